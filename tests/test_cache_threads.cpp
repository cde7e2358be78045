// The thread-safety contract of KVCache: different sequences may be appended to, attended, forked from
// and truncated from different threads at once; add_sequence, fork and remove are safe alongside.
// Results must be exactly those of the same operations run on one thread (the split of one attend
// across the cache's own threads is fixed, so it is deterministic too).
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "cache_model.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SealPolicy;

namespace {

CacheConfig config(SealPolicy seal) {
    CacheConfig cfg;
    cfg.n_layers = 2;
    cfg.n_kv_heads = 2;
    cfg.n_heads = 8;
    cfg.head_dim = 64;
    cfg.block_tokens = 16;
    cfg.seal = seal;
    cfg.threads = 2;  // attend calls also share the cache's worker
    return cfg;
}

constexpr size_t kRow = 2 * 64;

// One sequence's life: a prompt, then decode steps of append + attend on both layers.
std::vector<float> run_sequence(KVCache& cache, uint64_t seed) {
    std::vector<float> k, v;
    kvq::test::random_tokens(400, 2, 64, seed, k, v);
    const auto q = kvq::test::gaussian(8 * 64, seed + 1);
    std::vector<float> outs, out(q.size());
    const auto seq = cache.add_sequence();
    for (int layer = 0; layer < 2; ++layer) cache.append(layer, seq, k.data(), v.data(), 300);
    for (size_t t = 300; t < 400; ++t) {
        for (int layer = 0; layer < 2; ++layer) {
            cache.append(layer, seq, &k[t * kRow], &v[t * kRow], 1);
            cache.attend(layer, seq, q.data(), out.data());
            outs.insert(outs.end(), out.begin(), out.end());
        }
        if (t % 37 == 0) {  // a rollback of the last 3 tokens, then the same tokens again
            cache.truncate(seq, t - 2);
            for (int layer = 0; layer < 2; ++layer) cache.append(layer, seq, &k[(t - 2) * kRow], &v[(t - 2) * kRow], 3);
        }
    }
    cache.remove(seq);
    return outs;
}

}  // namespace

TEST_CASE("appends and attends on different sequences from several threads give the one-thread results") {
    for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
        constexpr int kThreads = 4;
        std::vector<std::vector<float>> serial(kThreads), parallel(kThreads);
        {
            KVCache cache(config(seal));
            for (int i = 0; i < kThreads; ++i) serial[i] = run_sequence(cache, 1000 + i);
        }
        KVCache cache(config(seal));
        std::vector<std::thread> threads;
        for (int i = 0; i < kThreads; ++i) {
            threads.emplace_back([&, i] { parallel[i] = run_sequence(cache, 1000 + i); });
        }
        for (auto& t : threads) t.join();
        for (int i = 0; i < kThreads; ++i) CHECK(parallel[i] == serial[i]);
        CHECK(cache.pool_stats().blocks_used == 0);
        CHECK(cache.bytes_used() == 0);
    }
}

TEST_CASE("forks, appends to the forks and removes while other threads read the parent") {
    for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
        KVCache cache(config(seal));
        const auto parent = cache.add_sequence();
        std::vector<float> k, v;
        kvq::test::random_tokens(600, 2, 64, 77, k, v);
        cache.append(0, parent, k.data(), v.data(), 501);  // ends mid-block: forks copy on write
        const auto q = kvq::test::gaussian(8 * 64, 78);
        std::vector<float> baseline(q.size());
        cache.attend(0, parent, q.data(), baseline.data());

        std::atomic<bool> stop{false};
        std::atomic<int> mismatches{0}, reads{0}, forks{0};
        std::vector<std::thread> threads;
        for (int r = 0; r < 2; ++r) {
            threads.emplace_back([&] {
                std::vector<float> out(q.size());
                do {  // at least one read each, however late the scheduler starts this thread
                    cache.attend(0, parent, q.data(), out.data());
                    mismatches += out != baseline;
                    ++reads;
                } while (!stop);
            });
        }
        for (int f = 0; f < 2; ++f) {
            threads.emplace_back([&, f] {
                std::vector<float> out(q.size());
                for (int i = 0; i < 15; ++i) {
                    const auto child = cache.fork(parent);
                    cache.append(0, child, &k[(501 + i + f) * kRow], &v[(501 + i + f) * kRow], 40);
                    cache.attend(0, child, q.data(), out.data());
                    cache.truncate(child, 300);
                    const auto grandchild = cache.fork(child);
                    cache.remove(child);
                    cache.append(0, grandchild, k.data(), v.data(), 5);
                    cache.remove(grandchild);
                    ++forks;
                }
            });
        }
        for (size_t i = 2; i < threads.size(); ++i) threads[i].join();
        stop = true;
        threads[0].join();
        threads[1].join();
        CHECK(forks == 30);
        CHECK(reads > 0);
        CHECK(mismatches == 0);
        CHECK(cache.sequences() == std::vector<kvq::SequenceId>{parent});
        std::vector<float> out(q.size());
        cache.attend(0, parent, q.data(), out.data());
        CHECK(out == baseline);
        CHECK(cache.pool_stats().blocks_shared == 0);
    }
}
