/* kvq — C API.
 *
 * For engines written in C, or in C++ that want a stable boundary: opaque handles, status codes, no
 * exceptions across the boundary, a thread-local message for the last error. Everything the C++ headers
 * offer for embedding is here: the codec table, codecs working on rows (byte buffers in the codecs'
 * layouts; for q8_0, q4_0, q4_1, q5_0, q5_1 these are ggml's blocks), attention over rows an engine owns,
 * and the block-wise KV cache.
 *
 *   kvq_cache_params p = kvq_cache_params_default();
 *   p.n_layers = 32; p.n_kv_heads = 8; p.n_heads = 32; p.head_dim = 128;
 *   kvq_cache* cache;
 *   if (kvq_cache_create(&p, &cache) != KVQ_OK) fprintf(stderr, "%s\n", kvq_last_error());
 *   int64_t seq; kvq_cache_add_sequence(cache, &seq);
 *   kvq_cache_append(cache, layer, seq, k, v, 1);   k, v: n_tokens × n_kv_heads × head_dim floats
 *   kvq_cache_attend(cache, layer, seq, q, out);    q, out: n_heads × head_dim floats
 *   kvq_cache_destroy(cache);
 *
 * Errors. Every function that can fail returns a kvq_status. On failure nothing was changed (no output
 * written except the message, no cache state touched) and kvq_last_error() returns a message naming the
 * problem. The message belongs to the calling thread and stays valid until that thread's next failing kvq
 * call; successful calls leave it alone.
 *
 * Threads. A kvq_codec is immutable: use it from any number of threads. A kvq_cache follows the C++
 * KVCache rules (kvq/cache.hpp): any function may be called from any thread at any time with any
 * sequence id. The cache locks each sequence itself: calls on different sequences run in parallel, calls
 * on one sequence wait for its writers (append, truncate); a sequence is listed only once complete, and a
 * call on a sequence removed meanwhile returns KVQ_ERR_BAD_SEQUENCE.
 *
 * ABI notes (how engines upgrade safely).
 *  - Within one major version the C ABI only grows: functions, status codes and enum values are added,
 *    never changed or removed; an engine built against an older kvq.h runs with a newer library.
 *    Check kvq_version() >> 16 == KVQ_VERSION_MAJOR at start-up.
 *  - Structs that cross the boundary start with `size_t size`, which the caller sets to sizeof the struct
 *    as compiled (kvq_cache_params_default(), kvq_codec_info_init() and kvq_pool_stats_init() do it).
 *    New fields are only ever appended, and input structs have no implicit padding (explicit reserved
 *    fields instead), so every byte past an older release's sizeof is a field. The
 *    library reads and writes only the first `size` bytes: fields an older caller does not know take
 *    their defaults on input and are not written on output. A size smaller than the first release's
 *    struct is rejected with KVQ_ERR_INVALID_ARGUMENT, and so is an input struct from a newer header
 *    whose fields unknown to this library are not all zero.
 *  - Handles (kvq_codec, kvq_cache) are opaque; their layout may change in any release.
 *  - Enums are passed as int32_t fields, so adding values never changes a struct's size.
 *  - The C++ API (the kvq/<name>.hpp headers) is also exported from the shared library for convenience, but has no ABI
 *    guarantee across releases: C++ users rebuild against the headers of the library they run, or link
 *    the static library.
 */
#ifndef KVQ_KVQ_H
#define KVQ_KVQ_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define KVQ_VERSION_MAJOR 0
#define KVQ_VERSION_MINOR 1
#define KVQ_VERSION_PATCH 0
/* (major << 16) | (minor << 8) | patch, comparable with kvq_version(). */
#define KVQ_VERSION ((KVQ_VERSION_MAJOR << 16) | (KVQ_VERSION_MINOR << 8) | KVQ_VERSION_PATCH)
#define KVQ_VERSION_STRING "0.1.0"

/* The default rotation seed of +rot, polar and turbo codecs (kvq::kDefaultSeed, "kvq_rot!"). */
#define KVQ_DEFAULT_SEED UINT64_C(0x6b76715f726f7421)

/* Exported from libkvq.so even when an engine compiles the library with -fvisibility=hidden. */
#if defined(__GNUC__)
#  define KVQ_API __attribute__((visibility("default")))
#else
#  define KVQ_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status, errors, version ------------------------------------------------------------------ */

typedef enum kvq_status {
    KVQ_OK = 0,
    KVQ_ERR_INVALID_ARGUMENT = 1, /* null pointer, struct size, shape, stride, n_tokens out of range, or a
                                     finite value beyond what the codec can store (its fp16 scale or norm
                                     would overflow; the message names the row and the limit) */
    KVQ_ERR_BAD_PARAMS = 2,       /* cache parameters inconsistent, or a codec spec's parameters */
    KVQ_ERR_UNKNOWN_CODEC = 3,    /* codec name not in the codec table */
    KVQ_ERR_BAD_HEAD_DIM = 4,     /* head_dim the codec cannot take (e.g. not a multiple of its block) */
    KVQ_ERR_POOL_EXHAUSTED = 5,   /* no free block in a pool with max_blocks set (kvq::PoolExhausted) */
    KVQ_ERR_BAD_SEQUENCE = 6,     /* sequence id not in the cache */
    KVQ_ERR_BAD_LAYER = 7,        /* layer outside 0..n_layers-1 */
    KVQ_ERR_NON_FINITE = 8,       /* NaN or Inf in keys, values or queries (nan_policy = reject) */
    KVQ_ERR_OUT_OF_MEMORY = 9,    /* an allocation failed */
    KVQ_ERR_INTERNAL = 10,        /* anything else; the message says what */
    KVQ_ERR_IO = 11,              /* a cache file could not be opened, read, written or renamed (errno's text) */
    KVQ_ERR_BAD_FILE = 12,        /* not a cache file this kvq reads: magic, version, truncated, CRC, contents */
    KVQ_ERR_CONFIG_MISMATCH = 13, /* kvq_cache_load_into: the file's cache had another configuration */
    KVQ_ERR_SELFTEST_FAILED = 14, /* kvq_selftest: a SIMD level differs from the scalar specification */
    KVQ_ERR_EXECUTOR = 15,        /* the engine's executor broke its contract: a task index outside [0, n), a
                                     task run twice, or one never run (kvq::ExecutorError); output unspecified */
    KVQ_STATUS_MAX_ = 0x7fffffff  /* never returned: keeps every int status a valid value of the enum in
                                     C++ too (kvq_status_name takes any; a later version may add statuses) */
} kvq_status;

/* The message of this thread's last failing kvq call ("" if none). Never NULL. */
KVQ_API const char* kvq_last_error(void);
/* A short constant name for a status ("KVQ_ERR_POOL_EXHAUSTED"); "unknown status" for other values. */
KVQ_API const char* kvq_status_name(kvq_status status);

/* The library's version as KVQ_VERSION encodes it, and as a string. Compare with the header's macros to
 * detect a header/library mismatch. */
KVQ_API uint32_t kvq_version(void);
KVQ_API const char* kvq_version_string(void);

/* ---- SIMD levels and the self-test ------------------------------------------------------------ */

/* kvq picks a SIMD level at run time: the best one the CPU runs that passes a known-answer self-check
 * against the scalar specification (run the first time a level is about to be used; a failing level is
 * not used, and kvq falls back to the best level below it that passes). KVQ_SIMD=scalar|sse2|avx2|
 * avx512|neon asks for a level, KVQ_SELFCHECK=0 skips the self-check. */

/* The name of the SIMD level in use ("avx2"); a static string. */
KVQ_API const char* kvq_simd_level(void);
/* Writes the levels this build has, whether the CPU runs them, their self-check results and the level
 * in use with the reason, as text (one line per level, then "in use: ..."), NUL-terminated and cut to
 * capacity bytes; returns the length of the whole text (snprintf's rule: call with capacity 0 to size
 * the buffer). buf may be NULL when capacity is 0. */
KVQ_API size_t kvq_simd_report(char* buf, size_t capacity);
/* The full parity check: every codec at every level this CPU runs against the scalar specification,
 * and cache attention against the FP32 reference (about a second per level). on_line, if not NULL, is
 * called with each result line ("avx2    q8_0          ok ..."). KVQ_OK if every line passed, else
 * KVQ_ERR_SELFTEST_FAILED (kvq_last_error() names the first failing level and family). */
KVQ_API kvq_status kvq_selftest(void (*on_line)(const char* line, void* ctx), void* ctx);

/* ---- the codec table -------------------------------------------------------------------------- */

/* One row of the codec table. Grows by appending fields (see the ABI notes). */
typedef struct kvq_codec_info {
    size_t size;             /* caller sets sizeof(kvq_codec_info); kvq_codec_info_init() does */
    const char* name;        /* e.g. "q4_0"; static storage */
    int32_t block;           /* values per block: head_dim must be a multiple */
    int32_t bytes_per_block; /* bytes of one block (codecs with a per-row header: see kvq_codec_spec_row_bytes) */
    double bits_per_value;   /* 8 · bytes_per_block / block, the blocks' scales and offsets included; a
                                per-row header (turbo*: fp16 norm) adds its bits / head_dim, which
                                kvq_codec_bits_per_value() of a codec for a head size counts */
    int32_t ggml_layout;     /* 1: row bytes are ggml's blocks of the type with the same name */
    const char* layout;      /* one line describing the bytes; static storage */
    int32_t ggml_type;       /* ggml's type id (enum ggml_type, as GGUF stores it) of the blocks the row bytes
                                are, or -1: set where ggml_layout is 1, and for iq4_nls, which writes iq4_nl's
                                blocks (20); the codec reading a ggml type is the row with ggml_layout 1 and
                                that ggml_type */
} kvq_codec_info;

static inline kvq_codec_info kvq_codec_info_init(void) {
    kvq_codec_info info;
    memset(&info, 0, sizeof info);
    info.size = sizeof(kvq_codec_info);
    return info;
}

/* Number of rows in the codec table; ids are 0..count-1, in table order. */
KVQ_API int32_t kvq_codec_count(void);
/* Table row of an id. */
KVQ_API kvq_status kvq_codec_get_info(int32_t id, kvq_codec_info* info);
/* Id of a table name (a base name, without ":params" or "+rot"); KVQ_ERR_UNKNOWN_CODEC if absent. */
KVQ_API kvq_status kvq_codec_lookup(const char* name, int32_t* id);
/* Bytes of one row of head_dim values for a codec spec ("name[:params][+rot]"). */
KVQ_API kvq_status kvq_codec_spec_row_bytes(const char* spec, int32_t head_dim, size_t* row_bytes);

/* ---- codecs on rows --------------------------------------------------------------------------- */

/* A codec for one head size: quantizes, dequantizes, scores and accumulates rows of head_dim values.
 * Rows are byte buffers in the codec's layout, kvq_codec_row_bytes() each; a stride of 0 means packed.
 * Sizes: a count, stride or n_q whose buffer would pass PTRDIFF_MAX bytes (e.g. n_rows near SIZE_MAX) is
 * KVQ_ERR_INVALID_ARGUMENT before any buffer is read, outputs untouched; the stride of a single row or
 * query is never used (any value is accepted). docs/reliability.md lists each function's sizes. */
typedef struct kvq_codec kvq_codec;

/* spec: "name[:params][+rot]"; seed: the rotation seed (KVQ_DEFAULT_SEED unless you need another). */
KVQ_API kvq_status kvq_codec_create(const char* spec, int32_t head_dim, uint64_t seed, kvq_codec** codec);
KVQ_API void kvq_codec_destroy(kvq_codec* codec); /* NULL is a no-op */

/* Accessors; a NULL codec gives 0 or "". */
KVQ_API const char* kvq_codec_name(const kvq_codec* codec); /* the spec, valid while codec lives */
KVQ_API int32_t kvq_codec_head_dim(const kvq_codec* codec);
KVQ_API size_t kvq_codec_row_bytes(const kvq_codec* codec);
KVQ_API size_t kvq_codec_query_bytes(const kvq_codec* codec); /* bytes of one prepared query */
KVQ_API double kvq_codec_bits_per_value(const kvq_codec* codec);
KVQ_API int32_t kvq_codec_rotated(const kvq_codec* codec);

/* x: n_rows × head_dim floats -> n_rows rows at dst, dst_stride bytes apart. Non-finite values are
 * rejected (KVQ_ERR_NON_FINITE). */
KVQ_API kvq_status kvq_codec_quantize_rows(const kvq_codec* codec, const float* x, size_t n_rows, void* dst,
                                           size_t dst_stride);
/* n_rows rows at src, src_stride bytes apart -> y: n_rows × head_dim floats (rotation undone). */
KVQ_API kvq_status kvq_codec_dequantize_rows(const kvq_codec* codec, const void* src, size_t n_rows,
                                             float* y, size_t src_stride);
/* q: n_q × head_dim floats -> prep: n_q × kvq_codec_query_bytes() bytes; once per decode step. */
KVQ_API kvq_status kvq_codec_prepare_queries(const kvq_codec* codec, const float* q, int32_t n_q, void* prep);
/* scores[i * score_stride + r] = (prepared query i) · (row r). */
KVQ_API kvq_status kvq_codec_score_rows(const kvq_codec* codec, const void* prep, int32_t n_q, const void* rows,
                                        size_t n_rows, float* scores, size_t score_stride, size_t row_stride);
/* acc[i * head_dim + j] += w[i * w_stride + r] · row_r[j]; acc stays in the codec's basis until
 * kvq_codec_finish_accumulate(acc, n_q) is called once after the last accumulate. */
KVQ_API kvq_status kvq_codec_accumulate_rows(const kvq_codec* codec, const float* w, size_t w_stride,
                                             int32_t n_q, const void* rows, size_t n_rows, float* acc,
                                             size_t row_stride);
KVQ_API kvq_status kvq_codec_finish_accumulate(const kvq_codec* codec, float* acc, int32_t n_q);

/* Decode attention over rows the engine owns (for example the rows of a ggml KV tensor of a ggml-layout
 * type): out[h] = softmax(scale · q[h] · Kᵀ) V for the n_heads query heads, query head h using kv head
 * h / (n_heads / n_kv_heads). The key row of token t and kv head j starts at
 * k + t * k_token_stride + j * k_head_stride (bytes); values likewise. A head stride of 0 means the row
 * bytes, a token stride of 0 means n_kv_heads row bytes (rows packed as [token][kv head]). For a ggml KV
 * tensor of shape [head_dim, n_kv_heads, n_ctx] the strides are its nb[2] and nb[1]. q: n_heads × the
 * key codec's head_dim floats, out: n_heads × the value codec's (the two may differ: DeepSeek's latent
 * attention has 576-value keys and 512-value values, v a view of k's rows). scale <= 0 means
 * 1/sqrt(key head_dim). With n_tokens = 0 the output is zero. Rows whose
 * extent ((n_tokens - 1) * token stride + (n_kv_heads - 1) * head stride + row bytes) would pass
 * PTRDIFF_MAX bytes: KVQ_ERR_INVALID_ARGUMENT before any row is read, out untouched. */
KVQ_API kvq_status kvq_attend_rows(const kvq_codec* key_codec, const kvq_codec* value_codec, int32_t n_heads,
                                   int32_t n_kv_heads, const float* q, const void* k, size_t k_token_stride,
                                   size_t k_head_stride, const void* v, size_t v_token_stride,
                                   size_t v_head_stride, size_t n_tokens, float scale, float* out);

/* Mask element types (kvq_attend_options.mask_type). */
typedef enum kvq_mask_type {
    KVQ_MASK_F16 = 0, /* IEEE binary16, as ggml's KQ mask */
    KVQ_MASK_F32 = 1
} kvq_mask_type;

/* What kvq_attend_rows_ex adds (mirrors kvq::AttendOptions, kvq/attention.hpp): several query rows with
 * strides, an additive mask per query row, threads. Strides count elements (floats for q and out, mask
 * elements for the mask); 0 takes the default. Grows by appending fields (see the ABI notes); start from
 * kvq_attend_options_default(). */
typedef struct kvq_attend_options {
    size_t size;             /* sizeof(kvq_attend_options) */
    float scale;             /* <= 0: 1/sqrt(head_dim) */
    float softcap;           /* c > 0: each scaled score s becomes c·tanh(s/c) before the mask; 0: off */
    size_t n_queries;        /* query rows, each n_heads × head_dim floats; default 1 (0: nothing to do) */
    size_t q_head_stride;    /* from head h to h + 1 of a query row; 0: head_dim */
    size_t q_row_stride;     /* from query row i to i + 1; 0: n_heads · q_head_stride */
    size_t out_head_stride;  /* likewise for out (results may not overlap) */
    size_t out_row_stride;
    /* NULL, or one row of n_tokens values per query row, added to the scaled (and soft-capped) scores;
     * -inf removes a token (weight exactly 0; not read where no query row computed with it keeps it). A row
     * that keeps no token gives zeros. Values must be finite or -inf: NaN or +inf fails with
     * KVQ_ERR_NON_FINITE under KVQ_NAN_REJECT (under KVQ_NAN_PROPAGATE that row's outputs are NaN). */
    const void* mask;
    size_t mask_row_stride;  /* from query row i's mask to i + 1's; 0: n_tokens */
    int32_t mask_type;       /* kvq_mask_type, default KVQ_MASK_F16 */
    int32_t threads;         /* 1..256, default 1: the rows and tokens are split into parts for this many */
    /* Runs those parts (as kvq_cache_params.executor); NULL: kvq's own pool, on at most `threads` threads. */
    void (*executor)(void* executor_ctx, int32_t n, void (*task)(void* task_ctx, int32_t i), void* task_ctx);
    void* executor_ctx;
    int32_t nan_policy;      /* KVQ_NAN_REJECT (default): a non-finite query fails with KVQ_ERR_NON_FINITE;
                                KVQ_NAN_PROPAGATE: it gives NaN in its own outputs */
    int32_t reserved;        /* 0 */
    const float* sinks;      /* NULL, or n_heads finite logits (attention sinks): each joins its head's
                                softmax denominator as a token without a value */
} kvq_attend_options;

static inline kvq_attend_options kvq_attend_options_default(void) {
    kvq_attend_options o;
    memset(&o, 0, sizeof o);
    o.size = sizeof(kvq_attend_options);
    o.n_queries = 1;
    o.threads = 1;
    return o;
}

/* kvq_attend_rows for options->n_queries query rows: query row i's head h at q + i·q_row_stride +
 * h·q_head_stride, its result at out + i·out_row_stride + h·out_head_stride, with the options' mask,
 * scale, soft-cap and threads. The rows and their strides as in kvq_attend_rows. KVQ_ERR_INVALID_ARGUMENT
 * for a bad shape, stride or option, or for any of k, v, q, out, mask and sinks whose extent (from the
 * counts and strides) passes PTRDIFF_MAX, before anything is read or written; KVQ_ERR_BAD_HEAD_DIM,
 * KVQ_ERR_NON_FINITE; on failure out is unchanged. Finite inputs give finite results (a result whose
 * float scores overflow, a scale of 3e38 say, is computed in double, as the cache does). In a steady
 * state (the same shapes again) a call allocates nothing. */
KVQ_API kvq_status kvq_attend_rows_ex(const kvq_codec* key_codec, const kvq_codec* value_codec, int32_t n_heads,
                                      int32_t n_kv_heads, const float* q, const void* k, size_t k_token_stride,
                                      size_t k_head_stride, const void* v, size_t v_token_stride,
                                      size_t v_head_stride, size_t n_tokens, const kvq_attend_options* options,
                                      float* out);

/* ---- the block-wise KV cache ------------------------------------------------------------------ */

typedef struct kvq_cache kvq_cache;

/* What the cache expects of an engine (details in kvq/cache.hpp):
 * - keys are appended after RoPE (as the attention multiplies them) and queries are passed rotated; the
 *   cache applies no positional encoding;
 * - positions are implicit: a sequence's tokens of a layer are 0, 1, ... in append order
 *   (kvq_cache_truncate drops the tail); causality and sliding windows count them;
 * - batched prefill: append the prompt's n tokens in one call, then kvq_cache_attend_prefill with its n
 *   queries (causal); decode steps of many sequences: kvq_cache_attend_batch; padding is never appended;
 * - kvq_cache_params.scale and .softcap (Gemma 2's logit soft-cap) apply in every kvq_cache_attend*;
 *   kvq_attend_rows over an engine's own rows takes a scale but no soft-cap (use the cache for a model
 *   that soft-caps). */

typedef enum kvq_seal_policy {
    KVQ_SEAL_ON_APPEND = 0,    /* every token is quantized as it is appended */
    KVQ_SEAL_ON_BLOCK_FULL = 1 /* the open block stays in full precision until it fills (default) */
} kvq_seal_policy;

typedef enum kvq_staging_type {
    KVQ_STAGING_F32 = 0, /* the open block's rows as float32 (default) */
    KVQ_STAGING_F16 = 1  /* as IEEE float16: half the memory; |x| at most 65504 */
} kvq_staging_type;

/* 16-bit floats an engine may hold keys and values in (kvq_cache_append_half). */
typedef enum kvq_half_type {
    KVQ_HALF_F16 = 0, /* IEEE binary16 (ggml's GGML_TYPE_F16) */
    KVQ_HALF_BF16 = 1 /* bfloat16 (ggml's GGML_TYPE_BF16) */
} kvq_half_type;

typedef enum kvq_nan_policy {
    KVQ_NAN_REJECT = 0,   /* non-finite keys, values or queries fail with KVQ_ERR_NON_FINITE (default) */
    KVQ_NAN_PROPAGATE = 1 /* stored as the codec maps them; attention returns NaN if it reads one */
} kvq_nan_policy;

/* Mirrors kvq::CacheConfig (kvq/cache.hpp). Grows by appending fields (see the ABI notes); start from
 * kvq_cache_params_default(). Bounds (KVQ_ERR_BAD_PARAMS beyond them): n_layers, n_kv_heads, n_heads and
 * head_dim at most KVQ_MAX_CACHE_DIM, block_tokens 1..4096, threads 1..256, initial_blocks <= max_blocks
 * when max_blocks is set, initial_blocks and grow_blocks at most KVQ_MAX_POOL_BLOCKS (a pool numbers its
 * blocks with 32 bits). A sequence holds at most KVQ_MAX_SEQUENCE_TOKENS tokens per layer. */
#define KVQ_MAX_CACHE_DIM 65536
#define KVQ_MAX_SEQUENCE_TOKENS (UINT64_C(1) << 48)
#define KVQ_MAX_POOL_BLOCKS UINT32_MAX
#define KVQ_MAX_EXACT_TAIL_TOKENS (1 << 20)
typedef struct kvq_cache_params {
    size_t size;                   /* sizeof(kvq_cache_params) */
    int32_t n_layers;              /* default 1 */
    int32_t n_kv_heads;            /* default 1 */
    int32_t n_heads;               /* query heads, a multiple of n_kv_heads; 0 means n_kv_heads */
    int32_t head_dim;              /* default 128 */
    const char* key_codec;         /* codec spec, default "q8_0"; copied by kvq_cache_create; not NULL */
    const char* value_codec;       /* default "q4_0" */
    int32_t block_tokens;          /* tokens per block, default 32 */
    int32_t threads;               /* threads for one attend call, default 1 */
    size_t max_blocks;             /* pool capacity in blocks (all layers); 0 = no limit */
    size_t initial_blocks;         /* blocks allocated up front */
    size_t grow_blocks;            /* blocks added when the pool grows, default 64 */
    float scale;                   /* softmax scale; 0 means 1/sqrt(head_dim) */
    float softcap;                 /* logit soft-cap c (s -> c·tanh(s/c)); 0 = off */
    const int32_t* sliding_window; /* n_sliding_window values (one per layer, 0 = full), or NULL; copied */
    size_t n_sliding_window;       /* 0 or n_layers */
    int32_t seal;                  /* kvq_seal_policy */
    int32_t center_keys;           /* deprecated: 1 = "+center" on every key codec (each block's keys minus
                                      their per-channel mean); key_codec may end in "+center" itself */
    int32_t nan_policy;            /* kvq_nan_policy */
    int32_t reserved0;             /* must be 0 (keeps the struct free of padding) */
    uint64_t seed;                 /* rotation seed, default KVQ_DEFAULT_SEED */
    /* Since 0.x (appended; an older caller's smaller struct leaves them NULL): the engine's own threads.
     * kvq calls executor(executor_ctx, n, task, task_ctx), which must call task(task_ctx, i) exactly once
     * for every i in [0, n), on any threads (the calling one included or not), and return when all calls
     * have returned. It may run other work between the tasks on the calling thread, other kvq calls
     * included (each call has buffers of its own). An executor that calls task with an index outside
     * [0, n), calls it twice for one index, or returns without calling it for every index makes the call
     * return KVQ_ERR_EXECUTOR (such indices are not run twice or out of range; a task called after the
     * executor returned is undefined). NULL: kvq's own pool, shared by every cache of the process.
     * `threads` still sets how many parts one call is split into. */
    void (*executor)(void* executor_ctx, int32_t n, void (*task)(void* task_ctx, int32_t i), void* task_ctx);
    void* executor_ctx;
    int32_t staging;               /* kvq_staging_type (added after executor_ctx; 0 = float32) */
    int32_t reserved1;             /* 0 */
    /* Since 0.x (appended): layers with codecs of their own (kvq::CacheConfig::layer_codecs). With
     * n_layer_codecs = n_layers, layer i has keys layer_key_codecs[i] and values layer_value_codecs[i]; a
     * NULL array or a NULL entry means key_codec or value_codec. Copied by kvq_cache_create. */
    const char* const* layer_key_codecs;
    const char* const* layer_value_codecs;
    size_t n_layer_codecs;         /* 0 or n_layers */
    size_t max_bytes;              /* capacity in bytes: blocks, float staging and each sequence's bookkeeping
                                      (its state, 24 bytes per block-table entry); 0 = no limit */
    /* Since 0.x (appended): 1 = q4_0 values multiplied by int8 weights (kvq::CacheConfig::
     * int8_value_weights: each softmax weight times block scale rounded to an int8 step per group of 16
     * rows of a block, faster where the SIMD level has the integer kernel); 0 = exact float weights (the
     * default). Not saved in cache files: kvq_cache_load_with takes it. */
    int32_t int8_value_weights;
    int32_t reserved2;             /* 0 */
    /* Since 0.x (appended): the exact tail (kvq::CacheConfig::exact_tail_tokens): the most recent
     * exact_tail_tokens tokens of each sequence and layer stay in the staging precision; a block is
     * quantized once all its tokens are more than that many tokens old. 0 = only the open block (the
     * default); 0..KVQ_MAX_EXACT_TAIL_TOKENS, needs seal = KVQ_SEAL_ON_BLOCK_FULL when > 0. The tail's
     * staging counts against max_blocks and max_bytes; saved in cache files. */
    int32_t exact_tail_tokens;
    int32_t reserved3;             /* 0 */
    /* Since 0.x (appended): static key channel scales (kvq::CacheConfig::key_scales): n_key_scales = 0, or
     * n_layers * n_kv_heads * head_dim floats, [layer][kv head][channel], positive and finite with finite
     * reciprocals (KVQ_ERR_BAD_PARAMS otherwise). Keys are stored as k * s and queries attend as q / s, so
     * scores are unchanged; saved in cache files. Copied by kvq_cache_create. */
    const float* key_scales;
    size_t n_key_scales;
    /* Values of their own head size (CacheConfig::head_dim_v): 0 means head_dim. kvq_cache_attend's out is
     * then n_heads × head_dim_v floats (and so prefill's and batch's), kvq_cache_append's v n_tokens ×
     * n_kv_heads × head_dim_v. latent_values = 1: DeepSeek's latent cache (MLA), one stored row of head_dim
     * values per token whose first head_dim_v values are the value (no value bytes; append takes v = NULL;
     * CacheConfig::latent_values says which key codecs can). Saved in cache files (format version 6). */
    int32_t head_dim_v;
    int32_t latent_values;
} kvq_cache_params;

static inline kvq_cache_params kvq_cache_params_default(void) {
    kvq_cache_params p;
    memset(&p, 0, sizeof p);
    p.size = sizeof(kvq_cache_params);
    p.n_layers = 1;
    p.n_kv_heads = 1;
    p.n_heads = 0;
    p.head_dim = 128;
    p.key_codec = "q8_0";
    p.value_codec = "q4_0";
    p.block_tokens = 32;
    p.grow_blocks = 64;
    p.seal = KVQ_SEAL_ON_BLOCK_FULL;
    p.nan_policy = KVQ_NAN_REJECT;
    p.threads = 1;
    p.seed = KVQ_DEFAULT_SEED;
    return p;
}

/* Pool occupancy. Grows by appending fields (see the ABI notes). */
typedef struct kvq_pool_stats {
    size_t size;          /* sizeof(kvq_pool_stats); kvq_pool_stats_init() sets it */
    size_t block_bytes;   /* bytes of one block */
    size_t blocks_total;  /* allocated */
    size_t blocks_used;   /* referenced by at least one sequence */
    size_t blocks_shared; /* referenced by more than one sequence */
    size_t max_blocks;    /* capacity (0 = unlimited) */
    /* Since 0.x (appended): blocks' worth of memory the open blocks' float staging holds, counted against
     * max_blocks (blocks_used + blocks_reserved <= max_blocks). */
    size_t blocks_reserved;
    /* Since 0.x (appended): bytes, for caches whose layers have blocks of different sizes. */
    size_t bytes_total;    /* allocated blocks (bytes_total + bytes_reserved + bookkeeping <= max_bytes) */
    size_t bytes_used;     /* blocks in use */
    size_t bytes_reserved; /* float staging of open blocks */
    size_t max_bytes;      /* capacity in bytes (0 = unlimited) */
} kvq_pool_stats;

static inline kvq_pool_stats kvq_pool_stats_init(void) {
    kvq_pool_stats s;
    memset(&s, 0, sizeof s);
    s.size = sizeof(kvq_pool_stats);
    return s;
}

/* Creates a cache. Fails with KVQ_ERR_BAD_PARAMS (a field out of its range or inconsistent with another:
 * n_layers 0 or beyond KVQ_MAX_CACHE_DIM, n_heads not a multiple of n_kv_heads, initial_blocks >
 * max_blocks, ...), KVQ_ERR_UNKNOWN_CODEC, KVQ_ERR_BAD_HEAD_DIM (the codec cannot take head_dim) or
 * KVQ_ERR_INVALID_ARGUMENT (a NULL pointer: params, cache, key_codec, value_codec, sliding_window with
 * n_sliding_window > 0, key_scales with n_key_scales > 0; a bad size field). */
KVQ_API kvq_status kvq_cache_create(const kvq_cache_params* params, kvq_cache** cache);
KVQ_API void kvq_cache_destroy(kvq_cache* cache); /* NULL is a no-op */

/* The cache's codecs (for row sizes and bits); owned by the cache, valid until it is destroyed. The
 * default ones (key_codec, value_codec), and those of one layer (NULL for a NULL cache or a layer
 * outside 0..n_layers-1). */
KVQ_API const kvq_codec* kvq_cache_key_codec(const kvq_cache* cache);
KVQ_API const kvq_codec* kvq_cache_value_codec(const kvq_cache* cache);
KVQ_API const kvq_codec* kvq_cache_layer_key_codec(const kvq_cache* cache, int32_t layer);
KVQ_API const kvq_codec* kvq_cache_layer_value_codec(const kvq_cache* cache, int32_t layer);

KVQ_API kvq_status kvq_cache_add_sequence(kvq_cache* cache, int64_t* seq);
KVQ_API kvq_status kvq_cache_remove_sequence(kvq_cache* cache, int64_t seq);
/* A new sequence with the same tokens as parent; full blocks are shared, the open block is copied. */
KVQ_API kvq_status kvq_cache_fork(kvq_cache* cache, int64_t parent, int64_t* child);
/* Keeps the first n_tokens tokens of every layer (n_tokens <= the sequence's length). A sealed block cut
 * into is appended to as kvq::KVCache::truncate says: chanB and centered keys move back to the float
 * staging at the next append and seal anew (that append may then need staging: KVQ_ERR_POOL_EXHAUSTED). */
KVQ_API kvq_status kvq_cache_truncate(kvq_cache* cache, int64_t seq, size_t n_tokens);

/* k, v: n_tokens × n_kv_heads × head_dim floats (C order). KVQ_ERR_INVALID_ARGUMENT before anything is
 * read when the buffers' byte size would overflow or the layer would pass KVQ_MAX_SEQUENCE_TOKENS;
 * KVQ_ERR_NON_FINITE for NaN/Inf (nan_policy = reject), KVQ_ERR_INVALID_ARGUMENT for a finite value beyond
 * the codec's range. */
KVQ_API kvq_status kvq_cache_append(kvq_cache* cache, int32_t layer, int64_t seq, const float* k,
                                    const float* v, size_t n_tokens);
/* kvq_cache_append of rows held as 16-bit floats (the bit patterns, n_tokens × n_kv_heads × head_dim
 * each): converted to float32 (exact) in a buffer of the call's size, then stored as kvq_cache_append
 * stores floats, with its statuses. type is a kvq_half_type, passed as int32_t as the structs' enum
 * fields are, so any value is checked: KVQ_ERR_INVALID_ARGUMENT for an unknown one. */
KVQ_API kvq_status kvq_cache_append_half(kvq_cache* cache, int32_t layer, int64_t seq, const uint16_t* k,
                                         const uint16_t* v, size_t n_tokens, int32_t type);
/* Decode attention over the sequence's tokens in this layer. q, out: n_heads × head_dim floats.
 * KVQ_ERR_NON_FINITE for a NaN/Inf query (nan_policy = reject). Finite queries over finite keys and values
 * give a finite output, even when their scores overflow float (such heads are recomputed in double). */
KVQ_API kvq_status kvq_cache_attend(const kvq_cache* cache, int32_t layer, int64_t seq, const float* q,
                                    float* out);
/* Causal attention for the last n_queries tokens (prefill). q, out: n_queries × n_heads × head_dim.
 * KVQ_ERR_INVALID_ARGUMENT, before q is read, when n_queries exceeds the layer's tokens. */
KVQ_API kvq_status kvq_cache_attend_prefill(const kvq_cache* cache, int32_t layer, int64_t seq,
                                            const float* q, size_t n_queries, float* out);
/* Decode attention of n_seqs sequences of one layer in one call (a batch of decoding sequences); an n_seqs
 * whose seqs, q or out would pass PTRDIFF_MAX bytes is KVQ_ERR_INVALID_ARGUMENT before seqs is read:
 * q, out: n_seqs × n_heads × head_dim floats, sequence seqs[i]'s at i·n_heads·head_dim. The work is
 * split across sequences, block ranges and kv heads; each result is bit-identical to kvq_cache_attend.
 * A sequence may appear once. KVQ_ERR_BAD_SEQUENCE, KVQ_ERR_BAD_LAYER, KVQ_ERR_NON_FINITE,
 * KVQ_ERR_INVALID_ARGUMENT (NULL, a repeated or empty sequence); out is written only on success. */
KVQ_API kvq_status kvq_cache_attend_batch(const kvq_cache* cache, int32_t layer, const int64_t* seqs, size_t n_seqs,
                                          const float* q, float* out);

KVQ_API kvq_status kvq_cache_n_tokens(const kvq_cache* cache, int64_t seq, int32_t layer, size_t* n_tokens);
/* 1 if seq is in the cache, else 0. */
KVQ_API int32_t kvq_cache_contains(const kvq_cache* cache, int64_t seq);
/* Writes up to capacity ids to ids (may be NULL when capacity is 0) and the total count to *count. */
KVQ_API kvq_status kvq_cache_sequences(const kvq_cache* cache, int64_t* ids, size_t capacity, size_t* count);

/* ---- save and load (file format: docs/file-format.md) ---- */

/* kvq_cache_save's seq for "every sequence". */
#define KVQ_ALL_SEQUENCES INT64_C(-1)

/* Writes every sequence (seq = KVQ_ALL_SEQUENCES) or one to path: into a temporary file beside it, synced,
 * then renamed over path, so a crash or error never leaves a partial file there (an old file stays as it
 * was). KVQ_ERR_IO (errno's text in the message), KVQ_ERR_BAD_SEQUENCE. No writer of the saved sequences
 * may run at the same time (as for attend). */
KVQ_API kvq_status kvq_cache_save(const kvq_cache* cache, const char* path, int64_t seq);
/* A new cache with the file's configuration and sequences (ids 0, 1, … in the file's order); unlimited
 * pool, one thread. KVQ_ERR_IO (also for anything but a regular file: a FIFO or a directory is refused
 * before it is read), KVQ_ERR_BAD_FILE (also for rows the file's nan_policy does not admit: NaN/Inf, or
 * staged values beyond the codec's range, under reject); *cache is written only on success. The pool
 * takes exactly the file's blocks (the payloads are in the file: nothing is allocated beyond its size). */
KVQ_API kvq_status kvq_cache_load(const char* path, kvq_cache** cache);
/* kvq_cache_load with the pool's capacity (max_blocks, 0 = no limit; a file with more blocks fails with
 * KVQ_ERR_POOL_EXHAUSTED before anything is allocated) and the threads of one attend call (1..256, else
 * KVQ_ERR_INVALID_ARGUMENT). */
KVQ_API kvq_status kvq_cache_load_limited(const char* path, size_t max_blocks, int32_t threads, kvq_cache** cache);
/* The same with a limit in bytes as well (max_bytes, 0 = no limit; kvq::LoadOptions::max_bytes). */
KVQ_API kvq_status kvq_cache_load_bounded(const char* path, size_t max_blocks, size_t max_bytes, int32_t threads,
                                          kvq_cache** cache);
/* What a load takes from the caller rather than from the file (mirrors kvq::LoadOptions): the pool's
 * limits and how attend runs; the fields mean what kvq_cache_params' of the same names do. Grows by
 * appending fields (see the ABI notes); start from kvq_load_params_default(). */
typedef struct kvq_load_params {
    size_t size;                  /* sizeof(kvq_load_params) */
    size_t max_blocks;            /* 0 = no limit; a file with more blocks: KVQ_ERR_POOL_EXHAUSTED */
    size_t max_bytes;             /* 0 = no limit */
    size_t grow_blocks;           /* blocks added when the pool grows after the load, default 64
                                     (1..KVQ_MAX_POOL_BLOCKS) */
    int32_t threads;              /* 1..256, default 1 */
    int32_t int8_value_weights;   /* 0 or 1 (kvq_cache_params.int8_value_weights), default 0 */
    void (*executor)(void* executor_ctx, int32_t n, void (*task)(void* task_ctx, int32_t i), void* task_ctx);
    void* executor_ctx;           /* as kvq_cache_params' */
} kvq_load_params;

static inline kvq_load_params kvq_load_params_default(void) {
    kvq_load_params p;
    memset(&p, 0, sizeof p);
    p.size = sizeof(kvq_load_params);
    p.grow_blocks = 64;
    p.threads = 1;
    return p;
}

/* kvq_cache_load with every load parameter: KVQ_ERR_INVALID_ARGUMENT for bad params (also NULL), else as
 * kvq_cache_load_bounded. */
KVQ_API kvq_status kvq_cache_load_with(const char* path, const kvq_load_params* params, kvq_cache** cache);
/* Adds the file's sequences to a cache of the same configuration. Their new ids go to ids (up to
 * capacity of them, in the file's order; ids may be NULL when capacity is 0) and their number to *count.
 * KVQ_ERR_IO, KVQ_ERR_BAD_FILE, KVQ_ERR_CONFIG_MISMATCH (the message names the field),
 * KVQ_ERR_POOL_EXHAUSTED; on any failure the cache, ids and *count are unchanged. */
KVQ_API kvq_status kvq_cache_load_into(kvq_cache* cache, const char* path, int64_t* ids, size_t capacity,
                                       size_t* count);

/* Accounting; a NULL cache gives 0. */
/* Blocks in use (shared ones once), float staging of open blocks, and per-sequence bookkeeping (about
 * 130 bytes per layer per sequence). */
KVQ_API size_t kvq_cache_bytes_used(const kvq_cache* cache);
KVQ_API double kvq_cache_bytes_per_token(const kvq_cache* cache); /* K + V, all layers and kv heads */
/* One layer's bytes per token averaged over a sequence of n_tokens tokens there, the exact tail's
 * min(n_tokens, exact_tail_tokens) tokens counted at the staging precision (kvq::KVCache::
 * average_bytes_per_token); kvq_cache_bytes_per_token counts the sealed format only. 0 on a NULL cache
 * or a layer out of range. */
KVQ_API double kvq_cache_average_bytes_per_token(const kvq_cache* cache, int32_t layer, uint64_t n_tokens);
KVQ_API kvq_status kvq_cache_pool_stats(const kvq_cache* cache, kvq_pool_stats* stats);

#ifdef __cplusplus
}
#endif

#endif /* KVQ_KVQ_H */
