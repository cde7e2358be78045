// KVQ_KV_FORMATS (kv-formats.hpp): which cache tensors hold kvq formats, and the ops on them that the
// plugin computes besides flash attention (row writes, the K-shift's copies).
#include "kv-formats.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>

#include "ggml-backend.h"

namespace kvq_ggml {
namespace {

// KVQ_KV_FORMATS="k=turbo4,v=turbo4,k.3=iq4_nls": a format for the keys, the values, and per layer
// (k.N, v.N); a bare format is both keys' and values'. Unset, empty, "0" or "off": the mode is off.
struct Formats {
    bool on = false;
    std::string keys, values;
    std::map<int, std::string> layer_keys, layer_values;

    const std::string& spec(bool key, int layer) const {
        const auto& per_layer = key ? layer_keys : layer_values;
        if (auto it = per_layer.find(layer); it != per_layer.end()) return it->second;
        return key ? keys : values;
    }
};

std::optional<Formats> parse_formats(std::string_view text, std::string& error) {
    Formats f;
    if (text.empty() || text == "0" || text == "off") return f;
    while (!text.empty()) {
        const size_t comma = text.find(',');
        std::string_view item = text.substr(0, comma);
        text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
        const size_t eq = item.find('=');
        const std::string format(eq == std::string_view::npos ? item : item.substr(eq + 1));
        try {
            kvq::parse_codec_spec(format);
        } catch (const std::exception& e) {
            error = e.what();
            return std::nullopt;
        }
        if (eq == std::string_view::npos) {
            f.keys = f.values = format;
            continue;
        }
        const std::string_view what = item.substr(0, eq);
        if (what == "k" || what == "v") {
            (what == "k" ? f.keys : f.values) = format;
        } else if (what.size() > 2 && (what[0] == 'k' || what[0] == 'v') && what[1] == '.') {
            const int layer = std::atoi(std::string(what.substr(2)).c_str());
            (what[0] == 'k' ? f.layer_keys : f.layer_values)[layer] = format;
        } else {
            error = "expected k=FORMAT, v=FORMAT, k.LAYER=FORMAT, v.LAYER=FORMAT or FORMAT, got '" + std::string(item) + "'";
            return std::nullopt;
        }
    }
    f.on = true;
    return f;
}

// The mode's settings, read once. With a GPU (or integrated GPU) device registered the mode stays off:
// llama.cpp then gives the CPU backend a host buffer type of the GPU's, and ggml's scheduler no longer
// moves the CPU's ops on these tensors to the plugin (ggml_backend_sched_split_graph, pass 3 compares
// the backends' buffer types), so the CPU backend could read the bytes as ggml's.
const Formats& formats() {
    static const Formats f = [] {
        const char* env = std::getenv("KVQ_KV_FORMATS");
        std::string error;
        auto parsed = parse_formats(env ? env : "", error);
        if (!parsed) {
            std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS='%s': %s; the KV cache keeps ggml's formats\n", env, error.c_str());
            return Formats{};
        }
        if (!parsed->on) return *parsed;
        // The registry is libggml's, which loaded this plugin (a plugin links only ggml-base): found at run time.
        using dev_count_t = size_t (*)();
        using dev_get_t = ggml_backend_dev_t (*)(size_t);
        const auto dev_count = reinterpret_cast<dev_count_t>(dlsym(RTLD_DEFAULT, "ggml_backend_dev_count"));
        const auto dev_get = reinterpret_cast<dev_get_t>(dlsym(RTLD_DEFAULT, "ggml_backend_dev_get"));
        if (!dev_count || !dev_get) {
            std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS: ggml's device registry not found; the KV cache keeps ggml's formats\n");
            return Formats{};
        }
        for (size_t i = 0; i < dev_count(); ++i) {
            const auto type = ggml_backend_dev_type(dev_get(i));
            if (type == GGML_BACKEND_DEVICE_TYPE_GPU || type == GGML_BACKEND_DEVICE_TYPE_IGPU) {
                std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS is for a CPU-only llama.cpp (device %s is a GPU); the KV "
                                     "cache keeps ggml's formats\n", ggml_backend_dev_name(dev_get(i)));
                return Formats{};
            }
        }
        std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS: quantized KV cache slots hold kvq formats: keys %s, values %s%s\n",
                     parsed->keys.empty() ? "ggml's" : parsed->keys.c_str(), parsed->values.empty() ? "ggml's" : parsed->values.c_str(),
                     parsed->layer_keys.empty() && parsed->layer_values.empty() ? "" : " (and per-layer choices)");
        return *parsed;
    }();
    return f;
}

// "cache_k_l12", "cache_swa_v_l3" (llama_kv_cache names its tensors cache_<tag>k_l<layer>): whether t is
// a key (true) or value tensor of that layer.
bool parse_cache_name(const char* name, bool& key, int& layer) {
    const std::string_view n(name);
    if (n.substr(0, 6) != "cache_") return false;
    const size_t l = n.rfind("_l");
    if (l == std::string_view::npos || l < 1 || l + 2 >= n.size()) return false;
    for (size_t i = l + 2; i < n.size(); ++i) {
        if (n[i] < '0' || n[i] > '9') return false;
    }
    if (n[l - 1] != 'k' && n[l - 1] != 'v') return false;
    if (l >= 2 && n[l - 2] != '_') return false;
    key = n[l - 1] == 'k';
    layer = std::atoi(std::string(n.substr(l + 2)).c_str());
    return true;
}

std::mutex registry_mu;
std::map<const ggml_tensor*, KvFormat> registry;  // by the cache tensor (the root of every view of it)

const ggml_tensor* root_of(const ggml_tensor* t) { return t && t->view_src ? t->view_src : t; }

}  // namespace

KvFormat* kv_format_of(const ggml_tensor* t) {
    const ggml_tensor* base = root_of(t);
    if (!base || !ggml_is_quantized(base->type)) return nullptr;
    bool key = false;
    int layer = -1;
    if (!parse_cache_name(base->name, key, layer)) return nullptr;
    const Formats& f = formats();
    if (!f.on) return nullptr;
    const std::string& spec = f.spec(key, layer);
    if (spec.empty()) return nullptr;
    // Only llama.cpp's cache in host memory (the CPU backend's buffers): the plugin computes on host memory.
    if (!base->buffer || !ggml_backend_buffer_is_host(base->buffer)) return nullptr;
    std::lock_guard<std::mutex> lock(registry_mu);
    auto [it, added] = registry.try_emplace(base);
    if (added) {
        it->second.key = key;
        it->second.layer = layer;
        it->second.slot = base->type;
        it->second.spec = spec;
    }
    return &it->second;
}

bool touches_kv_formats(const ggml_tensor* op) {
    if (kv_format_of(op)) return true;
    for (const ggml_tensor* src : op->src) {
        if (src && kv_format_of(src)) return true;
    }
    return false;
}

const kvq::Codec* kv_format_codec(const ggml_tensor* view) {
    KvFormat* f = kv_format_of(view);
    if (!f) return nullptr;
    static std::mutex mu;
    static std::map<std::pair<std::string, int64_t>, kvq::Codec> codecs;  // shared by the layers
    std::lock_guard<std::mutex> lock(mu);
    const int64_t head_dim = view->ne[0];
    if (f->head_dim == 0 && f->error.empty()) {
        const ggml_tensor* base = root_of(view);
        f->head_dim = head_dim;
        f->slot_row_bytes = ggml_row_size(f->slot, head_dim);
        try {
            auto it = codecs.find({f->spec, head_dim});
            if (it == codecs.end()) it = codecs.emplace(std::make_pair(f->spec, head_dim), kvq::Codec::make(f->spec, static_cast<int>(head_dim))).first;
            if (base->ne[0] % head_dim != 0 || view->nb[1] % f->slot_row_bytes != 0) {
                f->error = "its rows are not whole heads of " + std::to_string(head_dim) + " values";
            } else if (it->second.row_bytes() > f->slot_row_bytes) {
                f->error = f->spec + " needs " + std::to_string(it->second.row_bytes()) + " bytes per row of " + std::to_string(head_dim) +
                           " values, the " + ggml_type_name(f->slot) + " slot has " + std::to_string(f->slot_row_bytes);
            } else {
                f->codec = &it->second;
            }
        } catch (const std::exception& e) {
            f->error = e.what();
        }
        if (f->codec) {
            std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS: layer %d %s (%s, %s slot, head size %lld): %s, %zu of %zu bytes per row\n",
                         f->layer, f->key ? "K" : "V", base->name, ggml_type_name(f->slot), static_cast<long long>(head_dim),
                         f->spec.c_str(), f->codec->row_bytes(), f->slot_row_bytes);
        } else {
            std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS: layer %d %s (%s): %s cannot be used: %s; every op on it will fail\n",
                         f->layer, f->key ? "K" : "V", base->name, f->spec.c_str(), f->error.c_str());
        }
    }
    if (f->codec && f->head_dim != head_dim) return nullptr;
    return f->codec;
}

namespace {

// The codec of f, or the reason there is none.
const kvq::Codec* ready_codec(const KvFormat& f, std::string& error) {
    if (f.codec) return f.codec;
    error = !f.error.empty() ? f.error
                             : "its head size is not known: the plugin learns it from the layer's flash attention, which this "
                               "graph has none of (kvq formats need -fa on)";
    return nullptr;
}

// SET_ROWS: the rows of src0 (f32, n_heads heads of head_dim values each), quantized by the layer's codec
// into the slots of the rows that src1 names.
bool compute_set_rows(ggml_tensor* dst, const KvFormat& f, std::string& error) {
    const ggml_tensor* rows = dst->src[0];
    const ggml_tensor* ids = dst->src[1];
    const kvq::Codec* codec = ready_codec(f, error);
    if (!codec) return false;
    if (rows->type != GGML_TYPE_F32 || rows->nb[0] != sizeof(float) || rows->ne[2] != 1 || rows->ne[3] != 1 || dst->ne[2] != 1 ||
        dst->ne[3] != 1 || dst->ne[0] % f.head_dim != 0 || ids->ne[1] != 1 || ids->ne[2] != 1) {
        error = "SET_ROWS of this shape or type (kvq formats take 2-d f32 rows of whole heads)";
        return false;
    }
    const size_t heads = static_cast<size_t>(dst->ne[0] / f.head_dim);
    for (int64_t i = 0; i < rows->ne[1]; ++i) {
        const char* id = static_cast<const char*>(ids->data) + i * ids->nb[0];
        const int64_t row = ids->type == GGML_TYPE_I64 ? *reinterpret_cast<const int64_t*>(id) : *reinterpret_cast<const int32_t*>(id);
        if (row < 0 || row >= dst->ne[1]) {
            error = "SET_ROWS row index " + std::to_string(row) + " outside the cache";
            return false;
        }
        const auto* x = reinterpret_cast<const float*>(static_cast<const char*>(rows->data) + i * rows->nb[1]);
        codec->quantize_rows(x, heads, static_cast<char*>(dst->data) + row * dst->nb[1], f.slot_row_bytes, kvq::NanPolicy::propagate);
    }
    return true;
}

// CPY between a view of whole rows of a kvq-format tensor and f32 rows of the same shape: the K-shift's
// ggml_cast to f32 (dequantize) and its ggml_cpy back (quantize), llama_kv_cache::build_rope_shift.
bool compute_copy(const ggml_tensor* src, ggml_tensor* dst, std::string& error) {
    const KvFormat* fs = kv_format_of(src);
    const KvFormat* fd = kv_format_of(dst);
    const bool to_f32 = fs && !fd;
    const KvFormat& f = to_f32 ? *fs : *fd;
    const ggml_tensor* codes = to_f32 ? src : dst;
    const ggml_tensor* floats = to_f32 ? dst : src;
    const kvq::Codec* codec = ready_codec(f, error);
    if (!codec) return false;
    bool whole_rows = (fs == nullptr) != (fd == nullptr) && floats->type == GGML_TYPE_F32 && floats->nb[0] == sizeof(float) &&
                      codes->ne[0] == f.head_dim && codes->view_offs % f.slot_row_bytes == 0;
    for (int d = 0; d < 4; ++d) {
        whole_rows = whole_rows && src->ne[d] == dst->ne[d] && (d == 0 || codes->nb[d] % f.slot_row_bytes == 0);
    }
    if (!whole_rows) {
        error = "a copy that is not whole rows between the kvq format and f32 (the K-shift of a partial rotary embedding, a copy "
                "between cache tensors, or another type)";
        return false;
    }
    for (int64_t i3 = 0; i3 < src->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < src->ne[2]; ++i2) {
            for (int64_t i1 = 0; i1 < src->ne[1]; ++i1) {
                char* c = static_cast<char*>(codes->data) + i1 * codes->nb[1] + i2 * codes->nb[2] + i3 * codes->nb[3];
                auto* x = reinterpret_cast<float*>(static_cast<char*>(floats->data) + i1 * floats->nb[1] + i2 * floats->nb[2] + i3 * floats->nb[3]);
                if (to_f32) {
                    codec->dequantize_rows(c, 1, x);
                } else {
                    codec->quantize_rows(x, 1, c, 0, kvq::NanPolicy::propagate);
                }
            }
        }
    }
    return true;
}

}  // namespace

bool compute_kv_formats_op(ggml_tensor* node, std::string& error) {
    try {
        if (node->op == GGML_OP_SET_ROWS && kv_format_of(node)) return compute_set_rows(node, *kv_format_of(node), error);
        if (node->op == GGML_OP_CPY) return compute_copy(node->src[0], node, error);
    } catch (const std::exception& e) {
        error = e.what();
        return false;
    }
    error = "the plugin computes only SET_ROWS, FLASH_ATTN_EXT and whole-row copies to and from f32 on them";
    return false;
}

}  // namespace kvq_ggml
