// Scalar specification of the ggml-layout codecs q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, and iq4_nls (iq4_nl's
// blocks from ggml's scale-searching tensor quantizer). The quantizers
// follow ggml's reference quantizers (quantize_row_*_ref) operation for operation, so the bytes are
// identical: q8_0 rounds with roundf; q4_0/q5_0 take d = max/−8 (−16) of the signed extreme and truncate
// x/d + 8.5 (16.5); q4_1/q5_1 take d = (max−min)/15 (31) and truncate (x−min)/d + 0.5; iq4_nl picks the
// nearest of its 16 levels at d₀ = max/−127 and stores the x²-weighted least-squares scale of those codes.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels.hpp"
#include "scalar_ops.hpp"

namespace kvq::detail {
namespace {

// ---- what every quantizer shares ----

// A block holding NaN or Inf is stored with a NaN scale (and NaN min) and zero codes, so it reads back
// as NaN in every value: attention that reads it returns NaN (NanPolicy::propagate; under
// NanPolicy::reject kvq::Codec refuses such rows before they get here).
inline constexpr uint16_t kF16NaN = 0x7E00;

inline bool all_finite(const float* xb) {
    for (int j = 0; j < kQK; ++j) {
        if (!std::isfinite(xb[j])) return false;
    }
    return true;
}

// x -> x/d as ggml computes it: times the inverse scale, or 0 for a zero block. When d is so small
// (subnormal) that 1/d overflows, ggml's product is Inf or NaN and its integer cast undefined; there we
// divide instead, which is defined and exact enough (such a d is 0 once stored as fp16, so the stored
// key bytes do not depend on it; the float-scaled query does).
struct Scale {
    explicit Scale(float d) : d_(d), id_(d != 0.0f ? 1.0f / d : 0.0f), divide_(!std::isfinite(id_)) {}
    float apply(float x) const { return divide_ ? x / d_ : x * id_; }

private:
    float d_, id_;
    bool divide_;
};

// Float -> code conversions defined for every float (a cast of NaN or of an out-of-range float to an
// integer is undefined behaviour). On every input where ggml's plain casts are defined they give the
// same code, so the bytes stay identical to ggml's.
inline int8_t round_to_q8(float v) {  // ggml: (int8_t)roundf(v)
    if (std::isnan(v)) return 0;
    return static_cast<int8_t>(std::roundf(std::clamp(v, -127.0f, 127.0f)));
}
inline uint8_t truncate_to_level(float v, int top) {  // ggml: MIN(top, (int8_t)v) or (uint8_t)v
    if (!(v >= 0.0f)) return 0;  // negative or NaN
    return v >= static_cast<float>(top) ? static_cast<uint8_t>(top) : static_cast<uint8_t>(v);
}

// ---- q8_0 ----
struct LayoutQ8_0 {
    using Block = BlockQ8_0;
    static constexpr bool has_min = false;
    static void unpack(const Block& b, int8_t q[kQK]) { std::memcpy(q, b.qs, kQK); }
    static float d(const Block& b) { return f16_to_f32(b.d); }
    static float m(const Block&) { return 0.0f; }
};

void quantize_q8_0(const float* x, uint8_t* dst, int64_t n) {
    for (int64_t i = 0; i < n / kQK; ++i) {
        const float* xb = x + i * kQK;
        BlockQ8_0 b{};
        if (!all_finite(xb)) {
            b.d = kF16NaN;
            store_block(dst + i * sizeof b, b);
            continue;
        }
        float amax = 0.0f;
        for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(xb[j]));
        const float d = amax / ((1 << 7) - 1);
        const Scale s(d);
        b.d = f32_to_f16(d);
        for (int j = 0; j < kQK; ++j) b.qs[j] = round_to_q8(s.apply(xb[j]));
        store_block(dst + i * sizeof b, b);
    }
}

// ---- q4_0 / q5_0: symmetric, the extreme value maps to -8 (-16) ----
template <int Bits>
void quantize_sym(const float* x, uint8_t* dst, int64_t n) {
    constexpr int half = 1 << (Bits - 1);  // 8 or 16
    constexpr int top = (1 << Bits) - 1;   // 15 or 31
    using Block = std::conditional_t<Bits == 4, BlockQ4_0, BlockQ5_0>;
    for (int64_t i = 0; i < n / kQK; ++i) {
        const float* xb = x + i * kQK;
        Block b{};
        if (!all_finite(xb)) {
            b.d = kF16NaN;
            store_block(dst + i * sizeof b, b);
            continue;
        }
        const float max = signed_extreme(xb);
        const float d = max / -half;
        const Scale s(d);
        uint32_t qh = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            const uint8_t xi0 = truncate_to_level(s.apply(xb[j]) + (half + 0.5f), top);
            const uint8_t xi1 = truncate_to_level(s.apply(xb[kQK / 2 + j]) + (half + 0.5f), top);
            b.qs[j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << j;
            qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
        }
        b.d = f32_to_f16(d);
        if constexpr (Bits == 5) std::memcpy(b.qh, &qh, 4);
        store_block(dst + i * sizeof b, b);
    }
}

// ---- q4_1 / q5_1: asymmetric, min and (max-min) ----
template <int Bits>
void quantize_asym(const float* x, uint8_t* dst, int64_t n) {
    constexpr int top = (1 << Bits) - 1;
    using Block = std::conditional_t<Bits == 4, BlockQ4_1, BlockQ5_1>;
    for (int64_t i = 0; i < n / kQK; ++i) {
        const float* xb = x + i * kQK;
        Block b{};
        if (!all_finite(xb)) {
            b.d = kF16NaN;
            b.m = kF16NaN;
            store_block(dst + i * sizeof b, b);
            continue;
        }
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < kQK; ++j) {
            min = std::min(min, xb[j]);
            max = std::max(max, xb[j]);
        }
        const float d = (max - min) / top;
        const Scale s(d);
        uint32_t qh = 0;
        for (int j = 0; j < kQK / 2; ++j) {
            const uint8_t xi0 = truncate_to_level(s.apply(xb[j] - min) + 0.5f, top);
            const uint8_t xi1 = truncate_to_level(s.apply(xb[kQK / 2 + j] - min) + 0.5f, top);
            b.qs[j] = static_cast<uint8_t>((xi0 & 0x0F) | ((xi1 & 0x0F) << 4));
            qh |= ((xi0 & 0x10u) >> 4) << j;
            qh |= ((xi1 & 0x10u) >> 4) << (j + kQK / 2);
        }
        b.d = f32_to_f16(d);
        b.m = f32_to_f16(min);
        if constexpr (Bits == 5) std::memcpy(b.qh, &qh, 4);
        store_block(dst + i * sizeof b, b);
    }
}

// ---- iq4_nl: ggml's quantize_row_iq4_nl_ref (quantize_row_iq4_nl_impl with one 32-value block, no
// importance weights and no scale search, ntry = −1) ----

// ggml's best_index_int8: the nearest level, ties to the lower one; beyond either end, that end.
inline int nearest_iq4nl_level(float x) {
    const int8_t* v = kIQ4NLValues;
    if (!(x > v[0])) return 0;  // also NaN, which ggml never sees here (its block would be non-finite)
    if (x >= v[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        (x < v[mid] ? hi : lo) = mid;
    }
    return x - v[hi - 1] < v[hi] - x ? hi - 1 : hi;
}

void quantize_iq4_nl(const float* x, uint8_t* dst, int64_t n) {
    constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS
    for (int64_t i = 0; i < n / kQK; ++i) {
        // A block below ggml's eps stores d = 0 and zero codes. ggml stores d = 0 too, with whatever its
        // code buffer last held (uninitialized for a row's first block): codes no reader can tell apart,
        // which kvq fixes to zero so that bytes never depend on the rows quantized before.
        uint8_t codes[kQK] = {};
        const float* xb = x + i * kQK;
        BlockIQ4_NL b{};
        if (!all_finite(xb)) {
            b.d = kF16NaN;
            store_block(dst + i * sizeof b, b);
            continue;
        }
        const float max = signed_extreme(xb);
        float d = 0.0f;
        if (std::fabs(max) >= kGroupMaxEps) {
            const float id = 1.0f / (max / kIQ4NLValues[0]);
            float sumqx = 0.0f, sumq2 = 0.0f;
            for (int j = 0; j < kQK; ++j) {
                const int l = nearest_iq4nl_level(id * xb[j]);
                codes[j] = static_cast<uint8_t>(l);
                const float q = kIQ4NLValues[l];
                const float w = xb[j] * xb[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            d = sumqx / sumq2;
        }
        b.d = f32_to_f16(d);
        for (int j = 0; j < kQK / 2; ++j) b.qs[j] = static_cast<uint8_t>(codes[j] | (codes[kQK / 2 + j] << 4));
        store_block(dst + i * sizeof b, b);
    }
}

// ---- iq4_nls: ggml's whole-tensor iq4_nl quantizer (quantize_iq4_nl without importance weights:
// quantize_row_iq4_nl_impl with one 32-value block and the scale search, ntry = 7) ----
//
// Same weights w_j = x_j², same levels, same block layout; what differs from quantize_iq4_nl above:
//   1. the first candidate is d = max/127 (ggml's -max/values[0] when ntry > 0: max maps to +127, past
//      the top level 113), its codes the nearest levels and its d the weighted least-squares scale;
//   2. then 15 more candidates, inverse scales id = (itry − 127)/max for itry = −7..7 (max maps to
//      itry − 127): each picks the nearest levels and keeps its least-squares d if sumqx²/sumq2 beats
//      the best so far (in ggml's float form: sumqx·sumqx > best·sumq2 with best = d·sumqx);
//   3. the stored codes are then picked again as the nearest levels at 1/d of the chosen float d (not
//      the codes the candidate was scored with, and not at the fp16-rounded d the decoder uses).
// ggml's float details are kept: every sum runs j = 0..31 in float, w·q·x is (w·q)·x, best is d·sumqx
// (rounded) not the ratio, the comparisons overflow to Inf as ggml's do for blocks beyond about 1e5
// (Inf > Inf is false: such a block keeps the candidates before the overflow); the build has no FMA
// contraction (-ffp-contract=off). A block below ggml's eps stores d = 0 with every code 8 (the nearest
// level to 0·x, as ggml writes it). So the bytes are ggml_quantize_chunk(GGML_TYPE_IQ4_NL, ..., NULL)'s
// (tests/data/iq4_nls.bin, made by ggml itself).

// ggml's best_index_int8 including its NaN case (NaN compares false everywhere: the top level). Only a
// block whose d is NaN (x² overflowed, which kvq's input limit excludes) reaches it with NaN.
inline int ggml_best_index(float x) { return std::isnan(x) ? 15 : nearest_iq4nl_level(x); }

// The weighted least-squares fit of the nearest levels at inverse scale id: sumqx = Σ w·q·x, sumq2 = Σ w·q².
inline void fit_levels(const float* xb, const float* w, float id, float& sumqx, float& sumq2) {
    sumqx = sumq2 = 0.0f;
    for (int j = 0; j < kQK; ++j) {
        const float q = kIQ4NLValues[nearest_iq4nl_level(id * xb[j])];
        sumqx += w[j] * q * xb[j];
        sumq2 += w[j] * q * q;
    }
}

void quantize_iq4_nls(const float* x, uint8_t* dst, int64_t n) {
    constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS
    constexpr int kTry = 7;                 // ggml's ntry in quantize_iq4_nl
    for (int64_t i = 0; i < n / kQK; ++i) {
        const float* xb = x + i * kQK;
        BlockIQ4_NL b{};
        if (!all_finite(xb)) {
            b.d = kF16NaN;
            store_block(dst + i * sizeof b, b);
            continue;
        }
        float w[kQK];
        for (int j = 0; j < kQK; ++j) w[j] = xb[j] * xb[j];
        const float max = signed_extreme(xb);
        float d = 0.0f;
        if (std::fabs(max) >= kGroupMaxEps) {
            float sumqx, sumq2;
            fit_levels(xb, w, 1.0f / (-max / kIQ4NLValues[0]), sumqx, sumq2);
            d = sumq2 > 0 ? sumqx / sumq2 : 0.0f;
            float best = d * sumqx;
            for (int itry = -kTry; itry <= kTry; ++itry) {
                fit_levels(xb, w, static_cast<float>(itry + kIQ4NLValues[0]) / max, sumqx, sumq2);
                if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
                    d = sumqx / sumq2;
                    best = d * sumqx;
                }
            }
        }
        // ggml: id = scales[0] ? 1/scales[0] : 0, so a tiny block's codes are all 8. (1/d is finite: d is
        // a weighted mean of x/q over levels |q| ≥ 1 at scales near amax/127, far from float's subnormals.)
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint8_t codes[kQK];
        for (int j = 0; j < kQK; ++j) codes[j] = static_cast<uint8_t>(ggml_best_index(id * xb[j]));
        b.d = f32_to_f16(d);
        for (int j = 0; j < kQK / 2; ++j) b.qs[j] = static_cast<uint8_t>(codes[j] | (codes[kQK / 2 + j] << 4));
        store_block(dst + i * sizeof b, b);
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

struct LayoutIQ4_NL {
    using Block = BlockIQ4_NL;
    static constexpr bool has_min = false;
    static void unpack(const Block& b, int8_t q[kQK]) {
        for (int j = 0; j < kQK / 2; ++j) {
            q[j] = kIQ4NLValues[b.qs[j] & 0x0F];
            q[j + kQK / 2] = kIQ4NLValues[b.qs[j] >> 4];
        }
    }
    static float d(const Block& b) { return f16_to_f32(b.d); }
    static float m(const Block&) { return 0.0f; }
};

template <class L>
constexpr BlockKernels make_kernels(void (*quantize)(const float*, uint8_t*, int64_t),
                                   decltype(BlockKernels::accumulate_grid) accumulate_grid = nullptr) {
    return {quantize, dequantize_blocks<L>, prepare_query_q8, score_blocks<L>, accumulate_blocks<L>, accumulate_grid};
}

}  // namespace

void prepare_query_q8(const float* q, uint8_t* prep, int64_t n) {
    for (int64_t i = 0; i < n / kQK; ++i) {
        const float* qb = q + i * kQK;
        BlockQ8Query b{};
        if (!all_finite(qb)) {  // scores against this query are NaN
            b.d = b.s = std::numeric_limits<float>::quiet_NaN();
            store_block(prep + i * sizeof b, b);
            continue;
        }
        float amax = 0.0f;
        for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(qb[j]));
        const float d = amax / 127.0f;
        const Scale s(d);
        int32_t sum = 0;
        for (int j = 0; j < kQK; ++j) {
            b.qs[j] = round_to_q8(s.apply(qb[j]));
            sum += b.qs[j];
        }
        b.d = d;
        b.s = d * static_cast<float>(sum);
        store_block(prep + i * sizeof b, b);
    }
}

const BlockKernels kScalarQ8_0 = make_kernels<LayoutQ8_0>(quantize_q8_0);
const BlockKernels kScalarQ4_0 = make_kernels<LayoutQ4_0>(quantize_sym<4>, accumulate_grid_blocks<LayoutQ4_0>);
const BlockKernels kScalarQ4_1 = make_kernels<LayoutQ4_1>(quantize_asym<4>);
const BlockKernels kScalarQ5_0 = make_kernels<LayoutQ5_0>(quantize_sym<5>);
const BlockKernels kScalarQ5_1 = make_kernels<LayoutQ5_1>(quantize_asym<5>);
const BlockKernels kScalarIQ4_NL = make_kernels<LayoutIQ4_NL>(quantize_iq4_nl);
// iq4_nl's decode kernels (the same functions), its own encoder.
const BlockKernels kScalarIQ4_NLS = make_kernels<LayoutIQ4_NL>(quantize_iq4_nls);

}  // namespace kvq::detail
