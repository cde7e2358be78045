// A tcqB row's quantize at the x86 levels (tcq_quantize_row, rotated_quantize_scalar.cpp, is the
// specification): the same bytes from the same float operations in the same order.
// - the norm and the rotation are turbo's (quantize_turbo_impl.hpp): rotate_row's 16 double partials of
//   x² and Rotation::apply, the same computation (rotated_quantize.hpp); a row is taken here when its
//   norm is at most 1e30, as turbo's, and fits the rotation's registers, else it is the specification's
//   row with the AVX2 Viterbi;
// - u = y·(1/‖x‖) and t = u·fl(√d) lane by lane, then the Viterbi (tcq_viterbi_avx2.hpp), whose traceback
//   also gives each value's rank;
// - the codes as words: d is a multiple of 32 (turbo.cpp), so 32 values fill whole bytes of the u plane
//   (a movemask of the u bytes), of tcq2's 1-bit f codes (the same) and of tcq3's 2-bit ones (four codes
//   to a byte, code k of a byte in bits 2k, 2k + 1: put_code's order);
// - c = level(rank) by a lookup in registers, and cu[j mod 16] += c·u, cc[j mod 16] += c·c in 16 lanes,
//   added by turbo's tree, then the specification's turbo_store_scale.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "quantize_turbo_impl.hpp"
#include "tcq_viterbi_avx2.hpp"

namespace kvq::simd {
namespace {
namespace avx2 {

// Values j..j + 31 of u (bytes 0/1) and f into the row: plane bits at `plane`, f codes at `codes`.
inline void tcq_pack32(int bits, const uint8_t* u, const uint8_t* f, uint8_t* codes, uint8_t* plane) {
    // A byte's bit 0 to its sign, then a bit per byte.
    auto low_bits = [](__m256i b) { return static_cast<uint32_t>(_mm256_movemask_epi8(_mm256_slli_epi16(b, 7))); };
    const uint32_t u_bits = low_bits(_mm256_load_si256(reinterpret_cast<const __m256i*>(u)));
    std::memcpy(plane, &u_bits, 4);
    const __m256i fb = _mm256_load_si256(reinterpret_cast<const __m256i*>(f));
    if (bits == 2) {
        const uint32_t f_bits = low_bits(fb);
        std::memcpy(codes, &f_bits, 4);
        return;
    }
    // Per dword of four codes: (f0 + 4·f1) + 16·(f2 + 4·f3), then the low byte of each dword.
    const __m256i pairs = _mm256_maddubs_epi16(fb, _mm256_set1_epi16(0x0401));
    const __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x00100001));
    const __m256i low = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                         0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
    const __m256i bytes = _mm256_shuffle_epi8(quads, low);
    const uint32_t lo = static_cast<uint32_t>(_mm256_extract_epi32(bytes, 0));
    const uint32_t hi = static_cast<uint32_t>(_mm256_extract_epi32(bytes, 4));
    std::memcpy(codes, &lo, 4);
    std::memcpy(codes + 4, &hi, 4);
}

template <class A>
struct TcqQuantize : TurboQuantize<A> {
    using Base = TurboQuantize<A>;
    using typename Base::F;
    using typename Base::I;
    using typename Base::R;
    using typename Base::Rot;
    using Base::N;
    using Base::kMaxD;
    using Base::kSumRegs;

    static void row(const detail::TcqAlphabet& a, const detail::TurboQuantizeLayout& l, const float* x, uint8_t* row) {
        const int d = l.rot.d;
        const double norm = Rot::fits(l.rot) ? Base::row_norm(x, d) : NAN;
        if (!(norm <= 1e30)) return detail::tcq_quantize_row(a, l, x, row, tcq_viterbi);
        alignas(64) float u[kMaxD], t[kMaxD];
        Rot::apply(l.rot, x, u);
        std::memset(row, 0, l.row_bytes);
        const float inv = Base::inverse_norm(norm), root_d = static_cast<float>(std::sqrt(double(d)));
        F cu[kSumRegs], cc[kSumRegs];
        for (int i = 0; i < kSumRegs; ++i) cu[i] = cc[i] = F(0.0f);
        if (inv != 0.0f) {
            for (int j = 0; j < d; j += N) {
                const F v = F::load_aligned(u + j) * F(inv);
                v.store_aligned(u + j);
                (v * F(root_d)).store_aligned(t + j);
            }
            alignas(64) uint8_t bit[kMaxD], f[kMaxD];
            alignas(64) int32_t rank[kMaxD];
            tcq_viterbi_ranks(a, t, d, bit, f, rank);
            for (int j = 0; j < d; j += 32) {
                tcq_pack32(a.bits, bit + j, f + j, row + j * (a.bits - 1) / 8, row + l.plane_off + j / 8);
            }
            for (int j0 = 0; j0 < d; j0 += 16) {
                for (int p = 0; p < kSumRegs; ++p) {
                    const int j = j0 + p * N;
                    const F c = R::lookup16(a.levels, I::load_aligned(rank + j)), v = F::load_aligned(u + j);
                    cu[p] = cu[p] + c * v;
                    cc[p] = cc[p] + c * c;
                }
            }
        }
        // c is in σ units, so the norm's own scale is ‖x‖/√d (as the specification's).
        const float cu_sum = Base::template sum16<kSumRegs>(cu), cc_sum = Base::template sum16<kSumRegs>(cc);
        detail::turbo_store_scale(l, l.scale_mode == 0 ? norm / std::sqrt(double(d)) : norm, cu_sum, cc_sum, row);
    }
};

// The quantize of the rows tcq2 and tcq3 at the x86 levels (no residual: tcqB has no QJL stage).
template <class A, int B>
void tcq_quantize(const detail::TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                  size_t dst_stride, float*) {
    const detail::TcqAlphabet& a = detail::tcq_alphabet(B);
    for (size_t r = 0; r < n_rows; ++r) TcqQuantize<A>::row(a, l, x + r * l.rot.d, dst + r * dst_stride);
}

}  // namespace avx2
}  // namespace
}  // namespace kvq::simd
