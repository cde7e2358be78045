// Run-time choice of SIMD level. Each level's kernels are compiled in their own file with that level's
// flags only; this file (compiled without them) picks one level at run time, once, from what the CPU
// supports, overridable by the KVQ_SIMD environment variable or force_simd_level().
#pragma once

#include "../codec/kernels.hpp"
#include "../codec/rotated_kernels.hpp"
#include "kvq/simd.hpp"

namespace kvq::detail {

// The kernels of one SIMD level, made by lib/simd/level_<isa>.cpp (each compiled with its own flags).
struct LevelKernels {
    BlockKernels codec[static_cast<int>(BlockCodec::count)];
    bool (*all_finite)(const float* x, size_t n);  // no NaN or Inf in x[0..n)
    float (*finite_max_abs)(const float* x, size_t n);  // max |x_j| (0 for n = 0), or NaN if any is NaN or Inf
    RotatedKernels rotated{};  // polar and turbo codecs; all null where the level has none
};
const LevelKernels& level_sse2();
const LevelKernels& level_avx2();
const LevelKernels& level_avx512();
const LevelKernels& level_neon();

// True if x[0..n) holds no NaN or Inf (vectorized at the active level).
bool all_finite(const float* x, size_t n);
// The largest |x_j| of x[0..n) (0 for n = 0), or NaN if some x_j is NaN or Inf: one vectorized pass that
// checks finiteness and an input limit together.
float finite_max_abs(const float* x, size_t n);

// The kernels of codec c at the active level (falling back to the scalar specification where a level
// has no kernel for c).
const BlockKernels& active_kernels(BlockCodec c);
// The kernels of codec c at a given level (for parity tests and benchmarks); nullptr if not compiled.
const BlockKernels* level_kernels(BlockCodec c, SimdLevel level);

// The same for the polar and turbo codecs (lib/codec/rotated_kernels.hpp): the active level's, or the
// scalar specification where it has none; and a given level's (nullptr if it has none).
const RotatedKernels& active_rotated_kernels();
const RotatedKernels* level_rotated_kernels(SimdLevel level);

}  // namespace kvq::detail
