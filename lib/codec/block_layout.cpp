#include "block_layout.hpp"

#include <stdexcept>

#include "key_format.hpp"
#include "value_format.hpp"

namespace kvq::detail {

BlockLayout pool_block_layout(const KeyFormat& keys, const ValueFormat& values, int n_kv_heads, bool latent) {
    const size_t h = static_cast<size_t>(n_kv_heads);
    BlockLayout l;
    l.block_tokens = keys.block_tokens();
    l.keys.head_stride = keys.rows_bytes();
    if (latent) {  // the values are the key rows' leading bytes: no bytes of their own
        if (values.side_bytes()) throw std::logic_error("a latent cache's value format has side data");
        l.values.head_stride = keys.rows_bytes();
        l.values.row_stride = keys.row_bytes();
        l.bytes = align_block(h * keys.rows_bytes());  // where value rows would start
    } else {
        l.values.offset = align_block(h * keys.rows_bytes());
        l.values.head_stride = values.rows_bytes();
        l.bytes = l.values.offset + h * values.rows_bytes();
    }
    if (keys.side_bytes()) {
        l.keys.side_offset = align_block(l.bytes);
        l.keys.side_stride = keys.side_bytes();
        l.bytes = l.keys.side_offset + h * keys.side_bytes();
    }
    if (values.side_bytes()) {
        l.values.side_offset = align_block(l.bytes);
        l.values.side_stride = values.side_bytes();
        l.bytes = l.values.side_offset + h * values.side_bytes();
    }
    return l;
}

BlockLayout staging_block_layout(const KeyFormat& keys, const ValueFormat& values, int n_kv_heads, bool latent) {
    if (keys.side_bytes() || values.side_bytes()) throw std::logic_error("the staging's formats have side data");
    const size_t h = static_cast<size_t>(n_kv_heads);
    BlockLayout l;
    l.block_tokens = keys.block_tokens();
    l.keys.head_stride = keys.rows_bytes();
    if (latent) {  // a latent's values are its staged key rows' leading values
        l.values.head_stride = keys.rows_bytes();
        l.values.row_stride = keys.row_bytes();
        l.bytes = h * keys.rows_bytes();
    } else {
        l.values.offset = h * keys.rows_bytes();
        l.values.head_stride = values.rows_bytes();
        l.bytes = h * (keys.rows_bytes() + values.rows_bytes());
    }
    return l;
}

HeadBlock head_block(size_t rows_bytes, size_t side_bytes) {
    if (!side_bytes) return {kNoSide, rows_bytes};
    const size_t side = align_block(rows_bytes);
    return {side, align_block(side + side_bytes)};
}

}  // namespace kvq::detail
