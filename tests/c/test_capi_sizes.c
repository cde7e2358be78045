/* Every size, count and stride of every C entry point at its extremes (issue #36, item 3), compiled as
 * C11: a size whose buffer cannot exist (its arithmetic passes PTRDIFF_MAX or wraps) is
 * KVQ_ERR_INVALID_ARGUMENT before the caller's buffers are read (the buffers here are small: ASan sees any
 * read past them), the outputs are untouched, and the same call with sizes that fit gives the right
 * result. docs/reliability.md lists the entry points and their size arithmetic. */
#include <kvq/kvq.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "helpers.h"

#define SENTINEL 12345.0f
#define N_HUGE 6
#define N_BEYOND 4
/* Counts and strides no buffer can hold. The first N_BEYOND are beyond PTRDIFF_MAX by themselves; the
 * others only as a count of rows (or times two: 3 rows are 2 strides). */
static const size_t huge[N_HUGE] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX / 2 + 1, (size_t)PTRDIFF_MAX + 1,
                                    (size_t)1 << 62, SIZE_MAX / 3};

static int untouched(const float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (x[i] != SENTINEL) return 0;
    }
    return 1;
}

static void fill(float* x, size_t n, float value) {
    for (size_t i = 0; i < n; ++i) x[i] = value;
}

static int bytes_untouched(const unsigned char* x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (x[i] != 0xA5) return 0;
    }
    return 1;
}

enum { ROWS = 4, NQ = 2 };

/* quantize_rows, dequantize_rows: n_rows and the stride. */
static void test_rows_sizes(void) {
    kvq_codec* c = NULL;
    CHECK_OK(kvq_codec_create("q8_0", D, KVQ_DEFAULT_SEED, &c));
    const size_t rb = kvq_codec_row_bytes(c);
    float x[ROWS * D], y[ROWS * D];
    fill_gaussian(x, ROWS * D, 1);
    unsigned char* rows = malloc(ROWS * rb);
    for (int i = 0; i < N_HUGE; ++i) {
        memset(rows, 0xA5, ROWS * rb);
        CHECK_STATUS(kvq_codec_quantize_rows(c, x, huge[i], rows, 0), KVQ_ERR_INVALID_ARGUMENT, "overflow");
        CHECK_STATUS(kvq_codec_quantize_rows(c, x, 3, rows, huge[i]), KVQ_ERR_INVALID_ARGUMENT, "overflow");
        CHECK(bytes_untouched(rows, ROWS * rb));
        fill(y, ROWS * D, SENTINEL);
        CHECK_STATUS(kvq_codec_dequantize_rows(c, rows, huge[i], y, 0), KVQ_ERR_INVALID_ARGUMENT, "overflow");
        CHECK_STATUS(kvq_codec_dequantize_rows(c, rows, 3, y, huge[i]), KVQ_ERR_INVALID_ARGUMENT, "overflow");
        CHECK(untouched(y, ROWS * D));
    }
    /* One row: its stride is never used, so any stride is fine, and the row is right. */
    CHECK_OK(kvq_codec_quantize_rows(c, x, 1, rows, SIZE_MAX));
    CHECK_OK(kvq_codec_dequantize_rows(c, rows, 1, y, SIZE_MAX));
    CHECK(relative_l2(y, x, D) < 0.01);
    free(rows);
    kvq_codec_destroy(c);
}

/* prepare_queries, score_rows, accumulate_rows, finish_accumulate: n_q, n_rows and every stride. */
static void test_score_and_accumulate_sizes(void) {
    const char* specs[] = {"q8_0", "q4_0+rot", "polar", "turbo3", "tcq3"};
    for (size_t s = 0; s < sizeof specs / sizeof specs[0]; ++s) {
        kvq_codec* c = NULL;
        CHECK_OK(kvq_codec_create(specs[s], D, KVQ_DEFAULT_SEED, &c));
        const size_t rb = kvq_codec_row_bytes(c), qb = kvq_codec_query_bytes(c);
        float x[ROWS * D], q[NQ * D], w[NQ * ROWS], scores[NQ * ROWS], acc[NQ * D];
        fill_gaussian(x, ROWS * D, 2);
        fill_gaussian(q, NQ * D, 3);
        fill_gaussian(w, NQ * ROWS, 4);
        unsigned char* rows = malloc(ROWS * rb);
        unsigned char* prep = malloc(NQ * qb);
        CHECK_OK(kvq_codec_quantize_rows(c, x, ROWS, rows, 0));
        CHECK_OK(kvq_codec_prepare_queries(c, q, NQ, prep));
        CHECK_STATUS(kvq_codec_prepare_queries(c, q, -1, prep), KVQ_ERR_INVALID_ARGUMENT, "negative");
        CHECK_STATUS(kvq_codec_prepare_queries(c, q, INT32_MIN, prep), KVQ_ERR_INVALID_ARGUMENT, "negative");
        for (int i = 0; i < N_HUGE; ++i) {
            fill(scores, NQ * ROWS, SENTINEL);
            /* n_rows near SIZE_MAX (it segfaulted), a row stride, a score stride. */
            CHECK_STATUS(kvq_codec_score_rows(c, prep, NQ, rows, huge[i], scores, huge[i], 0), KVQ_ERR_INVALID_ARGUMENT,
                         "overflow");
            CHECK_STATUS(kvq_codec_score_rows(c, prep, 1, rows, huge[i], scores, 0, 0), KVQ_ERR_INVALID_ARGUMENT,
                         "overflow");
            CHECK_STATUS(kvq_codec_score_rows(c, prep, 1, rows, 3, scores, 0, huge[i]), KVQ_ERR_INVALID_ARGUMENT,
                         "overflow");
            CHECK_STATUS(kvq_codec_score_rows(c, prep, NQ, rows, ROWS, scores, huge[i], 0), KVQ_ERR_INVALID_ARGUMENT,
                         "overflow");
            CHECK(untouched(scores, NQ * ROWS));
            fill(acc, NQ * D, SENTINEL);
            CHECK_STATUS(kvq_codec_accumulate_rows(c, w, huge[i], NQ, rows, huge[i], acc, 0), KVQ_ERR_INVALID_ARGUMENT,
                         "overflow");
            CHECK_STATUS(kvq_codec_accumulate_rows(c, w, 0, 1, rows, huge[i], acc, 0), KVQ_ERR_INVALID_ARGUMENT,
                         "overflow");
            CHECK_STATUS(kvq_codec_accumulate_rows(c, w, ROWS, NQ, rows, 3, acc, huge[i]), KVQ_ERR_INVALID_ARGUMENT,
                         "overflow");
            CHECK_STATUS(kvq_codec_accumulate_rows(c, w, huge[i], NQ, rows, ROWS, acc, 0), KVQ_ERR_INVALID_ARGUMENT,
                         "overflow");
            CHECK(untouched(acc, NQ * D));
        }
        CHECK_STATUS(kvq_codec_score_rows(c, prep, -1, rows, ROWS, scores, ROWS, 0), KVQ_ERR_INVALID_ARGUMENT, "negative");
        CHECK_STATUS(kvq_codec_accumulate_rows(c, w, ROWS, INT32_MIN, rows, ROWS, acc, 0), KVQ_ERR_INVALID_ARGUMENT,
                     "negative");
        CHECK_STATUS(kvq_codec_finish_accumulate(c, acc, -1), KVQ_ERR_INVALID_ARGUMENT, "negative");
        CHECK(untouched(acc, NQ * D));
        /* With one query its score stride is never used: any stride gives the scores of the rows. */
        float one[ROWS], packed[ROWS];
        CHECK_OK(kvq_codec_score_rows(c, prep, 1, rows, ROWS, packed, ROWS, 0));
        CHECK_OK(kvq_codec_score_rows(c, prep, 1, rows, ROWS, one, SIZE_MAX, 0));
        CHECK(memcmp(one, packed, sizeof one) == 0);
        fill(acc, NQ * D, 0.0f);
        CHECK_OK(kvq_codec_accumulate_rows(c, w, SIZE_MAX, 1, rows, ROWS, acc, 0));
        CHECK_OK(kvq_codec_finish_accumulate(c, acc, 1));
        float y[ROWS * D], expect[D] = {0};
        CHECK_OK(kvq_codec_dequantize_rows(c, rows, ROWS, y, 0));
        for (int r = 0; r < ROWS; ++r) {
            for (int j = 0; j < D; ++j) expect[j] += w[r] * y[r * D + j];
        }
        CHECK(relative_l2(acc, expect, D) < 1e-4);
        free(rows);
        free(prep);
        kvq_codec_destroy(c);
    }
}

/* kvq_attend_rows: n_tokens (SIZE_MAX returned KVQ_OK and zeros), token and head strides, head counts. */
static void test_attend_rows_sizes(void) {
    enum { T = 3, KV = 2, H = 4 };
    kvq_codec *kc = NULL, *vc = NULL;
    CHECK_OK(kvq_codec_create("q8_0", D, KVQ_DEFAULT_SEED, &kc));
    CHECK_OK(kvq_codec_create("q4_0", D, KVQ_DEFAULT_SEED, &vc));
    const size_t kb = kvq_codec_row_bytes(kc), vb = kvq_codec_row_bytes(vc);
    float kx[T * KV * D], vx[T * KV * D], q[H * D], out[H * D], ref[H * D];
    fill_gaussian(kx, T * KV * D, 5);
    fill_gaussian(vx, T * KV * D, 6);
    fill_gaussian(q, H * D, 7);
    unsigned char* k = malloc(T * KV * kb);
    unsigned char* v = malloc(T * KV * vb);
    CHECK_OK(kvq_codec_quantize_rows(kc, kx, T * KV, k, 0));
    CHECK_OK(kvq_codec_quantize_rows(vc, vx, T * KV, v, 0));
    CHECK_OK(kvq_attend_rows(kc, vc, H, KV, q, k, 0, 0, v, 0, 0, T, 0.0f, ref));
    for (int i = 0; i < N_HUGE; ++i) {
        fill(out, H * D, SENTINEL);
        CHECK_STATUS(kvq_attend_rows(kc, vc, H, KV, q, k, 0, 0, v, 0, 0, huge[i], 0.0f, out), KVQ_ERR_INVALID_ARGUMENT,
                     "overflow");
        CHECK_STATUS(kvq_attend_rows(kc, vc, H, KV, q, k, huge[i], 0, v, 0, 0, T, 0.0f, out), KVQ_ERR_INVALID_ARGUMENT,
                     "overflow");
        CHECK_STATUS(kvq_attend_rows(kc, vc, H, KV, q, k, 0, 0, v, huge[i], 0, T, 0.0f, out), KVQ_ERR_INVALID_ARGUMENT,
                     "overflow");
        if (i < N_BEYOND) { /* a head stride is taken once (2 kv heads) */
            CHECK_STATUS(kvq_attend_rows(kc, vc, H, KV, q, k, 0, huge[i], v, 0, 0, T, 0.0f, out),
                         KVQ_ERR_INVALID_ARGUMENT, "overflow");
            CHECK_STATUS(kvq_attend_rows(kc, vc, H, KV, q, k, 0, 0, v, 0, huge[i], T, 0.0f, out),
                         KVQ_ERR_INVALID_ARGUMENT, "overflow");
        }
        CHECK(untouched(out, H * D));
    }
    CHECK_STATUS(kvq_attend_rows(kc, vc, INT32_MIN, KV, q, k, 0, 0, v, 0, 0, T, 0.0f, out), KVQ_ERR_INVALID_ARGUMENT,
                 "n_heads");
    CHECK_STATUS(kvq_attend_rows(kc, vc, H, INT32_MIN, q, k, 0, 0, v, 0, 0, T, 0.0f, out), KVQ_ERR_INVALID_ARGUMENT,
                 "n_heads");
    CHECK(untouched(out, H * D));
    /* One token: its token stride is never used, so SIZE_MAX is fine and gives the first token's attention
     * (the packed rows' first token). */
    float first[H * D];
    CHECK_OK(kvq_attend_rows(kc, vc, H, KV, q, k, SIZE_MAX, 0, v, SIZE_MAX, 0, 1, 0.0f, out));
    CHECK_OK(kvq_attend_rows(kc, vc, H, KV, q, k, 0, 0, v, 0, 0, 1, 0.0f, first));
    CHECK(memcmp(out, first, sizeof out) == 0);
    free(k);
    free(v);
    kvq_codec_destroy(kc);
    kvq_codec_destroy(vc);
}

enum { KVH = 2, QH = 4, BT = 8 };

/* The cache's sizes: append, attend_prefill, attend_batch, truncate, sequences, and the pool's fields. */
static void test_cache_sizes(void) {
    kvq_cache_params p = test_cache_params(1, KVH, QH, BT);
    kvq_cache* cache = NULL;
    CHECK_OK(kvq_cache_create(&p, &cache));
    int64_t seq;
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    float k[3 * KVH * D], v[3 * KVH * D], q[QH * D], out[QH * D], ref[QH * D];
    fill_gaussian(k, 3 * KVH * D, 8);
    fill_gaussian(v, 3 * KVH * D, 9);
    fill_gaussian(q, QH * D, 10);
    CHECK_OK(kvq_cache_append(cache, 0, seq, k, v, 3));
    CHECK_OK(kvq_cache_attend(cache, 0, seq, q, ref));
    const size_t used = kvq_cache_bytes_used(cache);
    for (int i = 0; i < N_HUGE; ++i) {
        CHECK_STATUS(kvq_cache_append(cache, 0, seq, k, v, huge[i]), KVQ_ERR_INVALID_ARGUMENT, "overflow");
        fill(out, QH * D, SENTINEL);
        CHECK_STATUS(kvq_cache_attend_prefill(cache, 0, seq, q, huge[i], out), KVQ_ERR_INVALID_ARGUMENT, "queries");
        /* n_seqs: refused before seqs (one id here) is read past its end. */
        CHECK_STATUS(kvq_cache_attend_batch(cache, 0, &seq, huge[i], q, out), KVQ_ERR_INVALID_ARGUMENT, "overflow");
        CHECK(untouched(out, QH * D));
        CHECK_STATUS(kvq_cache_truncate(cache, seq, huge[i]), KVQ_ERR_INVALID_ARGUMENT, "cannot keep");
    }
    /* A count of ids that fits in memory but names more sequences than seqs holds cannot be told apart
     * from a real array; 2^61 ids (2^64 bytes) can. */
    CHECK_STATUS(kvq_cache_attend_batch(cache, 0, &seq, (size_t)1 << 61, q, out), KVQ_ERR_INVALID_ARGUMENT, "seqs");
    size_t n = 0;
    CHECK_OK(kvq_cache_n_tokens(cache, seq, 0, &n));
    CHECK(n == 3);
    CHECK(kvq_cache_bytes_used(cache) == used);
    CHECK_OK(kvq_cache_attend_batch(cache, 0, &seq, 1, q, out));
    CHECK(memcmp(out, ref, sizeof out) == 0);
    /* capacity only bounds what is written: SIZE_MAX with room for the one id there is. */
    int64_t ids[1] = {-7};
    size_t count = 0;
    CHECK_OK(kvq_cache_sequences(cache, ids, SIZE_MAX, &count));
    CHECK(count == 1 && ids[0] == seq);
    CHECK_STATUS(kvq_cache_n_tokens(cache, seq, INT32_MAX, &n), KVQ_ERR_BAD_LAYER, "layer");
    CHECK_STATUS(kvq_cache_n_tokens(cache, seq, INT32_MIN, &n), KVQ_ERR_BAD_LAYER, "layer");
    CHECK(kvq_cache_layer_key_codec(cache, INT32_MAX) == NULL && kvq_cache_layer_value_codec(cache, INT32_MIN) == NULL);
    kvq_cache_destroy(cache);

    /* The pool's counts: a pool has at most 2^32 - 1 blocks (32-bit ids); grow_blocks = SIZE_MAX made every
     * append fail with KVQ_ERR_OUT_OF_MEMORY. max_blocks and max_bytes are limits: SIZE_MAX is no limit. */
    const size_t too_many[] = {SIZE_MAX, (size_t)UINT32_MAX + 1, (size_t)1 << 62};
    for (size_t i = 0; i < sizeof too_many / sizeof too_many[0]; ++i) {
        kvq_cache_params bad = p;
        bad.grow_blocks = too_many[i];
        CHECK_STATUS(kvq_cache_create(&bad, &cache), KVQ_ERR_BAD_PARAMS, "grow_blocks");
        bad = p;
        bad.initial_blocks = too_many[i];
        CHECK_STATUS(kvq_cache_create(&bad, &cache), KVQ_ERR_BAD_PARAMS, "initial_blocks");
        bad.max_blocks = SIZE_MAX;
        CHECK_STATUS(kvq_cache_create(&bad, &cache), KVQ_ERR_BAD_PARAMS, "initial_blocks");
        bad = p;
        bad.n_sliding_window = too_many[i];
        bad.sliding_window = (const int32_t[]){0};
        CHECK_STATUS(kvq_cache_create(&bad, &cache), KVQ_ERR_BAD_PARAMS, "n_sliding_window");
        bad = p;
        bad.n_layer_codecs = too_many[i];
        CHECK_STATUS(kvq_cache_create(&bad, &cache), KVQ_ERR_BAD_PARAMS, "n_layer_codecs");
    }
    kvq_cache_params big = p;
    big.max_blocks = SIZE_MAX;
    big.max_bytes = SIZE_MAX;
    big.initial_blocks = 2;
    CHECK_OK(kvq_cache_create(&big, &cache));
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    CHECK_OK(kvq_cache_append(cache, 0, seq, k, v, 3));
    CHECK_OK(kvq_cache_attend(cache, 0, seq, q, out));
    CHECK(memcmp(out, ref, sizeof out) == 0);
    kvq_cache_destroy(cache);
    kvq_cache_params ints = p;
    ints.block_tokens = INT32_MAX;
    CHECK_STATUS(kvq_cache_create(&ints, &cache), KVQ_ERR_BAD_PARAMS, "block_tokens");
    ints = p;
    ints.head_dim = INT32_MAX;
    CHECK_STATUS(kvq_cache_create(&ints, &cache), KVQ_ERR_BAD_HEAD_DIM, "head_dim");
    ints = p;
    ints.threads = INT32_MAX;
    CHECK_STATUS(kvq_cache_create(&ints, &cache), KVQ_ERR_BAD_PARAMS, "threads");

    /* kvq_cache_load_with: grow_blocks beyond a pool's ids, refused before the file is opened. */
    kvq_load_params lp = kvq_load_params_default();
    lp.grow_blocks = SIZE_MAX;
    CHECK_STATUS(kvq_cache_load_with("/nonexistent/kvq_sizes.kvq", &lp, &cache), KVQ_ERR_INVALID_ARGUMENT, "grow_blocks");
}

/* The codec table and row sizes: ids and head sizes at the ends of int32. */
static void test_table_sizes(void) {
    kvq_codec_info info = kvq_codec_info_init();
    CHECK_STATUS(kvq_codec_get_info(INT32_MAX, &info), KVQ_ERR_UNKNOWN_CODEC, "outside");
    CHECK_STATUS(kvq_codec_get_info(INT32_MIN, &info), KVQ_ERR_UNKNOWN_CODEC, "outside");
    size_t rb = 7;
    kvq_codec* c = NULL;
    const int32_t dims[] = {INT32_MAX, INT32_MIN, -1, 0, 65537};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; ++i) {
        CHECK_STATUS(kvq_codec_spec_row_bytes("q8_0", dims[i], &rb), KVQ_ERR_BAD_HEAD_DIM, "head_dim");
        CHECK_STATUS(kvq_codec_create("polar", dims[i], KVQ_DEFAULT_SEED, &c), KVQ_ERR_BAD_HEAD_DIM, "head_dim");
    }
    CHECK(rb == 7 && c == NULL);
    /* The largest head size: row bytes as the table says. */
    CHECK_OK(kvq_codec_spec_row_bytes("q8_0", 65536, &rb));
    CHECK(rb == 65536 / 32 * 34);
    /* kvq_simd_report: capacity only bounds what is written. */
    const size_t len = kvq_simd_report(NULL, 0);
    char* text = malloc(len + 1);
    CHECK(kvq_simd_report(text, SIZE_MAX) == len && strlen(text) == len);
    free(text);
}

int main(void) {
    test_rows_sizes();
    test_score_and_accumulate_sizes();
    test_attend_rows_sizes();
    test_cache_sizes();
    test_table_sizes();
    return check_report("test_capi_sizes");
}
