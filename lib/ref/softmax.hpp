// The online softmax's block update (lib/attention/online_softmax.hpp explains the algorithm): its state,
// its exponential, and the scalar specification of one block's update. SIMD levels (lib/simd/
// softmax_impl.hpp) compute the same operations in the same order, 8 lanes at a time, and so give the
// same bits; the self-check holds them to that.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace kvq::detail {

// exp(x) for x ≤ 0 (larger x is not needed here); NaN stays NaN, −inf and x < −87.3 give ≈ 0. The Cephes
// single-precision polynomial (≈1 ulp on this range) with plain arithmetic and bit operations, so that
// it runs 8 lanes wide. Internal linkage (static): SIMD files include this header with wide instructions
// enabled, and a shared inline copy could be the one the linker keeps for everyone.
static inline float exp_nonpositive(float x) {
    x = x < -87.3f ? -87.3f : x;  // keeps the exponent of 2^n normal; NaN passes (comparison is false)
    // n = round(x / ln 2) without a float-to-int conversion (undefined for NaN): adding 1.5·2^23 leaves
    // n in the low mantissa bits.
    const float magic = 12582912.0f;
    const float t = x * 1.44269504088896341f + magic;
    const float n = t - magic;
    uint32_t t_bits;
    std::memcpy(&t_bits, &t, 4);
    const uint32_t pow2_bits = (t_bits - 0x4B400000u + 127u) << 23;  // 2^n, n in [−126, 0]
    float pow2;
    std::memcpy(&pow2, &pow2_bits, 4);
    const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // x − n·ln 2 in two parts
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    return (p * r * r + r + 1.0f) * pow2;
}

// Softmax state of one query over the rows seen so far.
struct SoftmaxState {
    float max = -std::numeric_limits<float>::infinity();
    float sum = 0.0f;
};

// One block of scores for the g queries of a kv head: s[i·n + r] holds query i's raw score against row
// r. Per query: s ← (s + offset_i)·scale (offsets may be null: 0), then the online-softmax update of
// state[i]: s becomes the weights exp(s − max), and acc[i·d .. i·d + d) is rescaled when the max grows.
// The block max and the sum of the weights are taken over 8 lanes (row r in lane r mod 8, rows past the
// last whole 8 one by one after them), the lanes combined as ((0+1)+(2+3))+((4+5)+(6+7)).
using SoftmaxUpdate = void (*)(float* s, int g, size_t n, const float* offsets, float scale, SoftmaxState* state,
                               float* acc, int d);

// The scalar specification (softmax.cpp).
void softmax_update_scalar(float* s, int g, size_t n, const float* offsets, float scale, SoftmaxState* state,
                           float* acc, int d);

}  // namespace kvq::detail
