// The contract of every Ops<A> primitive whose lane order, width or rounding matters (ops.hpp), checked
// at run time on the CPU itself: each level's file instantiates check_ops<A>() with its own flags, the
// self-check (dispatch.cpp) runs it before the level is used, and tests/test_simd_ops.cpp runs it at
// every level the CPU has. Inputs make every lane differ, so a permuted, dropped or duplicated lane shows.
//
// This file is compiled with wide instructions: it uses no standard-library templates with external
// linkage (no std::vector, no <random>), only C arrays, memcpy and snprintf.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "../ref/blocks.hpp"
#include "../ref/half.hpp"
#include "ops.hpp"

namespace kvq::simd {
namespace {

struct OpsCheck {
    char msg[256] = {};
    bool failed = false;
    uint64_t state = 0x9E3779B97F4A7C15ull;

    uint32_t next() {  // xorshift64*: the same numbers everywhere
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        return static_cast<uint32_t>((state * 0x2545F4914F6CDD1Dull) >> 32);
    }
    int8_t next_i8() { return static_cast<int8_t>(next()); }
    // Fails with the first broken contract only (the rest would follow from it).
    void expect(bool ok, const char* what, long long lane, double got, double want) {
        if (ok || failed) return;
        failed = true;
        std::snprintf(msg, sizeof msg, "%s: lane %lld is %.9g, the contract says %.9g", what, lane, got, want);
    }
};

inline bool same_bits(float a, float b) {
    uint32_t x, y;
    std::memcpy(&x, &a, 4);
    std::memcpy(&y, &b, 4);
    return x == y;
}

// Lanes of a register as floats or int32 (any vector type, by its bytes).
template <class V>
void lanes_f32(const V& v, float* out) { std::memcpy(out, &v, sizeof v); }
template <class V>
void lanes_i32(const V& v, int32_t* out) { std::memcpy(out, &v, sizeof v); }

template <class A>
void check_reductions(OpsCheck& c) {
    using O = Ops<A>;
    using F = typename O::F;
    constexpr int N = static_cast<int>(F::size);
    alignas(64) float lanes[8][N];
    for (int k = 0; k < 8; ++k)
        for (int l = 0; l < N; ++l) lanes[k][l] = static_cast<float>((k + 1) * 1000 + l * 3 + (l * l) % 7);
    F rows[8];
    for (int k = 0; k < 8; ++k) rows[k] = F::load_aligned(lanes[k]);
    for (int count = 0; count <= 8; ++count) {
        float out[9];
        for (float& v : out) v = -1.0f;
        O::reduce_add_rows(rows, count, out);
        for (int k = 0; k < count; ++k) {
            float want = 0;
            for (int l = 0; l < N; ++l) want += lanes[k][l];  // integers: exact in any order
            c.expect(out[k] == want, "reduce_add_rows (out[k] = sum of rows[k])", k, out[k], want);
        }
        c.expect(out[count] == -1.0f, "reduce_add_rows writes past count", count, out[count], -1.0);
    }
    float want = 0;
    for (int l = 0; l < N; ++l) want += lanes[2][l];
    c.expect(reduce_add(rows[2]) == want, "reduce_add (sum of the lanes)", -1, reduce_add(rows[2]), want);
    for (int top = 0; top < N; ++top) {  // the largest lane at every position, negatives elsewhere
        alignas(64) float v[N];
        for (int l = 0; l < N; ++l) v[l] = l == top ? 7.5f : -static_cast<float>(l + 1);
        const float m = O::hmax(F::load_aligned(v));
        c.expect(m == 7.5f, "hmax (largest lane)", top, m, 7.5);
        if constexpr (requires { O::hmax_all(F(0.0f)); }) {
            float all[N];
            lanes_f32(O::hmax_all(F::load_aligned(v)), all);
            for (int l = 0; l < N; ++l) c.expect(all[l] == 7.5f, "hmax_all (largest lane in every lane)", l, all[l], 7.5);
        }
    }
    alignas(64) float f[N];
    for (int l = 0; l < N; ++l) f[l] = (l % 2 ? -1.0f : 1.0f) * (static_cast<float>(l) * 1.75f + 0.9f);
    int32_t ti[N];
    lanes_i32(O::to_i32(F::load_aligned(f)), ti);
    for (int l = 0; l < N; ++l) c.expect(ti[l] == static_cast<int32_t>(f[l]), "to_i32 (truncation)", l, ti[l], static_cast<int32_t>(f[l]));
    alignas(64) int32_t iv[N];
    for (int l = 0; l < N; ++l) iv[l] = 16777217 + 2 * l * (l % 2 ? -1 : 1) * 1000003;  // odd: rounding
    float tf[N];
    lanes_f32(O::to_f32(xsimd::batch<int32_t, A>::load_aligned(iv)), tf);
    for (int l = 0; l < N; ++l) c.expect(tf[l] == static_cast<float>(iv[l]), "to_f32 (rounding)", l, tf[l], static_cast<float>(iv[l]));
}

// Block layouts: loads, nibbles, high bits, packs and widening of one 32-value block.
template <class A>
void check_blocks(OpsCheck& c) {
    using O = Ops<A>;
    using F = typename O::F;
    using I = xsimd::batch<int32_t, A>;
    constexpr int N = static_cast<int>(F::size);
    int8_t q[32];
    for (int j = 0; j < 32; ++j) q[j] = static_cast<int8_t>(j * 7 - 100);  // all different, both signs
    int8_t out[32];
    const auto b = O::load_q8(q);
    O::store(b, out);
    for (int j = 0; j < 32; ++j) c.expect(out[j] == q[j], "load_q8/store (byte j)", j, out[j], q[j]);
    O::store(O::sub(b, 5), out);
    for (int j = 0; j < 32; ++j) c.expect(out[j] == static_cast<int8_t>(q[j] - 5), "sub", j, out[j], q[j] - 5);
    O::store(O::min(b, 3), out);
    for (int j = 0; j < 32; ++j) c.expect(out[j] == (q[j] < 3 ? q[j] : 3), "min (signed)", j, out[j], q[j] < 3 ? q[j] : 3);
    F w[32 / N];
    O::widen(b, w);
    for (int k = 0; k < 32 / N; ++k) {
        float v[N];
        lanes_f32(w[k], v);
        for (int l = 0; l < N; ++l) c.expect(v[l] == q[k * N + l], "widen (value kN + l)", k * N + l, v[l], q[k * N + l]);
    }
    for (int p = 0; p < 32 / (2 * N); ++p) {
        F pair[2];
        O::widen_pair(b, p, pair);
        for (int k = 0; k < 2; ++k) {
            float v[N];
            lanes_f32(pair[k], v);
            for (int l = 0; l < N; ++l) {
                const int j = 2 * N * p + k * N + l;
                c.expect(v[l] == q[j], "widen_pair (values 2Np..2Np+2N-1)", j, v[l], q[j]);
            }
        }
    }
    uint8_t qs[16];
    for (int j = 0; j < 16; ++j) qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));  // low j, high 15-j
    const auto nib = O::load_nibbles(qs);
    O::store(nib, out);
    for (int j = 0; j < 32; ++j) {
        const int want = j < 16 ? j : 31 - j;
        c.expect(out[j] == want, "load_nibbles (low nibble = j, high = j+16)", j, out[j], want);
    }
    O::store(O::load_iq4_nl(qs), out);
    for (int j = 0; j < 32; ++j) {
        const int want = detail::kIQ4NLValues[j < 16 ? j : 31 - j];
        c.expect(out[j] == want, "load_iq4_nl (value j = the level of nibble j)", j, out[j], want);
    }
    const uint8_t qh[4] = {0xA5, 0x3C, 0x0F, 0xF0};
    O::store(O::add_high_bits(nib, qh), out);
    for (int j = 0; j < 32; ++j) {
        const int want = (j < 16 ? j : 31 - j) | (((qh[j / 8] >> (j % 8)) & 1) << 4);
        c.expect(out[j] == want, "add_high_bits (bit j of qh -> 0x10 in byte j)", j, out[j], want);
    }
    const uint32_t mask = O::bit4_mask(O::add_high_bits(nib, qh));
    uint32_t want_mask;
    std::memcpy(&want_mask, qh, 4);
    for (int j = 0; j < 32; ++j)
        c.expect(((mask >> j) & 1) == ((want_mask >> j) & 1), "bit4_mask (bit j = bit 4 of byte j)", j, (mask >> j) & 1, (want_mask >> j) & 1);
    uint8_t packed[16];
    O::store_nibbles(O::add_high_bits(nib, qh), packed);  // bit 4 must be dropped
    for (int j = 0; j < 16; ++j) c.expect(packed[j] == qs[j], "store_nibbles (byte j = value j | value j+16 << 4)", j, packed[j], qs[j]);
    if constexpr (requires { O::store_nibbles15(nib, packed); }) {
        O::store_nibbles15(nib, packed);
        for (int j = 0; j < 16; ++j) c.expect(packed[j] == qs[j], "store_nibbles15", j, packed[j], qs[j]);
    }
    alignas(64) int32_t wide[32];
    for (int j = 0; j < 32; ++j) wide[j] = (j * 37 - 500) * (j % 3 == 0 ? 1000 : 1);  // beyond int8: truncation
    I iv[32 / N];
    for (int k = 0; k < 32 / N; ++k) iv[k] = I::load_aligned(wide + k * N);
    O::store(O::low_bytes(iv), out);
    for (int j = 0; j < 32; ++j)
        c.expect(out[j] == static_cast<int8_t>(wide[j]), "low_bytes (the low byte of value j)", j, out[j], static_cast<int8_t>(wide[j]));
    for (int j = 0; j < 32; ++j) wide[j] = j * 8 - 128;  // -128..120
    for (int k = 0; k < 32 / N; ++k) iv[k] = I::load_aligned(wide + k * N);
    O::store(O::pack_small(iv), out);
    for (int j = 0; j < 32; ++j) c.expect(out[j] == wide[j], "pack_small (value j in -128..127)", j, out[j], wide[j]);
}

template <class A>
void check_dots(OpsCheck& c) {
    using O = Ops<A>;
    using FD = xsimd::batch<float, typename O::DotArch>;
    constexpr int ND = static_cast<int>(FD::size);
    int8_t k[32], u[32], y[4][32];
    for (int j = 0; j < 32; ++j) {
        k[j] = j == 3 ? -128 : c.next_i8();  // -128: the sign trick's edge
        u[j] = static_cast<int8_t>(c.next() % 32);
        for (int i = 0; i < 4; ++i) y[i][j] = static_cast<int8_t>(i == 1 ? (j % 2 ? 127 : -127) : c.next_i8() / 2 * 2 + 1);
    }
    const int8_t* ys[4] = {y[0], y[1], y[2], y[3]};
    int32_t dk[4] = {}, du[4] = {};
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 32; ++j) {
            dk[i] += k[j] * y[i][j];
            du[i] += u[j] * y[i][j];
        }
    const auto key = O::key(O::load_q8(k));
    float lanes[ND];
    lanes_f32(O::dot(key, y[0]), lanes);
    float sum = 0;
    for (float v : lanes) sum += v;
    c.expect(sum == dk[0], "dot (lanes sum to k.y)", -1, sum, dk[0]);
    const struct {
        const char* what;
        typename O::IDot p;
        const int32_t* want;
    } fours[] = {{"dot4_signed (lanes l = i mod 4 sum to k.y_i)", O::dot4_signed(key, ys), dk},
                 {"dot4_unsigned (lanes l = i mod 4 sum to u.y_i)", O::dot4_unsigned(O::ukey(O::load_q8(u)), ys), du}};
    for (const auto& f : fours) {
        lanes_f32(O::dot_to_f32(f.p), lanes);
        for (int i = 0; i < 4; ++i) {
            float s = 0;
            for (int l = i; l < ND; l += 4) s += lanes[l];
            c.expect(s == f.want[i], f.what, i, s, f.want[i]);
        }
    }
    if constexpr (requires { O::kBlockPairs; }) {
        // Two nibble blocks, one per 128-bit half, laid out as score_group4_pairs lays them out.
        uint8_t qs0[16], qs1[16];
        for (int j = 0; j < 16; ++j) {
            qs0[j] = static_cast<uint8_t>(c.next());
            qs1[j] = static_cast<uint8_t>(c.next());
        }
        typename O::UKey lo, hi;
        O::load_nibble_pair(qs0, qs1, lo, hi);
        alignas(32) int8_t ylo[4][32], yhi[4][32];
        for (int i = 0; i < 4; ++i)
            for (int h = 0; h < 2; ++h) {
                std::memcpy(&ylo[i][16 * h], y[(i + h) % 4], 16);
                std::memcpy(&yhi[i][16 * h], y[(i + h) % 4] + 16, 16);
            }
        lanes_f32(O::dot_to_f32(O::dot4_pair(lo, hi, ylo, yhi)), lanes);
        for (int h = 0; h < 2; ++h) {
            const uint8_t* qs = h ? qs1 : qs0;
            for (int i = 0; i < 4; ++i) {
                int32_t want = 0;
                for (int j = 0; j < 16; ++j) want += (qs[j] & 15) * y[(i + h) % 4][j] + (qs[j] >> 4) * y[(i + h) % 4][j + 16];
                c.expect(lanes[4 * h + i] == want, "load_nibble_pair/dot4_pair (lane 4h+i: block h times query i)",
                         4 * h + i, lanes[4 * h + i], want);
            }
        }
        alignas(32) float result[7][8];
        for (int r = 0; r < 7; ++r)
            for (int l = 0; l < 8; ++l) result[r][l] = static_cast<float>(r * 100 + l * 11);
        float o[4][7];
        float* op[4] = {o[0], o[1], o[2], o[3]};
        O::store_half_sums4(result, 7, op);
        for (int i = 0; i < 4; ++i)
            for (int r = 0; r < 7; ++r)
                c.expect(o[i][r] == result[r][i] + result[r][i + 4], "store_half_sums4 (out[i][r] = result[r][i] + result[r][i+4])",
                         i * 7 + r, o[i][r], result[r][i] + result[r][i + 4]);
        float pair[8];
        lanes_f32(O::f16_pair(0x3C00, 0xC500), pair);  // 1.0 and -5.0
        for (int l = 0; l < 8; ++l) c.expect(pair[l] == (l < 4 ? 1.0f : -5.0f), "f16_pair (d0 in the low half, d1 in the high)", l, pair[l], l < 4 ? 1.0 : -5.0);
    }
}

// fp16 and 16-bit lanes: bit-identical to lib/ref/half.hpp.
template <class A>
void check_half(OpsCheck& c) {
    using O = Ops<A>;
    using F = typename O::F;
    using I = xsimd::batch<int32_t, A>;
    constexpr int N = static_cast<int>(F::size);
    for (uint32_t h = 0; h < 65536; ++h) {
        const float want = detail::f16_to_f32(static_cast<uint16_t>(h));
        const float got = O::f16_value(static_cast<uint16_t>(h));
        if (!std::isnan(want)) c.expect(same_bits(got, want), "f16_value (bits of half.hpp)", h, got, want);
    }
    alignas(64) uint16_t h16[N];
    for (int l = 0; l < N; ++l) h16[l] = static_cast<uint16_t>(0x3C00 + 97 * l + (l % 2 ? 0x8000 : 0));
    float v[N];
    lanes_f32(O::load_f16(h16), v);
    for (int l = 0; l < N; ++l) c.expect(same_bits(v[l], detail::f16_to_f32(h16[l])), "load_f16 (value l)", l, v[l], detail::f16_to_f32(h16[l]));
    int32_t u[N];
    lanes_i32(O::load_u16(h16), u);
    for (int l = 0; l < N; ++l) c.expect(u[l] == h16[l], "load_u16 (zero-extended)", l, u[l], h16[l]);
    alignas(64) float f[N];
    for (int l = 0; l < N; ++l) f[l] = (l % 2 ? -1.0f : 1.0f) * (1.0f + static_cast<float>(l) / 2048.0f + 1.0f / 4096.0f);  // ties
    f[0] = 65520.0f;  // rounds to Inf
    if (N > 2) f[2] = 3e-8f;  // subnormal half
    uint16_t out[N];
    O::store_f16(out, F::load_aligned(f));
    for (int l = 0; l < N; ++l) c.expect(out[l] == detail::f32_to_f16(f[l]), "store_f16 (round to nearest even)", l, out[l], detail::f32_to_f16(f[l]));
    alignas(64) int32_t wide[N];
    for (int l = 0; l < N; ++l) wide[l] = 0x12340000 + l * 0x1111 + 7;
    O::store_u16(out, I::load_aligned(wide));
    for (int l = 0; l < N; ++l) c.expect(out[l] == (wide[l] & 0xFFFF), "store_u16 (the low 16 bits)", l, out[l], wide[l] & 0xFFFF);
}

// fmadd (xsimd_compat.hpp): one rounding where the arch has fused multiply-add, else the product rounded
// then the sum. Lane l: (1 + (l+1)·2^-13)·(1 − 2^-13) − (1 + l·2^-13) is −(l+1)·2^-26 exactly, which
// a rounded product loses wherever (l+1) is not a multiple of 8 (every lane but 7 and 15).
template <class A>
void check_fmadd(OpsCheck& c) {
    using F = xsimd::batch<float, A>;
    constexpr int N = static_cast<int>(F::size);
    alignas(64) float x[N], y[N], z[N], got[N];
    for (int l = 0; l < N; ++l) {
        x[l] = 1.0f + static_cast<float>(l + 1) * 0x1p-13f;
        y[l] = 1.0f - 0x1p-13f;
        z[l] = -(1.0f + static_cast<float>(l) * 0x1p-13f);
    }
    fmadd(F::load_aligned(x), F::load_aligned(y), F::load_aligned(z)).store_aligned(got);
    for (int l = 0; l < N; ++l) {
        volatile float product = x[l] * y[l];  // rounded on its own (kvq builds with -ffp-contract=off)
        const float want = fmadd_is_fused<A>() ? std::fma(x[l], y[l], z[l]) : product + z[l];
        c.expect(same_bits(got[l], want), fmadd_is_fused<A>() ? "fmadd (one rounding)" : "fmadd (product rounded, then the sum)",
                 l, got[l], want);
    }
}

// Null if every primitive of Ops<A> keeps its contract on this CPU, else the first broken one.
template <class A>
const char* check_ops() {
    static thread_local OpsCheck c;
    c = OpsCheck{};
    check_reductions<A>(c);
    if constexpr (!std::is_same_v<typename Ops<A>::DotArch, A>) check_reductions<typename Ops<A>::DotArch>(c);
    check_blocks<A>(c);
    check_dots<A>(c);
    check_half<A>(c);
    check_fmadd<A>(c);
    if constexpr (!std::is_same_v<typename Ops<A>::DotArch, A>) check_fmadd<typename Ops<A>::DotArch>(c);
    return c.failed ? c.msg : nullptr;
}

}  // namespace
}  // namespace kvq::simd
