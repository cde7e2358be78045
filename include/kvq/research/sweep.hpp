// kvq — the accuracy-vs-compression sweep behind `kvq table`.
//
// For every data set and every K/V format: quantize each (layer, kv head)'s keys and values, run decode
// attention for the data set's queries on the codes (key codec scores, value codec accumulates; +center
// keys get q·mean added back per block) and compare with the FP32 reference on the original rows.
// Errors are the metrics of kvq/research/eval.hpp over all queries (mean and worst). In a layer with a sliding
// window (KVData::windows) a query attends to the window only, in the reference and on the codes. Decode time is one decode
// step — KVCache::attend of the last query in each of the first 4 layers, one thread, at the full
// context — best of a few samples, divided by f16/f16's time measured in the same run.
//
// A latent data set (KVData::latent: DeepSeek's MLA, make_dataset("mla")) is measured as a latent KVCache
// holds it: one row per token and layer in the key codec, the values read in place from its first
// head_dim_v values (CacheConfig::latent_values). Its reference is softmax(scale · q Kᵀ) · K[:, :head_dim_v];
// its formats are those a latent cache takes (f32, f16, bf16, ggml's unrotated block codecs, with the value
// codec the key codec's), any other is a row with the cache's reason; its decode time is against an f16
// latent cache; its bytes per token are of SweepResult::latent_model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvq/codec.hpp"
#include "kvq/research/datasets.hpp"
#include "kvq/research/eval.hpp"
#include "kvq/research/kv_format.hpp"
#include "kvq/research/planner.hpp"

namespace kvq {

struct SweepOptions {
    std::vector<KVFormat> formats;  // empty means default_kv_formats()
    // Shape for bytes per token; empty (n_layers == 0): the data's own when every data set is a dump of one
    // model shape (npy:DIR, data_shape), else llama-3-8b.
    ModelShape model;
    int block_tokens = 32;          // block size for key centering (as the cache seals blocks), 1..kMaxBlockTokens
    int top_k = 8;
    bool timing = true;
    int timing_repeats = 10;
    uint64_t seed = kDefaultSeed;   // rotation seed of +rot codecs
    // q4_0 values on int8 weights (CacheConfig::int8_value_weights), in the errors and the decode timing
    bool int8_value_weights = false;
    // Called after each (data set, layer, kv head) with steps done and the total; may throw to cancel.
    std::function<void(size_t done, size_t total)> progress;
};

struct SweepRow {
    std::string dataset;
    // Which layers the errors cover: "all"; on a data set with both full-attention and sliding-window
    // layers (KVData::windows), each format also gets a "full" and a "window" row (same bits and timing).
    std::string layers = "all";
    KVFormat format;
    std::string error;            // non-empty if a codec cannot take this data set (the row has no figures)
    int head_dim = 0;             // of keys (and queries)
    int head_dim_v = 0;           // of values
    bool latent = false;          // a latent data set's row: the values are the key rows' first head_dim_v values
    // Bits per value at the data set's head sizes, everything counted. A latent row's key_bits are the
    // latent's bits per stored value (its bytes per token and layer × 8 / head_dim) and its value_bits 0:
    // the values have no bytes of their own.
    double key_bits = 0, value_bits = 0;
    // KV bytes per token for SweepResult::model, a latent row's for SweepResult::latent_model (0 if the format
    // cannot take the model, or a latent cache refuses it).
    double bytes_per_token = 0;
    double compression = 0;       // f16/f16 bytes per token / bytes_per_token for that model
    AttentionErrors errors;
    double decode_seconds = 0;    // one decode step over all layers and kv heads (0 if not timed)
    double decode_vs_f16 = 0;     // decode_seconds / f16/f16's decode_seconds, same run (0 if not timed)
};

struct SweepResult {
    std::vector<SweepRow> rows;
    ModelShape model;
    // The model of the latent rows' bytes per token: SweepOptions::model if it is an MLA model, else
    // deepseek-v3 (n_layers 0 when no data set is latent).
    ModelShape latent_model;
    std::string timing_method;  // how decode time was measured
};

// The attention shape of a data set as a model named data.source_model (or data.name): its layers, query
// and kv heads, head sizes (a latent's as MLA's latent and rope dims) and sliding windows.
ModelShape data_shape(const KVData& data);

SweepResult run_sweep(const std::vector<KVData>& data, const SweepOptions& options = {});

}  // namespace kvq
