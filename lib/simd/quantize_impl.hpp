// SIMD quantizers of the ggml-layout codecs, written once over the xsimd arch A and Ops<A> (ops.hpp).
// They give the same bytes as the scalar specification (lib/ref/ggml_quant.cpp) because they do the
// same float operations in the same order: multiply by the reciprocal id = 1/d (never divide by d), add
// the rounding offset as a separate addition (no fma), and convert to int by truncation, keeping the low
// byte as C's int -> int8_t conversion does. Block maxima are order-independent except for signed zeros
// and for ties between +a and -a; blocks with those take the scalar loop, so the chosen value is the same.
#pragma once

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../ref/blocks.hpp"
#include "../ref/kernels.hpp"
#include "ops.hpp"

namespace kvq::simd {
namespace {

using detail::kQK;

template <class A>
constexpr int kLanes = static_cast<int>(xsimd::batch<float, A>::size);
template <class A>
constexpr int kPerBlock = kQK / kLanes<A>;  // registers per 32-value block

// roundf(v): round half away from zero. trunc(v + copysign(0.49999997, v)) equals roundf for every finite
// float (checked exhaustively); the truncation is done by the int conversion that follows.
template <class A>
xsimd::batch<float, A> add_round_half_away(xsimd::batch<float, A> v) {
    using F = xsimd::batch<float, A>;
    return v + (xsimd::bitofsign(v) | F(0x1.fffffep-2f));
}

// The quantizers read their input once from memory (the second pass over a block hits L1): software
// prefetch this far ahead keeps more of the stream in flight than the hardware prefetcher alone
// (measured: q8_0 about +20%, q4_0 +6% from memory on one AVX2 thread; nothing in cache).
inline constexpr size_t kQuantizePrefetchFloats = 1024;
inline void prefetch_block(const float* xb) {
    __builtin_prefetch(xb + kQuantizePrefetchFloats);
    __builtin_prefetch(xb + kQuantizePrefetchFloats + 16);
}

// hmax(v) in every lane: in registers where Ops has it (then the group's maxima are gathered with
// blends, not with scalar stores that a vector load would wait for), else a broadcast of hmax.
template <class O, class F>
F hmax_all(F v) {
    if constexpr (requires { O::hmax_all(v); }) {
        return O::hmax_all(v);
    } else {
        return F(O::hmax(v));
    }
}
template <class A>
xsimd::batch<float, A> lane_indices() {
    constexpr int N = kLanes<A>;
    alignas(64) static const float idx[64] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15,
                                              16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31,
                                              32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47,
                                              48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
    static_assert(N <= 64);
    return xsimd::batch<float, A>::load_aligned(idx);
}

template <class A>
void load_block(const float* x, xsimd::batch<float, A>* v) {
    for (int k = 0; k < kPerBlock<A>; ++k) v[k] = xsimd::batch<float, A>::load_unaligned(x + k * kLanes<A>);
}

template <class A>
float block_amax(const xsimd::batch<float, A>* v) {
    xsimd::batch<float, A> m = xsimd::abs(v[0]);
    for (int k = 1; k < kPerBlock<A>; ++k) m = xsimd::max(m, xsimd::abs(v[k]));
    return Ops<A>::hmax(m);
}

// Codes of a block whose scale d is normal (or zero) lie in -128..127: |x·(1/d)| exceeds the code range
// by a few ulps at most. A subnormal d makes 1/d inexact or infinite, and then the codes are whatever C's
// conversion makes of out-of-range values, which only low_bytes reproduces.
template <class A>
typename Ops<A>::Bytes pack_codes(const typename Ops<A>::I* q, float d) {
    return std::isnormal(d) || d == 0.0f ? Ops<A>::pack_small(q) : Ops<A>::low_bytes(q);
}

// Blocks the fast path does not treat as the specification does go through the specification itself
// (lib/ref/ggml_quant.cpp), one block at a time: a block holding NaN or Inf (stored as a NaN block)
// and a block whose scale is neither normal nor zero (where the specification divides or clamps). Both
// are rare, and the fast path then only ever packs codes of a normal scale.
template <class A>
bool block_finite(const xsimd::batch<float, A>* v) {
    auto t = v[0] - v[0];  // 0 for finite values, NaN otherwise
    for (int k = 1; k < kPerBlock<A>; ++k) t += v[k] - v[k];
    return !xsimd::any(xsimd::isnan(t));
}
inline bool ordinary_scale(float d) { return std::isnormal(d) || d == 0.0f; }

// Blocks are taken kLanes at a time so that their scales are computed together: one vector division for
// d and one for 1/d (IEEE division is correctly rounded, lane or scalar alike) and one fp16 conversion.
template <class A>
struct BlockScales {
    using F = xsimd::batch<float, A>;
    alignas(64) float id[kLanes<A>];
    alignas(64) uint16_t d16[kLanes<A>];
    alignas(64) float d[kLanes<A>];
    // d = numerator / denominator and id = d ? 1/d : 0, lane by lane.
    void compute(F numerator, float denominator) {
        const F dv = divide(numerator, F(denominator));
        xsimd::select(dv != F(0.0f), divide(F(1.0f), dv), F(0.0f)).store_aligned(id);
        dv.store_aligned(d);
        Ops<A>::store_f16(d16, dv);
    }
};

// |x| as integer bits are ordered as the floats for finite values and lie above every finite value
// (0x7F800000 and up) for Inf and NaN. Their maximum, capped at Inf's bits, is the block's max |x| as a
// float: exact, and +Inf exactly when the block holds a NaN or an Inf (whatever the order of the lanes;
// a float max would drop or keep a NaN depending on its operand order).
template <class A>
xsimd::batch<float, A> block_amax_capped(const xsimd::batch<float, A>* v) {
    using I = xsimd::batch<int32_t, A>;
    I m = bit_cast<int32_t>(xsimd::abs(v[0]));
    for (int k = 1; k < kPerBlock<A>; ++k) m = xsimd::max(m, bit_cast<int32_t>(xsimd::abs(v[k])));
    return bit_cast<float>(xsimd::min(m, I(0x7F800000)));
}

// out[c] != 0 for the lanes of d that are neither normal nor zero (NaN and Inf included): the blocks
// that go through the specification. One vector test for all the blocks of a group.
template <class A>
void irregular_scales(const float* d, float* out) {
    using F = xsimd::batch<float, A>;
    const F dv = F::load_aligned(d), a = xsimd::abs(dv);
    const auto ok = (a >= F(FLT_MIN) && a <= F(FLT_MAX)) || dv == F(0.0f);
    xsimd::select(ok, F(0.0f), F(1.0f)).store_aligned(out);
}

// One pass over each block for its maximum (which also finds NaN and Inf: their block's scale is Inf),
// the scales of kLanes blocks together, then a second pass from L1: x·id, rounded, packed, stored.
template <class A>
void quantize_q8_0(const float* x, uint8_t* dst, int64_t n) {
    using O = Ops<A>;
    using F = typename O::F;
    constexpr int N = kLanes<A>;
    auto* y = reinterpret_cast<detail::BlockQ8_0*>(dst);
    const int64_t nb = n / kQK;
    for (int64_t i0 = 0; i0 < nb; i0 += N) {
        const int count = static_cast<int>(std::min<int64_t>(N, nb - i0));
        const F lane = lane_indices<A>();
        F amax(0.0f);  // lane c: block i0 + c
        for (int c = 0; c < count; ++c) {
            prefetch_block(x + (i0 + c) * kQK);
            F v[kPerBlock<A>];
            load_block<A>(x + (i0 + c) * kQK, v);
            amax = xsimd::select(lane == F(float(c)), hmax_all<O>(block_amax_capped<A>(v)), amax);
        }
        BlockScales<A> s;
        s.compute(amax, (1 << 7) - 1);
        alignas(64) float irregular[N];
        irregular_scales<A>(s.d, irregular);
        for (int c = 0; c < count; ++c) {
            const float* xb = x + (i0 + c) * kQK;
            if (irregular[c] != 0.0f) {  // NaN or Inf in the block, or a subnormal scale
                detail::kScalarQ8_0.quantize(xb, dst + (i0 + c) * sizeof(detail::BlockQ8_0), kQK);
                continue;
            }
            const F id(s.id[c]);
            typename O::I q[kPerBlock<A>];
            for (int k = 0; k < kPerBlock<A>; ++k)
                q[k] = O::to_i32(add_round_half_away<A>(F::load_unaligned(xb + k * kLanes<A>) * id));
            y[i0 + c].d = s.d16[c];
            O::store(O::pack_small(q), y[i0 + c].qs);  // a regular scale: codes in -127..127
        }
    }
}

// NaN and Inf: a block holding Inf but no NaN has exact maxima, so an infinite extreme and an infinite
// scale; a block holding NaN (whatever its maxima became) has NaN among its products x·id, which are
// otherwise finite (|x·id| <= half + a few ulps). Both go through the specification.
template <class A, int Bits>
void quantize_sym(const float* x, uint8_t* dst, int64_t n) {
    using O = Ops<A>;
    using F = typename O::F;
    constexpr int N = kLanes<A>;
    constexpr int half = 1 << (Bits - 1);
    constexpr int top = (1 << Bits) - 1;
    using Block = std::conditional_t<Bits == 4, detail::BlockQ4_0, detail::BlockQ5_0>;
    const int64_t nb = n / kQK;
    for (int64_t i0 = 0; i0 < nb; i0 += N) {
        const int count = static_cast<int>(std::min<int64_t>(N, nb - i0));
        // Lane c: the largest value and the negated smallest of block i0 + c, then the one of larger
        // magnitude with its sign. Equal magnitudes (+a and -a both present, zero blocks, NaN) take the
        // specification's scan, which keeps the first.
        const F lane = lane_indices<A>();
        F vmax(0.0f), neg_vmin(0.0f);
        for (int c = 0; c < count; ++c) {
            const float* xb = x + (i0 + c) * kQK;
            prefetch_block(xb);
            F v[kPerBlock<A>];
            load_block<A>(xb, v);
            F hi = v[0], lo = v[0];
            for (int k = 1; k < kPerBlock<A>; ++k) {
                hi = xsimd::max(hi, v[k]);
                lo = xsimd::min(lo, v[k]);
            }
            const auto here = lane == F(float(c));
            vmax = xsimd::select(here, hmax_all<O>(hi), vmax);
            neg_vmin = xsimd::select(here, hmax_all<O>(-lo), neg_vmin);
        }
        const auto pos = vmax > neg_vmin, neg = neg_vmin > vmax;
        F extreme_v = xsimd::select(pos, vmax, xsimd::select(neg, -neg_vmin, F(0.0f)));
        if (xsimd::any(!(pos || neg) && lane < F(float(count)))) {
            alignas(64) float ext[N], tie[N];
            extreme_v.store_aligned(ext);
            xsimd::select(pos || neg, F(0.0f), F(1.0f)).store_aligned(tie);
            for (int c = 0; c < count; ++c) {
                if (tie[c] != 0.0f) ext[c] = detail::signed_extreme(x + (i0 + c) * kQK);
            }
            extreme_v = F::load_aligned(ext);
        }
        BlockScales<A> s;
        s.compute(extreme_v, -half);
        alignas(64) float irregular[N];
        irregular_scales<A>(s.d, irregular);
        for (int c = 0; c < count; ++c) {
            const float* xb = x + (i0 + c) * kQK;
            auto& b = reinterpret_cast<Block*>(dst)[i0 + c];
            if (irregular[c] == 0.0f) {
                const F id(s.id[c]);
                F p[kPerBlock<A>];
                for (int k = 0; k < kPerBlock<A>; ++k) p[k] = F::load_unaligned(xb + k * kLanes<A>) * id;
                F t = p[0];
                for (int k = 1; k < kPerBlock<A>; ++k) t += p[k];
                if (!xsimd::any(xsimd::isnan(t))) {
                    typename O::I q[kPerBlock<A>];
                    for (int k = 0; k < kPerBlock<A>; ++k) q[k] = O::to_i32(p[k] + F(half + 0.5f));
                    const auto bytes = O::min(O::pack_small(q), top);  // codes in 0..top+1 before the clamp
                    b.d = s.d16[c];
                    if constexpr (Bits == 5) {
                        const uint32_t qh = O::bit4_mask(bytes);
                        std::memcpy(b.qh, &qh, 4);
                    }
                    if constexpr (Bits == 4 && requires { O::store_nibbles15(bytes, b.qs); }) {
                        O::store_nibbles15(bytes, b.qs);
                    } else {
                        O::store_nibbles(bytes, b.qs);
                    }
                    continue;
                }
            }
            const auto& ref = Bits == 4 ? detail::kScalarQ4_0 : detail::kScalarQ5_0;
            ref.quantize(xb, dst + (i0 + c) * sizeof(Block), kQK);
        }
    }
}

template <class A, int Bits>
void quantize_asym(const float* x, uint8_t* dst, int64_t n) {
    using O = Ops<A>;
    using F = typename O::F;
    constexpr int N = kLanes<A>;
    constexpr int top = (1 << Bits) - 1;
    const int64_t nb = n / kQK;
    for (int64_t i0 = 0; i0 < nb; i0 += N) {
        const int count = static_cast<int>(std::min<int64_t>(N, nb - i0));
        alignas(64) float mins[N] = {}, maxs[N] = {};
        for (int c = 0; c < count; ++c) {
            const float* xb = x + (i0 + c) * kQK;
            F v[kPerBlock<A>];
            load_block<A>(xb, v);
            F hi = v[0], lo = v[0];
            for (int k = 1; k < kPerBlock<A>; ++k) {
                hi = xsimd::max(hi, v[k]);
                lo = xsimd::min(lo, v[k]);
            }
            float min = -O::hmax(-lo), max = O::hmax(hi);
            if (min == 0.0f || max == 0.0f) {  // the sign of a zero extreme depends on the scan order
                min = FLT_MAX;
                max = -FLT_MAX;
                for (int j = 0; j < kQK; ++j) {
                    min = std::min(min, xb[j]);
                    max = std::max(max, xb[j]);
                }
            }
            mins[c] = min;
            maxs[c] = max;
        }
        BlockScales<A> s;
        s.compute(F::load_aligned(maxs) - F::load_aligned(mins), top);
        alignas(64) uint16_t m16[N];
        O::store_f16(m16, F::load_aligned(mins));
        for (int c = 0; c < count; ++c) {
            F v[kPerBlock<A>];
            load_block<A>(x + (i0 + c) * kQK, v);
            if (!block_finite<A>(v) || !ordinary_scale(s.d[c])) {
                const auto& ref = Bits == 4 ? detail::kScalarQ4_1 : detail::kScalarQ5_1;
                constexpr size_t bytes = Bits == 4 ? sizeof(detail::BlockQ4_1) : sizeof(detail::BlockQ5_1);
                ref.quantize(x + (i0 + c) * kQK, dst + (i0 + c) * bytes, kQK);
                continue;
            }
            const F id(s.id[c]), min(mins[c]);
            typename O::I q[kPerBlock<A>];
            for (int k = 0; k < kPerBlock<A>; ++k) q[k] = O::to_i32((v[k] - min) * id + F(0.5f));
            auto bytes = pack_codes<A>(q, s.d[c]);
            if constexpr (Bits == 4) {
                bytes = O::min(bytes, 15);  // ggml clamps q4_1 through int8 and MIN(15, ·), q5_1 not at all
                auto& b = reinterpret_cast<detail::BlockQ4_1*>(dst)[i0 + c];
                b.d = s.d16[c];
                b.m = m16[c];
                O::store_nibbles(bytes, b.qs);
            } else {
                auto& b = reinterpret_cast<detail::BlockQ5_1*>(dst)[i0 + c];
                b.d = s.d16[c];
                b.m = m16[c];
                const uint32_t qh = O::bit4_mask(bytes);
                std::memcpy(b.qh, &qh, 4);
                O::store_nibbles(bytes, b.qs);
            }
        }
    }
}

// The query side of the quantized-key codecs (detail::prepare_query_q8): int8 per block, float d.
template <class A>
void prepare_query_q8(const float* q, uint8_t* prep, int64_t n) {
    using O = Ops<A>;
    using F = typename O::F;
    auto* y = reinterpret_cast<detail::BlockQ8Query*>(prep);
    for (int64_t i = 0; i < n / kQK; ++i) {
        F v[kPerBlock<A>];
        load_block<A>(q + i * kQK, v);
        const float d = block_amax<A>(v) / 127.0f;
        if (!block_finite<A>(v) || !ordinary_scale(d)) {
            detail::prepare_query_q8(q + i * kQK, prep + i * sizeof(detail::BlockQ8Query), kQK);
            continue;
        }
        const float id = d ? 1.0f / d : 0.0f;
        typename O::I qi[kPerBlock<A>];
        for (int k = 0; k < kPerBlock<A>; ++k) qi[k] = O::to_i32(add_round_half_away<A>(v[k] * F(id)));
        const auto bytes = O::low_bytes(qi);
        O::store(bytes, y[i].qs);
        F stored[kPerBlock<A>];  // the int8 values as written, summed exactly in float (|sum| <= 4096)
        O::widen(bytes, stored);
        F sum = stored[0];
        for (int k = 1; k < kPerBlock<A>; ++k) sum += stored[k];
        y[i].d = d;
        y[i].s = d * reduce_add(sum);
    }
}

// max |x_j|, or NaN if any x_j is NaN or Inf (x - x is NaN exactly then; the maxima ignore it).
template <class A>
float finite_max_abs(const float* x, size_t n) {
    using F = xsimd::batch<float, A>;
    constexpr size_t N = F::size;
    F t0(0.0f), t1(0.0f), m0(0.0f), m1(0.0f);
    size_t j = 0;
    for (; j + 4 * N <= n; j += 4 * N) {
        const F v0 = F::load_unaligned(x + j), v1 = F::load_unaligned(x + j + N);
        const F v2 = F::load_unaligned(x + j + 2 * N), v3 = F::load_unaligned(x + j + 3 * N);
        t0 += (v0 - v0) + (v1 - v1);
        t1 += (v2 - v2) + (v3 - v3);
        m0 = xsimd::max(m0, xsimd::max(xsimd::abs(v0), xsimd::abs(v1)));
        m1 = xsimd::max(m1, xsimd::max(xsimd::abs(v2), xsimd::abs(v3)));
    }
    float tail = 0.0f, m = 0.0f;
    for (; j < n; ++j) {
        tail += x[j] - x[j];
        m = std::max(m, std::fabs(x[j]));
    }
    if (xsimd::any(xsimd::isnan(t0 + t1)) || tail != 0.0f) return NAN;
    return std::max(m, Ops<A>::hmax(xsimd::max(m0, m1)));
}

// True if no value is NaN or Inf (the same pass; the maxima cost nothing beside the loads).
template <class A>
bool all_finite(const float* x, size_t n) {
    return !std::isnan(finite_max_abs<A>(x, n));
}

}  // namespace
}  // namespace kvq::simd
