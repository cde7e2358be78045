// KVCache operations: fork, truncate, remove, pool capacity and growth, accounting, and bad input —
// each failure must leave the cache exactly as it was.
#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "cache_model.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SealPolicy;
using kvq::test::LayerTokens;

namespace {

CacheConfig config(SealPolicy seal, int n_layers = 1) {
    CacheConfig cfg;
    cfg.n_layers = n_layers;
    cfg.n_kv_heads = 2;
    cfg.n_heads = 4;
    cfg.head_dim = 64;
    cfg.block_tokens = 16;
    cfg.seal = seal;
    return cfg;
}

constexpr size_t kRow = 2 * 64;  // floats per token (n_kv_heads × head_dim)

std::vector<float> attend(const KVCache& cache, kvq::SequenceId seq, const std::vector<float>& q, int layer = 0) {
    std::vector<float> out(q.size());
    cache.attend(layer, seq, q.data(), out.data());
    return out;
}

// Everything observable about a cache, to check that a failed call changed nothing.
struct Snapshot {
    std::string dump;
    size_t bytes;
    std::vector<kvq::SequenceId> seqs;
    std::vector<std::vector<float>> outs;
    explicit Snapshot(const KVCache& c, const std::vector<float>& q) : dump(c.dump()), bytes(c.bytes_used()), seqs(c.sequences()) {
        for (auto s : seqs) {
            if (c.n_tokens(s) > 0) outs.push_back(attend(c, s, q));
        }
    }
    bool operator==(const Snapshot&) const = default;
};

}  // namespace

TEST_CASE("fork shares blocks and a forked sequence diverges without touching its parent") {
    for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
        CAPTURE(static_cast<int>(seal));
        KVCache cache(config(seal));
        const auto parent = cache.add_sequence();
        std::vector<float> k, v;
        kvq::test::random_tokens(100, 2, 64, 1, k, v);
        cache.append(0, parent, k.data(), v.data(), 40);  // 2 full blocks + 8 tokens
        const auto q = kvq::test::gaussian(4 * 64, 2);
        const auto before = attend(cache, parent, q);
        const size_t used = cache.pool_stats().blocks_used;

        const auto child = cache.fork(parent);
        CHECK(cache.n_tokens(child) == 40);
        CHECK(cache.pool_stats().blocks_used == used);  // nothing copied yet
        CHECK(cache.pool_stats().blocks_shared == used);
        CHECK(attend(cache, child, q) == before);

        // The child writes into the partly filled block (copied on write) and beyond.
        cache.append(0, child, &k[40 * kRow], &v[40 * kRow], 30);
        CHECK(attend(cache, parent, q) == before);
        CHECK(cache.n_tokens(parent) == 40);
        // The parent diverges too, with other tokens.
        cache.append(0, parent, &k[70 * kRow], &v[70 * kRow], 5);

        const auto& c = cache.config();
        LayerTokens child_tok{2, 64}, parent_tok{2, 64};
        child_tok.add(k.data(), v.data(), 70);
        parent_tok.add(k.data(), v.data(), 40);
        parent_tok.add(&k[70 * kRow], &v[70 * kRow], 5);
        CHECK(kvq::test::max_rel_diff(attend(cache, child, q),
                                      kvq::test::expected_attention(cache, child_tok, 0, 70, kvq::test::sealed_end(c, 70), q.data())) <
              kvq::test::kFloatRounding);
        CHECK(kvq::test::max_rel_diff(attend(cache, parent, q),
                                      kvq::test::expected_attention(cache, parent_tok, 0, 45, kvq::test::sealed_end(c, 45), q.data())) <
              kvq::test::kFloatRounding);
        CHECK(cache.pool_stats().blocks_shared == 2);  // the two full blocks

        cache.remove(child);
        CHECK(cache.pool_stats().blocks_shared == 0);
        CHECK(kvq::test::max_rel_diff(attend(cache, parent, q),
                                      kvq::test::expected_attention(cache, parent_tok, 0, 45, kvq::test::sealed_end(c, 45), q.data())) <
              kvq::test::kFloatRounding);
    }
}

TEST_CASE("truncate keeps the first n tokens, appending afterwards continues from there") {
    for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
        for (size_t keep : {size_t(0), size_t(16), size_t(21), size_t(40), size_t(44)}) {
            CAPTURE(static_cast<int>(seal));
            CAPTURE(keep);
            KVCache cache(config(seal, 2));
            const auto seq = cache.add_sequence();
            std::vector<float> k, v;
            kvq::test::random_tokens(90, 2, 64, 3, k, v);
            cache.append(0, seq, k.data(), v.data(), 45);
            cache.append(1, seq, k.data(), v.data(), 30);
            const size_t used_before = cache.pool_stats().blocks_used;
            cache.truncate(seq, keep);
            CHECK(cache.n_tokens(seq, 0) == keep);
            CHECK(cache.n_tokens(seq, 1) == std::min<size_t>(keep, 30));
            CHECK(cache.pool_stats().blocks_used <= used_before);

            cache.append(0, seq, &k[60 * kRow], &v[60 * kRow], 30);
            LayerTokens tok{2, 64};
            tok.add(k.data(), v.data(), keep);
            tok.add(&k[60 * kRow], &v[60 * kRow], 30);
            const auto& c = cache.config();
            // A truncate into a sealed block leaves it sealed: its remaining rows are quantized as they
            // arrive, so quantized rows end at the later of that block's end and the usual boundary.
            size_t sealed = kvq::test::sealed_end(c, tok.n());
            if (seal == SealPolicy::on_block_full && keep < 32 && keep % 16) sealed = std::max(sealed, (keep / 16 + 1) * size_t(16));
            const auto q = kvq::test::gaussian(4 * 64, 4);
            CHECK(kvq::test::max_rel_diff(attend(cache, seq, q), kvq::test::expected_attention(cache, tok, 0, tok.n(), sealed, q.data())) <
                  kvq::test::kFloatRounding);
        }
    }
}

TEST_CASE("remove returns every block to the pool") {
    KVCache cache(config(SealPolicy::on_append));
    const auto a = cache.add_sequence(), b = cache.add_sequence();
    std::vector<float> k, v;
    kvq::test::random_tokens(50, 2, 64, 5, k, v);
    cache.append(0, a, k.data(), v.data(), 50);
    const size_t after_a = cache.pool_stats().blocks_used;
    cache.append(0, b, k.data(), v.data(), 20);
    const auto c = cache.fork(b);
    cache.remove(b);
    CHECK(cache.pool_stats().blocks_used == after_a + 2);  // c still holds b's blocks
    cache.remove(c);
    CHECK(cache.pool_stats().blocks_used == after_a);
    CHECK_FALSE(cache.contains(b));
    CHECK(cache.sequences() == std::vector<kvq::SequenceId>{a});
    CHECK_THROWS_AS(cache.remove(b), std::invalid_argument);
    CHECK_THROWS_AS(cache.append(0, c, k.data(), v.data(), 1), std::invalid_argument);
    cache.remove(a);
    CHECK(cache.pool_stats().blocks_used == 0);
    CHECK(cache.bytes_used() == 0);
}

// Blocks' worth of pool capacity one layer's float staging takes (SealPolicy::on_block_full).
size_t staging_units(const CacheConfig& cfg) {
    CacheConfig probe = cfg;
    probe.max_blocks = 0;
    probe.seal = SealPolicy::on_block_full;
    KVCache c(probe);
    const auto s = c.add_sequence();
    std::vector<float> k(static_cast<size_t>(probe.n_kv_heads) * probe.head_dim, 0.5f);
    c.append(0, s, k.data(), k.data(), 1);
    return c.pool_stats().blocks_reserved;
}

TEST_CASE("a full pool throws PoolExhausted and leaves every sequence unchanged") {
    for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
        CAPTURE(static_cast<int>(seal));
        CacheConfig cfg = config(seal);
        // 6 blocks, plus (on_block_full) the float staging of a's and b's open blocks, which counts
        // against max_blocks in blocks' worth of bytes.
        const size_t units = seal == SealPolicy::on_block_full ? staging_units(cfg) : 0;
        cfg.max_blocks = 6 + 2 * units;
        cfg.grow_blocks = 4;
        KVCache cache(cfg);
        const auto a = cache.add_sequence(), b = cache.add_sequence();
        std::vector<float> k, v;
        kvq::test::random_tokens(100, 2, 64, 7, k, v);
        cache.append(0, a, k.data(), v.data(), 40);
        cache.append(0, b, k.data(), v.data(), 20);
        const auto q = kvq::test::gaussian(4 * 64, 8);
        const Snapshot before(cache, q);
        // b needs 5 more blocks for tokens 20..99; at most 3 are left.
        CHECK_THROWS_AS(cache.append(0, b, &k[20 * kRow], &v[20 * kRow], 80), kvq::PoolExhausted);
        CHECK(Snapshot(cache, q) == before);
        CHECK(cache.n_tokens(b) == 20);
        // A forked partly filled block must be copied before a write, which also needs a block.
        if (seal == SealPolicy::on_append) {
            const auto c = cache.fork(b);
            cache.append(0, a, &k[40 * kRow], &v[40 * kRow], 9);  // takes the last free block
            const Snapshot full(cache, q);
            CHECK_THROWS_AS(cache.append(0, c, k.data(), v.data(), 1), kvq::PoolExhausted);
            CHECK(Snapshot(cache, q) == full);
        }
        // The capacity is what was asked for: after a remove, the same append succeeds.
        cache.remove(a);
        cache.append(0, b, &k[20 * kRow], &v[20 * kRow], 40);
        CHECK(cache.n_tokens(b) == 60);
        CHECK(cache.pool_stats().blocks_total <= 6 + units);
        CHECK(cache.pool_stats().blocks_used + cache.pool_stats().blocks_reserved <= cfg.max_blocks);
    }
}

TEST_CASE("a windowed layer runs with exactly the blocks its window needs") {
    CacheConfig cfg = config(SealPolicy::on_append);
    cfg.sliding_window = {32};
    cfg.max_blocks = 4;  // 32 tokens span at most 3 blocks of 16, plus one block of slack
    KVCache cache(cfg);
    const auto seq = cache.add_sequence();
    std::vector<float> k, v;
    kvq::test::random_tokens(200, 2, 64, 9, k, v);
    for (size_t t = 0; t < 200; ++t) cache.append(0, seq, &k[t * kRow], &v[t * kRow], 1);
    CHECK(cache.n_tokens(seq) == 200);
    // A batch keeps every block its own prefill needs until the next append: 200 more tokens need 13
    // blocks, more than the pool has; refused, nothing changed. Token by token it runs in the window's
    // blocks (a chunk of c tokens needs the blocks of w + c - 1 tokens, plus the slack).
    CHECK_THROWS_AS(cache.append(0, seq, k.data(), v.data(), 200), kvq::PoolExhausted);
    CHECK(cache.n_tokens(seq) == 200);
    for (size_t t = 0; t < 200; ++t) cache.append(0, seq, &k[t * kRow], &v[t * kRow], 1);
    CHECK(cache.pool_stats().blocks_used <= 4);
    // Truncating into tokens the window has released is refused, and changes nothing.
    const auto q = kvq::test::gaussian(4 * 64, 10);
    const Snapshot before(cache, q);
    CHECK_THROWS_AS(cache.truncate(seq, 300), std::invalid_argument);
    CHECK(Snapshot(cache, q) == before);
    cache.truncate(seq, 400 - 16);  // going back one block always works
    CHECK(cache.n_tokens(seq) == 384);
    cache.append(0, seq, k.data(), v.data(), 16);
    LayerTokens tok{2, 64};
    tok.add(k.data(), v.data(), 200);
    tok.add(k.data(), v.data(), 200);
    tok.truncate(384);
    tok.add(k.data(), v.data(), 16);
    CHECK(kvq::test::max_rel_diff(attend(cache, seq, q), kvq::test::expected_attention(cache, tok, 400 - 32, 400, 400, q.data())) <
          kvq::test::kFloatRounding);
}

TEST_CASE("the pool grows in chunks and counts bytes honestly") {
    CacheConfig cfg = config(SealPolicy::on_block_full, 2);
    cfg.key_codec = "q8_0";
    cfg.value_codec = "q4_0";
    cfg.initial_blocks = 2;
    cfg.grow_blocks = 5;
    KVCache cache(cfg);
    CHECK(cache.pool_stats().blocks_total == 2);
    CHECK(cache.bytes_per_token() == doctest::Approx(2 * 2 * (68 + 36)));
    const auto seq = cache.add_sequence();
    std::vector<float> k, v;
    kvq::test::random_tokens(100, 2, 64, 11, k, v);
    cache.append(0, seq, k.data(), v.data(), 50);  // 3 sealed blocks + 2 staged float rows
    const auto ps = cache.pool_stats();
    CHECK(ps.blocks_total == 7);
    CHECK(ps.blocks_used == 3);
    CHECK(ps.block_bytes >= 2 * 16 * (68 + 36));
    const size_t staging = 2 * 2 * 16 * 64 * sizeof(float);  // float K and V of one open block
    CHECK(cache.bytes_used() == 3 * ps.block_bytes + staging + cache.metadata_bytes());
    cache.append(1, seq, k.data(), v.data(), 1);
    CHECK(cache.bytes_used() == 3 * ps.block_bytes + 2 * staging + cache.metadata_bytes());
    const std::string dump = cache.dump();
    CHECK(dump.find("sequence 0") != std::string::npos);
    CHECK(dump.find("2 staged") != std::string::npos);

    cfg.center_keys = true;
    CHECK(KVCache(cfg).bytes_per_token() == doctest::Approx(2 * 2 * (68 + 36 + 64 * 2.0 / 16)));
}

TEST_CASE("bad arguments throw invalid_argument and change nothing") {
    KVCache cache(config(SealPolicy::on_block_full, 2));
    const auto seq = cache.add_sequence();
    std::vector<float> k, v;
    kvq::test::random_tokens(20, 2, 64, 13, k, v);
    cache.append(0, seq, k.data(), v.data(), 20);
    auto q = kvq::test::gaussian(4 * 64, 14);
    std::vector<float> out(q.size());
    const Snapshot before(cache, q);

    CHECK_THROWS_AS(cache.append(2, seq, k.data(), v.data(), 1), std::invalid_argument);
    CHECK_THROWS_AS(cache.append(-1, seq, k.data(), v.data(), 1), std::invalid_argument);
    CHECK_THROWS_AS(cache.append(0, 99, k.data(), v.data(), 1), std::invalid_argument);
    CHECK_THROWS_AS(cache.append(0, seq, nullptr, v.data(), 1), std::invalid_argument);
    CHECK_THROWS_AS(cache.attend(0, 99, q.data(), out.data()), std::invalid_argument);
    CHECK_THROWS_AS(cache.attend(5, seq, q.data(), out.data()), std::invalid_argument);
    CHECK_THROWS_AS(cache.attend(1, seq, q.data(), out.data()), std::invalid_argument);  // layer 1 is empty
    CHECK_THROWS_AS(cache.attend(0, seq, q.data(), nullptr), std::invalid_argument);
    CHECK_THROWS_AS(cache.attend_prefill(0, seq, q.data(), 21, out.data()), std::invalid_argument);
    CHECK_THROWS_AS(cache.truncate(seq, 21), std::invalid_argument);
    CHECK_THROWS_AS(cache.truncate(42, 0), std::invalid_argument);
    CHECK_THROWS_AS(cache.fork(42), std::invalid_argument);
    CHECK_THROWS_AS(cache.n_tokens(seq, 2), std::invalid_argument);

    // NaN/Inf under the default policy (reject): in the last token of a batch, in a query.
    auto bad_k = k;
    bad_k[19 * kRow + 70] = NAN;
    CHECK_THROWS_WITH_AS(cache.append(0, seq, bad_k.data(), v.data(), 20), doctest::Contains("token 19, kv head 1"),
                         std::invalid_argument);
    auto bad_v = v;
    bad_v[3] = INFINITY;
    CHECK_THROWS_AS(cache.append(0, seq, k.data(), bad_v.data(), 5), std::invalid_argument);
    auto bad_q = q;
    bad_q[100] = NAN;
    CHECK_THROWS_AS(cache.attend(0, seq, bad_q.data(), out.data()), std::invalid_argument);
    CHECK_THROWS_AS(cache.attend_prefill(0, seq, bad_q.data(), 1, out.data()), std::invalid_argument);
    CHECK(Snapshot(cache, q) == before);
}

TEST_CASE("bad configurations are rejected with a message naming the problem") {
    auto rejects = [](auto edit, const char* words) {
        CacheConfig cfg = config(SealPolicy::on_block_full);
        edit(cfg);
        CHECK_THROWS_WITH_AS(KVCache{cfg}, doctest::Contains(words), std::invalid_argument);
    };
    rejects([](CacheConfig& c) { c.n_heads = 3; }, "multiple of n_kv_heads");
    rejects([](CacheConfig& c) { c.n_layers = 0; }, "n_layers");
    rejects([](CacheConfig& c) { c.n_kv_heads = 0; }, "n_kv_heads");
    rejects([](CacheConfig& c) { c.block_tokens = 0; }, "block_tokens");
    rejects([](CacheConfig& c) { c.sliding_window = {1, 2}; }, "sliding_window");
    rejects([](CacheConfig& c) { c.sliding_window = {-1}; }, "sliding_window");
    rejects([](CacheConfig& c) { c.key_codec = "q9_9"; }, "unknown codec");
    rejects([](CacheConfig& c) { c.head_dim = 48; }, "multiple of 32");
    rejects([](CacheConfig& c) { c.max_blocks = 2, c.initial_blocks = 3; }, "initial_blocks");
    rejects([](CacheConfig& c) { c.softcap = -1; }, "softcap");
    rejects([](CacheConfig& c) { c.scale = NAN; }, "scale");
    rejects([](CacheConfig& c) { c.threads = 0; }, "threads");
    rejects([](CacheConfig& c) { c.center_keys = true, c.seal = SealPolicy::on_append; }, "center_keys");
}

TEST_CASE("NanPolicy::propagate stores non-finite input and returns NaN only for the heads that read it") {
    for (const auto& codecs : std::vector<std::pair<std::string, std::string>>{{"q8_0", "q4_0"}, {"f16", "f32"}}) {
        // (no structured bindings: Clang 14 cannot capture them in CAPTURE's lambda)
        const std::string &kc = codecs.first, &vc = codecs.second;
        for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
            CAPTURE(kc);
            CacheConfig cfg = config(seal);
            cfg.key_codec = kc;
            cfg.value_codec = vc;
            cfg.nan_policy = kvq::NanPolicy::propagate;
            cfg.sliding_window = {20};
            KVCache cache(cfg);
            const auto seq = cache.add_sequence();
            std::vector<float> k, v;
            kvq::test::random_tokens(80, 2, 64, 15, k, v);
            k[5 * kRow + 64 + 3] = NAN;  // token 5, kv head 1
            cache.append(0, seq, k.data(), v.data(), 10);
            auto q = kvq::test::gaussian(4 * 64, 16);
            auto out = attend(cache, seq, q);
            for (int i = 0; i < 4 * 64; ++i) CHECK(std::isnan(out[i]) == (i >= 128));  // heads 2, 3 use kv head 1
            // Once the window has moved past token 5, every head is finite again.
            cache.append(0, seq, &k[10 * kRow], &v[10 * kRow], 60);
            out = attend(cache, seq, q);
            for (float x : out) CHECK(std::isfinite(x));
            q[0] = INFINITY;  // query head 0
            out = attend(cache, seq, q);
            for (int i = 0; i < 4 * 64; ++i) CHECK(std::isnan(out[i]) == (i < 64));
        }
    }
}
