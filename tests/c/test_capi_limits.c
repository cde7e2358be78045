/* The range and NaN rules through the C API (compiled as C11): a finite value beyond what a codec can
 * store (its fp16 scale or norm would overflow) is KVQ_ERR_INVALID_ARGUMENT naming the row and the
 * limit, with nothing written; under KVQ_NAN_PROPAGATE non-finite keys and values are stored and the
 * heads that read them attend to NaN, while other sequences and kv heads stay finite. */
#define _POSIX_C_SOURCE 200809L /* getpid */
#include <kvq/kvq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "helpers.h"

enum { N = 4, KVH = 2, QH = 4, BT = 8 };

/* A codec rejects row `bad` when its value `at` is `big`, names the limit, and leaves dst as it was. */
static void expect_range_error(const char* spec, float big, const char* fragment) {
    kvq_codec* c;
    CHECK_OK(kvq_codec_create(spec, D, KVQ_DEFAULT_SEED, &c));
    float x[N * D];
    fill_gaussian(x, N * D, 31);
    const size_t rb = kvq_codec_row_bytes(c);
    uint8_t* dst = malloc(N * rb);
    uint8_t* before = malloc(N * rb);
    memset(dst, 0x5A, N * rb);
    memcpy(before, dst, N * rb);
    x[2 * D + 9] = big;
    CHECK_STATUS(kvq_codec_quantize_rows(c, x, N, dst, 0), KVQ_ERR_INVALID_ARGUMENT, fragment);
    CHECK_STATUS(kvq_codec_quantize_rows(c, x, N, dst, 0), KVQ_ERR_INVALID_ARGUMENT, "row 2");
    CHECK(memcmp(dst, before, N * rb) == 0);
    x[2 * D + 9] = -big;
    CHECK_STATUS(kvq_codec_quantize_rows(c, x, N, dst, 0), KVQ_ERR_INVALID_ARGUMENT, fragment);
    CHECK(memcmp(dst, before, N * rb) == 0);
    x[2 * D + 9] = 1.0f;
    CHECK_OK(kvq_codec_quantize_rows(c, x, N, dst, 0));
    CHECK(memcmp(dst, before, N * rb) != 0);
    free(before);
    free(dst);
    kvq_codec_destroy(c);
}

static void test_codec_ranges(void) {
    /* fp16 stores values up to 65504; q8_0's scale amax/127 overflows past 127 · 65504. */
    expect_range_error("f16", 1.0e5f, "beyond the codec's range");
    expect_range_error("q8_0", 1.0e7f, "beyond the codec's range");
    expect_range_error("q4_0", 1.0e6f, "beyond the codec's range");
    /* Rotating codecs bound the row's L2 norm: a rotated coordinate can be as large as the norm. */
    expect_range_error("q8_0+rot", 1.0e7f, "norm");
    expect_range_error("turbo4", 1.0e30f, "norm");

    /* f32 stores every finite value; the largest round-trips exactly. */
    kvq_codec* f32;
    CHECK_OK(kvq_codec_create("f32", D, KVQ_DEFAULT_SEED, &f32));
    float x[D], y[D];
    fill_gaussian(x, D, 32);
    x[0] = 3.4028235e38f;
    x[1] = -3.4028235e38f;
    uint8_t row[D * 4];
    CHECK_OK(kvq_codec_quantize_rows(f32, x, 1, row, 0));
    CHECK_OK(kvq_codec_dequantize_rows(f32, row, 1, y, 0));
    CHECK(memcmp(x, y, sizeof x) == 0);
    kvq_codec_destroy(f32);
}

static kvq_cache* make_cache(int32_t nan_policy, size_t max_blocks) {
    kvq_cache_params p = test_cache_params(1, KVH, QH, BT);
    p.nan_policy = nan_policy;
    p.max_blocks = max_blocks;
    kvq_cache* cache = NULL;
    CHECK_OK(kvq_cache_create(&p, &cache));
    return cache;
}

static int same_stats(const kvq_pool_stats* a, const kvq_pool_stats* b) {
    return a->blocks_total == b->blocks_total && a->blocks_used == b->blocks_used &&
           a->blocks_shared == b->blocks_shared && a->block_bytes == b->block_bytes;
}

/* Under reject, an out-of-range key or value changes no sequence and no accounting. */
static void test_cache_range_reject(void) {
    kvq_cache* cache = make_cache(KVQ_NAN_REJECT, 0);
    int64_t seq;
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    float k[3 * KVH * D], v[3 * KVH * D], q[QH * D], out[QH * D], again[QH * D];
    fill_gaussian(k, 3 * KVH * D, 33);
    fill_gaussian(v, 3 * KVH * D, 34);
    fill_gaussian(q, QH * D, 35);
    CHECK_OK(kvq_cache_append(cache, 0, seq, k, v, 2));
    CHECK_OK(kvq_cache_attend(cache, 0, seq, q, out));
    kvq_pool_stats before = kvq_pool_stats_init(), after = kvq_pool_stats_init();
    CHECK_OK(kvq_cache_pool_stats(cache, &before));

    k[2 * KVH * D + 5] = 2.0e7f; /* the third token's key: beyond q8_0's range */
    CHECK_STATUS(kvq_cache_append(cache, 0, seq, k, v, 3), KVQ_ERR_INVALID_ARGUMENT,
                 "k of token 2, kv head 0 is beyond the key codec's range");
    k[2 * KVH * D + 5] = 0.0f;
    v[2 * KVH * D + D + 1] = -5.0e6f; /* a value beyond q4_0's */
    CHECK_STATUS(kvq_cache_append(cache, 0, seq, k, v, 3), KVQ_ERR_INVALID_ARGUMENT,
                 "v of token 2, kv head 1 is beyond the value codec's range");
    v[2 * KVH * D + D + 1] = 0.0f;

    size_t n = 0;
    CHECK_OK(kvq_cache_n_tokens(cache, seq, 0, &n));
    CHECK(n == 2);
    CHECK_OK(kvq_cache_pool_stats(cache, &after));
    CHECK(same_stats(&before, &after));
    CHECK_OK(kvq_cache_attend(cache, 0, seq, q, again));
    CHECK(memcmp(out, again, sizeof out) == 0);
    kvq_cache_destroy(cache);
}

/* Under propagate, a NaN value is stored: the query heads of its kv head attend to NaN, the other kv
 * head's heads and another sequence stay finite; a NaN query gives NaN output rather than an error. */
static void test_cache_nan_propagate(void) {
    kvq_cache* cache = make_cache(KVQ_NAN_PROPAGATE, 0);
    int64_t a, b;
    CHECK_OK(kvq_cache_add_sequence(cache, &a));
    CHECK_OK(kvq_cache_add_sequence(cache, &b));
    float k[KVH * D], v[KVH * D], q[QH * D], out[QH * D];
    fill_gaussian(k, KVH * D, 36);
    fill_gaussian(v, KVH * D, 37);
    fill_gaussian(q, QH * D, 38);
    CHECK_OK(kvq_cache_append(cache, 0, b, k, v, 1));
    v[D + 3] = NAN; /* kv head 1's value */
    CHECK_OK(kvq_cache_append(cache, 0, a, k, v, 1));
    size_t n = 0;
    CHECK_OK(kvq_cache_n_tokens(cache, a, 0, &n));
    CHECK(n == 1);

    CHECK_OK(kvq_cache_attend(cache, 0, a, q, out));
    const int g = QH / KVH;
    int finite_head0 = 1, nan_head1 = 1;
    for (int h = 0; h < QH; ++h) {
        for (int i = 0; i < D; ++i) {
            if (h < g) finite_head0 &= isfinite(out[h * D + i]) != 0;
        }
        if (h >= g) nan_head1 &= isnan(out[h * D + 3]) != 0;
    }
    CHECK(finite_head0);
    CHECK(nan_head1);

    CHECK_OK(kvq_cache_attend(cache, 0, b, q, out));
    int all_finite = 1;
    for (int i = 0; i < QH * D; ++i) all_finite &= isfinite(out[i]) != 0;
    CHECK(all_finite);

    q[0] = INFINITY; /* query head 0 */
    CHECK_OK(kvq_cache_attend(cache, 0, b, q, out));
    CHECK(isnan(out[0]));
    CHECK(isfinite(out[(QH - 1) * D]));
    kvq_cache_destroy(cache);
}

/* Layers with codecs of their own: each layer's codecs, attention as a one-layer cache of those codecs
 * gives, a byte limit that holds, and a file that keeps them. */
static void test_layer_codecs(void) {
    const char* keys[2] = {NULL, "q4_0"};
    const char* values[2] = {NULL, "f16"};
    kvq_cache_params p = test_cache_params(2, KVH, QH, BT);
    p.layer_key_codecs = keys;
    p.layer_value_codecs = values;
    p.n_layer_codecs = 2;
    kvq_cache* cache;
    CHECK_OK(kvq_cache_create(&p, &cache));
    CHECK(kvq_codec_row_bytes(kvq_cache_layer_key_codec(cache, 0)) == kvq_codec_row_bytes(kvq_cache_key_codec(cache)));
    CHECK(kvq_codec_row_bytes(kvq_cache_layer_key_codec(cache, 1)) != kvq_codec_row_bytes(kvq_cache_key_codec(cache)));
    CHECK(kvq_cache_layer_value_codec(cache, 2) == NULL);
    CHECK(kvq_cache_layer_key_codec(NULL, 0) == NULL);

    kvq_cache_params one = test_cache_params(1, KVH, QH, BT);
    one.key_codec = "q4_0";
    one.value_codec = "f16";
    kvq_cache* alone;
    CHECK_OK(kvq_cache_create(&one, &alone));
    float k[20 * KVH * D], v[20 * KVH * D], q[QH * D], out[QH * D], want[QH * D];
    fill_gaussian(k, 20 * KVH * D, 41);
    fill_gaussian(v, 20 * KVH * D, 42);
    fill_gaussian(q, QH * D, 43);
    int64_t s, t;
    CHECK_OK(kvq_cache_add_sequence(cache, &s));
    CHECK_OK(kvq_cache_add_sequence(alone, &t));
    CHECK_OK(kvq_cache_append(cache, 0, s, k, v, 20));
    CHECK_OK(kvq_cache_append(cache, 1, s, k, v, 20));
    CHECK_OK(kvq_cache_append(alone, 0, t, k, v, 20));
    CHECK_OK(kvq_cache_attend(cache, 1, s, q, out));
    CHECK_OK(kvq_cache_attend(alone, 0, t, q, want));
    CHECK(memcmp(out, want, sizeof out) == 0);

    kvq_pool_stats st = kvq_pool_stats_init();
    CHECK_OK(kvq_cache_pool_stats(cache, &st));
    CHECK(st.blocks_used == 6);
    CHECK(st.bytes_used > 3 * st.block_bytes); /* layer 1's blocks are larger (f16 values) */
    CHECK(kvq_cache_bytes_used(cache) >= st.bytes_used);

    /* Saved and loaded with a byte limit the file fits in, and one it does not. */
    /* One file per process: the test runs once per SIMD level, in parallel. */
    char path[256];
    const char* tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/kvq_capi_layer_codecs_%ld.kvq", tmp ? tmp : "/tmp", (long)getpid());
    CHECK_OK(kvq_cache_save(cache, path, -1));
    kvq_cache* back;
    /* The limit counts the bookkeeping too (sequence state, block tables): all of bytes_used. */
    const size_t everything = kvq_cache_bytes_used(cache);
    CHECK_OK(kvq_cache_load_bounded(path, 0, everything, 1, &back));
    CHECK(kvq_codec_row_bytes(kvq_cache_layer_value_codec(back, 1)) == kvq_codec_row_bytes(kvq_cache_value_codec(alone)));
    float again[QH * D];
    CHECK_OK(kvq_cache_attend(back, 1, 0, q, again));
    CHECK(memcmp(out, again, sizeof out) == 0);
    kvq_cache* none = NULL;
    CHECK_STATUS(kvq_cache_load_bounded(path, 0, everything - 1, 1, &none), KVQ_ERR_POOL_EXHAUSTED, "max_bytes");
    CHECK(none == NULL);
    remove(path);
    kvq_cache_destroy(back);

    /* max_bytes: two of layer 1's blocks and a sequence's bookkeeping (below 1 KiB: 2 layers, 2 table
     * entries); the third block is refused and nothing changes. */
    kvq_pool_stats one_st = kvq_pool_stats_init();
    CHECK_OK(kvq_cache_pool_stats(alone, &one_st));
    kvq_cache_params bounded = p;
    bounded.max_bytes = 2 * one_st.block_bytes + 64 + 1024;
    CHECK(one_st.block_bytes > 64 + 1024);
    kvq_cache* small;
    CHECK_OK(kvq_cache_create(&bounded, &small));
    int64_t a;
    CHECK_OK(kvq_cache_add_sequence(small, &a));
    CHECK_STATUS(kvq_cache_append(small, 1, a, k, v, 20), KVQ_ERR_POOL_EXHAUSTED, "max_bytes");
    size_t n = 1;
    CHECK_OK(kvq_cache_n_tokens(small, a, 1, &n));
    CHECK(n == 0);
    CHECK_OK(kvq_cache_append(small, 1, a, k, v, 16));
    kvq_pool_stats sb = kvq_pool_stats_init();
    CHECK_OK(kvq_cache_pool_stats(small, &sb));
    CHECK(sb.max_bytes == bounded.max_bytes);
    CHECK(sb.bytes_total + sb.bytes_reserved <= sb.max_bytes);

    /* A count that is neither 0 nor n_layers, and an unknown codec in a layer. */
    kvq_cache* bad = NULL;
    p.n_layer_codecs = 1;
    CHECK_STATUS(kvq_cache_create(&p, &bad), KVQ_ERR_BAD_PARAMS, "n_layer_codecs");
    p.n_layer_codecs = 2;
    keys[1] = "q9_9";
    CHECK_STATUS(kvq_cache_create(&p, &bad), KVQ_ERR_UNKNOWN_CODEC, "q9_9");
    CHECK(bad == NULL);
    kvq_cache_destroy(small);
    kvq_cache_destroy(alone);
    kvq_cache_destroy(cache);
}

int main(void) {
    test_layer_codecs();
    test_codec_ranges();
    test_cache_range_reject();
    test_cache_nan_propagate();
    return check_report("test_capi_limits");
}
