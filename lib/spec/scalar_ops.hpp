// Generic scalar score/accumulate/dequantize for block codecs, written once over a small "unpack"
// trait per layout. These loops are the specification the SIMD kernels are checked against.
#pragma once

#include <cstdint>
#include <cstring>

#include "blocks.hpp"
#include "half.hpp"
#include "kernels.hpp"

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

}  // namespace kvq::detail
