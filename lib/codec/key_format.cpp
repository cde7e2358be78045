#include "key_format.hpp"

#include <stdexcept>
#include <utility>

namespace kvq::detail {

KeyFormat::KeyFormat(Codec codec, int block_tokens, size_t group_rows)
    : codec_(std::move(codec)), impl_(&impl_of(codec_)), block_tokens_(block_tokens), group_rows_(group_rows) {}

double KeyFormat::bytes_per_token() const {
    const double side = side_bytes() ? static_cast<double>(side_bytes()) / block_tokens_ : 0.0;
    return static_cast<double>(row_bytes()) + side;
}

size_t KeyFormat::head_block_bytes() const {
    return side_bytes() ? align_key_block(head_side_offset() + side_bytes()) : rows_bytes();
}

KeyFormat::CacheBlock KeyFormat::cache_block(int n_kv_heads, size_t value_head_bytes) const {
    const size_t h = static_cast<size_t>(n_kv_heads);
    CacheBlock b;
    b.value_offset = align_key_block(h * rows_bytes());
    b.bytes = b.value_offset + h * value_head_bytes;
    if (side_bytes()) {
        b.side_offset = align_key_block(b.bytes);
        b.bytes = b.side_offset + h * side_bytes();
    }
    return b;
}

void KeyFormat::write_rows(const float*, size_t, size_t, const KeyHead&) const {
    throw std::logic_error("key format '" + name() + "' does not write rows into a sealed block");
}

}  // namespace kvq::detail
