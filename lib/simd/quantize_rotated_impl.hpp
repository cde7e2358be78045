// SIMD quantizers of the turbo codecs (and what polar's, quantize_polar_impl.hpp, share), written once over the xsimd arch A, Ops<A> and
// RotOps<A> (quantize_rotated_ops.hpp). They write the bytes of the scalar specification
// (lib/spec/rotated_quantize_scalar.cpp) because they do its float operations in its order
// (lib/spec/rotated_quantize.hpp says which order): the rotation's butterflies lane by lane, the 16
// partial sums register by register (the trees and the fp16 scale are the specification's own
// out-of-line functions), ranks by a binary search over the same thresholds, polar_angle's operations
// one for one, no fma. One liberty: a butterfly's a − b is computed as a + (−b), which differs from it
// only in which NaN a NaN operand gives; so a row is taken here only when it is finite after the rotation
// (turbo: its norm is below 1e30), and every other row goes through the specification's row function.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../spec/rotated_quantize.hpp"
#include "ops.hpp"
#include "quantize_rotated_ops.hpp"

namespace kvq::simd {
namespace {

template <class A>
struct RotatedQuantize {
    using O = Ops<A>;
    using R = RotOps<A>;
    using F = xsimd::batch<float, A>;
    using I = xsimd::batch<int32_t, A>;
    using D = xsimd::batch<double, A>;
    static constexpr int N = F::size;
    static constexpr int kMaxD = 1024;       // larger rows go through the specification
    static constexpr int kPad = 2 * N + 32;  // zero lanes read past a buffer's values

    // --- rotation: y = H·D·x (Rotation::apply), in place in y ---------------------------------------

    static F lane_sign_mask(int h) {  // −0.0 in the lanes with bit h set
        alignas(64) float m[N];
        for (int l = 0; l < N; ++l) m[l] = (l & h) ? -0.0f : 0.0f;
        return F::load_aligned(m);
    }
    // The butterflies of stages h < N inside one register: lane l gets v[l] + v[l^h] (low side) or
    // v[l^h] + (−v[l]) (high side).
    static F in_register_stages(F v, const F* masks) {
        if constexpr (N >= 2) v = R::template swap<1>(v) + (v ^ masks[0]);
        if constexpr (N >= 4) v = R::template swap<2>(v) + (v ^ masks[1]);
        if constexpr (N >= 8) v = R::template swap<4>(v) + (v ^ masks[2]);
        if constexpr (N >= 16) v = R::template swap<8>(v) + (v ^ masks[3]);
        return v;
    }
    static bool rotation_fits(const detail::RotationLayout& r) {
        if (r.d > kMaxD || r.d % N != 0) return false;
        for (int i = 0; i < r.n_blocks; ++i) {
            if (r.blocks[i] < N) return false;
        }
        return true;
    }
    // A block of Rn·N values held in registers through every stage.
    template <int Rn>
    static void rotate_block_in_registers(const float* x, const float* signs, float* y, const F* masks, float norm) {
        F v[Rn];
#pragma GCC unroll 16
        for (int k = 0; k < Rn; ++k) {
            v[k] = in_register_stages(F::load_unaligned(x + k * N) * F::load_unaligned(signs + k * N), masks);
        }
#pragma GCC unroll 16
        for (int h = 1; h < Rn; h *= 2) {
#pragma GCC unroll 16
            for (int q = 0; q < Rn / 2; ++q) {  // butterfly q of the stage: registers j and j + h
                const int j = (q / h) * 2 * h + q % h;
                const F a = v[j], c = v[j + h];
                v[j] = a + c;
                v[j + h] = a - c;
            }
        }
#pragma GCC unroll 16
        for (int k = 0; k < Rn; ++k) (v[k] * F(norm)).store_aligned(y + k * N);
    }

    static void rotate(const detail::RotationLayout& r, const float* x, float* y) {
        static const F masks[4] = {lane_sign_mask(1), lane_sign_mask(2), lane_sign_mask(4), lane_sign_mask(8)};
        int off = 0;
        for (int bi = 0; bi < r.n_blocks; ++bi) {
            const int b = r.blocks[bi];
            float* yb = y + off;
            const float norm = 1.0f / std::sqrt(static_cast<float>(b));
            const float* xb = x + off;
            const float* sb = r.signs + off;
            switch (b / N) {
                case 1: rotate_block_in_registers<1>(xb, sb, yb, masks, norm); off += b; continue;
                case 2: rotate_block_in_registers<2>(xb, sb, yb, masks, norm); off += b; continue;
                case 4: rotate_block_in_registers<4>(xb, sb, yb, masks, norm); off += b; continue;
                case 8: rotate_block_in_registers<8>(xb, sb, yb, masks, norm); off += b; continue;
                case 16: rotate_block_in_registers<16>(xb, sb, yb, masks, norm); off += b; continue;
                default: break;
            }
            for (int j = 0; j < b; j += N) {
                const F v = F::load_unaligned(x + off + j) * F::load_unaligned(r.signs + off + j);
                in_register_stages(v, masks).store_aligned(yb + j);
            }
            for (int h = N; h < b; h *= 2) {
                for (int i = 0; i < b; i += 2 * h) {
                    for (int j = i; j < i + h; j += N) {
                        const F a = F::load_aligned(yb + j), c = F::load_aligned(yb + j + h);
                        (a + c).store_aligned(yb + j);
                        (a - c).store_aligned(yb + j + h);
                    }
                }
            }
            for (int j = 0; j < b; j += N) (F::load_aligned(yb + j) * F(norm)).store_aligned(yb + j);
            off += b;
        }
    }

    // --- codes -------------------------------------------------------------------------------------

    // The number of thresholds t (2^bits − 1 of them, ascending) with !(v < t): std::upper_bound's rank,
    // by a binary search (the predicate is monotone in t, and true for every t when v is NaN).
    // With B ≤ 4 the search reads per-step tables (Steps): step k = 1..B−1 compares with the threshold
    // rank + s − 1 (s = 2^(B−1−k), rank a multiple of 2s), which is table k's entry rank >> (B − k), one of
    // 2^k ≤ 8: one register lookup.
    struct Steps {
        alignas(64) float t[3][16];
        void build(const float* bounds, int bits) {
            for (int k = 1; k < bits && k <= 3; ++k) {
                const int s = 1 << (bits - 1 - k);
                for (int m = 0; m < 16; ++m) t[k - 1][m] = m < (1 << k) ? bounds[2 * s * m + s - 1] : 0.0f;
            }
        }
    };
    template <int B>
    static I rank_fixed(F v, const float* bounds, const Steps& steps) {
        I r(0);
        if constexpr (B >= 1) {
            r = R::add_unless_less(r, v, F(bounds[(1 << (B - 1)) - 1]), 1 << (B - 1));
#pragma GCC unroll 8
            for (int k = 1; k < B; ++k) {
                const int s = 1 << (B - 1 - k);
                F probe;
                if constexpr (B <= 4) {
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

    // Rows are read once, from memory: the row four ahead is asked for, every cache line of it.
    static void prefetch_row(const float* x, int d) {
        for (int j = 0; j < d; j += 16) __builtin_prefetch(x + j);
    }

    // --- turbo ---------------------------------------------------------------------------------------

    static bool turbo_fits(const detail::TurboQuantizeLayout& l) {
        if (!rotation_fits(l.rot) || l.row_bytes > kMaxD) return false;
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

    // The row's norm from 16 partial sums of x² in double (the specification's order).
    static double row_norm(const float* x, int d) {
        constexpr int kD = D::size, kNormRegs = 16 / kD;
        D sq[kNormRegs];
        for (auto& s : sq) s = D(0.0);
        for (int k = 0; k < d / N; ++k) {
            D lo, hi;
            R::widen(F::load_unaligned(x + k * N), lo, hi);
            sq[(2 * k) % kNormRegs] = sq[(2 * k) % kNormRegs] + lo * lo;
            sq[(2 * k + 1) % kNormRegs] = sq[(2 * k + 1) % kNormRegs] + hi * hi;
        }
        alignas(64) double partial[16];
        for (int k = 0; k < kNormRegs; ++k) sq[k].store_aligned(partial + k * kD);
        return std::sqrt(detail::sum16_double(partial));
    }

    static void turbo_row(const detail::TurboQuantizeLayout& l, const Steps* steps, const float* x, double norm,
                          uint8_t* row, float* residual) {
        constexpr int kSumRegs = 16 / N;
        if (!(norm <= 1e30)) {  // NaN, Inf or huge: the specification's NaN operand order matters
            detail::turbo_quantize_row_spec(l, x, row, residual);
            return;
        }
        alignas(64) float u[kMaxD];
        alignas(64) int32_t codes[kMaxD + 32];
        alignas(64) uint8_t buf[kMaxD + 128];
        zero_bytes(buf, l.row_bytes + 8);
        rotate(l.rot, x, u);
        const F inv(detail::turbo_inverse_norm(norm));
        F cu[kSumRegs], cc[kSumRegs];
        for (int k = 0; k < kSumRegs; ++k) cu[k] = cc[k] = F(0.0f);
        for (int s = 0; s < l.n_sections; ++s) {
            const detail::TurboSection& sec = l.sections[s];
            with_bits(sec.bits, [&](auto bits) {
                constexpr int B = decltype(bits)::value;
                if constexpr (B >= 1 && B <= 4) {
                    const I half(1 << (B - 1)), sign(int32_t(0x80000000u));
                    const float* magnitude = sec.value_by_rank + (1 << (B - 1));
                    const float* bounds = sec.bounds;
                    const Steps& st = steps[s];
                    const int begin = sec.begin, end = sec.begin + sec.count;
                    // kSumRegs registers per step, so that each partial sum stays in its register.
                    for (int j0 = begin; j0 < end; j0 += kSumRegs * N) {
#pragma GCC unroll 4
                        for (int p = 0; p < kSumRegs; ++p) {
                            const int j = j0 + p * N;  // (j / N) % kSumRegs == p: begin is a multiple of 16
                            if (j >= end) break;
                            const F v = F::load_aligned(u + j) * inv;
                            const I rk = rank_fixed<B>(v, bounds, st);
                            // The sign-magnitude code of the rank, and its value: ± the magnitude's.
                            const I t = rk - half, neg = t >> 31, m = t ^ neg;
                            (m | (neg & half)).store_aligned(codes + (j - begin));  // the section's codes from 0
                            const F c = R::lookup8(magnitude, m) ^ bit_cast<float>(neg & sign);
                            cu[p] = cu[p] + c * v;
                            cc[p] = cc[p] + c * c;
                            if (residual) (v - c).store_unaligned(residual + j);
                        }
                    }
                }
            });
            zero_tail(codes, sec.count);
            pack(codes, sec.count, sec.bits, buf, sec.bit_off);
        }
        alignas(64) float pu[16], pc[16];
        for (int k = 0; k < kSumRegs; ++k) {
            cu[k].store_aligned(pu + k * N);
            cc[k].store_aligned(pc + k * N);
        }
        std::memcpy(row, buf, l.row_bytes);
        detail::turbo_store_scale(l, norm, detail::sum16_float(pu), detail::sum16_float(pc), row);
    }

    static void turbo(const detail::TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                      size_t dst_stride, float* residual) {
        const int d = l.rot.d;
        if (!turbo_fits(l)) {
            detail::scalar_rotated_quantize().turbo(l, x, n_rows, dst, dst_stride, residual);
            return;
        }
        // Norms four rows at a time: each row's codes wait for its norm's sum, square root and division,
        // and four independent chains of them overlap.
        constexpr size_t kTile = 4;
        Steps steps[2];
        for (int s = 0; s < l.n_sections; ++s) steps[s].build(l.sections[s].bounds, l.sections[s].bits);
        for (size_t r0 = 0; r0 < n_rows; r0 += kTile) {
            const size_t n = std::min(kTile, n_rows - r0);
            double norms[kTile];
            for (size_t r = 0; r < n; ++r) norms[r] = row_norm(x + (r0 + r) * d, d);
            for (size_t r = r0; r < r0 + n; ++r) {
                prefetch_row(x + (r + 2 * kTile) * d, d);
                turbo_row(l, steps, x + r * d, norms[r - r0], dst + r * dst_stride, residual ? residual + r * d : nullptr);
            }
        }
    }
};

}  // namespace
}  // namespace kvq::simd
