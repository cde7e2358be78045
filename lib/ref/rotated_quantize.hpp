// Quantize kernels of the always-rotated codecs (turbo.hpp, polar.hpp) over plain descriptions of what a
// row needs: the rotation, the codebooks' decision thresholds and the row layout. The scalar functions
// here (rotated_quantize_scalar.cpp) are the specification; a SIMD level may provide its own kernels
// (lib/simd/quantize_rotated_impl.hpp), which must write the same bytes.
//
// Every step of the specification is one that a SIMD level can do with the same float operations in the
// same order, so the bytes are the same at every level:
// - the rotation is Rotation::apply (signs, then the Walsh-Hadamard butterflies stage by stage, h = 1, 2,
//   4, ..., then 1/√b): a butterfly's a + b and a − b are exact functions of a and b whatever the lane;
// - sums over a row (turbo's norm in double, ⟨c, u⟩ and ‖c‖² in float) are kept in 16 partial sums, value
//   j adding to partial j mod 16 in increasing j, and the partials are added as a tree (sum16_*); any
//   level whose register holds 1, 2, 4, 8 or 16 of them accumulates the same partials in the same order;
// - a code is the rank of the value among its codebook's ascending thresholds, the number of thresholds
//   t with !(v < t) (what std::upper_bound returns, NaN included); a binary search gives the same rank;
// - polar computes no angle: a code is the number of thresholds an angle is past, and "the angle of
//   (x, y) is past t" is y > x·tan t (x, y ≥ 0), so the code is a count of products and compares
//   against a table of tangents (polar_level1_code, polar_node_code below): no division, no polynomial,
//   no C library function whose bits differ between libraries and from any vector version. Nodes above
//   level 1 compare squared radii against squared tangents, so no radius needs a square root but the
//   row's last ones.
// Rows a SIMD level does not take (a NaN, an Inf or a huge value, where the order of a NaN's operands
// would show in its bits) go through the specification's row function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "rotated_kernels.hpp"

namespace kvq::detail {

class Rotation;
class QjlSketch;

// The seeded rotation as a SIMD level reads it: y = H·D·x with H block-diagonal over power-of-two blocks.
struct RotationLayout {
    int d = 0;
    const float* signs = nullptr;  // D, ±1 per value
    int n_blocks = 0;
    int blocks[32] = {};  // sizes, largest first, summing to d
    const Rotation* rotation = nullptr;  // the same rotation, for the specification
};

// One section of a turbo row: channels [begin, begin + count) coded with `bits` bits, starting at bit
// bit_off of the row (a whole byte).
struct TurboSection {
    int begin = 0, count = 0, bits = 0;
    size_t bit_off = 0;
    const float* bounds = nullptr;         // 2^bits − 1 ascending thresholds (zero-padded to 16)
    const uint8_t* code_by_rank = nullptr;  // sign-magnitude codes (turbo_codebook.hpp)
    const float* value_by_rank = nullptr;  // centroid of each rank (padded to 16)
    const int8_t* int_by_rank = nullptr;   // value_by_rank[k] = scale · int_by_rank[k]
    float scale = 0;
};

struct TurboQuantizeLayout {
    RotationLayout rot;
    TurboSection sections[2];
    int n_sections = 1;
    int scale_mode = 1;  // TurboScale: 0 norm, 1 ls, 2 unbiased
    size_t norm_off = 0, row_bytes = 0;
    size_t plane_off = 0;  // the tcq rows' u plane (their sections unused)
};

struct PolarQuantizeLayout {
    RotationLayout rot;
    int levels = 0;
    int bits[8] = {};
    size_t bit_off[8] = {};
    const float* tangents[8] = {};  // level ℓ+1: polar_tangents (ascending, zero-padded to 32)
    size_t radius_off = 0, row_bytes = 0;
};

// The specification: whole calls (scalar_rotated_kernels(), rotated_kernels.hpp), and one row (for the
// rows a SIMD level leaves to it).
void turbo_quantize_rows_spec(const TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                              size_t dst_stride, float* residual);
void polar_quantize_rows_spec(const PolarQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                              size_t dst_stride);
void turbo_quantize_row_spec(const TurboQuantizeLayout& l, const float* x, uint8_t* row, float* residual);
void polar_quantize_row_spec(const PolarQuantizeLayout& l, const float* x, uint8_t* row);
// A tcqB row over alphabet a: y = R·x and the norm as turbo's row, t = y·(1/‖x‖)·√d in float (u = y/‖x‖
// first, as turbo's, then times fl(√d)), the Viterbi codes of t (tcq.hpp), and turbo's scale of c = the
// chosen levels (σ units) and u, so x̃ = s·Rᵀc: ls and unbiased as they are; norm stores ‖x‖/√d. A row
// whose 1/‖x‖ is 0 (zero, too small, NaN, Inf) gets all codes 0, so the encoder sees only finite t.
// viterbi: the specification's tcq_viterbi or a SIMD level's, which writes the same codes.
void tcq_quantize_row(const TcqAlphabet& a, const TurboQuantizeLayout& l, const float* x, uint8_t* row,
                      TcqViterbi viterbi);

// The specification's last steps of a turbo row: the partial sums' trees, and turbo's stored scale from
// the norm, ⟨c, u⟩ and ‖c‖² (fp16, written to row + norm_off). A SIMD level repeats them operation for
// operation, the trees in registers and a tile of rows' scales converted to fp16 together
// (lib/simd/quantize_turbo_impl.hpp).
double sum16_double(const double* partials);
float sum16_float(const float* partials);
void turbo_store_scale(const TurboQuantizeLayout& l, double norm, float cu, float cc, uint8_t* row);
// 1/norm as the row's float multiplier: 0 for a zero row or one so small that 1/norm overflows.
float turbo_inverse_norm(double norm);

// Polar's codes without angles (PolarQuant, arXiv 2502.02617, quantizes the angles themselves; a code is
// the same cell of the same codebook, decided by compares).
//
// Level 1 (bits B, 2^B uniform cells of [0, 2π), the pair (a, b) of rotated values): the octant by exact
// compares, then the cell within it from the tangents of the octant's thresholds. With the quadrant
// 2X + Y (X = b < 0, Y = (a < 0) ≠ X, counterclockwise) and Z = (|a| < |b|) ≠ Y (past the quadrant's
// diagonal, from its first axis), the octant is o = 4X + 2Y + Z; B ≤ 3: code = o >> (3 − B); B ≥ 4,
// h = 2^(B−3) cells per octant: i = #{k < h − 1 : min(|a|, |b|) > max(|a|, |b|)·T_k}
// (T_k = fl(tan((k + 1)·π/2^(B−1))), ascending), and code = o·h + (Z ? h − 1 − i : i) (the odd octants
// are the even ones mirrored). Computed as bit masks: code = (b < 0 ? 2^B − 1 : 0) ^ (a < 0 ? 2^(B−1) − 1
// : 0) ^ (|a| < |b| ? 2^(B−2) − 1 : 0) ^ i (B ≥ 2 for the third term, i = 0 for B ≤ 3).
// Only the octants' own boundaries (the axes and diagonals, where tan is 0, 1 or ∞) can hold a pair
// exactly; a pair there takes one of the two cells beside it (zeros count as positive, (±0, ±0) is code
// 0), and both are equally far from it. Elsewhere a code differs from the cell of the exact angle only
// within a float rounding of a threshold (the product's rounding and T_k's).
//
// Level ℓ ≥ 2 (bits B, the Lloyd-Max thresholds t_k of [0, π/2]): a node of the squared radii s1, s2
// of its two children (s = a·a + b·b at level 1, then s1 + s2, all in float) has the code
//   #{k < 2^B − 1 : s2 > s1·U_k}  (U_k = fl(tan²(t_k)), ascending),
// the rank of atan2(√s2, √s1) among the t_k. A product that underflows to 0 or overflows to ∞ still
// decides right (s2 > 0 is then past the threshold, s2 ≤ FLT_MAX is not); (0, 0) is code 0.
// The stored radius is √s of the last level, rounded to fp16.
//
// Both counts are binary searches of a predicate monotone in k (x, y ≥ 0 or NaN; x·T is
// non-decreasing in T), so a search of any order gives the same count; NaN gives 0.
uint32_t polar_level1_code(float a, float b, int bits, const float* tangents);
uint32_t polar_node_code(float s1, float s2, int bits, const float* tangents);
// The tangents a level compares with: level 1, bits ≥ 4: 2^(bits−3) − 1 of them; level ≥ 2: 2^bits − 1
// (thresholds: the codebook's float boundaries, ascending); computed in double, rounded to float once.
std::vector<float> polar_tangents(int level, int bits, const float* thresholds);

// The same rotation tables a SIMD level reads.
RotationLayout rotation_layout(const Rotation& r);

}  // namespace kvq::detail
