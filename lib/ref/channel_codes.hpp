// The codes of per-channel keys (`chanB`, lib/codec/channel_keys.hpp) and the scalar specification of
// their score kernel. SIMD levels (lib/simd/channel_avx512.hpp) give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq::detail {

// A row's d codes (d a multiple of 8) into out (d bytes): eight B-bit codes fill B bytes, code i of a
// group at bits [i·B, i·B + B) of the group's little-endian word (lib/ref/bit_codes.hpp's order).
void unpack_channel_codes(const uint8_t* row, int d, int bits, uint8_t* out);

// scores[i·score_stride + r] = Σ_j q_i[j]·code_r[j] for i < n_q, r < n_rows, q_i = q + i·d (a query
// already scaled by its block's steps). Per query the products go to 16 partial sums, value j to partial
// j mod 16 in increasing j (the last d mod 16 values to partials 0..7), each a product then a sum
// (no fma), then the tree p[i] + p[i + 8], + 4, + 2, + 1 (sum16_float).
using ChannelScore = void (*)(const float* q, int n_q, int d, int bits, const uint8_t* rows, size_t row_stride,
                              size_t n_rows, float* scores, size_t score_stride);
void channel_score_scalar(const float* q, int n_q, int d, int bits, const uint8_t* rows, size_t row_stride,
                          size_t n_rows, float* scores, size_t score_stride);

}  // namespace kvq::detail
