// IEEE binary16 and bfloat16 conversions, bit-exact with ggml (round to nearest even, as F16C does).
// static: SIMD files include this header, and a shared inline copy compiled with one level's flags could be
// the one the linker keeps for every caller.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace kvq::detail {

static inline uint32_t float_bits(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}
static inline float float_from_bits(uint32_t u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// After Maratyszcza's FP16 library (the code ggml uses when it has no F16C).
static inline uint16_t f32_to_f16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (std::fabs(f) * scale_to_inf) * scale_to_zero;
    const uint32_t w = float_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = float_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = float_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    // A NaN keeps its sign and the top of its payload and becomes quiet, as F16C's vcvtps2ph (and so
    // the SIMD levels) convert it; Maratyszcza's original returns one canonical NaN here.
    const uint32_t nan = 0x7E00u | ((w >> 13) & 0x03FFu);
    return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? nan : nonsign));
}

static inline float f16_to_f32(uint16_t h) {
    const uint32_t w = static_cast<uint32_t>(h) << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float normalized = float_from_bits((two_w >> 4) + exp_offset) * 0x1.0p-112f;
    const float denormalized = float_from_bits((two_w >> 17) | (126u << 23)) - 0.5f;
    const uint32_t result =
        sign | (two_w < (1u << 27) ? float_bits(denormalized) : float_bits(normalized));
    return float_from_bits(result);
}

static inline uint16_t f32_to_bf16(float f) {
    const uint32_t u = float_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64u);  // quiet NaN
    return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

static inline float bf16_to_f32(uint16_t h) { return float_from_bits(static_cast<uint32_t>(h) << 16); }

}  // namespace kvq::detail
