/* The C API from C (compiled as C11, linked against libkvq.so): version, codec table, codecs on rows,
 * kvq_attend_rows and the thread-local error message. The cache is in test_capi_cache.c. */
#include <kvq/kvq.h>

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "helpers.h"

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
    CHECK(info.ggml_type == 2); /* GGML_TYPE_Q4_0 */
    CHECK_OK(kvq_codec_lookup("iq4_nls", &id)); /* iq4_nl's blocks (GGML_TYPE_IQ4_NL), not their reader */
    CHECK_OK(kvq_codec_get_info(id, &info));
    CHECK(info.ggml_type == 20 && info.ggml_layout == 0);
    CHECK_OK(kvq_codec_lookup("turbo4", &id));
    CHECK_OK(kvq_codec_get_info(id, &info));
    CHECK(info.ggml_type == -1 && info.ggml_layout == 0);
    /* A caller built against the first release's struct (it ended at layout): ggml_type is not written. */
    info = kvq_codec_info_init();
    info.size = offsetof(kvq_codec_info, ggml_type);
    info.ggml_type = 12345;
    CHECK_OK(kvq_codec_lookup("q4_0", &id));
    CHECK_OK(kvq_codec_get_info(id, &info));
    CHECK(info.bytes_per_block == 18 && info.ggml_type == 12345 && info.size == offsetof(kvq_codec_info, ggml_type));

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

/* A C executor: runs the parts backwards on the calling thread and counts its calls. */
static void backwards_executor(void* ctx, int32_t n, void (*task)(void*, int32_t), void* task_ctx) {
    ++*(int*)ctx;
    for (int32_t i = n - 1; i >= 0; --i) task(task_ctx, i);
}

static void test_attend_rows_ex(void) {
    enum { T = 700, KV = 2, H = 6, R = 3 };
    kvq_codec *keys, *values;
    CHECK_OK(kvq_codec_create("q8_0", D, KVQ_DEFAULT_SEED, &keys));
    CHECK_OK(kvq_codec_create("q4_0", D, KVQ_DEFAULT_SEED, &values));
    float* x = malloc(sizeof(float) * T * KV * D);
    fill_gaussian(x, (size_t)T * KV * D, 8);
    uint8_t* krows = malloc((size_t)T * KV * kvq_codec_row_bytes(keys));
    uint8_t* vrows = malloc((size_t)T * KV * kvq_codec_row_bytes(values));
    CHECK_OK(kvq_codec_quantize_rows(keys, x, (size_t)T * KV, krows, 0));
    CHECK_OK(kvq_codec_quantize_rows(values, x, (size_t)T * KV, vrows, 0));
    static float q[R * H * D], out[R * H * D], one[H * D];
    static uint16_t mask[R * T];
    fill_gaussian(q, R * H * D, 9);
    /* causal: query row i keeps tokens [0, T - R + i] (f16 0), removes the rest (f16 -inf) */
    for (int i = 0; i < R; ++i) {
        for (int t = 0; t < T; ++t) mask[i * T + t] = t <= T - R + i ? 0x0000 : 0xFC00;
    }
    kvq_attend_options o = kvq_attend_options_default();
    o.n_queries = R;
    o.mask = mask;
    o.threads = 2;
    int calls = 0;
    o.executor = backwards_executor;
    o.executor_ctx = &calls;
    CHECK_OK(kvq_attend_rows_ex(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, &o, out));
    CHECK(calls == 1);
    /* each row is the single-query attention over the tokens it keeps */
    for (int i = 0; i < R; ++i) {
        CHECK_OK(kvq_attend_rows(keys, values, H, KV, q + i * H * D, krows, 0, 0, vrows, 0, 0, (size_t)(T - R + i + 1),
                                 0.0f, one));
        CHECK(relative_l2(out + i * H * D, one, H * D) < 1e-5);
    }

    /* a sink far above every score takes all the weight: the results vanish */
    static float sinks[H];
    for (int h = 0; h < H; ++h) sinks[h] = 80.0f;
    kvq_attend_options with_sinks = o;
    with_sinks.sinks = sinks;
    CHECK_OK(kvq_attend_rows_ex(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, &with_sinks, out));
    for (int i = 0; i < R * H * D; ++i) CHECK(fabsf(out[i]) < 1e-20f);

    for (int i = 0; i < R * H * D; ++i) out[i] = 7.0f;
    CHECK_STATUS(kvq_attend_rows_ex(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, NULL, out),
                 KVQ_ERR_INVALID_ARGUMENT, "options is NULL");
    kvq_attend_options small = o;
    small.size = 8;
    CHECK_STATUS(kvq_attend_rows_ex(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, &small, out),
                 KVQ_ERR_INVALID_ARGUMENT, "size");
    kvq_attend_options bad = o;
    bad.mask_type = 5;
    CHECK_STATUS(kvq_attend_rows_ex(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, &bad, out),
                 KVQ_ERR_INVALID_ARGUMENT, "mask_type");
    bad = o;
    bad.threads = 0;
    CHECK_STATUS(kvq_attend_rows_ex(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, &bad, out),
                 KVQ_ERR_INVALID_ARGUMENT, "threads");
    bad = o;
    bad.executor = NULL;
    CHECK_STATUS(kvq_attend_rows_ex(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, &bad, out),
                 KVQ_ERR_INVALID_ARGUMENT, "executor");
    q[H * D + 3] = NAN; /* row 1 */
    CHECK_STATUS(kvq_attend_rows_ex(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, &o, out),
                 KVQ_ERR_NON_FINITE, "not finite");
    for (int i = 0; i < R * H * D; ++i) CHECK(out[i] == 7.0f);
    o.nan_policy = KVQ_NAN_PROPAGATE;
    CHECK_OK(kvq_attend_rows_ex(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, &o, out));
    CHECK(isnan(out[H * D]) && !isnan(out[0]) && !isnan(out[2 * H * D]));
    free(x);
    free(krows);
    free(vrows);
    kvq_codec_destroy(keys);
    kvq_codec_destroy(values);
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

    /* Keys of another head size than the values (MLA's 576/512, llama.cpp's 192/128): keys [k, 0] of 2·D
     * values and queries [q, anything] score as k and q do, so the result is the D-value keys' one. */
    kvq_codec* wide;
    CHECK_OK(kvq_codec_create("f32", 2 * D, KVQ_DEFAULT_SEED, &wide));
    float* k2 = calloc((size_t)T * KV * 2 * D, sizeof(float));
    static float q2[H * 2 * D], out2[H * D];
    for (size_t r = 0; r < (size_t)T * KV; ++r) memcpy(k2 + r * 2 * D, k + r * D, sizeof(float) * D);
    for (int h = 0; h < H; ++h) {
        memcpy(q2 + h * 2 * D, q + h * D, sizeof(float) * D);
        for (int j = D; j < 2 * D; ++j) q2[h * 2 * D + j] = 3.0f;
    }
    uint8_t* k2rows = malloc((size_t)T * KV * kvq_codec_row_bytes(wide));
    CHECK_OK(kvq_codec_quantize_rows(wide, k2, (size_t)T * KV, k2rows, 0));
    CHECK_OK(kvq_attend_rows(keys, values, H, KV, q, krows, 0, 0, vrows, 0, 0, T, 0.0f, out));
    CHECK_OK(kvq_attend_rows(wide, values, H, KV, q2, k2rows, 0, 0, vrows, 0, 0, T, 1.0f / sqrtf((float)D), out2));
    CHECK(relative_l2(out2, out, H * D) < 1e-6);
    free(k2rows);
    free(k2);
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

int main(void) {
    test_version();
    test_codec_table();
    test_codec_rows();
    test_attend_rows();
    test_attend_rows_ex();
    test_last_error();
    return check_report("test_capi");
}
