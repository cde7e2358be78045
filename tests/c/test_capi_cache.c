/* The cache through the C API from C (compiled as C11, linked against libkvq.so): its whole life —
 * create, sequences, append, attend, prefill, fork, truncate, remove, accounting, destroy — and every
 * error status (bad params, unknown codec, bad head size, full pool, bad sequence id, bad layer,
 * non-finite input) with its message. */
#include <kvq/kvq.h>

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "helpers.h"

enum { L = 2, KVH = 2, QH = 4, BT = 8 };

static kvq_cache_params small_params(void) { return test_cache_params(L, KVH, QH, BT); }

static void test_cache_params_errors(void) {
    kvq_cache* cache = NULL;
    kvq_cache_params p = small_params();
    p.n_layers = 0;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "n_layers");
    p = small_params();
    p.n_heads = 3;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "n_heads");
    p = small_params();
    p.block_tokens = 0;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "block_tokens");
    p = small_params();
    p.seal = 7;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "seal");
    p = small_params();
    p.n_sliding_window = 1; /* one value for two layers */
    const int32_t window[1] = {16};
    p.sliding_window = window;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "n_sliding_window");
    p = small_params();
    p.reserved0 = 1;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "reserved0");
    p = small_params();
    p.reserved1 = 1;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "reserved1");
    p = small_params();
    p.reserved2 = 1;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "reserved2");
    p = small_params();
    p.int8_value_weights = 2;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "int8_value_weights");
    p = small_params();
    p.staging = 2;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "staging");
    p = small_params();
    p.staging = KVQ_STAGING_F16; /* half the open block's memory */
    p.seal = KVQ_SEAL_ON_BLOCK_FULL;
    CHECK_OK(kvq_cache_create(&p, &cache));
    {
        kvq_cache* full = NULL;
        kvq_cache_params p32 = small_params();
        p32.seal = KVQ_SEAL_ON_BLOCK_FULL;
        CHECK_OK(kvq_cache_create(&p32, &full));
        float* kv = malloc(sizeof(float) * KVH * p.head_dim);
        for (int i = 0; i < KVH * p.head_dim; ++i) kv[i] = 0.25f * (float)(i % 7);
        int64_t a = 0, b = 0;
        CHECK_OK(kvq_cache_add_sequence(cache, &a));
        CHECK_OK(kvq_cache_add_sequence(full, &b));
        CHECK_OK(kvq_cache_append(cache, 0, a, kv, kv, 1));
        CHECK_OK(kvq_cache_append(full, 0, b, kv, kv, 1));
        /* the open block's staging of one layer: f32 twice f16's */
        CHECK(kvq_cache_bytes_used(full) - kvq_cache_bytes_used(cache) == (size_t)2 * KVH * BT * D * 2);
        free(kv);
        kvq_cache_destroy(full);
    }
    kvq_cache_destroy(cache);
    cache = NULL;
    p = small_params();
    p.key_codec = "q9_9";
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_UNKNOWN_CODEC, "q9_9");
    p = small_params();
    p.value_codec = "q4_0:bits=3";
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "bits=3");
    p = small_params();
    p.head_dim = 48;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_HEAD_DIM, "48");
    p = small_params();
    p.size = offsetof(kvq_cache_params, seed); /* smaller than the first release's struct */
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_INVALID_ARGUMENT, "sizeof");
    CHECK(cache == NULL);
    p = small_params();
    p.size = offsetof(kvq_cache_params, executor); /* the first release's struct: no executor fields */
    CHECK_OK(kvq_cache_create(&p, &cache));
    kvq_cache_destroy(cache);
    cache = NULL;
    p = small_params();
    p.executor_ctx = &p; /* a context without an executor */
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "executor");
    CHECK_STATUS(kvq_cache_create(NULL, &cache), KVQ_ERR_INVALID_ARGUMENT, "NULL");
    CHECK(cache == NULL);

    /* A caller built against a newer kvq.h: fields this library does not know must be zero. */
    struct {
        kvq_cache_params p;
        uint64_t field_from_the_future;
    } newer;
    newer.p = small_params();
    newer.p.size = sizeof newer;
    newer.field_from_the_future = 1;
    CHECK_STATUS(kvq_cache_create(&newer.p, &cache), KVQ_ERR_INVALID_ARGUMENT, "newer");
    newer.field_from_the_future = 0;
    CHECK_OK(kvq_cache_create(&newer.p, &cache));
    kvq_cache_destroy(cache);
    kvq_cache_destroy(NULL);
}

/* Rows of n tokens, [token][kv head][D]. */
static float* make_rows(size_t n, uint32_t seed) {
    float* x = malloc(sizeof(float) * n * KVH * D);
    fill_gaussian(x, n * KVH * D, seed);
    return x;
}

static void test_cache_life(void) {
    enum { T = 20 };
    kvq_cache_params p = small_params();
    /* T = 20 tokens take 3 blocks of BT = 8 in each of the L = 2 layers; a fork shares all of them (the
     * partly filled one is copied when either side writes to it), so 2 of 8 blocks are left. */
    p.max_blocks = 8;
    kvq_cache* cache = NULL;
    CHECK_OK(kvq_cache_create(&p, &cache));
    CHECK(cache != NULL);
    CHECK_STR_EQ(kvq_codec_name(kvq_cache_key_codec(cache)), "q8_0");
    CHECK(kvq_codec_row_bytes(kvq_cache_value_codec(cache)) == 2 * 18);
    CHECK(fabs(kvq_cache_bytes_per_token(cache) - (double)L * KVH * (2 * 34 + 2 * 18)) < 1e-9);

    int64_t seq;
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    CHECK(kvq_cache_contains(cache, seq) == 1);
    float* k = make_rows(T, 10);
    float* v = make_rows(T, 11);
    for (int l = 0; l < L; ++l) CHECK_OK(kvq_cache_append(cache, l, seq, k, v, T));
    size_t n = 0;
    CHECK_OK(kvq_cache_n_tokens(cache, seq, 1, &n));
    CHECK(n == T);

    /* Attention of the cache equals kvq_attend_rows over the same rows quantized by the same codecs. */
    static float q[QH * D], out[QH * D], expect[QH * D];
    fill_gaussian(q, QH * D, 12);
    CHECK_OK(kvq_cache_attend(cache, 1, seq, q, out));
    const kvq_codec* kc = kvq_cache_key_codec(cache);
    const kvq_codec* vc = kvq_cache_value_codec(cache);
    uint8_t* krows = malloc(T * KVH * kvq_codec_row_bytes(kc));
    uint8_t* vrows = malloc(T * KVH * kvq_codec_row_bytes(vc));
    CHECK_OK(kvq_codec_quantize_rows(kc, k, T * KVH, krows, 0));
    CHECK_OK(kvq_codec_quantize_rows(vc, v, T * KVH, vrows, 0));
    CHECK_OK(kvq_attend_rows(kc, vc, QH, KVH, q, krows, 0, 0, vrows, 0, 0, T, 0.0f, expect));
    CHECK(relative_l2(out, expect, QH * D) < 1e-4);
    /* Prefill: the last query sees every token, as decode attention does. */
    static float q2[2 * QH * D], out2[2 * QH * D];
    fill_gaussian(q2, QH * D, 13);
    memcpy(q2 + QH * D, q, sizeof q);
    CHECK_OK(kvq_cache_attend_prefill(cache, 1, seq, q2, 2, out2));
    CHECK(relative_l2(out2 + QH * D, out, QH * D) < 1e-5);

    /* Fork: same tokens, full blocks shared. */
    int64_t child;
    CHECK_OK(kvq_cache_fork(cache, seq, &child));
    CHECK(child != seq && kvq_cache_contains(cache, child) == 1);
    CHECK_OK(kvq_cache_n_tokens(cache, child, 0, &n));
    CHECK(n == T);
    static float out_child[QH * D];
    CHECK_OK(kvq_cache_attend(cache, 1, child, q, out_child));
    CHECK(memcmp(out_child, out, sizeof out) == 0);
    kvq_pool_stats stats = kvq_pool_stats_init();
    CHECK_OK(kvq_cache_pool_stats(cache, &stats));
    CHECK(stats.size == sizeof stats && stats.max_blocks == 8 && stats.blocks_shared == 3 * L);
    CHECK(stats.blocks_used == 3 * L && stats.block_bytes > 0);
    /* Blocks, plus the bookkeeping of two sequences of L layers (no float staging: on_append). */
    CHECK(kvq_cache_bytes_used(cache) > stats.blocks_used * stats.block_bytes);
    CHECK(kvq_cache_bytes_used(cache) - stats.blocks_used * stats.block_bytes < 2 * (256 + L * 256));
    int64_t ids[4];
    size_t count = 0;
    CHECK_OK(kvq_cache_sequences(cache, ids, 4, &count));
    CHECK(count == 2 && ((ids[0] == seq && ids[1] == child) || (ids[0] == child && ids[1] == seq)));

    /* Full pool: a third sequence gets the last 2 blocks, then the pool is exhausted; the failing append
     * stores nothing. Writing to a shared partly filled block needs a block too. */
    int64_t other;
    CHECK_OK(kvq_cache_add_sequence(cache, &other));
    CHECK_OK(kvq_cache_append(cache, 0, other, k, v, 2 * BT));
    CHECK_STATUS(kvq_cache_append(cache, 0, other, k, v, BT), KVQ_ERR_POOL_EXHAUSTED, "");
    CHECK(strlen(kvq_last_error()) > 0);
    CHECK_OK(kvq_cache_n_tokens(cache, other, 0, &n));
    CHECK(n == 2 * BT);
    CHECK_STATUS(kvq_cache_append(cache, 1, child, k, v, 1), KVQ_ERR_POOL_EXHAUSTED, "");
    CHECK_OK(kvq_cache_n_tokens(cache, child, 1, &n));
    CHECK(n == T);

    /* Truncating the fork keeps its first block (the parent still holds the others); removing the parent
     * gives the other two of each layer back, and the append fits. */
    CHECK_OK(kvq_cache_truncate(cache, child, BT));
    CHECK_OK(kvq_cache_n_tokens(cache, child, 1, &n));
    CHECK(n == BT);
    CHECK_STATUS(kvq_cache_truncate(cache, child, T), KVQ_ERR_INVALID_ARGUMENT, "");
    CHECK_OK(kvq_cache_remove_sequence(cache, seq));
    CHECK(kvq_cache_contains(cache, seq) == 0);
    CHECK_OK(kvq_cache_append(cache, 0, other, k, v, BT));

    /* Bad sequence id: every call that takes one. */
    const int64_t gone = seq;
    CHECK_STATUS(kvq_cache_append(cache, 0, gone, k, v, 1), KVQ_ERR_BAD_SEQUENCE, "not in the cache");
    CHECK_STATUS(kvq_cache_attend(cache, 0, gone, q, out), KVQ_ERR_BAD_SEQUENCE, "not in the cache");
    CHECK_STATUS(kvq_cache_attend_prefill(cache, 0, gone, q2, 2, out2), KVQ_ERR_BAD_SEQUENCE, "not in");
    CHECK_STATUS(kvq_cache_fork(cache, gone, &child), KVQ_ERR_BAD_SEQUENCE, "not in the cache");
    CHECK_STATUS(kvq_cache_truncate(cache, gone, 0), KVQ_ERR_BAD_SEQUENCE, "not in the cache");
    CHECK_STATUS(kvq_cache_remove_sequence(cache, gone), KVQ_ERR_BAD_SEQUENCE, "not in the cache");
    CHECK_STATUS(kvq_cache_n_tokens(cache, gone, 0, &n), KVQ_ERR_BAD_SEQUENCE, "not in the cache");
    CHECK_STATUS(kvq_cache_attend(cache, 0, -5, q, out), KVQ_ERR_BAD_SEQUENCE, "-5");

    /* Bad layer. */
    CHECK_STATUS(kvq_cache_append(cache, L, other, k, v, 1), KVQ_ERR_BAD_LAYER, "layer 2");
    CHECK_STATUS(kvq_cache_attend(cache, -1, other, q, out), KVQ_ERR_BAD_LAYER, "layer -1");
    CHECK_STATUS(kvq_cache_n_tokens(cache, other, L, &n), KVQ_ERR_BAD_LAYER, "layer");

    /* Non-finite keys, values or queries (nan_policy = reject): nothing stored, nothing written. */
    CHECK_OK(kvq_cache_n_tokens(cache, other, 0, &n));
    const size_t before = n;
    v[3] = NAN;
    CHECK_STATUS(kvq_cache_append(cache, 0, other, k, v, 1), KVQ_ERR_NON_FINITE, "");
    v[3] = 0.0f;
    k[KVH * D - 1] = -INFINITY;
    CHECK_STATUS(kvq_cache_append(cache, 0, other, k, v, 1), KVQ_ERR_NON_FINITE, "");
    k[KVH * D - 1] = 0.0f;
    CHECK_OK(kvq_cache_n_tokens(cache, other, 0, &n));
    CHECK(n == before);
    for (int i = 0; i < QH * D; ++i) out[i] = 3.0f;
    q[0] = NAN;
    CHECK_STATUS(kvq_cache_attend(cache, 0, other, q, out), KVQ_ERR_NON_FINITE, "");
    CHECK(out[0] == 3.0f && out[QH * D - 1] == 3.0f);
    q[0] = 0.0f;

    CHECK_STATUS(kvq_cache_append(NULL, 0, other, k, v, 1), KVQ_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_STATUS(kvq_cache_append(cache, 0, other, NULL, v, 1), KVQ_ERR_INVALID_ARGUMENT, "NULL");
    stats.size = 4;
    CHECK_STATUS(kvq_cache_pool_stats(cache, &stats), KVQ_ERR_INVALID_ARGUMENT, "sizeof");

    free(krows);
    free(vrows);
    free(k);
    free(v);
    kvq_cache_destroy(cache);
}

/* An engine's executor: runs the tasks on the calling thread in reverse order, counting them. */
typedef struct {
    int calls, tasks;
} engine_pool;
static void engine_executor(void* ctx, int32_t n, void (*task)(void* task_ctx, int32_t i), void* task_ctx) {
    engine_pool* pool = (engine_pool*)ctx;
    ++pool->calls;
    for (int32_t i = n - 1; i >= 0; --i) {
        task(task_ctx, i);
        ++pool->tasks;
    }
}

static void test_attend_batch(void) {
    enum { N = 3 };
    static const size_t lengths[N] = {5, 300, 41};
    engine_pool pool = {0, 0};
    kvq_cache_params p = small_params();
    p.threads = 2;
    p.executor = engine_executor;
    p.executor_ctx = &pool;
    kvq_cache* cache = NULL;
    CHECK_OK(kvq_cache_create(&p, &cache));
    int64_t seqs[N];
    for (int i = 0; i < N; ++i) {
        CHECK_OK(kvq_cache_add_sequence(cache, &seqs[i]));
        float* k = make_rows(lengths[i], 20 + i);
        float* v = make_rows(lengths[i], 30 + i);
        for (int l = 0; l < L; ++l) CHECK_OK(kvq_cache_append(cache, l, seqs[i], k, v, lengths[i]));
        free(k);
        free(v);
    }
    static float q[N * QH * D], out[N * QH * D], one[QH * D];
    fill_gaussian(q, N * QH * D, 40);
    CHECK_OK(kvq_cache_attend_batch(cache, 1, seqs, N, q, out));
    for (int i = 0; i < N; ++i) {
        CHECK_OK(kvq_cache_attend(cache, 1, seqs[i], q + i * QH * D, one));
        CHECK(memcmp(one, out + i * QH * D, sizeof one) == 0); /* bit for bit */
    }
    CHECK(pool.calls >= 1 && pool.tasks > N); /* the executor ran the parts; the long sequence split */
    CHECK_OK(kvq_cache_attend_batch(cache, 1, seqs, 0, NULL, NULL)); /* nothing to do */
    const int64_t repeated[2] = {seqs[0], seqs[0]};
    CHECK_STATUS(kvq_cache_attend_batch(cache, 1, repeated, 2, q, out), KVQ_ERR_INVALID_ARGUMENT, "twice");
    const int64_t unknown[2] = {seqs[0], 999};
    CHECK_STATUS(kvq_cache_attend_batch(cache, 1, unknown, 2, q, out), KVQ_ERR_BAD_SEQUENCE, "999");
    CHECK_STATUS(kvq_cache_attend_batch(cache, L, seqs, N, q, out), KVQ_ERR_BAD_LAYER, "layer");
    CHECK_STATUS(kvq_cache_attend_batch(cache, 1, seqs, N, NULL, out), KVQ_ERR_INVALID_ARGUMENT, "NULL");
    q[QH * D + 7] = NAN;
    CHECK_STATUS(kvq_cache_attend_batch(cache, 1, seqs, N, q, out), KVQ_ERR_NON_FINITE, "NaN");
    kvq_cache_destroy(cache);
}

/* An executor that breaks its contract (kvq.h, executor): a task skipped, run twice or given an index
 * out of range is KVQ_ERR_EXECUTOR, never KVQ_OK with output left unwritten. */
typedef struct {
    int mode; /* 0: faithful, 1: skips the last task, 2: runs task 0 twice, 3: passes n */
} broken_pool;
static void broken_executor(void* ctx, int32_t n, void (*task)(void* task_ctx, int32_t i), void* task_ctx) {
    const int mode = ((broken_pool*)ctx)->mode;
    if (mode == 2) task(task_ctx, 0);
    for (int32_t i = 0; i < n - (mode == 1); ++i) task(task_ctx, i);
    if (mode == 3) task(task_ctx, n);
}

static void test_broken_executor(void) {
    broken_pool pool = {0};
    kvq_cache_params p = small_params();
    p.threads = 2;
    p.executor = broken_executor;
    p.executor_ctx = &pool;
    kvq_cache* cache = NULL;
    CHECK_OK(kvq_cache_create(&p, &cache));
    int64_t seq;
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    float* k = make_rows(300, 50);
    float* v = make_rows(300, 51);
    for (int l = 0; l < L; ++l) CHECK_OK(kvq_cache_append(cache, l, seq, k, v, 300));
    free(k);
    free(v);
    static float q[QH * D], out[QH * D], again[QH * D];
    fill_gaussian(q, QH * D, 52);
    CHECK_OK(kvq_cache_attend(cache, 0, seq, q, out));
    static const char* messages[] = {"", "without running task", "more than once", "outside 0.."};
    for (pool.mode = 1; pool.mode <= 3; ++pool.mode) {
        CHECK_STATUS(kvq_cache_attend(cache, 0, seq, q, again), KVQ_ERR_EXECUTOR, messages[pool.mode]);
        CHECK_STATUS(kvq_cache_attend_batch(cache, 0, &seq, 1, q, again), KVQ_ERR_EXECUTOR, messages[pool.mode]);
    }
    CHECK(strcmp(kvq_status_name(KVQ_ERR_EXECUTOR), "KVQ_ERR_EXECUTOR") == 0);
    pool.mode = 0; /* the cache is unharmed */
    CHECK_OK(kvq_cache_attend(cache, 0, seq, q, again));
    CHECK(memcmp(out, again, sizeof out) == 0);
    kvq_cache_destroy(cache);
}

/* Per-channel keys (chanB): a key codec name of the cache, refused unless blocks are sealed when full;
 * chan8 keys attend within 1% of f32 keys; non-finite keys and row operations on the codec are refused. */
static void test_channel_keys(void) {
    enum { T = 2 * BT + 3 };
    kvq_cache* cache = NULL;
    kvq_cache_params p = small_params();
    p.key_codec = "chan3";
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "on_block_full"); /* small_params: on_append */
    p.value_codec = "chan3";
    p.seal = KVQ_SEAL_ON_BLOCK_FULL;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "key codec");
    kvq_codec* codec = NULL;
    CHECK_STATUS(kvq_codec_create("chan3", D, KVQ_DEFAULT_SEED, &codec), KVQ_ERR_BAD_PARAMS, "KVCache key codec");
    float* k = make_rows(T, 31);
    float* v = make_rows(T, 32);
    float q[QH * D], out[QH * D], exact[QH * D];
    fill_gaussian(q, QH * D, 33);
    const char* keys[] = {"f32", "chan8"};
    for (int i = 0; i < 2; ++i) {
        p = small_params();
        p.key_codec = keys[i];
        p.value_codec = "f32";
        p.seal = KVQ_SEAL_ON_BLOCK_FULL;
        CHECK_OK(kvq_cache_create(&p, &cache));
        CHECK_STR_EQ(kvq_codec_name(kvq_cache_key_codec(cache)), keys[i]);
        int64_t seq = -1;
        CHECK_OK(kvq_cache_add_sequence(cache, &seq));
        CHECK_OK(kvq_cache_append(cache, 0, seq, k, v, T));
        CHECK_OK(kvq_cache_attend(cache, 0, seq, q, i == 0 ? exact : out));
        if (i == 1) {
            double diff = 0, norm = 0;
            for (int j = 0; j < QH * D; ++j) diff += (out[j] - exact[j]) * (out[j] - exact[j]), norm += exact[j] * exact[j];
            CHECK(diff > 0 && sqrt(diff / norm) < 0.01);
            float* bad = make_rows(1, 34);
            bad[5] = NAN;
            CHECK_STATUS(kvq_cache_append(cache, 0, seq, bad, v, 1), KVQ_ERR_NON_FINITE, "");
            size_t n = 0;
            CHECK_OK(kvq_cache_n_tokens(cache, seq, 0, &n));
            CHECK(n == T);
            unsigned char row[D];
            CHECK_STATUS(kvq_codec_quantize_rows(kvq_cache_key_codec(cache), bad + D, 1, row, 0), KVQ_ERR_INVALID_ARGUMENT,
                         "no row operations");
            free(bad);
        }
        kvq_cache_destroy(cache);
        cache = NULL;
    }
    free(k);
    free(v);
}

/* "+center" in a key codec spec (a layer's own included) is center_keys = 1: the same bits; both given are
 * the same too. The key codec's rows are the row codec's ("q4_0"). */
static void test_center_suffix(void) {
    enum { T = 2 * BT + 3 };
    float* k = make_rows(T, 41);
    float* v = make_rows(T, 42);
    float q[QH * D], out[3][L][QH * D];
    fill_gaussian(q, QH * D, 43);
    const char* layer_keys[L] = {"q4_0+center", "q8_0+center"};
    for (int way = 0; way < 3; ++way) { /* the flag, the suffix, both */
        kvq_cache_params p = small_params();
        p.seal = KVQ_SEAL_ON_BLOCK_FULL;
        p.key_codec = way == 0 ? "q4_0" : "q4_0+center";
        p.center_keys = way != 1;
        const char* flag_keys[L] = {"q4_0", "q8_0"};
        p.layer_key_codecs = way == 0 ? flag_keys : layer_keys;
        p.n_layer_codecs = L;
        kvq_cache* cache = NULL;
        CHECK_OK(kvq_cache_create(&p, &cache));
        if (!cache) continue;
        CHECK_STR_EQ(kvq_codec_name(kvq_cache_key_codec(cache)), "q4_0");
        CHECK_STR_EQ(kvq_codec_name(kvq_cache_layer_key_codec(cache, 1)), "q8_0");
        int64_t seq = -1;
        CHECK_OK(kvq_cache_add_sequence(cache, &seq));
        for (int l = 0; l < L; ++l) {
            CHECK_OK(kvq_cache_append(cache, l, seq, k, v, T));
            CHECK_OK(kvq_cache_attend(cache, l, seq, q, out[way][l]));
        }
        kvq_cache_destroy(cache);
    }
    CHECK(memcmp(out[0], out[1], sizeof out[0]) == 0);
    CHECK(memcmp(out[0], out[2], sizeof out[0]) == 0);
    kvq_cache_params p = small_params(); /* on_append: a block's mean is known only when it is full */
    p.key_codec = "q4_0+center";
    kvq_cache* cache = NULL;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "on_block_full");
    free(k);
    free(v);
}

/* int8_value_weights = 1: q4_0 values on int8 weights, within 1% of the exact weights' output and not equal.
 * Files do not store it: kvq_cache_load_with takes it (and the executor), and a cache saved with it and
 * loaded with it attends bit for bit as before; loaded without it, as the exact cache. */
static void test_int8_value_weights(void) {
    enum { T = 100, D = 64 };
    float* k = malloc(sizeof(float) * T * KVH * D);
    float* v = malloc(sizeof(float) * T * KVH * D);
    float q[QH * D], out[2][QH * D];
    char path[64];
    snprintf(path, sizeof path, "/tmp/kvq_capi_int8_%d.kvq", (int)getpid());
    for (int i = 0; i < T * KVH * D; ++i) {
        k[i] = (float)sin(0.37 * i);
        v[i] = 1.0f + 0.5f * (float)cos(0.11 * i + 0.3 * (i % 5)); /* an output of size ~1, not a cancelling sum */
    }
    for (int i = 0; i < QH * D; ++i) q[i] = (float)sin(0.23 * i + 1.0);
    for (int int8 = 0; int8 < 2; ++int8) {
        kvq_cache_params p = small_params();
        p.head_dim = D;
        p.value_codec = "q4_0";
        p.int8_value_weights = int8;
        kvq_cache* cache = NULL;
        int64_t seq = 0;
        CHECK_OK(kvq_cache_create(&p, &cache));
        CHECK_OK(kvq_cache_add_sequence(cache, &seq));
        CHECK_OK(kvq_cache_append(cache, 0, seq, k, v, T));
        CHECK_OK(kvq_cache_attend(cache, 0, seq, q, out[int8]));
        if (int8) CHECK_OK(kvq_cache_save(cache, path, KVQ_ALL_SEQUENCES));
        kvq_cache_destroy(cache);
    }
    double diff = 0, size = 0;
    for (int i = 0; i < QH * D; ++i) {
        diff = fmax(diff, fabs(out[1][i] - out[0][i]));
        size = fmax(size, fabs(out[0][i]));
    }
    CHECK(diff > 1e-6 * size && diff < 1e-2 * size); /* within 1% of the exact weights' output, and not equal */

    float got[QH * D];
    engine_pool pool = {0, 0};
    kvq_load_params lp = kvq_load_params_default();
    lp.threads = 2;
    lp.int8_value_weights = 1;
    lp.executor = engine_executor;
    lp.executor_ctx = &pool;
    kvq_cache* loaded = NULL;
    CHECK_OK(kvq_cache_load_with(path, &lp, &loaded));
    CHECK_OK(kvq_cache_attend(loaded, 0, 0, q, got));
    CHECK(memcmp(got, out[1], sizeof got) == 0);
    CHECK(pool.tasks >= 1); /* the loaded cache ran its parts on the engine's executor */
    kvq_cache_destroy(loaded);
    loaded = NULL;
    CHECK_OK(kvq_cache_load(path, &loaded));
    CHECK_OK(kvq_cache_attend(loaded, 0, 0, q, got));
    CHECK(memcmp(got, out[0], sizeof got) == 0);
    kvq_cache_destroy(loaded);

    /* Bad load params: refused, *cache untouched. */
    loaded = NULL;
    CHECK_STATUS(kvq_cache_load_with(path, NULL, &loaded), KVQ_ERR_INVALID_ARGUMENT, "params is NULL");
    lp = kvq_load_params_default();
    lp.size = 8;
    CHECK_STATUS(kvq_cache_load_with(path, &lp, &loaded), KVQ_ERR_INVALID_ARGUMENT, "size");
    lp = kvq_load_params_default();
    lp.int8_value_weights = 2;
    CHECK_STATUS(kvq_cache_load_with(path, &lp, &loaded), KVQ_ERR_INVALID_ARGUMENT, "int8_value_weights");
    lp = kvq_load_params_default();
    lp.threads = 0;
    CHECK_STATUS(kvq_cache_load_with(path, &lp, &loaded), KVQ_ERR_INVALID_ARGUMENT, "threads");
    lp = kvq_load_params_default();
    lp.grow_blocks = 0;
    CHECK_STATUS(kvq_cache_load_with(path, &lp, &loaded), KVQ_ERR_INVALID_ARGUMENT, "grow_blocks");
    lp = kvq_load_params_default();
    lp.executor_ctx = &pool;
    CHECK_STATUS(kvq_cache_load_with(path, &lp, &loaded), KVQ_ERR_INVALID_ARGUMENT, "executor");
    CHECK(loaded == NULL);
    remove(path);
    free(k);
    free(v);
}

/* exact_tail_tokens (appended field): with a tail of 16 tokens, 20 tokens in blocks of 8 are all exact (no
 * block is more than 16 tokens old), so attention equals an f32/f32 cache's; without it, it does not. The
 * tail's staging (three blocks' rows per layer) is counted, the field is saved, and it is checked. */
static void test_exact_tail(void) {
    enum { N = 20 };
    float* k = make_rows(N, 40);
    float* v = make_rows(N, 41);
    static float q[QH * D], out[3][QH * D];
    fill_gaussian(q, QH * D, 42);
    char path[64];  /* per process: ctest runs this program at several SIMD levels at once */
    snprintf(path, sizeof path, "/tmp/kvq_capi_tail_%d.kvq", (int)getpid());
    for (int run = 0; run < 3; ++run) {
        kvq_cache_params p = small_params();
        p.key_codec = run == 2 ? "f32" : "q4_0";
        p.value_codec = run == 2 ? "f32" : "q4_0";
        p.exact_tail_tokens = run == 0 ? 16 : 0;
        p.seal = KVQ_SEAL_ON_BLOCK_FULL;
        kvq_cache* cache = NULL;
        CHECK_OK(kvq_cache_create(&p, &cache));
        int64_t seq;
        CHECK_OK(kvq_cache_add_sequence(cache, &seq));
        for (int l = 0; l < L; ++l) CHECK_OK(kvq_cache_append(cache, l, seq, k, v, N));
        CHECK_OK(kvq_cache_attend(cache, 1, seq, q, out[run]));
        if (run == 0) {
            kvq_pool_stats stats = kvq_pool_stats_init();
            CHECK_OK(kvq_cache_pool_stats(cache, &stats));
            const size_t slot = 2 * KVH * BT * D * sizeof(float);
            CHECK(stats.bytes_reserved == L * 3 * slot); /* ceil((16 + 8 - 1) / 8) = 3 blocks' rows a layer */
            CHECK(stats.blocks_used == 0);
            /* 18-byte q4_0 rows: 2 kv heads x 2 x 36 bytes sealed, 2 x 2 x 256 bytes exact. */
            CHECK(fabs(kvq_cache_average_bytes_per_token(cache, 0, 64) - (48.0 * 144 + 16.0 * 1024) / 64) < 1e-9);
            CHECK(kvq_cache_average_bytes_per_token(cache, L, 64) == 0.0);
            CHECK_OK(kvq_cache_save(cache, path, KVQ_ALL_SEQUENCES));
            kvq_cache* loaded = NULL;
            CHECK_OK(kvq_cache_load(path, &loaded));
            static float again[QH * D];
            CHECK_OK(kvq_cache_attend(loaded, 1, 0, q, again));
            CHECK(memcmp(again, out[0], sizeof again) == 0);
            kvq_cache_destroy(loaded);
            remove(path);
        }
        kvq_cache_destroy(cache);
    }
    CHECK(relative_l2(out[0], out[2], QH * D) < 1e-5);
    CHECK(relative_l2(out[1], out[2], QH * D) > 1e-3);

    kvq_cache* cache = NULL;
    kvq_cache_params p = small_params();
    p.exact_tail_tokens = -1;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "exact_tail_tokens");
    p = small_params();
    p.exact_tail_tokens = 8;
    p.seal = KVQ_SEAL_ON_APPEND;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "exact_tail_tokens");
    p = small_params();
    p.seal = KVQ_SEAL_ON_BLOCK_FULL;
    p.reserved3 = 1;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "reserved3");
    /* A caller built before the field: its smaller struct gets no tail. */
    p = small_params();
    p.size = offsetof(kvq_cache_params, exact_tail_tokens);
    p.exact_tail_tokens = 8; /* past its size: not read */
    CHECK_OK(kvq_cache_create(&p, &cache));
    kvq_cache_destroy(cache);
    free(k);
    free(v);
}

/* DeepSeek's latent cache through C: head_dim 576, head_dim_v 512, latent_values 1, append with v = NULL,
 * results of 512 floats per head: kvq_attend_rows over the same q8_0 rows with v a view of k, bit for bit. */
static void test_latent_cache(void) {
    enum { T = 300, H = 16, DK = 576, DV = 512 };
    kvq_cache_params p = kvq_cache_params_default();
    p.n_heads = H;
    p.head_dim = DK;
    p.head_dim_v = DV;
    p.latent_values = 1;
    p.key_codec = "q8_0";
    p.value_codec = "";
    p.block_tokens = 256;
    p.seal = KVQ_SEAL_ON_APPEND;
    kvq_cache* cache;
    CHECK_OK(kvq_cache_create(&p, &cache));
    int64_t seq;
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    float* k = malloc(sizeof(float) * T * DK);
    static float q[H * DK], out[H * DV], rows_out[H * DV];
    fill_gaussian(k, (size_t)T * DK, 21);
    fill_gaussian(q, H * DK, 22);
    for (int i = 0; i < H * DK; ++i) q[i] *= 0.05f;
    CHECK_STATUS(kvq_cache_append(cache, 0, seq, k, k, T), KVQ_ERR_INVALID_ARGUMENT, "v = null");
    CHECK_OK(kvq_cache_append(cache, 0, seq, k, NULL, T));
    CHECK_OK(kvq_cache_attend(cache, 0, seq, q, out));
    const kvq_codec* keys = kvq_cache_key_codec(cache);
    const kvq_codec* values = kvq_cache_value_codec(cache);
    const size_t rb = kvq_codec_row_bytes(keys);
    uint8_t* rows = malloc((size_t)T * rb);
    CHECK_OK(kvq_codec_quantize_rows(keys, k, T, rows, 0));
    CHECK_OK(kvq_attend_rows(keys, values, H, 1, q, rows, 0, 0, rows, rb, 0, T, 0.0f, rows_out));
    CHECK(memcmp(out, rows_out, sizeof out) == 0);
    p.latent_values = 2;
    kvq_cache* bad;
    CHECK_STATUS(kvq_cache_create(&p, &bad), KVQ_ERR_BAD_PARAMS, "latent_values");
    p.latent_values = 1;
    p.key_codec = "turbo4";
    CHECK_STATUS(kvq_cache_create(&p, &bad), KVQ_ERR_BAD_PARAMS, "leading values");
    free(rows);
    free(k);
    kvq_cache_destroy(cache);
}

int main(void) {
    test_cache_params_errors();
    test_int8_value_weights();
    test_channel_keys();
    test_center_suffix();
    test_cache_life();
    test_attend_batch();
    test_broken_executor();
    test_exact_tail();
    test_latent_cache();
    return check_report("test_capi_cache");
}
