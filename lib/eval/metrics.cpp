// Error metrics of quantized attention against the reference, per query, summarized as mean and worst.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kvq/research/eval.hpp"

namespace kvq {
namespace {

struct Accumulator {
    double sum = 0;
    double worst;
    bool higher_is_worse;
    explicit Accumulator(bool higher_worse) : worst(higher_worse ? -INFINITY : INFINITY), higher_is_worse(higher_worse) {}
    void add(double x) {
        sum += x;
        // A NaN is the worst of all (std::max would drop it, leaving a NaN mean beside a clean worst).
        worst = std::isnan(x) || std::isnan(worst) ? NAN : higher_is_worse ? std::max(worst, x) : std::min(worst, x);
    }
    MetricSummary summary(size_t n) const { return {n ? sum / n : 0.0, worst}; }
};

std::vector<size_t> top_indices(const float* w, size_t n, size_t k) {
    std::vector<size_t> idx(n);
    std::iota(idx.begin(), idx.end(), size_t{0});
    k = std::min(k, n);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [w](size_t a, size_t b) { return w[a] > w[b]; });
    idx.resize(k);
    std::sort(idx.begin(), idx.end());
    return idx;
}

}  // namespace

AttentionErrors compare_attention(const float* ref_scores, const float* ref_weights, const float* ref_out,
                                  const float* scores, const float* weights, const float* out, int n_q,
                                  size_t n_rows, int d, int top_k) {
    // Metrics of float attention on non-finite numbers (scores beyond float's range, or NaN/Inf input) would
    // read as agreement (a NaN weight is never > 0: KL 0); refused, with which query and array.
    for (int i = 0; i < n_q; ++i) {
        const std::pair<const char*, bool> arrays[] = {
            {"reference scores", all_finite(ref_scores + i * n_rows, n_rows)}, {"reference weights", all_finite(ref_weights + i * n_rows, n_rows)},
            {"reference output", all_finite(ref_out + size_t(i) * d, size_t(d))}, {"scores", all_finite(scores + i * n_rows, n_rows)},
            {"weights", all_finite(weights + i * n_rows, n_rows)}, {"output", all_finite(out + size_t(i) * d, size_t(d))}};
        for (const auto& [what, finite] : arrays) {
            if (!finite) {
                throw std::invalid_argument("attention metrics: query " + std::to_string(i) + "'s " + what +
                                            " are not finite (a score beyond float's range, or NaN/Inf input): nothing to measure");
            }
        }
    }
    Accumulator kl(true), rmse(true), topk(false), l2(true), cosine(false);
    for (int i = 0; i < n_q; ++i) {
        const float* rs = ref_scores + i * n_rows;
        const float* rw = ref_weights + i * n_rows;
        const float* s = scores + i * n_rows;
        const float* w = weights + i * n_rows;
        double kl_i = 0, se = 0, mean = 0, var = 0;
        for (size_t r = 0; r < n_rows; ++r) {
            if (rw[r] > 0) kl_i += rw[r] * (std::log(double(rw[r])) - std::log(std::max(double(w[r]), 1e-300)));
            const double ds = double(s[r]) - rs[r];  // in double: float differences of finite scores may overflow
            se += ds * ds;
            mean += rs[r];
        }
        mean /= n_rows;
        for (size_t r = 0; r < n_rows; ++r) var += (rs[r] - mean) * (rs[r] - mean);
        const double spread = std::sqrt(var / n_rows);
        kl.add(std::max(kl_i, 0.0));
        rmse.add(spread > 0 ? std::sqrt(se / n_rows) / spread : std::sqrt(se / n_rows));

        const auto a = top_indices(rw, n_rows, top_k), b = top_indices(w, n_rows, top_k);
        std::vector<size_t> common;
        std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(common));
        topk.add(a.empty() ? 1.0 : double(common.size()) / a.size());

        const float* ro = ref_out + i * d;
        const float* o = out + i * d;
        double diff = 0, nr = 0, no = 0, dot = 0;
        for (int j = 0; j < d; ++j) {
            const double dj = double(o[j]) - ro[j];
            diff += dj * dj;
            nr += double(ro[j]) * ro[j];
            no += double(o[j]) * o[j];
            dot += double(o[j]) * ro[j];
        }
        l2.add(nr > 0 ? std::sqrt(diff / nr) : std::sqrt(diff));
        cosine.add(nr > 0 && no > 0 ? dot / std::sqrt(nr * no) : (nr == no ? 1.0 : 0.0));
    }
    const size_t n = static_cast<size_t>(n_q);
    return {kl.summary(n), rmse.summary(n), topk.summary(n), l2.summary(n), cosine.summary(n), n};
}

}  // namespace kvq
