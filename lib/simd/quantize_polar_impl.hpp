// The SIMD quantizer of the polar codec, over the rotation, the rank search and the bit packing of
// quantize_rotated_impl.hpp (which says why the bytes are the specification's), and the level's table of
// polar/turbo quantizers. Level by level over the whole row: the nodes of level ℓ in row order are the
// pairs of level ℓ − 1's, so a register of pairs is one deinterleave away.
#pragma once

#include "quantize_rotated_impl.hpp"
#include "quantize_turbo_impl.hpp"

namespace kvq::simd {
namespace {

template <class A>
struct PolarQuantize : RotatedQuantize<A> {
    using Base = RotatedQuantize<A>;
    using typename Base::F;
    using typename Base::I;
    using typename Base::O;
    using typename Base::R;
    using typename Base::Steps;
    using Base::N;
    using Base::kMaxD;
    using Base::kPad;
    using Base::kGroup;

    // polar_level1_code / polar_node_code (rotated_quantize.hpp), operation for operation.
    // #{k < 2^M − 1 : x·t[k] < y} for ascending t: a binary search as rank_fixed's (Steps::build_search's
    // tables), whose predicate is monotone in k (x, y ≥ 0 here), so it counts as the specification does.
    template <int M>
    [[gnu::always_inline]] static inline I rank_below(F x, F y, const float* t, const Steps& steps) {
        I r(0);
        if constexpr (M >= 1) {
            const F x0 = x * F(t[(1 << (M - 1)) - 1]);
            r = R::add_if_less(r, x0, y, 1 << (M - 1));
#pragma GCC unroll 8
            for (int k = 1; k < M; ++k) {
                const int s = 1 << (M - 1 - k);
                F probe;
                if (k == 1) {
                    probe = R::select_if_less(x0, y, F(t[3 * s - 1]), F(t[s - 1]));
                } else if constexpr (M <= 4 && R::kLookup16) {
                    probe = R::lookup16(steps.u[k - 1], r);
                } else if constexpr (M <= 4) {
                    probe = R::lookup8(steps.t[k - 1], r >> (M - k));
                } else if constexpr (M == 5 && R::kLookup32) {
                    probe = R::lookup32(t, r + I(s - 1));
                } else {
                    probe = lookup_lanes<A>(t, r + I(s - 1));
                }
                r = R::add_if_less(r, x * probe, y, s);
            }
        }
        return r;
    }
    // The level-1 code of B bits of the pairs (a, b), by its bit masks. The specification's g ? ay : ax
    // and g ? ax : ay are max and min (no NaN reaches here).
    template <int B>
    [[gnu::always_inline]] static inline I level1_code(F a, F b, const float* t, const Steps& steps) {
        if constexpr (B == 0) {
            return I(0);
        } else {
            const F ax = xsimd::abs(a), ay = xsimd::abs(b), zero(0.0f);
            I code = R::bits_if_less(b, zero, (1 << B) - 1);
            if constexpr (B >= 2) code = code ^ R::bits_if_less(a, zero, (1 << (B - 1)) - 1);
            if constexpr (B >= 3) code = code ^ R::bits_if_less(ax, ay, (1 << (B - 2)) - 1);
            if constexpr (B >= 4) code = code ^ rank_below<B - 3>(xsimd::max(ax, ay), xsimd::min(ax, ay), t, steps);
            return code;
        }
    }

    static bool polar_fits(const detail::PolarQuantizeLayout& l) {
        if (!Base::Rot::fits(l.rot) || l.row_bytes > kMaxD) return false;
        for (int i = 0; i < l.levels; ++i) {
            if (l.bits[i] > 7) return false;
        }
        return true;
    }

    // Level `level` of B bits of K rows: node i's angle and radius from the pair (y[2i], y[2i + 1]) of the
    // level below; radii replace their pair in y (node i is written after pairs 2i, 2i + 1 are read).
    // Row after row within a register (one row's divisions and square roots overlap the other's
    // arithmetic). Codes a group of kGroup nodes (regs registers, the last one `valid` lanes) at a time,
    // straight into buf where the level packs codes in registers and the level starts on a byte
    // (Direct); elsewhere as int32 codes, packed at the end (pack).
    template <int B, bool Full, int K, bool Direct>
    [[gnu::always_inline]] static inline void polar_group(const detail::PolarQuantizeLayout& l, int level, const Steps& st,
                                                          float (*y)[kMaxD + kPad], uint8_t (*buf)[kMaxD + 128], int i0,
                                                          int regs, int valid, int32_t (*codes)[kMaxD / 2 + kPad]) {
        const float* tangents = l.tangents[level - 1];
        alignas(64) int32_t lane[N];
        for (int j = 0; j < N; ++j) lane[j] = j;
        I rk[K][4];
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p) {
            const int i = i0 + p * N;
#pragma GCC unroll 4
            for (int k = 0; k < K; ++k) {
                if (p >= regs) {
                    rk[k][p] = I(0);
                    continue;
                }
                F a, b;
                R::deinterleave(F::load_aligned(y[k] + 2 * i), F::load_aligned(y[k] + 2 * i + N), a, b);
                I r;
                if constexpr (Full) {
                    r = level1_code<B>(a, b, tangents, st);
                    (a * a + b * b).store_aligned(y[k] + i);
                } else {
                    r = rank_below<B>(a, b, tangents, st);
                    (a + b).store_aligned(y[k] + i);
                }
                if (p == regs - 1 && valid < N) r = xsimd::select(I::load_aligned(lane) < I(valid), r, I(0));  // past the level
                rk[k][p] = r;
                if constexpr (!Direct) r.store_aligned(codes[k] + i);
            }
        }
        if constexpr (Direct) {
            for (int k = 0; k < K; ++k) R::template pack_codes<B>(rk[k], nullptr, buf[k] + l.bit_off[level - 1] / 8 + size_t(i0) * B / 8);
        }
    }
    // One level of K rows. Not inlined: its instantiations (8 bit widths × 3 row counts × the packing
    // kinds) inlined into polar_rows made functions whose optimization was most of the level files'
    // compile time; one call per level and rows costs nothing.
    template <int B, bool Full, int K, bool Direct>
    [[gnu::noinline]] static void polar_level(const detail::PolarQuantizeLayout& l, int level, const Steps& st, float (*y)[kMaxD + kPad],
                            uint8_t (*buf)[kMaxD + 128]) {
        const int nodes = l.rot.d >> level;
        alignas(64) int32_t codes[Direct ? 1 : K][kMaxD / 2 + kPad];
        int i0 = 0;
        for (; i0 + kGroup <= nodes; i0 += kGroup) polar_group<B, Full, K, Direct>(l, level, st, y, buf, i0, 4, N, codes);
        if (i0 < nodes) {
            const int rest = nodes - i0, regs = (rest + N - 1) / N;
            polar_group<B, Full, K, Direct>(l, level, st, y, buf, i0, regs, rest - (regs - 1) * N, codes);
        }
        if constexpr (!Direct) {
            const size_t at = l.bit_off[level - 1];
            for (int k = 0; k < K; ++k) {
                if (nodes * B <= 56) {  // the deepest levels, a few codes: one word, or-ed in byte by byte
                    uint64_t w = 0;     // (a wider load would straddle the previous level's store)
                    for (int i = 0; i < nodes; ++i) w |= uint64_t(uint32_t(codes[k][i])) << (i * B);
                    w <<= at % 8;
                    uint8_t* p = buf[k] + at / 8;
                    const int n = static_cast<int>(at % 8 + size_t(nodes) * B + 7) / 8;  // ≤ 8
                    for (int j = 0; j < n && j < 8; ++j) p[j] |= uint8_t(w >> (8 * j));
                    continue;
                }
                Base::zero_tail(codes[k], nodes);
                Base::pack(codes[k], nodes, B, buf[k], at);
            }
        }
    }

    // K consecutive rows; false (nothing written) if a row's last squared radii are not all finite. Then
    // the row had a NaN or Inf after the rotation (where the specification's NaN operand order matters),
    // or a squared radius overflowed: a NaN or Inf value or squared radius makes every one above it NaN
    // or Inf, so a row whose last ones are finite has neither anywhere, in its values or its sums.
    template <int K>
    static bool polar_rows(const detail::PolarQuantizeLayout& l, const Steps* steps, const float* x, uint8_t* dst,
                           size_t dst_stride) {
        const int d = l.rot.d;
        alignas(64) float y[K][kMaxD + kPad];
        alignas(64) uint8_t buf[K][kMaxD + 128];
        for (int k = 0; k < K; ++k) {
            Base::Rot::apply(l.rot, x + k * d, y[k]);
            Base::zero_bytes(buf[k], l.row_bytes + 8);
            for (int j = d; j < d + kPad; ++j) y[k][j] = 0.0f;
        }
        // Level by level over the whole row: nodes of level ℓ in row order are pairs of level ℓ − 1's.
        for (int level = 1; level <= l.levels; ++level) {
            Base::with_bits(l.bits[level - 1], [&](auto bits) {
                constexpr int B = decltype(bits)::value;
                constexpr bool kCanPack = R::kPackCodes && B >= 1 && B <= 4;
                const bool direct = kCanPack && l.bit_off[level - 1] % 8 == 0;
                if (level == 1 && direct) polar_level<B, true, K, kCanPack>(l, level, steps[0], y, buf);
                if (level == 1 && !direct) polar_level<B, true, K, false>(l, level, steps[0], y, buf);
                if (level > 1 && direct) polar_level<B, false, K, kCanPack>(l, level, steps[level - 1], y, buf);
                if (level > 1 && !direct) polar_level<B, false, K, false>(l, level, steps[level - 1], y, buf);
            });
        }
        const int groups = d >> l.levels;
        alignas(64) float lane[N];
        for (int j = 0; j < N; ++j) lane[j] = static_cast<float>(j);
        F bad(0.0f);
        for (int k = 0; k < K; ++k) {
            for (int g = 0; g < groups; g += N) {
                const F v = F::load_aligned(y[k] + g);
                bad = bad + xsimd::select(F::load_aligned(lane) < F(float(groups - g)), v - v, F(0.0f));
            }
        }
        if (xsimd::any(xsimd::isnan(bad))) return false;
        for (int k = 0; k < K; ++k) {
            alignas(64) uint16_t radius[kMaxD / 2 + N];
            for (int g = 0; g < groups; g += N) O::store_f16(radius + g, xsimd::sqrt(F::load_aligned(y[k] + g)));
            std::memcpy(buf[k] + l.radius_off, radius, 2 * size_t(groups));
            Base::copy_bytes(dst + k * dst_stride, buf[k], l.row_bytes);
        }
        return true;
    }

    static void polar(const detail::PolarQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                      size_t dst_stride) {
        const int d = l.rot.d;
        if (!polar_fits(l)) {
            detail::polar_quantize_rows_spec(l, x, n_rows, dst, dst_stride);
            return;
        }
        Steps steps[8];
        for (int i = 0; i < l.levels; ++i) steps[i].build_search(l.tangents[i], i == 0 ? std::max(l.bits[0] - 3, 0) : l.bits[i]);
        auto one = [&](size_t r) {  // a row the level does not take goes through the specification's row function
            if (!polar_rows<1>(l, steps, x + r * d, dst + r * dst_stride, dst_stride)) {
                detail::polar_quantize_row_spec(l, x + r * d, dst + r * dst_stride);
            }
        };
        size_t r = 0;
        for (; r + 4 <= n_rows; r += 4) {
            Base::prefetch_row(x + (r + 8) * d, 4 * d);
            if (!polar_rows<4>(l, steps, x + r * d, dst + r * dst_stride, dst_stride)) {
                for (int k = 0; k < 4; ++k) one(r + k);
            }
        }
        for (; r + 2 <= n_rows; r += 2) {  // two rows at a time; a pair the level does not take, one by one
            Base::prefetch_row(x + (r + 4) * d, 2 * d);
            if (!polar_rows<2>(l, steps, x + r * d, dst + r * dst_stride, dst_stride)) {
                one(r);
                one(r + 1);
            }
        }
        if (r < n_rows) one(r);
    }
};

}  // namespace
}  // namespace kvq::simd
