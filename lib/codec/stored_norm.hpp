// Norms and radii of the rotated codecs (polar, turbo), stored as fp16. A row whose norm does not fit is
// rejected before anything is written (no radius of a row is larger than its norm).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <cstddef>
#include <stdexcept>
#include <string>

#include "half.hpp"

namespace kvq::detail {

inline constexpr double kMaxHalf = 65504.0;

inline double row_norm(const float* x, int d) {
    double sum = 0;
    for (int j = 0; j < d; ++j) sum += double(x[j]) * x[j];
    return std::sqrt(sum);
}

inline void check_norms_fit_fp16(const std::string& codec, const float* x, size_t n_rows, int d) {
    for (size_t r = 0; r < n_rows; ++r) {
        const double norm = row_norm(x + r * d, d);
        if (norm > kMaxHalf) {
            throw std::invalid_argument("codec '" + codec + "': quantize_rows: row " + std::to_string(r) + " has norm " +
                                        std::to_string(norm) + ", beyond the fp16 range (65504) of its stored norm");
        }
    }
}

inline void store_half(uint8_t* p, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(p, &h, 2);
}

inline float load_half(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
}

}  // namespace kvq::detail
