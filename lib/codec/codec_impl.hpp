// The interface every codec implements; kvq::Codec checks arguments and forwards here. Virtual calls
// happen once per call over many rows, never per value.
#pragma once

#include <cstddef>
#include <cstdint>

#include "../ref/row_codecs.hpp"
#include "kvq/codec.hpp"

namespace kvq::detail {

class CodecImpl {
public:
    virtual ~CodecImpl() = default;
    virtual int head_dim() const = 0;
    virtual size_t row_bytes() const = 0;
    virtual size_t query_bytes() const = 0;
    // Rows within this limit are stored with finite fields. The default suits a codec that stores fp16
    // numbers no larger than the row's norm; codecs with other ranges say so.
    virtual InputLimit input_limit() const { return {65504.0f, true}; }
    // Kernels are total: NaN, Inf, out-of-range and subnormal input give defined bytes (see NanPolicy),
    // never undefined behaviour, and any bytes decode without reading outside the row.
    virtual void quantize_rows(const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) const = 0;
    virtual void dequantize_rows(const uint8_t* src, size_t src_stride, size_t n_rows, float* y) const = 0;
    virtual void prepare_queries(const float* q, int n_q, uint8_t* prep) const = 0;
    virtual void score_rows(const uint8_t* prep, int n_q, const uint8_t* rows, size_t row_stride,
                            size_t n_rows, float* scores, size_t score_stride) const = 0;
    virtual void accumulate_rows(const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                                 size_t row_stride, size_t n_rows, float* acc) const = 0;
    virtual void finish_accumulate(float* /*acc*/, int /*n_q*/) const {}
    // The block codec whose kernels read and write the stored rows (a +rot codec's inner one: its rows are
    // that codec's bytes of the rotated row), or BlockCodec::count (polar, turbo, tcq). The formats that run
    // a block codec's kernels beyond the row operations ask it: q8_0's key groups (GroupedKeys,
    // lib/codec/row_keys.hpp) and q4_0's int8 weight grid (GridValues, lib/codec/value_format.cpp).
    virtual BlockCodec block_codec() const { return BlockCodec::count; }
    virtual void effective_query(const float* q, float* out) const = 0;
};

}  // namespace kvq::detail
