// kvq::attend_rows, the path every llama.cpp flash attention takes through the ggml backend: rows of a
// ggml KV tensor [head_dim, n_kv_heads, n_ctx] (q8_0 keys, q4_0 values, or f16 both), with the shapes a
// decode step (one query row) and a prefill chunk (512 query rows, a causal f16 mask) give it.
// Shapes: Gemma 3 270M's layer (4 query heads, 1 kv head, head_dim 256) and Llama 3 8B's (32 / 8 / 128).
//
// Counters, measured in this run:
//   x_floor  time ÷ (bytes the call reads ÷ read bandwidth of that many threads): 1.0 is the floor
//
//   ./build/bench/kvq_bench --benchmark_filter=attend_rows
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bandwidth.hpp"
#include "kvq/attention.hpp"
#include "kvq/codec.hpp"

namespace {

struct Shape {
    const char* name;
    int n_heads, n_kv_heads, head_dim;
};
constexpr Shape kShapes[] = {{"gemma3-270m", 4, 1, 256}, {"llama3-8b", 32, 8, 128}};
constexpr const char* kPairs[][2] = {{"q8_0", "q4_0"}, {"f16", "f16"}};

// The tensor's rows: token t, kv head h at t·token_stride + h·row_bytes (ggml's nb[1], nb[2]).
std::vector<uint8_t> rows_of(const kvq::Codec& c, size_t n, int n_kv, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal;
    std::vector<float> x(size_t(4096) * n_kv * c.head_dim());
    for (auto& v : x) v = normal(rng);
    std::vector<uint8_t> out(n * n_kv * c.row_bytes());
    for (size_t t = 0; t < n; t += 4096) {
        const size_t m = std::min<size_t>(4096, n - t);
        c.quantize_rows(x.data(), m * n_kv, out.data() + t * n_kv * c.row_bytes());
    }
    return out;
}

void BM_AttendRows(benchmark::State& state, const Shape& s, int pair, size_t ctx, size_t n_rows, int threads) {
    const auto keys = kvq::Codec::make(kPairs[pair][0], s.head_dim);
    const auto values = kvq::Codec::make(kPairs[pair][1], s.head_dim);
    const auto k = rows_of(keys, ctx, s.n_kv_heads, 1), v = rows_of(values, ctx, s.n_kv_heads, 2);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal;
    std::vector<float> q(n_rows * s.n_heads * s.head_dim), out(q.size());
    for (auto& x : q) x = normal(rng);
    // A causal mask for a prefill chunk at the end of the context (one row per query row).
    std::vector<uint16_t> mask;
    kvq::AttendOptions o;
    o.n_queries = n_rows;
    o.threads = threads;
    if (n_rows > 1) {
        mask.assign(n_rows * ctx, 0);
        for (size_t i = 0; i < n_rows; ++i) {
            for (size_t t = ctx - n_rows + i + 1; t < ctx; ++t) mask[i * ctx + t] = 0xFC00;  // -inf
        }
        o.mask = mask.data();
    }
    const kvq::RowsView kr{k.data()}, vr{v.data()};
    kvq::attend_rows(keys, values, s.n_heads, s.n_kv_heads, q.data(), kr, vr, ctx, out.data(), o);
    for (auto _ : state) {
        kvq::attend_rows(keys, values, s.n_heads, s.n_kv_heads, q.data(), kr, vr, ctx, out.data(), o);
        benchmark::DoNotOptimize(out.data());
    }
    const double bytes = static_cast<double>(k.size() + v.size());
    state.counters["x_floor"] = benchmark::Counter(bytes / kvq::bench::read_bandwidth(threads),
                                                   benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

const int registered = [] {
    for (const Shape& s : kShapes) {
        for (int pair = 0; pair < 2; ++pair) {
            for (const size_t ctx : {size_t(4096), size_t(16384)}) {
                for (const size_t rows : {size_t(1), size_t(512)}) {
                    if (rows > 1 && ctx > 4096) continue;  // prefill: one context is enough
                    for (const int threads : {1, 2}) {
                        const std::string name = std::string("attend_rows/") + s.name + "/" + kPairs[pair][0] + "/" +
                                                 kPairs[pair][1] + "/" + std::to_string(ctx / 1024) + "k/rows:" +
                                                 std::to_string(rows) + "/threads:" + std::to_string(threads);
                        benchmark::RegisterBenchmark(name.c_str(), BM_AttendRows, s, pair, ctx, rows, threads)
                            ->Unit(benchmark::kMicrosecond)
                            ->MinTime(0.3)
                            ->UseRealTime();
                    }
                }
            }
        }
    }
    return 0;
}();

}  // namespace
