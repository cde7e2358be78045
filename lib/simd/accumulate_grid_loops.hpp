// The loops shared by the integer accumulate_grid kernels (accumulate_grid_avx2.hpp, _vnni.hpp): queries
// four at a time, rows by grid group (lib/ref/weight_grid.hpp), blocks four at a time. Kernel::group<G>
// does one group of rn ≤ 16 rows, G ≤ 4 queries and nt ≤ 4 blocks from t0.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "../ref/blocks.hpp"
#include "../ref/weight_grid.hpp"

namespace kvq::simd {
namespace {

template <class Kernel, int G>
void grid_pass(const float* w, size_t w_stride, const uint8_t* rows, size_t row_stride, size_t n_rows, int64_t n,
               float* acc) {
    const int64_t nb = n / detail::kQK;
    for (size_t r0 = 0; r0 < n_rows; r0 += detail::kGridRows) {
        const size_t rn = std::min(detail::kGridRows, n_rows - r0);
        for (int64_t t0 = 0; t0 < nb; t0 += 4) {
            Kernel::template group<G>(w + r0, w_stride, rows + r0 * row_stride, row_stride, rn, t0,
                                      static_cast<int>(std::min<int64_t>(4, nb - t0)), n, acc);
        }
    }
}

// acc[i·n + j] += Σ_r ŵ(w[i·w_stride + r] · d) · q_r[j] for i < n_q, r < n_rows (n a multiple of 32).
template <class Kernel>
void accumulate_grid_groups(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                            size_t n_rows, int64_t n, float* acc) {
    for (int i0 = 0; i0 < n_q; i0 += 4) {
        const float* wq = w + static_cast<size_t>(i0) * w_stride;
        float* aq = acc + static_cast<size_t>(i0) * n;
        switch (std::min(4, n_q - i0)) {
            case 4: grid_pass<Kernel, 4>(wq, w_stride, rows, row_stride, n_rows, n, aq); break;
            case 3: grid_pass<Kernel, 3>(wq, w_stride, rows, row_stride, n_rows, n, aq); break;
            case 2: grid_pass<Kernel, 2>(wq, w_stride, rows, row_stride, n_rows, n, aq); break;
            default: grid_pass<Kernel, 1>(wq, w_stride, rows, row_stride, n_rows, n, aq); break;
        }
    }
}

}  // namespace
}  // namespace kvq::simd
