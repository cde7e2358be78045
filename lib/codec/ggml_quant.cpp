// Scalar specification of the ggml-layout codecs q8_0, q4_0, q4_1, q5_0, q5_1. The quantizers follow
// ggml's reference quantizers (quantize_row_*_ref) operation for operation, so the bytes are identical:
// q8_0 rounds with roundf; q4_0/q5_0 take d = max/−8 (−16) of the signed extreme and truncate x/d + 8.5
// (16.5); q4_1/q5_1 take d = (max−min)/15 (31) and truncate (x−min)/d + 0.5.
#include <cfloat>
#include <cmath>
#include <algorithm>

#include "kernels.hpp"
#include "scalar_ops.hpp"

namespace kvq::detail {
namespace {

// ---- q8_0 ----
struct LayoutQ8_0 {
    using Block = BlockQ8_0;
    static constexpr bool has_min = false;
    static void unpack(const Block& b, int8_t q[kQK]) { std::memcpy(q, b.qs, kQK); }
    static float d(const Block& b) { return f16_to_f32(b.d); }
    static float m(const Block&) { return 0.0f; }
};

void quantize_q8_0(const float* x, uint8_t* dst, int64_t n) {
    auto* y = reinterpret_cast<BlockQ8_0*>(dst);
    for (int64_t i = 0; i < n / kQK; ++i) {
        float amax = 0.0f;
        for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[i * kQK + j]));
        const float d = amax / ((1 << 7) - 1);
        const float id = d ? 1.0f / d : 0.0f;
        y[i].d = f32_to_f16(d);
        for (int j = 0; j < kQK; ++j) y[i].qs[j] = static_cast<int8_t>(std::roundf(x[i * kQK + j] * id));
    }
}

// ---- q4_0 / q5_0: symmetric, the extreme value maps to -8 (-16) ----
template <int Bits>
void quantize_sym(const float* x, uint8_t* dst, int64_t n) {
    constexpr int half = 1 << (Bits - 1);  // 8 or 16
    constexpr int top = (1 << Bits) - 1;   // 15 or 31
    for (int64_t i = 0; i < n / kQK; ++i) {
        const float* xb = x + i * kQK;
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < kQK; ++j) {
            if (amax < std::fabs(xb[j])) {
                amax = std::fabs(xb[j]);
                max = xb[j];
            }
        }
        const float d = max / -half;
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t qs[kQK / 2];
        uint32_t qh = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            const uint8_t xi0 = static_cast<uint8_t>(std::min<int>(top, static_cast<int8_t>(xb[j] * id + (half + 0.5f))));
            const uint8_t xi1 = static_cast<uint8_t>(std::min<int>(top, static_cast<int8_t>(xb[kQK / 2 + j] * id + (half + 0.5f))));
            qs[j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << j;
            qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
        }
        if constexpr (Bits == 4) {
            auto& b = reinterpret_cast<BlockQ4_0*>(dst)[i];
            b.d = f32_to_f16(d);
            std::memcpy(b.qs, qs, sizeof qs);
        } else {
            auto& b = reinterpret_cast<BlockQ5_0*>(dst)[i];
            b.d = f32_to_f16(d);
            std::memcpy(b.qh, &qh, 4);
            std::memcpy(b.qs, qs, sizeof qs);
        }
    }
}

// ---- q4_1 / q5_1: asymmetric, min and (max-min) ----
// ggml clamps q4_1 through int8 and MIN(15, ·) but casts q5_1 straight to uint8; keep both as they are.
template <int Bits>
inline uint8_t to_level(float v) {
    if constexpr (Bits == 4) {
        return static_cast<uint8_t>(std::min<int>(15, static_cast<int8_t>(v)));
    } else {
        return static_cast<uint8_t>(v);
    }
}

template <int Bits>
void quantize_asym(const float* x, uint8_t* dst, int64_t n) {
    constexpr int top = (1 << Bits) - 1;
    for (int64_t i = 0; i < n / kQK; ++i) {
        const float* xb = x + i * kQK;
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < kQK; ++j) {
            min = std::min(min, xb[j]);
            max = std::max(max, xb[j]);
        }
        const float d = (max - min) / top;
        const float id = d ? 1.0f / d : 0.0f;
        uint8_t qs[kQK / 2];
        uint32_t qh = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            const uint8_t xi0 = to_level<Bits>((xb[j] - min) * id + 0.5f);
            const uint8_t xi1 = to_level<Bits>((xb[kQK / 2 + j] - min) * id + 0.5f);
            qs[j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << j;
            qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
        }
        if constexpr (Bits == 4) {
            auto& b = reinterpret_cast<BlockQ4_1*>(dst)[i];
            b.d = f32_to_f16(d);
            b.m = f32_to_f16(min);
            std::memcpy(b.qs, qs, sizeof qs);
        } else {
            auto& b = reinterpret_cast<BlockQ5_1*>(dst)[i];
            b.d = f32_to_f16(d);
            b.m = f32_to_f16(min);
            std::memcpy(b.qh, &qh, 4);
            std::memcpy(b.qs, qs, sizeof qs);
        }
    }
}

inline void unpack_nibbles(const uint8_t* qs, int8_t q[kQK], int offset) {
    for (int j = 0; j < kQK / 2; ++j) {
        q[j] = static_cast<int8_t>((qs[j] & 0x0F) - offset);
        q[j + kQK / 2] = static_cast<int8_t>((qs[j] >> 4) - offset);
    }
}

inline void unpack_5bit(const uint8_t* qs, const uint8_t* qh_bytes, int8_t q[kQK], int offset) {
    uint32_t qh;
    std::memcpy(&qh, qh_bytes, 4);
    for (int j = 0; j < kQK / 2; ++j) {
        const int hi0 = ((qh >> j) << 4) & 0x10;
        const int hi1 = (qh >> (j + 12)) & 0x10;
        q[j] = static_cast<int8_t>(((qs[j] & 0x0F) | hi0) - offset);
        q[j + kQK / 2] = static_cast<int8_t>(((qs[j] >> 4) | hi1) - offset);
    }
}

struct LayoutQ4_0 {
    using Block = BlockQ4_0;
    static constexpr bool has_min = false;
    static void unpack(const Block& b, int8_t q[kQK]) { unpack_nibbles(b.qs, q, 8); }
    static float d(const Block& b) { return f16_to_f32(b.d); }
    static float m(const Block&) { return 0.0f; }
};
struct LayoutQ4_1 {
    using Block = BlockQ4_1;
    static constexpr bool has_min = true;
    static void unpack(const Block& b, int8_t q[kQK]) { unpack_nibbles(b.qs, q, 0); }
    static float d(const Block& b) { return f16_to_f32(b.d); }
    static float m(const Block& b) { return f16_to_f32(b.m); }
};
struct LayoutQ5_0 {
    using Block = BlockQ5_0;
    static constexpr bool has_min = false;
    static void unpack(const Block& b, int8_t q[kQK]) { unpack_5bit(b.qs, b.qh, q, 16); }
    static float d(const Block& b) { return f16_to_f32(b.d); }
    static float m(const Block&) { return 0.0f; }
};
struct LayoutQ5_1 {
    using Block = BlockQ5_1;
    static constexpr bool has_min = true;
    static void unpack(const Block& b, int8_t q[kQK]) { unpack_5bit(b.qs, b.qh, q, 0); }
    static float d(const Block& b) { return f16_to_f32(b.d); }
    static float m(const Block& b) { return f16_to_f32(b.m); }
};

template <class L>
constexpr BlockKernels make_kernels(void (*quantize)(const float*, uint8_t*, int64_t)) {
    return {quantize, dequantize_blocks<L>, prepare_query_q8, score_blocks<L>, accumulate_blocks<L>};
}

}  // namespace

void prepare_query_q8(const float* q, uint8_t* prep, int64_t n) {
    auto* y = reinterpret_cast<BlockQ8Query*>(prep);
    for (int64_t i = 0; i < n / kQK; ++i) {
        float amax = 0.0f;
        for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(q[i * kQK + j]));
        const float d = amax / 127.0f;
        const float id = d ? 1.0f / d : 0.0f;
        int32_t sum = 0;
        for (int j = 0; j < kQK; ++j) {
            y[i].qs[j] = static_cast<int8_t>(std::roundf(q[i * kQK + j] * id));
            sum += y[i].qs[j];
        }
        y[i].d = d;
        y[i].s = d * static_cast<float>(sum);
    }
}

const BlockKernels kScalarQ8_0 = make_kernels<LayoutQ8_0>(quantize_q8_0);
const BlockKernels kScalarQ4_0 = make_kernels<LayoutQ4_0>(quantize_sym<4>);
const BlockKernels kScalarQ4_1 = make_kernels<LayoutQ4_1>(quantize_asym<4>);
const BlockKernels kScalarQ5_0 = make_kernels<LayoutQ5_0>(quantize_sym<5>);
const BlockKernels kScalarQ5_1 = make_kernels<LayoutQ5_1>(quantize_asym<5>);

}  // namespace kvq::detail
