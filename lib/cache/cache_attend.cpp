// Attention over a sequence's layer: the pool blocks and the float staging become the row sources of
// the fused decode kernel (lib/attention/).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../util/checked_size.hpp"
#include "cache_impl.hpp"

namespace kvq {
namespace {

// reject: throws on a non-finite query value. propagate: returns a copy with them zeroed and marks
// the query heads that held one (their output becomes NaN).
const float* check_query(const char* what, const float* q, size_t n_head_vectors, int d, NanPolicy policy,
                         std::vector<float>& clean, std::vector<char>& nan_head) {
    if (all_finite(q, n_head_vectors * d)) return q;
    for (size_t h = 0; h < n_head_vectors; ++h) {
        bool finite = true;
        for (int j = 0; j < d; ++j) finite &= std::isfinite(q[h * d + j]);
        if (finite) continue;
        if (policy == NanPolicy::reject) {
            throw NonFiniteInput(std::string("KVCache::") + what + ": query vector " + std::to_string(h) +
                                         " holds NaN or Inf (NanPolicy::reject)");
        }
        if (clean.empty()) {
            clean.assign(q, q + n_head_vectors * d);
            nan_head.assign(n_head_vectors, 0);
        }
        for (int j = 0; j < d; ++j) {
            if (!std::isfinite(clean[h * d + j])) clean[h * d + j] = 0.0f;
        }
        nan_head[h] = 1;
    }
    return clean.empty() ? q : clean.data();
}

void fill_nan(float* out, size_t n) {
    for (size_t i = 0; i < n; ++i) out[i] = std::numeric_limits<float>::quiet_NaN();
}

}  // namespace

// Finite queries, keys and values whose scores overflow float (a query of 1e38, say) give Inf − Inf in the
// softmax: those kv heads again, in double precision (only heads whose output is not finite, and not the
// ones a non-finite row makes NaN anyway, so the fast path's bits are untouched otherwise). Then rows that
// held NaN/Inf in a codec that could not store them make their kv head's output NaN.
void detail::CacheImpl::finish_output(const LayerKind& kind, const detail::LayerState& st, size_t lo, size_t hi, const float* q, float* out) const {
    const size_t group = static_cast<size_t>(g()) * dv();
    for (int h = 0; h < cfg.n_kv_heads; ++h) {
        if (all_finite(out + h * group, group)) continue;
        const bool poisoned = std::any_of(st.poisoned.begin(), st.poisoned.end(),
                                          [&](const auto& p) { return p.second == h && p.first >= lo && p.first < hi; });
        if (!poisoned) attend_head_exact(kind, st, std::max(lo, st.first_pos), hi, q, out, h);
    }
    for (const auto& [pos, h] : st.poisoned) {
        if (pos >= lo && pos < hi) fill_nan(out + static_cast<size_t>(h) * g() * dv(), g() * dv());
    }
}

size_t detail::CacheImpl::row_sources(const LayerKind& kind, const detail::LayerState& st, size_t lo, size_t hi, detail::RowSource* sources,
                                  uint8_t** staging_slots) const {
    size_t n_sources = 0;
    const size_t bt = this->bt();
    const size_t pool_end = st.pool_end();
    if (const size_t a = std::max(lo, st.first_pos), b = std::min(hi, pool_end); a < b) {
        const size_t b0 = (a - st.first_pos) / bt, b1 = (b - st.first_pos + bt - 1) / bt;
        auto& s = sources[n_sources++];
        s.key = kind.keys.get();
        s.value = kind.values.get();
        s.layout = kind.layout;
        s.blocks = std::span<uint8_t* const>(st.data).subspan(b0, b1 - b0);
        s.first_row = (a - st.first_pos) % bt;
        s.end_row = b - st.first_pos - (b1 - 1) * bt;
    }
    if (const size_t a = std::max(lo, pool_end); a < hi) {
        // The ring's slots in position order from pool_end (a block boundary). The staging is read-only
        // here; RowSource holds mutable pointers only because block tables do.
        const size_t s0 = (a - pool_end) / bt, s1 = (hi - pool_end + bt - 1) / bt;
        for (size_t i = s0; i < s1; ++i) staging_slots[i] = const_cast<uint8_t*>(staging_slot(st, pool_end + i * bt));
        auto& s = sources[n_sources++];
        s.key = exact_keys.get();
        s.value = exact_values.get();
        s.layout = staging_layout;
        s.blocks = std::span<uint8_t* const>(staging_slots + s0, s1 - s0);
        s.first_row = (a - pool_end) % bt;
        s.end_row = hi - pool_end - (s1 - 1) * bt;
    }
    return n_sources;
}

void detail::CacheImpl::attend_range(const LayerKind& kind, const detail::LayerState& st, size_t lo, size_t hi, const float* q, float* out,
                                 int threads) const {
    detail::RowSource sources[2];
    // The staging's slot table: on the stack for the usual tails, else a buffer of this call.
    uint8_t* slots_here[8];
    std::vector<uint8_t*> slots_heap(staging_blocks > 8 ? staging_blocks : 0);
    const size_t n_sources = row_sources(kind, st, lo, hi, sources, staging_blocks > 8 ? slots_heap.data() : slots_here);
    const detail::AttentionShape shape{cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.scale, cfg.softcap, dv()};
    detail::decode_attention(shape, std::span<const detail::RowSource>(sources, n_sources), q, out, run(), threads,
                             &decode_scratch);
    finish_output(kind, st, lo, hi, q, out);
}

void detail::CacheImpl::attend_head_exact(const LayerKind& kind, const detail::LayerState& st, size_t lo, size_t hi, const float* q, float* out,
                                      int h) const {
    const size_t d = static_cast<size_t>(cfg.head_dim), dv = static_cast<size_t>(this->dv()), g = static_cast<size_t>(this->g());
    const size_t bt = this->bt(), pool_end = st.pool_end(), n = hi > lo ? hi - lo : 0;
    std::vector<float> row(std::max(d, dv));
    // The key (or value) row of position p as attention reads it, in the caller's basis.
    const auto read_row = [&](size_t p, bool keys) -> const float* {
        if (p >= pool_end) {
            staged_rows(st, keys, h, p, 1, row.data());
            return row.data();
        }
        const uint8_t* block = st.data[(p - st.first_pos) / bt];
        const size_t r = (p - st.first_pos) % bt;
        if (keys) {
            kind.keys->read_rows(kind.key_head(block, h), r, 1, row.data());
        } else {
            kind.values->read_rows(kind.value_head(block, h), r, 1, row.data());
        }
        return row.data();
    };
    std::vector<double> s(g * n), acc(g * dv, 0.0), top(g, -std::numeric_limits<double>::infinity()), sum(g, 0.0);
    for (size_t t = 0; t < n; ++t) {
        const float* k = read_row(lo + t, true);
        for (size_t i = 0; i < g; ++i) {
            const float* qi = q + (h * g + i) * d;
            double dot = 0.0;
            for (size_t j = 0; j < d; ++j) dot += static_cast<double>(qi[j]) * k[j];
            double x = dot * cfg.scale;
            if (cfg.softcap > 0) x = cfg.softcap * std::tanh(x / cfg.softcap);
            s[i * n + t] = x;
            top[i] = std::max(top[i], x);
        }
    }
    for (size_t t = 0; t < n; ++t) {
        const float* v = read_row(lo + t, false);
        for (size_t i = 0; i < g; ++i) {
            const double w = std::exp(s[i * n + t] - top[i]);
            sum[i] += w;
            for (size_t j = 0; j < dv; ++j) acc[i * dv + j] += w * v[j];
        }
    }
    for (size_t i = 0; i < g; ++i) {
        float* o = out + (h * g + i) * dv;
        for (size_t j = 0; j < dv; ++j) {
            o[j] = n ? static_cast<float>(std::clamp(acc[i * dv + j] / sum[i], -double(FLT_MAX), double(FLT_MAX))) : 0.0f;
        }
    }
}

void detail::CacheImpl::attend(int layer, SequenceId id, const float* q, float* out) const {
    check_layer("attend", layer);
    const ReadHeld held = read("attend", id);
    const detail::Sequence& seq = *held.seq;
    if (!q || !out) throw std::invalid_argument("KVCache::attend: q or out is a null pointer");
    const detail::LayerState& st = seq.layers[layer];
    if (st.n_tokens == 0) {
        throw std::invalid_argument("KVCache::attend: sequence " + std::to_string(id) + " has no tokens in layer " +
                                    std::to_string(layer));
    }
    std::vector<float> clean;
    std::vector<char> nan_head;
    q = check_query("attend", q, cfg.n_heads, cfg.head_dim, cfg.nan_policy, clean, nan_head);
    std::optional<detail::ScratchPool<std::vector<float>>::Lease> scaled;  // q ⊘ s (CacheConfig::key_scales)
    if (scales_keys(layer)) q = scale_queries("attend", layer, q, 1, *scaled.emplace(query_scratch));
    const size_t n = st.n_tokens, w = window(layer);
    attend_range(kind(layer), st, w && n > w ? n - w : 0, n, q, out, cfg.threads);
    for (size_t h = 0; h < nan_head.size(); ++h) {
        if (nan_head[h]) fill_nan(out + h * dv(), dv());
    }
}

void detail::CacheImpl::attend_prefill(int layer, SequenceId id, const float* q, size_t n_queries, float* out) const {
    check_layer("attend_prefill", layer);
    const ReadHeld held = read("attend_prefill", id);
    const detail::Sequence& seq = *held.seq;
    if (n_queries == 0) return;
    if (!q || !out) throw std::invalid_argument("KVCache::attend_prefill: q or out is a null pointer");
    const detail::LayerState& st = seq.layers[layer];
    const size_t n = st.n_tokens, w = window(layer);
    detail::check_buffer_sizes({{"q", detail::CheckedSize(n_queries) * cfg.n_heads * cfg.head_dim * sizeof(float),
                                 "n_queries x n_heads x head_dim floats"},
                                {"out", detail::CheckedSize(n_queries) * cfg.n_heads * dv() * sizeof(float),
                                 "n_queries x n_heads x head_dim_v floats"}},
                               [] { return "KVCache::attend_prefill"; });
    if (n_queries > n) {
        throw std::invalid_argument("KVCache::attend_prefill: " + std::to_string(n_queries) +
                                    " queries but the sequence holds " + std::to_string(n) + " tokens in layer " +
                                    std::to_string(layer));
    }
    // Query i sits at position p = n − n_queries + i and sees [p + 1 − window, p]; the earliest query
    // needs the most, and a sliding window may have released it already.
    const auto window_start = [&](size_t p) { return w && p + 1 > w ? p + 1 - w : 0; };
    if (window_start(n - n_queries) < st.first_pos) {
        throw std::invalid_argument(
            "KVCache::attend_prefill: layer " + std::to_string(layer) + " (sliding window of " + std::to_string(w) +
            " tokens) has released the tokens before position " + std::to_string(st.first_pos) + ", which query 0 needs: "
            "attend_prefill reaches back to the window of the first token of the latest append at most");
    }
    const size_t vec = static_cast<size_t>(cfg.n_heads) * cfg.head_dim, vec_out = static_cast<size_t>(cfg.n_heads) * dv();
    std::vector<float> clean;
    std::vector<char> nan_head;
    q = check_query("attend_prefill", q, n_queries * cfg.n_heads, cfg.head_dim, cfg.nan_policy, clean, nan_head);
    std::optional<detail::ScratchPool<std::vector<float>>::Lease> scaled;  // q ⊘ s (CacheConfig::key_scales)
    if (scales_keys(layer)) q = scale_queries("attend_prefill", layer, q, n_queries, *scaled.emplace(query_scratch));
    // One engine call: query i keeps positions [window_start(p), p] of those from the first query's window.
    const size_t p0 = n - n_queries, lo = window_start(p0);
    detail::RowSource sources[2];
    uint8_t* slots_here[8];
    std::vector<uint8_t*> slots_heap(staging_blocks > 8 ? staging_blocks : 0);
    const size_t n_sources = row_sources(kind(layer), st, lo, n, sources, staging_blocks > 8 ? slots_heap.data() : slots_here);
    detail::AttendTask task{std::span<const detail::RowSource>(sources, n_sources), {}};
    task.rows.q = q;
    task.rows.out = out;
    task.rows.n_rows = n_queries;
    task.rows.causal_end = p0 + 1 - lo;
    task.rows.window = w;
    const detail::AttentionShape shape{cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.scale, cfg.softcap, dv()};
    detail::attend(shape, std::span<const detail::AttendTask>(&task, 1), run(), cfg.threads, &decode_scratch);
    for (size_t i = 0; i < n_queries; ++i) {
        const size_t p = p0 + i;
        finish_output(kind(layer), st, window_start(p), p + 1, q + i * vec, out + i * vec_out);
    }
    for (size_t h = 0; h < nan_head.size(); ++h) {
        if (nan_head[h]) fill_nan(out + h * dv(), dv());
    }
}

}  // namespace kvq

namespace kvq {

void detail::CacheImpl::attend_batch(int layer, std::span<const SequenceId> ids, const float* q, float* out) const {
    check_layer("attend_batch", layer);
    if (ids.empty()) return;
    if (!q || !out) throw std::invalid_argument("KVCache::attend_batch: q or out is a null pointer");
    detail::check_buffer_sizes({{"q", detail::CheckedSize(ids.size()) * cfg.n_heads * cfg.head_dim * sizeof(float),
                                 "sequences x n_heads x head_dim floats"},
                                {"out", detail::CheckedSize(ids.size()) * cfg.n_heads * dv() * sizeof(float),
                                 "sequences x n_heads x head_dim_v floats"}},
                               [] { return "KVCache::attend_batch"; });
    const size_t vec = static_cast<size_t>(cfg.n_heads) * cfg.head_dim, vec_out = static_cast<size_t>(cfg.n_heads) * dv();
    // This call's buffers, kept by the cache between calls: a decode step of a batch allocates nothing.
    const auto lease = batch_scratch.lease();
    BatchScratch& sc = *lease;
    sc.layers.resize(ids.size());
    sc.sources.resize(2 * ids.size());
    sc.staging.resize(ids.size() * staging_blocks);
    sc.tasks.resize(ids.size());
    sc.ranges.resize(ids.size());
    auto& layers = sc.layers;
    auto& sources = sc.sources;
    auto& staging = sc.staging;
    auto& tasks = sc.tasks;
    auto& ranges = sc.ranges;
    // Each sequence held as a reader for the whole call, locks taken in increasing id order (no cycle with
    // another call that holds several); an id given twice is refused before any is taken.
    std::vector<size_t>& order = sc.order;
    order.resize(ids.size());
    for (size_t i = 0; i < ids.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ids[a] < ids[b]; });
    for (size_t k = 1; k < order.size(); ++k) {
        if (ids[order[k]] == ids[order[k - 1]]) {
            const size_t i = std::min(order[k], order[k - 1]), j = std::max(order[k], order[k - 1]);
            throw std::invalid_argument("KVCache::attend_batch: sequence " + std::to_string(ids[i]) +
                                        " is given twice (entries " + std::to_string(i) + " and " + std::to_string(j) + ")");
        }
    }
    struct Unhold {  // the locks go before the lease returns the buffers that hold them
        std::vector<ReadHeld>& held;
        ~Unhold() { held.clear(); }
    } unhold{sc.held};
    sc.held.clear();
    for (size_t i : order) sc.held.push_back(read("attend_batch", ids[i]));
    for (size_t k = 0; k < order.size(); ++k) {
        const size_t i = order[k];
        const detail::LayerState& st = sc.held[k]->layers[layer];
        if (st.n_tokens == 0) {
            throw std::invalid_argument("KVCache::attend_batch: sequence " + std::to_string(ids[i]) +
                                        " has no tokens in layer " + std::to_string(layer));
        }
        layers[i] = &st;
    }
    std::vector<float> clean;
    std::vector<char> nan_head;
    q = check_query("attend_batch", q, ids.size() * cfg.n_heads, cfg.head_dim, cfg.nan_policy, clean, nan_head);
    std::optional<detail::ScratchPool<std::vector<float>>::Lease> scaled;  // q ⊘ s (CacheConfig::key_scales)
    if (scales_keys(layer)) q = scale_queries("attend_batch", layer, q, ids.size(), *scaled.emplace(query_scratch));
    const size_t w = window(layer);
    for (size_t i = 0; i < ids.size(); ++i) {
        const size_t n = layers[i]->n_tokens;
        ranges[i] = {w && n > w ? n - w : 0, n};
        const size_t count = row_sources(kind(layer), *layers[i], ranges[i].first, ranges[i].second, &sources[2 * i],
                                         &staging[i * staging_blocks]);
        tasks[i] = {std::span<const detail::RowSource>(&sources[2 * i], count), {}};
        tasks[i].rows.q = q + i * vec;
        tasks[i].rows.out = out + i * vec_out;
    }
    const detail::AttentionShape shape{cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.scale, cfg.softcap, dv()};
    detail::attend(shape, tasks, run(), cfg.threads, &decode_scratch);
    for (size_t i = 0; i < ids.size(); ++i) finish_output(kind(layer), *layers[i], ranges[i].first, ranges[i].second, q + i * vec, out + i * vec_out);
    for (size_t h = 0; h < nan_head.size(); ++h) {
        if (nan_head[h]) fill_nan(out + h * dv(), dv());
    }
}

}  // namespace kvq
