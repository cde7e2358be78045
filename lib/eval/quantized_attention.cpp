#include "quantized_attention.hpp"

#include <algorithm>
#include <cmath>
#include <span>
#include <stdexcept>
#include <string>

#include "attention/decode_attention.hpp"
#include "codec/centering.hpp"
#include "spec/half.hpp"

namespace kvq::detail {
namespace {

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

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
    src.blocks = key_blocks;
    src.value_blocks = value_blocks;
    src.first_row = first - b0 * bt;
    src.end_row = n_rows - (b1 - 1) * bt;
    return src;
}

// Per-channel keys' scores: per block, q·min once, then the codes against q scaled channel by channel by
// the steps (unscaled; n = n_rows − first per query).
void channel_scores(const QuantizedKeys& k, const float* q, int n_q, size_t d, size_t first, size_t n_rows, float* scores) {
    const size_t bt = k.block_tokens, n = n_rows - first;
    std::vector<float> qs(d);
    for (int i = 0; i < n_q; ++i) {
        for (size_t start = first; start < n_rows;) {
            const size_t block = start / bt, end = std::min(n_rows, (block + 1) * bt);
            const float* mn = k.mins.data() + block * d;
            const float* st = k.steps.data() + block * d;
            float base = 0;
            for (size_t j = 0; j < d; ++j) base += q[i * d + j] * mn[j], qs[j] = q[i * d + j] * st[j];
            for (size_t r = start; r < end; ++r) {
                const uint8_t* code = k.rows.data() + r * d;
                float dot = 0;
                for (size_t j = 0; j < d; ++j) dot += qs[j] * static_cast<float>(code[j]);
                scores[i * n + (r - first)] = base + dot;
            }
            start = end;
        }
    }
}

}  // namespace

QuantizedKeys quantize_keys(const Codec& codec, const float* k, size_t n_rows, bool center, int block_tokens) {
    const size_t d = codec.head_dim(), bt = static_cast<size_t>(block_tokens);
    QuantizedKeys out;
    out.block_tokens = block_tokens;
    out.centered = center;
    out.mean_offset = round_up(bt * codec.row_bytes(), 64);
    out.block_bytes = center ? round_up(out.mean_offset + d * sizeof(uint16_t), 64) : bt * codec.row_bytes();
    const size_t n_blocks = (n_rows + bt - 1) / bt;
    out.rows.resize(n_blocks * out.block_bytes);
    std::vector<float> centered(center ? bt * d : 0);
    for (size_t b = 0; b < n_blocks; ++b) {
        const size_t first = b * bt, n = std::min(bt, n_rows - first);
        uint8_t* block = out.rows.data() + b * out.block_bytes;
        const float* rows = k + first * d;
        if (center) {  // as the cache seals a block (a partial last block: the mean of its rows)
            center_block(rows, d, n, static_cast<int>(d), reinterpret_cast<uint16_t*>(block + out.mean_offset), centered.data());
            rows = centered.data();
        }
        codec.quantize_rows(rows, n, block);
    }
    return out;
}

QuantizedKeys quantize_channel_keys(const float* k, size_t n_rows, int head_dim, int bits, int block_tokens) {
    const size_t d = head_dim;
    const int top = (1 << bits) - 1;
    QuantizedKeys out;
    out.channel_bits = bits;
    out.block_tokens = block_tokens;
    const size_t n_blocks = (n_rows + block_tokens - 1) / block_tokens;
    out.rows.resize(n_rows * d);
    out.mins.resize(n_blocks * d);
    out.steps.resize(n_blocks * d);
    auto f16 = [](float x) { return f16_to_f32(f32_to_f16(x)); };
    for (size_t b = 0; b < n_blocks; ++b) {
        const size_t first = b * block_tokens, n = std::min<size_t>(block_tokens, n_rows - first);
        for (size_t j = 0; j < d; ++j) {
            float lo = k[first * d + j], hi = lo;
            for (size_t r = 1; r < n; ++r) lo = std::min(lo, k[(first + r) * d + j]), hi = std::max(hi, k[(first + r) * d + j]);
            const float mn = f16(lo), step = f16((hi - lo) / static_cast<float>(top));
            if (!std::isfinite(mn) || !std::isfinite(step)) {
                throw std::invalid_argument("chan" + std::to_string(bits) + " keys: channel " + std::to_string(j) + " of block " +
                                            std::to_string(b) + " has a minimum or step beyond fp16 (keys not finite, or a range over 65504)");
            }
            out.mins[b * d + j] = mn;
            out.steps[b * d + j] = step;
            const float inv = step > 0 ? 1.0f / step : 0.0f;
            for (size_t r = 0; r < n; ++r) {
                const float c = std::round((k[(first + r) * d + j] - mn) * inv);
                out.rows[(first + r) * d + j] = static_cast<uint8_t>(std::clamp(c, 0.0f, static_cast<float>(top)));
            }
        }
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
                         float* out) {
    const size_t d = keys.head_dim(), n = n_rows - first, total = size_t(n_q) * n;
    if (k.channel_bits) {
        // The decode engine cannot hold per-channel keys (its key codecs code rows; here a block's rows share
        // one minimum and step per channel): their path stays this loop of its own.
        channel_scores(k, q, n_q, d, first, n_rows, scores);
        for (size_t i = 0; i < total; ++i) weights[i] = scores[i] *= scale;
        softmax_rows(weights, n_q, n, n);
        std::fill(out, out + size_t(n_q) * d, 0.0f);
        values.accumulate_rows(weights, n, n_q, v.data() + first * values.row_bytes(), n, out);
        values.finish_accumulate(out, n_q);
        return;
    }
    std::vector<uint8_t*> key_blocks, value_blocks;
    const RowSource src = row_source(keys, k, values, v, first, n_rows, key_blocks, value_blocks);
    const AttentionShape shape{n_q, 1, static_cast<int>(d), scale, 0.0f};
    attention_scores(shape, src, q, scores);
    decode_attention(shape, std::span<const RowSource>(&src, 1), q, out, nullptr, 1);
    std::copy(scores, scores + total, weights);
    softmax_rows(weights, n_q, n, n);
}

}  // namespace kvq::detail
