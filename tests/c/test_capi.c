/* The C API from C (compiled as C11, linked against libkvq.so): version, codec table, codecs on rows,
 * kvq_attend_rows, the cache's whole life, and every error status with its message. */
#include <kvq/kvq.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { D = 64 };

static float next_gaussian(uint32_t* state) {
    float u[2];
    for (int i = 0; i < 2; ++i) {
        *state ^= *state << 13;
        *state ^= *state >> 17;
        *state ^= *state << 5;
        u[i] = ((float)(*state >> 8) + 0.5f) / 16777216.0f;
    }
    return sqrtf(-2.0f * logf(u[0])) * cosf(6.2831853f * u[1]);
}

static void fill_gaussian(float* x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; ++i) x[i] = next_gaussian(&seed);
}

static double relative_l2(const float* a, const float* ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

static void test_version(void) {
    CHECK(kvq_version() == KVQ_VERSION);
    CHECK(kvq_version() >> 16 == KVQ_VERSION_MAJOR);
    CHECK_STR_EQ(kvq_version_string(), KVQ_VERSION_STRING);
    CHECK_STR_EQ(kvq_status_name(KVQ_ERR_POOL_EXHAUSTED), "KVQ_ERR_POOL_EXHAUSTED");
    CHECK_STR_EQ(kvq_status_name((kvq_status)999), "unknown status");
}

static void test_codec_table(void) {
    const int32_t count = kvq_codec_count();
    CHECK(count >= 8);
    for (int32_t id = 0; id < count; ++id) {
        kvq_codec_info info = kvq_codec_info_init();
        CHECK_OK(kvq_codec_get_info(id, &info));
        CHECK(info.size == sizeof info);
        CHECK(info.name != NULL && info.layout != NULL && info.block > 0 && info.bytes_per_block > 0);
        CHECK(fabs(info.bits_per_value - 8.0 * info.bytes_per_block / info.block) < 1e-12);
        int32_t found = -1;
        CHECK_OK(kvq_codec_lookup(info.name, &found));
        CHECK(found == id);
        /* Every codec takes 128 values per head; its rows hold at least its blocks' bits. */
        size_t row_bytes = 0;
        CHECK_OK(kvq_codec_spec_row_bytes(info.name, 128, &row_bytes));
        CHECK(8.0 * row_bytes / 128 >= info.bits_per_value);
        if (info.block > 1) {
            kvq_codec* codec = NULL;
            CHECK_STATUS(kvq_codec_create(info.name, info.block + 1, KVQ_DEFAULT_SEED, &codec), KVQ_ERR_BAD_HEAD_DIM,
                         info.name);
            CHECK(codec == NULL);
        }
    }
    int32_t id = -1;
    kvq_codec_info info = kvq_codec_info_init();
    CHECK_OK(kvq_codec_lookup("q8_0", &id));
    CHECK_OK(kvq_codec_get_info(id, &info));
    CHECK(info.block == 32 && info.bytes_per_block == 34 && info.ggml_layout == 1 && info.bits_per_value == 8.5);
    CHECK_OK(kvq_codec_lookup("q4_0", &id));
    CHECK_OK(kvq_codec_get_info(id, &info));
    CHECK(info.bytes_per_block == 18 && info.bits_per_value == 4.5 && info.ggml_layout == 1);

    CHECK_STATUS(kvq_codec_lookup("q3_xs", &id), KVQ_ERR_UNKNOWN_CODEC, "q3_xs");
    CHECK_STATUS(kvq_codec_get_info(count, &info), KVQ_ERR_UNKNOWN_CODEC, "outside");
    CHECK_STATUS(kvq_codec_get_info(-1, &info), KVQ_ERR_UNKNOWN_CODEC, "outside");
    CHECK_STATUS(kvq_codec_get_info(0, NULL), KVQ_ERR_INVALID_ARGUMENT, "NULL");
    info.size = 8; /* not set to sizeof */
    CHECK_STATUS(kvq_codec_get_info(0, &info), KVQ_ERR_INVALID_ARGUMENT, "sizeof");

    size_t bytes = 0;
    CHECK_OK(kvq_codec_spec_row_bytes("q4_0", 128, &bytes));
    CHECK(bytes == 4 * 18);
    CHECK_OK(kvq_codec_spec_row_bytes("q8_0+rot", 128, &bytes));
    CHECK(bytes == 4 * 34);
    CHECK_STATUS(kvq_codec_spec_row_bytes("nope", 128, &bytes), KVQ_ERR_UNKNOWN_CODEC, "nope");
    CHECK_STATUS(kvq_codec_spec_row_bytes("q4_0", 100, &bytes), KVQ_ERR_BAD_HEAD_DIM, "100");
    CHECK_STATUS(kvq_codec_spec_row_bytes("q4_0", 0, &bytes), KVQ_ERR_BAD_HEAD_DIM, "head_dim");
    CHECK_STATUS(kvq_codec_spec_row_bytes("q4_0:x=1", 128, &bytes), KVQ_ERR_BAD_PARAMS, "x=1");
    CHECK_STATUS(kvq_codec_spec_row_bytes(NULL, 128, &bytes), KVQ_ERR_INVALID_ARGUMENT, "NULL");
    CHECK(bytes == 4 * 34); /* unchanged by the failures */
}

static void test_codec_rows(void) {
    enum { N = 40, NQ = 3 };
    kvq_codec* keys = NULL;
    kvq_codec* values = NULL;
    CHECK_STATUS(kvq_codec_create("q4_0", 48, KVQ_DEFAULT_SEED, &keys), KVQ_ERR_BAD_HEAD_DIM, "48");
    CHECK(keys == NULL);
    CHECK_OK(kvq_codec_create("q8_0", D, KVQ_DEFAULT_SEED, &keys));
    CHECK_OK(kvq_codec_create("q4_0+rot", D, KVQ_DEFAULT_SEED, &values));
    CHECK_STR_EQ(kvq_codec_name(values), "q4_0+rot");
    CHECK(kvq_codec_head_dim(keys) == D && kvq_codec_rotated(values) == 1 && kvq_codec_rotated(keys) == 0);
    CHECK(kvq_codec_row_bytes(keys) == 2 * 34 && kvq_codec_bits_per_value(values) == 4.5);
    CHECK(kvq_codec_row_bytes(NULL) == 0 && strcmp(kvq_codec_name(NULL), "") == 0);

    static float x[N * D], y[N * D], q[NQ * D];
    fill_gaussian(x, N * D, 1);
    fill_gaussian(q, NQ * D, 2);
    uint8_t* rows = malloc(N * kvq_codec_row_bytes(keys));
    CHECK_OK(kvq_codec_quantize_rows(keys, x, N, rows, 0));
    CHECK_OK(kvq_codec_dequantize_rows(keys, rows, N, y, 0));
    CHECK(relative_l2(y, x, N * D) < 0.01); /* 8-bit round trip */

    /* Scores of the prepared queries equal dot products with the dequantized rows, up to the query's
     * own 8-bit rounding. */
    uint8_t* prep = malloc(NQ * kvq_codec_query_bytes(keys));
    static float scores[NQ * N], dots[NQ * N];
    CHECK_OK(kvq_codec_prepare_queries(keys, q, NQ, prep));
    CHECK_OK(kvq_codec_score_rows(keys, prep, NQ, rows, N, scores, N, 0));
    for (int i = 0; i < NQ; ++i) {
        for (int r = 0; r < N; ++r) {
            float s = 0;
            for (int j = 0; j < D; ++j) s += q[i * D + j] * y[r * D + j];
            dots[i * N + r] = s;
        }
    }
    CHECK(relative_l2(scores, dots, NQ * N) < 0.01);

    /* accumulate + finish equals the weighted sum of dequantized value rows (rotation undone). */
    uint8_t* vrows = malloc(N * kvq_codec_row_bytes(values));
    static float vy[N * D], acc[NQ * D], expect[NQ * D], w[NQ * N];
    CHECK_OK(kvq_codec_quantize_rows(values, x, N, vrows, 0));
    CHECK_OK(kvq_codec_dequantize_rows(values, vrows, N, vy, 0));
    fill_gaussian(w, NQ * N, 3);
    memset(acc, 0, sizeof acc);
    CHECK_OK(kvq_codec_accumulate_rows(values, w, N, NQ, vrows, N, acc, 0));
    CHECK_OK(kvq_codec_finish_accumulate(values, acc, NQ));
    for (int i = 0; i < NQ; ++i) {
        for (int j = 0; j < D; ++j) {
            float s = 0;
            for (int r = 0; r < N; ++r) s += w[i * N + r] * vy[r * D + j];
            expect[i * D + j] = s;
        }
    }
    CHECK(relative_l2(acc, expect, NQ * D) < 1e-5);

    /* Errors change nothing: the destination keeps its bytes. */
    const size_t row_bytes = kvq_codec_row_bytes(keys);
    uint8_t* before = malloc(N * row_bytes);
    memcpy(before, rows, N * row_bytes);
    x[5 * D + 7] = NAN;
    CHECK_STATUS(kvq_codec_quantize_rows(keys, x, N, rows, 0), KVQ_ERR_NON_FINITE, "not finite");
    x[5 * D + 7] = INFINITY;
    CHECK_STATUS(kvq_codec_quantize_rows(keys, x, N, rows, 0), KVQ_ERR_NON_FINITE, "not finite");
    x[5 * D + 7] = 0.0f;
    CHECK_STATUS(kvq_codec_quantize_rows(keys, x, N, rows, row_bytes - 1), KVQ_ERR_INVALID_ARGUMENT, "stride");
    CHECK(memcmp(before, rows, N * row_bytes) == 0);
    q[3] = NAN;
    CHECK_STATUS(kvq_codec_prepare_queries(keys, q, NQ, prep), KVQ_ERR_NON_FINITE, "not finite");
    q[3] = 0.5f;
    CHECK_STATUS(kvq_codec_score_rows(keys, prep, NQ, rows, N, scores, N - 1, 0), KVQ_ERR_INVALID_ARGUMENT,
                 "score_stride");
    CHECK_STATUS(kvq_codec_quantize_rows(NULL, x, N, rows, 0), KVQ_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_STATUS(kvq_codec_dequantize_rows(keys, NULL, N, y, 0), KVQ_ERR_INVALID_ARGUMENT, "null pointer");

    free(before);
    free(vrows);
    free(prep);
    free(rows);
    kvq_codec_destroy(keys);
    kvq_codec_destroy(values);
    kvq_codec_destroy(NULL);
}

/* Float attention of n_heads query heads over rows laid out [token][kv head][D]. */
static void float_attention(const float* q, int n_heads, int n_kv_heads, const float* k, const float* v,
                            size_t n_tokens, float* out) {
    const int g = n_heads / n_kv_heads;
    float* w = malloc(n_tokens * sizeof(float));
    for (int h = 0; h < n_heads; ++h) {
        const int j = h / g;
        float m = -INFINITY, sum = 0;
        for (size_t t = 0; t < n_tokens; ++t) {
            float s = 0;
            for (int i = 0; i < D; ++i) s += q[h * D + i] * k[(t * n_kv_heads + j) * D + i];
            w[t] = s / sqrtf((float)D);
            m = fmaxf(m, w[t]);
        }
        for (size_t t = 0; t < n_tokens; ++t) sum += (w[t] = expf(w[t] - m));
        for (int i = 0; i < D; ++i) {
            float o = 0;
            for (size_t t = 0; t < n_tokens; ++t) o += w[t] * v[(t * n_kv_heads + j) * D + i];
            out[h * D + i] = o / sum;
        }
    }
    free(w);
}

static void test_attend_rows(void) {
    enum { T = 600, KV = 2, H = 6 }; /* more tokens than one chunk of the online softmax */
    kvq_codec *keys, *values;
    CHECK_OK(kvq_codec_create("f32", D, KVQ_DEFAULT_SEED, &keys));
    CHECK_OK(kvq_codec_create("q4_1+rot", D, KVQ_DEFAULT_SEED, &values));
    float* k = malloc(sizeof(float) * T * KV * D);
    float* v = malloc(sizeof(float) * T * KV * D);
    float* v_deq = malloc(sizeof(float) * T * KV * D);
    static float q[H * D], out[H * D], ref[H * D];
    fill_gaussian(k, (size_t)T * KV * D, 4);
    fill_gaussian(v, (size_t)T * KV * D, 5);
    fill_gaussian(q, H * D, 6);
    uint8_t* krows = malloc((size_t)T * KV * kvq_codec_row_bytes(keys));
    uint8_t* vrows = malloc((size_t)T * KV * kvq_codec_row_bytes(values));
    CHECK_OK(kvq_codec_quantize_rows(keys, k, (size_t)T * KV, krows, 0));
    CHECK_OK(kvq_codec_quantize_rows(values, v, (size_t)T * KV, vrows, 0));
    CHECK_OK(kvq_codec_dequantize_rows(values, vrows, (size_t)T * KV, v_deq, 0));
    CHECK_OK(kvq_attend_rows(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, 0.0f, out));
    float_attention(q, H, KV, k, v_deq, T, ref);
    CHECK(relative_l2(out, ref, H * D) < 1e-4); /* f32 keys: the same softmax, the same value rows */

    for (int i = 0; i < H * D; ++i) out[i] = 7.0f;
    CHECK_STATUS(kvq_attend_rows(keys, values, 5, KV, q, krows, 0, 0, vrows, 0, 0, T, 0.0f, out),
                 KVQ_ERR_INVALID_ARGUMENT, "multiple of n_kv_heads");
    q[1] = NAN;
    CHECK_STATUS(kvq_attend_rows(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, 0.0f, out),
                 KVQ_ERR_NON_FINITE, "not finite");
    CHECK(out[0] == 7.0f && out[H * D - 1] == 7.0f);
    q[1] = 0.0f;
    CHECK_OK(kvq_attend_rows(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, 0, 0.0f, out));
    CHECK(out[0] == 0.0f && out[H * D - 1] == 0.0f);

    kvq_codec* wide;
    CHECK_OK(kvq_codec_create("q8_0", 2 * D, KVQ_DEFAULT_SEED, &wide));
    CHECK_STATUS(kvq_attend_rows(wide, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, 0.0f, out),
                 KVQ_ERR_BAD_HEAD_DIM, "head_dim");
    kvq_codec_destroy(wide);
    free(k);
    free(v);
    free(v_deq);
    free(krows);
    free(vrows);
    kvq_codec_destroy(keys);
    kvq_codec_destroy(values);
}

/* The message is per thread: another thread's failure does not replace this thread's. */
static void* fail_in_other_thread(void* arg) {
    (void)arg;
    int32_t id;
    kvq_codec_lookup("other-thread-codec", &id);
    return (void*)(strstr(kvq_last_error(), "other-thread-codec") != NULL ? (void*)1 : NULL);
}

static void test_last_error(void) {
    int32_t id;
    CHECK_STATUS(kvq_codec_lookup("main-thread-codec", &id), KVQ_ERR_UNKNOWN_CODEC, "main-thread-codec");
    CHECK_OK(kvq_codec_lookup("q8_0", &id)); /* success leaves the message alone */
    CHECK(strstr(kvq_last_error(), "main-thread-codec") != NULL);
    pthread_t thread;
    void* other_saw_its_own = NULL;
    CHECK(pthread_create(&thread, NULL, fail_in_other_thread, NULL) == 0);
    CHECK(pthread_join(thread, &other_saw_its_own) == 0);
    CHECK(other_saw_its_own != NULL);
    CHECK(strstr(kvq_last_error(), "main-thread-codec") != NULL);
}

/* ---- the cache through its whole life, with every error status ---- */

enum { L = 2, KVH = 2, QH = 4, BT = 8 };

static kvq_cache_params small_params(void) {
    kvq_cache_params p = kvq_cache_params_default();
    p.n_layers = L;
    p.n_kv_heads = KVH;
    p.n_heads = QH;
    p.head_dim = D;
    p.key_codec = "q8_0";
    p.value_codec = "q4_0";
    p.block_tokens = BT;
    p.seal = KVQ_SEAL_ON_APPEND;
    return p;
}

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
    p.key_codec = "q9_9";
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_UNKNOWN_CODEC, "q9_9");
    p = small_params();
    p.value_codec = "q4_0:bits=3";
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "bits=3");
    p = small_params();
    p.head_dim = 48;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_HEAD_DIM, "48");
    p = small_params();
    p.size = sizeof(kvq_cache_params) - 8;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_INVALID_ARGUMENT, "sizeof");
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
    CHECK(kvq_cache_bytes_used(cache) == stats.blocks_used * stats.block_bytes);
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

int main(void) {
    test_version();
    test_codec_table();
    test_codec_rows();
    test_attend_rows();
    test_last_error();
    test_cache_params_errors();
    test_cache_life();
    return check_report("test_capi");
}
