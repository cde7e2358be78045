// kvq::attend_rows (include/kvq/attention.hpp): attention over caller-owned rows (a ggml KV tensor's),
// for one or several query rows, with an additive mask and threads.
//
// The work is cut into items: a tile of query rows (all heads) × a part of the token range. An item
// gathers its queries per kv head (the g heads of each query row that share it, row after row), prepares
// them once in the key codec, then walks its tokens in virtual blocks of kChunkTokens: per kv head and
// block, one score call for the tile's g·rows queries, the scale (and soft-cap) and the mask, the online
// softmax of each query row, and one accumulate call for all of them. Masks are read per block: tokens
// that every query row of the tile removes are neither scored nor read, so a causal or sliding-window
// mask costs only what it keeps. Parts of a tile keep their own (max, sum, accumulator) and are merged
// in part order after the parallel run (flash-decoding), so the result does not depend on the threads.
//
// With one query row, no mask and one thread, the calls are those of the decode engine
// (decode_attention.cpp) on the same blocks, in the same order: the same bits as KVCache::attend.
#include "kvq/attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "../ref/half.hpp"
#include "attend_rows_checks.hpp"
#include "decode_attention.hpp"
#include "online_softmax.hpp"
#include "scratch_pool.hpp"
#include "thread_pool.hpp"

namespace kvq {
namespace {

using detail::SoftmaxState;

constexpr size_t kChunkTokens = 256;
constexpr size_t kLine = 64;
// Queries scored together per kv head and block (g heads × the tile's query rows): enough to amortize a
// block's key reads over many queries, few enough that the tile's scores stay in L1/L2.
constexpr size_t kTileQueries = 32;
// Parts of one tile's token range at most, and items aimed at per thread (threads take items as they
// come free, so several per thread keep one that starts late from idling the others at the end).
constexpr size_t kMaxParts = 64;
constexpr size_t kItemsPerThread = 4;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr uint16_t kF16NegInf = 0xFC00;

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("attend_rows: " + what); }

size_t round_up(size_t n, size_t m) { return (n + m - 1) / m * m; }

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

// The mask rows, as the engine reads them.
struct Mask {
    const uint8_t* base = nullptr;
    MaskType type = MaskType::f16;
    size_t row_bytes = 0;  // the row stride in bytes

    explicit operator bool() const { return base != nullptr; }
    bool removed(size_t row, size_t t) const {
        const uint8_t* p = base + row * row_bytes;
        if (type == MaskType::f16) {
            uint16_t h;
            std::memcpy(&h, p + 2 * t, 2);
            return h == kF16NegInf;
        }
        float f;
        std::memcpy(&f, p + 4 * t, 4);
        return f == kNegInf;
    }
    float value(size_t row, size_t t) const {
        const uint8_t* p = base + row * row_bytes;
        if (type == MaskType::f16) {
            uint16_t h;
            std::memcpy(&h, p + 2 * t, 2);
            return detail::f16_to_f32(h);
        }
        float f;
        std::memcpy(&f, p + 4 * t, 4);
        return f;
    }
    // The tokens of [a, b) that row keeps lie in [*lo, *hi) (empty: *lo == *hi); scans from both ends.
    void kept(size_t row, size_t a, size_t b, size_t* lo, size_t* hi) const {
        size_t l = a;
        while (l < b && removed(row, l)) ++l;
        size_t h = b;
        while (h > l && removed(row, h - 1)) --h;
        *lo = l;
        *hi = h;
    }
};

// Everything a call resolved: shapes, strides in bytes or elements, the plan.
struct Call {
    const detail::CodecImpl* key = nullptr;
    const detail::CodecImpl* value = nullptr;
    int n_heads = 0, n_kv_heads = 0, g = 0, d = 0;
    size_t qb = 0;  // bytes of a prepared query
    const uint8_t* k = nullptr;
    const uint8_t* v = nullptr;
    size_t k_token = 0, k_head = 0, v_token = 0, v_head = 0, k_row_bytes = 0, v_row_bytes = 0;
    size_t n_tokens = 0;
    const float* q = nullptr;
    size_t q_row = 0, q_head = 0;
    float* out = nullptr;
    size_t out_row = 0, out_head = 0;
    Mask mask;
    const float* sinks = nullptr;
    float scale = 0, softcap = 0;
    size_t n_queries = 0, tile_rows = 0, n_tiles = 0, parts = 1;
};

// This thread's buffers for the items it runs, grown once and kept.
struct ItemScratch {
    std::vector<float> queries;
    std::vector<uint8_t> prep;
    std::vector<float> scores;
    std::vector<float> mask;  // a block's mask values, tile row after tile row
    std::vector<uint8_t> any;
    std::vector<SoftmaxState> states;
    std::vector<float> accs;
};

// The calling thread's buffers: the plan's per-item states and accumulators when tiles are split.
struct CallScratch {
    std::vector<SoftmaxState> states;
    std::vector<float> accs;
};

// Rows ahead of use, to L2 (locality 2): one span where packed, row by row where other heads sit between.
void prefetch_rows(const uint8_t* p, size_t n, size_t row_bytes, size_t stride) {
    const bool packed = stride == row_bytes;
    const size_t span = packed ? n * row_bytes : row_bytes;
    for (size_t r = 0; r < (packed ? 1 : n); ++r) {
        for (size_t o = 0; o < span; o += kLine) __builtin_prefetch(p + r * stride + o, 0, 2);
    }
}

// The token range that the rows of tile `tile` keep (all tokens without a mask), and part `part` of it.
void part_range(const Call& c, size_t tile, size_t part, size_t* a, size_t* b) {
    size_t lo = 0, hi = c.n_tokens;
    if (c.mask) {
        const size_t r0 = tile * c.tile_rows, r1 = std::min(r0 + c.tile_rows, c.n_queries);
        lo = c.n_tokens;
        hi = 0;
        for (size_t r = r0; r < r1; ++r) {
            size_t l, h;
            c.mask.kept(r, 0, c.n_tokens, &l, &h);
            if (l < h) {
                lo = std::min(lo, l);
                hi = std::max(hi, h);
            }
        }
        if (lo >= hi) lo = hi = 0;
    }
    *a = lo + (hi - lo) * part / c.parts;
    *b = lo + (hi - lo) * (part + 1) / c.parts;
}

// One item: the queries of tile `tile` over part `part` of its tokens, into st (n_heads · rows states,
// per kv head its g·rows queries, row after row) and acc (d floats each, in the value codec's basis).
void run_item(const Call& c, size_t tile, size_t part, SoftmaxState* st, float* acc, ItemScratch& sc) {
    const size_t r0 = tile * c.tile_rows, nr = std::min(c.tile_rows, c.n_queries - r0);
    const size_t g = static_cast<size_t>(c.g), d = static_cast<size_t>(c.d);
    const size_t gq = g * nr;  // queries per kv head
    const size_t nq = gq * static_cast<size_t>(c.n_kv_heads);
    std::fill(st, st + nq, SoftmaxState{});
    std::fill(acc, acc + nq * d, 0.0f);
    size_t a, b;
    part_range(c, tile, part, &a, &b);
    if (a >= b) return;

    // The queries, kv head by kv head, row by row, head by head (query head kvh·g + i).
    float* qs = grow(sc.queries, nq * d);
    for (size_t kvh = 0, at = 0; kvh < static_cast<size_t>(c.n_kv_heads); ++kvh) {
        for (size_t j = 0; j < nr; ++j) {
            for (size_t i = 0; i < g; ++i, at += d) {
                const float* src = c.q + (r0 + j) * c.q_row + (kvh * g + i) * c.q_head;
                std::copy(src, src + d, qs + at);
            }
        }
    }
    const size_t prep_head = gq * c.qb;
    uint8_t* prep = grow(sc.prep, round_up(nq * c.qb, kLine));
    c.key->prepare_queries(qs, static_cast<int>(nq), prep);

    const size_t bt = kChunkTokens;
    float* scores = grow(sc.scores, gq * bt);
    float* mvals = c.mask ? grow(sc.mask, nr * bt) : nullptr;  // the block's mask, tile row after tile row
    uint8_t* any = c.mask ? grow(sc.any, bt) : nullptr;         // token kept by some tile row
    const bool plain = !c.mask && c.softcap == 0;
    const float inv_cap = c.softcap > 0 ? 1.0f / c.softcap : 0.0f;

    for (size_t kvh = 0; kvh < static_cast<size_t>(c.n_kv_heads); ++kvh) {
        const uint8_t* prep_h = prep + kvh * prep_head;
        SoftmaxState* st_h = st + kvh * gq;
        float* acc_h = acc + kvh * gq * d;
        for (size_t t0 = a; t0 < b; t0 += bt) {
            const size_t n = std::min(bt, b - t0);
            if (c.mask) {
                std::fill(any, any + n, uint8_t{0});
                for (size_t j = 0; j < nr; ++j) {
                    float* mj = mvals + j * bt;
                    for (size_t r = 0; r < n; ++r) {
                        mj[r] = c.mask.removed(r0 + j, t0 + r) ? kNegInf : c.mask.value(r0 + j, t0 + r);
                        any[r] |= mj[r] != kNegInf;
                    }
                }
            }
            // The next block's keys into L2 while this one is scored (blocks of a strided tensor are not
            // one stream for the hardware prefetcher).
            if (t0 + bt < b) {
                prefetch_rows(c.k + (t0 + bt) * c.k_token + kvh * c.k_head, std::min(bt, b - t0 - bt), c.k_row_bytes, c.k_token);
            }
            // Runs of tokens that some tile row keeps (the whole block without a mask): the others are
            // neither scored nor read.
            for (size_t lo = 0; lo < n;) {
                if (c.mask && !any[lo]) {
                    ++lo;
                    continue;
                }
                size_t hi = lo + 1;
                if (c.mask) {
                    while (hi < n && any[hi]) ++hi;
                } else {
                    hi = n;
                }
                const size_t m = hi - lo;
                const uint8_t* keys = c.k + (t0 + lo) * c.k_token + kvh * c.k_head;
                const uint8_t* values = c.v + (t0 + lo) * c.v_token + kvh * c.v_head;
                c.key->score_rows(prep_h, static_cast<int>(gq), keys, c.k_token, m, scores, m);
                prefetch_rows(values, m, c.v_row_bytes, c.v_token);  // read after the softmax
                if (plain) {
                    detail::softmax_update(scores, static_cast<int>(gq), m, nullptr, c.scale, st_h, acc_h, c.d);
                } else {
                    for (size_t j = 0; j < nr; ++j) {
                        float* s = scores + j * g * m;
                        const float* mj = c.mask ? mvals + j * bt + lo : nullptr;
                        if (mj && std::all_of(mj, mj + m, [](float x) { return x == kNegInf; })) {
                            std::fill(s, s + g * m, 0.0f);  // this row keeps none of the run: weight 0
                            continue;
                        }
                        for (size_t i = 0; i < g; ++i) {
                            float* row = s + i * m;
                            for (size_t r = 0; r < m; ++r) row[r] = (row[r] + 0.0f) * c.scale;
                            if (c.softcap > 0) {
                                for (size_t r = 0; r < m; ++r) row[r] = c.softcap * std::tanh(row[r] * inv_cap);
                            }
                            if (mj) {
                                for (size_t r = 0; r < m; ++r) row[r] = mj[r] == kNegInf ? kNegInf : row[r] + mj[r];
                            }
                        }
                        detail::softmax_update(s, static_cast<int>(g), m, nullptr, 1.0f, st_h + j * g, acc_h + j * g * d, c.d);
                        if (mj) {  // a removed token's weight is exactly 0 (the softmax gave it exp(-87.3))
                            for (size_t r = 0; r < m; ++r) {
                                if (mj[r] == kNegInf) {
                                    for (size_t i = 0; i < g; ++i) s[i * m + r] = 0.0f;
                                }
                            }
                        }
                    }
                }
                c.value->accumulate_rows(scores, m, static_cast<int>(gq), values, c.v_token, m, acc_h);
                lo = hi;
            }
        }
    }
}

// The finished states of tile `tile` into out (zeros for a query row that kept no token).
void write_tile(const Call& c, size_t tile, const SoftmaxState* st, float* acc) {
    const size_t r0 = tile * c.tile_rows, nr = std::min(c.tile_rows, c.n_queries - r0);
    const size_t g = static_cast<size_t>(c.g), d = static_cast<size_t>(c.d);
    const size_t nq = g * nr * static_cast<size_t>(c.n_kv_heads);
    c.value->finish_accumulate(acc, static_cast<int>(nq));
    for (size_t kvh = 0, at = 0; kvh < static_cast<size_t>(c.n_kv_heads); ++kvh) {
        for (size_t j = 0; j < nr; ++j) {
            for (size_t i = 0; i < g; ++i, ++at) {
                const size_t h = kvh * g + i;
                float* dst = c.out + (r0 + j) * c.out_row + h * c.out_head;
                float sum = st[at].sum, factor = 1.0f;
                if (c.sinks) {  // a token of score sinks[h] and no value: rescales to the new max, adds to the sum
                    const float m = std::max(st[at].max, c.sinks[h]);
                    factor = st[at].max == kNegInf ? 0.0f : std::exp(st[at].max - m);
                    sum = sum * factor + std::exp(c.sinks[h] - m);
                }
                const float inv = sum > 0 ? factor / sum : 0.0f;
                const float* src = acc + at * d;
                for (size_t x = 0; x < d; ++x) dst[x] = src[x] * inv;
            }
        }
    }
}

}  // namespace

void attend_rows(const Codec& keys, const Codec& values, int n_heads, int n_kv_heads, const float* q, RowsView k,
                 RowsView v, size_t n_tokens, float* out, float scale, float softcap) {
    AttendOptions options;
    options.scale = scale;
    options.softcap = softcap;
    attend_rows(keys, values, n_heads, n_kv_heads, q, k, v, n_tokens, out, options);
}

void attend_rows(const Codec& keys, const Codec& values, int n_heads, int n_kv_heads, const float* q, RowsView k,
                 RowsView v, size_t n_tokens, float* out, const AttendOptions& o) {
    const int d = keys.head_dim();
    if (keys.info().per_channel || values.info().per_channel) {
        bad("'" + (keys.info().per_channel ? keys : values).name() +
            "' is a per-channel key codec: its rows need their block's minimums and steps, which only a KVCache holds");
    }
    if (values.head_dim() != d) {
        bad("the key codec has head_dim " + std::to_string(d) + ", the value codec " + std::to_string(values.head_dim()));
    }
    if (n_kv_heads <= 0 || n_heads <= 0 || n_heads % n_kv_heads != 0) {
        bad("n_heads (" + std::to_string(n_heads) + ") must be a positive multiple of n_kv_heads (" +
            std::to_string(n_kv_heads) + ")");
    }
    if (!std::isfinite(o.scale) || o.scale < 0 || !std::isfinite(o.softcap) || o.softcap < 0) {
        bad("scale and softcap must be finite and >= 0");
    }
    if (o.threads < 1 || o.threads > 256) bad("threads must be 1..256, got " + std::to_string(o.threads));
    if (o.mask_type != MaskType::f16 && o.mask_type != MaskType::f32) bad("unknown mask type");
    const size_t nq = o.n_queries;
    if (nq == 0) return;
    if (!q || !out || (n_tokens > 0 && (!k.data || !v.data))) bad("null pointer");
    const size_t heads = static_cast<size_t>(n_heads), dd = static_cast<size_t>(d);
    // Every buffer's extent (k, v, q, out, mask, sinks) checked, then the query, mask and sinks' values
    // (attend_rows_checks.hpp); the strides with their defaults filled in.
    const detail::RowStrides strides = detail::check_attend_rows(keys, values, n_heads, n_kv_heads, q, k, v, n_tokens, out, o);
    const size_t q_head = strides.q_head, q_row = strides.q_row, out_head = strides.out_head, out_row = strides.out_row;
    if (n_tokens == 0) {
        for (size_t r = 0; r < nq; ++r) {
            for (size_t h = 0; h < heads; ++h) std::fill_n(out + r * out_row + h * out_head, dd, 0.0f);
        }
        return;
    }

    Call c;
    c.key = &detail::impl_of(keys);
    c.value = &detail::impl_of(values);
    c.n_heads = n_heads;
    c.n_kv_heads = n_kv_heads;
    c.g = n_heads / n_kv_heads;
    c.d = d;
    c.qb = c.key->query_bytes();
    c.k = static_cast<const uint8_t*>(k.data);
    c.v = static_cast<const uint8_t*>(v.data);
    c.k_token = k.token_stride;
    c.k_head = k.head_stride;
    c.v_token = v.token_stride;
    c.v_head = v.head_stride;
    c.k_row_bytes = keys.row_bytes();
    c.v_row_bytes = values.row_bytes();
    c.n_tokens = n_tokens;
    c.q = q;
    c.q_row = q_row;
    c.q_head = q_head;
    c.out = out;
    c.out_row = out_row;
    c.out_head = out_head;
    if (o.mask) {
        const size_t esize = o.mask_type == MaskType::f16 ? 2 : 4;
        c.mask = Mask{static_cast<const uint8_t*>(o.mask), o.mask_type, esize * (o.mask_row_stride ? o.mask_row_stride : n_tokens)};
    }
    c.sinks = o.sinks;
    c.scale = o.scale > 0 ? o.scale : 1.0f / std::sqrt(static_cast<float>(d));
    c.softcap = o.softcap;
    c.n_queries = nq;
    c.tile_rows = nq == 1 ? 1 : std::clamp<size_t>(kTileQueries / static_cast<size_t>(c.g), 1, nq);
    c.n_tiles = (nq + c.tile_rows - 1) / c.tile_rows;
    const int threads = o.threads;
    if (threads > 1) {
        // Enough items for the threads: tiles first, then parts of each tile's tokens (a block at least).
        const size_t want = kItemsPerThread * static_cast<size_t>(threads);
        const size_t blocks = (n_tokens + kChunkTokens - 1) / kChunkTokens;
        c.parts = std::clamp<size_t>((want + c.n_tiles - 1) / c.n_tiles, 1, std::min(kMaxParts, blocks));
        if (c.n_tiles >= want) c.parts = 1;
    }
    const size_t n_items = c.n_tiles * c.parts;
    const size_t tile_queries = heads * c.tile_rows;

    // Split tiles keep every part's state in the caller's buffers until the merge; whole tiles use the
    // running thread's and write their result at once.
    // Leased per call, not thread_local: an engine's executor may run another attend_rows on this thread
    // while this call waits for its parts (issue #36); tasks do not nest, so each task's ItemScratch may
    // be its thread's.
    static auto* const call_scratch = new detail::ScratchPool<CallScratch>;  // never freed: calls may outlive statics
    const auto lease = call_scratch->lease();
    CallScratch& cs = *lease;
    SoftmaxState* part_states = nullptr;
    float* part_accs = nullptr;
    const size_t acc_stride = round_up(tile_queries * dd, kLine / sizeof(float));
    const size_t state_stride = round_up(tile_queries, kLine / sizeof(SoftmaxState));
    if (c.parts > 1) {
        part_states = grow(cs.states, n_items * state_stride);
        part_accs = grow(cs.accs, n_items * acc_stride);
    }
    auto run = [&](int i) {
        thread_local ItemScratch item_scratch;
        ItemScratch& sc = item_scratch;
        const size_t tile = static_cast<size_t>(i) / c.parts, part = static_cast<size_t>(i) % c.parts;
        if (c.parts > 1) {
            run_item(c, tile, part, part_states + i * state_stride, part_accs + i * acc_stride, sc);
        } else {
            SoftmaxState* st = grow(sc.states, tile_queries);
            float* acc = grow(sc.accs, tile_queries * dd);
            run_item(c, tile, 0, st, acc, sc);
            write_tile(c, tile, st, acc);
        }
    };
    if (threads > 1 && n_items > 1) {
        // By reference: a std::function of the lambda itself would allocate; of a reference_wrapper never.
        if (o.executor) {
            detail::run_checked(o.executor, static_cast<int>(n_items), std::ref(run));  // ExecutorError on a broken contract
        } else {
            detail::shared_pool().run(static_cast<int>(n_items), run, threads);
        }
    } else {
        for (size_t i = 0; i < n_items; ++i) run(static_cast<int>(i));
    }
    if (c.parts > 1) {  // merge each tile's parts in order, then finish it
        for (size_t tile = 0; tile < c.n_tiles; ++tile) {
            const size_t first = tile * c.parts;
            SoftmaxState* st = part_states + first * state_stride;
            float* acc = part_accs + first * acc_stride;
            for (size_t p = 1; p < c.parts; ++p) {
                const SoftmaxState* st_p = part_states + (first + p) * state_stride;
                const float* acc_p = part_accs + (first + p) * acc_stride;
                for (size_t x = 0; x < tile_queries; ++x) detail::merge_softmax(st[x], acc + x * dd, st_p[x], acc_p + x * dd, d);
            }
            write_tile(c, tile, st, acc);
        }
    }
    // Results that finite inputs overflowed (a scale or query of 1e38: Inf − Inf in the softmax) again in
    // double, as KVCache::attend does (attend_rows_checks.hpp); the other results keep their bits.
    detail::finish_rows_exactly(keys, values, n_heads, n_kv_heads, q, k, v, n_tokens, out, o, strides,
                                o.scale > 0 ? o.scale : 1.0f / std::sqrt(static_cast<float>(d)));
}

}  // namespace kvq
