// KVQ_KV_FORMATS' calibration and what it reads from llama.cpp's graph (kv-calibration.hpp).
#include "kv-calibration.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string_view>

namespace kvq_ggml {

void hadamard(float* x, int64_t len, int64_t n) {
    const float norm = static_cast<float>(1.0 / std::sqrt(static_cast<double>(n)));
    for (int64_t c = 0; c + n <= len; c += n) {
        float* y = x + c;
        for (int64_t h = 1; h < n; h *= 2) {
            for (int64_t i = 0; i < n; i += 2 * h) {
                for (int64_t j = i; j < i + h; ++j) {
                    const float a = y[j], b = y[j + h];
                    y[j] = a + b;
                    y[j + h] = a - b;
                }
            }
        }
        for (int64_t j = 0; j < n; ++j) y[j] *= norm;
    }
}

namespace {

bool is_llama_rotation(const ggml_tensor* rot) {
    const std::string_view name = rot ? rot->name : "";
    return rot && rot->type == GGML_TYPE_F32 && rot->ne[0] == rot->ne[1] && rot->ne[0] >= 2 && (rot->ne[0] & (rot->ne[0] - 1)) == 0 &&
           name.substr(0, 9) == "attn_inp_" && name.size() > 13 && name.substr(name.size() - 4) == "_rot";
}

bool is_view_like(ggml_op op) {
    return op == GGML_OP_RESHAPE || op == GGML_OP_VIEW || op == GGML_OP_PERMUTE || op == GGML_OP_TRANSPOSE || op == GGML_OP_CONT;
}

}  // namespace

int64_t llama_rotation_of(const ggml_tensor* t) {
    for (int depth = 0; t && depth < 16; ++depth) {
        if (is_view_like(t->op)) {
            t = t->src[0];
            continue;
        }
        if (t->op == GGML_OP_MUL_MAT) return is_llama_rotation(t->src[0]) ? t->src[0]->ne[0] : 0;
        return 0;
    }
    return 0;
}

const ggml_tensor* rope_of(const ggml_tensor* t) {
    for (int depth = 0; t && depth < 16; ++depth) {
        if (t->op == GGML_OP_ROPE) return t;
        if (is_view_like(t->op) || t->op == GGML_OP_CPY) {
            t = t->src[0];
        } else if (t->op == GGML_OP_MUL_MAT && is_llama_rotation(t->src[0])) {
            t = t->src[1];
        } else {
            return nullptr;
        }
    }
    return nullptr;
}

void Rope::rotate(float* x, int64_t p, bool inverse) const {
    for (int64_t i = 0; i < pairs(); ++i) {
        // The angle in double, reduced before the float rotation: exact enough at any position.
        const double angle = std::fmod(static_cast<double>(p) * theta[static_cast<size_t>(i)], 2.0 * M_PI);
        const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(inverse ? -std::sin(angle) : std::sin(angle));
        const float xa = x[a(i)], xb = x[b(i)];
        x[a(i)] = xa * c - xb * s;
        x[b(i)] = xa * s + xb * c;
    }
}

std::optional<Rope> rope_from_op(const ggml_tensor* rope, int64_t head_dim, std::string& error) {
    int32_t params[16];
    std::memcpy(params, rope->op_params, sizeof(params));
    const int32_t n_dims = params[1], mode = params[2];
    float freq_base = 0, freq_scale = 0;
    std::memcpy(&freq_base, params + 5, sizeof(float));
    std::memcpy(&freq_scale, params + 6, sizeof(float));
    if (mode != 0 && mode != GGML_ROPE_TYPE_NEOX) {
        error = "a rotary embedding of mode " + std::to_string(mode) + " (+ropecenter models the normal and NeoX ones)";
        return std::nullopt;
    }
    if (n_dims < 2 || n_dims % 2 != 0 || n_dims > head_dim || rope->ne[0] != head_dim || !(freq_base > 0) || !(freq_scale > 0)) {
        error = "a rotary embedding of " + std::to_string(n_dims) + " of " + std::to_string(rope->ne[0]) + " channels that does not fit heads of " +
                std::to_string(head_dim);
        return std::nullopt;
    }
    const ggml_tensor* factors = rope->src[2];
    if (factors && (factors->type != GGML_TYPE_F32 || factors->ne[0] < n_dims / 2 || !factors->data)) {
        error = "rotary frequency factors of a form the plugin does not read";
        return std::nullopt;
    }
    Rope r;
    r.head_dim = head_dim;
    r.neox = mode == GGML_ROPE_TYPE_NEOX;
    r.theta.resize(static_cast<size_t>(n_dims / 2));
    for (int32_t i = 0; i < n_dims / 2; ++i) {
        double t = freq_scale * std::pow(static_cast<double>(freq_base), -2.0 * i / n_dims);
        if (factors) t /= static_cast<const float*>(factors->data)[i];
        r.theta[static_cast<size_t>(i)] = t;
    }
    return r;
}

// ---- the calibration file ------------------------------------------------------------------------------

namespace {

constexpr const char* kMagic = "kvq-kv-calibration";
constexpr int64_t kMaxWidth = int64_t{1} << 20;
constexpr int kMaxLayers = 4096;

// One layer's sums so far.
struct Moments {
    int64_t width = 0, head_dim = 0;
    double rows = 0, queries = 0, rope_rows = 0;
    int rope_mode = -1;  // of the rows' RoPE (the first seen; rows of another are not counted in rope_rows)
    int64_t rope_dims = 0;
    std::vector<double> sum, sumsq, qsq, rsum, rsumsq;
};

std::mutex mu;
std::map<int, Moments> moments;  // by layer

Moments& layer_moments(int layer, int64_t width, int64_t head_dim) {
    Moments& m = moments[layer];
    if (m.width == 0) {
        m.width = width;
        m.head_dim = head_dim;
        for (auto* v : {&m.sum, &m.sumsq, &m.qsq, &m.rsum, &m.rsumsq}) v->assign(static_cast<size_t>(width), 0.0);
    }
    return m;
}

}  // namespace

std::optional<std::map<int, LayerCalibration>> read_calibration(const std::string& path, std::string& error) {
    std::ifstream in(path);
    if (!in) {
        error = "cannot read the calibration file '" + path + "'";
        return std::nullopt;
    }
    std::string magic, word;
    int version = 0, n_layers = 0;
    in >> magic >> version >> word >> n_layers;
    if (!in || magic != kMagic || (version != 1 && version != 2) || word != "layers" || n_layers < 1 || n_layers > kMaxLayers) {
        error = "'" + path + "' is not a kvq KV calibration file (version 1 or 2)";
        return std::nullopt;
    }
    std::map<int, LayerCalibration> layers;
    for (int i = 0; i < n_layers; ++i) {
        std::string w[5];
        int layer = -1;
        LayerCalibration c;
        double rows = 0, queries = 0;
        in >> w[0] >> layer >> w[1] >> c.width >> w[2] >> c.head_dim >> w[3] >> rows >> w[4] >> queries;
        const bool header = in && w[0] == "layer" && w[1] == "width" && w[2] == "head_dim" && w[3] == "rows" && w[4] == "queries" &&
                            layer >= 0 && layer < (1 << 20) && c.width > 0 && c.width <= kMaxWidth && c.head_dim > 0 &&
                            c.width % c.head_dim == 0 && rows > 0 && queries > 0 && !layers.count(layer);
        int with_rope = 0;
        if (header && version == 2) in >> word >> c.rope_mode >> c.rope_dims;
        with_rope = c.rope_mode >= 0;
        const bool rope_ok = version == 1 || (in && word == "rope" && (c.rope_mode == -1 || c.rope_mode == 0 || c.rope_mode == GGML_ROPE_TYPE_NEOX) &&
                                              (c.rope_mode < 0 || (c.rope_dims >= 2 && c.rope_dims % 2 == 0 && c.rope_dims <= c.head_dim)));
        if (!header || !rope_ok) {
            error = "'" + path + "': layer entry " + std::to_string(i) + " is malformed";
            return std::nullopt;
        }
        std::vector<std::pair<const char*, std::vector<float>*>> arrays{{"mean", &c.mean}, {"kvar", &c.kvar}, {"qsq", &c.qsq}};
        if (with_rope) arrays.insert(arrays.end(), {{"rmean", &c.rmean}, {"rvar", &c.rvar}});
        for (auto [name, v] : arrays) {
            in >> word;
            v->resize(static_cast<size_t>(c.width));
            for (float& x : *v) in >> x;
            const bool signed_values = v == &c.mean || v == &c.rmean;
            bool ok = in && word == name;
            for (const float x : *v) ok = ok && std::isfinite(x) && (signed_values || x >= 0.0f);
            if (!ok) {
                error = "'" + path + "': layer " + std::to_string(layer) + "'s " + name + " is malformed or not finite";
                return std::nullopt;
            }
        }
        layers.emplace(layer, std::move(c));
    }
    return layers;
}

void record_key_rows(int layer, int64_t head_dim, const float* rows, int64_t width, const Rope* rope, int64_t position) {
    std::lock_guard<std::mutex> lock(mu);
    Moments& m = layer_moments(layer, width, head_dim);
    if (m.width != width || m.head_dim != head_dim) return;
    for (int64_t j = 0; j < width; ++j) {
        m.sum[j] += rows[j];
        m.sumsq[j] += double(rows[j]) * rows[j];
    }
    m.rows += 1;
    if (!rope || rope->head_dim != head_dim) return;
    if (m.rope_mode < 0) {
        m.rope_mode = rope->mode();
        m.rope_dims = 2 * rope->pairs();
    }
    if (m.rope_mode != rope->mode() || m.rope_dims != 2 * rope->pairs()) return;
    thread_local std::vector<float> k;
    k.assign(rows, rows + width);
    for (int64_t h = 0; h < width / head_dim; ++h) rope->rotate(k.data() + h * head_dim, position, /*inverse=*/true);
    for (int64_t j = 0; j < width; ++j) {
        m.rsum[j] += k[j];
        m.rsumsq[j] += double(k[j]) * k[j];
    }
    m.rope_rows += 1;
}

void record_queries(int layer, int64_t head_dim, int64_t width, const float* q, int64_t n_rows, int64_t n_heads, int64_t g,
                    int64_t first_head) {
    std::lock_guard<std::mutex> lock(mu);
    Moments& m = layer_moments(layer, width, head_dim);
    if (m.width != width || m.head_dim != head_dim) return;
    for (int64_t r = 0; r < n_rows; ++r) {
        for (int64_t h = 0; h < n_heads; ++h) {
            const float* x = q + (r * n_heads + h) * head_dim;
            double* acc = m.qsq.data() + (first_head + h / g) * head_dim;
            for (int64_t j = 0; j < head_dim; ++j) acc[j] += double(x[j]) * x[j] / double(g);
        }
    }
    m.queries += double(n_rows);
}

void write_calibration(const std::string& path) {
    if (path.empty()) return;
    std::lock_guard<std::mutex> lock(mu);
    std::vector<std::pair<int, const Moments*>> ready;
    for (const auto& [layer, m] : moments) {
        if (m.rows > 0 && m.queries > 0 && m.head_dim > 0) ready.emplace_back(layer, &m);
    }
    if (ready.empty()) return;
    const std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp);
        out << kMagic << " 2\nlayers " << ready.size() << "\n";
        out.precision(9);
        for (const auto& [layer, m] : ready) {
            // Rows written before their positions were known (none in llama.cpp's graphs) leave the
            // pre-RoPE moments out rather than skew them.
            const bool with_rope = m->rope_mode >= 0 && m->rope_rows == m->rows;
            out << "layer " << layer << " width " << m->width << " head_dim " << m->head_dim << " rows " << m->rows << " queries "
                << m->queries << " rope " << (with_rope ? m->rope_mode : -1) << ' ' << (with_rope ? m->rope_dims : 0) << "\n";
            const auto n = static_cast<size_t>(m->width);
            std::vector<double> mean(n), kvar(n), qsq(n), rmean(n), rvar(n);
            for (size_t j = 0; j < n; ++j) {
                mean[j] = m->sum[j] / m->rows;
                kvar[j] = std::max(m->sumsq[j] / m->rows - mean[j] * mean[j], 0.0);
                qsq[j] = m->qsq[j] / m->queries;
                rmean[j] = m->rsum[j] / m->rows;
                rvar[j] = std::max(m->rsumsq[j] / m->rows - rmean[j] * rmean[j], 0.0);
            }
            std::vector<std::pair<const char*, const std::vector<double>*>> arrays{{"mean", &mean}, {"kvar", &kvar}, {"qsq", &qsq}};
            if (with_rope) arrays.insert(arrays.end(), {{"rmean", &rmean}, {"rvar", &rvar}});
            for (auto [name, v] : arrays) {
                out << name;
                for (const double x : *v) out << ' ' << static_cast<float>(x);
                out << "\n";
            }
        }
        if (!out) {
            std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS: cannot write the calibration %s\n", tmp.c_str());
            return;
        }
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS: cannot write the calibration %s\n", path.c_str());
        return;
    }
    std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS: wrote the calibration of %zu layers to %s\n", ready.size(), path.c_str());
}

}  // namespace kvq_ggml
