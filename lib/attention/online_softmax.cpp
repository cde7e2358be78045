#include "online_softmax.hpp"

namespace kvq::detail {

float softmax_block(float* s, size_t n, SoftmaxState& state) {
    float block_max = -std::numeric_limits<float>::infinity();
    for (size_t r = 0; r < n; ++r) block_max = s[r] > block_max ? s[r] : block_max;
    float rescale = 1.0f;
    if (block_max > state.max) {
        // From −inf (no rows yet) the factor is exactly 0, and the accumulator is still all zeros.
        rescale = state.max == -std::numeric_limits<float>::infinity() ? 0.0f
                                                                       : exp_nonpositive(state.max - block_max);
        state.sum *= rescale;
        state.max = block_max;
    }
    const float m = state.max;
    float sum = 0.0f;
    for (size_t r = 0; r < n; ++r) {
        s[r] = exp_nonpositive(s[r] - m);
        sum += s[r];
    }
    state.sum += sum;
    return rescale;
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
