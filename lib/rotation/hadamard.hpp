// Seeded randomized Hadamard rotation y = H·D·x: D flips signs (from the seed), H is the normalized
// Walsh–Hadamard transform, O(d log d). For a head size that is not a power of two, H is block-diagonal
// over the largest power-of-two blocks (96 = 64 + 32). The rotation is orthogonal, so q·k = (Rq)·(Rk),
// and it spreads a few outlier channels over all channels (QuaRot, arXiv 2404.00456; TurboQuant).
#pragma once

#include <cstdint>
#include <vector>

namespace kvq::detail {

// In-place unnormalized fast Walsh–Hadamard transform of n values (n a power of two).
void fwht(float* x, int n);

class Rotation {
public:
    Rotation(int dim, uint64_t seed);
    int dim() const { return dim_; }
    void apply(const float* x, float* y) const;          // y = H D x  (x == y allowed)
    void apply_inverse(const float* y, float* x) const;  // x = D H y  (x == y allowed)
    const std::vector<int>& blocks() const { return blocks_; }
    const std::vector<float>& signs() const { return signs_; }  // D: ±1 per value

private:
    int dim_;
    std::vector<float> signs_;
    std::vector<int> blocks_;  // power-of-two block sizes, largest first, summing to dim_
};

}  // namespace kvq::detail
