// AVX-512 (F, BW, VL, DQ) primitives for kernels_impl.hpp. Float work (quantize, dequantize, plain codecs,
// accumulate) uses 512-bit batches; an int8 block is 32 bytes, so block dot products keep the 256-bit
// AVX2 code (DotArch), compiled here with EVEX encodings and 32 vector registers. Included only by
// level_avx512.cpp.
#pragma once

#include <immintrin.h>

#include <algorithm>

#include "ops_avx2.hpp"

namespace kvq::simd {
namespace {

template <>
struct Ops<xsimd::avx512bw> : Avx2Blocks {
    using A = xsimd::avx512bw;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    using DotArch = xsimd::fma3<xsimd::avx2>;

    // out[k] = the sum of the 16 lanes of rows[k], k < count: each row folded to 256 bits (its halves
    // added), then the AVX2 transpose.
    static void reduce_add_rows(const F* rows, int count, float* out) {
        using F8 = xsimd::batch<float, DotArch>;
        for (int k0 = 0; k0 < count; k0 += 4) {
            F8 half[4];
            const int n = std::min(4, count - k0);
            for (int k = 0; k < n; ++k) {
                const __m512 v = rows[k0 + k];
                half[k] = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
            }
            Avx2Blocks::reduce_add_rows(half, n, out + k0);
        }
    }
    static float hmax(F v) { return _mm512_reduce_max_ps(v); }
    static I to_i32(F v) { return _mm512_cvttps_epi32(v); }
    static F to_f32(I v) { return _mm512_cvtepi32_ps(v); }
    static Bytes low_bytes(const I* v) {  // vpmovdb truncates: exactly the low byte
        return _mm256_set_m128i(_mm512_cvtepi32_epi8(v[1]), _mm512_cvtepi32_epi8(v[0]));
    }
    static Bytes pack_small(const I* v) { return low_bytes(v); }
    static void widen(Bytes b, F* out) {
        out[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(b)));
        out[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(b, 1)));
    }
    static void widen_pair(Bytes b, int, F* out) { widen(b, out); }  // a pair of 16 lanes is the whole block
    static F load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
    static void store_f16(uint16_t* p, F v) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    static I load_u16(const uint16_t* p) { return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
    static void store_u16(uint16_t* p, I v) { _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(v)); }
};

}  // namespace
}  // namespace kvq::simd
