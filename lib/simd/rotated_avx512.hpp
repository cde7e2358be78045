// AVX-512 (F/BW/VL/DQ, and VNNI where the including file is compiled with it) kernels of the turbo codecs
// (layouts: lib/ref/rotated_kernels.hpp), included by level_avx512.cpp and level_avx512_vnni.cpp.
//
// score, on the int8 codes (int8_order != 0): a 128-value super-block of a row (four 32-blocks, one per
// 128-bit lane) is cut into two registers of table indices, looked up in the 16-byte int8 table with one
// vpshufb each, and multiplied with each query's int8 values, rearranged once per chunk to the same lane
// order: with VNNI one vpdpbusd per register (the table offset by +128 to make it unsigned, the offset
// taken back in the accumulator's start value: −128·Σq, exact), without it maddubs/madd on |k| and q
// carrying k's sign. The integer sums of four queries are folded into one register (lane 4·block +
// query), converted and scaled by the query's block scales in one fma; four rows' sums are folded and
// transposed together, so a row costs no horizontal reduction of its own. With VNNI, 4- and 3-bit rows go
// 16 to a register instead (score_int4_rows16, score_nibbles_rows16), the one-row kernel taking the rest.
// tcqB rows take these kernels with their own indices (rotated_tcq_avx512.hpp). Other layouts (the split
// codecs' float path, QJL scores, head sizes the loops do not take) go to the 256-bit kernels
// (rotated_avx2.hpp).
//
// Results equal the scalar specification (rotated_scalar.cpp) to float rounding: a block's integer sum is
// exact, and the float products are the specification's, summed in another order and with fma.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "rotated_avx2.hpp"

namespace kvq::simd {
namespace {

namespace avx512 {

using detail::TurboLayout;

constexpr size_t kChunk = 64;  // rows kept in cache while query groups pass over them
constexpr int kMaxSuper = 8;   // int8 scores: super-blocks of 128 values (d ≤ 1024) kept per query

__mmask64 first_bytes(int n) { return n >= 64 ? ~__mmask64(0) : n <= 0 ? 0 : (__mmask64(1) << n) - 1; }

// ---- scores on int8 codes ---------------------------------------------------------------------------

// Byte pairs of a 3-bit code group's words in each 128-bit lane: word t = bytes (3t >> 3), (3t >> 3) + 1.
constexpr std::array<int8_t, 64> kCut3 = [] {
    std::array<int8_t, 64> b{};
    for (int k = 0; k < 64; ++k) b[k] = static_cast<int8_t>((3 * (k % 16 / 2)) / 8 + k % 2);
    return b;
}();

// A super-block's B-bit codes (`bytes` of its 16·B bytes are in the row) as two registers of table
// indices, 128-bit lane L = block L: `first` the codes at the prepared int8 query's positions 0..15 of the
// block, `second` those at 16..31 (int8_order 4: even, odd codes; 2: codes 4i, 4i+1, then 4i+2, 4i+3;
// 3: index order).
template <int B>
void code_indices(const uint8_t* p, int bytes, __m512i& first, __m512i& second) {
    if constexpr (B == 4) {
        const __m512i x = _mm512_maskz_loadu_epi8(first_bytes(bytes), p);
        const __m512i m = _mm512_set1_epi8(0x0F);
        first = _mm512_and_si512(x, m);
        second = _mm512_and_si512(_mm512_srli_epi16(x, 4), m);
    } else if constexpr (B == 2) {  // qwords 2L, 2L+1 = block L's 8 bytes, shifted by 0, 2 (then 4, 6)
        const __m512i x = _mm512_castsi256_si512(_mm256_maskz_loadu_epi8(static_cast<__mmask32>(first_bytes(bytes)), p));
        const __m512i y = _mm512_permutexvar_epi64(_mm512_set_epi64(3, 3, 2, 2, 1, 1, 0, 0), x);
        const __m512i m = _mm512_set1_epi8(0x03);
        first = _mm512_and_si512(_mm512_srlv_epi64(y, _mm512_set_epi64(2, 0, 2, 0, 2, 0, 2, 0)), m);
        second = _mm512_and_si512(_mm512_srlv_epi64(y, _mm512_set_epi64(6, 4, 6, 4, 6, 4, 6, 4)), m);
    } else {
        static_assert(B == 3);
        // lane L = block L's 12 bytes; word t of part c = the 16 bits holding code 8c + t, shifted down
        const __m512i x = _mm512_maskz_loadu_epi8(first_bytes(bytes), p);
        const __m512i y = _mm512_permutexvar_epi32(_mm512_set_epi32(0, 11, 10, 9, 0, 8, 7, 6, 0, 5, 4, 3, 0, 2, 1, 0), x);
        const __m512i shifts = _mm512_set4_epi32(0x00050002, 0x00070004, 0x00010006, 0x00030000);
        const __m512i m = _mm512_set1_epi16(7);
        __m512i part[4];
        for (int c = 0; c < 4; ++c) {
            const __m512i idx = _mm512_add_epi8(_mm512_loadu_si512(kCut3.data()), _mm512_set1_epi8(static_cast<char>(3 * c)));
            part[c] = _mm512_and_si512(_mm512_srlv_epi16(_mm512_shuffle_epi8(y, idx), shifts), m);
        }
        first = _mm512_packus_epi16(part[0], part[1]);   // lane L: codes 0..7, 8..15 of block L
        second = _mm512_packus_epi16(part[2], part[3]);  // codes 16..23, 24..31
    }
}

// One query's int8 values of one super-block in code_indices's lane order; `start`: the integer sums'
// start value (VNNI: −128·Σq, taking back the table's +128; else 0); `scale` lane 4L + i: query i's scale
// of block L (0 past the last block), shared by the group's queries.
struct QuerySuper {
    __m512i first, second, start;
};

template <int G>
struct QueryGroup {
    QuerySuper q[kMaxSuper][G];
    __m512 scale[kMaxSuper];
};

template <int G>
void arrange_queries(const TurboLayout& l, const uint8_t* const* prep, QueryGroup<G>& g) {
    const int nb = l.d / 32;
    for (int s = 0; s * 4 < nb; ++s) {
        alignas(64) float sc[16] = {};
        for (int i = 0; i < G; ++i) {
            const int8_t* q8 = reinterpret_cast<const int8_t*>(prep[i] + l.prep_q8_off) + 128 * s;
            const float* scales = reinterpret_cast<const float*>(prep[i] + l.prep_scale_off);
            const int left = 32 * (nb - 4 * s);  // query bytes from this super-block on
            const __m512i z0 = _mm512_maskz_loadu_epi8(first_bytes(left), q8);            // blocks 0, 1
            const __m512i z1 = _mm512_maskz_loadu_epi8(first_bytes(left - 64), q8 + 64);  // blocks 2, 3
            QuerySuper& qs = g.q[s][i];
            qs.first = _mm512_shuffle_i64x2(z0, z1, _MM_SHUFFLE(2, 0, 2, 0));
            qs.second = _mm512_shuffle_i64x2(z0, z1, _MM_SHUFFLE(3, 1, 3, 1));
            alignas(64) int32_t start[16] = {};  // VNNI: −128·Σq of block L in lane L's first dword (fold sums them)
#if defined(__AVX512VNNI__)
            const int32_t* sums = reinterpret_cast<const int32_t*>(prep[i] + l.prep_sum_off);
            for (int b = 0; b < 4 && 4 * s + b < nb; ++b) start[4 * b] = -128 * sums[4 * s + b];
#endif
            qs.start = _mm512_load_si512(start);
            for (int b = 0; b < 4 && 4 * s + b < nb; ++b) sc[4 * b + i] = scales[4 * s + b];
        }
        g.scale[s] = _mm512_load_ps(sc);
    }
}

// Integer sums of one query over one super-block, by dword (a lane's four dwords are its block's).
__m512i int8_dot(__m512i k_first, __m512i k_second, const QuerySuper& q) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(q.start, k_first, q.first), k_second, q.second);
#else
    const __m512i zero = _mm512_setzero_si512(), ones = _mm512_set1_epi16(1);
    auto dot = [&](__m512i k, __m512i y) {  // |k|·(y with k's sign); |k|, |y| ≤ 127: no int16 saturation
        const __m512i signed_y = _mm512_mask_sub_epi8(y, _mm512_movepi8_mask(k), zero, y);
        return _mm512_madd_epi16(_mm512_maddubs_epi16(_mm512_abs_epi8(k), signed_y), ones);
    };
    return _mm512_add_epi32(dot(k_first, q.first), dot(k_second, q.second));
#endif
}

// Lane 4L + i = Σ of x[i]'s four dwords in lane L (the 4 × 4 transpose-and-add in each 128-bit lane).
__m512i fold_queries(const __m512i* x) {
    const __m512i s01 = _mm512_add_epi32(_mm512_unpacklo_epi32(x[0], x[1]), _mm512_unpackhi_epi32(x[0], x[1]));
    const __m512i s23 = _mm512_add_epi32(_mm512_unpacklo_epi32(x[2], x[3]), _mm512_unpackhi_epi32(x[2], x[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(s01, s23), _mm512_unpackhi_epi64(s01, s23));
}

// A super-block's table indices from a row's B-bit codes (code_indices).
template <int B>
struct CodeIndices {
    int code_bytes;
    explicit CodeIndices(const TurboLayout& l) : code_bytes(l.d * B / 8) {}
    void operator()(const uint8_t* row, int s, __m512i& first, __m512i& second) const {
        code_indices<B>(row + 16 * B * s, code_bytes - 16 * B * s, first, second);
    }
    // For score_nibbles_rows16 (codes below 16): indices t and 16 + t of a block in byte t's nibbles.
    void nibbles16(const uint8_t* base, size_t row_stride, int s, __m512i* p) const {
        for (int r = 0; r < 16; ++r) {
            __m512i first, second;
            (*this)(base + r * row_stride, s, first, second);
            p[r] = _mm512_or_si512(first, _mm512_slli_epi16(second, 4));  // indices < 16: no carry between bytes
        }
    }
};

// Lane 4L + i: query i's Σ_b scale_b·(block b's integer sum) over the blocks b ≡ L (mod 4) of one row,
// indices(row, s, first, second) its table indices of super-block s.
template <int G, class Indices>
__m512 row_sums(const TurboLayout& l, const QueryGroup<G>& g, const Indices& indices, const __m512i table,
                const uint8_t* row) {
    __m512 acc = _mm512_setzero_ps();
    for (int s = 0; s * 128 < l.d; ++s) {
        __m512i k_first, k_second;
        indices(row, s, k_first, k_second);
        k_first = _mm512_shuffle_epi8(table, k_first);
        k_second = _mm512_shuffle_epi8(table, k_second);
        __m512i x[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int i = 0; i < G; ++i) x[i] = int8_dot(k_first, k_second, g.q[s][i]);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fold_queries(x)), g.scale[s], acc);
    }
    return acc;
}

// Scores of G queries against rows on their int8 codes: four rows at a time, their sums folded over the
// four lanes (128-bit lane r = row r's four queries), times scale_hi·‖x‖, transposed (lane i = query
// i's four rows) and stored. A short last step repeats the last row and stores only the live ones.
template <int G, class Indices>
void score_int8_group(const TurboLayout& l, const uint8_t* const* prep, const uint8_t* rows, size_t row_stride,
                      size_t n_rows, float* const* out) {
    const Indices indices(l);
    QueryGroup<G> g;
    arrange_queries<G>(l, prep, g);
    __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(l.ints_hi));
#if defined(__AVX512VNNI__)
    t = _mm_xor_si128(t, _mm_set1_epi8(static_cast<char>(0x80)));  // + 128: unsigned for vpdpbusd
#endif
    const __m512i table = _mm512_broadcast_i32x4(t);
    const __m512i to_queries = _mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0);
    for (size_t r0 = 0; r0 < n_rows; r0 += 4) {
        __m512 f[4];
        alignas(16) float norms[4];
        for (int k = 0; k < 4; ++k) {
            const uint8_t* row = rows + std::min(r0 + k, n_rows - 1) * row_stride;
            f[k] = row_sums<G>(l, g, indices, table, row);
            norms[k] = avx2::half_at(row + l.norm_off) * l.scale_hi;
        }
        const __m512 f01 = _mm512_add_ps(_mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                         _mm512_shuffle_f32x4(f[0], f[1], _MM_SHUFFLE(3, 1, 3, 1)));
        const __m512 f23 = _mm512_add_ps(_mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(2, 0, 2, 0)),
                                         _mm512_shuffle_f32x4(f[2], f[3], _MM_SHUFFLE(3, 1, 3, 1)));
        __m512 sums = _mm512_add_ps(_mm512_shuffle_f32x4(f01, f23, _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm512_shuffle_f32x4(f01, f23, _MM_SHUFFLE(3, 1, 3, 1)));  // lane 4r + i
        const __m512 n = _mm512_permutexvar_ps(_mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0),
                                               _mm512_castps128_ps512(_mm_load_ps(norms)));
        sums = _mm512_permutexvar_ps(to_queries, _mm512_mul_ps(sums, n));  // lane 4i + r
        const __mmask8 live = static_cast<__mmask8>((1u << std::min<size_t>(4, n_rows - r0)) - 1);
        _mm_mask_storeu_ps(out[0] + r0, live, _mm512_castps512_ps128(sums));
        if constexpr (G > 1) _mm_mask_storeu_ps(out[1] + r0, live, _mm512_extractf32x4_ps(sums, 1));
        if constexpr (G > 2) _mm_mask_storeu_ps(out[2] + r0, live, _mm512_extractf32x4_ps(sums, 2));
        if constexpr (G > 3) _mm_mask_storeu_ps(out[3] + r0, live, _mm512_extractf32x4_ps(sums, 3));
    }
}

#if defined(__AVX512VNNI__)
// Rows 16 to a register with VNNI (as score_q8_0_rows16, score_impl.hpp): dword m of block b of 16 rows
// shares a register kt[m] (lane r = row r), two codes in each byte: the low nibbles are the codes at the
// prepared query's positions 4m..4m+3 of the block, the high ones those at 16 + 4m... They are looked up,
// and each query's block sum is 8 vpdpbusd against its dwords broadcast from memory, in the prepared
// order as it is: no fold, and one conversion and fma per block serve 16 rows.
template <int G>
void block_rows16(const TurboLayout& l, const uint8_t* const* prep, int b, const __m512i* kt, __m512i table,
                  __m512* acc) {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    __m512i low[4], high[4];
    for (int m = 0; m < 4; ++m) {
        low[m] = _mm512_shuffle_epi8(table, _mm512_and_si512(kt[m], nibble));
        high[m] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(kt[m], 4), nibble));
    }
    for (int i = 0; i < G; ++i) {
        // from −128·Σq (taking back the table's +128), the block's 8 dword products
        __m512i sum = _mm512_set1_epi32(-128 * reinterpret_cast<const int32_t*>(prep[i] + l.prep_sum_off)[b]);
        int32_t dw[8];
        std::memcpy(dw, prep[i] + l.prep_q8_off + 32 * b, 32);
        for (int m = 0; m < 4; ++m) {
            sum = _mm512_dpbusd_epi32(sum, low[m], _mm512_set1_epi32(dw[m]));
            sum = _mm512_dpbusd_epi32(sum, high[m], _mm512_set1_epi32(dw[4 + m]));
        }
        const float scale = reinterpret_cast<const float*>(prep[i] + l.prep_scale_off)[b];
        acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(scale), acc[i]);
    }
}

// out[i][0..16) = acc[i] · scale_hi · ‖x_r‖: the norms with one gather, of the dword that ends each norm.
template <int G>
void store_rows16(const TurboLayout& l, const uint8_t* base, size_t row_stride, const __m512* acc, float* const* out) {
    const __m512i at_row = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(static_cast<int>(row_stride)));
    const __m512i ends = _mm512_i32gather_epi32(at_row, base + l.norm_off - 2, 1);
    const __m512 norms = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(ends, 16))),
                                       _mm512_set1_ps(l.scale_hi));
    for (int i = 0; i < G; ++i) _mm512_storeu_ps(out[i], _mm512_mul_ps(acc[i], norms));
}

__m512i unsigned_table(const TurboLayout& l) {
    return _mm512_broadcast_i32x4(
        _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(l.ints_hi)), _mm_set1_epi8(static_cast<char>(0x80))));
}

// 4-bit codes (even codes in the low nibbles, as the prepared order has them): each block of 16 rows is
// loaded four rows per register (row 4L + k in lane L of register k) and transposed 4 × 4 dwords in each
// lane.
template <int G>
void score_int4_rows16(const TurboLayout& l, const uint8_t* const* prep, const uint8_t* base, size_t row_stride,
                       float* const* out) {
    const __m512i table = unsigned_table(l);
    __m512 acc[G];
    for (int i = 0; i < G; ++i) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < l.d / 32; ++b) {
        const uint8_t* blocks = base + 16 * b;
        __m512i k4[4];
        for (int k = 0; k < 4; ++k) {
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + k * row_stride)));
            v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + (4 + k) * row_stride)), 1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + (8 + k) * row_stride)), 2);
            k4[k] = _mm512_inserti32x4(v, _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + (12 + k) * row_stride)), 3);
        }
        const __m512i t0 = _mm512_unpacklo_epi32(k4[0], k4[1]), t1 = _mm512_unpackhi_epi32(k4[0], k4[1]);
        const __m512i t2 = _mm512_unpacklo_epi32(k4[2], k4[3]), t3 = _mm512_unpackhi_epi32(k4[2], k4[3]);
        const __m512i kt[4] = {_mm512_unpacklo_epi64(t0, t2), _mm512_unpackhi_epi64(t0, t2),
                               _mm512_unpacklo_epi64(t1, t3), _mm512_unpackhi_epi64(t1, t3)};
        block_rows16<G>(l, prep, b, kt, table, acc);
    }
    store_rows16<G>(l, base, row_stride, acc, out);
}

// Table indices below 16 (3-bit codes, tcq3's ranks): the 16 rows' super-blocks as nibble pairs
// (Indices::nibbles16: indices t and 16 + t of a block in byte t), the registers transposed 16 × 16 dwords (register 4L + m: dword m of block L of every row).
template <int G, class Indices>
void score_nibbles_rows16(const TurboLayout& l, const uint8_t* const* prep, const uint8_t* base, size_t row_stride,
                          float* const* out) {
    const __m512i table = unsigned_table(l);
    const Indices indices(l);
    const int nb = l.d / 32;
    __m512 acc[G];
    for (int i = 0; i < G; ++i) acc[i] = _mm512_setzero_ps();
    for (int s = 0; 4 * s < nb; ++s) {
        __m512i p[16];
        indices.nibbles16(base, row_stride, s, p);
        __m512i t[16], u[16];
        for (int i = 0; i < 8; ++i) {
            t[2 * i] = _mm512_unpacklo_epi32(p[2 * i], p[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(p[2 * i], p[2 * i + 1]);
        }
        for (int i = 0; i < 4; ++i) {  // u[4i + c], lane L: dword 4L + c of rows 4i..4i+3
            u[4 * i + 0] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
            u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
            u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
        }
        __m512i kt[16];  // kt[4L + c]: lane i = u[4i + c]'s lane L
        for (int c = 0; c < 4; ++c) {
            const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
            const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
            kt[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
            kt[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
            kt[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
            kt[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
        }
        for (int L = 0; L < 4 && 4 * s + L < nb; ++L) block_rows16<G>(l, prep, 4 * s + L, kt + 4 * L, table, acc);
    }
    store_rows16<G>(l, base, row_stride, acc, out);
}

// The rows of a chunk in groups of 16 (kernel K), the rest with the one-row kernel on the same indices.
template <int G, class Indices, class K>
void score_rows16_then_rest(const TurboLayout& l, const uint8_t* const* prep, const uint8_t* rows, size_t row_stride,
                            size_t n_rows, float* const* out, K kernel) {
    size_t r0 = 0;
    if (16 * row_stride < (size_t{1} << 31)) {  // the gather takes int32 offsets
        for (; r0 + 16 <= n_rows; r0 += 16) {
            float* o[G];
            for (int i = 0; i < G; ++i) o[i] = out[i] + r0;
            kernel(l, prep, rows + r0 * row_stride, row_stride, o);
        }
        if (r0 == n_rows) return;
    }
    float* o[G];
    for (int i = 0; i < G; ++i) o[i] = out[i] + r0;
    score_int8_group<G, Indices>(l, prep, rows + r0 * row_stride, row_stride, n_rows - r0, o);
}
#endif

template <int G>
void score_int8_any(const TurboLayout& l, const uint8_t* const* prep, const uint8_t* rows, size_t row_stride,
                    size_t n_rows, float* const* out) {
    switch (l.int8_order) {
#if defined(__AVX512VNNI__)
        case 4: return score_rows16_then_rest<G, CodeIndices<4>>(l, prep, rows, row_stride, n_rows, out, score_int4_rows16<G>);
        case 3:
            return score_rows16_then_rest<G, CodeIndices<3>>(l, prep, rows, row_stride, n_rows, out,
                                                            score_nibbles_rows16<G, CodeIndices<3>>);
#else
        case 4: return score_int8_group<G, CodeIndices<4>>(l, prep, rows, row_stride, n_rows, out);
        case 3: return score_int8_group<G, CodeIndices<3>>(l, prep, rows, row_stride, n_rows, out);
#endif
        default: return score_int8_group<G, CodeIndices<2>>(l, prep, rows, row_stride, n_rows, out);
    }
}

void turbo_score(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                 size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    if (l.int8_order < 2 || l.int8_order > 4 || l.qjl || l.d > 128 * kMaxSuper) {
        return avx2::turbo_score(l, prep, prep_bytes, n_q, rows, row_stride, n_rows, scores, score_stride);
    }
    avx2::for_score_groups(prep, prep_bytes, n_q, rows, row_stride, n_rows, scores, score_stride,
                           [&]<int G>(const uint8_t* const* p, const uint8_t* chunk, size_t rn, float* const* out) {
                               score_int8_any<G>(l, p, chunk, row_stride, rn, out);
                           });
}

}  // namespace avx512

}  // namespace
}  // namespace kvq::simd

#include "rotated_accumulate_avx512.hpp"
