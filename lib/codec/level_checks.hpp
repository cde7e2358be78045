// The end-to-end checks of a SIMD level through the codec path (level_checks.cpp): above lib/simd, whose
// self-check checks kernels only. Each returns what differed first, or an empty string; `checks` counts
// the values compared.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvq/simd.hpp"

namespace kvq::detail {

// A codec spec (polar, turbo*, or any other) through the whole codec path with this thread's kernels at
// `level` against the specification's: scores and accumulations (finished) to float rounding.
std::string check_codec_path(SimdLevel level, const std::string& spec, int d, size_t rows, int n_q, uint64_t seed,
                             size_t& checks);

// A codec's quantize_rows at `level` against the specification's: the same bytes, on parity_rows(extreme)
// and a NaN and an Inf row (NanPolicy::propagate), into strided rows whose gaps must stay untouched.
std::string check_codec_quantize(SimdLevel level, const std::string& spec, int d, size_t rows, uint64_t seed,
                                 size_t& checks);

// The run-time self-check's part above lib/simd: turbo4, turbo3.5, turbo2_qjl and polar through the codec
// path (two cases each: head sizes 128 and 64, 7 and 2 queries) and their quantize_rows on extreme rows.
std::string check_rotated_codecs(SimdLevel level);

// Adds check_rotated_codecs to every level's run-time self-check (dispatch.hpp, add_level_check); called
// by Codec::make, so before any polar or turbo kernel runs.
void add_codec_level_checks();

}  // namespace kvq::detail
