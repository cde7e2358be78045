// Save and load of a KVCache (docs/file-format.md): CRC32C against known vectors; round trips that give
// the same attention bit for bit and the same file again, for several codec pairs, forks sharing blocks,
// open blocks, sliding windows and one sequence; loading into a live cache; and every bad input — wrong
// magic, a newer version, each truncation and each flipped bit of a small file, another configuration,
// a missing file, a full pool, a failing write — rejected with its message and nothing changed.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/crc32c.hpp"
#include "kvq/cache.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SealPolicy;
using kvq::SequenceId;
namespace fs = std::filesystem;

namespace {

// A directory of its own for each test case, removed afterwards.
struct TempDir {
    fs::path path;
    TempDir() {
        static int n = 0;
        path = fs::temp_directory_path() / ("kvq_test_file_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    std::string operator/(const std::string& name) const { return (path / name).string(); }
    size_t entries() const { return static_cast<size_t>(std::distance(fs::directory_iterator(path), fs::directory_iterator())); }
};

std::vector<uint8_t> slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
    // A new file rather than a truncated one: ext4 flushes a file truncated and rewritten (auto_da_alloc),
    // which made the loops over thousands of bad files wait on the disk.
    fs::remove(path);
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

CacheConfig config(const std::string& kc, const std::string& vc) {
    CacheConfig c;
    c.n_layers = 2;
    c.n_kv_heads = 2;
    c.n_heads = 4;
    c.head_dim = 64;
    c.block_tokens = 8;
    c.key_codec = kc;
    c.value_codec = vc;
    return c;
}

void append(KVCache& c, SequenceId s, size_t n, uint64_t seed) {
    const size_t row = size_t(c.config().n_kv_heads) * c.config().head_dim;
    for (int l = 0; l < c.config().n_layers; ++l) {
        const auto k = kvq::test::gaussian(n * row, seed + 2 * l), v = kvq::test::gaussian(n * row, seed + 2 * l + 1);
        c.append(l, s, k.data(), v.data(), n);
    }
}

// Every layer's attention for every sequence, and the token counts, as bytes.
std::vector<std::vector<float>> outputs(const KVCache& c, const std::vector<SequenceId>& ids) {
    const auto q = kvq::test::gaussian(size_t(c.config().n_heads) * c.config().head_dim, 99);
    std::vector<std::vector<float>> all;
    for (SequenceId s : ids) {
        for (int l = 0; l < c.config().n_layers; ++l) {
            std::vector<float> out(q.size(), 0.0f);
            if (c.n_tokens(s, l) > 0) c.attend(l, s, q.data(), out.data());
            out.push_back(static_cast<float>(c.n_tokens(s, l)));
            all.push_back(out);
        }
    }
    return all;
}

bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) {
            return false;
        }
    }
    return true;
}

// Everything observable about a cache (dump includes block ids and reference counts).
struct Snapshot {
    std::string dump;
    size_t bytes;
    kvq::PoolStats pool;
    std::vector<std::vector<float>> outs;
    explicit Snapshot(const KVCache& c)
        : dump(c.dump()), bytes(c.bytes_used()), pool(c.pool_stats()), outs(outputs(c, c.sequences())) {}
    bool operator==(const Snapshot& o) const {
        return dump == o.dump && bytes == o.bytes && pool.blocks_total == o.pool.blocks_total &&
               pool.blocks_used == o.pool.blocks_used && pool.blocks_shared == o.pool.blocks_shared &&
               same_bits(outs, o.outs);
    }
};

// A cache with forks sharing blocks, open blocks, and a sequence with an odd length.
KVCache populated(const CacheConfig& cfg) {
    KVCache c(cfg);
    const SequenceId a = c.add_sequence();
    append(c, a, 21, 1);  // two full blocks and 5 open tokens
    const SequenceId b = c.fork(a);
    append(c, b, 4, 10);
    const SequenceId e = c.add_sequence();
    append(c, e, 3, 20);
    return c;
}

template <class E>
std::string error_of(auto&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    }
    FAIL("expected an exception");
    return {};
}

}  // namespace

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
        CHECK(d.config().key_codec == c.key_codec().name());
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
        b[8] = 2;
        CHECK(reason(b).find("format version 2 is not supported") != std::string::npos);
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
        {"center_keys", [](CacheConfig& c) { c.center_keys = true; }},
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
