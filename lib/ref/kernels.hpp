// The operations of a block codec, as plain function pointers over one row of n values (n a multiple
// of the block). The scalar set is the specification; each SIMD level may provide its own set
// (lib/simd/), which must give the same bytes from quantize and the same results, to float rounding,
// from everything else.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq::detail {

struct BlockKernels {
    // x[0..n) -> row bytes
    void (*quantize)(const float* x, uint8_t* dst, int64_t n);
    // row bytes -> y[0..n)
    void (*dequantize)(const uint8_t* src, float* y, int64_t n);
    // query q[0..n) -> prepared query bytes
    void (*prepare_query)(const float* q, uint8_t* prep, int64_t n);
    // scores[i*score_stride + r] = prep_i · row_r; prep_i starts at prep + i*prep_bytes
    void (*score)(const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                  size_t row_stride, size_t n_rows, int64_t n, float* scores, size_t score_stride);
    // acc[i*n + j] += w[i*w_stride + r] · row_r[j]
    void (*accumulate)(const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                       size_t row_stride, size_t n_rows, int64_t n, float* acc);
    // The same with each w·d (weight times block scale) on the int8 grid of weight_grid.hpp: what the
    // cache's attention adds for codecs that have it (q4_0), null for the others.
    void (*accumulate_grid)(const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                            size_t row_stride, size_t n_rows, int64_t n, float* acc);
    // q8_0 keys in groups of 16 rows (key_groups.hpp) against n_q ≤ 4 queries: out[i][r] for
    // r < 16·n_groups, the bits this level's score gives the same rows. Null where a level has no such
    // kernel (the cache then keeps its keys in rows).
    void (*score_groups)(const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* groups, size_t n_groups,
                         int64_t n, float* const* out) = nullptr;
};

// The query side of every quantized-key codec (scalar specification, ggml_quant.cpp): int8 per block,
// float scale d = amax/127.
void prepare_query_q8(const float* q, uint8_t* prep, int64_t n);

// The scalar sets, defined in plain.cpp and ggml_quant.cpp; row_codecs.hpp registers them.
extern const BlockKernels kScalarF32, kScalarF16, kScalarBF16, kScalarQ8_0, kScalarQ4_0, kScalarQ4_1,
    kScalarQ5_0, kScalarQ5_1, kScalarIQ4_NL, kScalarIQ4_NLS;

}  // namespace kvq::detail
