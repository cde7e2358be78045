// The online softmax's block update 8 lanes at a time (GCC/Clang vector extensions), compiled into each
// level's file with that level's flags: float reductions do not auto-vectorize without -ffast-math, and
// a decode step takes n_heads × context exponentials. The operations and their order are those of the
// scalar specification (lib/ref/softmax.cpp), so every level gives the same bits.
#pragma once

#include <cstring>

#include "../ref/softmax.hpp"

namespace kvq::simd {
namespace {

using detail::exp_nonpositive;
using detail::SoftmaxState;

typedef float f32x8 __attribute__((vector_size(32)));
typedef uint32_t u32x8 __attribute__((vector_size(32)));
typedef float f32x16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));
constexpr size_t kSoftmaxLanes = 8;

// Vectors pass by reference only: a 256-bit vector passed by value between functions compiled with and
// without AVX changes the calling convention (an error in Clang).
#define KVQ_INLINE inline __attribute__((always_inline))

KVQ_INLINE void load8(const float* p, f32x8& v) { std::memcpy(&v, p, sizeof v); }
KVQ_INLINE void store8(float* p, const f32x8& v) { std::memcpy(p, &v, sizeof v); }

// x ← exp_nonpositive(x), lane by lane, with the same operations in the same order. Lane-wise, so it
// may run 16 lanes at a time (one 512-bit register at avx512); the sums and maxima that depend on the
// order stay 8 lanes wide.
template <class V, class U>
KVQ_INLINE void exp_lanes(V& x) {
    const V lo = V{} - 87.3f;
    x = x < lo ? lo : x;
    const float magic = 12582912.0f;
    const V t = x * 1.44269504088896341f + magic;
    const V n = t - magic;
    U bits;
    std::memcpy(&bits, &t, sizeof bits);
    bits = (bits - 0x4B400000u + 127u) << 23;  // 2^n
    V pow2;
    std::memcpy(&pow2, &bits, sizeof pow2);
    const V r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    V p = V{} + 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    x = (p * r * r + r + 1.0f) * pow2;
}

// The halves of a 16-lane vector (lanes 0..7 come first in row order), taken in registers (through
// memory, the upper half's load waits for the 64-byte store: measured slower than 8 lanes at a time).
KVQ_INLINE void halves(const f32x16& v, f32x8& lo, f32x8& hi) {
    lo = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7);
    hi = __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
}

// The specification's max of the 8 lanes (a left fold of m > b ? m : b from −inf, NaN-free lanes) as a
// tree over adjacent ranges, each keeping its first maximum: the same lane wins, so a tie of −0 and +0 gives
// the same bits. 3 steps where the fold's chain takes 8.
KVQ_INLINE float first_max(const f32x8& v) {
    const f32x8 odd = __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
    const f32x8 a = odd > v ? odd : v;  // lanes 0, 2, 4, 6: ranges of 2
    const f32x8 a2 = __builtin_shufflevector(a, a, 2, 3, 0, 1, 6, 7, 4, 5);
    const f32x8 b = a2 > a ? a2 : a;  // lanes 0, 4: ranges of 4
    const float lo = b[0], hi = b[4];
    return hi > lo ? hi : lo;
}

KVQ_INLINE float lane_sum(const f32x8& v) {
    return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Queries are taken kQueryChunk at a time, their loops interleaved: each query's exponentials are a long
// chain of dependent multiplies and adds (no fma: the specification's rounding), so one query alone left
// the vector units waiting (measured at avx512, g = 4, n = 32: 7.4–8.3 → 4.3–6.1 ns a row and block
// update). Each query's operations and their order are unchanged.
constexpr int kQueryChunk = 4;
static_assert(kQueryChunk == 4, "softmax_update_lanes takes the remainder of g by 1, 2 or 3 queries");

// Queries i0 .. i0 + C − 1 (C fixed, so that their vectors stay in registers).
template <int C>
KVQ_INLINE void softmax_queries(float* scores, int i0, size_t n, const float* offsets, float scale,
                                SoftmaxState* state, float* acc, int d) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    float* s[C];
    float m[C];
    // Scale, and the block's max (a NaN score is skipped here; it still turns the sum, hence the
    // output, into NaN).
    f32x8 max8[C];
    float offset[C];
    for (int k = 0; k < C; ++k) {
        s[k] = scores + (i0 + k) * n;
        offset[k] = offsets ? offsets[i0 + k] : 0.0f;
        max8[k] = f32x8{} + kNegInf;
    }
    size_t r0 = 0;
#if defined(__AVX512F__)
    // 16 at a time, each half into the maxima in row order (8-lane stores read back 16 at a time below
    // would wait for both stores to reach the cache: a failed store-to-load forwarding)
    for (; r0 + 2 * kSoftmaxLanes <= n; r0 += 2 * kSoftmaxLanes) {
        for (int k = 0; k < C; ++k) {
            f32x16 v;
            std::memcpy(&v, s[k] + r0, sizeof v);
            v = (v + offset[k]) * scale;
            std::memcpy(s[k] + r0, &v, sizeof v);
            f32x8 lo, hi;
            halves(v, lo, hi);
            max8[k] = lo > max8[k] ? lo : max8[k];
            max8[k] = hi > max8[k] ? hi : max8[k];
        }
    }
#endif
    for (; r0 + kSoftmaxLanes <= n; r0 += kSoftmaxLanes) {
        for (int k = 0; k < C; ++k) {
            f32x8 v;
            load8(s[k] + r0, v);
            v = (v + offset[k]) * scale;
            store8(s[k] + r0, v);
            max8[k] = v > max8[k] ? v : max8[k];
        }
    }
    for (int k = 0; k < C; ++k) {
        float block_max = first_max(max8[k]);
        for (size_t r = r0; r < n; ++r) {
            s[k][r] = (s[k][r] + offset[k]) * scale;
            block_max = s[k][r] > block_max ? s[k][r] : block_max;
        }
        SoftmaxState& st = state[i0 + k];
        if (block_max > st.max) {
            // From −inf (no rows yet) the factor is exactly 0 and the accumulator is still all zeros.
            const float rescale = st.max == kNegInf ? 0.0f : exp_nonpositive(st.max - block_max);
            st.sum *= rescale;
            st.max = block_max;
            float* a = acc + static_cast<size_t>(i0 + k) * d;
            for (int j = 0; j < d; ++j) a[j] *= rescale;
        }
        m[k] = st.max;
    }

    f32x8 sum8[C] = {};
    size_t r = 0;
#if defined(__AVX512F__) || !defined(__AVX2__)
#if defined(__AVX512F__)
    // Two registers a query at once where there are 32 rows: 2·C independent chains keep the units busy
    // (C alone left them waiting on each chain's latency; at sse2, 17 → 19 ns a row: too few registers).
    for (; r + 4 * kSoftmaxLanes <= n; r += 4 * kSoftmaxLanes) {
        f32x16 e[C][2];
#pragma GCC unroll 4
        for (int k = 0; k < C; ++k) {
#pragma GCC unroll 2
            for (int h = 0; h < 2; ++h) {
                std::memcpy(&e[k][h], s[k] + r + 16 * h, sizeof e[k][h]);
                e[k][h] -= m[k];
                exp_lanes<f32x16, u32x16>(e[k][h]);
                std::memcpy(s[k] + r + 16 * h, &e[k][h], sizeof e[k][h]);
            }
        }
        for (int k = 0; k < C; ++k) {
            for (int h = 0; h < 2; ++h) {
                f32x8 lo, hi;
                halves(e[k][h], lo, hi);
                sum8[k] += lo;
                sum8[k] += hi;
            }
        }
    }
#endif
    // 16 lanes at a time, except at avx2, where GCC lowers 64-byte vectors badly (measured, 4 queries'
    // 32-score blocks: the avx2 level's update took 17 ns a row with them, 4.7 without; sse2's, whose
    // 32-byte vectors are no better, 21 with them and 29 without)
    for (; r + 2 * kSoftmaxLanes <= n; r += 2 * kSoftmaxLanes) {  // the sum in the same order as 8 by 8
        for (int k = 0; k < C; ++k) {
            f32x16 e;
            std::memcpy(&e, s[k] + r, sizeof e);
            e -= m[k];
            exp_lanes<f32x16, u32x16>(e);
            std::memcpy(s[k] + r, &e, sizeof e);
            f32x8 lo, hi;
            halves(e, lo, hi);
            sum8[k] += lo;
            sum8[k] += hi;
        }
    }
#endif
    for (; r + kSoftmaxLanes <= n; r += kSoftmaxLanes) {
        for (int k = 0; k < C; ++k) {
            f32x8 e;
            load8(s[k] + r, e);
            e -= m[k];
            exp_lanes<f32x8, u32x8>(e);
            store8(s[k] + r, e);
            sum8[k] += e;
        }
    }
    for (int k = 0; k < C; ++k) {
        float sum = lane_sum(sum8[k]);
        for (size_t j = r; j < n; ++j) {
            s[k][j] = exp_nonpositive(s[k][j] - m[k]);
            sum += s[k][j];
        }
        state[i0 + k].sum += sum;
    }
}

void softmax_update_lanes(float* scores, int g, size_t n, const float* offsets, float scale, SoftmaxState* state,
                    float* acc, int d) {
    int i0 = 0;
    for (; i0 + kQueryChunk <= g; i0 += kQueryChunk) softmax_queries<kQueryChunk>(scores, i0, n, offsets, scale, state, acc, d);
    switch (g - i0) {
        case 1: softmax_queries<1>(scores, i0, n, offsets, scale, state, acc, d); break;
        case 2: softmax_queries<2>(scores, i0, n, offsets, scale, state, acc, d); break;
        case 3: softmax_queries<3>(scores, i0, n, offsets, scale, state, acc, d); break;
        default: break;
    }
}

}  // namespace
}  // namespace kvq::simd
