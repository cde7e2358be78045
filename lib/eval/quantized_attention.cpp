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
// value_blocks receive the blocks' addresses (the source refers to them). v without rows: a latent, whose
// values are its key rows' leading bytes (as a latent cache's block layout places them).
RowSource row_source(const QuantizedKeys& k, const QuantizedValues& v, size_t first, size_t n_rows,
                     std::vector<uint8_t*>& key_blocks, std::vector<uint8_t*>& value_blocks) {
    const KeyFormat& keys = *k.format;
    const ValueFormat& values = *v.format;
    if (values.block_tokens() != keys.block_tokens()) throw std::logic_error("quantized_attention: blocks of different sizes");
    const size_t bt = static_cast<size_t>(keys.block_tokens()), b0 = first / bt, b1 = (n_rows + bt - 1) / bt;
    key_blocks.clear();
    value_blocks.clear();
    for (size_t b = b0; b < b1; ++b) {  // the engine reads through these pointers only
        key_blocks.push_back(const_cast<uint8_t*>(k.rows.data() + b * k.block_bytes));
        if (!v.rows.empty()) value_blocks.push_back(const_cast<uint8_t*>(v.rows.data() + b * v.block_bytes));
    }
    RowSource src;
    src.key = &keys;
    src.value = &values;
    src.layout.block_tokens = keys.block_tokens();
    src.layout.keys.side_offset = head_block(keys.rows_bytes(), keys.side_bytes()).side_offset;
    src.layout.values.side_offset = head_block(values.rows_bytes(), values.side_bytes()).side_offset;
    src.blocks = key_blocks;
    src.value_blocks = value_blocks;
    if (v.rows.empty()) {  // empty value_blocks: the values are in the key blocks, at the key rows' stride
        src.layout.values.side_offset = kNoSide;
        src.layout.values.row_stride = keys.row_bytes();
    }
    src.first_row = first - b0 * bt;
    src.end_row = n_rows - (b1 - 1) * bt;
    return src;
}

// n_rows rows of head_dim floats sealed by a format, block by block, each block a head's alone.
template <class Format>
QuantizedRows<Format> quantize(const Format& format, const float* x, size_t n_rows) {
    const size_t d = static_cast<size_t>(format.head_dim()), bt = static_cast<size_t>(format.block_tokens());
    const HeadBlock place = head_block(format.rows_bytes(), format.side_bytes());
    QuantizedRows<Format> out;
    out.format = &format;
    out.block_bytes = place.bytes;
    const size_t n_blocks = (n_rows + bt - 1) / bt;
    out.rows.resize(n_blocks * out.block_bytes);
    for (size_t b = 0; b < n_blocks; ++b) {
        const size_t first = b * bt, n = std::min(bt, n_rows - first);
        uint8_t* block = out.rows.data() + b * out.block_bytes;
        format.seal(x + first * d, n, first, {block, place.side_offset == kNoSide ? nullptr : block + place.side_offset, format.row_bytes()});
    }
    return out;
}

}  // namespace

QuantizedKeys quantize_keys(const KeyFormat& format, const float* k, size_t n_rows) { return quantize(format, k, n_rows); }

QuantizedValues quantize_values(const ValueFormat& format, const float* v, size_t n_rows) {
    // What Codec::quantize_rows refuses (NanPolicy::reject): a row with NaN or Inf, or beyond the codec's range.
    const InputLimit limit = format.input_limit();
    const int d = format.head_dim();
    for (size_t r = 0; r < n_rows; ++r) {
        if (!limit.admits(v + r * d, d)) {
            throw std::invalid_argument("value codec '" + format.name() + "': row " + std::to_string(r) +
                                        " is not finite or beyond the codec's range");
        }
    }
    return quantize(format, v, n_rows);
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

void quantized_attention(const QuantizedKeys& k, const QuantizedValues& v, const float* q, int n_q, size_t first, size_t n_rows,
                         float scale, float* scores, float* weights, float* out) {
    const size_t n = n_rows - first, total = size_t(n_q) * n;
    const Codec& values = v.format->codec();
    if (v.rows.empty() && (k.format->side_bytes() || v.format->side_bytes() || k.format->codec().name() != values.name() ||
                           values.rotated() || values.info().rotates || values.head_dim() > k.format->head_dim())) {
        throw std::invalid_argument("latent attention: the values (" + values.name() + ") are not the leading values of the key rows (" +
                                    k.format->name() + ")");
    }
    std::vector<uint8_t*> key_blocks, value_blocks;
    const RowSource src = row_source(k, v, first, n_rows, key_blocks, value_blocks);
    const AttentionShape shape{n_q, 1, k.format->head_dim(), scale, 0.0f, v.format->head_dim()};
    attention_scores(shape, src, q, scores);
    decode_attention(shape, std::span<const RowSource>(&src, 1), q, out, nullptr, 1);
    std::copy(scores, scores + total, weights);
    softmax_rows(weights, n_q, n, n);
}

}  // namespace kvq::detail
