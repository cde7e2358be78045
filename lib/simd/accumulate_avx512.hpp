// AVX-512 accumulate for the symmetric block codecs of values, q8_0 and q4_0: acc[i][:] += w[i][r]·row_r
// for up to four queries, a whole 32-value block per pair of zmm registers. Included by kernels_impl.hpp
// in files compiled with AVX-512 F (level_avx512.cpp), where it replaces accumulate_avx2.hpp's kernel.
//
// The arithmetic is accumulate_avx2.hpp's, lane for lane (so avx2 and avx512 give the same bits): each
// block's scale folds into the four weights once per (row, block) (fold_scales), and every value costs
// one fma per query on its exact code. What changes is the work per value: a block's 32 codes are two
// registers (q4_0: 16 code bytes zero-extended to 16 lanes in one instruction, the mask gives columns
// 0..15, the shift 16..31; q8_0: two sign-extending loads), and two blocks are in flight per row, so 16
// independent accumulators cover the fma latency and each weight broadcast is a memory operand.
// Measured: see docs/DESIGN.md (decode).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include <algorithm>
#include <type_traits>

#include "../spec/blocks.hpp"
#include "accumulate_avx2.hpp"

namespace kvq::simd {
namespace {

// The 32 codes of block t of a row as floats (lanes 0..15: columns 0..15, 16..31).
template <class Block>
__attribute__((always_inline)) inline void block_codes512(const uint8_t* qs, __m512* v) {
    if constexpr (std::is_same_v<Block, detail::BlockQ4_0>) {
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
        const __m512 eight = _mm512_set1_ps(8.0f);
        v[0] = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0x0F))), eight);
        v[1] = _mm512_sub_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4)), eight);
    } else {
        v[0] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs))));
        v[1] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16))));
    }
}

// Blocks t0..t0+TB-1 (TB = 1 or 2) of every row, the G queries' accumulators in registers over the rows.
// wd: fold_scales' weights, block t0 + tt at wd + tt·kSymRowChunk·4.
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
            const float* w = wd + tt * kSymRowChunk * 4 + r * 4;
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
    alignas(64) float wd[kSymBlocks * kSymRowChunk * 4];
    for (int64_t t0 = 0; t0 < nb; t0 += kSymBlocks) {
        const int nt = static_cast<int>(std::min<int64_t>(kSymBlocks, nb - t0));
        fold_scales<Block, G>(w, w_stride, rows, row_stride, n_rows, t0, nt, wd);
        int tt = 0;
        for (; tt + 2 <= nt; tt += 2) sym_tile512<Block, G, 2>(wd + tt * kSymRowChunk * 4, rows, row_stride, n_rows, t0 + tt, acc);
        if (tt < nt) sym_tile512<Block, G, 1>(wd + tt * kSymRowChunk * 4, rows, row_stride, n_rows, t0 + tt, acc);
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
