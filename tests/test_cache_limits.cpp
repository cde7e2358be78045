// The bounds of a cache configuration and the bookkeeping bytes_used() counts (issue #15).
#include <doctest/doctest.h>

#include <string>

#include "kvq/cache.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SequenceId;

TEST_CASE("config: dimensions beyond kMaxCacheDim are refused; bytes_used counts each sequence's bookkeeping") {
    CacheConfig cfg;
    cfg.head_dim = 64;
    for (int CacheConfig::*field : {&CacheConfig::n_layers, &CacheConfig::n_kv_heads, &CacheConfig::head_dim}) {
        CacheConfig c = cfg;
        c.*field = 100000000;
        CHECK_THROWS_WITH_AS(KVCache{c}, doctest::Contains("must be in 1..65536"), std::invalid_argument);
    }
    CacheConfig heads = cfg;
    heads.n_kv_heads = 2;
    heads.n_heads = 2 * kvq::kMaxCacheDim;
    CHECK_THROWS_WITH_AS(KVCache{heads}, doctest::Contains("n_heads must be in 1..65536"), std::invalid_argument);

    cfg.n_layers = kvq::kMaxCacheDim;
    KVCache c(cfg);
    CHECK(c.bytes_used() == 0);
    const SequenceId a = c.add_sequence();
    const size_t one = c.metadata_bytes();
    CHECK(one >= size_t(kvq::kMaxCacheDim) * 64);  // per-layer state, not nothing
    CHECK(c.bytes_used() == one);
    const SequenceId b = c.fork(a);
    CHECK(c.bytes_used() == 2 * one);
    const auto k = kvq::test::gaussian(64, 1);
    c.append(7, b, k.data(), k.data(), 1);
    CHECK(c.bytes_used() > 2 * one);  // and the float staging of the open block
    c.remove(b);
    CHECK(c.bytes_used() == one);
    c.remove(a);
    CHECK(c.bytes_used() == 0);
}
