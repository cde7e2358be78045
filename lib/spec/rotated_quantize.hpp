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
// - polar's angles come from polar_angle (below), kvq's own atan2 of one division and a fixed polynomial,
//   instead of the C library's (whose bits differ between libraries and from any vector version).
// Rows a SIMD level does not take (a NaN, an Inf or a huge value, where the order of a NaN's operands
// would show in its bits) go through the specification's row function.
#pragma once

#include <cstddef>
#include <cstdint>

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
};

struct PolarQuantizeLayout {
    RotationLayout rot;
    int levels = 0;
    int bits[8] = {};
    size_t bit_off[8] = {};
    const float* bounds[8] = {};  // level ℓ+1: 2^bits − 1 ascending thresholds (zero-padded to 16)
    size_t radius_off = 0, row_bytes = 0;
};

// residual (turbo, may be null): n_rows × d floats, u − c of each row (the QJL stage's input).
struct RotatedQuantizeKernels {
    void (*turbo)(const TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride,
                  float* residual) = nullptr;
    void (*polar)(const PolarQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) = nullptr;
};

// The specification: whole calls, and one row (for the rows a SIMD level leaves to it).
const RotatedQuantizeKernels& scalar_rotated_quantize();
void turbo_quantize_row_spec(const TurboQuantizeLayout& l, const float* x, uint8_t* row, float* residual);
void polar_quantize_row_spec(const PolarQuantizeLayout& l, const float* x, uint8_t* row);

// The specification's last steps of a turbo row: the partial sums' trees, and turbo's stored scale from
// the norm, ⟨c, u⟩ and ‖c‖² (fp16, written to row + norm_off). A SIMD level repeats them operation for
// operation, the trees in registers and a tile of rows' scales converted to fp16 together
// (lib/simd/quantize_turbo_impl.hpp).
double sum16_double(const double* partials);
float sum16_float(const float* partials);
void turbo_store_scale(const TurboQuantizeLayout& l, double norm, float cu, float cc, uint8_t* row);
// 1/norm as the row's float multiplier: 0 for a zero row or one so small that 1/norm overflows.
float turbo_inverse_norm(double norm);

// kvq's atan2: the angle of (x, y) in [0, 2π) (polar_angle) or, for x, y ≥ 0, in [0, π/2]
// (polar_angle_q1). One division and the Cephes atanf polynomial (|error| < 2e-7), in an order every
// SIMD level repeats (quantize_rotated_impl.hpp). NaN gives some angle; the row's radius is NaN then.
float polar_angle(float y, float x);
float polar_angle_q1(float y, float x);

// The same rotation tables a SIMD level reads.
RotationLayout rotation_layout(const Rotation& r);

}  // namespace kvq::detail
