// libggml-kvq.so: a ggml backend that computes GGML_OP_FLASH_ATTN_EXT with kvq's kernels, straight on
// ggml's KV tensors (their bytes are kvq's codecs of the same names), loaded at run time by any ggml built
// with GGML_BACKEND_DL=ON (GGML_BACKEND_PATH=/path/to/libggml-kvq.so, or ggml_backend_load()).
//
// Modeled on ggml's BLAS backend (ggml/src/ggml-blas/): an accelerator device that works on host memory
// (the CPU backend's buffers) and takes only the ops it computes exactly as ggml defines them; the
// scheduler leaves everything else, and every flash attention it declines, to the CPU backend. What it
// takes and declines: supports_flash_attn below; docs/llama-cpp.md.
//
// Built against one ggml's headers (ggml.h, ggml-backend.h and the internal ggml-backend-impl.h, whose
// interface structs must match the loading ggml's: GGML_BACKEND_API_VERSION is checked by the loader).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#ifdef KVQ_GGML_OPENMP
#include <omp.h>
#endif

#include "ggml-backend-impl.h"
#include "ggml-backend.h"
#include "ggml.h"
#include "kvq/attention.hpp"
#include "kvq/codec.hpp"
#include "kvq/simd.hpp"
#include "kv-formats.hpp"

namespace {

constexpr const char* kName = "kvq";

// The ggml types whose rows are kvq codecs byte for byte come from kvq's codec table (its ggml_type
// column): the codec that reads a type is named as ggml names it. registry_matches_ggml checks both
// against this ggml when the plugin registers.
bool registry_matches_ggml() {
    bool ok = true;
    for (const std::string& name : kvq::codec_names()) {
        const kvq::CodecInfo info = kvq::codec_info(name);
        if (info.ggml_type < 0) continue;
        const char* problem = nullptr;
        const auto t = static_cast<ggml_type>(info.ggml_type);
        constexpr int64_t n = 256;  // values in a row: a multiple of every block
        if (info.ggml_type >= GGML_TYPE_COUNT || ggml_blck_size(t) <= 0 || n % ggml_blck_size(t) != 0) {
            problem = "not a type of this ggml";
        } else if (kvq::codec_for_ggml_type(info.ggml_type) != ggml_type_name(t)) {
            problem = "named otherwise by this ggml";
        } else if (ggml_row_size(t, n) != kvq::Codec::make(name, n).row_bytes()) {
            problem = "of another row size in this ggml";
        }
        if (problem) {
            std::fprintf(stderr, "ggml-kvq: codec %s has ggml type %d, %s (ggml: %s); the plugin does not register\n",
                         name.c_str(), info.ggml_type, problem,
                         info.ggml_type < GGML_TYPE_COUNT ? ggml_type_name(t) : "none");
            ok = false;
        }
    }
    return ok;
}

// Codecs by (type, head size), made on first use and kept for the process (a handful).
const kvq::Codec* codec_for(ggml_type t, int64_t head_dim) {
    static std::mutex mu;
    static std::map<std::pair<int, int64_t>, kvq::Codec> codecs;
    const std::string name = kvq::codec_for_ggml_type(t);
    if (name.empty() || head_dim <= 0 || head_dim > (1 << 16)) return nullptr;
    std::lock_guard<std::mutex> lock(mu);
    const auto key = std::make_pair(static_cast<int>(t), head_dim);
    auto it = codecs.find(key);
    if (it == codecs.end()) {
        try {
            it = codecs.emplace(key, kvq::Codec::make(name, static_cast<int>(head_dim))).first;
        } catch (const std::exception&) {
            return nullptr;  // a head size the codec does not take
        }
    }
    return &it->second;
}

// A flash attention's K or V: kvq's format where KVQ_KV_FORMATS put one there, else the codec of ggml's type.
const kvq::Codec* rows_codec(const ggml_tensor* t) {
    if (kvq_ggml::kv_format_of(t)) return kvq_ggml::kv_format_codec(t);
    return codec_for(t->type, t->ne[0]);
}

bool row_contiguous(const ggml_tensor* t) { return t->nb[0] == ggml_type_size(t->type); }

// A cache of plain types (f16, bf16, f32) is left to ggml's CPU backend unless KVQ_GGML_PLAIN_KV=1: there
// kvq is faster only at depth (docs/llama-cpp.md), and llama.cpp's default -fa auto turns flash attention
// off for the whole context when another device than the layer's computes it, which made a plain cache
// slower with the plugin loaded than without. A quantized V forces flash attention on in llama.cpp; a
// quantized K with a plain V does not, so the first such op prints what to pass.
bool quantized_kv_or_opted_in(const ggml_tensor* k, const ggml_tensor* v) {
    const auto plain = [](ggml_type t) { return t == GGML_TYPE_F16 || t == GGML_TYPE_BF16 || t == GGML_TYPE_F32; };
    static const bool plain_kv = [] {
        const char* env = std::getenv("KVQ_GGML_PLAIN_KV");
        return env && std::strcmp(env, "1") == 0;
    }();
    if (plain(k->type) && plain(v->type)) return plain_kv;
    if (plain(v->type)) {
        static std::once_flag hint;
        std::call_once(hint, [] {
            std::fprintf(stderr, "ggml-kvq: flash attention on a quantized K and a plain V: llama.cpp's -fa auto turns flash attention "
                                 "off when this backend computes it (\"Flash Attention ... set to disabled\"); pass -fa on\n");
        });
    }
    return true;
}

// Whether kvq computes this flash attention exactly as ggml defines it (ggml-cpu's ops.cpp): everything
// else is declined and runs on the CPU backend.
bool supports_flash_attn(const ggml_tensor* op) {
    const ggml_tensor* q = op->src[0];
    const ggml_tensor* k = op->src[1];
    const ggml_tensor* v = op->src[2];
    const ggml_tensor* mask = op->src[3];
    if (!q || !k || !v) return false;
    const ggml_tensor* sinks = op->src[4];
    if (sinks && (sinks->type != GGML_TYPE_F32 || !ggml_is_contiguous(sinks) || sinks->ne[0] < q->ne[2])) return false;
    float max_bias = 0.0f;
    std::memcpy(&max_bias, reinterpret_cast<const float*>(op->op_params) + 1, sizeof(float));
    if (max_bias != 0.0f) return false;  // ALiBi
    float scale = 0.0f, softcap = 0.0f;
    std::memcpy(&scale, reinterpret_cast<const float*>(op->op_params) + 0, sizeof(float));
    std::memcpy(&softcap, reinterpret_cast<const float*>(op->op_params) + 2, sizeof(float));
    if (!std::isfinite(scale) || scale <= 0.0f || !std::isfinite(softcap) || softcap < 0.0f) return false;
    const int32_t prec = op->op_params[3];
    if (prec != GGML_PREC_DEFAULT && prec != GGML_PREC_F32) return false;
    if (q->type != GGML_TYPE_F32 || op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op)) return false;
    // Queries and keys of one head size, values and results of theirs (DeepSeek's latent attention: 576
    // and 512, V a view of K's leading values); rows contiguous.
    const int64_t dk = k->ne[0], dv = v->ne[0];
    if (q->ne[0] != dk || op->ne[0] != dv) return false;
    if (!row_contiguous(q) || !row_contiguous(k) || !row_contiguous(v)) return false;
    if (!rows_codec(k) || !rows_codec(v)) return false;
    if (!kvq_ggml::kv_format_of(k) && !quantized_kv_or_opted_in(k, v)) return false;
    // Shapes: tokens k->ne[1] == v->ne[1]; kv heads dividing the query heads (GQA); one batch of
    // sequences per dim 3 (ggml asserts equal ne[3]).
    if (k->ne[1] != v->ne[1] || k->ne[2] != v->ne[2] || k->ne[2] <= 0 || q->ne[2] % k->ne[2] != 0) return false;
    if (k->ne[3] != q->ne[3] || v->ne[3] != q->ne[3]) return false;
    if (q->ne[2] > (1 << 16) || k->ne[2] > (1 << 16)) return false;
    if (mask) {
        // f16, one row per query row shared by every head (ne[2] == 1; a per-head mask is declined),
        // broadcast over dim 3.
        if (mask->type != GGML_TYPE_F16 || !ggml_is_contiguous(mask)) return false;
        if (mask->ne[2] != 1 || mask->ne[0] < k->ne[1] || mask->ne[1] < q->ne[1]) return false;
        if (mask->ne[3] <= 0 || q->ne[3] % mask->ne[3] != 0) return false;
    }
    return true;
}

struct Context {
    int n_threads = 1;
    kvq::AttendOptions options;  // its executor is made once: a call allocates nothing
    size_t ops = 0, query_rows = 0;  // what it computed (printed at exit with KVQ_GGML_STATS=1)
    bool check = false;              // KVQ_GGML_CHECK=1: check_flash_attn after each op
    std::vector<float> queries;       // scaled queries (KVQ_KV_FORMATS' key scales)
};

// Until ggml sets it (llama.cpp does, before every graph): the hardware's threads, as ggml's CPU backend.
int default_threads() { return std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 256); }

// KVQ_GGML_THREADS, when set, overrides set_n_threads (tests use it to run the multi-thread paths).
int threads_for(int requested) {
    if (const char* env = std::getenv("KVQ_GGML_THREADS")) {
        const int n = std::atoi(env);
        if (n >= 1 && n <= 256) return n;
    }
    return std::clamp(requested, 1, 256);
}

void compute_flash_attn(Context& ctx, ggml_tensor* dst) {
    const ggml_tensor* q = dst->src[0];
    const ggml_tensor* k = dst->src[1];
    const ggml_tensor* v = dst->src[2];
    const ggml_tensor* mask = dst->src[3];
    float scale = 0.0f, softcap = 0.0f;
    std::memcpy(&scale, reinterpret_cast<const float*>(dst->op_params) + 0, sizeof(float));
    std::memcpy(&softcap, reinterpret_cast<const float*>(dst->op_params) + 2, sizeof(float));
    const kvq::Codec& keys = *rows_codec(k);
    const kvq::Codec& values = *rows_codec(v);
    const int n_heads = static_cast<int>(q->ne[2]);
    const int n_kv_heads = static_cast<int>(k->ne[2]);
    const size_t n_rows = static_cast<size_t>(q->ne[1]);
    const size_t n_tokens = static_cast<size_t>(k->ne[1]);

    kvq::AttendOptions& o = ctx.options;
    o.scale = scale;
    o.softcap = softcap;
    o.n_queries = n_rows;
    // dst is [d, n_heads, n_rows, ne3], contiguous (ggml's permute(0, 2, 1, 3) of the attention).
    o.out_head_stride = dst->nb[1] / sizeof(float);
    o.out_row_stride = dst->nb[2] / sizeof(float);
    o.mask_type = kvq::MaskType::f16;
    o.mask_row_stride = mask ? mask->nb[1] / sizeof(ggml_fp16_t) : 0;
    o.threads = threads_for(ctx.n_threads);
    o.nan = kvq::NanPolicy::propagate;  // as ggml: a NaN query gives NaN, never an abort
    o.sinks = dst->src[4] ? static_cast<const float*>(dst->src[4]->data) : nullptr;  // one per query head
    ++ctx.ops;
    ctx.query_rows += n_rows * static_cast<size_t>(q->ne[3]);
    if (kvq_ggml::kv_format_rope_centered(k)) {  // KVQ_KV_FORMATS' +ropecenter keys: a score correction per key
        kvq_ggml::attend_rope_centered(keys, values, dst, o, ctx.queries);
        return;
    }
    for (int64_t i3 = 0; i3 < q->ne[3]; ++i3) {
        // KVQ_KV_FORMATS' key scales divide the queries (a copy); otherwise q's own rows and strides.
        const float* qd = kvq_ggml::kv_format_queries(k, q, i3, ctx.queries, o.q_row_stride, o.q_head_stride);
        const kvq::RowsView kr{static_cast<const char*>(k->data) + i3 * k->nb[3], k->nb[1], k->nb[2]};
        const kvq::RowsView vr{static_cast<const char*>(v->data) + i3 * v->nb[3], v->nb[1], v->nb[2]};
        o.mask = mask ? static_cast<const char*>(mask->data) + (i3 % mask->ne[3]) * mask->nb[3] : nullptr;
        auto* out = reinterpret_cast<float*>(static_cast<char*>(dst->data) + i3 * dst->nb[3]);
        kvq::attend_rows(keys, values, n_heads, n_kv_heads, qd, kr, vr, n_tokens, out, o);
    }
}

// KVQ_GGML_CHECK=1: every op is compared with a double-precision reference computed here from ggml's own
// tensors (ggml's to_float for the rows), and the largest error printed: a debugging aid, slow.
void check_flash_attn(const ggml_tensor* dst) {
    const ggml_tensor* q = dst->src[0];
    const ggml_tensor* k = dst->src[1];
    const ggml_tensor* v = dst->src[2];
    const ggml_tensor* mask = dst->src[3];
    const ggml_tensor* sinks = dst->src[4];
    float scale = 0.0f, softcap = 0.0f;
    std::memcpy(&scale, reinterpret_cast<const float*>(dst->op_params) + 0, sizeof(float));
    std::memcpy(&softcap, reinterpret_cast<const float*>(dst->op_params) + 2, sizeof(float));
    const int64_t d = k->ne[0], dv = v->ne[0], n_kv = k->ne[1], g = q->ne[2] / k->ne[2];
    // A row as the model's values: ggml's to_float, or (KVQ_KV_FORMATS) kvq's decoding with the mean and
    // scales undone, so that the check holds the mode to the attention of the keys it was given.
    const auto row_reader = [](const ggml_tensor* t) {
        return [t, to_float = ggml_get_type_traits(t->type)->to_float](const char* row, float* out, int64_t n) {
            if (!kvq_ggml::kv_format_row_to_float(t, row, out)) to_float(row, out, n);
        };
    };
    const auto to_float_k = row_reader(k);
    const auto to_float_v = row_reader(v);
    std::vector<float> kr(d), vr(dv);
    double max_err = 0, max_ref = 0;
    for (int64_t i3 = 0; i3 < q->ne[3]; ++i3) {
        for (int64_t i1 = 0; i1 < q->ne[1]; ++i1) {
            for (int64_t h = 0; h < q->ne[2]; ++h) {
                const auto* qr = reinterpret_cast<const float*>(static_cast<const char*>(q->data) + i1 * q->nb[1] + h * q->nb[2] + i3 * q->nb[3]);
                std::vector<double> s(n_kv, -INFINITY), acc(dv, 0.0);
                double mx = -INFINITY;
                for (int64_t t = 0; t < n_kv; ++t) {
                    float m = 0.0f;
                    if (mask) {
                        const auto* mr = reinterpret_cast<const ggml_fp16_t*>(static_cast<const char*>(mask->data) + i1 * mask->nb[1] + (i3 % mask->ne[3]) * mask->nb[3]);
                        m = ggml_fp16_to_fp32(mr[t]);
                    }
                    if (m == -INFINITY) continue;
                    to_float_k(static_cast<const char*>(k->data) + t * k->nb[1] + (h / g) * k->nb[2] + i3 * k->nb[3], kr.data(), d);
                    double dot = 0;
                    for (int64_t j = 0; j < d; ++j) dot += double(qr[j]) * kr[j];
                    dot *= scale;
                    if (softcap > 0) dot = softcap * std::tanh(dot / softcap);
                    s[t] = dot + m;
                    mx = std::max(mx, s[t]);
                }
                double sum = 0;
                if (sinks) {
                    mx = std::max(mx, double(static_cast<const float*>(sinks->data)[h]));
                    sum = std::exp(static_cast<const float*>(sinks->data)[h] - mx);
                }
                for (int64_t t = 0; t < n_kv && mx > -INFINITY; ++t) {
                    if (s[t] == -INFINITY) continue;
                    const double w = std::exp(s[t] - mx);
                    sum += w;
                    to_float_v(static_cast<const char*>(v->data) + t * v->nb[1] + (h / g) * v->nb[2] + i3 * v->nb[3], vr.data(), dv);
                    for (int64_t j = 0; j < dv; ++j) acc[j] += w * vr[j];
                }
                const auto* o = reinterpret_cast<const float*>(static_cast<const char*>(dst->data) + h * dst->nb[1] + i1 * dst->nb[2] + i3 * dst->nb[3]);
                for (int64_t j = 0; j < dv; ++j) {
                    const double want = sum > 0 ? acc[j] / sum : 0.0;
                    max_err = std::max(max_err, std::fabs(o[j] - want));
                    max_ref = std::max(max_ref, std::fabs(want));
                }
            }
        }
    }
    std::fprintf(stderr, "ggml-kvq check %s: q [%lld %lld %lld %lld] k %s [%lld %lld %lld] nb %zu %zu, mask %s [%lld %lld %lld %lld]: max |err| %.3g (max |out| %.3g)\n",
                 dst->name, (long long)q->ne[0], (long long)q->ne[1], (long long)q->ne[2], (long long)q->ne[3], ggml_type_name(k->type),
                 (long long)k->ne[0], (long long)k->ne[1], (long long)k->ne[2], k->nb[1], k->nb[2], mask ? "f16" : "none",
                 mask ? (long long)mask->ne[0] : 0LL, mask ? (long long)mask->ne[1] : 0LL, mask ? (long long)mask->ne[2] : 0LL,
                 mask ? (long long)mask->ne[3] : 0LL, max_err, max_ref);
}

// ---- backend ----------------------------------------------------------------------------------------

const char* backend_get_name(ggml_backend_t) { return kName; }

void backend_free(ggml_backend_t backend) {
    auto* ctx = static_cast<Context*>(backend->context);
    if (const char* env = std::getenv("KVQ_GGML_STATS"); env && std::strcmp(env, "1") == 0) {
        std::fprintf(stderr, "ggml-kvq: %zu flash attention ops, %zu query rows\n", ctx->ops, ctx->query_rows);
        if (const std::string stats = kvq_ggml::kv_formats_stats(); !stats.empty()) std::fprintf(stderr, "ggml-kvq: %s\n", stats.c_str());
    }
    kvq_ggml::write_kv_calibration();  // KVQ_KV_FORMATS=calibrate=PATH: what this context saw
    delete ctx;
    delete backend;
}

void refuse_kv_formats_op(const ggml_tensor* node, const std::string& why) {
    const ggml_tensor* cache = kvq_ggml::kv_format_of(node) ? node : nullptr;
    for (const ggml_tensor* src : node->src) cache = cache ? cache : (src && kvq_ggml::kv_format_of(src) ? src : nullptr);
    const kvq_ggml::KvFormat* f = kvq_ggml::kv_format_of(cache);
    const char* base = cache->view_src ? cache->view_src->name : cache->name;
    std::fprintf(stderr, "ggml-kvq: KVQ_KV_FORMATS: refused %s (%s) on %s, whose bytes are kvq's %s, not ggml's %s: %s.%s\n",
                 ggml_op_desc(node), node->name, base, f->spec.c_str(), ggml_type_name(f->slot), why.c_str(),
                 node->op == GGML_OP_MUL_MAT ? " Attention without flash attention reads the cache with MUL_MAT: pass -fa on." : "");
}

ggml_status backend_graph_compute(ggml_backend_t backend, ggml_cgraph* cgraph) {
    Context& ctx = *static_cast<Context*>(backend->context);
    for (int i = 0; i < ggml_graph_n_nodes(cgraph); ++i) {
        ggml_tensor* node = ggml_graph_node(cgraph, i);
        if ((node->flags & GGML_TENSOR_FLAG_COMPUTE) == 0) continue;
        // KVQ_KV_FORMATS: the plugin claimed every op on a cache tensor holding a kvq format; what it does
        // not compute fails here, loudly, rather than on ggml's CPU backend reading the bytes as ggml's.
        const bool view = node->op == GGML_OP_NONE || node->op == GGML_OP_RESHAPE || node->op == GGML_OP_VIEW ||
                          node->op == GGML_OP_PERMUTE || node->op == GGML_OP_TRANSPOSE;
        if (!view && kvq_ggml::touches_kv_formats(node)) {
            std::string error;
            if (node->op == GGML_OP_FLASH_ATTN_EXT) {
                float softcap = 0.0f;
                std::memcpy(&softcap, reinterpret_cast<const float*>(node->op_params) + 2, sizeof(float));
                if (!supports_flash_attn(node)) error = "this flash attention (ALiBi, a per-head mask or another shape)";
                if (error.empty()) error = kvq_ggml::kv_format_attention_refusal(node->src[1], node->src[0], softcap, node->src[4] != nullptr);
            } else if (kvq_ggml::compute_kv_formats_op(node, ctx.options.executor, threads_for(ctx.n_threads), error)) {
                continue;
            }
            if (!error.empty()) {
                refuse_kv_formats_op(node, error);
                return GGML_STATUS_FAILED;
            }
        }
        switch (node->op) {
            case GGML_OP_FLASH_ATTN_EXT:
                try {
                    compute_flash_attn(ctx, node);
                    if (ctx.check) check_flash_attn(node);
                } catch (const std::exception& e) {
                    std::fprintf(stderr, "ggml-kvq: flash attention failed: %s\n", e.what());
                    return GGML_STATUS_FAILED;
                }
                break;
            case GGML_OP_NONE:
            case GGML_OP_RESHAPE:
            case GGML_OP_VIEW:
            case GGML_OP_PERMUTE:
            case GGML_OP_TRANSPOSE:
                break;
            default:
                std::fprintf(stderr, "ggml-kvq: unsupported op %s\n", ggml_op_desc(node));
                return GGML_STATUS_FAILED;
        }
    }
    return GGML_STATUS_SUCCESS;
}

const ggml_backend_i backend_iface = {
    /* .get_name            = */ backend_get_name,
    /* .free                = */ backend_free,
    /* .set_tensor_async    = */ nullptr,
    /* .get_tensor_async    = */ nullptr,
    /* .set_tensor_2d_async = */ nullptr,
    /* .get_tensor_2d_async = */ nullptr,
    /* .cpy_tensor_async    = */ nullptr,
    /* .synchronize         = */ nullptr,
    /* .graph_plan_create   = */ nullptr,
    /* .graph_plan_free     = */ nullptr,
    /* .graph_plan_update   = */ nullptr,
    /* .graph_plan_compute  = */ nullptr,
    /* .graph_compute       = */ backend_graph_compute,
    /* .event_record        = */ nullptr,
    /* .event_wait          = */ nullptr,
    /* .graph_optimize      = */ nullptr,
};

ggml_guid_t backend_guid() {
    static ggml_guid guid = {0x6b, 0x76, 0x71, 0x5f, 0x67, 0x67, 0x6d, 0x6c, 0x2d, 0x61, 0x74, 0x74, 0x6e, 0x00, 0x00, 0x01};
    return &guid;
}

bool is_kvq(ggml_backend_t backend) { return backend && ggml_guid_matches(backend->guid, backend_guid()); }

void set_n_threads(ggml_backend_t backend, int n_threads) {
    if (!is_kvq(backend)) return;
    static_cast<Context*>(backend->context)->n_threads = std::max(1, n_threads);
}

ggml_backend_reg_t kvq_reg();

ggml_backend_t backend_init() {
    auto* ctx = new Context;
    ctx->n_threads = default_threads();
    const char* check = std::getenv("KVQ_GGML_CHECK");
    ctx->check = check && std::strcmp(check, "1") == 0;
#ifdef KVQ_GGML_OPENMP
    // The parts of a call run on OpenMP threads: with ggml's CPU backend built with OpenMP (its default),
    // the very threads that ran the graph's other ops, so that none spins idle beside ours.
    ctx->options.executor = [ctx](int n, const std::function<void(int)>& task) {
        const int threads = std::min(n, threads_for(ctx->n_threads));
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
        for (int i = 0; i < n; ++i) task(i);
    };
#endif
    return new ggml_backend{
        /* .guid    = */ backend_guid(),
        /* .iface   = */ backend_iface,
        /* .device  = */ ggml_backend_reg_dev_get(kvq_reg(), 0),
        /* .context = */ ctx,
    };
}

// ---- device -----------------------------------------------------------------------------------------

const char* device_get_name(ggml_backend_dev_t) { return kName; }

const char* device_get_description(ggml_backend_dev_t) {
    static const std::string description = std::string("kvq flash attention on quantized KV (") + std::string(kvq::simd_level_name(kvq::simd_level())) + ")";
    return description.c_str();
}

void device_get_memory(ggml_backend_dev_t, size_t* free, size_t* total) {
    *free = 0;
    *total = 0;
}

enum ggml_backend_dev_type device_get_type(ggml_backend_dev_t) { return GGML_BACKEND_DEVICE_TYPE_ACCEL; }

void device_get_props(ggml_backend_dev_t dev, ggml_backend_dev_props* props) {
    props->name = device_get_name(dev);
    props->description = device_get_description(dev);
    props->type = device_get_type(dev);
    device_get_memory(dev, &props->memory_free, &props->memory_total);
    props->caps = {
        /* .async                = */ false,
        /* .host_buffer          = */ false,
        /* .buffer_from_host_ptr = */ true,
        /* .events               = */ false,
        /* .mmap_support         = */ true,
    };
}

ggml_backend_t device_init_backend(ggml_backend_dev_t, const char*) { return backend_init(); }

ggml_backend_buffer_type_t device_get_buffer_type(ggml_backend_dev_t) { return ggml_backend_cpu_buffer_type(); }

ggml_backend_buffer_t device_buffer_from_host_ptr(ggml_backend_dev_t, void* ptr, size_t size, size_t) {
    return ggml_backend_cpu_buffer_from_ptr(ptr, size);
}

bool device_supports_op(ggml_backend_dev_t, const ggml_tensor* op) {
    // Every op on a cache tensor that holds a kvq format is the plugin's (computed or refused): declined,
    // ggml's scheduler would give it to the CPU backend, which would read the bytes as ggml's.
    if (kvq_ggml::touches_kv_formats(op)) {
        if (op->op == GGML_OP_FLASH_ATTN_EXT) supports_flash_attn(op);  // learns and logs the layer's formats
        kvq_ggml::learn_kv_formats_op(op);                               // a row write: llama.cpp's rotation
        return true;
    }
    switch (op->op) {
        case GGML_OP_NONE:
        case GGML_OP_RESHAPE:
        case GGML_OP_VIEW:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            return true;
        case GGML_OP_FLASH_ATTN_EXT:
            return supports_flash_attn(op);
        default:
            return false;
    }
}

bool device_supports_buft(ggml_backend_dev_t, ggml_backend_buffer_type_t buft) { return ggml_backend_buft_is_host(buft); }

const ggml_backend_device_i device_iface = {
    /* .get_name             = */ device_get_name,
    /* .get_description      = */ device_get_description,
    /* .get_memory           = */ device_get_memory,
    /* .get_type             = */ device_get_type,
    /* .get_props            = */ device_get_props,
    /* .init_backend         = */ device_init_backend,
    /* .get_buffer_type      = */ device_get_buffer_type,
    /* .get_host_buffer_type = */ nullptr,
    /* .buffer_from_host_ptr = */ device_buffer_from_host_ptr,
    /* .supports_op          = */ device_supports_op,
    /* .supports_buft        = */ device_supports_buft,
    /* .offload_op           = */ nullptr,
    /* .event_new            = */ nullptr,
    /* .event_free           = */ nullptr,
    /* .event_synchronize    = */ nullptr,
};

// ---- registry ---------------------------------------------------------------------------------------

const char* reg_get_name(ggml_backend_reg_t) { return kName; }

size_t reg_get_device_count(ggml_backend_reg_t) { return 1; }

ggml_backend_dev_t reg_get_device(ggml_backend_reg_t reg, size_t index) {
    GGML_ASSERT(index == 0);
    static ggml_backend_device device = {
        /* .iface   = */ device_iface,
        /* .reg     = */ reg,
        /* .context = */ nullptr,
    };
    return &device;
}

void* reg_get_proc_address(ggml_backend_reg_t, const char* name) {
    if (std::strcmp(name, "ggml_backend_set_n_threads") == 0) return reinterpret_cast<void*>(set_n_threads);
    return nullptr;
}

const ggml_backend_reg_i reg_iface = {
    /* .get_name         = */ reg_get_name,
    /* .get_device_count = */ reg_get_device_count,
    /* .get_device       = */ reg_get_device,
    /* .get_proc_address = */ reg_get_proc_address,
};

ggml_backend_reg_t kvq_reg() {
    static const bool matches = registry_matches_ggml();
    if (!matches) return nullptr;
    static const bool formats_read = (kvq_ggml::init_kv_formats(), true);  // before llama.cpp makes its cache
    (void)formats_read;
    static ggml_backend_reg reg = {
        /* .api_version = */ GGML_BACKEND_API_VERSION,
        /* .iface       = */ reg_iface,
        /* .context     = */ nullptr,
    };
    return &reg;
}

}  // namespace

GGML_BACKEND_DL_IMPL(kvq_reg)
