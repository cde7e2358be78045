// AVX-512 kernels of the tcqB codecs (format: lib/ref/tcq.hpp; the AVX2 kernels and tcq_subsets:
// rotated_tcq_avx2.hpp), included by rotated_avx512.hpp. With mask registers the s1 and s0 bits need
// little spreading: one vpshufb and vptestmb put them in the lanes of the int8 order, and in index order
// tcq_subsets's words are the masks as they are.
//
// score: turbo's int8 kernels with the super-block's rank indices from TcqIndices: four rows at a time
// (score_int8_group), with VNNI tcq3's rows 16 at a time as turbo3's (score_nibbles_rows16: its ranks fit
// a nibble as 3-bit codes do). accumulate: TcqValues16 in the 512-bit tiles
// (rotated_accumulate_avx512.hpp). Results equal the scalar specification to float rounding, as turbo's.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "rotated_avx512.hpp"

namespace kvq::simd {
namespace {

namespace avx512 {

// A super-block's rank indices (four 32-blocks, lane L = block L) in code_indices's order (int8_order 2):
// `first` the values 4i, 4i+1 of each block, `second` 4i+2, 4i+3. The f codes as turbo2's codes (tcq3)
// or as bits (tcq2), then 2·s1 and s0 or-ed in under masks: value j of block L is bit j % 8 of byte
// 4L + j / 8 of the super-block's 128 bits, spread to its lane by one vpshufb and picked by vptestmb.
template <int B>
struct TcqIndices {
    const TurboLayout& l;
    CodeIndices<2> f_codes;

    explicit TcqIndices(const TurboLayout& layout) : l(layout), f_codes(layout) {}

    void operator()(const uint8_t* row, int s, __m512i& first, __m512i& second) const {
        const int nb = l.d / 32;
        const uint8_t* plane = row + l.plane_off;
        uint64_t s1[2] = {}, s0[2] = {}, f[2] = {};  // 64 values a word
        for (int h = 0; h < 2 && 4 * s + 2 * h < nb; ++h) {
            const int b = 4 * s + 2 * h, bytes = b + 1 < nb ? 8 : 4;  // blocks b, b + 1 (if in the row)
            uint64_t u = 0;
            std::memcpy(&u, plane + 4 * b, bytes);
            const avx2::Subsets sub = avx2::tcq_subsets(u, b ? plane[4 * b - 1] : 0);
            s1[h] = sub.s1;
            s0[h] = sub.s0;
            if constexpr (B == 2) std::memcpy(&f[h], row + 4 * b, bytes);
        }
        alignas(64) static constexpr int8_t kByte[64] = {
            0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 4, 4, 5, 5, 6, 6, 7, 7,
            8, 8, 9, 9, 10, 10, 11, 11, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15, 12, 12, 13, 13, 14, 14, 15, 15};
        const __m512i bits_first = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 16, 1, 16, 1, 16, 1, 16, 2, 32, 2, 32, 2, 32, 2, 32));
        const __m512i bits_second = _mm512_slli_epi16(bits_first, 2);  // bits 4·(p % 2) + 2 + p / 8: no carry
        const auto spread = [&](const uint64_t* w) {
            return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_set_epi64x(static_cast<long long>(w[1]), static_cast<long long>(w[0]))),
                                       _mm512_load_si512(kByte));
        };
        const __m512i x1 = spread(s1), x0 = spread(s0);
        if constexpr (B == 3) {
            f_codes(row, s, first, second);
            first = _mm512_slli_epi16(first, 2);  // 4·f; bytes < 4: no carry
            second = _mm512_slli_epi16(second, 2);
        } else {
            const __m512i xf = spread(f), four = _mm512_set1_epi8(4);
            first = _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(xf, bits_first), four);
            second = _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(xf, bits_second), four);
        }
        const __m512i two = _mm512_set1_epi8(2), one = _mm512_set1_epi8(1);  // the bits are apart: + is |
        first = _mm512_mask_add_epi8(first, _mm512_test_epi8_mask(x1, bits_first), first, two);
        second = _mm512_mask_add_epi8(second, _mm512_test_epi8_mask(x1, bits_second), second, two);
        first = _mm512_mask_add_epi8(first, _mm512_test_epi8_mask(x0, bits_first), first, one);
        second = _mm512_mask_add_epi8(second, _mm512_test_epi8_mask(x0, bits_second), second, one);
    }
};

void tcq_score(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
               size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        avx2::for_groups(n_q, [&]<int G>(int i0) {
            const uint8_t* p[G];
            float* out[G];
            for (int i = 0; i < G; ++i) {
                p[i] = prep + (i0 + i) * prep_bytes;
                out[i] = scores + (i0 + i) * score_stride + r0;
            }
            if (l.trellis == 3) {
#if defined(__AVX512VNNI__)
                score_rows16_then_rest<G, TcqIndices<3>>(l, p, rows + r0 * row_stride, row_stride, rn, out,
                                                         score_nibbles_rows16<G, TcqIndices<3>>);
#else
                score_int8_group<G, TcqIndices<3>>(l, p, rows + r0 * row_stride, row_stride, rn, out);
#endif
            } else {
                score_int8_group<G, TcqIndices<2>>(l, p, rows + r0 * row_stride, row_stride, rn, out);
            }
        });
    }
}

// The levels of group g (values 16g..16g+15) of a tcqB row, for accumulate_tiles: the f codes cut with
// vpsrlvd and moved up to 4·f, s1 and s0 or-ed in under their masks, one vpermps in centroids_hi. Index
// bits above the rank are left: vpermps reads 4 bits, and tcq2's 8 levels are repeated to 16.
template <int B>
struct TcqValues16 {
    const TurboLayout& l;
    __m512 table;

    explicit TcqValues16(const TurboLayout& layout)
        : l(layout),
          table(_mm512_permutexvar_ps(_mm512_and_si512(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                       _mm512_set1_epi32(B == 3 ? 15 : 7)),
                                      _mm512_loadu_ps(layout.centroids_hi))) {}

    // Inlined into the tiles' row loop, which the compiler would otherwise call it from.
    [[gnu::always_inline]] __m512 operator()(const uint8_t* row, int g) const {
        const uint8_t* plane = row + l.plane_off + 2 * g;
        uint16_t u;
        std::memcpy(&u, plane, 2);
        const avx2::Subsets s = avx2::tcq_subsets(u, g ? plane[-1] : 0);
        uint32_t f = 0;  // the group's (B − 1)-bit codes
        std::memcpy(&f, row + (B - 1) * 2 * g, (B - 1) * 2);
        const __m512i shifts = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                  _mm512_set1_epi32(B - 1));
        __m512i idx = _mm512_slli_epi32(_mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(f)), shifts), 2);
        idx = _mm512_mask_or_epi32(idx, static_cast<__mmask16>(s.s1), idx, _mm512_set1_epi32(2));
        idx = _mm512_mask_or_epi32(idx, static_cast<__mmask16>(s.s0), idx, _mm512_set1_epi32(1));
        return _mm512_permutexvar_ps(idx, table);
    }
};

}  // namespace avx512

}  // namespace
}  // namespace kvq::simd
