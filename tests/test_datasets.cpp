// The data sets: the llm generator's documented statistics hold for its default seed (docs/datasets.md),
// each knob moves the statistic it names, data are reproducible from the seed, and specs are checked.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>

#include "kvq/research/datasets.hpp"

TEST_CASE("llm data set: the documented statistics hold for seed 0") {
    const auto d = kvq::make_dataset("llm");
    CHECK(d.layers == 4);
    CHECK(d.kv_heads == 8);
    CHECK(d.q_heads == 32);
    CHECK(d.tokens == 2048);
    const auto s = kvq::data_stats(d);
    INFO("outlier ratio " << s.outlier_channel_ratio << ", sink " << s.sink_weight << ", entropy " << s.entropy_min << " / "
                          << s.entropy_median << " / " << s.entropy_max << ", sharp " << s.sharp_fraction << ", diffuse "
                          << s.diffuse_fraction << ", value outliers " << s.value_outlier_fraction);
    CHECK(s.outlier_channel_ratio > 7.0);   // documented: 8.2
    CHECK(s.outlier_channel_ratio < 10.0);
    CHECK(s.sink_weight > 0.15);            // documented: 0.21
    CHECK(s.sink_weight < 0.30);
    CHECK(s.entropy_min < 0.1);             // some heads attend to one token
    CHECK(s.entropy_max > 0.9 * s.entropy_log_context);  // some are nearly uniform over 2048 tokens
    CHECK(s.entropy_median > 1.5);          // documented: 2.3 nats
    CHECK(s.entropy_median < 3.5);
    CHECK(s.sharp_fraction > 0.15);         // documented: 0.20 below 1 nat
    CHECK(s.diffuse_fraction > 0.15);       // documented: 0.23 above half of log(context)
    CHECK(s.value_outlier_fraction > 0.005);  // documented: 1% of value rows
    CHECK(s.value_outlier_fraction < 0.02);
}

TEST_CASE("llm data set: each knob moves its statistic") {
    const auto base = kvq::data_stats(kvq::make_dataset("llm:layers=1,kv_heads=4,tokens=1024"));
    SUBCASE("outlier channels") {
        CHECK(kvq::data_stats(kvq::make_dataset("llm:layers=1,kv_heads=4,tokens=1024,outlier_channels=0")).outlier_channel_ratio < 3.0);
        CHECK(kvq::data_stats(kvq::make_dataset("llm:layers=1,kv_heads=4,tokens=1024,outlier_magnitude=24")).outlier_channel_ratio >
              1.7 * base.outlier_channel_ratio);
    }
    SUBCASE("sink") {
        CHECK(kvq::data_stats(kvq::make_dataset("llm:layers=1,kv_heads=4,tokens=1024,sink=0")).sink_weight < 0.01);
        CHECK(kvq::data_stats(kvq::make_dataset("llm:layers=1,kv_heads=4,tokens=1024,sink_logit=4")).sink_weight > base.sink_weight + 0.1);
    }
    SUBCASE("sharpness") {
        const auto flat = kvq::data_stats(kvq::make_dataset("llm:layers=1,kv_heads=4,tokens=1024,sharpness_max=0,sink=0"));
        CHECK(flat.sharp_fraction == 0.0);
        CHECK(flat.entropy_min > 0.8 * flat.entropy_log_context);
    }
    SUBCASE("key bias without RoPE stays a per-channel mean") {
        CHECK(kvq::data_stats(kvq::make_dataset("llm:layers=1,kv_heads=4,tokens=1024,rope=0,key_bias=3,outlier_channels=0")).key_bias_ratio > 2.0);
    }
    SUBCASE("value outliers") {
        CHECK(kvq::data_stats(kvq::make_dataset("llm:layers=1,kv_heads=4,tokens=1024,value_outlier_fraction=0")).value_outlier_fraction == 0.0);
    }
}

TEST_CASE("data sets are reproducible from their seed, and each layer from its own") {
    const auto a = kvq::make_dataset("llm:layers=2,kv_heads=2,tokens=256", 7);
    const auto b = kvq::make_dataset("llm:layers=2,kv_heads=2,tokens=256,seed=7");
    CHECK(a.k == b.k);
    CHECK(a.v == b.v);
    CHECK(a.q == b.q);
    CHECK(kvq::make_dataset("llm:layers=2,kv_heads=2,tokens=256", 8).k != a.k);
    // Layer 0 does not depend on how many layers are generated.
    const auto one = kvq::make_dataset("llm:layers=1,kv_heads=2,tokens=256", 7);
    CHECK(std::equal(one.k.begin(), one.k.end(), a.k.begin()));
    const auto g = kvq::make_dataset("gaussian:tokens=64,head_dim=32", 3);
    CHECK(g.k == kvq::make_dataset("gaussian:tokens=64,head_dim=32,seed=3").k);
}

TEST_CASE("gaussian data set: isotropic keys and nearly uniform attention") {
    const auto s = kvq::data_stats(kvq::make_dataset("gaussian"));
    CHECK(s.outlier_channel_ratio < 1.2);
    CHECK(s.key_bias_ratio < 0.1);
    CHECK(s.sharp_fraction == 0.0);
    CHECK(s.entropy_min > 0.8 * s.entropy_log_context);
}

TEST_CASE("data set specs: unknown names, knobs and values are errors") {
    CHECK_THROWS_WITH_AS(kvq::make_dataset("wikitext"), doctest::Contains("known: gaussian, llm, mla, npy:DIR"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::make_dataset("llm:bogus=1"), doctest::Contains("key one of layers"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::make_dataset("llm:tokens=many"), doctest::Contains("non-negative integer"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::make_dataset("llm:rope=maybe"), doctest::Contains("true/false"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::make_dataset("llm:outlier_channels=64"), doctest::Contains("a quarter of head_dim"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::make_dataset("llm:head_dim=7"), doctest::Contains("even"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::make_dataset("gaussian:query_positions=0"), doctest::Contains("query_positions"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::make_dataset("npy:"), doctest::Contains("give a directory"), std::invalid_argument);
}
