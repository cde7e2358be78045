// The scalar specification of the online softmax's block update (softmax.hpp): 8 partial maxima and sums,
// one per lane, combined in the fixed order the SIMD levels use.
#include "softmax.hpp"

namespace kvq::detail {

void softmax_update_scalar(float* scores, int g, size_t n, const float* offsets, float scale, SoftmaxState* state,
                           float* acc, int d) {
    constexpr float kNegInf = -std::numeric_limits<float>::infinity();
    constexpr size_t kLanes = 8;
    for (int i = 0; i < g; ++i) {
        float* s = scores + i * n;
        const float offset = offsets ? offsets[i] : 0.0f;
        float max8[kLanes];
        for (float& m : max8) m = kNegInf;
        size_t r = 0;
        for (; r + kLanes <= n; r += kLanes) {
            for (size_t l = 0; l < kLanes; ++l) {
                const float v = (s[r + l] + offset) * scale;
                s[r + l] = v;
                max8[l] = v > max8[l] ? v : max8[l];  // a NaN score is skipped here
            }
        }
        float block_max = kNegInf;
        for (float m : max8) block_max = m > block_max ? m : block_max;
        for (; r < n; ++r) {
            s[r] = (s[r] + offset) * scale;
            block_max = s[r] > block_max ? s[r] : block_max;
        }

        SoftmaxState& st = state[i];
        if (block_max > st.max) {
            // From −inf (no rows yet) the factor is exactly 0 and the accumulator is still all zeros.
            const float rescale = st.max == kNegInf ? 0.0f : exp_nonpositive(st.max - block_max);
            st.sum *= rescale;
            st.max = block_max;
            float* a = acc + static_cast<size_t>(i) * d;
            for (int j = 0; j < d; ++j) a[j] *= rescale;
        }
        const float m = st.max;
        float sum8[kLanes] = {};
        r = 0;
        for (; r + kLanes <= n; r += kLanes) {
            for (size_t l = 0; l < kLanes; ++l) {
                s[r + l] = exp_nonpositive(s[r + l] - m);
                sum8[l] += s[r + l];
            }
        }
        float sum = ((sum8[0] + sum8[1]) + (sum8[2] + sum8[3])) + ((sum8[4] + sum8[5]) + (sum8[6] + sum8[7]));
        for (; r < n; ++r) {
            s[r] = exp_nonpositive(s[r] - m);
            sum += s[r];
        }
        st.sum += sum;
    }
}

}  // namespace kvq::detail
