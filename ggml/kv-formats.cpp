// KVQ_KV_FORMATS (kv-formats.hpp): which cache tensors hold kvq formats, and the ops on them that the
// plugin computes besides flash attention (row writes, the K-shift's copies).
#include "kv-formats.hpp"
#include "kv-calibration.hpp"
#include "kv-rope-center.hpp"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <fstream>
#include <cmath>
#include <algorithm>
#include <vector>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <atomic>

#include "ggml-backend.h"

namespace kvq_ggml {
namespace {

// A key format of the mode: a kvq row codec spec, then any of +center, +ropecenter and +qk (in any order).
struct KeySpec {
    std::string row;
    bool center = false, rope_center = false, scales = false;
};

KeySpec split_key_spec(std::string_view spec) {
    KeySpec k;
    for (bool more = true; more;) {
        more = false;
        for (const std::string_view suffix : {std::string_view("+center"), std::string_view("+ropecenter"), std::string_view("+qk")}) {
            if (spec.size() > suffix.size() && spec.substr(spec.size() - suffix.size()) == suffix) {
                (suffix == "+qk" ? k.scales : suffix == "+center" ? k.center : k.rope_center) = true;
                spec.remove_suffix(suffix.size());
                more = true;
            }
        }
    }
    k.row = std::string(spec);
    return k;
}

// KVQ_KV_FORMATS="k=turbo4,v=turbo4,k.3=iq4_nls": a format for the keys, the values, and per layer
// (k.N, v.N); a bare format is both keys' and values'. Unset, empty, "0" or "off": the mode is off.
// Key formats may end in +center, +ropecenter and/or +qk (KeySpec), which need calib=PATH: a file written by a
// run with calibrate=PATH (the slots then keep ggml's bytes, written by kvq's identical codecs).
struct Formats {
    bool on = false;
    std::string keys, values;
    std::map<int, std::string> layer_keys, layer_values;
    std::string calib, calibrate;  // calibration file read, written

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
        const std::string_view what = eq == std::string_view::npos ? std::string_view{} : item.substr(0, eq);
        if (what == "calib" || what == "calibrate") {
            if (format.empty()) {
                error = std::string(what) + "= needs a file";
                return std::nullopt;
            }
            (what == "calib" ? f.calib : f.calibrate) = format;
            continue;
        }
        const KeySpec ks = split_key_spec(format);
        try {
            kvq::parse_codec_spec(ks.row);
        } catch (const std::exception& e) {
            error = e.what();
            return std::nullopt;
        }
        if ((ks.center || ks.rope_center || ks.scales) && (what.empty() || what[0] != 'k')) {
            error = "'" + format + "': +center, +ropecenter and +qk are for keys (k=FORMAT or k.LAYER=FORMAT)";
            return std::nullopt;
        }
        if (eq == std::string_view::npos) {
            f.keys = f.values = format;
            continue;
        }
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
    const auto needs_calib = [&](const std::string& spec) { return !spec.empty() && split_key_spec(spec).row != spec; };
    bool calibrated = needs_calib(f.keys);
    for (const auto& [layer, spec] : f.layer_keys) calibrated = calibrated || needs_calib(spec);
    if (calibrated && f.calib.empty()) {
        error = "+center, +ropecenter and +qk need calib=FILE (a calibration written by a run with calibrate=FILE)";
        return std::nullopt;
    }
    if (!f.calib.empty() && !f.calibrate.empty()) {
        error = "calib= and calibrate= together";
        return std::nullopt;
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


// ---- calibrated key formats (+center, +ropecenter, +qk) --------------------------------------------------

const std::map<int, LayerCalibration>& calibration() {
    static const std::map<int, LayerCalibration> c = [] {
        std::string error;
        auto read = formats().calib.empty() ? std::map<int, LayerCalibration>{} : read_calibration(formats().calib, error);
        if (!read) {
            std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS: %s; layers with +center, +ropecenter or +qk will refuse their ops\n", error.c_str());
            return std::map<int, LayerCalibration>{};
        }
        return *read;
    }();
    return c;
}

// The mean(s) to subtract and the scales to multiply f's key rows by, from the calibration (error if absent).
void setup_key_transform(KvFormat& f, int64_t width, const kvq::Codec& codec) {
    const auto& c = calibration();
    const auto it = c.find(f.layer);
    if (it == c.end() || it->second.width != width || it->second.head_dim != f.head_dim) {
        f.error = "the calibration file has no layer " + std::to_string(f.layer) + " of " + std::to_string(width) + " key values in heads of " +
                  std::to_string(f.head_dim) + " (calibrate with this model)";
        return;
    }
    const LayerCalibration& l = it->second;
    const int64_t d = f.head_dim, heads = width / d;
    if (f.center || f.rope_center) f.mean = l.mean;
    // Per channel: the variance of what is stored and the queries' second moment, which set the scales.
    std::vector<double> var(static_cast<size_t>(width)), qsq(l.qsq.begin(), l.qsq.end());
    for (int64_t j = 0; j < width; ++j) var[j] = f.center || f.rope_center ? l.kvar[j] : l.kvar[j] + double(l.mean[j]) * l.mean[j];
    if (f.rope_center) {
        f.error = setup_rope_center(f, l, codec, var);
        if (!f.error.empty()) return;
    }
    if (!f.key_scales) return;
    // s_j = (E[q_j²] / E[(k_j − μ_j)²])^(1/4), floored, normalized to a geometric mean of 1 per head:
    // stored keys (k − μ) ⊙ s, queries q ⊘ s balance the channels' shares of q·k's rounding error.
    f.scale.resize(static_cast<size_t>(width));
    for (int64_t h = 0; h < heads; ++h) {
        double log_sum = 0;
        for (int64_t j = h * d; j < (h + 1) * d; ++j) {
            f.scale[j] = static_cast<float>(std::pow(std::max(qsq[j], 1e-12) / std::max(var[j], 1e-12), 0.25));
            log_sum += std::log(f.scale[j]);
        }
        const double g = std::exp(log_sum / double(d));
        for (int64_t j = h * d; j < (h + 1) * d; ++j) f.scale[j] = static_cast<float>(f.scale[j] / g);
    }
}

std::atomic<size_t> rows_written{0}, rows_copied{0};  // KVQ_GGML_STATS=1

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
    // Calibrating, a slot without a format keeps ggml's bytes, written by kvq's identical codec.
    const std::string spec = !f.spec(key, layer).empty() ? f.spec(key, layer) : f.calibrate.empty() ? "" : ggml_type_name(base->type);
    if (spec.empty()) return nullptr;
    // Only llama.cpp's cache in host memory (the CPU backend's buffers): the plugin computes on host memory.
    if (!base->buffer || !ggml_backend_buffer_is_host(base->buffer)) return nullptr;
    std::lock_guard<std::mutex> lock(registry_mu);
    auto [it, added] = registry.try_emplace(base);
    // A context's tensors can reuse a freed context's addresses (llama.cpp makes a context twice when it
    // fits parameters): an entry is the tensor's only while its name, bytes and shape are the same.
    const KvFormat::Identity identity{base->name, base->buffer, base->data, base->type, base->ne[0], base->ne[1], base->ne[2]};
    if (!added && !(it->second.identity == identity)) {
        it->second = KvFormat{};
        added = true;
    }
    if (added) {
        it->second.identity = identity;
        it->second.key = key;
        it->second.layer = layer;
        it->second.slot = base->type;
        it->second.spec = spec;
        const KeySpec ks = split_key_spec(spec);
        it->second.center = ks.center;
        it->second.rope_center = ks.rope_center;
        it->second.key_scales = ks.scales;
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
            const std::string row = split_key_spec(f->spec).row;
            auto it = codecs.find({row, head_dim});
            if (it == codecs.end()) it = codecs.emplace(std::make_pair(row, head_dim), kvq::Codec::make(row, static_cast<int>(head_dim))).first;
            if (base->ne[0] % head_dim != 0 || view->nb[1] % f->slot_row_bytes != 0) {
                f->error = "its rows are not whole heads of " + std::to_string(head_dim) + " values";
            } else if (it->second.row_bytes() > f->slot_row_bytes) {
                f->error = f->spec + " needs " + std::to_string(it->second.row_bytes()) + " bytes per row of " + std::to_string(head_dim) +
                           " values, the " + ggml_type_name(f->slot) + " slot has " + std::to_string(f->slot_row_bytes);
            } else {
                // Keys stored in the model's channels: what the mean and scales are of, and what a rotating
                // codec should turn (llama.cpp's rotation first and the codec's after it spread a large
                // key mean worse than the codec's alone: KL 0.152 against 0.113, docs/llama-cpp.md).
                f->model_basis = f->key && (f->center || f->rope_center || f->key_scales || it->second.rotated() || it->second.info().rotates);
                if (f->center || f->rope_center || f->key_scales) setup_key_transform(*f, base->ne[0], it->second);
                if (f->error.empty()) f->codec = &it->second;
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

// The start of the cache row (every head) that byte p of base lies in.
const char* cache_row_of(const ggml_tensor* base, const char* p) {
    const auto off = static_cast<size_t>(p - static_cast<const char*>(base->data));
    return static_cast<const char*>(base->data) + (off - off % base->nb[1]);
}

bool transforms_keys(const KvFormat& f) { return f.model_basis || f.center || f.rope_center || f.key_scales; }

// x (n values from channel `first` of a K row at position p, in llama.cpp's basis) as the format stores
// it: (x − μ) ⊙ s in the model's channels (μ turned to p on +ropecenter's pairs), in scratch; x itself for
// formats that store the keys as given.
const float* to_stored(const KvFormat& f, const float* x, size_t n, size_t first, int64_t p, std::vector<float>& scratch) {
    if (!transforms_keys(f)) return x;
    scratch.assign(x, x + n);
    if (f.model_basis && f.llama_rot > 0) hadamard(scratch.data(), static_cast<int64_t>(n), f.llama_rot);
    if (f.rope_center) add_rope_mean(f, scratch.data(), n, first, p, -1.0f);
    for (size_t j = 0; j < n; ++j) {
        const float c = f.center || f.rope_center ? scratch[j] - f.mean[first + j] : scratch[j];
        scratch[j] = f.key_scales ? c * f.scale[first + j] : c;
    }
    return scratch.data();
}

// The inverse, in place: y ⊘ s + μ, in llama.cpp's basis.
void from_stored(const KvFormat& f, float* y, size_t n, size_t first, int64_t p) {
    if (!transforms_keys(f)) return;
    for (size_t j = 0; j < n; ++j) {
        const float c = f.key_scales ? y[j] / f.scale[first + j] : y[j];
        y[j] = f.center || f.rope_center ? c + f.mean[first + j] : c;
    }
    if (f.rope_center) add_rope_mean(f, y, n, first, p, 1.0f);
    if (f.model_basis && f.llama_rot > 0) hadamard(y, static_cast<int64_t>(n), f.llama_rot);
}

// Records from a SET_ROWS source whether llama.cpp rotates f's rows, or says why the rows cannot be taken:
// a rotation that differs from the one seen before.
const char* learn_rotation(KvFormat& f, const ggml_tensor* rows) {
    const int64_t rot = llama_rotation_of(rows);
    if (f.llama_rot < 0) f.llama_rot = rot;
    if (f.llama_rot != rot) return "rows rotated otherwise than before (llama.cpp's attn_rot_k changed)";
    return nullptr;
}

// The positions tensor's values, as read at the first layer of a graph that wrote its rows. Not a source
// of the plugin's ops, the tensor is freed to ggml's allocator after its last ROPE: by the last layer's
// row write its bytes may hold another tensor. Layers run in order, so a layer at or below the last one
// read (or another tensor) starts a new graph and reads it afresh; later layers take the copy.
struct PositionsCopy {
    std::mutex mu;
    const ggml_tensor* tensor = nullptr;
    int layer = -1;
    std::vector<int32_t> values;
} positions_copy;

std::vector<int32_t> positions_of(const ggml_tensor* pos, int layer) {
    std::lock_guard<std::mutex> lock(positions_copy.mu);
    auto& c = positions_copy;
    if (c.tensor != pos || layer <= c.layer || c.values.size() != static_cast<size_t>(pos->ne[0])) {
        c.tensor = pos;
        c.values.assign(static_cast<const int32_t*>(pos->data), static_cast<const int32_t*>(pos->data) + pos->ne[0]);
    }
    c.layer = layer;
    return c.values;
}

// The positions of the n rows of a SET_ROWS or K-shift source (the I32 positions or shifts of the ROPE
// that made them), with the rope learned into f (+ropecenter: checked against the calibration's), or
// nothing with the reason.
std::optional<std::vector<int32_t>> rows_positions(KvFormat& f, const ggml_tensor* rows, int64_t n, std::string& error) {
    const ggml_tensor* rope = rope_of(rows);
    const ggml_tensor* pos = rope ? rope->src[1] : nullptr;
    if (!pos || pos->type != GGML_TYPE_I32 || pos->ne[0] != n || !pos->data || !ggml_is_contiguous(pos)) {
        error = "the positions of its rows are not in the graph (a ROPE with one I32 position per row)";
        return std::nullopt;
    }
    auto model = rope_from_op(rope, f.head_dim, error);
    if (!model) return std::nullopt;
    if (f.rope_center && (model->mode() != f.rope_mode || 2 * model->pairs() != f.rope_dims)) {
        error = "the RoPE of its rows is not the calibration's (calibrate with this model)";
        return std::nullopt;
    }
    if (!f.rope) f.rope = std::move(*model);
    return positions_of(pos, f.layer);
}

// SET_ROWS: the rows of src0 (f32, n_heads heads of head_dim values each), quantized by the layer's codec
// into the slots of the rows that src1 names.
bool compute_set_rows(ggml_tensor* dst, KvFormat& f, const kvq::Executor& executor, int threads, std::string& error) {
    const ggml_tensor* rows = dst->src[0];
    const ggml_tensor* ids = dst->src[1];
    const kvq::Codec* codec = ready_codec(f, error);
    if (!codec) return false;
    if (rows->type != GGML_TYPE_F32 || rows->nb[0] != sizeof(float) || rows->ne[0] != dst->ne[0] || rows->ne[2] != 1 || rows->ne[3] != 1 ||
        dst->ne[2] != 1 || dst->ne[3] != 1 || dst->ne[0] % f.head_dim != 0 || ids->ne[1] != 1 || ids->ne[2] != 1) {
        error = "SET_ROWS of this shape or type (kvq formats take 2-d f32 rows of whole heads)";
        return false;
    }
    const int64_t n = rows->ne[1];
    const auto row_of = [&](int64_t i) {
        const char* id = static_cast<const char*>(ids->data) + i * ids->nb[0];
        return ids->type == GGML_TYPE_I64 ? *reinterpret_cast<const int64_t*>(id) : int64_t{*reinterpret_cast<const int32_t*>(id)};
    };
    const auto input = [&](int64_t i) { return reinterpret_cast<const float*>(static_cast<const char*>(rows->data) + i * rows->nb[1]); };
    if (const char* why = learn_rotation(f, rows)) {
        error = why;
        return false;
    }
    for (int64_t i = 0; i < n; ++i) {  // every index checked before any row is written
        if (row_of(i) < 0 || row_of(i) >= dst->ne[1]) {
            error = "SET_ROWS row index " + std::to_string(row_of(i)) + " outside the cache";
            return false;
        }
    }
    const bool calibrating = f.key && !formats().calibrate.empty();
    std::string rope_error;
    // Every key row write reads the positions (the first layer's read is the one the others can trust).
    const auto found = f.key ? rows_positions(f, rows, n, rope_error) : std::nullopt;
    const int32_t* positions = found ? found->data() : nullptr;
    if (f.rope_center) {
        for (int64_t i = 0; positions && i < n; ++i) {
            if (!position_fits(positions[i])) rope_error = "position " + std::to_string(positions[i]) + " outside [0, 2^24)";
        }
        if (!positions || !rope_error.empty()) {
            error = rope_error;
            return false;
        }
    }
    if (calibrating) {
        std::vector<float> k;
        for (int64_t i = 0; i < n; ++i) {
            k.assign(input(i), input(i) + dst->ne[0]);
            if (f.llama_rot > 0) hadamard(k.data(), dst->ne[0], f.llama_rot);  // the model's channels
            record_key_rows(f.layer, f.head_dim, k.data(), dst->ne[0], positions && f.rope ? &*f.rope : nullptr, positions ? positions[i] : 0);
        }
    }
    // A prompt's rows in parts of at least 16 on the backend's threads (one part for a decode step).
    const size_t heads = static_cast<size_t>(dst->ne[0] / f.head_dim);
    const int parts = static_cast<int>(std::clamp<int64_t>(n / 16, 1, std::max(threads, 1)));
    const auto part = [&](int p) {
        thread_local std::vector<float> shifted;
        for (int64_t i = n * p / parts; i < n * (p + 1) / parts; ++i) {
            char* row = static_cast<char*>(dst->data) + row_of(i) * dst->nb[1];
            const int64_t position = f.rope_center ? positions[i] : 0;
            codec->quantize_rows(to_stored(f, input(i), static_cast<size_t>(dst->ne[0]), 0, position, shifted), heads, row, f.slot_row_bytes,
                                 kvq::NanPolicy::propagate);
            if (f.rope_center) put_position(f, row, position);
        }
    };
    rows_written += static_cast<size_t>(n);
    if (parts == 1) {
        part(0);
    } else if (executor) {
        executor(parts, part);
    } else {
        std::vector<std::thread> pool;
        for (int p = 1; p < parts; ++p) pool.emplace_back(part, p);
        part(0);
        for (auto& t : pool) t.join();
    }
    return true;
}

// CPY between a view of whole rows of a kvq-format tensor and f32 rows of the same shape: the K-shift's
// ggml_cast to f32 (dequantize) and its ggml_cpy back (quantize), llama_kv_cache::build_rope_shift. A
// +ropecenter row keeps its position: read before the cell's heads are written back, moved by the shift.
bool compute_copy(const ggml_tensor* src, ggml_tensor* dst, std::string& error) {
    KvFormat* fs = kv_format_of(src);
    KvFormat* fd = kv_format_of(dst);
    const bool to_f32 = fs && !fd;
    KvFormat& f = to_f32 ? *fs : *fd;
    const ggml_tensor* codes = to_f32 ? src : dst;
    const ggml_tensor* floats = to_f32 ? dst : src;
    const ggml_tensor* base = root_of(codes);
    const kvq::Codec* codec = ready_codec(f, error);
    if (!codec) return false;
    bool whole_rows = (fs == nullptr) != (fd == nullptr) && floats->type == GGML_TYPE_F32 && floats->nb[0] == sizeof(float) &&
                      codes->ne[0] == f.head_dim && codes->view_offs % f.slot_row_bytes == 0;
    for (int d = 0; d < 4; ++d) {
        whole_rows = whole_rows && src->ne[d] == dst->ne[d] && (d == 0 || codes->nb[d] % f.slot_row_bytes == 0);
    }
    if (transforms_keys(f) && f.llama_rot < 0) {
        error = "a copy before any row write told whether llama.cpp rotates the rows";
        return false;
    }
    if (!whole_rows) {
        error = "a copy that is not whole rows between the kvq format and f32 (the K-shift of a partial rotary embedding, a copy "
                "between cache tensors, or another type)";
        return false;
    }
    std::optional<std::vector<int32_t>> found;
    const int32_t* shifts = nullptr;
    if (f.key && !to_f32) found = rows_positions(f, floats, codes->ne[2], error);  // every layer's K-shift reads them
    if (f.rope_center) {
        // Every head of each cache row in the view (its position is spread over them), and the shifts.
        if (codes->ne[1] * codes->ne[0] != base->ne[0] || codes->view_offs % base->nb[1] != 0 || codes->nb[1] != f.slot_row_bytes) {
            error = "a copy of part of +ropecenter rows (their position is spread over the row's heads)";
            return false;
        }
        if (!to_f32 && !(shifts = found ? found->data() : nullptr)) return false;
    }
    for (int64_t i3 = 0; i3 < src->ne[3]; ++i3) {
        for (int64_t i2 = 0; i2 < src->ne[2]; ++i2) {
            int64_t position = 0;
            if (f.rope_center) {
                const char* row = static_cast<const char*>(codes->data) + i2 * codes->nb[2] + i3 * codes->nb[3];
                position = get_position(f, row) + (shifts ? shifts[i2] : 0);
                if (!position_fits(position)) {
                    error = "a K-shift to position " + std::to_string(position) + ", outside [0, 2^24)";
                    return false;
                }
            }
            for (int64_t i1 = 0; i1 < src->ne[1]; ++i1) {
                char* c = static_cast<char*>(codes->data) + i1 * codes->nb[1] + i2 * codes->nb[2] + i3 * codes->nb[3];
                auto* x = reinterpret_cast<float*>(static_cast<char*>(floats->data) + i1 * floats->nb[1] + i2 * floats->nb[2] + i3 * floats->nb[3]);
                // The row's first channel within the cache row (its head), for the mean and scales.
                const size_t first = static_cast<size_t>((c - static_cast<const char*>(base->data)) % base->nb[1]) / f.slot_row_bytes *
                                     static_cast<size_t>(f.head_dim);
                ++rows_copied;
                if (to_f32) {
                    codec->dequantize_rows(c, 1, x);
                    from_stored(f, x, static_cast<size_t>(f.head_dim), first, position);
                } else {
                    thread_local std::vector<float> shifted;
                    codec->quantize_rows(to_stored(f, x, static_cast<size_t>(f.head_dim), first, position, shifted), 1, c, 0,
                                         kvq::NanPolicy::propagate);
                }
            }
            if (f.rope_center && !to_f32) put_position(f, static_cast<char*>(codes->data) + i2 * codes->nb[2] + i3 * codes->nb[3], position);
        }
    }
    return true;
}

}  // namespace

bool compute_kv_formats_op(ggml_tensor* node, const kvq::Executor& executor, int threads, std::string& error) {
    try {
        if (node->op == GGML_OP_SET_ROWS && kv_format_of(node)) return compute_set_rows(node, *kv_format_of(node), executor, threads, error);
        if (node->op == GGML_OP_CPY) return compute_copy(node->src[0], node, error);
    } catch (const std::exception& e) {
        error = e.what();
        return false;
    }
    error = "the plugin computes only SET_ROWS, FLASH_ATTN_EXT and whole-row copies to and from f32 on them";
    return false;
}

void init_kv_formats() {
    if (!formats().on) return;
    if (!formats().calib.empty()) {
        std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS: calibration %s: %zu layers\n", formats().calib.c_str(), calibration().size());
    }
}

const float* kv_format_queries(const ggml_tensor* k, const ggml_tensor* q, int64_t i3, std::vector<float>& scratch, size_t& row_stride,
                               size_t& head_stride) {
    const auto* qd = reinterpret_cast<const float*>(static_cast<const char*>(q->data) + i3 * q->nb[3]);
    row_stride = q->nb[1] / sizeof(float);
    head_stride = q->nb[2] / sizeof(float);
    const KvFormat* f = kv_format_of(k);
    if (!f || !f->key || !f->codec) return qd;
    const bool calibrating = !formats().calibrate.empty();
    // Keys stored in the model's channels are scored by queries in them: llama.cpp's rotation undone (the
    // same as its keys', checked when the op is taken), then divided by the scales.
    const bool model_basis = f->model_basis && f->llama_rot > 0;
    if (!calibrating && !model_basis && !f->key_scales) return qd;
    const ggml_tensor* base = root_of(k);
    const int64_t d = f->head_dim, n_heads = q->ne[2], n_rows = q->ne[1], g = n_heads / k->ne[2];
    const int64_t first_head = static_cast<int64_t>((k->view_offs % base->nb[1]) / f->slot_row_bytes);
    const int64_t q_rot = calibrating ? std::max<int64_t>(f->llama_rot, 0) : model_basis ? f->llama_rot : 0;
    scratch.resize(static_cast<size_t>(n_rows * n_heads * d));
    for (int64_t r = 0; r < n_rows; ++r) {
        for (int64_t h = 0; h < n_heads; ++h) {
            float* y = scratch.data() + (r * n_heads + h) * d;
            std::copy_n(qd + r * static_cast<int64_t>(row_stride) + h * static_cast<int64_t>(head_stride), d, y);
            if (q_rot > 0) hadamard(y, d, q_rot);
        }
    }
    row_stride = static_cast<size_t>(n_heads * d);
    head_stride = static_cast<size_t>(d);
    if (calibrating) {
        record_queries(f->layer, d, base->ne[0], scratch.data(), n_rows, n_heads, g, first_head);
        if (!model_basis && !f->key_scales) {  // calibrating only: attention on the queries as given
            row_stride = q->nb[1] / sizeof(float);
            head_stride = q->nb[2] / sizeof(float);
            return qd;
        }
    }
    for (int64_t r = 0; r < n_rows && f->key_scales; ++r) {
        for (int64_t h = 0; h < n_heads; ++h) {
            const float* s = f->scale.data() + (first_head + h / g) * d;
            float* y = scratch.data() + (r * n_heads + h) * d;
            for (int64_t j = 0; j < d; ++j) y[j] /= s[j];
        }
    }
    return scratch.data();
}

bool kv_format_rope_centered(const ggml_tensor* k) {
    const KvFormat* f = kv_format_of(k);
    return f && f->key && f->rope_center && f->codec;
}

std::string kv_format_attention_refusal(const ggml_tensor* k, const ggml_tensor* q, float softcap, bool sinks) {
    const KvFormat* f = kv_format_of(k);
    if (!f || !transforms_keys(*f)) return "";
    if (f->llama_rot < 0 || llama_rotation_of(q) != f->llama_rot) {
        return "queries rotated otherwise than the keys' rows (llama.cpp's attn_rot_k), or keys never written";
    }
    if (f->rope_center && !f->rope) return "+ropecenter keys whose RoPE was never seen (no row written)";
    if (!(f->center || f->rope_center) || (softcap == 0.0f && !sinks)) return "";
    // Centered keys give every score of a query the same offset −q·μ, which softmax ignores; a softcap
    // or a sink logit would not.
    return "centered keys (+center, +ropecenter) cannot serve attention with a logit softcap or attention sinks";
}

bool kv_format_row_to_float(const ggml_tensor* view, const char* row, float* out) {
    const KvFormat* f = kv_format_of(view);
    if (!f) return false;
    if (!f->codec) throw std::runtime_error("KVQ_KV_FORMATS: a row of " + std::string(root_of(view)->name) + " read before its format is known");
    const ggml_tensor* base = root_of(view);
    f->codec->dequantize_rows(row, 1, out);
    const int64_t position = f->rope_center ? get_position(*f, cache_row_of(base, row)) : 0;
    from_stored(*f, out, static_cast<size_t>(f->head_dim),
                static_cast<size_t>((row - static_cast<const char*>(base->data)) % base->nb[1]) / f->slot_row_bytes * static_cast<size_t>(f->head_dim),
                position);
    return true;
}

void learn_kv_formats_op(const ggml_tensor* op) {
    if (op->op != GGML_OP_SET_ROWS) return;
    if (KvFormat* f = kv_format_of(op); f && learn_rotation(*f, op->src[0])) {
        f->error = "its rows arrive rotated otherwise than before (llama.cpp's attn_rot_k changed)";
    }
}

std::string kv_formats_stats() {
    if (!formats().on) return "";
    return "KVQ_KV_FORMATS: " + std::to_string(rows_written.load()) + " cache rows written, " + std::to_string(rows_copied.load()) +
           " head rows copied to or from f32 (the K-shift)";
}

void write_kv_calibration() { write_calibration(formats().calibrate); }

}  // namespace kvq_ggml
