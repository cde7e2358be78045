// Appending tokens: checks, a plan of the blocks the append needs (taken from the pool in one call that
// either gives them all or throws with nothing changed), then the writes: quantize on append, or float
// staging sealed a block at a time by the layer's key format.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#include "../util/checked_size.hpp"
#include "cache_impl.hpp"

namespace kvq {
namespace {

size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

// Checks one of k/v for NaN/Inf and for rows beyond the codec's range (which would store an overflowing
// fp16 field: they count as non-finite). reject: throws. propagate: records (token, head) in `poisoned`
// (attention then returns NaN for the head); plain codecs store the row as it is (too large for f16/bf16
// becomes Inf), the others get a copy with the row zeroed.
const float* check_rows(const float* x, const char* name, size_t n, int n_kv, int d, NanPolicy policy,
                        const InputLimit& limit, bool codec_stores_nonfinite, std::vector<float>& clean,
                        std::vector<std::pair<size_t, int>>& poisoned) {
    for (size_t t = 0; t < n; ++t) {
        for (int h = 0; h < n_kv; ++h) {
            const size_t base = (t * n_kv + h) * static_cast<size_t>(d);
            bool finite = true;
            for (int j = 0; j < d; ++j) finite &= std::isfinite(x[base + j]);
            if (finite && limit.admits(x + base, d)) continue;
            if (policy == NanPolicy::reject) {
                const std::string what = finite ? std::string(" is beyond the ") + (name[0] == 'k' ? "key" : "value") +
                                                      " codec's range (" +
                                                      (limit.on_norm ? "L2 norm" : "|x|") + " at most " +
                                                      std::to_string(limit.max_abs) + ")"
                                                : " holds NaN or Inf";
                const std::string message = std::string("KVCache::append: ") + name + " of token " + std::to_string(t) +
                                            ", kv head " + std::to_string(h) + what +
                                            " (NanPolicy::reject); nothing was stored";
                if (!finite) throw NonFiniteInput(message);
                throw std::invalid_argument(message);
            }
            // Recorded even where the codec keeps the values: a key of -Inf would otherwise just get
            // weight 0, and the promise is NaN for every head that reads a non-finite row.
            if (!codec_stores_nonfinite) {
                if (clean.empty()) clean.assign(x, x + n * n_kv * d);
                std::fill(clean.begin() + base, clean.begin() + base + d, 0.0f);
            }
            poisoned.emplace_back(t, h);
        }
    }
    return clean.empty() ? x : clean.data();
}

// What an append of n tokens to a layer does to its block table, worked out before anything changes.
struct AppendPlan {
    size_t old_n, n_final;            // the layer's tokens before and after
    size_t keep_from, keep_block;     // the first position (a block boundary) and block kept
    size_t old_pool_end, new_pool_end;
    bool staging;                     // SealPolicy::on_block_full
    bool partial_pool_block;          // on_block_full: only after a truncate
    size_t restaged;                  // rows of a re-opened block moved back to the float staging
    size_t n_drop;                    // blocks at the front of the table given back
    size_t n_new;                     // blocks added at the end
    bool copy_last;                   // the partly filled last block is shared: written to a copy
};

// Keys or values with side data fitted to a whole block, or an exact tail (see plan_append).
bool re_quantizes_on_reopen(const detail::CacheImpl& c, const detail::LayerKind& kind) {
    return !kind.keys->writes_rows() || !kind.values->writes_rows() || c.cfg.exact_tail_tokens > 0;
}

// The first n key and value rows of kv head h of a block as attention reads them (the key format's
// exact read-back), into keys (n × head_dim) and values (n × head_dim_v; null: not read).
void read_block_rows(const detail::LayerKind& kind, const uint8_t* block, int h, size_t n, float* keys, float* values) {
    kind.keys->read_rows(kind.key_head(block, h), 0, n, keys);
    if (values) kind.values->read_rows(kind.value_head(block, h), 0, n, values);
}

// A row as a block reads it may pass the limit append admits by a rounding (an fp16 step, scale or mean
// rounded up near the top of the range): brought back within it, so that sealing it again is as safe as
// sealing an appended row (finite fp16 minimums, steps, means and scales). Non-finite rows (stored under
// NanPolicy::propagate, and recorded) stay as they are.
void bring_within(float* row, int d, const InputLimit& limit) {
    const double size = limit.size_of(row, d);
    if (!std::isfinite(size) || size <= limit.max_abs) return;
    for (int j = 0; j < d; ++j) {
        row[j] = limit.on_norm ? static_cast<float>(row[j] * (limit.max_abs / size * (1 - 1e-6)))
                               : std::clamp(row[j], -limit.max_abs, limit.max_abs);
    }
}

AppendPlan plan_append(const detail::CacheImpl& c, const detail::LayerState& st, int layer, size_t n) {
    AppendPlan p;
    const size_t bt = c.bt();
    p.old_n = st.n_tokens;
    p.n_final = p.old_n + n;
    const size_t w = c.window(layer);
    // Blocks that lie wholly before the window of the first token of this append (position old_n), by
    // more than one block of slack, are never needed again: attend_prefill over the tokens of this append
    // reads no further back, and decode after it reads less. They return to the pool here; tokens of a
    // long append that fall out of the window only later stay until the next append. The slack lets
    // truncate go back up to block_tokens tokens (speculative decoding).
    const size_t blocks_before_window = w && p.old_n + 1 > w ? (p.old_n + 1 - w) / bt : 0;
    p.keep_from = blocks_before_window > 1 ? (blocks_before_window - 1) * bt : 0;
    p.staging = c.cfg.seal == SealPolicy::on_block_full;
    p.old_pool_end = st.pool_end();
    // A block re-opened by a truncate whose key format fits side data to the whole block (a mean, ranges:
    // KeyFormat::writes_rows() is false) is not appended to with side data fitted to the rows it was sealed
    // with: its rows go back to the float staging (as they read back) and the block seals anew over them
    // and the new rows, as a block that was never sealed. With an exact tail too: the new rows are recent,
    // so they go to the staging, not into the block. Formats of rows otherwise keep quantizing into the
    // partly filled block: their rows are the same either way.
    p.restaged = p.staging && re_quantizes_on_reopen(c, c.kind(layer)) ? p.old_pool_end % bt : 0;
    p.old_pool_end -= p.restaged;
    p.partial_pool_block = p.old_pool_end % bt != 0;
    // A window shorter than the staging releases pool blocks only: staged blocks wait until sealed.
    p.keep_from = std::min(p.keep_from, p.old_pool_end / bt * bt);
    p.keep_block = p.keep_from / bt;
    p.new_pool_end = p.n_final;
    if (p.staging) {
        // Blocks full and wholly older than the exact tail are sealed (with no tail: every full block).
        const size_t tail = static_cast<size_t>(c.cfg.exact_tail_tokens);
        const size_t sealable = p.n_final > tail ? (p.n_final - tail) / bt * bt : 0;
        const size_t boundary = round_up(p.old_pool_end, bt);
        p.new_pool_end = p.partial_pool_block && p.n_final <= boundary ? p.n_final : std::max(boundary, sealable);
    }
    const size_t first_block = st.first_pos / bt;
    const size_t old_blocks_end = first_block + st.table.size() - (p.restaged ? 1 : 0);
    p.n_drop = p.keep_block > first_block ? std::min(p.keep_block, old_blocks_end) - first_block : 0;
    const size_t new_from = std::max(old_blocks_end, p.keep_block);
    const size_t new_blocks_end = (p.new_pool_end + bt - 1) / bt;
    p.n_new = new_blocks_end > new_from ? new_blocks_end - new_from : 0;
    // The partly filled last block is copied before it is written if another sequence shares it.
    p.copy_last = p.partial_pool_block && p.new_pool_end > p.old_pool_end && old_blocks_end - 1 >= p.keep_block &&
                  c.pool->is_shared(st.table.back().id);
    return p;
}

// The tokens into the layer's blocks as planned: quantized into a block (every append under on_append;
// the partly filled block left by a truncate under on_block_full), or copied to the float staging and the
// block sealed once it is full.
void write_tokens(const detail::CacheImpl& c, const detail::LayerKind& kind, detail::LayerState& st, const AppendPlan& p,
                  const float* k, const float* v) {
    const size_t bt = c.bt();
    const int n_kv = c.cfg.n_kv_heads, d = c.cfg.head_dim, dv = c.dv();
    const size_t token_floats = static_cast<size_t>(n_kv) * d, token_floats_v = static_cast<size_t>(n_kv) * dv;
    // Staged blocks are sealed in position order as soon as they are full and due, before the next
    // block's rows are written (its ring slot may be theirs: staging_blocks is large enough that a
    // block's slot is free by the time it is written).
    size_t sealed_to = round_up(p.old_pool_end, bt);
    const auto seal_up_to = [&](size_t end) {
        for (; p.staging && sealed_to + bt <= std::min(end, p.new_pool_end); sealed_to += bt) {
            c.seal(kind, st, sealed_to, st.data[(sealed_to - st.first_pos) / bt]);
        }
    };
    for (size_t pos = p.old_n; pos < p.n_final;) {
        seal_up_to(pos);
        const size_t block = pos / bt, row = pos % bt;
        const size_t end = std::min(p.n_final, (block + 1) * bt);
        const size_t count = end - pos, t = pos - p.old_n;
        if (block >= p.keep_block) {
            const size_t index = block - st.first_pos / bt;
            if (!p.staging || (p.partial_pool_block && block == p.old_pool_end / bt)) {
                c.write_rows(kind, st, index, row, k + t * token_floats, v ? v + t * token_floats_v : nullptr, count);
            } else {
                const detail::CodecImpl& staged = detail::impl_of(c.exact);  // f32: a copy; f16: rounded
                const detail::CodecImpl& staged_v = detail::impl_of(c.exact_v);
                const size_t rb = c.exact.row_bytes(), rb_v = c.exact_v.row_bytes();
                for (size_t i = 0; i < count; ++i) {
                    for (int h = 0; h < n_kv; ++h) {
                        staged.quantize_rows(k + (t + i) * token_floats + h * d, 1, c.staged_row(st, true, h, pos + i), rb);
                        if (v) staged_v.quantize_rows(v + (t + i) * token_floats_v + h * dv, 1, c.staged_row(st, false, h, pos + i), rb_v);
                    }
                }
            }
        }
        pos = end;
    }
    seal_up_to(p.n_final);
}

}  // namespace

void detail::CacheImpl::write_rows(const LayerKind& kind, detail::LayerState& st, size_t block_index, size_t row, const float* k,
                               const float* v, size_t n) const {
    const int n_kv = cfg.n_kv_heads, d = cfg.head_dim, dv = this->dv();
    uint8_t* block = st.data[block_index];
    std::vector<float> rows(n * std::max(d, dv));
    // Only key formats that write rows get here: a re-opened block of the others goes back to the staging
    // instead (plan_append). A latent cache's values are its keys (v is null).
    for (int h = 0; h < n_kv; ++h) {
        for (size_t t = 0; t < n; ++t) std::memcpy(&rows[t * d], k + (t * n_kv + h) * d, d * sizeof(float));
        kind.keys->write_rows(rows.data(), row, n, kind.key_head(block, h));
        if (!v) continue;
        for (size_t t = 0; t < n; ++t) std::memcpy(&rows[t * dv], v + (t * n_kv + h) * dv, dv * sizeof(float));
        kind.values->write_rows(rows.data(), row, n, kind.value_head(block, h));
    }
}

const uint8_t* detail::CacheImpl::staging_slot(const detail::LayerState& st, size_t pos) const {
    return st.staging.data() + (pos / bt()) % staging_blocks * staging_block_bytes;
}

const uint8_t* detail::CacheImpl::staged_row(const detail::LayerState& st, bool keys, int h, size_t pos) const {
    const uint8_t* slot = staging_slot(st, pos);
    if (keys) return staging_layout.key_head(slot, h, exact.row_bytes()).rows + pos % bt() * exact.row_bytes();
    return staging_layout.value_head(slot, h, exact_v.row_bytes()).rows + pos % bt() * staged_value_stride();
}

void detail::CacheImpl::staged_rows(const detail::LayerState& st, bool keys, int h, size_t pos, size_t n, float* out) const {
    if (keys) {
        detail::impl_of(exact).dequantize_rows(staged_row(st, true, h, pos), exact.row_bytes(), n, out);
    } else {
        detail::impl_of(exact_v).dequantize_rows(staged_row(st, false, h, pos), staged_value_stride(), n, out);
    }
}

void detail::CacheImpl::seal(const LayerKind& kind, const detail::LayerState& st, size_t pos, uint8_t* block) const {
    const int n_kv = cfg.n_kv_heads;
    thread_local std::vector<float> keys, values;
    keys.resize(bt() * cfg.head_dim);
    values.resize(bt() * dv());
    for (int h = 0; h < n_kv; ++h) {
        staged_rows(st, true, h, pos, bt(), keys.data());
        kind.keys->seal(keys.data(), bt(), pos, kind.key_head(block, h));
        if (latent()) continue;  // its values are the keys just sealed
        staged_rows(st, false, h, pos, bt(), values.data());
        kind.values->seal(values.data(), bt(), pos, kind.value_head(block, h));
    }
}

void detail::CacheImpl::append(int layer, SequenceId id, const float* k, const float* v, size_t n) {
    check_layer("append", layer);
    const WriteHeld held = write("append", id);
    detail::Sequence& seq = *held.seq;
    if (n == 0) return;
    if (!k || (!v && !latent())) throw std::invalid_argument("KVCache::append: k or v is a null pointer");
    if (v && latent()) {
        throw std::invalid_argument("KVCache::append: a latent cache (latent_values) takes v = null: its values are the "
                                    "keys' leading values");
    }
    const int n_kv = cfg.n_kv_heads, d = cfg.head_dim, dv = this->dv();
    const size_t token_floats = static_cast<size_t>(n_kv) * d;
    // Before a single value is read: n tokens of k and v must be buffers that can exist.
    detail::check_buffer_sizes({{"k", detail::CheckedSize(n) * token_floats * sizeof(float), "n_tokens x n_kv_heads x head_dim floats"},
                                {"v", detail::CheckedSize(v ? n : 0) * n_kv * dv * sizeof(float), "n_tokens x n_kv_heads x head_dim_v floats"}},
                               [&] { return "KVCache::append: n_tokens = " + std::to_string(n); });
    if (n > kMaxSequenceTokens - seq.layers[layer].n_tokens) {
        throw std::invalid_argument("KVCache::append: " + std::to_string(n) + " more tokens would take layer " +
                                    std::to_string(layer) + " past " + std::to_string(kMaxSequenceTokens) +
                                    " tokens; nothing was read");
    }
    std::vector<float> k_scaled, k_clean, v_clean;  // this call's copies: k ⊙ s, rows zeroed (NanPolicy)
    std::vector<std::pair<size_t, int>> poisoned;
    const LayerKind& kd = kind(layer);
    k = scale_keys(layer, k, n, k_scaled);  // the keys as stored: every check below is of k ⊙ s
    k = check_rows(k, scales_keys(layer) ? "k (times key_scales)" : "k", n, n_kv, d, cfg.nan_policy, kd.key_limit, kd.store_nonfinite_k, k_clean, poisoned);
    if (v) v = check_rows(v, "v", n, n_kv, dv, cfg.nan_policy, kd.value_limit, kd.store_nonfinite_v, v_clean, poisoned);

    detail::LayerState& st = seq.layers[layer];
    const AppendPlan p = plan_append(*this, st, layer, n);
    // The staging grows (doubling, up to the ring) to hold positions up to n_final; allocated and copied
    // before the pool is asked, kept only if it gives. The pool reserves the whole ring on the first append.
    std::vector<uint8_t> new_staging;
    const size_t held_slots = st.staging.size() / staging_block_bytes, need_slots = staging_slots_for(p.n_final);
    if (p.staging && need_slots > held_slots) {
        const size_t bytes = std::min(staging_blocks, std::max(need_slots, 2 * held_slots)) * staging_block_bytes;
        new_staging.reserve(bytes);
        new_staging.assign(st.staging.begin(), st.staging.end());
        new_staging.resize(bytes, 0);
    }
    const bool staging_now = p.staging && st.staging.empty();
    std::vector<detail::BlockRef> give_back(st.table.begin(), st.table.begin() + p.n_drop);
    if (p.copy_last) give_back.push_back(st.table.back());
    // A re-opened block (plan_append): its rows as floats now, since the pool may hand its memory out again.
    std::vector<float> restaged_k, restaged_v;
    if (p.restaged) {
        give_back.push_back(st.table.back());
        const size_t head_floats = p.restaged * static_cast<size_t>(d), head_floats_v = latent() ? 0 : p.restaged * static_cast<size_t>(dv);
        restaged_k.resize(n_kv * head_floats);
        restaged_v.resize(n_kv * head_floats_v);
        for (int h = 0; h < n_kv; ++h) {
            read_block_rows(kd, st.data.back(), h, p.restaged, restaged_k.data() + h * head_floats,
                            latent() ? nullptr : restaged_v.data() + h * head_floats_v);
        }
        for (size_t r = 0; r < n_kv * p.restaged; ++r) {
            bring_within(&restaged_k[r * d], d, kd.key_limit);
            if (!latent()) bring_within(&restaged_v[r * dv], dv, kd.value_limit);
        }
    }
    // The blocks and any new staging from the pool in one step (all or nothing).
    std::vector<size_t> want(kind_of[layer] + 1, 0);
    want[kind_of[layer]] = p.n_new + p.copy_last;
    // The table entries of the new blocks count against the pool too (CacheConfig::max_bytes).
    const std::vector<detail::BlockRef> fresh = pool->take(want, staging_now ? kd.staging_units : 0,
                                                           staging_now ? staging_layer_bytes : 0, give_back, false,
                                                           p.n_new * kTableEntryBytes);

    // ---- from here on nothing fails ----
    if (staging_now) staging_bytes += staging_layer_bytes;
    if (!new_staging.empty()) st.staging = std::move(new_staging);
    st.table.erase(st.table.begin(), st.table.begin() + p.n_drop);
    st.data.erase(st.data.begin(), st.data.begin() + p.n_drop);
    seq.charged += p.n_new * kTableEntryBytes;
    metadata_bytes += p.n_new * kTableEntryBytes;
    uncharge_entries(seq, p.n_drop + (p.restaged ? 1 : 0));  // a re-opened block leaves the table
    if (p.restaged) {
        st.table.pop_back();
        st.data.pop_back();
        for (int h = 0; h < n_kv; ++h) {
            detail::impl_of(exact).quantize_rows(restaged_k.data() + h * p.restaged * static_cast<size_t>(d), p.restaged,
                                                 staged_row(st, true, h, p.old_pool_end), exact.row_bytes());
            if (latent()) continue;
            detail::impl_of(exact_v).quantize_rows(restaged_v.data() + h * p.restaged * static_cast<size_t>(dv), p.restaged,
                                                   staged_row(st, false, h, p.old_pool_end), exact_v.row_bytes());
        }
    }
    st.first_pos = std::max(st.first_pos, p.keep_from);
    if (p.copy_last) {
        std::memcpy(fresh.back().data, st.table.back().data, block_bytes(layer));
        st.table.back() = fresh.back();
        st.data.back() = fresh.back().data;
    }
    for (size_t i = 0; i < p.n_new; ++i) st.push_block(fresh[i]);
    write_tokens(*this, kd, st, p, k, v);
    st.n_tokens = p.n_final;
    st.staged = p.n_final - p.new_pool_end;
    for (const auto& [t, h] : poisoned) {
        if (p.old_n + t >= st.first_pos) st.poisoned.emplace_back(p.old_n + t, h);
    }
    std::erase_if(st.poisoned, [&](const auto& q) { return q.first < st.first_pos; });
}

}  // namespace kvq
