/* Data and comparisons shared by the C tests. */
#ifndef KVQ_TESTS_C_HELPERS_H
#define KVQ_TESTS_C_HELPERS_H

#include <kvq/kvq.h>

#include <math.h>
#include <stddef.h>
#include <stdint.h>

enum { D = 64 }; /* values per head in the C tests */

static inline float next_gaussian(uint32_t* state) {
    float u[2];
    for (int i = 0; i < 2; ++i) {
        *state ^= *state << 13;
        *state ^= *state >> 17;
        *state ^= *state << 5;
        u[i] = ((float)(*state >> 8) + 0.5f) / 16777216.0f;
    }
    return sqrtf(-2.0f * logf(u[0])) * cosf(6.2831853f * u[1]);
}

static inline void fill_gaussian(float* x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; ++i) x[i] = next_gaussian(&seed);
}

static inline double relative_l2(const float* a, const float* ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

/* A q8_0/q4_0 cache of D-value heads that quantizes on append. */
static inline kvq_cache_params test_cache_params(int32_t n_layers, int32_t n_kv_heads, int32_t n_heads,
                                                 int32_t block_tokens) {
    kvq_cache_params p = kvq_cache_params_default();
    p.n_layers = n_layers;
    p.n_kv_heads = n_kv_heads;
    p.n_heads = n_heads;
    p.head_dim = D;
    p.key_codec = "q8_0";
    p.value_codec = "q4_0";
    p.block_tokens = block_tokens;
    p.seal = KVQ_SEAL_ON_APPEND;
    return p;
}

#endif
