#include "engine.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "../ref/half.hpp"
#include "online_softmax.hpp"

namespace kvq::detail {
namespace {

// A part below this many tokens costs more in merging and waking a thread than it saves (16 blocks of the
// cache's default 32 tokens).
constexpr size_t kMinTokensPerPart = 512;
// Parts of one source when split. Threads take parts as they come free (the caller too), so many small
// parts keep a thread that starts late or runs slower from idling the other at the end (16 parts left the
// caller idle for a whole part, 11% of a 128k-token step). Each part keeps its own (max, sum, acc) so
// that the merge order, hence the result, never depends on which thread ran which part.
constexpr size_t kMaxParts = 64;
// Queries scored together per kv head and block when a task has several rows (g heads × the tile's rows):
// enough to amortize a block's key reads over many queries, few enough that the scores stay in L1/L2.
constexpr size_t kTileQueries = 32;
// Parts aimed at per thread when a task has several tiles.
constexpr size_t kItemsPerThread = 4;
// A round's accumulators at most (floats), unless one unit alone needs more.
constexpr size_t kRoundAccFloats = size_t{1} << 22;

constexpr size_t kLine = 64;  // bytes of a cache line
// The most bytes one prefetch burst asks into L1 (a quarter of a 32-48 KiB L1): the cache's blocks of 32
// rows stay under it; a caller's tensor in 256-token blocks would otherwise evict what is being read
// (measured: 6-9% slower decode of Gemma 3 270M's 256-value heads through attend_rows before the cap).
constexpr size_t kL1Prefetch = 8192;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

// The first cache-line boundary at or after p (the buffer holds a line's worth of slack).
template <class T>
T* align_line(T* p) {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return reinterpret_cast<T*>((a + kLine - 1) / kLine * kLine);
}

template <class T>
T* grow(std::vector<T>& v, size_t n) {  // n elements on a cache line (v keeps its largest size)
    const size_t need = n + kLine / sizeof(T) + 1;
    if (v.size() < need) v.resize(need);
    return align_line(v.data());
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

// s <- (s + offset_i)·scale, then the soft-cap, for n_q queries' n scores (query i's at s + i·stride): the
// online softmax's own scaling (lib/ref/softmax.hpp), done ahead of it where the cap or a mask comes in
// between.
void scale_scores(const AttentionShape& shape, float* s, size_t stride, size_t n_q, size_t n, const float* offsets) {
    for (size_t i = 0; i < n_q; ++i) {
        float* row = s + i * stride;
        const float off = offsets ? offsets[i] : 0.0f;
        for (size_t r = 0; r < n; ++r) row[r] = (row[r] + off) * shape.scale;
        if (shape.softcap > 0) soft_cap(row, n, shape.softcap);
    }
}

// What row i of a task keeps: its causal range and its mask.
struct Keeps {
    const QueryRows& rows;

    bool masked() const { return rows.mask || rows.causal_end; }
    // Row i's causal range (all tokens without one).
    void range(size_t i, size_t n_tokens, size_t* lo, size_t* hi) const {
        if (!rows.causal_end) {
            *lo = 0;
            *hi = n_tokens;
            return;
        }
        const size_t end = std::min(rows.causal_end + i, n_tokens);
        *hi = end;
        *lo = rows.window && end > rows.window ? end - rows.window : 0;
    }
    // The mask's value of token t for row i (0 without a mask); −inf removes it.
    float mask_value(size_t i, size_t t) const {
        if (!rows.mask) return 0.0f;
        const size_t stride = rows.mask_row_stride;
        if (rows.mask_type == MaskType::f16) {
            uint16_t h;
            std::memcpy(&h, static_cast<const uint8_t*>(rows.mask) + 2 * (i * stride + t), 2);
            return h == 0xFC00 ? kNegInf : f16_to_f32(h);
        }
        float f;
        std::memcpy(&f, static_cast<const uint8_t*>(rows.mask) + 4 * (i * stride + t), 4);
        return f;
    }
    // The tokens rows [r0, r1) keep lie in [*lo, *hi) (empty: *lo == *hi); masks are scanned from both ends.
    void kept(size_t r0, size_t r1, size_t n_tokens, size_t* lo, size_t* hi) const {
        size_t a = n_tokens, b = 0;
        for (size_t i = r0; i < r1; ++i) {
            size_t l, h;
            range(i, n_tokens, &l, &h);
            while (rows.mask && l < h && mask_value(i, l) == kNegInf) ++l;
            while (rows.mask && h > l && mask_value(i, h - 1) == kNegInf) --h;
            if (l < h) {
                a = std::min(a, l);
                b = std::max(b, h);
            }
        }
        *lo = a < b ? a : 0;
        *hi = a < b ? b : 0;
    }
};

// This thread's buffers for the parts it runs, grown once and kept.
struct ItemScratch {
    std::vector<float> scores;    // the tile's queries × block_tokens scores, then the key format's scratch
    std::vector<float> mask;      // a block's mask values, tile row after tile row
    std::vector<uint8_t> any;     // token kept by some tile row
};

// The online softmax over blocks [b0, b1) of kv heads [h0, h1) of one source, for one tile's queries (per
// kv head its g·rows queries, row after row: prep and q at h·g·rows), into st and acc (in the value
// format's basis). token0: the task's token index of the source's first row.
void attend_blocks(const AttentionShape& shape, const AttendTask& task, const WorkUnit& unit, const RowSource& src,
                   const uint8_t* prep, const float* q, size_t token0, size_t b0, size_t b1, int h0, int h1,
                   SoftmaxState* st, float* acc) {
    const size_t g = static_cast<size_t>(shape.n_heads / shape.n_kv_heads), nr = unit.n_rows, gq = g * nr;
    const size_t dk = static_cast<size_t>(shape.head_dim), dv = static_cast<size_t>(shape.dv());
    const KeyFormat& key = *src.key;
    const size_t bt = src.block_tokens(), krb = key.row_bytes(), qb = key.query_bytes();
    const size_t krs = src.key_row_stride();
    const size_t vrb = src.value->row_bytes(), vrs = src.value_row_stride();
    const Keeps keeps{task.rows};
    const bool masked = keeps.masked();

    thread_local ItemScratch sc;
    const size_t score_floats = round_up(gq * bt, kLine / sizeof(float));
    float* scores = grow(sc.scores, score_floats + key.scratch_floats(static_cast<int>(gq)));
    float* block_scratch = scores + score_floats;
    float* mvals = masked ? grow(sc.mask, nr * bt) : nullptr;
    uint8_t* any = masked ? grow(sc.any, bt) : nullptr;

    for (size_t b = b0; b < b1; ++b) {
        const size_t lo = src.rows_begin(b), n = src.rows_in(b);
        if (n == 0) continue;
        const size_t t0 = token0 + src.token_of(b);  // the task's token of row lo
        if (masked) {  // the block's mask values per tile row, and the tokens some row keeps
            if (t0 + n <= unit.token_begin || t0 >= unit.token_end) continue;
            std::fill(any, any + n, uint8_t{0});
            for (size_t j = 0; j < nr; ++j) {
                float* mj = mvals + j * bt;
                size_t cl, ch;
                keeps.range(unit.row_begin + j, SIZE_MAX, &cl, &ch);
                for (size_t r = 0; r < n; ++r) {
                    const size_t t = t0 + r;
                    mj[r] = t >= cl && t < ch ? keeps.mask_value(unit.row_begin + j, t) : kNegInf;
                    any[r] |= mj[r] != kNegInf;
                }
            }
        }
        for (int h = h0; h < h1; ++h) {
            const ConstKeyHead head = src.key_head(b, h);
            const ConstValueHead vhead = src.value_head(b, h, vrb);
            const uint8_t* values = vhead.rows + lo * vrs;
            const uint8_t* prep_h = prep + static_cast<size_t>(h) * gq * qb;
            const float* q_h = q + static_cast<size_t>(h) * gq * dk;
            SoftmaxState* st_h = st + static_cast<size_t>(h) * gq;
            float* acc_h = acc + static_cast<size_t>(h) * gq * dv;
            // The prefetches are spread over a head's work: a burst of them stalls the loads behind it.
            // This head's keys of the next block into L2 now, its values after the softmax: blocks are not
            // adjacent in memory, and the hardware prefetchers lose the stream at each (measured on a Zen 4,
            // 2 threads, interleaved runs: from memory 1.1-1.2× faster for q8_0/q4_0, q8_0/q8_0 and f16 at
            // 32k and 128k tokens; to L1, or only a block's first lines, was slower; two blocks ahead no
            // faster). Spreading them, and the values' L1 prefetch below, was 1.04-1.11× faster again.
            const size_t n1 = b + 1 < b1 ? src.rows_in(b + 1) : 0, lo1 = b + 1 < b1 ? src.rows_begin(b + 1) : 0;
            if (n1) {
                const ConstKeyHead next = src.key_head(b + 1, h);
                prefetch_rows<kToL2>(key.rows_from(next.rows, lo1, krs), n1, krb, krs);
                // and its side data (centered keys' means, chanB's minimums and steps), read by the format's score
                if (next.side) prefetch_rows<kToL2>(next.side, 1, key.side_bytes(), 0);
            }
            if (!masked) {
                const float* offsets = key.score(prep_h, q_h, static_cast<int>(gq), head, lo, n, scores, n, block_scratch);
                // The values are read after the softmax: ask for them now, so that their first touch overlaps it
                // instead of stalling the accumulate (measured: 6-10% of a q8_0/q4_0 step at 4k and 32k tokens;
                // asked before the scoring, with the next block's keys, 1.0-1.1× slower).
                // (To L2 where a block's values would not fit beside its keys in L1: a caller's tensor in
                // 256-token blocks.)
                if (n * vrb <= kL1Prefetch) {
                    prefetch_rows<kToL1>(values, n, vrb, vrs);
                } else {
                    prefetch_rows<kToL2>(values, n, vrb, vrs);
                }
                // And the first half of the next head's keys (the hardware prefetcher streams the rest once it
                // sees them) while this head's softmax and accumulate run: measured 3-10% at 4k and 32k tokens
                // (all of them, or at score time, was no better or slower); not where that passes kL1Prefetch.
                const uint8_t* next_keys = h + 1 < h1 ? key.rows_from(src.key_head(b, h + 1).rows, lo, krs)
                                           : b + 1 < b1 ? key.rows_from(src.key_head(b + 1, h0).rows, lo1, krs)
                                                        : nullptr;
                if (next_keys && krs == krb && bt * krb / 2 <= kL1Prefetch) {
                    for (size_t o = 0; o < bt * krb / 2; o += 64) __builtin_prefetch(next_keys + o, 0, 3);
                }
                if (shape.softcap > 0) {  // the cap applies after the scale, before the softmax
                    scale_scores(shape, scores, n, gq, n, offsets);
                    softmax_update(scores, static_cast<int>(gq), n, nullptr, 1.0f, st_h, acc_h, static_cast<int>(dv));
                } else {
                    softmax_update(scores, static_cast<int>(gq), n, offsets, shape.scale, st_h, acc_h, static_cast<int>(dv));
                }
                if (n1) {
                    const ConstValueHead vnext = src.value_head(b + 1, h, vrb);
                    prefetch_rows<kToL2>(vnext.rows + lo1 * vrs, n1, vrb, vrs);
                    if (vnext.side) prefetch_rows<kToL2>(vnext.side, 1, src.value->side_bytes(), 0);  // read by accumulate
                }
                src.value->accumulate(scores, n, static_cast<int>(gq), vhead, lo, n, acc_h);
                continue;
            }
            // Runs of tokens that some tile row keeps: the others are neither scored nor read.
            for (size_t a = 0; a < n;) {
                if (!any[a]) {
                    ++a;
                    continue;
                }
                size_t e = a + 1;
                while (e < n && any[e]) ++e;
                const size_t m = e - a;
                const float* offsets = key.score(prep_h, q_h, static_cast<int>(gq), head, lo + a, m, scores, m, block_scratch);
                prefetch_rows<kToL1>(values + a * vrs, m, vrb, vrs);  // read after the softmax
                for (size_t j = 0; j < nr; ++j) {
                    float* s = scores + j * g * m;
                    const float* mj = mvals + j * bt + a;
                    if (std::all_of(mj, mj + m, [](float x) { return x == kNegInf; })) {
                        std::fill(s, s + g * m, 0.0f);  // this row keeps none of the run: weight 0
                        continue;
                    }
                    scale_scores(shape, s, m, g, m, offsets ? offsets + j * g : nullptr);
                    for (size_t i = 0; i < g; ++i) {
                        float* row = s + i * m;
                        for (size_t r = 0; r < m; ++r) row[r] = mj[r] == kNegInf ? kNegInf : row[r] + mj[r];
                    }
                    softmax_update(s, static_cast<int>(g), m, nullptr, 1.0f, st_h + j * g, acc_h + j * g * dv,
                                   static_cast<int>(dv));
                    for (size_t r = 0; r < m; ++r) {  // a removed token's weight is exactly 0 (the softmax gave it exp(-87.3))
                        if (mj[r] == kNegInf) {
                            for (size_t i = 0; i < g; ++i) s[i * m + r] = 0.0f;
                        }
                    }
                }
                src.value->accumulate(scores, m, static_cast<int>(gq), vhead, lo + a, m, acc_h);
                a = e;
            }
        }
    }
}

// The tiles of a task: one row at a time for a decode step, enough rows for kTileQueries queries per kv
// head otherwise.
size_t tile_rows(const AttentionShape& shape, const AttendTask& t) {
    const size_t g = static_cast<size_t>(shape.n_heads / shape.n_kv_heads);
    return t.rows.n_rows == 1 ? 1 : std::clamp<size_t>(kTileQueries / g, 1, t.rows.n_rows);
}

// The parts of one unit: per source, the blocks its rows keep in ranges (one without threads, more for
// long sources and few tiles); a source that stays one range is split by kv heads instead when threads
// would otherwise idle.
void plan_unit(const AttentionShape& shape, const AttendTask& task, size_t n_tiles, size_t u, WorkUnit& unit,
               int threads, std::vector<WorkItem>& items) {
    unit.first_item = items.size();
    const size_t want = kItemsPerThread * static_cast<size_t>(threads);
    for (size_t s = 0, token0 = 0; s < task.sources.size(); token0 += task.sources[s].tokens(), ++s) {
        const RowSource& src = task.sources[s];
        const size_t nb = src.blocks.size();
        if (nb == 0) continue;
        size_t bb = 0, be = nb;
        if (unit.token_begin > token0 || unit.token_end < token0 + src.tokens()) {  // the blocks the tile keeps
            const size_t lo = std::max(unit.token_begin, token0) - token0, hi = std::min(unit.token_end, token0 + src.tokens());
            if (hi <= token0 || lo >= hi - token0) continue;
            bb = (lo + src.first_row) / src.block_tokens();
            be = (hi - token0 + src.first_row + src.block_tokens() - 1) / src.block_tokens();
        }
        size_t parts = 1;
        if (threads > 1) {
            const size_t min_blocks = std::max<size_t>(1, kMinTokensPerPart / src.block_tokens());
            parts = std::clamp<size_t>((be - bb) / min_blocks, 1, kMaxParts);
            if (n_tiles > 1) parts = n_tiles >= want ? 1 : std::min(parts, (want + n_tiles - 1) / n_tiles);
        }
        const int head_parts = parts == 1 && threads > 1 && n_tiles < want ? std::min(threads, shape.n_kv_heads) : 1;
        for (size_t p = 0; p < parts; ++p) {
            for (int hp = 0; hp < head_parts; ++hp) {
                items.push_back({u, s, bb + (be - bb) * p / parts, bb + (be - bb) * (p + 1) / parts,
                                 shape.n_kv_heads * hp / head_parts, shape.n_kv_heads * (hp + 1) / head_parts});
            }
        }
    }
    unit.end_item = items.size();
}

// Writes a unit's finished state into its rows' results (zeros for a row that kept no token).
void write_unit(const AttentionShape& shape, const AttendTask& task, const WorkUnit& unit, const SoftmaxState* st,
                const float* acc) {
    const QueryRows& rows = task.rows;
    const size_t g = static_cast<size_t>(shape.n_heads / shape.n_kv_heads), dv = static_cast<size_t>(shape.dv());
    const size_t out_head = rows.out_head_stride ? rows.out_head_stride : dv;
    const size_t out_row = rows.out_row_stride ? rows.out_row_stride : static_cast<size_t>(shape.n_heads) * out_head;
    for (size_t kvh = 0, at = 0; kvh < static_cast<size_t>(shape.n_kv_heads); ++kvh) {
        for (size_t j = 0; j < unit.n_rows; ++j) {
            for (size_t i = 0; i < g; ++i, ++at) {
                const size_t h = kvh * g + i;
                float* dst = rows.out + (unit.row_begin + j) * out_row + h * out_head;
                float sum = st ? st[at].sum : 0.0f, factor = 1.0f;
                if (st && rows.sinks) {  // a token of score sinks[h] and no value: rescales to the new max, adds to the sum
                    const float m = std::max(st[at].max, rows.sinks[h]);
                    factor = st[at].max == kNegInf ? 0.0f : std::exp(st[at].max - m);
                    sum = sum * factor + std::exp(rows.sinks[h] - m);
                }
                const float inv = sum > 0 ? factor / sum : 0.0f;
                if (!st) {  // no part: the row kept no token
                    std::fill(dst, dst + dv, 0.0f);
                    continue;
                }
                const float* src = acc + at * dv;
                for (size_t x = 0; x < dv; ++x) dst[x] = src[x] * inv;
            }
        }
    }
}

// One round: the units' queries gathered and prepared, their parts run, merged and written.
void run_round(const AttentionShape& shape, std::span<const AttendTask> tasks, std::span<WorkUnit> units,
               const ParallelRun* run, int threads, EngineScratch& sc) {
    const size_t heads = static_cast<size_t>(shape.n_heads), g = heads / static_cast<size_t>(shape.n_kv_heads);
    const size_t dk = static_cast<size_t>(shape.head_dim), dv = static_cast<size_t>(shape.dv());
    const std::vector<WorkItem>& items = sc.items;

    // Queries per kv head, row after row (query head kvh·g + i of row j at kvh·g·rows + j·g + i): the task's
    // own where a single packed row already is, else gathered. Then prepared once per unit and source.
    size_t q_floats = 0, prep_bytes = 0, state_floats = 0;
    for (WorkUnit& u : units) {
        const QueryRows& r = tasks[u.task].rows;
        const bool own = u.n_rows == 1 && (r.head_stride == 0 || r.head_stride == dk);
        u.queries = own ? SIZE_MAX : q_floats;
        if (!own) q_floats += round_up(heads * u.n_rows * dk, kLine / sizeof(float));
        u.prep = prep_bytes;
        for (const RowSource& src : tasks[u.task].sources) prep_bytes += round_up(heads * u.n_rows * src.key->query_bytes(), kLine);
        u.state = state_floats;
        state_floats += (u.end_item - u.first_item) * round_up(heads * u.n_rows, kLine / sizeof(float));
    }
    float* const gathered = grow(sc.queries, q_floats);
    uint8_t* const preps = grow(sc.preps, prep_bytes);
    SoftmaxState* const states = grow(sc.states, state_floats);
    float* const accs = grow(sc.accs, state_floats * dv);
    const auto queries_of = [&](const WorkUnit& u) {
        const QueryRows& r = tasks[u.task].rows;
        if (u.queries == SIZE_MAX) return r.q + u.row_begin * (r.row_stride ? r.row_stride : heads * dk);
        return static_cast<const float*>(gathered + u.queries);
    };
    for (WorkUnit& u : units) {
        const AttendTask& t = tasks[u.task];
        if (u.first_item == u.end_item) continue;
        if (u.queries != SIZE_MAX) {
            const size_t hs = t.rows.head_stride ? t.rows.head_stride : dk;
            const size_t rs = t.rows.row_stride ? t.rows.row_stride : heads * hs;
            float* dst = gathered + u.queries;
            for (size_t kvh = 0; kvh < heads / g; ++kvh) {
                for (size_t j = 0; j < u.n_rows; ++j) {
                    for (size_t i = 0; i < g; ++i, dst += dk) {
                        const float* src = t.rows.q + (u.row_begin + j) * rs + (kvh * g + i) * hs;
                        std::copy(src, src + dk, dst);
                    }
                }
            }
        }
        size_t at = u.prep;
        for (const RowSource& src : t.sources) {
            src.key->prepare_queries(queries_of(u), static_cast<int>(heads * u.n_rows), preps + at);
            at += round_up(heads * u.n_rows * src.key->query_bytes(), kLine);
        }
    }

    // Each part's (max, sum) states and accumulators on cache lines of their own: parts run on different
    // threads at once, and both are written at every block. Each part resets its own.
    const auto state_at = [&](const WorkUnit& u, size_t item) {
        return u.state + (item - u.first_item) * round_up(heads * u.n_rows, kLine / sizeof(float));
    };
    auto run_item = [&](int i) {
        const WorkItem& it = items[i];
        const WorkUnit& u = units[it.unit];
        const AttendTask& task = tasks[u.task];
        const size_t nq = heads * u.n_rows, at = state_at(u, static_cast<size_t>(i));
        SoftmaxState* st = states + at;
        float* acc = accs + at * dv;
        std::fill(acc, acc + nq * dv, 0.0f);
        std::fill(st, st + nq, SoftmaxState{});
        size_t prep = u.prep, token0 = 0;
        for (size_t s = 0; s < it.source; ++s) {
            prep += round_up(nq * task.sources[s].key->query_bytes(), kLine);
            token0 += task.sources[s].tokens();
        }
        attend_blocks(shape, task, u, task.sources[it.source], preps + prep, queries_of(u), token0, it.block_begin,
                      it.block_end, it.head_begin, it.head_end, st, acc);
    };
    if (run && threads > 1 && items.size() > 1) {
        // By reference: a std::function made from the lambda itself would allocate (its captures are
        // larger than the small-object buffer); one from a reference_wrapper never does.
        (*run)(static_cast<int>(items.size()), std::ref(run_item));
    } else {
        for (size_t i = 0; i < items.size(); ++i) run_item(static_cast<int>(i));
    }

    // Per unit: merge the parts of each source (in plan order), finish it in its value format (back to
    // the caller's basis), then merge the sources. The first item of each source collects that source.
    for (const WorkUnit& u : units) {
        const AttendTask& task = tasks[u.task];
        const size_t nq = heads * u.n_rows;
        SoftmaxState* total = nullptr;
        float* total_acc = nullptr;
        for (size_t i = u.first_item; i < u.end_item;) {
            SoftmaxState* st_i = states + state_at(u, i);
            float* acc_i = accs + state_at(u, i) * dv;
            size_t j = i + 1;
            for (; j < u.end_item && items[j].source == items[i].source; ++j) {
                const SoftmaxState* st_j = states + state_at(u, j);
                const float* acc_j = accs + state_at(u, j) * dv;
                const size_t q0 = static_cast<size_t>(items[j].head_begin) * g * u.n_rows;
                const size_t q1 = static_cast<size_t>(items[j].head_end) * g * u.n_rows;
                for (size_t x = q0; x < q1; ++x) merge_softmax(st_i[x], acc_i + x * dv, st_j[x], acc_j + x * dv, static_cast<int>(dv));
            }
            task.sources[items[i].source].value->finish(acc_i, static_cast<int>(nq));
            if (!total) {
                total = st_i;
                total_acc = acc_i;
            } else {
                for (size_t x = 0; x < nq; ++x) merge_softmax(total[x], total_acc + x * dv, st_i[x], acc_i + x * dv, static_cast<int>(dv));
            }
            i = j;
        }
        write_unit(shape, task, u, total, total_acc);
    }
}

// Buffers of calls that bring no pool of their own (rows an engine owns); never destroyed, so that a
// call still running on another thread at exit never finds it gone.
ScratchPool<EngineScratch>& process_scratch() {
    static auto* pool = new ScratchPool<EngineScratch>;
    return *pool;
}

}  // namespace

void attend(const AttentionShape& shape, std::span<const AttendTask> tasks, const ParallelRun* run, int threads,
            ScratchPool<EngineScratch>* scratch) {
    // This call's own buffers: a nested call on this thread (an executor running other work between this
    // call's parts) leases others.
    const auto lease = (scratch ? *scratch : process_scratch()).lease();
    EngineScratch& sc = *lease;
    if (!run) threads = 1;
    const size_t heads = static_cast<size_t>(shape.n_heads), dv = static_cast<size_t>(shape.dv());
    // Rounds of whole tiles, at most kMaxItemsPerRound parts and kRoundAccFloats accumulators each: the
    // buffers stay bounded by the shape and threads however many tasks and rows a call has.
    size_t task = 0, row = 0;
    while (task < tasks.size()) {
        sc.units.clear();
        sc.items.clear();
        size_t acc_floats = 0;
        while (task < tasks.size()) {
            const AttendTask& t = tasks[task];
            const size_t tr = tile_rows(shape, t), n_tiles = (t.rows.n_rows + tr - 1) / tr;
            WorkUnit u{task, row, std::min(tr, t.rows.n_rows - row), 0, 0};
            size_t n_tokens = 0;
            for (const RowSource& s : t.sources) n_tokens += s.tokens();
            if (Keeps{t.rows}.masked()) {
                Keeps{t.rows}.kept(u.row_begin, u.row_begin + u.n_rows, n_tokens, &u.token_begin, &u.token_end);
            } else {
                u.token_end = n_tokens;
            }
            const size_t before = sc.items.size();
            plan_unit(shape, t, n_tiles, sc.units.size(), u, threads, sc.items);
            const size_t floats = (u.end_item - u.first_item) * heads * u.n_rows * dv;
            if (!sc.units.empty() && (sc.items.size() > kMaxItemsPerRound || acc_floats + floats > kRoundAccFloats)) {
                sc.items.resize(before);
                break;
            }
            acc_floats += floats;
            sc.units.push_back(u);
            row += u.n_rows;
            if (row >= t.rows.n_rows) {
                row = 0;
                ++task;
            }
        }
        run_round(shape, tasks, sc.units, run, threads, sc);
    }
}

void decode_attention(const AttentionShape& shape, std::span<const RowSource> sources, const float* q, float* out,
                      const ParallelRun* run, int threads, ScratchPool<EngineScratch>* scratch) {
    AttendTask task{sources, {}};
    task.rows.q = q;
    task.rows.out = out;
    attend(shape, std::span<const AttendTask>(&task, 1), run, threads, scratch);
}

void attention_scores(const AttentionShape& shape, const RowSource& src, const float* q, float* scores) {
    const size_t g = static_cast<size_t>(shape.n_heads / shape.n_kv_heads), dk = static_cast<size_t>(shape.head_dim);
    const KeyFormat& key = *src.key;
    thread_local std::vector<uint8_t> prep_buf;
    uint8_t* const prep = grow(prep_buf, static_cast<size_t>(shape.n_heads) * key.query_bytes());  // on a cache line, as attend's
    key.prepare_queries(q, shape.n_heads, prep);
    const size_t total = src.tokens();
    std::vector<float> block_scratch(key.scratch_floats(static_cast<int>(g)) + kLine / sizeof(float));
    float* const aligned_scratch = align_line(block_scratch.data());
    for (size_t b = 0, at = 0; b < src.blocks.size(); ++b) {
        const size_t lo = src.rows_begin(b), n = src.rows_in(b);
        if (n == 0) continue;
        for (int h = 0; h < shape.n_kv_heads; ++h) {
            float* s = scores + static_cast<size_t>(h) * g * total + at;
            const float* offsets = key.score(prep + h * g * key.query_bytes(), q + h * g * dk, static_cast<int>(g),
                                             src.key_head(b, h), lo, n, s, total, aligned_scratch);
            scale_scores(shape, s, total, g, n, offsets);
        }
        at += n;
    }
}

}  // namespace kvq::detail
