// Shared by the libFuzzer targets: choosing a codec from the input, running at every SIMD level, and
// failing loudly. A fuzz target reports a violated property with abort(), which libFuzzer records as a
// crash with the input that caused it.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fuzzer/FuzzedDataProvider.h>
#include <optional>
#include <string>
#include <vector>

#include "kvq/codec.hpp"
#include "kvq/simd.hpp"

namespace kvq::fuzz {

[[noreturn]] inline void fail(const std::string& what) {
    std::fprintf(stderr, "fuzz property violated: %s\n", what.c_str());
    std::abort();
}
inline void require(bool ok, const std::string& what) {
    if (!ok) fail(what);
}

// Every codec of the table, plain and +rot, in a fixed order.
inline const std::vector<std::string>& all_specs() {
    static const std::vector<std::string> specs = [] {
        std::vector<std::string> s;
        for (const auto& name : codec_names()) {
            s.push_back(name);
            s.push_back(name + "+rot");
        }
        return s;
    }();
    return specs;
}

// A codec chosen by the input: a spec from the table and a head size it takes (or nothing, if the
// chosen head size is one the codec refuses, which is a valid outcome of make()).
inline std::optional<Codec> pick_codec(FuzzedDataProvider& in) {
    const auto& specs = all_specs();
    const std::string& spec = specs[in.ConsumeIntegralInRange<size_t>(0, specs.size() - 1)];
    static const int dims[] = {32, 64, 96, 128, 256, 48, 8};
    const int head_dim = dims[in.ConsumeIntegralInRange<size_t>(0, std::size(dims) - 1)];
    const uint64_t seed = in.ConsumeBool() ? kDefaultSeed : in.ConsumeIntegral<uint64_t>();
    try {
        return Codec::make(spec, head_dim, seed);
    } catch (const std::invalid_argument&) {
        return std::nullopt;
    }
}

// Floats taken bit for bit from the input (any NaN, Inf, subnormal or huge value), zero-padded.
inline std::vector<float> raw_floats(FuzzedDataProvider& in, size_t n) {
    std::vector<float> x(n, 0.0f);
    const auto bytes = in.ConsumeBytes<uint8_t>(n * sizeof(float));
    if (!bytes.empty()) std::memcpy(x.data(), bytes.data(), bytes.size());
    return x;
}

// Bitwise equal, except that any two NaNs count as equal (payloads may differ between conversions).
inline bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (std::isnan(a[i]) && std::isnan(b[i])) continue;
        if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) return false;
    }
    return true;
}

// Runs f(level) at every SIMD level this build and CPU have, then restores the level in use.
template <class F>
void at_every_simd_level(F&& f) {
    const SimdLevel saved = simd_level();
    for (SimdLevel level : available_simd_levels()) {
        force_simd_level(level);
        f(level);
    }
    force_simd_level(saved);
}

}  // namespace kvq::fuzz
