// Batched decode: 64 sequences of 4k tokens (a serving batch), one Llama-3-8B layer (32 query heads, 8 kv
// heads, head_dim 128), q8_0/q4_0 and f16/f16, 2 threads: one KVCache::attend_batch call against 64
// KVCache::attend calls on the same cache, and against the read-bandwidth floor, all in one run.
//
// Counters:
//   x_floor        time ÷ (bytes read ÷ 2-thread read bandwidth): 1.0 is the floor
//   vs_single      time of the 64 single calls ÷ this time (> 1: the batch call is faster)
//
//   ./build/bench/kvq_bench --benchmark_filter=decode_batch
#include <benchmark/benchmark.h>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bandwidth.hpp"
#include "kvq/cache.hpp"

namespace {

constexpr int kSeqs = 64, kThreads = 2, kKvHeads = 8, kHeads = 32, kHeadDim = 128;
constexpr size_t kTokens = 4096;

struct Batch {
    std::unique_ptr<kvq::KVCache> cache;
    std::vector<kvq::SequenceId> seqs;
};

Batch& batch_for(const char* key, const char* value) {
    static std::map<std::string, Batch> made;
    Batch& b = made[std::string(key) + "/" + value];
    if (b.cache) return b;
    made.clear();  // one batch in memory at a time
    Batch& fresh = made[std::string(key) + "/" + value];
    kvq::CacheConfig cfg;
    cfg.n_kv_heads = kKvHeads;
    cfg.n_heads = kHeads;
    cfg.head_dim = kHeadDim;
    cfg.key_codec = key;
    cfg.value_codec = value;
    cfg.threads = kThreads;
    fresh.cache = std::make_unique<kvq::KVCache>(cfg);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    std::vector<float> k(kTokens * kKvHeads * kHeadDim), v(k.size());
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (int i = 0; i < kSeqs; ++i) {
        const auto s = fresh.cache->add_sequence();
        fresh.cache->append(0, s, k.data(), v.data(), kTokens);
        fresh.seqs.push_back(s);
    }
    return fresh;
}

std::map<std::string, double>& single_seconds() {
    static std::map<std::string, double> t;
    return t;
}

void BM_DecodeBatch(benchmark::State& state, const char* key, const char* value, bool batched) {
    Batch& b = batch_for(key, value);
    std::vector<float> q(size_t(kSeqs) * kHeads * kHeadDim, 0.25f), out(q.size());
    const size_t vec = size_t(kHeads) * kHeadDim;
    auto step = [&] {
        if (batched) {
            b.cache->attend_batch(0, b.seqs, q.data(), out.data());
        } else {
            for (int i = 0; i < kSeqs; ++i) b.cache->attend(0, b.seqs[i], q.data() + i * vec, out.data() + i * vec);
        }
    };
    step();  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (auto _ : state) {
        step();
        benchmark::DoNotOptimize(out.data());
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(state.iterations());
    const double bytes = b.cache->bytes_per_token() * static_cast<double>(kTokens) * kSeqs;
    state.counters["x_floor"] = seconds / (bytes / kvq::bench::read_bandwidth(kThreads));
    const std::string name = std::string(key) + "/" + value;
    if (!batched) single_seconds()[name] = seconds;
    if (const auto it = single_seconds().find(name); batched && it != single_seconds().end()) {
        state.counters["vs_single"] = it->second / seconds;
    }
}

const bool registered = [] {
    const char* pairs[][2] = {{"q8_0", "q4_0"}, {"f16", "f16"}};
    for (const auto& p : pairs) {
        for (bool batched : {false, true}) {  // single calls first: the batch is compared with them
            const std::string name = std::string("decode_batch/") + p[0] + "/" + p[1] + "/64x4k/threads:2/" +
                                     (batched ? "attend_batch" : "64_attend_calls");
            benchmark::RegisterBenchmark(name.c_str(), BM_DecodeBatch, p[0], p[1], batched)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond)
                ->MinTime(0.5);
        }
    }
    return true;
}();

}  // namespace
