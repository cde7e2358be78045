// Data sets for the accuracy tables: the KVData accessors, the Gaussian set, .npy dumps, and specs.
#include "kvq/research/datasets.hpp"

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "input_file.hpp"
#include "json_reader.hpp"
#include "kvq/research/npy.hpp"
#include "random.hpp"
#include "spec_params.hpp"

namespace kvq {
namespace {

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument(what); }

// A dump's meta.json holds a few names and numbers (one window per layer at most).
constexpr size_t kMaxMetaBytes = size_t(1) << 20;

void fill_normal(std::vector<float>& x, detail::Rng& rng) {
    for (float& v : x) v = static_cast<float>(rng.normal());
}

std::vector<int> last_positions(int tokens, int n) {
    if (n <= 0 || n > tokens) bad("data set: query_positions must be in 1.." + std::to_string(tokens) + ", got " + std::to_string(n));
    std::vector<int> pos(n);
    for (int i = 0; i < n; ++i) pos[i] = tokens - n + i;
    return pos;
}

void check_positive(const char* what, int x) {
    if (x <= 0) bad(std::string("data set: ") + what + " must be positive, got " + std::to_string(x));
}

// A synthetic data set is made in memory: its keys, values and queries must fit kMaxDatasetValues floats
// each (checked in double, so that no product of the knobs overflows on the way).
void check_size(const std::string& context, int layers, int tokens, int kv_heads, int q_per_kv, int head_dim,
                int query_positions) {
    for (auto [what, x] : {std::pair{"layers", layers}, {"kv_heads", kv_heads}, {"q_per_kv", q_per_kv},
                           {"head_dim", head_dim}, {"tokens", tokens}}) {
        check_positive(what, x);
    }
    const double kv = double(layers) * tokens * kv_heads * head_dim;
    const double q = double(layers) * query_positions * kv_heads * q_per_kv * head_dim;
    if (kv > double(kMaxDatasetValues) || q > double(kMaxDatasetValues)) {
        char text[64];
        std::snprintf(text, sizeof text, "%.3g", std::max(kv, q));
        bad(context + ": " + text + " values per tensor (layers x tokens x kv_heads x head_dim) is beyond the " +
            std::to_string(kMaxDatasetValues) + " a synthetic data set may hold");
    }
}

// A window in tokens: a non-negative integer (0 = full attention).
int window_value(const detail::JsonValue& v, const std::string& what) {
    const double* x = v.as_number();
    if (!x || !(*x >= 0) || *x != std::floor(*x) || *x > 2147483647.0) bad(what + " must be a non-negative integer (0 = full attention)");
    return static_cast<int>(*x);
}

// The per-layer sliding windows of a dump's meta.json: "windows" (one integer per layer, 0 = full), or
// Hugging Face's "sliding_window" with "layer_types"; empty when neither is given.
std::vector<int> read_windows(const detail::JsonValue& json, int layers, const std::string& file) {
    std::vector<int> out;
    const detail::JsonValue* windows = json.find("windows");
    if (windows && !windows->is_null()) {
        const auto* list = windows->as_array();
        if (!list) bad(file + ": 'windows' must be a list of one integer per layer (0 = full attention)");
        for (size_t l = 0; l < list->size(); ++l) out.push_back(window_value((*list)[l], file + ": windows[" + std::to_string(l) + "]"));
        if (out.size() != size_t(layers)) {
            bad(file + ": 'windows' has " + std::to_string(out.size()) + " entries but k.npy has " + std::to_string(layers) + " layers");
        }
        return out;
    }
    const detail::JsonValue* sliding = json.find("sliding_window");
    const detail::JsonValue* types = json.find("layer_types");
    const bool has_sliding = sliding && !sliding->is_null(), has_types = types && !types->is_null();
    if (!has_sliding && !has_types) return out;
    if (!has_sliding || !has_types) bad(file + ": 'sliding_window' and 'layer_types' go together (or give 'windows')");
    const int w = window_value(*sliding, file + ": 'sliding_window'");
    const auto* list = types->as_array();
    if (!list || list->size() != size_t(layers)) {
        bad(file + ": 'layer_types' must be a list of one entry per layer (" + std::to_string(layers) + ")");
    }
    for (size_t l = 0; l < list->size(); ++l) {
        const std::string* t = (*list)[l].as_string();
        if (t && *t == "sliding_attention") out.push_back(w);
        else if (t && *t == "full_attention") out.push_back(0);
        else bad(file + ": layer_types[" + std::to_string(l) + "] must be \"sliding_attention\" or \"full_attention\"");
    }
    return out;
}

}  // namespace

float KVData::softmax_scale() const { return scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim)); }

std::vector<float> KVData::keys(int layer, int kv_head, size_t n_tokens) const {
    std::vector<float> out(n_tokens * head_dim);
    for (size_t t = 0; t < n_tokens; ++t) {
        const float* src = k.data() + ((size_t(layer) * tokens + t) * kv_heads + kv_head) * head_dim;
        std::copy(src, src + head_dim, out.data() + t * head_dim);
    }
    return out;
}

std::vector<float> KVData::values(int layer, int kv_head, size_t n_tokens) const {
    const size_t d = size_t(dv()), row = latent ? size_t(head_dim) : d;  // a latent's: its key rows' first dv()
    std::vector<float> out(n_tokens * d);
    for (size_t t = 0; t < n_tokens; ++t) {
        const float* src = (latent ? k : v).data() + ((size_t(layer) * tokens + t) * kv_heads + kv_head) * row;
        std::copy(src, src + d, out.data() + t * d);
    }
    return out;
}

std::vector<float> KVData::queries(int layer, int kv_head, int i) const {
    const int g = group();
    const float* src = q.data() + ((size_t(layer) * n_queries() + i) * q_heads + size_t(kv_head) * g) * head_dim;
    return {src, src + size_t(g) * head_dim};
}

void KVData::validate() const {
    check_positive("layers", layers);
    check_positive("tokens", tokens);
    check_positive("kv_heads", kv_heads);
    check_positive("head_dim", head_dim);
    if (q_heads <= 0 || q_heads % kv_heads != 0) {
        bad("data set '" + name + "': query heads (" + std::to_string(q_heads) + ") must be a positive multiple of kv heads (" +
            std::to_string(kv_heads) + ")");
    }
    if (head_dim_v < 0) bad("data set '" + name + "': head_dim_v must be positive (0: head_dim)");
    if (latent && dv() > head_dim) {
        bad("data set '" + name + "': a latent's values are its keys' first head_dim_v values: head_dim_v (" +
            std::to_string(dv()) + ") must be at most head_dim (" + std::to_string(head_dim) + ")");
    }
    const size_t rows = size_t(layers) * tokens * kv_heads;
    if (k.size() != rows * head_dim || v.size() != (latent ? 0 : rows * dv())) {
        bad("data set '" + name + "': keys or values do not match the shape" + (latent ? " (a latent has no values of its own)" : ""));
    }
    if (query_positions.empty()) bad("data set '" + name + "': no query positions");
    for (size_t i = 0; i < query_positions.size(); ++i) {
        if (query_positions[i] < 0 || query_positions[i] >= tokens || (i && query_positions[i] <= query_positions[i - 1])) {
            bad("data set '" + name + "': query positions must increase within 0.." + std::to_string(tokens - 1));
        }
    }
    if (q.size() != size_t(layers) * query_positions.size() * q_heads * head_dim) {
        bad("data set '" + name + "': queries do not match the shape");
    }
    if (!windows.empty() && windows.size() != size_t(layers)) {
        bad("data set '" + name + "': " + std::to_string(windows.size()) + " sliding windows for " + std::to_string(layers) +
            " layers (give one per layer, 0 = full attention, or none)");
    }
    for (size_t l = 0; l < windows.size(); ++l) {
        if (windows[l] < 0) bad("data set '" + name + "': the sliding window of layer " + std::to_string(l) + " is negative");
    }
    if (!std::isfinite(scale) || scale < 0) bad("data set '" + name + "': the softmax scale must be finite and positive (0: 1/sqrt(head_dim))");
    // Attention on NaN or Inf has no reference to measure against: refused, with where it is.
    const auto check_finite = [&](const char* what, const std::vector<float>& x, int per_layer_rows, int heads,
                                  const std::vector<int>* positions, int dim) {
        const auto it = std::find_if(x.begin(), x.end(), [](float f) { return !std::isfinite(f); });
        if (it == x.end()) return;
        const size_t i = static_cast<size_t>(it - x.begin()) / dim;
        const size_t head = i % heads, row = i / heads % per_layer_rows, layer = i / heads / per_layer_rows;
        const size_t token = positions ? size_t((*positions)[row]) : row;
        bad("data set '" + name + "': " + what + " holds " + std::to_string(*it) + " at layer " + std::to_string(layer) + ", token " +
            std::to_string(token) + ", head " + std::to_string(head) + " (keys, values and queries must be finite)");
    };
    check_finite("the keys", k, tokens, kv_heads, nullptr, head_dim);
    check_finite("the values", v, tokens, kv_heads, nullptr, dv());
    check_finite("the queries", q, n_queries(), q_heads, &query_positions, head_dim);
}

KVData make_gaussian_data(const GaussianDataOptions& o) {
    for (auto [what, x] : {std::pair{"layers", o.layers}, {"kv_heads", o.kv_heads}, {"q_per_kv", o.q_per_kv},
                           {"head_dim", o.head_dim}, {"tokens", o.tokens}}) {
        check_positive(what, x);
    }
    KVData d;
    d.name = "gaussian";
    d.layers = o.layers;
    d.tokens = o.tokens;
    d.kv_heads = o.kv_heads;
    d.q_heads = o.kv_heads * o.q_per_kv;
    d.head_dim = o.head_dim;
    d.query_positions = last_positions(o.tokens, o.query_positions);
    d.k.resize(size_t(o.layers) * o.tokens * o.kv_heads * o.head_dim);
    d.v.resize(d.k.size());
    d.q.resize(size_t(o.layers) * d.query_positions.size() * d.q_heads * o.head_dim);
    detail::Rng rk(detail::derive_seed(o.seed, 1)), rv(detail::derive_seed(o.seed, 2)), rq(detail::derive_seed(o.seed, 3));
    fill_normal(d.k, rk);
    fill_normal(d.v, rv);
    fill_normal(d.q, rq);
    return d;
}

KVData load_npy_data(const std::string& dir, const NpyDataOptions& options) {
    namespace fs = std::filesystem;
    const fs::path root(dir);
    std::error_code ec;  // the non-throwing forms: a path fs cannot look at is an error message, not a crash
    if (!fs::is_directory(root, ec)) bad("npy data: '" + dir + "' is not a directory (expected k.npy, v.npy and optionally q.npy in it)");
    // Present when anything is there (a dangling link or a FIFO too: reading it says what is wrong).
    auto present = [&](const fs::path& path) { return fs::exists(fs::symlink_status(path, ec)); };
    auto load = [&](const char* file) {
        const fs::path path = root / file;
        if (!present(path)) bad("npy data: missing " + path.string());
        NpyArray a = read_npy(path.string());
        const bool dims_fit = std::all_of(a.shape.begin(), a.shape.end(), [](size_t s) { return s <= size_t(INT_MAX); });
        if (a.shape.size() != 4 || a.size() == 0 || !dims_fit) {
            bad(path.string() + ": expected shape (layers, tokens, " + (file[0] == 'q' ? "n_heads" : "kv_heads") +
                ", head_dim), got " + shape_string(a.shape) + (dims_fit ? "" : " (each at most " + std::to_string(INT_MAX) + ")"));
        }
        return a;
    };
    NpyArray k = load("k.npy"), v = load("v.npy");
    if (k.shape != v.shape) bad("npy data: k.npy has shape " + shape_string(k.shape) + " but v.npy has " + shape_string(v.shape));
    KVData d;
    d.name = "npy:" + dir;
    d.source_model = dir;
    d.layers = static_cast<int>(k.shape[0]);
    d.tokens = static_cast<int>(k.shape[1]);
    d.kv_heads = static_cast<int>(k.shape[2]);
    d.head_dim = static_cast<int>(k.shape[3]);
    d.query_positions = last_positions(d.tokens, options.query_positions);
    d.k = std::move(k.data);
    d.v = std::move(v.data);
    const int nq = d.n_queries();
    if (present(root / "q.npy")) {
        NpyArray q = load("q.npy");
        if (q.shape[0] != k.shape[0] || q.shape[1] != k.shape[1] || q.shape[3] != k.shape[3] || q.shape[2] % k.shape[2] != 0) {
            bad((root / "q.npy").string() + ": expected shape (" + std::to_string(d.layers) + ", " + std::to_string(d.tokens) +
                ", a multiple of " + std::to_string(d.kv_heads) + ", " + std::to_string(d.head_dim) + ") to match k.npy, got " +
                shape_string(q.shape));
        }
        d.q_heads = static_cast<int>(q.shape[2]);
        const size_t row = size_t(d.q_heads) * d.head_dim;
        d.q.resize(size_t(d.layers) * nq * row);
        for (int l = 0; l < d.layers; ++l) {
            for (int i = 0; i < nq; ++i) {
                const float* src = q.data.data() + (size_t(l) * d.tokens + d.query_positions[i]) * row;
                std::copy(src, src + row, d.q.data() + (size_t(l) * nq + i) * row);
            }
        }
    } else {
        // Synthetic queries: each channel weighted by the keys' RMS in that channel.
        d.q_heads = d.kv_heads;
        d.q.resize(size_t(d.layers) * nq * d.q_heads * d.head_dim);
        detail::Rng rng(detail::derive_seed(options.seed, 7));
        for (int l = 0; l < d.layers; ++l) {
            for (int h = 0; h < d.kv_heads; ++h) {
                std::vector<double> rms(d.head_dim);
                const auto keys = d.keys(l, h, d.tokens);
                for (size_t t = 0; t < size_t(d.tokens); ++t)
                    for (int c = 0; c < d.head_dim; ++c) rms[c] += double(keys[t * d.head_dim + c]) * keys[t * d.head_dim + c];
                double mean_rms = 0;
                for (double& r : rms) mean_rms += (r = std::sqrt(r / d.tokens));
                mean_rms /= d.head_dim;
                for (int i = 0; i < nq; ++i) {
                    float* dst = d.q.data() + ((size_t(l) * nq + i) * d.q_heads + h) * d.head_dim;
                    for (int c = 0; c < d.head_dim; ++c) dst[c] = static_cast<float>(rng.normal() * (mean_rms > 0 ? rms[c] / mean_rms : 1.0));
                }
            }
        }
    }
    // The softmax scale, when the dump states it (scripts/dump_hf_kv.py writes the model's own).
    if (const fs::path meta = root / "meta.json"; present(meta)) {
        const std::string text = detail::read_text_file(meta.string(), kMaxMetaBytes);
        detail::JsonValue json;
        try {
            json = detail::parse_json(text);
        } catch (const std::invalid_argument& e) {
            bad(meta.string() + ": " + e.what());
        }
        if (const detail::JsonValue* scale = json.find("scale"); scale && !scale->is_null()) {
            // The scale is a float in attention: one float cannot hold (1e300 or 1e-300) is refused, not
            // rounded to Inf or to 0 (which would mean 1/sqrt(head_dim)).
            const double* x = scale->as_number();
            if (!x || !(*x >= FLT_MIN && *x <= FLT_MAX)) {
                bad(meta.string() + ": 'scale' must be a positive number within float's range (1.2e-38 .. 3.4e38)");
            }
            d.scale = static_cast<float>(*x);
        }
        d.windows = read_windows(json, d.layers, meta.string());
        if (const detail::JsonValue* model = json.find("model"); model && model->as_string() && !model->as_string()->empty()) {
            d.source_model = *model->as_string();
        }
    }
    d.validate();
    return d;
}

KVData make_dataset(std::string_view spec, uint64_t seed) {
    const size_t colon = spec.find(':');
    const std::string_view kind = spec.substr(0, colon);
    const std::string_view params = colon == std::string_view::npos ? std::string_view{} : spec.substr(colon + 1);
    const std::string context = "data set '" + std::string(spec) + "'";
    if (kind == "gaussian") {
        using O = GaussianDataOptions;
        static const detail::Param<O> fields[] = {{"layers", &O::layers},     {"kv_heads", &O::kv_heads},
                                                  {"q_per_kv", &O::q_per_kv}, {"head_dim", &O::head_dim},
                                                  {"tokens", &O::tokens},     {"query_positions", &O::query_positions},
                                                  {"seed", &O::seed}};
        O o;
        o.seed = seed;
        detail::set_params<O>(o, params, fields, context);
        check_size(context, o.layers, o.tokens, o.kv_heads, o.q_per_kv, o.head_dim, o.query_positions);
        KVData d = make_gaussian_data(o);
        d.name = std::string(spec);
        return d;
    }
    if (kind == "llm") {
        using O = LlmDataOptions;
        static const detail::Param<O> fields[] = {
            {"layers", &O::layers},
            {"kv_heads", &O::kv_heads},
            {"q_per_kv", &O::q_per_kv},
            {"head_dim", &O::head_dim},
            {"tokens", &O::tokens},
            {"query_positions", &O::query_positions},
            {"outlier_channels", &O::outlier_channels},
            {"outlier_magnitude", &O::outlier_magnitude},
            {"key_bias", &O::key_bias},
            {"rope", &O::rope},
            {"rope_base", &O::rope_base},
            {"sink", &O::sink},
            {"sink_logit", &O::sink_logit},
            {"value_outlier_fraction", &O::value_outlier_fraction},
            {"value_outlier_magnitude", &O::value_outlier_magnitude},
            {"sharpness_max", &O::sharpness_max},
            {"seed", &O::seed},
        };
        O o;
        o.seed = seed;
        detail::set_params<O>(o, params, fields, context);
        check_size(context, o.layers, o.tokens, o.kv_heads, o.q_per_kv, o.head_dim, o.query_positions);
        KVData d = make_llm_data(o);
        d.name = std::string(spec);
        return d;
    }
    if (kind == "mla") {
        using O = MlaDataOptions;
        static const detail::Param<O> fields[] = {{"layers", &O::layers}, {"q_heads", &O::q_heads}, {"tokens", &O::tokens},
                                                  {"query_positions", &O::query_positions}, {"seed", &O::seed}};
        O o;
        o.seed = seed;
        detail::set_params<O>(o, params, fields, context);
        check_positive("q_heads", o.q_heads);
        check_size(context, o.layers, o.tokens, 1, o.q_heads, kMlaLatentDim + kMlaRopeDim, o.query_positions);
        KVData d = make_mla_data(o);
        d.name = std::string(spec);
        return d;
    }
    if (kind == "npy") {
        if (params.empty()) bad(context + ": give a directory, as in npy:DIR");
        const size_t comma = params.find(',');
        NpyDataOptions o;
        o.seed = seed;
        static const detail::Param<NpyDataOptions> fields[] = {{"query_positions", &NpyDataOptions::query_positions},
                                                               {"seed", &NpyDataOptions::seed}};
        if (comma != std::string_view::npos) detail::set_params<NpyDataOptions>(o, params.substr(comma + 1), fields, context);
        return load_npy_data(std::string(params.substr(0, comma)), o);
    }
    std::string known;
    for (const auto& [name, what] : dataset_kinds()) known += (known.empty() ? "" : ", ") + name;
    bad("unknown data set '" + std::string(spec) + "' (known: " + known + ")");
}

std::vector<std::pair<std::string, std::string>> dataset_kinds() {
    return {{"gaussian", "i.i.d. N(0,1) keys, values and queries"},
            {"llm", "synthetic LLM-like attention: key outlier channels and bias, RoPE, a sink token, value outliers, "
                    "sharp and diffuse heads (docs/datasets.md)"},
            {"mla", "a synthetic latent of DeepSeek V3's MLA: one 576-value row per token is the key, its first 512 "
                    "values the value; query heads share it (docs/datasets.md)"},
            {"npy:DIR", "real dumps DIR/k.npy, DIR/v.npy [, DIR/q.npy], shape (layers, tokens, heads, head_dim)"}};
}

}  // namespace kvq
