/* kvq_attend_rows_ex with every count and stride of its q, out and mask at the extremes (issue #50, item
 * 1), each buffer between PROT_NONE guard pages: a refused call must read and write nothing outside its
 * buffers (a stray access is a SIGSEGV, which fails the test), leave out untouched and say why; the same
 * buffers with sizes that fit give KVQ_OK (the engine reads exactly the buffers kvq.h describes). Each
 * buffer is placed once against the page after it and once against the page before it. Compiled as C11. */
#define _DEFAULT_SOURCE /* mmap, mprotect, sysconf */
#include <kvq/kvq.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check.h"
#include "helpers.h"

#define SENTINEL 12345.0f

/* `bytes` between two PROT_NONE pages: flush against the upper guard (at_end) or the lower one. */
typedef struct {
    unsigned char* map;
    size_t map_bytes;
    void* p;
} guarded;

static guarded guarded_alloc(size_t bytes, int at_end) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t data = (bytes + page - 1) / page * page;
    guarded g;
    g.map_bytes = data + 2 * page;
    g.map = mmap(NULL, g.map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (g.map == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    if (mprotect(g.map, page, PROT_NONE) != 0 || mprotect(g.map + page + data, page, PROT_NONE) != 0) {
        perror("mprotect");
        exit(1);
    }
    g.p = at_end ? g.map + page + data - bytes : g.map + page;
    return g;
}

static void guarded_free(guarded g) { munmap(g.map, g.map_bytes); }

enum { T = 5, KV = 2, H = 4, NQ = 3 };

typedef struct {
    kvq_codec *kc, *vc;
    guarded k, v, q, out, mask, sinks;
} setup;

static setup make_setup(int at_end) {
    setup s;
    CHECK_OK(kvq_codec_create("q8_0", D, KVQ_DEFAULT_SEED, &s.kc));
    CHECK_OK(kvq_codec_create("q4_0", D, KVQ_DEFAULT_SEED, &s.vc));
    const size_t kb = kvq_codec_row_bytes(s.kc), vb = kvq_codec_row_bytes(s.vc);
    float kx[T * KV * D], vx[T * KV * D];
    fill_gaussian(kx, T * KV * D, 5);
    fill_gaussian(vx, T * KV * D, 6);
    s.k = guarded_alloc(T * KV * kb, at_end);
    s.v = guarded_alloc(T * KV * vb, at_end);
    CHECK_OK(kvq_codec_quantize_rows(s.kc, kx, T * KV, s.k.p, 0));
    CHECK_OK(kvq_codec_quantize_rows(s.vc, vx, T * KV, s.v.p, 0));
    s.q = guarded_alloc(NQ * H * D * sizeof(float), at_end);
    fill_gaussian(s.q.p, NQ * H * D, 7);
    s.out = guarded_alloc(NQ * H * D * sizeof(float), at_end);
    s.mask = guarded_alloc(NQ * T * sizeof(uint16_t), at_end);
    memset(s.mask.p, 0, NQ * T * sizeof(uint16_t)); /* f16 zeros: every token kept */
    s.sinks = guarded_alloc(H * sizeof(float), at_end);
    memset(s.sinks.p, 0, H * sizeof(float));
    return s;
}

static void free_setup(setup* s) {
    guarded_free(s->k);
    guarded_free(s->v);
    guarded_free(s->q);
    guarded_free(s->out);
    guarded_free(s->mask);
    guarded_free(s->sinks);
    kvq_codec_destroy(s->kc);
    kvq_codec_destroy(s->vc);
}

static int out_untouched(const setup* s) {
    const float* o = s->out.p;
    for (size_t i = 0; i < NQ * H * D; ++i) {
        if (o[i] != SENTINEL) return 0;
    }
    return 1;
}

static kvq_status call(setup* s, const kvq_attend_options* o) {
    float* out = s->out.p;
    for (size_t i = 0; i < NQ * H * D; ++i) out[i] = SENTINEL;
    return kvq_attend_rows_ex(s->kc, s->vc, H, KV, s->q.p, s->k.p, 0, 0, s->v.p, 0, 0, T, o, out);
}

static kvq_attend_options base(const setup* s) {
    kvq_attend_options o = kvq_attend_options_default();
    o.n_queries = NQ;
    o.mask = s->mask.p;
    o.sinks = s->sinks.p;
    return o;
}

#define N_EXTREME 9
static const size_t extreme[N_EXTREME] = {SIZE_MAX,        SIZE_MAX - 1,        SIZE_MAX / 2,
                                          SIZE_MAX / 2 + 1, SIZE_MAX / 4,        SIZE_MAX / 8,
                                          (size_t)PTRDIFF_MAX, (size_t)PTRDIFF_MAX / 4 + 1, SIZE_MAX / 3};

static void refused(setup* s, const kvq_attend_options* o, const char* what) {
    CHECK_STATUS(call(s, o), KVQ_ERR_INVALID_ARGUMENT, "overflows");
    if (!out_untouched(s)) {
        CHECK(out_untouched(s));
        fprintf(stderr, "  (out written on a refused call: %s)\n", what);
    }
}

static void test_extremes(int at_end) {
    setup s = make_setup(at_end);
    kvq_attend_options o = base(&s);
    CHECK_OK(call(&s, &o)); /* exactly the buffers kvq.h describes: nothing outside them is touched */
    for (int i = 0; i < N_EXTREME; ++i) {
        const size_t x = extreme[i];
        o = base(&s);
        o.n_queries = x;
        refused(&s, &o, "n_queries");
        o = base(&s);
        o.q_row_stride = x;
        refused(&s, &o, "q_row_stride");
        o = base(&s);
        o.out_row_stride = x;
        refused(&s, &o, "out_row_stride");
        o = base(&s);
        o.q_head_stride = x;
        refused(&s, &o, "q_head_stride");
        o = base(&s);
        o.out_head_stride = x;
        refused(&s, &o, "out_head_stride");
        o = base(&s);
        o.mask_row_stride = x;
        refused(&s, &o, "mask_row_stride");
        o = base(&s); /* the default row stride n_heads·head_stride overflows */
        o.q_head_stride = x / 2 + 1;
        o.q_row_stride = 0;
        refused(&s, &o, "q_head_stride's default row stride");
    }
    /* One query row: its row strides are never used, any value is accepted (and nothing else is read). */
    o = base(&s);
    o.n_queries = 1;
    o.q_row_stride = SIZE_MAX;
    o.out_row_stride = SIZE_MAX;
    o.mask_row_stride = SIZE_MAX;
    CHECK_OK(call(&s, &o));
    free_setup(&s);
}

/* Finite inputs give finite output (item 2): a scale of 3.4e38 through both entry points; a mask element that
 * is NaN or +inf is refused as a NaN query is (kvq.h: masks are finite or -inf). */
static void test_values(void) {
    setup s = make_setup(1);
    kvq_attend_options o = base(&s);
    o.scale = 3.4e38f;
    CHECK_OK(call(&s, &o));
    const float* out = s.out.p;
    int finite = 1;
    for (size_t i = 0; i < NQ * H * D; ++i) finite &= isfinite(out[i]) != 0;
    CHECK(finite);
    float one[H * D];
    CHECK_OK(kvq_attend_rows(s.kc, s.vc, H, KV, s.q.p, s.k.p, 0, 0, s.v.p, 0, 0, T, 3.4e38f, one));
    finite = 1;
    for (size_t i = 0; i < H * D; ++i) finite &= isfinite(one[i]) != 0;
    CHECK(finite);

    uint16_t* m16 = s.mask.p;
    const uint16_t bad16[] = {0x7C00 /* +inf */, 0x7E00 /* NaN */, 0xFE01 /* -NaN */};
    for (size_t i = 0; i < sizeof bad16 / sizeof bad16[0]; ++i) {
        o = base(&s);
        m16[NQ * T - 1] = bad16[i];
        CHECK_STATUS(call(&s, &o), KVQ_ERR_NON_FINITE, "mask");
        CHECK(out_untouched(&s));
    }
    m16[NQ * T - 1] = 0xFC00; /* -inf removes the token: fine */
    o = base(&s);
    CHECK_OK(call(&s, &o));
    const float bad32[] = {NAN, INFINITY};
    float m32[NQ * T];
    for (size_t i = 0; i < 2; ++i) {
        for (size_t t = 0; t < NQ * T; ++t) m32[t] = 0.0f;
        m32[T + 2] = bad32[i];
        o = base(&s);
        o.mask = m32;
        o.mask_type = KVQ_MASK_F32;
        CHECK_STATUS(call(&s, &o), KVQ_ERR_NON_FINITE, "mask");
        CHECK(out_untouched(&s));
        o.nan_policy = KVQ_NAN_PROPAGATE; /* propagate: that row's outputs are NaN, as a float reference's */
        CHECK_OK(call(&s, &o));
        CHECK(isnan(out[1 * H * D]) && !isnan(out[0]) && !isnan(out[2 * H * D]));
    }
    free_setup(&s);
}

/* kvq_cache_append_half converts the halves to floats: a count whose float copies would pass PTRDIFF_MAX
 * (within KVQ_MAX_SEQUENCE_TOKENS, with 8192 values a token) is refused by the checked sizes, not by a
 * failed allocation. */
static void test_append_half_sizes(void) {
    kvq_cache_params p = test_cache_params(1, 64, 64, 32);
    p.head_dim = 128;
    kvq_cache* cache = NULL;
    int64_t seq = 0;
    CHECK_OK(kvq_cache_create(&p, &cache));
    CHECK_OK(kvq_cache_add_sequence(cache, &seq));
    uint16_t one[64 * 128];
    memset(one, 0, sizeof one);
    const size_t counts[] = {(size_t)1 << 48, ((size_t)PTRDIFF_MAX / (64 * 128 * 4)) + 1, SIZE_MAX};
    for (int i = 0; i < 3; ++i) {
        CHECK_STATUS(kvq_cache_append_half(cache, 0, seq, one, one, counts[i], KVQ_HALF_F16), KVQ_ERR_INVALID_ARGUMENT, "");
    }
    size_t n = 7;
    CHECK_OK(kvq_cache_n_tokens(cache, seq, 0, &n));
    CHECK(n == 0);
    kvq_cache_destroy(cache);
}

int main(void) {
    test_append_half_sizes();
    test_extremes(1);
    test_extremes(0);
    test_values();
    return check_report("test_capi_guard_pages");
}
