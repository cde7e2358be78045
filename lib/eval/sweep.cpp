// The accuracy-vs-compression sweep: errors against the FP32 reference and decode time vs f16.
#include "kvq/research/sweep.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>

#include "kvq/cache.hpp"
#include "codec/key_formats.hpp"
#include "quantized_attention.hpp"

namespace kvq {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;

// Mean and worst of every metric over many compare_attention results, weighted by their queries.
struct ErrorAccumulator {
    double sum[5] = {0, 0, 0, 0, 0};
    double worst[5] = {-INFINITY, -INFINITY, INFINITY, -INFINITY, INFINITY};  // kl, rmse, topk, l2, cosine
    size_t n = 0;

    void add(const AttentionErrors& e) {
        const MetricSummary* m[5] = {&e.kl, &e.score_rmse, &e.topk, &e.output_l2, &e.cosine};
        for (int i = 0; i < 5; ++i) {
            sum[i] += m[i]->mean * double(e.queries);
            const double w = m[i]->worst;  // a NaN stays (std::min and std::max would drop it)
            worst[i] = std::isnan(w) || std::isnan(worst[i]) ? NAN : (i == 2 || i == 4) ? std::min(worst[i], w) : std::max(worst[i], w);
        }
        n += e.queries;
    }
    AttentionErrors result() const {
        AttentionErrors e;
        MetricSummary* m[5] = {&e.kl, &e.score_rmse, &e.topk, &e.output_l2, &e.cosine};
        for (int i = 0; i < 5; ++i) *m[i] = {n ? sum[i] / double(n) : 0.0, n ? worst[i] : 0.0};
        e.queries = n;
        return e;
    }
};

struct Reference {
    std::vector<float> scores, weights, out;
};

Reference reference(const float* q, int n_q, const float* k, const float* v, size_t n, int d, float scale) {
    Reference r;
    r.scores.resize(size_t(n_q) * n);
    r.out.resize(size_t(n_q) * d);
    const auto rows = static_cast<Eigen::Index>(n);
    Map(r.scores.data(), n_q, rows).noalias() = (ConstMap(q, n_q, d) * ConstMap(k, rows, d).transpose()) * scale;
    r.weights = r.scores;
    detail::softmax_rows(r.weights.data(), n_q, n, n);
    Map(r.out.data(), n_q, d).noalias() = Map(r.weights.data(), n_q, rows) * ConstMap(v, rows, d);
    return r;
}

struct Prepared {
    KVFormat format;
    std::shared_ptr<const detail::KeyFormat> keys, window_keys;  // "K/V|K2/V2": the sliding-window layers' too
    std::shared_ptr<const detail::ValueFormat> values, window_values;
    std::string error;

    // The format and codecs of a layer.
    const KVFormat& format_of(bool windowed) const { return format.on_layer(windowed); }
    const detail::KeyFormat& keys_of(bool windowed) const { return windowed && window_keys ? *window_keys : *keys; }
    const detail::ValueFormat& values_of(bool windowed) const { return windowed && window_values ? *window_values : *values; }
    // Whether a KVCache can hold the format.
    bool cache_holds() const { return error.empty(); }
};

// Decode time is measured on the first layers only: the ratio to f16 does not need all of them, and one
// cache per format for every layer of a large dump would not fit in memory.
constexpr int kTimedLayers = 4;

// The data set's first `layers` layers in a KVCache of one format, the tokens up to the last query.
std::unique_ptr<KVCache> fill_cache(const KVData& data, int layers, const Prepared& p, size_t n_rows,
                                    const SweepOptions& options) {
    CacheConfig c;
    c.n_layers = layers;
    c.n_kv_heads = data.kv_heads;
    c.n_heads = data.q_heads;
    c.head_dim = data.head_dim;
    c.key_codec = p.format.key_label();
    c.value_codec = p.format.value_codec;
    c.block_tokens = options.block_tokens;
    c.scale = data.softmax_scale();
    c.threads = 1;
    c.seed = options.seed;
    c.int8_value_weights = options.int8_value_weights;
    if (!data.windows.empty()) c.sliding_window.assign(data.windows.begin(), data.windows.begin() + layers);
    for (int l = 0; p.format.window && l < layers; ++l) {
        const KVFormat& f = p.format_of(data.window(l) > 0);
        c.layer_codecs.push_back({f.key_label(), f.value_codec});
    }
    auto cache = std::make_unique<KVCache>(c);
    const SequenceId seq = cache->add_sequence();
    const size_t layer_floats = size_t(data.tokens) * data.kv_heads * data.head_dim;
    for (int l = 0; l < layers; ++l) {
        cache->append(l, seq, data.k.data() + l * layer_floats, data.v.data() + l * layer_floats, n_rows);
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
    std::vector<float> out(q_floats);
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

// Progress over every (layer, kv head) of every data set, and one timing step per data set.
class Progress {
public:
    Progress(const std::vector<KVData>& data, const SweepOptions& options) : callback_(options.progress) {
        for (const auto& d : data) total_ += size_t(d.layers) * d.kv_heads + (options.timing ? 1 : 0);
    }
    void step() {
        ++done_;
        if (callback_) callback_(done_, total_);
    }

private:
    const std::function<void(size_t, size_t)>& callback_;
    size_t done_ = 0, total_ = 0;
};

const KVFormat& f16_format() {
    static const KVFormat f16 = KVFormat::parse("f16/f16");
    return f16;
}

// A format's key format (lib/codec/key_formats.hpp), one kv head per block as the tables hold them.
std::shared_ptr<const detail::KeyFormat> key_format(const KVFormat& f, int head_dim, int block_tokens, uint64_t seed) {
    return detail::make_key_format(f.key_label(), head_dim, block_tokens, {false, seed});
}

// A format's value format, one kv head per block as the tables hold them.
std::shared_ptr<const detail::ValueFormat> value_format(const KVFormat& f, int head_dim, int block_tokens, const SweepOptions& o) {
    return detail::make_value_format(Codec::make(f.value_codec, head_dim, o.seed), block_tokens, o.int8_value_weights);
}

// The formats of every pair at the data set's head size; a pair they cannot make carries the reason.
std::vector<Prepared> prepare_formats(const std::vector<KVFormat>& formats, int head_dim, const SweepOptions& o) {
    const int block_tokens = o.block_tokens;
    const uint64_t seed = o.seed;
    std::vector<Prepared> prepared;
    for (const auto& f : formats) {
        Prepared p;
        p.format = f;
        try {
            p.keys = key_format(f, head_dim, block_tokens, seed);
            p.values = value_format(f, head_dim, block_tokens, o);
            if (const KVFormat* w = f.window.get()) {
                p.window_keys = key_format(*w, head_dim, block_tokens, seed);
                p.window_values = value_format(*w, head_dim, block_tokens, o);
            }
        } catch (const std::invalid_argument& e) {
            p.error = e.what();
        }
        prepared.push_back(std::move(p));
    }
    return prepared;
}

// A format's errors over every layer, and apart over full-attention and sliding-window layers (reported
// when the data set has both kinds: Gemma-style models).
struct FormatErrors {
    ErrorAccumulator all, full, window;
};

// Buffers of quantized attention, reused from one query to the next.
struct Scratch {
    std::vector<float> scores, weights, out;
};

// Every query of one kv head of one layer against the FP32 reference, in every format that was made.
void measure_head(const KVData& d, int l, int h, const std::vector<Prepared>& prepared, const SweepOptions& options,
                  Scratch& s, std::vector<FormatErrors>& errors) {
    const size_t n_rows = size_t(d.query_positions.back()) + 1;
    const int g = d.group(), dim = d.head_dim;
    const float scale = d.softmax_scale();
    const auto k = d.keys(l, h, n_rows), v = d.values(l, h, n_rows);
    std::vector<std::vector<float>> q(d.n_queries());
    std::vector<Reference> ref;
    for (int i = 0; i < d.n_queries(); ++i) {
        q[i] = d.queries(l, h, i);
        const size_t first = d.first_token(l, d.query_positions[i]), n = size_t(d.query_positions[i]) + 1;
        ref.push_back(reference(q[i].data(), g, k.data() + first * dim, v.data() + first * dim, n - first, dim, scale));
        if (!all_finite(ref[i].scores.data(), ref[i].scores.size()) || !all_finite(ref[i].out.data(), ref[i].out.size())) {
            throw std::invalid_argument("the queries at token " + std::to_string(d.query_positions[i]) +
                                        " have scores (q · k · scale) beyond float's range: nothing to measure against");
        }
    }
    std::map<std::string, detail::QuantizedKeys> key_codes;  // shared by formats with the same keys
    std::map<std::string, detail::QuantizedValues> value_codes;
    const bool windowed = d.window(l) > 0;
    for (size_t f = 0; f < prepared.size(); ++f) try {
        const Prepared& p = prepared[f];
        if (!p.error.empty()) continue;
        const KVFormat& lf = p.format_of(windowed);  // this layer's pair
        const detail::KeyFormat& keys = p.keys_of(windowed);
        const detail::ValueFormat& values = p.values_of(windowed);
        auto kc = key_codes.find(lf.key_label());
        if (kc == key_codes.end())
            kc = key_codes.emplace(lf.key_label(), detail::quantize_keys(keys, k.data(), n_rows))
                     .first;
        auto vc = value_codes.find(lf.value_codec);
        if (vc == value_codes.end()) vc = value_codes.emplace(lf.value_codec, detail::quantize_values(values, v.data(), n_rows)).first;
        for (int i = 0; i < d.n_queries(); ++i) {
            const size_t first = d.first_token(l, d.query_positions[i]), n = size_t(d.query_positions[i]) + 1;
            s.scores.resize(size_t(g) * (n - first));
            s.weights.resize(size_t(g) * (n - first));
            detail::quantized_attention(kc->second, vc->second, q[i].data(), g, first, n, scale, s.scores.data(),
                                        s.weights.data(), s.out.data());
            const AttentionErrors e = compare_attention(ref[i].scores.data(), ref[i].weights.data(), ref[i].out.data(),
                                                        s.scores.data(), s.weights.data(), s.out.data(), g, n - first, dim,
                                                        options.top_k);
            errors[f].all.add(e);
            (windowed ? errors[f].window : errors[f].full).add(e);
        }
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(prepared[f].format.label() + ": " + e.what());
    }
}

std::vector<FormatErrors> measure_errors(const KVData& d, const std::vector<Prepared>& prepared, const SweepOptions& options,
                                         Progress& progress) {
    std::vector<FormatErrors> errors(prepared.size());
    Scratch s;
    s.out.resize(size_t(d.group()) * d.head_dim);
    for (int l = 0; l < d.layers; ++l) {
        for (int h = 0; h < d.kv_heads; ++h) {
            try {
                measure_head(d, l, h, prepared, options, s, errors);
            } catch (const std::invalid_argument& e) {  // a value a codec cannot hold, a score beyond float
                throw std::invalid_argument("data set '" + d.name + "', layer " + std::to_string(l) + ", kv head " +
                                            std::to_string(h) + ": " + e.what());
            }
            progress.step();
        }
    }
    return errors;
}

// Decode time per format (0 where not timed) and of f16/f16, the baseline.
struct DecodeTimes {
    std::vector<double> seconds;
    double f16_seconds = 0;
};

DecodeTimes time_formats(const KVData& d, const std::vector<Prepared>& prepared, const SweepOptions& options) {
    // The f16/f16 row is the baseline; it is timed once more only if the sweep does not include it.
    std::vector<const Prepared*> timed;
    size_t baseline_index = SIZE_MAX;
    for (const auto& p : prepared) {
        if (!p.cache_holds()) continue;
        if (p.format.label() == f16_format().label()) baseline_index = timed.size();
        timed.push_back(&p);
    }
    Prepared baseline;
    baseline.format = f16_format();
    baseline.keys = detail::make_key_format("f16", d.head_dim, options.block_tokens);
    baseline.values = value_format(f16_format(), d.head_dim, options.block_tokens, options);
    if (baseline_index == SIZE_MAX) {
        baseline_index = timed.size();
        timed.push_back(&baseline);
    }
    const auto t = time_decode(d, timed, options);
    DecodeTimes times{std::vector<double>(prepared.size(), 0.0), t[baseline_index]};
    for (size_t f = 0, j = 0; f < prepared.size(); ++f) {
        if (prepared[f].cache_holds()) times.seconds[f] = t[j++];
    }
    return times;
}

// The rows of one data set: one per format over all layers, and one each over the full-attention and the
// sliding-window layers when the data set has both kinds.
void add_rows(SweepResult& result, const KVData& d, const std::vector<Prepared>& prepared,
              const std::vector<FormatErrors>& errors, const DecodeTimes& times, double fp16_bytes, int block_tokens) {
    bool any_full = false, any_window = false;
    for (int l = 0; l < d.layers; ++l) (d.window(l) > 0 ? any_window : any_full) = true;
    const bool split = any_full && any_window;
    const int dim = d.head_dim;
    for (size_t f = 0; f < prepared.size(); ++f) {
        const Prepared& p = prepared[f];
        SweepRow row;
        row.dataset = d.name;
        row.layers = "all";
        row.format = p.format;
        row.head_dim = dim;
        row.error = p.error;
        if (p.error.empty()) {
            // The mean over the data set's layers (a "K/V|K2/V2" format differs by layer).
            for (int l = 0; l < d.layers; ++l) {
                row.key_bits += p.format_of(d.window(l) > 0).key_bits(dim, block_tokens) / d.layers;
                row.value_bits += p.format_of(d.window(l) > 0).value_bits(dim) / d.layers;
            }
            row.errors = errors[f].all.result();
            row.decode_seconds = times.seconds[f];
            row.decode_vs_f16 = times.f16_seconds > 0 ? times.seconds[f] / times.f16_seconds : 0.0;
        }
        try {
            row.bytes_per_token = kv_bytes_per_token(result.model, p.format, block_tokens);
            row.compression = fp16_bytes / row.bytes_per_token;
        } catch (const std::invalid_argument&) {
            row.bytes_per_token = row.compression = 0;  // the codec cannot take the model's head size
        }
        if (split && p.error.empty()) {
            SweepRow full = row, window = row;
            full.layers = "full";
            full.errors = errors[f].full.result();
            window.layers = "window";
            window.errors = errors[f].window.result();
            for (auto [r, windowed] : {std::pair{&full, false}, std::pair{&window, true}}) {
                r->key_bits = p.format_of(windowed).key_bits(dim, block_tokens);
                r->value_bits = p.format_of(windowed).value_bits(dim);
            }
            result.rows.push_back(std::move(row));
            result.rows.push_back(std::move(full));
            result.rows.push_back(std::move(window));
        } else {
            result.rows.push_back(std::move(row));
        }
    }
}

}  // namespace

ModelShape data_shape(const KVData& data) {
    ModelShape m;
    m.name = data.source_model.empty() ? data.name : data.source_model;
    m.source = data.name;
    m.n_layers = data.layers;
    m.n_heads = data.q_heads;
    m.n_kv_heads = data.kv_heads;
    m.head_dim = data.head_dim;
    m.sliding_window = data.windows;
    return m;
}

namespace {

// The model of bytes per token when none is given: the dumps' own shape when every data set is a dump of a
// model and they agree on it (all layers and heads; windows), else llama-3-8b.
ModelShape default_model(const std::vector<KVData>& data) {
    if (data.empty() || data.front().source_model.empty()) return model_preset("llama-3-8b");
    const ModelShape first = data_shape(data.front());
    for (const KVData& d : data) {
        const ModelShape m = data_shape(d);
        if (d.source_model.empty() || m.n_layers != first.n_layers || m.n_kv_heads != first.n_kv_heads ||
            m.head_dim != first.head_dim || m.sliding_window != first.sliding_window) {
            return model_preset("llama-3-8b");
        }
    }
    return first;
}

}  // namespace

SweepResult run_sweep(const std::vector<KVData>& data, const SweepOptions& options) {
    if (options.block_tokens < 1 || options.block_tokens > kMaxBlockTokens) {
        throw std::invalid_argument("sweep: block_tokens must be in 1.." + std::to_string(kMaxBlockTokens) +
                                    " (what a KVCache takes), got " + std::to_string(options.block_tokens));
    }
    if (options.top_k <= 0) throw std::invalid_argument("sweep: top_k must be positive");
    const std::vector<KVFormat> formats = options.formats.empty() ? default_kv_formats() : options.formats;
    SweepResult result;
    result.model = options.model.n_layers > 0 ? options.model : default_model(data);
    result.timing_method = options.timing ? "KVCache::attend of the last query in each of the first " + std::to_string(kTimedLayers) + " layers (one thread, fused score + online "
                                            "softmax + accumulate on the codes), best of " + std::to_string(std::max(options.timing_repeats, 1)) +
                                            " samples of about 20 ms, relative to f16/f16 in the same run"
                                          : "not timed";
    const double fp16_bytes = kv_bytes_per_token(result.model, f16_format(), options.block_tokens);
    for (const auto& d : data) d.validate();
    Progress progress(data, options);
    for (const KVData& d : data) {
        const std::vector<Prepared> prepared = prepare_formats(formats, d.head_dim, options);
        const std::vector<FormatErrors> errors = measure_errors(d, prepared, options, progress);
        DecodeTimes times{std::vector<double>(prepared.size(), 0.0), 0.0};
        if (options.timing) {
            times = time_formats(d, prepared, options);
            progress.step();
        }
        add_rows(result, d, prepared, errors, times, fp16_bytes, options.block_tokens);
    }
    return result;
}

}  // namespace kvq
