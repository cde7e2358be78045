// QJL: the 1-bit quantized Johnson–Lindenstrauss sketch (Zandieh, Daliri, Han, arXiv 2406.03482), as the
// second stage of TurboQuant-prod (arXiv 2504.19874, Algorithm 2).
//
// S is a seeded dim × dim matrix of independent N(0, 1) entries. A residual r is stored as the signs of
// S·r and its norm γ = ‖r‖; it is reconstructed as r̃ = √(π/2)/dim · γ · Sᵀ sign(S·r). For a Gaussian
// row s, E[sign(⟨s, r⟩) s] = √(2/π) r/‖r‖, so E[⟨q, r̃⟩] = ⟨q, r⟩ over the draw of S: the inner-product
// estimate is unbiased, with variance at most π/(2·dim) · γ² ‖q‖².
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvq::detail {

class QjlSketch {
public:
    QjlSketch(int dim, uint64_t seed);
    int dim() const { return dim_; }
    // √(π/2)/dim: the factor in front of γ · Sᵀ sign(S·r).
    float scale() const { return scale_; }

    // Sign bits of S·r into ceil(dim/8) bytes: bit k set when (S·r)_k < 0 (the float sign-bit convention).
    void sketch(const float* r, uint8_t* sign_bits) const;
    // out = S·q.
    void project(const float* q, float* out) const;
    // acc += factor · Sᵀ·z.
    void add_transposed(const float* z, float factor, float* acc) const;

    // ±1 for bit k of a sign section.
    static float sign_of(const uint8_t* sign_bits, int k) { return (sign_bits[k >> 3] >> (k & 7)) & 1 ? -1.0f : 1.0f; }

private:
    int dim_;
    float scale_;
    std::vector<float> s_;  // row-major: row k is s_[k·dim .. (k+1)·dim)
};

}  // namespace kvq::detail
