// SIMD kernels of the plain codecs f32, f16 and bf16 (any row length: a tail shorter than a register goes
// through a zero-padded register, or, for accumulate, through the specification's scalar loop).
#pragma once

#include <cstdint>
#include <cstring>

#include "../ref/kernels.hpp"
#include "loops.hpp"

namespace kvq::simd {
namespace {

struct PlainF32 {
    using T = float;
    template <class A>
    static xsimd::batch<float, A> load(const T* p) { return xsimd::batch<float, A>::load_unaligned(p); }
    template <class A>
    static void store(T* p, xsimd::batch<float, A> v) { v.store_unaligned(p); }
    template <class A>
    static float decode(T v) { return v; }
};

struct PlainF16 {
    using T = uint16_t;
    template <class A>
    static xsimd::batch<float, A> load(const T* p) { return Ops<A>::load_f16(p); }
    template <class A>
    static void store(T* p, xsimd::batch<float, A> v) { Ops<A>::store_f16(p, v); }
    template <class A>
    static float decode(T v) { return Ops<A>::f16_value(v); }
};

// bf16 rounds to nearest even and keeps NaN quiet, as lib/ref/half.hpp does.
struct PlainBF16 {
    using T = uint16_t;
    template <class A>
    static xsimd::batch<float, A> load(const T* p) {
        return bit_cast<float>(Ops<A>::load_u16(p) << 16);
    }
    template <class A>
    static void store(T* p, xsimd::batch<float, A> v) {
        using U = xsimd::batch<uint32_t, A>;
        using F = xsimd::batch<float, A>;
        const U u = bit_cast<uint32_t>(v);
        const U rounded = (u + U(0x7fffu) + ((u >> 16) & U(1u))) >> 16;
        const U quiet_nan = (u >> 16) | U(64u);
        const F bits = xsimd::select(xsimd::isnan(v), bit_cast<float>(quiet_nan), bit_cast<float>(rounded));
        Ops<A>::store_u16(p, bit_cast<int32_t>(bits));
    }
    template <class A>
    static float decode(T v) {
        const uint32_t u = static_cast<uint32_t>(v) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

template <class A, class P>
void quantize_plain(const float* x, uint8_t* dst, int64_t n) {
    using F = xsimd::batch<float, A>;
    constexpr int64_t N = F::size;
    auto* y = reinterpret_cast<typename P::T*>(dst);  // rows are 2-byte aligned at least
    int64_t j = 0;
    for (; j + N <= n; j += N) P::template store<A>(y + j, F::load_unaligned(x + j));
    if (j < n) {
        alignas(64) float in[N] = {};
        typename P::T out[N];
        std::memcpy(in, x + j, (n - j) * sizeof(float));
        P::template store<A>(out, F::load_aligned(in));
        std::memcpy(y + j, out, (n - j) * sizeof(typename P::T));
    }
}

template <class A, class P>
void dequantize_plain(const uint8_t* src, float* y, int64_t n) {
    using F = xsimd::batch<float, A>;
    constexpr int64_t N = F::size;
    const auto* s = reinterpret_cast<const typename P::T*>(src);
    int64_t j = 0;
    for (; j + N <= n; j += N) P::template load<A>(s + j).store_unaligned(y + j);
    if (j < n) {
        typename P::T in[N] = {};
        alignas(64) float out[N];
        std::memcpy(in, s + j, (n - j) * sizeof(typename P::T));
        P::template load<A>(in).store_aligned(out);
        std::memcpy(y + j, out, (n - j) * sizeof(float));
    }
}

void prepare_query_f32(const float* q, uint8_t* prep, int64_t n) { std::memcpy(prep, q, n * sizeof(float)); }

template <class A, class P, int G>
void score_plain_group(const float* const* q, const uint8_t* rows, size_t row_stride, size_t n_rows, int64_t n,
                       float* const* out) {
    using F = xsimd::batch<float, A>;
    constexpr int64_t N = F::size;
    const int64_t full = n / N * N;
    alignas(64) float q_tail[G][N] = {};  // the queries' last n - full values, zero-padded
    for (int i = 0; i < G; ++i) std::memcpy(q_tail[i], q[i] + full, (n - full) * sizeof(float));
    for (size_t r = 0; r < n_rows; ++r) {
        const auto* row = reinterpret_cast<const typename P::T*>(rows + r * row_stride);
        F acc[G];
        for (int i = 0; i < G; ++i) acc[i] = F(0.0f);
        for (int64_t j = 0; j < full; j += N) {
            const F v = P::template load<A>(row + j);
            for (int i = 0; i < G; ++i) acc[i] = fmadd(F::load_unaligned(q[i] + j), v, acc[i]);
        }
        if (full < n) {
            typename P::T tail[N] = {};
            std::memcpy(tail, row + full, (n - full) * sizeof(typename P::T));
            const F v = P::template load<A>(tail);
            for (int i = 0; i < G; ++i) acc[i] = fmadd(F::load_aligned(q_tail[i]), v, acc[i]);
        }
        float s[G];
        Ops<A>::reduce_add_rows(acc, G, s);
        for (int i = 0; i < G; ++i) out[i][r] = s[i];
    }
}

template <class A, class P>
struct ScorePlain {
    template <int G>
    struct Pass {
        static void run(int i0, const uint8_t* prep, size_t prep_bytes, const uint8_t* rows, size_t row_stride,
                        size_t n_rows, int64_t n, float* scores, size_t score_stride) {
            const float* q[G];
            float* out[G];
            for (int i = 0; i < G; ++i) {
                q[i] = reinterpret_cast<const float*>(prep + (i0 + i) * prep_bytes);
                out[i] = scores + (i0 + i) * score_stride;
            }
            score_plain_group<A, P, G>(q, rows, row_stride, n_rows, n, out);
        }
    };
    static void score(const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows, size_t row_stride,
                      size_t n_rows, int64_t n, float* scores, size_t score_stride) {
        for (size_t r0 = 0; r0 < n_rows; r0 += kRowChunk) {
            const size_t rn = std::min(kRowChunk, n_rows - r0);
            for_query_groups<kScoreGroup, Pass>(n_q, prep, prep_bytes, rows + r0 * row_stride, row_stride, rn, n,
                                                scores + r0, score_stride);
        }
    }
};

template <class A, class P>
struct PlainTile {
    static void load(const uint8_t* row, int64_t t, int part, xsimd::batch<float, A>* v) {
        const auto* p = reinterpret_cast<const typename P::T*>(row) + t * kQK + part * kTileValues<A>;
        v[0] = P::template load<A>(p);
        v[1] = P::template load<A>(p + kLanes<A>);
    }
};

template <class A, class P>
void accumulate_plain(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                      size_t n_rows, int64_t n, float* acc) {
    AccumulateTiles<A, PlainTile<A, P>>::run(w, w_stride, n_q, rows, row_stride, n_rows, n, acc);
    const int64_t done = n / kQK * kQK;
    if (done == n) return;
    for (size_t r = 0; r < n_rows; ++r) {  // the last n % 32 columns: the specification's loop
        const uint8_t* row = rows + r * row_stride;
        for (int i = 0; i < n_q; ++i) {
            const float wi = w[i * w_stride + r];
            float* a = acc + i * n;
            for (int64_t j = done; j < n; ++j) {
                typename P::T v;
                std::memcpy(&v, row + j * sizeof v, sizeof v);
                a[j] += wi * P::template decode<A>(v);
            }
        }
    }
}

template <class A, class P>
detail::BlockKernels plain_kernels() {
    return {quantize_plain<A, P>, dequantize_plain<A, P>, prepare_query_f32, ScorePlain<A, P>::score,
            accumulate_plain<A, P>, nullptr};
}

}  // namespace
}  // namespace kvq::simd
