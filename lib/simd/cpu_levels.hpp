// Which SIMD levels this build compiled and which this CPU runs (cpuid, and the OS saving the wide
// registers), for dispatch.cpp.
#pragma once

#include "dispatch.hpp"

namespace kvq::detail {

// The kernels compiled for a level in this build (nullptr if none), whether or not this CPU can run them.
const LevelKernels* compiled_level(SimdLevel level);
// The level is compiled into this build (scalar always is).
bool compiled(SimdLevel level);
// This CPU runs the level's instructions.
bool cpu_runs(SimdLevel level);
// The CPU has AVX512-VNNI (false off x86), unless KVQ_AVX512_VNNI=0 says to treat it as one without:
// the avx512 level is then its build without VNNI (level_avx512.cpp), so that the test command checks
// that build too on a CPU with VNNI (scripts/simd_levels.sh). Read when the dispatcher is built.
bool cpu_has_avx512_vnni();
// Reads the CPU's features (x86: __builtin_cpu_init, which may not have run yet during static
// initialization); nothing elsewhere.
void cpu_init();

}  // namespace kvq::detail
