// kvq::selftest() on arm64 (scripts/neon_qemu.sh runs it under qemu-aarch64): every codec at the neon
// level against the scalar specification, and cache attention against the FP32 reference.
#include <cstdio>

#include "kvq/selftest.hpp"
#include "kvq/simd.hpp"

int main() {
    std::printf("%s", kvq::format_simd_report(kvq::simd_report()).c_str());
    const auto result = kvq::selftest([](const kvq::SelftestLine& l) { std::printf("%s\n", kvq::format_selftest_line(l).c_str()); });
    size_t failed = 0;
    for (const auto& l : result.lines) failed += !l.passed;
    std::printf("neon selftest: %zu passed, %zu failed\n", result.lines.size() - failed, failed);
    return result.passed() ? 0 : 1;
}
