// The C API of the block-wise KV cache (kvq/cache.hpp behind kvq.h). Layer and sequence are checked
// here, so their statuses do not depend on the order in which the C++ layer checks its arguments.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "../util/checked_size.hpp"
#include "boundary.hpp"

struct kvq_cache {
    kvq::KVCache cache;
    kvq_codec key;
    kvq_codec value;
    std::vector<kvq_codec> layer_keys, layer_values;  // by layer
};

namespace {

kvq_cache* wrap(kvq::KVCache made) {
    kvq_codec key{made.key_codec()};
    kvq_codec value{made.value_codec()};
    std::vector<kvq_codec> keys, values;
    for (int l = 0; l < made.config().n_layers; ++l) {
        keys.push_back({made.key_codec(l)});
        values.push_back({made.value_codec(l)});
    }
    return new kvq_cache{std::move(made), std::move(key), std::move(value), std::move(keys), std::move(values)};
}

}  // namespace

namespace kvq::capi {
namespace {

// Never change: the struct sizes of the first release (see the ABI notes in kvq.h): params ended at seed.
constexpr size_t kParamsSizeV1 = offsetof(kvq_cache_params, seed) + sizeof(uint64_t);
constexpr size_t kPoolStatsSizeV1 = offsetof(kvq_pool_stats, blocks_reserved);
constexpr size_t kLoadParamsSizeV1 = sizeof(kvq_load_params);  // added whole, after the first release
// Input structs have no implicit padding (kvq.h ABI notes): every byte past an older library's sizeof is
// a field, which is what lets read_versioned reject fields it does not know.
static_assert(sizeof(void*) != 8 || (sizeof(kvq_cache_params) == 216 && offsetof(kvq_cache_params, seed) == 112 &&
                                     offsetof(kvq_cache_params, executor) == 120 &&
                                     offsetof(kvq_cache_params, staging) == 136 &&
                                     offsetof(kvq_cache_params, layer_key_codecs) == 144 &&
                                     offsetof(kvq_cache_params, max_bytes) == 168 &&
                                     offsetof(kvq_cache_params, int8_value_weights) == 176 &&
                                     offsetof(kvq_cache_params, exact_tail_tokens) == 184 &&
                                     offsetof(kvq_cache_params, key_scales) == 192 &&
                                     offsetof(kvq_cache_params, head_dim_v) == 208),
              "kvq_cache_params has implicit padding");
static_assert(KVQ_MAX_POOL_BLOCKS == kMaxPoolBlocks && KVQ_MAX_CACHE_DIM == kMaxCacheDim &&
              KVQ_MAX_SEQUENCE_TOKENS == kMaxSequenceTokens && KVQ_MAX_EXACT_TAIL_TOKENS == kMaxExactTailTokens,
              "kvq.h's bounds are kvq/cache.hpp's");
static_assert(sizeof(void*) != 8 || (sizeof(kvq_load_params) == 56 && offsetof(kvq_load_params, executor) == 40),
              "kvq_load_params has implicit padding");

std::string text(const char* function, const std::string& what) { return std::string(function) + ": " + what; }

using CExecutor = decltype(kvq_cache_params::executor);

// The engine's executor as kvq's (empty for NULL): it sees a C task, the std::function and a trampoline.
Executor c_executor(CExecutor exec, void* ctx) {
    if (!exec) return {};
    return [exec, ctx](int n, const std::function<void(int)>& task) {
        exec(ctx, n, [](void* t, int32_t i) { (*static_cast<const std::function<void(int)>*>(t))(i); },
             const_cast<void*>(static_cast<const void*>(&task)));
    };
}

kvq_status check_layer(const kvq_cache* c, int32_t layer, const char* function) {
    const int n_layers = c->cache.config().n_layers;
    if (layer < 0 || layer >= n_layers) {
        return fail(KVQ_ERR_BAD_LAYER, text(function, "layer " + std::to_string(layer) + " is outside 0.." +
                                                          std::to_string(n_layers - 1)));
    }
    return KVQ_OK;
}

kvq_status check_sequence(const kvq_cache* c, int64_t seq, const char* function) {
    if (!c->cache.contains(seq)) {
        return fail(KVQ_ERR_BAD_SEQUENCE, text(function, "sequence " + std::to_string(seq) + " is not in the cache"));
    }
    return KVQ_OK;
}

kvq_status bad_params(const std::string& what) { return fail(KVQ_ERR_BAD_PARAMS, "kvq_cache_create: " + what); }

// The C params as a CacheConfig. Codec problems get their own statuses; everything else is BAD_PARAMS.
// The C struct as a CacheConfig. Only what is C's own is checked here (enum values, NULL arrays, the
// array's length field); every rule of the configuration itself is validate_config's, as in C++ and Python.
kvq_status to_config(const kvq_cache_params& p, CacheConfig& cfg) {
    if (p.seal != KVQ_SEAL_ON_APPEND && p.seal != KVQ_SEAL_ON_BLOCK_FULL) {
        return bad_params("seal must be a kvq_seal_policy, got " + std::to_string(p.seal));
    }
    if (p.nan_policy != KVQ_NAN_REJECT && p.nan_policy != KVQ_NAN_PROPAGATE) {
        return bad_params("nan_policy must be a kvq_nan_policy, got " + std::to_string(p.nan_policy));
    }
    if (p.center_keys != 0 && p.center_keys != 1) {
        return bad_params("center_keys must be 0 or 1, got " + std::to_string(p.center_keys));
    }
    if (p.reserved0 != 0 || p.reserved1 != 0 || p.reserved2 != 0 || p.reserved3 != 0) {
        return bad_params("reserved0, reserved1, reserved2 and reserved3 must be 0");
    }
    if (p.int8_value_weights != 0 && p.int8_value_weights != 1) {
        return bad_params("int8_value_weights must be 0 or 1, got " + std::to_string(p.int8_value_weights));
    }
    if (p.staging != KVQ_STAGING_F32 && p.staging != KVQ_STAGING_F16) {
        return bad_params("staging must be a kvq_staging_type, got " + std::to_string(p.staging));
    }
    if (p.n_sliding_window > 0 && !p.sliding_window) {
        return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_cache_create: sliding_window is NULL but n_sliding_window is " +
                                                  std::to_string(p.n_sliding_window));
    }
    if (p.n_sliding_window != 0 && p.n_sliding_window != static_cast<size_t>(std::max(p.n_layers, 0))) {
        return bad_params("n_sliding_window must be 0 or n_layers (" + std::to_string(p.n_layers) + "), got " +
                          std::to_string(p.n_sliding_window));
    }
    if (p.n_key_scales > 0 && !p.key_scales) {
        return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_cache_create: key_scales is NULL but n_key_scales is " +
                                                  std::to_string(p.n_key_scales));
    }
    if (!p.key_codec || !p.value_codec) {
        return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_cache_create: key_codec or value_codec is NULL");
    }
    if (p.n_layer_codecs != 0 && p.n_layer_codecs != static_cast<size_t>(std::max(p.n_layers, 0))) {
        return bad_params("n_layer_codecs must be 0 or n_layers (" + std::to_string(p.n_layers) + "), got " +
                          std::to_string(p.n_layer_codecs));
    }
    for (size_t l = 0; l < p.n_layer_codecs; ++l) {
        const char* k = p.layer_key_codecs ? p.layer_key_codecs[l] : nullptr;
        const char* v = p.layer_value_codecs ? p.layer_value_codecs[l] : nullptr;
        cfg.layer_codecs.push_back({k ? k : "", v ? v : ""});
    }
    cfg.max_bytes = p.max_bytes;

    cfg.n_layers = p.n_layers;
    cfg.n_kv_heads = p.n_kv_heads;
    cfg.n_heads = p.n_heads;
    cfg.head_dim = p.head_dim;
    cfg.key_codec = p.key_codec;
    cfg.value_codec = p.value_codec;
    cfg.block_tokens = p.block_tokens;
    cfg.max_blocks = p.max_blocks;
    cfg.initial_blocks = p.initial_blocks;
    cfg.grow_blocks = p.grow_blocks;
    cfg.scale = p.scale;
    cfg.softcap = p.softcap;
    cfg.sliding_window.assign(p.sliding_window, p.sliding_window + p.n_sliding_window);
    cfg.seal = p.seal == KVQ_SEAL_ON_APPEND ? SealPolicy::on_append : SealPolicy::on_block_full;
    cfg.center_keys = p.center_keys != 0;
    cfg.int8_value_weights = p.int8_value_weights != 0;
    cfg.nan_policy = p.nan_policy == KVQ_NAN_REJECT ? NanPolicy::reject : NanPolicy::propagate;
    cfg.staging = p.staging == KVQ_STAGING_F16 ? StagingType::f16 : StagingType::f32;
    cfg.exact_tail_tokens = p.exact_tail_tokens;
    if (p.latent_values != 0 && p.latent_values != 1) {
        return bad_params("latent_values must be 0 or 1, got " + std::to_string(p.latent_values));
    }
    cfg.head_dim_v = p.head_dim_v;
    cfg.latent_values = p.latent_values != 0;
    // Its length is validate_config's to check (n_layers x n_kv_heads x head_dim); copied first only up
    // to that bound, so a wrong count fails as BAD_PARAMS without reading far past the caller's array.
    const size_t n_scales = static_cast<size_t>(std::max(p.n_layers, 0)) * static_cast<size_t>(std::max(p.n_kv_heads, 0)) *
                            static_cast<size_t>(std::max(p.head_dim, 0));
    if (p.n_key_scales != 0 && p.n_key_scales != n_scales) {
        return bad_params("n_key_scales must be 0 or n_layers x n_kv_heads x head_dim (" + std::to_string(n_scales) +
                          "), got " + std::to_string(p.n_key_scales));
    }
    cfg.key_scales.assign(p.key_scales, p.key_scales + p.n_key_scales);
    if (!p.executor && p.executor_ctx) return bad_params("executor_ctx is set but executor is NULL");
    cfg.executor = c_executor(p.executor, p.executor_ctx);
    cfg.threads = p.threads;
    cfg.seed = p.seed;
    return KVQ_OK;
}

}  // namespace
}  // namespace kvq::capi

using kvq::capi::check_layer;
using kvq::capi::check_sequence;
using kvq::capi::fail;
using kvq::capi::guarded;

#define KVQ_REQUIRE(cond, function, what) \
    if (!(cond)) return fail(KVQ_ERR_INVALID_ARGUMENT, function ": " what)
#define KVQ_TRY(expr) \
    if (kvq_status s_ = (expr); s_ != KVQ_OK) return s_

namespace {

kvq_status attend(const kvq_cache* cache, int32_t layer, int64_t seq, const float* q, size_t n_queries, float* out,
                  const char* function) {
    return guarded([&] {
        if (!cache) return fail(KVQ_ERR_INVALID_ARGUMENT, std::string(function) + ": cache is NULL");
        if (n_queries > 0 && !(q && out)) return fail(KVQ_ERR_INVALID_ARGUMENT, std::string(function) + ": q or out is NULL");
        KVQ_TRY(check_layer(cache, layer, function));
        KVQ_TRY(check_sequence(cache, seq, function));
        // NaN/Inf queries come back as kvq::NonFiniteInput (KVQ_ERR_NON_FINITE, see guarded);
        // every other bad argument, before any read of q, as std::invalid_argument.
        if (n_queries == 1) {
            cache->cache.attend(layer, seq, q, out);
        } else {
            cache->cache.attend_prefill(layer, seq, q, n_queries, out);
        }
        return KVQ_OK;
    });
}

}  // namespace

extern "C" {

kvq_status kvq_cache_create(const kvq_cache_params* params, kvq_cache** cache) {
    return guarded([&] {
        KVQ_REQUIRE(cache, "kvq_cache_create", "cache is NULL");
        kvq_cache_params p = kvq_cache_params_default();
        KVQ_TRY(kvq::capi::read_versioned(params, kvq::capi::kParamsSizeV1, "kvq_cache_create: params is NULL", p));
        kvq::CacheConfig cfg;
        KVQ_TRY(kvq::capi::to_config(p, cfg));
        // The constructor checks what validate_config does: BadParams, BadHeadDim, UnknownCodec (guarded).
        *cache = wrap(kvq::KVCache(cfg));
        return KVQ_OK;
    });
}

void kvq_cache_destroy(kvq_cache* cache) { delete cache; }

const kvq_codec* kvq_cache_key_codec(const kvq_cache* cache) { return cache ? &cache->key : nullptr; }
const kvq_codec* kvq_cache_value_codec(const kvq_cache* cache) { return cache ? &cache->value : nullptr; }

const kvq_codec* kvq_cache_layer_key_codec(const kvq_cache* cache, int32_t layer) {
    return cache && layer >= 0 && static_cast<size_t>(layer) < cache->layer_keys.size() ? &cache->layer_keys[layer] : nullptr;
}

const kvq_codec* kvq_cache_layer_value_codec(const kvq_cache* cache, int32_t layer) {
    return cache && layer >= 0 && static_cast<size_t>(layer) < cache->layer_values.size() ? &cache->layer_values[layer] : nullptr;
}

kvq_status kvq_cache_add_sequence(kvq_cache* cache, int64_t* seq) {
    return guarded([&] {
        KVQ_REQUIRE(cache && seq, "kvq_cache_add_sequence", "NULL argument");
        *seq = cache->cache.add_sequence();
        return KVQ_OK;
    });
}

kvq_status kvq_cache_remove_sequence(kvq_cache* cache, int64_t seq) {
    return guarded([&] {
        KVQ_REQUIRE(cache, "kvq_cache_remove_sequence", "cache is NULL");
        KVQ_TRY(check_sequence(cache, seq, "kvq_cache_remove_sequence"));
        cache->cache.remove(seq);
        return KVQ_OK;
    });
}

kvq_status kvq_cache_fork(kvq_cache* cache, int64_t parent, int64_t* child) {
    return guarded([&] {
        KVQ_REQUIRE(cache && child, "kvq_cache_fork", "NULL argument");
        KVQ_TRY(check_sequence(cache, parent, "kvq_cache_fork"));
        *child = cache->cache.fork(parent);
        return KVQ_OK;
    });
}

kvq_status kvq_cache_truncate(kvq_cache* cache, int64_t seq, size_t n_tokens) {
    return guarded([&] {
        KVQ_REQUIRE(cache, "kvq_cache_truncate", "cache is NULL");
        KVQ_TRY(check_sequence(cache, seq, "kvq_cache_truncate"));
        cache->cache.truncate(seq, n_tokens);
        return KVQ_OK;
    });
}

kvq_status kvq_cache_append(kvq_cache* cache, int32_t layer, int64_t seq, const float* k, const float* v,
                            size_t n_tokens) {
    return guarded([&] {
        KVQ_REQUIRE(cache, "kvq_cache_append", "cache is NULL");
        // A latent cache takes v = NULL (its values are the keys' leading values); the C++ cache says so.
        KVQ_REQUIRE(n_tokens == 0 || (k && (v || cache->cache.config().latent_values)), "kvq_cache_append", "k or v is NULL");
        KVQ_TRY(check_layer(cache, layer, "kvq_cache_append"));
        KVQ_TRY(check_sequence(cache, seq, "kvq_cache_append"));
        // Sizes (n_tokens × n_kv_heads × head_dim overflowing) are checked before k and v are read.
        cache->cache.append(layer, seq, k, v, n_tokens);
        return KVQ_OK;
    });
}

kvq_status kvq_cache_append_half(kvq_cache* cache, int32_t layer, int64_t seq, const uint16_t* k, const uint16_t* v,
                                 size_t n_tokens, int32_t type) {
    return guarded([&] {
        KVQ_REQUIRE(cache, "kvq_cache_append_half", "cache is NULL");
        KVQ_REQUIRE(n_tokens == 0 || (k && (v || cache->cache.config().latent_values)), "kvq_cache_append_half", "k or v is NULL");
        KVQ_REQUIRE(type == KVQ_HALF_F16 || type == KVQ_HALF_BF16, "kvq_cache_append_half", "unknown kvq_half_type");
        KVQ_TRY(check_layer(cache, layer, "kvq_cache_append_half"));
        KVQ_TRY(check_sequence(cache, seq, "kvq_cache_append_half"));
        cache->cache.append(layer, seq, k, v, n_tokens, type == KVQ_HALF_F16 ? kvq::HalfType::f16 : kvq::HalfType::bf16);
        return KVQ_OK;
    });
}

kvq_status kvq_cache_attend(const kvq_cache* cache, int32_t layer, int64_t seq, const float* q, float* out) {
    return attend(cache, layer, seq, q, 1, out, "kvq_cache_attend");
}

kvq_status kvq_cache_attend_prefill(const kvq_cache* cache, int32_t layer, int64_t seq, const float* q,
                                    size_t n_queries, float* out) {
    return attend(cache, layer, seq, q, n_queries, out, "kvq_cache_attend_prefill");
}

kvq_status kvq_cache_attend_batch(const kvq_cache* cache, int32_t layer, const int64_t* seqs, size_t n_seqs,
                                  const float* q, float* out) {
    return kvq::capi::guarded([&] {
        const char* function = "kvq_cache_attend_batch";
        if (!cache) return kvq::capi::fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_cache_attend_batch: cache is NULL");
        if (n_seqs == 0) return KVQ_OK;
        if (!seqs || !q || !out) return kvq::capi::fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_cache_attend_batch: seqs, q or out is NULL");
        KVQ_TRY(kvq::capi::check_layer(cache, layer, function));
        // Before seqs is read: n_seqs ids, and n_seqs queries and outputs, must be buffers that can exist.
        const auto& cfg = cache->cache.config();
        const size_t n_heads = static_cast<size_t>(cfg.n_heads > 0 ? cfg.n_heads : cfg.n_kv_heads);
        using kvq::detail::CheckedSize;
        kvq::detail::check_buffer_sizes(
            {{"seqs", CheckedSize(n_seqs) * sizeof(int64_t), "n_seqs ids"},
             {"q", CheckedSize(n_seqs) * n_heads * cfg.head_dim * sizeof(float), "n_seqs x n_heads x head_dim floats"},
             {"out", CheckedSize(n_seqs) * n_heads * cfg.head_dim_v * sizeof(float), "n_seqs x n_heads x head_dim_v floats"}},
            [&] { return function; });
        for (size_t i = 0; i < n_seqs; ++i) KVQ_TRY(kvq::capi::check_sequence(cache, seqs[i], function));
        // NaN/Inf queries come back as kvq::NonFiniteInput (KVQ_ERR_NON_FINITE, see guarded).
        cache->cache.attend_batch(layer, std::span<const kvq::SequenceId>(seqs, n_seqs), q, out);
        return KVQ_OK;
    });
}

kvq_status kvq_cache_n_tokens(const kvq_cache* cache, int64_t seq, int32_t layer, size_t* n_tokens) {
    return guarded([&] {
        KVQ_REQUIRE(cache && n_tokens, "kvq_cache_n_tokens", "NULL argument");
        KVQ_TRY(check_layer(cache, layer, "kvq_cache_n_tokens"));
        KVQ_TRY(check_sequence(cache, seq, "kvq_cache_n_tokens"));
        *n_tokens = cache->cache.n_tokens(seq, layer);
        return KVQ_OK;
    });
}

int32_t kvq_cache_contains(const kvq_cache* cache, int64_t seq) {
    try {
        return cache && cache->cache.contains(seq) ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

kvq_status kvq_cache_sequences(const kvq_cache* cache, int64_t* ids, size_t capacity, size_t* count) {
    return guarded([&] {
        KVQ_REQUIRE(cache && count && (ids || capacity == 0), "kvq_cache_sequences", "NULL argument");
        const std::vector<kvq::SequenceId> all = cache->cache.sequences();
        for (size_t i = 0; i < all.size() && i < capacity; ++i) ids[i] = all[i];
        *count = all.size();
        return KVQ_OK;
    });
}

kvq_status kvq_cache_save(const kvq_cache* cache, const char* path, int64_t seq) {
    return guarded([&] {
        KVQ_REQUIRE(cache && path, "kvq_cache_save", "NULL argument");
        if (seq == KVQ_ALL_SEQUENCES) {
            cache->cache.save(path);
        } else {
            KVQ_TRY(check_sequence(cache, seq, "kvq_cache_save"));
            cache->cache.save(path, seq);
        }
        return KVQ_OK;
    });
}

kvq_status kvq_cache_load(const char* path, kvq_cache** cache) { return kvq_cache_load_limited(path, 0, 1, cache); }

kvq_status kvq_cache_load_limited(const char* path, size_t max_blocks, int32_t threads, kvq_cache** cache) {
    return kvq_cache_load_bounded(path, max_blocks, 0, threads, cache);
}

kvq_status kvq_cache_load_bounded(const char* path, size_t max_blocks, size_t max_bytes, int32_t threads, kvq_cache** cache) {
    kvq_load_params p = kvq_load_params_default();
    p.max_blocks = max_blocks;
    p.max_bytes = max_bytes;
    p.threads = threads;
    return kvq_cache_load_with(path, &p, cache);
}

kvq_status kvq_cache_load_with(const char* path, const kvq_load_params* params, kvq_cache** cache) {
    return guarded([&] {
        KVQ_REQUIRE(path && cache, "kvq_cache_load", "NULL argument");
        kvq_load_params p = kvq_load_params_default();
        KVQ_TRY(kvq::capi::read_versioned(params, kvq::capi::kLoadParamsSizeV1, "kvq_cache_load: params is NULL", p));
        const auto bad = [](const std::string& what) { return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_cache_load: " + what); };
        if (p.threads < 1 || p.threads > 256) return bad("threads must be in 1..256, got " + std::to_string(p.threads));
        if (p.grow_blocks < 1 || p.grow_blocks > kvq::kMaxPoolBlocks) {
            return bad("grow_blocks must be in 1.." + std::to_string(kvq::kMaxPoolBlocks) + ", got " + std::to_string(p.grow_blocks));
        }
        if (p.int8_value_weights != 0 && p.int8_value_weights != 1) {
            return bad("int8_value_weights must be 0 or 1, got " + std::to_string(p.int8_value_weights));
        }
        if (!p.executor && p.executor_ctx) return bad("executor_ctx is set but executor is NULL");
        kvq::LoadOptions options;
        options.max_blocks = p.max_blocks;
        options.max_bytes = p.max_bytes;
        options.grow_blocks = p.grow_blocks;
        options.threads = p.threads;
        options.int8_value_weights = p.int8_value_weights != 0;
        options.executor = kvq::capi::c_executor(p.executor, p.executor_ctx);
        *cache = wrap(kvq::KVCache::load(path, options));
        return KVQ_OK;
    });
}

kvq_status kvq_cache_load_into(kvq_cache* cache, const char* path, int64_t* ids, size_t capacity, size_t* count) {
    return guarded([&] {
        KVQ_REQUIRE(cache && path && count && (ids || capacity == 0), "kvq_cache_load_into", "NULL argument");
        const std::vector<kvq::SequenceId> added = cache->cache.load_into(path);
        for (size_t i = 0; i < added.size() && i < capacity; ++i) ids[i] = added[i];
        *count = added.size();
        return KVQ_OK;
    });
}

size_t kvq_cache_bytes_used(const kvq_cache* cache) {
    try {
        return cache ? cache->cache.bytes_used() : 0;
    } catch (...) {
        return 0;
    }
}

double kvq_cache_bytes_per_token(const kvq_cache* cache) {
    try {
        return cache ? cache->cache.bytes_per_token() : 0.0;
    } catch (...) {
        return 0.0;
    }
}

double kvq_cache_average_bytes_per_token(const kvq_cache* cache, int32_t layer, uint64_t n_tokens) {
    try {
        if (!cache || layer < 0 || layer >= cache->cache.config().n_layers) return 0.0;
        return cache->cache.average_bytes_per_token(layer, static_cast<size_t>(n_tokens));
    } catch (...) {
        return 0.0;
    }
}

kvq_status kvq_cache_pool_stats(const kvq_cache* cache, kvq_pool_stats* stats) {
    return guarded([&] {
        KVQ_REQUIRE(cache, "kvq_cache_pool_stats", "cache is NULL");
        const kvq::PoolStats s = cache->cache.pool_stats();
        kvq_pool_stats from = kvq_pool_stats_init();
        from.block_bytes = s.block_bytes;
        from.blocks_total = s.blocks_total;
        from.blocks_used = s.blocks_used;
        from.blocks_shared = s.blocks_shared;
        from.blocks_reserved = s.blocks_reserved;
        from.max_blocks = s.max_blocks;
        from.bytes_total = s.bytes_total;
        from.bytes_used = s.bytes_used;
        from.bytes_reserved = s.bytes_reserved;
        from.max_bytes = s.max_bytes;
        return kvq::capi::write_versioned(from, kvq::capi::kPoolStatsSizeV1, stats);
    });
}

}  // extern "C"
