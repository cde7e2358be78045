/* Save and load through the C API, from C: a round trip that attends bit for bit alike, loading into a
 * live cache, and every failure status (missing file, not a cache file, corrupted, truncated, other
 * configuration, full pool, bad sequence, unwritable path) with its message, the cache's contents and
 * accounting and the outputs unchanged. */
#define _POSIX_C_SOURCE 200809L /* getpid */
#include <kvq/kvq.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "helpers.h"

enum { L = 2, KVH = 2, QH = 4, BT = 8 };

static char dir[256];

/* The path of a file in the test's directory (one of 4 buffers in turn: copy it to keep it). */
static const char* in_dir(const char* name) {
    static char path[4][512];
    static int slot = 0;
    slot = (slot + 1) % 4;
    snprintf(path[slot], sizeof path[slot], "%s/%s", dir, name);
    return path[slot];
}

static kvq_cache_params params(void) {
    kvq_cache_params p = kvq_cache_params_default();
    p.n_layers = L;
    p.n_kv_heads = KVH;
    p.n_heads = QH;
    p.head_dim = D;
    p.block_tokens = BT;
    return p;
}

static void append(kvq_cache* c, int64_t seq, size_t n, uint32_t seed) {
    float* k = malloc(n * KVH * D * sizeof(float));
    float* v = malloc(n * KVH * D * sizeof(float));
    for (int l = 0; l < L; ++l) {
        fill_gaussian(k, n * KVH * D, seed + 2u * (uint32_t)l);
        fill_gaussian(v, n * KVH * D, seed + 2u * (uint32_t)l + 1u);
        CHECK_OK(kvq_cache_append(c, l, seq, k, v, n));
    }
    free(k);
    free(v);
}

/* Attention of every layer of seq, written to out (L × QH × D floats). */
static void attend_all(const kvq_cache* c, int64_t seq, float* out) {
    float q[QH * D];
    fill_gaussian(q, QH * D, 77);
    for (int l = 0; l < L; ++l) CHECK_OK(kvq_cache_attend(c, l, seq, q, out + (size_t)l * QH * D));
}

typedef struct {
    size_t n_seqs, bytes, blocks_used, blocks_total, blocks_shared;
    float out[4][L * QH * D];
} snapshot;

static void take(const kvq_cache* c, snapshot* s) {
    int64_t ids[4];
    memset(s, 0, sizeof *s);
    CHECK_OK(kvq_cache_sequences(c, ids, 4, &s->n_seqs));
    for (size_t i = 0; i < s->n_seqs && i < 4; ++i) attend_all(c, ids[i], s->out[i]);
    kvq_pool_stats st = kvq_pool_stats_init();
    CHECK_OK(kvq_cache_pool_stats(c, &st));
    s->bytes = kvq_cache_bytes_used(c);
    s->blocks_used = st.blocks_used;
    s->blocks_total = st.blocks_total;
    s->blocks_shared = st.blocks_shared;
}

static void check_unchanged(const kvq_cache* c, const snapshot* before) {
    snapshot* now = malloc(sizeof *now);
    take(c, now);
    CHECK(memcmp(now, before, sizeof *now) == 0);
    free(now);
}

static long file_size(const char* path) {
    FILE* f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fclose(f);
    return n;
}

/* Copies the first n bytes of src to dst, with byte `flip` (if >= 0) xor 0x40. */
static void copy_file(const char* src, const char* dst, long n, long flip) {
    FILE* in = fopen(src, "rb");
    FILE* out = fopen(dst, "wb");
    for (long i = 0; i < n; ++i) {
        int ch = fgetc(in);
        if (i == flip) ch ^= 0x40;
        fputc(ch, out);
    }
    fclose(in);
    fclose(out);
}

static void test_round_trip(void) {
    kvq_cache_params p = params();
    kvq_cache* src = NULL;
    CHECK_OK(kvq_cache_create(&p, &src));
    int64_t a, b;
    CHECK_OK(kvq_cache_add_sequence(src, &a));
    append(src, a, 21, 1);
    CHECK_OK(kvq_cache_fork(src, a, &b));
    append(src, b, 3, 9);
    const char* path = in_dir("c.kvq");
    CHECK_OK(kvq_cache_save(src, path, KVQ_ALL_SEQUENCES));

    kvq_cache* loaded = NULL;
    CHECK_OK(kvq_cache_load(path, &loaded));
    snapshot* s1 = malloc(sizeof *s1);
    snapshot* s2 = malloc(sizeof *s2);
    take(src, s1);
    take(loaded, s2);
    CHECK(s2->n_seqs == 2);
    /* blocks_total differs: the loaded pool grew by exactly the blocks it loaded. */
    CHECK(memcmp(s1->out, s2->out, sizeof s1->out) == 0);
    CHECK(s2->bytes == s1->bytes && s2->blocks_used == s1->blocks_used);
    CHECK(s2->blocks_shared == s1->blocks_shared && s2->blocks_shared > 0);

    /* One sequence, loaded into a live cache beside its own. */
    CHECK_OK(kvq_cache_save(src, in_dir("one.kvq"), b));
    int64_t ids[2] = {-7, -7};
    size_t count = 0;
    take(loaded, s1);
    CHECK_OK(kvq_cache_load_into(loaded, in_dir("one.kvq"), ids, 2, &count));
    CHECK(count == 1 && ids[0] == 2 && ids[1] == -7);
    float out[L * QH * D];
    attend_all(loaded, 2, out);
    CHECK(memcmp(out, s1->out[1], sizeof out) == 0);
    attend_all(loaded, 0, out);
    CHECK(memcmp(out, s1->out[0], sizeof out) == 0);
    CHECK_OK(kvq_cache_load_into(loaded, in_dir("one.kvq"), NULL, 0, &count));
    CHECK(count == 1);

    CHECK_STATUS(kvq_cache_save(src, path, 42), KVQ_ERR_BAD_SEQUENCE, "42");
    CHECK_STATUS(kvq_cache_save(NULL, path, 0), KVQ_ERR_INVALID_ARGUMENT, "NULL");
    CHECK_STATUS(kvq_cache_load_into(loaded, NULL, ids, 2, &count), KVQ_ERR_INVALID_ARGUMENT, "NULL");
    free(s1);
    free(s2);
    kvq_cache_destroy(loaded);
    kvq_cache_destroy(src);
}

static void test_failures(void) {
    kvq_cache_params p = params();
    kvq_cache* src = NULL;
    CHECK_OK(kvq_cache_create(&p, &src));
    int64_t a;
    CHECK_OK(kvq_cache_add_sequence(src, &a));
    append(src, a, 11, 3);
    char good[512], bad[512];
    strcpy(good, in_dir("good.kvq"));
    strcpy(bad, in_dir("bad.kvq"));
    CHECK_OK(kvq_cache_save(src, good, KVQ_ALL_SEQUENCES));
    const long size = file_size(good);
    CHECK(size > 4096);

    kvq_cache* live = NULL;
    /* 2 blocks in use below, and the open blocks' staging of 2 layers (counted against max_blocks in
     * blocks' worth of bytes): the file's 2 blocks do not fit. */
    kvq_pool_stats probe = kvq_pool_stats_init();
    CHECK_OK(kvq_cache_pool_stats(src, &probe));
    const size_t staging_units = (2 * KVH * BT * D * sizeof(float) + probe.block_bytes - 1) / probe.block_bytes;
    p.max_blocks = 3 + L * staging_units;
    CHECK_OK(kvq_cache_create(&p, &live));
    int64_t s;
    CHECK_OK(kvq_cache_add_sequence(live, &s));
    append(live, s, 13, 5);
    snapshot* before = malloc(sizeof *before);
    take(live, before);
    int64_t ids[4] = {-7, -7, -7, -7};
    size_t count = 99;
    kvq_cache* made = NULL;

    CHECK_STATUS(kvq_cache_load_into(live, in_dir("missing.kvq"), ids, 4, &count), KVQ_ERR_IO, "No such file");
    CHECK_STATUS(kvq_cache_load(in_dir("missing.kvq"), &made), KVQ_ERR_IO, "missing.kvq");
    copy_file(good, bad, size, 0);
    CHECK_STATUS(kvq_cache_load_into(live, bad, ids, 4, &count), KVQ_ERR_BAD_FILE, "magic");
    CHECK_STATUS(kvq_cache_load(bad, &made), KVQ_ERR_BAD_FILE, "magic");
    copy_file(good, bad, size, 8);
    CHECK_STATUS(kvq_cache_load_into(live, bad, ids, 4, &count), KVQ_ERR_BAD_FILE, "format version");
    copy_file(good, bad, size - 1, -1);
    CHECK_STATUS(kvq_cache_load_into(live, bad, ids, 4, &count), KVQ_ERR_BAD_FILE, "truncated");
    copy_file(good, bad, size, 4096 + 10);
    CHECK_STATUS(kvq_cache_load_into(live, bad, ids, 4, &count), KVQ_ERR_BAD_FILE, "CRC32C");
    copy_file(good, bad, size, size - 10);
    CHECK_STATUS(kvq_cache_load_into(live, bad, ids, 4, &count), KVQ_ERR_BAD_FILE, "CRC32C");
    CHECK_STATUS(kvq_cache_load_into(live, good, ids, 4, &count), KVQ_ERR_POOL_EXHAUSTED, "pool exhausted");
    CHECK(made == NULL && count == 99 && ids[0] == -7);
    check_unchanged(live, before);

    kvq_cache_params other = params();
    other.value_codec = "q8_0";
    kvq_cache* mismatch = NULL;
    CHECK_OK(kvq_cache_create(&other, &mismatch));
    CHECK_STATUS(kvq_cache_load_into(mismatch, good, ids, 4, &count), KVQ_ERR_CONFIG_MISMATCH, "value_codec");
    size_t n = 1;
    CHECK_OK(kvq_cache_sequences(mismatch, NULL, 0, &n));
    CHECK(n == 0 && count == 99);

    /* A save that cannot happen leaves the old file as it was. */
    CHECK_STATUS(kvq_cache_save(live, in_dir("no/such/dir.kvq"), KVQ_ALL_SEQUENCES), KVQ_ERR_IO, "No such file");
    CHECK_STATUS(kvq_cache_save(live, dir, KVQ_ALL_SEQUENCES), KVQ_ERR_IO, "rename");
    CHECK(file_size(good) == size);
    CHECK_STR_EQ(kvq_status_name(KVQ_ERR_BAD_FILE), "KVQ_ERR_BAD_FILE");
    CHECK_STR_EQ(kvq_status_name(KVQ_ERR_IO), "KVQ_ERR_IO");
    CHECK_STR_EQ(kvq_status_name(KVQ_ERR_CONFIG_MISMATCH), "KVQ_ERR_CONFIG_MISMATCH");
    check_unchanged(live, before);
    free(before);
    kvq_cache_destroy(mismatch);
    kvq_cache_destroy(live);
    kvq_cache_destroy(src);
}

int main(void) {
    (void)relative_l2;
    const char* tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/kvq_capi_file_%ld", tmp ? tmp : "/tmp", (long)getpid());
    char cmd[400];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir);
    if (system(cmd) != 0) return 1;
    test_round_trip();
    test_failures();
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) return 1;
    return check_report("test_capi_file");
}
