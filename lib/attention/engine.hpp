// The attention engine: every attention kvq computes runs here, over row sources whose blocks own their
// geometry (a cache's pool blocks and its float staging, or a caller's tensor in virtual blocks).
//
// A task is one sequence's query rows (one for a decode step, a prefill chunk's or a ggml op's several)
// over its row sources. Its rows go in tiles: per kv head, the g heads of a tile's rows are prepared once
// in the key format and scored together block by block, an online softmax turns the scores into weights,
// and the value format accumulates the weighted rows into register-sized accumulators (one call each per
// block and kv head). No row is dequantized into memory and every byte is read once per tile. What a row
// keeps: every token, or a causal range by position, and/or an additive mask; tokens no row of a tile
// keeps are neither scored nor read. Long runs are split into block ranges on several threads; their
// partial (max, sum, accumulator) states merge in a fixed order (flash-decoding), so the result does not
// depend on which thread ran what.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "../codec/codec_impl.hpp"
#include "../codec/key_format.hpp"
#include "../codec/value_format.hpp"
#include "kvq/attention.hpp"
#include "online_softmax.hpp"
#include "scratch_pool.hpp"
#include "thread_pool.hpp"

namespace kvq::detail {

// Consecutive tokens held in blocks of one layout (lib/codec/block_layout.hpp: it owns every offset), one key
// format and one value format: rows
// [first_row, block_tokens) of blocks[0], all rows of the blocks between, rows [0, end_row) of the last
// block (a single block uses rows [first_row, end_row)).
struct RowSource {
    const KeyFormat* key = nullptr;
    const ValueFormat* value = nullptr;
    BlockLayout layout;
    std::span<uint8_t* const> blocks;
    size_t first_row = 0;
    size_t end_row = 0;
    // Where the values of each block are, when not in the key blocks (rows an engine owns, with keys and
    // values in separate tensors); empty: the values are in `blocks`, where the layout says.
    std::span<uint8_t* const> value_blocks;

    size_t block_tokens() const { return static_cast<size_t>(layout.block_tokens); }
    // Block b holds rows [rows_begin(b), rows_begin(b) + rows_in(b)) of its block_tokens.
    size_t rows_begin(size_t b) const { return b == 0 ? first_row : 0; }
    size_t rows_in(size_t b) const {
        const size_t hi = b == blocks.size() - 1 ? end_row : block_tokens();
        return hi > rows_begin(b) ? hi - rows_begin(b) : 0;
    }
    // The tokens of the source, and the first token of block b among them.
    size_t tokens() const { return blocks.empty() ? 0 : blocks.size() * block_tokens() - first_row - (block_tokens() - end_row); }
    size_t token_of(size_t b) const { return b * block_tokens() + rows_begin(b) - first_row; }
    ConstKeyHead key_head(size_t b, int h) const { return layout.key_head<const uint8_t>(blocks[b], h, key->row_bytes()); }
    ConstValueHead value_head(size_t b, int h) const { return value_head(b, h, value->row_bytes()); }
    // The same with the value format's row_bytes() given (the decode loop's, read once per call).
    ConstValueHead value_head(size_t b, int h, size_t row_bytes) const {
        return layout.value_head<const uint8_t>(value_blocks.empty() ? blocks[b] : value_blocks[b], h, row_bytes);
    }
    size_t key_row_stride() const { return layout.keys.row_stride ? layout.keys.row_stride : key->row_bytes(); }
    size_t value_row_stride() const { return layout.values.row_stride ? layout.values.row_stride : value->row_bytes(); }
};

struct AttentionShape {
    int n_heads = 0;     // query heads; query head i uses kv head i / (n_heads / n_kv_heads)
    int n_kv_heads = 0;
    int head_dim = 0;    // of the keys and queries
    float scale = 0;     // applied to q·k (after the key-mean compensation)
    float softcap = 0;   // c > 0: s -> c·tanh(s/c) after scaling
    int head_dim_v = 0;  // of the values and results; 0: head_dim

    int dv() const { return head_dim_v ? head_dim_v : head_dim; }
};

// Runs task(i) once for every i in [0, n), on any threads, and returns when all calls have returned
// (kvq's shared pool, or an engine's executor).
using ParallelRun = std::function<void(int n, const std::function<void(int)>& task)>;

// A task's query rows and what each keeps. Strides count floats (q, out) or mask elements; 0 is packed.
// Token t of a task is its sources' rows in order (t = 0 the first row of the first source).
struct QueryRows {
    const float* q = nullptr;  // row i's head h at q + i·row_stride + h·head_stride (head_dim floats, finite)
    size_t n_rows = 1;
    size_t row_stride = 0, head_stride = 0;
    float* out = nullptr;      // likewise, head_dim_v floats each
    size_t out_row_stride = 0, out_head_stride = 0;
    // Additive mask (null: none): token t of row i at mask + i·mask_row_stride + t; -inf removes it.
    const void* mask = nullptr;
    MaskType mask_type = MaskType::f16;
    size_t mask_row_stride = 0;
    // Causal by position (causal_end 0: off): row i keeps tokens [end_i − window, end_i) with
    // end_i = causal_end + i (window 0: from token 0).
    size_t causal_end = 0;
    size_t window = 0;
    // One logit per query head that joins each softmax's denominator as a token without a value (null: none).
    const float* sinks = nullptr;
};

// One task: a sequence's row sources and its query rows. A row that keeps no token gets zeros.
struct AttendTask {
    std::span<const RowSource> sources;
    QueryRows rows;
};

// One part of a call: blocks [block_begin, block_end) of kv heads [head_begin, head_end) of one source,
// for one tile of a task's rows.
struct WorkItem {
    size_t unit, source;
    size_t block_begin, block_end;
    int head_begin, head_end;
};

// One tile of one task: rows [row_begin, row_begin + n_rows) and the token range they keep.
struct WorkUnit {
    size_t task, row_begin, n_rows;
    size_t token_begin, token_end;
    size_t first_item = 0, end_item = 0;
    size_t queries = 0;  // offset into the round's gathered queries (floats); SIZE_MAX: the task's own q
    size_t prep = 0;     // offset into preps of its first source's prepared queries
    size_t state = 0;    // offset of its first item's states (and accumulators: × head_dim_v)
};

// A call's buffers (leased per call: lib/attention/scratch_pool.hpp). Their size is bounded by the
// shape and threads, not by the number of tasks: a call runs in rounds of at most kMaxItemsPerRound parts.
struct EngineScratch {
    std::vector<WorkUnit> units;
    std::vector<WorkItem> items;
    std::vector<float> queries;
    std::vector<uint8_t> preps;
    std::vector<SoftmaxState> states;
    std::vector<float> accs;
};
using DecodeScratch = EngineScratch;
inline constexpr size_t kMaxItemsPerRound = 512;

// Every task's rows = softmax(mask + scale·q·k) · V over the tokens they keep of every source. Each source
// is scored in its key format's basis and accumulated in its value format's basis (finished, e.g.
// un-rotated, before sources merge). With run and threads > 1 the work is split into parts that run in
// parallel. Buffers come from `scratch` (null: a pool of the process's).
void attend(const AttentionShape& shape, std::span<const AttendTask> tasks, const ParallelRun* run, int threads,
            ScratchPool<EngineScratch>* scratch = nullptr);

// One decode step of one sequence (one query row, n_heads × head_dim, packed; out n_heads × head_dim_v).
void decode_attention(const AttentionShape& shape, std::span<const RowSource> sources, const float* q,
                      float* out, const ParallelRun* run, int threads, ScratchPool<EngineScratch>* scratch = nullptr);

// The scores attend computes for one source and one query row, as a measurement (the accuracy tables' KL
// and top-k need them): scores[i·n + r] = query head i's scaled (and soft-capped) score against the
// source's row r, n its rows in order. The same per-block scoring code as attend, on one thread.
void attention_scores(const AttentionShape& shape, const RowSource& src, const float* q, float* scores);

}  // namespace kvq::detail
