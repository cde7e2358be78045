/* The toy decode loop of decode_loop.cpp through the C API, as a C engine would embed kvq: one cache with
 * q8_0 keys and q4_0 values and one with f32 rows, the same model and inputs; prints bytes per token and
 * the error of the attention outputs and hidden states against the f32 run. Every kvq call is checked and
 * a failure prints kvq_last_error().
 *
 *   ./build/examples/c_embed [key_codec value_codec [steps]]
 */
#include <kvq/kvq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { N_LAYERS = 4, N_HEADS = 8, N_KV_HEADS = 2, HEAD_DIM = 64 };
enum { D_MODEL = N_HEADS * HEAD_DIM, D_KV = N_KV_HEADS * HEAD_DIM };

#define KVQ_CHECK(call)                                                                     \
    do {                                                                                    \
        const kvq_status status_ = (call);                                                  \
        if (status_ != KVQ_OK) {                                                            \
            fprintf(stderr, "%s failed: %s: %s\n", #call, kvq_status_name(status_), kvq_last_error()); \
            exit(1);                                                                        \
        }                                                                                   \
    } while (0)

static uint32_t rng_state = 2024;
static float next_gaussian(void) {
    float u[2];
    for (int i = 0; i < 2; ++i) {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 17;
        rng_state ^= rng_state << 5;
        u[i] = ((float)(rng_state >> 8) + 0.5f) / 16777216.0f;
    }
    return sqrtf(-2.0f * logf(u[0])) * cosf(6.2831853f * u[1]);
}

/* Weights of every layer: q and o projections d_model × d_model, k and v d_kv × d_model; key bias d_kv. */
static float wq[N_LAYERS][D_MODEL * D_MODEL], wo[N_LAYERS][D_MODEL * D_MODEL];
static float wk[N_LAYERS][D_KV * D_MODEL], wv[N_LAYERS][D_KV * D_MODEL], key_bias[N_LAYERS][D_KV];

static void init_model(void) {
    const float s = 1.0f / sqrtf((float)D_MODEL);
    for (int l = 0; l < N_LAYERS; ++l) {
        for (int i = 0; i < D_MODEL * D_MODEL; ++i) wq[l][i] = s * next_gaussian();
        for (int i = 0; i < D_MODEL * D_MODEL; ++i) wo[l][i] = s * next_gaussian();
        for (int i = 0; i < D_KV * D_MODEL; ++i) wk[l][i] = s * next_gaussian();
        for (int i = 0; i < D_KV * D_MODEL; ++i) wv[l][i] = s * next_gaussian();
        for (int i = 0; i < D_KV; ++i) key_bias[l][i] = next_gaussian();
    }
}

static void matvec(const float* w, const float* x, int rows, int cols, float* y) {
    for (int r = 0; r < rows; ++r) {
        float s = 0;
        for (int c = 0; c < cols; ++c) s += w[(size_t)r * cols + c] * x[c];
        y[r] = s;
    }
}

static void rope(float* x, int n_heads, int pos) {
    const int half = HEAD_DIM / 2;
    for (int h = 0; h < n_heads; ++h) {
        float* v = x + h * HEAD_DIM;
        for (int i = 0; i < half; ++i) {
            const double angle = pos * pow(10000.0, -2.0 * i / HEAD_DIM);
            const float c = (float)cos(angle), s = (float)sin(angle), a = v[i], b = v[i + half];
            v[i] = a * c - b * s;
            v[i + half] = a * s + b * c;
        }
    }
}

/* One decode step of every layer for the token at pos: x (d_model) in, x out; attention outputs of every
 * layer to attn (n_layers × d_model). */
static void step(kvq_cache* cache, int64_t seq, int pos, float* x, float* attn) {
    float h[D_MODEL], q[D_MODEL], k[D_KV], v[D_KV], proj[D_MODEL];
    for (int l = 0; l < N_LAYERS; ++l) {
        double ss = 0;
        for (int i = 0; i < D_MODEL; ++i) ss += (double)x[i] * x[i];
        for (int i = 0; i < D_MODEL; ++i) h[i] = x[i] / (float)sqrt(ss / D_MODEL + 1e-6);
        matvec(wq[l], h, D_MODEL, D_MODEL, q);
        matvec(wk[l], h, D_KV, D_MODEL, k);
        matvec(wv[l], h, D_KV, D_MODEL, v);
        for (int i = 0; i < D_KV; ++i) k[i] += key_bias[l][i];
        rope(q, N_HEADS, pos);
        rope(k, N_KV_HEADS, pos);
        KVQ_CHECK(kvq_cache_append(cache, l, seq, k, v, 1));
        KVQ_CHECK(kvq_cache_attend(cache, l, seq, q, attn + l * D_MODEL));
        matvec(wo[l], attn + l * D_MODEL, D_MODEL, D_MODEL, proj);
        for (int i = 0; i < D_MODEL; ++i) x[i] += proj[i];
    }
}

static kvq_cache* make_cache(const char* key_codec, const char* value_codec) {
    kvq_cache_params p = kvq_cache_params_default();
    p.n_layers = N_LAYERS;
    p.n_heads = N_HEADS;
    p.n_kv_heads = N_KV_HEADS;
    p.head_dim = HEAD_DIM;
    p.key_codec = key_codec;
    p.value_codec = value_codec;
    kvq_cache* cache;
    KVQ_CHECK(kvq_cache_create(&p, &cache));
    return cache;
}

static double relative_l2(const float* a, const float* ref, int n) {
    double num = 0, den = 0;
    for (int i = 0; i < n; ++i) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

int main(int argc, char** argv) {
    const char* key_codec = argc > 2 ? argv[1] : "q8_0";
    const char* value_codec = argc > 2 ? argv[2] : "q4_0";
    const int steps = argc > 3 ? atoi(argv[3]) : 200;
    if (steps <= 0) {
        fprintf(stderr, "usage: c_embed [key_codec value_codec [steps > 0]]\n");
        return 2;
    }
    if (kvq_version() >> 16 != KVQ_VERSION_MAJOR) {
        fprintf(stderr, "kvq.h %s does not match libkvq %s\n", KVQ_VERSION_STRING, kvq_version_string());
        return 1;
    }
    init_model();
    kvq_cache* quantized = make_cache(key_codec, value_codec);
    kvq_cache* reference = make_cache("f32", "f32");
    int64_t seq_q, seq_f;
    KVQ_CHECK(kvq_cache_add_sequence(quantized, &seq_q));
    KVQ_CHECK(kvq_cache_add_sequence(reference, &seq_f));

    static float x_q[D_MODEL], x_f[D_MODEL], attn_q[N_LAYERS * D_MODEL], attn_f[N_LAYERS * D_MODEL];
    double attention_error = 0, hidden_error = 0;
    for (int pos = 0; pos < steps; ++pos) {
        for (int i = 0; i < D_MODEL; ++i) x_q[i] = x_f[i] = next_gaussian();
        step(quantized, seq_q, pos, x_q, attn_q);
        step(reference, seq_f, pos, x_f, attn_f);
        for (int l = 0; l < N_LAYERS; ++l) {
            attention_error += relative_l2(attn_q + l * D_MODEL, attn_f + l * D_MODEL, D_MODEL);
        }
        hidden_error += relative_l2(x_q, x_f, D_MODEL);
    }
    attention_error /= (double)steps * N_LAYERS;
    hidden_error /= steps;

    size_t n_tokens;
    KVQ_CHECK(kvq_cache_n_tokens(quantized, seq_q, 0, &n_tokens));
    kvq_pool_stats stats = kvq_pool_stats_init();
    KVQ_CHECK(kvq_cache_pool_stats(quantized, &stats));
    const double bytes_q = kvq_cache_bytes_per_token(quantized), bytes_f = kvq_cache_bytes_per_token(reference);
    printf("toy model: %d layers, %d query heads, %d kv heads, head_dim %d; %zu tokens decoded\n", N_LAYERS,
           N_HEADS, N_KV_HEADS, HEAD_DIM, n_tokens);
    printf("%s / %s: %.0f bytes per token (f32: %.0f, %.2fx smaller), %zu blocks of %zu bytes in use\n",
           key_codec, value_codec, bytes_q, bytes_f, bytes_f / bytes_q, stats.blocks_used, stats.block_bytes);
    printf("mean relative L2 error against f32: attention outputs %.2e, hidden states %.2e\n", attention_error,
           hidden_error);

    /* Errors are statuses, never crashes: a layer that does not exist. */
    static float q[D_MODEL], out[D_MODEL];
    const kvq_status status = kvq_cache_attend(quantized, N_LAYERS, seq_q, q, out);
    printf("attend on layer %d: %s (%s)\n", N_LAYERS, kvq_status_name(status), kvq_last_error());

    kvq_cache_destroy(quantized);
    kvq_cache_destroy(reference);
    return status == KVQ_ERR_BAD_LAYER && n_tokens == (size_t)steps && attention_error < 0.5 ? 0 : 1;
}
