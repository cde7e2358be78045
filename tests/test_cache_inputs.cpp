// Hostile input to the cache (issue #15): sizes that overflow, finite queries whose float scores
// overflow, cache files whose CRCs were recomputed over rows the cache's input rules refuse, paths with a
// NUL byte, and a FIFO given as a cache file.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "cache/crc32c.hpp"
#include "kvq/cache.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::NanPolicy;
using kvq::SequenceId;
namespace fs = std::filesystem;

namespace {

constexpr int kD = 64, kKv = 2, kHeads = 4, kBt = 8;

struct TempDir {
    fs::path path;
    TempDir() {
        static int n = 0;
        path = fs::temp_directory_path() / ("kvq_test_inputs_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    std::string operator/(const std::string& name) const { return (path / name).string(); }
};

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

std::vector<uint8_t> slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
    fs::remove(path);
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

uint64_t get(const std::vector<uint8_t>& b, size_t at, int n) {
    uint64_t x = 0;
    for (int i = 0; i < n; ++i) x |= uint64_t(b[at + i]) << (8 * i);
    return x;
}

void put(std::vector<uint8_t>& b, size_t at, uint64_t x, int n) {
    for (int i = 0; i < n; ++i) b[at + i] = static_cast<uint8_t>(x >> (8 * i));
}

// The file's sections (docs/file-format.md).
struct Layout {
    uint64_t payloads, n_blocks, block_bytes, n_staging, staging_bytes, table, table_bytes;
    explicit Layout(const std::vector<uint8_t>& b)
        : payloads(get(b, 24, 8)), n_blocks(get(b, 32, 8)), block_bytes(get(b, 40, 8)), n_staging(get(b, 48, 8)),
          staging_bytes(get(b, 56, 8)), table(get(b, 64, 8)), table_bytes(get(b, 72, 8)) {}
    uint64_t staging(uint64_t j) const { return payloads + n_blocks * block_bytes + j * staging_bytes; }
};

// What a forger does after editing payloads: every payload CRC and the tables' CRC made to match again.
void recompute_crcs(std::vector<uint8_t>& b) {
    const Layout l(b);
    for (uint64_t i = 0; i < l.n_blocks + l.n_staging; ++i) {
        const uint64_t at = i < l.n_blocks ? l.payloads + i * l.block_bytes : l.staging(i - l.n_blocks);
        const uint64_t size = i < l.n_blocks ? l.block_bytes : l.staging_bytes;
        put(b, l.table + 4 * i, kvq::detail::crc32c(b.data() + at, size), 4);
    }
    put(b, l.table + l.table_bytes - 4, kvq::detail::crc32c(b.data() + l.table, l.table_bytes - 4), 4);
}

// One sequence of 12 tokens: one sealed block (positions 0-7) and 4 staged float rows (8-11).
std::vector<uint8_t> saved_file(const CacheConfig& cfg, const std::string& path) {
    KVCache c(cfg);
    const SequenceId s = c.add_sequence();
    const auto k = kvq::test::gaussian(12 * kKv * kD, 1), v = kvq::test::gaussian(12 * kKv * kD, 2);
    c.append(0, s, k.data(), v.data(), 12);
    c.save(path);
    return slurp(path);
}

enum class Forgery { staged_nan, staged_huge, block_inf_scale, block_nan_scale };
const Forgery kForgeries[] = {Forgery::staged_nan, Forgery::staged_huge, Forgery::block_inf_scale,
                              Forgery::block_nan_scale};
const char* name(Forgery f) {
    switch (f) {
        case Forgery::staged_nan: return "NaN in a staged key row";
        case Forgery::staged_huge: return "1e30 in a staged key row";
        case Forgery::block_inf_scale: return "an Inf fp16 scale in a sealed key row";
        default: return "a NaN fp16 scale in a sealed key row";
    }
}

// Kv head 0 of position 9 (staged) or 2 (sealed) made bad; the CRCs recomputed.
std::vector<uint8_t> forged(std::vector<uint8_t> b, Forgery f) {
    const Layout l(b);
    if (f == Forgery::staged_nan || f == Forgery::staged_huge) {
        const float x = f == Forgery::staged_nan ? std::numeric_limits<float>::quiet_NaN() : 1e30f;
        std::memcpy(b.data() + l.staging(0) + (0 * kBt + 1) * kD * sizeof(float) + 5 * sizeof(float), &x, sizeof x);
    } else {
        const size_t row_bytes = kD / 32 * 34;  // q8_0: fp16 scale, 32 int8 per block of 32
        put(b, l.payloads + 2 * row_bytes, f == Forgery::block_inf_scale ? 0x7C00 : 0x7E00, 2);
    }
    recompute_crcs(b);
    return b;
}

size_t bad_position(Forgery f) { return f == Forgery::staged_nan || f == Forgery::staged_huge ? 9 : 2; }

bool all_finite(const std::vector<float>& x, size_t from, size_t n) {
    for (size_t i = from; i < from + n; ++i) {
        if (!std::isfinite(x[i])) return false;
    }
    return true;
}

std::vector<float> attend(const KVCache& c, SequenceId s) {
    const auto q = kvq::test::gaussian(kHeads * kD, 7);
    std::vector<float> out(q.size());
    c.attend(0, s, q.data(), out.data());
    return out;
}

}  // namespace

TEST_CASE("load: rows the cache's input rules refuse are refused under nan_policy reject (CRCs recomputed)") {
    TempDir dir;
    const std::string path = dir / "c.kvq";
    const std::vector<uint8_t> good = saved_file(config(NanPolicy::reject), path);
    for (Forgery f : kForgeries) {
        CAPTURE(name(f));
        spit(path, forged(good, f));
        CHECK_THROWS_WITH_AS(KVCache::load(path), doctest::Contains("nan_policy = reject"), kvq::BadCacheFile);
        KVCache live(config(NanPolicy::reject));
        const SequenceId own = live.add_sequence();
        const auto k = kvq::test::gaussian(5 * kKv * kD, 3);
        live.append(0, own, k.data(), k.data(), 5);
        const std::string dump = live.dump();
        const size_t bytes = live.bytes_used();
        const auto out = attend(live, own);
        CHECK_THROWS_AS(live.load_into(path), kvq::BadCacheFile);
        CHECK(live.dump() == dump);
        CHECK(live.bytes_used() == bytes);
        CHECK(attend(live, own) == out);
    }
    spit(path, good);
    CHECK(KVCache::load(path).sequences().size() == 1);
}

TEST_CASE("load: under nan_policy propagate, such rows are recorded as non-finite, as append records them") {
    TempDir dir;
    const std::string path = dir / "c.kvq";
    const std::vector<uint8_t> good = saved_file(config(NanPolicy::propagate), path);
    for (Forgery f : kForgeries) {
        CAPTURE(name(f));
        spit(path, forged(good, f));
        KVCache c = KVCache::load(path);
        const auto out = attend(c, 0);
        // Kv head 0 (query heads 0 and 1) reads the bad row: NaN; kv head 1 is untouched and finite.
        CHECK(std::isnan(out[0]));
        CHECK(std::isnan(out[2 * kD - 1]));
        CHECK(all_finite(out, 2 * kD, 2 * kD));
        // Sealing the open block (the 1e30 row among it) stores no Inf scale: the row was zeroed, as
        // append zeroes it, and it stays recorded; truncating below it makes kv head 0 finite again.
        const auto k = kvq::test::gaussian(4 * kKv * kD, 5);
        c.append(0, 0, k.data(), k.data(), 4);
        CHECK(std::isnan(attend(c, 0)[0]));
        c.truncate(0, bad_position(f));
        CHECK(all_finite(attend(c, 0), 0, kHeads * kD));
        // Saved again, the loaded cache's file lists the row it recorded and loads alike.
        KVCache again = KVCache::load(path);
        again.save(dir / "again.kvq");
        CHECK(std::isnan(attend(KVCache::load(dir / "again.kvq"), 0)[0]));
    }
}

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

TEST_CASE("save/load: a path with a NUL byte is an error, and no file by the path's prefix is made") {
    TempDir dir;
    KVCache c(config(NanPolicy::reject));
    c.add_sequence();
    const std::string path = dir / "a" + std::string(1, '\0') + "b.kvq";
    CHECK_THROWS_WITH_AS(c.save(path), doctest::Contains("NUL"), std::invalid_argument);
    CHECK_FALSE(fs::exists(dir / "a"));
    c.save(dir / "a");
    CHECK_THROWS_WITH_AS(KVCache::load(path), doctest::Contains("NUL"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(c.load_into(path), doctest::Contains("NUL"), std::invalid_argument);
    CHECK(c.sequences().size() == 1);
}

TEST_CASE("load: a FIFO is refused at once, before it is read") {
    TempDir dir;
    const std::string fifo = dir / "fifo";
    REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
    // Without the fix, open() waits for a writer: this one comes after 3 s, so the test ends either way.
    std::thread writer([&] {
        std::this_thread::sleep_for(std::chrono::seconds(3));
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
        if (fd >= 0) ::close(fd);
    });
    const auto t0 = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(KVCache::load(fifo), doctest::Contains("FIFO"), kvq::FileIOError);
    KVCache c(config(NanPolicy::reject));
    CHECK_THROWS_WITH_AS(c.load_into(fifo), doctest::Contains("FIFO"), kvq::FileIOError);
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(2));
    writer.join();
}
