// The lane shuffles the polar/turbo quantizers (quantize_rotated_impl.hpp) need beyond xsimd, per
// instruction set: RotOps<A>::
//   swap<h>(v)            lane l takes lane l xor h (h < lanes): the partner of a Walsh-Hadamard butterfly
//   deinterleave(a, b, e, o)  e = the even lanes of the 2N values a‖b, o = the odd ones, in order
//   widen(v, lo, hi)      lanes 0..N/2−1 and N/2..N−1 as doubles (exact)
//   lookup16(t, i)        t[i] for every lane, i in 0..15 (t: 16 floats); lookup8 the same for i in 0..7
//   add_unless_less(r, v, t, s)  r + s in the lanes where !(v < t) (NaN v included), r elsewhere
// Their contracts are exercised by the quantizers' byte comparison with the specification at every level
// (selfcheck, selftest, tests/test_rotated_quantize.cpp), on rows that reach every lane.
#pragma once

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
    static void widen(F v, D& lo, D& hi) {
        lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
    }
    static F lookup16(const float* t, I i) { return _mm512_permutexvar_ps(i, _mm512_loadu_ps(t)); }
    static F lookup8(const float* t, I i) { return lookup16(t, i); }
    static I add_unless_less(I r, F v, F t, int s) {
        return _mm512_mask_add_epi32(r, _mm512_cmp_ps_mask(v, t, _CMP_NLT_UQ), r, _mm512_set1_epi32(s));
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
    static void widen(F v, D& lo, D& hi) {
        lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
    }
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
    static void widen(F v, D& lo, D& hi) {
        lo = _mm_cvtps_pd(v);
        hi = _mm_cvtps_pd(_mm_movehl_ps(v, v));
    }
    static F lookup16(const float* t, I i) { return lookup_lanes<A>(t, i); }
    static F lookup8(const float* t, I i) { return lookup_lanes<A>(t, i); }
    static I add_unless_less(I r, F v, F t, int s) {
        return _mm_add_epi32(r, _mm_and_si128(_mm_castps_si128(_mm_cmpnlt_ps(v, t)), _mm_set1_epi32(s)));
    }
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
    static void widen(F v, D& lo, D& hi) {
        lo = vcvt_f64_f32(vget_low_f32(v));
        hi = vcvt_high_f64_f32(v);
    }
    static F lookup16(const float* t, I i) { return lookup_lanes<A>(t, i); }
    static F lookup8(const float* t, I i) { return lookup_lanes<A>(t, i); }
    static I add_unless_less(I r, F v, F t, int s) {  // vcltq is false for NaN: bic keeps s there
        return vaddq_s32(r, vbicq_s32(vdupq_n_s32(s), vreinterpretq_s32_u32(vcltq_f32(v, t))));
    }
};
#endif

}  // namespace
}  // namespace kvq::simd
