// kvq_attend_rows: decode attention over key and value rows that the engine owns (for example the rows
// of a ggml KV tensor): kvq::attend_rows, the cache's own decode engine, behind the C statuses.
#include <algorithm>
#include <cstddef>
#include <functional>
#include <string>
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
        const int d = keys.head_dim();  // of the queries (the results have the value codec's)
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
        std::vector<float> result(static_cast<size_t>(n_heads) * values.head_dim());
        kvq::attend_rows(keys, values, n_heads, n_kv_heads, q, {k, k_token_stride, k_head_stride},
                         {v, v_token_stride, v_head_stride}, n_tokens, result.data(), scale > 0 ? scale : 0.0f);
        std::copy(result.begin(), result.end(), out);
        return KVQ_OK;
    });
}

namespace {

// The struct's size in the release that added it (see the ABI notes in kvq.h): never change it.
constexpr size_t kAttendOptionsSizeV1 = sizeof(kvq_attend_options);
// Input structs have no implicit padding (kvq.h ABI notes).
static_assert(sizeof(void*) != 8 || (sizeof(kvq_attend_options) == 112 && offsetof(kvq_attend_options, mask) == 56 &&
                                     offsetof(kvq_attend_options, executor) == 80 &&
                                     offsetof(kvq_attend_options, nan_policy) == 96 &&
                                     offsetof(kvq_attend_options, sinks) == 104),
              "kvq_attend_options has implicit padding");

}  // namespace

extern "C" kvq_status kvq_attend_rows_ex(const kvq_codec* key_codec, const kvq_codec* value_codec, int32_t n_heads,
                                         int32_t n_kv_heads, const float* q, const void* k, size_t k_token_stride,
                                         size_t k_head_stride, const void* v, size_t v_token_stride,
                                         size_t v_head_stride, size_t n_tokens, const kvq_attend_options* options,
                                         float* out) {
    return kvq::capi::guarded([&] {
        kvq_attend_options p = kvq_attend_options_default();
        if (const kvq_status s = kvq::capi::read_versioned(options, kAttendOptionsSizeV1, "kvq_attend_rows_ex: options is NULL", p);
            s != KVQ_OK) {
            return s;
        }
        auto bad = [](const std::string& what) { return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_attend_rows_ex: " + what); };
        if (!key_codec || !value_codec) return bad("NULL codec");
        if (p.mask_type != KVQ_MASK_F16 && p.mask_type != KVQ_MASK_F32) return bad("unknown mask_type");
        if (p.nan_policy != KVQ_NAN_REJECT && p.nan_policy != KVQ_NAN_PROPAGATE) return bad("unknown nan_policy");
        if (p.reserved != 0) return bad("reserved must be 0");
        if (!p.executor && p.executor_ctx) return bad("executor_ctx is set but executor is NULL");
        if (std::isnan(p.scale)) return bad("scale is NaN");
        kvq::AttendOptions o;
        o.scale = p.scale > 0 ? p.scale : 0.0f;
        o.softcap = p.softcap;
        o.n_queries = p.n_queries;
        o.q_head_stride = p.q_head_stride;
        o.q_row_stride = p.q_row_stride;
        o.out_head_stride = p.out_head_stride;
        o.out_row_stride = p.out_row_stride;
        o.mask = p.mask;
        o.mask_row_stride = p.mask_row_stride;
        o.sinks = p.sinks;
        o.mask_type = p.mask_type == KVQ_MASK_F32 ? kvq::MaskType::f32 : kvq::MaskType::f16;
        o.threads = p.threads;
        o.nan = p.nan_policy == KVQ_NAN_PROPAGATE ? kvq::NanPolicy::propagate : kvq::NanPolicy::reject;
        if (p.executor) {
            o.executor = [exec = p.executor, ctx = p.executor_ctx](int n, const std::function<void(int)>& task) {
                exec(ctx, n, [](void* t, int32_t i) { (*static_cast<const std::function<void(int)>*>(t))(i); },
                     const_cast<void*>(static_cast<const void*>(&task)));
            };
        }
        // Every check runs before the first result is written (kvq::attend_rows), so on failure out is unchanged.
        kvq::attend_rows(key_codec->codec, value_codec->codec, n_heads, n_kv_heads, q, {k, k_token_stride, k_head_stride},
                         {v, v_token_stride, v_head_stride}, n_tokens, out, o);
        return KVQ_OK;
    });
}
