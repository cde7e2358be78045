// Quantizing polar and turbo rows per SIMD level, one thread, head_dim 128: 32 k rows (16 MiB of floats,
// read once per pass from beyond L2) through Codec::quantize_rows, with NanPolicy::propagate (the
// kernel alone: rotation, norm, codebook search, bit packing) and with the default NanPolicy::reject
// (plus the finiteness and norm check of the input). Counters from the fastest pass: rows/s and x_floor
// (the time ÷ the time to read the input at one thread's read bandwidth, bandwidth.hpp).
//   ./build/bench/kvq_bench --benchmark_filter='quantize_rotated/'
//   ./build/bench/kvq_bench --benchmark_filter='quantize_rotated/(turbo4|polar)/'
//   ./build/bench/kvq_bench --benchmark_filter='quantize_rotated/(turbo3|tcq3)/'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "bandwidth.hpp"
#include "kvq/codec.hpp"
#include "kvq/simd.hpp"
#include "simd/dispatch.hpp"

namespace kvq::bench {
namespace {

constexpr int kDim = 128;
constexpr size_t kRows = 32768;

std::vector<float> normal_rows(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    return x;
}

// This thread's CPU time: on a shared machine it leaves out the time other processes had the core.
double thread_seconds() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

void quantize_rotated(benchmark::State& state, const std::string& spec, SimdLevel level, NanPolicy nan) {
    detail::LevelOverride at(level);
    const Codec codec = Codec::make(spec, kDim);
    static const std::vector<float> x = normal_rows(kRows * kDim, 1);
    std::vector<uint8_t> out(kRows * codec.row_bytes());
    const double floor_s = double(x.size() * sizeof(float)) / read_bandwidth(1);
    double best = 1e300;
    for (auto _ : state) {
        const double t0 = thread_seconds();
        codec.quantize_rows(x.data(), kRows, out.data(), 0, nan);
        best = std::min(best, thread_seconds() - t0);
        benchmark::DoNotOptimize(out.data());
    }
    state.counters["rows/s"] = benchmark::Counter(double(kRows) / best);
    state.counters["x_floor"] = benchmark::Counter(best / floor_s);
}

void register_all() {
    for (const char* spec : {"turbo2", "turbo3", "turbo4", "turbo4:scale=norm", "turbo2.5", "turbo3.5", "turbo3_qjl",
                             "tcq2", "tcq3", "polar", "polar:budget=3", "polar:budget=3.875", "q4_0+rot",
                             "q4_0"}) {
        for (auto level : available_simd_levels()) {
            for (NanPolicy nan : {NanPolicy::propagate, NanPolicy::reject}) {
                const std::string name = std::string("quantize_rotated/") + spec + "/" + std::string(simd_level_name(level)) +
                                         (nan == NanPolicy::reject ? "/checked" : "/kernel");
                benchmark::RegisterBenchmark(name.c_str(), quantize_rotated, std::string(spec), level, nan)
                    ->Unit(benchmark::kMillisecond)
                    ->MinTime(0.2);
            }
        }
    }
}

const int kRegistered = (register_all(), 0);

}  // namespace
}  // namespace kvq::bench
