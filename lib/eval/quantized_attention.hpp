// Decode attention on quantized rows for the sweep's error measurement: keys sealed block by block by their
// key format (lib/codec/key_format.hpp; centered, per-channel, ... as the cache seals them), one kv head
// per block, and values laid out as row sources of the cache's decode engine
// (lib/attention/engine.hpp), which computes the output; its scoring step gives the scores.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "codec/key_format.hpp"
#include "kvq/codec.hpp"

namespace kvq::detail {

struct QuantizedKeys {
    // Blocks of block_tokens rows (the last may hold fewer) of one kv head as the format seals them, block b
    // at rows + b·block_bytes (its head_block_bytes).
    const KeyFormat* format = nullptr;  // the caller's, which must outlive this
    std::vector<uint8_t> rows;
    size_t block_bytes = 0;
};

// k: n_rows × head_dim floats, sealed block by block (a partial last block: over its own rows). Throws
// std::invalid_argument if the format cannot seal them (side data beyond fp16).
QuantizedKeys quantize_keys(const KeyFormat& format, const float* k, size_t n_rows);
std::vector<uint8_t> quantize_values(const Codec& codec, const float* v, size_t n_rows);

// Row-wise softmax in place over n columns of rows `stride` floats apart.
void softmax_rows(float* s, int n_q, size_t n, size_t stride);

// Decode attention of n_q queries (q: n_q × head_dim, finite) over rows first..n_rows−1 (first > 0: a
// sliding window; blocks stay aligned to row 0, as in the cache); writes the scaled scores and weights
// (n_q × (n_rows − first)) and out (n_q × values.head_dim()). v: the value rows of `values`, or null for a
// latent (DeepSeek's MLA): the values are read in place from the key rows' leading bytes, as a latent
// KVCache reads them (the key format's rows must be `values`' codec's rows of more values, without side
// data). Row-wise keys: the output is the decode engine's (one thread), bit for bit what KVCache::attend
// gives on the same bytes (with the same int8_value_weights); the weights are a plain softmax of the
// scores (a measurement).
void quantized_attention(const QuantizedKeys& k, const Codec& values,
                         const std::vector<uint8_t>* v, const float* q, int n_q, size_t first, size_t n_rows,
                         float scale, float* scores, float* weights, float* out, bool int8_value_weights = false);
inline void quantized_attention(const QuantizedKeys& k, const Codec& values, const std::vector<uint8_t>& v, const float* q,
                                int n_q, size_t first, size_t n_rows, float scale, float* scores, float* weights, float* out,
                                bool int8_value_weights = false) {
    quantized_attention(k, values, &v, q, n_q, first, n_rows, scale, scores, weights, out, int8_value_weights);
}

}  // namespace kvq::detail
