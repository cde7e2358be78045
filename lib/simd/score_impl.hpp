// The score kernels of the block codecs: the g queries of a GQA group go through each key row together;
// rows are taken in chunks that stay in cache while several query groups pass over them. Quantized keys
// are scored as ggml does: an integer dot product per 32-value block against the int8 query, then one fma
// per block in fp32. Included by kernels_impl.hpp in one level's file,
// which chooses among them (lib/simd/level_<isa>.cpp).
#pragma once

#include <algorithm>

#include "../ref/key_groups.hpp"
#include "layouts_impl.hpp"

namespace kvq::simd {
namespace {

template <class A, class L, int G>
void score_group(const uint8_t* const* prep, const uint8_t* rows, size_t row_stride, size_t n_rows,
                 int64_t nb, float* const* out) {
    using O = Ops<A>;
    using FD = xsimd::batch<float, typename O::DotArch>;
    for (size_t r = 0; r < n_rows; ++r) {
        const auto* blk = reinterpret_cast<const typename L::Block*>(rows + r * row_stride);
        FD acc[G];
        float acc_min[G] = {};
        for (int i = 0; i < G; ++i) acc[i] = FD(0.0f);
        for (int64_t b = 0; b < nb; ++b) {
            const auto key = O::key(L::template bytes<O>(blk[b]));
            const float dk = O::f16_value(blk[b].d);
            for (int i = 0; i < G; ++i) {
                const auto& q = reinterpret_cast<const BlockQ8Query*>(prep[i])[b];
                acc[i] = fmadd(O::dot(key, q.qs), FD(dk * q.d), acc[i]);
                if constexpr (L::has_min) acc_min[i] += offset_of<O, L>(blk[b]) * q.s;
            }
        }
        float s[G];
        Ops<typename O::DotArch>::reduce_add_rows(acc, G, s);
        for (int i = 0; i < G; ++i) out[i][r] = s[i] + acc_min[i];
    }
}

inline constexpr int64_t kMaxGroupBlocks = 64;  // head_dim <= 2048: the group's block scales fit on the stack
// score_group4 and score_group4_pairs prefetch key rows kPrefetchBytes ahead: measured on one AVX2 thread,
// 10-20% from memory (the hardware prefetcher alone leaves the row loop waiting part of the time).
inline constexpr size_t kPrefetchBytes = 2048;


// Four queries at once, in one register: per key block, the four integer dot products are transposed into
// one vector (lane i of each 128-bit half holds query i), converted once and scaled by dk·[dq of each
// query]; nibble codes are taken unsigned (maddubs needs no sign trick) and their offset or minimum comes
// back per block as bias·[s of each query]. NB > 0 fixes the block count (d = 128: 4) so the block loop
// unrolls.
template <class A, class L, int NB = 0>
void score_group4(const uint8_t* const* prep, const uint8_t* rows, size_t row_stride, size_t n_rows,
                  int64_t nb_run, float* const* out) {
    const int64_t nb = NB > 0 ? NB : nb_run;
    using O = Ops<A>;
    using FD = xsimd::batch<float, typename O::DotArch>;
    constexpr int N = static_cast<int>(FD::size);
    static_assert(N % 4 == 0);
    const BlockQ8Query* q[4];
    for (int i = 0; i < 4; ++i) q[i] = reinterpret_cast<const BlockQ8Query*>(prep[i]);
    alignas(64) float dq[kMaxGroupBlocks][N], sq[kMaxGroupBlocks][N];
    assert(n_rows <= kRowChunk);
    for (int64_t b = 0; b < nb; ++b) {
        for (int l = 0; l < N; ++l) {
            dq[b][l] = q[l % 4][b].d;
            // the halves of acc each hold part of a dot; the bias goes in once
            if constexpr (L::unsigned_raw) sq[b][l] = l < 4 ? q[l][b].s * L::kBiasScale : 0.0f;
        }
    }
    // VNNI, signed keys: minus the part of each block's sums that the unsigned key adds, per query (ops_avx2.hpp)
    constexpr bool vnni = requires { O::kVnni; };
    typename O::IDot neg_offset[vnni ? kMaxGroupBlocks : 1][4];
    if constexpr (vnni) {
        if constexpr (!L::unsigned_raw) {
            for (int64_t b = 0; b < nb; ++b) {
                const int8_t* y[4] = {q[0][b].qs, q[1][b].qs, q[2][b].qs, q[3][b].qs};
                O::neg_offsets4(y, neg_offset[b]);
            }
        }
    }
    using Block = typename L::Block;
    // acc (+ bias) += block b of row blk against the four queries
    auto step = [&](const Block* blk, int64_t b, FD& acc, FD& bias) {
        const float dk = O::f16_value(blk[b].d);
        const int8_t* y[4] = {q[0][b].qs, q[1][b].qs, q[2][b].qs, q[3][b].qs};
        typename O::IDot p;
        if constexpr (L::unsigned_raw) {
            p = O::dot4_unsigned(O::ukey(L::template raw<O>(blk[b])), y);
            bias = fmadd(FD(L::template bias<O>(blk[b], dk)), FD::load_aligned(sq[b]), bias);
        } else if constexpr (requires { O::kVnni; }) {
            p = O::dot4_signed_less(L::template raw<O>(blk[b]), y, neg_offset[b]);
        } else {
            p = O::dot4_signed(O::key(L::template raw<O>(blk[b])), y);
        }
        acc = fmadd(O::dot_to_f32(p), FD(dk) * FD::load_aligned(dq[b]), acc);
    };
    alignas(64) float result[kRowChunk][N];
    // 256-bit dot products (AVX2, AVX-512): two rows per step, more independent work between the loads;
    // 128-bit ones keep one row per step (their four-query sums need more registers).
    constexpr size_t R = N == 8 ? 2 : 1;
    size_t r = 0;
    for (; r + R <= n_rows; r += R) {
        const uint8_t* row = rows + r * row_stride;
        for (size_t ahead = 0; ahead < R * row_stride; ahead += 64) __builtin_prefetch(row + kPrefetchBytes + ahead);
        FD acc[R], bias[R];
        for (size_t k = 0; k < R; ++k) acc[k] = bias[k] = FD(0.0f);
        for (int64_t b = 0; b < nb; ++b) {
            for (size_t k = 0; k < R; ++k) step(reinterpret_cast<const Block*>(row + k * row_stride), b, acc[k], bias[k]);
        }
        for (size_t k = 0; k < R; ++k) (acc[k] + bias[k]).store_aligned(result[r + k]);
    }
    for (; r < n_rows; ++r) {
        const auto* blk = reinterpret_cast<const Block*>(rows + r * row_stride);
        FD acc(0.0f), bias(0.0f);
        for (int64_t b = 0; b < nb; ++b) step(blk, b, acc, bias);
        (acc + bias).store_aligned(result[r]);
    }
    if constexpr (N == 8 && requires { O::store_half_sums4(result, n_rows, out); }) {
        O::store_half_sums4(result, n_rows, out);
    } else {
        for (int i = 0; i < 4; ++i) {
            for (size_t rr = 0; rr < n_rows; ++rr) {
                float total = result[rr][i];
                for (int l = i + 4; l < N; l += 4) total += result[rr][l];
                out[i][rr] = total;
            }
        }
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// −128·Σy per query block: the part of the sums that unsigned keys (k + 128) add; Σ(y + 128) by one sum
// of absolute differences.
inline void q8_0_unsigned_offsets(const BlockQ8Query* const* q, int n_q, int64_t nb, int32_t (*neg)[4]) {
    const __m256i flip32 = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int64_t b = 0; b < nb; ++b) {
        for (int i = 0; i < n_q; ++i) {
            const __m256i y = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[i][b].qs)), flip32);
            const __m256i sad = _mm256_sad_epu8(y, _mm256_setzero_si256());
            const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
            const int32_t biased = _mm_cvtsi128_si32(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2)));
            neg[b][i] = -128 * (biased - 128 * kQK);
        }
    }
}

// One query block against one key block of 16 rows (kt[j]: dword j of the 16 rows, made unsigned; dk: their
// scales; neg: −128·Σy of the query block): acc + Σ · dk·dq, Σ the exact integer dot products. What both
// layouts' kernels do per block and query, so that they give the same bits.
inline __attribute__((always_inline)) __m512 q8_0_block16(const __m512i (&kt)[8], const BlockQ8Query& qb, int32_t neg,
                                                          __m512 dk, __m512 acc) {
    auto ydw = [&](int j) {  // the query's dword j, broadcast
        int32_t w;
        std::memcpy(&w, qb.qs + 4 * j, 4);
        return _mm512_set1_epi32(w);
    };
    __m512i s0 = _mm512_set1_epi32(neg), s1 = _mm512_setzero_si512();
    for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, kt[j], ydw(j));
        s1 = _mm512_dpbusd_epi32(s1, kt[j + 1], ydw(j + 1));
    }
    const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
    return _mm512_fmadd_ps(sum, _mm512_mul_ps(dk, _mm512_set1_ps(qb.d)), acc);
}

// The codes of one block of two rows (the bytes after its scale at lo and hi) made unsigned, k + 128, one
// row per 256-bit half: q8_0's bytes with their sign bit flipped; iq4_nl's nibbles (load_nibbles' order)
// looked up in a table of its levels + 128 (one vpshufb for both rows).
template <class Block>
inline __attribute__((always_inline)) __m512i unsigned_codes2(const uint8_t* lo, const uint8_t* hi) {
    if constexpr (std::is_same_v<Block, detail::BlockIQ4_NL>) {
        const __m256i t = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
                                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
        const __m256i m = _mm256_set1_epi8(0x0F);
        const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(t, m)),
                                             _mm256_and_si256(_mm256_srli_epi16(t, 4), m), 1);  // lo nibbles of both, then hi
        const __m128i levels = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(detail::kIQ4NLValues)),
                                             _mm_set1_epi8(static_cast<char>(0x80)));
        return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(levels), _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0)));
    } else {
        static_assert(std::is_same_v<Block, detail::BlockQ8_0>);
        const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo))),
                                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi)), 1);
        return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
    }
}

// score_q8_0_rows16's step (below): 16 rows at base, row_stride apart, against the G queries (neg:
// −128·Σy of each query block), into out[i][at_out + 0..live).
template <int NB, int G, class Block>
inline __attribute__((always_inline)) void score_q8_0_group16(const BlockQ8Query* const* q, const int32_t (*neg)[4],
                                                              const uint8_t* base, size_t row_stride, int64_t nb,
                                                              size_t live, float* const* out, size_t at_out) {
    constexpr size_t kBlock = sizeof(Block);
    const __m512i at_row = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(static_cast<int>(row_stride)));
    // the rows of register k: k < 4: rows k, k + 4; k ≥ 4: rows k + 4, k + 8 (so the transposed lanes are
    // rows 0..15 in order)
    constexpr int kLow[8] = {0, 1, 2, 3, 8, 9, 10, 11};
    __m512 acc[G];
    for (int i = 0; i < G; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* const blocks = base + static_cast<size_t>(b) * kBlock;
        __m512i k8[8];
        for (int k = 0; k < 8; ++k) {
            const uint8_t* lo = blocks + kLow[k] * row_stride + 2;
            k8[k] = unsigned_codes2<Block>(lo, lo + 4 * row_stride);
        }
        // 8 × 8 dword transpose in each 256-bit half
        __m512i t[8];
        for (int k = 0; k < 4; ++k) {
            t[2 * k] = _mm512_unpacklo_epi32(k8[2 * k], k8[2 * k + 1]);
            t[2 * k + 1] = _mm512_unpackhi_epi32(k8[2 * k], k8[2 * k + 1]);
        }
        __m512i u[8];  // u[4g + j]: rows of registers 4g..4g+3, dword j of each 128-bit lane
        for (int g = 0; g < 2; ++g) {
            u[4 * g + 0] = _mm512_unpacklo_epi64(t[4 * g], t[4 * g + 2]);
            u[4 * g + 1] = _mm512_unpackhi_epi64(t[4 * g], t[4 * g + 2]);
            u[4 * g + 2] = _mm512_unpacklo_epi64(t[4 * g + 1], t[4 * g + 3]);
            u[4 * g + 3] = _mm512_unpackhi_epi64(t[4 * g + 1], t[4 * g + 3]);
        }
        __m512i kt[8];  // kt[j]: dword j of rows 0..15
        for (int j = 0; j < 4; ++j) {
            kt[j] = _mm512_shuffle_i32x4(u[j], u[4 + j], 0x88);      // lanes 0, 2 of each
            kt[4 + j] = _mm512_shuffle_i32x4(u[j], u[4 + j], 0xDD);  // lanes 1, 3 of each
        }
        // the 16 rows' fp16 scales: one gather of the dwords that start each block
        const __m512i d32 = _mm512_i32gather_epi32(at_row, blocks, 1);
        const __m512 dk = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32));
        for (int i = 0; i < G; ++i) {
            acc[i] = q8_0_block16(kt, q[i][b], neg[b][i], dk, acc[i]);
        }
    }
    const __mmask16 keep = static_cast<__mmask16>((1u << live) - 1);
    for (int i = 0; i < G; ++i) _mm512_mask_storeu_ps(out[i] + at_out, keep, acc[i]);
}

// q8_0 keys and four queries with AVX512-VNNI, 16 rows per register: each block of 16 rows is loaded (two
// rows per register: rows r and r + 4, then r + 8 and r + 12) and transposed in registers, 8 × 8 dwords in
// each 256-bit half, so that dword j of every row shares one register (lane l = row l). Then each query's
// block sum is 8 vpdpbusd against its dwords broadcast from memory, with no reduction after: one
// conversion and fma per block serve 16 rows. The transpose costs 24 shuffles per block and 16 rows;
// the kernel it replaced (two rows per zmm) spent 9 per block and 2 rows bringing its sums together.
// A block's integer sum is exact and the fma per block follows the specification's order (fma(Σ, dk·dq,
// score) over the blocks), so a score differs from the specification's by rounding only, and never
// depends on the row's place in the chunk (a short last group is scored as 16 rows of a copy that
// repeats its last row). Measured on 4096 rows in cache, d = 128: 10.6 → 7.1 ns a row. Its floor is the
// 8 vpdpbusd a row, which run on one port. NB > 0 fixes the block count (d = 128: 4). Block: q8_0, or
// iq4_nl (its levels looked up as the rows are loaded: unsigned_codes2).
template <int NB, int G, class Block = detail::BlockQ8_0>
void score_q8_0_rows16(const uint8_t* const* prep, const uint8_t* rows, size_t row_stride, size_t n_rows,
                       int64_t nb_run, float* const* out) {
    const int64_t nb = NB > 0 ? NB : nb_run;
    constexpr size_t kBlock = sizeof(Block);
    const size_t row_bytes = static_cast<size_t>(nb) * kBlock;
    assert(nb <= kMaxGroupBlocks && n_rows <= kRowChunk && 16 * row_stride < (size_t{1} << 31));
    const BlockQ8Query* q[G];
    for (int i = 0; i < G; ++i) q[i] = reinterpret_cast<const BlockQ8Query*>(prep[i]);
    int32_t neg[kMaxGroupBlocks][4];
    q8_0_unsigned_offsets(q, G, nb, neg);
    size_t r0 = 0;
    for (; r0 + 16 <= n_rows; r0 += 16) {
        const uint8_t* const base = rows + r0 * row_stride;
        if (row_stride == row_bytes) {
            for (size_t o = 0; o < 16 * row_bytes; o += 64) __builtin_prefetch(base + 16 * row_stride + o);
        } else {
            for (size_t k = 0; k < 16; ++k) {
                for (size_t o = 0; o < row_bytes; o += 64) __builtin_prefetch(base + (16 + k) * row_stride + o);
            }
        }
        score_q8_0_group16<NB, G, Block>(q, neg, base, row_stride, nb, 16, out, r0);
    }
    if (r0 < n_rows) {  // a short last group: its rows, then its last row again, as 16 rows of a copy
        alignas(64) uint8_t tail[16 * kMaxGroupBlocks * kBlock];
        const size_t live = n_rows - r0;
        for (size_t k = 0; k < 16; ++k) std::memcpy(tail + k * row_bytes, rows + (r0 + std::min(k, live - 1)) * row_stride, row_bytes);
        score_q8_0_group16<NB, G, Block>(q, neg, tail, row_bytes, nb, live, out, r0);
    }
}

// BlockKernels::score_groups: q8_0 keys stored in groups of 16 rows (lib/ref/key_groups.hpp) against
// G ≤ 4 queries. score_q8_0_group16 without its loads, inserts, sign flips, 24 shuffles and gather: a
// block of 16 rows is 8 loads of its dwords (already unsigned) and one of its scales, then per query the
// same 8 vpdpbusd, conversion and fma, so the scores are score_q8_0_rows16's bit for bit. Measured on a Zen 4, 4096 rows in L2, d = 128, 32 rows a
// call: docs/PERFORMANCE.md, "q8_0 keys in groups of 16 rows". NB > 0 fixes the block count.
template <int NB, int G>
void score_q8_0_groups16(const uint8_t* prep, size_t prep_bytes, const uint8_t* groups, size_t n_groups,
                         int64_t nb_run, float* const* out) {
    const int64_t nb = NB > 0 ? NB : nb_run;
    assert(nb <= kMaxGroupBlocks);
    const BlockQ8Query* q[G];
    for (int i = 0; i < G; ++i) q[i] = reinterpret_cast<const BlockQ8Query*>(prep + i * prep_bytes);
    int32_t neg[kMaxGroupBlocks][4];
    q8_0_unsigned_offsets(q, G, nb, neg);
    const size_t bytes = detail::group_bytes(static_cast<size_t>(nb));
    for (size_t gi = 0; gi < n_groups; ++gi) {
        const uint8_t* const g = groups + gi * bytes;
        for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(g + bytes + o);  // the next group (decode: 1.0-1.04× faster)
        const uint8_t* const codes = g + 2 * detail::kGroupRows * nb;
        __m512 acc[G];
        for (int i = 0; i < G; ++i) acc[i] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            const __m512 dk = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 32 * b)));
            __m512i kt[8];  // kt[j]: dword j of rows 0..15
            for (int j = 0; j < 8; ++j) kt[j] = _mm512_loadu_si512(codes + 512 * b + 64 * j);
            for (int i = 0; i < G; ++i) {
                acc[i] = q8_0_block16(kt, q[i][b], neg[b][i], dk, acc[i]);
            }
        }
        for (int i = 0; i < G; ++i) _mm512_storeu_ps(out[i] + 16 * gi, acc[i]);
    }
}

template <int G>
void score_q8_0_groups_of(const uint8_t* prep, size_t prep_bytes, const uint8_t* groups, size_t n_groups, int64_t nb,
                          float* const* out) {
    if (nb == 4) return score_q8_0_groups16<4, G>(prep, prep_bytes, groups, n_groups, nb, out);
    score_q8_0_groups16<0, G>(prep, prep_bytes, groups, n_groups, nb, out);
}

void score_q8_0_groups(const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* groups, size_t n_groups,
                       int64_t n, float* const* out) {
    const int64_t nb = n / kQK;
    switch (n_q) {
        case 4: return score_q8_0_groups_of<4>(prep, prep_bytes, groups, n_groups, nb, out);
        case 3: return score_q8_0_groups_of<3>(prep, prep_bytes, groups, n_groups, nb, out);
        case 2: return score_q8_0_groups_of<2>(prep, prep_bytes, groups, n_groups, nb, out);
        default: return score_q8_0_groups_of<1>(prep, prep_bytes, groups, n_groups, nb, out);
    }
}
#endif

// q4_0 keys and four queries, two key blocks per register where Ops has block pairs (AVX2: one block per
// 128-bit half, so a block's low and high nibbles each fill a register without shuffles and the four
// queries' sums need half the horizontal adds). The query blocks are rearranged once per chunk to match.
// Per block pair: s = the integer dot products, and score += dk · (dq·s − 8·dq·Σy) in fp32. Two rows per
// step share the query loads; NB > 0 fixes the block count (d = 128: 4) so the block loop unrolls.

template <class A, class L, int NB>
void score_group4_pairs(const uint8_t* const* prep, const uint8_t* rows, size_t row_stride, size_t n_rows,
                        int64_t nb_run, float* const* out) {
    static_assert(std::is_same_v<L, LayoutQ4_0>);
    using O = Ops<A>;
    using FD = xsimd::batch<float, typename O::DotArch>;
    static_assert(FD::size == 8);
    const int64_t nb = NB > 0 ? NB : nb_run;
    assert(nb % 2 == 0 && nb <= kMaxGroupBlocks && n_rows <= kRowChunk);
    const BlockQ8Query* q[4];
    for (int i = 0; i < 4; ++i) q[i] = reinterpret_cast<const BlockQ8Query*>(prep[i]);
    alignas(32) int8_t ylo[kMaxGroupBlocks / 2][4][32], yhi[kMaxGroupBlocks / 2][4][32];
    alignas(32) float dq[kMaxGroupBlocks / 2][8], sq[kMaxGroupBlocks / 2][8];
    for (int64_t p = 0; p < nb / 2; ++p) {
        for (int i = 0; i < 4; ++i) {
            for (int h = 0; h < 2; ++h) {
                const BlockQ8Query& y = q[i][2 * p + h];
                std::memcpy(&ylo[p][i][16 * h], y.qs, 16);
                std::memcpy(&yhi[p][i][16 * h], y.qs + 16, 16);
                dq[p][4 * h + i] = y.d;
                sq[p][4 * h + i] = y.s * L::kBiasScale;
            }
        }
    }
    using Block = typename L::Block;
    // acc += (dk of blocks 2p, 2p+1) · (s·dq + bias·Σy) for row blk
    auto step = [&](const Block* blk, int64_t p, FD acc) {
        typename O::UKey lo, hi;
        O::load_nibble_pair(blk[2 * p].qs, blk[2 * p + 1].qs, lo, hi);
        FD s;
        if constexpr (requires { O::kVnni; }) {
            s = O::dot_to_f32(O::dot4_pair_vnni(lo, hi, ylo[p], yhi[p]));
        } else {
            s = O::dot_to_f32(O::dot4_pair(lo, hi, ylo[p], yhi[p]));
        }
        return fmadd(O::f16_pair(blk[2 * p].d, blk[2 * p + 1].d),
                     fmadd(s, FD::load_aligned(dq[p]), FD::load_aligned(sq[p])), acc);
    };
    alignas(32) float result[kRowChunk][8];
    size_t r = 0;
    for (; r + 2 <= n_rows; r += 2) {
        const uint8_t* row = rows + r * row_stride;
        for (size_t ahead = 0; ahead < 2 * row_stride; ahead += 64) __builtin_prefetch(row + kPrefetchBytes + ahead);
        const auto* blk0 = reinterpret_cast<const Block*>(row);
        const auto* blk1 = reinterpret_cast<const Block*>(row + row_stride);
        FD acc0(0.0f), acc1(0.0f);
        for (int64_t p = 0; p < nb / 2; ++p) {
            acc0 = step(blk0, p, acc0);
            acc1 = step(blk1, p, acc1);
        }
        acc0.store_aligned(result[r]);
        acc1.store_aligned(result[r + 1]);
    }
    for (; r < n_rows; ++r) {
        const auto* blk = reinterpret_cast<const Block*>(rows + r * row_stride);
        FD acc(0.0f);
        for (int64_t p = 0; p < nb / 2; ++p) acc = step(blk, p, acc);
        acc.store_aligned(result[r]);
    }
    O::store_half_sums4(result, n_rows, out);
}

template <class O>
constexpr bool has_block_pairs() {
    if constexpr (requires { O::kBlockPairs; }) {
        return O::kBlockPairs;
    } else {
        return false;
    }
}

// A score kernel's first choice for one pass of G queries over a chunk of rows: run(...) scores them and
// returns true, or returns false where its preconditions do not hold (then ScoreBlocks's generic
// kernels score them). NoFirst: none (the generic kernels only).
struct NoFirst {
    template <int G>
    static bool run(const uint8_t* const*, const uint8_t*, size_t, size_t, int64_t, float* const*) {
        return false;
    }
};

// q4_0 keys, four queries: two key blocks per register (score_group4_pairs), where Ops<A> has block pairs.
template <class A>
struct Q4_0Pairs {
    static_assert(has_block_pairs<Ops<A>>(), "Q4_0Pairs: a level whose Ops have block pairs (kBlockPairs)");
    template <int G>
    static bool run(const uint8_t* const* p, const uint8_t* rows, size_t row_stride, size_t n_rows, int64_t nb,
                    float* const* out) {
        if constexpr (G == 4) {
            if (nb % 2 == 0 && nb <= kMaxGroupBlocks) {
                if (nb == 4) score_group4_pairs<A, LayoutQ4_0, 4>(p, rows, row_stride, n_rows, nb, out);
                else score_group4_pairs<A, LayoutQ4_0, 0>(p, rows, row_stride, n_rows, nb, out);
                return true;
            }
        }
        return false;
    }
};

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// q8_0 keys with AVX512-VNNI: 16 rows per register for any number of queries, the arithmetic of the
// kernel on keys in groups (score_q8_0_groups16), so both layouts give the same bits. Rows16<BlockIQ4_NL>:
// the same kernel on iq4_nl keys.
template <class Block>
struct Rows16 {
    template <int G>
    static bool run(const uint8_t* const* p, const uint8_t* rows, size_t row_stride, size_t n_rows, int64_t nb,
                    float* const* out) {
        if (16 * row_stride >= (size_t{1} << 31)) return false;  // the scales' gather takes int32 offsets
        if (nb == 4) score_q8_0_rows16<4, G, Block>(p, rows, row_stride, n_rows, nb, out);
        else if (nb <= kMaxGroupBlocks) score_q8_0_rows16<0, G, Block>(p, rows, row_stride, n_rows, nb, out);
        else return false;
        return true;
    }
};
using Q8_0Rows16 = Rows16<detail::BlockQ8_0>;
#endif

// BlockKernels::score of layout L: rows in chunks, queries in groups of up to kScoreGroup; each pass tries
// First (above), then the generic kernels: score_group4 for four queries (the block loop unrolled for
// d = 128 where L is q8_0 or iq4_nl), score_group for fewer.
template <class A, class L, class First = NoFirst>
struct ScoreBlocks {
    template <int G>
    struct Pass {
        static void run(int i0, const uint8_t* prep, size_t prep_bytes, const uint8_t* rows, size_t row_stride,
                        size_t n_rows, int64_t nb, float* scores, size_t score_stride) {
            const uint8_t* p[G];
            float* out[G];
            for (int i = 0; i < G; ++i) {
                p[i] = prep + (i0 + i) * prep_bytes;
                out[i] = scores + (i0 + i) * score_stride;
            }
            if (First::template run<G>(p, rows, row_stride, n_rows, nb, out)) return;
            if constexpr (G == 4) {
                if constexpr (std::is_same_v<L, LayoutQ8_0> || std::is_same_v<L, LayoutIQ4_NL>) {  // an unrolled copy of the same kernel
                    if (nb == 4) return score_group4<A, L, 4>(p, rows, row_stride, n_rows, nb, out);
                }
                if (nb <= kMaxGroupBlocks) return score_group4<A, L>(p, rows, row_stride, n_rows, nb, out);
            }
            score_group<A, L, G>(p, rows, row_stride, n_rows, nb, out);
        }
    };
    static void score(const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows, size_t row_stride,
                      size_t n_rows, int64_t n, float* scores, size_t score_stride) {
        for (size_t r0 = 0; r0 < n_rows; r0 += kRowChunk) {
            const size_t rn = std::min(kRowChunk, n_rows - r0);
            for_query_groups<kScoreGroup, Pass>(n_q, prep, prep_bytes, rows + r0 * row_stride, row_stride, rn,
                                   n / kQK, scores + r0, score_stride);
        }
    }
};

}  // namespace
}  // namespace kvq::simd
