// Worst-case round-trip error of each codec on any input it accepts, derived from its layout (not
// measured): used by the edge-case tests and by the quantize fuzzer, which feeds arbitrary floats.
//
// For a block of 32 values with scale d = f(amax) stored as fp16 d16 (and min m stored as m16), every
// value comes back within the rounding step of its grid plus what the fp16 rounding of d and m moves
// the largest code by:
//   q8_0  |x - x'| <= d/2 + 127·|d - d16|                 (d = amax/127, round to nearest)
//   q4_0  |x - x'| <= |d| + 8·|d - d16|                   (d = max/-8; the far extreme clamps to +7)
//   q5_0  |x - x'| <= |d| + 16·|d - d16|
//   q4_1  |x - x'| <= d/2 + 15·|d - d16| + |min - m16|   (d = (max-min)/15)
//   q5_1  |x - x'| <= d/2 + 31·|d - d16| + |min - m16|
//   f16 / bf16: half a unit in the last place; f32: exact.
// `+rot` codecs: the same bound on the rotated row, compared in L2 norm (the rotation is orthogonal).
// A block codec not listed here gets its registry row's bound (lib/ref/row_codecs.hpp); the rotating
// codecs (polar, turbo) a weak generic one, ||x - x'|| <= ||x||, and turbo*_qjl a looser one still
// (qjl_error_factor: its sketch bounds inner products, not a row's error).
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <numbers>
#include <tuple>
#include <string>
#include <vector>

#include "ref/half.hpp"
#include "ref/lloyd_max.hpp"
#include "ref/qjl.hpp"
#include "ref/turbo_codebook.hpp"
#include "kvq/codec.hpp"
#include "rotation/hadamard.hpp"
#include "ref/row_codecs.hpp"

namespace kvq::test {

inline std::string num(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

// A block codec without its own formula below (iq4_nl): its registry row's bound, max_rel_error times
// the block's max |x|, plus what an fp16 scale loses where it is subnormal (2^-25 times the largest code).
inline bool registry_bounds(const std::string& base, const float* x, int n, double* bound) {
    for (const auto& t : detail::kRowCodecs) {
        if (base != t.name || t.family != detail::CodecFamily::block) continue;
        for (int b = 0; b < n / t.block; ++b) {
            double amax = 0;
            for (int j = 0; j < t.block; ++j) amax = std::max(amax, std::fabs(double(x[b * t.block + j])));
            std::fill(bound + b * t.block, bound + (b + 1) * t.block, t.max_rel_error * amax + 127 * 0x1p-25);
        }
        return true;
    }
    return false;
}

// Per-value bounds for one unrotated row of a known codec; false if the codec is not known here.
inline bool value_bounds(const std::string& base, const float* x, int n, double* bound) {
    using detail::f32_to_f16, detail::f16_to_f32;
    constexpr double slack = 1e-6;  // float rounding of the scale's inverse and of d·q + m
    auto f16_error = [&](float v) { return std::fabs(double(v) - f16_to_f32(f32_to_f16(v))); };
    if (base == "f32") {
        std::fill(bound, bound + n, 0.0);
        return true;
    }
    if (base == "f16" || base == "bf16") {
        const double rel = base == "f16" ? 0x1p-11 : 0x1p-8;
        const double tiny = base == "f16" ? 0x1p-25 : 0x1p-134;
        for (int j = 0; j < n; ++j) bound[j] = std::fabs(double(x[j])) * rel + tiny;
        return true;
    }
    int top;
    bool with_min;
    if (base == "q8_0") top = 127, with_min = false;
    else if (base == "q4_0") top = 8, with_min = false;
    else if (base == "q5_0") top = 16, with_min = false;
    else if (base == "q4_1") top = 15, with_min = true;
    else if (base == "q5_1") top = 31, with_min = true;
    else return registry_bounds(base, x, n, bound);
    for (int b = 0; b < n / 32; ++b) {
        const float* xb = x + b * 32;
        float amax = 0, max = 0, lo = FLT_MAX, hi = -FLT_MAX;
        for (int j = 0; j < 32; ++j) {
            if (std::fabs(xb[j]) > amax) amax = std::fabs(xb[j]), max = xb[j];
            lo = std::min(lo, xb[j]);
            hi = std::max(hi, xb[j]);
        }
        // A subnormal d is rounded so coarsely that top·d may fall short of the block's range: the
        // values beyond clamp to the top code.
        double e;
        if (base == "q8_0") {
            const float d = amax / 127;
            e = 0.5 * d + std::max(0.0, amax - 127.0 * d) + 127 * f16_error(d);
        } else if (!with_min) {
            const float d = max / -top;
            e = std::fabs(d) + std::max(0.0, amax - top * std::fabs(double(d))) + top * f16_error(d);
        } else {
            const float d = (hi - lo) / top;
            e = 0.5 * d + std::max(0.0, (double(hi) - lo) - top * double(d)) + top * f16_error(d) + f16_error(lo);
        }
        e = e * (1 + slack) + double(amax) * slack + 1e-44;
        std::fill(bound + b * 32, bound + b * 32 + 32, e);
    }
    return true;
}

// turboB_qjl: how many times ‖x‖ a row's error may be. The row reads back as x̃ = s·Rᵀ(c + r̃), s = ‖x‖ in
// fp16, c the (B−1)-bit centroids of u = R·x/‖x‖, r̃ = √(π/2)/d·γ·Sᵀz the QJL estimate of r = u − c (γ = ‖r‖
// in fp16, z = sign(S·r)). QJL is an unbiased inner-product estimate, not a norm-bounded reconstruction:
// one row's ‖r − r̃‖ can exceed ‖r‖, and ‖r‖ can exceed ‖u‖ = 1 (a 1-bit centroid is ±a whatever the
// coordinate's size). What holds for every row: ‖x − x̃‖ ≤ ‖x‖·‖r − r̃‖ + |‖x‖ − s|·‖c + r̃‖, with
// ‖c‖ ≤ √d·c_max, ‖r‖ ≤ 1 + ‖c‖ and ‖r̃‖ ≤ √(π/2)/d·γ·σ_max(S)·√d. σ_max by power iteration (from below,
// so 5% is added), once per (d, seed).
inline double qjl_error_factor(int d, int bits, uint64_t seed) {
    static std::mutex mu;
    static std::map<std::tuple<int, int, uint64_t>, double> cache;
    const std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_tuple(d, bits, seed);
    if (const auto it = cache.find(key); it != cache.end()) return it->second;
    const detail::QjlSketch s(d, seed);
    std::vector<float> v(d, 1.0f), sv(d), w(d);
    double sigma2 = 0;
    for (int it = 0; it < 60; ++it) {
        double n = 0;
        for (float x : v) n += double(x) * x;
        for (float& x : v) x = static_cast<float>(x / std::sqrt(n));
        s.project(v.data(), sv.data());
        std::fill(w.begin(), w.end(), 0.0f);
        s.add_transposed(sv.data(), 1.0f, w.data());
        sigma2 = 0;
        for (int j = 0; j < d; ++j) sigma2 += double(w[j]) * v[j];
        v = w;
    }
    const double sigma = 1.05 * std::sqrt(sigma2);
    const detail::TurboCodebook cb = detail::make_turbo_codebook(detail::sphere_coordinate_codebook(bits, d));
    const double c_norm = std::sqrt(double(d)) * cb.scale * 127.0 * (1 + 1e-6);
    const double r_norm = (1 + c_norm) * (1 + 0x1p-10);
    const double r_est = std::sqrt(std::numbers::pi / 2) / d * r_norm * sigma * std::sqrt(double(d));
    return cache[key] = r_norm + r_est + 0x1p-10 * (c_norm + r_est);
}

// Checks the round trip of one row x -> x' (both in the caller's basis). Returns an empty string when
// within the codec's bound, else what is wrong.
inline std::string check_round_trip(const Codec& c, const float* x, const float* back) {
    const int n = c.head_dim();
    const std::string spec = c.name();
    const std::string base = spec.substr(0, spec.find_first_of(":+"));
    for (int j = 0; j < n; ++j) {
        if (!std::isfinite(back[j])) return "value " + std::to_string(j) + " reads back non-finite";
    }
    std::vector<float> y(x, x + n);
    if (c.rotated()) detail::Rotation(n, c.seed()).apply(x, y.data());
    std::vector<double> bound(n);
    double norm = 0, err = 0, allowed = 0;
    for (int j = 0; j < n; ++j) {
        norm += double(x[j]) * x[j];
        err += (double(x[j]) - back[j]) * (double(x[j]) - back[j]);
    }
    norm = std::sqrt(norm), err = std::sqrt(err);
    if (!value_bounds(base, y.data(), n, bound.data())) {
        // polar/turbo: the error stays below ||x||, plus what rounding the stored fp16 norms (row and, for
        // QJL, residual) can add: half an fp16 step each, coarse where the norm is an fp16 subnormal.
        const double fp16_half_step = std::max(norm * 0x1p-11, 0x1p-25);
        if (base.size() > 4 && base.compare(base.size() - 4, 4, "_qjl") == 0) {
            const int bits = base[5] - '0' - 1;  // turboB_qjl: (B−1)-bit codes
            const double factor = qjl_error_factor(n, bits, c.seed());
            const double allowed_err = (norm + 2 * fp16_half_step) * factor * (1 + 1e-5);
            return err <= allowed_err ? "" : "error " + num(err) + " exceeds " + num(factor) + " × ||x|| = " + num(norm) +
                                                 " (the QJL bound) with fp16 rounding of the norms";
        }
        const double allowed_err = norm * (1 + 1e-5) + 2 * fp16_half_step;
        return err <= allowed_err ? "" : "error " + num(err) + " exceeds ||x|| = " + num(norm) + " by more than fp16 rounding of the norm";
    }
    if (!c.rotated()) {
        for (int j = 0; j < n; ++j) {
            if (std::fabs(double(x[j]) - back[j]) > bound[j]) {
                return "value " + std::to_string(j) + ": " + num(x[j]) + " reads back as " +
                       num(back[j]) + ", beyond the bound " + num(bound[j]);
            }
        }
        return "";
    }
    for (int j = 0; j < n; ++j) allowed += bound[j] * bound[j];
    allowed = std::sqrt(allowed) + 1e-5 * norm + 1e-40;  // + the rotation's own float rounding
    return err <= allowed ? "" : "L2 error " + num(err) + " exceeds the bound " + num(allowed);
}

}  // namespace kvq::test
