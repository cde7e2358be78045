// SSE2 primitives for kernels_impl.hpp (the x86-64 baseline: no pshufb, no maddubs, no F16C). A block is
// two 16-byte registers; int8 products go through int16 and pmaddwd; fp16 is converted lane by lane with
// the bit manipulations of half.hpp (half_batch.hpp). Included only by level_sse2.cpp, compiled with the
// default flags, so calling the scalar half.hpp here is safe.
#pragma once

#include <emmintrin.h>

#include <cstdint>
#include <cstring>

#include "../ref/blocks.hpp"
#include "../ref/half.hpp"
#include "half_batch.hpp"
#include "ops.hpp"

namespace kvq::simd {
namespace {

// iq4_nl without pshufb: the levels of both nibbles of every code byte, as one int16 word each (low
// byte: the low nibble's level, high byte: the high nibble's), so that a block is 16 table loads.
struct IQ4NLPairs {
    uint16_t w[256];
};
constexpr IQ4NLPairs make_iq4_nl_pairs() {
    IQ4NLPairs t{};
    for (int b = 0; b < 256; ++b) {
        t.w[b] = static_cast<uint16_t>(static_cast<uint8_t>(detail::kIQ4NLValues[b & 0x0F]) |
                                       static_cast<uint8_t>(detail::kIQ4NLValues[b >> 4]) << 8);
    }
    return t;
}
inline constexpr IQ4NLPairs kIQ4NLPairs = make_iq4_nl_pairs();

template <>
struct Ops<xsimd::sse2> {
    using A = xsimd::sse2;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    using DotArch = A;
    struct Bytes {
        __m128i lo, hi;  // values 0..15 and 16..31
    };
    struct Key {
        __m128i w[4];  // the 32 values as int16
    };

    static __m128i set_bytes(int8_t v) { return _mm_set1_epi8(v); }
    static __m128i widen_lo(__m128i b) { return _mm_srai_epi16(_mm_unpacklo_epi8(b, b), 8); }
    static __m128i widen_hi(__m128i b) { return _mm_srai_epi16(_mm_unpackhi_epi8(b, b), 8); }

    static Bytes load_q8(const int8_t* p) {
        return {_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)),
                _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16))};
    }
    static Bytes load_nibbles(const uint8_t* qs) {
        const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
        const __m128i m = set_bytes(0x0F);
        return {_mm_and_si128(t, m), _mm_and_si128(_mm_srli_epi16(t, 4), m)};
    }
    // iq4_nl: code bytes j and j + 8 of the block (kIQ4NLPairs' words) into words j of two registers
    // (pinsrw); their low bytes are values 0..15 and their high bytes values 16..31, each sign-extended
    // to int16 and packed back to bytes (exact: they are levels, -127..113).
    static Bytes load_iq4_nl(const uint8_t* qs) {
        const uint16_t* w = kIQ4NLPairs.w;
        auto words = [&](const uint8_t* q) {
            return _mm_set_epi16(static_cast<short>(w[q[7]]), static_cast<short>(w[q[6]]), static_cast<short>(w[q[5]]),
                                 static_cast<short>(w[q[4]]), static_cast<short>(w[q[3]]), static_cast<short>(w[q[2]]),
                                 static_cast<short>(w[q[1]]), static_cast<short>(w[q[0]]));
        };
        const __m128i a = words(qs), b = words(qs + 8);
        const __m128i lo = _mm_packs_epi16(_mm_srai_epi16(_mm_slli_epi16(a, 8), 8), _mm_srai_epi16(_mm_slli_epi16(b, 8), 8));
        return {lo, _mm_packs_epi16(_mm_srai_epi16(a, 8), _mm_srai_epi16(b, 8))};
    }
    // 0x10 in byte j where bit j of qh is set: each byte of qh copied over 8 bytes, tested bit by bit.
    static __m128i bits16(uint32_t two_bytes) {
        const uint64_t lo = (two_bytes & 0xFFu) * 0x0101010101010101ull;
        const uint64_t hi = ((two_bytes >> 8) & 0xFFu) * 0x0101010101010101ull;
        const __m128i sel = _mm_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
        const __m128i v = _mm_set_epi64x(static_cast<int64_t>(hi), static_cast<int64_t>(lo));
        return _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, sel), sel), set_bytes(0x10));
    }
    static Bytes add_high_bits(Bytes b, const uint8_t* qh_bytes) {
        uint32_t qh;
        std::memcpy(&qh, qh_bytes, 4);
        return {_mm_or_si128(b.lo, bits16(qh & 0xFFFFu)), _mm_or_si128(b.hi, bits16(qh >> 16))};
    }
    static Bytes sub(Bytes b, int8_t v) { return {_mm_sub_epi8(b.lo, set_bytes(v)), _mm_sub_epi8(b.hi, set_bytes(v))}; }
    static __m128i min8(__m128i b, __m128i v) {  // signed, without SSE4.1's pminsb
        const __m128i gt = _mm_cmpgt_epi8(b, v);
        return _mm_or_si128(_mm_andnot_si128(gt, b), _mm_and_si128(gt, v));
    }
    static Bytes min(Bytes b, int8_t v) { return {min8(b.lo, set_bytes(v)), min8(b.hi, set_bytes(v))}; }
    static void store(Bytes b, int8_t* p) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), b.lo);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 16), b.hi);
    }
    static void store_nibbles(Bytes b, uint8_t* qs) {
        const __m128i m = set_bytes(0x0F);
        const __m128i r = _mm_or_si128(_mm_and_si128(b.lo, m), _mm_slli_epi16(_mm_and_si128(b.hi, m), 4));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), r);
    }
    static uint32_t bit4_mask(Bytes b) {
        const uint32_t lo = static_cast<uint32_t>(_mm_movemask_epi8(_mm_slli_epi16(b.lo, 3)));
        const uint32_t hi = static_cast<uint32_t>(_mm_movemask_epi8(_mm_slli_epi16(b.hi, 3)));
        return lo | hi << 16;
    }
    // Low byte of each int32, sign-extended so that the saturating packs keep it exactly.
    static __m128i low_bytes16(const I* v) {
        __m128i s[4];
        for (int k = 0; k < 4; ++k) s[k] = _mm_srai_epi32(_mm_slli_epi32(v[k], 24), 24);
        return _mm_packs_epi16(_mm_packs_epi32(s[0], s[1]), _mm_packs_epi32(s[2], s[3]));
    }
    static Bytes low_bytes(const I* v) { return {low_bytes16(v), low_bytes16(v + 4)}; }
    // For values known to lie in -128..127 the saturating packs alone are exact.
    static Bytes pack_small(const I* v) {
        return {_mm_packs_epi16(_mm_packs_epi32(v[0], v[1]), _mm_packs_epi32(v[2], v[3])),
                _mm_packs_epi16(_mm_packs_epi32(v[4], v[5]), _mm_packs_epi32(v[6], v[7]))};
    }
    static void widen(Bytes b, F* out) {
        const __m128i w[4] = {widen_lo(b.lo), widen_hi(b.lo), widen_lo(b.hi), widen_hi(b.hi)};
        for (int k = 0; k < 4; ++k) {
            out[2 * k] = _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(w[k], w[k]), 16));
            out[2 * k + 1] = _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpackhi_epi16(w[k], w[k]), 16));
        }
    }

    static void widen_pair(Bytes b, int p, F* out) {  // values 8p..8p+7
        const __m128i src = p < 2 ? b.lo : b.hi;
        const __m128i w = p % 2 ? widen_hi(src) : widen_lo(src);
        out[0] = _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpacklo_epi16(w, w), 16));
        out[1] = _mm_cvtepi32_ps(_mm_srai_epi32(_mm_unpackhi_epi16(w, w), 16));
    }

    static Key key(Bytes b) { return {{widen_lo(b.lo), widen_hi(b.lo), widen_lo(b.hi), widen_hi(b.hi)}}; }
    using UKey = Key;  // int16 products do not care about the sign
    static UKey ukey(Bytes b) { return key(b); }
    using IDot = __m128i;
    static IDot dot_signed(const Key& k, const int8_t* y) {
        const Bytes q = load_q8(y);
        __m128i s = _mm_madd_epi16(k.w[0], widen_lo(q.lo));
        s = _mm_add_epi32(s, _mm_madd_epi16(k.w[1], widen_hi(q.lo)));
        s = _mm_add_epi32(s, _mm_madd_epi16(k.w[2], widen_lo(q.hi)));
        return _mm_add_epi32(s, _mm_madd_epi16(k.w[3], widen_hi(q.hi)));
    }
    static IDot reduce4(const IDot* p) {
        const __m128i t0 = _mm_add_epi32(_mm_unpacklo_epi32(p[0], p[1]), _mm_unpackhi_epi32(p[0], p[1]));
        const __m128i t1 = _mm_add_epi32(_mm_unpacklo_epi32(p[2], p[3]), _mm_unpackhi_epi32(p[2], p[3]));
        return _mm_add_epi32(_mm_unpacklo_epi64(t0, t1), _mm_unpackhi_epi64(t0, t1));
    }
    static F dot_to_f32(IDot v) { return _mm_cvtepi32_ps(v); }
    static IDot dot4_signed(const Key& k, const int8_t* const* y) {
        const IDot p[4] = {dot_signed(k, y[0]), dot_signed(k, y[1]), dot_signed(k, y[2]), dot_signed(k, y[3])};
        return reduce4(p);
    }
    static IDot dot4_unsigned(const UKey& k, const int8_t* const* y) { return dot4_signed(k, y); }
    static F dot(const Key& k, const int8_t* y) { return _mm_cvtepi32_ps(dot_signed(k, y)); }

    // out[k] = the sum of the 4 lanes of rows[k], k < count: four rows transposed, then added.
    static void reduce_add_rows(const F* rows, int count, float* out) {
        for (int k0 = 0; k0 < count; k0 += 4) {
            __m128 r[4];
            for (int k = 0; k < 4; ++k) r[k] = k0 + k < count ? __m128(rows[k0 + k]) : _mm_setzero_ps();
            _MM_TRANSPOSE4_PS(r[0], r[1], r[2], r[3]);
            alignas(16) float s[4];
            _mm_store_ps(s, _mm_add_ps(_mm_add_ps(r[0], r[1]), _mm_add_ps(r[2], r[3])));
            for (int k = 0; k < 4 && k0 + k < count; ++k) out[k0 + k] = s[k];
        }
    }
    static float hmax(F v) {
        __m128 m = _mm_max_ps(v, _mm_movehl_ps(v, v));
        m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
        return _mm_cvtss_f32(m);
    }
    static I to_i32(F v) { return _mm_cvttps_epi32(v); }
    static F to_f32(I v) { return _mm_cvtepi32_ps(v); }
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

    static I load_u16(const uint16_t* p) {
        return _mm_unpacklo_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)), _mm_setzero_si128());
    }
    static void store_u16(uint16_t* p, I v) {  // the low 16 bits of each lane
        const __m128i s = _mm_srai_epi32(_mm_slli_epi32(v, 16), 16);
        _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi32(s, s));
    }
    static F load_f16(const uint16_t* p) { return f16_to_f32_batch<A>(bit_cast<uint32_t>(load_u16(p))); }
    static void store_f16(uint16_t* p, F v) { store_u16(p, bit_cast<int32_t>(f32_to_f16_batch<A>(v))); }
};

}  // namespace
}  // namespace kvq::simd
