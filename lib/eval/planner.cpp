// The memory planner: presets, bytes per token and per context for each K/V format.
#include "kvq/research/planner.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <stdexcept>

#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "codec/key_formats.hpp"
#include "input_file.hpp"

namespace kvq {
namespace {

// A Hugging Face config.json is a few kilobytes.
constexpr size_t kMaxConfigBytes = size_t(16) << 20;

// Gemma 3: five local layers, then one global layer (transformers: layer i is global when (i+1) % 6 == 0).
std::vector<int> every_sixth_global(int layers, int window) {
    std::vector<int> w(layers);
    for (int i = 0; i < layers; ++i) w[i] = (i + 1) % 6 == 0 ? 0 : window;
    return w;
}

ModelShape shape(std::string name, int layers, int heads, int kv_heads, int head_dim, std::vector<int> window = {}) {
    ModelShape m;
    m.name = std::move(name);
    m.source = "preset";
    m.n_layers = layers;
    m.n_heads = heads;
    m.n_kv_heads = kv_heads;
    m.head_dim = head_dim;
    m.sliding_window = std::move(window);
    return m;
}

std::string lower(std::string_view s) {
    std::string out(s);
    for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return out;
}

// Bytes per token of one layer (all its kv heads).
double layer_bytes_per_token(const ModelShape& m, const KVFormat& f, int block_tokens) {
    // The key rows and their side data as the cache seals them (its key format, lib/codec/key_format.hpp).
    double bytes = detail::make_key_format(f.key_label(), m.key_row_dim(), block_tokens)->bytes_per_token();
    if (!m.is_mla()) bytes += static_cast<double>(Codec::make(f.value_codec, m.value_row_dim()).row_bytes());
    return bytes * (m.is_mla() ? 1 : m.n_kv_heads);
}

}  // namespace

int ModelShape::window(int layer) const {
    return sliding_window.empty() ? 0 : sliding_window.at(static_cast<size_t>(layer));
}

int ModelShape::local_layers() const {
    return static_cast<int>(std::count_if(sliding_window.begin(), sliding_window.end(), [](int w) { return w > 0; }));
}

std::string ModelShape::describe() const {
    std::string s = std::to_string(n_layers) + " layers";
    if (is_mla()) {
        s += ", MLA latent " + std::to_string(mla_latent_dim) + " + rope " + std::to_string(mla_rope_dim);
    } else {
        s += ", " + std::to_string(n_kv_heads) + " kv heads × " + std::to_string(head_dim);
        if (value_dim && value_dim != head_dim) s += " (values × " + std::to_string(value_dim) + ")";
    }
    if (n_heads) s += " (" + std::to_string(n_heads) + " query heads)";
    if (const int local = local_layers()) {
        int w = 0;
        for (int x : sliding_window) w = std::max(w, x);
        s += local == n_layers ? ", every layer" : ", " + std::to_string(local) + " layers";
        s += " in a sliding window of " + std::to_string(w);
        if (std::any_of(sliding_window.begin(), sliding_window.end(), [&](int x) { return x > 0 && x != w; })) s += " (or less)";
    }
    return s;
}

void ModelShape::validate() const {
    auto bad = [&](const std::string& what) { throw std::invalid_argument("model '" + name + "': " + what); };
    if (n_layers <= 0) bad("needs a positive layer count");
    if (is_mla()) {
        if (mla_rope_dim < 0) bad("MLA rope dims must be >= 0");
    } else {
        if (n_kv_heads <= 0 || head_dim <= 0) bad("needs positive kv heads and head_dim");
        // Grouped-query attention shares each kv head among n_heads / n_kv_heads query heads.
        if (n_heads > 0 && n_heads % n_kv_heads != 0) {
            bad(std::to_string(n_heads) + " attention heads are not a multiple of " + std::to_string(n_kv_heads) +
                " kv heads");
        }
        if (value_dim < 0) bad("value_dim must be >= 0");
    }
    if (!sliding_window.empty() && sliding_window.size() != size_t(n_layers)) bad("needs one sliding-window entry per layer");
    for (int w : sliding_window) {
        if (w < 0) bad("sliding windows must be >= 0");
    }
}

std::vector<ModelShape> model_presets() {
    std::vector<ModelShape> p;
    p.push_back(shape("gpt2-xl", 48, 25, 25, 64));
    p.push_back(shape("llama-3-8b", 32, 32, 8, 128));
    p.push_back(shape("llama-3-70b", 80, 64, 8, 128));
    // Mistral 7B v0.1: every layer in a 4096-token window (v0.2 and v0.3 dropped it: use their config.json).
    p.push_back(shape("mistral-7b", 32, 32, 8, 128, std::vector<int>(32, 4096)));
    p.push_back(shape("qwen2.5-7b", 28, 28, 4, 128));
    p.push_back(shape("gemma-3-1b", 26, 4, 1, 256, every_sixth_global(26, 512)));
    p.push_back(shape("gemma-3-4b", 34, 8, 4, 256, every_sixth_global(34, 1024)));
    p.push_back(shape("gemma-3-12b", 48, 16, 8, 256, every_sixth_global(48, 1024)));
    p.push_back(shape("gemma-3-27b", 62, 32, 16, 128, every_sixth_global(62, 1024)));
    ModelShape ds = shape("deepseek-v3", 61, 128, 128, 0);
    ds.n_kv_heads = 0;
    ds.mla_latent_dim = 512;
    ds.mla_rope_dim = 64;
    p.push_back(ds);
    return p;
}

ModelShape model_preset(std::string_view name) {
    const std::string wanted = lower(name);
    std::string known;
    for (auto& m : model_presets()) {
        if (m.name == wanted) return m;
        known += (known.empty() ? "" : ", ") + m.name;
    }
    throw std::invalid_argument("unknown model '" + std::string(name) + "' (presets: " + known +
                                "; or give a path to a Hugging Face config.json)");
}

ModelShape load_model(std::string_view name_or_path) {
    namespace fs = std::filesystem;
    fs::path path(name_or_path);
    std::error_code ec;  // the non-throwing forms: a path fs cannot look at is an error message, not a crash
    if (fs::is_directory(path, ec)) path /= "config.json";
    if (fs::exists(fs::symlink_status(path, ec))) {
        // Not a regular file (a FIFO, a device) or larger than any config: refused before reading.
        const std::string text = detail::read_text_file(path.string(), kMaxConfigBytes);
        ModelShape m = model_from_hf_config(text, path.parent_path().filename().string());
        m.source = path.string();
        if (m.name.empty()) m.name = path.string();
        return m;
    }
    if (name_or_path.ends_with(".json")) throw std::invalid_argument(std::string(name_or_path) + ": no such file");
    return model_preset(name_or_path);
}

double kv_bytes_per_token(const ModelShape& model, const KVFormat& format, int block_tokens) {
    model.validate();
    double bytes = 0;
    for (int l = 0; l < model.n_layers; ++l) bytes += layer_bytes_per_token(model, format.on_layer(model.window(l) > 0), block_tokens);
    return bytes;
}

double kv_bytes(const ModelShape& model, const KVFormat& format, size_t context, size_t batch, int block_tokens) {
    model.validate();
    double bytes = 0;
    for (int l = 0; l < model.n_layers; ++l) {
        const int w = model.window(l);
        const double tokens = static_cast<double>(w > 0 ? std::min(context, size_t(w)) : context);
        bytes += layer_bytes_per_token(model, format.on_layer(w > 0), block_tokens) * tokens;
    }
    return bytes * static_cast<double>(batch);
}

double mean_key_bits(const ModelShape& model, const KVFormat& format, int block_tokens) {
    double bits = 0;
    for (int l = 0; l < model.n_layers; ++l) bits += format.on_layer(model.window(l) > 0).key_bits(model.key_row_dim(), block_tokens);
    return bits / model.n_layers;
}

double mean_value_bits(const ModelShape& model, const KVFormat& format) {
    if (model.is_mla()) return 0.0;
    double bits = 0;
    for (int l = 0; l < model.n_layers; ++l) bits += format.on_layer(model.window(l) > 0).value_bits(model.value_row_dim());
    return bits / model.n_layers;
}

// The bookkeeping of one block table entry (CacheConfig::max_bytes's "24 bytes per entry").
constexpr double kTableEntryBytes = 24;

double kv_cache_bytes(const ModelShape& model, const KVFormat& format, size_t context, size_t batch, int block_tokens,
                      StagingType staging_type) {
    model.validate();
    CacheConfig cfg;
    cfg.n_layers = model.n_layers;
    cfg.n_kv_heads = model.is_mla() ? 1 : model.n_kv_heads;  // MLA: one latent row per token and layer
    cfg.n_heads = cfg.n_kv_heads;  // query heads do not change what is stored
    cfg.head_dim = model.key_row_dim();
    cfg.key_codec = format.key_label();
    cfg.value_codec = format.value_codec;
    if (model.is_mla()) {  // a latent cache: values read from the latent's leading values
        cfg.latent_values = true;
        cfg.head_dim_v = model.mla_latent_dim;
        cfg.value_codec = "";
        if (format.window) return 0.0;  // (MLA models have no sliding windows here)
        try {
            validate_config(cfg);
        } catch (const BadParams&) {
            return 0.0;  // a key codec a latent cache cannot hold (rotated, per-channel): no KVCache figure
        }
    }
    cfg.block_tokens = block_tokens;
    cfg.sliding_window = model.sliding_window;
    if (format.window) {
        for (int l = 0; l < model.n_layers; ++l) {
            const KVFormat& f = format.on_layer(model.window(l) > 0);
            cfg.layer_codecs.push_back({f.key_label(), f.value_codec});
        }
    }
    // One single-layer cache per distinct pair of codecs: its block size, with the layout's padding. Each
    // layer's blocks are its own pair's (a "K/V|K2/V2" format on a model whose first layer is windowed,
    // as Gemma 3's, once gave every layer the window pair's blocks).
    std::map<std::pair<std::string, std::string>, double> block_bytes;
    const auto block_of = [&](int layer) {
        CacheConfig one = cfg;
        one.n_layers = 1;
        one.sliding_window.clear();
        one.layer_codecs.clear();
        if (!cfg.layer_codecs.empty()) one.key_codec = cfg.layer_codecs[layer].key, one.value_codec = cfg.layer_codecs[layer].value;
        auto [it, added] = block_bytes.try_emplace({one.key_codec, one.value_codec}, 0.0);
        if (added) it->second = static_cast<double>(KVCache(one).pool_stats().block_bytes);
        return it->second;
    };
    const double value_bytes = staging_type == StagingType::f16 ? 2.0 : 4.0;
    // The staging of one open block: keys and values (a latent's values are its keys).
    const double staging = (cfg.latent_values ? 1.0 : 2.0) * cfg.n_kv_heads * block_tokens * cfg.head_dim * value_bytes;
    const size_t bt = static_cast<size_t>(block_tokens), n = context;
    double per_sequence = static_cast<double>(KVCache::sequence_bookkeeping_bytes(model.n_layers));
    for (int l = 0; l < model.n_layers; ++l) {
        // As KVCache::append leaves a layer after a decode step: the open block in staging, whole blocks
        // in the pool from one block before the window of the last token's (the slack).
        const size_t w = static_cast<size_t>(model.window(l)), pool_end = n / bt * bt;
        const size_t before = w && n > w ? (n - w) / bt : 0;
        const size_t keep_from = before > 1 ? (before - 1) * bt : 0;
        const double block = block_of(l);
        // Each block held also costs its table entry (kvq/cache.hpp, CacheConfig::max_bytes: 24 bytes).
        per_sequence += static_cast<double>((pool_end - std::min(keep_from, pool_end)) / bt) * (block + kTableEntryBytes) + staging;
    }
    return per_sequence * static_cast<double>(batch);
}

std::vector<MemoryPlan> plan_memory(const ModelShape& model, const std::vector<KVFormat>& formats, const PlanOptions& o) {
    model.validate();
    if (o.block_tokens <= 0 || o.context == 0 || o.batch == 0) {
        throw std::invalid_argument("plan: context, batch and block_tokens must be positive");
    }
    const KVFormat fp16 = KVFormat::parse("f16/f16");
    const double fp16_token = kv_bytes_per_token(model, fp16, o.block_tokens);
    const double fp16_total = kv_bytes(model, fp16, o.context, o.batch, o.block_tokens);
    std::vector<MemoryPlan> rows;
    for (const auto& f : formats) {
        MemoryPlan r;
        r.format = f;
        r.fp16_bytes_per_token = fp16_token;
        r.fp16_bytes_total = fp16_total;
        try {
            r.key_bits = mean_key_bits(model, f, o.block_tokens);
            r.value_bits = mean_value_bits(model, f);
            r.bytes_per_token = kv_bytes_per_token(model, f, o.block_tokens);
            r.bytes_total = kv_bytes(model, f, o.context, o.batch, o.block_tokens);
            r.compression = r.bytes_total > 0 ? fp16_total / r.bytes_total : 0.0;
            r.cache_bytes_total = kv_cache_bytes(model, f, o.context, o.batch, o.block_tokens, o.staging);
        } catch (const std::invalid_argument& e) {
            r.supported = false;
            r.error = e.what();
        }
        rows.push_back(std::move(r));
    }
    return rows;
}

}  // namespace kvq
