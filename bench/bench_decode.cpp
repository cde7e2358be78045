// One decode step of one layer through KVCache::attend, with the Llama-3-8B layer shape (32 query heads,
// 8 kv heads, head_dim 128), at 4k, 32k and 128k tokens, on 1 and 2 threads, for several K/V codec pairs.
//
// Counters, all measured in this run:
//   x_floor  time ÷ (bytes the step reads ÷ read bandwidth of that many threads): 1.0 is the physical floor
//   vs_f16   time of the f16/f16 cache at the same length and threads ÷ this time (> 1: faster than f16)
//   GB/s     bytes read per second
//   GB/s/thread  the same per thread: at 4k tokens (7 MB of q8_0/q4_0, 16 MB of f16) the cache sits in
//            the last-level cache, so the 4k rows are the kernels' compute ceiling, the 32k and 128k rows
//            the from-memory figure, and floor_GB/s the read bandwidth of that many threads (the floor)
// At 4k tokens the quantized caches fit in the last-level cache, so they can beat the DRAM floor.
//
//   ./build/bench/kvq_bench --benchmark_filter=decode
#include <benchmark/benchmark.h>

#include <chrono>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bandwidth.hpp"
#include "kvq/cache.hpp"
#include "kvq/simd.hpp"

namespace {

struct CodecPair {
    const char* key;
    const char* value;
    const char* name = nullptr;  // the value's part of the benchmark name, if not `value`
    bool int8_value_weights = false;  // CacheConfig::int8_value_weights
    bool center_keys = false;         // CacheConfig::center_keys (the key's name gets "+center")
    bool key_scales = false;          // CacheConfig::key_scales, channel weights in [0.5, 2] (name: "+ks")
};
// f16 first: every other pair is compared with it. q4_0-i8w: q4_0 values on int8 weights.
constexpr CodecPair kPairs[] = {{"f16", "f16"},   {"f32", "f32"},       {"q8_0", "q4_0"},
                                {"q8_0", "q8_0"}, {"q4_0+rot", "q4_0"}, {"q8_0", "q4_0+rot"},
                                {"q8_0", "q4_0", "q4_0-i8w", true},
                                // Block-level key formats (lib/codec/key_formats.hpp): side data per block.
                                {"q4_0+rot", "q4_0", nullptr, false, true}, {"chan4", "q4_0"},
                                {"q4_0+rot+sink1", "q4_0", nullptr, false, true},
                                // iq4_nl (ggml's non-uniform 4-bit levels) as keys and as values.
                                {"iq4_nl", "iq4_nl"}, {"q8_0", "iq4_nl"},
                                // The rungs of docs/eval.md's --budget allocations (issue 39), with key scales.
                                {"q4_0+rot", "q4_0+rot", nullptr, false, true, true},
                                {"iq4_nls+rot", "turbo4", nullptr, false, true, true},
                                {"turbo4", "turbo4", nullptr, false, true, true},
                                {"turbo3", "turbo3", nullptr, false, true, true},
                                {"tcq3", "tcq3", nullptr, false, true, true}};
constexpr size_t kContexts[] = {size_t(128) << 10, size_t(32) << 10, size_t(4) << 10};  // longest first
constexpr int kThreads[] = {1, 2};
constexpr int kKvHeads = 8, kHeads = 32, kHeadDim = 128;

kvq::CacheConfig llama3_layer(const CodecPair& pair, int threads) {
    kvq::CacheConfig cfg;
    cfg.n_layers = 1;
    cfg.n_kv_heads = kKvHeads;
    cfg.n_heads = kHeads;
    cfg.head_dim = kHeadDim;
    cfg.key_codec = pair.key;
    cfg.value_codec = pair.value;
    cfg.threads = threads;
    cfg.int8_value_weights = pair.int8_value_weights;
    cfg.center_keys = pair.center_keys;
    if (pair.key_scales) {
        cfg.key_scales.resize(size_t(kKvHeads) * kHeadDim);
        for (size_t i = 0; i < cfg.key_scales.size(); ++i) cfg.key_scales[i] = 0.5f + 1.5f * float((i * 37) % 101) / 100.0f;
    }
    return cfg;
}

// One cache at a time (128k tokens of f32 K and V are 1 GiB): kept between benchmarks of the same pair and
// thread count, which run longest context first, so a shorter one only truncates.
struct BuiltCache {
    int pair = -1, threads = 0;
    kvq::SimdLevel level = kvq::SimdLevel::scalar;  // the level it was made at: its key layout may depend on it
    std::unique_ptr<kvq::KVCache> cache;
    kvq::SequenceId seq = 0;
};

kvq::KVCache& cache_for(int pair, int threads, size_t ctx, kvq::SequenceId& seq) {
    static BuiltCache built;
    if (built.pair != pair || built.threads != threads || built.level != kvq::simd_level() ||
        built.cache->n_tokens(built.seq) < ctx) {
        built.cache.reset();
        built.cache = std::make_unique<kvq::KVCache>(llama3_layer(kPairs[pair], threads));
        built.pair = pair;
        built.threads = threads;
        built.level = kvq::simd_level();
        built.seq = built.cache->add_sequence();
        // A few thousand random tokens, appended over and over: content does not change the speed.
        constexpr size_t kChunk = 4096;
        std::mt19937 rng(42);
        std::normal_distribution<float> normal;
        std::vector<float> k(kChunk * kKvHeads * kHeadDim), v(k.size());
        for (auto& x : k) x = normal(rng);
        for (auto& x : v) x = normal(rng);
        for (size_t n = 0; n < ctx; n += kChunk) {
            built.cache->append(0, built.seq, k.data(), v.data(), std::min(kChunk, ctx - n));
        }
    }
    if (built.cache->n_tokens(built.seq) > ctx) built.cache->truncate(built.seq, ctx);
    seq = built.seq;
    return *built.cache;
}

std::map<std::pair<size_t, int>, double>& f16_seconds() {
    static std::map<std::pair<size_t, int>, double> t;
    return t;
}

// Seconds per decode step of the benchmark's iterations (after one warm-up step).
double time_steps(benchmark::State& state, const kvq::KVCache& cache, kvq::SequenceId seq) {
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> q(kHeads * kHeadDim), out(q.size());
    for (auto& x : q) x = normal(rng);
    cache.attend(0, seq, q.data(), out.data());
    const auto t0 = std::chrono::steady_clock::now();
    for (auto _ : state) {
        cache.attend(0, seq, q.data(), out.data());
        benchmark::DoNotOptimize(out.data());
    }
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / static_cast<double>(state.iterations());
}

void BM_Decode(benchmark::State& state, int pair, size_t ctx, int threads) {
    kvq::SequenceId seq;
    const kvq::KVCache& cache = cache_for(pair, threads, ctx, seq);
    const double seconds = time_steps(state, cache, seq);

    const double bytes = cache.bytes_per_token() * static_cast<double>(ctx);  // one layer: every row once
    const double floor = bytes / kvq::bench::read_bandwidth(threads);
    state.counters["x_floor"] = seconds / floor;
    state.counters["GB/s"] = bytes / seconds / 1e9;
    state.counters["GB/s/thread"] = bytes / seconds / 1e9 / threads;
    state.counters["floor_GB/s"] = kvq::bench::read_bandwidth(threads) / 1e9;
    if (pair == 0) f16_seconds()[{ctx, threads}] = seconds;
    if (const auto it = f16_seconds().find({ctx, threads}); it != f16_seconds().end()) {
        state.counters["vs_f16"] = it->second / seconds;
    }
}

std::string context_name(size_t ctx) { return std::to_string(ctx >> 10) + "k"; }

// The same decode step at each SIMD level this CPU runs, levels next to each other for each pair and
// context, each reported against the default level's time in this run
// (vs_default > 1: faster than the default). Which level should be the default is read off this. The cache
// is made again at each level, as a user's would be (q8_0 keys are kept in groups only at levels with a
// kernel for them).
std::map<std::pair<int, size_t>, double>& default_seconds() {
    static std::map<std::pair<int, size_t>, double> t;
    return t;
}

void BM_DecodeLevel(benchmark::State& state, kvq::SimdLevel level, int pair, size_t ctx, int threads) {
    const kvq::SimdLevel before = kvq::simd_level();
    kvq::force_simd_level(level);
    if (kvq::simd_level() != level) {
        kvq::force_simd_level(before);
        state.SkipWithError("this level failed its self-check (kvq selftest)");
        return;
    }
    kvq::SequenceId seq;
    const kvq::KVCache& cache = cache_for(pair, threads, ctx, seq);
    const double seconds = time_steps(state, cache, seq);
    kvq::force_simd_level(before);
    const double bytes = cache.bytes_per_token() * static_cast<double>(ctx);
    state.counters["x_floor"] = seconds / (bytes / kvq::bench::read_bandwidth(threads));
    if (level == before) default_seconds()[{pair, ctx}] = seconds;
    if (const auto it = default_seconds().find({pair, ctx}); it != default_seconds().end()) {
        state.counters["vs_default"] = it->second / seconds;
    }
}

std::string value_name(const CodecPair& p) { return p.name ? p.name : p.value; }
std::string key_name(const CodecPair& p) {
    return std::string(p.key) + (p.center_keys ? "+center" : "") + (p.key_scales ? "+ks" : "");
}

const bool registered_levels = [] {
    const kvq::SimdLevel def = kvq::simd_level();
    std::vector<kvq::SimdLevel> levels{def};  // the default first: the others are compared with it
    for (auto l : kvq::available_simd_levels()) {
        if (l != def && l != kvq::SimdLevel::scalar) levels.push_back(l);
    }
    for (int p : {0, 2, 3, 6}) {  // f16/f16, q8_0/q4_0, q8_0/q8_0, q8_0/q4_0-i8w
        for (size_t ctx : {kContexts[0], kContexts[1]}) {
            for (auto level : levels) {
                const std::string name = std::string("decode_level/") + key_name(kPairs[p]) + "/" + value_name(kPairs[p]) + "/" +
                                         context_name(ctx) + "/threads:2/" + std::string(kvq::simd_level_name(level));
                benchmark::RegisterBenchmark(name.c_str(), BM_DecodeLevel, level, p, ctx, 2)
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond)
                    ->MinTime(0.3);
            }
        }
    }
    return true;
}();

const bool registered = [] {
    for (int p = 0; p < static_cast<int>(std::size(kPairs)); ++p) {
        for (int threads : kThreads) {
            for (size_t ctx : kContexts) {
                const std::string name = std::string("decode/") + key_name(kPairs[p]) + "/" + value_name(kPairs[p]) + "/" +
                                         context_name(ctx) + "/threads:" + std::to_string(threads);
                benchmark::RegisterBenchmark(name.c_str(), BM_Decode, p, ctx, threads)
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond)
                    ->MinTime(0.3);
            }
        }
    }
    return true;
}();

}  // namespace
