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

    // polar_angle_q1 / polar_angle (rotated_quantize_scalar.cpp), operation for operation. The
    // specification's big ? ay : ax and big ? ax : ay are max and min (no NaN reaches here); Full = false
    // takes radii, which are ≥ +0, so their |·| is themselves.
    template <bool Full>
    static F angle(F y, F x) {
        const F ax = Full ? xsimd::abs(x) : x, ay = Full ? xsimd::abs(y) : y;
        const auto big = ay > ax;
        const F mx = xsimd::max(ax, ay), mn = xsimd::min(ax, ay);
        const auto red = mn > F(0.414213562f) * mx;
        const F num = xsimd::select(red, mn - mx, mn), den = xsimd::select(red, mn + mx, mx);
        const F t = xsimd::select(den > F(0.0f), divide(num, den), F(0.0f));
        const F z = t * t;
        F p = ((F(8.05374449538e-2f) * z + F(-1.38776856032e-1f)) * z + F(1.99777106478e-1f)) * z + F(-3.33329491539e-1f);
        p = p * z;
        p = p * t;
        p = p + t;
        p = xsimd::select(red, p + F(0.785398163f), p);
        F a = xsimd::select(big, F(1.57079633f) - p, p);
        if constexpr (Full) {
            a = xsimd::select(x < F(0.0f), F(3.14159265f) - a, a);
            a = xsimd::select(y < F(0.0f), F(6.28318531f) - a, a);
        }
        return a;
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
    template <int B, bool Full, int K, bool Bucketed, bool Direct>
    [[gnu::always_inline]] static inline void polar_group(const detail::PolarQuantizeLayout& l, int level, const Steps& st,
                                                          float (*y)[kMaxD + kPad], uint8_t (*buf)[kMaxD + 128], int i0,
                                                          int regs, int valid, int32_t (*codes)[kMaxD / 2 + kPad]) {
        const float* bounds = l.bounds[level - 1];
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
                I r = Base::template rank_fixed<B, Bucketed>(angle<Full>(b, a), bounds, st);
                if (p == regs - 1 && valid < N) r = xsimd::select(I::load_aligned(lane) < I(valid), r, I(0));  // past the level
                rk[k][p] = r;
                xsimd::sqrt(a * a + b * b).store_aligned(y[k] + i);
                if constexpr (!Direct) r.store_aligned(codes[k] + i);
            }
        }
        if constexpr (Direct) {
            for (int k = 0; k < K; ++k) R::template pack_codes<B>(rk[k], nullptr, buf[k] + l.bit_off[level - 1] / 8 + size_t(i0) * B / 8);
        }
    }
    template <int B, bool Full, int K, bool Bucketed, bool Direct>
    static void polar_level(const detail::PolarQuantizeLayout& l, int level, const Steps& st, float (*y)[kMaxD + kPad],
                            uint8_t (*buf)[kMaxD + 128]) {
        const int nodes = l.rot.d >> level;
        alignas(64) int32_t codes[Direct ? 1 : K][kMaxD / 2 + kPad];
        int i0 = 0;
        for (; i0 + kGroup <= nodes; i0 += kGroup) polar_group<B, Full, K, Bucketed, Direct>(l, level, st, y, buf, i0, 4, N, codes);
        if (i0 < nodes) {
            const int rest = nodes - i0, regs = (rest + N - 1) / N;
            polar_group<B, Full, K, Bucketed, Direct>(l, level, st, y, buf, i0, regs, rest - (regs - 1) * N, codes);
        }
        if constexpr (!Direct) {
            for (int k = 0; k < K; ++k) {
                Base::zero_tail(codes[k], nodes);
                Base::pack(codes[k], nodes, B, buf[k], l.bit_off[level - 1]);
            }
        }
    }

    // K consecutive rows; false (nothing written) if a row's last radii are not all finite. Then the row
    // had a NaN or Inf after the rotation (where the specification's NaN operand order matters), or one
    // of its radii overflowed (a NaN angle, of Inf/Inf, ranks above every threshold there): a radius
    // bounds those below it, so every radius and every value of a row whose last radii are finite is
    // finite, and so is every angle of it.
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
                Base::template with_rank_kind<B>(steps[level - 1], [&](auto bucketed) {
                    constexpr bool kB = decltype(bucketed)::value;
                    if (level == 1 && direct) polar_level<B, true, K, kB, kCanPack>(l, level, steps[0], y, buf);
                    if (level == 1 && !direct) polar_level<B, true, K, kB, false>(l, level, steps[0], y, buf);
                    if (level > 1 && direct) polar_level<B, false, K, kB, kCanPack>(l, level, steps[level - 1], y, buf);
                    if (level > 1 && !direct) polar_level<B, false, K, kB, false>(l, level, steps[level - 1], y, buf);
                });
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
            for (int g = 0; g < groups; g += N) O::store_f16(radius + g, F::load_aligned(y[k] + g));
            std::memcpy(buf[k] + l.radius_off, radius, 2 * size_t(groups));
            Base::copy_bytes(dst + k * dst_stride, buf[k], l.row_bytes);
        }
        return true;
    }

    static void polar(const detail::PolarQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                      size_t dst_stride) {
        const int d = l.rot.d;
        if (!polar_fits(l)) {
            detail::scalar_rotated_quantize().polar(l, x, n_rows, dst, dst_stride);
            return;
        }
        Steps steps[8];
        for (int i = 0; i < l.levels; ++i) steps[i].build(l.bounds[i], l.bits[i]);
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

template <class A>
detail::RotatedQuantizeKernels rotated_quantize_kernels() {
    return {TurboQuantize<A>::turbo, PolarQuantize<A>::polar};
}

}  // namespace
}  // namespace kvq::simd
