// A block's geometry, keys and values together: where each kv head's key rows, value rows and each
// format's side data sit. Every reader of a block (the attention engine, the cache's sealing, reading and
// files) reaches a head's bytes through the layout's accessors (key_head, value_head) only, as FlashInfer's
// paged_kv_t owns a page's offsets; the layouts of kvq's own blocks are made here, once:
//
// A block of a cache's pool (n kv heads; pool_block_layout):
// | what                      | where                                                                      |
// |---------------------------|----------------------------------------------------------------------------|
// | key rows of head h        | h·K, K = the key format's rows_bytes()                                     |
// | value rows of head h      | align(n·K) + h·V, V = the value format's rows_bytes(); a latent cache's    |
// |                           | values are the key rows' leading values: no bytes of their own             |
// | key side data of head h   | align(end of the value rows) + h·(the key format's side_bytes())           |
// | value side data of head h | align(end of the key side data) + h·(the value format's side_bytes())      |
// A format without side data takes no room (so blocks of formats without value side data are laid out as
// they always were, files included); the block ends after its last region, the pool rounds it up to 64.
//
// A slot of a cache's float staging (staging_block_layout): every head's key rows, then every head's value
// rows, packed (a latent's values: the key rows); no side data.
//
// One kv head's block alone (the accuracy tables, head_block): its rows at 0, its side data (if any) from
// align(rows_bytes()); with side data the block ends on a 64-byte boundary, without it after its rows.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq::detail {

class KeyFormat;
class ValueFormat;

inline constexpr size_t kBlockAlignment = 64;  // where values and side data start (a cache line)
inline constexpr size_t kNoSide = SIZE_MAX;    // the offset of side data a format does not have

inline constexpr size_t align_block(size_t n) { return (n + kBlockAlignment - 1) / kBlockAlignment * kBlockAlignment; }

// One kv head's part of a block as a format sees it: its rows (row r at rows + r·row_stride; packed,
// row_stride = row_bytes, everywhere but an engine's own tensors and a latent cache's values) and its side
// data (null without).
template <class Byte>
struct HeadBytes {
    Byte* rows = nullptr;
    Byte* side = nullptr;
    size_t row_stride = 0;
};

// The key or the value half of a layout: head h's rows at offset + h·head_stride, row_stride apart (0: the
// format's row_bytes()), its side data at side_offset + h·side_stride (kNoSide: none).
struct BlockRegion {
    size_t offset = 0, head_stride = 0, row_stride = 0;
    size_t side_offset = kNoSide, side_stride = 0;

    template <class Byte>
    HeadBytes<Byte> head(Byte* block, int h, size_t row_bytes) const {
        return {block + offset + h * head_stride, side_offset == kNoSide ? nullptr : block + side_offset + h * side_stride,
                row_stride ? row_stride : row_bytes};
    }
};

struct BlockLayout {
    int block_tokens = 0;
    BlockRegion keys, values;
    size_t bytes = 0;  // where a block ends (0 for a caller's tensors, which the layout does not own)

    template <class Byte>
    HeadBytes<Byte> key_head(Byte* block, int h, size_t row_bytes) const { return keys.head(block, h, row_bytes); }
    template <class Byte>
    HeadBytes<Byte> value_head(Byte* block, int h, size_t row_bytes) const { return values.head(block, h, row_bytes); }
};

// The pool blocks of n_kv_heads heads of a key and a value format (latent: the values read the key rows,
// which needs a value format without side data).
BlockLayout pool_block_layout(const KeyFormat& keys, const ValueFormat& values, int n_kv_heads, bool latent);
// A staging slot of n_kv_heads heads of the staging's formats (of plain rows: no side data).
BlockLayout staging_block_layout(const KeyFormat& keys, const ValueFormat& values, int n_kv_heads, bool latent);

// One head's block alone of a format with rows_bytes of rows and side_bytes of side data.
struct HeadBlock {
    size_t side_offset = kNoSide;
    size_t bytes = 0;
};
HeadBlock head_block(size_t rows_bytes, size_t side_bytes);

}  // namespace kvq::detail
