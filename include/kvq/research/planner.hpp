// kvq — the memory planner: a model's attention shape turned into KV-cache bytes for each K/V format.
//
//   auto model = kvq::load_model("llama-3-8b");            // a preset, or a path to a config.json
//   auto rows = kvq::plan_memory(model, kvq::default_kv_formats(), {.context = 32768, .batch = 4});
//
// Bytes count everything a codec stores (scales, minimums, norms, centering means). Layers with a
// sliding window hold at most `window` tokens, so for them bytes grow with the context only up to the
// window. MLA models (DeepSeek V2/V3) cache one latent row per token and layer — kv_lora_rank latent
// values plus the rope key dims — which the key codec stores; values are read from the same latent
// (as llama.cpp and FlashMLA do), so the value codec does not apply.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/cache.hpp"
#include "kvq/research/kv_format.hpp"

namespace kvq {

struct ModelShape {
    std::string name;
    std::string source;   // "preset" or the config.json path
    int n_layers = 0;
    int n_heads = 0;      // query heads
    int n_kv_heads = 0;   // cached key/value heads per layer
    int head_dim = 0;     // key values per head
    int value_dim = 0;    // value values per head; 0 means head_dim
    int mla_latent_dim = 0;  // MLA: kv_lora_rank (0 = not MLA)
    int mla_rope_dim = 0;    // MLA: qk_rope_head_dim
    std::vector<int> sliding_window;  // per layer, tokens; 0 = full attention; empty = every layer full

    bool is_mla() const { return mla_latent_dim > 0; }
    int window(int layer) const;
    int key_row_dim() const { return is_mla() ? mla_latent_dim + mla_rope_dim : head_dim; }
    int value_row_dim() const { return is_mla() ? 0 : (value_dim ? value_dim : head_dim); }
    int local_layers() const;  // layers with a sliding window
    std::string describe() const;  // one line, e.g. "32 layers, 8 kv heads × 128 (32 query heads)"
    void validate() const;         // throws std::invalid_argument for an impossible shape
};

// The built-in presets, in a fixed order.
std::vector<ModelShape> model_presets();
// A preset by name (case-insensitive); throws std::invalid_argument listing the names.
ModelShape model_preset(std::string_view name);
// The attention shape from the text of a Hugging Face config.json (a nested "text_config" is used when
// the top level has no layer count). Understands num_key_value_heads, head_dim, GPT-2's n_layer/n_head/
// n_embd, MLA's kv_lora_rank/qk_rope_head_dim, and sliding windows given by layer_types,
// sliding_window_pattern, Gemma 2/3 defaults, or a plain sliding_window (Mistral).
ModelShape model_from_hf_config(std::string_view json_text, std::string name = "config.json");
// A preset name, a config.json path, or a directory holding a config.json.
ModelShape load_model(std::string_view name_or_path);

struct PlanOptions {
    size_t context = 8192;  // tokens per sequence
    size_t batch = 1;       // sequences
    int block_tokens = 32;  // cache block size (for the centering means of +center keys)
    StagingType staging = StagingType::f32;  // the open blocks' rows in a KVCache (cache_bytes_total)
};

struct MemoryPlan {
    KVFormat format;
    bool supported = true;
    std::string error;           // why not, when !supported (e.g. head_dim not a multiple of the block)
    double key_bits = 0, value_bits = 0;  // bits per value (the mean over layers); value_bits is 0 for MLA
    double bytes_per_token = 0;  // a token held by every layer
    double bytes_total = 0;      // context × batch, sliding windows applied
    double fp16_bytes_per_token = 0, fp16_bytes_total = 0;
    double compression = 0;      // fp16_bytes_total / bytes_total
    // What a kvq::KVCache with this format and default settings holds for batch sequences of context
    // tokens after decoding: whole blocks (their alignment padding included), each sequence's and
    // layer's staging of the open block (float32 or float16, PlanOptions::staging), the one block of slack before each sliding window, and
    // each sequence's bookkeeping. MLA models: a latent cache (CacheConfig::latent_values, one row of the
    // latent and rope values per token and layer); 0 where the key codec cannot be one (rotated, per-channel).
    double cache_bytes_total = 0;
};

// Bytes of one token in every layer, and of `context` tokens × `batch` with windows applied. Throw
// std::invalid_argument if a codec cannot take the model's head size.
double kv_bytes_per_token(const ModelShape& model, const KVFormat& format, int block_tokens = 32);
double kv_bytes(const ModelShape& model, const KVFormat& format, size_t context, size_t batch = 1,
                int block_tokens = 32);
// Bits per key and per value of a format, the mean over the model's layers ("K/V|K2/V2" formats differ by layer).
double mean_key_bits(const ModelShape& model, const KVFormat& format, int block_tokens = 32);
double mean_value_bits(const ModelShape& model, const KVFormat& format);
// MemoryPlan::cache_bytes_total for one format (KVCache's own block layout and staging rules).
double kv_cache_bytes(const ModelShape& model, const KVFormat& format, size_t context, size_t batch = 1,
                      int block_tokens = 32, StagingType staging = StagingType::f32);

std::vector<MemoryPlan> plan_memory(const ModelShape& model, const std::vector<KVFormat>& formats,
                                    const PlanOptions& options = {});

}  // namespace kvq
