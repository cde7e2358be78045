#include "quantized_attention.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "attention/engine.hpp"

namespace kvq::detail {
namespace {

// Rows first..n_rows−1 of the keys and values as one row source of the decode engine; key_blocks and
// value_blocks receive the blocks' addresses (the source refers to them). v null: a latent, whose values
// are its key rows' leading bytes (as a latent cache's block layout places them).
RowSource row_source(const QuantizedKeys& k, const ValueFormat& values, const std::vector<uint8_t>* v, size_t first, size_t n_rows,
                     std::vector<uint8_t*>& key_blocks, std::vector<uint8_t*>& value_blocks) {
    const KeyFormat& format = *k.format;
    const size_t bt = static_cast<size_t>(format.block_tokens()), b0 = first / bt, b1 = (n_rows + bt - 1) / bt;
    key_blocks.clear();
    value_blocks.clear();
    for (size_t b = b0; b < b1; ++b) {  // the engine reads through these pointers only
        key_blocks.push_back(const_cast<uint8_t*>(k.rows.data() + b * k.block_bytes));
        if (v) value_blocks.push_back(const_cast<uint8_t*>(v->data() + b * bt * values.row_bytes()));
    }
    RowSource src;
    src.key = &format;
    src.value = &values;
    src.layout.block_tokens = format.block_tokens();
    src.layout.k_side_offset = format.head_side_offset();
    src.blocks = key_blocks;
    src.value_blocks = value_blocks;
    if (!v) {  // empty value_blocks: the values are in the key blocks, at the key rows' stride
        src.layout.v_row_stride = format.row_bytes();
    }
    src.first_row = first - b0 * bt;
    src.end_row = n_rows - (b1 - 1) * bt;
    return src;
}

}  // namespace

QuantizedKeys quantize_keys(const KeyFormat& format, const float* k, size_t n_rows) {
    const size_t d = static_cast<size_t>(format.head_dim()), bt = static_cast<size_t>(format.block_tokens());
    QuantizedKeys out;
    out.format = &format;
    out.block_bytes = format.head_block_bytes();
    const size_t n_blocks = (n_rows + bt - 1) / bt;
    out.rows.resize(n_blocks * out.block_bytes);
    for (size_t b = 0; b < n_blocks; ++b) {
        const size_t first = b * bt, n = std::min(bt, n_rows - first);
        uint8_t* block = out.rows.data() + b * out.block_bytes;
        const size_t side = format.head_side_offset();
        format.seal(k + first * d, n, first, {block, side == kNoKeySide ? nullptr : block + side, format.row_bytes()});
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

void quantized_attention(const QuantizedKeys& k, const Codec& values, const std::vector<uint8_t>* v,
                         const float* q, int n_q, size_t first, size_t n_rows, float scale, float* scores, float* weights,
                         float* out, bool int8_value_weights) {
    const size_t d = static_cast<size_t>(k.format->head_dim()), n = n_rows - first, total = size_t(n_q) * n;
    if (!v && (k.format->head_side_offset() != kNoKeySide || k.format->codec().name() != values.name() || values.rotated() || values.info().rotates ||
               values.head_dim() > k.format->head_dim())) {
        throw std::invalid_argument("latent attention: the values (" + values.name() + ") are not the leading values of the key rows (" +
                                    k.format->name() + ")");
    }
    std::vector<uint8_t*> key_blocks, value_blocks;
    const auto value_format = make_value_format(values, int8_value_weights);
    const RowSource src = row_source(k, *value_format, v, first, n_rows, key_blocks, value_blocks);
    const AttentionShape shape{n_q, 1, static_cast<int>(d), scale, 0.0f, values.head_dim()};
    attention_scores(shape, src, q, scores);
    decode_attention(shape, std::span<const RowSource>(&src, 1), q, out, nullptr, 1);
    std::copy(scores, scores + total, weights);
    softmax_rows(weights, n_q, n, n);
}

}  // namespace kvq::detail
