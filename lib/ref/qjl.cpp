#include "qjl.hpp"

#include <cmath>
#include <numbers>

#include "../util/splitmix64.hpp"

namespace kvq::detail {
namespace {

// Uniform in (0, 1], from the top 53 bits.
double uniform(uint64_t& state) { return (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53; }

}  // namespace

QjlSketch::QjlSketch(int dim, uint64_t seed)
    : dim_(dim), scale_(static_cast<float>(std::sqrt(std::numbers::pi / 2) / dim)), s_(size_t(dim) * dim) {
    // Box–Muller on our own generator (std::normal_distribution differs between standard libraries, and
    // the matrix must be the same wherever the bytes are read). A distinct stream from the rotation's.
    uint64_t state = seed ^ 0x716a6c5f736b6574ull;  // "qjl_sket"
    for (size_t i = 0; i < s_.size(); i += 2) {
        const double radius = std::sqrt(-2.0 * std::log(uniform(state)));
        const double angle = 2.0 * std::numbers::pi * uniform(state);
        s_[i] = static_cast<float>(radius * std::cos(angle));
        if (i + 1 < s_.size()) s_[i + 1] = static_cast<float>(radius * std::sin(angle));
    }
}

void QjlSketch::sketch(const float* r, uint8_t* sign_bits) const {
    for (int k = 0; k < dim_; k += 8) sign_bits[k >> 3] = 0;
    for (int k = 0; k < dim_; ++k) {
        const float* row = s_.data() + size_t(k) * dim_;
        float dot = 0;
        for (int j = 0; j < dim_; ++j) dot += row[j] * r[j];
        if (dot < 0) sign_bits[k >> 3] |= static_cast<uint8_t>(1u << (k & 7));
    }
}

void QjlSketch::project(const float* q, float* out) const {
    for (int k = 0; k < dim_; ++k) {
        const float* row = s_.data() + size_t(k) * dim_;
        float dot = 0;
        for (int j = 0; j < dim_; ++j) dot += row[j] * q[j];
        out[k] = dot;
    }
}

void QjlSketch::add_transposed(const float* z, float factor, float* acc) const {
    for (int k = 0; k < dim_; ++k) {
        const float zk = factor * z[k];
        if (zk == 0) continue;
        const float* row = s_.data() + size_t(k) * dim_;
        for (int j = 0; j < dim_; ++j) acc[j] += zk * row[j];
    }
}

}  // namespace kvq::detail
