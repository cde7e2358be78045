// Generic scalar score/accumulate/dequantize for block codecs, written once over a small "unpack"
// trait per layout. These loops are the specification the SIMD kernels are checked against.
#pragma once

#include <cstdint>
#include <cstring>

#include "blocks.hpp"
#include "half.hpp"
#include "kernels.hpp"
#include "weight_grid.hpp"

namespace kvq::detail {

// Rows are plain bytes at any address (a caller may stride rows by any byte count), so blocks are
// copied in and out with memcpy rather than read through a cast pointer, which would be undefined
// behaviour at an odd address; the compiler turns these copies into ordinary loads.
template <class T>
inline T load_block(const uint8_t* p) {
    T b;
    std::memcpy(&b, p, sizeof b);
    return b;
}
template <class T>
inline void store_block(uint8_t* p, const T& b) {
    std::memcpy(p, &b, sizeof b);
}

// Layout traits provide: using Block; static constexpr bool has_min;
// static void unpack(const Block&, int8_t q[32]);  static float d(const Block&);  static float m(const Block&).

template <class L>
void dequantize_blocks(const uint8_t* src, float* y, int64_t n) {
    using Block = typename L::Block;
    int8_t q[kQK];
    for (int64_t i = 0; i < n / kQK; ++i) {
        const auto b = load_block<Block>(src + i * sizeof(Block));
        L::unpack(b, q);
        const float d = L::d(b);
        for (int j = 0; j < kQK; ++j) {
            if constexpr (L::has_min) {
                y[i * kQK + j] = q[j] * d + L::m(b);
            } else {
                y[i * kQK + j] = q[j] * d;
            }
        }
    }
}

// Integer dot product per block against a BlockQ8Query, float sum across blocks.
template <class L>
float dot_q8_query(const uint8_t* row, const uint8_t* prep, int64_t nb) {
    using Block = typename L::Block;
    int8_t q[kQK];
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; ++i) {
        const auto b = load_block<Block>(row + i * sizeof(Block));
        const auto qb = load_block<BlockQ8Query>(prep + i * sizeof(BlockQ8Query));
        L::unpack(b, q);
        int32_t sumi = 0;
        for (int j = 0; j < kQK; ++j) sumi += int32_t(q[j]) * int32_t(qb.qs[j]);
        float block = L::d(b) * qb.d * static_cast<float>(sumi);
        if constexpr (L::has_min) block += L::m(b) * qb.s;
        sum += block;
    }
    return sum;
}

template <class L>
void score_blocks(const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                  size_t row_stride, size_t n_rows, int64_t n, float* scores, size_t score_stride) {
    for (size_t r = 0; r < n_rows; ++r) {
        for (int i = 0; i < n_q; ++i) {
            scores[i * score_stride + r] = dot_q8_query<L>(rows + r * row_stride, prep + i * prep_bytes, n / kQK);
        }
    }
}

template <class L>
void accumulate_blocks(const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                       size_t row_stride, size_t n_rows, int64_t n, float* acc) {
    using Block = typename L::Block;
    int8_t q[kQK];
    for (size_t r = 0; r < n_rows; ++r) {
        for (int64_t i = 0; i < n / kQK; ++i) {
            const auto b = load_block<Block>(rows + r * row_stride + i * sizeof(Block));
            L::unpack(b, q);
            const float d = L::d(b);
            float v[kQK];
            for (int j = 0; j < kQK; ++j) {
                if constexpr (L::has_min) {
                    v[j] = q[j] * d + L::m(b);
                } else {
                    v[j] = q[j] * d;
                }
            }
            for (int k = 0; k < n_q; ++k) {
                const float wk = w[k * w_stride + r];
                float* a = acc + k * n + i * kQK;
                for (int j = 0; j < kQK; ++j) a[j] += wk * v[j];
            }
        }
    }
}

// acc[i*n + j] += Σ_r ŵ(w[i*w_stride + r] · d_r) · q_r[j] for a symmetric layout (x = d·q), with ŵ the int8
// grid of weight_grid.hpp per query, block and group of kGridRows rows.
template <class L>
void accumulate_grid_blocks(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                            size_t n_rows, int64_t n, float* acc) {
    static_assert(!L::has_min);
    using Block = typename L::Block;
    int8_t q[kGridRows][kQK];
    float d[kGridRows], wd[kGridRows];
    for (size_t r0 = 0; r0 < n_rows; r0 += kGridRows) {
        const size_t rn = n_rows - r0 < kGridRows ? n_rows - r0 : kGridRows;
        for (int64_t t = 0; t < n / kQK; ++t) {
            for (size_t r = 0; r < rn; ++r) {
                const auto b = load_block<Block>(rows + (r0 + r) * row_stride + t * sizeof(Block));
                L::unpack(b, q[r]);
                d[r] = L::d(b);
            }
            for (int k = 0; k < n_q; ++k) {
                for (size_t r = 0; r < rn; ++r) wd[r] = w[k * w_stride + r0 + r] * d[r];
                round_to_grid(wd, rn, 1);
                float* a = acc + k * n + t * kQK;
                for (size_t r = 0; r < rn; ++r) {
                    for (int j = 0; j < kQK; ++j) a[j] += wd[r] * q[r][j];
                }
            }
        }
    }
}

}  // namespace kvq::detail
