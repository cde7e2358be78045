#include "decode_attention.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "../codec/half.hpp"
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

struct WorkItem {
    size_t source;
    size_t block_begin, block_end;
};

// s -> c·tanh(s/c) (Gemma 2's logit soft-cap).
void soft_cap(float* s, size_t n, float softcap) {
    const float inv = 1.0f / softcap;
    for (size_t r = 0; r < n; ++r) s[r] = softcap * std::tanh(s[r] * inv);
}

// The online softmax over blocks [b0, b1) of one source, for every query head, into st and acc (in the
// value codec's basis).
void attend_blocks(const AttentionShape& shape, const RowSource& src, const uint8_t* prep, const float* q,
                   size_t b0, size_t b1, SoftmaxState* st, float* acc) {
    const int g = shape.n_heads / shape.n_kv_heads;
    const int d = shape.head_dim;
    const BlockLayout& lay = src.layout;
    const size_t bt = static_cast<size_t>(lay.block_tokens);
    const size_t krb = src.key->row_bytes(), vrb = src.value->row_bytes(), qb = src.key->query_bytes();
    const bool centered = lay.mean_offset != kNoMeans;

    // g × block_tokens scores; the stack holds the usual sizes (g ≤ 8, 64 tokens).
    float stack_scores[1024];
    std::vector<float> heap_scores;
    float* scores = stack_scores;
    if (static_cast<size_t>(g) * bt > std::size(stack_scores)) {
        heap_scores.resize(static_cast<size_t>(g) * bt);
        scores = heap_scores.data();
    }
    std::vector<float> mean(centered ? d : 0), offset_buf(centered ? g : 0);

    const size_t last = src.blocks.size() - 1;
    for (size_t b = b0; b < b1; ++b) {
        const size_t lo = b == 0 ? src.first_row : 0;
        const size_t hi = b == last ? src.end_row : bt;
        if (hi <= lo) continue;
        const size_t n = hi - lo;
        const uint8_t* block = src.blocks[b];
        for (int h = 0; h < shape.n_kv_heads; ++h) {
            const uint8_t* keys = block + lay.k_offset + h * lay.k_head_stride + lo * krb;
            const uint8_t* values = block + lay.v_offset + h * lay.v_head_stride + lo * vrb;
            // The values are read only after the scores and the softmax: ask for them now, so that their
            // first touch overlaps the scoring instead of stalling the accumulate (measured: 6-10% of a
            // q8_0/q4_0 step at 4k and 32k tokens; prefetching the next head's keys as well was slower).
            for (size_t o = 0; o < n * vrb; o += 64) __builtin_prefetch(values + o, 0, 3);
            src.key->score_rows(prep + static_cast<size_t>(h) * g * qb, g, keys, krb, n, scores, n);
            // And the first half of the next head's keys (the hardware prefetcher streams the rest once it
            // sees them) while this head's softmax and accumulate run: measured 3-10% at 4k and 32k tokens
            // (all of them, or at score time, was no better or slower).
            const uint8_t* next_keys = h + 1 < shape.n_kv_heads ? keys + lay.k_head_stride
                                       : b + 1 < b1             ? src.blocks[b + 1] + lay.k_offset
                                                                : nullptr;
            if (next_keys) {
                for (size_t o = 0; o < bt * krb / 2; o += 64) __builtin_prefetch(next_keys + o, 0, 3);
            }
            float* head_acc = acc + static_cast<size_t>(h) * g * d;
            float* offsets = nullptr;
            if (centered) {  // q·mean, added back to the scores of keys stored minus their block mean
                const auto* m16 = reinterpret_cast<const uint16_t*>(block + lay.mean_offset) + h * d;
                for (int j = 0; j < d; ++j) mean[j] = f16_to_f32(m16[j]);
                offsets = offset_buf.data();
                for (int i = 0; i < g; ++i) {
                    const float* qi = q + static_cast<size_t>(h * g + i) * d;
                    float dot = 0.0f;
                    for (int j = 0; j < d; ++j) dot += qi[j] * mean[j];
                    offsets[i] = dot;
                }
            }
            if (shape.softcap > 0) {  // the cap applies after the scale, before the softmax
                for (int i = 0; i < g; ++i) {
                    float* s = scores + i * n;
                    const float off = offsets ? offsets[i] : 0.0f;
                    for (size_t r = 0; r < n; ++r) s[r] = (s[r] + off) * shape.scale;
                    soft_cap(s, n, shape.softcap);
                }
                softmax_update(scores, g, n, nullptr, 1.0f, st + h * g, head_acc, d);
            } else {
                softmax_update(scores, g, n, offsets, shape.scale, st + h * g, head_acc, d);
            }
            src.value->accumulate_rows(scores, n, g, values, vrb, n, head_acc);
        }
    }
}

// Splits each source into block ranges: one per source without threads, more for long sources.
std::vector<WorkItem> plan_work(std::span<const RowSource> sources, int threads) {
    std::vector<WorkItem> items;
    for (size_t s = 0; s < sources.size(); ++s) {
        const size_t nb = sources[s].blocks.size();
        if (nb == 0) continue;
        size_t parts = 1;
        if (threads > 1) {
            parts = std::clamp<size_t>(nb / kMinBlocksPerPart, 1, kMaxParts);
        }
        for (size_t p = 0; p < parts; ++p) items.push_back({s, nb * p / parts, nb * (p + 1) / parts});
    }
    return items;
}

}  // namespace

void decode_attention(const AttentionShape& shape, std::span<const RowSource> sources, const float* q,
                      float* out, ThreadPool* pool, int threads) {
    const size_t heads = static_cast<size_t>(shape.n_heads);
    const size_t d = static_cast<size_t>(shape.head_dim);

    std::vector<std::vector<uint8_t>> preps(sources.size());
    for (size_t s = 0; s < sources.size(); ++s) {
        if (sources[s].blocks.empty()) continue;
        preps[s].resize(heads * sources[s].key->query_bytes());
        sources[s].key->prepare_queries(q, shape.n_heads, preps[s].data());
    }

    if (!pool) threads = 1;
    const std::vector<WorkItem> items = plan_work(sources, threads);
    // Each part's (max, sum) states and accumulators on cache lines of their own: parts run on different
    // threads at once, and both are written at every block. Each part zeroes its own accumulators.
    const size_t state_stride = round_up(heads, kLine / sizeof(SoftmaxState));
    const size_t acc_stride = round_up(heads * d, kLine / sizeof(float));
    std::vector<SoftmaxState> state_buf(items.size() * state_stride + kLine / sizeof(SoftmaxState));
    const std::unique_ptr<float[]> acc_buf(new float[items.size() * acc_stride + kLine / sizeof(float)]);
    SoftmaxState* const states = align_line(state_buf.data());
    float* const accs = align_line(acc_buf.get());
    auto run_item = [&](int i) {
        const WorkItem& it = items[i];
        float* acc = accs + i * acc_stride;
        std::fill(acc, acc + heads * d, 0.0f);
        attend_blocks(shape, sources[it.source], preps[it.source].data(), q, it.block_begin, it.block_end,
                      states + i * state_stride, acc);
    };
    if (pool && threads > 1 && items.size() > 1) {
        pool->run(static_cast<int>(items.size()), run_item);
    } else {
        for (size_t i = 0; i < items.size(); ++i) run_item(static_cast<int>(i));
    }

    // Merge the parts of each source, finish it in its value codec (back to the caller's basis), then
    // merge the sources. The first item of each source collects that source.
    SoftmaxState* total = nullptr;
    float* total_acc = nullptr;
    for (size_t i = 0; i < items.size();) {
        SoftmaxState* st_i = states + i * state_stride;
        float* acc_i = accs + i * acc_stride;
        size_t j = i + 1;
        for (; j < items.size() && items[j].source == items[i].source; ++j) {
            const SoftmaxState* st_j = states + j * state_stride;
            const float* acc_j = accs + j * acc_stride;
            for (size_t h = 0; h < heads; ++h) {
                merge_softmax(st_i[h], acc_i + h * d, st_j[h], acc_j + h * d, shape.head_dim);
            }
        }
        sources[items[i].source].value->finish_accumulate(acc_i, shape.n_heads);
        if (!total) {
            total = st_i;
            total_acc = acc_i;
        } else {
            for (size_t h = 0; h < heads; ++h) {
                merge_softmax(total[h], total_acc + h * d, st_i[h], acc_i + h * d, shape.head_dim);
            }
        }
        i = j;
    }
    for (size_t h = 0; h < heads; ++h) {
        const float inv = 1.0f / total[h].sum;
        for (size_t j = 0; j < d; ++j) out[h * d + j] = total_acc[h * d + j] * inv;
    }
}

}  // namespace kvq::detail
