// SIMD levels. kvq compiles kernels for several instruction sets into one binary and picks one at run
// time: the best level the CPU runs that passes its self-check, a few milliseconds of known-answer
// checks against the scalar specification run the first time a level is about to be used. A level that
// fails is not used: kvq falls back to the best level below it that passes, and simd_report() says why.
// KVQ_SIMD=scalar|sse2|avx2|avx512|neon asks for a level (if compiled and supported), KVQ_SELFCHECK=0
// skips the self-check; force_simd_level() does the same from code, for tests and benchmarks.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvq {

enum class SimdLevel : int { scalar = 0, sse2, avx2, avx512, neon };

std::string_view simd_level_name(SimdLevel level);
// Parses a level name; throws std::invalid_argument for an unknown one.
SimdLevel parse_simd_level(std::string_view name);
// Levels compiled into this build that this CPU can run, scalar first (whether or not they pass their
// self-check: see simd_report()).
std::vector<SimdLevel> available_simd_levels();
// The level in use (chosen, and its self-check run, on the first call of anything that computes).
SimdLevel simd_level();
// Uses `level` from now on, or, if it fails its self-check, the best level below it that passes; throws
// std::invalid_argument if it is not available. Not thread-safe with concurrent kernel calls: set it
// before starting work.
void force_simd_level(SimdLevel level);

struct SimdLevelStatus {
    SimdLevel level = SimdLevel::scalar;
    bool cpu_runs = false;  // compiled into this build and run by this CPU
    bool checked = false;   // the self-check has run
    bool passed = false;    // and found nothing
    std::string detail;     // what the self-check found, or why it has not run
    double check_ms = 0;    // how long the self-check took
};

struct SimdReport {
    std::vector<SimdLevelStatus> levels;  // every level compiled into this build, scalar first
    SimdLevel in_use = SimdLevel::scalar;
    std::string reason;                   // why that level is in use
};

// The levels, their self-checks and the level in use (choosing it first if nothing has).
SimdReport simd_report();
// One line per level ("* " marks the one in use), then "in use: LEVEL (reason)".
std::string format_simd_report(const SimdReport& report);

// One line of a level's kernel table: the kernel that runs for (codec, op) at `level` on this CPU, by the
// name its level file (lib/simd/level_<isa>.cpp, the one place that chooses kernels) gives it; "spec"
// where the scalar specification fills a gap the level leaves.
struct SimdKernel {
    SimdLevel level = SimdLevel::scalar;
    std::string codec;   // a block codec (f32 .. iq4_nls), a rotated codec's row (turbo, turbo_split, turbo_qjl,
                         // tcq2, tcq3, polar), tcqB, chanB, softmax, floats or primitives
    std::string op;      // quantize, dequantize, prepare_query, score, accumulate, accumulate_grid, score_groups, ...
    std::string kernel;  // e.g. "accumulate_sym_avx512<q4_0>", or "spec"
};
// The kernel table of every level compiled into this build that this CPU runs (passed its self-check or
// not), scalar first, each level's lines in codec then op order. A line is there only where the slot has
// a kernel: accumulate_grid only for codecs that have it (q4_0), score_groups only where the level scores
// q8_0 keys in groups of 16 rows.
std::vector<SimdKernel> simd_kernel_table();
// The table as text: a header line, then one line per (codec, op) with each level's kernel in a column.
std::string format_simd_kernel_table(const std::vector<SimdKernel>& table);

}  // namespace kvq
