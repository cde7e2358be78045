// Statistics of a data set (docs/datasets.md): what the llm generator's knobs should produce, measured
// on the data itself and on its FP32 reference attention.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kvq/research/datasets.hpp"
#include "kvq/research/eval.hpp"

namespace kvq {
namespace {

double median(std::vector<double> x) {
    if (x.empty()) return 0;
    const size_t mid = x.size() / 2;
    std::nth_element(x.begin(), x.begin() + mid, x.end());
    double m = x[mid];
    if (x.size() % 2 == 0) m = (m + *std::max_element(x.begin(), x.begin() + mid)) / 2;
    return m;
}

}  // namespace

DataStats data_stats(const KVData& data) {
    data.validate();
    const int dim = data.head_dim, dv = data.dv(), T = data.tokens, g = data.group();
    DataStats s;
    std::vector<double> outlier_ratios, bias_ratios, entropies, value_norms;
    double sink_sum = 0, log_context_sum = 0;
    size_t n_queries = 0, n_sink = 0;
    for (int l = 0; l < data.layers; ++l) {
        for (int h = 0; h < data.kv_heads; ++h) {
            const auto keys = data.keys(l, h, size_t(T));
            std::vector<double> mean(dim, 0), sq(dim, 0);
            for (int t = 0; t < T; ++t) {
                for (int c = 0; c < dim; ++c) {
                    mean[c] += keys[size_t(t) * dim + c];
                    sq[c] += double(keys[size_t(t) * dim + c]) * keys[size_t(t) * dim + c];
                }
            }
            std::vector<double> rms(dim);
            double mean_sq = 0, var_sum = 0;
            for (int c = 0; c < dim; ++c) {
                rms[c] = std::sqrt(sq[c] / T);
                const double m = mean[c] / T;
                mean_sq += m * m;
                var_sum += std::max(sq[c] / T - m * m, 0.0);
            }
            const double med = median(rms);
            outlier_ratios.push_back(med > 0 ? *std::max_element(rms.begin(), rms.end()) / med : 0.0);
            bias_ratios.push_back(var_sum > 0 ? std::sqrt(mean_sq / var_sum) : 0.0);

            const auto values = data.values(l, h, size_t(T));
            for (int t = 0; t < T; ++t) {
                double n2 = 0;
                for (int c = 0; c < dv; ++c) n2 += double(values[size_t(t) * dv + c]) * values[size_t(t) * dv + c];
                value_norms.push_back(std::sqrt(n2));
            }

            for (int i = 0; i < data.n_queries(); ++i) {
                // A sliding-window layer attends to the window only (the sink weight counts queries that see token 0).
                const size_t first = data.first_token(l, data.query_positions[i]);
                const size_t n = size_t(data.query_positions[i]) + 1 - first;
                const auto q = data.queries(l, h, i);
                std::vector<float> out(size_t(g) * dv), w(size_t(g) * n);
                reference_attention(q.data(), g, keys.data() + first * dim, values.data() + first * dv, n, dim, dv,
                                    data.softmax_scale(), out.data(), w.data());
                for (int j = 0; j < g; ++j) {
                    const float* wj = w.data() + size_t(j) * n;
                    double entropy = 0;
                    for (size_t r = 0; r < n; ++r) {
                        if (wj[r] > 0) entropy -= wj[r] * std::log(double(wj[r]));
                    }
                    entropies.push_back(entropy);
                    if (first == 0) sink_sum += wj[0], ++n_sink;
                    log_context_sum += std::log(double(n));
                    ++n_queries;
                }
            }
        }
    }
    s.outlier_channel_ratio = median(outlier_ratios);
    s.key_bias_ratio = median(bias_ratios);
    s.sink_weight = n_sink ? sink_sum / n_sink : 0.0;
    s.entropy_log_context = log_context_sum / n_queries;
    s.entropy_min = *std::min_element(entropies.begin(), entropies.end());
    s.entropy_max = *std::max_element(entropies.begin(), entropies.end());
    s.entropy_median = median(entropies);
    for (double e : entropies) {
        s.sharp_fraction += e < 1.0;
        s.diffuse_fraction += e > 0.5 * s.entropy_log_context;
    }
    s.sharp_fraction /= entropies.size();
    s.diffuse_fraction /= entropies.size();
    const double med_norm = median(value_norms);
    for (double x : value_norms) s.value_outlier_fraction += x > 4 * med_norm;
    s.value_outlier_fraction /= value_norms.size();
    return s;
}

}  // namespace kvq
