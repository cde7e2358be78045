// AVX2 (+FMA, F16C) kernels of the polar and turbo codecs (layouts: lib/ref/rotated_kernels.hpp),
// included by level_avx2.cpp and level_avx512.cpp. Rows are decoded in registers, eight values at a
// time: codes are cut from one loaded word with per-lane shifts (vpsrlvd), and looked up in tables of up
// to 8 floats with one vpermps, of 16 with two and a blend, beyond that with a gather.
//
// Results equal the scalar specification (rotated_scalar.cpp) to float rounding: the same products,
// summed in another order and with fma. Polar scores from the decoded row instead of the level-1 table.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../ref/rotated_kernels.hpp"

namespace kvq::simd {
namespace {

namespace avx2 {

using detail::PolarLayout;
using detail::TurboLayout;

constexpr size_t kChunk = 64;  // rows kept in cache while query groups pass over them

float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

float half_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

uint64_t load_u64(const uint8_t* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}

// Eight B-bit codes that start on a byte (exactly B bytes read), lane j = code j in its low bits (higher
// bits hold the following codes unless masked).
template <int B>
__m256i codes8(const uint8_t* p) {
    uint32_t word;  // assembled in registers: narrow stores and a wide reload would stall store forwarding
    if constexpr (B == 4) {
        std::memcpy(&word, p, 4);
    } else if constexpr (B == 3) {
        uint16_t high;
        std::memcpy(&high, p + 1, 2);
        word = p[0] | (uint32_t(high) << 8);
    } else if constexpr (B == 2) {
        uint16_t w16;
        std::memcpy(&w16, p, 2);
        word = w16;
    } else {
        word = p[0];
    }
    return _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)),
                             _mm256_setr_epi32(0, B, 2 * B, 3 * B, 4 * B, 5 * B, 6 * B, 7 * B));
}

// table[idx] for a table of 2^B floats (zero-padded to 16): vpermps uses the low 3 bits of each lane.
template <int B>
__m256 lookup(const float* table, __m256i idx) {
    if constexpr (B <= 3) {
        if constexpr (B < 3) idx = _mm256_and_si256(idx, _mm256_set1_epi32((1 << B) - 1));
        return _mm256_permutevar8x32_ps(_mm256_loadu_ps(table), idx);
    } else if constexpr (B == 4) {
        const __m256 lo = _mm256_permutevar8x32_ps(_mm256_loadu_ps(table), idx);
        const __m256 hi = _mm256_permutevar8x32_ps(_mm256_loadu_ps(table + 8), idx);
        return _mm256_blendv_ps(lo, hi, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3 -> sign
    } else {
        return _mm256_i32gather_ps(table, _mm256_and_si256(idx, _mm256_set1_epi32((1 << B) - 1)), 4);
    }
}

// table[idx] for a 16-entry table whose upper half is the lower half negated (turbo's sign-magnitude codes,
// polar's uniform level-1 angles, where code c + 8 is the angle c plus π): one vpermps and a sign flip.
__m256 lookup_signed16(const float* table, __m256i idx) {
    const __m256 v = _mm256_permutevar8x32_ps(_mm256_loadu_ps(table), idx);
    return _mm256_xor_ps(v, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(idx, 3), 31)));
}

// table[idx & (size−1)] for a table of `bits` index bits, chosen at run time.
__m256 lookup_any(const float* table, __m256i idx, int bits) {
    switch (bits) {
        case 0:
        case 1: return lookup<1>(table, idx);
        case 2: return lookup<2>(table, idx);
        case 3: return lookup<3>(table, idx);
        case 4: return lookup<4>(table, idx);
        default:
            return _mm256_i32gather_ps(table, _mm256_and_si256(idx, _mm256_set1_epi32((1 << bits) - 1)), 4);
    }
}

// ---- turbo -------------------------------------------------------------------------------------------

// The values of eight B-bit turbo codes.
template <int B>
__m256 turbo_values(const float* values, __m256i codes) {
    if constexpr (B == 4) {
        return lookup_signed16(values, _mm256_and_si256(codes, _mm256_set1_epi32(15)));
    } else {
        return lookup<B>(values, codes);
    }
}

// Independent accumulators per query, so that G·K fma chains hide the fma latency.
template <int G>
constexpr int kChains = G == 1 ? 4 : G == 2 ? 2 : 1;

// Scores of G prepared queries against rows, one section of B-bit codes (channels j0..j1) at a time;
// group t of the section goes to accumulator chain t % K.
template <int B, int G>
void turbo_section(const uint8_t* codes, int j0, int j1, const float* centroids, const float* const* q,
                   __m256 (*acc)[G]) {
    constexpr int K = kChains<G>;
    int j = j0;
    for (; j + 8 * K <= j1; j += 8 * K) {
        for (int k = 0; k < K; ++k) {
            const __m256 c = turbo_values<B>(centroids, codes8<B>(codes + (j + 8 * k - j0) / 8 * B));
            for (int i = 0; i < G; ++i) acc[k][i] = _mm256_fmadd_ps(c, _mm256_loadu_ps(q[i] + j + 8 * k), acc[k][i]);
        }
    }
    for (; j < j1; j += 8) {
        const __m256 c = turbo_values<B>(centroids, codes8<B>(codes + (j - j0) / 8 * B));
        for (int i = 0; i < G; ++i) acc[0][i] = _mm256_fmadd_ps(c, _mm256_loadu_ps(q[i] + j), acc[0][i]);
    }
}

template <int G>
void turbo_section_any(int bits, const uint8_t* codes, int j0, int j1, const float* centroids, const float* const* q,
                       __m256 (*acc)[G]) {
    switch (bits) {
        case 1: turbo_section<1, G>(codes, j0, j1, centroids, q, acc); break;
        case 2: turbo_section<2, G>(codes, j0, j1, centroids, q, acc); break;
        case 3: turbo_section<3, G>(codes, j0, j1, centroids, q, acc); break;
        default: turbo_section<4, G>(codes, j0, j1, centroids, q, acc); break;
    }
}

// Sums the K chains of each query into chain 0.
template <int G>
void merge_chains(__m256 (*acc)[G]) {
    for (int k = 1; k < kChains<G>; ++k)
        for (int i = 0; i < G; ++i) acc[0][i] = _mm256_add_ps(acc[0][i], acc[k][i]);
}

// Eight ±1 signs as sign bits: bit j of the byte -> bit 31 of lane j.
__m256 sign_bits8(uint8_t byte) {
    const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srlv_epi32(_mm256_set1_epi32(byte), lanes), 31));
}

// The 32 B-bit codes of a block (4·B bytes) as bytes, in the prepared int8 query's order
// (rotated_kernels.hpp): B = 4, the even then the odd codes; B = 2, codes 4i, 4i+1, 4i+2, 4i+3 by turns.
template <int B>
__m256i code_bytes32(const uint8_t* codes) {
    __m128i lo, hi;
    if constexpr (B == 4) {
        const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes));
        const __m128i m = _mm_set1_epi8(0x0F);
        lo = _mm_and_si128(x, m);
        hi = _mm_and_si128(_mm_srli_epi16(x, 4), m);
    } else {
        const __m128i x = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes));
        const __m128i m = _mm_set1_epi8(0x03);
        lo = _mm_unpacklo_epi64(_mm_and_si128(x, m), _mm_and_si128(_mm_srli_epi16(x, 2), m));
        hi = _mm_unpacklo_epi64(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(_mm_srli_epi16(x, 6), m));
    }
    return _mm256_set_m128i(hi, lo);
}

// Σ_blocks scale_b · (int8 values · int8 query) for G queries, values(blk) = block blk's 32 int8 values in
// the prepared query's order; ggml-style: maddubs needs one unsigned operand, so |k| times q carrying k's
// sign; |k|, |q| <= 127 keep the int16 pair sums from saturating.
template <int G, class Values>
void int8_dot(const TurboLayout& l, Values values, const uint8_t* const* prep, __m256* acc) {
    for (int blk = 0; blk < l.d / 32; ++blk) {
        const __m256i k = values(blk);
        const __m256i abs_k = _mm256_abs_epi8(k);
        for (int i = 0; i < G; ++i) {
            const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(prep[i] + l.prep_q8_off + 32 * blk));
            const __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(abs_k, _mm256_sign_epi8(q, k)), _mm256_set1_epi16(1));
            const float scale = reinterpret_cast<const float*>(prep[i] + l.prep_scale_off)[blk];
            acc[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(scale), acc[i]);
        }
    }
}

template <int B, int G>
void turbo_int8_dot(const TurboLayout& l, const uint8_t* row, const uint8_t* const* prep, __m256* acc) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(l.ints_hi)));
    int8_dot<G>(l, [&](int blk) { return _mm256_shuffle_epi8(table, code_bytes32<B>(row + blk * 4 * B)); }, prep, acc);
}

template <int G>
void turbo_score_group(const TurboLayout& l, const float* const* q, const uint8_t* rows, size_t row_stride,
                       size_t n_rows, float* const* out) {
    constexpr int K = kChains<G>;
    const size_t lo_byte = size_t(l.n_hi) * l.bits_hi / 8;
    const uint8_t* const* prep = reinterpret_cast<const uint8_t* const*>(q);
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        __m256 acc[K][G], sk[K][G];
        for (int k = 0; k < K; ++k)
            for (int i = 0; i < G; ++i) acc[k][i] = sk[k][i] = _mm256_setzero_ps();
        if (l.int8_order == 4) {
            turbo_int8_dot<4, G>(l, row, prep, acc[0]);
            for (int i = 0; i < G; ++i) acc[0][i] = _mm256_mul_ps(acc[0][i], _mm256_set1_ps(l.scale_hi));
        } else if (l.int8_order == 2) {
            turbo_int8_dot<2, G>(l, row, prep, acc[0]);
            for (int i = 0; i < G; ++i) acc[0][i] = _mm256_mul_ps(acc[0][i], _mm256_set1_ps(l.scale_hi));
        } else {
            turbo_section_any<G>(l.bits_hi, row, 0, l.n_hi, l.centroids_hi, q, acc);
            if (l.n_hi < l.d) turbo_section_any<G>(l.bits_lo, row + lo_byte, l.n_hi, l.d, l.centroids_lo, q, acc);
            merge_chains<G>(acc);
        }
        const float norm = half_at(row + l.norm_off);
        if (l.qjl) {
            int k = 0;
            for (; k + 8 * K <= l.d; k += 8 * K) {
                for (int c = 0; c < K; ++c) {
                    const __m256 s = sign_bits8(row[l.sign_off + k / 8 + c]);
                    for (int i = 0; i < G; ++i) {
                        sk[c][i] = _mm256_add_ps(sk[c][i], _mm256_xor_ps(_mm256_loadu_ps(q[i] + l.d + k + 8 * c), s));
                    }
                }
            }
            for (; k < l.d; k += 8) {
                const __m256 s = sign_bits8(row[l.sign_off + k / 8]);
                for (int i = 0; i < G; ++i) sk[0][i] = _mm256_add_ps(sk[0][i], _mm256_xor_ps(_mm256_loadu_ps(q[i] + l.d + k), s));
            }
            merge_chains<G>(sk);
            const float gamma = half_at(row + l.gamma_off);
            for (int i = 0; i < G; ++i) out[i][r] = norm * (hsum(acc[0][i]) + gamma * hsum(sk[0][i]));
        } else {
            for (int i = 0; i < G; ++i) out[i][r] = norm * hsum(acc[0][i]);
        }
    }
}

// Runs f.template operator()<g>(i0) for groups of up to 4 queries.
template <class F>
void for_groups(int n_q, F&& f) {
    for (int i0 = 0; i0 < n_q; i0 += 4) {
        switch (std::min(4, n_q - i0)) {
            case 4: f.template operator()<4>(i0); break;
            case 3: f.template operator()<3>(i0); break;
            case 2: f.template operator()<2>(i0); break;
            default: f.template operator()<1>(i0); break;
        }
    }
}

// The rows of a score call kChunk at a time, the queries in groups of up to 4:
// f.template operator()<G>(p, chunk, rn, out) with p the group's prepared queries, chunk the chunk's first
// row and out the group's score rows from it.
template <class F>
void for_score_groups(const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows, size_t row_stride,
                      size_t n_rows, float* scores, size_t score_stride, F&& f) {
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        for_groups(n_q, [&]<int G>(int i0) {
            const uint8_t* p[G];
            float* out[G];
            for (int i = 0; i < G; ++i) {
                p[i] = prep + (i0 + i) * prep_bytes;
                out[i] = scores + (i0 + i) * score_stride + r0;
            }
            f.template operator()<G>(p, rows + r0 * row_stride, rn, out);
        });
    }
}

void turbo_score(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                 size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        for_groups(n_q, [&]<int G>(int i0) {
            const float* q[G];
            float* out[G];
            for (int i = 0; i < G; ++i) {
                q[i] = reinterpret_cast<const float*>(prep + (i0 + i) * prep_bytes);
                out[i] = scores + (i0 + i) * score_stride + r0;
            }
            turbo_score_group<G>(l, q, rows + r0 * row_stride, row_stride, rn, out);
        });
    }
}

// acc[i][tile] += w[i][r]·scale_r·v_r for a tile of NG groups of 8 columns over the rows of a chunk, with
// the accumulators in registers. Source::scale(row) and Source::load(row, group) give a row's factor
// and its eight values of a group.
template <int NG, int G, class Source>
void accumulate_tile(const Source& src, const float* const* w, const uint8_t* rows, size_t row_stride,
                     size_t n_rows, int g0, float* const* acc) {
    __m256 a[G][NG];
    for (int i = 0; i < G; ++i)
        for (int k = 0; k < NG; ++k) a[i][k] = _mm256_loadu_ps(acc[i] + (g0 + k) * 8);
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        __m256 v[NG];
        for (int k = 0; k < NG; ++k) v[k] = src.load(row, g0 + k);
        const float s = src.scale(row);
        for (int i = 0; i < G; ++i) {
            const __m256 wi = _mm256_set1_ps(w[i][r] * s);
            for (int k = 0; k < NG; ++k) a[i][k] = src.add(wi, v[k], a[i][k]);
        }
    }
    for (int i = 0; i < G; ++i)
        for (int k = 0; k < NG; ++k) _mm256_storeu_ps(acc[i] + (g0 + k) * 8, a[i][k]);
}

// Tiles of two groups over groups [g_begin, g_end), for every query group.
template <class Source>
void accumulate_groups(const Source& src, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                       size_t row_stride, size_t n_rows, int g_begin, int g_end, float* out, size_t out_stride) {
    for (int g0 = g_begin; g0 < g_end; g0 += 2) {
        const bool pair = g0 + 1 < g_end;
        for_groups(n_q, [&]<int G>(int i0) {
            const float* wp[G];
            float* ap[G];
            for (int i = 0; i < G; ++i) {
                wp[i] = w + (i0 + i) * w_stride;
                ap[i] = out + (i0 + i) * out_stride;
            }
            if (pair) {
                accumulate_tile<2, G>(src, wp, rows, row_stride, n_rows, g0, ap);
            } else {
                accumulate_tile<1, G>(src, wp, rows, row_stride, n_rows, g0, ap);
            }
        });
    }
}

// Centroids of a B-bit section starting at channel j0 (a multiple of 8), times the row norm.
template <int B>
struct CodeSource {
    const TurboLayout& l;
    size_t byte0;  // the section's first byte in a row
    int g_first;   // the section's first group of 8 channels
    const float* centroids;
    float scale(const uint8_t* row) const { return half_at(row + l.norm_off); }
    __m256 load(const uint8_t* row, int g) const {
        return turbo_values<B>(centroids, codes8<B>(row + byte0 + (g - g_first) * B));
    }
    static __m256 add(__m256 w, __m256 v, __m256 a) { return _mm256_fmadd_ps(w, v, a); }
};

// The QJL signs (as sign bits, flipped into w·‖x‖·‖r‖), for the sketch accumulator.
struct SignSource {
    const TurboLayout& l;
    float scale(const uint8_t* row) const { return half_at(row + l.norm_off) * half_at(row + l.gamma_off); }
    __m256 load(const uint8_t* row, int g) const { return sign_bits8(row[l.sign_off + g]); }
    static __m256 add(__m256 w, __m256 s, __m256 a) { return _mm256_add_ps(a, _mm256_xor_ps(w, s)); }
};

template <int B>
void turbo_accumulate_section(const TurboLayout& l, size_t byte0, int j0, int j1, const float* centroids,
                              const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                              size_t n_rows, float* acc) {
    const CodeSource<B> src{l, byte0, j0 / 8, centroids};
    accumulate_groups(src, w, w_stride, n_q, rows, row_stride, n_rows, j0 / 8, j1 / 8, acc, l.d);
}

void turbo_accumulate_any(int bits, const TurboLayout& l, size_t byte0, int j0, int j1, const float* centroids,
                          const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                          size_t n_rows, float* acc) {
    switch (bits) {
        case 1: turbo_accumulate_section<1>(l, byte0, j0, j1, centroids, w, w_stride, n_q, rows, row_stride, n_rows, acc); break;
        case 2: turbo_accumulate_section<2>(l, byte0, j0, j1, centroids, w, w_stride, n_q, rows, row_stride, n_rows, acc); break;
        case 3: turbo_accumulate_section<3>(l, byte0, j0, j1, centroids, w, w_stride, n_q, rows, row_stride, n_rows, acc); break;
        default: turbo_accumulate_section<4>(l, byte0, j0, j1, centroids, w, w_stride, n_q, rows, row_stride, n_rows, acc); break;
    }
}

void turbo_accumulate(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                      size_t row_stride, size_t n_rows, float* acc, float* sketch) {
    const size_t lo_byte = size_t(l.n_hi) * l.bits_hi / 8;
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        const uint8_t* chunk = rows + r0 * row_stride;
        turbo_accumulate_any(l.bits_hi, l, 0, 0, l.n_hi, l.centroids_hi, w + r0, w_stride, n_q, chunk, row_stride, rn, acc);
        if (l.n_hi < l.d) {
            turbo_accumulate_any(l.bits_lo, l, lo_byte, l.n_hi, l.d, l.centroids_lo, w + r0, w_stride, n_q, chunk,
                                 row_stride, rn, acc);
        }
        if (l.qjl) {
            accumulate_groups(SignSource{l}, w + r0, w_stride, n_q, chunk, row_stride, rn, 0, l.d / 8, sketch, l.d);
        }
    }
}

}  // namespace avx2

}  // namespace
}  // namespace kvq::simd

#include "rotated_polar_avx2.hpp"
