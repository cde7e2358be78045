// tcqB's Viterbi encoder over 4-float batches (the sse2 and neon levels; AVX2's: tcq_viterbi_avx2.hpp). It
// writes the specification's u and f (tcq_viterbi, lib/ref/tcq.hpp) for any input, NaN and Inf included,
// because it does the same float operations on the same operands and decides as the specification's
// compares do:
// - each subset's least e·e (e = t − level, no fma) is a chain over the subset's levels in rank order,
//   select(sq < best, sq, best), four values at a time (a row's values are independent here);
// - the add-compare-select is one value at a time with the 8 states in two batches: destination `to`
//   takes c0 = cost[to >> 1] + err and c1 = cost[(to >> 1) | 4] + err (the predecessors by zip_lo /
//   zip_hi of a batch with itself, the branch errors in lane order), and select(c1 < c0, c1, c0) is the
//   specification's select (NaN compares false, so c0 is kept);
// - the costs before each value are kept instead of the choices: the traceback makes the compare again for
//   the one state on the path, on the same operands, so it takes the same branch.
#pragma once

#include <cstdint>
#include <vector>

#include "../ref/rotated_quantize.hpp"
#include "../ref/tcq.hpp"
#include "xsimd_compat.hpp"

namespace kvq::simd {
namespace {
namespace portable {

template <class A>
float tcq_viterbi(const detail::TcqAlphabet& a, const float* t, int n, uint8_t* u, uint8_t* f) {
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    static_assert(F::size == 4, "the states are two batches of four");
    static const struct Trellis {
        uint8_t subset[8][2];  // [state][u]: the branch's subset
        Trellis() {
            for (int s = 0; s < 8; ++s)
                for (int b = 0; b < 2; ++b) subset[s][b] = static_cast<uint8_t>(detail::tcq_branch_subset(s, b));
        }
    } tr;
    // Per value: the four subsets' least errors and f codes (subset-major), the branch errors in the lanes'
    // order (below), and the eight costs before it.
    thread_local std::vector<float> err_buffer, branch_buffer, cost_buffer;
    thread_local std::vector<int32_t> nearest_buffer;
    const size_t padded = (size_t(n) + 3) & ~size_t(3);
    if (err_buffer.size() < padded * 4) {
        err_buffer.resize(padded * 4), nearest_buffer.resize(padded * 4);
        branch_buffer.resize(padded * 16), cost_buffer.resize(padded * 8);
    }
    float* err = err_buffer.data();
    int32_t* nearest = nearest_buffer.data();
    float* branch = branch_buffer.data();
    float* before = cost_buffer.data();
    const int per_subset = a.n_levels / 4;
    for (int j = 0; j < n; j += 4) {
        alignas(16) float v4[4] = {};
        for (int k = 0; k < 4 && j + k < n; ++k) v4[k] = t[j + k];
        const F v = F::load_aligned(v4);
        for (int s = 0; s < 4; ++s) {
            const F e0 = v - F(a.levels[s]);
            F best = e0 * e0;
            I best_f(0);
            for (int k = 1; k < per_subset; ++k) {
                const F e = v - F(a.levels[4 * k + s]);
                const F sq = e * e;
                const auto lt = sq < best;
                best = xsimd::select(lt, sq, best);
                best_f = xsimd::select(xsimd::bool_cast(lt), I(k), best_f);
            }
            best.store_unaligned(err + s * padded + j);
            best_f.store_unaligned(nearest + s * padded + j);
        }
        // The branch into `to` from p0 = to >> 1 has subset [0, 2, 2, 0 | 1, 3, 3, 1][to], from p0 | 4 that
        // ^ 2: per value the errors of c0 (states 0..3), c1 (0..3), c0 (4..7), c1 (4..7).
        static constexpr int kSubset[16] = {0, 2, 2, 0, 2, 0, 0, 2, 1, 3, 3, 1, 3, 1, 1, 3};
        for (int k = 0; k < 4 && j + k < n; ++k) {
            float* b = branch + 16 * size_t(j + k);
            for (int l = 0; l < 16; ++l) b[l] = err[kSubset[l] * padded + j + k];
        }
    }
    alignas(16) static constexpr float kStart[4] = {0.0f, INFINITY, INFINITY, INFINITY};
    F lo = F::load_aligned(kStart), hi(INFINITY);  // states 0..3, 4..7: every row starts in state 0
    for (int j = 0; j < n; ++j) {
        lo.store_unaligned(before + 8 * size_t(j));
        hi.store_unaligned(before + 8 * size_t(j) + 4);
        const float* b = branch + 16 * size_t(j);
        const F c0_lo = xsimd::zip_lo(lo, lo) + F::load_unaligned(b), c1_lo = xsimd::zip_lo(hi, hi) + F::load_unaligned(b + 4);
        const F c0_hi = xsimd::zip_hi(lo, lo) + F::load_unaligned(b + 8), c1_hi = xsimd::zip_hi(hi, hi) + F::load_unaligned(b + 12);
        lo = xsimd::select(c1_lo < c0_lo, c1_lo, c0_lo);
        hi = xsimd::select(c1_hi < c0_hi, c1_hi, c0_hi);
    }
    alignas(16) float last[8];
    lo.store_aligned(last);
    hi.store_aligned(last + 4);
    int state = 0;
    for (int s = 1; s < 8; ++s) {
        if (last[s] < last[state]) state = s;
    }
    const float total = last[state];
    for (int j = n - 1; j >= 0; --j) {
        const int bit = state & 1, p0 = state >> 1, p1 = p0 | 4;
        const float* c = before + 8 * size_t(j);
        const float c0 = c[p0] + err[tr.subset[p0][bit] * padded + j];
        const float c1 = c[p1] + err[tr.subset[p1][bit] * padded + j];
        const int prev = c1 < c0 ? p1 : p0;
        u[j] = static_cast<uint8_t>(bit);
        f[j] = static_cast<uint8_t>(nearest[tr.subset[prev][bit] * padded + j]);
        state = prev;
    }
    return total;
}

// The quantize of the rows tcq2 and tcq3 at sse2 and neon: the specification's row steps with this
// encoder (no residual: tcqB has no QJL stage).
template <class A, int B>
void tcq_quantize(const detail::TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride,
                  float*) {
    const detail::TcqAlphabet& a = detail::tcq_alphabet(B);
    for (size_t r = 0; r < n_rows; ++r) detail::tcq_quantize_row(a, l, x + r * l.rot.d, dst + r * dst_stride, tcq_viterbi<A>);
}

}  // namespace portable
}  // namespace
}  // namespace kvq::simd
