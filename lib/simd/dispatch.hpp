// Run-time choice of SIMD level. Each level's kernels are compiled in their own file with that level's
// flags only; this file (compiled without them) keeps one table per level that the CPU runs, with every
// kernel a level lacks taken from the scalar specification (never a null call), and picks the level in
// use on first use: the best level the CPU runs (or the one KVQ_SIMD / force_simd_level() asks for) that
// passes its self-check (selfcheck.hpp), falling back level by level to scalar.
#pragma once

#include <string>

#include "../ref/block_codecs.hpp"
#include "../ref/channel_codes.hpp"
#include "../ref/rotated_kernels.hpp"
#include "../ref/softmax.hpp"
#include "../ref/rotated_quantize.hpp"
#include "kvq/simd.hpp"

namespace kvq::detail {

// The kernels of one SIMD level, made by lib/simd/level_<isa>.cpp (each compiled with its own flags).
// Any pointer may be null (the level has no such kernel): dispatch fills it from the specification.
struct LevelKernels {
    BlockKernels codec[static_cast<int>(BlockCodec::count)];
    bool (*all_finite)(const float* x, size_t n);  // no NaN or Inf in x[0..n)
    float (*finite_max_abs)(const float* x, size_t n);  // max |x_j| (0 for n = 0), or NaN if any is NaN or Inf
    RotatedKernels rotated{};  // polar and turbo codecs
    RotatedQuantizeKernels rotated_quantize{};  // their quantizers
    SoftmaxUpdate softmax = nullptr;
    ChannelScore channel_score = nullptr;  // chanB key scores
    // The contract check of the level's primitives (ops_check.hpp): null if all hold, else the first
    // broken one. Null pointer: nothing to check (scalar).
    const char* (*check_ops)() = nullptr;
};
const LevelKernels& level_sse2();
const LevelKernels& level_avx2();
const LevelKernels& level_avx512();
const LevelKernels& level_avx512_vnni();  // the avx512 level where the CPU has AVX512-VNNI
const LevelKernels& level_neon();

// True if x[0..n) holds no NaN or Inf (vectorized at the active level).
bool all_finite(const float* x, size_t n);
// The largest |x_j| of x[0..n) (0 for n = 0), or NaN if some x_j is NaN or Inf: one vectorized pass that
// checks finiteness and an input limit together.
float finite_max_abs(const float* x, size_t n);

// The kernels of codec c at the active level.
const BlockKernels& active_kernels(BlockCodec c);
// The kernels of codec c at a given level, whether or not it passed its self-check (for parity tests
// and benchmarks); nullptr if the level is not compiled or this CPU cannot run it.
const BlockKernels* level_kernels(BlockCodec c, SimdLevel level);

// The same for the polar and turbo codecs: the active level's; and a given level's own (nullptr if it
// has none and uses the scalar specification).
const RotatedKernels& active_rotated_kernels();
const RotatedKernels* level_rotated_kernels(SimdLevel level);

// Their quantizers: the active level's; and a given level's own (nullptr if it has none).
const RotatedQuantizeKernels& active_rotated_quantize();
const RotatedQuantizeKernels* level_rotated_quantize(SimdLevel level);

// The online softmax's block update at the active level, and at a given one (nullptr as above).
SoftmaxUpdate active_softmax();
SoftmaxUpdate level_softmax(SimdLevel level);
// The chanB score kernel at the active level, and at a given one (nullptr as above).
ChannelScore active_channel_score();
ChannelScore level_channel_score(SimdLevel level);
// The contract check of a level's primitives (ops_check.hpp); nullptr if it has none.
const char* (*level_check_ops(SimdLevel level))();

// While alive, this thread's kernels come from `level` (compiled and run by the CPU, or scalar),
// whatever level is in use: the self-check and selftest run a level through the whole codec path.
class LevelOverride {
public:
    explicit LevelOverride(SimdLevel level);
    ~LevelOverride();
    LevelOverride(const LevelOverride&) = delete;
    LevelOverride& operator=(const LevelOverride&) = delete;

private:
    int previous_;
};

// Test hook: replaces the score kernel of codec c at `level` by one that is off by one per score (or
// restores the real kernels with fault = false) and forgets the level's self-check and the choice of
// level, so the next use chooses again.
void inject_kernel_fault_for_testing(SimdLevel level, BlockCodec c, bool fault);

}  // namespace kvq::detail
