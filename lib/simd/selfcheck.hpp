// The run-time self-check of one SIMD level: a known-answer check of its kernels against the scalar
// specification on small seeded inputs (quantize bytes, prepared queries, dequantized values, scores
// and accumulations of every codec family, the softmax update, and the contracts of its primitives).
// Run by dispatch.cpp the first time a level is about to be used.
#pragma once

#include <string>

#include "kvq/simd.hpp"

namespace kvq::detail {

// Empty if `level`'s kernels agree with the specification, else what differed first. The run-time
// self-check is this and the checks added from above (dispatch.hpp, level_self_check).
std::string quick_check_level(SimdLevel level);

}  // namespace kvq::detail
