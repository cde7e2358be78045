// Per-channel keys (`chanB`, B = 2..8; KIVI, arXiv 2402.02750; KVQuant, arXiv 2401.18079): within a block
// of block_tokens keys, each channel has an fp16 minimum and an fp16 step (max − min)/(2^B − 1) over the
// block's tokens, and each value a B-bit code, x̃ = min + step·code. The score is
// q·min + Σ_c (q_c·step_c)·code_c: one dot product per block and query for q·min, and the codes against
// the query scaled channel by channel by the steps (a query prepared per block).
//
// | where (per kv head)            | what                                                          |
// |--------------------------------|---------------------------------------------------------------|
// | key rows (row_bytes each)      | d B-bit codes per token, packed as lib/ref/bit_codes.hpp says |
// | side data (4d bytes)           | d fp16 minimums, then d fp16 steps                            |
//
// A chanB codec is no row codec: a row's codes mean nothing without its block's minimums and steps. So
// it is not in the codec table, Codec::make refuses it, and it lives in ChannelKeys, its key format
// (lib/codec/key_format.hpp; made by lib/codec/key_formats.cpp for CacheConfig::key_codec "chanB", sealed
// a block at a time, and the tables' chanB keys). Its Codec's row operations throw; the format scores its
// codes through the implementation (score_rows against a query prepared per block).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "key_format.hpp"
#include "kvq/codec.hpp"

namespace kvq::detail {

inline constexpr int kMinChannelBits = 2, kMaxChannelBits = 8;

// B for a spec "chanB" (B = 2..8); 0 for a spec that does not start with "chan". Throws BadParams for a
// spec that starts with "chan" and is not one of chan2 .. chan8 (parameters and "+rot" included).
int channel_key_bits(std::string_view spec);

// The key codec "chanB" for rows of head_dim values (a multiple of 8, so that a row's codes fill whole
// bytes; BadHeadDim otherwise).
Codec make_channel_key_codec(int bits, int head_dim);

// B of a chanB codec (its 8 values per block take B bytes), 0 for any other.
inline int channel_bits_of(const Codec& c) { return c.info().per_channel ? c.info().bytes_per_block : 0; }

// Bytes of one kv head's minimums and steps in a block.
inline size_t channel_params_bytes(int head_dim) { return 4 * static_cast<size_t>(head_dim); }

// One block of n key rows of d floats (row r at k + r·k_stride), finite and within fp16's range: params
// (d fp16 minimums, then d fp16 steps) and the codes (row r at codes + r·code_stride). Throws
// std::invalid_argument, writing nothing, if a minimum or step is not finite in fp16.
void quantize_channel_block(const float* k, size_t k_stride, size_t n, int d, int bits, uint16_t* params,
                            uint8_t* codes, size_t code_stride);
// The codes of rows under minimums and steps already worked out (quantize_channel_block's second step):
// each value's nearest code, clamped to 0 .. 2^B − 1.
void quantize_channel_rows(const float* k, size_t k_stride, size_t n, int d, int bits, const uint16_t* params,
                           uint8_t* codes, size_t code_stride);
// min + step·code of n rows, into out (n × d).
void dequantize_channel_rows(const uint8_t* codes, size_t code_stride, size_t n, int d, int bits, const uint16_t* params,
                             float* out);
// The per-block query preparation of n_q queries (q: n_q × d): scaled (n_q × d) = q ⊙ step, what the
// codes are scored against; offsets[i] = q_i·min (in float, j in increasing order), added to each score.
void prepare_channel_queries(const float* q, int n_q, int d, const uint16_t* params, float* scaled, float* offsets);

// The key format of chanB keys.
class ChannelKeys : public KeyFormat {
public:
    ChannelKeys(int bits, int head_dim, int block_tokens) : KeyFormat(make_channel_key_codec(bits, head_dim), block_tokens), bits_(bits) {}

    size_t side_bytes() const override { return channel_params_bytes(head_dim()); }
    bool writes_rows() const override { return false; }  // minimums and steps are fitted to the whole block
    void seal(const float* k, size_t n, size_t first_token, const KeyHead& head) const override;
    void read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const override;
    size_t scratch_floats(int g) const override { return static_cast<size_t>(g) * head_dim() + g; }
    const float* score(const uint8_t* prep, const float* q, int g, const ConstKeyHead& head, size_t lo, size_t n,
                       float* scores, size_t stride, float* scratch) const override;

private:
    int bits_;
};

}  // namespace kvq::detail
