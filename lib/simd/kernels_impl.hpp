// The SIMD kernels of every block codec, written once over the xsimd arch A and Ops<A> (ops.hpp). This
// file and the *_impl.hpp headers it includes provide kernels; they choose none. Each level's file
// (lib/simd/level_<isa>.cpp, compiled with that instruction set's flags only) includes its ops_<isa>.hpp,
// this file and the ISA-specific kernel headers it uses, and lists its kernels one line per (codec, op):
// the level files are the one place that says which kernel runs (docs/simd.md, "Which kernel runs").
// Equal to the scalar specification (lib/ref/) in bytes for quantize and dequantize, and to float
// rounding for score and accumulate (lanes are summed in another order and with fma).
//
// Layouts: layouts_impl.hpp; score: score_impl.hpp; quantize: quantize_impl.hpp; plain codecs:
// plain_impl.hpp; the online softmax: softmax_impl.hpp. Here: the generic accumulate kernels.
// accumulate: acc += w·row with the accumulators of one 32-column tile and a few queries held in
// registers over a chunk of rows; rows are dequantized in registers, never into a buffer.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstring>
#include <type_traits>

#include "../ref/row_codecs.hpp"
#include "../ref/weight_grid.hpp"
#include "plain_impl.hpp"
#include "loops.hpp"
#include "ops_check.hpp"
#include "quantize_impl.hpp"
#include "score_impl.hpp"
#include "softmax_impl.hpp"

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

// The generic accumulate kernels, with BlockKernels::accumulate's signature. Layouts with a minimum
// (x = d·q + m): tiles dequantized in registers. Symmetric layouts: the block scale folded into the
// weights (AccumulateScaled). accumulate_scaled_grid: the same on weights rounded to the int8 grid
// (BlockKernels::accumulate_grid, lib/ref/weight_grid.hpp).
template <class A, class L>
void accumulate_tiles(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                      size_t n_rows, int64_t n, float* acc) {
    AccumulateTiles<A, BlockTile<A, L>>::run(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
}
template <class A, class L>
void accumulate_scaled(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                       size_t n_rows, int64_t n, float* acc) {
    static_assert(!L::has_min, "accumulate_scaled: symmetric layouts (x = d·q) only; accumulate_tiles for the others");
    AccumulateScaled<A, L>::run(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
}
template <class A, class L>
void accumulate_scaled_grid(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                            size_t n_rows, int64_t n, float* acc) {
    static_assert(!L::has_min, "accumulate_scaled_grid: symmetric layouts (x = d·q) only");
    AccumulateScaled<A, L, true>::run(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
}

}  // namespace
}  // namespace kvq::simd
