// Codec kernels per codec and per SIMD level, from memory, one thread: quantize (16 M floats), dequantize,
// score (head_dim 128, a GQA group of 4 queries prepared once, keys streamed from a buffer far larger than
// the caches, scores written to a small reused buffer as decode attention does) and accumulate.
// Counters (from the fastest pass): values/s, bytes/s (bytes the kernel reads) and x_floor, the time as a
// multiple of the time the machine needs just to read those bytes (kvq::bench::read_bandwidth, measured
// in the same run): 1.0 is the physical floor, 1.67 is 60% of the read bandwidth.
//
//   ./build/bench/kvq_bench --benchmark_filter='codec/score/(q8_0|q4_0|f16)/'
//   ./build/bench/kvq_bench --benchmark_filter='codec/(score|accumulate)_cached/(q8_0|q4_0)/'   (decode-shaped, in L2)
//   ./build/bench/kvq_bench --benchmark_filter='codec/score(_groups)?_cached/q8_0/'  (q8_0 keys in rows and in groups)
//   ./build/bench/kvq_bench --benchmark_filter='^softmax/'       (the online softmax's block update, per level)
//   ./build/bench/kvq_bench --benchmark_filter='codec/quantize(_cached|_api)?/(q8_0|q4_0)/'
//   ./build/bench/kvq_bench --benchmark_filter='codec/' --benchmark_format=json > codecs.json
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bandwidth.hpp"
#include "kvq/codec.hpp"
#include "kvq/simd.hpp"
#include "ref/key_groups.hpp"
#include "simd/dispatch.hpp"

namespace kvq::bench {
namespace {

using detail::BlockCodec;
using detail::BlockKernels;

constexpr int kDim = 128;
constexpr size_t kQuantizeValues = size_t(16) << 20;  // 16 M floats = 64 MiB
constexpr size_t kStreamBytes = size_t(256) << 20;    // key/value rows streamed by score and accumulate
constexpr size_t kChunkRows = 512;                     // rows per kernel call in score/accumulate
constexpr int kGroup = 4;                              // queries of one GQA group

struct CodecShape {
    BlockCodec codec;
    std::string name;
    size_t row_bytes, query_bytes;
};

CodecShape shape(BlockCodec c) {
    const auto info = kvq::codec_info(kvq::codec_names().at(static_cast<int>(c)));
    const auto codec = kvq::Codec::make(info.name, kDim);
    return {c, info.name, codec.row_bytes(), codec.query_bytes()};
}

std::vector<float> gaussian(size_t n, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    return x;
}

// Times each pass of the body (wall clock) and sets the counters from the fastest pass, as the bandwidth
// probe keeps its fastest pass: on a shared machine, noise only ever makes a pass slower.
template <class Body>
void run(benchmark::State& state, size_t values, size_t bytes_read, Body&& body, size_t bytes_written = 0) {
    const double floor_s = double(bytes_read) / read_bandwidth(1);
    double best = 1e300;
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        body();
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    state.counters["values/s"] = benchmark::Counter(double(values) / best);
    state.counters["bytes/s"] = benchmark::Counter(double(bytes_read) / best);
    state.counters["x_floor"] = benchmark::Counter(best / floor_s);
    // quantize also writes its blocks: x_floor_rw counts them too (as if written at the read bandwidth)
    if (bytes_written) state.counters["x_floor_rw"] = benchmark::Counter(best / (floor_s * double(bytes_read + bytes_written) / double(bytes_read)));
}

void quantize(benchmark::State& state, CodecShape s, const BlockKernels* k) {
    const size_t rows = kQuantizeValues / kDim;
    const auto x = gaussian(kQuantizeValues, 1);
    std::vector<uint8_t> out(rows * s.row_bytes, 1);
    run(
        state, kQuantizeValues, kQuantizeValues * sizeof(float),
        [&] {
            for (size_t r = 0; r < rows; ++r) k->quantize(x.data() + r * kDim, out.data() + r * s.row_bytes, kDim);
            benchmark::DoNotOptimize(out.data());
        },
        out.size());
}

// The same on 64 K floats (256 KiB, in L2), repeated: the kernel's own speed, not the memory's
// (x_floor there is only a scale, the data never leaves the caches).
void quantize_cached(benchmark::State& state, CodecShape s, const BlockKernels* k) {
    constexpr size_t values = size_t(64) << 10, repeats = 64;
    const size_t rows = values / kDim;
    const auto x = gaussian(values, 1);
    std::vector<uint8_t> out(rows * s.row_bytes, 1);
    run(
        state, values * repeats, values * repeats * sizeof(float),
        [&] {
            for (size_t i = 0; i < repeats; ++i) {
                for (size_t r = 0; r < rows; ++r) k->quantize(x.data() + r * kDim, out.data() + r * s.row_bytes, kDim);
                benchmark::DoNotOptimize(out.data());
            }
        },
        out.size() * repeats);
}

// The public path: Codec::quantize_rows at the active level, with its finiteness check (a second read of
// the input when it is larger than the caches).
void quantize_api(benchmark::State& state, CodecShape s, SimdLevel level) {
    const SimdLevel before = simd_level();
    force_simd_level(level);
    const auto codec = kvq::Codec::make(s.name, kDim);
    const size_t rows = kQuantizeValues / kDim;
    const auto x = gaussian(kQuantizeValues, 1);
    std::vector<uint8_t> out(rows * s.row_bytes, 1);
    run(
        state, kQuantizeValues, kQuantizeValues * sizeof(float),
        [&] {
            codec.quantize_rows(x.data(), rows, out.data());
            benchmark::DoNotOptimize(out.data());
        },
        out.size());
    force_simd_level(before);
}

// 4096 distinct rows, repeated (quantizing 256 MiB with the scalar specification would take seconds).
std::vector<uint8_t> quantized_rows(const CodecShape& s, size_t rows) {
    constexpr size_t distinct = 4096;
    std::vector<uint8_t> bytes(rows * s.row_bytes);
    const auto x = gaussian(distinct * kDim, 2);
    for (size_t r = 0; r < std::min(rows, distinct); ++r)
        detail::scalar_kernels(s.codec).quantize(x.data() + r * kDim, bytes.data() + r * s.row_bytes, kDim);
    for (size_t r = distinct; r < rows; ++r)
        std::memcpy(bytes.data() + r * s.row_bytes, bytes.data() + (r % distinct) * s.row_bytes, s.row_bytes);
    return bytes;
}

void dequantize(benchmark::State& state, CodecShape s, const BlockKernels* k) {
    const size_t rows = kQuantizeValues / kDim;
    const auto bytes = quantized_rows(s, rows);
    std::vector<float> y(kQuantizeValues, 1.0f);
    run(state, kQuantizeValues, bytes.size(), [&] {
        for (size_t r = 0; r < rows; ++r) k->dequantize(bytes.data() + r * s.row_bytes, y.data() + r * kDim, kDim);
        benchmark::DoNotOptimize(y.data());
    });
}

// The rows of a score or accumulate benchmark: `rows` of them, `call_rows` per kernel call, `repeats` times.
struct RowPass {
    size_t rows, call_rows, repeats;
};

// Streamed from memory: a buffer far larger than the caches, 512 rows per call, once.
RowPass streamed(const CodecShape& s) { return {kStreamBytes / s.row_bytes / kChunkRows * kChunkRows, kChunkRows, 1}; }

// As the decode loop calls them, in cache: 4096 rows (a 4k-token context's rows of one kv head; 557 KiB of
// q8_0 keys, in L2), 32 rows per call (one cache block), 64 times over; the kernel's own speed.
constexpr size_t kCachedRows = 4096, kCallRows = 32;
constexpr RowPass kCached{kCachedRows, kCallRows, 64};

// ns per (token, kv head) row for the group of 4 queries, from run's values/s.
void ns_per_row(benchmark::State& state) {
    state.counters["ns/row"] = benchmark::Counter(kDim / state.counters["values/s"].value * 1e9,
                                                  benchmark::Counter::kDefaults, benchmark::Counter::kIs1000);
}

void score_pass(benchmark::State& state, const CodecShape& s, const BlockKernels* k, RowPass p) {
    const auto keys = quantized_rows(s, p.rows);
    const auto q = gaussian(size_t(kGroup) * kDim, 3);
    std::vector<uint8_t> prep(kGroup * s.query_bytes);
    for (int i = 0; i < kGroup; ++i) k->prepare_query(q.data() + i * kDim, prep.data() + i * s.query_bytes, kDim);
    std::vector<float> scores(kGroup * p.call_rows);
    const size_t rows = p.rows * p.repeats;
    run(state, rows * kDim, rows * s.row_bytes, [&] {
        for (size_t i = 0; i < p.repeats; ++i) {
            for (size_t r0 = 0; r0 < p.rows; r0 += p.call_rows) {
                k->score(prep.data(), s.query_bytes, kGroup, keys.data() + r0 * s.row_bytes, s.row_bytes, p.call_rows,
                         kDim, scores.data(), p.call_rows);
                benchmark::DoNotOptimize(scores.data());
            }
        }
    });
}

// q8_0 keys as a cache keeps them where the level has BlockKernels::score_groups: the same rows in groups
// of 16 (lib/ref/key_groups.hpp), 32 rows (2 groups) a call, 4 queries.
void score_groups_cached(benchmark::State& state, CodecShape s, const BlockKernels* k) {
    const RowPass p = kCached;
    const auto rows = quantized_rows(s, p.rows);
    std::vector<uint8_t> groups(rows.size());
    detail::groups_from_rows(rows.data(), s.row_bytes, p.rows, kDim / 32, groups.data());
    const auto q = gaussian(size_t(kGroup) * kDim, 3);
    std::vector<uint8_t> prep(kGroup * s.query_bytes);
    for (int i = 0; i < kGroup; ++i) k->prepare_query(q.data() + i * kDim, prep.data() + i * s.query_bytes, kDim);
    std::vector<float> scores(kGroup * p.call_rows);
    float* out[kGroup];
    for (int i = 0; i < kGroup; ++i) out[i] = scores.data() + i * p.call_rows;
    const size_t n = p.rows * p.repeats;
    run(state, n * kDim, n * s.row_bytes, [&] {
        for (size_t i = 0; i < p.repeats; ++i) {
            for (size_t r0 = 0; r0 < p.rows; r0 += p.call_rows) {
                k->score_groups(prep.data(), s.query_bytes, kGroup, groups.data() + r0 * s.row_bytes,
                                p.call_rows / detail::kGroupRows, kDim, out);
                benchmark::DoNotOptimize(scores.data());
            }
        }
    });
    ns_per_row(state);
}

// op: BlockKernels::accumulate, or accumulate_grid (the cache's q4_0 value accumulation).
using AccumulateOp = decltype(&BlockKernels::accumulate);

void accumulate_pass(benchmark::State& state, const CodecShape& s, const BlockKernels* k, RowPass p,
                     AccumulateOp op = &BlockKernels::accumulate) {
    const auto values = quantized_rows(s, p.rows);
    auto w = gaussian(size_t(kGroup) * p.call_rows, 4);
    for (float& v : w) v = std::fabs(v) * 1e-3f;
    std::vector<float> acc(kGroup * kDim, 0.0f);
    const size_t rows = p.rows * p.repeats;
    run(state, rows * kDim, rows * s.row_bytes, [&] {
        for (size_t i = 0; i < p.repeats; ++i) {
            for (size_t r0 = 0; r0 < p.rows; r0 += p.call_rows) {
                (k->*op)(w.data(), p.call_rows, kGroup, values.data() + r0 * s.row_bytes, s.row_bytes,
                         p.call_rows, kDim, acc.data());
            }
        }
        benchmark::DoNotOptimize(acc.data());
    });
}

void score(benchmark::State& state, CodecShape s, const BlockKernels* k) { score_pass(state, s, k, streamed(s)); }
void accumulate(benchmark::State& state, CodecShape s, const BlockKernels* k) { accumulate_pass(state, s, k, streamed(s)); }
void score_cached(benchmark::State& state, CodecShape s, const BlockKernels* k) {
    score_pass(state, s, k, kCached);
    ns_per_row(state);
}
void accumulate_cached(benchmark::State& state, CodecShape s, const BlockKernels* k) {
    accumulate_pass(state, s, k, kCached);
    ns_per_row(state);
}
void accumulate_grid_cached(benchmark::State& state, CodecShape s, const BlockKernels* k) {
    accumulate_pass(state, s, k, kCached, &BlockKernels::accumulate_grid);
    ns_per_row(state);
}

// The online softmax's block update as the decode loop calls it: 4 queries' 32 scores per block, 4096 blocks
// (scores restored before each call from a copy, which the time includes); ns/row as above.
void softmax_blocks(benchmark::State& state, SimdLevel level) {
    const detail::SoftmaxUpdate update = detail::level_softmax(level);
    constexpr size_t kBlocks = kCachedRows / kCallRows * 32;
    auto all = gaussian(kBlocks * kGroup * kCallRows, 5);
    for (float& v : all) v *= 3.0f;
    std::vector<float> s(kGroup * kCallRows), acc(kGroup * kDim);
    const float offsets[kGroup] = {0.5f, -0.25f, 0.0f, 1.0f};
    run(state, kBlocks * kCallRows * kDim, kBlocks * kGroup * kCallRows * sizeof(float), [&] {
        detail::SoftmaxState st[kGroup];
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (size_t b = 0; b < kBlocks; ++b) {
            std::memcpy(s.data(), all.data() + b * s.size(), s.size() * sizeof(float));
            update(s.data(), kGroup, kCallRows, offsets, 0.088f, st, acc.data(), kDim);
        }
        benchmark::DoNotOptimize(acc.data());
        benchmark::DoNotOptimize(s.data());
    });
    ns_per_row(state);
}

// codec/<op>/<codec>/<level>, for every block codec and every level this CPU runs; softmax/<level>.
const bool registered = [] {
    for (const char* op : {"quantize", "quantize_cached", "quantize_api", "dequantize", "score", "accumulate",
                           "score_cached", "score_groups_cached", "accumulate_cached", "accumulate_grid_cached"}) {
        for (int c = 0; c < static_cast<int>(BlockCodec::count); ++c) {
            const CodecShape s = shape(static_cast<BlockCodec>(c));
            for (SimdLevel level : available_simd_levels()) {
                const BlockKernels* k = detail::level_kernels(s.codec, level);
                if (std::string_view(op) == "accumulate_grid_cached" && !k->accumulate_grid) continue;
                if (std::string_view(op) == "score_groups_cached" && !k->score_groups) continue;
                const std::string name = std::string("codec/") + op + "/" + s.name + "/" +
                                         std::string(simd_level_name(level));
                const std::string o = op;
                benchmark::internal::Benchmark* b = nullptr;
                if (o == "quantize") b = benchmark::RegisterBenchmark(name.c_str(), quantize, s, k);
                if (o == "quantize_cached") b = benchmark::RegisterBenchmark(name.c_str(), quantize_cached, s, k);
                if (o == "quantize_api") b = benchmark::RegisterBenchmark(name.c_str(), quantize_api, s, level);
                if (o == "dequantize") b = benchmark::RegisterBenchmark(name.c_str(), dequantize, s, k);
                if (o == "score") b = benchmark::RegisterBenchmark(name.c_str(), score, s, k);
                if (o == "accumulate") b = benchmark::RegisterBenchmark(name.c_str(), accumulate, s, k);
                if (o == "score_cached") b = benchmark::RegisterBenchmark(name.c_str(), score_cached, s, k);
                if (o == "score_groups_cached") b = benchmark::RegisterBenchmark(name.c_str(), score_groups_cached, s, k);
                if (o == "accumulate_cached") b = benchmark::RegisterBenchmark(name.c_str(), accumulate_cached, s, k);
                if (o == "accumulate_grid_cached") b = benchmark::RegisterBenchmark(name.c_str(), accumulate_grid_cached, s, k);
                b->Unit(benchmark::kMillisecond)->MinTime(0.3);
            }
        }
    }
    for (SimdLevel level : available_simd_levels()) {
        const std::string name = "softmax/" + std::string(simd_level_name(level));
        benchmark::RegisterBenchmark(name.c_str(), softmax_blocks, level)->Unit(benchmark::kMillisecond)->MinTime(0.3);
    }
    return true;
}();

}  // namespace
}  // namespace kvq::bench
