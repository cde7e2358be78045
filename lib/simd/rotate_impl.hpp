// The seeded rotation y = H·D·x of the polar/turbo quantizers (Rotation::apply, lib/rotation/hadamard.cpp)
// at a SIMD level, with the specification's float operations in its order: the sign flips, then the
// Walsh-Hadamard butterflies stage by stage (h = 1, 2, 4, ...), then the multiplication by 1/√b.
// A butterfly's a + b and a − b are exact functions of a and b in any lane; the stages h < N (inside a
// register) are one shuffle and one multiply-add each: v·(±1) + swap(v), where v·(±1) is exact, so it
// rounds once, as the specification's a + b and a − b (= a + (−b)) do, fused or not. (a − b and a + (−b) differ only in which NaN a NaN operand gives: the
// callers take finite rows only.)
#pragma once

#include <cmath>

#include "../ref/rotated_quantize.hpp"
#include "quantize_rotated_ops.hpp"

namespace kvq::simd {
namespace {

template <class A>
struct Rotate {
    using R = RotOps<A>;
    using F = xsimd::batch<float, A>;
    static constexpr int N = F::size;
    static constexpr int kMaxD = 1024;  // larger rows go through the specification

    // pm: +1 in the lanes of a butterfly's low side, −1 in those of its high side (lane bit h set);
    // norm[k]: the specification's 1/√b for a block of b = 2^k values.
    struct Masks {
        F pm[4];
        float norm[11];
        Masks() {
            for (int s = 0; s < 4; ++s) {
                alignas(64) float m[N];
                for (int l = 0; l < N; ++l) m[l] = (l & (1 << s)) ? -1.0f : 1.0f;
                pm[s] = F::load_aligned(m);
            }
            for (int k = 0; k < 11; ++k) norm[k] = 1.0f / std::sqrt(static_cast<float>(1 << k));
        }
    };
    static_assert(kMaxD <= 1 << 10);
    // Stages h < N: lane l gets v[l] + v[l^h] (low side) or v[l^h] + (−v[l]) (high side).
    static F in_register_stages(F v, const Masks& m) {
        if constexpr (N >= 2) v = R::fmadd(v, m.pm[0], R::template swap<1>(v));
        if constexpr (N >= 4) v = R::fmadd(v, m.pm[1], R::template swap<2>(v));
        if constexpr (N >= 8) v = R::fmadd(v, m.pm[2], R::template swap<4>(v));
        if constexpr (N >= 16) v = R::fmadd(v, m.pm[3], R::template swap<8>(v));
        return v;
    }

    static bool fits(const detail::RotationLayout& r) {
        if (r.d > kMaxD || r.d % N != 0) return false;
        for (int i = 0; i < r.n_blocks; ++i) {
            if (r.blocks[i] < N) return false;
        }
        return true;
    }

    // A block of Rn·N values held in registers through every stage.
    template <int Rn>
    static void block_in_registers(const float* x, const float* signs, float* y, const Masks& m, float norm) {
        F v[Rn];
#pragma GCC unroll 16
        for (int k = 0; k < Rn; ++k) {
            v[k] = in_register_stages(F::load_unaligned(x + k * N) * F::load_unaligned(signs + k * N), m);
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

    // y = H·D·x (y aligned, d values; x need not be).
    static void apply(const detail::RotationLayout& r, const float* x, float* y) {
        static const Masks masks;
        int off = 0;
        for (int bi = 0; bi < r.n_blocks; off += r.blocks[bi], ++bi) {
            const int b = r.blocks[bi];
            float* yb = y + off;
            const float norm = masks.norm[__builtin_ctz(static_cast<unsigned>(b))];
            const float* xb = x + off;
            const float* sb = r.signs + off;
            switch (b / N) {
                case 1: block_in_registers<1>(xb, sb, yb, masks, norm); continue;
                case 2: block_in_registers<2>(xb, sb, yb, masks, norm); continue;
                case 4: block_in_registers<4>(xb, sb, yb, masks, norm); continue;
                case 8: block_in_registers<8>(xb, sb, yb, masks, norm); continue;
                case 16: block_in_registers<16>(xb, sb, yb, masks, norm); continue;
                default: break;
            }
            for (int j = 0; j < b; j += N) {
                in_register_stages(F::load_unaligned(xb + j) * F::load_unaligned(sb + j), masks).store_aligned(yb + j);
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
        }
    }
};

}  // namespace
}  // namespace kvq::simd
