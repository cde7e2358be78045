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

// Queries whose accumulators for one 32-column tile fit in registers next to the tile itself.
template <class A>
constexpr int kAccumulateGroup = std::max(1, 8 / kPerBlock<A>);

// acc[i][tile t] += w[i][r] · tile t of row r for the rows of one chunk and queries i0..i0+G, with the
// accumulators in registers. Tile::load(row, t, v) puts the tile's 32 values in v.
template <class A, class Tile, int G>
void accumulate_tile(const float* const* w, const uint8_t* rows, size_t row_stride, size_t n_rows, int64_t t,
                     float* const* acc) {
    using F = xsimd::batch<float, A>;
    constexpr int K = kPerBlock<A>;
    F a[G][K];
    for (int i = 0; i < G; ++i)
        for (int k = 0; k < K; ++k) a[i][k] = F::load_unaligned(acc[i] + t * kQK + k * kLanes<A>);
    for (size_t r = 0; r < n_rows; ++r) {
        F v[K];
        Tile::load(rows + r * row_stride, t, v);
        for (int i = 0; i < G; ++i) {
            const F wi(w[i][r]);
            for (int k = 0; k < K; ++k) a[i][k] = xsimd::fma(wi, v[k], a[i][k]);
        }
    }
    for (int i = 0; i < G; ++i)
        for (int k = 0; k < K; ++k) a[i][k].store_unaligned(acc[i] + t * kQK + k * kLanes<A>);
}

template <class A, class Tile>
struct AccumulateTiles {
    template <int G>
    struct Pass {
        static void run(int i0, const float* w, size_t w_stride, const uint8_t* rows, size_t row_stride,
                        size_t n_rows, int64_t n, int64_t t, float* acc) {
            const float* wp[G];
            float* ap[G];
            for (int i = 0; i < G; ++i) {
                wp[i] = w + (i0 + i) * w_stride;
                ap[i] = acc + (i0 + i) * n;
            }
            accumulate_tile<A, Tile, G>(wp, rows, row_stride, n_rows, t, ap);
        }
    };
    // Full 32-column tiles only; the caller handles columns past n / 32 * 32.
    static void run(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                    size_t n_rows, int64_t n, float* acc) {
        for (size_t r0 = 0; r0 < n_rows; r0 += kRowChunk) {
            const size_t rn = std::min(kRowChunk, n_rows - r0);
            for (int64_t t = 0; t < n / kQK; ++t) {
                for_query_groups<kAccumulateGroup<A>, Pass>(n_q, w + r0, w_stride, rows + r0 * row_stride,
                                       row_stride, rn, n, t, acc);
            }
        }
    }
};

}  // namespace
}  // namespace kvq::simd
