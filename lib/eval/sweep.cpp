// The accuracy-vs-compression sweep: errors against the FP32 reference and decode time vs f16.
#include "kvq/research/sweep.hpp"

#include <Eigen/Dense>
#include <algorithm>
#include <cstdint>
#include <cmath>
#include <functional>
#include <map>
#include <stdexcept>

#include "quantized_attention.hpp"
#include "sweep_parts.hpp"

namespace kvq {
namespace {

using detail::Prepared;
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

// q: n_q × d, k: n × d, v: n × dv (a latent's: its keys' first dv values, copied out).
Reference reference(const float* q, int n_q, const float* k, const float* v, size_t n, int d, int dv, float scale) {
    Reference r;
    r.scores.resize(size_t(n_q) * n);
    r.out.resize(size_t(n_q) * dv);
    const auto rows = static_cast<Eigen::Index>(n);
    Map(r.scores.data(), n_q, rows).noalias() = (ConstMap(q, n_q, d) * ConstMap(k, rows, d).transpose()) * scale;
    r.weights = r.scores;
    detail::softmax_rows(r.weights.data(), n_q, n, n);
    Map(r.out.data(), n_q, dv).noalias() = Map(r.weights.data(), n_q, rows) * ConstMap(v, rows, dv);
    return r;
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
    const int g = d.group(), dim = d.head_dim, dv = d.dv();
    const float scale = d.softmax_scale();
    const auto k = d.keys(l, h, n_rows), v = d.values(l, h, n_rows);
    std::vector<std::vector<float>> q(d.n_queries());
    std::vector<Reference> ref;
    for (int i = 0; i < d.n_queries(); ++i) {
        q[i] = d.queries(l, h, i);
        const size_t first = d.first_token(l, d.query_positions[i]), n = size_t(d.query_positions[i]) + 1;
        ref.push_back(reference(q[i].data(), g, k.data() + first * dim, v.data() + first * dv, n - first, dim, dv, scale));
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
        // A latent's values are read in place from its key codes (no value codes of their own).
        auto vc = value_codes.find(lf.value_codec);
        if (!p.latent && vc == value_codes.end()) vc = value_codes.emplace(lf.value_codec, detail::quantize_values(values, v.data(), n_rows)).first;
        const detail::QuantizedValues latent = detail::latent_values(values);
        const detail::QuantizedValues& value_codes_of = p.latent ? latent : vc->second;
        for (int i = 0; i < d.n_queries(); ++i) {
            const size_t first = d.first_token(l, d.query_positions[i]), n = size_t(d.query_positions[i]) + 1;
            s.scores.resize(size_t(g) * (n - first));
            s.weights.resize(size_t(g) * (n - first));
            detail::quantized_attention(kc->second, value_codes_of, q[i].data(), g, first, n, scale, s.scores.data(),
                                        s.weights.data(), s.out.data());
            const AttentionErrors e = compare_attention(ref[i].scores.data(), ref[i].weights.data(), ref[i].out.data(),
                                                        s.scores.data(), s.weights.data(), s.out.data(), g, n - first, dv,
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
    s.out.resize(size_t(d.group()) * d.dv());
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

// The rows of one data set: one per format over all layers, and one each over the full-attention and the
// sliding-window layers when the data set has both kinds.
// Bytes per token are of `model` (a latent data set's: SweepResult::latent_model).
void add_rows(SweepResult& result, const KVData& d, const std::vector<Prepared>& prepared,
              const std::vector<FormatErrors>& errors, const detail::DecodeTimes& times, const ModelShape& model,
              int block_tokens) {
    bool any_full = false, any_window = false;
    for (int l = 0; l < d.layers; ++l) (d.window(l) > 0 ? any_window : any_full) = true;
    const bool split = any_full && any_window;
    const int dim = d.head_dim, dv = d.dv();
    // A latent has no value bytes: its bits are the latent's, per stored value (key_bits).
    const auto value_bits = [&](const KVFormat& f) { return d.latent ? 0.0 : f.value_bits(dv); };
    // A latent's bytes per token are an MLA model's of its sizes, in a format a latent cache holds.
    const bool model_fits = !d.latent || (model.key_row_dim() == dim && model.mla_latent_dim == dv);
    const double fp16_bytes = kv_bytes_per_token(model, detail::f16_format(), block_tokens);
    for (size_t f = 0; f < prepared.size(); ++f) {
        const Prepared& p = prepared[f];
        SweepRow row;
        row.dataset = d.name;
        row.layers = "all";
        row.format = p.format;
        row.head_dim = dim;
        row.head_dim_v = dv;
        row.latent = d.latent;
        row.error = p.error;
        if (p.error.empty()) {
            // The mean over the data set's layers (a "K/V|K2/V2" format differs by layer).
            for (int l = 0; l < d.layers; ++l) {
                row.key_bits += p.format_of(d.window(l) > 0).key_bits(dim, block_tokens) / d.layers;
                row.value_bits += value_bits(p.format_of(d.window(l) > 0)) / d.layers;
            }
            row.errors = errors[f].all.result();
            row.decode_seconds = times.seconds[f];
            row.decode_vs_f16 = times.f16_seconds > 0 ? times.seconds[f] / times.f16_seconds : 0.0;
        }
        try {
            if (model_fits && (p.error.empty() || !d.latent)) {
                row.bytes_per_token = kv_bytes_per_token(model, p.format, block_tokens);
                row.compression = fp16_bytes / row.bytes_per_token;
            }
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
                r->value_bits = value_bits(p.format_of(windowed));
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
    if (data.latent) {  // MLA: one latent row per token and layer, its first dv() values the value
        m.mla_latent_dim = data.dv();
        m.mla_rope_dim = data.head_dim - data.dv();
    } else if (data.dv() != data.head_dim) {
        m.value_dim = data.dv();
    }
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

// The model of a latent data set's bytes per token: the given one if it is an MLA model, else DeepSeek V3.
ModelShape latent_model(const SweepOptions& options) {
    return options.model.is_mla() ? options.model : model_preset("deepseek-v3");
}

}  // namespace

SweepResult run_sweep(const std::vector<KVData>& data, const SweepOptions& options) {
    if (options.block_tokens < 1 || options.block_tokens > kMaxBlockTokens) {
        throw std::invalid_argument("sweep: block_tokens must be in 1.." + std::to_string(kMaxBlockTokens) +
                                    " (what a KVCache takes), got " + std::to_string(options.block_tokens));
    }
    if (options.top_k <= 0) throw std::invalid_argument("sweep: top_k must be positive");
    SweepResult result;
    result.model = options.model.n_layers > 0 ? options.model : default_model(data);
    for (const auto& d : data) {
        if (d.latent) result.latent_model = latent_model(options);
    }
    result.timing_method = options.timing ? "KVCache::attend of the last query in each of the first " + std::to_string(detail::kTimedLayers) + " layers (one thread, fused score + online "
                                            "softmax + accumulate on the codes), best of " + std::to_string(std::max(options.timing_repeats, 1)) +
                                            " samples of about 20 ms, relative to f16/f16 in the same run"
                                          : "not timed";
    for (const auto& d : data) d.validate();
    Progress progress(data, options);
    for (const KVData& d : data) {
        // A latent data set's default formats are the ones a latent cache holds.
        const std::vector<KVFormat> formats = !options.formats.empty() ? options.formats
                                              : d.latent ? default_latent_formats(d.head_dim, d.dv())
                                                         : default_kv_formats();
        const std::vector<Prepared> prepared = detail::prepare_formats(formats, d, options);
        const std::vector<FormatErrors> errors = measure_errors(d, prepared, options, progress);
        detail::DecodeTimes times{std::vector<double>(prepared.size(), 0.0), 0.0};
        if (options.timing) {
            times = detail::time_formats(d, prepared, options);
            progress.step();
        }
        add_rows(result, d, prepared, errors, times, d.latent ? result.latent_model : result.model, options.block_tokens);
    }
    return result;
}

}  // namespace kvq
