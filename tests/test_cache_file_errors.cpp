// Save and load of a KVCache, bad input (docs/file-format.md): wrong magic, a newer version, each
// truncation and each flipped bit of a small file, another configuration, a missing file, a full pool, a
// failing write — each rejected with its message and nothing changed.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cache_file_util.hpp"

using namespace kvq::test::cache_file;

TEST_CASE("save/load: bad files are rejected with their reason and change nothing") {
    TempDir dir;
    CacheConfig small;
    small.n_layers = 1;
    small.head_dim = 32;
    small.block_tokens = 4;
    KVCache src(small);
    const SequenceId s = src.add_sequence();
    append(src, s, 6, 7);  // a full block and two float rows
    src.save(dir / "small.kvq");
    const auto good = slurp(dir / "small.kvq");
    REQUIRE(good.size() > 4096);

    KVCache live(small);
    append(live, live.add_sequence(), 9, 8);
    const Snapshot before(live);
    const std::string bad = dir / "bad.kvq";
    auto reason = [&](const std::vector<uint8_t>& bytes) {
        spit(bad, bytes);
        const std::string what = error_of<kvq::BadCacheFile>([&] { live.load_into(bad); });
        CHECK(Snapshot(live) == before);
        return what;
    };

    SUBCASE("magic, version") {
        auto b = good;
        b[0] = 'X';
        CHECK(reason(b).find("magic") != std::string::npos);
        b = good;
        b[8] = 7;
        CHECK(reason(b).find("format version 7 is not supported") != std::string::npos);
        CHECK(reason(b).find("newer kvq") != std::string::npos);
        CHECK(reason({}).find("less than a header") != std::string::npos);
        b = good;
        b.push_back(0);
        CHECK(reason(b).find("data after the end") != std::string::npos);
    }
    SUBCASE("every truncation") {
        for (size_t n = 0; n < good.size(); ++n) {
            CAPTURE(n);
            const std::string what = reason(std::vector<uint8_t>(good.begin(), good.begin() + n));
            CHECK((what.find("truncated") != std::string::npos || what.find("less than a header") != std::string::npos));
        }
    }
    SUBCASE("every flipped bit position") {
        for (size_t i = 0; i < good.size(); ++i) {
            CAPTURE(i);
            auto b = good;
            b[i] ^= static_cast<uint8_t>(1u << (i % 8));
            reason(b);
        }
    }
    SUBCASE("a payload CRC") {
        auto b = good;
        b[4096 + 3] ^= 0x10;  // inside the first block
        CHECK(reason(b).find("block 0: CRC32C mismatch") != std::string::npos);
    }
    SUBCASE("missing file, directory") {
        const std::string what = error_of<kvq::FileIOError>([&] { live.load_into(dir / "nope.kvq"); });
        CHECK(what.find("No such file") != std::string::npos);
        CHECK(error_of<kvq::FileIOError>([&] { live.load_into(dir.path.string()); }).find("not a regular file") !=
              std::string::npos);
        CHECK(error_of<kvq::FileIOError>([&] { (void)KVCache::load(dir / "nope.kvq"); }).find("nope.kvq") !=
              std::string::npos);
        CHECK(Snapshot(live) == before);
    }
    SUBCASE("static load of a bad file") {
        auto b = good;
        b[5000 < b.size() ? 5000 : b.size() - 1] ^= 1;
        spit(bad, b);
        CHECK_THROWS_AS((void)KVCache::load(bad), kvq::BadCacheFile);
    }
}

TEST_CASE("save/load: load_into names the configuration field that differs") {
    TempDir dir;
    const CacheConfig base = config("q8_0", "q4_0");
    KVCache src = populated(base);
    src.save(dir / "f.kvq");
    struct Change {
        const char* field;
        void (*apply)(CacheConfig&);
    };
    const Change changes[] = {
        {"n_layers", [](CacheConfig& c) { c.n_layers = 3; }},
        {"n_heads", [](CacheConfig& c) { c.n_heads = 2; }},
        {"head_dim", [](CacheConfig& c) { c.head_dim = 128; }},
        {"value_codec is 'q4_0', this cache's is 'q8_0'", [](CacheConfig& c) { c.value_codec = "q8_0"; }},
        {"key_codec", [](CacheConfig& c) { c.key_codec = "q8_0+rot"; }},
        {"seed", [](CacheConfig& c) { c.seed = 5; }},
        {"block_tokens", [](CacheConfig& c) { c.block_tokens = 16; }},
        {"seal", [](CacheConfig& c) { c.seal = SealPolicy::on_append; }},
        {"key_codec is 'q8_0', this cache's is 'q8_0+center'", [](CacheConfig& c) { c.center_keys = true; }},
        {"key_codec is 'q8_0', this cache's is 'q8_0+center'", [](CacheConfig& c) { c.key_codec = "q8_0+center"; }},
        {"scale", [](CacheConfig& c) { c.scale = 0.5f; }},
        {"softcap", [](CacheConfig& c) { c.softcap = 30.0f; }},
        {"sliding_window of layer 1", [](CacheConfig& c) { c.sliding_window = {0, 64}; }},
    };
    for (const Change& ch : changes) {
        CAPTURE(ch.field);
        CacheConfig cfg = base;
        ch.apply(cfg);
        KVCache other = populated(cfg);
        const Snapshot before(other);
        const std::string what = error_of<kvq::ConfigMismatch>([&] { other.load_into(dir / "f.kvq"); });
        CHECK(what.find(ch.field) != std::string::npos);
        CHECK(Snapshot(other) == before);
    }
    // Pool sizes, threads and an explicit window of zeros are not part of the match.
    CacheConfig same = base;
    same.threads = 2;
    same.max_blocks = 100;
    same.sliding_window = {0, 0};
    KVCache ok(same);
    CHECK(ok.load_into(dir / "f.kvq").size() == 3);
}

TEST_CASE("save/load: a pool that runs out mid-load changes nothing") {
    TempDir dir;
    CacheConfig cfg = config("q8_0", "q4_0");
    KVCache src = populated(cfg);
    src.save(dir / "f.kvq");
    // The file's blocks and its open blocks' float staging (counted in blocks' worth of bytes); the live
    // cache's own 6 blocks and its 2 layers' staging leave one unit too few.
    const size_t needed = src.pool_stats().blocks_used + src.pool_stats().blocks_reserved;
    const size_t bb = src.pool_stats().block_bytes, units = (2 * 2 * 8 * 64 * sizeof(float) + bb - 1) / bb;
    cfg.max_blocks = 6 + 2 * units + needed - 1;
    KVCache live(cfg);
    append(live, live.add_sequence(), 24, 3);  // 3 blocks in each of 2 layers
    REQUIRE(live.pool_stats().blocks_used == 6);
    REQUIRE(live.pool_stats().blocks_reserved == 2 * units);
    const Snapshot before(live);
    CHECK_THROWS_AS(live.load_into(dir / "f.kvq"), kvq::PoolExhausted);
    CHECK(Snapshot(live) == before);
    CHECK(live.sequences().size() == 1);
}

TEST_CASE("save: a failed write leaves the old file and no temporary file") {
    TempDir dir;
    KVCache c = populated(config("q8_0", "q4_0"));
    const std::string path = dir / "c.kvq";
    KVCache(config("q8_0", "q4_0")).save(path);  // an old file: no sequences
    const auto old = slurp(path);

    SUBCASE("no such directory") {
        const std::string what = error_of<kvq::FileIOError>([&] { c.save(dir / "no/such/dir.kvq"); });
        CHECK(what.find("No such file") != std::string::npos);
    }
    SUBCASE("the path is a directory: rename fails after the write") {
        fs::create_directory(dir / "d");
        const std::string what = error_of<kvq::FileIOError>([&] { c.save(dir / "d"); });
        CHECK(what.find("rename") != std::string::npos);
        CHECK(fs::is_directory(dir / "d"));
    }
    SUBCASE("the file system refuses the bytes mid-write (file size limit)") {
        // RLIMIT_FSIZE holds for root too: write() fails with EFBIG once the file reaches the limit.
        struct rlimit saved;
        REQUIRE(::getrlimit(RLIMIT_FSIZE, &saved) == 0);
        const auto old_handler = ::signal(SIGXFSZ, SIG_IGN);
        struct rlimit small = saved;
        small.rlim_cur = 6000;
        REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
        std::string what;
        try {
            c.save(path);
        } catch (const kvq::FileIOError& e) {
            what = e.what();
        }
        ::setrlimit(RLIMIT_FSIZE, &saved);
        ::signal(SIGXFSZ, old_handler);
        CHECK(what.find("cannot write") != std::string::npos);
        CHECK(what.find("was not changed") != std::string::npos);
    }
    CHECK(slurp(path) == old);
    CHECK(dir.entries() == 1 + fs::exists(dir / "d"));
    // And a save that works replaces it.
    c.save(path);
    CHECK(KVCache::load(path).sequences().size() == 3);
}
