// kvq::attend_rows' argument checks (issue #50): every buffer the call reads or writes (k, v, q, out, the
// mask, the sinks) described once, its extent computed with checked arithmetic (lib/util/checked_size.hpp)
// and refused past PTRDIFF_MAX before a byte of any of them is read; then the values the call owes a
// finite result for (the query, the mask, the sinks) are checked under NanPolicy::reject. The engine
// (attend_rows.cpp) runs on what this resolves, and finish_rows_exactly (attend_rows_exact.cpp) gives
// finite results where finite inputs overflowed float, as the cache does.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kvq/attention.hpp"

namespace kvq::detail {

// The strides of a call with the defaults filled in, in elements (floats; mask elements for mask_row).
// A row stride is SIZE_MAX when its default overflows and only one row is read (never used then).
struct RowStrides {
    size_t q_head = 0, q_row = 0, out_head = 0, out_row = 0, mask_row = 0;
};

// Fills k's and v's default strides and checks every buffer's extent, the stride rules (token strides of
// at least a row, mask rows of at least n_tokens, results that do not overlap), then, under
// NanPolicy::reject, that the query is finite and the mask finite or -inf (NonFiniteInput); sinks must be
// finite under either policy. Throws std::invalid_argument before anything is written. n_queries > 0, and
// the shapes (head counts, head_dim, pointers) were checked by the caller.
RowStrides check_attend_rows(const Codec& keys, const Codec& values, int n_heads, int n_kv_heads, const float* q,
                             RowsView& k, RowsView& v, size_t n_tokens, const float* out, const AttendOptions& o);

// Results whose d floats are not all finite although their query, mask row, keys and values are (scores
// or sums that overflow float: a scale or query of 1e38): computed again in double precision from the
// dequantized rows, so finite inputs give finite output (clamped to ±FLT_MAX). Other results keep their
// bits. `scale` is the resolved scale (never 0).
void finish_rows_exactly(const Codec& keys, const Codec& values, int n_heads, int n_kv_heads, const float* q,
                         const RowsView& k, const RowsView& v, size_t n_tokens, float* out, const AttendOptions& o,
                         const RowStrides& s, float scale);

}  // namespace kvq::detail
