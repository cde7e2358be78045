// Norms and radii of the rotated codecs (polar, turbo), stored as fp16. A row whose norm does not fit is
// rejected by kvq::Codec before anything is written (their input_limit() is the default: an L2 norm of
// at most 65504, and no radius of a row is larger than its norm); under NanPolicy::propagate it is
// stored as the Inf it becomes.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "half.hpp"

namespace kvq::detail {

static inline double row_norm(const float* x, int d) {
    double sum = 0;
    for (int j = 0; j < d; ++j) sum += double(x[j]) * x[j];
    return std::sqrt(sum);
}

static inline void store_half(uint8_t* p, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(p, &h, 2);
}

static inline float load_half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
}

}  // namespace kvq::detail
