// The randomized Hadamard rotation is orthogonal, its inverse undoes it, q·k is kept, and it is a real
// Walsh–Hadamard transform (checked against the dense matrix).
#include <doctest/doctest.h>

#include <cmath>

#include "rotation/hadamard.hpp"
#include "test_util.hpp"

using kvq::detail::Rotation;

TEST_CASE("fwht matches the dense Sylvester Hadamard matrix") {
    const int n = 16;
    const auto x = kvq::test::gaussian(n, 1);
    auto y = x;
    kvq::detail::fwht(y.data(), n);
    for (int i = 0; i < n; ++i) {
        double ref = 0;
        for (int j = 0; j < n; ++j) ref += (__builtin_popcount(i & j) % 2 ? -1.0 : 1.0) * x[j];
        CHECK(y[i] == doctest::Approx(ref).epsilon(1e-5));
    }
}

TEST_CASE("rotation is orthogonal, invertible and keeps inner products") {
    for (int d : {32, 64, 96, 128, 160, 256}) {
        CAPTURE(d);
        const Rotation rot(d, 42);
        const auto q = kvq::test::gaussian(d, 2), k = kvq::test::gaussian(d, 3);
        std::vector<float> rq(d), rk(d), back(d);
        rot.apply(q.data(), rq.data());
        rot.apply(k.data(), rk.data());
        rot.apply_inverse(rq.data(), back.data());
        double dot = 0, rdot = 0, nq = 0, nrq = 0, err = 0;
        for (int j = 0; j < d; ++j) {
            dot += double(q[j]) * k[j];
            rdot += double(rq[j]) * rk[j];
            nq += double(q[j]) * q[j];
            nrq += double(rq[j]) * rq[j];
            err = std::max(err, double(std::fabs(back[j] - q[j])));
        }
        CHECK(rdot == doctest::Approx(dot).epsilon(1e-5));
        CHECK(nrq == doctest::Approx(nq).epsilon(1e-5));
        CHECK(err < 1e-5);
    }
}

TEST_CASE("the seed chooses the signs, the same seed gives the same rotation") {
    const auto x = kvq::test::gaussian(128, 9);
    std::vector<float> a(128), b(128), c(128);
    Rotation(128, 1).apply(x.data(), a.data());
    Rotation(128, 1).apply(x.data(), b.data());
    Rotation(128, 2).apply(x.data(), c.data());
    CHECK(a == b);
    CHECK(a != c);
}

TEST_CASE("an outlier channel is spread over all channels") {
    std::vector<float> x(128, 0.0f);
    x[77] = 100.0f;
    std::vector<float> y(128);
    Rotation(128, 5).apply(x.data(), y.data());
    for (float v : y) CHECK(std::fabs(v) == doctest::Approx(100.0 / std::sqrt(128.0)).epsilon(1e-5));
}

TEST_CASE("non-power-of-two head sizes use block-diagonal Hadamard blocks") {
    CHECK(Rotation(96, 1).blocks() == std::vector<int>{64, 32});
    CHECK(Rotation(80, 1).blocks() == std::vector<int>{64, 16});
    CHECK_THROWS_AS(Rotation(0, 1), std::invalid_argument);
}
