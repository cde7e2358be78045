// fp16 <-> fp32 on whole batches without F16C (the sse2 and neon levels): the bit manipulations of
// lib/ref/half.hpp (after Maratyszcza's FP16 library) lane by lane, so the bits are the same.
#pragma once

#include <cstdint>

#include "xsimd_compat.hpp"

namespace kvq::simd {
namespace {

// h: fp16 bits in the low half of each lane.
template <class A>
xsimd::batch<float, A> f16_to_f32_batch(xsimd::batch<uint32_t, A> h) {
    using U = xsimd::batch<uint32_t, A>;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    const U w = h << 16;
    const U sign = w & U(0x80000000u);
    const U two_w = w + w;
    const F normalized = bit_cast<float>((two_w >> 4) + U(0xE0u << 23)) * F(0x1.0p-112f);
    const F denormalized = bit_cast<float>((two_w >> 17) | U(126u << 23)) - F(0.5f);
    // two_w < 2^27, compared as signed after a logical shift (SSE2 has no unsigned compare).
    const U is_denormal = bit_cast<uint32_t>(xsimd::select(bit_cast<int32_t>(two_w >> 1) < I(1 << 26), I(-1), I(0)));
    const U magnitude = (bit_cast<uint32_t>(denormalized) & is_denormal) | (bit_cast<uint32_t>(normalized) & ~is_denormal);
    return bit_cast<float>(sign | magnitude);
}

// Returns the fp16 bits in the low half of each lane.
template <class A>
xsimd::batch<uint32_t, A> f32_to_f16_batch(xsimd::batch<float, A> f) {
    using U = xsimd::batch<uint32_t, A>;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    F base = (xsimd::abs(f) * F(0x1.0p+112f)) * F(0x1.0p-110f);
    const U w = bit_cast<uint32_t>(f);
    const U shl1_w = w + w;
    const U sign = w & U(0x80000000u);
    // max(bias, 0x71000000) >> 1, as a signed max of values below 2^31.
    const I half_bias = xsimd::max(bit_cast<int32_t>((shl1_w & U(0xFF000000u)) >> 1), I(0x71000000 >> 1));
    base = bit_cast<float>(bit_cast<uint32_t>(half_bias) + U(0x07800000u)) + base;
    const U bits = bit_cast<uint32_t>(base);
    const U nonsign = ((bits >> 13) & U(0x00007C00u)) + (bits & U(0x00000FFFu));
    const U nan = U(0x7E00u) | ((w >> 13) & U(0x03FFu));  // quiet, payload kept (as F16C does)
    const U magnitude = bit_cast<uint32_t>(xsimd::select(xsimd::isnan(f), bit_cast<float>(nan),
                                                             bit_cast<float>(nonsign)));
    return (sign >> 16) | magnitude;
}

}  // namespace
}  // namespace kvq::simd
