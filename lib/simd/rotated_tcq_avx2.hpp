// AVX2 kernels of the tcqB codecs, the rows tcq2 and tcq3 of the kernel grid (level_avx2.cpp; format and
// decoding rule: lib/ref/tcq.hpp; the AVX-512 levels have their own, rotated_tcq_avx512.hpp, and score
// head sizes above 1024 here), over turbo's int8 dot and accumulate tiles (rotated_avx2.hpp). The
// ranks of a super-block (128 values) of a row are formed in 256-bit registers as rotated_tcq_avx512.hpp
// forms them for two rows (tcq_ranks128): the u bits spread to 2-bit fields, the trellis's shifts as qword
// shifts with the carry from the qword before, z = 2·s1 + s0 next to the f codes, x and y the nibble
// pairs of values 4t, 4t + 2 and 4t + 1, 4t + 3 of each block.
//
// score, on the int8 levels: a block's 32 rank bytes in the prepared int8 query's order 2 (turbo.cpp sets
// it for tcqB) are the low then the high nibbles of its x and y qwords; one vpshufb of ints_hi gives the
// int8 values, then turbo's int8 dot (int8_dot). accumulate: a chunk's ranks decoded once (and each row's
// norm with them), eight values a dword, cut with per-lane shifts and looked up in the 16 floats of
// centroids_hi (accumulate_groups's Source).
//
// Results equal the scalar specification (rotated_scalar.cpp) to float rounding, as turbo's kernels do.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../ref/rotated_kernels.hpp"
#include "rotated_avx2.hpp"

namespace kvq::simd {
namespace {
namespace avx2 {

// The first n (≤ 16) bytes at p, zero after.
__m128i load_bytes16(const uint8_t* p, int n) {
    if (n >= 16) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    alignas(16) uint8_t b[16] = {};
    std::memcpy(b, p, static_cast<size_t>(std::max(n, 0)));
    return _mm_load_si128(reinterpret_cast<const __m128i*>(b));
}

// Bit j of 16 bytes at bit 2j, 0 between: qword k = bytes 4k..4k+3 spread.
__m256i spread_bits(__m128i bits) {
    const __m256i w = _mm256_cvtepu8_epi16(bits);
    const __m256i nibbles = _mm256_and_si256(_mm256_or_si256(w, _mm256_slli_epi16(w, 4)), _mm256_set1_epi16(0x0F0F));
    const __m256i spread = _mm256_broadcastsi128_si256(
        _mm_setr_epi8(0x00, 0x01, 0x04, 0x05, 0x10, 0x11, 0x14, 0x15, 0x40, 0x41, 0x44, 0x45, 0x50, 0x51, 0x54, 0x55));
    return _mm256_shuffle_epi8(spread, nibbles);
}

// Super-block s of a tcqB row: qword L of x and y = block L's ranks, byte t of x those of values 4t (low
// nibble) and 4t + 2, of y 4t + 1 and 4t + 3. Blocks past the row: garbage.
template <int B>
void tcq_ranks128(const TurboLayout& l, const uint8_t* row, int s, __m256i& x, __m256i& y) {
    const int u_left = l.d / 8 - 16 * s;  // bytes of the u plane (and of tcq2's f bits) from the super-block on
    const uint8_t* plane = row + l.plane_off + 16 * s;
    const __m256i e = spread_bits(load_bytes16(plane, u_left));
    __m256i carry = _mm256_setzero_si256();  // qword 0: the u bits before the super-block
    if (s > 0) carry = spread_bits(_mm_cvtsi32_si128(static_cast<int>(uint32_t{plane[-1]} << 24)));
    const __m256i prev = _mm256_blend_epi32(_mm256_permute4x64_epi64(e, _MM_SHUFFLE(2, 1, 0, 0)), carry, 0x03);
    // bit 2j of t: u_j ⊕ u_{j−1} ⊕ u_{j−3} (s1_j); z: s1_j at bit 2j + 1, s0_j = u_{j−2} at 2j
    __m256i t = _mm256_xor_si256(_mm256_xor_si256(e, _mm256_slli_epi64(e, 2)), _mm256_slli_epi64(e, 6));
    t = _mm256_xor_si256(t, _mm256_xor_si256(_mm256_srli_epi64(prev, 62), _mm256_srli_epi64(prev, 58)));
    const __m256i z = _mm256_or_si256(_mm256_or_si256(_mm256_slli_epi64(e, 4), _mm256_srli_epi64(prev, 60)),
                                      _mm256_slli_epi64(t, 1));
    __m256i f;  // the f codes as 2-bit fields
    if constexpr (B == 3) {
        const uint8_t* codes = row + 32 * s;
        const int f_left = l.d / 4 - 32 * s;
        f = f_left >= 32 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes))
                         : _mm256_set_m128i(load_bytes16(codes + 16, f_left - 16), load_bytes16(codes, f_left));
    } else {
        static_assert(B == 2);
        f = spread_bits(load_bytes16(row + 16 * s, u_left));
    }
    // byte t: fields 0, 2 (values 4t, 4t + 2) of z in bits 0-1, 4-5, of f moved up to bits 2-3, 6-7; y the
    // same of fields 1, 3
    const __m256i high = _mm256_set1_epi8(static_cast<char>(0xCC));
    x = _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi64(f, 2), high), _mm256_andnot_si256(high, z));
    y = _mm256_or_si256(_mm256_and_si256(f, high), _mm256_andnot_si256(high, _mm256_srli_epi64(z, 2)));
}

// The four blocks of super-block s as 32 rank bytes each in int8_order 2: the low nibbles of x's and y's
// qword of the block (positions 0..15: values 4i, then 4i + 1), then the high ones (4i + 2, 4i + 3).
template <int B>
void tcq_blocks(const TurboLayout& l, const uint8_t* row, int s, __m256i* k) {
    __m256i x, y;
    tcq_ranks128<B>(l, row, s, x, y);
    const __m256i m = _mm256_set1_epi8(0x0F);
    const __m256i even = _mm256_unpacklo_epi64(x, y), odd = _mm256_unpackhi_epi64(x, y);  // lanes: blocks 0, 2 | 1, 3
    const __m256i even_lo = _mm256_and_si256(even, m), even_hi = _mm256_and_si256(_mm256_srli_epi16(even, 4), m);
    const __m256i odd_lo = _mm256_and_si256(odd, m), odd_hi = _mm256_and_si256(_mm256_srli_epi16(odd, 4), m);
    k[0] = _mm256_permute2x128_si256(even_lo, even_hi, 0x20);
    k[1] = _mm256_permute2x128_si256(odd_lo, odd_hi, 0x20);
    k[2] = _mm256_permute2x128_si256(even_lo, even_hi, 0x31);
    k[3] = _mm256_permute2x128_si256(odd_lo, odd_hi, 0x31);
}

// Scores of G prepared queries against rows: each row's super-blocks decoded once for the group.
template <int B, int G>
void tcq_score_group(const TurboLayout& l, const uint8_t* const* prep, const uint8_t* rows, size_t row_stride,
                     size_t n_rows, float* const* out) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(l.ints_hi)));
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        __m256 acc[G];
        for (int i = 0; i < G; ++i) acc[i] = _mm256_setzero_ps();
        __m256i k[4];
        int8_dot<G>(
            l,
            [&](int b) {
                if (b % 4 == 0) tcq_blocks<B>(l, row, b / 4, k);
                return _mm256_shuffle_epi8(table, k[b % 4]);
            },
            prep, acc);
        const float s = half_at(row + l.norm_off);
        for (int i = 0; i < G; ++i) out[i][r] = s * (l.scale_hi * hsum(acc[i]));
    }
}

template <int B>
void tcq_score(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
               size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    for_score_groups(prep, prep_bytes, n_q, rows, row_stride, n_rows, scores, score_stride,
                     [&]<int G>(const uint8_t* const* p, const uint8_t* chunk, size_t rn, float* const* out) {
                         tcq_score_group<B, G>(l, p, chunk, row_stride, rn, out);
                     });
}

// accumulate: super-blocks kTcqSlice at a time, the chunk's ranks of a slice decoded once to a scratch row
// of 64 bytes a super-block (dword g = values 8g..8g+7: words of x and y alternating) and the row's norm.
constexpr int kTcqSlice = 2;
constexpr size_t kTcqScratch = 64 * kTcqSlice + 32;  // a scratch row's bytes (norm at 64 · kTcqSlice)

// The levels of group g (values 8g..8g+7) from a decoded slice starting at group g_first, times the norm.
// Value 8g + j is in the dword's x word (j even) or y word (j odd), nibble j / 2.
template <int B>
struct TcqRankSource {
    const TurboLayout& l;
    int g_first;
    float scale(const uint8_t* ranks) const {
        float s;
        std::memcpy(&s, ranks + 64 * kTcqSlice, 4);
        return s;
    }
    __m256 load(const uint8_t* ranks, int g) const {
        uint32_t word;
        std::memcpy(&word, ranks + 4 * (g - g_first), 4);
        const __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), _mm256_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28));
        return lookup<B + 1>(l.centroids_hi, idx);  // reads the low B + 1 bits
    }
    static __m256 add(__m256 w, __m256 v, __m256 a) { return _mm256_fmadd_ps(w, v, a); }
};

template <int B>
void tcq_accumulate_rows(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                         size_t row_stride, size_t n_rows, float* acc) {
    const int n_super = (l.d + 127) / 128;
    alignas(32) uint8_t ranks[kChunk][kTcqScratch];
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        const uint8_t* chunk = rows + r0 * row_stride;
        for (int s0 = 0; s0 < n_super; s0 += kTcqSlice) {
            for (size_t r = 0; r < rn; ++r) {
                const uint8_t* row = chunk + r * row_stride;
                for (int s = s0; s < std::min(n_super, s0 + kTcqSlice); ++s) {
                    __m256i x, y;
                    tcq_ranks128<B>(l, row, s, x, y);
                    const __m256i lo = _mm256_unpacklo_epi16(x, y), hi = _mm256_unpackhi_epi16(x, y);  // blocks 0, 2 | 1, 3
                    __m256i* out = reinterpret_cast<__m256i*>(ranks[r] + 64 * (s - s0));
                    _mm256_store_si256(out, _mm256_permute2x128_si256(lo, hi, 0x20));
                    _mm256_store_si256(out + 1, _mm256_permute2x128_si256(lo, hi, 0x31));
                }
                const float norm = half_at(row + l.norm_off);
                std::memcpy(ranks[r] + 64 * kTcqSlice, &norm, 4);
            }
            const int g_begin = 16 * s0, g_end = std::min(l.d / 8, 16 * (s0 + kTcqSlice));
            accumulate_groups(TcqRankSource<B>{l, g_begin}, w + r0, w_stride, n_q, ranks[0], kTcqScratch, rn, g_begin,
                              g_end, acc, l.d);
        }
    }
}

// (tcqB has no QJL stage: no sketch.)
template <int B>
void tcq_accumulate(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                    size_t row_stride, size_t n_rows, float* acc, float*) {
    tcq_accumulate_rows<B>(l, w, w_stride, n_q, rows, row_stride, n_rows, acc);
}

}  // namespace avx2
}  // namespace
}  // namespace kvq::simd
