// kvq_attend_rows: decode attention over key and value rows that the engine owns (for example the rows
// of a ggml KV tensor), with the codecs' own score and accumulate kernels. Rows are read in chunks with
// an online softmax (running max and sum), so the scratch memory does not grow with the context.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "boundary.hpp"

namespace {

constexpr size_t kChunkTokens = 256;

// One kv head: the g query heads that share it, scored together in one pass over its rows.
void attend_kv_head(const kvq::Codec& keys, const kvq::Codec& values, const float* q, int g, const uint8_t* k,
                    size_t k_stride, const uint8_t* v, size_t v_stride, size_t n_tokens, float scale, float* out) {
    const int d = keys.head_dim();
    std::vector<uint8_t> prep(static_cast<size_t>(g) * keys.query_bytes());
    keys.prepare_queries(q, g, prep.data());
    const size_t chunk = std::min(n_tokens, kChunkTokens);
    std::vector<float> w(static_cast<size_t>(g) * chunk);
    std::vector<float> acc(static_cast<size_t>(g) * d, 0.0f);
    std::vector<float> running_max(g, -std::numeric_limits<float>::infinity());
    std::vector<float> running_sum(g, 0.0f);
    for (size_t t0 = 0; t0 < n_tokens; t0 += chunk) {
        const size_t n = std::min(chunk, n_tokens - t0);
        keys.score_rows(prep.data(), g, k + t0 * k_stride, n, w.data(), chunk, k_stride);
        for (int i = 0; i < g; ++i) {
            float* wi = w.data() + static_cast<size_t>(i) * chunk;
            float m = running_max[i];
            for (size_t r = 0; r < n; ++r) {
                wi[r] *= scale;
                m = std::max(m, wi[r]);
            }
            // Rescale what was accumulated under the old maximum; the accumulator is linear in the
            // weights, so this is right in the codec's (possibly rotated) basis too.
            const float rescale = std::exp(running_max[i] - m);
            float sum = running_sum[i] * rescale;
            for (int j = 0; j < d; ++j) acc[static_cast<size_t>(i) * d + j] *= rescale;
            for (size_t r = 0; r < n; ++r) {
                wi[r] = std::exp(wi[r] - m);
                sum += wi[r];
            }
            running_max[i] = m;
            running_sum[i] = sum;
        }
        values.accumulate_rows(w.data(), chunk, g, v + t0 * v_stride, n, acc.data(), v_stride);
    }
    values.finish_accumulate(acc.data(), g);
    for (int i = 0; i < g; ++i) {
        for (int j = 0; j < d; ++j) {
            out[static_cast<size_t>(i) * d + j] = acc[static_cast<size_t>(i) * d + j] / running_sum[i];
        }
    }
}

}  // namespace

using kvq::capi::fail;

extern "C" kvq_status kvq_attend_rows(const kvq_codec* key_codec, const kvq_codec* value_codec, int32_t n_heads,
                                      int32_t n_kv_heads, const float* q, const void* k, size_t k_token_stride,
                                      size_t k_head_stride, const void* v, size_t v_token_stride,
                                      size_t v_head_stride, size_t n_tokens, float scale, float* out) {
    return kvq::capi::guarded([&] {
        if (!key_codec || !value_codec || !q || !out || (n_tokens > 0 && (!k || !v))) {
            return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_attend_rows: NULL argument");
        }
        const kvq::Codec& keys = key_codec->codec;
        const kvq::Codec& values = value_codec->codec;
        const int d = keys.head_dim();
        if (values.head_dim() != d) {
            return fail(KVQ_ERR_BAD_HEAD_DIM, "kvq_attend_rows: key codec has head_dim " + std::to_string(d) +
                                                  ", value codec " + std::to_string(values.head_dim()));
        }
        if (n_kv_heads <= 0 || n_heads <= 0 || n_heads % n_kv_heads != 0) {
            return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_attend_rows: n_heads (" + std::to_string(n_heads) +
                                                      ") must be a positive multiple of n_kv_heads (" +
                                                      std::to_string(n_kv_heads) + ")");
        }
        if (!std::isfinite(scale)) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_attend_rows: scale is not finite");
        const size_t n_q_values = static_cast<size_t>(n_heads) * d;
        if (kvq::capi::any_non_finite(q, n_q_values)) {
            return fail(KVQ_ERR_NON_FINITE, "kvq_attend_rows: the query is not finite (NaN or Inf)");
        }
        if (k_head_stride == 0) k_head_stride = keys.row_bytes();
        if (k_token_stride == 0) k_token_stride = static_cast<size_t>(n_kv_heads) * keys.row_bytes();
        if (v_head_stride == 0) v_head_stride = values.row_bytes();
        if (v_token_stride == 0) v_token_stride = static_cast<size_t>(n_kv_heads) * values.row_bytes();
        if (n_tokens > 1 && (k_token_stride < keys.row_bytes() || v_token_stride < values.row_bytes())) {
            return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_attend_rows: a token stride is smaller than the row bytes");
        }
        if (scale <= 0) scale = 1.0f / std::sqrt(static_cast<float>(d));
        if (n_tokens == 0) {
            std::fill(out, out + n_q_values, 0.0f);
            return KVQ_OK;
        }
        const int g = n_heads / n_kv_heads;
        // Into scratch first: out is written only when every head has succeeded.
        std::vector<float> result(n_q_values);
        for (int j = 0; j < n_kv_heads; ++j) {
            const size_t first = static_cast<size_t>(j) * g * d;
            attend_kv_head(keys, values, q + first, g, static_cast<const uint8_t*>(k) + j * k_head_stride,
                           k_token_stride, static_cast<const uint8_t*>(v) + j * v_head_stride, v_token_stride,
                           n_tokens, scale, result.data() + first);
        }
        std::copy(result.begin(), result.end(), out);
        return KVQ_OK;
    });
}
