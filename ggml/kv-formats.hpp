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
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ggml.h"
#include "kv-calibration.hpp"
#include "kvq/attention.hpp"
#include "kvq/codec.hpp"

namespace kvq_ggml {

struct AngleTables;  // kv-rope-center.hpp

// A cache tensor of llama.cpp (cache_k_l<N>, cache_v_l<N>, any prefix) whose bytes are a kvq format.
struct KvFormat {
    struct Identity {  // what the entry was made for (kv_format_of)
        std::string name;
        const void* buffer = nullptr;
        const void* data = nullptr;
        int type = -1;
        int64_t ne0 = 0, ne1 = 0, ne2 = 0;
        bool operator==(const Identity&) const = default;
    } identity;
    bool key = true;
    int layer = -1;
    ggml_type slot = GGML_TYPE_COUNT;  // the type llama.cpp allocated (-ctk / -ctv)
    std::string spec;                  // kvq's codec spec, e.g. "turbo4"
    int64_t head_dim = 0;              // learned from the first flash attention on it (0: not yet)
    size_t slot_row_bytes = 0;         // ggml_row_size(slot, head_dim): one head's row slot
    const kvq::Codec* codec = nullptr; // made once head_dim is known; null with error set if it fails
    std::string error;                 // why this tensor cannot be used (printed when an op needs it)
    // Keys only, from the calibration file (calib=PATH): +center subtracts a fixed mean per channel before
    // encoding, +qk stores each channel times a scale s_j and the queries attend divided by it. Both are
    // per kv head and channel (heads × head_dim values); empty when the format has neither.
    bool center = false, rope_center = false, key_scales = false;
    std::vector<float> mean, scale;
    // +ropecenter: the keys' mean before the RoPE, m, turned to each row's position p (R_p·m) on the
    // kRopePairs channel pairs per kv head where that removes the most (query-weighted) energy; the other
    // channels are centered as +center. The row keeps p in the low bits of its blocks' fp16 scales, and
    // the attention adds q·R_p·m back to each score (attend_rope_centered; ggml/kv-rope-center.*).
    std::vector<float> rmean;                      // heads × head_dim: m on the chosen pairs' channels, 0 elsewhere
    std::vector<std::vector<int32_t>> rope_pairs;  // per kv head: the chosen pairs
    std::optional<Rope> rope;                      // learned from the row writes (the graph's ROPE)
    int rope_mode = -1;                            // the calibration's RoPE: ggml's mode and rotated channels
    int64_t rope_dims = 0;
    int position_bits = 0;                         // bits of p in each block's scale
    std::vector<uint32_t> position_scales;         // those scales' offsets in the cache row
    std::shared_ptr<AngleTables> angles;           // cos/sin of p·θ for the chosen pairs (attention)
    // llama.cpp's own Hadamard rotation of this cache's rows (attn_rot_k), learned from the first row
    // write: its size n (the rows arrive as H·k in chunks of n), 0 for none, -1 not yet known. The mean
    // and scales are of the model's channels, so the key formats that have them, and the key codecs that
    // rotate (one rotation is better than two on keys with a large mean), undo it (H² = I) before, and
    // redo it after: model_basis.
    int64_t llama_rot = -1;
    bool model_basis = false;
};

// Reads KVQ_KV_FORMATS once, at the plugin's registration, and says what it found.
void init_kv_formats();

// The kvq format of the cache tensor that t is or views, or null (ggml's own bytes, or the mode is off).
KvFormat* kv_format_of(const ggml_tensor* t);

// Whether op or one of its sources is such a tensor: the plugin claims the op (computes or refuses it).
bool touches_kv_formats(const ggml_tensor* op);

// The codec of a flash attention's K or V view [head_dim, tokens, heads, ...] of such a tensor (the
// first call fixes and logs the layer's format), or null (f.error says why).
const kvq::Codec* kv_format_codec(const ggml_tensor* view);

// Computes an op other than flash attention that touches such a tensor: SET_ROWS into it, CPY between it
// and f32 rows (the K-shift's dequantize and quantize back). False, with the reason, for anything else.
// SET_ROWS runs its rows on threads parts (through executor when it is set, else on threads of its own).
bool compute_kv_formats_op(ggml_tensor* node, const kvq::Executor& executor, int threads, std::string& error);

// The queries of a flash attention whose K view is k (a kvq format with key scales): q ⊘ s into scratch,
// laid out [ne3][rows][heads][head_dim]; returns q itself (and its strides) for formats without scales.
// Also records the queries' moments when calibrating.
const float* kv_format_queries(const ggml_tensor* k, const ggml_tensor* q, int64_t i3, std::vector<float>& scratch,
                               size_t& row_stride, size_t& head_stride);

// Whether the flash attention on K view k needs attend_rope_centered (its keys are +ropecenter).
bool kv_format_rope_centered(const ggml_tensor* k);

// The flash attention dst (ggml's FLASH_ATTN_EXT) on +ropecenter keys: per kv head, each query head
// becomes a query row of its own, whose f32 mask row adds q·R_p·m to the score of the key at position p;
// options carries the scale, threads and executor. Throws what attend_rows throws.
void attend_rope_centered(const kvq::Codec& keys, const kvq::Codec& values, ggml_tensor* dst, const kvq::AttendOptions& options,
                          std::vector<float>& queries);

// Why a flash attention cannot run on this K format (centered keys under a softcap or sinks, queries
// rotated otherwise than the keys), or "".
std::string kv_format_attention_refusal(const ggml_tensor* k, const ggml_tensor* q, float softcap, bool sinks);

// Learns what an op shows of a cache tensor before any compute (a SET_ROWS: whether llama.cpp rotates the
// rows it writes), when the scheduler asks whether the plugin takes it.
void learn_kv_formats_op(const ggml_tensor* op);

// One head's row of view (a kvq-format K or V view) decoded as the model's values (mean and scales undone)
// into out; false, touching nothing, for a tensor with ggml's bytes.
bool kv_format_row_to_float(const ggml_tensor* view, const char* row, float* out);

// What the mode computed, for KVQ_GGML_STATS=1 ("" when it is off).
std::string kv_formats_stats();

// Writes the calibration file (calibrate=PATH) with the moments seen so far; no-op when not calibrating.
void write_kv_calibration();

}  // namespace kvq_ggml
