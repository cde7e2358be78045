// An independent oracle for the ggml layouts: ggml's reference quantizers (ggml-quants.c,
// quantize_row_*_ref) transcribed line for line in C style, deliberately not sharing code with
// lib/codec. It is itself checked against ggml's own bytes in tests/data before it is trusted on
// random rows. fp16 rounding comes from the F16C-equivalent conversion in lib/codec/half.hpp, which
// the f16 oracle file checks separately.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "codec/half.hpp"

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

#undef GGML_MIN
#undef GGML_MAX

}  // namespace kvq::test::ggml
