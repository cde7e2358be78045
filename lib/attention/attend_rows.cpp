// kvq::attend_rows (include/kvq/attention.hpp): attention over caller-owned rows (a ggml KV tensor's),
// for one or several query rows, with an additive mask and threads: the checks, and the caller's tensors
// as a row source of the attention engine (lib/attention/engine.hpp) in virtual blocks of kBlockTokens
// tokens. The engine is the cache's: with one query row, no mask and one thread, rows a cache of
// kBlockTokens-token blocks stores give KVCache::attend's bits.
#include "kvq/attention.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../codec/row_keys.hpp"
#include "attend_rows_checks.hpp"
#include "engine.hpp"
#include "scratch_pool.hpp"
#include "thread_pool.hpp"

namespace kvq {
namespace {

// Tokens of a virtual block: the unit of the engine's loop, its prefetch and its split into parts.
constexpr int kBlockTokens = 256;

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("attend_rows: " + what); }

// The engine's formats of a row codec, made once per thread and codec and kept (the last few): a call
// in a steady state allocates nothing. A format holds a copy of its codec, so a codec's implementation
// stays alive (and its address unique) while an entry names it.
struct RowFormats {
    const detail::CodecImpl* keys = nullptr;
    const detail::CodecImpl* values = nullptr;
    std::unique_ptr<const detail::KeyFormat> key_format;
    std::unique_ptr<const detail::ValueFormat> value_format;
};

const RowFormats& formats_for(const Codec& keys, const Codec& values) {
    thread_local std::array<RowFormats, 4> kept;
    thread_local size_t next = 0;
    const detail::CodecImpl* ki = &detail::impl_of(keys);
    const detail::CodecImpl* vi = &detail::impl_of(values);
    for (const RowFormats& f : kept) {
        if (f.keys == ki && f.values == vi) return f;
    }
    RowFormats& f = kept[next++ % kept.size()];
    f.key_format = std::make_unique<detail::RowKeys>(keys, kBlockTokens);
    f.value_format = detail::make_value_format(values, kBlockTokens, false);
    f.keys = ki;
    f.values = vi;
    return f;
}

// A call's block tables (leased: an executor may run another call on this thread meanwhile).
struct BlockTables {
    std::vector<uint8_t*> k, v;
};

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
    // Keys and queries have the key codec's head size, values and results the value codec's (DeepSeek's
    // latent attention: 576 and 512).
    const int dk = keys.head_dim(), dv = values.head_dim();
    if (keys.info().per_channel || values.info().per_channel) {
        bad("'" + (keys.info().per_channel ? keys : values).name() +
            "' is a per-channel key codec: its rows need their block's minimums and steps, which only a KVCache holds");
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
    const size_t heads = static_cast<size_t>(n_heads), dout = static_cast<size_t>(dv);
    // Every buffer's extent (k, v, q, out, mask, sinks) checked, then the query, mask and sinks' values
    // (attend_rows_checks.hpp); the strides with their defaults filled in.
    const detail::RowStrides strides = detail::check_attend_rows(keys, values, n_heads, n_kv_heads, q, k, v, n_tokens, out, o);
    const size_t q_head = strides.q_head, q_row = strides.q_row, out_head = strides.out_head, out_row = strides.out_row;
    if (n_tokens == 0) {
        for (size_t r = 0; r < nq; ++r) {
            for (size_t h = 0; h < heads; ++h) std::fill_n(out + r * out_row + h * out_head, dout, 0.0f);
        }
        return;
    }

    const size_t nb = (n_tokens + kBlockTokens - 1) / kBlockTokens;
    static auto* const tables = new detail::ScratchPool<BlockTables>;  // never freed: calls may outlive statics
    const auto lease = tables->lease();
    BlockTables& bt = *lease;
    bt.k.resize(std::max(bt.k.size(), nb));
    bt.v.resize(std::max(bt.v.size(), nb));
    for (size_t b = 0; b < nb; ++b) {  // the engine only reads through them
        bt.k[b] = const_cast<uint8_t*>(static_cast<const uint8_t*>(k.data)) + b * kBlockTokens * k.token_stride;
        bt.v[b] = const_cast<uint8_t*>(static_cast<const uint8_t*>(v.data)) + b * kBlockTokens * v.token_stride;
    }
    const RowFormats& f = formats_for(keys, values);
    detail::RowSource src;
    src.key = f.key_format.get();
    src.value = f.value_format.get();
    src.layout.block_tokens = kBlockTokens;
    src.layout.keys.head_stride = k.head_stride;
    src.layout.keys.row_stride = k.token_stride;
    src.layout.values.head_stride = v.head_stride;
    src.layout.values.row_stride = v.token_stride;
    src.blocks = std::span<uint8_t* const>(bt.k.data(), nb);
    src.value_blocks = std::span<uint8_t* const>(bt.v.data(), nb);
    src.end_row = n_tokens - (nb - 1) * kBlockTokens;

    detail::AttendTask task{std::span<const detail::RowSource>(&src, 1), {}};
    detail::QueryRows& r = task.rows;
    r.q = q;
    r.n_rows = nq;
    r.row_stride = q_row;
    r.head_stride = q_head;
    r.out = out;
    r.out_row_stride = out_row;
    r.out_head_stride = out_head;
    r.mask = o.mask;
    r.mask_type = o.mask_type;
    r.mask_row_stride = strides.mask_row;
    r.sinks = o.sinks;
    const float scale = o.scale > 0 ? o.scale : 1.0f / std::sqrt(static_cast<float>(dk));
    const detail::AttentionShape shape{n_heads, n_kv_heads, dk, scale, o.softcap, dv};
    // The parts run on the engine's executor (its contract checked: ExecutorError) or kvq's shared pool. The
    // function holds one pointer: a std::function keeps it without allocating.
    const detail::ParallelRun run = [op = &o](int n, const std::function<void(int)>& part) {
        if (op->executor) {
            detail::run_checked(op->executor, n, part);
        } else {
            detail::shared_pool().run(n, part, op->threads);
        }
    };
    detail::attend(shape, std::span<const detail::AttendTask>(&task, 1), &run, o.threads);
    // Finite inputs whose scores overflowed float: those results again in double (the cache's rule).
    detail::finish_rows_exactly(keys, values, n_heads, n_kv_heads, q, k, v, n_tokens, out, o, strides, scale);
}

}  // namespace kvq
