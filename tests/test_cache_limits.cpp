// The bounds of a cache configuration, the bookkeeping bytes_used() counts, and the pool limits a load
// takes from the caller (issue #15), with how the loaded cache attends.
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "cache_model.hpp"
#include "kvq/cache.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SequenceId;
namespace fs = std::filesystem;

TEST_CASE("config: dimensions beyond kMaxCacheDim are refused, bytes_used counts each sequence's bookkeeping") {
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

TEST_CASE("load: LoadOptions give the pool's limit and threads, the pool takes exactly the file's blocks") {
    const fs::path path = fs::temp_directory_path() / ("kvq_test_limits_" + std::to_string(::getpid()) + ".kvq");
    CacheConfig cfg;
    cfg.n_kv_heads = 2;
    cfg.head_dim = 64;
    cfg.block_tokens = 16;
    cfg.grow_blocks = 64;
    KVCache c(cfg);
    const SequenceId s = c.add_sequence();
    const auto k = kvq::test::gaussian(50 * 2 * 64, 2);
    c.append(0, s, k.data(), k.data(), 50);  // 3 sealed blocks
    c.save(path.string());

    const KVCache loaded = KVCache::load(path.string());
    CHECK(loaded.pool_stats().blocks_total == 3);  // not a chunk of grow_blocks = 64
    CHECK(loaded.pool_stats().max_blocks == 0);
    CHECK(loaded.config().threads == 1);

    kvq::LoadOptions limited;
    limited.max_blocks = 2;
    CHECK_THROWS_WITH_AS(KVCache::load(path.string(), limited), doctest::Contains("more than max_blocks = 2"),
                         kvq::PoolExhausted);
    // 4 blocks and the open block's float staging (counted against max_blocks in blocks' worth of bytes).
    const size_t staging = loaded.pool_stats().blocks_reserved;
    CHECK(staging > 0);
    limited.max_blocks = 4 + staging;
    limited.threads = 2;
    limited.grow_blocks = 1;
    KVCache capped = KVCache::load(path.string(), limited);
    CHECK(capped.pool_stats().max_blocks == 4 + staging);
    CHECK(capped.config().threads == 2);
    const auto q = kvq::test::gaussian(2 * 64, 3);
    std::vector<float> a(q.size()), b(q.size());
    c.attend(0, s, q.data(), a.data());
    capped.attend(0, 0, q.data(), b.data());
    CHECK(a == b);
    capped.append(0, 0, k.data(), k.data(), 14);  // fills the open block: the fourth block
    CHECK_THROWS_AS(capped.append(0, 0, k.data(), k.data(), 16), kvq::PoolExhausted);
    CHECK(capped.pool_stats().blocks_total == 4);

    kvq::LoadOptions bad;
    bad.threads = 0;
    CHECK_THROWS_WITH_AS(KVCache::load(path.string(), bad), doctest::Contains("threads in 1..256"), std::invalid_argument);
    fs::remove(path);
}

// Files store nothing of how attend runs: a cache saved with int8 value weights and loaded with them
// attends bit-identically, loaded without them as an exact cache does; the loaded cache runs its parts
// on the executor given.
TEST_CASE("load: LoadOptions give int8_value_weights and the executor") {
    const fs::path path = fs::temp_directory_path() / ("kvq_test_load_attend_" + std::to_string(::getpid()) + ".kvq");
    CacheConfig cfg;
    cfg.n_kv_heads = 2;
    cfg.n_heads = 8;
    cfg.head_dim = 64;
    std::vector<float> k, v;
    kvq::test::random_tokens(300, 2, 64, 5, k, v);
    const auto q = kvq::test::gaussian(8 * 64, 6, 2.0f);
    std::vector<float> out[2];  // [int8 weights]: the saving cache's, and the exact cache's
    for (int grid = 0; grid < 2; ++grid) {
        cfg.int8_value_weights = grid == 1;
        KVCache c(cfg);
        const SequenceId s = c.add_sequence();
        c.append(0, s, k.data(), v.data(), 300);
        out[grid].resize(q.size());
        c.attend(0, s, q.data(), out[grid].data());
        if (grid == 1) c.save(path.string());
    }
    REQUIRE(out[0] != out[1]);

    int parts = 0;
    kvq::LoadOptions options;
    options.threads = 2;
    options.int8_value_weights = true;
    options.executor = [&](int n, const std::function<void(int)>& task) {
        parts += n;
        for (int i = 0; i < n; ++i) task(i);
    };
    const KVCache grid = KVCache::load(path.string(), options);
    CHECK(grid.config().int8_value_weights);
    std::vector<float> got(q.size());
    grid.attend(0, 0, q.data(), got.data());
    CHECK(got == out[1]);
    CHECK(parts > 0);

    const KVCache exact = KVCache::load(path.string());
    CHECK_FALSE(exact.config().int8_value_weights);
    exact.attend(0, 0, q.data(), got.data());
    CHECK(got == out[0]);
    fs::remove(path);
}
