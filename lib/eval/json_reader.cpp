// Recursive-descent JSON reader (RFC 8259; \u escapes are decoded to UTF-8).
#include "json_reader.hpp"

#include <cstdlib>
#include <limits>
#include <stdexcept>

namespace kvq::detail {
namespace {

constexpr int kMaxDepth = 256;

class Parser {
public:
    explicit Parser(std::string_view text) : s_(text) {}

    JsonValue document() {
        JsonValue v = value(0);
        space();
        if (pos_ != s_.size()) fail("unexpected text after the value");
        return v;
    }

private:
    std::string_view s_;
    size_t pos_ = 0;

    [[noreturn]] void fail(const std::string& what) const {
        throw std::invalid_argument("JSON: " + what + " at byte " + std::to_string(pos_));
    }
    void space() {
        while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\n' || s_[pos_] == '\r' || s_[pos_] == '\t')) ++pos_;
    }
    char peek() {
        space();
        if (pos_ >= s_.size()) fail("unexpected end of text");
        return s_[pos_];
    }
    void expect(char c) {
        if (peek() != c) fail(std::string("expected '") + c + "'");
        ++pos_;
    }
    bool literal(std::string_view word) {
        if (s_.substr(pos_, word.size()) != word) return false;
        pos_ += word.size();
        return true;
    }

    JsonValue value(int depth) {
        if (depth > kMaxDepth) fail("nesting too deep");
        const char c = peek();
        if (c == '{') return object(depth);
        if (c == '[') return array(depth);
        if (c == '"') return {string()};
        if (literal("true")) return {true};
        if (literal("false")) return {false};
        if (literal("null")) return {nullptr};
        if (c == '-' || (c >= '0' && c <= '9')) return {number()};
        // Python's json module writes these for non-finite floats; configs sometimes contain them.
        if (literal("NaN")) return {std::numeric_limits<double>::quiet_NaN()};
        if (literal("Infinity")) return {std::numeric_limits<double>::infinity()};
        fail("unexpected character");
    }

    JsonValue object(int depth) {
        expect('{');
        auto obj = std::make_shared<JsonValue::Object>();
        if (peek() == '}') {
            ++pos_;
            return {obj};
        }
        while (true) {
            if (peek() != '"') fail("expected a member name");
            std::string key = string();
            expect(':');
            (*obj)[key] = value(depth + 1);
            if (peek() == ',') {
                ++pos_;
                continue;
            }
            expect('}');
            return {obj};
        }
    }

    JsonValue array(int depth) {
        expect('[');
        auto arr = std::make_shared<JsonValue::Array>();
        if (peek() == ']') {
            ++pos_;
            return {arr};
        }
        while (true) {
            arr->push_back(value(depth + 1));
            if (peek() == ',') {
                ++pos_;
                continue;
            }
            expect(']');
            return {arr};
        }
    }

    double number() {
        const size_t start = pos_;
        if (s_[pos_] == '-') ++pos_;
        while (pos_ < s_.size() && std::string_view("0123456789.eE+-").find(s_[pos_]) != std::string_view::npos) ++pos_;
        const std::string text(s_.substr(start, pos_ - start));
        char* end = nullptr;
        const double x = std::strtod(text.c_str(), &end);
        if (end != text.c_str() + text.size()) fail("malformed number '" + text + "'");
        return x;
    }

    static void append_utf8(std::string& out, unsigned cp) {
        if (cp < 0x80) {
            out += static_cast<char>(cp);
        } else if (cp < 0x800) {
            out += static_cast<char>(0xC0 | (cp >> 6));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            out += static_cast<char>(0xE0 | (cp >> 12));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
            out += static_cast<char>(0xF0 | (cp >> 18));
            out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
            out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
            out += static_cast<char>(0x80 | (cp & 0x3F));
        }
    }

    unsigned hex4() {
        if (pos_ + 4 > s_.size()) fail("truncated \\u escape");
        unsigned cp = 0;
        for (int i = 0; i < 4; ++i) {
            const char h = s_[pos_++];
            cp <<= 4;
            if (h >= '0' && h <= '9') cp |= h - '0';
            else if (h >= 'a' && h <= 'f') cp |= h - 'a' + 10;
            else if (h >= 'A' && h <= 'F') cp |= h - 'A' + 10;
            else fail("bad \\u escape");
        }
        return cp;
    }

    std::string string() {
        expect('"');
        std::string out;
        while (true) {
            if (pos_ >= s_.size()) fail("unterminated string");
            const char c = s_[pos_++];
            if (c == '"') return out;
            if (static_cast<unsigned char>(c) < 0x20) fail("control character in string");
            if (c != '\\') {
                out += c;
                continue;
            }
            if (pos_ >= s_.size()) fail("unterminated string");
            const char e = s_[pos_++];
            switch (e) {
                case '"': out += '"'; break;
                case '\\': out += '\\'; break;
                case '/': out += '/'; break;
                case 'b': out += '\b'; break;
                case 'f': out += '\f'; break;
                case 'n': out += '\n'; break;
                case 'r': out += '\r'; break;
                case 't': out += '\t'; break;
                case 'u': {
                    unsigned cp = hex4();
                    if (cp >= 0xD800 && cp < 0xDC00 && s_.substr(pos_, 2) == "\\u") {
                        pos_ += 2;
                        const unsigned lo = hex4();
                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    }
                    append_utf8(out, cp);
                    break;
                }
                default: fail("bad escape");
            }
        }
    }
};

}  // namespace

const JsonValue::Array* JsonValue::as_array() const {
    const auto* p = std::get_if<std::shared_ptr<Array>>(&value);
    return p ? p->get() : nullptr;
}

const JsonValue::Object* JsonValue::as_object() const {
    const auto* p = std::get_if<std::shared_ptr<Object>>(&value);
    return p ? p->get() : nullptr;
}

const JsonValue* JsonValue::find(std::string_view key) const {
    const Object* obj = as_object();
    if (!obj) return nullptr;
    const auto it = obj->find(key);
    return it == obj->end() ? nullptr : &it->second;
}

JsonValue parse_json(std::string_view text) { return Parser(text).document(); }

}  // namespace kvq::detail
