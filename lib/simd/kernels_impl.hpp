// The SIMD kernels of every block codec, written once over the xsimd arch A and Ops<A> (ops.hpp); each
// lib/simd/level_<isa>.cpp includes its ops_<isa>.hpp and this file and calls make_level<A>(), compiled
// with that instruction set's flags only. Equal to the scalar specification (lib/ref/) in bytes for
// quantize and dequantize, and to float rounding for score and accumulate (lanes are summed in another
// order and with fma).
//
// Layouts: layouts_impl.hpp; score: score_impl.hpp; quantize: quantize_impl.hpp; plain codecs:
// plain_impl.hpp; the online softmax: softmax_impl.hpp. Here: accumulate, and the level's table.
// accumulate: acc += w·row with the accumulators of one 32-column tile and a few queries held in
// registers over a chunk of rows; rows are dequantized in registers, never into a buffer.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>

#include "../ref/block_codecs.hpp"
#include "../ref/weight_grid.hpp"
#include "plain_impl.hpp"
#include "loops.hpp"
#include "ops_check.hpp"
#include "quantize_impl.hpp"
#include "score_impl.hpp"
#include "softmax_impl.hpp"
#if defined(__AVX512F__)
#include "accumulate_avx512.hpp"
#elif defined(__AVX2__)
#include "accumulate_avx2.hpp"
#endif
#if defined(__AVX512VNNI__)
#include "accumulate_grid_vnni.hpp"
#elif defined(__AVX2__)
#include "accumulate_grid_avx2.hpp"
#endif

namespace kvq::simd {
namespace {

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
                v[k] = fmadd(v[k], d, F(offset_of<O, L>(b)));
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
// (row, block), and the tile loop only widens codes and issues fmas (4 queries × 2 registers). Grid: the
// folded weights are rounded to the int8 grid first (accumulate_grid, lib/ref/weight_grid.hpp).
template <class A, class L, bool Grid = false>
struct AccumulateScaled {
    static_assert(kRowChunk % detail::kGridRows == 0, "a chunk holds whole grid groups");
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
                if constexpr (Grid) detail::round_to_grid(wd, n_rows, G);
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

// accumulate_grid (q4_0): the integer kernel where the level has AVX512-VNNI (vpdpbusd) or AVX2
// (vpmaddubsw), else the float one on rounded weights.
template <class A, class L>
void accumulate_grid_blocks(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                            size_t n_rows, int64_t n, float* acc) {
#if defined(__AVX512VNNI__)
    if constexpr (std::is_same_v<L, LayoutQ4_0>) {
        return accumulate_grid_q4_0_vnni(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
    }
#elif defined(__AVX2__)
    if constexpr (std::is_same_v<L, LayoutQ4_0>) {
        return accumulate_grid_q4_0_avx2(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
    }
#endif
    AccumulateScaled<A, L, true>::run(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
}

template <class A, class L>
detail::BlockKernels block_kernels(void (*quantize)(const float*, uint8_t*, int64_t)) {
    return {quantize, dequantize_blocks<A, L>, prepare_query_q8<A>, ScoreBlocks<A, L>::score,
            accumulate_blocks<A, L>, std::is_same_v<L, LayoutQ4_0> ? accumulate_grid_blocks<A, L> : nullptr};
}

template <class A>
detail::LevelKernels make_level() {
    using detail::BlockCodec;
    detail::LevelKernels k{};
    k.codec[int(BlockCodec::f32)] = plain_kernels<A, PlainF32>();
    k.codec[int(BlockCodec::f16)] = plain_kernels<A, PlainF16>();
    k.codec[int(BlockCodec::bf16)] = plain_kernels<A, PlainBF16>();
    k.codec[int(BlockCodec::q8_0)] = block_kernels<A, LayoutQ8_0>(quantize_q8_0<A>);
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    if constexpr (std::is_same_v<A, xsimd::avx512bw>) k.codec[int(BlockCodec::q8_0)].score_groups = score_q8_0_groups;
#endif
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
