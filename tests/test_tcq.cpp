// The trellis-coded codecs tcq2 and tcq3 (lib/ref/tcq.hpp): the Viterbi encoder against brute force, the
// decoding rule on hand-built rows, the error against turbo at the same bits, and the turbo conventions
// (scales, head sizes, NaN rows) they share.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "codec/codec_impl.hpp"
#include "kvq/codec.hpp"
#include "ref/half.hpp"
#include "ref/tcq.hpp"
#include "rotation/hadamard.hpp"
#include "test_util.hpp"

using kvq::Codec;
namespace kd = kvq::detail;

namespace {

// The specification's path cost: e·e summed in float in index order, the nearest level of each subset
// with ties to the lower rank.
float best_cost_of_u(const kd::TcqAlphabet& a, const float* t, int n, uint32_t u_bits) {
    float cost = 0;
    int state = 0;
    for (int j = 0; j < n; ++j) {
        const int u = (u_bits >> j) & 1, s = kd::tcq_branch_subset(state, u);
        float best = INFINITY;
        for (int k = s; k < a.n_levels; k += 4) {
            const float e = t[j] - a.levels[k];
            if (e * e < best) best = e * e;
        }
        cost += best;
        state = (u | state << 1) & 7;
    }
    return cost;
}

// The decoding rule written out from its definition (u_{−1..−3} = 0).
int spec_rank(const std::vector<int>& f, const std::vector<int>& u, int j) {
    auto at = [&](int k) { return k < 0 ? 0 : u[k]; };
    const int s1 = at(j) ^ at(j - 1) ^ at(j - 3), s0 = at(j - 2);
    return 4 * f[j] + 2 * s1 + s0;
}

double mean_squared_error(const Codec& c, const std::vector<float>& x, size_t n) {
    const int d = c.head_dim();
    std::vector<uint8_t> bytes(n * c.row_bytes());
    std::vector<float> y(n * d);
    c.quantize_rows(x.data(), n, bytes.data());
    c.dequantize_rows(bytes.data(), n, y.data());
    double se = 0, ss = 0;
    for (size_t i = 0; i < n * d; ++i) se += double(y[i] - x[i]) * (y[i] - x[i]), ss += double(x[i]) * x[i];
    return se / ss;  // per unit variance
}

}  // namespace

TEST_CASE("the tcq Viterbi encoder finds the least-cost path of brute force") {
    for (int bits : {2, 3}) {
        const kd::TcqAlphabet& a = kd::tcq_alphabet(bits);
        const int n = bits == 2 ? 10 : 8;
        for (uint64_t seed = 1; seed <= 20; ++seed) {
            CAPTURE(bits);
            CAPTURE(seed);
            const auto t = kvq::test::gaussian(n, seed);
            float brute = INFINITY;
            for (uint32_t u = 0; u < (1u << n); ++u) brute = std::min(brute, best_cost_of_u(a, t.data(), n, u));
            std::vector<uint8_t> u(n), f(n);
            const float cost = kd::tcq_viterbi(a, t.data(), n, u.data(), f.data());
            CHECK(cost == brute);
            // The returned codes are a path of that cost.
            float path = 0;
            int state = 0;
            for (int j = 0; j < n; ++j) {
                const float e = t[j] - a.levels[4 * f[j] + kd::tcq_branch_subset(state, u[j])];
                path += e * e;
                state = (u[j] | state << 1) & 7;
            }
            CHECK(path == cost);
        }
    }
}

TEST_CASE("the tcq alphabets are symmetric, ascending, on the int8 grid") {
    for (int bits : {2, 3}) {
        const kd::TcqAlphabet& a = kd::tcq_alphabet(bits);
        CHECK(a.n_levels == 1 << (bits + 1));
        CHECK(a.ints[a.n_levels - 1] == 127);
        for (int k = 0; k < a.n_levels; ++k) {
            CHECK(a.ints[k] == -a.ints[a.n_levels - 1 - k]);
            if (k > 0) CHECK(a.levels[k] > a.levels[k - 1]);
        }
    }
    CHECK(kd::tcq_alphabet(2).levels[7] == doctest::Approx(1.8763));
    CHECK(kd::tcq_alphabet(3).levels[15] == doctest::Approx(2.5702));
}

TEST_CASE("a hand-built tcq row decodes to s · Rᵀ level(rank) by the specification's rule") {
    const int d = 64;
    for (int bits : {2, 3}) {
        CAPTURE(bits);
        const Codec c = Codec::make("tcq" + std::to_string(bits), d);
        const kd::TcqAlphabet& a = kd::tcq_alphabet(bits);
        REQUIRE(c.row_bytes() == size_t(d * (bits - 1) / 8 + d / 8 + 2));
        std::vector<int> f(d), u(d);
        std::vector<uint8_t> row(c.row_bytes(), 0);
        uint64_t state = 0x9E3779B97F4A7C15ull;
        for (int j = 0; j < d; ++j) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            f[j] = int(state >> 60) & ((1 << (bits - 1)) - 1);
            u[j] = int(state >> 50) & 1;
            for (int i = 0; i < bits - 1; ++i) row[(j * (bits - 1) + i) / 8] |= ((f[j] >> i) & 1) << ((j * (bits - 1) + i) % 8);
            row[d * (bits - 1) / 8 + j / 8] |= u[j] << (j % 8);
        }
        const uint16_t half = kd::f32_to_f16(0.5f);
        std::memcpy(row.data() + row.size() - 2, &half, 2);
        std::vector<float> y(d);
        c.dequantize_rows(row.data(), 1, y.data());
        kd::Rotation(d, kvq::kDefaultSeed).apply(y.data(), y.data());
        for (int j = 0; j < d; ++j) {
            CAPTURE(j);
            CHECK(y[j] == doctest::Approx(0.5f * a.levels[spec_rank(f, u, j)]).epsilon(1e-4));
        }
    }
}

TEST_CASE("tcq3 and tcq2 have 0.70x and 0.73x turbo3's and turbo2's squared error on Gaussian rows") {
    const int d = 128;
    const size_t n = 2000;
    const auto x = kvq::test::gaussian(n * d, 77);
    const double t2 = mean_squared_error(Codec::make("turbo2", d), x, n);
    const double t3 = mean_squared_error(Codec::make("turbo3", d), x, n);
    const double c2 = mean_squared_error(Codec::make("tcq2", d), x, n);
    const double c3 = mean_squared_error(Codec::make("tcq3", d), x, n);
    MESSAGE("turbo2 " << t2 << ", tcq2 " << c2 << " (" << c2 / t2 << "x); turbo3 " << t3 << ", tcq3 " << c3 << " ("
                      << c3 / t3 << "x)");
    CHECK(c3 <= 0.78 * t3);
    CHECK(c2 <= 0.80 * t2);
}

TEST_CASE("tcq scores are closer to the exact q·k than turbo's at the same bits") {
    const int d = 128, n = 256, n_q = 4;
    const auto k = kvq::test::gaussian(size_t(n) * d, 81), q = kvq::test::gaussian(size_t(n_q) * d, 82);
    auto score_error = [&](const char* spec) {
        const Codec c = Codec::make(spec, d);
        std::vector<uint8_t> rows(n * c.row_bytes()), prep(n_q * c.query_bytes());
        std::vector<float> scores(n_q * n);
        c.quantize_rows(k.data(), n, rows.data());
        c.prepare_queries(q.data(), n_q, prep.data());
        c.score_rows(prep.data(), n_q, rows.data(), n, scores.data(), n);
        double se = 0;
        for (int i = 0; i < n_q; ++i) {
            for (int r = 0; r < n; ++r) {
                double exact = 0;
                for (int j = 0; j < d; ++j) exact += double(q[i * d + j]) * k[r * d + j];
                se += (scores[i * n + r] - exact) * (scores[i * n + r] - exact);
            }
        }
        return std::sqrt(se / (n_q * n));
    };
    const double t2 = score_error("turbo2"), c2 = score_error("tcq2"), t3 = score_error("turbo3"), c3 = score_error("tcq3");
    MESSAGE("score RMS error: turbo2 " << t2 << ", tcq2 " << c2 << ", turbo3 " << t3 << ", tcq3 " << c3);
    CHECK(c2 < 0.9 * t2);
    CHECK(c3 < 0.9 * t3);
}

TEST_CASE("tcq takes turbo's scales, needs a head_dim multiple of 32 and writes the same bytes twice") {
    const int d = 96;
    const auto x = kvq::test::gaussian(size_t(8) * d, 91);
    for (const char* spec : {"tcq2", "tcq3", "tcq3:scale=norm", "tcq3:scale=ls", "tcq2:scale=norm"}) {
        CAPTURE(spec);
        const Codec c = Codec::make(spec, d);
        CHECK(c.rotated());
        CHECK(c.bits_per_value() == doctest::Approx((spec[3] - '0') + 16.0 / d));
        std::vector<uint8_t> a(8 * c.row_bytes()), b(8 * c.row_bytes(), 0xFF);
        c.quantize_rows(x.data(), 8, a.data());
        c.quantize_rows(x.data(), 8, b.data());
        CHECK(a == b);
        std::vector<float> y(8 * d);
        c.dequantize_rows(a.data(), 8, y.data());
        double se = 0, ss = 0;
        for (size_t i = 0; i < y.size(); ++i) se += double(y[i] - x[i]) * (y[i] - x[i]), ss += double(x[i]) * x[i];
        CHECK(se / ss < (spec[3] == '2' ? 0.12 : 0.04));  // every scale is near the least-squares one
    }
    CHECK_THROWS_WITH_AS(Codec::make("tcq3", 48), doctest::Contains("multiple of 32"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("tcq2", 16), doctest::Contains("multiple of 32"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("tcq3:scale=max", 64), doctest::Contains("scale=norm|ls"), std::invalid_argument);
    CHECK_THROWS_AS(Codec::make("tcq2:scale=unbiased", 64), std::invalid_argument);  // ⟨c, u⟩ has no floor
}

TEST_CASE("tcq: a zero row is all zero codes and scale 0, NaN and Inf rows store their non-finite scale") {
    const int d = 64;
    for (const char* spec : {"tcq2", "tcq3"}) {
        CAPTURE(spec);
        const Codec c = Codec::make(spec, d);
        std::vector<float> x(3 * d, 0.0f), y(3 * d, 1.0f);
        for (int j = 0; j < d; ++j) x[d + j] = x[2 * d + j] = 0.5f;
        x[d + 5] = NAN;
        x[2 * d + 7] = INFINITY;
        std::vector<uint8_t> rows(3 * c.row_bytes(), 0x5A);
        c.quantize_rows(x.data(), 3, rows.data(), 0, kvq::NanPolicy::propagate);
        for (size_t i = 0; i < c.row_bytes(); ++i) CHECK(rows[i] == 0);
        std::vector<uint8_t> again(3 * c.row_bytes());
        c.quantize_rows(x.data(), 3, again.data(), 0, kvq::NanPolicy::propagate);
        CHECK(rows == again);
        c.dequantize_rows(rows.data(), 3, y.data());
        for (int j = 0; j < d; ++j) {
            CHECK(y[j] == 0.0f);
            CHECK(std::isnan(y[d + j]));
            CHECK(!std::isfinite(y[2 * d + j]));
        }
        CHECK_THROWS_AS(c.quantize_rows(x.data(), 3, rows.data()), std::invalid_argument);
    }
}
