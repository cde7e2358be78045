// A key format: what one kv head's keys are in a sealed block, owned in one place. The cache, the decode
// loop, the memory planner and the accuracy tables know a block's keys only through a KeyFormat: its
// bytes (key rows, then side data fitted to the block), sealing, writes into a re-opened block, the exact
// read-back, the conversion to the file's ggml rows, and scoring queries against it. Formats compose: a
// centered format wraps a row format, as faiss's DCTemplate composes a quantizer and a similarity behind
// one virtual call. The decode loop makes one virtual call per block and kv head (KeyFormat::score).
//
// The formats (lib/codec/key_formats.hpp is their one registration):
//   RowKeys      a row codec's rows as they are (lib/codec/row_keys.hpp)
//   GroupedKeys  q8_0 rows in groups of 16 in the pool's memory (lib/codec/row_keys.hpp)
//   CenteredKeys any of the above minus the block's fp16 mean per channel (lib/codec/centering.hpp)
//   ChannelKeys  chanB: per-channel fp16 minimums and steps per block (lib/codec/channel_keys.hpp)
//   SinkKeys     any of the above with the first N keys of a sequence in fp16 (lib/codec/sink_keys.hpp)
//
// What keys and values have in common (bytes, sealing, writing, reading) is BlockFormat's
// (lib/codec/block_format.hpp); where a format's bytes sit in a block, beside the values' (a value format,
// lib/codec/value_format.hpp), is the block layout's (lib/codec/block_layout.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "block_format.hpp"

namespace kvq::detail {

using KeyHead = HeadRows;
using ConstKeyHead = ConstHeadRows;

// The bytes, sealing, writing and reading (BlockFormat's, lib/codec/block_format.hpp), and scoring.
class KeyFormat : public BlockFormat {
public:
    // A head's key rows (rows_bytes) from the pool's memory to the file's ggml rows (to_file) or back, in
    // place: only formats whose pool layout is not ggml's do anything.
    virtual void convert_rows(uint8_t* /*rows*/, bool /*to_file*/) const {}
    // Whether the pool's memory holds the rows as the file does (convert_rows does nothing).
    bool rows_as_file() const { return group_rows_ == 1; }

    // ---- scoring ----
    size_t query_bytes() const { return impl_->query_bytes(); }
    // The queries prepared once per call (n_q × head_dim floats in, query_bytes() each out).
    void prepare_queries(const float* q, int n_q, uint8_t* prep) const { impl_->prepare_queries(q, n_q, prep); }
    // Floats of scratch score() needs for g queries.
    virtual size_t scratch_floats(int /*g*/) const { return 0; }
    size_t group_rows() const { return group_rows_; }  // rows stored together (1: each on its own)
    // Where the bytes of rows from lo start (what to prefetch): lo's own row, or the start of its group.
    const uint8_t* rows_from(const uint8_t* rows, size_t lo, size_t row_stride) const {
        return rows + lo / group_rows_ * group_rows_ * row_stride;
    }
    // q·k of g queries against rows [lo, lo + n) of one head's part of a block: prep their prepared
    // queries (g × query_bytes()), q the same queries as floats (g × head_dim); query i's scores at
    // scores + i·stride. Returns what is to be added to query i's scores (offsets[i], in scratch), or null.
    virtual const float* score(const uint8_t* prep, const float* q, int g, const ConstKeyHead& head, size_t lo, size_t n,
                               float* scores, size_t stride, float* scratch) const = 0;

protected:
    // group_rows: rows stored together (1: each row on its own).
    KeyFormat(Codec codec, int block_tokens, size_t group_rows = 1)
        : BlockFormat(std::move(codec), block_tokens), group_rows_(group_rows) {}

    size_t group_rows_;
};

}  // namespace kvq::detail
