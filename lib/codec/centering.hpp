// Key centering (CacheConfig::center_keys, the tables' +center): a block's keys are stored minus their
// per-channel mean, and the mean is kept as fp16 with the block; attention adds q·mean back to each score
// (lib/attention/decode_attention.cpp). This removes a key bias shared by the block's tokens (large
// k_proj biases, as in Qwen models) before the codec sees it. The cache (seal) and the
// tables (lib/eval/quantized_attention.cpp) both center through these two functions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq::detail {

// One block of n key rows of d floats (row r at k + r·k_stride): mean16 (d values) = the per-channel mean,
// summed in double and rounded to fp16, and centered (n × d, packed) = k − that fp16 mean. The mean is
// rounded before it is subtracted, so that adding the stored mean back restores exactly what was taken off.
void center_block(const float* k, size_t k_stride, size_t n, int d, uint16_t* mean16, float* centered);

// centered (n × d, packed) = k − mean16 (center_block's second step).
void subtract_mean(const float* k, size_t k_stride, size_t n, int d, const uint16_t* mean16, float* centered);

}  // namespace kvq::detail
