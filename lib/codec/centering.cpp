#include "centering.hpp"

#include "../ref/half.hpp"

namespace kvq::detail {

void center_block(const float* k, size_t k_stride, size_t n, int d, uint16_t* mean16, float* centered) {
    for (int j = 0; j < d; ++j) {
        double sum = 0;
        for (size_t t = 0; t < n; ++t) sum += k[t * k_stride + j];
        mean16[j] = f32_to_f16(static_cast<float>(sum / static_cast<double>(n)));
    }
    subtract_mean(k, k_stride, n, d, mean16, centered);
}

void subtract_mean(const float* k, size_t k_stride, size_t n, int d, const uint16_t* mean16, float* centered) {
    for (size_t t = 0; t < n; ++t) {
        for (int j = 0; j < d; ++j) centered[t * d + j] = k[t * k_stride + j] - f16_to_f32(mean16[j]);
    }
}

}  // namespace kvq::detail
