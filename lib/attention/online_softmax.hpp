// The online softmax of flash attention (Milakov & Gimelshein, arXiv 1805.02867; FlashAttention-2,
// arXiv 2307.08691): scores arrive a block at a time; a running max m and sum l per query let the
// weights of each block be exp(s − m) straight away, and the value accumulator is rescaled by
// exp(m_old − m_new) only when the max grows. Partial states over different rows merge exactly.
//
// exp is the Cephes single-precision polynomial (≈1 ulp on the range used here, s − m ≤ 0), with plain
// arithmetic and bit operations so that it runs 8 lanes wide (online_softmax.cpp); a decode step takes
// n_heads × context exponentials, too many for the libm call.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>

namespace kvq::detail {

// exp(x) for x ≤ 0 (larger x is not needed here); NaN stays NaN, −inf and x < −87.3 give ≈ 0.
inline float exp_nonpositive(float x) {
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
void softmax_update(float* s, int g, size_t n, const float* offsets, float scale, SoftmaxState* state, float* acc,
                    int d);

// Merges partial state b (with accumulator acc_b, d values) into a (acc_a); both over disjoint rows.
void merge_softmax(SoftmaxState& a, float* acc_a, const SoftmaxState& b, const float* acc_b, int d);

}  // namespace kvq::detail
