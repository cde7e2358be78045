// Per-layer codecs (CacheConfig::layer_codecs, issue #17): each layer attends as a cache of its own codecs
// would, blocks of several sizes share one pool within max_blocks and max_bytes (free blocks of one size
// give way to another), and the codecs survive save/load (the file records them; load_into compares them).
#include <doctest/doctest.h>

#include <random>

#include "cache_file_util.hpp"

using namespace kvq::test::cache_file;
using kvq::LayerCodecs;

namespace {

// Three layers: the defaults (q8_0/q4_0), 4-bit keys, and turbo4 keys with q8_0 values.
CacheConfig mixed() {
    CacheConfig c = config("q8_0", "q4_0");
    c.n_layers = 3;
    c.layer_codecs = {{}, {"q4_0+rot", ""}, {"turbo4", "q8_0"}};
    return c;
}

// The same appends into a single-layer cache of one layer's codecs.
CacheConfig alone(const CacheConfig& c, int layer) {
    CacheConfig one = c;
    one.n_layers = 1;
    one.layer_codecs.clear();
    const LayerCodecs& own = c.layer_codecs[layer];
    if (!own.key.empty()) one.key_codec = own.key;
    if (!own.value.empty()) one.value_codec = own.value;
    return one;
}

std::vector<float> attend(const KVCache& c, int layer, SequenceId s) {
    const auto q = kvq::test::gaussian(size_t(c.config().n_heads) * c.config().head_dim, 5);
    std::vector<float> out(q.size());
    c.attend(layer, s, q.data(), out.data());
    return out;
}

}  // namespace

TEST_CASE("layer codecs: each layer attends bit for bit as a cache of its own codecs") {
    const CacheConfig c = mixed();
    KVCache cache(c);
    CHECK(cache.key_codec(0).name() == "q8_0");
    CHECK(cache.key_codec(1).name() == "q4_0+rot");
    CHECK(cache.value_codec(1).name() == "q4_0");
    CHECK(cache.value_codec(2).name() == "q8_0");
    CHECK(cache.key_codec().name() == "q8_0");
    CHECK_THROWS_AS((void)cache.key_codec(3), std::invalid_argument);
    const SequenceId s = cache.add_sequence();
    append(cache, s, 29, 3);  // three sealed blocks and five open rows per layer
    for (int l = 0; l < 3; ++l) {
        CAPTURE(l);
        KVCache one(alone(c, l));
        const SequenceId t = one.add_sequence();
        const size_t row = size_t(c.n_kv_heads) * c.head_dim;
        const auto k = kvq::test::gaussian(29 * row, 3 + 2 * l), v = kvq::test::gaussian(29 * row, 3 + 2 * l + 1);
        one.append(0, t, k.data(), v.data(), 29);
        CHECK(attend(cache, l, s) == attend(one, 0, t));
    }
    // Blocks of three sizes; bytes_used counts each at its own.
    const kvq::PoolStats ps = cache.pool_stats();
    CHECK(ps.blocks_used == 9);
    size_t bytes = 0;
    for (int l = 0; l < 3; ++l) bytes += 3 * KVCache(alone(c, l)).pool_stats().block_bytes;
    CHECK(ps.bytes_used == bytes);
    CHECK(cache.bytes_used() == bytes + ps.bytes_reserved + cache.metadata_bytes());
    double per_token = 0;
    for (int l = 0; l < 3; ++l) per_token += KVCache(alone(c, l)).bytes_per_token();
    CHECK(cache.bytes_per_token() == doctest::Approx(per_token));
}

TEST_CASE("layer codecs: bad entries are refused before anything is made") {
    CacheConfig c = mixed();
    c.layer_codecs.pop_back();
    CHECK_THROWS_WITH_AS(KVCache{c}, doctest::Contains("layer_codecs has 2 entries"), kvq::BadParams);
    CHECK_THROWS_AS(kvq::validate_config(c), kvq::BadParams);
    c = mixed();
    c.layer_codecs[2].key = "q9_9";
    CHECK_THROWS_AS(KVCache{c}, kvq::UnknownCodec);
    c = mixed();
    c.head_dim = 48;  // q4_0+rot needs a power of two
    CHECK_THROWS_AS(kvq::validate_config(c), kvq::BadHeadDim);
    c = mixed();
    c.max_bytes = 1000;
    c.initial_blocks = 2;
    CHECK_THROWS_WITH_AS(KVCache{c}, doctest::Contains("exceed max_bytes"), kvq::BadParams);
}

TEST_CASE("layer codecs: max_bytes holds, and free blocks of one size give way to another") {
    CacheConfig c = mixed();
    c.seal = SealPolicy::on_append;  // no staging: blocks only
    c.grow_blocks = 4;
    const size_t big = KVCache(alone(c, 2)).pool_stats().block_bytes;  // turbo4/q8_0: the largest
    // Six of them, and the bookkeeping of the two sequences below with their tables of six blocks each
    // (less than a block).
    const size_t bookkeeping = 2 * KVCache::sequence_bookkeeping_bytes(c.n_layers) + 12 * 24;
    REQUIRE(bookkeeping < big);
    c.max_bytes = 6 * big + bookkeeping;
    KVCache cache(c);
    const size_t row = size_t(c.n_kv_heads) * c.head_dim;
    const auto k = kvq::test::gaussian(64 * row, 1), v = kvq::test::gaussian(64 * row, 2);
    // Layer 0 takes as many blocks as the limit allows.
    const SequenceId a = cache.add_sequence();
    size_t n = 0;
    try {
        for (; n < 1000; n += 8) cache.append(0, a, k.data(), v.data(), 8);
        FAIL("max_bytes never reached");
    } catch (const kvq::PoolExhausted&) {
    }
    CHECK(cache.pool_stats().bytes_total <= c.max_bytes);
    CHECK(cache.n_tokens(a, 0) == n);
    // Layer 2 cannot have a block while layer 0 holds them; the failed append changes nothing.
    const SequenceId b = cache.add_sequence();
    const Snapshot before(cache);
    CHECK_THROWS_AS(cache.append(2, b, k.data(), v.data(), 8), kvq::PoolExhausted);
    CHECK(Snapshot(cache) == before);
    // Once layer 0's blocks are free, they give way: layer 2 gets all the memory it can.
    cache.remove(a);
    size_t m = 0;
    try {
        for (; m < 1000; m += 8) cache.append(2, b, k.data(), v.data(), 8);
    } catch (const kvq::PoolExhausted&) {
    }
    CHECK(m == 6 * 8);
    const kvq::PoolStats ps = cache.pool_stats();
    CHECK(ps.bytes_total <= c.max_bytes);
    CHECK(ps.bytes_used == 6 * big);
}

TEST_CASE("layer codecs: random appends, forks, truncates and removes never exceed max_blocks or max_bytes") {
    CacheConfig c = mixed();
    c.grow_blocks = 3;
    c.max_blocks = 20;
    c.max_bytes = 14 * KVCache(alone(c, 0)).pool_stats().block_bytes;
    KVCache cache(c);
    std::mt19937 rng(11);
    const size_t row = size_t(c.n_kv_heads) * c.head_dim;
    const auto k = kvq::test::gaussian(16 * row, 1), v = kvq::test::gaussian(16 * row, 2);
    std::vector<SequenceId> live;
    size_t refused = 0;
    for (int step = 0; step < 600; ++step) {
        try {
            const unsigned op = rng() % 6;
            if (live.empty() || op == 0) {
                live.push_back(cache.add_sequence());
            } else {
                const SequenceId s = live[rng() % live.size()];
                if (op <= 2) {
                    cache.append(static_cast<int>(rng() % 3), s, k.data(), v.data(), 1 + rng() % 16);
                } else if (op == 3) {
                    live.push_back(cache.fork(s));
                } else if (op == 4) {
                    size_t shortest = SIZE_MAX;
                    for (int l = 0; l < 3; ++l) shortest = std::min(shortest, cache.n_tokens(s, l));
                    cache.truncate(s, shortest ? rng() % (shortest + 1) : 0);
                } else {
                    cache.remove(s);
                    live.erase(std::find(live.begin(), live.end(), s));
                }
            }
        } catch (const kvq::PoolExhausted&) {
            ++refused;
        }
        const kvq::PoolStats ps = cache.pool_stats();
        REQUIRE(ps.blocks_total + ps.blocks_reserved <= c.max_blocks);
        REQUIRE(ps.bytes_total + ps.bytes_reserved <= c.max_bytes);
        REQUIRE(cache.bytes_used() == ps.bytes_used + ps.bytes_reserved + cache.metadata_bytes());
    }
    CHECK(refused > 0);  // the limits were reached
    for (SequenceId s : live) cache.remove(s);
    CHECK(cache.pool_stats().blocks_used == 0);
    CHECK(cache.bytes_used() == 0);
}

TEST_CASE("layer codecs: save/load keeps each layer's codecs and bits, load_into names a layer that differs") {
    TempDir dir;
    const CacheConfig c = mixed();
    KVCache src = populated(c);
    src.save(dir / "mixed.kvq");
    const KVCache back = KVCache::load(dir / "mixed.kvq");
    REQUIRE(back.config().layer_codecs.size() == 3);
    CHECK(back.key_codec(1).name() == "q4_0+rot");
    CHECK(back.value_codec(2).name() == "q8_0");
    CHECK(same_bits(outputs(back, back.sequences()), outputs(src, src.sequences())));
    CHECK(back.pool_stats().bytes_used == src.pool_stats().bytes_used);
    back.save(dir / "again.kvq");
    CHECK(slurp(dir / "again.kvq") == slurp(dir / "mixed.kvq"));

    KVCache same(c);
    CHECK(same.load_into(dir / "mixed.kvq").size() == src.sequences().size());
    CacheConfig other = c;
    other.layer_codecs[2].value = "q4_0";
    KVCache different(other);
    const Snapshot before(different);
    CHECK_THROWS_WITH_AS(different.load_into(dir / "mixed.kvq"), doctest::Contains("codecs of layer 2"), kvq::ConfigMismatch);
    CHECK(Snapshot(different) == before);
    // Without layer codecs of its own a cache of all-default layers saves none, and loads as it was.
    KVCache plain = populated(config("q8_0", "q4_0"));
    plain.save(dir / "plain.kvq");
    CHECK(KVCache::load(dir / "plain.kvq").config().layer_codecs.empty());
    // A limit on bytes at load: a file holding more is refused before the cache is made.
    kvq::LoadOptions small;
    small.max_bytes = src.pool_stats().bytes_used - 1;
    CHECK_THROWS_AS((void)KVCache::load(dir / "mixed.kvq", small), kvq::PoolExhausted);
}

TEST_CASE("layer codecs: a file whose layer reads a block of another kind is refused") {
    TempDir dir;
    CacheConfig c = mixed();
    c.n_kv_heads = 1;
    c.n_heads = 1;
    c.seal = SealPolicy::on_append;
    KVCache src(c);
    const SequenceId s = src.add_sequence();
    append(src, s, 8, 4);  // one block per layer: file blocks 0, 1, 2 of kinds 0, 1, 2
    src.save(dir / "f.kvq");
    auto b = slurp(dir / "f.kvq");
    // The tables end with one record per layer; layer 0's block index is the u32 after its record's
    // counts. Point layer 0 at block 1 (of kind 1) and recompute the section's CRC.
    uint64_t table_offset;
    std::memcpy(&table_offset, b.data() + 64, 8);
    const size_t record0 = table_offset + 3 * 4;  // after the three payload CRCs
    const size_t index0 = record0 + 8 + 8 + 4 + 4 + 4 + 4;
    uint32_t index;
    std::memcpy(&index, b.data() + index0, 4);
    REQUIRE(index == 0);
    index = 1;
    std::memcpy(b.data() + index0, &index, 4);
    const uint32_t crc = kvq::detail::crc32c(b.data() + table_offset, b.size() - table_offset - 4);
    std::memcpy(b.data() + b.size() - 4, &crc, 4);
    spit(dir / "bad.kvq", b);
    CHECK_THROWS_WITH_AS((void)KVCache::load(dir / "bad.kvq"), doctest::Contains("the blocks of the layer's codecs"),
                         kvq::BadCacheFile);
}
