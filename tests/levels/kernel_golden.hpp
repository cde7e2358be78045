// Each SIMD level's kernel table against its checked-in listing (tests/data/kernels/<build>.txt): the
// level files (lib/simd/level_<isa>.cpp) choose kernels line by line, so a line forgotten in one of them
// would silently run the specification there; the listing makes it a failed test. Used by ctest
// (test_simd_kernel_table.cpp, the levels this CPU runs) and by kvq_level_selftest --kernels (the levels
// scripts/simd_levels.sh runs under qemu: neon, and x86 levels the CPU lacks).
// KVQ_UPDATE_GOLDEN=1 writes the listings instead of comparing (then review the diff).
#pragma once

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kvq/simd.hpp"
#include "simd/cpu_levels.hpp"

namespace kvq::test {

// The listing's name: the level's, and for avx512 which of its two builds runs (lib/simd/cpu_levels.cpp).
inline std::string kernel_build_name(SimdLevel level) {
    std::string name(simd_level_name(level));
    if (level == SimdLevel::avx512 && detail::cpu_has_avx512_vnni()) name += "_vnni";
    return name;
}

// One line per (codec, op) the level's table has, in its order: codec, op, kernel.
inline std::string kernel_listing(SimdLevel level) {
    std::ostringstream s;
    for (const SimdKernel& k : simd_kernel_table()) {
        if (k.level != level) continue;
        s << k.codec << std::string(k.codec.size() < 12 ? 12 - k.codec.size() : 1, ' ') << k.op
          << std::string(k.op.size() < 16 ? 16 - k.op.size() : 1, ' ') << k.kernel << '\n';
    }
    return s.str();
}

// Empty if the level's listing equals dir/<build>.txt, else what differs first.
inline std::string check_kernel_listing(SimdLevel level, const std::string& dir) {
    const std::string path = dir + "/" + kernel_build_name(level) + ".txt";
    const std::string got = kernel_listing(level);
    if (const char* env = std::getenv("KVQ_UPDATE_GOLDEN"); env && std::string(env) == "1") {
        std::ofstream(path, std::ios::binary) << got;
        return {};
    }
    std::ifstream in(path, std::ios::binary);
    if (!in) return path + ": missing (KVQ_UPDATE_GOLDEN=1 writes it)";
    std::stringstream want_text;
    want_text << in.rdbuf();
    std::istringstream g(got), w(want_text.str());
    std::string gl, wl;
    for (int line = 1;; ++line) {
        const bool more_g = static_cast<bool>(std::getline(g, gl)), more_w = static_cast<bool>(std::getline(w, wl));
        if (!more_g && !more_w) return {};
        if (!more_g) gl = "(end of the table)";
        if (!more_w) wl = "(end of the file)";
        if (gl != wl) {
            return path + ":" + std::to_string(line) + ": the table has \"" + gl + "\", the listing \"" + wl +
                   "\" (a level file's line added or lost? KVQ_UPDATE_GOLDEN=1 rewrites the listing)";
        }
    }
}

}  // namespace kvq::test
