/* kvq_cache_append_half: keys and values an engine holds as f16 or bf16 are stored as the same rows given
 * as floats would be (attention bit-identical), a NaN among them is refused as a float NaN is, and an
 * unknown type is a bad argument; a failed call stores nothing. */
#include <kvq/kvq.h>

#include <stdint.h>
#include <string.h>

#include "check.h"
#include "helpers.h"

enum { KVH = 2, QH = 4, TOKENS = 40, ROW = KVH * D };

static uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* f16 bits of a float that f16 holds exactly (0 or a normal f16 value). */
static uint16_t f16_bits(float x) {
    const uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) == 0) return (uint16_t)(u >> 16);
    const uint32_t sign = (u >> 16) & 0x8000u, exp = ((u >> 23) & 0xffu) - 127u + 15u, mant = (u & 0x7fffffu) >> 13;
    return (uint16_t)(sign | (exp << 10) | mant);
}

static void run(kvq_half_type type) {
    kvq_cache_params p = test_cache_params(1, KVH, QH, 16);
    kvq_cache *halves = NULL, *floats = NULL;
    int64_t a, b;
    CHECK_OK(kvq_cache_create(&p, &halves));
    CHECK_OK(kvq_cache_create(&p, &floats));
    CHECK_OK(kvq_cache_add_sequence(halves, &a));
    CHECK_OK(kvq_cache_add_sequence(floats, &b));
    static float k[TOKENS * ROW], v[TOKENS * ROW];
    static uint16_t k16[TOKENS * ROW], v16[TOKENS * ROW];
    for (int i = 0; i < TOKENS * ROW; ++i) {
        /* Values both formats hold exactly: k/64 with |k| < 128 (bf16 has 8 significant bits). */
        k[i] = (float)((i * 37) % 255 - 127) / 64.0f;
        v[i] = (float)((i * 11) % 201 - 100) / 64.0f;
        k16[i] = type == KVQ_HALF_F16 ? f16_bits(k[i]) : (uint16_t)(bits_of(k[i]) >> 16);
        v16[i] = type == KVQ_HALF_F16 ? f16_bits(v[i]) : (uint16_t)(bits_of(v[i]) >> 16);
    }
    CHECK_OK(kvq_cache_append_half(halves, 0, a, k16, v16, TOKENS, type));
    CHECK_OK(kvq_cache_append(floats, 0, b, k, v, TOKENS));
    float q[QH * D], out_h[QH * D], out_f[QH * D];
    fill_gaussian(q, QH * D, 5);
    CHECK_OK(kvq_cache_attend(halves, 0, a, q, out_h));
    CHECK_OK(kvq_cache_attend(floats, 0, b, q, out_f));
    CHECK(memcmp(out_h, out_f, sizeof out_h) == 0);

    /* A NaN (f16 0x7e00, bf16 0x7fc0) is refused under the default nan_policy, and nothing is stored. */
    const size_t used = kvq_cache_bytes_used(halves);
    k16[3] = type == KVQ_HALF_F16 ? 0x7e00u : 0x7fc0u;
    CHECK_STATUS(kvq_cache_append_half(halves, 0, a, k16, v16, 1, type), KVQ_ERR_NON_FINITE, "");
    CHECK_STATUS(kvq_cache_append_half(halves, 0, a, k16, v16, 1, 7), KVQ_ERR_INVALID_ARGUMENT,
                 "unknown kvq_half_type");
    CHECK_STATUS(kvq_cache_append_half(halves, 0, a, NULL, v16, 1, type), KVQ_ERR_INVALID_ARGUMENT, "NULL");
    size_t n = 0;
    CHECK_OK(kvq_cache_n_tokens(halves, a, 0, &n));
    CHECK(n == TOKENS);
    CHECK(kvq_cache_bytes_used(halves) == used);
    kvq_cache_destroy(halves);
    kvq_cache_destroy(floats);
}

int main(void) {
    run(KVQ_HALF_F16);
    run(KVQ_HALF_BF16);
    return check_report("test_capi_half");
}
