/* Hostile sizes and parameters through the C API (issue #15), compiled as C11: sizes that overflow are
 * KVQ_ERR_INVALID_ARGUMENT before any read of the caller's buffers, each status kvq.h documents for
 * kvq_cache_create is the one returned, configurations beyond the documented bounds are refused, and a
 * finite query too large for float scores still gives a finite output. */
#define _POSIX_C_SOURCE 200809L /* getpid, mkfifo */
#include <kvq/kvq.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "helpers.h"

enum { KVH = 2, QH = 4, BT = 16 };

static kvq_cache* small_cache(void) {
    kvq_cache_params p = test_cache_params(1, KVH, QH, BT);
    kvq_cache* cache = NULL;
    CHECK_OK(kvq_cache_create(&p, &cache));
    return cache;
}

/* n_tokens × n_kv_heads × head_dim × 4 bytes overflowing: refused before k or v is read (the buffers
 * here hold one token), and nothing changed. */
static void test_append_sizes_overflow(void) {
    kvq_cache* cache = small_cache();
    int64_t seq;
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    float k[KVH * D], v[KVH * D];
    fill_gaussian(k, KVH * D, 1);
    fill_gaussian(v, KVH * D, 2);
    const size_t used = kvq_cache_bytes_used(cache);
    const size_t huge[] = {(size_t)-1, (size_t)-1 / (KVH * D) + 1, (size_t)1 << 62, (size_t)PTRDIFF_MAX / (4 * KVH * D) + 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; ++i) {
        CHECK_STATUS(kvq_cache_append(cache, 0, seq, k, v, huge[i]), KVQ_ERR_INVALID_ARGUMENT, "overflows");
    }
    /* Sizes that fit but would take the layer past KVQ_MAX_SEQUENCE_TOKENS. */
    CHECK_STATUS(kvq_cache_append(cache, 0, seq, k, v, (size_t)KVQ_MAX_SEQUENCE_TOKENS + 1), KVQ_ERR_INVALID_ARGUMENT,
                 "past");
    size_t n = 99;
    CHECK_OK(kvq_cache_n_tokens(cache, seq, 0, &n));
    CHECK(n == 0);
    CHECK(kvq_cache_bytes_used(cache) == used);
    CHECK_OK(kvq_cache_append(cache, 0, seq, k, v, 1));
    kvq_cache_destroy(cache);
}

/* More prefill queries than tokens is a bad argument, not a NaN found past the end of q. */
static void test_prefill_more_queries_than_tokens(void) {
    kvq_cache* cache = small_cache();
    int64_t seq;
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    enum { T = 300 };
    float* k = malloc(sizeof(float) * T * KVH * D);
    float* v = malloc(sizeof(float) * T * KVH * D);
    fill_gaussian(k, (size_t)T * KVH * D, 3);
    fill_gaussian(v, (size_t)T * KVH * D, 4);
    CHECK_OK(kvq_cache_append(cache, 0, seq, k, v, T));
    float q[QH * D], out[QH * D];
    fill_gaussian(q, QH * D, 5);
    CHECK_STATUS(kvq_cache_attend_prefill(cache, 0, seq, q, 100000, out), KVQ_ERR_INVALID_ARGUMENT,
                 "100000 queries but the sequence holds 300 tokens");
    CHECK_STATUS(kvq_cache_attend_prefill(cache, 0, seq, q, (size_t)-1, out), KVQ_ERR_INVALID_ARGUMENT, "queries");
    q[7] = NAN; /* still NON_FINITE where the query really holds one */
    CHECK_STATUS(kvq_cache_attend_prefill(cache, 0, seq, q, 1, out), KVQ_ERR_NON_FINITE, "NaN");
    CHECK_STATUS(kvq_cache_attend(cache, 0, seq, q, out), KVQ_ERR_NON_FINITE, "NaN");
    k[5] = INFINITY;
    CHECK_STATUS(kvq_cache_append(cache, 0, seq, k, v, 1), KVQ_ERR_NON_FINITE, "NaN or Inf");
    free(k);
    free(v);
    kvq_cache_destroy(cache);
}

/* Every status kvq.h documents for kvq_cache_create, each for an input it names. */
static void test_create_statuses(void) {
    kvq_cache* cache = NULL;
    kvq_cache_params p = test_cache_params(1, KVH, QH, BT);
    CHECK_STATUS(kvq_cache_create(NULL, &cache), KVQ_ERR_INVALID_ARGUMENT, "params is NULL");
    CHECK_STATUS(kvq_cache_create(&p, NULL), KVQ_ERR_INVALID_ARGUMENT, "cache is NULL");
    p.size = 8;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_INVALID_ARGUMENT, "size");
    p = test_cache_params(1, KVH, QH, BT);
    p.key_codec = NULL;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_INVALID_ARGUMENT, "key_codec or value_codec is NULL");
    p = test_cache_params(1, KVH, QH, BT);
    p.value_codec = NULL;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_INVALID_ARGUMENT, "key_codec or value_codec is NULL");
    p = test_cache_params(1, KVH, QH, BT);
    p.n_sliding_window = 1;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_INVALID_ARGUMENT, "sliding_window is NULL");
    p = test_cache_params(1, KVH, QH, BT);
    p.max_blocks = 4;
    p.initial_blocks = 5;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "initial_blocks (5) exceeds max_blocks (4)");
    p = test_cache_params(1, KVH, QH, BT);
    p.n_heads = 7;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "multiple of n_kv_heads");
    p = test_cache_params(1, KVH, QH, BT);
    p.key_codec = "q9_9";
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_UNKNOWN_CODEC, "q9_9");
    p = test_cache_params(1, KVH, QH, BT);
    p.head_dim = 48; /* not a multiple of q8_0's 32 */
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_HEAD_DIM, "48");
    CHECK(cache == NULL);
}

/* The bounds kvq.h documents: n_layers = 10^8 no longer creates a cache whose every sequence costs
 * gigabytes of bookkeeping; at the bound, a sequence's bookkeeping shows in kvq_cache_bytes_used. */
static void test_bounded_configurations(void) {
    kvq_cache* cache = NULL;
    kvq_cache_params p = test_cache_params(1, KVH, QH, BT);
    p.n_layers = 100000000;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "n_layers must be in 1..65536");
    p = test_cache_params(1, KVH, QH, BT);
    p.n_kv_heads = KVQ_MAX_CACHE_DIM + 1;
    p.n_heads = 0;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_PARAMS, "n_kv_heads must be in 1..65536");
    p = test_cache_params(1, KVH, QH, BT);
    p.head_dim = 2 * KVQ_MAX_CACHE_DIM;
    CHECK_STATUS(kvq_cache_create(&p, &cache), KVQ_ERR_BAD_HEAD_DIM, "head_dim must be in 1..65536");
    CHECK(cache == NULL);
    p = test_cache_params(KVQ_MAX_CACHE_DIM, KVH, QH, BT);
    CHECK_OK(kvq_cache_create(&p, &cache));
    CHECK(kvq_cache_bytes_used(cache) == 0);
    int64_t seq;
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    const size_t one = kvq_cache_bytes_used(cache);
    CHECK(one >= (size_t)KVQ_MAX_CACHE_DIM * 64); /* per-layer state: several vectors per layer */
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    CHECK(kvq_cache_bytes_used(cache) == 2 * one);
    CHECK_OK(kvq_cache_remove_sequence(cache, seq));
    CHECK(kvq_cache_bytes_used(cache) == one);
    kvq_cache_destroy(cache);
}

/* A finite query of 3e38: its float scores overflow; the output is finite (recomputed in double), and
 * equals the attention of the scaled query's limit: all weight on the keys of the largest score. */
static void test_huge_finite_query(void) {
    const char* pairs[][2] = {{"q8_0", "q4_0"}, {"f32", "f32"}, {"f16", "q8_0"}, {"q4_0+rot", "q4_0"}};
    for (size_t c = 0; c < sizeof pairs / sizeof pairs[0]; ++c) {
        for (int seal = 0; seal < 2; ++seal) {
            kvq_cache_params p = test_cache_params(1, KVH, QH, BT);
            p.key_codec = pairs[c][0];
            p.value_codec = pairs[c][1];
            p.seal = seal ? KVQ_SEAL_ON_BLOCK_FULL : KVQ_SEAL_ON_APPEND;
            kvq_cache* cache;
            CHECK_OK(kvq_cache_create(&p, &cache));
            int64_t seq;
            CHECK_OK(kvq_cache_add_sequence(cache, &seq));
            enum { T = 40 }; /* two sealed blocks and 8 staged tokens under on_block_full */
            static float k[T * KVH * D], v[T * KVH * D];
            fill_gaussian(k, T * KVH * D, 7);
            fill_gaussian(v, T * KVH * D, 8);
            CHECK_OK(kvq_cache_append(cache, 0, seq, k, v, T));
            float q[QH * D], out[QH * D];
            fill_gaussian(q, QH * D, 9);
            for (int i = 0; i < QH * D; ++i) q[i] = q[i] > 0 ? 3e38f : -3e38f;
            CHECK_OK(kvq_cache_attend(cache, 0, seq, q, out));
            int finite = 1;
            for (int i = 0; i < QH * D; ++i) finite &= isfinite(out[i]) != 0;
            CHECK(finite);
            static float outs[T * QH * D];
            static float qs[T * QH * D];
            for (int t = 0; t < T; ++t) memcpy(qs + t * QH * D, q, sizeof q);
            CHECK_OK(kvq_cache_attend_prefill(cache, 0, seq, qs, T, outs));
            for (int i = 0; i < T * QH * D; ++i) finite &= isfinite(outs[i]) != 0;
            CHECK(finite);
            /* The last prefill query is the decode query: the same positions, the same (exact) path. */
            CHECK(memcmp(outs + (T - 1) * QH * D, out, sizeof out) == 0);
            kvq_cache_destroy(cache);
        }
    }
}

/* kvq_cache_load_limited: the pool's capacity and threads for a loaded cache; a file with more blocks than
 * max_blocks is KVQ_ERR_POOL_EXHAUSTED; a FIFO is KVQ_ERR_IO at once (it is never opened for reading). */
static void test_load_limited(void) {
    char path[64], fifo[64];
    snprintf(path, sizeof path, "/tmp/kvq_capi_inputs_%d.kvq", (int)getpid());
    snprintf(fifo, sizeof fifo, "/tmp/kvq_capi_inputs_%d.fifo", (int)getpid());
    kvq_cache* cache = small_cache();
    int64_t seq;
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    static float k[3 * BT * KVH * D];
    fill_gaussian(k, 3 * BT * KVH * D, 21);
    CHECK_OK(kvq_cache_append(cache, 0, seq, k, k, 3 * BT)); /* 3 blocks */
    CHECK_OK(kvq_cache_save(cache, path, KVQ_ALL_SEQUENCES));
    kvq_cache* loaded = NULL;
    CHECK_STATUS(kvq_cache_load_limited(path, 2, 1, &loaded), KVQ_ERR_POOL_EXHAUSTED, "more than max_blocks = 2");
    CHECK_STATUS(kvq_cache_load_limited(path, 0, 0, &loaded), KVQ_ERR_INVALID_ARGUMENT, "threads");
    CHECK(loaded == NULL);
    CHECK_OK(kvq_cache_load_limited(path, 3, 2, &loaded));
    kvq_pool_stats stats = kvq_pool_stats_init();
    CHECK_OK(kvq_cache_pool_stats(loaded, &stats));
    CHECK(stats.max_blocks == 3 && stats.blocks_total == 3 && stats.blocks_used == 3);
    CHECK_STATUS(kvq_cache_append(loaded, 0, 0, k, k, 1), KVQ_ERR_POOL_EXHAUSTED, "exhausted");
    kvq_cache_destroy(loaded);
    CHECK_OK(kvq_cache_load(path, &loaded)); /* unlimited, and exactly the file's blocks */
    CHECK_OK(kvq_cache_pool_stats(loaded, &stats));
    CHECK(stats.max_blocks == 0 && stats.blocks_total == 3);
    kvq_cache_destroy(loaded);
    remove(path);
    CHECK(mkfifo(fifo, 0600) == 0);
    loaded = NULL;
    CHECK_STATUS(kvq_cache_load(fifo, &loaded), KVQ_ERR_IO, "FIFO");
    size_t count = 0;
    CHECK_STATUS(kvq_cache_load_into(cache, fifo, NULL, 0, &count), KVQ_ERR_IO, "FIFO");
    CHECK(loaded == NULL);
    remove(fifo);
    kvq_cache_destroy(cache);
}

/* The codec functions on rows: row counts whose sizes overflow are refused before a read (the buffers here
 * hold one row), not scanned for NaN past the caller's buffer. */
static void test_codec_rows_overflow(void) {
    kvq_codec* c;
    CHECK_OK(kvq_codec_create("q8_0", D, KVQ_DEFAULT_SEED, &c));
    float x[D];
    fill_gaussian(x, D, 31);
    uint8_t dst[2 * D];
    const size_t huge[] = {(size_t)-1, (size_t)-1 / D + 1, (size_t)PTRDIFF_MAX / (4 * D) + 1};
    for (size_t i = 0; i < sizeof huge / sizeof huge[0]; ++i) {
        CHECK_STATUS(kvq_codec_quantize_rows(c, x, huge[i], dst, 0), KVQ_ERR_INVALID_ARGUMENT, "overflow");
        CHECK_STATUS(kvq_codec_dequantize_rows(c, dst, huge[i], x, 0), KVQ_ERR_INVALID_ARGUMENT, "overflow");
    }
    CHECK_OK(kvq_codec_quantize_rows(c, x, 1, dst, 0));
    kvq_codec_destroy(c);
}

int main(void) {
    test_append_sizes_overflow();
    test_prefill_more_queries_than_tokens();
    test_create_statuses();
    test_bounded_configurations();
    test_huge_finite_query();
    test_load_limited();
    test_codec_rows_overflow();
    return check_report("test_capi_inputs");
}
