// KVCache: configuration checks, the public entry points (each forwards to Impl), accounting and dump.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "../codec/key_formats.hpp"
#include "../ref/half.hpp"
#include "../util/checked_size.hpp"
#include "cache_impl.hpp"
#include "key_scales.hpp"

namespace kvq {
namespace {

[[noreturn]] void bad_config(const std::string& what) { throw BadParams("CacheConfig: " + what); }

void check_dim(const char* what, int x) {
    if (x < 1 || x > kMaxCacheDim) {
        const std::string message = std::string("CacheConfig: ") + what + " must be in 1.." +
                                    std::to_string(kMaxCacheDim) + ", got " + std::to_string(x);
        if (std::string_view(what).starts_with("head_dim")) throw BadHeadDim(message);
        throw BadParams(message);
    }
}

// Every rule but the codecs' (which Codec::make checks when the cache makes them).
CacheConfig checked_fields(CacheConfig c) {
    check_dim("n_layers", c.n_layers);
    check_dim("n_kv_heads", c.n_kv_heads);
    if (c.n_heads == 0) c.n_heads = c.n_kv_heads;
    if (c.n_heads < 0 || c.n_heads % c.n_kv_heads != 0) {
        bad_config("n_heads (" + std::to_string(c.n_heads) + ") must be a positive multiple of n_kv_heads (" +
                   std::to_string(c.n_kv_heads) + ")");
    }
    check_dim("n_heads", c.n_heads);
    check_dim("head_dim", c.head_dim);
    if (c.head_dim_v == 0) c.head_dim_v = c.head_dim;
    check_dim("head_dim_v", c.head_dim_v);
    if (c.latent_values) {
        if (c.head_dim_v > c.head_dim) {
            bad_config("latent_values: head_dim_v (" + std::to_string(c.head_dim_v) + ") must be at most head_dim (" +
                       std::to_string(c.head_dim) + "): the values are the keys' leading values");
        }
        bool centered = c.center_keys || detail::parse_key_spec(c.key_codec).center;
        for (const LayerCodecs& l : c.layer_codecs) centered |= !l.key.empty() && detail::parse_key_spec(l.key).center;
        if (centered || !c.key_scales.empty()) {
            bad_config("latent_values takes no center_keys ('+center' keys) or key_scales: the values are the stored keys' "
                       "leading values");
        }
    }
    if (c.block_tokens < 1 || c.block_tokens > kMaxBlockTokens) {
        bad_config("block_tokens must be in 1.." + std::to_string(kMaxBlockTokens) + ", got " + std::to_string(c.block_tokens));
    }
    if (c.max_blocks != 0 && c.initial_blocks > c.max_blocks) {
        bad_config("initial_blocks (" + std::to_string(c.initial_blocks) + ") exceeds max_blocks (" +
                   std::to_string(c.max_blocks) + ")");
    }
    if (c.grow_blocks < 1) bad_config("grow_blocks must be at least 1");
    // A pool numbers its blocks with 32 bits: it never holds more (and would fail every growth beyond).
    static_assert(kMaxPoolBlocks == std::numeric_limits<detail::BlockId>::max());
    if (c.initial_blocks > kMaxPoolBlocks || c.grow_blocks > kMaxPoolBlocks) {
        bad_config("initial_blocks and grow_blocks must be at most " + std::to_string(kMaxPoolBlocks) +
                   " (a pool's blocks have 32-bit ids), got " + std::to_string(c.initial_blocks) + " and " +
                   std::to_string(c.grow_blocks));
    }
    if (!std::isfinite(c.scale) || c.scale < 0) bad_config("scale must be finite and >= 0 (0 = 1/sqrt(head_dim))");
    if (c.scale == 0) c.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    if (!std::isfinite(c.softcap) || c.softcap < 0) bad_config("softcap must be finite and >= 0 (0 = off)");
    if (!c.sliding_window.empty()) {
        if (c.sliding_window.size() != static_cast<size_t>(c.n_layers)) {
            bad_config("sliding_window has " + std::to_string(c.sliding_window.size()) +
                       " entries; it must be empty or have one per layer (" + std::to_string(c.n_layers) + ")");
        }
        for (size_t i = 0; i < c.sliding_window.size(); ++i) {
            if (c.sliding_window[i] < 0) {
                bad_config("sliding_window[" + std::to_string(i) + "] is negative (0 = full attention)");
            }
        }
    }
    if (!c.layer_codecs.empty() && c.layer_codecs.size() != static_cast<size_t>(c.n_layers)) {
        bad_config("layer_codecs has " + std::to_string(c.layer_codecs.size()) +
                   " entries; it must be empty or have one per layer (" + std::to_string(c.n_layers) + ")");
    }
    if (!c.key_scales.empty()) {
        const size_t n = size_t(c.n_layers) * size_t(c.n_kv_heads) * size_t(c.head_dim);
        if (c.key_scales.size() != n) {
            bad_config("key_scales has " + std::to_string(c.key_scales.size()) + " entries; it must be empty or have "
                       "n_layers x n_kv_heads x head_dim (" + std::to_string(n) + ")");
        }
        for (size_t i = 0; i < n; ++i) {
            const float s = c.key_scales[i];
            if (!detail::valid_key_scale(s)) {
                bad_config("key_scales[" + std::to_string(i) + "] (layer " + std::to_string(i / (n / c.n_layers)) + ") is " +
                           std::to_string(s) + "; every key scale must be positive and finite, and so its reciprocal");
            }
        }
    }
    if (c.threads < 1 || c.threads > 256) bad_config("threads must be in 1..256, got " + std::to_string(c.threads));
    if (c.exact_tail_tokens < 0 || c.exact_tail_tokens > kMaxExactTailTokens) {
        bad_config("exact_tail_tokens must be in 0.." + std::to_string(kMaxExactTailTokens) + ", got " +
                   std::to_string(c.exact_tail_tokens));
    }
    if (c.exact_tail_tokens > 0 && c.seal != SealPolicy::on_block_full) {
        bad_config("exact_tail_tokens needs seal = SealPolicy::on_block_full (on_append quantizes every token as "
                   "it arrives)");
    }
    if (c.center_keys && c.seal != SealPolicy::on_block_full) {
        bad_config("center_keys needs seal = SealPolicy::on_block_full (a block's key mean is known only "
                   "when the block is full)");
    }
    return detail::centered_key_specs(std::move(c));
}

}  // namespace

CacheConfig detail::centered_key_specs(CacheConfig c) {
    if (c.center_keys) {
        c.key_codec = detail::key_spec_centered(c.key_codec, true);
        for (LayerCodecs& l : c.layer_codecs) {
            if (!l.key.empty()) l.key = detail::key_spec_centered(l.key, true);
        }
    }
    return c;
}

bool detail::CacheImpl::centered(int layer) const { return detail::parse_key_spec(kind(layer).keys->name()).center; }

CacheConfig validate_config(CacheConfig c) {
    // Every field, the codecs' names and parameters and whether they take head_dim (UnknownCodec,
    // BadParams, BadHeadDim), and the pool's limits against the blocks allocated up front: what the
    // constructor checks, without allocating a block.
    return detail::CacheImpl(c, false).cfg;
}

namespace {

// The key format of a spec as the cache's pool holds it (lib/codec/key_formats.cpp is the registration).
std::shared_ptr<const detail::KeyFormat> make_keys(const CacheConfig& c, const std::string& spec) {
    // A latent cache's pool keeps its key rows as ggml's (not in q8_0's groups), as its values read them.
    std::shared_ptr<const detail::KeyFormat> keys =
        detail::make_key_format(spec, c.head_dim, c.block_tokens, {!c.latent_values, c.seed});
    if (!keys->writes_rows() && c.seal != SealPolicy::on_block_full) {
        bad_config("key codec '" + spec + "' needs seal = SealPolicy::on_block_full (its side data is fitted to a whole "
                   "block, known only when the block is full)");
    }
    return keys;
}

// The values' codec: the spec's, of head_dim_v values; with latent_values the key codec's, read from the
// leading values of the key rows, which only an unrotated codec of its own blocks (or plain rows) has.
Codec make_value_codec(const CacheConfig& c, const std::string& spec, const detail::KeyFormat& keys) {
    if (!c.latent_values) {
        if (detail::is_key_only_spec(spec)) bad_config("'" + spec + "' is a key codec (a key format); values need a row codec");
        return Codec::make(spec, c.head_dim_v, c.seed);
    }
    const Codec& k = keys.codec();
    if (!spec.empty() && spec != k.name()) {
        bad_config("latent_values: the value codec must be empty or the key codec ('" + k.name() + "'), got '" + spec + "'");
    }
    if (keys.name() != k.name() || k.rotated() || k.info().rotates || k.info().per_channel || (!k.info().plain && !k.info().ggml_layout)) {
        bad_config("latent_values: key codec '" + keys.name() + "' does not keep its leading values as rows of their own "
                   "(f32, f16, bf16 and ggml's unrotated block codecs do)");
    }
    if (c.head_dim_v % k.info().block != 0) {
        bad_config("latent_values: head_dim_v (" + std::to_string(c.head_dim_v) + ") must be a multiple of " + k.name() +
                   "'s block of " + std::to_string(k.info().block) + " values");
    }
    return Codec::make(k.name(), c.head_dim_v, c.seed);
}

}  // namespace

detail::CacheImpl::CacheImpl(const CacheConfig& config, bool allocate)
    : cfg(checked_fields(config)),  // with the codecs made below: validate_config's rules, codecs made once
      key_format(make_keys(cfg, cfg.key_codec)),
      key(key_format->codec()),
      value(make_value_codec(cfg, cfg.value_codec, *key_format)),
      exact(Codec::make(cfg.staging == StagingType::f16 ? "f16" : "f32", cfg.head_dim)),
      exact_v(Codec::make(exact.name(), cfg.head_dim_v)),
      exact_keys(detail::make_key_format(exact.name(), cfg.head_dim, cfg.block_tokens)),
      exact_values(detail::make_value_format(exact_v, cfg.block_tokens, cfg.int8_value_weights)) {
    static_assert(detail::kBlockAlignment == detail::BlockPool::kAlignment);
    staging_layout = detail::staging_block_layout(*exact_keys, *exact_values, cfg.n_kv_heads, latent());
    staging_block_bytes = staging_layout.bytes;
    // The ring holds the most rows staged at once: the tail and an open block of up to bt − 1 rows.
    staging_blocks = std::max<size_t>(1, (static_cast<size_t>(cfg.exact_tail_tokens) + 2 * bt() - 2) / bt());
    if ((detail::CheckedSize(staging_blocks) * staging_block_bytes * static_cast<size_t>(cfg.n_layers)).too_large()) {
        bad_config("exact_tail_tokens (" + std::to_string(cfg.exact_tail_tokens) + ") would take more bytes of staging than any allocation");
    }
    staging_layer_bytes = staging_blocks * staging_block_bytes;

    // The layers' kinds: one per distinct pair of codec names, in the order of their first layer.
    std::vector<size_t> class_bytes, layers_of;
    for (int l = 0; l < cfg.n_layers; ++l) {
        const LayerCodecs own = cfg.layer_codecs.empty() ? LayerCodecs{} : cfg.layer_codecs[l];
        std::shared_ptr<const detail::KeyFormat> k = own.key.empty() ? key_format : make_keys(cfg, own.key);
        Codec v = !own.value.empty() || (latent() && !own.key.empty()) ? make_value_codec(cfg, own.value, *k) : value;
        size_t found = 0;
        while (found < kinds.size() && (kinds[found].keys->name() != k->name() || kinds[found].value.name() != v.name())) ++found;
        kind_of.push_back(found);
        if (found < kinds.size()) {
            ++layers_of[found];
            continue;
        }
        LayerKind& kd = kinds.emplace_back(LayerKind{k->codec(), v, false, false, {}, {}, {}, 0, k,
                                                     detail::make_value_format(v, cfg.block_tokens, cfg.int8_value_weights)});
        layers_of.push_back(1);
        if (!kd.values->writes_rows() && cfg.seal != SealPolicy::on_block_full) {
            bad_config("value codec '" + kd.values->name() + "' needs seal = SealPolicy::on_block_full (its side data is fitted "
                       "to a whole block, known only when the block is full)");
        }
        kd.store_nonfinite_k = kd.key.info().plain;
        kd.store_nonfinite_v = kd.value.info().plain;
        kd.key_limit = kd.keys->input_limit();
        kd.value_limit = kd.values->input_limit();
        // fp16 staging holds |x| up to 65504 (a limit on the norm implies it on every value).
        if (cfg.staging == StagingType::f16 && cfg.seal == SealPolicy::on_block_full) {
            kd.key_limit.max_abs = std::min(kd.key_limit.max_abs, 65504.0f);
            kd.value_limit.max_abs = std::min(kd.value_limit.max_abs, 65504.0f);
        }
        kd.layout = detail::pool_block_layout(*kd.keys, *kd.values, cfg.n_kv_heads, latent());
        const size_t bytes = kd.layout.bytes;  // the pool rounds it up to its alignment
        class_bytes.push_back(bytes);
        kd.staging_units = (staging_layer_bytes + bytes - 1) / bytes;
    }
    if (kinds.size() > UINT16_MAX) bad_config("more than 65535 distinct pairs of layer codecs");
    // initial_blocks, shared among the kinds in proportion to their layers (the remainder to kind 0).
    std::vector<size_t> initial(kinds.size(), 0);
    size_t given = 0;
    for (size_t k = 1; k < kinds.size(); ++k) given += initial[k] = cfg.initial_blocks * layers_of[k] / cfg.n_layers;
    initial[0] = cfg.initial_blocks - given;
    detail::CheckedSize initial_bytes = 0;
    for (size_t k = 0; k < kinds.size(); ++k) initial_bytes = initial_bytes + detail::CheckedSize(initial[k]) * class_bytes[k];
    if (initial_bytes.too_large()) {
        bad_config("initial_blocks (" + std::to_string(cfg.initial_blocks) + " blocks) would take more bytes than any allocation");
    }
    if (cfg.max_bytes != 0 && initial_bytes.value() > cfg.max_bytes) {
        bad_config("initial_blocks (" + std::to_string(cfg.initial_blocks) + " blocks, " +
                   std::to_string(initial_bytes.value()) + " bytes) exceed max_bytes (" + std::to_string(cfg.max_bytes) + ")");
    }
    if (!allocate) std::fill(initial.begin(), initial.end(), 0);
    pool = std::make_unique<detail::BlockPool>(class_bytes, cfg.max_blocks, cfg.max_bytes, initial, cfg.grow_blocks);
    // Key channel scales: which layers have any but 1, and the reciprocals the queries are multiplied by.
    if (!cfg.key_scales.empty()) {
        const size_t per_layer = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
        scaled_layer.assign(cfg.n_layers, 0);
        key_scale_inv.resize(cfg.key_scales.size());
        for (size_t i = 0; i < cfg.key_scales.size(); ++i) {
            key_scale_inv[i] = detail::key_scale_reciprocal(cfg.key_scales[i]);
            scaled_layer[i / per_layer] |= cfg.key_scales[i] != 1.0f;
        }
    }
    // center_keys as the cache reports it: whether every key spec, the default's and each layer's, is centered.
    bool all_centered = detail::parse_key_spec(key_format->name()).center;
    for (int l = 0; l < cfg.n_layers; ++l) all_centered &= centered(l);
    cfg.center_keys = all_centered;
    if (cfg.executor) {
        runner = [ex = cfg.executor](int n, const std::function<void(int)>& task) { detail::run_checked(ex, n, task); };
    } else if (cfg.threads > 1) {
        runner = [t = cfg.threads](int n, const std::function<void(int)>& task) { detail::shared_pool().run(n, task, t); };
    }
}

void detail::CacheImpl::check_layer(const char* what, int layer) const {
    if (layer < 0 || layer >= cfg.n_layers) {
        throw std::invalid_argument(std::string("KVCache::") + what + ": layer " + std::to_string(layer) +
                                    " is out of range (n_layers = " + std::to_string(cfg.n_layers) + ")");
    }
}

namespace {

[[noreturn]] void no_sequence(const char* what, SequenceId seq) {
    throw UnknownSequence(std::string("KVCache::") + what + ": no sequence with id " + std::to_string(seq));
}

}  // namespace

std::shared_ptr<detail::Sequence> detail::CacheImpl::find(const char* what, SequenceId seq) const {
    std::lock_guard<std::mutex> lock(seq_mu);
    const auto it = seqs.find(seq);
    if (it == seqs.end()) no_sequence(what, seq);
    return it->second;
}

detail::ReadHeld detail::CacheImpl::read(const char* what, SequenceId seq) const {
    ReadHeld h{find(what, seq), {}};
    h.lock = std::shared_lock<std::shared_mutex>(h.seq->mu);
    if (h.seq->removed) no_sequence(what, seq);
    return h;
}

detail::WriteHeld detail::CacheImpl::write(const char* what, SequenceId seq) const {
    WriteHeld h{find(what, seq), {}};
    h.lock = std::unique_lock<std::shared_mutex>(h.seq->mu);
    if (h.seq->removed) no_sequence(what, seq);
    return h;
}

std::vector<SequenceId> detail::CacheImpl::publish(std::vector<std::shared_ptr<detail::Sequence>>& fresh) {
    std::vector<SequenceId> ids;
    ids.reserve(fresh.size());
    std::map<SequenceId, std::shared_ptr<detail::Sequence>> added;
    size_t charged = 0;
    std::lock_guard<std::mutex> lock(seq_mu);
    for (auto& seq : fresh) {
        ids.push_back(next_id + static_cast<SequenceId>(ids.size()));
        charged += seq->charged;
        added.emplace(ids.back(), std::move(seq));
    }
    // ---- from here on nothing fails ----
    seqs.merge(added);
    next_id += static_cast<SequenceId>(ids.size());
    metadata_bytes += charged;
    return ids;
}

std::string detail::CacheImpl::dump() const {
    std::ostringstream os;
    const PoolStats ps = pool->stats();
    os << "KVCache: " << cfg.n_layers << " layer(s), " << cfg.n_heads << " query / " << cfg.n_kv_heads
       << " kv heads, head_dim " << cfg.head_dim
       << (cfg.head_dim_v != cfg.head_dim ? " (values " + std::to_string(cfg.head_dim_v) + ")" : std::string())
       << ", keys " << key_format->name() << ", values " << (latent() ? "the keys' leading values (latent)" : value.name()) << ", "
       << (kinds.size() > 1 ? std::to_string(kinds.size()) + " kinds of layer codecs, " : std::string())
       << cfg.block_tokens << " tokens/block, seal "
       << (cfg.seal == SealPolicy::on_append ? "on_append" : "on_block_full")
       << (cfg.exact_tail_tokens ? ", exact tail of " + std::to_string(cfg.exact_tail_tokens) + " tokens" : std::string())
       << (cfg.key_scales.empty() ? "" : ", key channel scales")
       << "\npool: " << ps.blocks_used << " of " << ps.blocks_total << " blocks used (" << ps.blocks_shared
       << " shared), max " << (ps.max_blocks ? std::to_string(ps.max_blocks) : std::string("unlimited")) << ", "
       << ps.block_bytes << " bytes/block\n";
    std::vector<std::pair<SequenceId, std::shared_ptr<detail::Sequence>>> all;
    {
        std::lock_guard<std::mutex> lock(seq_mu);
        all.assign(seqs.begin(), seqs.end());
    }
    for (const auto& [id, seq] : all) {
        std::shared_lock<std::shared_mutex> held(seq->mu);
        if (seq->removed) continue;
        os << "sequence " << id << ":\n";
        for (size_t l = 0; l < seq->layers.size(); ++l) {
            const auto& st = seq->layers[l];
            os << "  layer " << l << ": " << st.n_tokens << " tokens";
            if (st.first_pos) os << ", released below " << st.first_pos;
            if (st.staged) os << ", " << st.staged << " staged (float)";
            os << "; blocks [";
            for (size_t i = 0; i < st.table.size(); ++i) {
                const uint32_t refs = pool->ref_count(st.table[i].id);
                os << (i ? " " : "") << st.table[i].id;
                if (refs > 1) os << "x" << refs;
            }
            os << "]\n";
        }
    }
    return os.str();
}

// ---- public API ----

KVCache::KVCache(const CacheConfig& config) : impl_(std::make_unique<detail::CacheImpl>(config)) {}
KVCache::~KVCache() = default;
KVCache::KVCache(KVCache&&) noexcept = default;
KVCache& KVCache::operator=(KVCache&&) noexcept = default;

const CacheConfig& KVCache::config() const { return impl_->cfg; }
const Codec& KVCache::key_codec() const { return impl_->key; }
const Codec& KVCache::value_codec() const { return impl_->value; }
const Codec& KVCache::key_codec(int layer) const {
    impl_->check_layer("key_codec", layer);
    return impl_->kind(layer).key;
}
const Codec& KVCache::value_codec(int layer) const {
    impl_->check_layer("value_codec", layer);
    return impl_->kind(layer).value;
}
std::string KVCache::key_spec() const { return impl_->key_format->name(); }
std::string KVCache::key_spec(int layer) const {
    impl_->check_layer("key_spec", layer);
    return impl_->kind(layer).keys->name();
}

size_t detail::CacheImpl::sequence_metadata_bytes() const { return KVCache::sequence_bookkeeping_bytes(cfg.n_layers); }

size_t KVCache::sequence_bookkeeping_bytes(int n_layers) {
    // The sequence with its lock and shared_ptr count, its node in the id map and their allocations'
    // headers (about 128 bytes), and each layer's state.
    return sizeof(detail::Sequence) + 128 + static_cast<size_t>(std::max(n_layers, 0)) * sizeof(detail::LayerState);
}

SequenceId KVCache::add_sequence() {
    std::vector<std::shared_ptr<detail::Sequence>> fresh{std::make_shared<detail::Sequence>()};
    fresh[0]->layers.resize(impl_->cfg.n_layers);
    fresh[0]->charged = impl_->sequence_metadata_bytes();
    impl_->pool->charge_bookkeeping(fresh[0]->charged);
    try {
        return impl_->publish(fresh)[0];
    } catch (...) {
        impl_->pool->uncharge_bookkeeping(fresh[0]->charged);
        throw;
    }
}

void KVCache::remove(SequenceId seq) { impl_->remove(seq); }
SequenceId KVCache::fork(SequenceId parent) { return impl_->fork(parent); }
void KVCache::truncate(SequenceId seq, size_t n_tokens) { impl_->truncate(seq, n_tokens); }

void KVCache::append(int layer, SequenceId seq, const float* k, const float* v, size_t n_tokens) {
    impl_->append(layer, seq, k, v, n_tokens);
}

void KVCache::append(int layer, SequenceId seq, const uint16_t* k, const uint16_t* v, size_t n_tokens, HalfType type) {
    if (type != HalfType::f16 && type != HalfType::bf16) throw std::invalid_argument("KVCache::append: unknown HalfType");
    const size_t row = size_t(impl_->cfg.n_kv_heads) * size_t(impl_->cfg.head_dim);
    const size_t row_v = impl_->latent() ? 0 : size_t(impl_->cfg.n_kv_heads) * size_t(impl_->dv());
    // Before a value is read or a copy made: the halves, and their float copies, must be buffers that can exist.
    detail::check_buffer_sizes({{"k", detail::CheckedSize(n_tokens) * row * sizeof(float),
                                 "n_tokens x n_kv_heads x head_dim halves, converted to floats"},
                                {"v", detail::CheckedSize(n_tokens) * row_v * sizeof(float),
                                 "n_tokens x n_kv_heads x head_dim_v halves, converted to floats"}},
                               [&] { return "KVCache::append: n_tokens = " + std::to_string(n_tokens); });
    if (n_tokens > kMaxSequenceTokens) {
        throw std::invalid_argument("KVCache::append: " + std::to_string(n_tokens) + " tokens is beyond what a sequence holds");
    }
    if (n_tokens > 0 && (!k || (!v && !impl_->latent()))) throw std::invalid_argument("KVCache::append: k or v is null");
    if (v && impl_->latent()) {
        throw std::invalid_argument("KVCache::append: a latent cache (latent_values) takes v = null: its values are the keys' leading values");
    }
    std::vector<float> kf(n_tokens * row), vf(n_tokens * row_v);
    const auto convert = [type](const uint16_t* src, float* dst, size_t n) {
        for (size_t i = 0; i < n; ++i) dst[i] = type == HalfType::f16 ? detail::f16_to_f32(src[i]) : detail::bf16_to_f32(src[i]);
    };
    convert(k, kf.data(), kf.size());
    if (v) convert(v, vf.data(), vf.size());
    append(layer, seq, kf.data(), v ? vf.data() : nullptr, n_tokens);
}

void KVCache::attend(int layer, SequenceId seq, const float* q, float* out) const { impl_->attend(layer, seq, q, out); }

void KVCache::attend_prefill(int layer, SequenceId seq, const float* q, size_t n_queries, float* out) const {
    impl_->attend_prefill(layer, seq, q, n_queries, out);
}

void KVCache::attend_batch(int layer, std::span<const SequenceId> seqs, const float* q, float* out) const {
    impl_->attend_batch(layer, seqs, q, out);
}

size_t KVCache::n_tokens(SequenceId seq, int layer) const {
    impl_->check_layer("n_tokens", layer);
    return impl_->read("n_tokens", seq)->layers[layer].n_tokens;
}

std::vector<SequenceId> KVCache::sequences() const {
    std::lock_guard<std::mutex> lock(impl_->seq_mu);
    std::vector<SequenceId> ids;
    for (const auto& entry : impl_->seqs) ids.push_back(entry.first);
    return ids;
}

bool KVCache::contains(SequenceId seq) const {
    std::lock_guard<std::mutex> lock(impl_->seq_mu);
    return impl_->seqs.count(seq) != 0;
}

size_t KVCache::bytes_used() const {
    return impl_->pool->bytes_in_use() + impl_->staging_bytes.load() +
           impl_->metadata_bytes.load();
}

size_t KVCache::metadata_bytes() const { return impl_->metadata_bytes.load(); }

double KVCache::bytes_per_token() const {
    double total = 0;
    for (int l = 0; l < impl_->cfg.n_layers; ++l) total += bytes_per_token(l);
    return total;
}

double KVCache::bytes_per_token(int layer) const {
    impl_->check_layer("bytes_per_token", layer);
    const auto& c = impl_->cfg;
    const detail::LayerKind& k = impl_->kind(layer);
    const double per_head = k.keys->bytes_per_token() + (c.latent_values ? 0.0 : k.values->bytes_per_token());
    return per_head * c.n_kv_heads;
}

double KVCache::average_bytes_per_token(int layer, size_t n_tokens) const {
    const double sealed = bytes_per_token(layer);
    const size_t tail = std::min(n_tokens, static_cast<size_t>(impl_->cfg.exact_tail_tokens));
    if (tail == 0) return sealed;
    // The tail's rows as the staging holds them: a key row of head_dim values and, unless values are the
    // latent's leading values, a value row of head_dim_v.
    const double value_row = impl_->cfg.latent_values ? 0.0 : static_cast<double>(impl_->exact_v.row_bytes());
    const double exact = (static_cast<double>(impl_->exact.row_bytes()) + value_row) * impl_->cfg.n_kv_heads;
    return (static_cast<double>(n_tokens - tail) * sealed + static_cast<double>(tail) * exact) / static_cast<double>(n_tokens);
}

PoolStats KVCache::pool_stats() const { return impl_->pool->stats(); }
std::string KVCache::dump() const { return impl_->dump(); }

void detail::CacheImpl::convert_keys(const LayerKind& kind, uint8_t* block, bool to_file) const {
    if (kind.keys->rows_as_file()) return;
    for (int h = 0; h < cfg.n_kv_heads; ++h) kind.keys->convert_rows(kind.key_head(block, h).rows, to_file);
}

}  // namespace kvq
