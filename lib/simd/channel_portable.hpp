// chanB key scores (the specification: lib/ref/channel_codes.hpp) for the levels without an AVX-512
// kernel (avx2, sse2, neon), over the level's float batches, bit for bit the specification's.
//
// A row's codes are decoded once to floats, two at a time through a table of code pairs
// (rotated_portable.hpp's decode_codes, the values being the codes themselves; chan5..chan8 one code at a
// time), kSlice values at a time. Per query the 16 partial sums are 16 / W batches (value j in lane
// j mod 16, the last d mod 16 values in lanes 0..7), each step a product then a sum, and the
// specification's tree (sum16_float) ends them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "../ref/rotated_quantize.hpp"
#include "rotated_portable.hpp"

namespace kvq::simd {
namespace {

namespace portable {

template <class A>
void channel_score(const float* q, int n_q, int d, int bits, const uint8_t* rows, size_t row_stride, size_t n_rows,
                   float* scores, size_t score_stride) {
    using F = xsimd::batch<float, A>;
    constexpr int W = static_cast<int>(F::size), P = 16 / W;
    static_assert(16 % W == 0 && kSlice % 16 == 0);
    float codes[256];
    for (int c = 0; c < 256; ++c) codes[c] = static_cast<float>(c);
    Pair pairs[256];
    const bool have_pairs = Tables::make_codes(pairs, codes, bits);
    alignas(64) float values[kSlice];
    alignas(64) float partial[4][16];  // four queries' partial sums between slices
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        for (int i0 = 0; i0 < n_q; i0 += 4) {
            const int g = std::min(4, n_q - i0);
            for (int j0 = 0; j0 < d; j0 += kSlice) {
                const int j1 = std::min(d, j0 + kSlice);
                if (i0 == 0 || d > kSlice) decode_codes_any(pairs, have_pairs, codes, bits, row, 0, j0, j1, values);
                for (int i = 0; i < g; ++i) {
                    const float* qi = q + static_cast<size_t>(i0 + i) * d;
                    F p[P];
                    for (int k = 0; k < P; ++k) p[k] = j0 == 0 ? F(0.0f) : F::load_aligned(partial[i] + k * W);
                    int j = j0;
                    for (; j + 16 <= j1; j += 16) {
                        for (int k = 0; k < P; ++k) {
                            p[k] = p[k] + F::load_unaligned(qi + j + k * W) * F::load_aligned(values + (j - j0) + k * W);
                        }
                    }
                    for (int k = 0; k < P; ++k) {  // the last 8 values, if any: lanes 0..7
                        if (j + W <= j1) {
                            p[k] = p[k] + F::load_unaligned(qi + j) * F::load_aligned(values + (j - j0));
                            j += W;
                        }
                    }
                    for (int k = 0; k < P; ++k) p[k].store_aligned(partial[i] + k * W);
                }
            }
            for (int i = 0; i < g; ++i) scores[(i0 + i) * score_stride + r] = detail::sum16_float(partial[i]);
        }
    }
}

}  // namespace portable

}  // namespace
}  // namespace kvq::simd
