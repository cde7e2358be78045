// kvq.reference_attention and kvq.attention_error: the FP32 reference and the error metrics of a
// key/value codec pair against it (include/kvq/research/eval.hpp).
#include <optional>
#include <string>

#include "bindings.hpp"
#include "kvq/research/eval.hpp"

namespace kvq::python {
namespace {

using namespace pybind11::literals;

struct AttentionInputs {
    CheckedArray q, k, v;
    int n_q = 0, d = 0;
    size_t n_rows = 0;
};

// q: (n_q, d), k and v: (n, d), all finite (a NaN would make the reference meaningless, not wrong).
AttentionInputs attention_inputs(const char* fn, py::handle q_obj, py::handle k_obj, py::handle v_obj) {
    AttentionInputs in;
    const std::string f(fn);
    in.q = float_array(q_obj, f + ": q", {{"n_q"}, {"head_dim"}});
    const py::ssize_t d = in.q.dim(1);
    in.k = float_array(k_obj, f + ": k", {{"n"}, {"head_dim", d}});
    in.v = float_array(v_obj, f + ": v", {{"n", in.k.dim(0)}, {"head_dim", d}});
    if (in.q.dim(0) == 0 || in.k.dim(0) == 0 || d == 0) {
        raise_value_error(f + ": q, k and v must not be empty");
    }
    require_finite(in.q, f + ": q");
    require_finite(in.k, f + ": k");
    require_finite(in.v, f + ": v");
    in.n_q = static_cast<int>(in.q.dim(0));
    in.d = static_cast<int>(d);
    in.n_rows = static_cast<size_t>(in.k.dim(0));
    return in;
}

float scale_or_default(std::optional<float> scale) {
    if (scale && !(*scale > 0)) raise_value_error("scale must be positive (or None for 1/sqrt(head_dim))");
    return scale.value_or(0.0f);
}

py::object reference_attention(py::handle q_obj, py::handle k_obj, py::handle v_obj, std::optional<float> scale,
                               bool return_weights) {
    const AttentionInputs in = attention_inputs("reference_attention", q_obj, k_obj, v_obj);
    const float s = scale_or_default(scale);
    auto out = new_float_array({in.n_q, in.d});
    py::array_t<float> weights;
    if (return_weights) weights = new_float_array({in.n_q, static_cast<py::ssize_t>(in.n_rows)});
    float* o = out.mutable_data();
    float* w = return_weights ? weights.mutable_data() : nullptr;
    {
        WithoutGil unlocked;
        kvq::reference_attention(in.q.floats(), in.n_q, in.k.floats(), in.v.floats(), in.n_rows, in.d, s, o, w);
    }
    if (return_weights) return py::make_tuple(out, weights);
    return out;
}

py::dict summary(const MetricSummary& m) { return py::dict("mean"_a = m.mean, "worst"_a = m.worst); }

py::dict attention_error(py::handle q_obj, py::handle k_obj, py::handle v_obj, const std::string& key_codec,
                         const std::string& value_codec, std::optional<float> scale, int top_k, uint64_t seed) {
    const AttentionInputs in = attention_inputs("attention_error", q_obj, k_obj, v_obj);
    const float s = scale_or_default(scale);
    if (top_k < 1) raise_value_error("attention_error: top_k must be at least 1, got " + std::to_string(top_k));
    const Codec keys = Codec::make(key_codec, in.d, seed);
    const Codec values = Codec::make(value_codec, in.d, seed);
    AttentionErrors e;
    {
        WithoutGil unlocked;
        e = kvq::attention_error(in.q.floats(), in.n_q, in.k.floats(), in.v.floats(), in.n_rows, keys, values, s,
                                 top_k);
    }
    py::dict d;
    d["kl"] = summary(e.kl);
    d["score_rmse"] = summary(e.score_rmse);
    d["topk"] = summary(e.topk);
    d["output_l2"] = summary(e.output_l2);
    d["cosine"] = summary(e.cosine);
    d["queries"] = e.queries;
    d["top_k"] = top_k;
    d["key_bits_per_value"] = keys.bits_per_value();
    d["value_bits_per_value"] = values.bits_per_value();
    return d;
}

void bind_reference(py::module_& m) {
    m.def("reference_attention", &reference_attention, "q"_a, "k"_a, "v"_a, "scale"_a = py::none(), py::kw_only(),
          "return_weights"_a = false,
          "FP32 attention softmax(scale * q @ k.T) @ v on unquantized rows (Eigen): q (n_q, head_dim),\n"
          "k and v (n, head_dim), finite; scale None means 1/sqrt(head_dim). A query whose float scores overflow\n"
          "is computed in double. Returns (n_q, head_dim) float32, and the (n_q, n) attention weights as well\n"
          "when return_weights is true.");
    m.def("attention_error", &attention_error, "q"_a, "k"_a, "v"_a, "key_codec"_a = "q8_0", "value_codec"_a = "q4_0",
          "scale"_a = py::none(), "top_k"_a = 8, py::kw_only(), "seed"_a = kDefaultSeed,
          "Quantizes k and v with the codecs, runs attention on the codes and compares it per query with\n"
          "reference_attention (ValueError for a query whose scores q.k*scale overflow float). Returns a dict:\n"
          "kl, score_rmse, topk, output_l2, cosine (each {'mean', 'worst'};\n"
          "worst is the max of errors, the min of agreements), queries, top_k, key/value_bits_per_value.");
}

const Registration registration("reference", bind_reference);

}  // namespace
}  // namespace kvq::python
