// The interface every codec implements; kvq::Codec checks arguments and forwards here. Virtual calls
// happen once per call over many rows, never per value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>

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
    // What the cache's attention adds: accumulate_rows, or where the codec has one its accumulate on the
    // int8 weight grid (BlockKernels::accumulate_grid, lib/ref/weight_grid.hpp).
    virtual void accumulate_attention(const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                                      size_t row_stride, size_t n_rows, float* acc) const {
        accumulate_rows(w, w_stride, n_q, rows, row_stride, n_rows, acc);
    }
    virtual void finish_accumulate(float* /*acc*/, int /*n_q*/) const {}
    // q8_0 keys a cache stores in groups of 16 rows (lib/ref/key_groups.hpp), group 0 holding rows 0..15 at
    // groups: score_rows's scores of rows [r0, r0 + n_rows), bit for bit. Only q8_0 implements it.
    // can_score_groups(): q8_0 with a kernel for it at the active level and a head it takes; whether a
    // cache uses the layout is decided in one place, detail::keys_in_groups (lib/codec/key_formats.hpp).
    virtual bool can_score_groups() const { return false; }
    virtual void score_groups(const uint8_t* /*prep*/, int /*n_q*/, const uint8_t* /*groups*/, size_t /*r0*/,
                              size_t /*n_rows*/, float* /*scores*/, size_t /*score_stride*/) const {
        throw std::logic_error("score_groups: not a q8_0 codec");
    }
    virtual void effective_query(const float* q, float* out) const = 0;
};

}  // namespace kvq::detail
