// Any thread may name any sequence at any time (issue #36): sequences are made (fork, add_sequence,
// load_into), written and removed while other threads list every id and attend, save and count it. A
// sequence is reachable only once it is complete and unreachable before it is taken apart, so each call
// either works on a whole sequence or fails with std::invalid_argument ("no sequence", or "no tokens" for
// a new empty one), never a crash or a data race (this file is in the TSan run).
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include "kvq/cache.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SequenceId;

namespace {

CacheConfig lifecycle_config() {
    CacheConfig cfg;
    cfg.n_layers = 2;
    cfg.n_kv_heads = 2;
    cfg.n_heads = 4;
    cfg.head_dim = 32;
    cfg.block_tokens = 16;
    cfg.threads = 2;  // attends also run parts on kvq's pool
    return cfg;
}

bool expected_error(const std::invalid_argument& e) {
    const std::string m = e.what();
    return m.find("no sequence with id") != std::string::npos || m.find("has no tokens") != std::string::npos;
}

bool all_finite(const std::vector<float>& x) {
    for (float f : x) {
        if (!std::isfinite(f)) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("sequences made, written and removed under readers of every listed id: whole or an error, never a race") {
    const CacheConfig cfg = lifecycle_config();
    KVCache cache(cfg);
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim, vec = static_cast<size_t>(cfg.n_heads) * cfg.head_dim;
    const auto k = kvq::test::gaussian(40 * row, 1), v = kvq::test::gaussian(40 * row, 2);
    const auto q = kvq::test::gaussian(4 * vec, 3);
    const SequenceId a = cache.add_sequence();
    for (int l = 0; l < cfg.n_layers; ++l) cache.append(l, a, k.data(), v.data(), 40);  // two sealed blocks, 8 staged
    const auto dir = std::filesystem::temp_directory_path() / ("kvq_lifecycle_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string file_a = (dir / "a.kvq").string();
    cache.save(file_a, a);
    std::vector<float> before(vec);
    cache.attend(0, a, q.data(), before.data());
    const kvq::PoolStats pool_before = cache.pool_stats();
    const size_t bytes_before = cache.bytes_used();

    // Writers go on until they have made kRounds sequences each and the readers have made kPasses passes
    // over the listed ids; everyone starts together.
    constexpr int kRounds = 100, kPasses = 60;
    std::atomic<int> writers_left{3}, waiting{5}, passes{0};
    const auto start = [&] {
        --waiting;
        while (waiting.load() > 0) std::this_thread::yield();
    };
    const auto more = [&](int i) { return i < kRounds || passes.load() < kPasses; };
    std::atomic<long> attended{0}, refused{0};
    std::atomic<bool> unexpected{false};
    std::vector<std::thread> threads;
    // Writers: forks of a that take tokens, are truncated and removed; new sequences; loaded copies of a.
    threads.emplace_back([&] {
        start();
        for (int i = 0; more(i); ++i) {
            const SequenceId f = cache.fork(a);
            for (int l = 0; l < cfg.n_layers; ++l) cache.append(l, f, k.data(), v.data(), 3 + i % 20);
            cache.truncate(f, 30);
            cache.remove(f);
        }
        --writers_left;
    });
    threads.emplace_back([&] {
        start();
        for (int i = 0; more(i); ++i) {
            const SequenceId s = cache.add_sequence();
            if (i % 2) cache.append(1, s, k.data(), v.data(), 17);
            cache.remove(s);
        }
        --writers_left;
    });
    threads.emplace_back([&] {
        start();
        for (int i = 0; more(5 * i); ++i) {
            for (SequenceId s : cache.load_into(file_a)) cache.remove(s);
        }
        --writers_left;
    });
    // Readers: every listed id attended (alone and in batches), counted, saved, dumped.
    for (int r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
            std::vector<float> out(4 * vec);
            const std::string file = (dir / ("r" + std::to_string(r) + ".kvq")).string();
            start();
            bool last = false;
            while (!last) {
                last = writers_left.load() == 0;  // one more pass after the writers are done
                const std::vector<SequenceId> ids = cache.sequences();
                for (SequenceId s : ids) {
                    try {
                        cache.attend(0, s, q.data(), out.data());
                        if (!all_finite(out)) unexpected = true;
                        (void)cache.n_tokens(s, 1);
                        ++attended;
                    } catch (const std::invalid_argument& e) {
                        if (!expected_error(e)) unexpected = true;
                        ++refused;
                    }
                }
                try {
                    const std::vector<SequenceId> few(ids.begin(), ids.begin() + std::min<size_t>(ids.size(), 4));
                    cache.attend_batch(0, few, q.data(), out.data());
                } catch (const std::invalid_argument& e) {
                    if (!expected_error(e)) unexpected = true;
                }
                cache.save(file);  // every sequence there is, each whole
                (void)cache.dump();
                ++passes;
            }
        });
    }
    for (auto& t : threads) t.join();
    CHECK_FALSE(unexpected.load());
    CHECK(attended.load() > 0);
    MESSAGE("attended " << attended.load() << ", refused " << refused.load());
    // Everything made was taken apart: the cache is as before.
    CHECK(cache.sequences() == std::vector<SequenceId>{a});
    CHECK(cache.pool_stats().blocks_used == pool_before.blocks_used);
    CHECK(cache.pool_stats().bytes_reserved == pool_before.bytes_reserved);
    CHECK(cache.bytes_used() == bytes_before);
    std::vector<float> after(vec);
    cache.attend(0, a, q.data(), after.data());
    CHECK(std::memcmp(before.data(), after.data(), vec * sizeof(float)) == 0);
    // A file saved while sequences came and went loads, each sequence whole.
    KVCache loaded = KVCache::load((dir / "r0.kvq").string());
    for (SequenceId s : loaded.sequences()) {
        for (int l = 0; l < cfg.n_layers; ++l) {
            if (loaded.n_tokens(s, l) == 0) continue;
            std::vector<float> out(vec);
            loaded.attend(l, s, q.data(), out.data());
            CHECK(all_finite(out));
        }
    }
    std::filesystem::remove_all(dir);
}

TEST_CASE("a sequence removed while calls wait for it: those calls fail as for an unknown id") {
    const CacheConfig cfg = lifecycle_config();
    KVCache cache(cfg);
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim, vec = static_cast<size_t>(cfg.n_heads) * cfg.head_dim;
    const auto k = kvq::test::gaussian(2000 * row, 4), q = kvq::test::gaussian(vec, 5);
    for (int round = 0; round < 20; ++round) {
        const SequenceId s = cache.add_sequence();
        cache.append(0, s, k.data(), k.data(), 2000);
        std::atomic<bool> go{false};
        std::atomic<int> ok{0}, gone{0}, other{0};
        std::vector<std::thread> readers;
        for (int r = 0; r < 3; ++r) {
            readers.emplace_back([&] {
                std::vector<float> out(vec);
                while (!go.load()) std::this_thread::yield();
                for (int i = 0; i < 5; ++i) {
                    try {
                        cache.attend(0, s, q.data(), out.data());
                        ++ok;
                    } catch (const std::invalid_argument& e) {
                        ++(std::string(e.what()).find("no sequence with id") != std::string::npos ? gone : other);
                    }
                }
            });
        }
        go = true;
        cache.remove(s);
        for (auto& t : readers) t.join();
        CHECK(other.load() == 0);
        CHECK(ok.load() + gone.load() == 15);
        CHECK_FALSE(cache.contains(s));
    }
    CHECK(cache.pool_stats().blocks_used == 0);
    CHECK(cache.bytes_used() == 0);
}
