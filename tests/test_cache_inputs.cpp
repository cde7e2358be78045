// Hostile input to the cache (issue #15): sizes that overflow, finite queries whose float scores
// overflow.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kvq/cache.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::NanPolicy;
using kvq::SequenceId;

namespace {

constexpr int kD = 64, kKv = 2, kHeads = 4, kBt = 8;

CacheConfig config(NanPolicy nan, const std::string& kc = "q8_0", const std::string& vc = "q4_0") {
    CacheConfig c;
    c.n_layers = 1;
    c.n_kv_heads = kKv;
    c.n_heads = kHeads;
    c.head_dim = kD;
    c.block_tokens = kBt;
    c.key_codec = kc;
    c.value_codec = vc;
    c.nan_policy = nan;
    return c;
}

bool all_finite(const std::vector<float>& x, size_t from, size_t n) {
    for (size_t i = from; i < from + n; ++i) {
        if (!std::isfinite(x[i])) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("append: n_tokens whose k and v sizes overflow are refused before anything is read") {
    KVCache c(config(NanPolicy::reject));
    const SequenceId s = c.add_sequence();
    const auto k = kvq::test::gaussian(kKv * kD, 1);  // one token's worth
    for (size_t n : {std::numeric_limits<size_t>::max(), std::numeric_limits<size_t>::max() / (kKv * kD) + 1,
                     size_t(1) << 62, size_t(PTRDIFF_MAX) / (4 * kKv * kD) + 1}) {
        CAPTURE(n);
        CHECK_THROWS_WITH_AS(c.append(0, s, k.data(), k.data(), n), doctest::Contains("overflows"), std::invalid_argument);
    }
    CHECK(c.n_tokens(s) == 0);
    c.append(0, s, k.data(), k.data(), 1);
    CHECK(c.n_tokens(s) == 1);
}

TEST_CASE("attend: a finite query of 3e38 gives a finite output, the double-precision attention") {
    for (const char* kc : {"f32", "q8_0", "f16"}) {
        for (bool staged : {false, true}) {
            CAPTURE(kc);
            CAPTURE(staged);
            CacheConfig cfg = config(NanPolicy::reject, kc, "f32");
            cfg.seal = staged ? kvq::SealPolicy::on_block_full : kvq::SealPolicy::on_append;
            KVCache c(cfg);
            const SequenceId s = c.add_sequence();
            const size_t n = 20;
            const auto k = kvq::test::gaussian(n * kKv * kD, 11), v = kvq::test::gaussian(n * kKv * kD, 12);
            c.append(0, s, k.data(), v.data(), n);
            auto q = kvq::test::gaussian(kHeads * kD, 13);
            for (float& x : q) x = x > 0 ? 3e38f : -3e38f;
            std::vector<float> out(q.size());
            c.attend(0, s, q.data(), out.data());
            REQUIRE(all_finite(out, 0, out.size()));
            if (std::string(kc) != "f32") continue;
            // f32 keys and values: the reference in double over the exact rows.
            for (int h = 0; h < kHeads; ++h) {
                const int kv = h / (kHeads / kKv);
                std::vector<double> sc(n);
                double top = -INFINITY;
                for (size_t t = 0; t < n; ++t) {
                    double dot = 0;
                    for (int j = 0; j < kD; ++j) dot += double(q[h * kD + j]) * k[(t * kKv + kv) * kD + j];
                    sc[t] = dot / std::sqrt(double(kD));
                    top = std::max(top, sc[t]);
                }
                double sum = 0;
                for (double& x : sc) sum += (x = std::exp(x - top));
                for (int j = 0; j < kD; ++j) {
                    double ref = 0;
                    for (size_t t = 0; t < n; ++t) ref += sc[t] / sum * v[(t * kKv + kv) * kD + j];
                    CHECK(out[h * kD + j] == doctest::Approx(ref).epsilon(1e-6));
                }
            }
        }
    }
}

