// The synthetic latent of DeepSeek's multi-head latent attention (MLA) with DeepSeek V3's shapes
// (docs/datasets.md), drawn as bench/mla_accuracy.py draws it, so that the two measure the same thing.
//
// Per layer, independently seeded:
//   latent    c_t[j] = s_j · e, j < 512: a low-rank projection's channels are uneven, s_j = exp(0.5 N) fixed
//             per layer and channel;
//   rope      r_t[j] = 3 e, 64 values of a larger norm (the decoupled rotary key, shared by every head);
//   key       k_t = (c_t, r_t), 576 values; the value is c_t, the key's first 512 (read in place);
//   queries   absorbed MLA: each of q_heads heads is 0.08 · k_a + 0.05 e for an anchor token a drawn from the
//             tokens the query sees, so that the softmax has peaks to get right;
// with e ~ N(0, 1) fresh for every value, and DeepSeek V3's softmax scale 1/sqrt(128 + 64).
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvq/research/datasets.hpp"
#include "random.hpp"

namespace kvq {
namespace {

constexpr double kChannelSpread = 0.5;
constexpr double kRopeScale = 3.0;
constexpr double kAnchorWeight = 0.08, kQueryNoise = 0.05;
constexpr double kQkHeadDim = 128 + kMlaRopeDim;  // DeepSeek V3's qk_nope_head_dim + qk_rope_head_dim

void check(bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("mla data set: " + what);
}

}  // namespace

KVData make_mla_data(const MlaDataOptions& o) {
    check(o.layers > 0 && o.q_heads > 0 && o.tokens > 0, "layers, q_heads and tokens must be positive");
    check(o.query_positions > 0 && o.query_positions <= o.tokens, "query_positions must be in 1.." + std::to_string(o.tokens));
    KVData d;
    d.name = "mla";
    d.layers = o.layers;
    d.tokens = o.tokens;
    d.kv_heads = 1;
    d.q_heads = o.q_heads;
    d.head_dim = kMlaLatentDim + kMlaRopeDim;
    d.head_dim_v = kMlaLatentDim;
    d.latent = true;
    d.scale = static_cast<float>(1.0 / std::sqrt(kQkHeadDim));
    for (int i = 0; i < o.query_positions; ++i) d.query_positions.push_back(o.tokens - o.query_positions + i);
    const size_t dim = size_t(d.head_dim);
    d.k.resize(size_t(o.layers) * o.tokens * dim);
    d.q.resize(size_t(o.layers) * d.query_positions.size() * o.q_heads * dim);
    for (int l = 0; l < o.layers; ++l) {
        detail::Rng rk(detail::derive_seed(o.seed, 20, l));
        std::vector<double> channel(kMlaLatentDim);
        for (double& s : channel) s = std::exp(kChannelSpread * rk.normal());
        float* layer_k = d.k.data() + size_t(l) * o.tokens * dim;
        for (size_t t = 0; t < size_t(o.tokens); ++t) {
            float* row = layer_k + t * dim;
            for (int j = 0; j < kMlaLatentDim; ++j) row[j] = static_cast<float>(rk.normal() * channel[j]);
            for (size_t j = kMlaLatentDim; j < dim; ++j) row[j] = static_cast<float>(kRopeScale * rk.normal());
        }
        for (int h = 0; h < o.q_heads; ++h) {
            detail::Rng rq(detail::derive_seed(o.seed, 21, l, h));
            for (int i = 0; i < d.n_queries(); ++i) {
                const float* anchor = layer_k + rq.below(uint64_t(d.query_positions[i]) + 1) * dim;
                float* q = d.q.data() + ((size_t(l) * d.n_queries() + i) * o.q_heads + h) * dim;
                for (size_t j = 0; j < dim; ++j) q[j] = static_cast<float>(kAnchorWeight * anchor[j] + kQueryNoise * rq.normal());
            }
        }
    }
    d.validate();
    return d;
}

}  // namespace kvq
