#include "hadamard.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "../util/splitmix64.hpp"

namespace kvq::detail {
namespace {

void hadamard_blocks(const std::vector<int>& blocks, float* y) {
    int off = 0;
    for (int b : blocks) {
        fwht(y + off, b);
        const float norm = 1.0f / std::sqrt(static_cast<float>(b));
        for (int j = 0; j < b; ++j) y[off + j] *= norm;
        off += b;
    }
}

}  // namespace

void fwht(float* x, int n) {
    for (int h = 1; h < n; h <<= 1) {
        for (int i = 0; i < n; i += 2 * h) {
            for (int j = i; j < i + h; ++j) {
                const float a = x[j], b = x[j + h];
                x[j] = a + b;
                x[j + h] = a - b;
            }
        }
    }
}

Rotation::Rotation(int dim, uint64_t seed) : dim_(dim), signs_(dim > 0 ? dim : 0) {
    if (dim <= 0) throw std::invalid_argument("rotation: head_dim must be positive, got " + std::to_string(dim));
    uint64_t state = seed;
    uint64_t bits = 0;
    for (int j = 0; j < dim; ++j) {
        if (j % 64 == 0) bits = splitmix64(state);
        signs_[j] = (bits >> (j % 64)) & 1 ? -1.0f : 1.0f;
    }
    for (int rest = dim; rest > 0;) {
        int b = 1;
        while (b * 2 <= rest) b *= 2;
        blocks_.push_back(b);
        rest -= b;
    }
}

void Rotation::apply(const float* x, float* y) const {
    for (int j = 0; j < dim_; ++j) y[j] = x[j] * signs_[j];
    hadamard_blocks(blocks_, y);
}

void Rotation::apply_inverse(const float* y, float* x) const {
    if (x != y) {
        for (int j = 0; j < dim_; ++j) x[j] = y[j];
    }
    hadamard_blocks(blocks_, x);
    for (int j = 0; j < dim_; ++j) x[j] *= signs_[j];
}

}  // namespace kvq::detail
