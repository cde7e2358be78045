// iq4_nl and iq4_nls quantize (the specification: lib/ref/ggml_quant.cpp, ggml's bytes) over the level's
// float batches, one block per lane: W blocks (W = the batch's lanes) are transposed so that a batch holds
// value j of each, and every block then runs the specification's float operations in its order (the sums
// over j = 0..31 one after the other, w·q·x as (w·q)·x, no fma), so the bytes are the specification's.
// The nearest level (ggml's best_index_int8) without a branch: with x > v₀ and x < v₁₅ the binary search
// ends at lo = #{k = 1..14 : v_k ≤ x}, and the compares that count it also carry v_lo and v_lo+1; the
// ends fall out of the same count (x ≤ v₀: 0 and v₀ nearer; x ≥ v₁₅: 14 and v₁₅ not farther). AVX-512
// counts by binary lifting over the 16 levels in one register instead (four permutes and compares).
// Blocks holding NaN or Inf, below ggml's eps or of 1e9 and more are the specification's own, block by
// block; a row's last blocks, fewer than W, fill the other lanes with one of theirs.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../ref/blocks.hpp"
#include "../ref/half.hpp"
#include "../ref/kernels.hpp"
#include "xsimd_compat.hpp"

namespace kvq::simd {
namespace {

// Search: iq4_nls (ggml's scale search over 16 candidates), else iq4_nl (one scale).
template <class A, bool Search>
struct QuantizeIQ4NL {
    using F = xsimd::batch<float, A>;
    static constexpr int W = static_cast<int>(F::size);
    static constexpr int kQK = static_cast<int>(detail::kQK);

    static float level(int k) { return static_cast<float>(detail::kIQ4NLValues[k]); }

    // The nearest level's index (as floats) and value for finite or infinite x, a tie where ggml's compare
    // x − v_lo < v_hi − x sends it (to the upper level).
    static void nearest(F x, F& index, F& value) {
#if defined(__AVX512F__)
        if constexpr (std::is_base_of_v<xsimd::avx512f, A>) {
            // The same count by binary lifting over the 16 levels in one register: the largest k with
            // v_k ≤ x (0 when there is none), at most 14.
            static constexpr auto kLevels = [] {
                std::array<float, 16> t{};
                for (int j = 0; j < 16; ++j) t[j] = detail::kIQ4NLValues[j];
                return t;
            }();
            const __m512 table = _mm512_loadu_ps(kLevels.data());
            __m512i k = _mm512_setzero_si512();
            for (int step = 8; step >= 1; step /= 2) {
                const __m512i t = _mm512_add_epi32(k, _mm512_set1_epi32(step));
                const __mmask16 ge = _mm512_cmp_ps_mask(x, _mm512_permutexvar_ps(t, table), _CMP_GE_OQ);
                k = _mm512_mask_mov_epi32(k, ge, t);
            }
            k = _mm512_min_epi32(k, _mm512_set1_epi32(14));
            const __m512 lo = _mm512_permutexvar_ps(k, table);
            const __m512 hi = _mm512_permutexvar_ps(_mm512_add_epi32(k, _mm512_set1_epi32(1)), table);
            const __mmask16 lower = _mm512_cmp_ps_mask(_mm512_sub_ps(x, lo), _mm512_sub_ps(hi, x), _CMP_LT_OQ);
            const __m512 count = _mm512_cvtepi32_ps(k);
            index = _mm512_mask_blend_ps(lower, _mm512_add_ps(count, _mm512_set1_ps(1.0f)), count);
            value = _mm512_mask_blend_ps(lower, hi, lo);
            return;
        }
#endif
        F count(0.0f), lo(level(0)), hi(level(1));
        for (int k = 1; k < 15; ++k) {
            const auto ge = x >= F(level(k));
            count = xsimd::select(ge, count + F(1.0f), count);
            lo = xsimd::select(ge, F(level(k)), lo);
            hi = xsimd::select(ge, F(level(k + 1)), hi);
        }
        const auto lower = (x - lo) < (hi - x);
        index = xsimd::select(lower, count, count + F(1.0f));
        value = xsimd::select(lower, lo, hi);
    }

    // Σ w·q·x and Σ w·q² over the block's values at inverse scale id, j = 0..31 in order.
    static void fit(const F* x, const F* w, F id, F& sumqx, F& sumq2) {
        sumqx = sumq2 = F(0.0f);
        for (int j = 0; j < kQK; ++j) {
            F index, q;
            nearest(id * x[j], index, q);
            sumqx = sumqx + (w[j] * q) * x[j];
            sumq2 = sumq2 + (w[j] * q) * q;
        }
    }

    // W blocks that take the vector path (plain), lane l's from src[l], into dst (W blocks).
    static void blocks(const float* const* src, uint8_t* dst) {
        alignas(64) float t[kQK][W];
        for (int l = 0; l < W; ++l)
            for (int j = 0; j < kQK; ++j) t[j][l] = src[l][j];
        F v[kQK], w[kQK];
        F amax(0.0f), max(0.0f);
        for (int j = 0; j < kQK; ++j) {
            v[j] = F::load_aligned(t[j]);
            w[j] = v[j] * v[j];
            const F a = xsimd::abs(v[j]);
            const auto more = amax < a;  // the first of equal magnitudes stays
            amax = xsimd::select(more, a, amax);
            max = xsimd::select(more, v[j], max);
        }
        F d, sumqx, sumq2;
        if constexpr (Search) {
            fit(v, w, divide(F(1.0f), divide(-max, F(level(0)))), sumqx, sumq2);
            d = xsimd::select(sumq2 > F(0.0f), divide(sumqx, sumq2), F(0.0f));
            F best = d * sumqx;
            for (int itry = -7; itry <= 7; ++itry) {
                fit(v, w, divide(F(static_cast<float>(itry + detail::kIQ4NLValues[0])), max), sumqx, sumq2);
                const auto better = (sumq2 > F(0.0f)) & (sumqx * sumqx > best * sumq2);
                d = xsimd::select(better, divide(sumqx, sumq2), d);
                best = xsimd::select(better, d * sumqx, best);
            }
        } else {
            fit(v, w, divide(F(1.0f), divide(max, F(level(0)))), sumqx, sumq2);
            d = divide(sumqx, sumq2);
        }
        // The codes at 1/d (iq4_nl: those of its one fit, at the same inverse scale).
        const F id = Search ? xsimd::select(d != F(0.0f), divide(F(1.0f), d), F(0.0f))
                            : divide(F(1.0f), divide(max, F(level(0))));
        alignas(64) float code[kQK][W], scale[W];
        for (int j = 0; j < kQK; ++j) {
            F index, q;
            nearest(id * v[j], index, q);
            index.store_aligned(code[j]);
        }
        d.store_aligned(scale);
        for (int l = 0; l < W; ++l) {
            detail::BlockIQ4_NL b{};
            b.d = detail::f32_to_f16(scale[l]);
            for (int j = 0; j < kQK / 2; ++j) {
                b.qs[j] = static_cast<uint8_t>(static_cast<int>(code[j][l]) | static_cast<int>(code[kQK / 2 + j][l]) << 4);
            }
            std::memcpy(dst + l * sizeof b, &b, sizeof b);
        }
    }

    // Whether a block takes the vector path: finite, at least ggml's eps, and below 1e9, where no sum
    // overflows to Inf and d cannot be NaN (the specification's codes at a NaN 1/d are its own case).
    static bool plain(const float* xb) {
        float amax = 0.0f;
        for (int j = 0; j < kQK; ++j) {
            if (!std::isfinite(xb[j])) return false;
            amax = std::fmax(amax, std::fabs(xb[j]));
        }
        return amax >= 1e-15f && amax < 1e9f;  // ggml's GROUP_MAX_EPS
    }

    // A row of n values (a multiple of 32) W blocks at a time; a group's lanes past the row's end, or
    // whose block is not plain, take a plain block of the group and their bytes come from the
    // specification instead.
    static void quantize(const float* x, uint8_t* dst, int64_t n) {
        const auto spec = (Search ? detail::kScalarIQ4_NLS : detail::kScalarIQ4_NL).quantize;
        constexpr size_t kBlock = sizeof(detail::BlockIQ4_NL);
        const int64_t nb = n / kQK;
        for (int64_t b = 0; b < nb; b += W) {
            const int count = static_cast<int>(nb - b < W ? nb - b : W);
            bool own[W] = {};
            int first = -1;
            for (int l = 0; l < count; ++l) {
                own[l] = plain(x + (b + l) * kQK);
                if (own[l] && first < 0) first = l;
            }
            if (first >= 0) {
                const float* src[W];
                for (int l = 0; l < W; ++l) src[l] = x + (b + (own[l] ? l : first)) * kQK;
                alignas(64) uint8_t out[W * kBlock];
                blocks(src, out);
                for (int l = 0; l < count; ++l) {
                    if (own[l]) std::memcpy(dst + (b + l) * kBlock, out + l * kBlock, kBlock);
                }
            }
            for (int l = 0; l < count; ++l) {
                if (!own[l]) spec(x + (b + l) * kQK, dst + (b + l) * kBlock, kQK);
            }
        }
    }
};

}  // namespace
}  // namespace kvq::simd
