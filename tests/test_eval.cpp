// The FP32 reference agrees with a naive softmax attention, and the metrics behave: zero error for f32
// rows, growing error for fewer bits.
#include <doctest/doctest.h>

#include <cmath>

#include "kvq/research/eval.hpp"
#include "test_util.hpp"

TEST_CASE("reference_attention equals a naive double-precision softmax attention") {
    const int d = 64, n_q = 3;
    const size_t n = 50;
    const auto q = kvq::test::gaussian(n_q * d, 1), k = kvq::test::gaussian(n * d, 2), v = kvq::test::gaussian(n * d, 3);
    std::vector<float> out(n_q * d), w(n_q * n);
    kvq::reference_attention(q.data(), n_q, k.data(), v.data(), n, d, 0, out.data(), w.data());
    for (int i = 0; i < n_q; ++i) {
        std::vector<double> s(n);
        double m = -1e300, sum = 0;
        for (size_t r = 0; r < n; ++r) {
            for (int j = 0; j < d; ++j) s[r] += double(q[i * d + j]) * k[r * d + j] / std::sqrt(double(d));
            m = std::max(m, s[r]);
        }
        for (auto& x : s) sum += (x = std::exp(x - m));
        for (int j = 0; j < d; ++j) {
            double o = 0;
            for (size_t r = 0; r < n; ++r) o += s[r] / sum * v[r * d + j];
            CHECK(out[i * d + j] == doctest::Approx(o).epsilon(1e-4));
        }
        for (size_t r = 0; r < n; ++r) CHECK(w[i * n + r] == doctest::Approx(s[r] / sum).epsilon(1e-4));
    }
}

TEST_CASE("attention_error: f32 is exact, and error grows as bits shrink") {
    const int d = 128, n_q = 8;
    const size_t n = 256;
    const auto q = kvq::test::gaussian(n_q * d, 4), k = kvq::test::gaussian(n * d, 5), v = kvq::test::gaussian(n * d, 6);
    auto err = [&](const char* kc, const char* vc) {
        return kvq::attention_error(q.data(), n_q, k.data(), v.data(), n, kvq::Codec::make(kc, d), kvq::Codec::make(vc, d));
    };
    const auto f32 = err("f32", "f32");
    CHECK(f32.kl.worst < 1e-6);
    CHECK(f32.output_l2.worst < 1e-5);
    CHECK(f32.topk.worst == 1.0);
    CHECK(f32.cosine.worst == doctest::Approx(1.0));
    const auto q8 = err("q8_0", "q8_0"), q4 = err("q4_0", "q4_0");
    CHECK(q8.kl.mean > 0);
    CHECK(q8.kl.mean < q4.kl.mean);
    CHECK(q8.output_l2.mean < q4.output_l2.mean);
    CHECK(q4.output_l2.mean < 0.2);
    CHECK(q4.score_rmse.mean > q8.score_rmse.mean);
}
