// The int8 weight grid of the cache's value accumulation (BlockKernels::accumulate_grid; q4_0 values):
// the scalar specification every level is checked against.
//
// Attention adds Σ_r w_r · d_r · c_r[j] over value rows r (softmax weight w, block scale d, code c). The
// grid rounds each product w·d to an int8 step, per query, per block of columns and per group of
// kGridRows rows counted from the first row of the call:
//   m = max_r |w_r·d_r| over the group,  s = m / 127,  ŵ_r = s · round(w_r·d_r / s)   (ties to even)
// so a kernel can multiply the 4-bit codes by int8 weights in integers and convert once per group (ggml's
// non-flash attention likewise rounds the softmax to q8_0 per 32 tokens before its V product). A weight's
// error is at most m/254, a group's relative error at most 1/254 of its largest weight.
//
// Exactly, per (query, block, group) lane, with every step a single float operation:
//   up = m < 2^-100 ? 2^100 : 1        (a tiny m is scaled up, exactly, so that 127/(m·up) is finite)
//   k  = m > 0 ? 127 / (m·up) : 0,     s = (m·up / 127) / up
//   ŵ_r = s · round((w_r·d_r · up) · k)
// A NaN among the group's products makes s NaN (so is every ŵ of the lane); products are otherwise
// finite or ±Inf, and an Inf gives m = Inf, s = Inf and non-finite ŵ.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>

namespace kvq::detail {

inline constexpr size_t kGridRows = 16;  // rows per grid group

// x rounded to the nearest integer, ties to even, for |x| ≤ 2^22 (NaN stays NaN): what cvtps2dq gives.
inline float grid_round(float x) {
    constexpr float kMagic = 0x1.8p23f;
    return (x + kMagic) - kMagic;  // kvq builds without -ffast-math: the sum is rounded as written
}

struct WeightGrid {
    float up, k, s;  // scale-up, inverse step of the scaled-up products, step
};

// The grid of a lane from m = max |w·d| over its group (NaN-free) and whether a product was NaN.
inline WeightGrid weight_grid(float m, bool any_nan) {
    const float up = m < 0x1p-100f ? 0x1p100f : 1.0f;
    const float mm = m * up;
    WeightGrid g{up, m > 0.0f ? 127.0f / mm : 0.0f, (mm / 127.0f) / up};
    if (any_nan) g.s = std::numeric_limits<float>::quiet_NaN();
    return g;
}

// The rounded weight of one product x = w·d of the lane: s · round((x·up)·k).
inline float grid_weight(const WeightGrid& g, float x) { return g.s * grid_round((x * g.up) * g.k); }

// wd[r·lanes + l] (r < n_rows, l < lanes) replaced by its rounded weight, each lane l on its own grid
// per group of kGridRows rows from row 0.
inline void round_to_grid(float* wd, size_t n_rows, int lanes) {
    for (size_t r0 = 0; r0 < n_rows; r0 += kGridRows) {
        const size_t r1 = r0 + kGridRows < n_rows ? r0 + kGridRows : n_rows;
        for (int l = 0; l < lanes; ++l) {
            float m = 0.0f;
            bool nan = false;
            for (size_t r = r0; r < r1; ++r) {
                const float x = wd[r * lanes + l];
                nan = nan || std::isnan(x);
                if (std::fabs(x) > m) m = std::fabs(x);
            }
            const WeightGrid g = weight_grid(m, nan);
            for (size_t r = r0; r < r1; ++r) wd[r * lanes + l] = grid_weight(g, wd[r * lanes + l]);
        }
    }
}

}  // namespace kvq::detail
