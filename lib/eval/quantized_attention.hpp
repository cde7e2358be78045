// Decode attention on quantized rows for the sweep's error measurement: keys and values sealed block by
// block by their formats (lib/codec/key_format.hpp, value_format.hpp; centered, per-channel, ... as the
// cache seals them), one kv head per block, laid out as a row source of the cache's decode engine
// (lib/attention/engine.hpp), which computes the output; its scoring step gives the scores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/key_format.hpp"
#include "codec/value_format.hpp"
#include "kvq/codec.hpp"

namespace kvq::detail {

// Blocks of block_tokens rows (the last may hold fewer) of one kv head as a format seals them, block b at
// rows + b·block_bytes (lib/codec/block_layout.hpp: head_block).
template <class Format>
struct QuantizedRows {
    const Format* format = nullptr;  // the caller's, which must outlive this
    std::vector<uint8_t> rows;
    size_t block_bytes = 0;
};
using QuantizedKeys = QuantizedRows<KeyFormat>;
using QuantizedValues = QuantizedRows<ValueFormat>;

// k (v): n_rows × head_dim floats, sealed block by block (a partial last block: over its own rows). Throws
// std::invalid_argument if the format cannot seal them (side data beyond fp16).
QuantizedKeys quantize_keys(const KeyFormat& format, const float* k, size_t n_rows);
QuantizedValues quantize_values(const ValueFormat& format, const float* v, size_t n_rows);

// Row-wise softmax in place over n columns of rows `stride` floats apart.
void softmax_rows(float* s, int n_q, size_t n, size_t stride);

// Decode attention of n_q queries (q: n_q × head_dim, finite) over rows first..n_rows−1 (first > 0: a
// sliding window; blocks stay aligned to row 0, as in the cache); writes the scaled scores and weights
// (n_q × (n_rows − first)) and out (n_q × head_dim of the values). The keys' and values' blocks must be of
// the same block_tokens. A latent's values (DeepSeek's MLA; latent_values) have no rows of their own: they
// are read in place from the key rows' leading bytes, as a latent KVCache's block layout places them (the
// key format's rows must be the value format's codec's rows of more values, without side data). The
// output is the decode engine's (one thread), bit for bit what KVCache::attend gives on the same bytes
// (with the value format's int8_value_weights); the weights are a plain softmax of the scores (a
// measurement).
void quantized_attention(const QuantizedKeys& k, const QuantizedValues& v, const float* q, int n_q, size_t first, size_t n_rows,
                         float scale, float* scores, float* weights, float* out);
// A latent's values: a value format's, read from the key rows (QuantizedValues without rows).
inline QuantizedValues latent_values(const ValueFormat& format) { return {&format, {}, 0}; }

}  // namespace kvq::detail
