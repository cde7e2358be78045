// The lane shuffles the polar/turbo quantizers (quantize_rotated_impl.hpp) need beyond xsimd, per
// instruction set: RotOps<A>::
//   swap<h>(v)            lane l takes lane l xor h (h < lanes): the partner of a Walsh-Hadamard butterfly
//   deinterleave(a, b, e, o)  e = the even lanes of the 2N values a‖b, o = the odd ones, in order
//   load_wide(p, lo, hi)  the N floats at p as doubles (exact): p[0..N/2) in lo, p[N/2..N) in hi
//   fmadd(a, b, c)        a·b + c (float or double), in one instruction where there is one (xsimd 8.1 has
//                         none for AVX-512); the callers use it only where a·b is exact, so fused or not
//                         it rounds as a·b + c does
//   lookup16(t, i)        t[i] for every lane, i in 0..15 (t: 16 floats); lookup8 the same for i in 0..7;
//                         kLookup16: lookup16 is one instruction (else lookup8 is the cheap one)
//   kLookup32, lookup32(t, i)  (AVX-512) t[i], i in 0..31, t: 32 floats or int32 (one instruction)
//   to_int(v)             v truncated to int32 (v within int32's range)
//   sum_lanes(v)          the lanes of a float or double register added as a tree: lane i + lane i + L/2
//                         for the L lanes left, halving L, to one (sum16_float / sum16_double's order)
//   add_unless_less(r, v, t, s)  r + s in the lanes where !(v < t) (NaN v included), r elsewhere
//   select_unless_less(v, t, a, b)  a where !(v < t), b elsewhere
//   add_if_less(r, v, t, s), select_if_less(v, t, a, b)  the same where v < t (false for NaN)
//   bits_if_less(v, t, s)  s where v < t, 0 elsewhere
//   kPackCodes, pack_codes<B>(r, map, out)  (AVX2, AVX-512) the 4N ranks of r[0..3] (0..2^B−1), each
//                         mapped through map (16 bytes; null: the rank itself), as B-bit codes packed
//                         back to back from bit 0 of out (bit_codes.hpp); writes out[0, 2N): the N·B/2
//                         bytes of codes, then zeros
// Their contracts are exercised by the quantizers' byte comparison with the specification at every level
// (selfcheck, selftest, tests/test_rotated_quantize.cpp), on rows that reach every lane.
#pragma once

#include <array>
#include <cstdint>

#include "xsimd_compat.hpp"

#if defined(__SSE2__)
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#include <arm_neon.h>
#endif

namespace kvq::simd {
namespace {

template <class A>
struct RotOps;

// The generic lookup: through memory, lane by lane.
template <class A>
xsimd::batch<float, A> lookup_lanes(const float* t, xsimd::batch<int32_t, A> i) {
    constexpr int N = xsimd::batch<float, A>::size;
    alignas(64) int32_t idx[N];
    alignas(64) float out[N];
    i.store_aligned(idx);
    for (int l = 0; l < N; ++l) out[l] = t[idx[l]];
    return xsimd::batch<float, A>::load_aligned(out);
}

#if defined(__SSE2__)
// The last steps of sum_lanes on x86: lanes i + i + L/2 down to one lane.
inline float sum_lanes4(__m128 v) {
    const __m128 c = _mm_add_ps(v, _mm_movehl_ps(v, v));
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}
inline double sum_lanes2(__m128d v) { return _mm_cvtsd_f64(_mm_add_sd(v, _mm_unpackhi_pd(v, v))); }
#endif
#if defined(__AVX__)
inline float sum_lanes8(__m256 v) { return sum_lanes4(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1))); }
inline double sum_lanes4(__m256d v) { return sum_lanes2(_mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1))); }
#endif

#if defined(__AVX512F__)
template <>
struct RotOps<xsimd::avx512bw> {
    using A = xsimd::avx512bw;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    using D = xsimd::batch<double, A>;
    template <int H>
    static F swap(F v) {
        if constexpr (H == 1) return _mm512_permute_ps(v, 0xB1);
        if constexpr (H == 2) return _mm512_permute_ps(v, 0x4E);
        if constexpr (H == 4) return _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(2, 3, 0, 1));
        if constexpr (H == 8) return _mm512_shuffle_f32x4(v, v, _MM_SHUFFLE(1, 0, 3, 2));
    }
    static void deinterleave(F a, F b, F& even, F& odd) {
        const __m512i e = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
        const __m512i o = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
        even = _mm512_permutex2var_ps(a, e, b);
        odd = _mm512_permutex2var_ps(a, o, b);
    }
    static void load_wide(const float* p, D& lo, D& hi) {
        lo = _mm512_cvtps_pd(_mm256_loadu_ps(p));
        hi = _mm512_cvtps_pd(_mm256_loadu_ps(p + 8));
    }
    static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static D fmadd(D a, D b, D c) { return _mm512_fmadd_pd(a, b, c); }
    static constexpr bool kLookup16 = true, kLookup32 = true;
    static F lookup16(const float* t, I i) { return _mm512_permutexvar_ps(i, _mm512_loadu_ps(t)); }
    static F lookup32(const float* t, I i) { return _mm512_permutex2var_ps(_mm512_loadu_ps(t), i, _mm512_loadu_ps(t + 16)); }
    static I lookup32(const int32_t* t, I i) {
        return _mm512_permutex2var_epi32(_mm512_loadu_si512(t), i, _mm512_loadu_si512(t + 16));
    }
    static I to_int(F v) { return _mm512_cvttps_epi32(v); }
    static float sum_lanes(F v) {
        return sum_lanes8(_mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)));
    }
    static double sum_lanes(D v) {
        return sum_lanes4(_mm256_add_pd(_mm512_castpd512_pd256(v), _mm512_extractf64x4_pd(v, 1)));
    }
    static F lookup8(const float* t, I i) { return lookup16(t, i); }
    static I add_unless_less(I r, F v, F t, int s) {
        return _mm512_mask_add_epi32(r, _mm512_cmp_ps_mask(v, t, _CMP_NLT_UQ), r, _mm512_set1_epi32(s));
    }
    static F select_unless_less(F v, F t, F a, F b) {
        return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, t, _CMP_NLT_UQ), b, a);
    }
    static I add_if_less(I r, F v, F t, int s) {
        return _mm512_mask_add_epi32(r, _mm512_cmp_ps_mask(v, t, _CMP_LT_OQ), r, _mm512_set1_epi32(s));
    }
    static F select_if_less(F v, F t, F a, F b) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(v, t, _CMP_LT_OQ), b, a); }
    static I bits_if_less(F v, F t, int s) { return _mm512_maskz_mov_epi32(_mm512_cmp_ps_mask(v, t, _CMP_LT_OQ), _mm512_set1_epi32(s)); }

    // Saturating packs work per 128-bit lane (byte 4k + i of lane L is value 16k + 4L + i): a dword
    // transpose puts value j at byte j. Then pairs of codes are summed into 16 bits and pairs of those
    // into 32 (maddubs, madd: code + code' << B), a qword gets its 8 codes in its low B bytes, and a word
    // or dword permute gathers those bytes.
    static constexpr bool kPackCodes = true;
    template <int B>
    [[gnu::always_inline]] static inline void pack_codes(const I* r, const uint8_t* map, uint8_t* out) {
        static_assert(B >= 1 && B <= 4);
        const __m512i w = _mm512_packs_epi16(_mm512_packs_epi32(r[0], r[1]), _mm512_packs_epi32(r[2], r[3]));
        __m512i b = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), w);
        if (map) b = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(map))), b);
        __m512i packed;
        if constexpr (B == 1) {
            packed = _mm512_zextsi128_si512(_mm_cvtsi64_si128(static_cast<long long>(_mm512_movepi8_mask(_mm512_slli_epi16(b, 7)))));
        } else {
            const __m512i m1 = _mm512_maddubs_epi16(b, _mm512_set1_epi16(static_cast<int16_t>(1 | (1 << (B + 8)))));
            const __m512i m2 = _mm512_madd_epi16(m1, _mm512_set1_epi32(1 | (1 << (2 * B + 16))));
            const __m512i q = _mm512_or_si512(m2, _mm512_srli_epi64(m2, 32 - 4 * B));
            if constexpr (B == 4) {
                packed = _mm512_maskz_permutexvar_epi32(0x00FF, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 0, 0, 0, 0, 0, 0, 0, 0), q);
            } else {
                static constexpr std::array<int16_t, 32> words = qword_words<B>();
                const __m512i byte3 = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 8, 9, 10, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1));
                const __m512i src = B == 3 ? _mm512_shuffle_epi8(q, byte3) : q;
                packed = _mm512_maskz_permutexvar_epi16((1u << (4 * B)) - 1, _mm512_loadu_si512(words.data()), src);
            }
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm512_castsi512_si256(packed));
    }
    // The words that hold the codes: B = 2, word 0 of every qword; B = 3, words 0..2 of every 128-bit
    // lane (after the in-lane byte shuffle).
    template <int B>
    static constexpr std::array<int16_t, 32> qword_words() {
        std::array<int16_t, 32> w{};
        for (int i = 0; i < 4 * B; ++i) w[i] = static_cast<int16_t>(B == 2 ? 4 * i : 8 * (i / 3) + i % 3);
        return w;
    }
};
#endif

#if defined(__AVX2__)
template <>
struct RotOps<xsimd::fma3<xsimd::avx2>> {
    using A = xsimd::fma3<xsimd::avx2>;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    using D = xsimd::batch<double, A>;
    template <int H>
    static F swap(F v) {
        if constexpr (H == 1) return _mm256_permute_ps(v, 0xB1);
        if constexpr (H == 2) return _mm256_permute_ps(v, 0x4E);
        if constexpr (H == 4) return _mm256_permute2f128_ps(v, v, 1);
    }
    static void deinterleave(F a, F b, F& even, F& odd) {
        // Within 128-bit halves: a0 a2 b0 b2 | a4 a6 b4 b6; then the 64-bit pieces in order 0, 2, 1, 3.
        const __m256 e = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        const __m256 o = _mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
        even = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xD8));
        odd = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xD8));
    }
    static void load_wide(const float* p, D& lo, D& hi) {
        lo = _mm256_cvtps_pd(_mm_loadu_ps(p));
        hi = _mm256_cvtps_pd(_mm_loadu_ps(p + 4));
    }
    static F fmadd(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static D fmadd(D a, D b, D c) { return _mm256_fmadd_pd(a, b, c); }
    static constexpr bool kLookup16 = false, kLookup32 = false;
    static F lookup8(const float* t, I i) { return _mm256_permutevar8x32_ps(_mm256_loadu_ps(t), i); }
    static F lookup16(const float* t, I i) {
        const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t), i);
        const __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(t + 8), i);
        return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_cmpgt_epi32(i, _mm256_set1_epi32(7))));
    }
    static I add_unless_less(I r, F v, F t, int s) {
        const __m256i m = _mm256_castps_si256(_mm256_cmp_ps(v, t, _CMP_NLT_UQ));
        return _mm256_add_epi32(r, _mm256_and_si256(m, _mm256_set1_epi32(s)));
    }
    static F select_unless_less(F v, F t, F a, F b) { return _mm256_blendv_ps(b, a, _mm256_cmp_ps(v, t, _CMP_NLT_UQ)); }
    static I bits_if_less(F v, F t, int s) {
        return _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(v, t, _CMP_LT_OQ)), _mm256_set1_epi32(s));
    }
    static I add_if_less(I r, F v, F t, int s) { return _mm256_add_epi32(r, bits_if_less(v, t, s)); }
    static F select_if_less(F v, F t, F a, F b) { return _mm256_blendv_ps(b, a, _mm256_cmp_ps(v, t, _CMP_LT_OQ)); }
    static float sum_lanes(F v) { return sum_lanes8(v); }
    static double sum_lanes(D v) { return sum_lanes4(v); }

    // As the AVX-512 version, on 32 codes: each 128-bit lane's two qwords give B bytes each, shuffled
    // to bytes 0..2B−1 (lane 0) and 2B..4B−1 (lane 1), and the lanes or-ed.
    static constexpr bool kPackCodes = true;
    template <int B>
    [[gnu::always_inline]] static inline void pack_codes(const I* r, const uint8_t* map, uint8_t* out) {
        static_assert(B >= 1 && B <= 4);
        const __m256i a = _mm256_packs_epi32(r[0], r[1]), c = _mm256_packs_epi32(r[2], r[3]);
        __m256i b = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, c), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        if (map) b = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(map))), b);
        __m128i packed;
        if constexpr (B == 1) {
            packed = _mm_cvtsi32_si128(_mm256_movemask_epi8(_mm256_slli_epi16(b, 7)));
        } else {
            const __m256i m1 = _mm256_maddubs_epi16(b, _mm256_set1_epi16(static_cast<int16_t>(1 | (1 << (B + 8)))));
            const __m256i m2 = _mm256_madd_epi16(m1, _mm256_set1_epi32(1 | (1 << (2 * B + 16))));
            const __m256i q = _mm256_or_si256(m2, _mm256_srli_epi64(m2, 32 - 4 * B));
            static constexpr std::array<int8_t, 32> bytes = lane_bytes<B>();
            const __m256i s = _mm256_shuffle_epi8(q, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bytes.data())));
            packed = _mm_or_si128(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(out), packed);
    }
    template <int B>
    static constexpr std::array<int8_t, 32> lane_bytes() {
        std::array<int8_t, 32> p{};
        for (auto& v : p) v = -1;  // zero
        for (int lane = 0; lane < 2; ++lane) {
            for (int i = 0; i < 2 * B; ++i) p[16 * lane + 2 * B * lane + i] = static_cast<int8_t>(i < B ? i : 8 + i - B);
        }
        return p;
    }
};
#endif

#if defined(__SSE2__) && !defined(__AVX2__)
template <>
struct RotOps<xsimd::sse2> {
    using A = xsimd::sse2;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    using D = xsimd::batch<double, A>;
    template <int H>
    static F swap(F v) {
        if constexpr (H == 1) return _mm_shuffle_ps(v, v, _MM_SHUFFLE(2, 3, 0, 1));
        if constexpr (H == 2) return _mm_shuffle_ps(v, v, _MM_SHUFFLE(1, 0, 3, 2));
    }
    static void deinterleave(F a, F b, F& even, F& odd) {
        even = _mm_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0));
        odd = _mm_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1));
    }
    static void load_wide(const float* p, D& lo, D& hi) {
        lo = _mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
        hi = _mm_cvtps_pd(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 2))));
    }
    static F fmadd(F a, F b, F c) { return a * b + c; }
    static D fmadd(D a, D b, D c) { return a * b + c; }
    static constexpr bool kLookup16 = false, kLookup32 = false;
    static F lookup16(const float* t, I i) { return lookup_lanes<A>(t, i); }
    static F lookup8(const float* t, I i) { return lookup_lanes<A>(t, i); }
    static I add_unless_less(I r, F v, F t, int s) {
        return _mm_add_epi32(r, _mm_and_si128(_mm_castps_si128(_mm_cmpnlt_ps(v, t)), _mm_set1_epi32(s)));
    }
    static F select_unless_less(F v, F t, F a, F b) {
        const __m128 m = _mm_cmpnlt_ps(v, t);
        return _mm_or_ps(_mm_and_ps(m, a), _mm_andnot_ps(m, b));
    }
    static I bits_if_less(F v, F t, int s) { return _mm_and_si128(_mm_castps_si128(_mm_cmplt_ps(v, t)), _mm_set1_epi32(s)); }
    static I add_if_less(I r, F v, F t, int s) { return _mm_add_epi32(r, bits_if_less(v, t, s)); }
    static F select_if_less(F v, F t, F a, F b) {
        const __m128 m = _mm_cmplt_ps(v, t);
        return _mm_or_ps(_mm_and_ps(m, a), _mm_andnot_ps(m, b));
    }
    static float sum_lanes(F v) { return sum_lanes4(v); }
    static double sum_lanes(D v) { return sum_lanes2(v); }
    static constexpr bool kPackCodes = false;
};
#endif

#if defined(__aarch64__)
template <>
struct RotOps<xsimd::neon64> {
    using A = xsimd::neon64;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    using D = xsimd::batch<double, A>;
    template <int H>
    static F swap(F v) {
        if constexpr (H == 1) return vrev64q_f32(v);
        if constexpr (H == 2) return vextq_f32(v, v, 2);
    }
    static void deinterleave(F a, F b, F& even, F& odd) {
        even = vuzp1q_f32(a, b);
        odd = vuzp2q_f32(a, b);
    }
    static void load_wide(const float* p, D& lo, D& hi) {
        lo = vcvt_f64_f32(vld1_f32(p));
        hi = vcvt_f64_f32(vld1_f32(p + 2));
    }
    static F fmadd(F a, F b, F c) { return vfmaq_f32(c, a, b); }
    static D fmadd(D a, D b, D c) { return vfmaq_f64(c, a, b); }
    static constexpr bool kLookup16 = false, kLookup32 = false;
    static F lookup16(const float* t, I i) { return lookup_lanes<A>(t, i); }
    static F lookup8(const float* t, I i) { return lookup_lanes<A>(t, i); }
    static I add_unless_less(I r, F v, F t, int s) {  // vcltq is false for NaN: bic keeps s there
        return vaddq_s32(r, vbicq_s32(vdupq_n_s32(s), vreinterpretq_s32_u32(vcltq_f32(v, t))));
    }
    static F select_unless_less(F v, F t, F a, F b) { return vbslq_f32(vcltq_f32(v, t), b, a); }
    static I bits_if_less(F v, F t, int s) { return vandq_s32(vdupq_n_s32(s), vreinterpretq_s32_u32(vcltq_f32(v, t))); }
    static I add_if_less(I r, F v, F t, int s) { return vaddq_s32(r, bits_if_less(v, t, s)); }
    static F select_if_less(F v, F t, F a, F b) { return vbslq_f32(vcltq_f32(v, t), a, b); }
    static float sum_lanes(F v) {
        const float32x2_t c = vadd_f32(vget_low_f32(v), vget_high_f32(v));
        return vget_lane_f32(c, 0) + vget_lane_f32(c, 1);
    }
    static double sum_lanes(D v) { return vgetq_lane_f64(v, 0) + vgetq_lane_f64(v, 1); }
    static constexpr bool kPackCodes = false;
};
#endif

}  // namespace
}  // namespace kvq::simd
