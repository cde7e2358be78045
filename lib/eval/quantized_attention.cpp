#include "quantized_attention.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "attention/decode_attention.hpp"
#include "codec/centering.hpp"
#include "codec/channel_keys.hpp"
#include "codec/key_format.hpp"

namespace kvq::detail {
namespace {

// Rows first..n_rows−1 of the keys and values as one row source of the decode engine; key_blocks and
// value_blocks receive the blocks' addresses (the source refers to them).
RowSource row_source(const Codec& keys, const QuantizedKeys& k, const Codec& values, const std::vector<uint8_t>& v,
                     size_t first, size_t n_rows, std::vector<uint8_t*>& key_blocks, std::vector<uint8_t*>& value_blocks) {
    const size_t bt = static_cast<size_t>(k.block_tokens), b0 = first / bt, b1 = (n_rows + bt - 1) / bt;
    key_blocks.clear();
    value_blocks.clear();
    for (size_t b = b0; b < b1; ++b) {  // the engine reads through these pointers only
        key_blocks.push_back(const_cast<uint8_t*>(k.rows.data() + b * k.block_bytes));
        value_blocks.push_back(const_cast<uint8_t*>(v.data() + b * bt * values.row_bytes()));
    }
    RowSource src;
    src.key = &impl_of(keys);
    src.value = &impl_of(values);
    src.layout.block_tokens = k.block_tokens;
    if (k.centered) src.layout.mean_offset = k.mean_offset;
    if (k.per_channel) src.layout.channel_offset = k.channel_offset;
    src.blocks = key_blocks;
    src.value_blocks = value_blocks;
    src.first_row = first - b0 * bt;
    src.end_row = n_rows - (b1 - 1) * bt;
    return src;
}

}  // namespace

QuantizedKeys quantize_keys(const Codec& codec, const float* k, size_t n_rows, bool center, int block_tokens) {
    const size_t d = codec.head_dim(), bt = static_cast<size_t>(block_tokens);
    const int channel_bits = channel_bits_of(codec);
    QuantizedKeys out;
    // As a cache block of one kv head: the key rows, then the means or the minimums and steps.
    const KeyBlockFormat format(codec, center, block_tokens);
    out.block_tokens = block_tokens;
    out.centered = format.side() == KeySide::means;
    out.per_channel = format.side() == KeySide::channel_params;
    if (out.centered) out.mean_offset = format.head_side_offset();
    if (out.per_channel) out.channel_offset = format.head_side_offset();
    out.block_bytes = format.head_block_bytes();
    const size_t n_blocks = (n_rows + bt - 1) / bt;
    out.rows.resize(n_blocks * out.block_bytes);
    std::vector<float> centered(center ? bt * d : 0);
    for (size_t b = 0; b < n_blocks; ++b) {
        const size_t first = b * bt, n = std::min(bt, n_rows - first);
        uint8_t* block = out.rows.data() + b * out.block_bytes;
        const float* rows = k + first * d;
        if (out.per_channel) {  // as the cache seals a block (a partial last block: over its own rows)
            quantize_channel_block(rows, d, n, static_cast<int>(d), channel_bits,
                                   reinterpret_cast<uint16_t*>(block + out.channel_offset), block, codec.row_bytes());
            continue;
        }
        if (center) {  // as the cache seals a block (a partial last block: the mean of its rows)
            center_block(rows, d, n, static_cast<int>(d), reinterpret_cast<uint16_t*>(block + out.mean_offset), centered.data());
            rows = centered.data();
        }
        codec.quantize_rows(rows, n, block);
    }
    return out;
}

std::vector<uint8_t> quantize_values(const Codec& codec, const float* v, size_t n_rows) {
    std::vector<uint8_t> rows(n_rows * codec.row_bytes());
    codec.quantize_rows(v, n_rows, rows.data());
    return rows;
}

void softmax_rows(float* s, int n_q, size_t n, size_t stride) {
    for (int i = 0; i < n_q; ++i) {
        float* row = s + i * stride;
        const float m = *std::max_element(row, row + n);
        double sum = 0;
        for (size_t r = 0; r < n; ++r) sum += (row[r] = std::exp(row[r] - m));
        const float inv = static_cast<float>(1.0 / sum);
        for (size_t r = 0; r < n; ++r) row[r] *= inv;
    }
}

void quantized_attention(const Codec& keys, const QuantizedKeys& k, const Codec& values, const std::vector<uint8_t>& v,
                         const float* q, int n_q, size_t first, size_t n_rows, float scale, float* scores, float* weights,
                         float* out, bool int8_value_weights) {
    const size_t d = keys.head_dim(), n = n_rows - first, total = size_t(n_q) * n;
    std::vector<uint8_t*> key_blocks, value_blocks;
    const RowSource src = row_source(keys, k, values, v, first, n_rows, key_blocks, value_blocks);
    AttentionShape shape{n_q, 1, static_cast<int>(d), scale, 0.0f};
    shape.grid_values = int8_value_weights;
    attention_scores(shape, src, q, scores);
    decode_attention(shape, std::span<const RowSource>(&src, 1), q, out, nullptr, 1);
    std::copy(scores, scores + total, weights);
    softmax_rows(weights, n_q, n, n);
}

}  // namespace kvq::detail
