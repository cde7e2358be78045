// AVX2 kernels of the polar codec (part of rotated_avx2.hpp). A 16-value batch is 8 level-1 pairs, one
// per lane: the lane's radius is the group radius times the cos/sin factors of its ancestors (levels
// above 4 are shared by the whole batch and decoded once per row; levels 2–4 come from precomputed
// 8-float rows of PolarLayout::batch_factors, or from per-lane table lookups), and the pair is
// radius·(cos θ, sin θ). Accumulation works row by row into acc (in L1), so the row is decoded once for
// all queries. Layouts with fewer than 4 levels use the scalar specification.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "../ref/rotated_kernels.hpp"

namespace kvq::simd {
namespace {
namespace avx2 {

// The row's bytes [byte, byte + 8) as a little-endian word: one load, or near the row's end (rows can be
// shorter than 8 bytes) the bytes left with zeros above them, so nothing past the row is read.
uint64_t row_word(const uint8_t* row, size_t row_bytes, size_t byte) {
    if (byte + 8 <= row_bytes) return load_u64(row + byte);
    uint64_t v = 0;
    std::memcpy(&v, row + byte, row_bytes - byte);
    return v;
}

// Bits [bit, bit + width) of a row, width <= 32 (so bit & 7 plus width fits the word).
uint32_t bits_at(const uint8_t* row, size_t bit, int width, size_t row_bytes) {
    const uint64_t v = row_word(row, row_bytes, bit >> 3) >> (bit & 7);
    return static_cast<uint32_t>(v & ((uint64_t(1) << width) - 1));
}

// Consecutive `width`-bit codes of a row from bit `pos` on, read 64 bits at a time.
struct CodeStream {
    const uint8_t* row;
    size_t row_bytes, pos;
    int width;
    uint64_t mask, buf = 0;
    int avail = 0;
    CodeStream(const uint8_t* r, size_t bytes, size_t bit, int w)
        : row(r), row_bytes(bytes), pos(bit), width(w), mask((uint64_t(1) << w) - 1) {}
    uint32_t next() {
        if (avail < width) {  // refill from the byte holding pos
            const int skip = static_cast<int>(pos & 7);
            buf = row_word(row, row_bytes, pos >> 3) >> skip;
            avail = 64 - skip;  // past the row's end these are zeros, never asked for
        }
        const uint32_t v = static_cast<uint32_t>(buf & mask);
        buf >>= width;
        avail -= width;
        pos += width;
        return v;
    }
};

// Per-call constants for the level-2..4 lookups: lane j's shift to its ancestor's code, and its side.
struct PolarPlan {
    __m256i shift[3], side[3];
    explicit PolarPlan(const PolarLayout& l) {
        for (int level = 2; level <= 4; ++level) {
            alignas(32) int32_t sh[8], sd[8];
            for (int j = 0; j < 8; ++j) {
                sh[j] = (j >> (level - 1)) * l.bits[level - 1];
                sd[j] = (j >> (level - 2)) & 1;
            }
            shift[level - 2] = _mm256_load_si256(reinterpret_cast<const __m256i*>(sh));
            side[level - 2] = _mm256_load_si256(reinterpret_cast<const __m256i*>(sd));
        }
    }
};

// Lane j: the factor leaf j of batch b gets from its level-`level` ancestor (2 <= level <= 4).
__m256 polar_level(const PolarLayout& l, const PolarPlan& plan, const uint8_t* row, int b, int level) {
    const int bits = l.bits[level - 1], width = bits << (4 - level);
    const uint32_t packed = bits_at(row, l.bit_off[level - 1] + size_t(b) * width, width, l.row_bytes);
    if (const float* t = l.batch_factors[level - 2]) return _mm256_loadu_ps(t + size_t(packed) * 8);
    __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(packed)), plan.shift[level - 2]);
    idx = _mm256_and_si256(idx, _mm256_set1_epi32((1 << bits) - 1));
    idx = _mm256_or_si256(_mm256_slli_epi32(idx, 1), plan.side[level - 2]);
    return lookup_any(l.cossin[level - 1], idx, bits + 1);
}

// Eight B-bit codes starting on a byte, B in 1..8 (above 4 from two words; may read 1..2 bytes beyond).
template <int B>
__m256i codes8_wide(const uint8_t* p) {
    if constexpr (B <= 4) {
        return codes8<B>(p);
    } else {
        uint32_t lo, hi;
        std::memcpy(&lo, p, 4);
        std::memcpy(&hi, p + B / 2, 4);  // codes 4..7 start at bit 4B
        hi >>= (4 * B) % 8;
        const __m256i w = _mm256_blend_epi32(_mm256_set1_epi32(static_cast<int>(lo)), _mm256_set1_epi32(static_cast<int>(hi)), 0xF0);
        return _mm256_srlv_epi32(w, _mm256_setr_epi32(0, B, 2 * B, 3 * B, 0, B, 2 * B, 3 * B));
    }
}

// cos θ and sin θ of eight B-bit level-1 codes. The angles are a uniform grid, so code c + 2^(B−1) is
// angle c plus π: look up the lower half and flip the sign.
template <int B>
void angles8(const PolarLayout& l, __m256i codes, __m256& c, __m256& s) {
    if constexpr (B == 1) {
        c = lookup<1>(l.cos1, codes);
        s = lookup<1>(l.sin1, codes);
    } else {
        const __m256i m = _mm256_and_si256(codes, _mm256_set1_epi32((1 << (B - 1)) - 1));
        const __m256 flip = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(codes, B - 1), 31));
        c = _mm256_xor_ps(lookup<B - 1>(l.cos1, m), flip);
        s = _mm256_xor_ps(lookup<B - 1>(l.sin1, m), flip);
    }
}

// top[b] for every batch of a row with L > 4: the group radius down levels L..5 (as the scalar decode).
void polar_tops(const PolarLayout& l, const uint8_t* row, float* top) {
    const int per_group = 1 << (l.levels - 4);
    float a[16];  // L <= 8: at most 16 batches per group
    for (int g = 0; g < l.d >> l.levels; ++g) {
        a[0] = half_at(row + l.radius_off + 2 * g);
        for (int level = l.levels, nodes = 1; level >= 5; --level, nodes *= 2) {
            const int bits = l.bits[level - 1];
            const float* cs = l.cossin[level - 1];
            for (int k = nodes - 1; k >= 0; --k) {
                const uint32_t c = bits_at(row, l.bit_off[level - 1] + size_t(g * nodes + k) * bits, bits, l.row_bytes);
                const float parent = a[k];
                a[2 * k] = parent * cs[2 * c];
                a[2 * k + 1] = parent * cs[2 * c + 1];
            }
        }
        for (int k = 0; k < per_group; ++k) top[g * per_group + k] = a[k];
    }
}

// The whole-row walk over batches: fn(b, xe, xo) gets batch b's 8 even and 8 odd values (rotated basis).
// Levels 2–4 come from the batch tables when they exist, else from lookups.
template <int B1, class Fn>
[[gnu::always_inline]] inline void for_each_batch(const PolarLayout& l, const PolarPlan& plan, const uint8_t* row,
                                                  float* top, Fn&& fn) {
    const int batches = l.d / detail::kPolarBatch;
    if (l.levels > 4) polar_tops(l, row, top);
    const float* t2 = l.batch_factors[0];
    const float* t3 = l.batch_factors[1];
    const float* t4 = l.batch_factors[2];
    const float* t34 = l.batch_factors34;
    if (t2 && t34) {  // the usual case (PolarQuant's 4.2.2.2 included): two table rows per batch
        const int w3 = 2 * l.bits[2];
        CodeStream s2(row, l.row_bytes, l.bit_off[1], 4 * l.bits[1]), s3(row, l.row_bytes, l.bit_off[2], w3),
            s4(row, l.row_bytes, l.bit_off[3], l.bits[3]);
        for (int b = 0; b < batches; ++b) {
            const float t = l.levels > 4 ? top[b] : half_at(row + l.radius_off + 2 * b);
            const uint32_t k34 = s3.next() | (s4.next() << w3);
            __m256 f = _mm256_mul_ps(_mm256_set1_ps(t), _mm256_loadu_ps(t34 + size_t(k34) * 8));
            f = _mm256_mul_ps(f, _mm256_loadu_ps(t2 + size_t(s2.next()) * 8));
            __m256 c, s;
            angles8<B1>(l, codes8_wide<B1>(row + size_t(b) * B1), c, s);
            fn(b, _mm256_mul_ps(f, c), _mm256_mul_ps(f, s));
        }
        return;
    }
    if (t2 && t3 && t4) {
        const int w2 = 4 * l.bits[1], w3 = 2 * l.bits[2], w4 = l.bits[3];
        size_t p2 = l.bit_off[1], p3 = l.bit_off[2], p4 = l.bit_off[3];
        for (int b = 0; b < batches; ++b, p2 += w2, p3 += w3, p4 += w4) {
            const float t = l.levels > 4 ? top[b] : half_at(row + l.radius_off + 2 * b);
            __m256 f = _mm256_mul_ps(_mm256_set1_ps(t), _mm256_loadu_ps(t4 + size_t(bits_at(row, p4, w4, l.row_bytes)) * 8));
            f = _mm256_mul_ps(f, _mm256_loadu_ps(t3 + size_t(bits_at(row, p3, w3, l.row_bytes)) * 8));
            f = _mm256_mul_ps(f, _mm256_loadu_ps(t2 + size_t(bits_at(row, p2, w2, l.row_bytes)) * 8));
            __m256 c, s;
            angles8<B1>(l, codes8_wide<B1>(row + size_t(b) * B1), c, s);
            fn(b, _mm256_mul_ps(f, c), _mm256_mul_ps(f, s));
        }
        return;
    }
    for (int b = 0; b < batches; ++b) {
        __m256 f = _mm256_set1_ps(l.levels > 4 ? top[b] : half_at(row + l.radius_off + 2 * b));
        for (int level = 4; level >= 2; --level) f = _mm256_mul_ps(f, polar_level(l, plan, row, b, level));
        __m256 c, s;
        angles8<B1>(l, codes8_wide<B1>(row + size_t(b) * B1), c, s);
        fn(b, _mm256_mul_ps(f, c), _mm256_mul_ps(f, s));
    }
}

// Calls f.template operator()<B1>() with the level-1 bits as a constant.
template <class F>
void with_level1_bits(int bits, F&& f) {
    switch (bits) {
        case 1: f.template operator()<1>(); break;
        case 2: f.template operator()<2>(); break;
        case 3: f.template operator()<3>(); break;
        case 4: f.template operator()<4>(); break;
        case 5: f.template operator()<5>(); break;
        case 6: f.template operator()<6>(); break;
        case 7: f.template operator()<7>(); break;
        default: f.template operator()<8>(); break;
    }
}

template <int B1, int G>
void polar_score_group(const PolarLayout& l, const PolarPlan& plan, const float* const* q, const uint8_t* rows,
                       size_t row_stride, size_t n_rows, float* const* out) {
    float top[65536 / detail::kPolarBatch];
    for (size_t r = 0; r < n_rows; ++r) {
        __m256 even[G], odd[G];  // two fma chains per query
        for (int i = 0; i < G; ++i) even[i] = odd[i] = _mm256_setzero_ps();
        for_each_batch<B1>(l, plan, rows + r * row_stride, top, [&](int b, __m256 xe, __m256 xo) __attribute__((always_inline)) {
            for (int i = 0; i < G; ++i) {  // the prepared query holds each batch as evens, then odds
                even[i] = _mm256_fmadd_ps(xe, _mm256_loadu_ps(q[i] + 16 * b), even[i]);
                odd[i] = _mm256_fmadd_ps(xo, _mm256_loadu_ps(q[i] + 16 * b + 8), odd[i]);
            }
        });
        for (int i = 0; i < G; ++i) out[i][r] = hsum(_mm256_add_ps(even[i], odd[i]));
    }
}

void polar_score(const PolarLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                 size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    if (l.levels < 4) {
        return detail::scalar_rotated_kernels().polar.score(l, prep, prep_bytes, n_q, rows, row_stride, n_rows, scores,
                                                             score_stride);
    }
    const PolarPlan plan(l);
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        for_groups(n_q, [&]<int G>(int i0) {
            const float* q[G];
            float* out[G];
            for (int i = 0; i < G; ++i) {
                q[i] = reinterpret_cast<const float*>(prep + (i0 + i) * prep_bytes);
                out[i] = scores + (i0 + i) * score_stride + r0;
            }
            with_level1_bits(l.bits[0], [&]<int B1>() { polar_score_group<B1, G>(l, plan, q, rows + r0 * row_stride, row_stride, rn, out); });
        });
    }
}

// acc[i] += w[i][r]·row_r over a chunk of rows, one row at a time (a row is decoded once for G queries,
// the accumulators stay in L1).
template <int B1, int G>
void polar_accumulate_group(const PolarLayout& l, const PolarPlan& plan, const float* const* w, const uint8_t* rows,
                            size_t row_stride, size_t n_rows, float* const* acc) {
    float top[65536 / detail::kPolarBatch];
    for (size_t r = 0; r < n_rows; ++r) {
        __m256 wi[G];
        for (int i = 0; i < G; ++i) wi[i] = _mm256_set1_ps(w[i][r]);
        for_each_batch<B1>(l, plan, rows + r * row_stride, top, [&](int b, __m256 xe, __m256 xo) __attribute__((always_inline)) {
            // Back to index order: (e0 o0 e1 o1 e2 o2 e3 o3), (e4 o4 … e7 o7).
            const __m256 lo = _mm256_unpacklo_ps(xe, xo), hi = _mm256_unpackhi_ps(xe, xo);
            const __m256 v0 = _mm256_permute2f128_ps(lo, hi, 0x20), v1 = _mm256_permute2f128_ps(lo, hi, 0x31);
            for (int i = 0; i < G; ++i) {
                float* a = acc[i] + 16 * b;
                _mm256_storeu_ps(a, _mm256_fmadd_ps(wi[i], v0, _mm256_loadu_ps(a)));
                _mm256_storeu_ps(a + 8, _mm256_fmadd_ps(wi[i], v1, _mm256_loadu_ps(a + 8)));
            }
        });
    }
}

// Batch b of a row, read directly (no stream): for the tile loop below, which needs the usual tables.
template <int B1>
[[gnu::always_inline]] inline void batch_at(const PolarLayout& l, const uint8_t* row, int b, __m256& xe, __m256& xo) {
    float t = half_at(row + l.radius_off + 2 * (b >> (l.levels - 4)));
    for (int level = 5; level <= l.levels; ++level) {
        const int bits = l.bits[level - 1];
        const uint32_t c = bits_at(row, l.bit_off[level - 1] + size_t(b >> (level - 4)) * bits, bits, l.row_bytes);
        t *= l.cossin[level - 1][2 * c + ((b >> (level - 5)) & 1)];
    }
    const int w2 = 4 * l.bits[1], w3 = 2 * l.bits[2], w4 = l.bits[3];
    const uint32_t k2 = bits_at(row, l.bit_off[1] + size_t(b) * w2, w2, l.row_bytes);
    const uint32_t k34 = bits_at(row, l.bit_off[2] + size_t(b) * w3, w3, l.row_bytes) |
                         (bits_at(row, l.bit_off[3] + size_t(b) * w4, w4, l.row_bytes) << w3);
    const __m256 f = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(t), _mm256_loadu_ps(l.batch_factors34 + size_t(k34) * 8)),
                                   _mm256_loadu_ps(l.batch_factors[0] + size_t(k2) * 8));
    __m256 c, s;
    angles8<B1>(l, codes8_wide<B1>(row + size_t(b) * B1), c, s);
    xe = _mm256_mul_ps(f, c);
    xo = _mm256_mul_ps(f, s);
}

// acc[i][batch b] += w[i][r]·row_r[batch b] over a chunk of rows, with the 2·G accumulators in registers.
template <int B1, int G>
void polar_accumulate_tile(const PolarLayout& l, const float* const* w, const uint8_t* rows, size_t row_stride,
                           size_t n_rows, int b, float* const* acc) {
    __m256 a[G][2];
    for (int i = 0; i < G; ++i) {
        a[i][0] = _mm256_loadu_ps(acc[i] + 16 * b);
        a[i][1] = _mm256_loadu_ps(acc[i] + 16 * b + 8);
    }
    for (size_t r = 0; r < n_rows; ++r) {
        __m256 xe, xo;
        batch_at<B1>(l, rows + r * row_stride, b, xe, xo);
        const __m256 lo = _mm256_unpacklo_ps(xe, xo), hi = _mm256_unpackhi_ps(xe, xo);
        const __m256 v0 = _mm256_permute2f128_ps(lo, hi, 0x20), v1 = _mm256_permute2f128_ps(lo, hi, 0x31);
        for (int i = 0; i < G; ++i) {
            const __m256 wi = _mm256_set1_ps(w[i][r]);
            a[i][0] = _mm256_fmadd_ps(wi, v0, a[i][0]);
            a[i][1] = _mm256_fmadd_ps(wi, v1, a[i][1]);
        }
    }
    for (int i = 0; i < G; ++i) {
        _mm256_storeu_ps(acc[i] + 16 * b, a[i][0]);
        _mm256_storeu_ps(acc[i] + 16 * b + 8, a[i][1]);
    }
}

void polar_accumulate(const PolarLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                      size_t row_stride, size_t n_rows, float* acc) {
    if (l.levels < 4) {
        return detail::scalar_rotated_kernels().polar.accumulate(l, w, w_stride, n_q, rows, row_stride, n_rows, acc);
    }
    const PolarPlan plan(l);
    // Several queries: tiles (accumulators in registers, batches decoded directly). One query, or levels
    // above 4 to decode per batch: row by row, the row streamed once and acc in L1.
    const bool tiles = n_q > 1 && l.levels == 4 && l.batch_factors[0] && l.batch_factors34;
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        for_groups(n_q, [&]<int G>(int i0) {
            const float* wp[G];
            float* ap[G];
            for (int i = 0; i < G; ++i) {
                wp[i] = w + (i0 + i) * w_stride + r0;
                ap[i] = acc + size_t(i0 + i) * l.d;
            }
            const uint8_t* chunk = rows + r0 * row_stride;
            with_level1_bits(l.bits[0], [&]<int B1>() {
                if (tiles) {
                    for (int b = 0; b < l.d / detail::kPolarBatch; ++b) polar_accumulate_tile<B1, G>(l, wp, chunk, row_stride, rn, b, ap);
                } else {
                    polar_accumulate_group<B1, G>(l, plan, wp, chunk, row_stride, rn, ap);
                }
            });
        });
    }
}

}  // namespace avx2

}  // namespace
}  // namespace kvq::simd
