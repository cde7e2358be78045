// The loop structure shared by the plain and the block kernels: rows in cache-sized chunks, queries in
// groups whose accumulators fit in registers, accumulation over 32-column tiles.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "quantize_impl.hpp"

namespace kvq::simd {
namespace {

inline constexpr size_t kRowChunk = 64;  // rows kept in cache while query groups pass over them
inline constexpr int kScoreGroup = 4;    // queries scored together in registers

// Calls Pass<g>::run(i0, args...) for each group of up to MaxG (<= 4) queries i0..i0+g.
template <int MaxG, template <int> class Pass, class... Args>
void for_query_groups(int n_q, Args&&... args) {
    static_assert(MaxG >= 1 && MaxG <= 4);
    for (int i0 = 0; i0 < n_q; i0 += MaxG) {
        const int g = std::min(MaxG, n_q - i0);
        if constexpr (MaxG >= 4) {
            if (g == 4) { Pass<4>::run(i0, args...); continue; }
        }
        if constexpr (MaxG >= 3) {
            if (g == 3) { Pass<3>::run(i0, args...); continue; }
        }
        if constexpr (MaxG >= 2) {
            if (g == 2) { Pass<2>::run(i0, args...); continue; }
        }
        Pass<1>::run(i0, args...);
    }
}

// accumulate works on tiles of two registers (16 columns with AVX2, 32 with AVX-512, 8 with 4 lanes), so
// that the accumulators of four queries (eight registers) stay in registers next to the tile.
template <class A>
constexpr int kTileValues = 2 * kLanes<A>;
template <class A>
constexpr int kTilesPerBlock = kQK / kTileValues<A>;

// acc[i][part p of block t] += w[r][i] · (that part of row r), for the rows of one chunk and G queries,
// with the accumulators in registers. wt holds the chunk's weights row by row (G per row), so one pointer
// reaches them all. Tile::load(row, t, p, v) puts the part's values in v[0..2).
template <class A, class Tile, int G>
void accumulate_tile(const float* wt, const uint8_t* rows, size_t row_stride, size_t n_rows, int64_t t, int p,
                     float* const* acc) {
    using F = xsimd::batch<float, A>;
    const int64_t col = t * kQK + p * kTileValues<A>;
    F a[G][2];
    for (int i = 0; i < G; ++i)
        for (int k = 0; k < 2; ++k) a[i][k] = F::load_unaligned(acc[i] + col + k * kLanes<A>);
    for (size_t r = 0; r < n_rows; ++r) {
        F v[2];
        Tile::load(rows + r * row_stride, t, p, v);
        for (int i = 0; i < G; ++i) {
            const F wi(wt[r * G + i]);
            a[i][0] = fmadd(wi, v[0], a[i][0]);
            a[i][1] = fmadd(wi, v[1], a[i][1]);
        }
    }
    for (int i = 0; i < G; ++i)
        for (int k = 0; k < 2; ++k) a[i][k].store_unaligned(acc[i] + col + k * kLanes<A>);
}

template <class A, class Tile>
struct AccumulateTiles {
    template <int G>
    struct Pass {
        static void run(int i0, const float* w, size_t w_stride, const uint8_t* rows, size_t row_stride,
                        size_t n_rows, int64_t n, float* acc) {
            float wt[kRowChunk * G];
            float* ap[G];
            for (int i = 0; i < G; ++i) {
                ap[i] = acc + (i0 + i) * n;
                for (size_t r = 0; r < n_rows; ++r) wt[r * G + i] = w[(i0 + i) * w_stride + r];
            }
            for (int64_t t = 0; t < n / kQK; ++t) {
                for (int p = 0; p < kTilesPerBlock<A>; ++p) accumulate_tile<A, Tile, G>(wt, rows, row_stride, n_rows, t, p, ap);
            }
        }
    };
    // Full 32-column blocks only; the caller handles columns past n / 32 * 32.
    static void run(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                    size_t n_rows, int64_t n, float* acc) {
        for (size_t r0 = 0; r0 < n_rows; r0 += kRowChunk) {
            const size_t rn = std::min(kRowChunk, n_rows - r0);
            for_query_groups<4, Pass>(n_q, w + r0, w_stride, rows + r0 * row_stride, row_stride, rn, n, acc);
        }
    }
};

}  // namespace
}  // namespace kvq::simd
