// Scoring keys and accumulating values on the codes of the polar and turbo codecs, against q8_0 keys and
// q4_0 values in the same iterations. Times are the thread's CPU time; every time is also printed as a
// multiple of the read-bandwidth floor (bytes of the rows / one thread's read bandwidth, bandwidth.hpp):
//   x_floor  — time / floor;   x_q8_0 (x_q4_0) — time / the same operation on q8_0 keys (q4_0 values).
// 32 k rows of head_dim 128 per kv head, 1 and 4 queries per pass (4 = a GQA group sharing the kv head),
// over 40 kv heads in separate memory, so a pass reads ≥ 64 MB from DRAM (more than the last-level cache)
// as a decode step over a whole model does.
//   ./build/bench/kvq_bench --benchmark_filter=PolarTurbo
#include <benchmark/benchmark.h>

#include <algorithm>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "bandwidth.hpp"
#include "kvq/codec.hpp"

namespace {

constexpr int kDim = 128;
constexpr size_t kRows = 32768;
constexpr int kHeads = 40;

struct Rows {
    kvq::Codec codec;
    std::vector<uint8_t> bytes;
    std::vector<float> queries, weights;
    std::vector<uint8_t> prep;
};

std::vector<float> gaussian(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    return x;
}

Rows make_rows(const std::string& spec, int n_q) {
    Rows r{kvq::Codec::make(spec, kDim), {}, gaussian(size_t(n_q) * kDim, 2), {}, {}};
    const auto x = gaussian(kRows * kDim, 1);
    const size_t head_bytes = kRows * r.codec.row_bytes();
    r.bytes.resize(kHeads * head_bytes);
    r.codec.quantize_rows(x.data(), kRows, r.bytes.data());
    for (int h = 1; h < kHeads; ++h) std::copy_n(r.bytes.data(), head_bytes, r.bytes.data() + h * head_bytes);
    r.prep.resize(size_t(n_q) * r.codec.query_bytes());
    r.codec.prepare_queries(r.queries.data(), n_q, r.prep.data());
    r.weights = gaussian(size_t(n_q) * kRows, 3);
    for (float& w : r.weights) w = w * w / kRows;
    return r;
}

double thread_seconds() {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// One pass over every head: scores (keys) or acc += w·v (values), with prepare/finish once per head.
// Returns this thread's CPU seconds: on a shared machine it excludes the time other processes had the
// core, which wall time does not.
double pass_seconds(Rows& r, int n_q, bool values, std::vector<float>& out) {
    const size_t head_bytes = kRows * r.codec.row_bytes();
    const double t0 = thread_seconds();
    for (int h = 0; h < kHeads; ++h) {
        const uint8_t* rows = r.bytes.data() + h * head_bytes;
        if (values) {
            out.assign(size_t(n_q) * kDim, 0.0f);
            r.codec.accumulate_rows(r.weights.data(), kRows, n_q, rows, kRows, out.data());
            r.codec.finish_accumulate(out.data(), n_q);
        } else {
            out.resize(size_t(n_q) * kRows);
            r.codec.prepare_queries(r.queries.data(), n_q, r.prep.data());
            r.codec.score_rows(r.prep.data(), n_q, rows, kRows, out.data(), kRows);
        }
        benchmark::DoNotOptimize(out.data());
    }
    return thread_seconds() - t0;
}

// Each iteration times a pass of the codec and a pass of the baseline (q8_0 keys, q4_0 values) back to
// back, so their ratio sees the same machine state.
void run(benchmark::State& state, const std::string& spec, bool values) {
    const int n_q = static_cast<int>(state.range(0));
    Rows r = make_rows(spec, n_q);
    Rows base = make_rows(values ? "q4_0" : "q8_0", n_q);
    std::vector<float> out;
    double total = 0, total_base = 0;
    for (auto _ : state) {
        const double s = pass_seconds(r, n_q, values, out);
        total_base += pass_seconds(base, n_q, values, out);
        state.SetIterationTime(s);
        total += s;
    }
    const double per_pass = total / state.iterations();
    const double bytes = double(kHeads) * kRows * r.codec.row_bytes();
    state.SetBytesProcessed(int64_t(bytes) * state.iterations());
    state.counters["bits"] = r.codec.bits_per_value();
    state.counters["ns/row"] = per_pass * 1e9 / (double(kHeads) * kRows);
    state.counters["x_floor"] = per_pass / (bytes / kvq::bench::read_bandwidth(1));
    state.counters[values ? "x_q4_0" : "x_q8_0"] = total / total_base;
}

void register_all() {
    for (const char* spec : {"q8_0", "q4_0", "polar", "polar:budget=4.125", "turbo3", "turbo4", "turbo3.5", "turbo4_qjl"}) {
        const std::string s(spec);
        benchmark::RegisterBenchmark(("PolarTurbo/score/" + s).c_str(), [s](benchmark::State& st) { run(st, s, false); })
            ->Arg(1)->Arg(4)->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
    for (const char* spec : {"q4_0", "q8_0", "polar", "turbo3", "turbo4"}) {
        const std::string s(spec);
        benchmark::RegisterBenchmark(("PolarTurbo/accumulate/" + s).c_str(), [s](benchmark::State& st) { run(st, s, true); })
            ->Arg(1)->Arg(4)->UseManualTime()->Unit(benchmark::kMicrosecond);
    }
}

const int kRegistered = (register_all(), 0);

}  // namespace
