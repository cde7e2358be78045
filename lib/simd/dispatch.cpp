#include "dispatch.hpp"

#include <atomic>
#include <cstdlib>
#include <stdexcept>
#include <string>

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

}  // namespace

const BlockKernels* level_kernels(BlockCodec c, SimdLevel level) {
    if (level == SimdLevel::scalar) return &scalar_kernels(c);
    return nullptr;  // SIMD levels register here (lib/simd/)
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

std::vector<SimdLevel> available_simd_levels() { return {SimdLevel::scalar}; }

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
