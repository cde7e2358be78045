// Trellis-coded quantization of the tcqB codecs (lib/codec/turbo.hpp): the alphabet, the decoding rule
// and the Viterbi encoder, the specification a SIMD level must match.
//
// The alphabet has 2^(B+1) levels, ascending by rank k, on an int8 grid: level_k = scale · ints[k] in units
// of the coordinate's standard deviation σ. The subsets D_s = {ranks ≡ s mod 4} (s = 0..3) partition it
// as Ungerboeck's set partitioning does. Value j of a row carries one trellis bit u_j (the u plane) and an
// f code of B − 1 bits; with u_{−1} = u_{−2} = u_{−3} = 0 (every row starts in state 0):
//   s1_j = u_j ⊕ u_{j−1} ⊕ u_{j−3},  s0_j = u_{j−2},  subset s_j = 2·s1_j + s0_j,  rank_j = 4·f_j + s_j.
// A value depends on its own code and the three bits before it, so a row decodes in parallel.
//
// The encoder minimizes Σ_j (t_j − level(rank_j))² over all paths of the 8-state trellis (state
// (u_{j−1}, u_{j−2}, u_{j−3})), in float: a branch costs e·e with e = t − level, a path's cost is the
// running float sum in index order. Within a subset the nearest level wins, ties to the lower rank; a
// state's two predecessors are compared with strict <, the one with u_{j−3} = 0 first; the end state is
// the cheapest, ties to the lowest state index. NaN costs compare false, so they also give fixed codes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "rotated_kernels.hpp"

namespace kvq::detail {

struct TcqAlphabet {
    int bits = 0;          // B
    int n_levels = 0;      // 2^(B+1)
    float scale = 0;       // largest level / 127 (σ units)
    int8_t ints[16] = {};  // by rank, zero-padded to 16
    float levels[16] = {};  // scale · ints[k], zero-padded to 16
};

// B = 2 or 3.
const TcqAlphabet& tcq_alphabet(int bits);

// The subset of the branch u out of state (u_{j−1} | u_{j−2} << 1 | u_{j−3} << 2).
int tcq_branch_subset(int state, int u);

// rank_j of a row: f codes of B − 1 bits packed from `codes`, the u plane at `plane` (bit j = u_j).
int tcq_rank(const uint8_t* codes, const uint8_t* plane, int bits, int j);

// The encoder over n values t (σ units): u[j] ∈ {0, 1} and f[j] < 2^(B−1) of the least-cost path; returns
// its cost. Uses a buffer of this thread, grown once (12 bytes per value).
float tcq_viterbi(const TcqAlphabet& a, const float* t, int n, uint8_t* u, uint8_t* f);

// The specification's kernels of the rows tcq2 and tcq3 (B = 2, 3; tcq_kernels.cpp): the scalar level's
// entries of the kernel grid (rotated_spec.cpp). tcqB has no QJL stage: residual and sketch are unused.
template <int B>
void tcq_quantize_rows_spec(const TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                            size_t dst_stride, float* residual);
template <int B>
void tcq_score_spec(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                    size_t row_stride, size_t n_rows, float* scores, size_t score_stride);
template <int B>
void tcq_accumulate_spec(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                         size_t row_stride, size_t n_rows, float* acc, float* sketch);
// A row's levels c[j] = level(rank_j), σ units (dequantize: times the scale, then Rᵀ).
void tcq_decode_levels(const TurboLayout& l, int bits, const uint8_t* row, float* c);

}  // namespace kvq::detail
