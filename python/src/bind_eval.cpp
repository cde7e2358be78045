// kvq.dataset, kvq.sweep, kvq.plan and friends: the data sets, the accuracy-vs-compression sweep and the
// memory planner of lib/eval (include/kvq/research/{datasets,sweep,planner,report}.hpp), behind `kvq table`,
// `kvq plan` and `kvq info`.
#include <Python.h>

#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "bindings.hpp"
#include "kvq/research/datasets.hpp"
#include "kvq/research/planner.hpp"
#include "kvq/research/report.hpp"
#include "kvq/research/sweep.hpp"

namespace kvq::python {
namespace {

using namespace pybind11::literals;

py::array_t<float> array_of(const std::vector<float>& x, std::vector<py::ssize_t> shape) {
    auto a = new_float_array(shape);
    std::copy(x.begin(), x.end(), a.mutable_data());
    return a;
}

py::dict model_dict(const ModelShape& m) {
    return py::dict("name"_a = m.name, "source"_a = m.source, "layers"_a = m.n_layers, "heads"_a = m.n_heads,
                    "kv_heads"_a = m.n_kv_heads, "head_dim"_a = m.head_dim, "value_dim"_a = m.value_row_dim(),
                    "mla_latent_dim"_a = m.mla_latent_dim, "mla_rope_dim"_a = m.mla_rope_dim,
                    "sliding_window"_a = m.sliding_window, "description"_a = m.describe());
}

py::object or_none(bool ok, double x) { return ok ? py::object(py::float_(x)) : py::object(py::none()); }

py::dict sweep_row_dict(const SweepRow& r) {
    const bool ok = r.error.empty();
    const auto& e = r.errors;
    return py::dict("dataset"_a = r.dataset, "layers"_a = r.layers, "pair"_a = r.format.label(), "key"_a = r.format.key_codec,
                    "value"_a = r.format.value_codec, "key_centered"_a = r.format.center_keys, "head_dim"_a = r.head_dim,
                    "head_dim_v"_a = r.head_dim_v, "latent"_a = r.latent, "key_bits"_a = or_none(ok, r.key_bits),
                    "value_bits"_a = or_none(ok && !r.latent, r.value_bits),  // a latent's values have no bits of their own
                    "bytes_per_token"_a = or_none(r.bytes_per_token > 0, r.bytes_per_token),
                    "compression_vs_f16"_a = or_none(r.compression > 0, r.compression),
                    "kl_mean"_a = or_none(ok, e.kl.mean), "kl_worst"_a = or_none(ok, e.kl.worst),
                    "score_rmse_mean"_a = or_none(ok, e.score_rmse.mean), "score_rmse_worst"_a = or_none(ok, e.score_rmse.worst),
                    "topk_mean"_a = or_none(ok, e.topk.mean), "topk_worst"_a = or_none(ok, e.topk.worst),
                    "output_err_mean"_a = or_none(ok, e.output_l2.mean), "output_err_worst"_a = or_none(ok, e.output_l2.worst),
                    "cosine_mean"_a = or_none(ok, e.cosine.mean), "cosine_worst"_a = or_none(ok, e.cosine.worst),
                    "queries"_a = e.queries, "decode_seconds"_a = or_none(r.decode_seconds > 0, r.decode_seconds),
                    "decode_vs_f16"_a = or_none(r.decode_vs_f16 > 0, r.decode_vs_f16), "error"_a = r.error);
}

// The CSV's fields (report.cpp's format_plan), with Python types: a "K/V|K2/V2" pair's window layers' codecs
// are window_key/window_value/window_key_centered (None for a pair of every layer), where the CSV writes "K|K2".
py::dict plan_row_dict(const MemoryPlan& r, const ModelShape& model, const PlanOptions& o) {
    const bool mla = model.is_mla();
    const KVFormat* w = r.format.window.get();
    return py::dict("model"_a = model.name, "pair"_a = r.format.label(), "key"_a = r.format.key_codec,
                    "value"_a = r.format.value_codec, "key_centered"_a = r.format.center_keys,
                    "window_key"_a = w ? py::object(py::str(w->key_codec)) : py::object(py::none()),
                    "window_value"_a = w ? py::object(py::str(w->value_codec)) : py::object(py::none()),
                    "window_key_centered"_a = w ? py::object(py::bool_(w->center_keys)) : py::object(py::none()),
                    "supported"_a = r.supported,
                    "key_bits"_a = or_none(r.supported, r.key_bits), "value_bits"_a = or_none(r.supported && !mla, r.value_bits),
                    "bytes_per_token"_a = or_none(r.supported, r.bytes_per_token),
                    "bytes_total"_a = or_none(r.supported, r.bytes_total), "fp16_bytes_per_token"_a = r.fp16_bytes_per_token,
                    "fp16_bytes_total"_a = r.fp16_bytes_total, "compression_vs_f16"_a = or_none(r.supported, r.compression),
                    "cache_bytes_total"_a = or_none(r.supported && !mla, r.cache_bytes_total), "context"_a = o.context,
                    "batch"_a = o.batch, "error"_a = r.error);
}

// A plan kept whole so that its text forms come from the C++ formatter (lib/eval/report.cpp).
struct Plan {
    ModelShape model;
    PlanOptions options;
    std::vector<MemoryPlan> rows;
};

std::vector<KVFormat> formats_from(const std::optional<std::vector<std::string>>& pairs) {
    if (!pairs) return default_kv_formats();
    std::vector<KVFormat> out;
    for (const auto& p : *pairs) out.push_back(KVFormat::parse(p));
    if (out.empty()) throw std::invalid_argument("no K/V pairs given");
    return out;
}

std::string text(const std::string& format, const std::function<std::string(TableFormat)>& f) { return f(parse_table_format(format)); }

SweepResult sweep(const std::vector<std::variant<std::string, KVData>>& datasets, const std::optional<std::vector<std::string>>& pairs,
                  const std::optional<std::string>& model, bool timing, int repeats, uint64_t data_seed, uint64_t seed, int block_tokens,
                  int top_k, bool int8_value_weights, py::object progress) {
    if (datasets.empty()) raise_value_error("sweep: give at least one data set");
    if (repeats < 1) raise_value_error("sweep: repeats must be at least 1");
    SweepOptions o;
    if (pairs) o.formats = formats_from(pairs);  // else the defaults (a latent data set's: default_latent_formats)
    if (model) o.model = load_model(*model);  // else the dumps' own shape, or llama-3-8b (run_sweep)
    o.timing = timing;
    o.timing_repeats = repeats;
    o.seed = seed;
    o.block_tokens = block_tokens;
    o.top_k = top_k;
    o.int8_value_weights = int8_value_weights;
    // Called without the GIL; takes it to report progress and to let Ctrl-C (or an exception raised by
    // the callback) stop the sweep.
    o.progress = [&progress](size_t done, size_t total) {
        WithGil gil;
        if (PyErr_CheckSignals() != 0) throw py::error_already_set();
        if (!progress.is_none()) progress(done, total);
    };
    std::vector<KVData> data;
    for (const auto& d : datasets) {
        if (const auto* spec = std::get_if<std::string>(&d)) data.push_back(make_dataset(*spec, data_seed));
        else data.push_back(std::get<KVData>(d));
    }
    WithoutGil unlocked;
    return run_sweep(data, o);
}

void bind_eval(py::module_& m) {
    py::class_<KVData>(m, "Dataset", "Keys, values and queries of several layers and heads (kvq.dataset).")
        .def_readonly("name", &KVData::name)
        .def_readonly("layers", &KVData::layers)
        .def_readonly("tokens", &KVData::tokens)
        .def_readonly("kv_heads", &KVData::kv_heads)
        .def_readonly("q_heads", &KVData::q_heads)
        .def_readonly("head_dim", &KVData::head_dim)
        .def_property_readonly("head_dim_v", &KVData::dv, "of the values (head_dim unless they differ, as a latent's)")
        .def_readonly("latent", &KVData::latent, "the values are the keys' first head_dim_v values (DeepSeek's MLA latent)")
        .def_readonly("query_positions", &KVData::query_positions)
        .def_readonly("windows", &KVData::windows, "sliding window per layer in tokens (0 = full); empty = all full")
        .def_property_readonly("k", [](const KVData& d) { return array_of(d.k, {d.layers, d.tokens, d.kv_heads, d.head_dim}); },
                               "keys, (layers, tokens, kv_heads, head_dim) float32 (a copy)")
        .def_property_readonly("v", [](const KVData& d) {
                if (!d.latent) return array_of(d.v, {d.layers, d.tokens, d.kv_heads, d.dv()});
                auto v = new_float_array({d.layers, d.tokens, d.kv_heads, d.dv()});  // a latent's: its keys' first dv()
                const size_t rows = size_t(d.layers) * d.tokens * d.kv_heads, dv = size_t(d.dv());
                for (size_t r = 0; r < rows; ++r) std::copy_n(d.k.data() + r * d.head_dim, dv, v.mutable_data() + r * dv);
                return v;
            }, "values, (layers, tokens, kv_heads, head_dim_v) float32 (a copy; a latent's: k[..., :head_dim_v])")
        .def_property_readonly("q", [](const KVData& d) { return array_of(d.q, {d.layers, d.n_queries(), d.q_heads, d.head_dim}); },
                               "queries, (layers, len(query_positions), q_heads, head_dim) float32 (a copy)")
        .def("stats", [](const KVData& d) {
                DataStats s;
                {
                    WithoutGil unlocked;
                    s = data_stats(d);
                }
                return py::dict("outlier_channel_ratio"_a = s.outlier_channel_ratio, "key_bias_ratio"_a = s.key_bias_ratio,
                                "sink_weight"_a = s.sink_weight, "entropy_min"_a = s.entropy_min,
                                "entropy_median"_a = s.entropy_median, "entropy_max"_a = s.entropy_max,
                                "entropy_log_context"_a = s.entropy_log_context, "sharp_fraction"_a = s.sharp_fraction,
                                "diffuse_fraction"_a = s.diffuse_fraction, "value_outlier_fraction"_a = s.value_outlier_fraction);
            }, "Statistics of the data and its FP32 reference attention (docs/datasets.md).")
        .def("__repr__", [](const KVData& d) {
            return "<kvq.Dataset '" + d.name + "': " + std::to_string(d.layers) + " layers, " + std::to_string(d.tokens) +
                   " tokens, " + std::to_string(d.kv_heads) + " kv heads, " + std::to_string(d.q_heads) + " query heads, head_dim " +
                   std::to_string(d.head_dim) + (d.latent ? ", values its first " + std::to_string(d.dv()) + " (latent)"
                                                : d.dv() != d.head_dim ? ", head_dim_v " + std::to_string(d.dv()) : "") + ">";
        });

    m.def("dataset", [](const std::string& spec, uint64_t seed) {
            WithoutGil unlocked;
            return make_dataset(spec, seed);
        }, "spec"_a, "seed"_a = 0,
        "A data set by spec: 'gaussian', 'llm' (both take knobs: 'llm:tokens=4096,rope=0'), or 'npy:DIR' "
        "(DIR/k.npy, DIR/v.npy [, DIR/q.npy], shape (layers, tokens, heads, head_dim)).");
    m.def("dataset_kinds", &dataset_kinds, "The data set kinds kvq.dataset knows, with a description each.");

    py::class_<SweepResult>(m, "SweepResult", "Rows of an accuracy-vs-compression sweep (kvq.sweep).")
        .def_property_readonly("rows", [](const SweepResult& r) {
            py::list rows;
            for (const auto& row : r.rows) rows.append(sweep_row_dict(row));
            return rows;
        })
        .def_property_readonly("model", [](const SweepResult& r) { return model_dict(r.model); })
        .def_property_readonly("latent_model", [](const SweepResult& r) {
                return r.latent_model.n_layers > 0 ? py::object(model_dict(r.latent_model)) : py::object(py::none());
            }, "the model of the latent rows' bytes per token (None without a latent data set)")
        .def_readonly("timing", &SweepResult::timing_method)
        .def("format", [](const SweepResult& r, const std::string& format) {
            return text(format, [&](TableFormat f) { return format_sweep(r, f); });
        }, "format"_a = "markdown", "The table as 'markdown', 'csv' or 'json' text.");

    m.def("sweep", &sweep, "datasets"_a, "pairs"_a = py::none(), "model"_a = py::none(), "timing"_a = true, "repeats"_a = 10,
          "data_seed"_a = 0, "seed"_a = kDefaultSeed, "block_tokens"_a = 32, "top_k"_a = 8,
          "int8_value_weights"_a = false, "progress"_a = py::none(),
          "Errors against the FP32 reference and decode time vs f16 for each data set (spec or kvq.Dataset) and K/V "
          "pair ('q8_0/q4_0', 'q4_0+rot+center/q4_0'; None: the default list). model: a preset or config.json for "
          "bytes per token (None: the model of npy dumps, from their shape and meta.json, else llama-3-8b). int8_value_weights: q4_0 values on int8 weights (kvq.KVCache's), in the errors and "
          "the timing. progress(done, total) is called as the sweep goes; Ctrl-C stops it.");

    py::class_<Plan>(m, "Plan", "KV-cache bytes of a model for each K/V pair (kvq.plan).")
        .def_property_readonly("rows", [](const Plan& p) {
            py::list rows;
            for (const auto& row : p.rows) rows.append(plan_row_dict(row, p.model, p.options));
            return rows;
        })
        .def_property_readonly("model", [](const Plan& p) { return model_dict(p.model); })
        .def_property_readonly("context", [](const Plan& p) { return p.options.context; })
        .def_property_readonly("batch", [](const Plan& p) { return p.options.batch; })
        .def("format", [](const Plan& p, const std::string& format) {
            return text(format, [&](TableFormat f) { return format_plan(p.model, p.rows, p.options, f); });
        }, "format"_a = "markdown", "The plan as 'markdown', 'csv' or 'json' text.");

    m.def("plan", [](const std::string& model, const std::optional<std::vector<std::string>>& pairs, size_t context, size_t batch,
                     int block_tokens, const std::string& staging) {
            if (staging != "f32" && staging != "f16") raise_value_error("staging must be 'f32' or 'f16', got '" + staging + "'");
            Plan p;
            p.model = load_model(model);
            p.options = {context, batch, block_tokens, staging == "f16" ? StagingType::f16 : StagingType::f32};
            p.rows = plan_memory(p.model, formats_from(pairs), p.options);
            return p;
        }, "model"_a = "llama-3-8b", "pairs"_a = py::none(), "context"_a = 8192, "batch"_a = 1, "block_tokens"_a = 32,
        "staging"_a = "f32", "KV-cache bytes per token and for context × batch, per K/V pair, next to fp16. model: a preset name, a "
        "Hugging Face config.json, or a directory holding one.");
    m.def("model_presets", [] {
        py::list out;
        for (const auto& p : model_presets()) out.append(model_dict(p));
        return out;
    }, "The planner's built-in model shapes.");
    m.def("model_shape", [](const std::string& name_or_path) { return model_dict(load_model(name_or_path)); }, "name_or_path"_a,
          "The attention shape of a preset or a Hugging Face config.json.");
    m.def("default_pairs", [](bool latent) {
        std::vector<std::string> out;
        for (const auto& f : latent ? default_latent_formats() : default_kv_formats()) out.push_back(f.label());
        return out;
    }, "latent"_a = false, "The K/V pairs kvq.sweep and kvq.plan use by default; latent=True: those kvq.sweep uses on a latent "
       "data set (DeepSeek's MLA: every codec a latent cache holds, as K/K).");
    m.def("codec_table", [](const std::string& format, int head_dim) {
        return text(format, [&](TableFormat f) { return format_codec_info(f, head_dim); });
    }, "format"_a = "markdown", "head_dim"_a = 128, "The codec table and the SIMD level, as 'markdown', 'csv' or 'json' text.");
}

const Registration registration("eval", bind_eval);

}  // namespace
}  // namespace kvq::python
