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
//
// Where a format's bytes sit (the geometry below, written once):
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
#include <memory>
#include <string>

#include "codec_impl.hpp"
#include "kvq/codec.hpp"

namespace kvq::detail {

inline constexpr size_t kKeyBlockAlignment = 64;  // where values and side data start (a cache line)
inline constexpr size_t kNoKeySide = SIZE_MAX;   // the offset of side data a format does not have

inline constexpr size_t align_key_block(size_t n) {
    return (n + kKeyBlockAlignment - 1) / kKeyBlockAlignment * kKeyBlockAlignment;
}

// One kv head's part of a block as a format sees it: its key rows (row r at rows + r·row_stride; packed,
// row_stride = row_bytes, everywhere but an engine's own tensors) and its side data (null without).
template <class Byte>
struct KeyHeadOf {
    Byte* rows = nullptr;
    Byte* side = nullptr;
    size_t row_stride = 0;
};
using KeyHead = KeyHeadOf<uint8_t>;
using ConstKeyHead = KeyHeadOf<const uint8_t>;

class KeyFormat {
public:
    virtual ~KeyFormat() = default;
    KeyFormat(const KeyFormat&) = delete;
    KeyFormat& operator=(const KeyFormat&) = delete;

    // The codec of its rows: the file's ggml rows, the input limits, the queries' preparation.
    const Codec& codec() const { return codec_; }
    const CodecImpl& row_codec() const { return *impl_; }
    // The format's name as configurations spell it (the codec's, with the wrappers' suffixes).
    virtual std::string name() const { return codec_.name(); }
    int block_tokens() const { return block_tokens_; }
    int head_dim() const { return codec_.head_dim(); }
    size_t row_bytes() const { return codec_.row_bytes(); }

    // ---- bytes ----
    // One kv head's key rows in a block: block_tokens × row_bytes.
    size_t rows_bytes() const { return static_cast<size_t>(block_tokens_) * row_bytes(); }
    // One kv head's side data in a block (0: none).
    virtual size_t side_bytes() const { return 0; }
    // One kv head's key bytes per token of a sealed block, and its bits per key value.
    double bytes_per_token() const;
    double bits_per_value() const { return bytes_per_token() * 8.0 / head_dim(); }
    // One kv head's block alone (the tables): side data at head_side_offset (kNoKeySide without), and the
    // block's bytes.
    size_t head_side_offset() const { return side_bytes() ? align_key_block(rows_bytes()) : kNoKeySide; }
    size_t head_block_bytes() const;
    // A block of the cache's pool: n_kv_heads heads' key rows, then their value rows (value_head_bytes
    // each) from value_offset, then their side data from side_offset (kNoKeySide without); bytes: where the
    // block ends (before the pool rounds it up).
    struct CacheBlock {
        size_t value_offset = 0, side_offset = kNoKeySide, bytes = 0;
    };
    CacheBlock cache_block(int n_kv_heads, size_t value_head_bytes) const;

    // ---- writing ----
    // The rows sealing admits (finite, and within this; a row beyond counts as non-finite: NanPolicy).
    virtual InputLimit input_limit() const { return codec_.input_limit(); }
    // Whether rows can be quantized into a block that holds rows already (SealPolicy::on_append, or a block
    // re-opened by a truncate): no for formats whose side data is fitted to the whole block, which the cache
    // seals anew from exact rows instead.
    virtual bool writes_rows() const { return true; }
    // n rows of head_dim floats (row r at k + r·head_dim; input_limit()'s) into an empty block: n =
    // block_tokens in the cache, fewer for the tables' last block. first_token: the position in its
    // sequence of the block's first row.
    virtual void seal(const float* k, size_t n, size_t first_token, const KeyHead& head) const = 0;
    // Rows [row, row + n) into a block whose earlier rows are stored (writes_rows() only).
    virtual void write_rows(const float* k, size_t row, size_t n, const KeyHead& head) const;

    // ---- reading ----
    // Rows [lo, lo + n) as attention reads them, in the caller's basis, into out (n × head_dim).
    virtual void read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const = 0;
    // A head's key rows (rows_bytes) from the pool's memory to the file's ggml rows (to_file) or back, in
    // place: only formats whose pool layout is not ggml's do anything.
    virtual void convert_rows(uint8_t* /*rows*/, bool /*to_file*/) const {}
    // What is wrong with the fields of a head's side data that the format itself writes from the block's
    // position (a loaded file's: they are checked as its rows are), given the position of the block's first
    // row; empty when nothing is.
    virtual std::string side_error(const ConstKeyHead& /*head*/, size_t /*first_token*/) const { return {}; }
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
    KeyFormat(Codec codec, int block_tokens, size_t group_rows = 1);

    Codec codec_;
    const CodecImpl* impl_;
    int block_tokens_;
    size_t group_rows_;
};

}  // namespace kvq::detail
