// A toy transformer decode loop on kvq's cache (C++ API): each step projects the hidden state to q, k, v
// per layer (rotary position embedding on q and k), appends k and v to the cache, attends and adds the
// projected attention output back. The same model runs once with an f32 cache and once per codec pair;
// the table shows the bytes per token and how far the quantized run's attention outputs and hidden
// states drift from the f32 run's.
//
//   ./build/examples/decode_loop [steps]
#include <kvq/cache.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace {

struct ToyModel {
    int n_layers = 4, n_heads = 8, n_kv_heads = 2, head_dim = 64;
    int d_model() const { return n_heads * head_dim; }
    int d_kv() const { return n_kv_heads * head_dim; }
    // Per layer: wq (d_model × d_model), wk and wv (d_kv × d_model), wo (d_model × d_model), row-major.
    std::vector<std::vector<float>> wq, wk, wv, wo;
    std::vector<float> key_bias;  // per layer and kv channel: LLM keys have a large per-channel offset

    explicit ToyModel(uint32_t seed) {
        std::mt19937 rng(seed);
        auto matrix = [&](int rows, int cols) {
            std::normal_distribution<float> normal(0.0f, 1.0f / std::sqrt(static_cast<float>(cols)));
            std::vector<float> m(static_cast<size_t>(rows) * cols);
            for (float& x : m) x = normal(rng);
            return m;
        };
        std::normal_distribution<float> bias(0.0f, 1.0f);
        for (int l = 0; l < n_layers; ++l) {
            wq.push_back(matrix(d_model(), d_model()));
            wk.push_back(matrix(d_kv(), d_model()));
            wv.push_back(matrix(d_kv(), d_model()));
            wo.push_back(matrix(d_model(), d_model()));
            for (int c = 0; c < d_kv(); ++c) key_bias.push_back(bias(rng));
        }
    }
};

void matvec(const std::vector<float>& w, const std::vector<float>& x, std::vector<float>& y) {
    const size_t cols = x.size(), rows = w.size() / cols;
    y.assign(rows, 0.0f);
    for (size_t r = 0; r < rows; ++r) {
        float s = 0;
        for (size_t c = 0; c < cols; ++c) s += w[r * cols + c] * x[c];
        y[r] = s;
    }
}

void rms_norm(std::vector<float>& x) {
    double ss = 0;
    for (float v : x) ss += static_cast<double>(v) * v;
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / x.size() + 1e-6));
    for (float& v : x) v *= inv;
}

// Rotary position embedding on every head_dim-sized head of x (pairs i, i + head_dim/2).
void rope(std::vector<float>& x, int head_dim, int pos) {
    const int half = head_dim / 2;
    for (size_t h = 0; h < x.size() / head_dim; ++h) {
        float* v = x.data() + h * head_dim;
        for (int i = 0; i < half; ++i) {
            const double angle = pos * std::pow(10000.0, -2.0 * i / head_dim);
            const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
            const float a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = a * s + b * c;
        }
    }
}

double relative_l2(const std::vector<float>& a, const std::vector<float>& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
        den += static_cast<double>(ref[i]) * ref[i];
    }
    return std::sqrt(num / den);
}

// One run of the model over `inputs`; records every layer's attention output and the final hidden state
// of every step.
struct Run {
    std::vector<std::vector<float>> attention, hidden;
    double bytes_per_token = 0;
};

Run decode(const ToyModel& m, const std::string& key_codec, const std::string& value_codec,
           const std::vector<std::vector<float>>& inputs) {
    kvq::CacheConfig cfg;
    cfg.n_layers = m.n_layers;
    cfg.n_heads = m.n_heads;
    cfg.n_kv_heads = m.n_kv_heads;
    cfg.head_dim = m.head_dim;
    cfg.key_codec = key_codec;
    cfg.value_codec = value_codec;
    kvq::KVCache cache(cfg);
    const kvq::SequenceId seq = cache.add_sequence();
    Run run;
    std::vector<float> q, k, v, attn(m.d_model()), proj;
    for (size_t pos = 0; pos < inputs.size(); ++pos) {
        std::vector<float> x = inputs[pos];
        for (int l = 0; l < m.n_layers; ++l) {
            std::vector<float> h = x;
            rms_norm(h);
            matvec(m.wq[l], h, q);
            matvec(m.wk[l], h, k);
            matvec(m.wv[l], h, v);
            for (int c = 0; c < m.d_kv(); ++c) k[c] += m.key_bias[static_cast<size_t>(l) * m.d_kv() + c];
            rope(q, m.head_dim, static_cast<int>(pos));
            rope(k, m.head_dim, static_cast<int>(pos));
            cache.append(l, seq, k.data(), v.data(), 1);
            cache.attend(l, seq, q.data(), attn.data());
            run.attention.push_back(attn);
            matvec(m.wo[l], attn, proj);
            for (int c = 0; c < m.d_model(); ++c) x[c] += proj[c];
        }
        run.hidden.push_back(x);
    }
    run.bytes_per_token = cache.bytes_per_token();
    return run;
}

}  // namespace

int main(int argc, char** argv) {
    const int steps = argc > 1 ? std::atoi(argv[1]) : 200;
    if (steps <= 0) {
        std::fprintf(stderr, "usage: decode_loop [steps > 0]\n");
        return 2;
    }
    const ToyModel model(1234);
    std::mt19937 rng(99);
    std::normal_distribution<float> normal;
    std::vector<std::vector<float>> inputs(steps, std::vector<float>(model.d_model()));
    for (auto& x : inputs) {
        for (float& v : x) v = normal(rng);
    }

    std::printf("toy model: %d layers, %d query heads, %d kv heads, head_dim %d; %d decode steps\n",
                model.n_layers, model.n_heads, model.n_kv_heads, model.head_dim, steps);
    const Run reference = decode(model, "f32", "f32", inputs);
    std::printf("%-18s %12s %8s %20s %20s\n", "keys / values", "bytes/token", "vs f32", "attention rel. L2",
                "hidden rel. L2");
    std::printf("%-18s %12.0f %8s %20s %20s\n", "f32 / f32", reference.bytes_per_token, "1.00x", "-", "-");
    const char* pairs[][2] = {{"f16", "f16"}, {"q8_0", "q8_0"}, {"q8_0", "q4_0"}, {"q8_0", "q4_0+rot"},
                              {"q4_0", "q4_0"}};
    bool sane = true;
    for (const auto& pair : pairs) {
        const Run run = decode(model, pair[0], pair[1], inputs);
        double attention_error = 0, hidden_error = 0;
        for (size_t i = 0; i < run.attention.size(); ++i) {
            attention_error += relative_l2(run.attention[i], reference.attention[i]);
        }
        for (size_t i = 0; i < run.hidden.size(); ++i) hidden_error += relative_l2(run.hidden[i], reference.hidden[i]);
        attention_error /= static_cast<double>(run.attention.size());
        hidden_error /= static_cast<double>(run.hidden.size());
        const std::string name = std::string(pair[0]) + " / " + pair[1];
        std::printf("%-18s %12.0f %7.2fx %20.2e %20.2e\n", name.c_str(), run.bytes_per_token,
                    reference.bytes_per_token / run.bytes_per_token, attention_error, hidden_error);
        // A quantized cache is smaller than f32 and stays close to it; anything else is a bug.
        sane = sane && run.bytes_per_token < reference.bytes_per_token && std::isfinite(hidden_error) &&
               attention_error < 0.5;
    }
    return sane ? 0 : 1;
}
