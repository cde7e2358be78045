// A value format: what one kv head's values are in a sealed block, owned in one place, with a key format's
// shape (lib/codec/key_format.hpp): its bytes (value rows, then side data fitted to the block), sealing
// (told the block's first position), writes into a re-opened block, the exact read-back (BlockFormat's,
// lib/codec/block_format.hpp, for both), and accumulating weighted rows (one virtual call per block and kv
// head). The cache, the decode loop and the tables know a block's values only through it; where its bytes
// sit beside the keys' is the block layout's (lib/codec/block_layout.hpp).
//
// The formats (made by make_value_format):
//   RowValues   a row codec's rows, accumulated on float weights (CodecImpl::accumulate_rows)
//   GridValues  a block codec's rows, accumulated on the int8 weight grid where the codec has a kernel
//               for it (BlockKernels::accumulate_grid: q4_0; CacheConfig::int8_value_weights)
// Neither has side data; a format that keeps some (per block, as CenteredKeys keeps its means) says how
// many bytes in side_bytes(), and the layout, the cache's sealing and files and the engine carry them
// (tests/test_value_format.cpp writes one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "block_format.hpp"

namespace kvq::detail {

using ValueHead = HeadRows;
using ConstValueHead = ConstHeadRows;

// The bytes, sealing, writing and reading (BlockFormat's), and accumulating.
class ValueFormat : public BlockFormat {
public:
    // acc (g × head_dim) += w · rows [lo, lo + n) of one head's part of a block: g queries' weights (query i's
    // at w + i·w_stride, one per row from lo), in the format's basis until finish.
    virtual void accumulate(const float* w, size_t w_stride, int g, const ConstValueHead& head, size_t lo, size_t n,
                            float* acc) const = 0;
    // The accumulators of n_q queries back to the caller's basis (an un-rotation), once per call.
    void finish(float* acc, int n_q) const { impl_->finish_accumulate(acc, n_q); }

protected:
    ValueFormat(Codec codec, int block_tokens) : BlockFormat(std::move(codec), block_tokens) {}
};

// The value format of a row codec's rows sealed block_tokens at a time: RowValues, or with int8_weights
// GridValues where the codec is a block codec (the rotating codecs have no grid: RowValues).
std::unique_ptr<const ValueFormat> make_value_format(Codec codec, int block_tokens, bool int8_weights);

}  // namespace kvq::detail
