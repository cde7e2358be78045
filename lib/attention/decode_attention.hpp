// One decode step of attention over rows stored in blocks, computed on the codes.
//
// For each kv head, the g = n_heads / n_kv_heads queries that share it are prepared once; then, block by
// block, the key format scores the g queries against the block's rows (one call), an online softmax turns
// the scores into weights, and the value codec accumulates the weighted rows into registers-sized
// accumulators (one call). No row is ever dequantized into memory and every byte is read once.
// Long runs are split into block ranges that run on several threads; their partial (max, sum,
// accumulator) states merge exactly (flash-decoding).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

#include <vector>

#include "../codec/codec_impl.hpp"
#include "../codec/key_format.hpp"
#include "../codec/value_format.hpp"
#include "online_softmax.hpp"
#include "scratch_pool.hpp"
#include "thread_pool.hpp"

namespace kvq::detail {

// Where the rows of kv head h sit in a block: keys at block + k_offset + h·k_head_stride, one row of
// the key format's row_bytes() per token (or as the format keeps them), values likewise; the key format's
// side data (lib/codec/key_format.hpp), where it has any, at k_side_offset + h·k_side_stride.
struct BlockLayout {
    int block_tokens = 0;
    size_t k_offset = 0, k_head_stride = 0;
    size_t v_offset = 0, v_head_stride = 0;
    size_t k_side_offset = kNoKeySide, k_side_stride = 0;
    // Bytes from one token's row to the next within a head; 0: the codec's row_bytes() (rows packed, as
    // in pool blocks). A ggml KV tensor has its nb[2] here.
    size_t k_row_stride = 0, v_row_stride = 0;
};

// Consecutive tokens held in blocks of one layout, one key format and one value format: rows
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
    // values in separate tensors); empty: the value rows are in `blocks` at layout.v_offset.
    std::span<uint8_t* const> value_blocks;
};

struct AttentionShape {
    int n_heads = 0;     // query heads; query head i uses kv head i / (n_heads / n_kv_heads)
    int n_kv_heads = 0;
    int head_dim = 0;
    float scale = 0;     // applied to q·k (after the key-mean compensation)
    float softcap = 0;   // c > 0: s -> c·tanh(s/c) after scaling
};

// Runs task(i) once for every i in [0, n), on any threads, and returns when all calls have returned
// (kvq's shared pool, or an engine's executor).
using ParallelRun = std::function<void(int n, const std::function<void(int)>& task)>;

// One decode step of one sequence: its row sources, its query vectors and where the result goes.
struct DecodeTask {
    std::span<const RowSource> sources;
    const float* q = nullptr;  // n_heads × head_dim, finite (the caller checks)
    float* out = nullptr;      // n_heads × head_dim
};

// One part of a decode call: blocks [block_begin, block_end) of kv heads [head_begin, head_end) of a
// task's source.
struct WorkItem {
    size_t task, source;
    size_t block_begin, block_end;
    int head_begin, head_end;
};

// A decode call's buffers (leased per call: lib/attention/scratch_pool.hpp). Their size is bounded by the
// shape and threads, not by the number of tasks: a batch runs in rounds of at most kMaxItemsPerRound parts.
struct DecodeScratch {
    std::vector<uint8_t> preps;
    std::vector<size_t> prep_at;  // per (task, source): offset into preps
    std::vector<WorkItem> items;
    std::vector<size_t> first_prep;  // per task: prep_at index of its first source
    std::vector<SoftmaxState> states;
    std::vector<float> accs;
};
// Parts of one round; a single task never has more (2 sources × max(64 block ranges, 256 head ranges)).
inline constexpr size_t kMaxItemsPerRound = 512;

// out (n_heads × head_dim) = softmax(scores) · V over every row of every source. Each source is scored
// in its key codec's basis and accumulated in its value codec's basis (finished, e.g. un-rotated, before
// sources merge). With run and threads > 1, long sources are split into block ranges (and a single range
// into kv-head ranges) that run in parallel; their states merge in a fixed order, so the result does not
// depend on which thread ran what. Every task must hold at least one row in total. Buffers come from
// `scratch` (null: a pool of the process's).
void decode_attention(const AttentionShape& shape, std::span<const RowSource> sources, const float* q,
                      float* out, const ParallelRun* run, int threads, ScratchPool<DecodeScratch>* scratch = nullptr);
// Several sequences' steps in parallel runs of at most kMaxItemsPerRound parts: each task's result is
// bit-identical to decode_attention of that task alone with the same threads.
void decode_attention_batch(const AttentionShape& shape, std::span<const DecodeTask> tasks, const ParallelRun* run,
                            int threads, ScratchPool<DecodeScratch>* scratch = nullptr);

// The scores decode_attention computes for one source, as a measurement (the accuracy tables' KL and top-k
// need them): scores[i·n + r] = query head i's scaled (and soft-capped) score against the source's row r,
// n its rows in order. The same per-block scoring code as the decode loop, on one thread.
void attention_scores(const AttentionShape& shape, const RowSource& src, const float* q, float* scores);

}  // namespace kvq::detail
