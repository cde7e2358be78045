// Decode attention with polar and turbo keys (and values) against q8_0 keys, through KVCache::attend: one
// step of one Llama-3-8B layer (32 query heads, 8 kv heads, head_dim 128, so 4 queries per kv head) at 32k
// tokens, one thread. Each iteration runs the step on the codec pair's cache and on the q8_0/q4_0 cache
// back to back and takes the process CPU time of each, so the ratio sees the same machine state.
//   x_q8_0   time ÷ time of the q8_0-key / q4_0-value cache (the target for turbo4 and polar keys: ≤ 1.5)
//   x_floor  time ÷ (bytes the step reads ÷ one thread's read bandwidth, bandwidth.hpp)
//   ./build/bench/kvq_bench --benchmark_filter=PolarTurboDecode
#include <benchmark/benchmark.h>

#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bandwidth.hpp"
#include "kvq/cache.hpp"

namespace {

constexpr int kKvHeads = 8, kHeads = 32, kHeadDim = 128;
constexpr size_t kContext = size_t(32) << 10;

double process_seconds() {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

struct Filled {
    std::unique_ptr<kvq::KVCache> cache;
    kvq::SequenceId seq = 0;
};

Filled filled_cache(const std::string& key, const std::string& value) {
    kvq::CacheConfig cfg;
    cfg.n_kv_heads = kKvHeads;
    cfg.n_heads = kHeads;
    cfg.head_dim = kHeadDim;
    cfg.key_codec = key;
    cfg.value_codec = value;
    Filled f{std::make_unique<kvq::KVCache>(cfg), 0};
    f.seq = f.cache->add_sequence();
    constexpr size_t kChunk = 4096;  // random tokens appended over and over: content does not change speed
    std::mt19937 rng(42);
    std::normal_distribution<float> normal;
    std::vector<float> k(kChunk * kKvHeads * kHeadDim), v(k.size());
    for (auto& x : k) x = normal(rng);
    for (auto& x : v) x = normal(rng);
    for (size_t n = 0; n < kContext; n += kChunk) f.cache->append(0, f.seq, k.data(), v.data(), kChunk);
    return f;
}

double step_seconds(const Filled& f, const std::vector<float>& q, std::vector<float>& out) {
    const double t0 = process_seconds();
    f.cache->attend(0, f.seq, q.data(), out.data());
    benchmark::DoNotOptimize(out.data());
    return process_seconds() - t0;
}

void BM_PolarTurboDecode(benchmark::State& state, const std::string& key, const std::string& value) {
    static Filled baseline;  // q8_0/q4_0, built once
    if (!baseline.cache) baseline = filled_cache("q8_0", "q4_0");
    const Filled f = filled_cache(key, value);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> q(kHeads * kHeadDim), out(q.size());
    for (auto& x : q) x = normal(rng);
    step_seconds(f, q, out);  // warm-up
    step_seconds(baseline, q, out);
    double total = 0, total_base = 0;
    for (auto _ : state) {
        const double s = step_seconds(f, q, out);
        total_base += step_seconds(baseline, q, out);
        state.SetIterationTime(s);
        total += s;
    }
    const double per_step = total / static_cast<double>(state.iterations());
    const double bytes = f.cache->bytes_per_token() * static_cast<double>(kContext);
    state.counters["bytes/token"] = f.cache->bytes_per_token();
    state.counters["x_floor"] = per_step / (bytes / kvq::bench::read_bandwidth(1));
    state.counters["x_q8_0"] = total / total_base;
}

const bool registered = [] {
    const std::pair<const char*, const char*> pairs[] = {{"q8_0", "q4_0"},   {"turbo4", "q4_0"},
                                                         {"polar", "q4_0"},  {"turbo3.5", "q4_0"},
                                                         {"turbo3", "q4_0"}, {"turbo4", "turbo4"},
                                                         {"polar", "polar"}, {"polar:budget=4.125", "q4_0"}};
    for (const auto& [key, value] : pairs) {
        const std::string name = std::string("PolarTurboDecode/") + key + "/" + value + "/32k";
        benchmark::RegisterBenchmark(name.c_str(), BM_PolarTurboDecode, std::string(key), std::string(value))
            ->UseManualTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(0.5);
    }
    return true;
}();

}  // namespace
