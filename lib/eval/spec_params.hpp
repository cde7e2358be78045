// Parsing "key=value,key=value" parameter lists into option structs, for data set specs and the like.
// Each options struct lists its fields once (name and member pointer); unknown keys and malformed
// values throw std::invalid_argument naming the key and the fields that exist.
#pragma once

#include <cstdint>
#include <limits>
#include <type_traits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace kvq::detail {

template <class Options>
struct Param {
    const char* name;
    std::variant<int Options::*, float Options::*, bool Options::*, uint64_t Options::*> field;
};

inline std::vector<std::string_view> split(std::string_view s, char sep) {
    std::vector<std::string_view> parts;
    size_t start = 0;
    while (true) {
        const size_t end = s.find(sep, start);
        parts.push_back(s.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
        if (end == std::string_view::npos) break;
        start = end + 1;
    }
    return parts;
}

inline double parse_number(std::string_view text, const std::string& what) {
    const std::string s(text);
    size_t used = 0;
    double x = 0;
    try {
        x = std::stod(s, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (s.empty() || used != s.size()) throw std::invalid_argument(what + ": '" + s + "' is not a number");
    return x;
}

template <class Options>
void set_params(Options& options, std::string_view list, std::span<const Param<Options>> params,
                const std::string& context) {
    if (list.empty()) return;
    for (std::string_view item : split(list, ',')) {
        const size_t eq = item.find('=');
        const std::string key(item.substr(0, eq));
        const Param<Options>* param = nullptr;
        for (const auto& p : params) {
            if (key == p.name) param = &p;
        }
        if (!param || eq == std::string_view::npos) {
            std::string known;
            for (const auto& p : params) known += (known.empty() ? "" : ", ") + std::string(p.name);
            throw std::invalid_argument(context + ": expected key=value with key one of " + known + ", got '" +
                                        std::string(item) + "'");
        }
        const std::string what = context + " parameter " + key;
        const std::string_view value = item.substr(eq + 1);
        std::visit(
            [&](auto member) {
                using T = std::remove_reference_t<decltype(options.*member)>;
                if constexpr (std::is_same_v<T, bool>) {
                    if (value == "1" || value == "true" || value == "on") options.*member = true;
                    else if (value == "0" || value == "false" || value == "off") options.*member = false;
                    else throw std::invalid_argument(what + ": expected 0/1, true/false or on/off, got '" + std::string(value) + "'");
                } else if constexpr (std::is_integral_v<T>) {
                    const std::string s(value);
                    size_t used = 0;
                    unsigned long long x = 0;
                    try {
                        if (!s.empty() && s[0] != '-') x = std::stoull(s, &used, 0);
                    } catch (const std::exception&) {
                        used = 0;
                    }
                    if (s.empty() || used != s.size() || x > static_cast<unsigned long long>(std::numeric_limits<T>::max()))
                        throw std::invalid_argument(what + ": expected a non-negative integer, got '" + s + "'");
                    options.*member = static_cast<T>(x);
                } else {
                    options.*member = static_cast<T>(parse_number(value, what));
                }
            },
            param->field);
    }
}

}  // namespace kvq::detail
