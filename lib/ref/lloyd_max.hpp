// Analytic scalar codebooks: Lloyd-Max quantizers computed from a known density, never trained on data
// (as faiss does for its TurboQuant and RaBitQ codecs).
//
// - sphere_coordinate_codebook(bits, dim): one coordinate of a uniformly random unit vector in R^dim has
//   density ∝ (1 − x²)^((dim−3)/2) on [−1, 1] (≈ N(0, 1/dim)); a randomized rotation makes every row's
//   coordinates look like that. TurboQuant-MSE (arXiv 2504.19874) quantizes each one with this codebook.
// - polar_angle_codebook(level, bits): PolarQuant (arXiv 2502.02617). Level-1 angles of a rotated vector
//   are uniform on [0, 2π) (the optimal codebook is the uniform grid); a level-ℓ angle ψ = atan2(r′, r) of
//   two radii, each the norm of k = 2^(ℓ−1) Gaussians, has density ∝ sin^(k−1)(2ψ) on [0, π/2].
//
// Codebooks are computed once per (bits, dim) or (level, bits), on first use, and cached for the life of
// the process; the functions are thread-safe and the returned references stay valid.
#pragma once

#include <cstdint>
#include <vector>

namespace kvq::detail {

struct ScalarCodebook {
    int bits = 0;
    std::vector<float> centroids;   // 2^bits, ascending
    std::vector<float> boundaries;  // 2^bits − 1 decision thresholds, ascending (midpoints of centroids)
    double mse = 0;                 // E[(x − Q(x))²] under the density
    double chord_error = 0;         // E[2(1 − cos(x − Q(x)))]: the squared error of a unit vector whose
                                    // angle x is quantized (angle codebooks only)

    // Index of the nearest centroid (the cell that holds x).
    int encode(float x) const;
};

const ScalarCodebook& sphere_coordinate_codebook(int bits, int dim);
const ScalarCodebook& polar_angle_codebook(int level, int bits);

// Lloyd-Max on a density given at the midpoints of n equal cells over [lo, hi] (weights need not be
// normalized). Starts from the high-resolution optimum and iterates to a fixed point.
ScalarCodebook lloyd_max(const std::vector<double>& cell_weight, double lo, double hi, int bits);

}  // namespace kvq::detail
