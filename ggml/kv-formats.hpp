// KVQ_KV_FORMATS: the plugin's mode in which llama.cpp's quantized KV cache tensors hold kvq's formats in
// the slot that ggml's type gives each row (docs/llama-cpp.md, "kvq's formats in llama.cpp").
//
// The tensors stay in llama.cpp's CPU buffer; what makes the mode sound is that the plugin claims
// (supports_op) every op that reads or writes one of them, so that ggml's scheduler runs all of them on
// the plugin, before the CPU backend: SET_ROWS and the K-shift's copies (dequantize, quantize back) are
// computed here, flash attention reads the codes through kvq::attend_rows, and any other op on those
// bytes fails the graph with a message instead of reading them as ggml's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ggml.h"
#include "kvq/codec.hpp"

namespace kvq_ggml {

// A cache tensor of llama.cpp (cache_k_l<N>, cache_v_l<N>, any prefix) whose bytes are a kvq format.
struct KvFormat {
    bool key = true;
    int layer = -1;
    ggml_type slot = GGML_TYPE_COUNT;  // the type llama.cpp allocated (-ctk / -ctv)
    std::string spec;                  // kvq's codec spec, e.g. "turbo4"
    int64_t head_dim = 0;              // learned from the first flash attention on it (0: not yet)
    size_t slot_row_bytes = 0;         // ggml_row_size(slot, head_dim): one head's row slot
    const kvq::Codec* codec = nullptr; // made once head_dim is known; null with error set if it fails
    std::string error;                 // why this tensor cannot be used (printed when an op needs it)
};

// The kvq format of the cache tensor that t is or views, or null (ggml's own bytes, or the mode is off).
KvFormat* kv_format_of(const ggml_tensor* t);

// Whether op or one of its sources is such a tensor: the plugin claims the op (computes or refuses it).
bool touches_kv_formats(const ggml_tensor* op);

// The codec of a flash attention's K or V view [head_dim, tokens, heads, ...] of such a tensor (the
// first call fixes and logs the layer's format), or null (f.error says why).
const kvq::Codec* kv_format_codec(const ggml_tensor* view);

// Computes an op other than flash attention that touches such a tensor: SET_ROWS into it, CPY between it
// and f32 rows (the K-shift's dequantize and quantize back). False, with the reason, for anything else.
bool compute_kv_formats_op(ggml_tensor* node, std::string& error);

}  // namespace kvq_ggml
