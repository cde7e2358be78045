#include "polar_params.hpp"

#include <charconv>
#include <cstdio>
#include <cmath>
#include <limits>
#include <optional>
#include <stdexcept>

#include "bit_codes.hpp"
#include "kvq/errors.hpp"
#include "lloyd_max.hpp"

namespace kvq::detail {
namespace {

[[noreturn]] void fail(const std::string& what) { throw BadParams("codec 'polar': " + what); }
[[noreturn]] void fail_head_dim(const std::string& what) { throw BadHeadDim("codec 'polar': " + what); }

int parse_int(std::string_view s, const char* what) {
    int v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size()) fail(std::string(what) + " must be an integer, got '" + std::string(s) + "'");
    return v;
}

double parse_double(std::string_view s, const char* what) {
    double v = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    if (ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v)) {
        fail(std::string(what) + " must be a number, got '" + std::string(s) + "'");
    }
    return v;
}

void check_levels(int levels, int head_dim) {
    if (levels < 1 || levels > kPolarMaxLevels) {
        fail("L must be in 1.." + std::to_string(kPolarMaxLevels) + ", got " + std::to_string(levels));
    }
    if (head_dim % (1 << levels) != 0) {
        fail_head_dim("L=" + std::to_string(levels) + " needs a head_dim that is a multiple of 2^L = " + std::to_string(1 << levels) +
             ", got " + std::to_string(head_dim));
    }
}

std::string shortest(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    return buf;
}

int max_levels(int head_dim) {
    int levels = 0;
    while (levels < kPolarMaxLevels && head_dim % (2 << levels) == 0) ++levels;
    return levels;
}

// Units of d/2^L bits: level ℓ with b bits costs 2^(L−ℓ)·b of them per row.
std::optional<PolarConfig> best_for_levels(double budget, int head_dim, int levels) {
    const int groups = head_dim >> levels;
    // Whole bytes of codes, then 16-bit radii: ceil(code_bits/8)·8 + 16·groups <= budget·d.
    const double room = std::floor((budget * head_dim + 1e-9 - 16.0 * groups) / 8.0) * 8.0;
    if (room < 0) return std::nullopt;
    const int cap = static_cast<int>(std::min(room / groups, 1e6));
    constexpr double kInf = std::numeric_limits<double>::infinity();
    // err[l][c]: least error of levels 1..l using at most c units; choice[l][c]: bits of level l there.
    std::vector<std::vector<double>> err(levels + 1, std::vector<double>(cap + 1, kInf));
    std::vector<std::vector<int>> choice(levels + 1, std::vector<int>(cap + 1, -1));
    for (int c = 0; c <= cap; ++c) err[0][c] = 0;
    for (int l = 1; l <= levels; ++l) {
        const int unit = 1 << (levels - l);
        double level_error[kPolarMaxBits + 1];
        for (int b = 0; b <= kPolarMaxBits; ++b) level_error[b] = polar_angle_codebook(l, b).chord_error;
        for (int c = 0; c <= cap; ++c) {
            for (int b = l == 1 ? 1 : 0; b <= kPolarMaxBits && b * unit <= c; ++b) {
                const double e = err[l - 1][c - b * unit] + level_error[b];
                if (e < err[l][c] - 1e-15) {  // ties keep the cheaper choice found first
                    err[l][c] = e;
                    choice[l][c] = b;
                }
            }
        }
    }
    if (err[levels][cap] == kInf) return std::nullopt;
    PolarConfig config{levels, std::vector<int>(levels)};
    for (int l = levels, c = cap; l >= 1; --l) {
        config.bits[l - 1] = choice[l][c];
        c -= choice[l][c] << (levels - l);
    }
    return config;
}

}  // namespace

double polar_model_error(const PolarConfig& config) {
    double e = 0;
    for (int l = 1; l <= config.levels; ++l) e += polar_angle_codebook(l, config.bits[l - 1]).chord_error;
    return e;
}

size_t polar_row_bytes(const PolarConfig& config, int head_dim) {
    size_t code_bits = 0;
    for (int l = 1; l <= config.levels; ++l) code_bits += size_t(head_dim >> l) * config.bits[l - 1];
    return bytes_for_bits(code_bits) + 2 * size_t(head_dim >> config.levels);
}

std::string to_string(const PolarConfig& config) {
    std::string s = "L=" + std::to_string(config.levels) + ",bits=";
    for (int l = 0; l < config.levels; ++l) {
        if (l) s += '.';
        s += std::to_string(config.bits[l]);
    }
    return s;
}

PolarConfig min_error_allocation(double budget, int head_dim, int levels) {
    if (!(budget > 0) || !std::isfinite(budget)) fail("budget must be a positive number of bits per value");
    const int lo = levels ? levels : 1, hi = levels ? levels : max_levels(head_dim);
    if (levels) check_levels(levels, head_dim);
    if (hi < 1) fail_head_dim("head_dim must be even, got " + std::to_string(head_dim));
    // The most a row can take: every level at kPolarMaxBits, at the level count that stores the most
    // (the fewest levels: more radii). A budget beyond it would silently buy nothing more.
    double most = 0;
    int most_levels = lo;
    for (int l = lo; l <= hi; ++l) {
        const double bits = 8.0 * polar_row_bytes(PolarConfig{l, std::vector<int>(l, kPolarMaxBits)}, head_dim) / head_dim;
        if (bits > most) most = bits, most_levels = l;
    }
    if (budget > most + 1e-9) {
        fail("budget=" + shortest(budget) + " is beyond the most a row can use at head_dim " + std::to_string(head_dim) +
             (levels ? " and L=" + std::to_string(levels) : std::string()) + ": budget must be at most " + shortest(most) +
             " bits/value (L=" + std::to_string(most_levels) + ", " + std::to_string(kPolarMaxBits) + " bits at every level)");
    }
    std::optional<PolarConfig> best;
    double best_error = std::numeric_limits<double>::infinity();
    for (int l = lo; l <= hi; ++l) {
        if (const auto c = best_for_levels(budget, head_dim, l)) {
            const double e = polar_model_error(*c);
            if (e < best_error - 1e-15) {
                best_error = e;
                best = c;
            }
        }
    }
    if (!best) {
        // The cheapest row: one bit at level 1, nothing above, one radius per 2^hi values.
        const double least = 8.0 * bytes_for_bits(size_t(head_dim / 2)) / head_dim + 16.0 / (1 << hi);
        fail("no allocation fits budget=" + std::to_string(budget) + " bits/value at head_dim " + std::to_string(head_dim) +
             " (the least is " + std::to_string(least) + ")");
    }
    return *best;
}

PolarConfig parse_polar_params(std::string_view params, int head_dim) {
    std::optional<int> levels;
    std::optional<std::vector<int>> bits;
    std::optional<double> budget;
    while (!params.empty()) {
        const size_t comma = params.find(',');
        const std::string_view item = params.substr(0, comma);
        params = comma == std::string_view::npos ? std::string_view() : params.substr(comma + 1);
        const size_t eq = item.find('=');
        if (eq == std::string_view::npos) fail("parameter '" + std::string(item) + "' is not key=value (keys: L, bits, budget)");
        const std::string_view key = item.substr(0, eq), value = item.substr(eq + 1);
        if (key == "L") {
            if (levels) fail("L given twice");
            levels = parse_int(value, "L");
        } else if (key == "bits") {
            if (bits) fail("bits given twice");
            bits.emplace();
            for (std::string_view rest = value;;) {
                const size_t dot = rest.find('.');
                bits->push_back(parse_int(rest.substr(0, dot), "each of bits"));
                if (dot == std::string_view::npos) break;
                rest = rest.substr(dot + 1);
            }
        } else if (key == "budget") {
            if (budget) fail("budget given twice");
            budget = parse_double(value, "budget");
        } else {
            fail("unknown parameter '" + std::string(key) + "' (keys: L, bits, budget)");
        }
    }
    if (bits && budget) fail("give bits or budget, not both");
    if (budget) return min_error_allocation(*budget, head_dim, levels.value_or(0));
    if (!bits) {
        if (levels) fail("L=" + std::to_string(*levels) + " needs bits=b1.….bL or budget=B");
        PolarConfig config;
        check_levels(config.levels, head_dim);
        return config;
    }
    const int n = static_cast<int>(bits->size());
    if (levels && *levels != n) {
        fail("L=" + std::to_string(*levels) + " but bits lists " + std::to_string(n) + " levels");
    }
    check_levels(n, head_dim);
    for (int l = 0; l < n; ++l) {
        const int lo = l == 0 ? 1 : 0;
        if ((*bits)[l] < lo || (*bits)[l] > kPolarMaxBits) {
            fail("bits of level " + std::to_string(l + 1) + " must be in " + std::to_string(lo) + ".." +
                 std::to_string(kPolarMaxBits) + ", got " + std::to_string((*bits)[l]));
        }
    }
    return PolarConfig{n, *bits};
}

}  // namespace kvq::detail
