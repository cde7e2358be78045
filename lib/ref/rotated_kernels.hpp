// The kernels of the always-rotated codecs (lib/codec/turbo.hpp, polar.hpp) over plain descriptions of
// their row layouts, and their rows in the kernel grid (RotatedCodec, below). The scalar rows
// (rotated_spec.cpp) are the specification; a SIMD level may provide its own kernel for any slot, which
// must agree to float rounding (quantize: the same bytes). Kernels never throw and never allocate.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq::detail {

inline constexpr int kPolarBatch = 16;  // values per SIMD batch of the polar layout (8 level-1 pairs)

struct TurboLayout {
    int d = 0;
    int n_hi = 0;                          // channels 0..n_hi use bits_hi, the rest bits_lo
    int bits_hi = 0, bits_lo = 0;
    // The value of each code, zero-padded to at least 16 entries (turbo_codebook.hpp: sign-magnitude codes).
    const float* centroids_hi = nullptr;
    const float* centroids_lo = nullptr;
    // When every channel has the same width of 2 to 4 bits and d is a multiple of 32 (int8_order = that
    // width): the values are scale_hi · ints_hi[code] (16 int8 entries), and the prepared query also holds
    // int8 blocks, ordered as the kernels read codes of that width (below).
    float scale_hi = 0;
    const int8_t* ints_hi = nullptr;
    int int8_order = 0;
    // The tcq rows (lib/ref/tcq.hpp; B from the row): f codes of B−1 bits at byte 0, the u plane at
    // plane_off; the value of rank k is centroids_hi[k] = scale_hi · ints_hi[k] (σ units); int8_order is 2
    // (the SIMD kernels' order of ranks; the scalar ones score from the float q̃).
    size_t plane_off = 0;
    bool qjl = false;
    size_t sign_off = 0, norm_off = 0, gamma_off = 0;  // byte offsets in a row
    size_t prep_q8_off = 0, prep_scale_off = 0, prep_sum_off = 0;  // byte offsets in a prepared query
};

// Prepared turbo query: q̃ = the rotated query R·q rounded to int8 per block of 32 values (scale amax/127,
// as ggml's q8_0) and dequantized (d floats); then for QJL √(π/2)/d · S·q̃ (d floats); then, at
// prep_q8_off, the same int8 values with each 32-block in the order the int8 kernel reads codes
// (int8_order 4: the 16 even then the 16 odd positions; 2: positions 4i, then 4i+1, 4i+2, 4i+3; 3 and 0:
// index order), at prep_scale_off the block scales (floats), and at prep_sum_off each block's sum of its
// int8 values (int32: a kernel on unsigned codes takes back its offset with it). Scores are q̃ · x̃.
// accumulate: acc (rotated basis) += Σ_r w·‖x_r‖·c[code]; for QJL also sketch[i·d + k] +=
// Σ_r w·‖x_r‖·‖r_r‖·sign_k (the caller maps it back with Sᵀ once).
using TurboScore = void (*)(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q,
                            const uint8_t* rows, size_t row_stride, size_t n_rows, float* scores, size_t score_stride);
using TurboAccumulate = void (*)(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                                 size_t row_stride, size_t n_rows, float* acc, float* sketch);

struct PolarLayout {
    int d = 0, levels = 0;
    int bits[8] = {};
    size_t bit_off[8] = {};              // where level ℓ+1's codes start in a row
    // Tables are zero-padded to at least 16 entries (cos1, sin1) and 16 floats (cossin), so a SIMD level
    // may load them as whole registers.
    const float* cos1 = nullptr;         // level 1: cos and sin of the 2^bits[0] centroids
    const float* sin1 = nullptr;
    const float* cossin[8] = {};         // level ℓ+1 ≥ 2: [2c] = cos, [2c+1] = sin of centroid c
    // For levels 2, 3, 4 (index ℓ−2), when L ≥ 4 and a 16-value batch's codes of that level (2^(4−ℓ) codes)
    // take at most 12 bits: 8 floats per value k of those bits, lane j = the factor leaf j of the batch
    // gets from its level-ℓ ancestor (cos or sin of the ancestor's angle). Otherwise nullptr.
    const float* batch_factors[3] = {};
    // Levels 3 and 4 together, when their codes of a batch take at most 8 bits: index k3 | k4 << (2·b3),
    // the product of the two factors. Otherwise nullptr.
    const float* batch_factors34 = nullptr;
    size_t radius_off = 0;               // fp16 radii, one per 2^levels values
    size_t row_bytes = 0;
};

// Prepared polar query: q′ = R·q with each 16-value batch stored as its 8 even then its 8 odd values
// (values past the last whole batch as they are), then the level-1 table T[p·n₁ + c] = q′₂ₚ·cos θ_c +
// q′₂ₚ₊₁·sin θ_c for every pair p (the scalar specification scores with T).
using PolarScore = void (*)(const PolarLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q,
                            const uint8_t* rows, size_t row_stride, size_t n_rows, float* scores, size_t score_stride);
using PolarAccumulate = void (*)(const PolarLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                                 size_t row_stride, size_t n_rows, float* acc);

// Quantizers (rotated_quantize.hpp). residual (turbo_qjl, else null): n_rows × d floats, u − c of each row
// (the QJL stage's input).
struct TurboQuantizeLayout;
struct PolarQuantizeLayout;
struct TcqAlphabet;
using TurboQuantize = void (*)(const TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                               size_t dst_stride, float* residual);
using PolarQuantize = void (*)(const PolarQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                               size_t dst_stride);
// The signature of tcq_viterbi (tcq.hpp).
using TcqViterbi = float (*)(const TcqAlphabet& a, const float* t, int n, uint8_t* u, uint8_t* f);

// The rows of the rotated codecs in the kernel grid: each has its own quantize, score and accumulate slot
// at every level, and a slot a level leaves empty is the specification's (lib/simd/dispatch.hpp). A codec
// picks its row once, when it is made (lib/codec/turbo.cpp, polar.cpp): turbo is turbo2…turbo4,
// turbo_split turbo2.5 and turbo3.5, turbo_qjl turboB_qjl, tcq2 and tcq3 the trellis codecs, polar every
// polar configuration. The rows before polar share the turbo layout description (TurboLayout: codes, an
// fp16 scale, the int8 prepared query), each with kernels of its own.
enum class RotatedCodec : int { turbo, turbo_split, turbo_qjl, tcq2, tcq3, polar, count };
inline constexpr int kRotatedCodecCount = static_cast<int>(RotatedCodec::count);
inline constexpr int kTurboRows = static_cast<int>(RotatedCodec::polar);  // the rows on TurboLayout
inline constexpr const char* kRotatedCodecNames[] = {"turbo", "turbo_split", "turbo_qjl", "tcq2", "tcq3", "polar"};
static_assert(sizeof kRotatedCodecNames / sizeof *kRotatedCodecNames == kRotatedCodecCount);
enum class RotatedOp : int { quantize, score, accumulate, count };
inline constexpr const char* kRotatedOpNames[] = {"quantize", "score", "accumulate"};

struct TurboRowKernels {
    TurboQuantize quantize = nullptr;
    TurboScore score = nullptr;
    TurboAccumulate accumulate = nullptr;
};
struct PolarRowKernels {
    PolarQuantize quantize = nullptr;
    PolarScore score = nullptr;
    PolarAccumulate accumulate = nullptr;
};

// One level's rotated kernels: a row each, and tcqB's Viterbi encoder (the helper both tcq rows' quantize
// share: the specification's or a level's, the same u and f).
struct RotatedKernels {
    TurboRowKernels turbo_rows[kTurboRows] = {};
    PolarRowKernels polar = {};
    TcqViterbi tcq_viterbi = nullptr;

    const TurboRowKernels& row(RotatedCodec c) const { return turbo_rows[static_cast<int>(c)]; }
};

// The scalar level's rows: the specification's kernels of every row (rotated_spec.cpp, one line a row).
const RotatedKernels& scalar_rotated_kernels();

// The specification's score and accumulate of turbo's rows (turbo, turbo_split, turbo_qjl) and polar's
// (rotated_scalar.cpp); their quantizers are in rotated_quantize.hpp.
void turbo_score_spec(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                      size_t row_stride, size_t n_rows, float* scores, size_t score_stride);
void turbo_accumulate_spec(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                           size_t row_stride, size_t n_rows, float* acc, float* sketch);
void polar_score_spec(const PolarLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                      size_t row_stride, size_t n_rows, float* scores, size_t score_stride);
void polar_accumulate_spec(const PolarLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                           size_t row_stride, size_t n_rows, float* acc);

// Row decoding shared by dequantize and the kernels. turbo: c[j] = centroid of code j (not yet
// times the norm); signs[k] = ±1. polar: the row in the rotated basis.
void turbo_decode_centroids(const TurboLayout& l, const uint8_t* row, float* c);
void turbo_decode_signs(const TurboLayout& l, const uint8_t* row, float* signs);
void polar_decode_rotated(const PolarLayout& l, const uint8_t* row, float* y);
void polar_decode_group(const PolarLayout& l, const uint8_t* row, int g, float* v);  // group g: 2^levels values

// Functions in headers that SIMD files include must not be inline (the linker could keep a copy compiled
// with wider instructions for everyone), which is why everything here is out of line.

}  // namespace kvq::detail
