// Table-driven codec tests: every codec in the table (plain and +rot) round-trips within its bound,
// scores equal the effective query times the dequantized rows, accumulation equals the weighted sum of
// dequantized rows, and bad input throws without writing.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include "kvq/codec.hpp"
#include "kvq/research/eval.hpp"
#include "test_util.hpp"

using kvq::Codec;

namespace {

// Relative RMSE bounds on N(0,1) rows. A codec added to the table without a bound here fails below.
const std::map<std::string, double> kRoundTripBound = {
    {"f32", 0.0}, {"f16", 3e-4}, {"bf16", 3e-3}, {"q8_0", 0.008}, {"q4_0", 0.12},
    {"q4_1", 0.11}, {"q5_0", 0.06}, {"q5_1", 0.055}, {"iq4_nl", 0.09}, {"iq4_nls", 0.09},
    // Rotated Lloyd-Max codecs: √MSE of the coordinate codebook (0.341, 0.184, 0.097 at 2..4 bits); the
    // QJL variants reconstruct the residual with extra variance (they are built for inner products).
    {"polar", 0.19}, {"turbo2", 0.36}, {"turbo2.5", 0.29}, {"turbo3", 0.195}, {"turbo3.5", 0.155},
    {"turbo4", 0.102}, {"turbo2_qjl", 0.79}, {"turbo3_qjl", 0.45}, {"turbo4_qjl", 0.245},
    // Trellis-coded: √ of their MSE per unit variance at d = 128 (0.0852, 0.0235; test_tcq.cpp): 0.292, 0.153.
    {"tcq2", 0.31}, {"tcq3", 0.165},
};

std::vector<std::string> all_specs() {
    std::vector<std::string> specs;
    for (const auto& name : kvq::codec_names()) {
        specs.push_back(name);
        specs.push_back(name + "+rot");
    }
    return specs;
}

std::string base_name(const std::string& spec) { return spec.substr(0, spec.find_first_of(":+")); }

}  // namespace

TEST_CASE("every codec round-trips N(0,1) rows within its bound") {
    for (int d : {64, 128, 256}) {
        const auto x = kvq::test::gaussian(size_t(512) * d, 11 + d);
        for (const auto& spec : all_specs()) {
            CAPTURE(spec);
            CAPTURE(d);
            const auto bound = kRoundTripBound.find(base_name(spec));
            REQUIRE_MESSAGE(bound != kRoundTripBound.end(), "no round-trip bound for a registered codec");
            const Codec c = Codec::make(spec, d);
            const double err = kvq::roundtrip_relative_rmse(c, x.data(), 512);
            CHECK(err <= bound->second + 2e-7);  // +rot adds float rounding of the rotation itself
        }
    }
}

TEST_CASE("q8_0 and q4_0 round-trip errors match theory on N(0,1)") {
    // Uniform quantization error: RMS step/√12 with step = amax/127 (q8_0) or amax/8 (q4_0); the expected
    // block maximum |x| of 32 normals is ≈ 2.25σ, so ≈ 0.51% and ≈ 8.1% (q4_0 a little more: its grid
    // reaches −8 on the extreme's side but only +7 on the other).
    const auto x = kvq::test::gaussian(size_t(4096) * 128, 3);
    const double q8 = kvq::roundtrip_relative_rmse(Codec::make("q8_0", 128), x.data(), 4096);
    const double q4 = kvq::roundtrip_relative_rmse(Codec::make("q4_0", 128), x.data(), 4096);
    MESSAGE("q8_0 relative RMSE " << q8 << ", q4_0 relative RMSE " << q4);
    CHECK(q8 == doctest::Approx(0.0051).epsilon(0.1));
    CHECK(q4 == doctest::Approx(0.085).epsilon(0.1));
}

TEST_CASE("score_rows equals the effective query times the dequantized rows, for any n_q and row count") {
    const int d = 128;
    for (const auto& spec : all_specs()) {
        CAPTURE(spec);
        const Codec c = Codec::make(spec, d);
        for (size_t n_rows : {size_t(1), size_t(7), size_t(33)}) {
            const int n_q = 3;
            const auto k = kvq::test::gaussian(n_rows * d, 5);
            const auto q = kvq::test::gaussian(size_t(n_q) * d, 6);
            std::vector<uint8_t> rows(n_rows * c.row_bytes()), prep(n_q * c.query_bytes());
            c.quantize_rows(k.data(), n_rows, rows.data());
            c.prepare_queries(q.data(), n_q, prep.data());
            std::vector<float> scores(n_q * n_rows), kd(n_rows * d), qe(d);
            c.score_rows(prep.data(), n_q, rows.data(), n_rows, scores.data(), n_rows);
            c.dequantize_rows(rows.data(), n_rows, kd.data());
            for (int i = 0; i < n_q; ++i) {
                c.effective_query(q.data() + i * d, qe.data());
                for (size_t r = 0; r < n_rows; ++r) {
                    double ref = 0, mag = 0;
                    for (int j = 0; j < d; ++j) {
                        ref += double(qe[j]) * kd[r * d + j];
                        mag += std::fabs(double(qe[j]) * kd[r * d + j]);
                    }
                    CHECK(std::fabs(scores[i * n_rows + r] - ref) <= 1e-5 * mag + 1e-6);
                }
            }
        }
    }
}

TEST_CASE("accumulate_rows adds the weighted dequantized rows") {
    const int d = 64, n_q = 2;
    const size_t n_rows = 19;
    for (const auto& spec : all_specs()) {
        CAPTURE(spec);
        const Codec c = Codec::make(spec, d);
        const auto v = kvq::test::gaussian(n_rows * d, 8);
        const auto w = kvq::test::gaussian(n_q * n_rows, 9);
        std::vector<uint8_t> rows(n_rows * c.row_bytes());
        c.quantize_rows(v.data(), n_rows, rows.data());
        std::vector<float> vd(n_rows * d), acc(n_q * d, 0.0f);
        c.dequantize_rows(rows.data(), n_rows, vd.data());
        c.accumulate_rows(w.data(), n_rows, n_q, rows.data(), n_rows, acc.data());
        c.finish_accumulate(acc.data(), n_q);
        for (int i = 0; i < n_q; ++i) {
            for (int j = 0; j < d; ++j) {
                double ref = 0, mag = 0;
                for (size_t r = 0; r < n_rows; ++r) {
                    ref += double(w[i * n_rows + r]) * vd[r * d + j];
                    mag += std::fabs(double(w[i * n_rows + r]) * vd[r * d + j]);
                }
                CHECK(std::fabs(acc[i * d + j] - ref) <= 1e-5 * mag + 1e-6);
            }
        }
    }
}

TEST_CASE("strided rows give the same scores as packed rows") {
    const int d = 64;
    const Codec c = Codec::make("q4_0", d);
    const auto k = kvq::test::gaussian(5 * d, 1);
    const auto q = kvq::test::gaussian(d, 2);
    const size_t stride = c.row_bytes() + 13;
    std::vector<uint8_t> packed(5 * c.row_bytes()), strided(5 * stride, 0xAB), prep(c.query_bytes());
    c.quantize_rows(k.data(), 5, packed.data());
    c.quantize_rows(k.data(), 5, strided.data(), stride);
    c.prepare_queries(q.data(), 1, prep.data());
    std::vector<float> a(5), b(5);
    c.score_rows(prep.data(), 1, packed.data(), 5, a.data(), 5);
    c.score_rows(prep.data(), 1, strided.data(), 5, b.data(), 5, stride);
    CHECK(a == b);
}

TEST_CASE("bad specs and head sizes get clear errors") {
    CHECK_THROWS_WITH_AS(Codec::make("q3_0", 128), doctest::Contains("unknown codec 'q3_0'"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("q8_0", 48), doctest::Contains("multiple of 32"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("q4_0+rot", 100), doctest::Contains("multiple of 32"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("f16", 0), doctest::Contains("head_dim"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("q8_0:x=1", 64), doctest::Contains("takes no parameters"), std::invalid_argument);
    CHECK_NOTHROW(Codec::make("f16+rot", 96));  // block-diagonal rotation 64 + 32
    CHECK_THROWS_AS(kvq::codec_info("nope"), std::invalid_argument);
    CHECK(kvq::codec_info("q4_0").bytes_per_block == 18);
}

TEST_CASE("a ggml type is read by one codec, named as ggml names the type, and its writers share its bytes") {
    // The ggml backend checks the names and row sizes against ggml itself when it registers.
    for (const auto& name : kvq::codec_names()) {
        CAPTURE(name);
        const auto info = kvq::codec_info(name);
        if (info.ggml_type < 0) {
            CHECK(!info.ggml_layout);
            continue;
        }
        CHECK(!info.rotates);
        const std::string reader = kvq::codec_for_ggml_type(info.ggml_type);
        CHECK((reader == name) == info.ggml_layout);
        REQUIRE(!reader.empty());
        CHECK(Codec::make(reader, 256).row_bytes() == Codec::make(name, 256).row_bytes());
    }
    CHECK(kvq::codec_for_ggml_type(2) == "q4_0");  // GGML_TYPE_Q4_0
    CHECK(kvq::codec_for_ggml_type(4) == "");      // GGML_TYPE_Q4_2, removed from ggml
    CHECK(kvq::codec_for_ggml_type(-1) == "");
}

TEST_CASE("NaN and Inf are rejected and nothing is written") {
    for (const auto& spec : all_specs()) {
        CAPTURE(spec);
        const Codec c = Codec::make(spec, 32);
        for (float bad : {NAN, INFINITY, -INFINITY}) {
            auto x = kvq::test::gaussian(64, 4);
            x[40] = bad;
            std::vector<uint8_t> out(2 * c.row_bytes(), 0x5A);
            CHECK_THROWS_WITH_AS(c.quantize_rows(x.data(), 2, out.data()), doctest::Contains("row 1 is not finite"),
                                 std::invalid_argument);
            for (uint8_t b : out) REQUIRE(b == 0x5A);
        }
    }
}
