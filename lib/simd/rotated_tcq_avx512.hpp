// AVX-512 kernels of the tcqB codecs, the rows tcq2 and tcq3 of the kernel grid at the avx512 level
// (level_avx512*.cpp; format: lib/ref/tcq.hpp; the AVX2 kernels: rotated_tcq_avx2.hpp). The ranks of a super-block (128 values) of two rows are formed at once
// in 512-bit registers, with no scalar work on the u plane (TcqIndices::ranks2): the u bits are spread to
// 2-bit fields (bit j → bit 2j, one vpshufb on nibbles), where the trellis's shifts are qword shifts with
// the carry from the qword before (vpermt2q) and s1, s0 land next to each other as a 2-bit field z_j =
// 2·s1 + s0 packed as the f codes are. Then the rank 4·f + z of values 4t, 4t + 2 of a block are byte t's
// nibbles of one qword x, those of 4t + 1, 4t + 3 of another y: two bit-selects. Those are the int8
// query's order 2 (turbo.cpp) as nibble pairs.
//
// score: turbo's int8 kernels with these indices: four rows at a time (score_int8_group), with VNNI rows
// 16 at a time as turbo3's (score_nibbles_rows16: the qwords x, y of a block are its 16 nibble pairs).
// accumulate: a chunk's ranks decoded once to 16 values a qword, then the 512-bit tiles
// (rotated_accumulate_avx512.hpp) cut them as 4-bit codes. Results equal the scalar specification to
// float rounding, as turbo's.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "rotated_accumulate_avx512.hpp"
#include "rotated_avx512.hpp"
#include "rotated_tcq_avx2.hpp"

namespace kvq::simd {
namespace {

namespace avx512 {

// Bit j of each 16-byte half of `bits` (a row's bits, rows in the halves) at bit 2j, 0 between: qwords
// 0..3 of the result are the first row's bytes 4k..4k+3 spread, 4..7 the second's.
__m512i spread_bits(__m256i bits) {
    const __m512i w = _mm512_cvtepu8_epi16(bits);
    const __m512i nibbles = _mm512_ternarylogic_epi64(w, _mm512_slli_epi16(w, 4), _mm512_set1_epi16(0x0F0F), 0xA8);  // (a|b)&c
    const __m512i spread = _mm512_broadcast_i32x4(_mm_setr_epi8(0x00, 0x01, 0x04, 0x05, 0x10, 0x11, 0x14, 0x15, 0x40, 0x41,
                                                                0x44, 0x45, 0x50, 0x51, 0x54, 0x55));
    return _mm512_shuffle_epi8(spread, nibbles);
}

// The ranks of tcqB rows as nibble pairs in the int8 query's order 2 (see the top of the file).
template <int B>
struct TcqIndices {
    const TurboLayout& l;
    int u_bytes, f_bytes;  // of a row

    explicit TcqIndices(const TurboLayout& layout)
        : l(layout), u_bytes(layout.d / 8), f_bytes(layout.d * (B - 1) / 8) {}

    // Super-block s of rows a and b: qword L of x and y (a) and 4 + L (b) = block L's ranks, byte t of x
    // those of values 4t (low nibble) and 4t + 2, of y 4t + 1 and 4t + 3. Blocks past the row: garbage.
    [[gnu::always_inline]] void ranks2(const uint8_t* a, const uint8_t* b, int s, __m512i& x, __m512i& y) const {
        const auto two_rows = [](__mmask16 m, const uint8_t* pa, const uint8_t* pb) {
            return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_maskz_loadu_epi8(m, pa)), _mm_maskz_loadu_epi8(m, pb), 1);
        };
        const __mmask16 mu = static_cast<__mmask16>(first_bytes(u_bytes - 16 * s));
        const uint8_t *ua = a + l.plane_off + 16 * s, *ub = b + l.plane_off + 16 * s;
        const __m512i e = spread_bits(two_rows(mu, ua, ub));
        __m512i carry = _mm512_setzero_si512();  // qword 0 (a), 4 (b): the u bits before the super-block
        if (s > 0) {
            carry = spread_bits(_mm256_setr_epi32(static_cast<int>(uint32_t{ua[-1]} << 24), 0, 0, 0,
                                                  static_cast<int>(uint32_t{ub[-1]} << 24), 0, 0, 0));
        }
        const __m512i prev = _mm512_permutex2var_epi64(e, _mm512_set_epi64(6, 5, 4, 12, 2, 1, 0, 8), carry);
        // bit 2j of t: u_j ⊕ u_{j−1} ⊕ u_{j−3} (s1_j); z: s1_j at bit 2j + 1, s0_j = u_{j−2} at 2j
        __m512i t = _mm512_ternarylogic_epi64(e, _mm512_slli_epi64(e, 2), _mm512_slli_epi64(e, 6), 0x96);
        t = _mm512_ternarylogic_epi64(t, _mm512_srli_epi64(prev, 62), _mm512_srli_epi64(prev, 58), 0x96);
        const __m512i z = _mm512_ternarylogic_epi64(_mm512_slli_epi64(e, 4), _mm512_srli_epi64(prev, 60),
                                                    _mm512_slli_epi64(t, 1), 0xFE);
        __m512i f;  // the f codes as 2-bit fields
        if constexpr (B == 3) {
            const __mmask32 mf = static_cast<__mmask32>(first_bytes(f_bytes - 32 * s));
            f = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_maskz_loadu_epi8(mf, a + 32 * s)),
                                   _mm256_maskz_loadu_epi8(mf, b + 32 * s), 1);
        } else {
            static_assert(B == 2);
            f = spread_bits(two_rows(mu, a + 16 * s, b + 16 * s));
        }
        // byte t: fields 0, 2 (values 4t, 4t + 2) of z in bits 0-1, 4-5, of f moved up to bits 2-3, 6-7;
        // y the same of fields 1, 3
        const __m512i high = _mm512_set1_epi8(static_cast<char>(0xCC));
        x = _mm512_ternarylogic_epi64(high, _mm512_slli_epi64(f, 2), z, 0xCA);  // a ? b : c
        y = _mm512_ternarylogic_epi64(high, f, _mm512_srli_epi64(z, 2), 0xCA);
    }

    // Row a's (b's) super-block as nibble pairs: lane L = qwords L of x, y (4 + L).
    static __m512i nibbles_a(__m512i x, __m512i y) {
        return _mm512_permutex2var_epi64(x, _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0), y);
    }
    static __m512i nibbles_b(__m512i x, __m512i y) {
        return _mm512_permutex2var_epi64(x, _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4), y);
    }

    // For score_int8_group: the int8 query's positions 0..15 of each block in `first`, 16..31 in `second`.
    void operator()(const uint8_t* row, int s, __m512i& first, __m512i& second) const {
        __m512i x, y;
        ranks2(row, row, s, x, y);
        const __m512i p = nibbles_a(x, y), m = _mm512_set1_epi8(0x0F);
        first = _mm512_and_si512(p, m);
        second = _mm512_and_si512(_mm512_srli_epi16(p, 4), m);
    }

    // For score_nibbles_rows16: the nibble pairs of 16 rows, two at a time.
    void nibbles16(const uint8_t* base, size_t row_stride, int s, __m512i* p) const {
        for (int r = 0; r < 16; r += 2) {
            __m512i x, y;
            ranks2(base + r * row_stride, base + (r + 1) * row_stride, s, x, y);
            p[r] = nibbles_a(x, y);
            p[r + 1] = nibbles_b(x, y);
        }
    }
};

// Head sizes past the super-blocks this kernel keeps (kMaxSuper): the AVX2 kernel's.
template <int B>
void tcq_score(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
               size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    if (l.d > 128 * kMaxSuper) {
        return avx2::tcq_score<B>(l, prep, prep_bytes, n_q, rows, row_stride, n_rows, scores, score_stride);
    }
    avx2::for_score_groups(prep, prep_bytes, n_q, rows, row_stride, n_rows, scores, score_stride,
                           [&]<int G>(const uint8_t* const* p, const uint8_t* chunk, size_t rn, float* const* out) {
#if defined(__AVX512VNNI__)
                               if constexpr (B == 3) {
                                   return score_rows16_then_rest<G, TcqIndices<3>>(l, p, chunk, row_stride, rn, out,
                                                                                   score_nibbles_rows16<G, TcqIndices<3>>);
                               }
#endif
                               score_int8_group<G, TcqIndices<B>>(l, p, chunk, row_stride, rn, out);
                           });
}

// accumulate: super-blocks kSlice at a time, the chunk's ranks of a slice decoded once (64 bytes a row's
// super-block: qword g = values 16g..16g+15, dwords of x and y alternating), then the tiles over them.
constexpr int kSlice = 2;

// How the 16 ranks of a decoded qword are cut for vpermps: value 4t + c is in byte t (c even) or 4 + t
// (c odd) of the qword, in the high nibble if c ≥ 2. Bits above the rank are left: vpermps reads 4 bits.
struct RankCut {
    static constexpr std::array<int8_t, 64> bytes = [] {
        std::array<int8_t, 64> b{};
        for (int j = 0; j < 16; ++j)
            for (int k = 0; k < 4; ++k) b[4 * j + k] = k == 0 ? static_cast<int8_t>(j / 4 + 4 * (j % 2)) : int8_t(-128);
        return b;
    }();
    static constexpr std::array<int32_t, 16> shifts = [] {
        std::array<int32_t, 16> s{};
        for (int j = 0; j < 16; ++j) s[j] = j % 4 >= 2 ? 4 : 0;
        return s;
    }();
};

// The levels of group g (values 16g..) from a decoded slice starting at group g0. tcq2's 8 levels are
// repeated to 16.
struct TcqRankValues {
    __m512 table;
    int g0;

    [[gnu::always_inline]] __m512 operator()(const uint8_t* ranks, int g) const {
        uint64_t word;
        std::memcpy(&word, ranks + 8 * (g - g0), 8);
        const __m512i cut = _mm512_shuffle_epi8(_mm512_set1_epi64(static_cast<long long>(word)),
                                                _mm512_loadu_si512(RankCut::bytes.data()));
        return _mm512_permutexvar_ps(_mm512_srlv_epi32(cut, _mm512_loadu_si512(RankCut::shifts.data())), table);
    }
};

template <int B>
void tcq_accumulate_rows(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                         size_t row_stride, size_t n_rows, float* acc) {
    const TcqIndices<B> indices(l);
    const int n_super = (l.d + 127) / 128;
    const __m512 table = table16<B + 1>(l.centroids_hi);
    alignas(64) uint8_t ranks[kChunk][64 * kSlice];
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        const uint8_t* chunk = rows + r0 * row_stride;
        alignas(64) float norms[kChunk];
        for (size_t r = 0; r < rn; ++r) norms[r] = avx2::half_at(chunk + r * row_stride + l.norm_off);
        for (int s0 = 0; s0 < n_super; s0 += kSlice) {
            for (int s = s0; s < std::min(n_super, s0 + kSlice); ++s) {
                for (size_t r = 0; r < rn; r += 2) {  // an odd last row decoded twice
                    const size_t r1 = std::min(r + 1, rn - 1);
                    __m512i x, y;
                    indices.ranks2(chunk + r * row_stride, chunk + r1 * row_stride, s, x, y);
                    const __m512i lo = _mm512_unpacklo_epi32(x, y), hi = _mm512_unpackhi_epi32(x, y);  // blocks 0, 2 | 1, 3
                    _mm512_store_si512(ranks[r] + 64 * (s - s0), _mm512_permutex2var_epi64(lo, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), hi));
                    _mm512_store_si512(ranks[r1] + 64 * (s - s0), _mm512_permutex2var_epi64(lo, _mm512_set_epi64(15, 14, 7, 6, 13, 12, 5, 4), hi));
                }
            }
            const int g_begin = 8 * s0, g_end = std::min(l.d / 16, 8 * (s0 + kSlice));
            avx2::for_groups(n_q, [&]<int G>(int i0) {
                alignas(64) float wn[G][kChunk];
                float* ap[G];
                chunk_weights<G>(w, w_stride, i0, r0, rn, norms, acc, l.d, wn, ap);
                accumulate_tiles<G>(TcqRankValues{table, g_begin}, g_begin, g_end, wn, ranks[0], sizeof ranks[0], rn, ap);
            });
        }
    }
}

// (tcqB has no QJL stage: no sketch.)
template <int B>
void tcq_accumulate(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                    size_t row_stride, size_t n_rows, float* acc, float*) {
    tcq_accumulate_rows<B>(l, w, w_stride, n_q, rows, row_stride, n_rows, acc);
}

}  // namespace avx512

}  // namespace
}  // namespace kvq::simd
