// The score kernels of every SIMD level this CPU runs against the scalar specification where the
// general grid of kvq::selftest() (test_simd_selfcheck.cpp) does not reach: the int16 limits of the dot
// products, the decode-sized calls (1-8 queries, a block of tokens) with their unrolled loops, and
// iq4_nl blocks of any bytes (every level, zero, NaN and Inf scales).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

#include "ref/blocks.hpp"
#include "simd/dispatch.hpp"
#include "simd/level_check.hpp"
#include "simd_levels.hpp"

using kvq::detail::BlockCodec;
using kvq::detail::BlockKernels;
using kvq::test::simd_levels;

namespace {

bool close(float simd, float ref, double tol) { return kvq::detail::close_to(simd, ref, tol); }

// The scores of 4 queries with codes at ±127 (all +1, all −1, alternating, alternating times j % 7)
// against the given key rows, at a level and in the specification: equal to float rounding, for scores
// of at most n · `per_value` · |d·dq|.
void check_limit_scores(const BlockKernels& ref, const BlockKernels& simd, const std::vector<uint8_t>& keys,
                        size_t row_bytes, size_t rows, int n, double per_value) {
    const int n_q = 4;
    std::vector<float> q(n_q * n);
    for (int i = 0; i < n_q; ++i) {
        for (int j = 0; j < n; ++j) q[i * n + j] = i == 0 ? 1.0f : i == 1 ? -1.0f : (j % 2 ? 1.0f : -1.0f) * (i == 2 ? 1.0f : float(j % 7));
    }
    const size_t qbytes = size_t(n / 32) * 40;
    std::vector<uint8_t> prep(n_q * qbytes);
    for (int i = 0; i < n_q; ++i) ref.prepare_query(q.data() + i * n, prep.data() + i * qbytes, n);
    std::vector<float> sa(n_q * rows), sb(n_q * rows);
    ref.score(prep.data(), qbytes, n_q, keys.data(), row_bytes, rows, n, sa.data(), rows);
    simd.score(prep.data(), qbytes, n_q, keys.data(), row_bytes, rows, n, sb.data(), rows);
    size_t bad = 0;
    for (size_t i = 0; i < sa.size(); ++i) bad += !close(sb[i], sa[i], 1e-6 * n * per_value + 1e-30);
    CHECK_MESSAGE(bad == 0, bad << " scores differ");
}

}  // namespace

TEST_CASE("q4 scores at the int16 limits: every nibble 15 or random, query codes ±127, 4 queries, even and odd block counts") {
    for (auto level : simd_levels()) {
        for (BlockCodec codec : {BlockCodec::q4_0, BlockCodec::q4_1}) {
            const BlockKernels& ref = kvq::detail::scalar_kernels(codec);
            const BlockKernels& simd = *kvq::detail::level_kernels(codec, level);
            const int bpb = codec == BlockCodec::q4_0 ? 18 : 20;
            for (int n : {32, 64, 96, 128, 256, 2048, 2080}) {
                CAPTURE(kvq::simd_level_name(level));
                CAPTURE(static_cast<int>(codec));
                CAPTURE(n);
                const size_t rows = 70, row_bytes = size_t(n / 32) * bpb;
                std::vector<uint8_t> keys(rows * row_bytes);
                std::mt19937 rng(n);
                for (size_t r = 0; r < rows; ++r) {
                    for (int b = 0; b < n / 32; ++b) {
                        uint8_t* blk = keys.data() + r * row_bytes + b * bpb;
                        const uint16_t d = 0x3C00 + static_cast<uint16_t>(rng() % 64);  // about 1.0
                        std::memcpy(blk, &d, 2);
                        if (bpb == 20) std::memcpy(blk + 2, &d, 2);
                        for (int j = bpb - 16; j < bpb; ++j) blk[j] = r % 3 == 0 ? 0xFF : static_cast<uint8_t>(rng());
                    }
                }
                check_limit_scores(ref, simd, keys, row_bytes, rows, n, 40.0);
            }
        }
    }
}

TEST_CASE("q8_0 scores at the int16 limits: key codes -128, 127 or random, query codes ±127, 4 queries, every block count, odd rows") {
    // maddubs pair sums reach 2·128·127 = 32512 here (the most a signed key can give without saturating).
    for (auto level : simd_levels()) {
        const BlockKernels& ref = kvq::detail::scalar_kernels(BlockCodec::q8_0);
        const BlockKernels& simd = *kvq::detail::level_kernels(BlockCodec::q8_0, level);
        for (int n : {32, 64, 96, 128, 256, 2048, 2080}) {
            for (size_t rows : {size_t(1), size_t(33), size_t(70)}) {
                CAPTURE(kvq::simd_level_name(level));
                CAPTURE(n);
                CAPTURE(rows);
                const size_t row_bytes = size_t(n / 32) * 34;
                std::vector<uint8_t> keys(rows * row_bytes);
                std::mt19937 rng(n + rows);
                for (size_t r = 0; r < rows; ++r) {
                    for (int b = 0; b < n / 32; ++b) {
                        uint8_t* blk = keys.data() + r * row_bytes + b * 34;
                        const uint16_t d = 0x3C00 + static_cast<uint16_t>(rng() % 64);  // about 1.0
                        std::memcpy(blk, &d, 2);
                        for (int j = 2; j < 34; ++j) {
                            blk[j] = r % 3 == 0 ? 0x80 : r % 3 == 1 ? (j % 2 ? 0x7F : 0x80) : static_cast<uint8_t>(rng());
                        }
                    }
                }
                check_limit_scores(ref, simd, keys, row_bytes, rows, n, 160.0);
            }
        }
    }
}

TEST_CASE("block-codec scores in decode-sized calls: 1-8 queries, 1-65 rows, d = 96/128 at every level") {
    // decode scores a block of 32 tokens per call; the d = 128 q8_0 kernel has its block loop unrolled.
    for (auto level : simd_levels()) {
        for (BlockCodec codec : {BlockCodec::q8_0, BlockCodec::q4_0, BlockCodec::iq4_nl}) {
            const BlockKernels& ref = kvq::detail::scalar_kernels(codec);
            const BlockKernels& simd = *kvq::detail::level_kernels(codec, level);
            for (int n : {96, 128}) {
                const size_t row_bytes = size_t(n / 32) * (codec == BlockCodec::q8_0 ? 34 : 18);
                const size_t max_rows = 65;
                std::mt19937 rng(n);
                std::normal_distribution<float> dist(0.0f, 1.0f);
                std::vector<float> x(max_rows * n), q(8 * n);
                for (float& v : x) v = dist(rng);
                for (float& v : q) v = dist(rng);
                std::vector<uint8_t> keys(max_rows * row_bytes);
                for (size_t r = 0; r < max_rows; ++r) ref.quantize(x.data() + r * n, keys.data() + r * row_bytes, n);
                const size_t qbytes = size_t(n / 32) * 40;
                std::vector<uint8_t> prep(8 * qbytes);
                for (int i = 0; i < 8; ++i) ref.prepare_query(q.data() + i * n, prep.data() + i * qbytes, n);
                for (int n_q = 1; n_q <= 8; ++n_q) {
                    for (size_t rows : {size_t(1), size_t(2), size_t(3), size_t(5), size_t(31), size_t(32), size_t(33), size_t(64), size_t(65)}) {
                        CAPTURE(kvq::simd_level_name(level));
                        CAPTURE(static_cast<int>(codec));
                        CAPTURE(n);
                        CAPTURE(n_q);
                        CAPTURE(rows);
                        const size_t stride = rows + 3;
                        std::vector<float> sa(n_q * stride, -1.0f), sb(n_q * stride, -1.0f);
                        ref.score(prep.data(), qbytes, n_q, keys.data(), row_bytes, rows, n, sa.data(), stride);
                        simd.score(prep.data(), qbytes, n_q, keys.data(), row_bytes, rows, n, sb.data(), stride);
                        size_t bad = 0;
                        for (int i = 0; i < n_q; ++i) {
                            for (size_t r = 0; r < stride; ++r) {
                                const float a = sa[i * stride + r], b = sb[i * stride + r];
                                double mag = 1.0;  // Σ|q·x| (the float inputs, about the quantized ones)
                                for (int j = 0; j < n && r < rows; ++j) mag += std::fabs(double(q[i * n + j]) * x[r * n + j]);
                                bad += r < rows ? !close(b, a, 4e-6 * mag) : b != -1.0f;
                            }
                        }
                        CHECK_MESSAGE(bad == 0, bad << " scores differ (or written outside the rows)");
                    }
                }
            }
        }
    }
}

TEST_CASE("a row's score does not depend on its place in the call: each row alone gives the whole call's bits, at every level") {
    // The kernels take rows in groups (two at a time, 16 per register at avx512 with VNNI, a short last
    // group padded): a key's score must not change with the rows around it or the block's fill.
    for (auto level : simd_levels()) {
        for (BlockCodec codec : {BlockCodec::q8_0, BlockCodec::q4_0, BlockCodec::iq4_nl}) {
            const BlockKernels& ref = kvq::detail::scalar_kernels(codec);
            const BlockKernels& simd = *kvq::detail::level_kernels(codec, level);
            for (int n : {64, 128}) {
                const size_t row_bytes = size_t(n / 32) * (codec == BlockCodec::q8_0 ? 34 : 18);
                std::mt19937 rng(n + 5);
                std::normal_distribution<float> dist(0.0f, 1.0f);
                const size_t max_rows = 65;
                std::vector<float> x(max_rows * n), q(4 * n);
                for (float& v : x) v = dist(rng);
                for (float& v : q) v = dist(rng);
                for (size_t stride : {row_bytes, row_bytes + 5}) {
                    std::vector<uint8_t> keys(max_rows * stride);
                    for (size_t r = 0; r < max_rows; ++r) ref.quantize(x.data() + r * n, keys.data() + r * stride, n);
                    const size_t qbytes = size_t(n / 32) * 40;
                    std::vector<uint8_t> prep(4 * qbytes);
                    for (int i = 0; i < 4; ++i) ref.prepare_query(q.data() + i * n, prep.data() + i * qbytes, n);
                    for (size_t rows : {size_t(17), size_t(32), size_t(47), size_t(64)}) {
                        CAPTURE(kvq::simd_level_name(level));
                        CAPTURE(static_cast<int>(codec));
                        CAPTURE(n);
                        CAPTURE(stride);
                        CAPTURE(rows);
                        std::vector<float> all(4 * rows), one(4);
                        simd.score(prep.data(), qbytes, 4, keys.data(), stride, rows, n, all.data(), rows);
                        size_t bad = 0;
                        for (size_t r = 0; r < rows; ++r) {
                            simd.score(prep.data(), qbytes, 4, keys.data() + r * stride, stride, 1, n, one.data(), 1);
                            for (int i = 0; i < 4; ++i) bad += std::memcmp(&one[i], &all[i * rows + r], sizeof(float)) != 0;
                        }
                        CHECK_MESSAGE(bad == 0, bad << " scores change with the row's place");
                    }
                }
            }
        }
    }
}

// iq4_nl's kernels look its 16 levels up in registers (load_iq4_nl): blocks of any bytes, with every code
// in both nibbles, the extreme levels (-127: code 0, 113: code 15) filling whole blocks, and scales 0,
// -0, NaN, ±Inf, subnormal, 1 and random, against the specification at every level: dequantize bit for
// bit, score and accumulate to float rounding (NaN where it gives NaN, the same Inf where it gives Inf;
// scores: see below).
TEST_CASE("iq4_nl blocks of any bytes: zero, NaN, Inf and subnormal scales, extreme levels, at every level") {
    const BlockKernels& ref = kvq::detail::scalar_kernels(BlockCodec::iq4_nl);
    const uint16_t scales[] = {0x0000, 0x8000, 0x7E00, 0x7C00, 0xFC00, 0x0001, 0x83FF, 0x3C00, 0xBC00};
    const uint8_t fills[] = {0x00, 0xFF, 0x0F, 0xF0, 0x88};
    const uint16_t finite[] = {0x0000, 0x8000, 0x0001, 0x83FF, 0x3C00, 0xBC00};
    constexpr size_t kSpecialRows = 12;
    for (int n : {32, 128, 160}) {
        const size_t rows = 37, row_bytes = size_t(n / 32) * 18, stride = row_bytes + 1;
        std::mt19937 rng(n);
        std::vector<uint8_t> keys(rows * stride);
        for (auto& v : keys) v = static_cast<uint8_t>(rng());
        for (size_t r = 0; r < rows; ++r) {
            for (int b = 0; b < n / 32; ++b) {
                uint8_t* blk = keys.data() + r * stride + b * 18;
                const size_t k = r * 7 + b;
                // rows 0..11: every scale; the others finite ones (a normal scale, or 0, -0, subnormal, ±1)
                const uint16_t d = r < kSpecialRows ? scales[k % std::size(scales)]
                                   : k % 5 == 0     ? finite[k % std::size(finite)]
                                                    : static_cast<uint16_t>(0x3000 + rng() % 0x1000);
                std::memcpy(blk, &d, 2);
                if (k % 3 == 0) std::memset(blk + 2, fills[k / 3 % std::size(fills)], 16);
                if (b == 0 && r == 1) {
                    for (int j = 0; j < 16; ++j) blk[2 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
                }
            }
        }
        std::vector<float> kd(rows * n);
        for (size_t r = 0; r < rows; ++r) ref.dequantize(keys.data() + r * stride, kd.data() + r * n, n);
        // queries: normal, all +1 (codes 127), alternating ±1, and a zero one (dq = 0)
        const int n_q = 5;
        std::vector<float> q(n_q * n);
        std::normal_distribution<float> dist(0.0f, 1.0f);
        for (int i = 0; i < n_q; ++i) {
            for (int j = 0; j < n; ++j) q[i * n + j] = i == 0 ? 1.0f : i == 1 ? (j % 2 ? 1.0f : -1.0f) : i == 2 ? 0.0f : dist(rng);
        }
        const size_t qbytes = size_t(n / 32) * 40;
        std::vector<uint8_t> prep(n_q * qbytes);
        for (int i = 0; i < n_q; ++i) ref.prepare_query(q.data() + i * n, prep.data() + i * qbytes, n);
        std::vector<float> w(n_q * rows);
        for (auto& v : w) v = std::fabs(dist(rng));
        w[3] = 0.0f;
        for (auto level : simd_levels()) {
            CAPTURE(kvq::simd_level_name(level));
            CAPTURE(n);
            const BlockKernels& simd = *kvq::detail::level_kernels(BlockCodec::iq4_nl, level);
            std::vector<float> y(rows * n);
            for (size_t r = 0; r < rows; ++r) simd.dequantize(keys.data() + r * stride, y.data() + r * n, n);
            size_t bad = 0;
            for (size_t i = 0; i < y.size(); ++i) bad += !kvq::detail::same_float(y[i], kd[i]);
            CHECK_MESSAGE(bad == 0, bad << " dequantized values differ");
            for (int nq : {1, 4, 5}) {
                CAPTURE(nq);
                std::vector<float> sa(nq * rows), sb(nq * rows);
                ref.score(prep.data(), qbytes, nq, keys.data(), stride, rows, n, sa.data(), rows);
                simd.score(prep.data(), qbytes, nq, keys.data(), stride, rows, n, sb.data(), rows);
                bad = 0;
                for (int i = 0; i < nq; ++i) {
                    for (size_t r = 0; r < rows; ++r) {
                        double mag = 1e-30;  // Σ|dq·y·x| over the row: the terms' magnitudes
                        for (int j = 0; j < n; ++j) {
                            const auto& qb = reinterpret_cast<const kvq::detail::BlockQ8Query*>(prep.data() + i * qbytes)[j / 32];
                            mag += std::fabs(double(qb.d) * qb.qs[j % 32] * kd[r * n + j]);
                        }
                        const float a = sa[i * rows + r], b = sb[i * rows + r];
                        // An Inf scale (outside the codec's contract: max_abs keeps d finite) gives a
                        // non-finite score, but lanes of partial sums of both signs times Inf can make
                        // NaN where the specification's one sum times Inf is ±Inf (q8_0's kernels alike).
                        bad += std::isinf(a) ? std::isfinite(b) : !close(b, a, 1e-6 * mag);
                    }
                }
                CHECK_MESSAGE(bad == 0, bad << " scores differ");
                // each of the rows with NaN and Inf scales alone (they make every column they reach NaN or
                // Inf), then the rows with finite scales in one call
                bad = 0;
                for (size_t r0 = 0; r0 <= kSpecialRows; ++r0) {
                    const size_t count = r0 < kSpecialRows ? 1 : rows - kSpecialRows;
                    const std::vector<float> acc0(size_t(nq) * n, 0.5f);
                    std::vector<float> aa = acc0, ab = acc0;
                    const uint8_t* at = keys.data() + r0 * stride;
                    ref.accumulate(w.data() + r0, rows, nq, at, stride, count, n, aa.data());
                    simd.accumulate(w.data() + r0, rows, nq, at, stride, count, n, ab.data());
                    for (int i = 0; i < nq; ++i) {
                        for (int j = 0; j < n; ++j) {
                            double mag = 0.5;
                            for (size_t r = r0; r < r0 + count; ++r) mag += std::fabs(double(w[i * rows + r]) * kd[r * n + j]);
                            bad += !close(ab[i * n + j], aa[i * n + j], 2e-6 * mag);
                        }
                    }
                }
                CHECK_MESSAGE(bad == 0, bad << " accumulated values differ");
            }
        }
    }
}
