#include "decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "online_softmax.hpp"

namespace kvq::detail {
namespace {

// A part below this many blocks costs more in merging and waking a thread than it saves.
constexpr size_t kMinBlocksPerPart = 16;
// Parts of one source when split. Threads take parts as they come free (the caller too), so many small
// parts keep a thread that starts late or runs slower from idling the other at the end (16 parts left the
// caller idle for a whole part, 11% of a 128k-token step). Each part keeps its own (max, sum, acc) so
// that the merge order, hence the result, never depends on which thread ran which part.
constexpr size_t kMaxParts = 64;

constexpr size_t kLine = 64;  // bytes of a cache line

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// The first cache-line boundary at or after p (the buffer holds a line's worth of slack).
template <class T>
T* align_line(T* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return reinterpret_cast<T*>((a + kLine - 1) / kLine * kLine);
}

// n rows of row_bytes, stride apart, asked for ahead of use: one span where they are packed, row by row
// where they are not (a ggml tensor's rows of one head, with other heads between). Prefetches never fault.
constexpr int kToL1 = 3, kToL2 = 2;  // __builtin_prefetch's locality: prefetcht0, prefetcht1
template <int Locality>
void prefetch_rows(const uint8_t* p, size_t n, size_t row_bytes, size_t stride) {
    const bool packed = stride == row_bytes;
    const size_t span = packed ? n * row_bytes : row_bytes;
    for (size_t r = 0; r < (packed ? 1 : n); ++r) {
        for (size_t o = 0; o < span; o += kLine) __builtin_prefetch(p + r * stride + o, 0, Locality);
    }
}

// s -> c·tanh(s/c) (Gemma 2's logit soft-cap).
void soft_cap(float* s, size_t n, float softcap) {
    const float inv = 1.0f / softcap;
    for (size_t r = 0; r < n; ++r) s[r] = softcap * std::tanh(s[r] * inv);
}

// The key side of a source, shared by attend_blocks and attention_scores: which rows of each block it
// holds and where a kv head's part of a block is; the key format (lib/codec/key_format.hpp) scores them.
struct KeyBlocks {
    const RowSource& src;
    int g, d;
    size_t bt, krb, krs, qb, side_bytes;

    KeyBlocks(const AttentionShape& shape, const RowSource& s)
        : src(s), g(shape.n_heads / shape.n_kv_heads), d(shape.head_dim), bt(static_cast<size_t>(s.layout.block_tokens)),
          krb(s.key->row_bytes()), krs(s.layout.k_row_stride ? s.layout.k_row_stride : krb), qb(s.key->query_bytes()),
          side_bytes(s.key->side_bytes()) {}

    // Floats of scratch the key format's score needs.
    size_t scratch_floats() const { return src.key->scratch_floats(g); }
    // Block b holds rows [lo(b), lo(b) + rows(b)) of the source.
    size_t lo(size_t b) const { return b == 0 ? src.first_row : 0; }
    size_t rows(size_t b) const {
        const size_t hi = b == src.blocks.size() - 1 ? src.end_row : bt;
        return hi > lo(b) ? hi - lo(b) : 0;
    }
    // Kv head h's part of block b.
    ConstKeyHead head(size_t b, int h) const {
        const uint8_t* block = src.blocks[b];
        const BlockLayout& lay = src.layout;
        return {block + lay.k_offset + h * lay.k_head_stride,
                lay.k_side_offset == kNoKeySide ? nullptr : block + lay.k_side_offset + h * lay.k_side_stride, krs};
    }
    // Where the bytes of row lo of kv head h's keys in block b start (keys in groups: where its group starts).
    const uint8_t* keys(size_t b, int h, size_t lo) const {
        return src.key->rows_from(src.blocks[b] + src.layout.k_offset + h * src.layout.k_head_stride, lo, krs);
    }
    // q·k of kv head h's g queries (prep: the source's prepared queries, from prepare_queries; q: the
    // floats) against rows [lo, lo + n) of block b; query i's at scores + i·stride. Returns what to add to
    // query i's scores (null: nothing). scratch: scratch_floats() floats.
    const float* score(const uint8_t* prep, const float* q, size_t b, int h, size_t lo, size_t n, float* scores,
                       size_t stride, float* scratch) const {
        const size_t first = static_cast<size_t>(h) * g;
        return src.key->score(prep + first * qb, q + first * d, g, head(b, h), lo, n, scores, stride, scratch);
    }
};

// s <- (s + offset_i)·scale, then the soft-cap, for g queries' n scores (query i's at s + i·stride): the
// online softmax's own scaling (lib/ref/softmax.hpp), done ahead of it where the cap comes in between.
void scale_scores(const AttentionShape& shape, float* s, size_t stride, int g, size_t n, const float* offsets) {
    for (int i = 0; i < g; ++i) {
        float* row = s + i * stride;
        const float off = offsets ? offsets[i] : 0.0f;
        for (size_t r = 0; r < n; ++r) row[r] = (row[r] + off) * shape.scale;
        if (shape.softcap > 0) soft_cap(row, n, shape.softcap);
    }
}

// The online softmax over blocks [b0, b1) of one source, for every query head, into st and acc (in the
// value codec's basis).
void attend_blocks(const AttentionShape& shape, const RowSource& src, const uint8_t* prep, const float* q,
                   size_t b0, size_t b1, int h0, int h1, SoftmaxState* st, float* acc) {
    const KeyBlocks kb(shape, src);
    const int g = kb.g, d = kb.d;
    const BlockLayout& lay = src.layout;
    const size_t bt = kb.bt, krb = kb.krb, krs = kb.krs;
    const size_t vrb = src.value->row_bytes();
    const size_t vrs = lay.v_row_stride ? lay.v_row_stride : vrb;

    // g × block_tokens scores and block_query's scratch: this thread's, grown once (the block queries on
    // a cache line: the score kernels read them as vectors).
    thread_local std::vector<float> scratch;
    const size_t score_floats = round_up(static_cast<size_t>(g) * bt, kLine / sizeof(float));
    const size_t need = score_floats + kb.scratch_floats() + kLine / sizeof(float);
    if (scratch.size() < need) scratch.resize(need);
    float* scores = align_line(scratch.data());
    float* block_scratch = scores + score_floats;

    for (size_t b = b0; b < b1; ++b) {
        const size_t lo = kb.lo(b), n = kb.rows(b);
        if (n == 0) continue;
        const uint8_t* value_block = src.value_blocks.empty() ? src.blocks[b] : src.value_blocks[b];
        for (int h = h0; h < h1; ++h) {
            const uint8_t* keys = kb.keys(b, h, lo);
            const uint8_t* values = value_block + lay.v_offset + h * lay.v_head_stride + lo * vrs;
            // The prefetches are spread over a head's work: a burst of them stalls the loads behind it.
            // This head's keys of the next block into L2 now, its values after the softmax: blocks are not
            // adjacent in memory, and the hardware prefetchers lose the stream at each (measured on a Zen 4,
            // 2 threads, interleaved runs: from memory 1.1-1.2× faster for q8_0/q4_0, q8_0/q8_0 and f16 at
            // 32k and 128k tokens; to L1, or only a block's first lines, was slower; two blocks ahead no
            // faster). Spreading them, and the values' L1 prefetch below, was 1.04-1.11× faster again.
            const size_t n1 = b + 1 < b1 ? kb.rows(b + 1) : 0, lo1 = b + 1 < b1 ? kb.lo(b + 1) : 0;
            if (n1) {
                prefetch_rows<kToL2>(kb.keys(b + 1, h, lo1), n1, krb, krs);
                // and its side data (centered keys' means, chanB's minimums and steps), read by the format's score
                if (const uint8_t* side = kb.head(b + 1, h).side) prefetch_rows<kToL2>(side, 1, kb.side_bytes, 0);
            }
            const float* offsets = kb.score(prep, q, b, h, lo, n, scores, n, block_scratch);
            // The values are read after the softmax: ask for them now, so that their first touch overlaps it
            // instead of stalling the accumulate (measured: 6-10% of a q8_0/q4_0 step at 4k and 32k tokens;
            // asked before the scoring, with the next block's keys, 1.0-1.1× slower).
            prefetch_rows<kToL1>(values, n, vrb, vrs);
            // And the first half of the next head's keys (the hardware prefetcher streams the rest once it
            // sees them) while this head's softmax and accumulate run: measured 3-10% at 4k and 32k tokens
            // (all of them, or at score time, was no better or slower).
            const uint8_t* next_keys = h + 1 < h1 ? keys + lay.k_head_stride
                                       : b + 1 < b1             ? src.blocks[b + 1] + lay.k_offset + h0 * lay.k_head_stride
                                                                : nullptr;
            if (next_keys && krs == krb) {
                for (size_t o = 0; o < bt * krb / 2; o += 64) __builtin_prefetch(next_keys + o, 0, 3);
            }
            float* head_acc = acc + static_cast<size_t>(h) * g * d;
            if (shape.softcap > 0) {  // the cap applies after the scale, before the softmax
                scale_scores(shape, scores, n, g, n, offsets);
                softmax_update(scores, g, n, nullptr, 1.0f, st + h * g, head_acc, d);
            } else {
                softmax_update(scores, g, n, offsets, shape.scale, st + h * g, head_acc, d);
            }
            if (n1) {
                const uint8_t* value_block1 = src.value_blocks.empty() ? src.blocks[b + 1] : src.value_blocks[b + 1];
                prefetch_rows<kToL2>(value_block1 + lay.v_offset + h * lay.v_head_stride + lo1 * vrs, n1, vrb, vrs);
            }
            src.value->accumulate(scores, n, g, values, vrs, n, head_acc);
        }
    }
}

// Splits each source of a task into block ranges: one per source without threads, more for long sources;
// a source that stays one range is split by kv heads instead when threads would otherwise idle.
void plan_work(size_t task, std::span<const RowSource> sources, int n_kv_heads, int threads, std::vector<WorkItem>& items) {
    for (size_t s = 0; s < sources.size(); ++s) {
        const size_t nb = sources[s].blocks.size();
        if (nb == 0) continue;
        size_t parts = 1;
        if (threads > 1) {
            parts = std::clamp<size_t>(nb / kMinBlocksPerPart, 1, kMaxParts);
        }
        const int head_parts = parts == 1 && threads > 1 ? std::min(threads, n_kv_heads) : 1;
        for (size_t p = 0; p < parts; ++p) {
            for (int hp = 0; hp < head_parts; ++hp) {
                items.push_back({task, s, nb * p / parts, nb * (p + 1) / parts, n_kv_heads * hp / head_parts,
                                 n_kv_heads * (hp + 1) / head_parts});
            }
        }
    }
}

// One round of a decode call: the tasks' parts (already planned into sc.items) in one parallel run.
void decode_round(const AttentionShape& shape, std::span<const DecodeTask> tasks, const ParallelRun* run, int threads,
                  DecodeScratch& sc) {
    const size_t heads = static_cast<size_t>(shape.n_heads);
    const size_t d = static_cast<size_t>(shape.head_dim);
    const int g = shape.n_heads / shape.n_kv_heads;

    // Queries prepared once per task and source (a source's key format), at 64-byte offsets.
    sc.prep_at.clear();
    size_t prep_bytes = 0;
    for (const DecodeTask& t : tasks) {
        for (const RowSource& src : t.sources) {
            sc.prep_at.push_back(prep_bytes);
            if (!src.blocks.empty()) prep_bytes += round_up(heads * src.key->query_bytes(), kLine);
        }
    }
    if (sc.preps.size() < prep_bytes + kLine) sc.preps.resize(prep_bytes + kLine);
    uint8_t* const preps = align_line(sc.preps.data());
    {
        size_t k = 0;
        for (const DecodeTask& t : tasks) {
            for (const RowSource& src : t.sources) {
                if (!src.blocks.empty()) src.key->prepare_queries(t.q, shape.n_heads, preps + sc.prep_at[k]);
                ++k;
            }
        }
    }

    const std::vector<WorkItem>& items = sc.items;
    std::vector<size_t>& first_prep = sc.first_prep;
    first_prep.resize(tasks.size());
    for (size_t t = 0, k = 0; t < tasks.size(); k += tasks[t].sources.size(), ++t) first_prep[t] = k;

    // Each part's (max, sum) states and accumulators on cache lines of their own: parts run on different
    // threads at once, and both are written at every block. Each part resets its own.
    const size_t state_stride = round_up(heads, kLine / sizeof(SoftmaxState));
    const size_t acc_stride = round_up(heads * d, kLine / sizeof(float));
    if (sc.states.size() < items.size() * state_stride + kLine / sizeof(SoftmaxState))
        sc.states.resize(items.size() * state_stride + kLine / sizeof(SoftmaxState));
    if (sc.accs.size() < items.size() * acc_stride + kLine / sizeof(float))
        sc.accs.resize(items.size() * acc_stride + kLine / sizeof(float));
    SoftmaxState* const states = align_line(sc.states.data());
    float* const accs = align_line(sc.accs.data());
    auto run_item = [&](int i) {
        const WorkItem& it = items[i];
        const DecodeTask& task = tasks[it.task];
        float* acc = accs + i * acc_stride;
        std::fill(acc, acc + heads * d, 0.0f);
        std::fill(states + i * state_stride, states + i * state_stride + heads, SoftmaxState{});
        attend_blocks(shape, task.sources[it.source], preps + sc.prep_at[first_prep[it.task] + it.source], task.q,
                      it.block_begin, it.block_end, it.head_begin, it.head_end, states + i * state_stride, acc);
    };
    if (run && threads > 1 && items.size() > 1) {
        // By reference: a std::function made from the lambda itself would allocate (its captures are
        // larger than the small-object buffer); one from a reference_wrapper never does.
        (*run)(static_cast<int>(items.size()), std::ref(run_item));
    } else {
        for (size_t i = 0; i < items.size(); ++i) run_item(static_cast<int>(i));
    }

    // Per task: merge the parts of each source (in plan order), finish it in its value codec (back to
    // the caller's basis), then merge the sources. The first item of each source collects that source.
    for (size_t i = 0; i < items.size();) {
        const size_t task = items[i].task;
        SoftmaxState* total = nullptr;
        float* total_acc = nullptr;
        for (; i < items.size() && items[i].task == task;) {
            SoftmaxState* st_i = states + i * state_stride;
            float* acc_i = accs + i * acc_stride;
            size_t j = i + 1;
            for (; j < items.size() && items[j].task == task && items[j].source == items[i].source; ++j) {
                const SoftmaxState* st_j = states + j * state_stride;
                const float* acc_j = accs + j * acc_stride;
                const size_t h0 = static_cast<size_t>(items[j].head_begin) * g, h1 = static_cast<size_t>(items[j].head_end) * g;
                for (size_t h = h0; h < h1; ++h) merge_softmax(st_i[h], acc_i + h * d, st_j[h], acc_j + h * d, shape.head_dim);
            }
            tasks[task].sources[items[i].source].value->finish(acc_i, shape.n_heads);
            if (!total) {
                total = st_i;
                total_acc = acc_i;
            } else {
                for (size_t h = 0; h < heads; ++h) merge_softmax(total[h], total_acc + h * d, st_i[h], acc_i + h * d, shape.head_dim);
            }
            i = j;
        }
        float* out = tasks[task].out;
        for (size_t h = 0; h < heads; ++h) {
            const float inv = 1.0f / total[h].sum;
            for (size_t j = 0; j < d; ++j) out[h * d + j] = total_acc[h * d + j] * inv;
        }
    }
}

// Buffers of calls that bring no pool of their own (rows an engine owns); never destroyed, so that a
// call still running on another thread at exit never finds it gone.
ScratchPool<DecodeScratch>& process_scratch() {
    static auto* pool = new ScratchPool<DecodeScratch>;
    return *pool;
}

}  // namespace

void decode_attention_batch(const AttentionShape& shape, std::span<const DecodeTask> tasks, const ParallelRun* run,
                            int threads, ScratchPool<DecodeScratch>* scratch) {
    // This call's own buffers: a nested call on this thread (an executor running other work between this
    // call's parts) leases others.
    const auto lease = (scratch ? *scratch : process_scratch()).lease();
    DecodeScratch& sc = *lease;
    if (!run) threads = 1;
    // Rounds of whole tasks, at most kMaxItemsPerRound parts each: the buffers stay bounded by the shape
    // and threads however many tasks a batch has.
    for (size_t begin = 0; begin < tasks.size();) {
        sc.items.clear();
        size_t end = begin;
        for (; end < tasks.size(); ++end) {
            const size_t before = sc.items.size();
            plan_work(end - begin, tasks[end].sources, shape.n_kv_heads, threads, sc.items);
            if (sc.items.size() > kMaxItemsPerRound && end > begin) {
                sc.items.resize(before);
                break;
            }
        }
        decode_round(shape, tasks.subspan(begin, end - begin), run, threads, sc);
        begin = end;
    }
}

void decode_attention(const AttentionShape& shape, std::span<const RowSource> sources, const float* q, float* out,
                      const ParallelRun* run, int threads, ScratchPool<DecodeScratch>* scratch) {
    const DecodeTask task{sources, q, out};
    decode_attention_batch(shape, std::span<const DecodeTask>(&task, 1), run, threads, scratch);
}

void attention_scores(const AttentionShape& shape, const RowSource& src, const float* q, float* scores) {
    const KeyBlocks kb(shape, src);
    thread_local std::vector<uint8_t> prep_buf;
    const size_t prep_bytes = static_cast<size_t>(shape.n_heads) * kb.qb + kLine;
    if (prep_buf.size() < prep_bytes) prep_buf.resize(prep_bytes);
    uint8_t* const prep = align_line(prep_buf.data());  // on a cache line, as decode_attention's
    src.key->prepare_queries(q, shape.n_heads, prep);
    size_t total = 0;
    for (size_t b = 0; b < src.blocks.size(); ++b) total += kb.rows(b);
    std::vector<float> block_scratch(kb.scratch_floats() + kLine / sizeof(float));
    float* const aligned_scratch = align_line(block_scratch.data());
    for (size_t b = 0, at = 0; b < src.blocks.size(); ++b) {
        const size_t lo = kb.lo(b), n = kb.rows(b);
        if (n == 0) continue;
        for (int h = 0; h < shape.n_kv_heads; ++h) {
            float* s = scores + static_cast<size_t>(h) * kb.g * total + at;
            const float* offsets = kb.score(prep, q, b, h, lo, n, s, total, aligned_scratch);
            scale_scores(shape, s, total, kb.g, n, offsets);
        }
        at += n;
    }
}

}  // namespace kvq::detail
