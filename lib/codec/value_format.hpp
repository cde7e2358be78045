// A value format: what one kv head's values are in a sealed block, owned in one place, as a KeyFormat
// (lib/codec/key_format.hpp) owns its keys. The cache, the decode loop and the tables know a block's
// values only through it: its bytes, sealing and writing rows, the exact read-back, the conversion to the
// file's ggml rows, and accumulating weighted rows (one virtual call per block and kv head).
//
// The formats (made by make_value_format):
//   RowValues   a row codec's rows, accumulated on float weights (CodecImpl::accumulate_rows)
//   GridValues  a block codec's rows, accumulated on the int8 weight grid where the codec has a kernel
//               for it (BlockKernels::accumulate_grid: q4_0; CacheConfig::int8_value_weights)
// Values have no side data today: a format with some would add it as the key formats do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "codec_impl.hpp"
#include "kvq/codec.hpp"

namespace kvq::detail {

class ValueFormat {
public:
    virtual ~ValueFormat() = default;
    ValueFormat(const ValueFormat&) = delete;
    ValueFormat& operator=(const ValueFormat&) = delete;

    const Codec& codec() const { return codec_; }
    size_t row_bytes() const { return codec_.row_bytes(); }
    int head_dim() const { return codec_.head_dim(); }
    // One kv head's value rows in a block of block_tokens rows.
    size_t rows_bytes(int block_tokens) const { return static_cast<size_t>(block_tokens) * row_bytes(); }

    // n rows of head_dim floats (row r at v + r·head_dim; within the codec's input limit) into rows
    // [row, row + n) of one head's rows (row_stride apart): sealing a block, or writing into one.
    void write_rows(const float* v, size_t row, size_t n, uint8_t* rows, size_t row_stride) const {
        impl_->quantize_rows(v, n, rows + row * row_stride, row_stride);
    }
    // Rows [lo, lo + n) as attention reads them (before finish), into out (n × head_dim).
    void read_rows(const uint8_t* rows, size_t row_stride, size_t lo, size_t n, float* out) const {
        impl_->dequantize_rows(rows + lo * row_stride, row_stride, n, out);
    }

    // acc (g × head_dim) += w · rows: g queries' weights (query i's at w + i·w_stride) over n rows.
    virtual void accumulate(const float* w, size_t w_stride, int g, const uint8_t* rows, size_t row_stride, size_t n,
                            float* acc) const = 0;
    // The accumulators of n_q queries back to the caller's basis (an un-rotation), once per call.
    void finish(float* acc, int n_q) const { impl_->finish_accumulate(acc, n_q); }

protected:
    explicit ValueFormat(Codec codec) : codec_(std::move(codec)), impl_(&impl_of(codec_)) {}

    Codec codec_;
    const CodecImpl* impl_;
};

// RowValues, or GridValues with int8_weights.
std::unique_ptr<const ValueFormat> make_value_format(Codec codec, bool int8_weights);

}  // namespace kvq::detail
