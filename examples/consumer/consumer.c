/* A C program built against an installed kvq (see CMakeLists.txt here): checks the header and library
 * versions agree, lists the codec table, attends over rows it quantized itself and through a cache. */
#include <kvq/kvq.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int main(void) {
    if (kvq_version() >> 16 != KVQ_VERSION_MAJOR) {
        fprintf(stderr, "kvq.h is %s but libkvq is %s\n", KVQ_VERSION_STRING, kvq_version_string());
        return 1;
    }
    printf("kvq %s:", kvq_version_string());
    for (int32_t id = 0; id < kvq_codec_count(); ++id) {
        kvq_codec_info info = kvq_codec_info_init();
        if (kvq_codec_get_info(id, &info) == KVQ_OK) printf(" %s", info.name);
    }
    printf("\n");

    enum { D = 64, T = 16 };
    float k[T * D], v[T * D], q[D], out[D];
    for (int i = 0; i < T * D; ++i) {
        k[i] = sinf(0.37f * i);
        v[i] = cosf(0.11f * i);
    }
    for (int i = 0; i < D; ++i) q[i] = cosf(0.5f * i);
    kvq_codec *keys = NULL, *values = NULL;
    unsigned char krows[T * 2 * 34], vrows[T * 2 * 18];
    if (kvq_codec_create("q8_0", D, KVQ_DEFAULT_SEED, &keys) != KVQ_OK ||
        kvq_codec_create("q4_0", D, KVQ_DEFAULT_SEED, &values) != KVQ_OK ||
        kvq_codec_quantize_rows(keys, k, T, krows, 0) != KVQ_OK ||
        kvq_codec_quantize_rows(values, v, T, vrows, 0) != KVQ_OK ||
        kvq_attend_rows(keys, values, 1, 1, q, krows, 0, 0, vrows, 0, 0, T, 0.0f, out) != KVQ_OK) {
        fprintf(stderr, "kvq: %s\n", kvq_last_error());
        return 1;
    }
    printf("attention over %d q8_0/q4_0 rows: out[0..2] = %.4f %.4f %.4f\n", T, out[0], out[1], out[2]);
    kvq_codec_destroy(keys);
    kvq_codec_destroy(values);

    /* The same rows through a cache (one layer, one head). Its open block stays float32 until it fills
     * (seal = KVQ_SEAL_ON_BLOCK_FULL), so the output differs slightly from the all-quantized one above. */
    kvq_cache_params p = kvq_cache_params_default();
    p.head_dim = D;
    kvq_cache* cache = NULL;
    int64_t seq;
    float cached[D];
    if (kvq_cache_create(&p, &cache) != KVQ_OK || kvq_cache_add_sequence(cache, &seq) != KVQ_OK ||
        kvq_cache_append(cache, 0, seq, k, v, T) != KVQ_OK || kvq_cache_attend(cache, 0, seq, q, cached) != KVQ_OK) {
        fprintf(stderr, "kvq: %s\n", kvq_last_error());
        kvq_cache_destroy(cache);
        return 1;
    }
    printf("cache: %.0f bytes per token, out[0..2] = %.4f %.4f %.4f\n", kvq_cache_bytes_per_token(cache), cached[0],
           cached[1], cached[2]);
    kvq_cache_destroy(cache);
    return 0;
}
