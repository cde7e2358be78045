// The accuracy tables' inputs (issue 36, items 7, 8 and 11): .npy bytes and the numbers the metrics see.
// Properties:
//   parse_npy on any bytes throws std::invalid_argument or returns an array that holds exactly the
//     product of its shape (no wrapped count, no read or allocation beyond the bytes given);
//   reference_attention on finite q, k, v (raw bits: huge, subnormal) gives finite weights in [0, 1]
//     summing to 1 and an output within each channel's range of v; a NaN/Inf input throws;
//   compare_attention throws std::invalid_argument exactly when one of its arrays holds NaN/Inf, and
//     otherwise gives finite metrics in their ranges (KL >= 0, top-k and cosine in [0, 1] and [-1, 1]).
#include <algorithm>
#include <limits>
#include <stdexcept>

#include "fuzz_common.hpp"
#include "kvq/research/eval.hpp"
#include "kvq/research/npy.hpp"

namespace {

using kvq::fuzz::raw_floats;
using kvq::fuzz::require;

void npy_bytes(FuzzedDataProvider& in) {
    // A valid prefix half of the time, so that the header scanner is reached.
    std::string bytes = in.ConsumeBool() ? std::string("\x93NUMPY\x01\x00", 8) : std::string();
    const auto rest = in.ConsumeRemainingBytes<char>();
    bytes.append(rest.begin(), rest.end());
    try {
        const kvq::NpyArray a = kvq::parse_npy(bytes.data(), bytes.size());
        size_t n = 1;
        for (size_t s : a.shape) require(!__builtin_mul_overflow(n, s, &n), "parse_npy accepted a shape whose count wraps");
        require(a.data.size() == n, "parse_npy: data size differs from the shape's count");
        require(a.data.size() * (a.dtype == "float16" ? 2 : 4) <= bytes.size(), "parse_npy: more data than bytes given");
    } catch (const std::invalid_argument&) {
    }
}

void reference(FuzzedDataProvider& in) {
    const int n_q = in.ConsumeIntegralInRange(1, 3), d = in.ConsumeIntegralInRange(1, 16);
    const size_t n = in.ConsumeIntegralInRange(1, 12);
    const float scale = in.ConsumeBool() ? 0.0f : in.ConsumeFloatingPoint<float>();
    const auto q = raw_floats(in, size_t(n_q) * d), k = raw_floats(in, n * d), v = raw_floats(in, n * d);
    std::vector<float> out(size_t(n_q) * d), w(size_t(n_q) * n);
    const bool finite = kvq::all_finite(q.data(), q.size()) && kvq::all_finite(k.data(), k.size()) &&
                        kvq::all_finite(v.data(), v.size()) && std::isfinite(scale);
    try {
        kvq::reference_attention(q.data(), n_q, k.data(), v.data(), n, d, scale, out.data(), w.data());
    } catch (const std::invalid_argument&) {
        require(!finite, "reference_attention refused finite input");
        return;
    }
    require(finite, "reference_attention took NaN/Inf input");
    for (int i = 0; i < n_q; ++i) {
        double sum = 0;
        for (size_t r = 0; r < n; ++r) {
            const float x = w[i * n + r];
            require(x >= 0 && x <= 1, "reference_attention: a weight outside [0, 1]");
            sum += x;
        }
        require(std::abs(sum - 1) < 1e-4, "reference_attention: weights do not sum to 1");
        for (int j = 0; j < d; ++j) {
            float lo = v[j], hi = v[j];
            for (size_t r = 1; r < n; ++r) lo = std::min(lo, v[r * d + j]), hi = std::max(hi, v[r * d + j]);
            // Rounding: relative to the values, and in subnormals an absolute step per row summed.
            const float o = out[size_t(i) * d + j],
                        slack = 1e-4f * std::max(std::abs(lo), std::abs(hi)) + float(n) * std::numeric_limits<float>::denorm_min();
            require(std::isfinite(o) && o >= lo - slack && o <= hi + slack, "reference_attention: output outside v's range");
        }
    }
}

void metrics(FuzzedDataProvider& in) {
    const int n_q = in.ConsumeIntegralInRange(1, 3), d = in.ConsumeIntegralInRange(1, 8);
    const size_t n = in.ConsumeIntegralInRange(1, 10);
    const int top_k = in.ConsumeIntegralInRange(1, 10);
    std::vector<float> a[6];
    for (int i = 0; i < 6; ++i) a[i] = raw_floats(in, size_t(n_q) * (i % 3 == 2 ? size_t(d) : n));
    for (int i : {1, 4}) {  // weights: raw bits, or mapped into [0, 1] so that ordinary values are reached
        if (in.ConsumeBool()) for (float& x : a[i]) x = std::isfinite(x) ? std::abs(std::remainder(x, 1.0f)) : x;
    }
    const bool finite = std::all_of(a, a + 6, [](const auto& x) { return kvq::all_finite(x.data(), x.size()); });
    kvq::AttentionErrors e;
    try {
        e = kvq::compare_attention(a[0].data(), a[1].data(), a[2].data(), a[3].data(), a[4].data(), a[5].data(), n_q, n, d, top_k);
    } catch (const std::invalid_argument&) {
        require(!finite, "compare_attention refused finite input");
        return;
    }
    require(finite, "compare_attention measured NaN/Inf input");
    for (const kvq::MetricSummary* m : {&e.kl, &e.score_rmse, &e.topk, &e.output_l2, &e.cosine}) {
        require(std::isfinite(m->mean) && std::isfinite(m->worst), "compare_attention: a metric is not finite");
    }
    require(e.kl.worst >= 0 && e.topk.worst >= 0 && e.topk.mean <= 1, "compare_attention: KL or top-k out of range");
    require(e.cosine.worst >= -1 - 1e-9 && e.cosine.mean <= 1 + 1e-9, "compare_attention: cosine out of [-1, 1]");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    switch (in.ConsumeIntegralInRange(0, 2)) {
        case 0: npy_bytes(in); break;
        case 1: reference(in); break;
        default: metrics(in); break;
    }
    return 0;
}
