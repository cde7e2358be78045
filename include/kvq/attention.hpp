// Decode attention over key and value rows that the caller owns (for example the rows of a ggml KV
// tensor [head_dim, n_kv_heads, n_ctx] with its strides nb[1], nb[2]), computed on the codes with the
// same engine as KVCache::attend: per kv head, the g = n_heads / n_kv_heads queries scored together, an
// online softmax, the values accumulated straight from their codes; no dequantized copy is made and the
// scratch memory does not grow with the context.
#pragma once

#include <cstddef>
#include <functional>

#include "kvq/codec.hpp"

namespace kvq {

// An engine's own threads: runs task(i) once for every i in [0, n), on any threads (the calling one
// included or not) in any order, and returns when every call has returned. task does not throw. It may
// run other work between the tasks, on the calling thread too, other kvq calls included (each call leases
// buffers of its own). An index outside [0, n), an index run twice (neither is run) or one never run
// makes the call throw ExecutorError once the executor returns; calling task after returning is undefined.
using Executor = std::function<void(int n, const std::function<void(int)>& task)>;

struct RowsView {
    const void* data = nullptr;
    size_t token_stride = 0;  // bytes from token t to t + 1; 0: n_kv_heads rows, packed
    size_t head_stride = 0;   // bytes from kv head h to h + 1; 0: one row
};

// out (n_heads × value head_dim) = softmax(scale · q·k) · v over n_tokens tokens; row of kv head h, token t
// at data + t·token_stride + h·head_stride. q has the key codec's head_dim per head, out the value codec's
// (they may differ: DeepSeek's latent attention reads 576-value keys and 512-value values, and k and v may
// be views of the same rows). scale 0 means 1/sqrt(key head_dim); softcap c > 0 maps each
// scaled score s to c·tanh(s/c). Throws std::invalid_argument for a bad shape, stride or head size, or
// a query that is not finite; n_tokens = 0 gives zeros. The rows must hold finite values as the codecs
// store them (what Codec::quantize_rows writes).
void attend_rows(const Codec& keys, const Codec& values, int n_heads, int n_kv_heads, const float* q, RowsView k,
                 RowsView v, size_t n_tokens, float* out, float scale = 0.0f, float softcap = 0.0f);

// The element type of an attention mask.
enum class MaskType { f16, f32 };

// What an engine's attention op adds to attend_rows: several query rows (the tokens of a prefill chunk, or
// a batch of sequences' tokens over the same rows), each with its own additive mask row, and threads.
// Strides count elements (floats for q and out, mask elements for the mask); 0 takes the default.
struct AttendOptions {
    float scale = 0.0f;    // 0: 1/sqrt(head_dim)
    float softcap = 0.0f;  // c > 0: each scaled score s becomes c·tanh(s/c), before the mask is added
    size_t n_queries = 1;  // query rows, each n_heads query vectors of head_dim floats
    size_t q_head_stride = 0;    // from head h to h + 1 of a query row; 0: head_dim
    size_t q_row_stride = 0;     // from query row i to i + 1; 0: n_heads·q_head_stride
    size_t out_head_stride = 0;  // likewise for the result (the rows and heads may not overlap)
    size_t out_row_stride = 0;
    // Additive mask, one row of n_tokens values per query row (shared by its heads), null: none. The
    // value of token t is added to the scaled (and soft-capped) score of t; -inf removes t: its weight is
    // exactly 0, and a token that every query row of a tile (the rows computed together; with one query
    // row, that row) removes is neither scored nor read, so causal and sliding-window masks cost only the
    // tokens they keep. Values must be finite or -inf (NaN or +inf: NonFiniteInput under NanPolicy::reject).
    // A query row that keeps no token gets zeros.
    const void* mask = nullptr;
    MaskType mask_type = MaskType::f16;
    size_t mask_row_stride = 0;  // from query row i's mask to i + 1's; 0: n_tokens
    // Attention sinks (gpt-oss), null: none. n_heads finite logits, one per query head: s_h joins the
    // softmax's denominator as a token without a value (each weight becomes exp(x) / (Σ exp + exp(s_h))).
    const float* sinks = nullptr;
    // Threads for this call (1..256): the query rows and the token range are split into parts (partial
    // softmax states merged in a fixed order, so the result does not depend on which thread ran what).
    int threads = 1;
    Executor executor;  // runs the parts (the contract of CacheConfig::executor: ExecutorError when broken; it may
                        // run other work, other kvq calls included, between kvq's tasks); empty: kvq's shared pool
    // reject: a query that is not finite throws NonFiniteInput (the whole query block is checked first);
    // propagate: it gives NaN in its own outputs, as a float reference would, and nothing is checked.
    NanPolicy nan = NanPolicy::reject;
};

// out = softmax(mask + scale · q·k) · v for every query row and head: query row i's head h at
// q + i·q_row_stride + h·q_head_stride, its result at out + i·out_row_stride + h·out_head_stride; query
// head h uses kv head h / (n_heads / n_kv_heads); the rows as in the other overload. With one query row,
// no mask and one thread it gives the other overload's bits. Throws std::invalid_argument (nothing
// written) for what the other overload rejects, a bad option, overlapping result rows, or a buffer (k, v,
// q, out, mask, sinks) whose extent from the counts and strides passes PTRDIFF_MAX (checked before any is
// read). Finite inputs give finite results: a result whose float scores or sums overflow (a scale or query
// of 1e38) is computed again in double from the dequantized rows, as KVCache::attend does.
// The scratch it needs lives in per-thread buffers that grow to the largest call and are kept: in a
// steady state (the same shapes again) a call allocates nothing.
void attend_rows(const Codec& keys, const Codec& values, int n_heads, int n_kv_heads, const float* q, RowsView k,
                 RowsView v, size_t n_tokens, float* out, const AttendOptions& options);

}  // namespace kvq
