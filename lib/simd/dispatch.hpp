// Run-time choice of SIMD level. Each level's kernels are compiled in their own file with that level's
// flags only; this file (compiled without them) keeps one table per level that the CPU runs, with every
// kernel a level lacks taken from the scalar specification (never a null call), and picks the level in
// use on first use: the best level the CPU runs (or the one KVQ_SIMD / force_simd_level() asks for) that
// passes its self-check (selfcheck.hpp), falling back level by level to scalar.
#pragma once

#include <cstddef>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../ref/row_codecs.hpp"
#include "../ref/channel_codes.hpp"
#include "../ref/rotated_kernels.hpp"
#include "../ref/softmax.hpp"
#include "../ref/rotated_quantize.hpp"
#include "kvq/simd.hpp"

namespace kvq::detail {

// The operations of a block codec (BlockKernels), one line each in a level's kernel table.
enum class KernelOp : int { quantize, dequantize, prepare_query, score, accumulate, accumulate_grid, score_groups, count };
inline constexpr const char* kKernelOpNames[] = {"quantize",   "dequantize",      "prepare_query", "score",
                                                 "accumulate", "accumulate_grid", "score_groups"};
// The rotated codecs' operations are rows of the same grid (RotatedCodec × RotatedOp, rotated_kernels.hpp).
// A level's other kernels, each named by (codec, op) in the table: tcqB's Viterbi encoder (the helper of
// both tcq rows' quantize), the online softmax's, the chanB keys' score, the float checks and the
// primitives' contract check.
enum class OtherKernel : int {
    tcq_viterbi, softmax_update, chan_score, all_finite, finite_max_abs, check_ops, count
};
struct OtherKernelName {
    const char* codec;
    const char* op;
};
inline constexpr OtherKernelName kOtherKernelNames[] = {
    {"tcqB", "viterbi"},      {"softmax", "update"},          {"chanB", "score"},
    {"floats", "all_finite"}, {"floats", "finite_max_abs"}, {"primitives", "check_ops"},
};
static_assert(sizeof kKernelOpNames / sizeof *kKernelOpNames == static_cast<size_t>(KernelOp::count));
static_assert(sizeof kOtherKernelNames / sizeof *kOtherKernelNames == static_cast<size_t>(OtherKernel::count));

// The kernel name dispatch gives every slot a level leaves empty and the scalar level's: the scalar
// specification (lib/ref/).
inline constexpr const char* kSpecKernel = "spec";

// The kernels of one SIMD level, made by lib/simd/level_<isa>.cpp (each compiled with its own flags): the
// one place that chooses, by set<...>(), which kernel runs for each (codec, op) at that level (block codecs
// and rotated codecs alike), and names it. Any slot may stay empty (the level has no such kernel): dispatch fills it from the specification
// (named kSpecKernel), except accumulate_grid and score_groups, which stay null where a codec or level has
// none (their callers then take accumulate, or keys in rows).
struct LevelKernels {
    BlockKernels codec[kBlockCodecCount]{};
    bool (*all_finite)(const float* x, size_t n) = nullptr;  // no NaN or Inf in x[0..n)
    float (*finite_max_abs)(const float* x, size_t n) = nullptr;  // max |x_j| (0 for n = 0), or NaN if any is NaN or Inf
    RotatedKernels rotated{};  // the rotated codecs' rows (turbo … polar) and tcqB's Viterbi encoder
    SoftmaxUpdate softmax = nullptr;
    ChannelScore channel_score = nullptr;  // chanB key scores
    // The contract check of the level's primitives (ops_check.hpp): null if all hold, else the first
    // broken one. Null pointer: nothing to check (scalar).
    const char* (*check_ops)() = nullptr;
    // Each slot's kernel name (null: empty), as the level file gives it.
    const char* codec_names[kBlockCodecCount][static_cast<int>(KernelOp::count)] = {};
    const char* rotated_names[kRotatedCodecCount][static_cast<int>(RotatedOp::count)] = {};
    const char* other_names[static_cast<int>(OtherKernel::count)] = {};

    // The slot of operation Op in a codec's kernels, and of another kernel K.
    template <KernelOp Op>
    static constexpr auto& slot(BlockKernels& b) {
        if constexpr (Op == KernelOp::quantize) return b.quantize;
        else if constexpr (Op == KernelOp::dequantize) return b.dequantize;
        else if constexpr (Op == KernelOp::prepare_query) return b.prepare_query;
        else if constexpr (Op == KernelOp::score) return b.score;
        else if constexpr (Op == KernelOp::accumulate) return b.accumulate;
        else if constexpr (Op == KernelOp::accumulate_grid) return b.accumulate_grid;
        else return b.score_groups;
    }
    template <OtherKernel K>
    constexpr auto& slot() {
        if constexpr (K == OtherKernel::tcq_viterbi) return rotated.tcq_viterbi;
        else if constexpr (K == OtherKernel::softmax_update) return softmax;
        else if constexpr (K == OtherKernel::chan_score) return channel_score;
        else if constexpr (K == OtherKernel::all_finite) return all_finite;
        else if constexpr (K == OtherKernel::finite_max_abs) return finite_max_abs;
        else return check_ops;
    }
    // Codec c's operation Op runs `kernel`, called `name` in the table.
    template <KernelOp Op>
    void set(BlockCodec c, std::remove_reference_t<decltype(slot<Op>(std::declval<BlockKernels&>()))> kernel,
             const char* name) {
        slot<Op>(codec[static_cast<int>(c)]) = kernel;
        codec_names[static_cast<int>(c)][static_cast<int>(Op)] = name;
    }
    // The slot of rotated codec R's operation Op: polar's, or that of a row on TurboLayout.
    template <RotatedCodec R, RotatedOp Op>
    constexpr auto& slot() {
        if constexpr (R == RotatedCodec::polar) return rotated_slot<Op>(rotated.polar);
        else return rotated_slot<Op>(rotated.turbo_rows[static_cast<int>(R)]);
    }
    template <RotatedOp Op, class Row>
    static constexpr auto& rotated_slot(Row& row) {
        if constexpr (Op == RotatedOp::quantize) return row.quantize;
        else if constexpr (Op == RotatedOp::score) return row.score;
        else return row.accumulate;
    }
    // Rotated codec R's operation Op runs `kernel`, called `name` in the table.
    template <RotatedCodec R, RotatedOp Op, class F>
    void set(F kernel, const char* name) {
        slot<R, Op>() = kernel;
        rotated_names[static_cast<int>(R)][static_cast<int>(Op)] = name;
    }
    // (The kernel's type is checked by the assignment: a parameter type naming slot<K>() would need this
    // class complete, which clang requires at the declaration.)
    template <OtherKernel K, class F>
    void set(F kernel, const char* name) {
        slot<K>() = kernel;
        other_names[static_cast<int>(K)] = name;
    }
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

// The same for the rotated codecs (every row, every slot filled): the active level's; and a given level's
// (nullptr if the level is not compiled or this CPU cannot run it).
const RotatedKernels& active_rotated_kernels();
const RotatedKernels* level_rotated_kernels(SimdLevel level);
// The name the table gives rotated codec c's operation op at a level ("spec" where the level left it to
// the specification); nullptr for a level not present.
const char* level_rotated_kernel_name(SimdLevel level, RotatedCodec c, RotatedOp op);

// The online softmax's block update at the active level, and at a given one (nullptr as above).
SoftmaxUpdate active_softmax();
SoftmaxUpdate level_softmax(SimdLevel level);
// The chanB score kernel at the active level, and at a given one (nullptr as above).
ChannelScore active_channel_score();
ChannelScore level_channel_score(SimdLevel level);
// The contract check of a level's primitives (ops_check.hpp); nullptr if it has none.
const char* (*level_check_ops(SimdLevel level))();

// A check a layer above lib/simd adds to every level's run-time self-check: empty if the level agrees
// with the specification, else what differed first. lib/codec adds the polar and turbo codecs' checks
// through the codec path (their kernels take layouts only the codecs build) as the program starts
// (codec.cpp); a check added after a level was checked does not run for it. Adding one twice adds it once.
using LevelCheck = std::string (*)(SimdLevel level);
void add_level_check(LevelCheck check);
// The run-time self-check of a level: its kernels (selfcheck.hpp), then every added check.
std::string level_self_check(SimdLevel level);

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
