// ModelShape from a Hugging Face config.json. Field names differ between model families; each rule
// below names the family it comes from.
#include <cmath>
#include <stdexcept>

#include "json_reader.hpp"
#include "kvq/research/planner.hpp"

namespace kvq {
namespace {

using detail::JsonValue;

[[noreturn]] void bad(const std::string& name, const std::string& what) {
    throw std::invalid_argument(name + ": " + what);
}

// The first of `keys` that holds a number, as an int; -1 if none does.
int int_field(const JsonValue& cfg, std::initializer_list<const char*> keys, const std::string& name) {
    for (const char* key : keys) {
        const JsonValue* v = cfg.find(key);
        if (!v || v->is_null()) continue;
        const double* x = v->as_number();
        if (!x || *x < 0 || *x != std::floor(*x) || *x > 1e9) bad(name, std::string("'") + key + "' must be a non-negative integer");
        return static_cast<int>(*x);
    }
    return -1;
}

std::string string_field(const JsonValue& cfg, const char* key) {
    const JsonValue* v = cfg.find(key);
    return v && v->as_string() ? *v->as_string() : std::string();
}

bool bool_field(const JsonValue& cfg, const char* key, bool fallback) {
    const JsonValue* v = cfg.find(key);
    return v && v->as_bool() ? *v->as_bool() : fallback;
}

std::vector<int> sliding_windows(const JsonValue& cfg, int layers, const std::string& name) {
    const int window = int_field(cfg, {"sliding_window"}, name);
    const std::string type = string_field(cfg, "model_type");
    // Newer transformers list every layer's kind (Gemma 2/3, Qwen 2/3, Llama 4, GPT-OSS ...).
    if (const JsonValue* types = cfg.find("layer_types"); types && types->as_array()) {
        const auto& list = *types->as_array();
        if (list.size() != size_t(layers)) bad(name, "layer_types has " + std::to_string(list.size()) + " entries for " + std::to_string(layers) + " layers");
        std::vector<int> w(layers, 0);
        for (int i = 0; i < layers; ++i) {
            const std::string* kind = list[i].as_string();
            if (!kind) bad(name, "layer_types entries must be strings");
            if (*kind == "full_attention") continue;
            if (*kind == "sliding_attention") {
                if (window <= 0) bad(name, "layer_types has sliding layers but sliding_window is not set");
                w[i] = window;
            } else if (*kind == "chunked_attention") {
                const int chunk = int_field(cfg, {"attention_chunk_size"}, name);
                if (chunk <= 0) bad(name, "layer_types has chunked layers but attention_chunk_size is not set");
                w[i] = chunk;  // a chunk never holds more than attention_chunk_size tokens
            } else {
                bad(name, "layer type '" + *kind + "' is not supported by the planner (only full, sliding and chunked attention)");
            }
        }
        return w;
    }
    if (window <= 0) return {};
    // Qwen 2/3 (transformers' Qwen2Config, Qwen3Config, Qwen2MoeConfig): the window is off unless
    // use_sliding_window is true (default false), and then only some layers have it: layers with index >=
    // max_window_layers (default 28) in the dense models, even-numbered layers below max_window_layers in
    // Qwen2-MoE.
    if (type.rfind("qwen", 0) == 0) {
        if (!bool_field(cfg, "use_sliding_window", false)) return {};
        int max_window = int_field(cfg, {"max_window_layers"}, name);
        if (type == "qwen2_moe") {
            if (max_window < 0) max_window = 28;
            std::vector<int> w(layers, 0);
            for (int i = 0; i < layers; ++i) w[i] = (i + 1) % 2 != 0 && i < max_window ? window : 0;
            return w;
        }
        if (type == "qwen2" || type == "qwen3" || type.find("_vl") != std::string::npos) {
            if (max_window < 0) max_window = type.find("_vl") != std::string::npos ? 80 : 28;
            std::vector<int> w(layers, 0);
            for (int i = 0; i < layers; ++i) w[i] = i >= max_window ? window : 0;
            return w;
        }
        return std::vector<int>(layers, window);  // e.g. qwen3_moe: no per-layer rule, every layer
    }
    // Gemma 3: sliding_window_pattern (older configs) or its default of 6: every 6th layer is global.
    int pattern = int_field(cfg, {"sliding_window_pattern", "_sliding_window_pattern"}, name);
    if (pattern <= 0 && type.rfind("gemma3", 0) == 0) pattern = 6;
    if (type == "gemma2" && pattern <= 0) pattern = 2;  // Gemma 2 alternates local and global layers
    std::vector<int> w(layers, window);
    if (pattern > 0) {
        for (int i = 0; i < layers; ++i) w[i] = (i + 1) % pattern == 0 ? 0 : window;
        return w;
    }
    if (!bool_field(cfg, "use_sliding_window", true)) return {};
    return w;  // Mistral v0.1: every layer
}

}  // namespace

ModelShape model_from_hf_config(std::string_view json_text, std::string name) {
    JsonValue root;
    try {
        root = detail::parse_json(json_text);
    } catch (const std::invalid_argument& e) {
        bad(name, std::string("not valid JSON (") + e.what() + ")");
    }
    if (!root.as_object()) bad(name, "expected a JSON object");
    const JsonValue* cfg = &root;
    // Multimodal configs (Gemma 3 4B+, LLaVA, ...) keep the language model's shape in text_config.
    if (int_field(root, {"num_hidden_layers", "n_layer", "num_layers"}, name) < 0) {
        if (const JsonValue* text = root.find("text_config"); text && text->as_object()) cfg = text;
    }
    ModelShape m;
    m.name = std::move(name);
    m.source = "config.json";
    m.n_layers = int_field(*cfg, {"num_hidden_layers", "n_layer", "num_layers"}, m.name);
    m.n_heads = int_field(*cfg, {"num_attention_heads", "n_head", "num_heads"}, m.name);
    if (m.n_layers <= 0) bad(m.name, "no layer count (num_hidden_layers or n_layer)");
    if (m.n_heads <= 0) bad(m.name, "no attention head count (num_attention_heads or n_head)");

    const int latent = int_field(*cfg, {"kv_lora_rank"}, m.name);
    if (latent > 0) {  // DeepSeek V2/V3 MLA
        m.mla_latent_dim = latent;
        m.mla_rope_dim = std::max(int_field(*cfg, {"qk_rope_head_dim"}, m.name), 0);
    } else {
        m.n_kv_heads = int_field(*cfg, {"num_key_value_heads", "num_kv_heads", "n_head_kv"}, m.name);
        if (m.n_kv_heads <= 0) m.n_kv_heads = bool_field(*cfg, "multi_query", false) ? 1 : m.n_heads;  // Falcon
        m.head_dim = int_field(*cfg, {"head_dim"}, m.name);
        if (m.head_dim <= 0) {
            const int hidden = int_field(*cfg, {"hidden_size", "n_embd", "d_model"}, m.name);
            if (hidden <= 0) bad(m.name, "no head_dim and no hidden_size to derive it from");
            if (hidden % m.n_heads != 0) bad(m.name, "hidden_size is not a multiple of the head count");
            m.head_dim = hidden / m.n_heads;
        }
        const int v = int_field(*cfg, {"v_head_dim"}, m.name);
        if (v > 0 && v != m.head_dim) m.value_dim = v;
    }
    m.sliding_window = sliding_windows(*cfg, m.n_layers, m.name);
    m.validate();
    return m;
}

}  // namespace kvq
