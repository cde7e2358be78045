// The read-bandwidth probe, and a benchmark that reports it. The summing loop is compiled for the widest
// vector unit the CPU has (GCC/Clang target_clones): narrower loads would understate the floor.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "bandwidth.hpp"

namespace kvq::bench {
namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
__attribute__((noinline)) uint64_t sum_words(const uint64_t* p, size_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    for (; i < n; ++i) a += p[i];
    return a ^ b ^ c ^ d;
}

double measure(int threads, size_t bytes, int repeats) {
    const size_t words = bytes / sizeof(uint64_t);
    std::vector<uint64_t> buf(words);
    for (size_t i = 0; i < words; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
    std::vector<uint64_t> sinks(threads);
    double best = 0;
    for (int r = 0; r < repeats; ++r) {
        const auto t0 = std::chrono::steady_clock::now();
        std::vector<std::thread> pool;
        const size_t part = words / threads;
        for (int t = 0; t < threads; ++t) {
            const size_t begin = t * part, end = t + 1 == threads ? words : begin + part;
            pool.emplace_back([&, t, begin, end] { sinks[t] += sum_words(buf.data() + begin, end - begin); });
        }
        for (auto& th : pool) th.join();
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        best = std::max(best, double(bytes) / s);
    }
    benchmark::DoNotOptimize(sinks.data());
    return best;
}

}  // namespace

double read_bandwidth(int threads, size_t bytes, int repeats) {
    static std::mutex mu;
    static std::map<int, double> cache;
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(threads);
    if (it == cache.end()) it = cache.emplace(threads, measure(threads, bytes, repeats)).first;
    return it->second;
}

namespace {

void BM_ReadBandwidth(benchmark::State& state) {
    const int threads = static_cast<int>(state.range(0));
    double bw = 0;
    for (auto _ : state) bw = read_bandwidth(threads);
    state.counters["GB/s"] = bw / 1e9;
}
BENCHMARK(BM_ReadBandwidth)->Arg(1)->Arg(2)->Iterations(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace kvq::bench
