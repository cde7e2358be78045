#include "key_format.hpp"

#include <stdexcept>
#include <string>

#include "channel_keys.hpp"

namespace kvq::detail {

KeyBlockFormat::KeyBlockFormat(const Codec& key, bool centered, int block_tokens)
    : block_tokens_(block_tokens), head_dim_(key.head_dim()), row_bytes_(key.row_bytes()) {
    const bool per_channel = key.info().per_channel;
    if (per_channel && centered) {
        throw std::invalid_argument("key codec '" + key.name() + "' stores a per-channel minimum per block already; centering does not apply to it");
    }
    side_ = per_channel ? KeySide::channel_params : centered ? KeySide::means : KeySide::none;
}

size_t KeyBlockFormat::side_bytes() const {
    switch (side_) {
        case KeySide::means: return static_cast<size_t>(head_dim_) * sizeof(uint16_t);
        case KeySide::channel_params: return channel_params_bytes(head_dim_);
        case KeySide::none: break;
    }
    return 0;
}

size_t KeyBlockFormat::head_block_bytes() const {
    return side_ == KeySide::none ? rows_bytes() : align_key_block(head_side_offset() + side_bytes());
}

KeyBlockFormat::CacheBlock KeyBlockFormat::cache_block(int n_kv_heads, size_t value_head_bytes) const {
    const size_t h = static_cast<size_t>(n_kv_heads);
    CacheBlock b;
    b.value_offset = align_key_block(h * rows_bytes());
    b.bytes = b.value_offset + h * value_head_bytes;
    if (side_ != KeySide::none) {
        b.side_offset = align_key_block(b.bytes);
        b.bytes = b.side_offset + h * side_bytes();
    }
    return b;
}

}  // namespace kvq::detail
