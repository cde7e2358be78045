// AVX-512 accumulate for the symmetric block codecs of values, q8_0, q4_0 and iq4_nl: acc[i][:] += w[i][r]·row_r
// for up to four queries, a whole 32-value block per pair of zmm registers. Included by kernels_impl.hpp
// in files compiled with AVX-512 F (level_avx512.cpp), where it replaces accumulate_avx2.hpp's kernel.
//
// The arithmetic is accumulate_avx2.hpp's, lane for lane (so avx2 and avx512 give the same bits): each
// block's scale folds into the four weights once per (row, block), and every value costs one fma per
// query on its exact code. What changes is the work around the fmas:
//   - a block's 32 codes are two registers (q4_0: 16 code bytes zero-extended to 16 lanes, then one
//     permute of a table of c − 8 for the low nibbles and a shift and a permute for the high ones: 4
//     operations where a mask, a shift, two conversions and two subtractions took 6; q8_0: two
//     sign-extending loads);
//   - the scales fold one register per row (fold_scales512: a row's 4 block scales picked from its bytes
//     by one permute and converted together, times its 4 queries' weights), where fold_scales spends
//     about 20 scalar and 128-bit operations per row;
//   - two blocks are in flight per row, so 16 independent accumulators cover the fma latency and each
//     weight broadcast is a memory operand.
// Measured: see docs/PERFORMANCE.md.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include <algorithm>
#include <type_traits>

#include "../ref/blocks.hpp"
#include "accumulate_avx2.hpp"

namespace kvq::simd {
namespace {

// The 32 codes of block t of a row as floats (lanes 0..15: columns 0..15, 16..31). q4_0: vpermps reads
// only an index's low 4 bits, so one permute of the table c − 8 turns the zero-extended code bytes into
// the low nibbles' values and one more, after a shift, the high ones' (exact, as cvt(c) − 8 is). iq4_nl:
// the same with the table of its 16 levels as floats (exact).
template <class Block>
__attribute__((always_inline)) inline void block_codes512(const uint8_t* qs, __m512* v) {
    if constexpr (kNibbleBlock<Block>) {
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
        static_assert(detail::kIQ4NLValues[0] == -127 && detail::kIQ4NLValues[15] == 113);  // the table below
        const __m512 table = std::is_same_v<Block, detail::BlockQ4_0>
                                 ? _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
                                 : _mm512_setr_ps(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
        v[0] = _mm512_permutexvar_ps(b, table);
        v[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
    } else {
        v[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))));
        v[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16))));
    }
}

// wd[r·16 + tt·4 + i] = w[i·w_stride + r] · d(row r, block t0 + tt) for r < n_rows, tt < nt ≤ 4, i < G
// (other lanes 0): the products fold_scales makes, one register per row. The weights of 16 rows are
// transposed to (row: 4 queries) in 128-bit lanes; a row's 4 block scales are its words at
// tt·sizeof(Block)/2, picked by one permute of the row's first bytes and converted together.
template <class Block, int G>
__attribute__((always_inline)) inline void fold_scales512(const float* w, size_t w_stride, const uint8_t* rows,
                                                          size_t row_stride, size_t n_rows, int64_t t0, int nt,
                                                          float* wd) {
    constexpr int kWords = sizeof(Block) / 2;  // blocks are whole words: d of block tt is word tt·kWords
    static_assert(sizeof(Block) % 2 == 0 && 3 * kWords < 64);
    alignas(64) int16_t pick[32] = {};
    for (int l = 0; l < 16; ++l) pick[l] = static_cast<int16_t>((l / 4) * kWords);
    const __m512i idx = _mm512_load_si512(pick);
    const int last_word = (nt - 1) * kWords;  // the words a row's scales need: 0..last_word
    const __mmask32 m0 = last_word >= 31 ? ~__mmask32(0) : static_cast<__mmask32>((uint64_t(1) << (last_word + 1)) - 1);
    const __mmask32 m1 = last_word < 32 ? 0 : static_cast<__mmask32>((uint64_t(1) << (last_word - 31)) - 1);
    const __mmask16 used = static_cast<__mmask16>((uint32_t(1) << (4 * nt)) - 1) & static_cast<__mmask16>(0x1111 * ((1u << G) - 1));
    for (size_t r0 = 0; r0 < n_rows; r0 += 16) {
        const size_t rn = std::min<size_t>(16, n_rows - r0);
        const __mmask16 rows_in = static_cast<__mmask16>((uint32_t(1) << rn) - 1);
        __m512 q[4];
        for (int i = 0; i < 4; ++i) q[i] = i < G ? _mm512_maskz_loadu_ps(rows_in, w + i * w_stride + r0) : _mm512_setzero_ps();
        const __m512 a0 = _mm512_unpacklo_ps(q[0], q[1]), a1 = _mm512_unpackhi_ps(q[0], q[1]);
        const __m512 a2 = _mm512_unpacklo_ps(q[2], q[3]), a3 = _mm512_unpackhi_ps(q[2], q[3]);
        alignas(64) float t[4][16];  // t[k] lane group j: row r0 + 4j + k's four weights
        _mm512_store_ps(t[0], _mm512_shuffle_ps(a0, a2, 0x44));
        _mm512_store_ps(t[1], _mm512_shuffle_ps(a0, a2, 0xEE));
        _mm512_store_ps(t[2], _mm512_shuffle_ps(a1, a3, 0x44));
        _mm512_store_ps(t[3], _mm512_shuffle_ps(a1, a3, 0xEE));
        for (size_t k = 0; k < rn; ++k) {
            const size_t r = r0 + k;
            const uint8_t* row = rows + r * row_stride + t0 * sizeof(Block);
            const __m512i lo = _mm512_maskz_loadu_epi16(m0, row);
            const __m512i hi = _mm512_maskz_loadu_epi16(m1, row + 64);
            const __m256i h = _mm512_castsi512_si256(_mm512_permutex2var_epi16(lo, idx, hi));
            const __m512 wr = _mm512_broadcast_f32x4(_mm_load_ps(&t[k % 4][4 * (k / 4)]));
            _mm512_store_ps(wd + r * 16, _mm512_maskz_mul_ps(used, wr, _mm512_cvtph_ps(h)));
        }
    }
}

// Blocks t0..t0+TB-1 (TB = 1 or 2) of every row, the G queries' accumulators in registers over the rows.
// wd: fold_scales512's weights, offset to block t0 (row r's four at wd + r·16 + tt·4).
template <class Block, int G, int TB>
__attribute__((always_inline)) inline void sym_tile512(const float* wd, const uint8_t* rows, size_t row_stride,
                                                       size_t n_rows, int64_t t0, float* const* acc) {
    __m512 a[TB][G][2];
    for (int tt = 0; tt < TB; ++tt) {
        for (int i = 0; i < G; ++i) {
            const float* p = acc[i] + (t0 + tt) * detail::kQK;
            a[tt][i][0] = _mm512_loadu_ps(p);
            a[tt][i][1] = _mm512_loadu_ps(p + 16);
        }
    }
    const uint8_t* qs0 = rows + t0 * sizeof(Block) + offsetof(Block, qs);
    for (size_t r = 0; r < n_rows; ++r) {
        for (int tt = 0; tt < TB; ++tt) {
            __m512 v[2];
            block_codes512<Block>(qs0 + r * row_stride + tt * sizeof(Block), v);
            const float* w = wd + r * 16 + tt * 4;
            for (int i = 0; i < G; ++i) {
                const __m512 wi = _mm512_set1_ps(w[i]);
                a[tt][i][0] = _mm512_fmadd_ps(wi, v[0], a[tt][i][0]);
                a[tt][i][1] = _mm512_fmadd_ps(wi, v[1], a[tt][i][1]);
            }
        }
    }
    for (int tt = 0; tt < TB; ++tt) {
        for (int i = 0; i < G; ++i) {
            float* p = acc[i] + (t0 + tt) * detail::kQK;
            _mm512_storeu_ps(p, a[tt][i][0]);
            _mm512_storeu_ps(p + 16, a[tt][i][1]);
        }
    }
}

template <class Block, int G>
void sym_pass512(const float* w, size_t w_stride, const uint8_t* rows, size_t row_stride, size_t n_rows, int64_t nb,
                 float* const* acc) {
    static_assert(kSymBlocks == 4);
    alignas(64) float wd[kSymRowChunk * 16];
    for (int64_t t0 = 0; t0 < nb; t0 += kSymBlocks) {
        const int nt = static_cast<int>(std::min<int64_t>(kSymBlocks, nb - t0));
        fold_scales512<Block, G>(w, w_stride, rows, row_stride, n_rows, t0, nt, wd);
        int tt = 0;
        for (; tt + 2 <= nt; tt += 2) sym_tile512<Block, G, 2>(wd + tt * 4, rows, row_stride, n_rows, t0 + tt, acc);
        if (tt < nt) sym_tile512<Block, G, 1>(wd + tt * 4, rows, row_stride, n_rows, t0 + tt, acc);
    }
}

// acc[i·n + j] += w[i·w_stride + r] · row_r[j] for i < n_q, r < n_rows (n a multiple of 32).
template <class Block>
void accumulate_sym_avx512(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                           size_t n_rows, int64_t n, float* acc) {
    const int64_t nb = n / detail::kQK;
    for (size_t r0 = 0; r0 < n_rows; r0 += kSymRowChunk) {
        const size_t rn = std::min(kSymRowChunk, n_rows - r0);
        const uint8_t* chunk = rows + r0 * row_stride;
        for (int i0 = 0; i0 < n_q; i0 += 4) {
            float* ap[4];
            const int g = std::min(4, n_q - i0);
            for (int i = 0; i < g; ++i) ap[i] = acc + static_cast<size_t>(i0 + i) * n;
            const float* wq = w + static_cast<size_t>(i0) * w_stride + r0;
            switch (g) {
                case 4: sym_pass512<Block, 4>(wq, w_stride, chunk, row_stride, rn, nb, ap); break;
                case 3: sym_pass512<Block, 3>(wq, w_stride, chunk, row_stride, rn, nb, ap); break;
                case 2: sym_pass512<Block, 2>(wq, w_stride, chunk, row_stride, rn, nb, ap); break;
                default: sym_pass512<Block, 1>(wq, w_stride, chunk, row_stride, rn, nb, ap); break;
            }
        }
    }
}

}  // namespace
}  // namespace kvq::simd
