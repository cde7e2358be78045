// Save and load of a KVCache (docs/file-format.md): CRC32C against known vectors; round trips that give
// the same attention bit for bit and the same file again, for several codec pairs, forks sharing blocks,
// open blocks, sliding windows and one sequence; and loading into a live cache. The bad inputs are in
// test_cache_file_errors.cpp.
#include <doctest/doctest.h>

#include "cache_file_util.hpp"

using namespace kvq::test::cache_file;

TEST_CASE("crc32c: known vectors (RFC 3720, iSCSI) and pieces") {
    using kvq::detail::crc32c;
    CHECK(crc32c("123456789", 9) == 0xE3069283u);
    CHECK(crc32c("", 0) == 0u);
    std::vector<uint8_t> zeros(32, 0), ones(32, 0xFF), up(32);
    for (int i = 0; i < 32; ++i) up[i] = static_cast<uint8_t>(i);
    CHECK(crc32c(zeros.data(), 32) == 0x8A9136AAu);
    CHECK(crc32c(ones.data(), 32) == 0x62A8AB43u);
    CHECK(crc32c(up.data(), 32) == 0x46DD794Eu);
    const auto big = kvq::test::gaussian(1000, 3);
    const auto* p = reinterpret_cast<const uint8_t*>(big.data());
    for (size_t cut : {0, 1, 7, 8, 9, 1000, 3999, 4000}) {
        CHECK(crc32c(p + cut, 4000 - cut, crc32c(p, cut)) == crc32c(p, 4000));
    }
}

TEST_CASE("save/load: round trip is bit-exact for codec pairs, forks, open blocks, windows") {
    struct Case {
        const char* k;
        const char* v;
        bool center;
        SealPolicy seal;
        std::vector<int> window;
    };
    const Case cases[] = {
        {"q8_0", "q4_0", false, SealPolicy::on_block_full, {}},
        {"f16", "f16", false, SealPolicy::on_block_full, {}},
        {"q4_0+rot", "q4_0", false, SealPolicy::on_block_full, {}},
        {"polar", "q4_0", false, SealPolicy::on_block_full, {}},
        {"turbo3", "turbo4", false, SealPolicy::on_block_full, {}},
        {"tcq3", "tcq3", false, SealPolicy::on_block_full, {}},
        {"q8_0", "q4_0", true, SealPolicy::on_block_full, {}},
        {"q4_1", "q8_0", false, SealPolicy::on_append, {}},
        {"q8_0", "q4_0", false, SealPolicy::on_block_full, {0, 8}},
    };
    TempDir dir;
    for (const Case& k : cases) {
        CAPTURE(k.k);
        CAPTURE(k.v);
        CacheConfig cfg = config(k.k, k.v);
        cfg.center_keys = k.center;
        cfg.seal = k.seal;
        cfg.sliding_window = k.window;
        cfg.seed = 1234;
        KVCache c = populated(cfg);
        const std::string path = dir / "cache.kvq";
        c.save(path);
        const auto file = slurp(path);
        // The payload section starts on a page, so a reader can map the file and use blocks in place.
        uint64_t payload_offset = 0;
        std::memcpy(&payload_offset, file.data() + 24, 8);
        CHECK(payload_offset % 4096 == 0);

        KVCache d = KVCache::load(path);
        CHECK(d.sequences() == std::vector<SequenceId>{0, 1, 2});
        CHECK(same_bits(outputs(c, c.sequences()), outputs(d, d.sequences())));
        CHECK(d.bytes_used() == c.bytes_used());
        CHECK(d.pool_stats().blocks_used == c.pool_stats().blocks_used);
        CHECK(d.pool_stats().blocks_shared == c.pool_stats().blocks_shared);
        CHECK(d.config().key_codec == c.key_spec());  // "+center" included (the file has the center_keys field)
        CHECK(d.config().center_keys == k.center);
        CHECK(d.config().seed == 1234);
        CHECK(d.config().sliding_window == cfg.sliding_window);
        // Saving the loaded cache gives the same bytes: every block, table and float row came back.
        d.save(dir / "again.kvq");
        CHECK(slurp(dir / "again.kvq") == file);
        // And both go on alike: the open blocks seal into the same bytes, forks copy on write alike.
        for (KVCache* x : {&c, &d}) {
            append(*x, 1, 13, 50);
            append(*x, 0, 2, 60);
            x->truncate(2, 1);
        }
        CHECK(same_bits(outputs(c, c.sequences()), outputs(d, d.sequences())));
    }
}

TEST_CASE("save/load: sliding window that released blocks, and one sequence") {
    TempDir dir;
    CacheConfig cfg = config("q8_0", "q4_0");
    cfg.sliding_window = {16, 0};
    KVCache c = populated(cfg);
    append(c, 0, 40, 70);
    append(c, 0, 1, 71);  // layer 0 drops the blocks below its window at the next append
    REQUIRE(c.dump().find("released below") != std::string::npos);
    c.save(dir / "all.kvq");
    KVCache d = KVCache::load(dir / "all.kvq");
    CHECK(same_bits(outputs(c, c.sequences()), outputs(d, d.sequences())));
    CHECK(d.dump().find("released below") != std::string::npos);

    c.save(dir / "one.kvq", 1);
    KVCache e = KVCache::load(dir / "one.kvq");
    CHECK(e.sequences() == std::vector<SequenceId>{0});
    CHECK(same_bits(outputs(c, {1}), outputs(e, {0})));
    CHECK(e.pool_stats().blocks_shared == 0);
    CHECK(error_of<std::invalid_argument>([&] { c.save(dir / "x.kvq", 7); }).find("no sequence with id 7") !=
          std::string::npos);
}

TEST_CASE("save/load: load_into a live cache keeps its sequences and shares the file's forks") {
    TempDir dir;
    const CacheConfig cfg = config("q8_0", "q4_0");
    KVCache src = populated(cfg);
    src.save(dir / "f.kvq");
    KVCache live = populated(cfg);
    append(live, 0, 7, 500);  // different contents from src
    const auto before = outputs(live, live.sequences());
    const auto stats = live.pool_stats();
    const auto ids = live.load_into(dir / "f.kvq");
    CHECK(ids == std::vector<SequenceId>{3, 4, 5});
    CHECK(same_bits(outputs(live, {0, 1, 2}), before));
    CHECK(same_bits(outputs(live, ids), outputs(src, src.sequences())));
    const auto after = live.pool_stats();
    CHECK(after.blocks_used - stats.blocks_used == src.pool_stats().blocks_used);
    CHECK(after.blocks_shared - stats.blocks_shared == src.pool_stats().blocks_shared);
    CHECK(src.pool_stats().blocks_shared > 0);
    // Removing the loaded sequences gives every block back.
    for (SequenceId s : ids) live.remove(s);
    CHECK(live.pool_stats().blocks_used == stats.blocks_used);
}

