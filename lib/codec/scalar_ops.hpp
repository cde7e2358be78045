// Generic scalar score/accumulate/dequantize for block codecs, written once over a small "unpack"
// trait per layout. These loops are the specification the SIMD kernels are checked against.
#pragma once

#include <cstdint>
#include <cstring>

#include "blocks.hpp"
#include "half.hpp"

namespace kvq::detail {

// Layout traits provide: using Block; static constexpr bool has_min;
// static void unpack(const Block&, int8_t q[32]);  static float d(const Block&);  static float m(const Block&).

template <class L>
void dequantize_blocks(const uint8_t* src, float* y, int64_t n) {
    const auto* b = reinterpret_cast<const typename L::Block*>(src);
    int8_t q[kQK];
    for (int64_t i = 0; i < n / kQK; ++i) {
        L::unpack(b[i], q);
        const float d = L::d(b[i]);
        for (int j = 0; j < kQK; ++j) {
            if constexpr (L::has_min) {
                y[i * kQK + j] = q[j] * d + L::m(b[i]);
            } else {
                y[i * kQK + j] = q[j] * d;
            }
        }
    }
}

// Integer dot product per block against a BlockQ8Query, float sum across blocks.
template <class L>
float dot_q8_query(const typename L::Block* b, const BlockQ8Query* qb, int64_t nb) {
    int8_t q[kQK];
    float sum = 0.0f;
    for (int64_t i = 0; i < nb; ++i) {
        L::unpack(b[i], q);
        int32_t sumi = 0;
        for (int j = 0; j < kQK; ++j) sumi += int32_t(q[j]) * int32_t(qb[i].qs[j]);
        float block = L::d(b[i]) * qb[i].d * static_cast<float>(sumi);
        if constexpr (L::has_min) block += L::m(b[i]) * qb[i].s;
        sum += block;
    }
    return sum;
}

template <class L>
void score_blocks(const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                  size_t row_stride, size_t n_rows, int64_t n, float* scores, size_t score_stride) {
    for (size_t r = 0; r < n_rows; ++r) {
        const auto* b = reinterpret_cast<const typename L::Block*>(rows + r * row_stride);
        for (int i = 0; i < n_q; ++i) {
            const auto* qb = reinterpret_cast<const BlockQ8Query*>(prep + i * prep_bytes);
            scores[i * score_stride + r] = dot_q8_query<L>(b, qb, n / kQK);
        }
    }
}

template <class L>
void accumulate_blocks(const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                       size_t row_stride, size_t n_rows, int64_t n, float* acc) {
    int8_t q[kQK];
    for (size_t r = 0; r < n_rows; ++r) {
        const auto* b = reinterpret_cast<const typename L::Block*>(rows + r * row_stride);
        for (int64_t i = 0; i < n / kQK; ++i) {
            L::unpack(b[i], q);
            const float d = L::d(b[i]);
            float v[kQK];
            for (int j = 0; j < kQK; ++j) {
                if constexpr (L::has_min) {
                    v[j] = q[j] * d + L::m(b[i]);
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

// The query side of every quantized-key codec: int8 per block, float scale d = amax/127.
void prepare_query_q8(const float* q, uint8_t* prep, int64_t n);

}  // namespace kvq::detail
