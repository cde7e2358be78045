// What the SIMD quantizers of the turbo and polar codecs share (quantize_turbo_impl.hpp,
// quantize_polar_impl.hpp), written once over the xsimd arch A, Ops<A> and RotOps<A>
// (quantize_rotated_ops.hpp): the rank of a value among a codebook's thresholds, the packing of codes,
// row buffers. They write the bytes of the scalar specification (lib/ref/rotated_quantize_scalar.cpp)
// because they do its float operations in its order (lib/ref/rotated_quantize.hpp says which order):
// the rotation's butterflies lane by lane (rotate_impl.hpp), the 16 partial sums register by register
// and added by the same tree, the rank of a value as the exact count of thresholds below it (by buckets
// or a binary search, below), polar's code compares one for one. fma only where a product is exact
// (x² in double, v·(±1)), so that it rounds as the specification's separate add does. One liberty: a
// butterfly's a − b is computed as a + (−b), which differs from it only in which NaN a NaN operand
// gives; so a row is taken here only when it is finite after the rotation (turbo: its norm is at most
// 1e30; polar: its last radii are finite), and every other row goes through the specification's row
// function.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../ref/rotated_quantize.hpp"
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
    // Built from the thresholds with the same operations (std::fma is the fused fma); a codebook with two
    // thresholds in one bucket is searched. v is finite here (the rows taken have no NaN: see above).
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
        // Per call of a quantizer: only the tables its rank search reads.
        void build(const float* bounds, int bits) {
            if (!(R::kLookup32 && build_buckets(bounds, bits))) build_search(bounds, bits);
        }
        void build_search(const float* bounds, int bits) {
            for (int k = 2; k < bits && k <= 3; ++k) {  // step 1 reads no table
                const int s = 1 << (bits - 1 - k);
                for (int r = 0; r < 16; ++r) {
                    const int m = std::min(R::kLookup16 ? r >> (bits - k) : r, (1 << k) - 1);
                    (R::kLookup16 ? u : t)[k - 1][r] = bounds[2 * s * m + s - 1];
                }
            }
        }
        bool build_buckets(const float* bounds, int bits) {
            const int n = (1 << bits) - 1;
            if (bits < 3 || bits > 5 || !(bounds[n - 1] > bounds[0])) return false;
            a = 30.0f / (bounds[n - 1] - bounds[0]);  // the thresholds in buckets 1..30
            b = 1.0f - bounds[0] * a;
            if (!std::isfinite(a) || !std::isfinite(b)) return false;
            for (int i = 0; i < 32; ++i) thr[i] = INFINITY;
            int last = -1;  // the thresholds' buckets ascend: two in one bucket are neighbours
            for (int k = 0; k < n; ++k) {
                const int i = bucket(bounds[k], a, b);
                if (i == last) return false;  // two in one bucket: search
                for (int j = last + 1; j <= i; ++j) base[j] = k;
                thr[i] = bounds[k];
                last = i;
            }
            for (int j = last + 1; j < 32; ++j) base[j] = n;
            bucketed = true;
            return true;
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

    // n bytes from buf to a row (no library call for these few bytes; nothing past the row is written).
    static void copy_bytes(uint8_t* row, const uint8_t* buf, size_t n) {
        size_t i = 0;
        for (; i + 32 <= n; i += 32) std::memcpy(row + i, buf + i, 32);
        for (; i + 8 <= n; i += 8) std::memcpy(row + i, buf + i, 8);
        for (; i < n; ++i) row[i] = buf[i];
    }

    // Rows are read once, from memory: the rows ahead are asked for, every cache line of them.
    static void prefetch_row(const float* x, int d) {
        for (int j = 0; j < d; j += 16) __builtin_prefetch(x + j);
    }
};

}  // namespace
}  // namespace kvq::simd
