// The SIMD kernels of every block codec, written once over the xsimd arch A and Ops<A> (ops.hpp); each
// lib/simd/level_<isa>.cpp includes its ops_<isa>.hpp and this file and calls make_level<A>(), compiled
// with that instruction set's flags only. Equal to the scalar specification (lib/spec/) in bytes for
// quantize and dequantize, and to float rounding for score and accumulate (lanes are summed in another
// order and with fma).
//
// score: the g queries of a GQA group go through each key row together; rows are taken in chunks that
// stay in cache while several query groups pass over them. Quantized keys are scored as ggml does: an
// integer dot product per 32-value block against the int8 query, then one fma per block in fp32.
// accumulate: acc += w·row with the accumulators of one 32-column tile and a few queries held in
// registers over a chunk of rows; rows are dequantized in registers, never into a buffer.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>

#include "../spec/block_codecs.hpp"
#include "plain_impl.hpp"
#include "loops.hpp"
#include "ops_check.hpp"
#include "quantize_impl.hpp"
#include "softmax_impl.hpp"
#if defined(__AVX512F__)
#include "accumulate_avx512.hpp"
#elif defined(__AVX2__)
#include "accumulate_avx2.hpp"
#endif

namespace kvq::simd {
namespace {

using detail::BlockQ8Query;

// Layouts: the block's values as signed int8 Bytes, and its scale and offset.
// The nibble layouts also give their codes before the offset (raw, 0..31) and the per-block term that
// the offset or the minimum adds to a dot product: x = d·(raw − off) or x = d·raw + m, so
// q·x = d·dq·Σ raw·y + bias·kBiasScale·s with bias·kBiasScale = −off·d or m and s = dq·Σy
// (BlockQ8Query::s).
struct LayoutQ8_0 {
    using Block = detail::BlockQ8_0;
    static constexpr bool has_min = false, unsigned_raw = false;
    template <class O>
    static auto bytes(const Block& b) { return O::load_q8(b.qs); }
    template <class O>
    static auto raw(const Block& b) { return bytes<O>(b); }
};
struct LayoutQ4_0 {
    using Block = detail::BlockQ4_0;
    static constexpr bool has_min = false, unsigned_raw = true;
    template <class O>
    static auto raw(const Block& b) { return O::load_nibbles(b.qs); }
    template <class O>
    static auto bytes(const Block& b) { return O::sub(raw<O>(b), 8); }
    static constexpr float kBiasScale = -8.0f;
    template <class O>
    static float bias(const Block&, float d) { return d; }
};
struct LayoutQ4_1 {
    using Block = detail::BlockQ4_1;
    static constexpr bool has_min = true, unsigned_raw = true;
    template <class O>
    static auto raw(const Block& b) { return O::load_nibbles(b.qs); }
    template <class O>
    static auto bytes(const Block& b) { return raw<O>(b); }
    static constexpr float kBiasScale = 1.0f;
    template <class O>
    static float bias(const Block& b, float) { return O::f16_value(b.m); }
};
struct LayoutQ5_0 {
    using Block = detail::BlockQ5_0;
    static constexpr bool has_min = false, unsigned_raw = true;
    template <class O>
    static auto raw(const Block& b) { return O::add_high_bits(O::load_nibbles(b.qs), b.qh); }
    template <class O>
    static auto bytes(const Block& b) { return O::sub(raw<O>(b), 16); }
    static constexpr float kBiasScale = -16.0f;
    template <class O>
    static float bias(const Block&, float d) { return d; }
};
struct LayoutQ5_1 {
    using Block = detail::BlockQ5_1;
    static constexpr bool has_min = true, unsigned_raw = true;
    template <class O>
    static auto raw(const Block& b) { return O::add_high_bits(O::load_nibbles(b.qs), b.qh); }
    template <class O>
    static auto bytes(const Block& b) { return raw<O>(b); }
    static constexpr float kBiasScale = 1.0f;
    template <class O>
    static float bias(const Block& b, float) { return O::f16_value(b.m); }
};

template <class O, class L>
float offset_of(const typename L::Block& b) {
    if constexpr (L::has_min) {
        return O::f16_value(b.m);
    } else {
        return 0.0f;
    }
}

// The 32 values of a block as floats: q·d (+ m), the specification's operations.
template <class A, class L>
void dequantize_block(const typename L::Block& b, xsimd::batch<float, A>* v) {
    using O = Ops<A>;
    using F = typename O::F;
    O::widen(L::template bytes<O>(b), v);
    const F d(O::f16_value(b.d));
    for (int k = 0; k < kPerBlock<A>; ++k) {
        if constexpr (L::has_min) {
            v[k] = v[k] * d + F(offset_of<O, L>(b));
        } else {
            v[k] = v[k] * d;
        }
    }
}

template <class A, class L>
void dequantize_blocks(const uint8_t* src, float* y, int64_t n) {
    const auto* b = reinterpret_cast<const typename L::Block*>(src);
    for (int64_t i = 0; i < n / kQK; ++i) {
        xsimd::batch<float, A> v[kPerBlock<A>];
        dequantize_block<A, L>(b[i], v);
        for (int k = 0; k < kPerBlock<A>; ++k) v[k].store_unaligned(y + i * kQK + k * kLanes<A>);
    }
}

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
                acc[i] = xsimd::fma(O::dot(key, q.qs), FD(dk * q.d), acc[i]);
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
    // VNNI, signed keys: the part of each block's sums that the unsigned key adds (ops_avx2.hpp)
    constexpr bool vnni = requires { O::kVnni; };
    typename O::IDot offset[vnni ? kMaxGroupBlocks : 1];
    if constexpr (vnni) {
        if constexpr (!L::unsigned_raw) {
            for (int64_t b = 0; b < nb; ++b) {
                const int8_t* y[4] = {q[0][b].qs, q[1][b].qs, q[2][b].qs, q[3][b].qs};
                offset[b] = O::dot4_signed_offset(O::zero_bytes(), y);
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
            bias = xsimd::fma(FD(L::template bias<O>(blk[b], dk)), FD::load_aligned(sq[b]), bias);
        } else if constexpr (requires { O::kVnni; }) {
            p = O::idot_sub(O::dot4_signed_offset(L::template raw<O>(blk[b]), y), offset[b]);
        } else {
            p = O::dot4_signed(O::key(L::template raw<O>(blk[b])), y);
        }
        acc = xsimd::fma(O::dot_to_f32(p), FD(dk) * FD::load_aligned(dq[b]), acc);
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
        return xsimd::fma(O::f16_pair(blk[2 * p].d, blk[2 * p + 1].d),
                          xsimd::fma(s, FD::load_aligned(dq[p]), FD::load_aligned(sq[p])), acc);
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

template <class A, class L>
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
            if constexpr (G == 4) {
                if constexpr (std::is_same_v<L, LayoutQ4_0> && has_block_pairs<Ops<A>>()) {
                    if (nb % 2 == 0 && nb <= kMaxGroupBlocks) {
                        if (nb == 4) return score_group4_pairs<A, L, 4>(p, rows, row_stride, n_rows, nb, out);
                        return score_group4_pairs<A, L, 0>(p, rows, row_stride, n_rows, nb, out);
                    }
                }
                if constexpr (std::is_same_v<L, LayoutQ8_0>) {
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

// Part p of block t of a row, dequantized in registers (with fma: accumulate needs float rounding only).
template <class A, class L>
struct BlockTile {
    static void load(const uint8_t* row, int64_t t, int p, xsimd::batch<float, A>* v) {
        using O = Ops<A>;
        using F = typename O::F;
        const auto& b = reinterpret_cast<const typename L::Block*>(row)[t];
        O::widen_pair(L::template bytes<O>(b), p, v);
        const F d(O::f16_value(b.d));
        for (int k = 0; k < 2; ++k) {
            if constexpr (L::has_min) {
                v[k] = xsimd::fma(v[k], d, F(offset_of<O, L>(b)));
            } else {
                v[k] = v[k] * d;
            }
        }
    }
};

// Part p of block t of a row as its signed codes q (x = d·q), unscaled: symmetric layouts only.
template <class A, class L>
struct CodeTile {
    static void load(const uint8_t* row, int64_t t, int p, xsimd::batch<float, A>* v) {
        using O = Ops<A>;
        const auto& b = reinterpret_cast<const typename L::Block*>(row)[t];
        O::widen_pair(L::template bytes<O>(b), p, v);
    }
};

// Symmetric layouts (x = d·q): w·x = (w·d)·q, so each block's scale folds into the weights once per
// (row, block), and the tile loop only widens codes and issues fmas (4 queries × 2 registers).
template <class A, class L>
struct AccumulateScaled {
    template <int G>
    struct Pass {
        static void run(int i0, const float* w, size_t w_stride, const uint8_t* rows, size_t row_stride,
                        size_t n_rows, int64_t n, float* acc) {
            using O = Ops<A>;
            float wt[kRowChunk * G], wd[kRowChunk * G];
            float* ap[G];
            for (int i = 0; i < G; ++i) {
                ap[i] = acc + (i0 + i) * n;
                for (size_t r = 0; r < n_rows; ++r) wt[r * G + i] = w[(i0 + i) * w_stride + r];
            }
            for (int64_t t = 0; t < n / kQK; ++t) {
                for (size_t r = 0; r < n_rows; ++r) {
                    const float d = O::f16_value(reinterpret_cast<const typename L::Block*>(rows + r * row_stride)[t].d);
                    for (int i = 0; i < G; ++i) wd[r * G + i] = wt[r * G + i] * d;
                }
                for (int p = 0; p < kTilesPerBlock<A>; ++p)
                    accumulate_tile<A, CodeTile<A, L>, G>(wd, rows, row_stride, n_rows, t, p, ap);
            }
        }
    };
    static void run(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                    size_t n_rows, int64_t n, float* acc) {
        for (size_t r0 = 0; r0 < n_rows; r0 += kRowChunk) {
            const size_t rn = std::min(kRowChunk, n_rows - r0);
            for_query_groups<4, Pass>(n_q, w + r0, w_stride, rows + r0 * row_stride, row_stride, rn, n, acc);
        }
    }
};

template <class A, class L>
void accumulate_blocks(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                       size_t n_rows, int64_t n, float* acc) {
#if defined(__AVX512F__)
    // By capability, not by level: a level compiled with AVX-512 F takes the 512-bit kernel (the same bits
    // as the 256-bit one), any other compiled with AVX2 the 256-bit one.
    if constexpr (std::is_same_v<L, LayoutQ4_0>) {
        return accumulate_sym_avx512<detail::BlockQ4_0>(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
    } else if constexpr (std::is_same_v<L, LayoutQ8_0>) {
        return accumulate_sym_avx512<detail::BlockQ8_0>(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same_v<L, LayoutQ4_0>) {
        return accumulate_sym_avx2<detail::BlockQ4_0, CodesQ4_0>(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
    } else if constexpr (std::is_same_v<L, LayoutQ8_0>) {
        return accumulate_sym_avx2<detail::BlockQ8_0, CodesQ8_0>(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
    }
#endif
    if constexpr (L::has_min) {
        AccumulateTiles<A, BlockTile<A, L>>::run(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
    } else {
        AccumulateScaled<A, L>::run(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
    }
}

template <class A, class L>
detail::BlockKernels block_kernels(void (*quantize)(const float*, uint8_t*, int64_t)) {
    return {quantize, dequantize_blocks<A, L>, prepare_query_q8<A>, ScoreBlocks<A, L>::score,
            accumulate_blocks<A, L>};
}

template <class A>
detail::LevelKernels make_level() {
    using detail::BlockCodec;
    detail::LevelKernels k{};
    k.codec[int(BlockCodec::f32)] = plain_kernels<A, PlainF32>();
    k.codec[int(BlockCodec::f16)] = plain_kernels<A, PlainF16>();
    k.codec[int(BlockCodec::bf16)] = plain_kernels<A, PlainBF16>();
    k.codec[int(BlockCodec::q8_0)] = block_kernels<A, LayoutQ8_0>(quantize_q8_0<A>);
    k.codec[int(BlockCodec::q4_0)] = block_kernels<A, LayoutQ4_0>(quantize_sym<A, 4>);
    k.codec[int(BlockCodec::q4_1)] = block_kernels<A, LayoutQ4_1>(quantize_asym<A, 4>);
    k.codec[int(BlockCodec::q5_0)] = block_kernels<A, LayoutQ5_0>(quantize_sym<A, 5>);
    k.codec[int(BlockCodec::q5_1)] = block_kernels<A, LayoutQ5_1>(quantize_asym<A, 5>);
    k.all_finite = all_finite<A>;
    k.finite_max_abs = finite_max_abs<A>;
    k.softmax = softmax_update_lanes;
    k.check_ops = check_ops<A>;
    return k;
}

}  // namespace
}  // namespace kvq::simd
