// The sweep's decode timing: each format in a KVCache of the data set's first layers, one decode step at
// the full context, best of a few samples, against f16/f16 in the same run (lib/eval/sweep_parts.hpp).
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>

#include "sweep_parts.hpp"

namespace kvq::detail {
namespace {

// The data set's first `layers` layers in a KVCache of one format, the tokens up to the last query.
std::unique_ptr<KVCache> fill_cache(const KVData& data, int layers, const Prepared& p, size_t n_rows,
                                    const SweepOptions& options) {
    auto cache = std::make_unique<KVCache>(cache_config(data, layers, p.format, options));
    const SequenceId seq = cache->add_sequence();
    const size_t layer_rows = size_t(data.tokens) * data.kv_heads;
    for (int l = 0; l < layers; ++l) {
        const float* k = data.k.data() + l * layer_rows * data.head_dim;
        const float* v = data.latent ? nullptr : data.v.data() + l * layer_rows * data.dv();  // a latent's: its keys
        cache->append(l, seq, k, v, n_rows);
    }
    return cache;
}

// Best-of-`timing_repeats` time of one decode step (KVCache::attend of the last query at the full context, in
// each timed layer) per format; formats take turns within each repeat so that drifting machine load affects them alike.
std::vector<double> time_decode(const KVData& data, const std::vector<const Prepared*>& formats,
                                const SweepOptions& options) {
    const size_t n_rows = size_t(data.query_positions.back()) + 1;
    const int last = data.n_queries() - 1, layers = std::min(data.layers, kTimedLayers);
    std::vector<std::unique_ptr<KVCache>> caches;
    for (const Prepared* p : formats) caches.push_back(fill_cache(data, layers, *p, n_rows, options));
    const size_t q_floats = size_t(data.q_heads) * data.head_dim;
    std::vector<float> out(size_t(data.q_heads) * data.dv());
    auto steps = [&](size_t f, int calls) {
        const SequenceId seq = caches[f]->sequences().front();
        const auto start = std::chrono::steady_clock::now();
        for (int c = 0; c < calls; ++c) {
            for (int l = 0; l < layers; ++l) {
                caches[f]->attend(l, seq, data.q.data() + (size_t(l) * data.n_queries() + last) * q_floats, out.data());
            }
        }
        const std::chrono::duration<double> dt = std::chrono::steady_clock::now() - start;
        return dt.count() / calls;
    };
    // A sample runs enough steps to last about 20 ms, so that timer resolution and a single preemption
    // weigh little; the best sample of each format is its time.
    std::vector<int> calls(formats.size());
    std::vector<double> best(formats.size());
    for (size_t f = 0; f < formats.size(); ++f) {
        best[f] = steps(f, 1);  // also warms caches and the thread's page tables
        calls[f] = static_cast<int>(std::clamp(0.02 / std::max(best[f], 1e-9), 1.0, 1000.0));
    }
    for (int rep = 0; rep < std::max(options.timing_repeats, 1); ++rep) {
        for (size_t f = 0; f < formats.size(); ++f) best[f] = std::min(best[f], steps(f, calls[f]));
    }
    return best;
}

}  // namespace

DecodeTimes time_formats(const KVData& d, const std::vector<Prepared>& prepared, const SweepOptions& options) {
    // The f16/f16 row is the baseline (on a latent data set, an f16 latent); it is timed once more only if
    // the sweep does not include it.
    std::vector<const Prepared*> timed;
    size_t baseline_index = SIZE_MAX;
    for (const auto& p : prepared) {
        if (!p.cache_holds()) continue;
        if (p.format.label() == f16_format().label()) baseline_index = timed.size();
        timed.push_back(&p);
    }
    const std::vector<Prepared> baseline = prepare_formats({f16_format()}, d, options);
    if (baseline_index == SIZE_MAX) {
        baseline_index = timed.size();
        timed.push_back(&baseline.front());
    }
    const auto t = time_decode(d, timed, options);
    DecodeTimes times{std::vector<double>(prepared.size(), 0.0), t[baseline_index]};
    for (size_t f = 0, j = 0; f < prepared.size(); ++f) {
        if (prepared[f].cache_holds()) times.seconds[f] = t[j++];
    }
    return times;
}

}  // namespace kvq::detail
