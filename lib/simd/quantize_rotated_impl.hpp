// SIMD quantizers of the turbo codecs (and what polar's, quantize_polar_impl.hpp, share), written once
// over the xsimd arch A, Ops<A> and RotOps<A> (quantize_rotated_ops.hpp). They write the bytes of the
// scalar specification (lib/spec/rotated_quantize_scalar.cpp) because they do its float operations in its
// order (lib/spec/rotated_quantize.hpp says which order): the rotation's butterflies lane by lane
// (rotate_impl.hpp), the 16 partial sums register by register (the trees and the fp16 scale are the
// specification's own out-of-line functions), ranks by a binary search over the same thresholds,
// polar_angle's operations one for one. fma only where a product is exact (x² in double, v·(±1)), so that
// it rounds as the specification's separate add does. One liberty: a butterfly's a − b is computed as
// a + (−b), which differs from it only in which NaN a NaN operand gives; so a row is taken here only when
// it is finite after the rotation (turbo: its norm is below 1e30), and every other row goes through the
// specification's row function.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../spec/rotated_quantize.hpp"
#include "ops.hpp"
#include "quantize_rotated_ops.hpp"
#include "rotate_impl.hpp"

namespace kvq::simd {
namespace {

template <class A>
struct RotatedQuantize {
    using O = Ops<A>;
    using R = RotOps<A>;
    using Rot = Rotate<A>;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    using D = xsimd::batch<double, A>;
    static constexpr int N = F::size;
    static constexpr int kMaxD = Rot::kMaxD;
    static constexpr int kPad = 2 * N + 32;  // zero lanes read past a buffer's values
    static constexpr int kGroup = 4 * N;     // values whose codes are packed together (pack_codes)

    // --- codes -------------------------------------------------------------------------------------

    // The number of thresholds t (2^bits − 1 of them, ascending) with !(v < t): std::upper_bound's rank.
    //
    // Where a 32-entry lookup is one instruction (kLookup32) and there are 7..31 thresholds: by buckets.
    // bucket(v) = trunc(clamp(fma(v, a, b), 0, 31)) is monotone in v, so a threshold in a lower bucket than
    // v's is below v and one in a higher bucket above it; if no bucket holds two thresholds, the rank is
    // the number in lower buckets (base) plus v's own bucket's one where !(v < it) (thr; +∞ if none).
    // Built from the thresholds with the same operations (std::fma is the fused fma; the vector max
    // returns its second operand, 0, for a NaN); a codebook with two thresholds in a bucket is searched.
    //
    // Otherwise by a binary search (the predicate is monotone in t, and true for every t when v is NaN):
    // step k = 1..B−1 compares with the threshold rank + s − 1 (s = 2^(B−1−k), rank a multiple of 2s).
    // Step 1 has two candidates, chosen by step 0's comparison; with B ≤ 4 the later steps read per-step
    // tables: t[k−1][rank >> (B − k)] (one of 2^k ≤ 8, a lookup8), or u[k−1][rank] where a 16-entry
    // lookup is one instruction.
    struct Steps {
        alignas(64) float t[3][16];
        alignas(64) float u[3][16];
        alignas(64) float thr[32];
        alignas(64) int32_t base[32];
        float a = 0, b = 0;
        bool bucketed = false;
        static int bucket(float v, float a, float b) {
            return static_cast<int>(std::min(std::max(std::fma(v, a, b), 0.0f), 31.0f));
        }
        void build(const float* bounds, int bits) {
            for (int k = 1; k < bits && k <= 3; ++k) {
                const int s = 1 << (bits - 1 - k);
                for (int m = 0; m < 16; ++m) t[k - 1][m] = m < (1 << k) ? bounds[2 * s * m + s - 1] : 0.0f;
                for (int r = 0; r < 16; ++r) u[k - 1][r] = bits <= 4 && (r >> (bits - k)) < (1 << k) ? t[k - 1][r >> (bits - k)] : 0.0f;
            }
            const int n = (1 << bits) - 1;
            if (!R::kLookup32 || bits < 3 || bits > 5 || !(bounds[n - 1] > bounds[0])) return;
            a = 30.0f / (bounds[n - 1] - bounds[0]);  // the thresholds in buckets 1..30
            b = 1.0f - bounds[0] * a;
            if (!std::isfinite(a) || !std::isfinite(b)) return;
            int count[32] = {};
            for (int i = 0; i < 32; ++i) thr[i] = INFINITY;
            for (int k = 0; k < n; ++k) {
                const int i = bucket(bounds[k], a, b);
                if (count[i]++) return;  // two in one bucket: search
                thr[i] = bounds[k];
            }
            for (int i = 0, below = 0; i < 32; below += count[i], ++i) base[i] = below;
            bucketed = true;
        }
    };
    // Calls body(std::bool_constant<Bucketed>) with Bucketed = st.bucketed, once per section or level.
    template <int B, class Body>
    static void with_rank_kind(const Steps& st, Body&& body) {
        if constexpr (R::kLookup32 && B >= 3 && B <= 5) {
            if (st.bucketed) return body(std::true_type{});
        }
        body(std::false_type{});
    }
    template <int B, bool Bucketed = false>
    static I rank_fixed(F v, const float* bounds, const Steps& steps) {
        if constexpr (Bucketed) {
            const F f = xsimd::min(xsimd::max(R::fmadd(v, F(steps.a), F(steps.b)), F(0.0f)), F(31.0f));
            const I i = R::to_int(f);
            return R::add_unless_less(R::lookup32(steps.base, i), v, R::lookup32(steps.thr, i), 1);
        }
        I r(0);
        if constexpr (B >= 1) {
            const F t0(bounds[(1 << (B - 1)) - 1]);
            r = R::add_unless_less(r, v, t0, 1 << (B - 1));
#pragma GCC unroll 8
            for (int k = 1; k < B; ++k) {
                const int s = 1 << (B - 1 - k);
                F probe;
                if (k == 1) {
                    probe = R::select_unless_less(v, t0, F(bounds[3 * s - 1]), F(bounds[s - 1]));
                } else if constexpr (B <= 4 && R::kLookup16) {
                    probe = R::lookup16(steps.u[k - 1], r);
                } else if constexpr (B <= 4) {
                    probe = R::lookup8(steps.t[k - 1], r >> (B - k));
                } else {
                    probe = lookup_lanes<A>(bounds, r + I(s - 1));
                }
                r = R::add_unless_less(r, v, probe, s);
            }
        }
        return r;
    }

    // Zeroes bytes [0, n) of p and up to 64 beyond (p has room for them).
    static void zero_bytes(void* p, size_t n) {
        const F zero(0.0f);
        for (size_t i = 0; i < n; i += sizeof(float) * N) zero.store_unaligned(reinterpret_cast<float*>(static_cast<uint8_t*>(p) + i));
    }
    template <class Body>
    static void with_bits(int bits, Body&& body) {
        switch (bits) {
            case 0: return body(std::integral_constant<int, 0>{});
            case 1: return body(std::integral_constant<int, 1>{});
            case 2: return body(std::integral_constant<int, 2>{});
            case 3: return body(std::integral_constant<int, 3>{});
            case 4: return body(std::integral_constant<int, 4>{});
            case 5: return body(std::integral_constant<int, 5>{});
            case 6: return body(std::integral_constant<int, 6>{});
            default: return body(std::integral_constant<int, 7>{});
        }
    }

    // Codes (int32, one per value, zero past count) to packed bits at bit_off of buf, whose bytes past
    // the row are scratch. Eight b-bit codes make 8b bits, gathered from one byte each by three SWAR steps.
    // A section that starts on a byte is written with plain 8-byte stores in increasing order (each one's
    // zero high bytes are overwritten by the next), one that does not is or-ed in (its first byte holds
    // the previous section's last bits).
    static void pack(const int32_t* codes32, int count, int bits, uint8_t* buf, size_t bit_off) {
        if (bits == 0 || count == 0) return;
        alignas(64) int8_t codes[kMaxD + 192];
        constexpr int kRegs = 32 / N;
        for (int j = 0; j < count; j += 32) {
            I v[kRegs];
            for (int k = 0; k < kRegs; ++k) v[k] = I::load_aligned(codes32 + j + k * N);
            O::store(O::pack_small(v), codes + j);
        }
        zero_bytes(codes + (count + 31) / 32 * 32, 64);  // the last register's groups past the codes
        using U = xsimd::batch<uint64_t, A>;
        constexpr int G = static_cast<int>(U::size);  // groups of 8 codes per register
        const int groups = (count + 7) / 8;
        const unsigned b = static_cast<unsigned>(bits);
        alignas(64) uint64_t words[kMaxD / 8 + 16];
        for (int g = 0; g < groups; g += G) {  // codes past count are zero (to a multiple of 32)
            U w = U::load_aligned(reinterpret_cast<const uint64_t*>(codes) + g);
            w = (w & U(0x00FF00FF00FF00FFull)) | ((w & U(0xFF00FF00FF00FF00ull)) >> (8 - b));
            w = (w & U(0x0000FFFF0000FFFFull)) | ((w & U(0xFFFF0000FFFF0000ull)) >> (16 - 2 * b));
            w = (w & U(0x00000000FFFFFFFFull)) | ((w >> 32) << (4 * b));
            w.store_aligned(words + g);
        }
        if (bit_off % 8 == 0) {
            for (int g = 0; g < groups; ++g) std::memcpy(buf + bit_off / 8 + size_t(g) * b, &words[g], 8);
            return;
        }
        for (int g = 0; g < groups; ++g) {
            const size_t at = bit_off + size_t(g) * 8 * b;
            uint64_t cur;
            std::memcpy(&cur, buf + at / 8, 8);
            cur |= words[g] << (at % 8);
            std::memcpy(buf + at / 8, &cur, 8);
        }
    }
    static void zero_tail(int32_t* codes32, int count) {
        for (int j = count; j < (count + 31) / 32 * 32; ++j) codes32[j] = 0;
    }

    // Rows are read once, from memory: a row ahead is asked for, every cache line of it.
    static void prefetch_row(const float* x, int d) {
        for (int j = 0; j < d; j += 16) __builtin_prefetch(x + j);
    }

    // --- turbo ---------------------------------------------------------------------------------------

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
        alignas(64) double partial[16];
        for (int k = 0; k < kNormRegs; ++k) sq[k].store_aligned(partial + k * kD);
        return std::sqrt(detail::sum16_double(partial));
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
                const I r = rank_fixed<B, Bucketed>(v, sec.bounds, st);
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
    template <int B, int K, bool Bucketed, bool Residual>
    static void turbo_section(const detail::TurboSection& sec, const Steps& st, const uint8_t* code_map, TurboRow* rows) {
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
                zero_tail(codes[k], sec.count);
                pack(codes[k], sec.count, B, rows[k].buf, sec.bit_off);
            }
        }
    }

    // The codes of K rows (into their rows) and their partial sums (pu, pc: 16 each per row); their scales
    // are stored after (turbo, below).
    template <int K>
    static void turbo_rows(const detail::TurboQuantizeLayout& l, const TurboTables& tables, const float* const* x,
                           const float* inverse, uint8_t* const* row, float* const* residual, float (*pu)[16], float (*pc)[16]) {
        TurboRow rows[K];
        for (int k = 0; k < K; ++k) {
            TurboRow& t = rows[k];
            zero_bytes(t.buf, l.row_bytes + 8);
            Rot::apply(l.rot, x[k], t.u);
            t.inv = F(inverse[k]);
            for (int i = 0; i < kSumRegs; ++i) t.cu[i] = t.cc[i] = F(0.0f);
            t.residual = residual[k];
        }
        for (int s = 0; s < l.n_sections; ++s) {
            with_bits(l.sections[s].bits, [&](auto bits) {
                constexpr int B = decltype(bits)::value;
                if constexpr (B >= 1 && B <= 4) {
                    with_rank_kind<B>(tables.steps[s], [&](auto bucketed) {
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
            for (int i = 0; i < kSumRegs; ++i) {
                rows[k].cu[i].store_unaligned(pu[k] + i * N);
                rows[k].cc[i].store_unaligned(pc[k] + i * N);
            }
            copy_bytes(row[k], rows[k].buf, l.row_bytes);
        }
    }

    // n bytes from buf to a row (no library call for these few bytes; nothing past the row is written).
    static void copy_bytes(uint8_t* row, const uint8_t* buf, size_t n) {
        size_t i = 0;
        for (; i + 32 <= n; i += 32) std::memcpy(row + i, buf + i, 32);
        for (; i + 8 <= n; i += 8) std::memcpy(row + i, buf + i, 8);
        for (; i < n; ++i) row[i] = buf[i];
    }

    static void turbo(const detail::TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                      size_t dst_stride, float* residual) {
        const int d = l.rot.d;
        if (!turbo_fits(l)) {
            detail::scalar_rotated_quantize().turbo(l, x, n_rows, dst, dst_stride, residual);
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
                prefetch_row(x + (r0 + r + kPrefetch) * d, d);
                norms[r] = row_norm(xs[r], d);
                inverse[r] = detail::turbo_inverse_norm(norms[r]);
                taken[r] = norms[r] <= 1e30;
            }
            alignas(64) float pu[kTile][16], pc[kTile][16];
            for (size_t r = 0; r < n;) {
                if (r + 1 < n && taken[r] && taken[r + 1]) {
                    turbo_rows<2>(l, tables, xs + r, inverse + r, rows + r, res + r, pu + r, pc + r);
                    r += 2;
                    continue;
                }
                if (taken[r]) {
                    turbo_rows<1>(l, tables, xs + r, inverse + r, rows + r, res + r, pu + r, pc + r);
                } else {
                    detail::turbo_quantize_row_spec(l, xs[r], rows[r], res[r]);
                }
                ++r;
            }
            for (size_t r = 0; r < n; ++r) {
                if (taken[r]) detail::turbo_store_scale(l, norms[r], detail::sum16_float(pu[r]), detail::sum16_float(pc[r]), rows[r]);
            }
        }
    }
};

}  // namespace
}  // namespace kvq::simd
