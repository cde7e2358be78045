// TurboQuant against its theory (arXiv 2504.19874): mean squared error of unit vectors at d = 128 for
// b = 1..4 bits, the unbiased inner products of the QJL (prod) variant, exact bit counts, and errors.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "ref/lloyd_max.hpp"
#include "codec/turbo.hpp"
#include "kvq/codec.hpp"
#include "test_util.hpp"

using kvq::Codec;

namespace {

std::vector<float> unit_rows(size_t n, int d, uint64_t seed) {
    auto x = kvq::test::gaussian(n * d, seed);
    for (size_t r = 0; r < n; ++r) {
        double s = 0;
        for (int j = 0; j < d; ++j) s += double(x[r * d + j]) * x[r * d + j];
        for (int j = 0; j < d; ++j) x[r * d + j] = static_cast<float>(x[r * d + j] / std::sqrt(s));
    }
    return x;
}

// Mean over rows of ‖x − x̃‖² (the rows are unit vectors).
double mean_squared_error(const kvq::detail::CodecImpl& c, const std::vector<float>& x, size_t n) {
    const int d = c.head_dim();
    std::vector<uint8_t> bytes(n * c.row_bytes());
    std::vector<float> y(n * d);
    c.quantize_rows(x.data(), n, bytes.data(), c.row_bytes());
    c.dequantize_rows(bytes.data(), c.row_bytes(), n, y.data());
    double se = 0;
    for (size_t i = 0; i < n * d; ++i) se += double(y[i] - x[i]) * (y[i] - x[i]);
    return se / n;
}

struct Bias {
    double mean = 0, standard_error = 0;
};

// Mean error of the score q·k̃ against q·k, with q correlated to k so that a shrinking (biased) estimate
// shows. Unbiasedness is over the codec's randomness, so every seed (a fresh rotation and QJL matrix) is
// one independent sample: the mean error of its `per_seed` pairs.
Bias inner_product_bias(const char* spec, int seeds, int per_seed) {
    const int d = 128;
    double sum = 0, sum2 = 0;
    for (int s = 0; s < seeds; ++s) {
        const Codec c = Codec::make(spec, d, 1000 + s);
        const auto k = unit_rows(per_seed, d, 2 * s + 1), z = unit_rows(per_seed, d, 2 * s + 2);
        std::vector<float> q(per_seed * d);
        std::vector<double> exact(per_seed, 0.0);
        for (int p = 0; p < per_seed; ++p) {
            for (int j = 0; j < d; ++j) {
                q[p * d + j] = 0.8f * k[p * d + j] + 0.6f * z[p * d + j];
                exact[p] += double(q[p * d + j]) * k[p * d + j];
            }
        }
        std::vector<uint8_t> rows(per_seed * c.row_bytes()), prep(per_seed * c.query_bytes());
        std::vector<float> scores(per_seed * per_seed);
        c.quantize_rows(k.data(), per_seed, rows.data());
        c.prepare_queries(q.data(), per_seed, prep.data());
        c.score_rows(prep.data(), per_seed, rows.data(), per_seed, scores.data(), per_seed);
        double err = 0;
        for (int p = 0; p < per_seed; ++p) err += scores[p * per_seed + p] - exact[p];
        err /= per_seed;
        sum += err;
        sum2 += err * err;
    }
    const double mean = sum / seeds;
    return {mean, std::sqrt((sum2 / seeds - mean * mean) / (seeds - 1))};
}

}  // namespace

TEST_CASE("TurboQuant-MSE on unit vectors at d=128 has the Lloyd-Max error 0.3634, 0.1175, 0.0345, 0.0095") {
    const int d = 128;
    const size_t n = 4000;
    const auto x = unit_rows(n, d, 42);
    const double expected[] = {0.3634, 0.1175, 0.0345, 0.0095};
    for (int b = 1; b <= 4; ++b) {
        CAPTURE(b);
        // The theory is of TurboQuant as published: the norm as the row's scale.
        const auto c = kvq::detail::make_turbo({b, b, false, false, kvq::detail::TurboScale::norm}, "turbo", "", d, kvq::kDefaultSeed);
        const double mse = mean_squared_error(*c, x, n);
        const double model = d * kvq::detail::sphere_coordinate_codebook(b, d).mse;
        MESSAGE("b=" << b << ": measured " << mse << ", codebook " << model << ", paper " << expected[b - 1]);
        CHECK(mse == doctest::Approx(expected[b - 1]).epsilon(0.03));
    }
}

TEST_CASE("the coordinate codebooks are symmetric Lloyd-Max quantizers") {
    for (int b = 1; b <= 4; ++b) {
        const auto& cb = kvq::detail::sphere_coordinate_codebook(b, 128);
        REQUIRE(cb.centroids.size() == size_t(1) << b);
        for (size_t i = 0; i < cb.centroids.size(); ++i) {
            CHECK(cb.centroids[i] == doctest::Approx(-cb.centroids[cb.centroids.size() - 1 - i]).epsilon(1e-5));
        }
        for (size_t i = 0; i + 1 < cb.centroids.size(); ++i) {
            CHECK(cb.boundaries[i] == doctest::Approx(0.5f * (cb.centroids[i] + cb.centroids[i + 1])).epsilon(1e-6));
        }
    }
    // One bit: the centroid is E|x|, ≈ √(2/(π d)).
    CHECK(kvq::detail::sphere_coordinate_codebook(1, 128).centroids[1] ==
          doctest::Approx(std::sqrt(2.0 / (std::numbers::pi * 128))).epsilon(0.005));
}

TEST_CASE("the split codecs sit between their two widths") {
    const int d = 128;
    const size_t n = 2000;
    const auto x = unit_rows(n, d, 43);
    auto mse = [&](const char* spec) {
        const Codec c = Codec::make(spec, d);
        return mean_squared_error(kvq::detail::impl_of(c), x, n);
    };
    const double t2 = mse("turbo2"), t25 = mse("turbo2.5"), t3 = mse("turbo3"), t35 = mse("turbo3.5"), t4 = mse("turbo4");
    MESSAGE("turbo2 " << t2 << ", turbo2.5 " << t25 << ", turbo3 " << t3 << ", turbo3.5 " << t35 << ", turbo4 " << t4);
    CHECK(t25 == doctest::Approx(0.5 * (t2 + t3)).epsilon(0.05));
    CHECK(t35 == doctest::Approx(0.5 * (t3 + t4)).epsilon(0.05));
}

TEST_CASE("TurboQuant-prod (QJL) inner products are unbiased where the MSE stage alone is not") {
    for (const char* spec : {"turbo2_qjl", "turbo3_qjl", "turbo4_qjl"}) {
        const Bias b = inner_product_bias(spec, 300, 8);
        MESSAGE(std::string(spec) << ": mean error " << b.mean << " ± " << b.standard_error);
        CHECK(std::fabs(b.mean) < 3 * b.standard_error);
    }
    // The same test detects the shrinkage of the MSE quantizer: E[q·k̃] ≈ (1 − D)·q·k.
    const Bias mse = inner_product_bias("turbo2:scale=norm", 100, 8);
    MESSAGE("turbo2 (no QJL): mean error " << mse.mean << " ± " << mse.standard_error);
    CHECK(std::fabs(mse.mean) > 3 * mse.standard_error);
}

TEST_CASE("turbo rows count every stored bit") {
    struct Case {
        const char* spec;
        int d;
        size_t bytes;
    };
    for (const Case& c : {Case{"turbo2", 128, 34}, Case{"turbo3", 128, 50}, Case{"turbo4", 128, 66},
                          Case{"turbo2.5", 128, 42}, Case{"turbo3.5", 128, 58}, Case{"turbo2_qjl", 128, 36},
                          Case{"turbo3_qjl", 128, 52}, Case{"turbo4_qjl", 128, 68}, Case{"turbo3", 96, 38}}) {
        CAPTURE(c.spec);
        const Codec codec = Codec::make(c.spec, c.d);
        CHECK(codec.row_bytes() == c.bytes);
        CHECK(codec.rotated());
    }
    CHECK(Codec::make("turbo2.5", 128).bits_per_value() == doctest::Approx(2.5 + 16.0 / 128));
    CHECK(Codec::make("turbo3_qjl", 128).bits_per_value() == doctest::Approx(3 + 32.0 / 128));
    CHECK(kvq::codec_info("turbo4").rotates);
    CHECK_FALSE(kvq::codec_info("q4_0").rotates);
}

TEST_CASE("+rot on an always-rotated codec builds the same codec") {
    const int d = 64;
    const auto x = kvq::test::gaussian(3 * d, 5);
    for (const char* name : {"turbo3", "turbo3_qjl", "polar"}) {
        CAPTURE(name);
        const Codec plain = Codec::make(name, d), rot = Codec::make(std::string(name) + "+rot", d);
        std::vector<uint8_t> a(3 * plain.row_bytes()), b(3 * rot.row_bytes());
        plain.quantize_rows(x.data(), 3, a.data());
        rot.quantize_rows(x.data(), 3, b.data());
        CHECK(a == b);
        CHECK(rot.rotated());
    }
}

TEST_CASE("turbo codecs reject bad head sizes, parameters and norms beyond fp16") {
    CHECK_THROWS_WITH_AS(Codec::make("turbo4:b=3", 128), doctest::Contains("scale=norm|ls|unbiased, got 'b=3'"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("turbo4:scale=max", 128), doctest::Contains("scale=norm|ls|unbiased"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("turbo4_qjl:scale=ls", 128), doctest::Contains("takes no parameters"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("turbo4", 100), doctest::Contains("multiple of 8"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("turbo2.5", 72), doctest::Contains("multiple of 16"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("turbo3_qjl", 8192), doctest::Contains("at most 4096"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(Codec::make("turbo5", 128), doctest::Contains("unknown codec"), std::invalid_argument);

    const Codec c = Codec::make("turbo3", 32);
    std::vector<float> x(2 * 32, 1.0f);
    x[40] = 70000.0f;
    std::vector<uint8_t> out(2 * c.row_bytes(), 0x5A);
    CHECK_THROWS_WITH_AS(c.quantize_rows(x.data(), 2, out.data()), doctest::Contains("row 1 has norm"), std::invalid_argument);
    for (uint8_t b : out) REQUIRE(b == 0x5A);
}

TEST_CASE("a zero row stays zero") {
    for (const char* spec : {"turbo3", "turbo3_qjl", "polar"}) {
        CAPTURE(spec);
        const Codec c = Codec::make(spec, 64);
        std::vector<float> x(64, 0.0f), y(64, 1.0f);
        std::vector<uint8_t> row(c.row_bytes());
        c.quantize_rows(x.data(), 1, row.data());
        c.dequantize_rows(row.data(), 1, y.data());
        for (float v : y) CHECK(v == 0.0f);
    }
}

TEST_CASE("turbo scale=ls: the least-squares scale never has more error than the norm, on any row") {
    const int d = 128;
    const size_t n = 2000;
    const auto x = unit_rows(n, d, 44);
    for (const char* base : {"turbo2", "turbo3", "turbo3.5", "turbo4"}) {
        CAPTURE(base);
        const Codec norm = Codec::make(std::string(base) + ":scale=norm", d), ls = Codec::make(base, d),  // ls: the default
                    unb = Codec::make(std::string(base) + ":scale=unbiased", d);
        CHECK(ls.row_bytes() == norm.row_bytes());
        CHECK(unb.bits_per_value() == norm.bits_per_value());
        std::vector<uint8_t> a(n * norm.row_bytes()), b(a.size()), c(a.size());
        std::vector<float> ya(n * d), yb(n * d), yc(n * d);
        norm.quantize_rows(x.data(), n, a.data());
        ls.quantize_rows(x.data(), n, b.data());
        unb.quantize_rows(x.data(), n, c.data());
        norm.dequantize_rows(a.data(), n, ya.data());
        ls.dequantize_rows(b.data(), n, yb.data());
        unb.dequantize_rows(c.data(), n, yc.data());
        double se_norm = 0, se_ls = 0, se_unb = 0;
        int worse = 0;
        for (size_t r = 0; r < n; ++r) {
            double ea = 0, eb = 0, ec = 0;
            for (int j = 0; j < d; ++j) {
                const size_t i = r * d + j;
                ea += double(ya[i] - x[i]) * (ya[i] - x[i]);
                eb += double(yb[i] - x[i]) * (yb[i] - x[i]);
                ec += double(yc[i] - x[i]) * (yc[i] - x[i]);
            }
            worse += eb > ea * (1 + 2e-3) + 1e-7;  // beyond the fp16 rounding of the stored scale
            se_norm += ea, se_ls += eb, se_unb += ec;
        }
        MESSAGE(std::string(base) << ": MSE norm " << se_norm / n << ", ls " << se_ls / n << ", unbiased " << se_unb / n);
        CHECK(worse == 0);
        CHECK(se_ls < se_norm);
        // On unit Gaussian rows ⟨c, u⟩ ≈ ‖c‖² ≈ 1 − D, so the three scales differ little: the theory check
        // (the Lloyd-Max error) holds for ls within a few percent, and unbiased costs at most ~D more.
        CHECK(se_ls / n > 0.9 * se_norm / n);
        CHECK(se_unb > se_ls);
    }
}

TEST_CASE("turbo scale=unbiased: inner products are unbiased over the rotation, norm and ls shrink them") {
    for (const char* spec : {"turbo2:scale=unbiased", "turbo3:scale=unbiased"}) {
        const Bias b = inner_product_bias(spec, 300, 8);
        MESSAGE(std::string(spec) << ": mean error " << b.mean << " ± " << b.standard_error);
        CHECK(std::fabs(b.mean) < 3 * b.standard_error);
    }
    for (const char* spec : {"turbo2:scale=norm", "turbo2"}) {
        const Bias b = inner_product_bias(spec, 100, 8);
        MESSAGE(std::string(spec) << ": mean error " << b.mean << " ± " << b.standard_error);
        CHECK(b.mean < -3 * b.standard_error);
    }
}

TEST_CASE("turbo scale=ls/unbiased: the input limit keeps the stored scale within fp16 on the worst row") {
    const int d = 64;
    for (const char* spec : {"turbo2:scale=ls", "turbo4:scale=ls", "turbo3.5:scale=unbiased", "turbo2:scale=unbiased"}) {
        CAPTURE(spec);
        const Codec c = Codec::make(spec, d);
        const float limit = c.input_limit().max_abs;
        CHECK(limit < 65504.0f);
        CHECK(c.input_limit().on_norm);
        // All of a row's energy in one channel (and, after the rotation, spread evenly): the rows whose
        // codes fit them worst.
        std::vector<float> x(2 * d, 0.0f), y(2 * d);
        x[3] = 0.999f * limit;
        for (int j = 0; j < d; ++j) x[d + j] = (j % 3 ? 0.999f : -0.999f) * limit / std::sqrt(float(d));
        std::vector<uint8_t> row(2 * c.row_bytes());
        c.quantize_rows(x.data(), 2, row.data());
        c.dequantize_rows(row.data(), 2, y.data());
        for (float v : y) REQUIRE(std::isfinite(v));
        x[3] = 1.01f * limit;
        CHECK_THROWS_WITH_AS(c.quantize_rows(x.data(), 1, row.data()), doctest::Contains("row 0 has norm"), std::invalid_argument);
    }
}
