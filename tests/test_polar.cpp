// The polar codec (PolarQuant, arXiv 2502.02617): its error per configuration against the error model,
// the budget allocation against hand-made ones, the angle codebooks, bit counts and parameter errors.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "ref/lloyd_max.hpp"
#include "ref/polar_params.hpp"
#include "kvq/codec.hpp"
#include "kvq/research/eval.hpp"
#include "test_util.hpp"

using kvq::Codec;
using kvq::detail::PolarConfig;

namespace {

double relative_mse(const std::string& spec, const std::vector<float>& x, size_t n, int d) {
    const double rmse = kvq::roundtrip_relative_rmse(Codec::make(spec, d), x.data(), n);
    return rmse * rmse;
}

// Every allocation of L levels (level 1 at least one bit) whose rows fit budget·d bits.
void for_each_allocation(int levels, int d, double budget, const std::function<void(const PolarConfig&)>& f) {
    PolarConfig c{levels, std::vector<int>(levels, 0)};
    std::function<void(int)> rec = [&](int l) {
        if (l == levels) {
            if (8.0 * kvq::detail::polar_row_bytes(c, d) <= budget * d + 1e-9) f(c);
            return;
        }
        for (int b = l == 0 ? 1 : 0; b <= 8; ++b) {
            c.bits[l] = b;
            rec(l + 1);
        }
    };
    rec(0);
}

}  // namespace

TEST_CASE("polar's default is PolarQuant's 4.2.2.2 at 3.875 bits per value") {
    const Codec c = Codec::make("polar", 128);
    CHECK(c.row_bytes() == 62);
    CHECK(c.bits_per_value() == doctest::Approx(3.875));
    CHECK(c.rotated());
    CHECK(Codec::make("polar:L=4,bits=4.2.2.2", 128).row_bytes() == 62);
    CHECK(Codec::make("polar:bits=4.3", 64).row_bytes() == 64 / 2 * 4 / 8 + 64 / 4 * 3 / 8 + 2 * 16);
    CHECK(kvq::detail::to_string(kvq::detail::parse_polar_params("", 128)) == "L=4,bits=4.2.2.2");
}

TEST_CASE("polar angle codebooks follow the level densities") {
    using kvq::detail::polar_angle_codebook;
    // Level 1: the uniform grid on [0, 2π).
    const auto& l1 = polar_angle_codebook(1, 3);
    for (int c = 0; c < 8; ++c) CHECK(l1.centroids[c] == doctest::Approx((c + 0.5) * std::numbers::pi / 4));
    // Higher levels: symmetric about π/4, tighter as the level rises (∝ sin^(2^(ℓ−1)−1)(2ψ)).
    double previous = 1e9;
    for (int level = 2; level <= 6; ++level) {
        const auto& cb = polar_angle_codebook(level, 2);
        for (int c = 0; c < 4; ++c) CHECK(cb.centroids[c] + cb.centroids[3 - c] == doctest::Approx(std::numbers::pi / 2));
        CHECK(cb.mse < previous);
        previous = cb.mse;
    }
    // Level 2 has density 2·sin(2ψ); with 0 bits the centroid is its mean π/4 and the error its variance
    // π²/16 − 1/2.
    CHECK(polar_angle_codebook(2, 0).mse == doctest::Approx(std::numbers::pi * std::numbers::pi / 16 - 0.5).epsilon(1e-4));
}

TEST_CASE("polar error per configuration matches the level-sum model") {
    const int d = 128;
    const size_t n = 2000;
    const auto x = kvq::test::gaussian(n * d, 77);
    for (const char* params : {"", "bits=4.3.3.3", "bits=3.2.2.2", "bits=5.3.3.2", "bits=4.2", "bits=4.3.2.2.2",
                               "budget=2.5", "budget=3", "budget=3.5", "budget=3.875", "budget=4.125", "budget=5"}) {
        const std::string spec = std::string("polar") + (*params ? ":" : "") + params;
        CAPTURE(spec);
        const auto config = kvq::detail::parse_polar_params(params, d);
        const double measured = relative_mse(spec, x, n, d);
        const double model = kvq::detail::polar_model_error(config);
        MESSAGE(spec << " -> " << kvq::detail::to_string(config) << ": " << Codec::make(spec, d).bits_per_value()
                     << " bits/value, relative MSE " << measured << " (model " << model << ")");
        CHECK(measured == doctest::Approx(model).epsilon(0.05));
    }
}

TEST_CASE("the minimum-error allocation is never worse than another allocation of the same budget") {
    const int d = 128;
    const size_t n = 2000;
    const auto x = kvq::test::gaussian(n * d, 78);
    // Hand-made allocations against the budget form at their own bits per value.
    for (const char* bits : {"4.2.2.2", "3.3.2.2", "3.2.2.2", "4.3.3.3", "5.2.2.1", "2.2.2.2", "4.3", "6.4.3.3.2"}) {
        const std::string hand = std::string("polar:bits=") + bits;
        const double budget = Codec::make(hand, d).bits_per_value();
        const std::string best = "polar:budget=" + std::to_string(budget);
        CAPTURE(hand);
        CHECK(Codec::make(best, d).bits_per_value() <= budget + 1e-9);
        const double e_hand = relative_mse(hand, x, n, d), e_best = relative_mse(best, x, n, d);
        MESSAGE(hand << ": " << e_hand << " vs " << kvq::detail::to_string(kvq::detail::parse_polar_params(
                                                         best.substr(6), d))
                     << ": " << e_best << " at " << budget << " bits/value");
        CHECK(e_best <= e_hand * 1.01);
    }
    // The dynamic program against exhaustive search of the model at L = 4.
    for (double budget : {2.0, 2.75, 3.0, 3.875, 4.5}) {
        CAPTURE(budget);
        const double dp = kvq::detail::polar_model_error(kvq::detail::min_error_allocation(budget, d, 4));
        double brute = 1e9;
        for_each_allocation(4, d, budget, [&](const PolarConfig& c) { brute = std::min(brute, kvq::detail::polar_model_error(c)); });
        CHECK(dp == doctest::Approx(brute).epsilon(1e-12));
    }
}

TEST_CASE("polar parameters and head sizes get clear errors") {
    auto throws = [](const char* spec, int d, const char* what) {
        CAPTURE(spec);
        CHECK_THROWS_WITH_AS(Codec::make(spec, d), doctest::Contains(what), std::invalid_argument);
    };
    throws("polar", 40, "multiple of 2^L = 16");
    throws("polar:L=5,bits=4.2.2.2.2", 48, "multiple of 2^L = 32");
    throws("polar:L=9,budget=3", 512, "L must be in 1..8");
    throws("polar:bits=0.2", 64, "bits of level 1 must be in 1..8");
    throws("polar:bits=4.9", 64, "bits of level 2 must be in 0..8");
    throws("polar:bits=4.x", 64, "must be an integer");
    throws("polar:L=3,bits=4.2", 64, "L=3 but bits lists 2 levels");
    throws("polar:L=3", 64, "needs bits=");
    throws("polar:bits=4.2,budget=3", 64, "not both");
    throws("polar:budget=0.5", 64, "no allocation fits");
    // A budget beyond what the largest allocation uses (every level at 8 bits) bought nothing more: it
    // was taken silently (polar:budget=99 gave 12 bits/value). The range's end is accepted.
    throws("polar:budget=99", 128, "budget must be at most 12 bits/value (L=1, 8 bits at every level)");
    throws("polar:budget=12.01", 128, "at most 12 bits/value");
    throws("polar:L=3,budget=9.5", 128, "at head_dim 128 and L=3: budget must be at most 9 bits/value");
    CHECK(Codec::make("polar:budget=12", 128).bits_per_value() == 12.0);
    CHECK(Codec::make("polar:L=3,budget=9", 128).bits_per_value() == 9.0);
    throws("polar:", 64, "nothing after ':'");
    throws("q8_0:", 64, "nothing after ':'");
    throws("turbo3:+rot", 64, "nothing after ':'");
    throws("polar:budget=three", 64, "must be a number");
    throws("polar:levels=4", 64, "unknown parameter 'levels'");
    throws("polar:L=4,L=4,bits=4.2.2.2", 64, "L given twice");
    throws("polar:4.2.2.2", 64, "not key=value");
    throws("polar:bits=4.2.2.2.2.2", 96, "multiple of 2^L = 64");
    CHECK_NOTHROW(Codec::make("polar", 96));
}
