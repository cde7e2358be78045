// Every SIMD level this CPU runs against the scalar specification at the edges: NaN/Inf anywhere,
// every fp16 scale, rounding ties, every accumulate group and chunk. The general grid is kvq::selftest()
// (test_simd_selfcheck.cpp); the score kernels' edges are in test_simd_scores.cpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <cfloat>
#include <limits>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kvq/codec.hpp"
#include "kvq/simd.hpp"
#include "simd/dispatch.hpp"
#include "ref/blocks.hpp"
#include "ref/half.hpp"
#include "ref/weight_grid.hpp"
#include "simd/level_check.hpp"
#include "simd_levels.hpp"

using kvq::detail::BlockCodec;
using kvq::detail::BlockKernels;
using kvq::test::simd_levels;

namespace {

struct CodecCase {
    BlockCodec codec;
    std::string name;
    int block, bytes_per_block;
};

std::vector<CodecCase> block_codecs() {
    std::vector<CodecCase> cases;
    const auto names = kvq::codec_names();
    for (int c = 0; c < static_cast<int>(BlockCodec::count); ++c) {
        const auto info = kvq::codec_info(names.at(c));  // BlockCodec is in table order
        cases.push_back({static_cast<BlockCodec>(c), info.name, info.block, info.bytes_per_block});
    }
    return cases;
}

std::vector<float> make_rows(size_t rows, int n, uint64_t seed, bool extreme) {
    return kvq::detail::parity_rows(rows, n, seed, extreme);
}
bool close(float simd, float ref, double tol) { return kvq::detail::close_to(simd, ref, tol); }

}  // namespace

TEST_CASE("SIMD levels: this CPU runs the levels it reports, and KVQ_SIMD names are known") {
    const auto levels = kvq::available_simd_levels();
    REQUIRE(levels.front() == kvq::SimdLevel::scalar);
    for (auto l : levels) {
        CAPTURE(kvq::simd_level_name(l));
        for (const auto& c : block_codecs()) CHECK(kvq::detail::level_kernels(c.codec, l) != nullptr);
    }
    MESSAGE("SIMD levels here: " << [&] {
        std::string s;
        for (auto l : levels) s += std::string(kvq::simd_level_name(l)) + " ";
        return s;
    }());
    const auto active = kvq::simd_level();
    for (auto l : levels) {
        kvq::force_simd_level(l);
        CHECK(kvq::simd_level() == l);
    }
    kvq::force_simd_level(active);
    CHECK_THROWS_AS(kvq::parse_simd_level("avx9000"), std::invalid_argument);
}

// The grid of quantize/prepare/dequantize (identical bytes) and score/accumulate (float rounding) for
// every block codec, head size, 1-8 queries and 1-129 rows is kvq::selftest(), shipped in the library
// (tests/test_simd_selfcheck.cpp runs it); the cases below are the edges it does not reach.

TEST_CASE("all_finite finds every NaN and Inf at every level, wherever it is") {
    const kvq::SimdLevel active = kvq::simd_level();
    for (auto level : kvq::available_simd_levels()) {
        kvq::force_simd_level(level);
        CAPTURE(kvq::simd_level_name(level));
        std::vector<float> x(301, 1.5f);
        CHECK(kvq::detail::all_finite(x.data(), x.size()));
        CHECK(kvq::detail::all_finite(x.data(), 0));
        for (size_t pos : {size_t(0), size_t(7), size_t(64), size_t(255), size_t(300)}) {
            for (float bad : {NAN, INFINITY, -INFINITY}) {
                x[pos] = bad;
                CHECK_FALSE(kvq::detail::all_finite(x.data(), x.size()));
                CHECK(kvq::detail::all_finite(x.data(), pos));  // stops before it
                x[pos] = FLT_MAX;
                CHECK(kvq::detail::all_finite(x.data(), x.size()));
                x[pos] = 1.5f;
            }
        }
    }
    kvq::force_simd_level(active);
}

TEST_CASE("every fp16 scale (all 65536 bit patterns) dequantizes to the same bits at every level") {
    std::vector<uint8_t> rows(size_t(65536) * 34);
    for (uint32_t h = 0; h < 65536; ++h) {
        const uint16_t d = static_cast<uint16_t>(h);
        std::memcpy(&rows[h * 34], &d, 2);
        for (int j = 0; j < 32; ++j) rows[h * 34 + 2 + j] = static_cast<uint8_t>(j - 16);
    }
    const int64_t n = int64_t(65536) * 32;
    std::vector<float> ref(n), got(n);
    kvq::detail::scalar_kernels(BlockCodec::q8_0).dequantize(rows.data(), ref.data(), n);
    for (auto level : simd_levels()) {
        CAPTURE(kvq::simd_level_name(level));
        kvq::detail::level_kernels(BlockCodec::q8_0, level)->dequantize(rows.data(), got.data(), n);
        size_t diff = 0;
        for (int64_t i = 0; i < n; ++i) diff += std::memcmp(&ref[i], &got[i], 4) != 0;
        CHECK(diff == 0);
    }
}

// The value kernels of the decode step (lib/simd/accumulate_avx2.hpp and the generic ones): every group
// of queries (4 at a time, then the rest), row counts around the 64-row chunk, head sizes whose block
// count is and is not a multiple of the 4 scales folded together, every code value (extreme rows), and
// accumulators that already hold values.
TEST_CASE("every SIMD level accumulates symmetric block codes as the scalar specification, every group and chunk") {
    for (auto level : simd_levels()) {
        for (const auto& c : block_codecs()) {
            if (c.codec != BlockCodec::q8_0 && c.codec != BlockCodec::q4_0 && c.codec != BlockCodec::q5_0 &&
                c.codec != BlockCodec::iq4_nl) {
                continue;
            }
            const BlockKernels& ref = kvq::detail::scalar_kernels(c.codec);
            const BlockKernels& simd = *kvq::detail::level_kernels(c.codec, level);
            for (int n : {32, 96, 128, 160, 256}) {
                for (size_t rows : {size_t(1), size_t(32), size_t(63), size_t(64), size_t(65), size_t(129)}) {
                    for (bool extreme : {false, true}) {
                        const size_t row_bytes = size_t(n / c.block) * c.bytes_per_block, stride = row_bytes + 1;
                        const auto v = make_rows(rows, n, 31 * n + rows, extreme);
                        std::vector<uint8_t> vals(rows * stride);
                        for (size_t r = 0; r < rows; ++r) ref.quantize(v.data() + r * n, vals.data() + r * stride, n);
                        std::vector<float> vd(rows * n);
                        for (size_t r = 0; r < rows; ++r) ref.dequantize(vals.data() + r * stride, vd.data() + r * n, n);
                        for (int n_q : {1, 2, 3, 4, 5, 8}) {
                            CAPTURE(kvq::simd_level_name(level));
                            CAPTURE(c.name);
                            CAPTURE(n);
                            CAPTURE(rows);
                            CAPTURE(extreme);
                            CAPTURE(n_q);
                            const size_t w_stride = rows + 3;
                            std::vector<float> w = make_rows(n_q, static_cast<int>(w_stride), 7 + rows, false);
                            for (auto& x : w) x = std::fabs(x);  // softmax weights are non-negative
                            const std::vector<float> acc0 = make_rows(n_q, n, 3 + n, false);
                            std::vector<float> aa = acc0, ab = acc0;
                            ref.accumulate(w.data(), w_stride, n_q, vals.data(), stride, rows, n, aa.data());
                            simd.accumulate(w.data(), w_stride, n_q, vals.data(), stride, rows, n, ab.data());
                            size_t bad = 0;
                            for (int i = 0; i < n_q; ++i) {
                                for (int j = 0; j < n; ++j) {
                                    double mag = std::fabs(acc0[i * n + j]);
                                    for (size_t r = 0; r < rows; ++r) mag += std::fabs(double(w[i * w_stride + r]) * vd[r * n + j]);
                                    bad += !close(ab[i * n + j], aa[i * n + j], 2e-6 * mag + 1e-35);
                                }
                            }
                            CHECK_MESSAGE(bad == 0, bad << " accumulated values differ beyond float rounding");
                        }
                    }
                }
            }
        }
    }
}

namespace {

// Blocks that probe the quantizers' fast-path tests and rounding: NaN and Inf in every position (alone,
// together, with a larger finite value), exact rounding ties and their neighbours at scale 1, ±0, huge
// and subnormal scales. Each block is 32 values; blocks are grouped so that every lane of a group of
// 4, 8 or 16 blocks sees each kind.
std::vector<float> edge_blocks() {
    std::vector<float> x;
    std::mt19937_64 rng(77);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    auto block = [&](auto&& fill) {
        float b[32];
        for (float& v : b) v = normal(rng);
        fill(b);
        x.insert(x.end(), b, b + 32);
    };
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (int p = 0; p < 32; ++p) {
        for (float bad : {nan, -nan, inf, -inf}) block([&](float* b) { b[p] = bad; });
        block([&](float* b) { b[p] = nan; b[31 - p] = inf; });
        block([&](float* b) { b[p] = -inf; b[(p + 7) % 32] = nan; });
        block([&](float* b) { b[p] = nan; b[(p + 1) % 32] = 1e30f; });
        block([&](float* b) { for (int j = 0; j < 32; ++j) b[j] = j == p ? nan : 0.0f; });
    }
    // Scale exactly 1 for q8_0 (amax 127) and q4_0 (extreme -8) / q5_0 (-16): x·id = x, and the rounding
    // sees the ties themselves.
    const float ties[] = {0.5f, 1.5f, 2.5f, 126.5f, 0.49999997f, 0.50000006f, 1.4999999f, 2.5000002f,
                          0.0f, -0.0f, 1e-45f, 7.5f, 8.5f, 15.5f, 3.4999998f};
    for (float extreme : {127.0f, -8.0f, -16.0f, 8.0f, 16.0f}) {
        for (float sign : {1.0f, -1.0f}) {
            block([&](float* b) {
                for (int j = 0; j < 32; ++j) {
                    const float t = ties[j % (sizeof ties / sizeof ties[0])] * sign;
                    b[j] = std::fabs(t) <= std::fabs(extreme) ? t : t / 16.0f;
                }
                b[(extreme > 0) ? 3 : 29] = extreme;
            });
        }
    }
    for (float s : {0.0f, -0.0f}) block([&](float* b) { for (int j = 0; j < 32; ++j) b[j] = (j % 3) ? s : -s; });
    for (float m : {FLT_MAX, -FLT_MAX, 8.3e6f, 65504.0f * 127, 65504.0f * 127 * 1.001f, 1e-38f, 1e-40f, 1e-44f,
                    FLT_MIN * 127, FLT_MIN * 126}) {
        block([&](float* b) {
            for (int j = 0; j < 32; ++j) b[j] = m * (j % 5 - 2) / 2.0f;
        });
        block([&](float* b) { for (int j = 0; j < 32; ++j) b[j] *= std::fabs(m) / 4.0f; b[11] = m; });
    }
    // iq4_nl, iq4_nls: at an extreme of ±127 the inverse scale (iq4_nls: its first candidate's) is exactly
    // ∓1 or ±1, so values on the levels and on the midpoints between them are the nearest-level rule's
    // ties; and blocks of every size the vector path takes, and just past it.
    for (float extreme : {127.0f, -127.0f}) {
        for (float sign : {1.0f, -1.0f}) {
            block([&](float* b) {
                for (int j = 0; j < 32; ++j) {
                    const float lo = kvq::detail::kIQ4NLValues[j % 15], hi = kvq::detail::kIQ4NLValues[j % 15 + 1];
                    b[j] = sign * (j < 15 ? (lo + hi) / 2 : j < 30 ? lo : hi);
                }
                b[31] = extreme;
            });
        }
    }
    for (float s : {1e-15f, 1e-12f, 1e-6f, 0.01f, 1.0f, 3.0f, 1e3f, 1e6f, 1e8f, 5e8f, 1e9f}) {
        block([&](float* b) { for (int j = 0; j < 32; ++j) b[j] *= s; });
    }
    while (x.size() % (16 * 32) != 0) block([](float*) {});
    return x;
}

}  // namespace

TEST_CASE("every SIMD level quantizes NaN/Inf anywhere, rounding ties, ±0, huge and subnormal scales as the specification") {
    const auto x = edge_blocks();
    for (auto level : simd_levels()) {
        for (const auto& c : block_codecs()) {
            if (c.block != 32) continue;
            CAPTURE(kvq::simd_level_name(level));
            CAPTURE(c.name);
            const BlockKernels& ref = kvq::detail::scalar_kernels(c.codec);
            const BlockKernels& simd = *kvq::detail::level_kernels(c.codec, level);
            // One long call (full groups of blocks) and rows of 1..9 blocks (partial groups).
            for (int per_call : {0, 1, 3, 4, 5, 8, 9}) {
                CAPTURE(per_call);
                const size_t blocks = x.size() / 32;
                std::vector<uint8_t> a(blocks * c.bytes_per_block, 0xAB), b(blocks * c.bytes_per_block, 0xCD);
                const size_t step = per_call ? per_call : blocks;
                for (size_t i = 0; i < blocks; i += step) {
                    const size_t nb = std::min(step, blocks - i);
                    ref.quantize(x.data() + i * 32, a.data() + i * c.bytes_per_block, int64_t(nb) * 32);
                    simd.quantize(x.data() + i * 32, b.data() + i * c.bytes_per_block, int64_t(nb) * 32);
                }
                size_t bad = 0;
                for (size_t i = 0; i < blocks; ++i) {
                    bad += std::memcmp(a.data() + i * c.bytes_per_block, b.data() + i * c.bytes_per_block,
                                       c.bytes_per_block) != 0;
                }
                CHECK_MESSAGE(bad == 0, bad << " of " << blocks << " edge blocks quantize differently");
            }
        }
    }
}

TEST_CASE("finite_max_abs: the largest |x|, or NaN for any NaN or Inf, at every level") {
    const kvq::SimdLevel active = kvq::simd_level();
    for (auto level : kvq::available_simd_levels()) {
        kvq::force_simd_level(level);
        CAPTURE(kvq::simd_level_name(level));
        std::vector<float> x(301);
        for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * 3.0f;
        float m = 0.0f;
        for (float v : x) m = std::max(m, std::fabs(v));
        CHECK(kvq::detail::finite_max_abs(x.data(), x.size()) == m);
        CHECK(kvq::detail::finite_max_abs(x.data(), 0) == 0.0f);
        for (size_t pos : {size_t(0), size_t(7), size_t(64), size_t(255), size_t(300)}) {
            CAPTURE(pos);
            for (float bad : {NAN, INFINITY, -INFINITY}) {
                const float keep = x[pos];
                x[pos] = bad;
                CHECK(std::isnan(kvq::detail::finite_max_abs(x.data(), x.size())));
                CHECK_FALSE(std::isnan(kvq::detail::finite_max_abs(x.data(), pos)));  // stops before it
                x[pos] = -FLT_MAX;
                CHECK(kvq::detail::finite_max_abs(x.data(), x.size()) == FLT_MAX);
                x[pos] = keep;
            }
        }
    }
    kvq::force_simd_level(active);
}

// The chanB score kernel of every level against its specification, bit for bit: every code width, head
// sizes with and without a last group of 8 codes and past 256 (the portable kernel decodes 256 values at
// a time), one row to a few chunks, 1 to 5 queries (a query with a -0 first value), rows at a stride one
// byte past their end.
TEST_CASE("every SIMD level scores chanB codes as the scalar specification, bit for bit") {
    for (auto level : simd_levels()) {
        for (int bits = 2; bits <= 8; ++bits) {
            for (int d : {8, 16, 24, 120, 128, 136, 256, 264, 520}) {
                for (size_t rows : {size_t(1), size_t(2), size_t(33)}) {
                    for (int n_q : {1, 4, 5}) {
                        size_t checks = 0;
                        CAPTURE(kvq::simd_level_name(level));
                        CAPTURE(bits);
                        CAPTURE(d);
                        CAPTURE(rows);
                        CAPTURE(n_q);
                        CHECK(kvq::detail::check_channel_score(level, bits, d, rows, n_q, 1000 * bits + d + rows, checks) == "");
                        CHECK(checks == rows * n_q);
                    }
                }
            }
        }
    }
}

// accumulate_grid (q4_0 values on the int8 weight grid, lib/ref/weight_grid.hpp): every level as the
// scalar specification, over group sizes around the 16-row grid group and odd row pairs, query groups,
// head sizes, weights with zeros, a group whose largest w·d is subnormal (the scale-up), and a NaN weight.
TEST_CASE("every SIMD level accumulates q4_0 on the int8 weight grid as the scalar specification") {
    const BlockKernels& ref = kvq::detail::scalar_kernels(BlockCodec::q4_0);
    REQUIRE((ref.accumulate_grid != nullptr));
    for (auto level : simd_levels()) {
        const BlockKernels& simd = *kvq::detail::level_kernels(BlockCodec::q4_0, level);
        REQUIRE((simd.accumulate_grid != nullptr));
        for (int n : {32, 128, 160}) {
            for (size_t rows : {size_t(1), size_t(2), size_t(15), size_t(16), size_t(17), size_t(33), size_t(65)}) {
                const size_t row_bytes = size_t(n / 32) * 18, stride = row_bytes + 1;
                const auto v = make_rows(rows, n, 17 * n + rows, false);
                std::vector<uint8_t> vals(rows * stride);
                for (size_t r = 0; r < rows; ++r) ref.quantize(v.data() + r * n, vals.data() + r * stride, n);
                std::vector<float> vd(rows * n);
                for (size_t r = 0; r < rows; ++r) ref.dequantize(vals.data() + r * stride, vd.data() + r * n, n);
                for (int n_q : {1, 3, 4, 5, 8}) {
                    for (int kind = 0; kind < 3; ++kind) {  // plain, zeros and a spread, subnormal
                        CAPTURE(kvq::simd_level_name(level));
                        CAPTURE(n);
                        CAPTURE(rows);
                        CAPTURE(n_q);
                        CAPTURE(kind);
                        const size_t w_stride = rows + 3;
                        std::vector<float> w = make_rows(n_q, static_cast<int>(w_stride), 11 + rows, false);
                        for (size_t at = 0; at < w.size(); ++at) {
                            w[at] = std::fabs(w[at]);
                            if (kind == 1) w[at] = at % 5 == 0 ? 0.0f : std::exp(8.0f * (w[at] - 1.0f));
                            if (kind == 2) w[at] *= 1e-38f;
                        }
                        // A subnormal group's sums start from zero, so that nothing larger hides them.
                        const std::vector<float> acc0 = kind == 2 ? std::vector<float>(size_t(n_q) * n, 0.0f)
                                                                  : make_rows(n_q, n, 5 + n, false);
                        std::vector<float> aa = acc0, ab = acc0;
                        ref.accumulate_grid(w.data(), w_stride, n_q, vals.data(), stride, rows, n, aa.data());
                        simd.accumulate_grid(w.data(), w_stride, n_q, vals.data(), stride, rows, n, ab.data());
                        size_t bad = 0;
                        for (int i = 0; i < n_q; ++i) {
                            for (int j = 0; j < n; ++j) {
                                // |ŵ| ≤ |w·d| + m/254 and |q| ≤ 8, m the group's largest |w·d|
                                double mag = std::fabs(acc0[i * n + j]);
                                for (size_t r0 = 0; r0 < rows; r0 += 16) {
                                    const size_t r1 = std::min(rows, r0 + 16);
                                    double m = 0;
                                    for (size_t r = r0; r < r1; ++r) {
                                        uint16_t h;
                                        std::memcpy(&h, vals.data() + r * stride + (j / 32) * 18, 2);
                                        m = std::max(m, std::fabs(double(w[i * w_stride + r]) * kvq::detail::f16_to_f32(h)));
                                    }
                                    for (size_t r = r0; r < r1; ++r) mag += std::fabs(double(w[i * w_stride + r]) * vd[r * n + j]) + m * 8 / 254;
                                }
                                bad += !close(ab[i * n + j], aa[i * n + j], 2e-6 * mag);
                            }
                        }
                        CHECK_MESSAGE(bad == 0, bad << " values differ beyond float rounding");
                    }
                }
                // A NaN weight makes its query's columns NaN at every level; the other queries are unaffected.
                std::vector<float> w(2 * rows, 0.5f);
                w[rows / 2] = std::numeric_limits<float>::quiet_NaN();
                std::vector<float> aa(2 * n, 0.0f), ab(2 * n, 0.0f);
                ref.accumulate_grid(w.data(), rows, 2, vals.data(), stride, rows, n, aa.data());
                simd.accumulate_grid(w.data(), rows, 2, vals.data(), stride, rows, n, ab.data());
                for (int j = 0; j < n; ++j) {
                    CHECK(std::isnan(aa[j]));
                    CHECK(std::isnan(ab[j]));
                    double mag = 0;  // every weight 0.5: |ŵ·q| ≤ (0.5·|d| + m/254)·8
                    for (size_t r = 0; r < rows; ++r) {
                        uint16_t h;
                        std::memcpy(&h, vals.data() + r * stride + (j / 32) * 18, 2);
                        mag += 8 * std::fabs(double(kvq::detail::f16_to_f32(h)));
                    }
                    CHECK(close(ab[n + j], aa[n + j], 2e-6 * mag));
                }
            }
        }
    }
}

// The grid itself: each rounded weight is within half a step (m/254) of w·d, an integer number of steps
// of at most 127, the largest maps to ±127 steps; zero and subnormal groups stay finite.
TEST_CASE("the int8 weight grid rounds within half a step, per lane and group") {
    std::mt19937 rng(3);
    for (float scale : {1.0f, 1e-3f, 1e-30f, 1e-40f, 0.0f}) {
        for (size_t rows : {size_t(1), size_t(16), size_t(40)}) {
            CAPTURE(scale);
            CAPTURE(rows);
            const int lanes = 3;
            std::vector<float> x(rows * lanes);
            std::normal_distribution<float> nd(0.0f, 1.0f);
            for (auto& e : x) e = nd(rng) * scale;
            std::vector<float> g = x;
            kvq::detail::round_to_grid(g.data(), rows, lanes);
            for (int l = 0; l < lanes; ++l) {
                for (size_t r0 = 0; r0 < rows; r0 += kvq::detail::kGridRows) {
                    const size_t r1 = std::min(rows, r0 + kvq::detail::kGridRows);
                    float m = 0;
                    for (size_t r = r0; r < r1; ++r) m = std::max(m, std::fabs(x[r * lanes + l]));
                    const double step = double(m) / 127;
                    for (size_t r = r0; r < r1; ++r) {
                        const double got = g[r * lanes + l], want = x[r * lanes + l];
                        REQUIRE(std::isfinite(got));
                        CHECK(std::fabs(got - want) <= step / 2 * (1 + 1e-5) + 1e-43);
                        if (step > 1e-36) {  // a subnormal step is itself rounded
                            const double k = got / step;
                            CHECK(std::fabs(k - std::round(k)) < 1e-3);
                            CHECK(std::fabs(k) <= 127.001);
                            if (std::fabs(want) == m) CHECK(std::fabs(std::fabs(k) - 127) < 1e-3);
                        }
                    }
                }
            }
        }
    }
}
