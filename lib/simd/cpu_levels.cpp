#include "cpu_levels.hpp"

#include <cstdlib>
#include <string_view>

#if defined(KVQ_SIMD_X86)
#include <cpuid.h>
#endif

namespace kvq::detail {
namespace {

#if defined(KVQ_SIMD_X86)

// clang (14) has no "f16c" for __builtin_cpu_supports: read the cpuid bit itself.
bool cpu_has_f16c() {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

}  // namespace

void cpu_init() {
#if defined(KVQ_SIMD_X86)
    __builtin_cpu_init();
#endif
}

bool cpu_has_avx512_vnni() {
#if defined(KVQ_SIMD_X86)
    if (const char* env = std::getenv("KVQ_AVX512_VNNI"); env && std::string_view(env) == "0") return false;
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni");
#else
    return false;
#endif
}

// The kernels compiled for a level in this build (nullptr if none), whether or not this CPU can run them.
const LevelKernels* compiled_level(SimdLevel level) {
    switch (level) {
#if defined(KVQ_SIMD_X86)
        case SimdLevel::sse2: return &level_sse2();
        case SimdLevel::avx2: return &level_avx2();
#if !defined(KVQ_NO_AVX512)
        // By capability: the VNNI build of the level where the CPU has AVX512-VNNI (its int8 dot products).
        case SimdLevel::avx512: return cpu_has_avx512_vnni() ? &level_avx512_vnni() : &level_avx512();
#endif
#elif defined(KVQ_SIMD_NEON)
        case SimdLevel::neon: return &level_neon();
#endif
        default: return nullptr;
    }
}

bool compiled(SimdLevel level) {
    switch (level) {
        case SimdLevel::scalar: return true;
#if defined(KVQ_SIMD_X86)
        case SimdLevel::sse2:
        case SimdLevel::avx2: return true;
#if !defined(KVQ_NO_AVX512)  // KVQ_SIMD_AVX512=OFF
        case SimdLevel::avx512: return true;
#endif
#elif defined(KVQ_SIMD_NEON)
        case SimdLevel::neon: return true;
#endif
        default: return false;
    }
}

bool cpu_runs(SimdLevel level) {
    switch (level) {
        case SimdLevel::scalar: return true;
#if defined(KVQ_SIMD_X86)
        case SimdLevel::sse2: return __builtin_cpu_supports("sse2");
        // __builtin_cpu_supports reads cpuid and also checks that the OS saves the wide registers.
        case SimdLevel::avx2:
            return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
        case SimdLevel::avx512:
            return cpu_runs(SimdLevel::avx2) && __builtin_cpu_supports("avx512f") &&
                   __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                   __builtin_cpu_supports("avx512dq");
#elif defined(KVQ_SIMD_NEON)
        case SimdLevel::neon: return true;  // part of every arm64 CPU
#endif
        default: return false;
    }
}

}  // namespace kvq::detail
