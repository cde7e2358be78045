// Decode attention over key and value rows that the caller owns (for example the rows of a ggml KV
// tensor [head_dim, n_kv_heads, n_ctx] with its strides nb[1], nb[2]), computed on the codes with the
// same engine as KVCache::attend: per kv head, the g = n_heads / n_kv_heads queries scored together, an
// online softmax, the values accumulated straight from their codes; no dequantized copy is made and the
// scratch memory does not grow with the context.
#pragma once

#include <cstddef>

#include "kvq/codec.hpp"

namespace kvq {

struct RowsView {
    const void* data = nullptr;
    size_t token_stride = 0;  // bytes from token t to t + 1; 0: n_kv_heads rows, packed
    size_t head_stride = 0;   // bytes from kv head h to h + 1; 0: one row
};

// out (n_heads × head_dim) = softmax(scale · q·k) · v over n_tokens tokens; row of kv head h, token t
// at data + t·token_stride + h·head_stride. scale 0 means 1/sqrt(head_dim); softcap c > 0 maps each
// scaled score s to c·tanh(s/c). Throws std::invalid_argument for a bad shape, stride or head size, or
// a query that is not finite; n_tokens = 0 gives zeros. The rows must hold finite values as the codecs
// store them (what Codec::quantize_rows writes).
void attend_rows(const Codec& keys, const Codec& values, int n_heads, int n_kv_heads, const float* q, RowsView k,
                 RowsView v, size_t n_tokens, float* out, float scale = 0.0f, float softcap = 0.0f);

}  // namespace kvq
