// AVX2 accumulate for the symmetric block codecs of values, q8_0, q4_0 and iq4_nl: acc[i][:] += w[i][r]·row_r
// for up to four queries. Included by kernels_impl.hpp in files compiled with AVX2 (level_avx2.cpp uses it).
//
// Why its own kernel: with four queries, every value takes 4 FMAs (two ports), so whatever else the
// loop issues per value competes with them. Here each value costs at most 4 more vector operations:
//   - each block's scale folds into the weights once per (row, block): w·(d·q) = (w·d)·q, four blocks'
//     scales converted together (F16C) and multiplied into the four weights with one 128-bit multiply;
//   - q8_0 codes: sign-extended straight from memory (vpmovsxbd m64) and converted;
//   - q4_0 codes: 8 code bytes zero-extended to 32-bit lanes in one instruction; a mask gives the low
//     nibbles (columns c..c+7), a shift the high ones (c+16..c+23); converted, minus 8. Three integer
//     operations per 16 values (an earlier per-lane variable-shift decode took eight).
//   - iq4_nl codes: 8 code bytes, masked and shifted into nibbles, each looked up in the 16 levels by a
//     pshufb, sign-extended and converted (q4_0's columns).
// Results equal the scalar specification to float rounding (the product w·d is rounded once, where
// the specification rounds d·q; the codes themselves are exact).
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <algorithm>
#include <type_traits>

#include "../ref/blocks.hpp"

namespace kvq::simd {
namespace {

inline constexpr size_t kSymRowChunk = 64;  // rows per pass: the scaled weights stay in L1 (4 KiB)
inline constexpr int kSymBlocks = 4;        // blocks whose scales are folded together

// wd[(tt·kSymRowChunk + r)·4 + i] = w[i·w_stride + r] · d(row r, block t0 + tt), for tt < nt ≤ 4 and
// i < G (lanes i ≥ G hold 0).
template <class Block, int G>
__attribute__((always_inline)) inline void fold_scales(const float* w, size_t w_stride, const uint8_t* rows,
                                                       size_t row_stride, size_t n_rows, int64_t t0, int nt,
                                                       float* wd) {
    for (size_t r = 0; r < n_rows; ++r) {
        __m128 wr = _mm_setzero_ps();
        if constexpr (G == 4) {
            wr = _mm_setr_ps(w[r], w[w_stride + r], w[2 * w_stride + r], w[3 * w_stride + r]);
        } else {
            alignas(16) float s[4] = {};
            for (int i = 0; i < G; ++i) s[i] = w[i * w_stride + r];
            wr = _mm_load_ps(s);
        }
        const Block* b = reinterpret_cast<const Block*>(rows + r * row_stride) + t0;
        float* out = wd + r * 4;
        if (nt == kSymBlocks) {
            __m128i h = _mm_cvtsi32_si128(b[0].d);
            h = _mm_insert_epi16(h, b[1].d, 1);
            h = _mm_insert_epi16(h, b[2].d, 2);
            h = _mm_insert_epi16(h, b[3].d, 3);
            const __m128 d = _mm_cvtph_ps(h);
            _mm_store_ps(out + 0 * kSymRowChunk * 4, _mm_mul_ps(wr, _mm_shuffle_ps(d, d, 0x00)));
            _mm_store_ps(out + 1 * kSymRowChunk * 4, _mm_mul_ps(wr, _mm_shuffle_ps(d, d, 0x55)));
            _mm_store_ps(out + 2 * kSymRowChunk * 4, _mm_mul_ps(wr, _mm_shuffle_ps(d, d, 0xAA)));
            _mm_store_ps(out + 3 * kSymRowChunk * 4, _mm_mul_ps(wr, _mm_shuffle_ps(d, d, 0xFF)));
        } else {
            for (int tt = 0; tt < nt; ++tt) {
                _mm_store_ps(out + tt * kSymRowChunk * 4, _mm_mul_ps(wr, _mm_set1_ps(_cvtsh_ss(b[tt].d))));
            }
        }
    }
}

// The G queries' accumulators of one 16-column tile, in registers over n_rows rows. Codes::load(row, v)
// gives the tile's 16 codes of a row as floats; Codes::load_acc / store_acc move the accumulators.
template <class Codes, int G>
__attribute__((always_inline)) inline void sym_tile(const float* wd, const uint8_t* codes, size_t row_stride,
                                                    size_t n_rows, float* const* acc, int col) {
    __m256 a[G][2];
    for (int i = 0; i < G; ++i) Codes::load_acc(acc[i] + col, a[i]);
    for (size_t r = 0; r < n_rows; ++r) {
        __m256 v[2];
        Codes::load(codes + r * row_stride, v);
        for (int i = 0; i < G; ++i) {
            const __m256 wi = _mm256_broadcast_ss(wd + r * 4 + i);
            a[i][0] = _mm256_fmadd_ps(wi, v[0], a[i][0]);
            a[i][1] = _mm256_fmadd_ps(wi, v[1], a[i][1]);
        }
    }
    for (int i = 0; i < G; ++i) Codes::store_acc(acc[i] + col, a[i]);
}

// q8_0, tile of columns [col, col + 16): codes from qs + 16p.
struct CodesQ8_0 {
    static void load(const uint8_t* qs, __m256* v) {
        v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs))));
        v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8))));
    }
    static void load_acc(const float* a, __m256* v) {
        v[0] = _mm256_loadu_ps(a);
        v[1] = _mm256_loadu_ps(a + 8);
    }
    static void store_acc(float* a, const __m256* v) {
        _mm256_storeu_ps(a, v[0]);
        _mm256_storeu_ps(a + 8, v[1]);
    }
};

// q4_0, tile T of a block: code bytes 8T..8T+7 zero-extended to eight lanes; the low nibbles are columns
// c..c+7 and the high nibbles c+16..c+23, c = 8T. Codes u − 8 are small integers, exact as floats.
struct CodesQ4_0 {
    static void load(const uint8_t* qs, __m256* v) {
        const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
        const __m256 eight = _mm256_set1_ps(8.0f);
        v[0] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0x0F))), eight);
        v[1] = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), eight);
    }
    static void load_acc(const float* a, __m256* v) {
        v[0] = _mm256_loadu_ps(a);
        v[1] = _mm256_loadu_ps(a + 16);
    }
    static void store_acc(float* a, const __m256* v) {
        _mm256_storeu_ps(a, v[0]);
        _mm256_storeu_ps(a + 16, v[1]);
    }
};

// iq4_nl, tile T of a block: q4_0's columns (code bytes 8T..8T+7: low nibbles c..c+7, high c+16..c+23),
// each nibble looked up in the 16 levels by one pshufb per 8 codes, then sign-extended. The levels
// (-127..113) are exact as floats.
struct CodesIQ4_NL : CodesQ4_0 {
    static void load(const uint8_t* qs, __m256* v) {
        const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(detail::kIQ4NLValues));
        const __m128i t = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs));
        const __m128i m = _mm_set1_epi8(0x0F);
        const __m128i lo = _mm_shuffle_epi8(levels, _mm_and_si128(t, m));
        const __m128i hi = _mm_shuffle_epi8(levels, _mm_and_si128(_mm_srli_epi16(t, 4), m));
        v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
        v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    }
};

// Blocks of 16 nibble bytes (q4_0, iq4_nl): tiles of 8 bytes, columns c..c+7 and c+16..c+23.
template <class Block>
inline constexpr bool kNibbleBlock = std::is_same_v<Block, detail::BlockQ4_0> || std::is_same_v<Block, detail::BlockIQ4_NL>;

template <class Block, class Codes, int G>
void sym_pass(const float* w, size_t w_stride, const uint8_t* rows, size_t row_stride, size_t n_rows, int64_t nb,
              float* const* acc) {
    alignas(32) float wd[kSymBlocks * kSymRowChunk * 4];
    for (int64_t t0 = 0; t0 < nb; t0 += kSymBlocks) {
        const int nt = static_cast<int>(std::min<int64_t>(kSymBlocks, nb - t0));
        fold_scales<Block, G>(w, w_stride, rows, row_stride, n_rows, t0, nt, wd);
        for (int tt = 0; tt < nt; ++tt) {
            const int64_t t = t0 + tt;
            const uint8_t* qs = rows + t * sizeof(Block) + offsetof(Block, qs);
            const float* wt = wd + tt * kSymRowChunk * 4;
            const int col = static_cast<int>(t * detail::kQK);
            if constexpr (kNibbleBlock<Block>) {
                sym_tile<Codes, G>(wt, qs, row_stride, n_rows, acc, col);
                sym_tile<Codes, G>(wt, qs + 8, row_stride, n_rows, acc, col + 8);
            } else {
                sym_tile<Codes, G>(wt, qs, row_stride, n_rows, acc, col);
                sym_tile<Codes, G>(wt, qs + 16, row_stride, n_rows, acc, col + 16);
            }
        }
    }
}

// acc[i·n + j] += w[i·w_stride + r] · row_r[j] for i < n_q, r < n_rows (n a multiple of 32).
template <class Block, class Codes>
void accumulate_sym_avx2(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
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
                case 4: sym_pass<Block, Codes, 4>(wq, w_stride, chunk, row_stride, rn, nb, ap); break;
                case 3: sym_pass<Block, Codes, 3>(wq, w_stride, chunk, row_stride, rn, nb, ap); break;
                case 2: sym_pass<Block, Codes, 2>(wq, w_stride, chunk, row_stride, rn, nb, ap); break;
                default: sym_pass<Block, Codes, 1>(wq, w_stride, chunk, row_stride, rn, nb, ap); break;
            }
        }
    }
}

}  // namespace
}  // namespace kvq::simd
