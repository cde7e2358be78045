// kvq — codecs for one row of a KV cache (one token, one kv head, head_dim values).
//
// A codec is chosen by name from the codec table (`codec_names()`), optionally with the `+rot`
// modifier, which multiplies rows and queries by a seeded randomized Hadamard matrix first
// (q·k is unchanged; outlier channels are spread over all channels). The polar and turbo codecs always
// rotate (with the seed given to make); on them "+rot" is accepted and builds the same codec.
//
//   auto k = kvq::Codec::make("q8_0", 128);          // keys: ggml block_q8_0 rows
//   auto v = kvq::Codec::make("q4_0+rot", 128);      // values: rotated ggml block_q4_0 rows
//
// Operations work on many rows at once:
//   quantize_rows / dequantize_rows — float rows <-> row bytes;
//   prepare_queries — once per decode step (q8_0/q4_x keys: the query becomes q8_0 blocks so the score
//                     is an integer dot product per block, as in ggml; rotated codecs: rotate the query);
//   score_rows      — scores[q][r] = q·k_r for the n_q prepared queries against n_rows rows;
//   accumulate_rows — acc[q][:] += w[q][r] · v_r, then finish_accumulate() once (undoes the rotation).
// Every call validates its arguments and throws std::invalid_argument (NonFiniteInput for NaN or Inf)
// with a message that names the problem; nothing is written when it throws.
//
// Non-finite input (NaN, Inf) follows a NanPolicy: rejected with an error (the default), or stored and
// propagated. Finite rows beyond input_limit() (where an fp16 scale or value would overflow) count as
// non-finite: rejected, or stored as the overflow they are. Zero rows and subnormal values are
// well-defined everywhere: a zero row stores exact zeros, and values below the resolution of a codec's
// fp16 scale read back as zero.
#ifndef KVQ_CODEC_HPP  // a guard, not #pragma once: see tests/CMakeLists.txt (precompiled header)
#define KVQ_CODEC_HPP

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/errors.hpp"

namespace kvq {

inline constexpr uint64_t kDefaultSeed = 0x6b76715f726f7421ull;  // "kvq_rot!"

class Codec;
namespace detail {
class CodecImpl;
const CodecImpl& impl_of(const Codec& c);  // the library's own access to a codec's implementation
Codec make_channel_key_codec(int bits, int head_dim);  // KVCache's per-channel keys (lib/codec/channel_keys.hpp)
}

// What happens to NaN or Inf in rows or queries.
enum class NanPolicy {
    reject,     // throw std::invalid_argument, write nothing
    propagate,  // store it, and anything that reads it gives NaN: plain codecs (f32/f16/bf16) keep the
                // value (f16/bf16 round as IEEE does: too large becomes Inf); block codecs store a block
                // holding NaN or Inf with a NaN scale (and min) and zero codes, so all of it reads as NaN
};

// The largest input a codec stores without overflowing one of its fields (an fp16 scale, min or value).
struct InputLimit {
    float max_abs = 0.0f;  // bound on every |x_j| of a row or, when on_norm, on the row's L2 norm
    bool on_norm = false;  // codecs that rotate first: a rotated coordinate is at most the row's norm

    // The row's size as this limit measures it: max |x_j|, or the L2 norm (in double: no overflow).
    double size_of(const float* row, int n) const {
        double size = 0.0;
        for (int j = 0; j < n; ++j) {
            const double v = row[j];
            size = on_norm ? size + v * v : std::max(size, std::fabs(v));
        }
        return on_norm ? std::sqrt(size) : size;
    }
    // False also for a row holding NaN (its size is NaN).
    bool admits(const float* row, int n) const { return size_of(row, n) <= max_abs; }
};

// One row of the codec table, as users see it.
struct CodecInfo {
    std::string name;         // table name, e.g. "q4_0"
    int block = 0;            // values per block (row length must be a multiple)
    int bytes_per_block = 0;  // bytes per block (for codecs with a per-row header, see row_bytes)
    bool ggml_layout = false; // row bytes are ggml's blocks for the type of the same name
    // ggml's type id (enum ggml_type, as GGUF stores it) of the blocks the row bytes are, or -1: set for the
    // ggml-layout codecs, and for iq4_nls, which writes iq4_nl's blocks (20) but is not their reader
    // (codec_for_ggml_type(20) is "iq4_nl").
    int ggml_type = -1;
    std::string layout;       // one-line description of the bytes
    bool rotates = false;     // always rotates (polar, turbo*): "+rot" is accepted and changes nothing
    bool plain = false;       // values stored as they are (f32, f16, bf16): NaN and Inf can be stored too
    // Per-channel keys ("chanB", a KVCache key codec, not in the table): a row's codes mean nothing without
    // its block's per-channel minimums and steps, so the row operations below throw std::invalid_argument.
    bool per_channel = false;
};

// Names in the codec table, in table order.
std::vector<std::string> codec_names();
// Table row for a base name (without modifiers); throws UnknownCodec for an unknown name.
CodecInfo codec_info(std::string_view name);

// The codec that reads the rows of ggml type ggml_type (an enum ggml_type value): the table row with
// ggml_layout whose ggml_type it is, named as ggml names the type ("q4_0" for GGML_TYPE_Q4_0 = 2);
// "" if no codec reads that type.
std::string codec_for_ggml_type(int ggml_type);

// True if x[0..n) holds no NaN or Inf (one vectorized pass at the active SIMD level).
bool all_finite(const float* x, size_t n);

// A codec spec "name[:params][+rot]" taken apart: what Codec::make reads.
struct CodecSpec {
    CodecInfo info;       // the table row of `name`
    std::string params;   // what follows "name:" (empty if none); the codec checks it when made
    bool rot = false;     // the "+rot" suffix
};
// Throws UnknownCodec if the name is not in the table (the message lists the known names).
CodecSpec parse_codec_spec(std::string_view spec);

class Codec {
public:
    // spec: a table name, optionally followed by "+rot"; head_dim: values per row.
    // Throws UnknownCodec, BadHeadDim or BadParams (kvq/errors.hpp); BadParams for "chanB", which only
    // KVCache stores (CacheConfig::key_codec).
    static Codec make(std::string_view spec, int head_dim, uint64_t seed = kDefaultSeed);

    const std::string& name() const { return name_; }  // the spec as given, normalized
    const CodecInfo& info() const { return info_; }     // its table row
    int head_dim() const { return head_dim_; }
    bool rotated() const { return rotated_; }
    uint64_t seed() const { return seed_; }
    size_t row_bytes() const;
    size_t query_bytes() const;  // bytes of one prepared query
    double bits_per_value() const { return 8.0 * static_cast<double>(row_bytes()) / head_dim_; }

    InputLimit input_limit() const;

    // x: n_rows × head_dim floats; dst: n_rows rows of row_bytes(), dst_stride bytes apart (0 = packed).
    // Under NanPolicy::reject, a non-finite value or a row beyond input_limit() throws.
    void quantize_rows(const float* x, size_t n_rows, void* dst, size_t dst_stride = 0,
                       NanPolicy nan = NanPolicy::reject) const;
    // y: n_rows × head_dim floats (in the caller's basis: a rotation is undone).
    void dequantize_rows(const void* src, size_t n_rows, float* y, size_t src_stride = 0) const;

    // q: n_q × head_dim floats; prep: n_q × query_bytes() at any address (one aligned to 16 bytes avoids
    // a copy). Under NanPolicy::propagate a non-finite query gives NaN scores.
    void prepare_queries(const float* q, int n_q, void* prep, NanPolicy nan = NanPolicy::reject) const;
    // scores[i * score_stride + r] = (prepared query i) · (row r), for i < n_q, r < n_rows.
    void score_rows(const void* prep, int n_q, const void* rows, size_t n_rows, float* scores,
                    size_t score_stride, size_t row_stride = 0) const;
    // acc[i * head_dim + j] += w[i * w_stride + r] · row_r[j]; acc is in the codec's basis until
    // finish_accumulate(acc, n_q) is called once after the last accumulate.
    void accumulate_rows(const float* w, size_t w_stride, int n_q, const void* rows, size_t n_rows,
                         float* acc, size_t row_stride = 0) const;
    void finish_accumulate(float* acc, int n_q) const;

    // The query as score_rows sees it, in the caller's basis (for q8_0 keys: the query after its own
    // q8_0 round trip). With it, score_rows equals effective_query · dequantize_rows to float rounding.
    void effective_query(const float* q, float* out) const;

private:
    friend const detail::CodecImpl& detail::impl_of(const Codec& c);
    friend Codec detail::make_channel_key_codec(int bits, int head_dim);
    void check_rows_operation(const char* what) const;  // throws for per-channel keys
    void check_range(const float* x, size_t n_rows) const;  // throws for a row beyond input_limit()

    std::shared_ptr<const detail::CodecImpl> impl_;
    std::string name_;
    CodecInfo info_;
    int head_dim_ = 0;
    bool rotated_ = false;
    uint64_t seed_ = kDefaultSeed;
};

}  // namespace kvq

#endif  // KVQ_CODEC_HPP
