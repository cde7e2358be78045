// .npy reading and writing. The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// parsed here by a small scanner that accepts exactly the three keys NumPy writes.
#include "kvq/npy.hpp"

#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <stdexcept>

#include "spec/half.hpp"

namespace kvq {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

[[noreturn]] void fail(const std::string& what, const std::string& problem) {
    throw std::invalid_argument(what + ": " + problem);
}

// Scanner over the header dict.
struct HeaderScanner {
    const std::string& text;
    const std::string& what;
    size_t pos = 0;

    void skip_space() {
        while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t')) ++pos;
    }
    bool take(char c) {
        skip_space();
        if (pos < text.size() && text[pos] == c) {
            ++pos;
            return true;
        }
        return false;
    }
    void expect(char c) {
        if (!take(c)) fail(what, std::string("corrupt .npy header (expected '") + c + "' at " + std::to_string(pos) + " in " + text + ")");
    }
    std::string string_literal() {
        skip_space();
        if (pos >= text.size() || (text[pos] != '\'' && text[pos] != '"')) fail(what, "corrupt .npy header (expected a quoted string): " + text);
        const char quote = text[pos++];
        const size_t end = text.find(quote, pos);
        if (end == std::string::npos) fail(what, "corrupt .npy header (unterminated string): " + text);
        std::string s = text.substr(pos, end - pos);
        pos = end + 1;
        return s;
    }
    bool boolean() {
        skip_space();
        for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
            if (text.compare(pos, std::strlen(word), word) == 0) {
                pos += std::strlen(word);
                return value;
            }
        }
        fail(what, "corrupt .npy header (expected True or False): " + text);
    }
    std::vector<size_t> shape_tuple() {
        expect('(');
        std::vector<size_t> shape;
        while (!take(')')) {
            skip_space();
            size_t start = pos;
            while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') ++pos;
            if (start == pos) fail(what, "corrupt .npy header (bad shape): " + text);
            shape.push_back(std::stoull(text.substr(start, pos - start)));
            if (!take(',')) {
                expect(')');
                break;
            }
        }
        return shape;
    }
};

}  // namespace

size_t NpyArray::size() const {
    size_t n = 1;
    for (size_t s : shape) n *= s;
    return n;
}

std::string shape_string(const std::vector<size_t>& shape) {
    std::string s = "(";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

NpyArray parse_npy(const void* bytes, size_t n_bytes, const std::string& what) {
    const auto* p = static_cast<const uint8_t*>(bytes);
    if (n_bytes < kMagicLen + 4 || std::memcmp(p, kMagic, kMagicLen) != 0) fail(what, "not a .npy file (bad magic)");
    const int major = p[6];
    size_t header_len = 0, offset = 0;
    if (major == 1) {
        header_len = p[8] | (size_t(p[9]) << 8);
        offset = 10;
    } else if (major == 2 || major == 3) {
        if (n_bytes < 12) fail(what, "truncated .npy header");
        header_len = p[8] | (size_t(p[9]) << 8) | (size_t(p[10]) << 16) | (size_t(p[11]) << 24);
        offset = 12;
    } else {
        fail(what, "unsupported .npy format version " + std::to_string(major));
    }
    if (offset + header_len > n_bytes) fail(what, "truncated .npy header");
    const std::string header(reinterpret_cast<const char*>(p + offset), header_len);

    std::string descr;
    bool fortran = false, have_descr = false, have_order = false, have_shape = false;
    NpyArray a;
    HeaderScanner scan{header, what};
    scan.expect('{');
    while (!scan.take('}')) {
        const std::string key = scan.string_literal();
        scan.expect(':');
        if (key == "descr") {
            descr = scan.string_literal();
            have_descr = true;
        } else if (key == "fortran_order") {
            fortran = scan.boolean();
            have_order = true;
        } else if (key == "shape") {
            a.shape = scan.shape_tuple();
            have_shape = true;
        } else {
            fail(what, "corrupt .npy header (unknown key '" + key + "')");
        }
        if (!scan.take(',')) {
            scan.expect('}');
            break;
        }
    }
    if (!have_descr || !have_order || !have_shape) fail(what, "corrupt .npy header (needs descr, fortran_order and shape): " + header);
    if (fortran) fail(what, "Fortran-order arrays are not supported (save np.ascontiguousarray(x))");
    size_t item = 0;
    if (descr == "<f4" || descr == "=f4") {
        a.dtype = "float32";
        item = 4;
    } else if (descr == "<f2" || descr == "=f2") {
        a.dtype = "float16";
        item = 2;
    } else {
        fail(what, "dtype '" + descr + "' is not supported (expected little-endian float32 '<f4' or float16 '<f2')");
    }
    const size_t n = a.size();
    const size_t data_offset = offset + header_len;
    if (n_bytes - data_offset != n * item) {
        fail(what, "data size " + std::to_string(n_bytes - data_offset) + " bytes does not match shape " +
                       shape_string(a.shape) + " of " + a.dtype + " (" + std::to_string(n * item) + " bytes)");
    }
    a.data.resize(n);
    const uint8_t* data = p + data_offset;
    if (item == 4) {
        std::memcpy(a.data.data(), data, n * 4);
    } else {
        for (size_t i = 0; i < n; ++i) a.data[i] = detail::f16_to_f32(static_cast<uint16_t>(data[2 * i] | (data[2 * i + 1] << 8)));
    }
    return a;
}

NpyArray read_npy(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::invalid_argument(path + ": cannot open");
    const std::vector<char> bytes{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    return parse_npy(bytes.data(), bytes.size(), path);
}

void write_npy(const std::string& path, const float* data, size_t n_values, const std::vector<size_t>& shape) {
    size_t n = 1;
    for (size_t s : shape) n *= s;
    if (n != n_values) {
        throw std::invalid_argument("write_npy: shape " + shape_string(shape) + " holds " + std::to_string(n) +
                                    " values, got " + std::to_string(n_values));
    }
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_string(shape) + ", }";
    // Pad with spaces so the data starts on a 64-byte boundary, ending in a newline, as NumPy does.
    const size_t unpadded = kMagicLen + 4 + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header += '\n';
    std::ofstream f(path, std::ios::binary);
    if (!f) throw std::invalid_argument(path + ": cannot open for writing");
    f.write(kMagic, kMagicLen);
    const char version[2] = {1, 0};
    f.write(version, 2);
    const char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
    f.write(len, 2);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
    if (!f) throw std::invalid_argument(path + ": write failed");
}

}  // namespace kvq
