// The LLM-like synthetic data set (model and statistics in docs/datasets.md).
//
// Per layer and kv head, independently seeded:
//   keys (before RoPE)  k_t[c] = mu_c + sigma_c (sqrt(0.8) (A h_t)_c + sqrt(0.2) e_tc), h_t ~ N(0, I_16):
//                       low-rank content plus noise, channel scales sigma_c = exp(0.3 N), bias mu_c ~ N(0, b^2);
//   outlier channels    a few channels of the lowest-frequency RoPE pairs hold s_c M (0.8 + 0.6 e_tc): RMS M,
//                       the same sign for every token (persistent, as the key outliers KIVI/KVQuant report);
//   RoPE                rotate-half pairs (j, j + d/2) by t·base^(-2j/d);
//   sink                token 0's key gets an extra 2·sqrt(tr Σ) along a fixed direction u;
//   values              v_t = sigma'_c (sqrt(0.5) (B g_t)_c + sqrt(0.5) e), a fraction of tokens scaled by a
//                       magnitude (per-token outliers), the sink's value scaled by 0.1;
//   queries             built after RoPE to set each head's attention directly: a logit gap
//                       g = U(0, sharpness_max)·log(context) towards 1–3 target tokens (half of them recent),
//                       background logits of std 1, and a sink bonus b = log(context) + sink_logit + U(-3, 3):
//                       small g gives diffuse heads, large g sharp ones.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>

#include "kvq/research/datasets.hpp"
#include "random.hpp"

namespace kvq {
namespace {

constexpr int kContentRank = 16;
constexpr double kChannelSpread = 0.3;
constexpr double kBackgroundLogitStd = 1.0;
constexpr double kSinkValueScale = 0.1;
constexpr int kRecentWindow = 32;
constexpr double kSinkSpread = 3.0;

void check(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("llm data set: " + what);
}

struct HeadKeys {
    std::vector<double> sink_direction;  // unit vector u (empty without a sink)
    double sink_norm = 0;                // S
};

// Keys of one (layer, kv head), written into d.k.
HeadKeys make_keys(KVData& d, const LlmDataOptions& o, int layer, int head) {
    const int dim = d.head_dim, half = dim / 2, T = d.tokens;
    detail::Rng rng(detail::derive_seed(o.seed, 10, layer, head));
    std::vector<double> sigma(dim), mu(dim), a(size_t(dim) * kContentRank);
    for (int c = 0; c < dim; ++c) {
        sigma[c] = std::exp(kChannelSpread * rng.normal());
        mu[c] = o.key_bias * rng.normal();
    }
    for (double& x : a) x = rng.normal() / std::sqrt(double(kContentRank));
    // Outlier channels: distinct channels among the lowest-frequency half of the RoPE pairs.
    std::vector<int> outlier_sign(dim, 0);
    const int band = std::max(half / 2, 1);
    for (int n = 0; n < o.outlier_channels;) {
        const int pair = half - 1 - static_cast<int>(rng.below(band));
        const int c = rng.below(2) ? pair + half : pair;
        if (outlier_sign[c] != 0) continue;
        outlier_sign[c] = rng.below(2) ? 1 : -1;
        ++n;
    }
    std::vector<double> h(kContentRank), row(dim);
    for (int t = 0; t < T; ++t) {
        for (double& x : h) x = rng.normal();
        for (int c = 0; c < dim; ++c) {
            if (outlier_sign[c]) {
                row[c] = outlier_sign[c] * o.outlier_magnitude * (0.8 + 0.6 * rng.normal());
                continue;
            }
            double content = 0;
            for (int r = 0; r < kContentRank; ++r) content += a[size_t(c) * kContentRank + r] * h[r];
            row[c] = mu[c] + sigma[c] * (std::sqrt(0.8) * content + std::sqrt(0.2) * rng.normal());
        }
        if (o.rope) {
            for (int j = 0; j < half; ++j) {
                const double angle = t * std::pow(double(o.rope_base), -2.0 * j / dim);
                const double x0 = row[j], x1 = row[j + half], c = std::cos(angle), s = std::sin(angle);
                row[j] = x0 * c - x1 * s;
                row[j + half] = x0 * s + x1 * c;
            }
        }
        float* dst = d.k.data() + ((size_t(layer) * T + t) * d.kv_heads + head) * dim;
        for (int c = 0; c < dim; ++c) dst[c] = static_cast<float>(row[c]);
    }
    HeadKeys out;
    if (o.sink) {
        // S = 2·sqrt(tr Σ) of the keys: the sink key stands out without dwarfing the outlier channels.
        std::vector<double> mean(dim, 0), sq(dim, 0);
        for (int t = 0; t < T; ++t) {
            const float* k = d.k.data() + ((size_t(layer) * T + t) * d.kv_heads + head) * dim;
            for (int c = 0; c < dim; ++c) {
                mean[c] += k[c];
                sq[c] += double(k[c]) * k[c];
            }
        }
        double trace = 0;
        for (int c = 0; c < dim; ++c) trace += sq[c] / T - (mean[c] / T) * (mean[c] / T);
        out.sink_direction.resize(dim);
        double norm = 0;
        for (double& x : out.sink_direction) {
            x = rng.normal();
            norm += x * x;
        }
        for (double& x : out.sink_direction) x /= std::sqrt(norm);
        out.sink_norm = 2.0 * std::sqrt(std::max(trace, 1e-12));
        float* k0 = d.k.data() + size_t(layer) * T * d.kv_heads * dim + size_t(head) * dim;
        for (int c = 0; c < dim; ++c) k0[c] += static_cast<float>(out.sink_norm * out.sink_direction[c]);
    }
    return out;
}

void make_values(KVData& d, const LlmDataOptions& o, int layer, int head) {
    const int dim = d.head_dim, T = d.tokens;
    detail::Rng rng(detail::derive_seed(o.seed, 11, layer, head));
    std::vector<double> sigma(dim), b(size_t(dim) * kContentRank), g(kContentRank);
    for (double& s : sigma) s = std::exp(kChannelSpread * rng.normal());
    for (double& x : b) x = rng.normal() / std::sqrt(double(kContentRank));
    for (int t = 0; t < T; ++t) {
        for (double& x : g) x = rng.normal();
        double scale = rng.uniform() < o.value_outlier_fraction ? o.value_outlier_magnitude : 1.0;
        if (o.sink && t == 0) scale = kSinkValueScale;
        float* dst = d.v.data() + ((size_t(layer) * T + t) * d.kv_heads + head) * dim;
        for (int c = 0; c < dim; ++c) {
            double content = 0;
            for (int r = 0; r < kContentRank; ++r) content += b[size_t(c) * kContentRank + r] * g[r];
            dst[c] = static_cast<float>(scale * sigma[c] * (std::sqrt(0.5) * content + std::sqrt(0.5) * rng.normal()));
        }
    }
}

// Queries of the g query heads that share (layer, kv head).
void make_queries(KVData& d, const LlmDataOptions& o, int layer, int head, const HeadKeys& sink) {
    const int dim = d.head_dim, nq = d.n_queries(), g = d.group();
    const double sqrt_d = std::sqrt(double(dim));
    // Context statistics (mean key and total variance) over tokens 1..first query position.
    const int p0 = d.query_positions.front();
    const auto keys = d.keys(layer, head, size_t(d.tokens));
    std::vector<double> mean(dim, 0);
    double trace = 0;
    {
        std::vector<double> sq(dim, 0);
        const int n = std::max(p0, 1);
        for (int t = 1; t <= p0; ++t) {
            for (int c = 0; c < dim; ++c) {
                mean[c] += keys[size_t(t) * dim + c];
                sq[c] += double(keys[size_t(t) * dim + c]) * keys[size_t(t) * dim + c];
            }
        }
        for (int c = 0; c < dim; ++c) {
            mean[c] /= n;
            trace += std::max(sq[c] / n - mean[c] * mean[c], 0.0);
        }
        trace = std::max(trace, 1e-12);
    }
    std::vector<double> q(dim), w(dim);
    for (int j = 0; j < g; ++j) {
        const int qh = head * g + j;
        detail::Rng rng(detail::derive_seed(o.seed, 12, layer, qh));
        // Both in units tied to log(context), so heads keep their character as the context grows.
        const double sharpness = rng.uniform(0.0, o.sharpness_max);
        const double sink_offset = o.sink_logit + rng.uniform(-kSinkSpread, kSinkSpread);
        for (int i = 0; i < nq; ++i) {
            const int p = d.query_positions[i];
            const double log_context = std::log(double(p + 1));
            const double gap = sharpness * log_context;
            const double sink_bonus = log_context + sink_offset;
            std::fill(q.begin(), q.end(), 0.0);
            if (p >= 1) {
                // Content: logit gap `gap` towards each of n_t target tokens.
                const double u = rng.uniform();
                const int n_targets = u < 0.6 ? 1 : (u < 0.85 ? 2 : 3);
                std::fill(w.begin(), w.end(), 0.0);
                for (int n = 0; n < n_targets; ++n) {
                    const int lo = rng.below(2) ? std::max(1, p - kRecentWindow + 1) : 1;
                    const int t = lo + static_cast<int>(rng.below(uint64_t(p - lo + 1)));
                    for (int c = 0; c < dim; ++c) w[c] += keys[size_t(t) * dim + c] - mean[c];
                }
                const double w2 = std::inner_product(w.begin(), w.end(), w.begin(), 0.0);
                if (w2 > 0) {
                    for (int c = 0; c < dim; ++c) q[c] += gap * sqrt_d * n_targets * w[c] / w2;
                }
            }
            // Background: a random direction whose logits have std kBackgroundLogitStd.
            double n2 = 0;
            for (double& x : w) {
                x = rng.normal();
                n2 += x * x;
            }
            const double noise_norm = kBackgroundLogitStd * dim / std::sqrt(trace);
            for (int c = 0; c < dim; ++c) q[c] += noise_norm * w[c] / std::sqrt(n2);
            if (!sink.sink_direction.empty()) {
                for (int c = 0; c < dim; ++c) q[c] += sink_bonus * sqrt_d / sink.sink_norm * sink.sink_direction[c];
            }
            float* dst = d.q.data() + ((size_t(layer) * nq + i) * d.q_heads + qh) * dim;
            for (int c = 0; c < dim; ++c) dst[c] = static_cast<float>(q[c]);
        }
    }
}

}  // namespace

KVData make_llm_data(const LlmDataOptions& o) {
    check(o.layers > 0 && o.kv_heads > 0 && o.q_per_kv > 0 && o.tokens > 1, "layers, kv_heads, q_per_kv must be positive and tokens > 1");
    check(o.head_dim >= 4 && o.head_dim % 2 == 0, "head_dim must be even and at least 4, got " + std::to_string(o.head_dim));
    check(o.outlier_channels >= 0 && o.outlier_channels <= o.head_dim / 4,
          "outlier_channels must be in 0.." + std::to_string(o.head_dim / 4) + " (a quarter of head_dim), got " +
              std::to_string(o.outlier_channels));
    check(o.value_outlier_fraction >= 0 && o.value_outlier_fraction <= 1, "value_outlier_fraction must be in [0, 1]");
    check(o.rope_base > 1, "rope_base must be greater than 1");
    check(std::isfinite(o.sink_logit), "sink_logit must be finite");
    for (float x : {o.outlier_magnitude, o.key_bias, o.value_outlier_magnitude, o.sharpness_max}) {
        check(std::isfinite(x) && x >= 0, "magnitudes, key_bias and sharpness_max must be finite and >= 0");
    }
    KVData d;
    d.name = "llm";
    d.layers = o.layers;
    d.tokens = o.tokens;
    d.kv_heads = o.kv_heads;
    d.q_heads = o.kv_heads * o.q_per_kv;
    d.head_dim = o.head_dim;
    check(o.query_positions > 0 && o.query_positions < o.tokens, "query_positions must be in 1.." + std::to_string(o.tokens - 1));
    for (int i = 0; i < o.query_positions; ++i) d.query_positions.push_back(o.tokens - o.query_positions + i);
    d.k.resize(size_t(o.layers) * o.tokens * o.kv_heads * o.head_dim);
    d.v.resize(d.k.size());
    d.q.resize(size_t(o.layers) * o.query_positions * d.q_heads * o.head_dim);
    for (int l = 0; l < o.layers; ++l) {
        for (int h = 0; h < o.kv_heads; ++h) {
            const HeadKeys sink = make_keys(d, o, l, h);
            make_values(d, o, l, h);
            make_queries(d, o, l, h, sink);
        }
    }
    d.validate();
    return d;
}

}  // namespace kvq
