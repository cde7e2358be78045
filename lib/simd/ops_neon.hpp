// NEON (arm64) primitives for kernels_impl.hpp. A block is two 16-byte registers; int8 products are
// widened with vmull_s8 and summed pairwise into int32 (no int16 sums, so no overflow at all); fp16 uses
// the bit manipulations of half.hpp lane by lane (half_batch.hpp) so the bits equal the scalar
// specification's. float -> int conversion saturates on arm64, as the scalar casts do there. Included only
// by level_neon.cpp, compiled with the default flags (NEON is part of every arm64 CPU).
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "../ref/blocks.hpp"
#include "../ref/half.hpp"
#include "half_batch.hpp"
#include "ops.hpp"

namespace kvq::simd {
namespace {

template <>
struct Ops<xsimd::neon64> {
    using A = xsimd::neon64;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    using DotArch = A;
    struct Bytes {
        int8x16_t lo, hi;  // values 0..15 and 16..31
    };
    using Key = Bytes;
    using UKey = Bytes;
    using IDot = int32x4_t;

    static Bytes load_q8(const int8_t* p) { return {vld1q_s8(p), vld1q_s8(p + 16)}; }
    static Bytes load_nibbles(const uint8_t* qs) {
        const uint8x16_t t = vld1q_u8(qs);
        return {vreinterpretq_s8_u8(vandq_u8(t, vdupq_n_u8(0x0F))), vreinterpretq_s8_u8(vshrq_n_u8(t, 4))};
    }
    // iq4_nl: the nibbles looked up in the 16 levels (kIQ4NLValues), one tbl per 16 values.
    static Bytes load_iq4_nl(const uint8_t* qs) {
        const int8x16_t levels = vld1q_s8(detail::kIQ4NLValues);
        const Bytes n = load_nibbles(qs);
        return {vqtbl1q_s8(levels, vreinterpretq_u8_s8(n.lo)), vqtbl1q_s8(levels, vreinterpretq_u8_s8(n.hi))};
    }
    // 0x10 in byte j where bit j of qh is set.
    static int8x16_t bits16(uint32_t two_bytes) {
        const uint8x16_t v = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(two_bytes)), vdup_n_u8(static_cast<uint8_t>(two_bytes >> 8)));
        static const uint8_t sel[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(v, vld1q_u8(sel)), vdupq_n_u8(0x10)));
    }
    static Bytes add_high_bits(Bytes b, const uint8_t* qh_bytes) {
        uint32_t qh;
        std::memcpy(&qh, qh_bytes, 4);
        return {vorrq_s8(b.lo, bits16(qh & 0xFFFFu)), vorrq_s8(b.hi, bits16(qh >> 16))};
    }
    static Bytes sub(Bytes b, int8_t v) { return {vsubq_s8(b.lo, vdupq_n_s8(v)), vsubq_s8(b.hi, vdupq_n_s8(v))}; }
    static Bytes min(Bytes b, int8_t v) { return {vminq_s8(b.lo, vdupq_n_s8(v)), vminq_s8(b.hi, vdupq_n_s8(v))}; }
    static void store(Bytes b, int8_t* p) {
        vst1q_s8(p, b.lo);
        vst1q_s8(p + 16, b.hi);
    }
    static void store_nibbles(Bytes b, uint8_t* qs) {
        const uint8x16_t m = vdupq_n_u8(0x0F);
        const uint8x16_t lo = vandq_u8(vreinterpretq_u8_s8(b.lo), m);
        const uint8x16_t hi = vandq_u8(vreinterpretq_u8_s8(b.hi), m);
        vst1q_u8(qs, vorrq_u8(lo, vshlq_n_u8(hi, 4)));
    }
    static uint32_t bit4_mask16(int8x16_t b) {  // bit j = bit 4 of byte j
        static const uint8_t weight[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        const uint8x16_t bits = vandq_u8(vshrq_n_u8(vreinterpretq_u8_s8(b), 4), vdupq_n_u8(1));
        const uint8x16_t w = vmulq_u8(bits, vld1q_u8(weight));
        return static_cast<uint32_t>(vaddv_u8(vget_low_u8(w))) | static_cast<uint32_t>(vaddv_u8(vget_high_u8(w))) << 8;
    }
    static uint32_t bit4_mask(Bytes b) { return bit4_mask16(b.lo) | bit4_mask16(b.hi) << 16; }
    // vmovn keeps the low half of each lane: C's int -> int8_t conversion.
    static int8x16_t low_bytes16(const I* v) {
        const int16x8_t a = vcombine_s16(vmovn_s32(v[0]), vmovn_s32(v[1]));
        const int16x8_t b = vcombine_s16(vmovn_s32(v[2]), vmovn_s32(v[3]));
        return vcombine_s8(vmovn_s16(a), vmovn_s16(b));
    }
    static Bytes low_bytes(const I* v) { return {low_bytes16(v), low_bytes16(v + 4)}; }
    static Bytes pack_small(const I* v) { return low_bytes(v); }
    static void widen(Bytes b, F* out) {
        const int16x8_t w[4] = {vmovl_s8(vget_low_s8(b.lo)), vmovl_s8(vget_high_s8(b.lo)), vmovl_s8(vget_low_s8(b.hi)),
                                vmovl_s8(vget_high_s8(b.hi))};
        for (int k = 0; k < 4; ++k) {
            out[2 * k] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w[k])));
            out[2 * k + 1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w[k])));
        }
    }

    static void widen_pair(Bytes b, int p, F* out) {  // values 8p..8p+7
        const int8x16_t src = p < 2 ? b.lo : b.hi;
        const int16x8_t w = vmovl_s8(p % 2 ? vget_high_s8(src) : vget_low_s8(src));
        out[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(w)));
        out[1] = vcvtq_f32_s32(vmovl_s16(vget_high_s16(w)));
    }

    static Key key(Bytes b) { return b; }
    static UKey ukey(Bytes b) { return b; }
    static IDot dot_signed(const Key& k, const int8_t* y) {
        const Bytes q = load_q8(y);
        int32x4_t s = vpaddlq_s16(vmull_s8(vget_low_s8(k.lo), vget_low_s8(q.lo)));
        s = vpadalq_s16(s, vmull_high_s8(k.lo, q.lo));
        s = vpadalq_s16(s, vmull_s8(vget_low_s8(k.hi), vget_low_s8(q.hi)));
        return vpadalq_s16(s, vmull_high_s8(k.hi, q.hi));
    }
    static IDot reduce4(const IDot* p) { return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3])); }
    static IDot dot4_signed(const Key& k, const int8_t* const* y) {
        const IDot p[4] = {dot_signed(k, y[0]), dot_signed(k, y[1]), dot_signed(k, y[2]), dot_signed(k, y[3])};
        return reduce4(p);
    }
    static IDot dot4_unsigned(const UKey& k, const int8_t* const* y) { return dot4_signed(k, y); }
    static F dot_to_f32(IDot v) { return vcvtq_f32_s32(v); }
    static F dot(const Key& k, const int8_t* y) { return vcvtq_f32_s32(dot_signed(k, y)); }

    // out[k] = the sum of the 4 lanes of rows[k], k < count: pairwise adds transpose four rows.
    static void reduce_add_rows(const F* rows, int count, float* out) {
        for (int k0 = 0; k0 < count; k0 += 4) {
            float32x4_t r[4];
            for (int k = 0; k < 4; ++k) r[k] = k0 + k < count ? float32x4_t(rows[k0 + k]) : vdupq_n_f32(0.0f);
            float s[4];
            vst1q_f32(s, vpaddq_f32(vpaddq_f32(r[0], r[1]), vpaddq_f32(r[2], r[3])));
            for (int k = 0; k < 4 && k0 + k < count; ++k) out[k0 + k] = s[k];
        }
    }
    static float hmax(F v) { return vmaxvq_f32(v); }
    static I to_i32(F v) { return vcvtq_s32_f32(v); }  // truncates toward zero
    static F to_f32(I v) { return vcvtq_f32_s32(v); }
    // Normal values (all scales in practice) by moving the bits; zeros, subnormals, Inf and NaN through
    // half.hpp. Both are exact, so the bits are the same.
    static float f16_value(uint16_t h) {
        const uint32_t exponent = h & 0x7C00u;
        if (exponent == 0 || exponent == 0x7C00u) return detail::f16_to_f32(h);
        const uint32_t bits = (static_cast<uint32_t>(h & 0x8000u) << 16) | (((h & 0x7FFFu) << 13) + 0x38000000u);
        float f;
        std::memcpy(&f, &bits, 4);
        return f;
    }

    static I load_u16(const uint16_t* p) { return vreinterpretq_s32_u32(vmovl_u16(vld1_u16(p))); }
    static void store_u16(uint16_t* p, I v) { vst1_u16(p, vmovn_u32(vreinterpretq_u32_s32(v))); }
    static F load_f16(const uint16_t* p) { return f16_to_f32_batch<A>(bit_cast<uint32_t>(load_u16(p))); }
    static void store_f16(uint16_t* p, F v) { store_u16(p, bit_cast<int32_t>(f32_to_f16_batch<A>(v))); }
};

}  // namespace
}  // namespace kvq::simd
