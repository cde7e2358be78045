// Score and accumulate of the tcqB codecs, the rows tcq2 and tcq3 of the kernel grid at sse2 and neon
// (level_sse2.cpp, level_neon.cpp; format and decoding rule: lib/ref/tcq.hpp): turbo's portable kernels
// (rotated_portable.hpp) over this row decoder. A value pair's two f codes, its two s1 and its two s0 bits
// index a table of 2^(2B+2) value pairs made per call; s1 and s0 of 32 values come at once from the u
// plane with word shifts. Results equal the specification (lib/ref/tcq_kernels.cpp) to float rounding.
#pragma once

#include <cstdint>
#include <cstring>

#include "../ref/rotated_kernels.hpp"
#include "rotated_portable.hpp"

namespace kvq::simd {
namespace {
namespace portable {

template <int B>
struct TcqSlices {
    static constexpr int fb = B - 1;  // bits of an f code
    const TurboLayout& l;
    Pair pairs[1 << (2 * fb + 4)];

    // index: f0 | f1 << (B−1) | s1_0 << 2(B−1) | s1_1 << (2B−1) | s0_0 << 2B | s0_1 << (2B+1)
    explicit TcqSlices(const TurboLayout& layout) : l(layout) {
        for (int x = 0; x < (1 << (2 * fb + 4)); ++x) {
            const int f0 = x & ((1 << fb) - 1), f1 = (x >> fb) & ((1 << fb) - 1);
            const int s10 = (x >> 2 * fb) & 1, s11 = (x >> (2 * fb + 1)) & 1;
            const int s00 = (x >> (2 * fb + 2)) & 1, s01 = (x >> (2 * fb + 3)) & 1;
            pairs[x] = {{l.centroids_hi[4 * f0 + 2 * s10 + s00], l.centroids_hi[4 * f1 + 2 * s11 + s01]}};
        }
    }

    // Values [j0, j1) of a row (multiples of 32) into out: s1_j = u_j ⊕ u_{j−1} ⊕ u_{j−3}, s0_j = u_{j−2}
    // for 32 values at once from the u plane, with the three bits before them.
    void operator()(const uint8_t* row, int j0, int j1, float* out) const {
        constexpr uint32_t fmask = (1u << (2 * fb)) - 1;
        const uint8_t* plane = row + l.plane_off;
        for (int j = j0; j < j1; j += 32) {
            uint32_t u32;
            std::memcpy(&u32, plane + j / 8, 4);
            const uint64_t u = u32;
            const uint64_t before = j > 0 ? plane[j / 8 - 1] >> 5 : 0;  // u_{j−3}, u_{j−2}, u_{j−1}
            const uint64_t s1 = u ^ (u << 1 | before >> 2) ^ (u << 3 | before);
            const uint64_t s0 = u << 2 | before >> 1;
            uint64_t f = 0;
            std::memcpy(&f, row + j / 8 * fb, 4 * fb);  // 32 f codes
            for (int p = 0; p < 16; ++p) {
                const uint32_t x = static_cast<uint32_t>((f >> (2 * fb * p)) & fmask) |
                                   static_cast<uint32_t>((s1 >> (2 * p)) & 3) << (2 * fb) |
                                   static_cast<uint32_t>((s0 >> (2 * p)) & 3) << (2 * fb + 2);
                std::memcpy(out + (j - j0) + 2 * p, &pairs[x], 8);
            }
        }
    }
};

template <class A, int B>
void tcq_score(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
               size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    turbo_score<A, TcqSlices<B>>(l, prep, prep_bytes, n_q, rows, row_stride, n_rows, scores, score_stride);
}

template <class A, int B>
void tcq_accumulate(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                    size_t row_stride, size_t n_rows, float* acc, float* sketch) {
    turbo_accumulate<A, TcqSlices<B>>(l, w, w_stride, n_q, rows, row_stride, n_rows, acc, sketch);
}

}  // namespace portable
}  // namespace
}  // namespace kvq::simd
