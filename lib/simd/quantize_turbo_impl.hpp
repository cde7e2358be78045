// The SIMD quantizer of the turbo codecs (TurboQuant-MSE, arXiv 2504.19874), over the rotation, the rank
// search and the bit packing of quantize_rotated_impl.hpp (which says why the bytes are the
// specification's). A tile of rows goes in three passes: the norms, the codes (two rows at a time, their
// chains interleaved), the scales. The partial sums are added in registers by the specification's tree
// (sum16, below), and the scale is turbo_store_scale's arithmetic (rotated_quantize_scalar.cpp), the
// tile's scales converted to fp16 together.
#pragma once

#include <cfloat>

#include "quantize_rotated_impl.hpp"

namespace kvq::simd {
namespace {

template <class A>
struct TurboQuantize : RotatedQuantize<A> {
    using Base = RotatedQuantize<A>;
    using typename Base::D;
    using typename Base::F;
    using typename Base::I;
    using typename Base::O;
    using typename Base::R;
    using typename Base::Rot;
    using typename Base::Steps;
    using Base::N;
    using Base::kGroup;
    using Base::kMaxD;

    static bool turbo_fits(const detail::TurboQuantizeLayout& l) {
        if (!Rot::fits(l.rot) || l.row_bytes > kMaxD) return false;
        for (int s = 0; s < l.n_sections; ++s) {
            const detail::TurboSection& sec = l.sections[s];
            if (sec.begin % 16 || sec.count % N || sec.bits < 1 || sec.bits > 4 || sec.bit_off % 8) return false;
            const int half = 1 << (sec.bits - 1);
            for (int k = 0; k < 2 * half; ++k) {  // sign-magnitude codes, as below
                const int t = k - half, code = t >= 0 ? t : (~t | half);
                if (sec.code_by_rank[k] != code) return false;
                if (sec.value_by_rank[k] != -sec.value_by_rank[2 * half - 1 - k]) return false;  // exactly ±
            }
        }
        return true;
    }

    // The row's norm from 16 partial sums of x² in double (the specification's order). x² is exact in
    // double, so fmadd(x, x, s) rounds as s + x² does.
    static double row_norm(const float* x, int d) {
        constexpr int kD = D::size, kNormRegs = 16 / kD;
        D sq[kNormRegs];
        for (auto& s : sq) s = D(0.0);
        for (int k = 0; k < d / N; ++k) {
            D lo, hi;
            R::load_wide(x + k * N, lo, hi);
            sq[(2 * k) % kNormRegs] = R::fmadd(lo, lo, sq[(2 * k) % kNormRegs]);
            sq[(2 * k + 1) % kNormRegs] = R::fmadd(hi, hi, sq[(2 * k + 1) % kNormRegs]);
        }
        return std::sqrt(sum16<kNormRegs>(sq));
    }

    // sum16_double / sum16_float (rotated_quantize_scalar.cpp) of the 16 partials in M registers (partial
    // j in lane j mod L of register j / L): p[i] + p[i + 8], then + 4, + 2, + 1 — across registers while
    // there are several, then inside the last one (sum_lanes).
    template <int M, class V>
    static auto sum16(V* regs) {
        for (int m = M; m > 1; m /= 2) {
            for (int i = 0; i < m / 2; ++i) regs[i] = regs[i] + regs[i + m / 2];
        }
        return R::sum_lanes(regs[0]);
    }
    // turbo_inverse_norm and turbo_store_scale's scale (rotated_quantize_scalar.cpp), for a row taken here
    // (its norm is finite).
    static float inverse_norm(double norm) {
        const double inv = norm > 0 ? 1.0 / norm : 0.0;
        return inv <= FLT_MAX ? static_cast<float>(inv) : 0.0f;
    }
    static float scale(int mode, double norm, float cu, float cc) {
        double s = norm;
        if (mode == 1) s = cc > 0 ? norm * double(cu) / double(cc) : 0.0;
        if (mode == 2) s = cu > 0 ? norm / double(cu) : 0.0;
        return static_cast<float>(s);
    }

    // Per section: the rank search's tables and the code of each rank (16 bytes, for pack_codes).
    struct TurboTables {
        Steps steps[2];
        alignas(16) uint8_t code[2][16] = {};
        explicit TurboTables(const detail::TurboQuantizeLayout& l) {
            for (int s = 0; s < l.n_sections; ++s) {
                const detail::TurboSection& sec = l.sections[s];
                steps[s].build(sec.bounds, sec.bits);
                for (int k = 0; k < (1 << sec.bits); ++k) code[s][k] = sec.code_by_rank[k];
            }
        }
    };

    // What a row carries through the code passes (turbo_rows): its rotated values, its row buffer, its
    // partial sums of ⟨c, u⟩ and ‖c‖² in kSumRegs registers (value j adds to partial j mod 16) and where
    // its residual goes (or null).
    static constexpr int kSumRegs = 16 / N;
    struct TurboRow {
        alignas(64) float u[kMaxD];
        alignas(64) uint8_t buf[kMaxD + 128];
        F inv, cu[kSumRegs], cc[kSumRegs];
        float* residual;
    };

    // One section's codes of K rows, a group of kGroup values (regs registers) at a time, row after row
    // within a register (the rows' chains of compares and lookups are independent, so they overlap): where
    // the level packs codes in registers (pack_codes), straight into each row's buffer; elsewhere as int32
    // codes (codes[k], from the section's index 0), packed at the end (pack).
    template <int B, int K, bool Bucketed, bool Residual>
    [[gnu::always_inline]] static inline void turbo_group(const detail::TurboSection& sec, const Steps& st,
                                                          const uint8_t* code_map, TurboRow* rows, F (*cu)[kSumRegs],
                                                          F (*cc)[kSumRegs], int j0, int regs, int32_t (*codes)[kMaxD + 32]) {
        const I half(1 << (B - 1)), sign(int32_t(0x80000000u));
        const float* magnitude = sec.value_by_rank + (1 << (B - 1));
        I rk[K][4];
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
            // (j / N) % kSumRegs == p % kSumRegs: begin is a multiple of 16, kGroup of 16 / N registers.
            const int j = j0 + p * N;
#pragma GCC unroll 4
            for (int k = 0; k < K; ++k) {
                TurboRow& row = rows[k];
                if (p >= regs) {
                    rk[k][p] = half;  // code 0
                    continue;
                }
                const F v = F::load_aligned(row.u + j) * row.inv;
                const I r = Base::template rank_fixed<B, Bucketed>(v, sec.bounds, st);
                rk[k][p] = r;
                // The rank's value; without a one-instruction 16-entry lookup, ± the magnitude's (its
                // sign-magnitude code).
                const I t = r - half, neg = t >> 31, m = t ^ neg;
                F c;
                if constexpr (B <= 3) {
                    c = R::lookup8(sec.value_by_rank, r);
                } else if constexpr (R::kLookup16) {
                    c = R::lookup16(sec.value_by_rank, r);
                } else {
                    c = R::lookup8(magnitude, m) ^ bit_cast<float>(neg & sign);
                }
                cu[k][p % kSumRegs] = cu[k][p % kSumRegs] + c * v;
                cc[k][p % kSumRegs] = cc[k][p % kSumRegs] + c * c;
                if constexpr (Residual) (v - c).store_unaligned(row.residual + j);
                if constexpr (!R::kPackCodes) (m | (neg & half)).store_aligned(codes[k] + (j - sec.begin));
            }
        }
        if constexpr (R::kPackCodes) {  // turbo_fits: a section starts on a byte
            for (int k = 0; k < K; ++k) {
                R::template pack_codes<B>(rk[k], code_map, rows[k].buf + sec.bit_off / 8 + size_t(j0 - sec.begin) * B / 8);
            }
        }
    }
    // Not inlined, as polar_level (quantize_polar_impl.hpp): one call per section and rows.
    template <int B, int K, bool Bucketed, bool Residual>
    [[gnu::noinline]] static void turbo_section(const detail::TurboSection& sec, const Steps& st, const uint8_t* code_map, TurboRow* rows) {
        const int end = sec.begin + sec.count;
        alignas(64) int32_t codes[R::kPackCodes ? 1 : K][kMaxD + 32];
        F cu[K][kSumRegs], cc[K][kSumRegs];  // in registers: the rows' buffers are written through byte pointers
        for (int k = 0; k < K; ++k) {
            for (int i = 0; i < kSumRegs; ++i) {
                cu[k][i] = rows[k].cu[i];
                cc[k][i] = rows[k].cc[i];
            }
        }
        int j0 = sec.begin;
        for (; j0 + kGroup <= end; j0 += kGroup) turbo_group<B, K, Bucketed, Residual>(sec, st, code_map, rows, cu, cc, j0, 4, codes);
        if (j0 < end) turbo_group<B, K, Bucketed, Residual>(sec, st, code_map, rows, cu, cc, j0, (end - j0) / N, codes);
        for (int k = 0; k < K; ++k) {
            for (int i = 0; i < kSumRegs; ++i) {
                rows[k].cu[i] = cu[k][i];
                rows[k].cc[i] = cc[k][i];
            }
        }
        if constexpr (!R::kPackCodes) {
            for (int k = 0; k < K; ++k) {
                Base::zero_tail(codes[k], sec.count);
                Base::pack(codes[k], sec.count, B, rows[k].buf, sec.bit_off);
            }
        }
    }

    // The codes of K rows (into their rows) and the sums ⟨c, u⟩ and ‖c‖² of each (cu, cc); their scales
    // are stored after (turbo, below).
    template <int K>
    static void turbo_rows(const detail::TurboQuantizeLayout& l, const TurboTables& tables, const float* const* x,
                           const float* inverse, uint8_t* const* row, float* const* residual, float* cu, float* cc) {
        TurboRow rows[K];
        for (int k = 0; k < K; ++k) {
            TurboRow& t = rows[k];
            Base::zero_bytes(t.buf, l.row_bytes + 8);
            Rot::apply(l.rot, x[k], t.u);
            t.inv = F(inverse[k]);
            for (int i = 0; i < kSumRegs; ++i) t.cu[i] = t.cc[i] = F(0.0f);
            t.residual = residual[k];
        }
        for (int s = 0; s < l.n_sections; ++s) {
            Base::with_bits(l.sections[s].bits, [&](auto bits) {
                constexpr int B = decltype(bits)::value;
                if constexpr (B >= 1 && B <= 4) {
                    Base::template with_rank_kind<B>(tables.steps[s], [&](auto bucketed) {
                        constexpr bool kBucketed = decltype(bucketed)::value;
                        if (rows[0].residual) {
                            turbo_section<B, K, kBucketed, true>(l.sections[s], tables.steps[s], tables.code[s], rows);
                        } else {
                            turbo_section<B, K, kBucketed, false>(l.sections[s], tables.steps[s], tables.code[s], rows);
                        }
                    });
                }
            });
        }
        for (int k = 0; k < K; ++k) {
            cu[k] = sum16<kSumRegs>(rows[k].cu);
            cc[k] = sum16<kSumRegs>(rows[k].cc);
            Base::copy_bytes(row[k], rows[k].buf, l.row_bytes);
        }
    }

    static void turbo(const detail::TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                      size_t dst_stride, float* residual) {
        const int d = l.rot.d;
        if (!turbo_fits(l)) {
            detail::turbo_quantize_rows_spec(l, x, n_rows, dst, dst_stride, residual);
            return;
        }
        // A tile of rows in three passes: the norms (and their inverses), the codes (two rows at a time),
        // the scales. A row's codes wait for its norm's sum, square root and division, its scale for its
        // partial sums, their trees and a division: in passes over several rows, their chains overlap.
        constexpr size_t kTile = 4, kPrefetch = 8;
        const TurboTables tables(l);
        for (size_t r0 = 0; r0 < n_rows; r0 += kTile) {
            const size_t n = std::min(kTile, n_rows - r0);
            const float* xs[kTile];
            uint8_t* rows[kTile];
            float* res[kTile];
            double norms[kTile];
            float inverse[kTile];
            bool taken[kTile];  // the others are NaN, Inf or huge: the specification's NaN operand order matters
            for (size_t r = 0; r < n; ++r) {
                xs[r] = x + (r0 + r) * d;
                rows[r] = dst + (r0 + r) * dst_stride;
                res[r] = residual ? residual + (r0 + r) * d : nullptr;
                Base::prefetch_row(x + (r0 + r + kPrefetch) * d, d);
                norms[r] = row_norm(xs[r], d);
                inverse[r] = inverse_norm(norms[r]);
                taken[r] = norms[r] <= 1e30;
            }
            float cu[kTile], cc[kTile];
            for (size_t r = 0; r < n;) {
                if (r + 1 < n && taken[r] && taken[r + 1]) {
                    turbo_rows<2>(l, tables, xs + r, inverse + r, rows + r, res + r, cu + r, cc + r);
                    r += 2;
                    continue;
                }
                if (taken[r]) {
                    turbo_rows<1>(l, tables, xs + r, inverse + r, rows + r, res + r, cu + r, cc + r);
                } else {
                    detail::turbo_quantize_row_spec(l, xs[r], rows[r], res[r]);
                }
                ++r;
            }
            alignas(64) float scales[N > kTile ? N : kTile] = {};
            alignas(64) uint16_t halves[N > kTile ? N : kTile];
            for (size_t r = 0; r < n; ++r) scales[r] = taken[r] ? scale(l.scale_mode, norms[r], cu[r], cc[r]) : 0.0f;
            for (size_t r = 0; r < kTile; r += N) O::store_f16(halves + r, F::load_aligned(scales + r));
            for (size_t r = 0; r < n; ++r) {
                if (taken[r]) std::memcpy(rows[r] + l.norm_off, halves + r, 2);
            }
        }
    }
};

}  // namespace
}  // namespace kvq::simd
