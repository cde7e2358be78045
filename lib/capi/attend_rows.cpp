// kvq_attend_rows: decode attention over key and value rows that the engine owns (for example the rows
// of a ggml KV tensor): kvq::attend_rows, the cache's own decode engine, behind the C statuses.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "boundary.hpp"
#include "kvq/attention.hpp"

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
        // Into scratch first: out is written only when the call has succeeded.
        std::vector<float> result(n_q_values);
        kvq::attend_rows(keys, values, n_heads, n_kv_heads, q, {k, k_token_stride, k_head_stride},
                         {v, v_token_stride, v_head_stride}, n_tokens, result.data(), scale > 0 ? scale : 0.0f);
        std::copy(result.begin(), result.end(), out);
        return KVQ_OK;
    });
}
