// AVX2 accumulate_grid for q4_0 values: acc[i][:] += Σ_r ŵ_ir · q_r with the weights w·d on the int8 grid
// of lib/ref/weight_grid.hpp, in integers. Included by kernels_impl.hpp in files compiled with AVX2 but
// not AVX512-VNNI (the avx2 level, and the avx512 level's build without VNNI, which runs the same 256-bit
// code; the VNNI build has accumulate_grid_vnni.hpp).
//
// Why integers: the float kernel (accumulate_avx2.hpp) issues one fma per value and query after widening
// and converting each code; here two rows' code bytes are interleaved once per (row pair, block), and
// each query multiplies 32 code pairs by its two int8 weights in one vpmaddubsw (16 columns) and adds
// them in 16 bits. Per group of 16 rows (the grid's) and block, each query's sums are widened, converted
// and scaled once: s · (Σ ŵ·c − 8·Σ ŵ), c = q + 8 being the stored unsigned nibble.
// The integers are exact (|Σ| ≤ 8 pairs · 2 · 15 · 127 = 30480 fits int16), so the result equals the
// specification to float rounding. Measured: docs/PERFORMANCE.md,
// "q4_0 values on int8 weights".
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include <algorithm>

#include "../ref/blocks.hpp"
#include "../ref/weight_grid.hpp"
#include "accumulate_grid_loops.hpp"

namespace kvq::simd {
namespace {

// One grid group (rn ≤ 16 rows from rows) of G ≤ 4 queries and blocks t0..t0+nt−1 (nt ≤ 4).
template <int G>
__attribute__((always_inline)) inline void grid_group_avx2(const float* w, size_t w_stride, const uint8_t* rows,
                                                           size_t row_stride, size_t rn, int64_t t0, int nt,
                                                           int64_t n, float* acc) {
    using detail::BlockQ4_0;
    static_assert(detail::kGridRows == 16);
    alignas(32) float wd[16][16];   // row r: lane tt·4 + i = w[i][r] · d(r, t0 + tt)
    alignas(32) int32_t wq[8][16];  // pair p, lane l: the int8 weights of rows 2p (low byte), 2p+1
    alignas(32) float step[16];
    alignas(32) int32_t bias[16];   // 8 · Σ_r ŵ_r / s: what the stored nibbles (c = q + 8) add
    const __m256i pick_lo = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    const __m256i pick_hi = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
    // m = max_r |x_r| as the integer maximum of the magnitudes' bits (a NaN's are above every number's).
    const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
    __m256i m[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (size_t r = 0; r < rn; ++r) {
        const __m128 wr = _mm_setr_ps(w[r], G > 1 ? w[w_stride + r] : 0.0f, G > 2 ? w[2 * w_stride + r] : 0.0f,
                                      G > 3 ? w[3 * w_stride + r] : 0.0f);
        const __m256 w8 = _mm256_set_m128(wr, wr);
        const auto* b = reinterpret_cast<const BlockQ4_0*>(rows + r * row_stride) + t0;
        __m128i h = _mm_cvtsi32_si128(b[0].d);
        if (nt > 1) h = _mm_insert_epi16(h, b[1].d, 1);
        if (nt > 2) h = _mm_insert_epi16(h, b[2].d, 2);
        if (nt > 3) h = _mm_insert_epi16(h, b[3].d, 3);
        const __m256 d = _mm256_castps128_ps256(_mm_cvtph_ps(h));
        const __m256 x[2] = {_mm256_mul_ps(w8, _mm256_permutevar8x32_ps(d, pick_lo)),
                             _mm256_mul_ps(w8, _mm256_permutevar8x32_ps(d, pick_hi))};
        for (int hh = 0; hh < 2; ++hh) {
            _mm256_store_ps(wd[r] + 8 * hh, x[hh]);
            m[hh] = _mm256_max_epu32(m[hh], _mm256_and_si256(_mm256_castps_si256(x[hh]), magnitude));
        }
    }
    // weight_grid, lane by lane. A NaN maximum is a lane with a NaN product; an infinite one has s = ∞ and
    // k = 0, so each of its weights s · round(x·k) is NaN as well (∞ · 0 or ∞ · NaN).
    __m256 up[2], k[2];
    for (int hh = 0; hh < 2; ++hh) {
        const __m256 mf = _mm256_castsi256_ps(m[hh]);
        const __m256 nan = _mm256_cmp_ps(mf, _mm256_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
        const __m256 tiny = _mm256_cmp_ps(mf, _mm256_set1_ps(0x1p-100f), _CMP_LT_OQ);
        up[hh] = _mm256_blendv_ps(_mm256_set1_ps(1.0f), _mm256_set1_ps(0x1p100f), tiny);
        const __m256 mm = _mm256_mul_ps(mf, up[hh]);
        const __m256 pos = _mm256_cmp_ps(mf, _mm256_setzero_ps(), _CMP_GT_OQ);
        k[hh] = _mm256_and_ps(pos, _mm256_div_ps(_mm256_set1_ps(127.0f), mm));
        const __m256 s = _mm256_div_ps(_mm256_div_ps(mm, _mm256_set1_ps(127.0f)), up[hh]);
        _mm256_store_ps(step + 8 * hh, _mm256_blendv_ps(s, _mm256_set1_ps(__builtin_nanf("")), nan));
    }
    const int pairs = static_cast<int>((rn + 1) / 2);
    __m256i sum[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    const __m256i byte = _mm256_set1_epi32(0xFF);
    for (int p = 0; p < pairs; ++p) {
        for (int hh = 0; hh < 2; ++hh) {
            const auto grid = [&](size_t r) {
                return _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(wd[r] + 8 * hh), up[hh]), k[hh]));
            };
            const __m256i a = grid(2 * p);
            const __m256i c = 2 * p + 1 < static_cast<int>(rn) ? grid(2 * p + 1) : _mm256_setzero_si256();
            sum[hh] = _mm256_add_epi32(sum[hh], _mm256_add_epi32(a, c));
            const __m256i packed = _mm256_or_si256(_mm256_and_si256(a, byte), _mm256_slli_epi32(_mm256_and_si256(c, byte), 8));
            _mm256_store_si256(reinterpret_cast<__m256i*>(wq[p] + 8 * hh), packed);
        }
    }
    for (int hh = 0; hh < 2; ++hh) _mm256_store_si256(reinterpret_cast<__m256i*>(bias + 8 * hh), _mm256_slli_epi32(sum[hh], 3));

    const __m256i low4 = _mm256_set1_epi8(0x0F);
    for (int tt = 0; tt < nt; ++tt) {
        __m256i a[G][2];
        for (int i = 0; i < G; ++i) a[i][0] = a[i][1] = _mm256_setzero_si256();
        const uint8_t* qs = rows + (t0 + tt) * sizeof(BlockQ4_0) + offsetof(BlockQ4_0, qs);
        for (int p = 0; p < pairs; ++p) {
            const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 2 * p * row_stride));
            const __m128i q1 = 2 * p + 1 < static_cast<int>(rn)
                                   ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + (2 * p + 1) * row_stride))
                                   : _mm_setzero_si128();
            // Byte 2j + e: code byte j of row 2p + e; its low nibbles are column j, its high ones j + 16.
            const __m256i z = _mm256_set_m128i(_mm_unpackhi_epi8(q0, q1), _mm_unpacklo_epi8(q0, q1));
            const __m256i lo = _mm256_and_si256(z, low4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), low4);
#pragma GCC unroll 4
            for (int i = 0; i < G; ++i) {
                const __m256i wb = _mm256_set1_epi16(static_cast<int16_t>(wq[p][tt * 4 + i]));
                a[i][0] = _mm256_add_epi16(a[i][0], _mm256_maddubs_epi16(lo, wb));
                a[i][1] = _mm256_add_epi16(a[i][1], _mm256_maddubs_epi16(hi, wb));
            }
        }
        for (int i = 0; i < G; ++i) {
            const int l = tt * 4 + i;
            const __m256i b = _mm256_set1_epi32(bias[l]);
            const __m256 s = _mm256_set1_ps(step[l]);
            float* out = acc + i * n + (t0 + tt) * detail::kQK;
            for (int hh = 0; hh < 2; ++hh) {  // columns 16·hh + 0..7, + 8..15
                const __m256i x0 = _mm256_cvtepi16_epi32(_mm256_castsi256_si128(a[i][hh]));
                const __m256i x1 = _mm256_cvtepi16_epi32(_mm256_extracti128_si256(a[i][hh], 1));
                float* o = out + 16 * hh;
                _mm256_storeu_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(x0, b)), s, _mm256_loadu_ps(o)));
                _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(x1, b)), s, _mm256_loadu_ps(o + 8)));
            }
        }
    }
}

struct GridAvx2 {
    template <int G>
    static void group(const float* w, size_t w_stride, const uint8_t* rows, size_t row_stride, size_t rn, int64_t t0,
                      int nt, int64_t n, float* acc) {
        grid_group_avx2<G>(w, w_stride, rows, row_stride, rn, t0, nt, n, acc);
    }
};

// acc[i·n + j] += Σ_r ŵ(w[i·w_stride + r] · d) · q_r[j] for i < n_q, r < n_rows (n a multiple of 32).
void accumulate_grid_q4_0_avx2(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                               size_t n_rows, int64_t n, float* acc) {
    accumulate_grid_groups<GridAvx2>(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
}

}  // namespace
}  // namespace kvq::simd
