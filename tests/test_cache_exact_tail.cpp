// The exact tail (CacheConfig::exact_tail_tokens = T, issue #39): the last T tokens of every sequence and
// layer stay in the staging precision and a block is sealed only once all its tokens are more than T
// tokens old. Attention (attend, attend_prefill, attend_batch) must equal the model of tests/cache_model.hpp
// where exactly those blocks are quantized (built from the codecs' quantize/dequantize) and the rest is
// exact: a tail read quantized, or a block sealed too early or too late, is off by ~1e-2, far above float
// rounding. Then truncate, fork, save/load, windows, limits and the bytes the tail costs.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cache_file_util.hpp"
#include "cache_model.hpp"
#include "kvq/errors.hpp"

using kvq::test::LayerTokens;

namespace {

constexpr int kKv = 2, kHeads = 4, kDim = 64, kBlock = 16;

CacheConfig tail_config(const std::string& kc, const std::string& vc, int tail) {
    CacheConfig cfg;
    cfg.n_kv_heads = kKv;
    cfg.n_heads = kHeads;
    cfg.head_dim = kDim;
    cfg.key_codec = kc;
    cfg.value_codec = vc;
    cfg.block_tokens = kBlock;
    cfg.exact_tail_tokens = tail;
    return cfg;
}

constexpr size_t kRow = size_t(kKv) * kDim;

// One sequence's tokens in every layer of a cache and the model of what is sealed (positions below
// `sealed` are quantized), kept in step with the cache by append and truncate.
struct Tracked {
    KVCache& cache;
    SequenceId seq;
    std::vector<LayerTokens> tok;
    size_t sealed = 0;
    bool reopened = false;  // a truncate cut into a sealed block: the next append restages its rows

    Tracked(KVCache& c, SequenceId s) : cache(c), seq(s) {
        tok.assign(static_cast<size_t>(c.config().n_layers), LayerTokens{kKv, kDim});
    }
    size_t n() const { return tok[0].n(); }

    // Row codecs without centering here: with a tail, a re-opened block's rows go back to the staging as
    // they read (dequantized); without one, new rows are quantized into it as they arrive.
    void append(const float* k, const float* v, size_t count) {
        const auto& cfg = cache.config();
        const size_t bt = cfg.block_tokens;
        const bool restages = cfg.exact_tail_tokens > 0;
        if (reopened && restages) {
            for (int l = 0; l < cfg.n_layers; ++l) restage(l, sealed / bt * bt, n());
            sealed = sealed / bt * bt;
        }
        const size_t before = sealed;
        for (int l = 0; l < cfg.n_layers; ++l) {
            cache.append(l, seq, k, v, count);
            tok[l].add(k, v, count);
        }
        if (reopened && !restages) sealed = std::min(n(), (sealed + bt - 1) / bt * bt);
        reopened = false;
        sealed = std::max(sealed, kvq::test::sealed_end(cfg, n()));
        for (int l = 0; l < cfg.n_layers; ++l) {  // per-channel keys: each new block's minimums and steps
            const int bits = kvq::test::channel_bits(cache.key_codec(l));
            for (size_t b = before / bt; bits && b < sealed / bt; ++b) tok[l].seal_channels(b, bt, bits);
        }
    }
    void truncate(size_t count) {
        cache.truncate(seq, count);
        for (auto& t : tok) t.truncate(count);
        if (count < sealed) {
            sealed = count;
            reopened = count % cache.config().block_tokens != 0;
        }
    }
    void restage(int layer, size_t from, size_t to) {
        const kvq::Codec& kc = cache.key_codec(layer);
        const kvq::Codec& vc = cache.value_codec(layer);
        std::vector<uint8_t> kb(kc.row_bytes()), vb(vc.row_bytes());
        LayerTokens& t = tok[layer];
        for (size_t p = from; p < to; ++p) {
            for (int h = 0; h < kKv; ++h) {
                kc.quantize_rows(t.krow(p, h), 1, kb.data());
                kc.dequantize_rows(kb.data(), 1, &t.k[(p * kKv + h) * kDim]);
                vc.quantize_rows(t.vrow(p, h), 1, vb.data());
                vc.dequantize_rows(vb.data(), 1, &t.v[(p * kKv + h) * kDim]);
            }
        }
    }

    // Decode attention of every layer against the model; returns the worst difference.
    double check_decode(const std::vector<float>& q) const {
        double worst = 0;
        std::vector<float> out(q.size());
        for (int l = 0; l < cache.config().n_layers; ++l) {
            cache.attend(l, seq, q.data(), out.data());
            const size_t w = cache.config().sliding_window.empty() ? 0 : cache.config().sliding_window[l];
            const size_t lo = w && n() > w ? n() - w : 0;
            worst = std::max(worst, kvq::test::max_rel_diff(out, kvq::test::expected_attention(cache, tok[l], lo, n(), sealed, q.data(), l)));
        }
        return worst;
    }
    // Prefill attention of the last m tokens of layer 0 against the model.
    double check_prefill(size_t m, uint64_t seed) const {
        const size_t vec = size_t(kHeads) * kDim;
        const auto q = kvq::test::gaussian(m * vec, seed, 1.5f);
        std::vector<float> out(q.size());
        cache.attend_prefill(0, seq, q.data(), m, out.data());
        double worst = 0;
        const size_t w = cache.config().sliding_window.empty() ? 0 : cache.config().sliding_window[0];
        for (size_t i = 0; i < m; ++i) {
            const size_t p = n() - m + i;
            const size_t lo = w && p + 1 > w ? p + 1 - w : 0;
            const auto want = kvq::test::expected_attention(cache, tok[0], lo, p + 1, sealed, &q[i * vec]);
            worst = std::max(worst, kvq::test::max_rel_diff(std::vector<float>(&out[i * vec], &out[(i + 1) * vec]), want));
        }
        return worst;
    }
};

std::vector<float> decode(const KVCache& c, SequenceId s, const std::vector<float>& q, int layer = 0) {
    std::vector<float> out(q.size());
    c.attend(layer, s, q.data(), out.data());
    return out;
}

}  // namespace

TEST_CASE("exact tail: attention reads the last T tokens exactly and the older full blocks quantized") {
    struct Case {
        std::string key, value;
        bool center;
        kvq::StagingType staging;
    };
    const std::vector<Case> cases = {
        {"q4_0", "q4_0", false, kvq::StagingType::f32},  {"q4_0+rot", "q4_0", true, kvq::StagingType::f32},
        {"q8_0", "q4_0", false, kvq::StagingType::f16},  {"chan4", "q4_0", false, kvq::StagingType::f32},
        {"turbo4", "turbo4", false, kvq::StagingType::f32},
    };
    for (const auto& c : cases) {
        for (const int tail : {0, 1, 15, 16, 17, 40, 100}) {
            for (const size_t chunk : {size_t(1), size_t(7), size_t(33)}) {
                CAPTURE(c.key);
                CAPTURE(c.center);
                CAPTURE(tail);
                CAPTURE(chunk);
                CacheConfig cfg = tail_config(c.key, c.value, tail);
                cfg.center_keys = c.center;
                cfg.staging = c.staging;
                cfg.scale = 0.3f;  // sharp attention: a quantized tail row shows
                KVCache cache(cfg);
                Tracked t(cache, cache.add_sequence());
                std::vector<float> k, v;
                kvq::test::random_tokens(150, kKv, kDim, 11 + tail, k, v, 1.0f);
                if (c.staging == kvq::StagingType::f16) {  // tokens an f16 staging holds exactly
                    for (auto* x : {&k, &v}) {
                        for (float& f : *x) f = kvq::detail::f16_to_f32(kvq::detail::f32_to_f16(f));
                    }
                }
                const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 5, 1.5f);
                double worst = 0;
                for (size_t pos = 0; pos < 150;) {
                    const size_t count = std::min(chunk, 150 - pos);
                    t.append(&k[pos * kRow], &v[pos * kRow], count);
                    pos += count;
                    worst = std::max(worst, t.check_decode(q));
                    if (chunk > 1) worst = std::max(worst, t.check_prefill(count, pos));
                }
                CHECK(worst < kvq::test::kFloatRounding);
                // The tail is there: at least T tokens exact, fewer than T + block_tokens.
                CHECK(t.n() - t.sealed >= std::min<size_t>(t.n(), tail));
                CHECK(t.n() - t.sealed < size_t(tail) + kBlock);
            }
        }
    }
}

TEST_CASE("exact tail: attend_batch equals attend for sequences of different lengths") {
    CacheConfig cfg = tail_config("q4_0", "q4_0", 40);
    KVCache cache(cfg);
    std::vector<SequenceId> ids;
    std::vector<float> k, v;
    kvq::test::random_tokens(200, kKv, kDim, 3, k, v);
    for (size_t n : {5, 40, 41, 57, 200}) {
        ids.push_back(cache.add_sequence());
        cache.append(0, ids.back(), k.data(), v.data(), n);
    }
    const size_t vec = size_t(kHeads) * kDim;
    const auto q = kvq::test::gaussian(ids.size() * vec, 9, 1.5f);
    std::vector<float> out(q.size());
    cache.attend_batch(0, ids, q.data(), out.data());
    for (size_t i = 0; i < ids.size(); ++i) {
        std::vector<float> one(vec);
        cache.attend(0, ids[i], &q[i * vec], one.data());
        CHECK(std::memcmp(one.data(), &out[i * vec], vec * sizeof(float)) == 0);
    }
}

TEST_CASE("exact tail: truncate into the tail and into sealed blocks, then append, against the model") {
    for (const int tail : {0, 24}) {
        CAPTURE(tail);
        KVCache cache(tail_config("q8_0", "q4_0", tail));
        Tracked t(cache, cache.add_sequence());
        std::vector<float> k, v;
        kvq::test::random_tokens(400, kKv, kDim, 21, k, v);
        const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 6, 1.5f);
        size_t next = 0;
        const auto add = [&](size_t count) {
            t.append(&k[next * kRow], &v[next * kRow], count);
            next += count;
        };
        add(70);
        CHECK(t.check_decode(q) < kvq::test::kFloatRounding);
        t.truncate(60);  // within the tail (T = 24: sealed below 32)
        add(9);
        CHECK(t.check_decode(q) < kvq::test::kFloatRounding);
        t.truncate(21);  // into sealed block 1 (T = 24: [16, 32) sealed earlier)
        add(3);
        CHECK(t.check_decode(q) < kvq::test::kFloatRounding);
        add(60);
        CHECK(t.check_decode(q) < kvq::test::kFloatRounding);
        t.truncate(48);  // onto a block boundary
        add(40);
        CHECK(t.check_decode(q) < kvq::test::kFloatRounding);
        CHECK(t.check_prefill(40, 1) < kvq::test::kFloatRounding);
    }
}

TEST_CASE("exact tail: a fork copies the tail, parent and child go on independently") {
    KVCache cache(tail_config("q4_0", "q4_0", 40));
    Tracked parent(cache, cache.add_sequence());
    std::vector<float> k, v;
    kvq::test::random_tokens(300, kKv, kDim, 31, k, v);
    parent.append(k.data(), v.data(), 90);
    Tracked child(cache, cache.fork(parent.seq));
    child.tok = parent.tok;
    child.sealed = parent.sealed;
    const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 7, 1.5f);
    CHECK(decode(cache, child.seq, q) == decode(cache, parent.seq, q));
    child.append(&k[150 * kRow], &v[150 * kRow], 45);
    parent.append(&k[90 * kRow], &v[90 * kRow], 20);
    CHECK(child.check_decode(q) < kvq::test::kFloatRounding);
    CHECK(parent.check_decode(q) < kvq::test::kFloatRounding);
    // The pool: the child's staging (the whole ring) is counted once more.
    CHECK(cache.pool_stats().bytes_reserved == 2 * ((40 + 2 * kBlock - 2) / kBlock) * (2 * kKv * kBlock * kDim * sizeof(float)));
    cache.remove(child.seq);
    cache.remove(parent.seq);
    CHECK(cache.pool_stats().bytes_reserved == 0);
    CHECK(cache.pool_stats().blocks_used == 0);
}

TEST_CASE("exact tail: save and load bit for bit, T in the file (version 4), T = 0 files stay version 3") {
    using namespace kvq::test::cache_file;
    TempDir dir;
    for (const int tail : {0, 40}) {
        CAPTURE(tail);
        CacheConfig cfg = tail_config("q4_0+rot", "q4_0", tail);
        cfg.center_keys = true;
        cfg.n_layers = 2;
        cfg.layer_codecs = {{"", ""}, {"q8_0", "q8_0"}};
        KVCache cache(cfg);
        std::vector<float> k, v;
        kvq::test::random_tokens(200, kKv, kDim, 41, k, v);
        const SequenceId a = cache.add_sequence();
        for (int l = 0; l < 2; ++l) cache.append(l, a, k.data(), v.data(), 77);
        const SequenceId b = cache.fork(a);
        for (int l = 0; l < 2; ++l) cache.append(l, b, &k[100 * kRow], &v[100 * kRow], 30);
        const std::string path = dir / ("tail" + std::to_string(tail) + ".kvq");
        cache.save(path);
        const auto bytes = slurp(path);
        CHECK(bytes[8] == (tail ? 4 : 3));

        KVCache loaded = KVCache::load(path);
        CHECK(loaded.config().exact_tail_tokens == tail);
        const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 8, 1.5f);
        for (int l = 0; l < 2; ++l) {
            CHECK(decode(loaded, 0, q, l) == decode(cache, a, q, l));
            CHECK(decode(loaded, 1, q, l) == decode(cache, b, q, l));
        }
        loaded.save(dir / "again.kvq");
        CHECK(slurp(dir / "again.kvq") == bytes);
        CHECK(loaded.bytes_used() == cache.bytes_used());
        // The loaded cache goes on as the saved one: the tail seals at the same appends.
        for (int l = 0; l < 2; ++l) {
            cache.append(l, b, &k[130 * kRow], &v[130 * kRow], 50);
            loaded.append(l, 1, &k[130 * kRow], &v[130 * kRow], 50);
            CHECK(decode(loaded, 1, q, l) == decode(cache, b, q, l));
        }
        // load_into a cache of another tail: ConfigMismatch naming the field.
        CacheConfig other = cfg;
        other.exact_tail_tokens = tail ? 0 : 16;
        KVCache live(other);
        const std::string what = error_of<kvq::ConfigMismatch>([&] { live.load_into(path); });
        CHECK(what.find("exact_tail_tokens") != std::string::npos);
    }
}

TEST_CASE("exact tail: the staging counts against max_blocks and max_bytes, refused with nothing changed") {
    CacheConfig cfg = tail_config("q4_0", "q4_0", 24);
    const size_t ring = (24 + 2 * kBlock - 2) / kBlock * (2 * kKv * kBlock * kDim * sizeof(float));  // 3 slots
    {
        KVCache probe(cfg);
        const SequenceId s = probe.add_sequence();
        std::vector<float> k, v;
        kvq::test::random_tokens(1, kKv, kDim, 1, k, v);
        const size_t before = probe.bytes_used();
        probe.append(0, s, k.data(), v.data(), 1);
        CHECK(probe.pool_stats().bytes_reserved == ring);
        CHECK(probe.bytes_used() == before + ring);
        CHECK(probe.pool_stats().blocks_reserved == (ring + probe.pool_stats().block_bytes - 1) / probe.pool_stats().block_bytes);
    }
    const size_t units = (ring + KVCache(cfg).pool_stats().block_bytes - 1) / KVCache(cfg).pool_stats().block_bytes;
    std::vector<float> k, v;
    kvq::test::random_tokens(100, kKv, kDim, 2, k, v);
    SUBCASE("max_blocks below the ring: the first append is refused") {
        cfg.max_blocks = units - 1;
        KVCache cache(cfg);
        const SequenceId s = cache.add_sequence();
        const size_t before = cache.bytes_used();
        CHECK_THROWS_AS(cache.append(0, s, k.data(), v.data(), 1), kvq::PoolExhausted);
        CHECK(cache.n_tokens(s) == 0);
        CHECK(cache.bytes_used() == before);
    }
    SUBCASE("max_blocks of the ring alone: the tail fills, the first seal is refused") {
        cfg.max_blocks = units;
        cfg.grow_blocks = 1;
        KVCache cache(cfg);
        const SequenceId s = cache.add_sequence();
        cache.append(0, s, k.data(), v.data(), 24 + kBlock - 1);  // nothing to seal yet
        const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 3, 1.5f);
        const auto out = decode(cache, s, q);
        const size_t before = cache.bytes_used();
        CHECK_THROWS_AS(cache.append(0, s, &k[39 * kRow], &v[39 * kRow], 1), kvq::PoolExhausted);
        CHECK(cache.n_tokens(s) == 39);
        CHECK(cache.bytes_used() == before);
        CHECK(decode(cache, s, q) == out);
    }
    SUBCASE("max_bytes below the ring and the bookkeeping: refused") {
        cfg.max_bytes = KVCache::sequence_bookkeeping_bytes(1) + ring - 1;
        KVCache cache(cfg);
        const SequenceId s = cache.add_sequence();
        CHECK_THROWS_AS(cache.append(0, s, k.data(), v.data(), 1), kvq::PoolExhausted);
        CHECK(cache.n_tokens(s) == 0);
    }
}

TEST_CASE("exact tail: a sliding window shorter than the tail reads the window exactly and releases sealed blocks") {
    CacheConfig cfg = tail_config("q4_0", "q4_0", 64);
    cfg.n_layers = 2;
    cfg.sliding_window = {20, 0};
    KVCache cache(cfg);
    Tracked t(cache, cache.add_sequence());
    std::vector<float> k, v;
    kvq::test::random_tokens(400, kKv, kDim, 51, k, v);
    const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 4, 1.5f);
    double worst = 0;
    for (size_t pos = 0; pos < 400; pos += 13) {
        t.append(&k[pos * kRow], &v[pos * kRow], std::min<size_t>(13, 400 - pos));
        worst = std::max(worst, t.check_decode(q));
        worst = std::max(worst, t.check_prefill(std::min<size_t>(13, 400 - pos), pos));
    }
    CHECK(worst < kvq::test::kFloatRounding);
    // Layer 1 holds every sealed block, layer 0 only a few past its window.
    const size_t sealed_blocks = t.sealed / kBlock;
    CHECK(cache.pool_stats().blocks_used < sealed_blocks + 4);
}

TEST_CASE("exact tail: configuration rules, and the bytes the tail costs") {
    CacheConfig cfg = tail_config("q4_0", "q4_0", -1);
    CHECK_THROWS_AS(KVCache{cfg}, kvq::BadParams);
    cfg.exact_tail_tokens = kvq::kMaxExactTailTokens + 1;
    CHECK_THROWS_AS(KVCache{cfg}, kvq::BadParams);
    cfg.exact_tail_tokens = 8;
    cfg.seal = SealPolicy::on_append;
    CHECK_THROWS_AS(KVCache{cfg}, kvq::BadParams);
    cfg.seal = SealPolicy::on_block_full;
    cfg.exact_tail_tokens = 24;
    KVCache cache(cfg);
    // The sealed format's bytes: 2 kv heads × (an 18-byte q4_0 key row per 32 values, and the same value).
    const double sealed = 2.0 * (2 * 18 + 2 * 18);
    CHECK(cache.bytes_per_token(0) == doctest::Approx(sealed));
    const double exact = 2.0 * 2 * kDim * sizeof(float);
    CHECK(cache.average_bytes_per_token(0, 100) == doctest::Approx((76 * sealed + 24 * exact) / 100));
    CHECK(cache.average_bytes_per_token(0, 10) == doctest::Approx(exact));
    CHECK(cache.average_bytes_per_token(0, 0) == doctest::Approx(sealed));
    cfg.exact_tail_tokens = 0;
    CHECK(KVCache(cfg).average_bytes_per_token(0, 100) == doctest::Approx(sealed));
}

TEST_CASE("exact tail: the bytes of a tail of values of their own size, and of a latent cache's") {
    CacheConfig cfg = tail_config("q8_0", "q8_0", 16);
    cfg.head_dim_v = kDim / 2;
    const double key_row = 2.0 * 34, value_row = 1.0 * 34;  // q8_0: 34 bytes per 32 values
    CHECK(KVCache(cfg).average_bytes_per_token(0, 16) == doctest::Approx(2.0 * (kDim + kDim / 2) * sizeof(float)));
    CHECK(KVCache(cfg).bytes_per_token(0) == doctest::Approx(2.0 * (key_row + value_row)));
    cfg.latent_values = true;  // one row per token: values read the key row's first head_dim_v values
    cfg.value_codec.clear();
    CHECK(KVCache(cfg).bytes_per_token(0) == doctest::Approx(2.0 * key_row));
    CHECK(KVCache(cfg).average_bytes_per_token(0, 16) == doctest::Approx(2.0 * kDim * sizeof(float)));
}
