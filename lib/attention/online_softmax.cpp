// The online softmax's merge of partial states; the block update runs at the active SIMD level
// (lib/simd/softmax_impl.hpp, specification lib/ref/softmax.cpp).
#include "online_softmax.hpp"

#include "../simd/dispatch.hpp"

namespace kvq::detail {

void softmax_update(float* scores, int g, size_t n, const float* offsets, float scale, SoftmaxState* state,
                    float* acc, int d) {
    active_softmax()(scores, g, n, offsets, scale, state, acc, d);
}

void merge_softmax(SoftmaxState& a, float* acc_a, const SoftmaxState& b, const float* acc_b, int d) {
    if (b.sum == 0.0f && b.max == -std::numeric_limits<float>::infinity()) return;  // b saw no rows
    const float m = a.max > b.max ? a.max : b.max;
    const float fa = a.max == -std::numeric_limits<float>::infinity() ? 0.0f : std::exp(a.max - m);
    const float fb = std::exp(b.max - m);
    for (int j = 0; j < d; ++j) acc_a[j] = acc_a[j] * fa + acc_b[j] * fb;
    a.sum = a.sum * fa + b.sum * fb;
    a.max = m;
}

}  // namespace kvq::detail
