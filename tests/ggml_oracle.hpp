// An independent oracle for the ggml layouts: ggml's reference quantizers (ggml-quants.c,
// quantize_row_*_ref) transcribed line for line in C style, deliberately not sharing code with
// lib/codec. It is itself checked against ggml's own bytes in tests/data before it is trusted on
// random rows. fp16 rounding comes from the F16C-equivalent conversion in lib/ref/half.hpp, which
// the f16 oracle file checks separately.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "ref/half.hpp"

namespace kvq::test::ggml {

#define GGML_MIN(a, b) ((a) < (b) ? (a) : (b))
#define GGML_MAX(a, b) ((a) > (b) ? (a) : (b))
inline uint16_t fp16(float f) { return kvq::detail::f32_to_f16(f); }

inline void quantize_row_q8_0_ref(const float* x, uint8_t* out, int64_t k) {
    const int qk = 32;
    for (int i = 0; i < k / qk; i++) {
        float amax = 0.0f;
        for (int j = 0; j < qk; j++) amax = GGML_MAX(amax, fabsf(x[i * qk + j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t* y = out + i * 34;
        const uint16_t dh = fp16(d);
        memcpy(y, &dh, 2);
        for (int j = 0; j < qk; ++j) {
            const float x0 = x[i * qk + j] * id;
            y[2 + j] = (uint8_t)(int8_t)roundf(x0);
        }
    }
}

inline void quantize_row_q4_0_ref(const float* x, uint8_t* out, int64_t k) {
    const int qk = 32;
    for (int i = 0; i < k / qk; i++) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < qk; j++) {
            const float v = x[i * qk + j];
            if (amax < fabsf(v)) { amax = fabsf(v); max = v; }
        }
        const float d = max / -8;
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t* y = out + i * 18;
        const uint16_t dh = fp16(d);
        memcpy(y, &dh, 2);
        for (int j = 0; j < qk / 2; ++j) {
            const float x0 = x[i * qk + 0 + j] * id;
            const float x1 = x[i * qk + qk / 2 + j] * id;
            const uint8_t xi0 = GGML_MIN(15, (int8_t)(x0 + 8.5f));
            const uint8_t xi1 = GGML_MIN(15, (int8_t)(x1 + 8.5f));
            y[2 + j] = xi0 | (xi1 << 4);
        }
    }
}

inline void quantize_row_q4_1_ref(const float* x, uint8_t* out, int64_t k) {
    const int qk = 32;
    for (int i = 0; i < k / qk; i++) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < qk; j++) {
            const float v = x[i * qk + j];
            if (v < min) min = v;
            if (v > max) max = v;
        }
        const float d = (max - min) / ((1 << 4) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t* y = out + i * 20;
        const uint16_t dh = fp16(d), mh = fp16(min);
        memcpy(y, &dh, 2);
        memcpy(y + 2, &mh, 2);
        for (int j = 0; j < qk / 2; ++j) {
            const float x0 = (x[i * qk + 0 + j] - min) * id;
            const float x1 = (x[i * qk + qk / 2 + j] - min) * id;
            const uint8_t xi0 = GGML_MIN(15, (int8_t)(x0 + 0.5f));
            const uint8_t xi1 = GGML_MIN(15, (int8_t)(x1 + 0.5f));
            y[4 + j] = xi0 | (xi1 << 4);
        }
    }
}

inline void quantize_row_q5_0_ref(const float* x, uint8_t* out, int64_t k) {
    const int qk = 32;
    for (int i = 0; i < k / qk; i++) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < qk; j++) {
            const float v = x[i * qk + j];
            if (amax < fabsf(v)) { amax = fabsf(v); max = v; }
        }
        const float d = max / -16;
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t* y = out + i * 22;
        const uint16_t dh = fp16(d);
        memcpy(y, &dh, 2);
        uint32_t qh = 0;
        for (int j = 0; j < qk / 2; ++j) {
            const float x0 = x[i * qk + 0 + j] * id;
            const float x1 = x[i * qk + qk / 2 + j] * id;
            const uint8_t xi0 = GGML_MIN(31, (int8_t)(x0 + 16.5f));
            const uint8_t xi1 = GGML_MIN(31, (int8_t)(x1 + 16.5f));
            y[6 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
            qh |= ((xi1 & 0x10u) >> 4) << (j + qk / 2);
        }
        memcpy(y + 2, &qh, sizeof(qh));
    }
}

inline void quantize_row_q5_1_ref(const float* x, uint8_t* out, int64_t k) {
    const int qk = 32;
    for (int i = 0; i < k / qk; i++) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < qk; j++) {
            const float v = x[i * qk + j];
            if (v < min) min = v;
            if (v > max) max = v;
        }
        const float d = (max - min) / ((1 << 5) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t* y = out + i * 24;
        const uint16_t dh = fp16(d), mh = fp16(min);
        memcpy(y, &dh, 2);
        memcpy(y + 2, &mh, 2);
        uint32_t qh = 0;
        for (int j = 0; j < qk / 2; ++j) {
            const float x0 = (x[i * qk + 0 + j] - min) * id;
            const float x1 = (x[i * qk + qk / 2 + j] - min) * id;
            const uint8_t xi0 = (uint8_t)(x0 + 0.5f);
            const uint8_t xi1 = (uint8_t)(x1 + 0.5f);
            y[8 + j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= ((xi0 & 0x10u) >> 4) << (j + 0);
            qh |= ((xi1 & 0x10u) >> 4) << (j + qk / 2);
        }
        memcpy(y + 4, &qh, sizeof(qh));
    }
}

// ggml's quantize_row_iq4_nl_ref: quantize_row_iq4_nl_impl(32, 32, ..., quant_weights = NULL, ntry = -1),
// with its helpers best_index_int8 and GROUP_MAX_EPS. One difference, on purpose: a block below the eps
// gets zero codes; ggml leaves its code buffer as it was (uninitialized at a row's first block), so
// those codes are indeterminate in ggml's own bytes and only its d = 0 is compared (see the tests).
inline int best_index_int8(int n, const int8_t* val, float x) {
    if (x <= val[0]) return 0;
    if (x >= val[n - 1]) return n - 1;
    int ml = 0, mu = n - 1;
    while (mu - ml > 1) {
        int mav = (ml + mu) / 2;
        if (x < val[mav]) mu = mav;
        else ml = mav;
    }
    return x - val[mu - 1] < val[mu] - x ? mu - 1 : mu;
}

inline void quantize_row_iq4_nl_ref(const float* x, uint8_t* out, int64_t k) {
    static const int8_t values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    const int qk = 32;
    for (int ib = 0; ib < k / qk; ++ib) {
        const float* xb = x + ib * qk;
        uint8_t* y = out + ib * 18;
        uint8_t L[32] = {0};
        float weight[32];
        for (int j = 0; j < qk; ++j) weight[j] = xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < qk; ++j) {
            float ax = fabsf(xb[j]);
            if (ax > amax) { amax = ax; max = xb[j]; }
        }
        float scale = 0;
        if (!(amax < 1e-15f)) {
            float d = max / values[0];
            float id = 1 / d;
            float sumqx = 0, sumq2 = 0;
            for (int j = 0; j < qk; ++j) {
                float al = id * xb[j];
                int l = best_index_int8(16, values, al);
                L[j] = l;
                float q = values[l];
                float w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            scale = sumqx / sumq2;
        }
        const uint16_t dh = fp16(scale);
        memcpy(y, &dh, 2);
        for (int j = 0; j < 16; ++j) y[2 + j] = L[j] | (L[16 + j] << 4);
    }
}

// ggml's whole-tensor iq4_nl quantizer without an importance matrix, quantize_iq4_nl(..., quant_weights =
// NULL): quantize_row_iq4_nl_impl(32, 32, ..., ntry = 7) per block, transcribed from ggml 0.25.3
// (ggml-quants.c) with the branches a 32-value block without weights takes. kvq's iq4_nls. Unlike the
// reference quantizer above, every code is determined: the codes are picked again at the final scale
// (all 8 for a block below the eps, whose scale is 0).
inline void quantize_iq4_nl(const float* x, uint8_t* out, int64_t k) {
    static const int8_t values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    const int qk = 32, ntry = 7;
    for (int ib = 0; ib < k / qk; ++ib) {
        const float* xb = x + ib * qk;
        uint8_t* y = out + ib * 18;
        uint8_t L[32];
        float weight[32];
        for (int j = 0; j < qk; ++j) weight[j] = xb[j] * xb[j];
        float amax = 0, max = 0;
        for (int j = 0; j < qk; ++j) {
            float ax = fabsf(xb[j]);
            if (ax > amax) { amax = ax; max = xb[j]; }
        }
        float scale = 0;
        if (!(amax < 1e-15f)) {
            float d = ntry > 0 ? -max / values[0] : max / values[0];
            float id = 1 / d;
            float sumqx = 0, sumq2 = 0;
            for (int j = 0; j < qk; ++j) {
                float al = id * xb[j];
                int l = best_index_int8(16, values, al);
                L[j] = l;
                float q = values[l];
                float w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            d = sumq2 > 0 ? sumqx / sumq2 : 0.f;
            float best = d * sumqx;
            for (int itry = -ntry; itry <= ntry; ++itry) {
                id = (itry + values[0]) / max;
                sumqx = sumq2 = 0;
                for (int j = 0; j < qk; ++j) {
                    float al = id * xb[j];
                    int l = best_index_int8(16, values, al);
                    float q = values[l];
                    float w = weight[j];
                    sumqx += w * q * xb[j];
                    sumq2 += w * q * q;
                }
                if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                    d = sumqx / sumq2;
                    best = d * sumqx;
                }
            }
            scale = d;
        }
        const uint16_t dh = fp16(scale);
        memcpy(y, &dh, 2);
        float id = scale ? 1 / scale : 0;
        for (int j = 0; j < qk; ++j) L[j] = best_index_int8(16, values, id * xb[j]);
        for (int j = 0; j < 16; ++j) y[2 + j] = L[j] | (L[16 + j] << 4);
    }
}

#undef GGML_MIN
#undef GGML_MAX

}  // namespace kvq::test::ggml
