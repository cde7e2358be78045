// The C API of the codec table and of codecs working on rows (kvq/codec.hpp behind kvq.h).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "boundary.hpp"

namespace kvq::capi {
namespace {

// Never change: the struct's size in the first release (see the ABI notes in kvq.h), which ended at layout.
constexpr size_t kCodecInfoSizeV1 = offsetof(kvq_codec_info, ggml_type);
static_assert(sizeof(void*) != 8 || kCodecInfoSizeV1 == 48);

// The table as C sees it: names and layouts need storage that outlives every call.
const std::vector<CodecInfo>& table() {
    static const std::vector<CodecInfo> rows = [] {
        std::vector<CodecInfo> r;
        for (const auto& name : codec_names()) r.push_back(codec_info(name));
        return r;
    }();
    return rows;
}

}  // namespace

}  // namespace kvq::capi

using kvq::capi::fail;
using kvq::capi::guarded;

extern "C" {

int32_t kvq_codec_count(void) {
    try {
        return static_cast<int32_t>(kvq::capi::table().size());
    } catch (...) {
        return 0;  // only if building the table ran out of memory
    }
}

kvq_status kvq_codec_get_info(int32_t id, kvq_codec_info* info) {
    return guarded([&] {
        const auto& rows = kvq::capi::table();
        if (id < 0 || static_cast<size_t>(id) >= rows.size()) {
            return fail(KVQ_ERR_UNKNOWN_CODEC, "kvq_codec_get_info: codec id " + std::to_string(id) +
                                                   " is outside 0.." + std::to_string(rows.size() - 1));
        }
        const auto& row = rows[id];
        kvq_codec_info from = kvq_codec_info_init();
        from.name = row.name.c_str();
        from.block = row.block;
        from.bytes_per_block = row.bytes_per_block;
        from.bits_per_value = 8.0 * row.bytes_per_block / row.block;
        from.ggml_layout = row.ggml_layout ? 1 : 0;
        from.layout = row.layout.c_str();
        from.ggml_type = row.ggml_type;
        return kvq::capi::write_versioned(from, kvq::capi::kCodecInfoSizeV1, info);
    });
}

kvq_status kvq_codec_lookup(const char* name, int32_t* id) {
    return guarded([&] {
        if (!name || !id) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_lookup: NULL argument");
        const auto& rows = kvq::capi::table();
        for (size_t i = 0; i < rows.size(); ++i) {
            if (rows[i].name == name) {
                *id = static_cast<int32_t>(i);
                return KVQ_OK;
            }
        }
        std::string known;
        for (const auto& row : rows) known += (known.empty() ? "" : ", ") + row.name;
        return fail(KVQ_ERR_UNKNOWN_CODEC,
                    "kvq_codec_lookup: unknown codec '" + std::string(name) + "' (known: " + known + ")");
    });
}

kvq_status kvq_codec_spec_row_bytes(const char* spec, int32_t head_dim, size_t* row_bytes) {
    return guarded([&] {
        if (!row_bytes) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_spec_row_bytes: row_bytes is NULL");
        if (!spec) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_spec_row_bytes: spec is NULL");
        *row_bytes = kvq::Codec::make(spec, head_dim, KVQ_DEFAULT_SEED).row_bytes();
        return KVQ_OK;
    });
}

kvq_status kvq_codec_create(const char* spec, int32_t head_dim, uint64_t seed, kvq_codec** codec) {
    return guarded([&] {
        if (!codec) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_create: codec is NULL");
        if (!spec) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_create: spec is NULL");
        *codec = new kvq_codec{kvq::Codec::make(spec, head_dim, seed)};
        return KVQ_OK;
    });
}

void kvq_codec_destroy(kvq_codec* codec) { delete codec; }

const char* kvq_codec_name(const kvq_codec* codec) { return codec ? codec->codec.name().c_str() : ""; }
int32_t kvq_codec_head_dim(const kvq_codec* codec) { return codec ? codec->codec.head_dim() : 0; }
size_t kvq_codec_row_bytes(const kvq_codec* codec) { return codec ? codec->codec.row_bytes() : 0; }
size_t kvq_codec_query_bytes(const kvq_codec* codec) { return codec ? codec->codec.query_bytes() : 0; }
double kvq_codec_bits_per_value(const kvq_codec* codec) { return codec ? codec->codec.bits_per_value() : 0.0; }
int32_t kvq_codec_rotated(const kvq_codec* codec) { return codec && codec->codec.rotated() ? 1 : 0; }

kvq_status kvq_codec_quantize_rows(const kvq_codec* codec, const float* x, size_t n_rows, void* dst,
                                   size_t dst_stride) {
    return guarded([&] {
        if (!codec) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_quantize_rows: codec is NULL");
        codec->codec.quantize_rows(x, n_rows, dst, dst_stride);  // NaN/Inf: NonFiniteInput (guarded)
        return KVQ_OK;
    });
}

kvq_status kvq_codec_dequantize_rows(const kvq_codec* codec, const void* src, size_t n_rows, float* y,
                                     size_t src_stride) {
    return guarded([&] {
        if (!codec) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_dequantize_rows: codec is NULL");
        codec->codec.dequantize_rows(src, n_rows, y, src_stride);
        return KVQ_OK;
    });
}

kvq_status kvq_codec_prepare_queries(const kvq_codec* codec, const float* q, int32_t n_q, void* prep) {
    return guarded([&] {
        if (!codec) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_prepare_queries: codec is NULL");
        codec->codec.prepare_queries(q, n_q, prep);  // NaN/Inf: NonFiniteInput (guarded)
        return KVQ_OK;
    });
}

kvq_status kvq_codec_score_rows(const kvq_codec* codec, const void* prep, int32_t n_q, const void* rows,
                                size_t n_rows, float* scores, size_t score_stride, size_t row_stride) {
    return guarded([&] {
        if (!codec) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_score_rows: codec is NULL");
        codec->codec.score_rows(prep, n_q, rows, n_rows, scores, score_stride, row_stride);
        return KVQ_OK;
    });
}

kvq_status kvq_codec_accumulate_rows(const kvq_codec* codec, const float* w, size_t w_stride, int32_t n_q,
                                     const void* rows, size_t n_rows, float* acc, size_t row_stride) {
    return guarded([&] {
        if (!codec) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_accumulate_rows: codec is NULL");
        codec->codec.accumulate_rows(w, w_stride, n_q, rows, n_rows, acc, row_stride);
        return KVQ_OK;
    });
}

kvq_status kvq_codec_finish_accumulate(const kvq_codec* codec, float* acc, int32_t n_q) {
    return guarded([&] {
        if (!codec) return fail(KVQ_ERR_INVALID_ARGUMENT, "kvq_codec_finish_accumulate: codec is NULL");
        codec->codec.finish_accumulate(acc, n_q);
        return KVQ_OK;
    });
}

}  // extern "C"
