// kvq::attend_rows (include/kvq/attention.hpp): caller-owned rows as the row source of the decode engine,
// in virtual blocks of kChunkTokens tokens (the scores of one block are the only scratch).
#include "kvq/attention.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "../util/checked_size.hpp"
#include "decode_attention.hpp"

namespace kvq {
namespace {

constexpr size_t kChunkTokens = 256;

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("attend_rows: " + what); }

}  // namespace

void attend_rows(const Codec& keys, const Codec& values, int n_heads, int n_kv_heads, const float* q, RowsView k,
                 RowsView v, size_t n_tokens, float* out, float scale, float softcap) {
    const int d = keys.head_dim();
    if (keys.info().per_channel || values.info().per_channel) {
        bad("'" + (keys.info().per_channel ? keys : values).name() +
            "' is a per-channel key codec: its rows need their block's minimums and steps, which only a KVCache holds");
    }
    if (values.head_dim() != d) {
        bad("the key codec has head_dim " + std::to_string(d) + ", the value codec " + std::to_string(values.head_dim()));
    }
    if (n_kv_heads <= 0 || n_heads <= 0 || n_heads % n_kv_heads != 0) {
        bad("n_heads (" + std::to_string(n_heads) + ") must be a positive multiple of n_kv_heads (" +
            std::to_string(n_kv_heads) + ")");
    }
    if (!q || !out || (n_tokens > 0 && (!k.data || !v.data))) bad("null pointer");
    if (!std::isfinite(scale) || scale < 0 || !std::isfinite(softcap) || softcap < 0) bad("scale and softcap must be finite and >= 0");
    const size_t n_q_values = static_cast<size_t>(n_heads) * d;
    for (size_t i = 0; i < n_q_values; ++i) {
        if (!std::isfinite(q[i])) bad("the query is not finite (NaN or Inf) at value " + std::to_string(i));
    }
    if (k.head_stride == 0) k.head_stride = keys.row_bytes();
    if (v.head_stride == 0) v.head_stride = values.row_bytes();
    if (k.token_stride == 0) k.token_stride = static_cast<size_t>(n_kv_heads) * keys.row_bytes();
    if (v.token_stride == 0) v.token_stride = static_cast<size_t>(n_kv_heads) * values.row_bytes();
    // The rows' extents, checked before a row is read (n_tokens, the strides and n_kv_heads come from the caller).
    using detail::strided;
    detail::check_buffer_sizes(
        {{"k", strided(n_tokens, k.token_stride, strided(n_kv_heads, k.head_stride, keys.row_bytes())),
          "n_tokens tokens token_stride apart, each n_kv_heads rows head_stride apart"},
         {"v", strided(n_tokens, v.token_stride, strided(n_kv_heads, v.head_stride, values.row_bytes())),
          "n_tokens tokens token_stride apart, each n_kv_heads rows head_stride apart"}},
        [] { return "attend_rows"; });
    if (n_tokens > 1 && (k.token_stride < keys.row_bytes() || v.token_stride < values.row_bytes())) {
        bad("a token stride is smaller than the row bytes");
    }
    if (n_tokens == 0) {
        std::fill(out, out + n_q_values, 0.0f);
        return;
    }
    const size_t n_blocks = (n_tokens + kChunkTokens - 1) / kChunkTokens;
    std::vector<uint8_t*> kb(n_blocks), vb(n_blocks);
    for (size_t b = 0; b < n_blocks; ++b) {
        // The engine reads through these pointers only.
        kb[b] = const_cast<uint8_t*>(static_cast<const uint8_t*>(k.data)) + b * kChunkTokens * k.token_stride;
        vb[b] = const_cast<uint8_t*>(static_cast<const uint8_t*>(v.data)) + b * kChunkTokens * v.token_stride;
    }
    detail::RowSource src;
    src.key = &detail::impl_of(keys);
    src.value = &detail::impl_of(values);
    src.layout.block_tokens = static_cast<int>(kChunkTokens);
    src.layout.k_head_stride = k.head_stride;
    src.layout.v_head_stride = v.head_stride;
    src.layout.k_row_stride = k.token_stride;
    src.layout.v_row_stride = v.token_stride;
    src.blocks = kb;
    src.value_blocks = vb;
    src.first_row = 0;
    src.end_row = n_tokens - (n_blocks - 1) * kChunkTokens;
    const detail::AttentionShape shape{n_heads, n_kv_heads, d, scale > 0 ? scale : 1.0f / std::sqrt(static_cast<float>(d)),
                                       softcap};
    detail::decode_attention(shape, std::span<const detail::RowSource>(&src, 1), q, out, nullptr, 1);
}

}  // namespace kvq
