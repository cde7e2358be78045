// A C++ engine built against an installed kvq: it includes only <kvq/kvq.hpp> and links only the engine
// library, twice (consumer_cpp: kvq::kvq_static; consumer_cpp_shared: kvq::kvq, libkvq.so). Decodes one
// step over a q8_0/q4_0 cache and checks it against attention computed here in double, attends the same
// rows through kvq::attend_rows, and catches kvq::PoolExhausted thrown inside the library.
#include <kvq/kvq.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

namespace {

// softmax(q·k/√d)·v for one head, in double.
std::vector<double> exact_attention(const float* q, const std::vector<float>& k, const std::vector<float>& v, int n, int d) {
    std::vector<double> s(n), out(d, 0.0);
    double max = -INFINITY, sum = 0.0;
    for (int t = 0; t < n; ++t) {
        double dot = 0.0;
        for (int j = 0; j < d; ++j) dot += double(q[j]) * k[size_t(t) * d + j];
        s[t] = dot / std::sqrt(double(d));
        max = std::max(max, s[t]);
    }
    for (int t = 0; t < n; ++t) sum += s[t] = std::exp(s[t] - max);
    for (int t = 0; t < n; ++t) {
        for (int j = 0; j < d; ++j) out[j] += s[t] / sum * v[size_t(t) * d + j];
    }
    return out;
}

double cosine(const float* a, const std::vector<double>& b) {
    double ab = 0, aa = 0, bb = 0;
    for (size_t j = 0; j < b.size(); ++j) ab += a[j] * b[j], aa += double(a[j]) * a[j], bb += b[j] * b[j];
    return ab / std::sqrt(aa * bb);
}

}  // namespace

int main() {
    const int d = 64, n = 256;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> k(size_t(n) * d), v(size_t(n) * d), q(d);
    for (auto* x : {&k, &v, &q}) {
        for (float& value : *x) value = normal(rng);
    }

    kvq::CacheConfig cfg;  // one layer, one kv head; q8_0 keys, q4_0 values
    cfg.head_dim = d;
    kvq::KVCache cache(cfg);
    const auto seq = cache.add_sequence();
    cache.append(0, seq, k.data(), v.data(), n);
    std::vector<float> out(d), rows_out(d);
    cache.attend(0, seq, q.data(), out.data());
    const double cos = cosine(out.data(), exact_attention(q.data(), k, v, n, d));

    // The same tokens as rows the engine owns (ggml-style tensors): the same engine, the same result.
    const auto keys = kvq::Codec::make("q8_0", d), values = kvq::Codec::make("q4_0", d);
    std::vector<uint8_t> kb(n * keys.row_bytes()), vb(n * values.row_bytes());
    keys.quantize_rows(k.data(), n, kb.data());
    values.quantize_rows(v.data(), n, vb.data());
    kvq::attend_rows(keys, values, 1, 1, q.data(), {kb.data(), keys.row_bytes(), keys.row_bytes()},
                     {vb.data(), values.row_bytes(), values.row_bytes()}, n, rows_out.data());
    const double rows_cos = cosine(rows_out.data(), exact_attention(q.data(), k, v, n, d));
    std::printf("q8_0/q4_0 decode vs exact attention (SIMD %s): cosine %.5f in the cache, %.5f on owned rows\n",
                std::string(kvq::simd_level_name(kvq::simd_level())).c_str(), cos, rows_cos);

    cfg.max_blocks = 1;  // 32 tokens
    kvq::KVCache small(cfg);
    const auto s = small.add_sequence();
    bool caught = false;
    try {
        small.append(0, s, k.data(), v.data(), 65);  // two blocks to seal, one in the pool
    } catch (const kvq::PoolExhausted& e) {
        caught = true;
        std::printf("caught kvq::PoolExhausted: %s\n", e.what());
    }
    return cos > 0.99 && rows_cos > 0.99 && caught && small.n_tokens(s) == 0 ? 0 : 1;
}
