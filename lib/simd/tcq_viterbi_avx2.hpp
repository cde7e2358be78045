// tcqB's Viterbi encoder in 256-bit registers (the avx2 level; the avx512 levels call it too; the rest of
// a tcqB row: quantize_tcq_avx2.hpp). It writes the specification's u and f (tcq_viterbi, lib/ref/tcq.hpp)
// for any input, NaN and Inf included, because it does the same float operations on the same operands
// and decides as the specification's compares do:
// - each subset's least e·e (e = t − level, no fma) is a chain over the subset's levels in rank order,
//   vminps(sq, best) = sq < best ? sq : best with the f of the kept one: strict <, so a tie or a NaN
//   keeps the lower rank; eight values at a time (a row's values are independent here);
// - the add-compare-select is one value at a time with the 8 states in lanes: vpermps gathers each
//   destination's two predecessor costs and branch errors, c0 = cost[to >> 1] + err, c1 = cost[(to >> 1)
//   | 4] + err, and vminps(c1, c0) = c1 < c0 ? c1 : c0 is the specification's select (NaN compares
//   false, so c0 is kept); the choices are the compare's sign bits, a byte per value (bit `to`);
// - the end state and the traceback are the specification's scalar loops.
#pragma once

#include <immintrin.h>

#include <cstring>
#include <vector>

#include "../ref/tcq.hpp"

namespace kvq::simd {
namespace {
namespace avx2 {

// The trellis as index vectors, from the specification's tcq_branch_subset: for destination state `to`
// (a lane), its predecessors p0 = to >> 1, p1 = p0 | 4 and the subsets of their branches u = to & 1.
struct TcqTrellis {
    alignas(32) int32_t p0[8], p1[8], sub0[8], sub1[8];
    uint8_t subset[8][2];
    TcqTrellis() {
        for (int to = 0; to < 8; ++to) {
            p0[to] = to >> 1, p1[to] = (to >> 1) | 4;
            sub0[to] = detail::tcq_branch_subset(p0[to], to & 1), sub1[to] = detail::tcq_branch_subset(p1[to], to & 1);
        }
        for (int s = 0; s < 8; ++s) {
            for (int b = 0; b < 2; ++b) subset[s][b] = static_cast<uint8_t>(detail::tcq_branch_subset(s, b));
        }
    }
};

// Values j0..j0 + 7 (t zero-padded past n): err[4j + s] = subset s's least e·e, nearest[4j + s] its f.
inline void tcq_subset_errors8(const detail::TcqAlphabet& a, const float* t, int n, int j0, float* err,
                               uint8_t* nearest) {
    __m256 v;
    if (n - j0 >= 8) {
        v = _mm256_loadu_ps(t + j0);
    } else {
        alignas(32) float pad[8] = {};
        std::memcpy(pad, t + j0, sizeof(float) * size_t(n - j0));
        v = _mm256_load_ps(pad);
    }
    const int per_subset = a.n_levels / 4;
    __m256 best[4];
    __m256i f = _mm256_setzero_si256();  // subset s's f in byte s of each value's dword
    for (int s = 0; s < 4; ++s) {
        const __m256 e0 = _mm256_sub_ps(v, _mm256_set1_ps(a.levels[s]));
        __m256 b = _mm256_mul_ps(e0, e0);
        __m256i bf = _mm256_setzero_si256();
        for (int k = 1; k < per_subset; ++k) {
            const __m256 e = _mm256_sub_ps(v, _mm256_set1_ps(a.levels[4 * k + s]));
            const __m256 sq = _mm256_mul_ps(e, e);
            const __m256 lt = _mm256_cmp_ps(sq, b, _CMP_LT_OQ);
            b = _mm256_min_ps(sq, b);
            bf = _mm256_blendv_epi8(bf, _mm256_set1_epi32(k), _mm256_castps_si256(lt));
        }
        best[s] = b;
        f = _mm256_or_si256(f, _mm256_slli_epi32(bf, 8 * s));
    }
    // 4 × 8 (subset, value) to 8 × 4 (value, subset).
    const __m256 t0 = _mm256_unpacklo_ps(best[0], best[1]), t1 = _mm256_unpackhi_ps(best[0], best[1]);
    const __m256 t2 = _mm256_unpacklo_ps(best[2], best[3]), t3 = _mm256_unpackhi_ps(best[2], best[3]);
    const __m256 r0 = _mm256_shuffle_ps(t0, t2, 0x44), r1 = _mm256_shuffle_ps(t0, t2, 0xEE);  // values 0|4, 1|5
    const __m256 r2 = _mm256_shuffle_ps(t1, t3, 0x44), r3 = _mm256_shuffle_ps(t1, t3, 0xEE);  // values 2|6, 3|7
    float* out = err + 4 * j0;
    _mm256_storeu_ps(out, _mm256_permute2f128_ps(r0, r1, 0x20));
    _mm256_storeu_ps(out + 8, _mm256_permute2f128_ps(r2, r3, 0x20));
    _mm256_storeu_ps(out + 16, _mm256_permute2f128_ps(r0, r1, 0x31));
    _mm256_storeu_ps(out + 24, _mm256_permute2f128_ps(r2, r3, 0x31));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(nearest + 4 * j0), f);
}

// tcq_viterbi's contract (tcq.hpp): the same u, f and returned cost; and, where rank is not null, each
// value's rank 4·f + subset, which the traceback has at hand (tcq_rank's, without reading it back from the
// packed row). Uses buffers of this thread, grown once (25 bytes per value).
inline float tcq_viterbi_ranks(const detail::TcqAlphabet& a, const float* t, int n, uint8_t* u, uint8_t* f,
                               int32_t* rank) {
    static const TcqTrellis tr;
    thread_local std::vector<float> err_buffer;
    thread_local std::vector<uint8_t> byte_buffer;
    const size_t padded = (size_t(n) + 7) & ~size_t(7);
    if (err_buffer.size() < padded * 4) err_buffer.resize(padded * 4), byte_buffer.resize(padded * 5);
    float* err = err_buffer.data();
    uint8_t* nearest = byte_buffer.data();
    uint8_t* from = nearest + padded * 4;  // bit `to`: the state kept its predecessor with u_{j−3} = 1
    for (int j0 = 0; j0 < n; j0 += 8) tcq_subset_errors8(a, t, n, j0, err, nearest);

    const __m256i p0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(tr.p0));
    const __m256i p1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(tr.p1));
    const __m256i sub0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(tr.sub0));
    const __m256i sub1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(tr.sub1));
    __m256 cost = _mm256_setr_ps(0, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY, INFINITY);
    for (int j = 0; j < n; ++j) {
        const __m256 e = _mm256_broadcast_ps(reinterpret_cast<const __m128*>(err + 4 * j));  // subsets 0..3, twice
        const __m256 c0 = _mm256_add_ps(_mm256_permutevar8x32_ps(cost, p0), _mm256_permutevar8x32_ps(e, sub0));
        const __m256 c1 = _mm256_add_ps(_mm256_permutevar8x32_ps(cost, p1), _mm256_permutevar8x32_ps(e, sub1));
        from[j] = static_cast<uint8_t>(_mm256_movemask_ps(_mm256_cmp_ps(c1, c0, _CMP_LT_OQ)));
        cost = _mm256_min_ps(c1, c0);
    }
    alignas(32) float last[8];
    _mm256_store_ps(last, cost);
    int state = 0;
    for (int s = 1; s < 8; ++s) {
        if (last[s] < last[state]) state = s;
    }
    const float total = last[state];
    for (int j = n - 1; j >= 0; --j) {
        const int bit = state & 1, prev = (state >> 1) | ((from[j] >> state) & 1) << 2;
        const int subset = tr.subset[prev][bit];
        u[j] = static_cast<uint8_t>(bit);
        f[j] = nearest[4 * j + subset];
        if (rank) rank[j] = 4 * f[j] + subset;
        state = prev;
    }
    return total;
}

inline float tcq_viterbi(const detail::TcqAlphabet& a, const float* t, int n, uint8_t* u, uint8_t* f) {
    return tcq_viterbi_ranks(a, t, n, u, f, nullptr);
}

}  // namespace avx2
}  // namespace
}  // namespace kvq::simd
