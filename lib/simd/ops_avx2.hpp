// AVX2 (+FMA, F16C) primitives for kernels_impl.hpp: the int8 block work that xsimd does not cover
// (byte packing, nibbles, maddubs dot products) and F16C conversions. Included only by files compiled
// with -mavx2 -mfma -mf16c (level_avx2.cpp, and level_avx512.cpp, which keeps 256-bit int8 blocks).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../ref/blocks.hpp"
#include "ops.hpp"

namespace kvq::simd {
namespace {

// One 32-value block as 32 bytes in a ymm register, and the ggml dot product against an int8 query:
// maddubs needs one unsigned operand, so multiply |k| by y carrying k's sign (sign_epi8), as ggml's
// mul_sum_i8_pairs does. |k| ≤ 128 and |y| ≤ 127, so the int16 pair sums cannot saturate.
struct Avx2Blocks {
    using Bytes = __m256i;
    struct Key {
        __m256i k, abs_k;
    };

    static Bytes load_q8(const int8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
    // qs[j] low nibble -> value j, high nibble -> value j+16 (ggml order).
    static Bytes load_nibbles(const uint8_t* qs) {
        const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
        const __m256i b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
        return _mm256_and_si256(b, _mm256_set1_epi8(0x0F));
    }
    // iq4_nl: the nibbles (load_nibbles' order) looked up in the 16 levels (kIQ4NLValues), one pshufb for
    // the whole block (the table in both 128-bit halves), as ggml's iq4_nl kernels do.
    static Bytes load_iq4_nl(const uint8_t* qs) {
        const __m256i levels = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(detail::kIQ4NLValues)));
        return _mm256_shuffle_epi8(levels, load_nibbles(qs));
    }
    // Sets 0x10 in byte j where bit j of qh is set (ggml's bytes_from_bits_32).
    static Bytes add_high_bits(Bytes b, const uint8_t* qh_bytes) {
        uint32_t qh;
        std::memcpy(&qh, qh_bytes, 4);
        const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
        __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
        bits = _mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        bits = _mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1));
        return _mm256_or_si256(b, _mm256_and_si256(bits, _mm256_set1_epi8(0x10)));
    }
    static Bytes sub(Bytes b, int8_t v) { return _mm256_sub_epi8(b, _mm256_set1_epi8(v)); }
    static Bytes min(Bytes b, int8_t v) { return _mm256_min_epi8(b, _mm256_set1_epi8(v)); }
    static void store(Bytes b, int8_t* p) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), b); }
    static void store_nibbles(Bytes b, uint8_t* qs) {
        const __m128i m = _mm_set1_epi8(0x0F);
        const __m128i lo = _mm_and_si128(_mm256_castsi256_si128(b), m);
        const __m128i hi = _mm_and_si128(_mm256_extracti128_si256(b, 1), m);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
    }
    // store_nibbles for codes known to lie in 0..15: no masking (a 16-bit shift by 4 keeps each byte's
    // code in its own byte).
    static void store_nibbles15(Bytes b, uint8_t* qs) {
        const __m128i lo = _mm256_castsi256_si128(b), hi = _mm256_extracti128_si256(b, 1);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qs), _mm_or_si128(lo, _mm_slli_epi16(hi, 4)));
    }
    // Bit j = bit 4 of byte j.
    static uint32_t bit4_mask(Bytes b) { return static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(b, 3))); }
    // The low byte of each of 32 int32 values (4 registers of 8), in order: C's int -> int8_t conversion.
    static Bytes low_bytes(const __m256i v[4]) {
        const __m256i m = _mm256_set1_epi32(0xFF);
        const __m256i a = _mm256_packus_epi32(_mm256_and_si256(v[0], m), _mm256_and_si256(v[1], m));
        const __m256i b = _mm256_packus_epi32(_mm256_and_si256(v[2], m), _mm256_and_si256(v[3], m));
        return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    }
    // Values 8i..8i+7 of the block, sign-extended to int32.
    static __m256i widen(Bytes b, int i) {
        const __m128i h = i < 2 ? _mm256_castsi256_si128(b) : _mm256_extracti128_si256(b, 1);
        return _mm256_cvtepi8_epi32(i % 2 ? _mm_srli_si128(h, 8) : h);
    }

    static Key key(Bytes k) { return {k, _mm256_abs_epi8(k)}; }
    // Keys with values in 0..31 (unsigned nibbles, before their offset): maddubs takes them as they are.
    using UKey = __m256i;
    static UKey ukey(Bytes k) { return k; }
    using IDot = __m256i;  // eight int32 partial sums of one block's dot product
    static IDot dot_signed(const Key& key, const int8_t* y) {
        const __m256i sy = _mm256_sign_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y)), key.k);
        return _mm256_madd_epi16(_mm256_maddubs_epi16(key.abs_k, sy), _mm256_set1_epi16(1));
    }
    // Four dot products' partial sums transposed and added: lane i (of each 128-bit half) sums p[i].
    static IDot reduce4(const IDot* p) {
        const __m256i t0 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
        const __m256i t1 = _mm256_add_epi32(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
        return _mm256_add_epi32(_mm256_unpacklo_epi64(t0, t1), _mm256_unpackhi_epi64(t0, t1));
    }
    static xsimd::batch<float, xsimd::fma3<xsimd::avx2>> dot_to_f32(IDot v) { return _mm256_cvtepi32_ps(v); }
    // reduce4 of four queries' dot products with one key block. Unsigned codes are at most 31 and
    // |y| <= 128, so eight products fit in int16 (31·128·8 < 2^15): sum them with hadd before widening.
    static IDot dot4_unsigned(UKey k, const int8_t* const* y) {
        __m256i m[4];
        for (int i = 0; i < 4; ++i) m[i] = _mm256_maddubs_epi16(k, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i])));
        const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(m[0], m[1]), _mm256_hadd_epi16(m[2], m[3]));
        return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
    }
    // Signed keys (q8_0): the pair sums reach 2·128·127, so each query's are widened (madd) before the
    // four are transposed and added, by unpacks rather than hadd (hadd is several uops on AMD: measured
    // 10-15% faster on one Zen 3 thread, 4 queries × 32 rows per call).
    static IDot dot4_signed(const Key& k, const int8_t* const* y) {
        IDot p[4];
        for (int i = 0; i < 4; ++i) p[i] = dot_signed(k, y[i]);
        return reduce4(p);
    }
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    // With AVX512-VNNI (the avx512 level's VNNI build, level_avx512_vnni.cpp): vpdpbusd takes an unsigned
    // and a signed operand and sums four products into each int32 lane in one instruction. Signed keys
    // are made unsigned by flipping their sign bit, k ^ 0x80 = k + 128, so the four queries' sums are
    // Σ k·y + 128·Σ y; dot4_signed_offset(0 bytes, y) is that offset alone, computed once per block of
    // the queries, and the difference is dot4_signed's exact integers, in the same lanes.
    static constexpr bool kVnni = true;
    static IDot dot4_signed_offset(Bytes k, const int8_t* const* y) {
        const __m256i uk = _mm256_xor_si256(k, _mm256_set1_epi8(static_cast<char>(0x80)));
        IDot p[4];
        for (int i = 0; i < 4; ++i) {
            p[i] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), uk, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i])));
        }
        return reduce4(p);
    }
    static IDot idot_sub(IDot a, IDot b) { return _mm256_sub_epi32(a, b); }
    static Bytes zero_bytes() { return _mm256_setzero_si256(); }
    // The same sums with the offset taken out as they are made: each query's vpdpbusd accumulates into
    // the negative of its own offset lanes (neg_offsets4, once per block of the queries), so a block
    // costs no zeroed register and no subtraction; the integers are dot4_signed_offset's minus its
    // offset, exactly.
    static void neg_offsets4(const int8_t* const* y, IDot* neg) {
        const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
        for (int i = 0; i < 4; ++i) {
            const __m256i off = _mm256_dpbusd_epi32(_mm256_setzero_si256(), flip, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i])));
            neg[i] = _mm256_sub_epi32(_mm256_setzero_si256(), off);
        }
    }
    static IDot dot4_signed_less(Bytes k, const int8_t* const* y, const IDot* neg) {
        const __m256i uk = _mm256_xor_si256(k, _mm256_set1_epi8(static_cast<char>(0x80)));
        IDot p[4];
        for (int i = 0; i < 4; ++i) p[i] = _mm256_dpbusd_epi32(neg[i], uk, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i])));
        return reduce4(p);
    }
    // Unsigned codes (q4_0 block pairs): code·y summed four at a time, no int16 stage.
    static IDot dot4_pair_vnni(__m256i lo, __m256i hi, const int8_t (*ylo)[32], const int8_t (*yhi)[32]) {
        IDot p[4];
        for (int i = 0; i < 4; ++i) {
            const __m256i a = _mm256_dpbusd_epi32(_mm256_setzero_si256(), lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(ylo[i])));
            p[i] = _mm256_dpbusd_epi32(a, hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(yhi[i])));
        }
        return reduce4(p);
    }
#endif
    // Eight partial sums of k·y (exact integers, as floats).
    static xsimd::batch<float, xsimd::fma3<xsimd::avx2>> dot(const Key& key, const int8_t* y) {
        return _mm256_cvtepi32_ps(dot_signed(key, y));
    }

    static float f16_value(uint16_t h) { return _cvtsh_ss(h); }

    // Two nibble blocks at once, one per 128-bit half (kernels_impl.hpp's score_group4_pairs): a block's
    // 16 bytes hold values 0..15 in their low and 16..31 in their high nibbles, so the low nibbles of
    // both blocks make one register and the high nibbles another, and the query is laid out to match.
    static constexpr bool kBlockPairs = true;
    static void load_nibble_pair(const uint8_t* qs0, const uint8_t* qs1, __m256i& lo, __m256i& hi) {
        const __m256i t = _mm256_inserti128_si256(
            _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0))),
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1)), 1);
        const __m256i m = _mm256_set1_epi8(0x0F);
        lo = _mm256_and_si256(t, m);
        hi = _mm256_and_si256(_mm256_srli_epi16(t, 4), m);
    }
    // Lane i of the low half: Σ over block 0 of code·y for query i; of the high half: the same for block 1.
    // ylo[i] / yhi[i]: query i's values 0..15 / 16..31 of block 0, then of block 1 (32 bytes each).
    // Codes are at most 15 and |y| <= 128, so the int16 sums of up to 16 products stay below 2^15.
    static IDot dot4_pair(__m256i lo, __m256i hi, const int8_t (*ylo)[32], const int8_t (*yhi)[32]) {
        __m256i m[4];
        for (int i = 0; i < 4; ++i) {
            m[i] = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_load_si256(reinterpret_cast<const __m256i*>(ylo[i]))),
                                    _mm256_maddubs_epi16(hi, _mm256_load_si256(reinterpret_cast<const __m256i*>(yhi[i]))));
        }
        const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(m[0], m[1]), _mm256_hadd_epi16(m[2], m[3]));
        return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
    }
    // out[i][r] = result[r][i] + result[r][i + 4] for i < 4, r < n: the two halves of each row's sums
    // added and transposed, four rows at a time.
    static void store_half_sums4(const float (*result)[8], size_t n, float* const* out) {
        size_t r = 0;
        for (; r + 4 <= n; r += 4) {
            __m128 x[4];
            for (int k = 0; k < 4; ++k) x[k] = _mm_add_ps(_mm_load_ps(result[r + k]), _mm_load_ps(result[r + k] + 4));
            _MM_TRANSPOSE4_PS(x[0], x[1], x[2], x[3]);
            for (int i = 0; i < 4; ++i) _mm_storeu_ps(out[i] + r, x[i]);
        }
        for (; r < n; ++r) {
            for (int i = 0; i < 4; ++i) out[i][r] = result[r][i] + result[r][i + 4];
        }
    }
    // out[k] = the sum of the 8 lanes of rows[k], for k < count (rows past count are not read): four
    // rows at a time, two hadds transpose them into one register per 128-bit half, whose halves are added.
    static void reduce_add_rows(const xsimd::batch<float, xsimd::fma3<xsimd::avx2>>* rows, int count, float* out) {
        for (int k0 = 0; k0 < count; k0 += 4) {
            __m256 r[4];
            for (int k = 0; k < 4; ++k) r[k] = k0 + k < count ? __m256(rows[k0 + k]) : _mm256_setzero_ps();
            const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(r[0], r[1]), _mm256_hadd_ps(r[2], r[3]));
            alignas(16) float s[4];
            _mm_store_ps(s, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
            for (int k = 0; k < 4 && k0 + k < count; ++k) out[k0 + k] = s[k];
        }
    }
    // Two fp16 values, each broadcast to one 128-bit half, as floats.
    static xsimd::batch<float, xsimd::fma3<xsimd::avx2>> f16_pair(uint16_t d0, uint16_t d1) {
        return _mm256_cvtph_ps(_mm_unpacklo_epi64(_mm_set1_epi16(static_cast<short>(d0)), _mm_set1_epi16(static_cast<short>(d1))));
    }
};

template <>
struct Ops<xsimd::fma3<xsimd::avx2>> : Avx2Blocks {
    using A = xsimd::fma3<xsimd::avx2>;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    using DotArch = A;

    static float hmax(F v) {
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
        return _mm_cvtss_f32(m);
    }
    // hmax(v) in every lane.
    static F hmax_all(F v) {
        __m256 m = _mm256_max_ps(v, _mm256_permute2f128_ps(v, v, 1));
        m = _mm256_max_ps(m, _mm256_permute_ps(m, 0x4E));
        return _mm256_max_ps(m, _mm256_permute_ps(m, 0xB1));
    }
    static I to_i32(F v) { return _mm256_cvttps_epi32(v); }  // truncation, as C's float -> int
    static F to_f32(I v) { return _mm256_cvtepi32_ps(v); }
    static Bytes low_bytes(const I* v) {
        const __m256i r[4] = {v[0], v[1], v[2], v[3]};
        return Avx2Blocks::low_bytes(r);
    }
    // The same for values known to lie in -128..127: saturating packs are then exact.
    static Bytes pack_small(const I* v) {
        const __m256i a = _mm256_packs_epi32(v[0], v[1]), b = _mm256_packs_epi32(v[2], v[3]);
        return _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    }
    static void widen(Bytes b, F* out) {
        for (int i = 0; i < 4; ++i) out[i] = _mm256_cvtepi32_ps(Avx2Blocks::widen(b, i));
    }
    static void widen_pair(Bytes b, int p, F* out) {  // values 16p..16p+15
        out[0] = _mm256_cvtepi32_ps(Avx2Blocks::widen(b, 2 * p));
        out[1] = _mm256_cvtepi32_ps(Avx2Blocks::widen(b, 2 * p + 1));
    }
    static F load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
    static void store_f16(uint16_t* p, F v) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    static I load_u16(const uint16_t* p) { return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
    static void store_u16(uint16_t* p, I v) {  // the low 16 bits of each lane
        const __m256i s = _mm256_srai_epi32(_mm256_slli_epi32(v, 16), 16);
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(s, s), 0x08);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
    }
};

}  // namespace
}  // namespace kvq::simd
