// kvq::selftest() as a program, for the levels the test command runs under emulation (scripts/simd_levels.sh):
// built for the host by CMake (build/tests/kvq_level_selftest, run under qemu-x86_64 for an x86 level the
// CPU lacks) and for arm64 by scripts/neon_qemu.sh (run under qemu-aarch64).
//   kvq_level_selftest            every level this CPU runs (scalar only through cache attention)
//   kvq_level_selftest avx2 ...   those levels only; each must be one this CPU runs, else exit 2
//   kvq_level_selftest --list     the levels this CPU runs, one line, separated by spaces
//   kvq_level_selftest --kernels DIR avx2 ...   those levels' kernel tables against DIR/<build>.txt
//                                 (kernel_golden.hpp; the test command passes tests/data/kernels)
// Prints the SIMD report and one line per level and codec family; exits 1 if any line failed.
// KVQ_AVX512_VNNI=0 checks the avx512 level's build without VNNI on a CPU with it.
#include <cstdio>
#include <string>
#include <vector>

#include "check/selftest_levels.hpp"
#include "kernel_golden.hpp"
#include "simd/cpu_levels.hpp"
#include "kvq/selftest.hpp"
#include "kvq/simd.hpp"

int main(int argc, char** argv) {
    const std::vector<kvq::SimdLevel> runs = kvq::available_simd_levels();
    if (argc == 2 && std::string(argv[1]) == "--list") {
        for (size_t i = 0; i < runs.size(); ++i) std::printf("%s%s", i ? " " : "", std::string(kvq::simd_level_name(runs[i])).c_str());
        std::printf("\n");
        return 0;
    }
    const bool kernels = argc >= 3 && std::string(argv[1]) == "--kernels";
    const int first = kernels ? 3 : 1;
    std::vector<kvq::SimdLevel> levels = runs;
    if (argc > first) {
        levels.clear();
        for (int i = first; i < argc; ++i) {
            kvq::SimdLevel l;
            try {
                l = kvq::parse_simd_level(argv[i]);
            } catch (const std::exception& e) {
                std::fprintf(stderr, "kvq_level_selftest: %s\n", e.what());
                return 2;
            }
            bool found = false;
            for (auto r : runs) found = found || r == l;
            if (!found) {
                std::fprintf(stderr, "kvq_level_selftest: this CPU does not run %s: nothing checked\n", argv[i]);
                return 2;
            }
            levels.push_back(l);
        }
    }
    if (kernels) {
        int failed = 0;
        for (auto l : levels) {
            const std::string finding = kvq::test::check_kernel_listing(l, argv[2]);
            std::printf("kernel table %s: %s\n", kvq::test::kernel_build_name(l).c_str(),
                        finding.empty() ? "as listed" : ("FAILED: " + finding).c_str());
            failed += !finding.empty();
        }
        return failed ? 1 : 0;
    }
    std::printf("%s", kvq::format_simd_report(kvq::simd_report()).c_str());
    for (auto l : levels) {
        if (l == kvq::SimdLevel::avx512)  // the level's two builds (lib/simd/cpu_levels.cpp)
            std::printf("avx512 is its %s build\n", kvq::detail::cpu_has_avx512_vnni() ? "AVX512-VNNI" : "plain (no VNNI)");
    }
    const auto result = kvq::detail::selftest_levels(levels, [](const kvq::SelftestLine& l) {
        std::printf("%s\n", kvq::format_selftest_line(l).c_str());
        std::fflush(stdout);
    });
    size_t failed = 0;
    for (const auto& l : result.lines) failed += !l.passed;
    std::printf("selftest:");
    for (auto l : levels) std::printf(" %s", std::string(kvq::simd_level_name(l)).c_str());
    std::printf(": %zu passed, %zu failed\n", result.lines.size() - failed, failed);
    return result.passed() ? 0 : 1;
}
