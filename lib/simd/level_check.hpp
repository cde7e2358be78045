// Checks of one SIMD level's kernels against the scalar specification, shared by the run-time self-check
// (selfcheck.cpp: a few small cases) and the full parity check kvq::selftest() (lib/check/): each
// function runs one case and returns what differed first, or an empty string; `checks` counts the
// values compared. Kernels only: the checks through the codec path are above lib/simd
// (lib/codec/level_checks.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../ref/row_codecs.hpp"
#include "kvq/simd.hpp"

namespace kvq::detail {

// A block codec's raw kernels at `level` against the specification: quantize and prepare_query bytes
// identical, dequantize bits identical (of the quantized rows and of random bytes), score and accumulate
// to float rounding; n values per row (a multiple of the block), rows rows (stride padded), n_q queries.
// extreme: rows with huge, tiny and subnormal values besides ordinary ones.
std::string check_block_codec(SimdLevel level, BlockCodec c, int n, size_t rows, int n_q, bool extreme, uint64_t seed,
                              size_t& checks);

// The online softmax's block update at `level`: the same bits as the specification (weights, states and
// rescaled accumulators) for g queries and n scores.
std::string check_softmax(SimdLevel level, int g, size_t n, uint64_t seed, size_t& checks);
// The level's chanB score kernel against channel_score_scalar, bit for bit: n_q queries, rows of d
// B-bit codes (random bytes, any of which is a code row) at a stride one byte past the row.
std::string check_channel_score(SimdLevel level, int bits, int d, size_t rows, int n_q, uint64_t seed, size_t& checks);
// q8_0 keys in groups of 16 (lib/ref/key_groups.hpp): the layout's round trip, and where the level has
// BlockKernels::score_groups, its scores of 1-4 queries against the level's own score of the same rows,
// bit for bit.
std::string check_score_groups(SimdLevel level, int d, size_t n_groups, bool extreme, uint64_t seed, size_t& checks);

// Rows of n values for parity checks, each row a different kind of data, cycling through the kinds:
// zeros, signed zeros, equal values, exact rounding ties, alternating signs, huge, tiny, subnormal
// scales, a narrow range around an offset, N(0, 1). extreme: the huge/tiny kinds beyond fp16's range.
std::vector<float> parity_rows(size_t rows, int n, uint64_t seed, bool extreme);
// a and b have the same bits, or are both NaN.
bool same_float(float a, float b);
// |got − want| <= tol, or both the same infinity, or both NaN.
bool close_to(float got, float want, double tol);

// The contract check of the level's primitives (ops_check.hpp).
std::string check_primitives(SimdLevel level, size_t& checks);

}  // namespace kvq::detail
