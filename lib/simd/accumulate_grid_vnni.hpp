// AVX512-VNNI accumulate_grid for q4_0 values: acc[i][:] += Σ_r ŵ_ir · q_r with the weights w·d on the int8
// grid of lib/ref/weight_grid.hpp, in integers, four rows per vpdpbusd. Included by kernels_impl.hpp in
// the file compiled with AVX512-VNNI (the avx512 level's VNNI build).
//
// vpdpbusd adds four byte products into each dword lane: here lane j is column j (or j + 16) of a block,
// and its four bytes are four rows' codes, so one instruction per query and 16 columns adds four rows. A
// quad of rows' 16 code bytes is loaded one row per 128-bit lane and transposed to that order by one
// vpermd and one vpshufb (transpose_4x16). Per row, the products w·d of 4 queries × 4 blocks fill one
// register (a row's 4 fp16 scales by one masked load and one word permute, its 4 weights from a transposed
// copy); their rounded values, four rows at a time, are packed to bytes with saturation and put in the
// codes' order by one vpshufb, so each query's weights of a quad and block are one dword, broadcast from
// memory, and Σ ŵ per lane is one vpdpbusd against ones per quad. The grid, the
// integers and the float conversion are the AVX2 kernel's (accumulate_grid_avx2.hpp) lane for lane:
// exact sums (at most 16 rows · 15 · 127 per lane), then s · (Σ ŵ·c − 8·Σ ŵ), c = q + 8 being the stored
// unsigned nibble, so both give the same bits wherever the weights are finite. Measured:
// docs/PERFORMANCE.md, "q4_0 values on int8 weights".
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

// Each 128-bit lane's 4 × 4 bytes transposed (byte 4b + e ← byte 4e + b).
__attribute__((always_inline)) inline __m512i transpose_4x4_bytes(__m512i x) {
    return _mm512_shuffle_epi8(x, _mm512_broadcast_i32x4(_mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)));
}

// Byte j of 128-bit lane e (e < 4, j < 16) to byte e of dword j: a 4 × 16 byte transpose. vpermd gathers
// dword a of every lane into lane a (dword a·4 + e ← dword e·4 + a), then each lane's 4 × 4 bytes.
__attribute__((always_inline)) inline __m512i transpose_4x16(__m512i x) {
    const __m512i dwords = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return transpose_4x4_bytes(_mm512_permutexvar_epi32(dwords, x));
}

// One grid group (rn ≤ 16 rows from rows) of G ≤ 4 queries and blocks t0..t0+nt−1 (nt ≤ 4).
template <int G>
__attribute__((always_inline)) inline void grid_group_vnni(const float* w, size_t w_stride, const uint8_t* rows,
                                                           size_t row_stride, size_t rn, int64_t t0, int nt,
                                                           int64_t n, float* acc) {
    using detail::BlockQ4_0;
    static_assert(detail::kGridRows == 16);
    alignas(64) float wt[16][4];      // row r: w[i][r] for i < 4 (zero past G and rn)
    alignas(64) int32_t wq[4][16];    // quad p, lane l: the int8 weights of rows 4p..4p+3 (byte e: row 4p + e)
    alignas(64) float step[16];
    alignas(64) int32_t bias[16];     // −8 · Σ_r ŵ_r / s: what the stored nibbles (c = q + 8) add, negated
    const __mmask16 live = static_cast<__mmask16>((1u << rn) - 1);
    {  // the weights transposed, four rows per register: 128-bit blocks, then dwords within them
        __m512i a[4];
        for (int i = 0; i < 4; ++i) {
            a[i] = i < G ? _mm512_castps_si512(_mm512_maskz_loadu_ps(live, w + i * w_stride)) : _mm512_setzero_si512();
        }
        const __m512i p0 = _mm512_shuffle_i32x4(a[0], a[1], 0x44), p1 = _mm512_shuffle_i32x4(a[0], a[1], 0xEE);
        const __m512i p2 = _mm512_shuffle_i32x4(a[2], a[3], 0x44), p3 = _mm512_shuffle_i32x4(a[2], a[3], 0xEE);
        const __m512i blocks[4] = {_mm512_shuffle_i32x4(p0, p2, 0x88), _mm512_shuffle_i32x4(p0, p2, 0xDD),
                                   _mm512_shuffle_i32x4(p1, p3, 0x88), _mm512_shuffle_i32x4(p1, p3, 0xDD)};
        const __m512i dwords = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        for (int k = 0; k < 4; ++k) _mm512_store_si512(wt[4 * k], _mm512_permutexvar_epi32(dwords, blocks[k]));
    }
    // A row's nt scales: words 0, 9, 18, 27 from its block t0 (blocks are 18 bytes), by a masked load (no
    // byte past them is read), then word 9·(l / 4) to lane l.
    const __mmask32 scales = static_cast<__mmask32>(0x08040201u & ((1ull << (9 * (nt - 1) + 1)) - 1));
    const __m512i pick = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 27, 27, 27, 27, 18, 18, 18,
                                          18, 9, 9, 9, 9, 0, 0, 0, 0);
    // x_r = w·d per lane; m = max_r |x_r| as the integer maximum of the magnitudes' bits (a NaN's are above
    // every number's).
    const __m512i magnitude = _mm512_set1_epi32(0x7FFFFFFF);
    __m512 x[16];
    __m512i m = _mm512_setzero_si512();
    for (size_t r = 0; r < 16; ++r) {
        if (r >= rn) {
            x[r] = _mm512_setzero_ps();
            continue;
        }
        const __m512i h = _mm512_maskz_loadu_epi16(scales, rows + r * row_stride + t0 * sizeof(BlockQ4_0));
        const __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(pick, h)));
        x[r] = _mm512_mul_ps(_mm512_broadcast_f32x4(_mm_load_ps(wt[r])), d);
        m = _mm512_max_epu32(m, _mm512_and_si512(_mm512_castps_si512(x[r]), magnitude));
    }
    // weight_grid, lane by lane. A NaN maximum is a lane with a NaN product; an infinite one has s = ∞ and
    // k = 0, so each of its weights s · round(x·k) is NaN as well (∞ · 0 or ∞ · NaN).
    const __m512 mf = _mm512_castsi512_ps(m);
    const __mmask16 nan = _mm512_cmp_ps_mask(mf, _mm512_set1_ps(__builtin_inff()), _CMP_NLT_UQ);
    const __mmask16 tiny = _mm512_cmp_ps_mask(mf, _mm512_set1_ps(0x1p-100f), _CMP_LT_OQ);
    const __m512 up = _mm512_mask_blend_ps(tiny, _mm512_set1_ps(1.0f), _mm512_set1_ps(0x1p100f));
    const __m512 mm = _mm512_mul_ps(mf, up);
    const __mmask16 pos = _mm512_cmp_ps_mask(mf, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 k = _mm512_maskz_div_ps(pos, _mm512_set1_ps(127.0f), mm);
    const __m512 s = _mm512_div_ps(_mm512_div_ps(mm, _mm512_set1_ps(127.0f)), up);
    _mm512_store_ps(step, _mm512_mask_blend_ps(nan, s, _mm512_set1_ps(__builtin_nanf(""))));
    // The int8 weights, four rows at a time: rounded as cvtps2dq, packed with saturation (rows past rn are
    // zero), so that 128-bit lane tt holds dword e = row 4p + e's weights of queries 0..3; then its 4 × 4
    // bytes transposed (one vpshufb) to dword i = query i's weights of rows 4p..4p+3. 8 · Σ_r ŵ_r per lane
    // by vpdpbusd against ones (a lane with a NaN step has sums that do not matter).
    const int quads = static_cast<int>((rn + 3) / 4);
    __m512i sum = _mm512_setzero_si512();
    for (int p = 0; p < quads; ++p) {
        __m512i g[4];
        for (int e = 0; e < 4; ++e) {
            __m512 y = x[4 * p + e];
            if (tiny) y = _mm512_mul_ps(y, up);
            g[e] = _mm512_cvtps_epi32(_mm512_mul_ps(y, k));
        }
        const __m512i b = _mm512_packs_epi16(_mm512_packs_epi32(g[0], g[1]), _mm512_packs_epi32(g[2], g[3]));
        const __m512i q = transpose_4x4_bytes(b);
        _mm512_store_si512(wq[p], q);
        sum = _mm512_dpbusd_epi32(sum, _mm512_set1_epi8(1), q);
    }
    _mm512_store_si512(bias, _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 3)));

    const __m512i low4 = _mm512_set1_epi8(0x0F);
    for (int tt = 0; tt < nt; ++tt) {
        __m512i a[G][2];
        for (int i = 0; i < G; ++i) a[i][0] = a[i][1] = _mm512_set1_epi32(bias[tt * 4 + i]);
        const uint8_t* qs = rows + (t0 + tt) * sizeof(BlockQ4_0) + offsetof(BlockQ4_0, qs);
        for (int p = 0; p < quads; ++p) {
            const size_t r = 4 * static_cast<size_t>(p);
            const auto row = [&](size_t e) {
                return r + e < rn ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + (r + e) * row_stride))
                                  : _mm_setzero_si128();
            };
            __m512i z = _mm512_castsi128_si512(row(0));
            z = _mm512_inserti32x4(z, row(1), 1);
            z = _mm512_inserti32x4(z, row(2), 2);
            z = _mm512_inserti32x4(z, row(3), 3);
            // Dword j: code byte j of the quad's four rows; its low nibbles are column j, its high ones j + 16.
            z = transpose_4x16(z);
            const __m512i lo = _mm512_and_si512(z, low4);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), low4);
#pragma GCC unroll 4
            for (int i = 0; i < G; ++i) {
                const __m512i wv = _mm512_set1_epi32(wq[p][tt * 4 + i]);
                a[i][0] = _mm512_dpbusd_epi32(a[i][0], lo, wv);
                a[i][1] = _mm512_dpbusd_epi32(a[i][1], hi, wv);
            }
        }
        for (int i = 0; i < G; ++i) {
            const __m512 st = _mm512_set1_ps(step[tt * 4 + i]);
            float* out = acc + i * n + (t0 + tt) * detail::kQK;
            for (int hh = 0; hh < 2; ++hh) {  // columns 16·hh + 0..15
                float* o = out + 16 * hh;
                _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[i][hh]), st, _mm512_loadu_ps(o)));
            }
        }
    }
}

struct GridVnni {
    template <int G>
    static void group(const float* w, size_t w_stride, const uint8_t* rows, size_t row_stride, size_t rn, int64_t t0,
                      int nt, int64_t n, float* acc) {
        grid_group_vnni<G>(w, w_stride, rows, row_stride, rn, t0, nt, n, acc);
    }
};

// acc[i·n + j] += Σ_r ŵ(w[i·w_stride + r] · d) · q_r[j] for i < n_q, r < n_rows (n a multiple of 32).
void accumulate_grid_q4_0_vnni(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                               size_t n_rows, int64_t n, float* acc) {
    accumulate_grid_groups<GridVnni>(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
}

}  // namespace
}  // namespace kvq::simd
