// The polar codec: PolarQuant (Han, Kacham, Karbasi, Mirrokni, Zandieh, arXiv 2502.02617).
//
// The row is rotated (y = R·x, the seeded randomized Hadamard of lib/rotation) and cut into groups of 2^L
// values. In each group, level 1 turns the pairs (y₂ⱼ, y₂ⱼ₊₁) into radii and angles in [0, 2π); level
// ℓ ≥ 2 turns pairs of radii (r, r′) into a radius and the angle atan2(r′, r) in [0, π/2]. After L levels
// one radius per group is left. Every angle is stored as a code of its level's Lloyd-Max codebook
// (lloyd_max.hpp: uniform at level 1, density ∝ sin^(2^(ℓ−1)−1)(2ψ) above); the radius as fp16. The
// quantizer decides each code by compares against the thresholds' tangents, without computing the angle
// (lib/ref/rotated_quantize.hpp).
//
// | section (per row of d values)             | size                       |
// |-------------------------------------------|----------------------------|
// | level-1 codes, node order, b₁ bits each   | d/2 · b₁ bits              |
// | level-ℓ codes, ..., b_ℓ bits each         | d/2^ℓ · b_ℓ bits           |
// | (padding to a whole byte)                 |                            |
// | group radii, fp16                         | d/2^L · 2 bytes            |
//
// Codes of consecutive levels follow each other bit for bit (bit_codes.hpp). The default L = 4, bits
// 4.2.2.2 is 46 bits of codes and 16 of radius per 16 values: 3.875 bits/value (62 bytes at d = 128).
//
// Scoring never rebuilds keys in memory: prepare_queries rotates the query and tabulates, per level-1 pair
// p and code c, q′₂ₚ·cos θ_c + q′₂ₚ₊₁·sin θ_c; the scalar specification combines a row's level-1 entries up
// the tree with the cos/sin of the higher-level angle codes (cos ψ·t_left + sin ψ·t_right) and multiplies
// by the radius. SIMD levels decode 16 values at a time in registers instead (rotated_kernels.hpp,
// lib/simd/rotated_polar_avx2.hpp). Parameters and the budget allocation: polar_params.hpp. The codec
// always rotates.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "codec_impl.hpp"

namespace kvq::detail {

std::unique_ptr<CodecImpl> make_polar(std::string_view params, int head_dim, uint64_t seed);

}  // namespace kvq::detail
