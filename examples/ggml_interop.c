/* ggml interop through the C API, with plain byte buffers (kvq does not depend on ggml).
 *
 * For q8_0, q4_0 and q4_1 a kvq row is ggml's blocks: head_dim / 32 blocks of the struct ggml declares in
 * ggml/src/ggml-common.h, restated below. So
 *   1. an engine hands kvq the rows of a ggml KV tensor (shape [head_dim, n_kv_heads, n_ctx], strides
 *      nb[1] = row bytes and nb[2] = n_kv_heads row bytes) and gets attention back (kvq_attend_rows);
 *   2. kvq quantizes rows straight into a ggml-layout buffer, which ggml's own dequantization reads.
 * Both directions are checked here against ggml's reference dequantization (dequantize_row_q*_0/1 in
 * ggml-quants.c, restated below) and a float attention; the program exits non-zero if a check fails.
 *
 *   ./build/examples/ggml_interop
 */
#include <kvq/kvq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- ggml's block layouts (ggml-common.h) ---- */
typedef uint16_t ggml_half;
#define QK8_0 32
typedef struct {
    ggml_half d;       /* delta */
    int8_t qs[QK8_0];  /* quants */
} block_q8_0;
_Static_assert(sizeof(block_q8_0) == sizeof(ggml_half) + QK8_0, "wrong q8_0 block size/padding");
#define QK4_0 32
typedef struct {
    ggml_half d;           /* delta */
    uint8_t qs[QK4_0 / 2]; /* nibbles / quants */
} block_q4_0;
_Static_assert(sizeof(block_q4_0) == sizeof(ggml_half) + QK4_0 / 2, "wrong q4_0 block size/padding");
#define QK4_1 32
typedef struct {
    ggml_half d;           /* delta */
    ggml_half m;           /* min */
    uint8_t qs[QK4_1 / 2]; /* nibbles / quants */
} block_q4_1;
_Static_assert(sizeof(block_q4_1) == 2 * sizeof(ggml_half) + QK4_1 / 2, "wrong q4_1 block size/padding");

/* IEEE binary16 -> float, exact (ggml_compute_fp16_to_fp32). */
static float half_to_float(ggml_half h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exponent = (h >> 10) & 0x1Fu;
    const uint32_t mantissa = h & 0x3FFu;
    float magnitude;
    if (exponent == 0) {
        magnitude = ldexpf((float)mantissa, -24); /* zero or subnormal */
    } else if (exponent == 31) {
        magnitude = mantissa ? NAN : INFINITY;
    } else {
        magnitude = ldexpf((float)(mantissa | 0x400u), (int)exponent - 25);
    }
    uint32_t bits;
    memcpy(&bits, &magnitude, sizeof bits);
    bits |= sign;
    float result;
    memcpy(&result, &bits, sizeof result);
    return result;
}

/* ---- ggml's reference dequantization (ggml-quants.c), one row of k values ---- */
static void dequantize_row_q8_0(const block_q8_0* x, float* y, int k) {
    for (int i = 0; i < k / QK8_0; i++) {
        const float d = half_to_float(x[i].d);
        for (int j = 0; j < QK8_0; ++j) y[i * QK8_0 + j] = x[i].qs[j] * d;
    }
}
static void dequantize_row_q4_0(const block_q4_0* x, float* y, int k) {
    for (int i = 0; i < k / QK4_0; i++) {
        const float d = half_to_float(x[i].d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            const int x0 = (x[i].qs[j] & 0x0F) - 8;
            const int x1 = (x[i].qs[j] >> 4) - 8;
            y[i * QK4_0 + j] = x0 * d;
            y[i * QK4_0 + j + QK4_0 / 2] = x1 * d;
        }
    }
}
static void dequantize_row_q4_1(const block_q4_1* x, float* y, int k) {
    for (int i = 0; i < k / QK4_1; i++) {
        const float d = half_to_float(x[i].d);
        const float m = half_to_float(x[i].m);
        for (int j = 0; j < QK4_1 / 2; ++j) {
            y[i * QK4_1 + j] = (x[i].qs[j] & 0x0F) * d + m;
            y[i * QK4_1 + j + QK4_1 / 2] = (x[i].qs[j] >> 4) * d + m;
        }
    }
}

struct ggml_type_desc {
    const char* name;
    size_t block_size;
    void (*dequantize)(const void* row, float* y, int k);
    void (*random_block)(void* block); /* a block as ggml might have stored it */
};

static uint32_t rng_state = 12345;
static uint32_t next_u32(void) { /* xorshift32: deterministic, no libc rand() differences */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return rng_state;
}
static float next_gaussian(void) {
    const float u1 = ((float)(next_u32() >> 8) + 0.5f) / 16777216.0f;
    const float u2 = (float)(next_u32() >> 8) / 16777216.0f;
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
/* A positive normal fp16 between 2^-7 and 2^-5: the scale of an int8 or nibble code of a unit value. */
static ggml_half random_scale(void) { return (ggml_half)(((8u + next_u32() % 2u) << 10) | (next_u32() & 0x3FFu)); }

static void dq_q8_0(const void* r, float* y, int k) { dequantize_row_q8_0(r, y, k); }
static void dq_q4_0(const void* r, float* y, int k) { dequantize_row_q4_0(r, y, k); }
static void dq_q4_1(const void* r, float* y, int k) { dequantize_row_q4_1(r, y, k); }
static void rb_q8_0(void* p) {
    block_q8_0* b = p;
    b->d = random_scale();
    for (int j = 0; j < QK8_0; ++j) b->qs[j] = (int8_t)((int)(next_u32() % 255u) - 127);
}
static void rb_q4_0(void* p) {
    block_q4_0* b = p;
    b->d = (ggml_half)(random_scale() + (4u << 10)); /* nibbles span 16 steps: a 16x larger scale */
    for (int j = 0; j < QK4_0 / 2; ++j) b->qs[j] = (uint8_t)next_u32();
}
static void rb_q4_1(void* p) {
    block_q4_1* b = p;
    b->d = (ggml_half)(random_scale() + (3u << 10));
    b->m = (ggml_half)(0x8000u | (uint16_t)(random_scale() + (6u << 10))); /* negative min */
    for (int j = 0; j < QK4_1 / 2; ++j) b->qs[j] = (uint8_t)next_u32();
}

static const struct ggml_type_desc kTypes[] = {
    {"q8_0", sizeof(block_q8_0), dq_q8_0, rb_q8_0},
    {"q4_0", sizeof(block_q4_0), dq_q4_0, rb_q4_0},
    {"q4_1", sizeof(block_q4_1), dq_q4_1, rb_q4_1},
};

enum { HEAD_DIM = 128, N_KV_HEADS = 2, N_HEADS = 8, N_CTX = 300 };

/* Float attention on dequantized rows: the answer kvq_attend_rows should give. */
static void float_attention(const float* q, const float* k, const float* v, float* out) {
    const int g = N_HEADS / N_KV_HEADS;
    const float scale = 1.0f / sqrtf((float)HEAD_DIM);
    static float w[N_CTX];
    for (int h = 0; h < N_HEADS; ++h) {
        const int j = h / g;
        float m = -INFINITY, sum = 0;
        for (int t = 0; t < N_CTX; ++t) {
            const float* kt = k + ((size_t)t * N_KV_HEADS + j) * HEAD_DIM;
            float s = 0;
            for (int i = 0; i < HEAD_DIM; ++i) s += q[h * HEAD_DIM + i] * kt[i];
            w[t] = s * scale;
            if (w[t] > m) m = w[t];
        }
        for (int t = 0; t < N_CTX; ++t) sum += (w[t] = expf(w[t] - m));
        for (int i = 0; i < HEAD_DIM; ++i) {
            float o = 0;
            for (int t = 0; t < N_CTX; ++t) o += w[t] * v[((size_t)t * N_KV_HEADS + j) * HEAD_DIM + i];
            out[h * HEAD_DIM + i] = o / sum;
        }
    }
}

static double relative_l2(const float* a, const float* ref, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        num += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        den += (double)ref[i] * ref[i];
    }
    return sqrt(num / den);
}

#define REQUIRE(cond)                                                                  \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: check failed: %s (%s)\n", __FILE__, __LINE__, #cond, \
                    kvq_last_error());                                                 \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

int main(void) {
    const size_t n_rows = (size_t)N_CTX * N_KV_HEADS;
    float* x = malloc(n_rows * HEAD_DIM * sizeof(float));
    float* ggml_view = malloc(n_rows * HEAD_DIM * sizeof(float));
    float* kvq_view = malloc(n_rows * HEAD_DIM * sizeof(float));
    float* k_deq = malloc(n_rows * HEAD_DIM * sizeof(float));
    float* v_deq = malloc(n_rows * HEAD_DIM * sizeof(float));
    float q[N_HEADS * HEAD_DIM], out[N_HEADS * HEAD_DIM], ref[N_HEADS * HEAD_DIM];
    REQUIRE(x && ggml_view && kvq_view && k_deq && v_deq);
    for (int i = 0; i < N_HEADS * HEAD_DIM; ++i) q[i] = next_gaussian();

    printf("%-5s %9s %10s %22s %22s %24s\n", "type", "row bytes", "bits/value", "kvq->ggml max|diff|",
           "ggml->kvq max|diff|", "attention rel. L2 error");
    for (size_t ti = 0; ti < sizeof kTypes / sizeof kTypes[0]; ++ti) {
        const struct ggml_type_desc* type = &kTypes[ti];
        int32_t id;
        kvq_codec_info info = kvq_codec_info_init();
        REQUIRE(kvq_codec_lookup(type->name, &id) == KVQ_OK);
        REQUIRE(kvq_codec_get_info(id, &info) == KVQ_OK);
        REQUIRE(info.ggml_layout == 1 && info.block == 32 && (size_t)info.bytes_per_block == type->block_size);

        kvq_codec* codec;
        REQUIRE(kvq_codec_create(type->name, HEAD_DIM, KVQ_DEFAULT_SEED, &codec) == KVQ_OK);
        const size_t row_bytes = kvq_codec_row_bytes(codec);
        REQUIRE(row_bytes == HEAD_DIM / 32 * type->block_size); /* a row is exactly ggml's blocks */
        /* ggml KV tensors: [head_dim, n_kv_heads, n_ctx], nb1 = row bytes, nb2 = n_kv_heads rows. */
        const size_t nb1 = row_bytes, nb2 = N_KV_HEADS * row_bytes;
        uint8_t* k_tensor = malloc(N_CTX * nb2);
        uint8_t* v_tensor = malloc(N_CTX * nb2);
        REQUIRE(k_tensor && v_tensor);

        /* 1. kvq -> ggml: kvq writes its blocks into a ggml-layout buffer; ggml's dequantization reads
         *    the same values kvq's does (bit for bit) and they are close to the input. */
        for (size_t i = 0; i < n_rows * HEAD_DIM; ++i) x[i] = next_gaussian();
        REQUIRE(kvq_codec_quantize_rows(codec, x, n_rows, k_tensor, nb1) == KVQ_OK);
        REQUIRE(kvq_codec_dequantize_rows(codec, k_tensor, n_rows, kvq_view, 0) == KVQ_OK);
        float kvq_to_ggml = 0;
        for (size_t r = 0; r < n_rows; ++r) {
            type->dequantize(k_tensor + r * nb1, ggml_view + r * HEAD_DIM, HEAD_DIM);
        }
        for (size_t i = 0; i < n_rows * HEAD_DIM; ++i) kvq_to_ggml = fmaxf(kvq_to_ggml, fabsf(ggml_view[i] - kvq_view[i]));
        REQUIRE(kvq_to_ggml == 0.0f);
        REQUIRE(relative_l2(ggml_view, x, n_rows * HEAD_DIM) < 0.12); /* 4-bit round trip: ~0.1 */

        /* 2. ggml -> kvq: blocks as ggml stored them in an engine's K and V tensors; kvq reads them with
         *    the tensor's strides and attends over them. */
        for (size_t r = 0; r < n_rows; ++r) {
            for (int b = 0; b < HEAD_DIM / 32; ++b) {
                type->random_block(k_tensor + r * nb1 + b * type->block_size);
                type->random_block(v_tensor + r * nb1 + b * type->block_size);
            }
            type->dequantize(k_tensor + r * nb1, k_deq + r * HEAD_DIM, HEAD_DIM);
            type->dequantize(v_tensor + r * nb1, v_deq + r * HEAD_DIM, HEAD_DIM);
        }
        REQUIRE(kvq_codec_dequantize_rows(codec, k_tensor, n_rows, kvq_view, nb1) == KVQ_OK);
        float ggml_to_kvq = 0;
        for (size_t i = 0; i < n_rows * HEAD_DIM; ++i) ggml_to_kvq = fmaxf(ggml_to_kvq, fabsf(k_deq[i] - kvq_view[i]));
        REQUIRE(ggml_to_kvq == 0.0f);
        REQUIRE(kvq_attend_rows(codec, codec, N_HEADS, N_KV_HEADS, q, k_tensor, nb2, nb1, v_tensor, nb2, nb1,
                                N_CTX, 0.0f, out) == KVQ_OK);
        float_attention(q, k_deq, v_deq, ref);
        /* kvq scores q8_0/q4_x keys against the query quantized to 8 bits per block, as ggml does, so the
         * output differs from float attention on the same rows by that rounding only. */
        const double err = relative_l2(out, ref, N_HEADS * HEAD_DIM);
        REQUIRE(err < 0.02);
        printf("%-5s %9zu %10.2f %22g %22g %24.2e\n", type->name, row_bytes, kvq_codec_bits_per_value(codec),
               kvq_to_ggml, ggml_to_kvq, err);
        free(k_tensor);
        free(v_tensor);
        kvq_codec_destroy(codec);
    }
    free(x);
    free(ggml_view);
    free(kvq_view);
    free(k_deq);
    free(v_deq);
    printf("ok: kvq rows are ggml blocks for q8_0, q4_0 and q4_1\n");
    return 0;
}
