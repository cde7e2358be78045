// FP32 reference attention with Eigen, and attention on quantized rows through the decode engine.
#include <Eigen/Dense>
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/row_keys.hpp"
#include "kvq/research/eval.hpp"
#include "quantized_attention.hpp"

namespace kvq {
namespace {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMap = Eigen::Map<const RowMatrix>;
using Map = Eigen::Map<RowMatrix>;

float default_scale(const char* fn, float scale, int d) {
    if (!std::isfinite(scale)) throw std::invalid_argument(std::string(fn) + ": the scale must be finite (<= 0 for 1/sqrt(d))");
    return scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(d));
}

void check_finite(const char* fn, const float* q, size_t n_q, const float* k, const float* v, size_t n_rows, size_t d,
                  size_t d_v) {
    if (!all_finite(q, n_q * d) || !all_finite(k, n_rows * d) || !all_finite(v, n_rows * d_v)) {
        throw std::invalid_argument(std::string(fn) + ": q, k and v must be finite (no NaN or Inf)");
    }
}

// Query i again in double precision: its float scores overflowed (finite inputs, |scale · q · k| beyond
// FLT_MAX). The weights and the output are within float's range (the output is a convex combination of v).
void attend_in_double(const float* q, const float* k, const float* v, size_t n_rows, int d, int d_v, float scale,
                      float* out, float* weights) {
    std::vector<double> s(n_rows), o(size_t(d_v), 0.0);
    double top = -INFINITY, sum = 0;
    for (size_t r = 0; r < n_rows; ++r) {
        double dot = 0;
        for (int j = 0; j < d; ++j) dot += double(q[j]) * k[r * d + j];
        top = std::max(top, s[r] = dot * scale);
    }
    for (size_t r = 0; r < n_rows; ++r) sum += (s[r] = std::exp(s[r] - top));
    for (size_t r = 0; r < n_rows; ++r) {
        weights[r] = static_cast<float>(s[r] /= sum);
        for (int j = 0; j < d_v; ++j) o[j] += s[r] * v[r * d_v + j];
    }
    for (int j = 0; j < d_v; ++j) out[j] = static_cast<float>(std::clamp(o[j], -double(FLT_MAX), double(FLT_MAX)));
}

void check_shape(int n_q, size_t n_rows, int d, int d_v) {
    if (n_q <= 0 || n_rows == 0 || d <= 0 || d_v <= 0) {
        throw std::invalid_argument("attention: need n_q > 0, n_rows > 0, d > 0 and d_v > 0, got n_q=" + std::to_string(n_q) +
                                    ", n_rows=" + std::to_string(n_rows) + ", d=" + std::to_string(d) + ", d_v=" + std::to_string(d_v));
    }
}

}  // namespace

void reference_attention(const float* q, int n_q, const float* k, const float* v, size_t n_rows, int d,
                         float scale, float* out, float* weights) {
    reference_attention(q, n_q, k, v, n_rows, d, d, scale, out, weights);
}

void reference_attention(const float* q, int n_q, const float* k, const float* v, size_t n_rows, int d, int d_v,
                         float scale, float* out, float* weights) {
    check_shape(n_q, n_rows, d, d_v);
    scale = default_scale("reference_attention", scale, d);
    check_finite("reference_attention", q, size_t(n_q), k, v, n_rows, size_t(d), size_t(d_v));
    std::vector<float> own;
    if (!weights) {
        own.resize(static_cast<size_t>(n_q) * n_rows);
        weights = own.data();
    }
    const auto n = static_cast<Eigen::Index>(n_rows);
    Map p(weights, n_q, n);
    p.noalias() = (ConstMap(q, n_q, d) * ConstMap(k, n, d).transpose()) * scale;
    detail::softmax_rows(weights, n_q, n_rows, n_rows);
    Map(out, n_q, d_v).noalias() = p * ConstMap(v, n, d_v);
    for (size_t i = 0; i < size_t(n_q); ++i) {
        float* w = weights + i * n_rows;
        if (!all_finite(w, n_rows) || !all_finite(out + i * d_v, size_t(d_v))) {
            attend_in_double(q + i * d, k, v, n_rows, d, d_v, scale, out + i * d_v, w);
        }
    }
}

AttentionErrors attention_error(const float* q, int n_q, const float* k, const float* v, size_t n_rows,
                                const Codec& key_codec, const Codec& value_codec, float scale, int top_k) {
    const int d = key_codec.head_dim();
    check_shape(n_q, n_rows, d, d);
    if (value_codec.head_dim() != d) throw std::invalid_argument("attention_error: key and value head_dim differ");
    scale = default_scale("attention_error", scale, d);
    const size_t nq = static_cast<size_t>(n_q);
    check_finite("attention_error", q, nq, k, v, n_rows, size_t(d), size_t(d));

    std::vector<float> ref_scores(nq * n_rows), ref_w(nq * n_rows), ref_out(nq * d);
    const auto n = static_cast<Eigen::Index>(n_rows);
    Map(ref_scores.data(), n_q, n).noalias() = (ConstMap(q, n_q, d) * ConstMap(k, n, d).transpose()) * scale;
    // The metrics compare float scores; a query whose scores float cannot hold has none to compare.
    for (size_t i = 0; i < nq; ++i) {
        if (!all_finite(ref_scores.data() + i * n_rows, n_rows)) {
            throw std::invalid_argument("attention_error: query " + std::to_string(i) +
                                        "'s scores (q · k · scale) are beyond float's range: the metrics compare float scores");
        }
    }
    ref_w = ref_scores;
    detail::softmax_rows(ref_w.data(), n_q, n_rows, n_rows);
    Map(ref_out.data(), n_q, d).noalias() = Map(ref_w.data(), n_q, n) * ConstMap(v, n, d);

    // On the codes, as the tables and engines attend: the cache's decode engine (quantized_attention).
    const detail::RowKeys keys(key_codec, 256);
    const auto values = detail::make_value_format(value_codec, 256, false);
    const detail::QuantizedKeys kq = detail::quantize_keys(keys, k, n_rows);
    const detail::QuantizedValues vq = detail::quantize_values(*values, v, n_rows);
    std::vector<float> scores(nq * n_rows), w(nq * n_rows), out(nq * d);
    detail::quantized_attention(kq, vq, q, n_q, 0, n_rows, scale, scores.data(), w.data(), out.data());
    return compare_attention(ref_scores.data(), ref_w.data(), ref_out.data(), scores.data(), w.data(), out.data(),
                             n_q, n_rows, d, top_k);
}

double roundtrip_relative_rmse(const Codec& codec, const float* x, size_t n_rows) {
    const size_t d = codec.head_dim();
    std::vector<uint8_t> bytes(n_rows * codec.row_bytes());
    std::vector<float> y(n_rows * d);
    codec.quantize_rows(x, n_rows, bytes.data());
    codec.dequantize_rows(bytes.data(), n_rows, y.data());
    double err = 0, norm = 0;
    for (size_t i = 0; i < n_rows * d; ++i) {
        err += double(y[i] - x[i]) * (y[i] - x[i]);
        norm += double(x[i]) * x[i];
    }
    return norm > 0 ? std::sqrt(err / norm) : std::sqrt(err);
}

}  // namespace kvq
