// Parameters of the polar codec and the bit allocation that minimizes its error for a budget.
//
//   polar                      L = 4 levels, bits 4.2.2.2 (PolarQuant's choice: 3.875 bits/value)
//   polar:bits=4.3.2           the bits of levels 1..L (L = their count), level 1 in 1..8, others 0..8
//   polar:L=4,bits=4.2.2.2     the same, with L stated
//   polar:budget=3             the levels and bits of least error within 3 bits/value (everything counted;
//                              at most the largest allocation's bits: 12 at L=1 for head_dim 128)
//   polar:L=3,budget=3.5       the same with the level count fixed
//
// The error model: with radii r and angle errors Δ at every node, a group's squared error is
// Σ_levels Σ_nodes r²·2(1 − cos Δ) to first order, and the squared radii of each level sum to the group's
// energy; so the relative squared error is Σ_ℓ E[2(1 − cos Δ_ℓ)], one term per level, each a property of
// that level's codebook (lloyd_max.hpp: chord_error). Minimizing it for a bit budget is a knapsack over
// levels, solved exactly by dynamic programming.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvq::detail {

inline constexpr int kPolarMaxLevels = 8;
inline constexpr int kPolarMaxBits = 8;

struct PolarConfig {
    int levels = 4;
    std::vector<int> bits = {4, 2, 2, 2};  // bits[ℓ−1]: bits of a level-ℓ angle
};

// Throws std::invalid_argument naming the problem and the valid range (unknown key, bad number, head_dim
// not divisible by 2^L, budget below what any allocation needs or beyond what the largest allocation
// uses, ...).
PolarConfig parse_polar_params(std::string_view params, int head_dim);

// The allocation of least modelled error whose rows take at most budget·head_dim bits; levels = 0 tries
// every level count that divides head_dim. Throws std::invalid_argument when nothing fits, or when the
// budget is beyond the largest allocation's bits per value (every level at kPolarMaxBits bits).
PolarConfig min_error_allocation(double budget, int head_dim, int levels = 0);

// Relative squared error of the model above (fp16 radii count as exact).
double polar_model_error(const PolarConfig& config);
// Bytes of one row: the angle codes of every level, packed, then d/2^L fp16 radii.
size_t polar_row_bytes(const PolarConfig& config, int head_dim);
// "L=4,bits=4.2.2.2"
std::string to_string(const PolarConfig& config);

}  // namespace kvq::detail
