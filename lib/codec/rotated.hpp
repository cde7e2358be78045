// The "+rot" modifier: wraps any codec so rows and queries are multiplied by a seeded randomized
// Hadamard matrix first. Scores are unchanged (the rotation is orthogonal); accumulated values come out
// rotated and finish_accumulate rotates them back once per step.
#pragma once

#include <cstdint>
#include <memory>

#include "codec_impl.hpp"

namespace kvq::detail {

std::unique_ptr<CodecImpl> make_rotated(std::unique_ptr<CodecImpl> inner, uint64_t seed);

}  // namespace kvq::detail
