// SIMD levels. kvq compiles kernels for several instruction sets into one binary and picks the best the
// CPU supports at run time. KVQ_SIMD=scalar|sse2|avx2|avx512|neon forces a level (if compiled and
// supported); force_simd_level() does the same from code, for tests and benchmarks.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kvq {

enum class SimdLevel : int { scalar = 0, sse2, avx2, avx512, neon };

std::string_view simd_level_name(SimdLevel level);
// Parses a level name; throws std::invalid_argument for an unknown one.
SimdLevel parse_simd_level(std::string_view name);
// Levels compiled into this build that this CPU can run, scalar first.
std::vector<SimdLevel> available_simd_levels();
// The level in use.
SimdLevel simd_level();
// Uses `level` from now on; throws std::invalid_argument if it is not available. Not thread-safe with
// concurrent kernel calls: set it before starting work.
void force_simd_level(SimdLevel level);

}  // namespace kvq
