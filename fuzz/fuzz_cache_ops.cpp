// Fuzz target: random sequences of cache operations (add, append from the input's values or from a seed,
// fork, truncate, remove, attend, and the hostile ones: appends of token counts whose sizes overflow,
// attends with queries of ~1e38) on a small cache with a pool limit, checked against a reference model
// that keeps every sequence's tokens as floats and knows which are quantized (tests/cache_model.hpp
// computes the attention they must give).
// Properties: attention equals the model's to float rounding; token counts and sequence ids match; an
// operation that throws PoolExhausted (add_sequence too: bookkeeping counts against the limits) changes
// nothing observable; removing every sequence returns every
// block to the pool (and LeakSanitizer finds no leak); an overflowing append is refused before it reads
// and changes nothing; a finite query gives a finite output.
// The model header is shared with the doctest suite; here its doctest parts compile to nothing.
#define DOCTEST_CONFIG_DISABLE
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <stdexcept>
#include <string_view>

#include "cache_model.hpp"
#include "fuzz_common.hpp"

using namespace kvq;
using namespace kvq::fuzz;

namespace {

struct ModelLayer {
    test::LayerTokens tok;
    size_t pool_end = 0;  // positions below are quantized (a prefix; see lib/cache/cache_impl.hpp)
};
using ModelSeq = std::vector<ModelLayer>;

std::string observe(const KVCache& c, const std::map<SequenceId, ModelSeq>& model, const std::vector<float>& q) {
    std::string s = c.dump() + std::to_string(c.bytes_used());
    for (const auto& [id, layers] : model) {
        for (size_t l = 0; l < layers.size(); ++l) {
            if (layers[l].tok.n() == 0) continue;
            std::vector<float> out(q.size());
            c.attend(static_cast<int>(l), id, q.data(), out.data());
            s.append(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float));
        }
    }
    return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    static const char* codecs[] = {"q8_0", "q4_0", "f16", "q4_1+rot", "polar", "turbo3", "tcq3"};
    // Keys may also be per-channel (chanB), which a cache holds only when it seals a block at a time.
    static const char* key_codecs[] = {"q8_0", "q4_0", "f16", "q4_1+rot", "polar", "turbo3", "tcq3", "chan3", "chan8"};
    CacheConfig cfg;
    cfg.n_layers = in.ConsumeIntegralInRange<int>(1, 2);
    cfg.n_kv_heads = in.ConsumeIntegralInRange<int>(1, 2);
    // 4 queries per kv head and 16-token blocks: the cache keeps sealed q8_0 keys in groups of 16 rows
    // where the level has a kernel for them (lib/ref/key_groups.hpp). A zero byte picks the first choice,
    // as before these were added (the seeds' configurations).
    static const int gqa[] = {1, 2, 4}, block_tokens[] = {8, 4, 16};
    cfg.n_heads = cfg.n_kv_heads * gqa[in.ConsumeIntegralInRange<size_t>(0, std::size(gqa) - 1)];
    cfg.head_dim = 32;
    cfg.key_codec = key_codecs[in.ConsumeIntegralInRange<size_t>(0, std::size(key_codecs) - 1)];
    cfg.value_codec = codecs[in.ConsumeIntegralInRange<size_t>(0, std::size(codecs) - 1)];
    cfg.block_tokens = block_tokens[in.ConsumeIntegralInRange<size_t>(0, std::size(block_tokens) - 1)];
    cfg.seal = in.ConsumeBool() ? SealPolicy::on_append : SealPolicy::on_block_full;
    // Layer 1 may have codecs of its own (blocks of another size in the same pool).
    if (cfg.n_layers == 2 && in.ConsumeBool()) {
        cfg.layer_codecs = {{}, {key_codecs[in.ConsumeIntegralInRange<size_t>(0, std::size(key_codecs) - 1)],
                                 codecs[in.ConsumeIntegralInRange<size_t>(0, std::size(codecs) - 1)]}};
    }
    bool per_channel = std::string_view(cfg.key_codec).starts_with("chan");
    for (const auto& lc : cfg.layer_codecs) per_channel |= lc.key.starts_with("chan");
    if (per_channel && cfg.seal == SealPolicy::on_append) {  // refused, as it must be; then sealed per block
        bool refused = false;
        try {
            KVCache refused_cache(cfg);
        } catch (const BadParams&) {
            refused = true;
        }
        require(refused, "chanB keys were accepted with SealPolicy::on_append");
        cfg.seal = SealPolicy::on_block_full;
    }
    cfg.max_blocks = in.ConsumeIntegralInRange<size_t>(0, 12);
    // A byte limit: 0, or up to about twelve blocks of the largest kind.
    cfg.max_bytes = in.ConsumeIntegralInRange<size_t>(0, 12) * 4096;
    cfg.grow_blocks = in.ConsumeIntegralInRange<size_t>(1, 4);
    KVCache cache(cfg);
    const int d = cfg.head_dim, n_kv = cfg.n_kv_heads;
    const size_t bt = cfg.block_tokens;
    const size_t token_floats = size_t(n_kv) * d;
    std::vector<float> q(size_t(cfg.n_heads) * d);
    for (float& x : q) x = in.ConsumeFloatingPointInRange<float>(-2.0f, 2.0f);

    std::map<SequenceId, ModelSeq> model;
    auto pick = [&]() -> SequenceId {
        if (model.empty()) return -1;
        auto it = model.begin();
        std::advance(it, in.ConsumeIntegralInRange<size_t>(0, model.size() - 1));
        return it->first;
    };
    for (int step = 0; step < 40 && in.remaining_bytes() > 0; ++step) {
        const int op = in.ConsumeIntegralInRange<int>(0, 8);  // 8 came last: ops 0-7 read as they did
        const SequenceId id = pick();
        const int layer = in.ConsumeIntegralInRange<int>(0, cfg.n_layers - 1);
        if (op == 0 || id < 0) {
            // Its bookkeeping counts against the limits (issue #36): refused in full, nothing changed.
            const auto before_add = observe(cache, model, q);
            SequenceId s;
            try {
                s = cache.add_sequence();
            } catch (const PoolExhausted&) {
                require(cfg.max_blocks > 0 || cfg.max_bytes > 0, "PoolExhausted from a pool without a limit");
                require(observe(cache, model, q) == before_add, "a refused add_sequence changed the cache");
                if (model.empty()) break;  // nothing else to do
                continue;
            }
            require(!model.count(s), "add_sequence reused a live id");
            model.emplace(s, ModelSeq(cfg.n_layers, ModelLayer{test::LayerTokens(n_kv, d)}));
            continue;
        }
        ModelLayer& ml = model.at(id)[layer];
        const std::string before = observe(cache, model, q);
        try {
            if (op == 1 || op == 8) {
                // op 8: up to 40 tokens drawn from a seed, so that inputs of a few bytes fill and seal blocks
                // of 16 tokens (op 1 takes each value from the input).
                const size_t n = in.ConsumeIntegralInRange<size_t>(1, op == 1 ? 12 : 40);
                std::vector<float> k(n * token_floats), v(n * token_floats);
                if (op == 1) {
                    for (float& x : k) x = in.ConsumeFloatingPointInRange<float>(-4.0f, 4.0f);
                    for (float& x : v) x = in.ConsumeFloatingPointInRange<float>(-4.0f, 4.0f);
                } else {
                    std::mt19937 rng(in.ConsumeIntegral<uint32_t>());
                    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
                    for (float& x : k) x = u(rng);
                    for (float& x : v) x = u(rng);
                }
                cache.append(layer, id, k.data(), v.data(), n);
                const int chan = test::channel_bits(cache.key_codec(layer));
                if (chan && ml.pool_end % bt) {  // a chanB block re-opened by a truncate goes back to the staging
                    ml.tok.restage_channels(ml.pool_end / bt, bt, ml.pool_end, chan, cache.value_codec(layer));
                    ml.pool_end = ml.pool_end / bt * bt;
                }
                const size_t old_n = ml.tok.n(), n_final = old_n + n, old_pool_end = ml.pool_end;
                ml.tok.add(k.data(), v.data(), n);
                if (cfg.seal == SealPolicy::on_append) {
                    ml.pool_end = n_final;
                } else {  // a block partly filled after a truncate (keys of rows) is quantized as it fills, then staging
                    const size_t boundary = (ml.pool_end + bt - 1) / bt * bt;
                    ml.pool_end = ml.pool_end % bt && n_final <= boundary ? n_final : std::max(boundary, n_final / bt * bt);
                }
                // chanB: the blocks sealed from staging by this append fix their minimums and steps.
                if (chan) {
                    for (size_t b = (old_pool_end + bt - 1) / bt; (b + 1) * bt <= ml.pool_end; ++b) ml.tok.seal_channels(b, bt, chan);
                }
            } else if (op == 2) {
                const SequenceId child = cache.fork(id);
                require(!model.count(child), "fork reused a live id");
                model.emplace(child, model.at(id));
            } else if (op == 3) {
                size_t shortest = SIZE_MAX;  // truncate applies to every layer
                for (const auto& l : model.at(id)) shortest = std::min(shortest, l.tok.n());
                const size_t n = in.ConsumeIntegralInRange<size_t>(0, shortest);
                cache.truncate(id, n);
                for (auto& l : model.at(id)) {
                    const size_t keep = std::min(n, l.tok.n());
                    l.tok.truncate(keep);
                    l.pool_end = std::min(l.pool_end, keep);
                    std::erase_if(l.tok.chan_params, [&](const auto& e) { return e.first * bt >= l.pool_end; });
                }
            } else if (op == 4) {
                cache.remove(id);
                model.erase(id);
            } else if (op == 6) {
                // A token count no buffer can hold (its byte size overflows), or one past the most tokens a
                // layer takes: refused before a value is read (the buffers hold one token), nothing changed.
                const size_t huge[] = {SIZE_MAX, SIZE_MAX / token_floats + 1, size_t(1) << 62,
                                       size_t(PTRDIFF_MAX) / (token_floats * sizeof(float)) + 1,
                                       kMaxSequenceTokens - ml.tok.n() + 1};
                const size_t n = huge[in.ConsumeIntegralInRange<size_t>(0, std::size(huge) - 1)];
                std::vector<float> k(token_floats, 1.0f), v(token_floats, 1.0f);
                bool refused = false;
                try {
                    cache.append(layer, id, k.data(), v.data(), n);
                } catch (const std::invalid_argument&) {
                    refused = true;
                }
                require(refused, "append of " + std::to_string(n) + " tokens from a one-token buffer was not refused");
                require(observe(cache, model, q) == before, "a refused append changed the cache");
            } else if (op == 7 && ml.tok.n() > 0) {
                // A finite query whose float scores overflow: the output is finite all the same.
                std::vector<float> big(q.size()), out(q.size());
                const float scale = in.ConsumeFloatingPointInRange<float>(1e30f, 3e38f);
                for (size_t i = 0; i < q.size(); ++i) big[i] = std::clamp(q[i] * scale, -3.4e38f, 3.4e38f);
                cache.attend(layer, id, big.data(), out.data());
                for (float x : out) require(std::isfinite(x), "a finite query of ~1e38 gave a non-finite output");
            } else if (op == 5 && ml.tok.n() > 0) {
                std::vector<float> out(q.size());
                cache.attend(layer, id, q.data(), out.data());
                const auto expected = test::expected_attention(cache, ml.tok, 0, ml.tok.n(), ml.pool_end, q.data(), layer);
                const double diff = test::max_rel_diff(out, expected);
                require(diff <= 1e-4, "attend differs from the model by " + std::to_string(diff) + "\n" + cache.dump());
            }
        } catch (const PoolExhausted&) {
            require(cfg.max_blocks > 0 || cfg.max_bytes > 0, "PoolExhausted from a pool without a limit");
            require(observe(cache, model, q) == before, "PoolExhausted changed the cache");
        }
        for (const auto& [s, layers] : model) {
            for (int l = 0; l < cfg.n_layers; ++l) {
                require(cache.n_tokens(s, l) == layers[l].tok.n(), "n_tokens differs from the model");
            }
        }
        require(cache.sequences().size() == model.size(), "sequences() differs from the model");
        const PoolStats ps = cache.pool_stats();
        // Memory within the limits: the allocated blocks and the open blocks' float staging together.
        require(cfg.max_blocks == 0 || ps.blocks_total + ps.blocks_reserved <= cfg.max_blocks,
                "blocks and staging hold more than max_blocks");
        require(cfg.max_bytes == 0 || ps.bytes_total + ps.bytes_reserved + cache.metadata_bytes() <= cfg.max_bytes,
                "blocks, staging and bookkeeping hold more than max_bytes");
        require(cache.bytes_used() - cache.metadata_bytes() == ps.bytes_used + ps.bytes_reserved,
                "bytes_used is not the blocks in use and the staging (bookkeeping aside)");
        require(cfg.max_blocks == 0 || !cfg.layer_codecs.empty() ||
                    cache.bytes_used() - cache.metadata_bytes() <= cfg.max_blocks * ps.block_bytes,
                "bytes_used beyond max_blocks × block_bytes (bookkeeping aside)");
    }

    for (const auto& [s, layers] : model) cache.remove(s);
    require(cache.pool_stats().blocks_used == 0, "blocks still used after every sequence was removed");
    require(cache.pool_stats().blocks_reserved == 0, "staging still counted after every sequence was removed");
    require(cache.bytes_used() == 0, "bytes still used after every sequence was removed");
    return 0;
}
