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

namespace {

// What an observer sees of a cache: its ids, bytes and pool (a refused call must change none of it).
struct Seen {
    std::vector<SequenceId> ids;
    size_t bytes, metadata, blocks_used;
    explicit Seen(const KVCache& c)
        : ids(c.sequences()), bytes(c.bytes_used()), metadata(c.metadata_bytes()), blocks_used(c.pool_stats().blocks_used) {}
    bool operator==(const Seen&) const = default;
};

}  // namespace

namespace {

void test_forks(KVCache& c) {
    const CacheConfig& cfg = c.config();
    const SequenceId a = c.add_sequence();
    const auto k = kvq::test::gaussian(160 * 2 * 64, 1);
    for (int l = 0; l < cfg.n_layers; ++l) c.append(l, a, k.data(), k.data(), 160);  // 10 blocks a layer
    const size_t tables = 32 * 10 * 24;
    CHECK(c.metadata_bytes() == KVCache::sequence_bookkeeping_bytes(cfg.n_layers) + tables);
    size_t forks = 0;
    try {
        for (; forks < 100000; ++forks) c.fork(a);
    } catch (const kvq::PoolExhausted&) {
    }
    CHECK(forks > 0);
    CHECK(c.metadata_bytes() == (forks + 1) * (KVCache::sequence_bookkeeping_bytes(cfg.n_layers) + tables));
    CHECK(c.bytes_used() <= cfg.max_bytes);
    CHECK(c.pool_stats().bytes_total + c.pool_stats().bytes_reserved + c.metadata_bytes() <= cfg.max_bytes);
    const Seen at_limit(c);
    CHECK_THROWS_AS(c.fork(a), kvq::PoolExhausted);
    CHECK(Seen(c) == at_limit);
    // Truncating gives a table's entries back.
    const SequenceId last = at_limit.ids.back();
    c.truncate(last, 16);
    CHECK(c.metadata_bytes() == at_limit.metadata - 32 * 9 * 24);
    for (SequenceId s : c.sequences()) c.remove(s);
    CHECK(c.bytes_used() == 0);
    CHECK(c.metadata_bytes() == 0);
}

}  // namespace

TEST_CASE("max_bytes bounds the bookkeeping: sequences and forks' block tables past it are PoolExhausted, nothing changed") {
    CacheConfig cfg;
    cfg.n_layers = 32;
    cfg.n_kv_heads = 2;
    cfg.head_dim = 64;
    cfg.block_tokens = 16;
    cfg.max_bytes = 1 << 20;
    KVCache c(cfg);
    // Empty sequences (issue #36: 200,000 of them took 781 MiB under an 8 MiB limit).
    size_t made = 0;
    try {
        for (; made < 100000; ++made) c.add_sequence();
        FAIL("max_bytes never reached");
    } catch (const kvq::PoolExhausted& e) {
        CHECK(std::string(e.what()).find("bookkeeping") != std::string::npos);
    }
    CHECK(made == cfg.max_bytes / KVCache::sequence_bookkeeping_bytes(cfg.n_layers));
    CHECK(c.bytes_used() <= cfg.max_bytes);
    const Seen full(c);
    CHECK_THROWS_AS(c.add_sequence(), kvq::PoolExhausted);
    CHECK_THROWS_AS(c.fork(full.ids[0]), kvq::PoolExhausted);
    CHECK(Seen(c) == full);
    for (SequenceId s : full.ids) c.remove(s);
    CHECK(c.bytes_used() == 0);

    // Forks of a long sequence: each copies its tables (24 bytes per block of every layer).
    cfg.max_bytes = 4 << 20;
    KVCache forked(cfg);
    test_forks(forked);
}

TEST_CASE("max_blocks alone bounds the bookkeeping too: within max_blocks blocks' bytes") {
    CacheConfig cfg;
    cfg.n_layers = 32;
    cfg.n_kv_heads = 2;
    cfg.head_dim = 64;
    cfg.block_tokens = 16;
    cfg.max_blocks = 4;
    KVCache c(cfg);
    const size_t block = c.pool_stats().block_bytes;
    size_t made = 0;
    try {
        for (; made < 100000; ++made) c.add_sequence();
        FAIL("never refused");
    } catch (const kvq::PoolExhausted&) {
    }
    CHECK(c.metadata_bytes() <= cfg.max_blocks * block);
    CHECK(made == cfg.max_blocks * block / KVCache::sequence_bookkeeping_bytes(cfg.n_layers));
    // The blocks themselves are not squeezed by it: max_blocks blocks still fit beside.
    for (SequenceId s : c.sequences()) c.remove(s);
    const SequenceId a = c.add_sequence();
    const auto k = kvq::test::gaussian(64 * 2 * 64, 2);
    cfg.seal = kvq::SealPolicy::on_append;
    KVCache blocks_only(cfg);
    const SequenceId b = blocks_only.add_sequence();
    blocks_only.append(0, b, k.data(), k.data(), 64);  // 4 blocks: the limit
    CHECK(blocks_only.pool_stats().blocks_used == 4);
    CHECK_THROWS_AS(blocks_only.append(1, b, k.data(), k.data(), 1), kvq::PoolExhausted);
    (void)a;
}
