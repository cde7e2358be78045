// Decode attention on quantized rows for the sweep's error measurement: keys (optionally centered per
// block, as the cache's center_keys does) and values laid out as row sources of the cache's decode engine
// (lib/attention/decode_attention.hpp), which computes the output; its scoring step gives the scores.
// Per-channel keys (chanB, lib/codec/channel_keys.hpp) are laid out as the cache seals them too: a
// block's codes, then its fp16 minimums and steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvq/codec.hpp"

namespace kvq::detail {

struct QuantizedKeys {
    // Row-wise keys: blocks of block_tokens rows (the last may hold fewer), block b at rows + b·block_bytes,
    // the key codec's rows first; centered keys have the block's head_dim fp16 means at mean_offset.
    std::vector<uint8_t> rows;
    int block_tokens = 0;
    size_t block_bytes = 0;
    bool centered = false;
    size_t mean_offset = 0;
    // Per-channel keys (a chanB codec): the block's fp16 minimums and steps at channel_offset.
    bool per_channel = false;
    size_t channel_offset = 0;
};

// k: n_rows × head_dim floats. A chanB codec (detail::make_channel_key_codec): per block and channel an
// fp16 minimum and step (a partial last block: over its own rows); throws std::invalid_argument if one
// does not fit fp16.
QuantizedKeys quantize_keys(const Codec& codec, const float* k, size_t n_rows, bool center, int block_tokens);
std::vector<uint8_t> quantize_values(const Codec& codec, const float* v, size_t n_rows);

// Row-wise softmax in place over n columns of rows `stride` floats apart.
void softmax_rows(float* s, int n_q, size_t n, size_t stride);

// Decode attention of n_q queries (q: n_q × head_dim, finite) over rows first..n_rows−1 (first > 0: a
// sliding window; blocks stay aligned to row 0, as in the cache); writes the scaled scores and weights
// (n_q × (n_rows − first)) and out (n_q × head_dim). Row-wise keys: the output is the decode engine's (one
// thread), bit for bit what KVCache::attend gives on the same bytes (with the same int8_value_weights);
// the weights are a plain softmax of the scores (a measurement).
void quantized_attention(const Codec& keys, const QuantizedKeys& k, const Codec& values,
                         const std::vector<uint8_t>& v, const float* q, int n_q, size_t first, size_t n_rows,
                         float scale, float* scores, float* weights, float* out, bool int8_value_weights = false);

}  // namespace kvq::detail
