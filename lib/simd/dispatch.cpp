#include "dispatch.hpp"

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <algorithm>
#include <stdexcept>
#include <string>
#if defined(KVQ_SIMD_X86)
#include <cpuid.h>
#endif

namespace kvq {
namespace detail {

const BlockKernels& scalar_kernels(BlockCodec c) {
    static const BlockKernels* const table[] = {&kScalarF32,  &kScalarF16,  &kScalarBF16, &kScalarQ8_0,
                                                &kScalarQ4_0, &kScalarQ4_1, &kScalarQ5_0, &kScalarQ5_1};
    static_assert(sizeof table / sizeof table[0] == static_cast<size_t>(BlockCodec::count));
    return *table[static_cast<int>(c)];
}

namespace {

SimdLevel best_level() {
    const auto levels = available_simd_levels();
    SimdLevel level = levels.back();
    if (const char* env = std::getenv("KVQ_SIMD"); env && *env) {
        const SimdLevel wanted = parse_simd_level(env);
        for (SimdLevel l : levels) {
            if (l == wanted) level = l;
        }
    }
    return level;
}

std::atomic<int>& current_level() {
    static std::atomic<int> level{static_cast<int>(best_level())};
    return level;
}

// The kernels compiled for a level in this build (nullptr if none), whether or not this CPU can run them.
const LevelKernels* compiled_level(SimdLevel level) {
    switch (level) {
#if defined(KVQ_SIMD_X86)
        case SimdLevel::sse2: return &level_sse2();
        case SimdLevel::avx2: return &level_avx2();
        case SimdLevel::avx512: return &level_avx512();
#elif defined(KVQ_SIMD_NEON)
        case SimdLevel::neon: return &level_neon();
#endif
        default: return nullptr;
    }
}

#if defined(KVQ_SIMD_X86)
// clang (14) has no "f16c" for __builtin_cpu_supports: read the cpuid bit itself.
bool cpu_has_f16c() {
    unsigned eax, ebx, ecx, edx;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}
#endif

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

// Compiled and supported by this CPU, decided once. A level's kernels are not even constructed on a CPU
// that cannot run them (its file may use the wider instructions anywhere).
const LevelKernels* runnable_level(SimdLevel level) {
    static const auto table = [] {
        std::array<const LevelKernels*, 5> t{};
#if defined(KVQ_SIMD_X86)
        __builtin_cpu_init();  // may run before libgcc's own initializer (static initialization order)
#endif
        for (SimdLevel l : {SimdLevel::sse2, SimdLevel::avx2, SimdLevel::avx512, SimdLevel::neon}) {
            t[static_cast<int>(l)] = cpu_runs(l) ? compiled_level(l) : nullptr;
        }
        return t;
    }();
    return table[static_cast<int>(level)];
}

}  // namespace

const BlockKernels* level_kernels(BlockCodec c, SimdLevel level) {
    if (level == SimdLevel::scalar) return &scalar_kernels(c);
    const LevelKernels* k = runnable_level(level);
    return k ? &k->codec[static_cast<int>(c)] : nullptr;
}

bool all_finite(const float* x, size_t n) {
    if (const LevelKernels* k = runnable_level(simd_level())) return k->all_finite(x, n);
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) return false;
    }
    return true;
}

float finite_max_abs(const float* x, size_t n) {
    if (const LevelKernels* k = runnable_level(simd_level())) return k->finite_max_abs(x, n);
    float m = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) return std::numeric_limits<float>::quiet_NaN();
        m = std::max(m, std::fabs(x[i]));
    }
    return m;
}

const RotatedKernels* level_rotated_kernels(SimdLevel level) {
    if (level == SimdLevel::scalar) return &scalar_rotated_kernels();
    const LevelKernels* k = runnable_level(level);
    return k && k->rotated.turbo.score ? &k->rotated : nullptr;
}

const RotatedKernels& active_rotated_kernels() {
    const RotatedKernels* k = level_rotated_kernels(simd_level());
    return k ? *k : scalar_rotated_kernels();
}

const BlockKernels& active_kernels(BlockCodec c) {
    const BlockKernels* k = level_kernels(c, static_cast<SimdLevel>(current_level().load(std::memory_order_relaxed)));
    return k ? *k : scalar_kernels(c);
}

}  // namespace detail

std::string_view simd_level_name(SimdLevel level) {
    switch (level) {
        case SimdLevel::scalar: return "scalar";
        case SimdLevel::sse2: return "sse2";
        case SimdLevel::avx2: return "avx2";
        case SimdLevel::avx512: return "avx512";
        case SimdLevel::neon: return "neon";
    }
    return "unknown";
}

SimdLevel parse_simd_level(std::string_view name) {
    for (SimdLevel l : {SimdLevel::scalar, SimdLevel::sse2, SimdLevel::avx2, SimdLevel::avx512, SimdLevel::neon}) {
        if (simd_level_name(l) == name) return l;
    }
    throw std::invalid_argument("unknown SIMD level '" + std::string(name) +
                                "' (expected scalar, sse2, avx2, avx512 or neon)");
}

std::vector<SimdLevel> available_simd_levels() {
    std::vector<SimdLevel> levels{SimdLevel::scalar};
    for (SimdLevel l : {SimdLevel::sse2, SimdLevel::avx2, SimdLevel::avx512, SimdLevel::neon}) {
        if (detail::runnable_level(l)) levels.push_back(l);
    }
    return levels;
}

SimdLevel simd_level() { return static_cast<SimdLevel>(detail::current_level().load()); }

void force_simd_level(SimdLevel level) {
    for (SimdLevel l : available_simd_levels()) {
        if (l == level) {
            detail::current_level().store(static_cast<int>(level));
            return;
        }
    }
    throw std::invalid_argument("SIMD level '" + std::string(simd_level_name(level)) +
                                "' is not available in this build on this CPU");
}

}  // namespace kvq
