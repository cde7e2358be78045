/* kvq_cache_params.key_scales: f32 keys attend as without scales (k * s stored, q / s attending, per kv
 * head under GQA), the scales survive save and load, and bad scales are refused at creation. */
#define _POSIX_C_SOURCE 200809L /* getpid */
#include <kvq/kvq.h>

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "helpers.h"

enum { LAYERS = 2, KVH = 2, QH = 4, TOKENS = 19, ROW = KVH * D, SCALES = LAYERS * KVH * D };

static kvq_cache_params f32_params(const float* scales, size_t n) {
    kvq_cache_params p = test_cache_params(LAYERS, KVH, QH, 8);
    p.key_codec = "f32";
    p.value_codec = "f32";
    p.key_scales = scales;
    p.n_key_scales = n;
    return p;
}

static void attend_all(const kvq_cache* c, int64_t seq, const float* q, float* out) {
    for (int l = 0; l < LAYERS; ++l) CHECK_OK(kvq_cache_attend(c, l, seq, q, out + l * QH * D));
}

int main(void) {
    static float scales[SCALES], k[TOKENS * ROW], v[TOKENS * ROW], q[QH * D];
    static float plain_out[LAYERS * QH * D], scaled_out[LAYERS * QH * D], loaded_out[LAYERS * QH * D];
    for (int i = 0; i < SCALES; ++i) scales[i] = 0.25f + (float)((i * 37) % 101) / 25.0f;
    fill_gaussian(k, TOKENS * ROW, 1);
    fill_gaussian(v, TOKENS * ROW, 2);
    fill_gaussian(q, QH * D, 3);

    kvq_cache *plain = NULL, *scaled = NULL, *loaded = NULL;
    kvq_cache_params p = f32_params(NULL, 0);
    CHECK_OK(kvq_cache_create(&p, &plain));
    p = f32_params(scales, SCALES);
    CHECK_OK(kvq_cache_create(&p, &scaled));
    int64_t a, b;
    CHECK_OK(kvq_cache_add_sequence(plain, &a));
    CHECK_OK(kvq_cache_add_sequence(scaled, &b));
    for (int l = 0; l < LAYERS; ++l) {
        CHECK_OK(kvq_cache_append(plain, l, a, k, v, TOKENS));
        CHECK_OK(kvq_cache_append(scaled, l, b, k, v, TOKENS));
    }
    attend_all(plain, a, q, plain_out);
    attend_all(scaled, b, q, scaled_out);
    CHECK(relative_l2(scaled_out, plain_out, LAYERS * QH * D) < 1e-5);

    char path[64];
    snprintf(path, sizeof path, "/tmp/kvq_capi_key_scales_%d.kvq", (int)getpid());
    CHECK_OK(kvq_cache_save(scaled, path, KVQ_ALL_SEQUENCES));
    CHECK_OK(kvq_cache_load(path, &loaded));
    attend_all(loaded, 0, q, loaded_out);
    CHECK(memcmp(loaded_out, scaled_out, sizeof scaled_out) == 0);
    int64_t ids[2];
    size_t count = 0;
    CHECK_STATUS(kvq_cache_load_into(plain, path, ids, 2, &count), KVQ_ERR_CONFIG_MISMATCH, "key_scales");
    remove(path);

    /* Bad scales: refused when the cache is made. */
    kvq_cache* made = NULL;
    p = f32_params(scales, SCALES - 1);
    CHECK_STATUS(kvq_cache_create(&p, &made), KVQ_ERR_BAD_PARAMS, "n_key_scales must be 0 or");
    p = f32_params(NULL, SCALES);
    CHECK_STATUS(kvq_cache_create(&p, &made), KVQ_ERR_INVALID_ARGUMENT, "key_scales is NULL");
    static float bad[SCALES];
    memcpy(bad, scales, sizeof bad);
    bad[3] = 0.0f;
    p = f32_params(bad, SCALES);
    CHECK_STATUS(kvq_cache_create(&p, &made), KVQ_ERR_BAD_PARAMS, "key_scales[3]");
    bad[3] = NAN;
    CHECK_STATUS(kvq_cache_create(&p, &made), KVQ_ERR_BAD_PARAMS, "positive and finite");
    CHECK(made == NULL);

    kvq_cache_destroy(plain);
    kvq_cache_destroy(scaled);
    kvq_cache_destroy(loaded);
    return check_report("test_capi_key_scales");
}
