// AVX2 kernels of the tcqB codecs (part of rotated_avx2.hpp; format and decoding rule: lib/ref/tcq.hpp;
// the AVX-512 levels have their own, rotated_tcq_avx512.hpp, and score head sizes above 1024 here). A
// value's rank is 4·f + 2·s1 + s0, s1 and s0 bits of its own trellis bit and the three before it; for a
// run of values they are a few scalar shifts and xors of the u plane (tcq_subsets).
//
// score, on the int8 levels: the rank bytes of a 32-block are formed in the prepared int8 query's order
// 2 (turbo.cpp sets it for tcqB): the f codes cut as turbo2's 2-bit codes are (code_bytes32<2>), the
// single bits (s1, s0 and tcq2's 1-bit f) spread to byte masks with one vpshufb and vpcmpeqb each; one
// vpshufb of ints_hi gives the int8 values, then turbo's int8 dot (int8_dot). accumulate: eight values at
// a time, their rank bits cut with per-lane shifts from one word and looked up in the 16 floats of
// centroids_hi (accumulate_groups's Source).
//
// Results equal the scalar specification (rotated_scalar.cpp) to float rounding, as turbo's kernels do.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../ref/rotated_kernels.hpp"

namespace kvq::simd {
namespace {
namespace avx2 {

// The s1 and s0 bits (tcq.hpp) of a run of up to 64 values from their u bits `u` (bit j = value j) and
// the byte of u bits before the run, `prev` (0 at the row's start): bit j of s1 = u_j ⊕ u_{j−1} ⊕ u_{j−3},
// of s0 = u_{j−2}. Only the run's bits of the results are meant.
struct Subsets {
    uint64_t s1, s0;
};

Subsets tcq_subsets(uint64_t u, uint64_t prev) {
    return {u ^ (u << 1 | prev >> 7) ^ (u << 3 | prev >> 5), u << 2 | prev >> 6};
}

// 0xFF in byte lane p where bit j = 4·(p % 8) + p / 8 of `bits` is set, else 0: int8_order 2 puts value
// j there. The bit is in byte (p % 8) / 2, at 4·(p % 2) + p / 8.
__m256i bit_lanes(uint32_t bits) {
    const __m256i byte = _mm256_setr_epi8(0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3,
                                          0, 0, 1, 1, 2, 2, 3, 3, 0, 0, 1, 1, 2, 2, 3, 3);
    const __m256i bit = _mm256_setr_epi8(1, 16, 1, 16, 1, 16, 1, 16, 2, 32, 2, 32, 2, 32, 2, 32,
                                         4, 64, 4, 64, 4, 64, 4, 64, 8, -128, 8, -128, 8, -128, 8, -128);
    const __m256i x = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), byte);
    return _mm256_cmpeq_epi8(_mm256_and_si256(x, bit), bit);
}

uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// The 32 ranks of block b of a tcqB row as bytes, in int8_order 2.
template <int B>
__m256i tcq_ranks32(const TurboLayout& l, const uint8_t* row, int b) {
    const uint8_t* plane = row + l.plane_off + 4 * b;
    const Subsets s = tcq_subsets(load_u32(plane), b ? plane[-1] : 0);
    const __m256i sub = _mm256_or_si256(_mm256_and_si256(bit_lanes(static_cast<uint32_t>(s.s1)), _mm256_set1_epi8(2)),
                                        _mm256_and_si256(bit_lanes(static_cast<uint32_t>(s.s0)), _mm256_set1_epi8(1)));
    __m256i f4;  // 4·f
    if constexpr (B == 3) {
        f4 = _mm256_slli_epi16(code_bytes32<2>(row + 8 * b), 2);  // bytes < 4: nothing crosses into the next
    } else {
        static_assert(B == 2);
        f4 = _mm256_and_si256(bit_lanes(load_u32(row + 4 * b)), _mm256_set1_epi8(4));
    }
    return _mm256_or_si256(f4, sub);
}

// Scores of G prepared queries against rows: each row's blocks decoded once for the group.
template <int B, int G>
void tcq_score_group(const TurboLayout& l, const uint8_t* const* prep, const uint8_t* rows, size_t row_stride,
                     size_t n_rows, float* const* out) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(l.ints_hi)));
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        __m256 acc[G];
        for (int i = 0; i < G; ++i) acc[i] = _mm256_setzero_ps();
        int8_dot<G>(l, [&](int b) { return _mm256_shuffle_epi8(table, tcq_ranks32<B>(l, row, b)); }, prep, acc);
        const float s = half_at(row + l.norm_off);
        for (int i = 0; i < G; ++i) out[i][r] = s * (l.scale_hi * hsum(acc[i]));
    }
}

void tcq_score(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
               size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        for_groups(n_q, [&]<int G>(int i0) {
            const uint8_t* p[G];
            float* out[G];
            for (int i = 0; i < G; ++i) {
                p[i] = prep + (i0 + i) * prep_bytes;
                out[i] = scores + (i0 + i) * score_stride + r0;
            }
            if (l.trellis == 3) {
                tcq_score_group<3, G>(l, p, rows + r0 * row_stride, row_stride, rn, out);
            } else {
                tcq_score_group<2, G>(l, p, rows + r0 * row_stride, row_stride, rn, out);
            }
        });
    }
}

// The levels of group g (values 8g..8g+7) of a tcqB row, times the row's scale: s0, s1 and the f codes of
// the group in one word (bits 0..7, 8..15, 16 on), cut per lane to the rank 4·f + 2·s1 + s0.
template <int B>
struct TcqSource {
    const TurboLayout& l;
    float scale(const uint8_t* row) const { return half_at(row + l.norm_off); }
    __m256 load(const uint8_t* row, int g) const {
        const uint8_t* plane = row + l.plane_off + g;
        const Subsets s = tcq_subsets(plane[0], g ? plane[-1] : 0);
        uint32_t f;  // the group's (B − 1)-bit codes
        if constexpr (B == 3) {
            uint16_t f16;
            std::memcpy(&f16, row + 2 * g, 2);
            f = f16;
        } else {
            f = row[g];
        }
        const uint32_t word = static_cast<uint32_t>((s.s0 & 0xFF) | (s.s1 & 0xFF) << 8) | f << 16;
        const __m256i x = _mm256_set1_epi32(static_cast<int>(word));
        const __m256i j = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        const __m256i s0 = _mm256_and_si256(_mm256_srlv_epi32(x, j), _mm256_set1_epi32(1));
        const __m256i s1 = _mm256_and_si256(_mm256_srlv_epi32(x, _mm256_add_epi32(j, _mm256_set1_epi32(7))),
                                            _mm256_set1_epi32(2));
        const __m256i f_shift = _mm256_add_epi32(_mm256_mullo_epi32(j, _mm256_set1_epi32(B - 1)), _mm256_set1_epi32(14));
        const __m256i f4 = _mm256_and_si256(_mm256_srlv_epi32(x, f_shift), _mm256_set1_epi32(B == 3 ? 12 : 4));
        return lookup<B + 1>(l.centroids_hi, _mm256_or_si256(f4, _mm256_or_si256(s1, s0)));
    }
    static __m256 add(__m256 w, __m256 v, __m256 a) { return _mm256_fmadd_ps(w, v, a); }
};

void tcq_accumulate(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                    size_t row_stride, size_t n_rows, float* acc) {
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        const uint8_t* chunk = rows + r0 * row_stride;
        if (l.trellis == 3) {
            accumulate_groups(TcqSource<3>{l}, w + r0, w_stride, n_q, chunk, row_stride, rn, 0, l.d / 8, acc, l.d);
        } else {
            accumulate_groups(TcqSource<2>{l}, w + r0, w_stride, n_q, chunk, row_stride, rn, 0, l.d / 8, acc, l.d);
        }
    }
}

}  // namespace avx2
}  // namespace
}  // namespace kvq::simd
