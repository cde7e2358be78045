// The cache's attention equals the FP32 reference on the dequantized rows (to float rounding) for every
// codec pair, GQA ratio, head size, seal policy, key centering, window, soft-cap and thread count, at
// every SIMD level this CPU runs.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "cache_model.hpp"
#include "kvq/simd.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SealPolicy;
using kvq::test::LayerTokens;

namespace {

std::vector<std::string> all_specs() {
    std::vector<std::string> specs;
    for (const auto& name : kvq::codec_names()) {
        specs.push_back(name);
        specs.push_back(name + "+rot");
    }
    return specs;
}

struct Run {
    double worst = 0;  // largest relative difference seen
    int checks = 0;
};

// Appends n_tokens in the given chunk sizes (the last repeated), attending after every chunk, and
// compares each result with the model. Returns the worst difference.
Run append_and_compare(const CacheConfig& cfg, size_t n_tokens, std::vector<size_t> chunks, uint64_t seed,
                       float key_bias = 0.0f) {
    KVCache cache(cfg);
    const auto seq = cache.add_sequence();
    const auto& c = cache.config();
    std::vector<float> k, v;
    kvq::test::random_tokens(n_tokens, c.n_kv_heads, c.head_dim, seed, k, v, key_bias);
    const auto q = kvq::test::gaussian(static_cast<size_t>(c.n_heads) * c.head_dim, seed + 1, 1.5f);
    LayerTokens tok{c.n_kv_heads, c.head_dim};
    const size_t row = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
    std::vector<float> out(q.size());
    Run run;
    for (size_t pos = 0, i = 0; pos < n_tokens; ++i) {
        const size_t count = std::min(chunks[std::min(i, chunks.size() - 1)], n_tokens - pos);
        cache.append(0, seq, &k[pos * row], &v[pos * row], count);
        tok.add(&k[pos * row], &v[pos * row], count);
        pos += count;
        cache.attend(0, seq, q.data(), out.data());
        const size_t w = c.sliding_window.empty() ? 0 : c.sliding_window[0];
        const size_t lo = w && pos > w ? pos - w : 0;
        const auto want = kvq::test::expected_attention(cache, tok, lo, pos, kvq::test::sealed_end(c, pos), q.data());
        run.worst = std::max(run.worst, kvq::test::max_rel_diff(out, want));
        ++run.checks;
    }
    return run;
}

CacheConfig small_config(const std::string& kc, const std::string& vc, SealPolicy seal) {
    CacheConfig cfg;
    cfg.n_kv_heads = 2;
    cfg.n_heads = 4;
    cfg.head_dim = 64;
    cfg.key_codec = kc;
    cfg.value_codec = vc;
    cfg.block_tokens = 16;
    cfg.seal = seal;
    return cfg;
}

// Runs body at every SIMD level this CPU runs (cache attention goes through every kernel family and the
// softmax), then restores the level in use. body may take a bool: true at the level in use by default.
// KVQ_TEST_DEFAULT_LEVEL_ONLY=1 (the sanitizer runs) keeps the level in use only: there every level's
// kernels still go through kvq::selftest, so the memory checks reach each of them.
template <class F>
void at_every_level(F&& body) {
    const kvq::SimdLevel before = kvq::simd_level();
    const char* one = std::getenv("KVQ_TEST_DEFAULT_LEVEL_ONLY");
    const bool only_default = one && std::string(one) == "1";
    for (kvq::SimdLevel level : kvq::available_simd_levels()) {
        if (only_default && level != before) continue;
        kvq::force_simd_level(level);
        REQUIRE(kvq::simd_level() == level);
        const std::string name(kvq::simd_level_name(level));
        CAPTURE(name);
        if constexpr (std::is_invocable_v<F, bool>) {
            body(level == before);
        } else {
            body();
        }
    }
    kvq::force_simd_level(before);
}

}  // namespace

TEST_CASE("cache attention equals the reference on dequantized rows for every codec pair") {
    // Every pair at the default level; at the others every codec as key and as value (with two partners
    // each), which reaches every kernel at a fraction of the cost (the kernels' own parity is selftest's).
    at_every_level([&](bool every_pair) {
        const auto specs = all_specs();
        for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
            for (size_t a = 0; a < specs.size(); ++a) {
                const auto& kc = specs[a];
                for (size_t b = 0; b < specs.size(); ++b) {
                    const auto& vc = specs[b];
                    if (!every_pair && b != a && b != (a + 7) % specs.size()) continue;
                    CAPTURE(kc);
                    CAPTURE(vc);
                    CAPTURE(static_cast<int>(seal));
                    // 37 tokens in blocks of 16: two full blocks and one that ends mid-block; a batch that
                    // ends mid-block, then a few tokens at a time across the block boundary. One kv head
                    // (GQA and several heads are covered below; this case is about the codecs).
                    CacheConfig cfg = small_config(kc, vc, seal);
                    cfg.n_kv_heads = 1;
                    cfg.n_heads = 2;
                    const Run run = append_and_compare(cfg, 37, {29, 5}, 100);
                    CHECK(run.checks == 3);
                    CHECK(run.worst < kvq::test::kFloatRounding);
                }
            }
        }
    });
}

TEST_CASE("cache attention for GQA ratios 1, 4, 8 and head sizes 64, 128, 256") {
    at_every_level([&] {
        const std::vector<std::pair<std::string, std::string>> pairs = {
            {"q8_0", "q4_0"}, {"q4_0+rot", "q4_0"}, {"f16", "f16"}, {"q8_0", "q4_0+rot"}};
        for (int d : {64, 128, 256}) {
            for (int g : {1, 4, 8}) {
                for (const auto& codecs : pairs) {
                    // (no structured bindings: Clang 14 cannot capture them in CAPTURE's lambda)
                    const std::string &kc = codecs.first, &vc = codecs.second;
                    for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
                        CAPTURE(d);
                        CAPTURE(g);
                        CAPTURE(kc);
                        CAPTURE(vc);
                        CacheConfig cfg = small_config(kc, vc, seal);
                        cfg.head_dim = d;
                        cfg.n_kv_heads = 2;
                        cfg.n_heads = 2 * g;
                        cfg.block_tokens = 32;
                        const Run run = append_and_compare(cfg, 77, {50, 13, 1}, 200 + d + g);
                        CHECK(run.worst < kvq::test::kFloatRounding);
                    }
                }
            }
        }
    });
}

TEST_CASE("centered keys: attention equals the reference with the fp16 mean added back, and removes key bias") {
    at_every_level([&] {
        const std::vector<std::pair<std::string, std::string>> pairs = {
            {"q8_0", "q4_0"}, {"q4_0", "q4_0"}, {"q4_0+rot", "q8_0"}, {"f16", "f16"}};
        for (const auto& codecs : pairs) {
            // (no structured bindings: Clang 14 cannot capture them in CAPTURE's lambda)
            const std::string &kc = codecs.first, &vc = codecs.second;
            CAPTURE(kc);
            CacheConfig cfg = small_config(kc, vc, SealPolicy::on_block_full);
            cfg.center_keys = true;
            const Run run = append_and_compare(cfg, 70, {33, 1}, 300, /*key_bias=*/8.0f);
            CHECK(run.worst < kvq::test::kFloatRounding);
        }
    
        // Against exact FP32 attention, centering 4-bit keys with a large bias must shrink the error.
        auto error_vs_fp32 = [](bool center) {
            CacheConfig cfg = small_config("q4_0", "f32", SealPolicy::on_block_full);
            cfg.center_keys = center;
            KVCache cache(cfg);
            const auto seq = cache.add_sequence();
            std::vector<float> k, v;
            kvq::test::random_tokens(256, 2, 64, 5, k, v, 8.0f);
            cache.append(0, seq, k.data(), v.data(), 256);
            const auto q = kvq::test::gaussian(4 * 64, 6, 1.5f);
            std::vector<float> out(q.size());
            cache.attend(0, seq, q.data(), out.data());
            CacheConfig exact = cfg;
            exact.key_codec = "f32";
            exact.center_keys = false;
            LayerTokens tok{2, 64};
            tok.add(k.data(), v.data(), 256);
            const auto f32 = kvq::Codec::make("f32", 64);
            const auto want = kvq::test::expected_attention(exact, f32, f32, tok, 0, 256, 256, q.data());
            return kvq::test::max_rel_diff(out, want);
        };
        const double plain = error_vs_fp32(false), centered = error_vs_fp32(true);
        CAPTURE(plain);
        CAPTURE(centered);
        CHECK(centered < 0.5 * plain);
    });
}

TEST_CASE("sliding window: attention sees the last W tokens and blocks out of the window return to the pool") {
    at_every_level([&] {
        for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
            for (int w : {5, 16, 40}) {
                CAPTURE(w);
                CacheConfig cfg = small_config("q8_0", "q4_0", seal);
                cfg.n_layers = 2;
                cfg.sliding_window = {w, 0};
                const Run run = append_and_compare(cfg, 150, {20, 1, 1, 3}, 400 + w);
                CHECK(run.worst < kvq::test::kFloatRounding);
    
                // Blocks in use stay bounded by the window, in a batch append far longer than it too.
                KVCache cache(cfg);
                const auto seq = cache.add_sequence();
                std::vector<float> k, v;
                kvq::test::random_tokens(300, 2, 64, 9, k, v);
                cache.append(0, seq, k.data(), v.data(), 300);
                for (int i = 0; i < 100; ++i) cache.append(0, seq, &k[i * 128], &v[i * 128], 1);
                CHECK(cache.n_tokens(seq, 0) == 400);
                CHECK(cache.pool_stats().blocks_used <= static_cast<size_t>(w + 15) / 16 + 2);  // + 1 block of slack
            }
        }
    });
}

TEST_CASE("logit soft-cap") {
    at_every_level([&] {
        for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
            CacheConfig cfg = small_config("q8_0", "q4_0", seal);
            cfg.softcap = 2.0f;  // small, so that it changes the result a lot
            cfg.scale = 0.5f;
            const Run run = append_and_compare(cfg, 60, {30, 1}, 500);
            CHECK(run.worst < kvq::test::kFloatRounding);
        }
    });
}

TEST_CASE("threads = 2 gives the threads = 1 result to float rounding") {
    at_every_level([&] {
        for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
            for (const auto& kc : {std::string("q8_0"), std::string("f16"), std::string("q4_0+rot")}) {
                CAPTURE(kc);
                CacheConfig cfg = small_config(kc, "q4_0+rot", seal);
                cfg.n_heads = 8;
                std::vector<float> outs[2];
                for (int threads : {1, 2}) {
                    cfg.threads = threads;
                    KVCache cache(cfg);
                    const auto seq = cache.add_sequence();
                    std::vector<float> k, v;
                    kvq::test::random_tokens(2000, 2, 64, 600, k, v);  // 125 blocks: several parts
                    cache.append(0, seq, k.data(), v.data(), 2000);
                    const auto q = kvq::test::gaussian(8 * 64, 601, 2.0f);
                    outs[threads - 1].resize(q.size());
                    cache.attend(0, seq, q.data(), outs[threads - 1].data());
                    if (threads == 2) {
                        LayerTokens tok{2, 64};
                        tok.add(k.data(), v.data(), 2000);
                        const auto c = cache.config();
                        const auto want = kvq::test::expected_attention(cache, tok, 0, 2000, kvq::test::sealed_end(c, 2000), q.data());
                        CHECK(kvq::test::max_rel_diff(outs[1], want) < kvq::test::kFloatRounding);
                    }
                }
                CHECK(kvq::test::max_rel_diff(outs[1], outs[0]) < 1e-5);
            }
        }
    });
}

TEST_CASE("prefill attention is causal and equals the reference for each position") {
    at_every_level([&] {
        for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
            for (int threads : {1, 2}) {
                for (int w : {0, 24}) {
                    CAPTURE(w);
                    CacheConfig cfg = small_config("q8_0", "q4_0", seal);
                    cfg.threads = threads;
                    if (w) cfg.sliding_window = {w};
                    KVCache cache(cfg);
                    const auto seq = cache.add_sequence();
                    std::vector<float> k, v;
                    kvq::test::random_tokens(50, 2, 64, 700, k, v);
                    cache.append(0, seq, k.data(), v.data(), 30);   // earlier context
                    cache.append(0, seq, &k[30 * 128], &v[30 * 128], 20);  // the prompt chunk
                    const size_t nq = 20, vec = 4 * 64;
                    const auto q = kvq::test::gaussian(nq * vec, 701);
                    std::vector<float> out(q.size());
                    cache.attend_prefill(0, seq, q.data(), nq, out.data());
                    LayerTokens tok{2, 64};
                    tok.add(k.data(), v.data(), 50);
                    const auto& c = cache.config();
                    for (size_t i = 0; i < nq; ++i) {
                        const size_t p = 30 + i, lo = w && p + 1 > size_t(w) ? p + 1 - w : 0;
                        const auto want = kvq::test::expected_attention(cache, tok, lo, p + 1, kvq::test::sealed_end(c, 50), &q[i * vec]);
                        const std::vector<float> got(&out[i * vec], &out[i * vec] + vec);
                        CHECK(kvq::test::max_rel_diff(got, want) < kvq::test::kFloatRounding);
                    }
                }
            }
        }
    });
}

TEST_CASE("prefill of a whole prompt longer than the window, then decode: equal to the reference") {
    // A 3000-token prompt appended in one piece into a layer with a 512-token window: attend_prefill sees
    // every token it needs; the next append releases what fell out of the window, and decode after it
    // reads exactly the window.
    for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
        CAPTURE(static_cast<int>(seal));
        CacheConfig cfg = small_config("q8_0", "q4_0", seal);
        cfg.n_kv_heads = 1;
        cfg.n_heads = 2;
        cfg.head_dim = 32;
        cfg.threads = 2;
        cfg.sliding_window = {512};
        KVCache cache(cfg);
        const auto seq = cache.add_sequence();
        const size_t n = 3000, vec = 2 * 32;
        std::vector<float> k, v;
        kvq::test::random_tokens(n + 1, 1, 32, 900, k, v);
        cache.append(0, seq, k.data(), v.data(), n);
        const auto q = kvq::test::gaussian(n * vec, 901);
        std::vector<float> out(q.size());
        cache.attend_prefill(0, seq, q.data(), n, out.data());
        LayerTokens tok{1, 32};
        tok.add(k.data(), v.data(), n);
        const auto& c = cache.config();
        double worst = 0;
        for (size_t i = 0; i < n; i += 37) {
            const size_t lo = i + 1 > 512 ? i + 1 - 512 : 0;
            const auto want = kvq::test::expected_attention(cache, tok, lo, i + 1, kvq::test::sealed_end(c, n), &q[i * vec]);
            worst = std::max(worst, kvq::test::max_rel_diff(std::vector<float>(&out[i * vec], &out[i * vec] + vec), want));
        }
        CHECK(worst < kvq::test::kFloatRounding);
        const size_t held = cache.pool_stats().blocks_used;
        CHECK(held * 16 + 16 >= n);  // the prompt's blocks are all still held (the last may be staging)

        cache.append(0, seq, &k[n * 32], &v[n * 32], 1);  // decode: releases what fell out of the window
        tok.add(&k[n * 32], &v[n * 32], 1);
        CHECK(cache.pool_stats().blocks_used * 16 <= 512 + 3 * 16);
        std::vector<float> one(vec);
        cache.attend(0, seq, q.data(), one.data());
        const auto want = kvq::test::expected_attention(cache, tok, n + 1 - 512, n + 1, kvq::test::sealed_end(c, n + 1), q.data());
        CHECK(kvq::test::max_rel_diff(one, want) < kvq::test::kFloatRounding);
    }
}

// CacheConfig::int8_value_weights: q4_0 values on the int8 weight grid are within the grid's rounding of
// the exact accumulation (a weight moves by at most 1/254 of its group's largest: the output here by
// less than 1% of its largest value) but not equal to it; other value codecs ignore it; threads do not
// change the result. Blocks of 16 rows are one grid group each, blocks of 32 two.
TEST_CASE("int8 value weights: q4_0 attention within the grid's rounding, other value codecs unchanged") {
    at_every_level([&] {
        for (const auto& vc : {std::string("q4_0"), std::string("q4_0+rot"), std::string("q8_0")}) {
            for (int block_tokens : {16, 32}) {
                CAPTURE(vc);
                CAPTURE(block_tokens);
                std::vector<float> outs[2][2];  // [int8 weights][threads − 1]
                for (int grid = 0; grid < 2; ++grid) {
                    for (int threads : {1, 2}) {
                        CacheConfig cfg = small_config("q8_0", vc, SealPolicy::on_append);
                        cfg.block_tokens = block_tokens;
                        cfg.n_heads = 8;
                        cfg.threads = threads;
                        cfg.int8_value_weights = grid == 1;
                        KVCache cache(cfg);
                        const auto seq = cache.add_sequence();
                        std::vector<float> k, v;
                        kvq::test::random_tokens(700, 2, 64, 70, k, v);
                        cache.append(0, seq, k.data(), v.data(), 700);
                        const auto q = kvq::test::gaussian(8 * 64, 71, 2.0f);
                        outs[grid][threads - 1].resize(q.size());
                        cache.attend(0, seq, q.data(), outs[grid][threads - 1].data());
                    }
                    CHECK(kvq::test::max_rel_diff(outs[grid][1], outs[grid][0]) < 1e-5);
                }
                const double diff = kvq::test::max_rel_diff(outs[1][0], outs[0][0]);
                if (vc == "q8_0") {
                    CHECK(diff == 0);
                } else {
                    CHECK(diff > kvq::test::kFloatRounding);
                    CHECK(diff < 1e-2);  // q4_0's own error here is ~10× more
                }
            }
        }
    });
}
