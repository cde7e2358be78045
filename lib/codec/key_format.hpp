// The bytes of a sealed block's keys, written once: one kv head's key rows and its side data — the
// block's fp16 key means per channel when the keys are centered (lib/codec/centering.hpp), or a
// per-channel key codec's (chanB, lib/codec/channel_keys.hpp) fp16 minimums and steps — with the
// 64-byte aligned offsets where they sit. The cache's block layout and bytes_per_token
// (lib/cache/kv_cache.cpp), the memory planner (lib/eval/planner.cpp) and the accuracy tables' key
// blocks (lib/eval/quantized_attention.cpp) all ask a KeyBlockFormat, so that they cannot disagree.
//
// | block of the cache's pool (n kv heads)            | one kv head alone (the tables)             |
// |---------------------------------------------------|--------------------------------------------|
// | key rows of head h at h·rows_bytes()              | key rows at 0                              |
// | value rows from align(n·rows_bytes())             | (values are kept apart)                    |
// | side data of head h at side_offset + h·side_bytes | side data at align(rows_bytes())           |
//
// side_offset = align(values' end); a block without side data ends after the value rows (the pool rounds
// a block up to 64 bytes); a head alone with side data ends on a 64-byte boundary, without at its rows.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvq/codec.hpp"

namespace kvq::detail {

// What follows a kv head's key rows in a sealed block.
enum class KeySide : uint8_t {
    none,            // nothing: a row codec's keys as they are
    means,           // centered keys: head_dim fp16 means
    channel_params,  // a chanB codec: head_dim fp16 minimums, then head_dim fp16 steps
};

inline constexpr size_t kKeyBlockAlignment = 64;  // where values and side data start (a cache line)
inline constexpr size_t kNoKeySide = SIZE_MAX;   // the offset of side data a format does not have

inline constexpr size_t align_key_block(size_t n) {
    return (n + kKeyBlockAlignment - 1) / kKeyBlockAlignment * kKeyBlockAlignment;
}

class KeyBlockFormat {
public:
    // Keys of `key` (its head_dim and row_bytes) sealed block_tokens at a time, centered or not. Throws
    // std::invalid_argument if a per-channel codec is to be centered (its minimums take the place of the
    // means). The block sizes and offsets need block_tokens > 0 (the cache and the tables check it first);
    // the planner's bytes per token take any block_tokens, as they always have (no side data: row_bytes).
    KeyBlockFormat(const Codec& key, bool centered, int block_tokens);

    int block_tokens() const { return block_tokens_; }
    int head_dim() const { return head_dim_; }
    KeySide side() const { return side_; }
    size_t row_bytes() const { return row_bytes_; }  // one token's key row

    // One kv head's key rows in a block: block_tokens × row_bytes.
    size_t rows_bytes() const { return static_cast<size_t>(block_tokens_) * row_bytes_; }
    // One kv head's side data in a block: 2·head_dim (means), 4·head_dim (minimums and steps), or 0.
    size_t side_bytes() const;
    // The side data's share of a token: side_bytes / block_tokens (0 without side data).
    double side_bytes_per_token() const {
        return side_ == KeySide::none ? 0.0 : static_cast<double>(side_bytes()) / block_tokens_;
    }
    // One kv head's key bytes per token of a sealed block: row_bytes + side_bytes_per_token.
    double bytes_per_token() const { return static_cast<double>(row_bytes_) + side_bytes_per_token(); }

    // One kv head's block alone (the tables): side data at head_side_offset (kNoKeySide without), and the
    // block's bytes.
    size_t head_side_offset() const { return side_ == KeySide::none ? kNoKeySide : align_key_block(rows_bytes()); }
    size_t head_block_bytes() const;

    // A block of the cache's pool: n_kv_heads heads' key rows, then their value rows (value_head_bytes
    // each) from value_offset, then their side data from side_offset (kNoKeySide without); bytes: where the
    // block ends (before the pool rounds it up).
    struct CacheBlock {
        size_t value_offset = 0, side_offset = kNoKeySide, bytes = 0;
    };
    CacheBlock cache_block(int n_kv_heads, size_t value_head_bytes) const;

private:
    int block_tokens_ = 0, head_dim_ = 0;
    size_t row_bytes_ = 0;
    KeySide side_ = KeySide::none;
};

}  // namespace kvq::detail
