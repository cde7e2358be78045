// The online softmax of flash attention (Milakov & Gimelshein, arXiv 1805.02867; FlashAttention-2,
// arXiv 2307.08691): scores arrive a block at a time; a running max m and sum l per query let the
// weights of each block be exp(s − m) straight away, and the value accumulator is rescaled by
// exp(m_old − m_new) only when the max grows. Partial states over different rows merge exactly.
//
// exp is the Cephes single-precision polynomial (≈1 ulp on the range used here, s − m ≤ 0), with plain
// arithmetic and bit operations so that it runs 8 lanes wide (lib/ref/softmax.hpp); a decode step
// takes n_heads × context exponentials, too many for the libm call.
#pragma once

#include "../ref/softmax.hpp"

namespace kvq::detail {

// One block's update (lib/ref/softmax.hpp: SoftmaxUpdate), at the active SIMD level.
void softmax_update(float* s, int g, size_t n, const float* offsets, float scale, SoftmaxState* state, float* acc,
                    int d);

// Merges partial state b (with accumulator acc_b, d values) into a (acc_a); both over disjoint rows.
void merge_softmax(SoftmaxState& a, float* acc_a, const SoftmaxState& b, const float* acc_b, int d);

}  // namespace kvq::detail
