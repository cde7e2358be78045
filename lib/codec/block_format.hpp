// What key formats (lib/codec/key_format.hpp) and value formats (value_format.hpp) have in common: one kv
// head's rows of a sealed block, owned in one place: their bytes (rows of a codec, then side data fitted to
// the block), sealing (told the block's first position), writes into a re-opened block, the exact
// read-back and the check of a loaded file's side data. Where those bytes sit in a block is the block
// layout's (lib/codec/block_layout.hpp); a format says only how many its rows and side data take.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "block_layout.hpp"
#include "codec_impl.hpp"
#include "kvq/codec.hpp"

namespace kvq::detail {

using HeadRows = HeadBytes<uint8_t>;
using ConstHeadRows = HeadBytes<const uint8_t>;

class BlockFormat {
public:
    virtual ~BlockFormat() = default;
    BlockFormat(const BlockFormat&) = delete;
    BlockFormat& operator=(const BlockFormat&) = delete;

    // The codec of its rows: the file's rows, the input limits (and for keys the queries' preparation).
    const Codec& codec() const { return codec_; }
    const CodecImpl& row_codec() const { return *impl_; }
    // The format's name as configurations spell it (the codec's, with the wrappers' suffixes).
    virtual std::string name() const { return codec_.name(); }
    int block_tokens() const { return block_tokens_; }
    int head_dim() const { return codec_.head_dim(); }
    size_t row_bytes() const { return codec_.row_bytes(); }

    // ---- bytes ----
    // One kv head's rows in a block: block_tokens × row_bytes.
    size_t rows_bytes() const { return static_cast<size_t>(block_tokens_) * row_bytes(); }
    // One kv head's side data in a block (0: none).
    virtual size_t side_bytes() const { return 0; }
    // One kv head's bytes per token of a sealed block, and its bits per value.
    double bytes_per_token() const;
    double bits_per_value() const { return bytes_per_token() * 8.0 / head_dim(); }

    // ---- writing ----
    // The rows sealing admits (finite, and within this; a row beyond counts as non-finite: NanPolicy).
    virtual InputLimit input_limit() const { return codec_.input_limit(); }
    // Whether rows can be quantized into a block that holds rows already (SealPolicy::on_append, or a block
    // re-opened by a truncate): no for formats whose side data is fitted to the whole block, which the cache
    // seals anew from exact rows instead.
    virtual bool writes_rows() const { return true; }
    // n rows of head_dim floats (row r at x + r·head_dim; input_limit()'s) into an empty block: n =
    // block_tokens in the cache, fewer for the tables' last block. first_token: the position in its
    // sequence of the block's first row.
    virtual void seal(const float* x, size_t n, size_t first_token, const HeadRows& head) const = 0;
    // Rows [row, row + n) into a block whose earlier rows are stored (writes_rows() only).
    virtual void write_rows(const float* x, size_t row, size_t n, const HeadRows& head) const;

    // ---- reading ----
    // Rows [lo, lo + n) as attention reads them, in the caller's basis, into out (n × head_dim).
    virtual void read_rows(const ConstHeadRows& head, size_t lo, size_t n, float* out) const = 0;
    // What is wrong with the fields of a head's side data that the format itself writes from the block's
    // position (a loaded file's: they are checked as its rows are), given the position of the block's first
    // row; empty when nothing is.
    virtual std::string side_error(const ConstHeadRows& /*head*/, size_t /*first_token*/) const { return {}; }

protected:
    // block_tokens: the rows of a block (any, for rows an engine owns: only the rows' bytes are used).
    BlockFormat(Codec codec, int block_tokens);

    Codec codec_;
    const CodecImpl* impl_;
    int block_tokens_;
};

}  // namespace kvq::detail
