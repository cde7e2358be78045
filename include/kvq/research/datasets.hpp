// kvq — attention data for the accuracy tables: keys, values and queries of several layers and heads.
//
// Data sets are named by a spec string:
//   "gaussian[:key=value,...]"  i.i.d. N(0, 1) keys, values and queries (the case theory covers);
//   "llm[:key=value,...]"       a seeded synthetic model of LLM attention (docs/datasets.md): persistent key
//                               outlier channels, per-channel key bias, rotary position embedding, an
//                               attention-sink token, per-token value outliers, sharp and diffuse heads;
//   "mla[:key=value,...]"       a synthetic latent of DeepSeek's multi-head latent attention with DeepSeek V3's
//                               shapes: one 576-value row per token and layer (a 512-value latent and 64 rope
//                               values) is the key, and its first 512 values are the value (latent = true);
//   "npy:DIR"                   real dumps: DIR/k.npy and DIR/v.npy, shape (layers, tokens, kv_heads,
//                               head_dim), float32 or float16, and optionally DIR/q.npy, shape (layers,
//                               tokens, n_heads, head_dim) with n_heads a multiple of kv_heads, and
//                               optionally DIR/meta.json with the softmax "scale" and the per-layer
//                               sliding "windows" (scripts/dump_hf_kv.py).
// Every data set is decode attention: query i sits at token query_positions[i] and attends to tokens
// 0..query_positions[i] of its layer and kv head (its GQA group shares the kv head); in a layer with a
// sliding window W > 0, to the last W of them (tokens query_positions[i] − W + 1 .. query_positions[i]).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvq {

struct KVData {
    std::string name;
    int layers = 0;
    int tokens = 0;
    int kv_heads = 0;
    int q_heads = 0;  // query heads, a multiple of kv_heads
    int head_dim = 0;                  // of keys and queries
    int head_dim_v = 0;                // of values; 0 means head_dim
    // Values are the keys' first head_dim_v values, read in place (DeepSeek's latent attention: one stored
    // row per token serves as both, CacheConfig::latent_values); v is then empty.
    bool latent = false;
    std::vector<int> query_positions;  // increasing token indices
    std::vector<float> k, v;           // layers × tokens × kv_heads × head_dim (v: × dv(); empty if latent)
    std::vector<float> q;              // layers × query_positions.size() × q_heads × head_dim
    float scale = 0;                   // softmax scale; 0 means 1/sqrt(head_dim)
    std::vector<int> windows;          // per layer: sliding window in tokens, 0 = full; empty = all full
    // A dump of a real model (npy:DIR): meta.json's "model", else DIR; its layers, heads and windows are the
    // model's (scripts/dump_hf_kv.py dumps every layer), so the sweep takes bytes per token from them
    // (kvq::data_shape). Empty for synthetic data.
    std::string source_model;

    int group() const { return q_heads / kv_heads; }
    int dv() const { return head_dim_v ? head_dim_v : head_dim; }
    int n_queries() const { return static_cast<int>(query_positions.size()); }
    float softmax_scale() const;
    // The sliding window of a layer (0 = full attention) and the first token a query at `position` sees.
    int window(int layer) const { return windows.empty() ? 0 : windows[size_t(layer)]; }
    size_t first_token(int layer, int position) const {
        const int w = window(layer);
        return w > 0 && position + 1 > w ? size_t(position + 1 - w) : 0;
    }
    // Keys of one (layer, kv head) for tokens [0, n_tokens) as n_tokens × head_dim floats; values as
    // n_tokens × dv() floats (a latent's: its keys' first dv() values).
    std::vector<float> keys(int layer, int kv_head, size_t n_tokens) const;
    std::vector<float> values(int layer, int kv_head, size_t n_tokens) const;
    // The group() queries of one (layer, kv head) at query index i, as group() × head_dim floats.
    std::vector<float> queries(int layer, int kv_head, int i) const;
    // Throws std::invalid_argument if sizes and shapes disagree.
    void validate() const;
};

// The most floats a synthetic data set (make_dataset's gaussian, llm and mla) holds per tensor: keys, values
// and queries each. Larger specs are refused with std::invalid_argument before anything is allocated.
inline constexpr size_t kMaxDatasetValues = size_t(1) << 28;

struct GaussianDataOptions {
    int layers = 1, kv_heads = 8, q_per_kv = 2, head_dim = 128, tokens = 1024, query_positions = 4;
    uint64_t seed = 0;
};

// The knobs of the LLM-like generator; docs/datasets.md gives the model and the statistics they produce.
struct LlmDataOptions {
    int layers = 4, kv_heads = 8, q_per_kv = 4, head_dim = 128, tokens = 2048, query_positions = 4;
    int outlier_channels = 4;        // persistent key outlier channels per kv head (low-frequency RoPE pairs)
    float outlier_magnitude = 12.0f; // RMS of an outlier channel, in units of a typical channel's std
    float key_bias = 1.0f;           // std of the per-channel key mean, same units
    bool rope = true;                // rotary position embedding on keys (rotate-half pairing)
    float rope_base = 10000.0f;
    bool sink = true;                // token 0 is an attention sink
    float sink_logit = 1.0f;         // per query head, the sink's logit bonus is log(context) + this + U(-3, 3)
    float value_outlier_fraction = 0.01f;  // tokens whose whole value row is scaled up
    float value_outlier_magnitude = 8.0f;
    float sharpness_max = 2.5f;      // per query head, the target tokens' logit gap is U(0, this)·log(context)
    uint64_t seed = 0;
};

// The latent of DeepSeek V3's multi-head latent attention (MLA), absorbed form (docs/datasets.md): per
// token and layer one row of 512 latent values (channels of log-normal scale) and 64 rope values (of a
// larger norm), which is the key (head_dim 576) and whose first 512 values are the value (head_dim_v 512,
// latent); q_heads query heads share it, softmax scale 1/sqrt(192). bench/mla_accuracy.py draws the same.
inline constexpr int kMlaLatentDim = 512, kMlaRopeDim = 64;  // DeepSeek V2/V3: kv_lora_rank, qk_rope_head_dim
struct MlaDataOptions {
    int layers = 1, q_heads = 128, tokens = 2048, query_positions = 4;
    uint64_t seed = 0;
};

KVData make_gaussian_data(const GaussianDataOptions& options);
KVData make_llm_data(const LlmDataOptions& options);
KVData make_mla_data(const MlaDataOptions& options);

struct NpyDataOptions {
    int query_positions = 4;  // the last tokens act as decode queries
    uint64_t seed = 0;        // for synthetic queries when DIR/q.npy is absent
};
// Loads DIR/k.npy, DIR/v.npy and DIR/q.npy if present, and the softmax scale from DIR/meta.json's "scale"
// if present (else 1/sqrt(head_dim)). Sliding windows come from meta.json too: "windows", one
// non-negative integer per layer (0 = full attention), or else Hugging Face's "sliding_window" (tokens)
// with "layer_types" (one "sliding_attention" or "full_attention" per layer); without them every layer
// attends to the whole context. Without q.npy the queries are synthetic: per
// (layer, kv head), channel c is N(0, 1) scaled by the keys' RMS in channel c over their mean RMS (so
// queries weigh channels as the keys do); results are then indicative only.
KVData load_npy_data(const std::string& dir, const NpyDataOptions& options = {});

// Builds a data set from its spec (see above). Parameters: gaussian, llm and mla take every field of their
// options struct by name (e.g. "llm:tokens=2048,outlier_magnitude=20,rope=0"); npy takes
// query_positions after the directory ("npy:DIR,query_positions=8"). `seed` is used unless the spec
// sets one. Throws std::invalid_argument for an unknown name or parameter.
KVData make_dataset(std::string_view spec, uint64_t seed = 0);
// The names make_dataset knows, with a one-line description each.
std::vector<std::pair<std::string, std::string>> dataset_kinds();

// Statistics of a data set, computed on the FP32 reference attention (docs/datasets.md).
struct DataStats {
    double outlier_channel_ratio = 0;  // median over (layer, kv head) of max channel RMS / median channel RMS
    double key_bias_ratio = 0;         // median over heads of |per-channel key mean| RMS / per-channel std RMS
    double sink_weight = 0;            // mean attention weight on token 0 over the queries that see it
    double entropy_min = 0, entropy_median = 0, entropy_max = 0;  // attention entropy per query, nats
    double entropy_log_context = 0;    // log(mean context length): the entropy of uniform attention
    double sharp_fraction = 0;         // queries with entropy below 1 nat
    double diffuse_fraction = 0;       // queries with entropy above half of log(context)
    double value_outlier_fraction = 0; // value rows with norm above 4× the median row norm
};
DataStats data_stats(const KVData& data);

}  // namespace kvq
