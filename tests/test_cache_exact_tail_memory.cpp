// The exact tail's memory (issue #50, item 5): a layer's staging ring holds exact_tail_tokens + block_tokens
// − 1 tokens, 8 GiB at the largest tail (2^20 tokens of 8 kv heads of 128 floats, keys and values). It
// grows as the tail fills (doubling, up to the ring), so the first token costs a block's rows, not the
// ring; the pool still reserves the whole ring at once (later appends never fail for it).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "cache_file_util.hpp"
#include "kvq/cache.hpp"
#include "test_util.hpp"

namespace {

size_t resident_bytes() {
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
        std::fclose(f);
    }
    return static_cast<size_t>(resident) * 4096;
}

}  // namespace

TEST_CASE("exact tail: the largest tail costs what it holds, not its whole ring, on the first token (issue #50)") {
    kvq::CacheConfig cfg;
    cfg.n_kv_heads = 8;
    cfg.n_heads = 8;
    cfg.head_dim = 128;
    cfg.block_tokens = 32;
    cfg.exact_tail_tokens = kvq::kMaxExactTailTokens;  // a ring of 8 GiB per layer
    kvq::KVCache cache(cfg);
    const size_t row = 8 * 128;
    const auto k = kvq::test::gaussian(3000 * row, 1), v = kvq::test::gaussian(3000 * row, 2);
    const auto q = kvq::test::gaussian(row, 3);
    const size_t empty_bytes = cache.bytes_used();
    const auto seq = cache.add_sequence();
    const size_t before = resident_bytes();
    const auto start = std::chrono::steady_clock::now();
    cache.append(0, seq, k.data(), v.data(), 1);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK(seconds < 1.0);  // was 30-44 s: 8 GiB zeroed
    CHECK(resident_bytes() - before < (64u << 20));
    // 3000 tokens: 24 MiB of float rows, the staging at most twice that.
    cache.append(0, seq, k.data() + row, v.data() + row, 2999);
    CHECK(resident_bytes() - before < (96u << 20));
    // Still exact (everything is in the tail) and the fork copies what is held.
    std::vector<float> out(row), again(row);
    cache.attend(0, seq, q.data(), out.data());
    const auto child = cache.fork(seq);
    cache.attend(0, child, q.data(), again.data());
    CHECK(again == out);
    CHECK(resident_bytes() - before < (160u << 20));
    // Saved as held (format version 6: the ring's first slots), not as 8 GiB; loaded, the same attention.
    kvq::test::cache_file::TempDir dir;
    cache.save(dir / "tail.kvq");
    const auto file = kvq::test::cache_file::slurp(dir / "tail.kvq");
    CHECK(file.size() < (64u << 20));
    CHECK(file[8] == 6);
    {
        const kvq::KVCache loaded = kvq::KVCache::load(dir / "tail.kvq");
        for (const auto s : loaded.sequences()) {
            loaded.attend(0, s, q.data(), again.data());
            CHECK(again == out);
        }
        CHECK(resident_bytes() - before < (320u << 20));
    }
    cache.remove(child);
    cache.remove(seq);
    CHECK(cache.bytes_used() == empty_bytes);  // the reservation given back whole
}
