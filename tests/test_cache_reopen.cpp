// A block re-opened by a truncate (issue #36, item 6): the tokens appended after a truncate into a sealed
// block must attend as well as the same tokens appended to a cache that never held the truncated ones.
// Keys whose codes share parameters fitted to the whole block (chanB minimums and steps, a centered
// block's key mean) were quantized with the old block's parameters (chan8: output error 0.090 against
// 0.0043 for fresh appends); now the block's rows go back to the float staging and it seals anew. Codecs
// of rows (q8_0 in groups of 16 included) give the fresh cache's bits once the block is sealed again.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "test_util.hpp"

namespace {

constexpr int kKv = 2, kHeads = 4, kDim = 64, kBlock = 16;

// Keys with a per-channel bias, as real keys have; `shift` moves the channels' ranges (the truncated
// tokens and the new ones come from different ranges, as a rejected draft and its replacement may).
std::vector<float> keys(size_t n, uint64_t seed, float shift) {
    auto k = kvq::test::gaussian(n * kKv * kDim, seed);
    for (size_t i = 0; i < k.size(); ++i) k[i] = k[i] * (1 + shift) + static_cast<float>(int(i % kDim) - 32) / 8.0f + shift;
    return k;
}

std::vector<float> reference(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, size_t n) {
    return kvq::test::decode_attention_double(q, k, v, n, kHeads, kKv, kDim);
}

using kvq::test::relative_error;

std::vector<float> attend(const kvq::KVCache& cache, kvq::SequenceId seq, const std::vector<float>& q) {
    std::vector<float> out(size_t(kHeads) * kDim);
    cache.attend(0, seq, q.data(), out.data());
    return out;
}

const float* token(const std::vector<float>& x, size_t t) { return x.data() + t * kKv * kDim; }

struct Case {
    std::string key;
    bool center;
};

}  // namespace

TEST_CASE("truncate into a sealed block, then append: as accurate as the same tokens appended fresh, for every key codec") {
    std::vector<Case> cases;
    for (const auto& name : kvq::codec_names()) {
        if (kvq::codec_info(name).plain && name != "f16") continue;  // f32/bf16 keys: nothing to fit
        cases.push_back({name, false});
        cases.push_back({name, true});
    }
    cases.push_back({"q4_0+rot", true});
    for (int bits = 2; bits <= 8; ++bits) cases.push_back({"chan" + std::to_string(bits), false});

    // 40 tokens of the old range, truncated to 20 (into sealed block 1, 4 rows kept), then 28 new tokens
    // of a wider range: block 1 seals again at 32, block 2 at 48.
    const auto old_k = keys(40, 1, 0.0f), new_k = keys(28, 2, 1.5f);
    const auto old_v = kvq::test::gaussian(40 * kKv * kDim, 3), new_v = kvq::test::gaussian(28 * kKv * kDim, 4);
    const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 5, 0.3f);
    std::vector<float> all_k(token(old_k, 0), token(old_k, 20)), all_v(token(old_v, 0), token(old_v, 20));
    all_k.insert(all_k.end(), new_k.begin(), new_k.end());
    all_v.insert(all_v.end(), new_v.begin(), new_v.end());

    for (const auto& c : cases) {
        CAPTURE(c.key);
        CAPTURE(c.center);
        kvq::CacheConfig cfg;
        cfg.n_kv_heads = kKv;
        cfg.n_heads = kHeads;
        cfg.head_dim = kDim;
        cfg.key_codec = c.key;
        cfg.value_codec = "f32";
        cfg.block_tokens = kBlock;
        cfg.center_keys = c.center;
        const bool rows_codec = !c.center && !c.key.starts_with("chan");
        kvq::KVCache reopened(cfg), fresh(cfg);
        // Codecs of rows: quantized as they arrive, as SealPolicy::on_append does everywhere.
        cfg.seal = rows_codec ? kvq::SealPolicy::on_append : cfg.seal;
        kvq::KVCache quantized(cfg);
        const auto r = reopened.add_sequence(), f = fresh.add_sequence(), a = quantized.add_sequence();
        reopened.append(0, r, old_k.data(), old_v.data(), 40);
        reopened.truncate(r, 20);
        fresh.append(0, f, old_k.data(), old_v.data(), 20);
        quantized.append(0, a, old_k.data(), old_v.data(), 20);
        // While block 1 is open (9 of its rows), then once every block is sealed again.
        for (const auto& [from, to] : {std::pair<size_t, size_t>{0, 5}, {5, 28}}) {
            const size_t n = 20 + to;
            CAPTURE(n);
            reopened.append(0, r, token(new_k, from), token(new_v, from), to - from);
            fresh.append(0, f, token(new_k, from), token(new_v, from), to - from);
            quantized.append(0, a, token(new_k, from), token(new_v, from), to - from);
            CHECK(reopened.n_tokens(r, 0) == n);
            const auto exact = reference(q, all_k, all_v, n);
            const auto out_r = attend(reopened, r, q), out_f = attend(fresh, f, q);
            const double err_r = relative_error(out_r, exact), err_f = relative_error(out_f, exact);
            MESSAGE(c.key << std::string(c.center ? "+center, " : ", ") << n << " tokens: truncate-then-append " << err_r
                          << ", fresh " << err_f);
            if (rows_codec) {
                // Rows quantized one by one: the same codes whichever way the block was filled. While it is
                // open, its new rows are quantized as they arrive (the fresh cache keeps them in float):
                // the bits of a cache that quantizes every row on append.
                const auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
                    return std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
                };
                CHECK(same(out_r, n % kBlock == 0 ? out_f : attend(quantized, a, q)));
            } else {
                // Re-quantized over the block's rows as they read and the new ones, sealed anew.
                CHECK(err_r <= 1.5 * err_f + 1e-6);
            }
        }
    }
}

TEST_CASE("a re-opened block of keys at the top of fp16's range seals again with finite parameters") {
    // Rows as a block reads them can pass 65504 by a rounding (an fp16 step or scale rounded up): they
    // are brought back within what append admits, so sealing them again neither overflows nor throws.
    for (const auto staging : {kvq::StagingType::f32, kvq::StagingType::f16}) {
        for (const Case& c : {Case{"chan2", false}, Case{"chan8", false}, Case{"q8_0", true}, Case{"q4_1", true}}) {
            CAPTURE(c.key);
            CAPTURE(int(staging));
            kvq::CacheConfig cfg;
            cfg.n_kv_heads = kKv;
            cfg.n_heads = kHeads;
            cfg.head_dim = kDim;
            cfg.key_codec = c.key;
            cfg.value_codec = "q4_1";
            cfg.block_tokens = kBlock;
            cfg.center_keys = c.center;
            cfg.staging = staging;
            kvq::KVCache cache(cfg);
            const float top = c.center ? (c.key == "q4_1" ? 32752.0f : 65504.0f) : 65504.0f;
            std::vector<float> k(2 * kBlock * kKv * kDim), v(k.size());
            for (size_t i = 0; i < k.size(); ++i) {
                const size_t t = i / (kKv * kDim);
                k[i] = (t % 3 == 0 ? top : t % 3 == 1 ? -top : top * 0.999f) * (i % 2 ? 1.0f : 0.97f);
                v[i] = (i % 5 == 0 ? -65504.0f : 65504.0f) * (t % 2 ? 1.0f : 0.9991f);
            }
            const auto seq = cache.add_sequence();
            cache.append(0, seq, k.data(), v.data(), kBlock);
            cache.truncate(seq, 5);
            cache.append(0, seq, token(k, 5), token(v, 5), 2 * kBlock - 5);  // block 0 seals again, block 1 too
            CHECK(cache.n_tokens(seq, 0) == 2 * kBlock);
            const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 7, 1e-3f);
            const auto out = attend(cache, seq, q);
            CHECK(kvq::all_finite(out.data(), out.size()));
        }
    }
}
