// Per-channel keys (chanB) in KVCache: sealed a block at a time, scored as q·min + (q ⊙ step)·codes,
// the open block in float; refused where a block's minimums and steps cannot be known; saved and loaded.
// (Bit-for-bit agreement with the accuracy tables: test_sweep.cpp.)
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cache_file_util.hpp"
#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "ref/half.hpp"
#include "test_util.hpp"

namespace {

constexpr int kKv = 2, kHeads = 4, kDim = 64, kBlock = 32;

kvq::CacheConfig chan_config(const char* key = "chan3", const char* value = "f32") {
    kvq::CacheConfig c;
    c.n_kv_heads = kKv;
    c.n_heads = kHeads;
    c.head_dim = kDim;
    c.key_codec = key;
    c.value_codec = value;
    c.block_tokens = kBlock;
    return c;
}

// Keys with a per-channel bias, as real keys have: channel c = (c − 32)/4 + noise.
std::vector<float> biased_keys(size_t n, uint64_t seed) {
    auto k = kvq::test::gaussian(n * kKv * kDim, seed);
    for (size_t i = 0; i < k.size(); ++i) k[i] += static_cast<float>(int(i % kDim) - 32) / 4.0f;
    return k;
}

float f16(float x) { return kvq::detail::f16_to_f32(kvq::detail::f32_to_f16(x)); }

// What the cache should hold: every whole block of n tokens as min + step·code (computed here from the
// definition), the tokens after the last whole block as given.
std::vector<float> expected_keys(const std::vector<float>& k, size_t n, int bits) {
    std::vector<float> y(k.begin(), k.begin() + n * kKv * kDim);
    const float top = float((1 << bits) - 1);
    for (size_t b = 0; b + kBlock <= n; b += kBlock) {
        for (int h = 0; h < kKv; ++h) {
            for (int c = 0; c < kDim; ++c) {
                auto at = [&](size_t t) { return (t * kKv + h) * kDim + c; };
                float lo = k[at(b)], hi = lo;
                for (size_t t = b; t < b + kBlock; ++t) lo = std::min(lo, k[at(t)]), hi = std::max(hi, k[at(t)]);
                const float mn = f16(lo), step = f16((hi - lo) / top);
                for (size_t t = b; t < b + kBlock; ++t) y[at(t)] = mn + step * std::clamp(std::round((k[at(t)] - mn) * (1.0f / step)), 0.0f, top);
            }
        }
    }
    return y;
}

std::vector<float> attention(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, size_t n) {
    return kvq::test::decode_attention_double(q, k, v, n, kHeads, kKv, kDim);
}

using kvq::test::relative_error;

std::vector<float> attend(const kvq::KVCache& cache, int layer, kvq::SequenceId seq, const std::vector<float>& q) {
    std::vector<float> out(size_t(kHeads) * kDim);
    cache.attend(layer, seq, q.data(), out.data());
    return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("chanB keys in KVCache: sealed blocks attend as min + step·code, the open block in float") {
    const size_t n = 2 * kBlock + 16;  // two sealed blocks, 16 tokens staged
    const auto k = biased_keys(n, 1), v = kvq::test::gaussian(n * kKv * kDim, 2);
    const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 3, 0.5f);
    for (const int bits : {2, 3, 4, 8}) {
        CAPTURE(bits);
        const std::string key = "chan" + std::to_string(bits);
        kvq::KVCache cache(chan_config(key.c_str()));
        CHECK(cache.key_codec().name() == key);
        CHECK(cache.key_codec().info().per_channel);
        CHECK(cache.key_codec().row_bytes() == size_t(kDim * bits / 8));
        // B bits per code and 32 bits of minimum and step per channel per block; f32 values.
        CHECK(cache.bytes_per_token() == doctest::Approx(kKv * (kDim * bits / 8.0 + 4.0 * kDim / kBlock + 4.0 * kDim)));
        const auto seq = cache.add_sequence();
        cache.append(0, seq, k.data(), v.data(), 40);  // one block sealed, then the rest in two appends
        cache.append(0, seq, k.data() + 40 * kKv * kDim, v.data() + 40 * kKv * kDim, 1);
        cache.append(0, seq, k.data() + 41 * kKv * kDim, v.data() + 41 * kKv * kDim, n - 41);
        const auto out = attend(cache, 0, seq, q);
        const double err = relative_error(out, attention(q, expected_keys(k, n, bits), v, n));
        const double quantization = relative_error(attention(q, expected_keys(k, n, bits), v, n), attention(q, k, v, n));
        MESSAGE("chan" << bits << ": against the stored keys " << err << ", the quantization itself " << quantization);
        CHECK(err < 2e-5);
        CHECK(quantization > 10 * err);  // the check above tells the stored keys from the exact ones
        // Scores that overflow float: the head again in double precision from min + step·code, which
        // puts all the weight on the best stored key (a query of ~1e36: the softmax is one-hot).
        std::vector<float> big(q.size());
        for (size_t i = 0; i < q.size(); ++i) big[i] = q[i] * 1e36f;
        const auto capped = attend(cache, 0, seq, big);
        CHECK(kvq::all_finite(capped.data(), capped.size()));
        CHECK(relative_error(capped, attention(big, expected_keys(k, n, bits), v, n)) < 1e-5);
    }
}

TEST_CASE("chanB keys are refused where a block's minimums and steps cannot be known, and as values") {
    auto c = chan_config();
    c.seal = kvq::SealPolicy::on_append;
    CHECK_THROWS_WITH_AS(kvq::KVCache{c}, doctest::Contains("needs seal = SealPolicy::on_block_full"), kvq::BadParams);
    CHECK_THROWS_WITH_AS(kvq::validate_config(c), doctest::Contains("needs seal = SealPolicy::on_block_full"), kvq::BadParams);
    c = chan_config("q8_0");
    c.n_layers = 2;
    c.seal = kvq::SealPolicy::on_append;
    c.layer_codecs = {{}, {"chan4", ""}};  // one layer of chanB keys is enough
    CHECK_THROWS_WITH_AS(kvq::KVCache{c}, doctest::Contains("'chan4' needs seal"), kvq::BadParams);
    c = chan_config();
    c.center_keys = true;
    CHECK_THROWS_WITH_AS(kvq::KVCache{c}, doctest::Contains("center_keys does not apply"), kvq::BadParams);
    CHECK_THROWS_WITH_AS(kvq::KVCache{chan_config("q8_0", "chan3")}, doctest::Contains("is a key codec"), kvq::BadParams);
    for (const char* bad : {"chan1", "chan9", "chan3+rot", "chan3:x", "channel"}) {
        CAPTURE(bad);
        CHECK_THROWS_WITH_AS(kvq::KVCache{chan_config(bad)}, doctest::Contains("chan2 .. chan8"), kvq::BadParams);
    }
    c = chan_config();
    c.head_dim = 12;  // 12 3-bit codes do not fill whole bytes
    CHECK_THROWS_WITH_AS(kvq::KVCache{c}, doctest::Contains("multiple of 8"), kvq::BadHeadDim);
    // Not a row codec: Codec::make refuses it, and the cache's codec has no row operations.
    CHECK_THROWS_WITH_AS(kvq::Codec::make("chan3", 64), doctest::Contains("KVCache key codec"), kvq::BadParams);
    kvq::KVCache cache(chan_config());
    std::vector<float> x(kDim, 1.0f), y(kDim);
    std::vector<uint8_t> row(cache.key_codec().row_bytes());
    CHECK_THROWS_WITH_AS(cache.key_codec().quantize_rows(x.data(), 1, row.data()), doctest::Contains("no row operations"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(cache.key_codec().dequantize_rows(row.data(), 1, y.data()), doctest::Contains("no row operations"),
                         std::invalid_argument);
    const kvq::RowsView rows{row.data(), 0, 0};
    CHECK_THROWS_WITH_AS(kvq::attend_rows(cache.key_codec(), cache.value_codec(), 1, 1, x.data(), rows, rows, 1, y.data()),
                         doctest::Contains("per-channel key codec"), std::invalid_argument);
}

TEST_CASE("chanB keys: NaN, Inf and keys beyond fp16 are refused with nothing changed") {
    kvq::KVCache cache(chan_config("chan4"));
    const auto seq = cache.add_sequence();
    const auto k = biased_keys(40, 4), v = kvq::test::gaussian(40 * kKv * kDim, 5);
    const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 6);
    cache.append(0, seq, k.data(), v.data(), 20);
    const auto before = attend(cache, 0, seq, q);
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(), 1e6f}) {
        CAPTURE(bad);
        auto kb = k;
        kb[30 * kKv * kDim + kDim + 7] = bad;  // token 30 of the append below (it would fill the block)
        CHECK_THROWS_AS(cache.append(0, seq, kb.data() + 20 * kKv * kDim, v.data(), 20), std::invalid_argument);
        CHECK(cache.n_tokens(seq) == 20);
        CHECK(same_bits(attend(cache, 0, seq, q), before));
    }
    cache.append(0, seq, k.data() + 20 * kKv * kDim, v.data(), 20);  // the same rows, finite: stored
    CHECK(cache.n_tokens(seq) == 40);
}

TEST_CASE("chanB keys: a saved and loaded cache attends identically, per-layer codecs and forks included") {
    kvq::test::cache_file::TempDir dir;
    auto c = chan_config("chan3", "q4_0");
    c.n_layers = 2;
    c.layer_codecs = {{"chan3", "polar:budget=3.5"}, {"q8_0", "q4_0"}};
    c.sliding_window = {0, 48};
    kvq::KVCache cache(c);
    const auto k = biased_keys(100, 7), v = kvq::test::gaussian(100 * kKv * kDim, 8);
    const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 9);
    const auto a = cache.add_sequence();
    for (int l = 0; l < 2; ++l) cache.append(l, a, k.data(), v.data(), 70);
    const auto b = cache.fork(a);
    for (int l = 0; l < 2; ++l) cache.append(l, b, k.data() + 70 * kKv * kDim, v.data() + 70 * kKv * kDim, 30);
    cache.save(dir / "chan.kvq");
    const kvq::KVCache loaded = kvq::KVCache::load(dir / "chan.kvq");
    CHECK(loaded.key_codec(0).name() == "chan3");
    CHECK(loaded.key_codec(1).name() == "q8_0");
    CHECK(loaded.bytes_per_token() == cache.bytes_per_token());
    for (int l = 0; l < 2; ++l) {
        CAPTURE(l);
        CHECK(same_bits(attend(loaded, l, 0, q), attend(cache, l, a, q)));
        CHECK(same_bits(attend(loaded, l, 1, q), attend(cache, l, b, q)));
    }
    kvq::KVCache live(c);
    const auto ids = live.load_into(dir / "chan.kvq");
    REQUIRE(ids.size() == 2);
    CHECK(same_bits(attend(live, 0, ids[1], q), attend(cache, 0, b, q)));
    auto other = c;
    other.layer_codecs[0].key = "chan4";
    kvq::KVCache mismatched(other);
    CHECK_THROWS_AS(mismatched.load_into(dir / "chan.kvq"), kvq::ConfigMismatch);
    CHECK(mismatched.sequences().empty());
}

TEST_CASE("chanB keys: a block re-opened by a truncate seals anew over its rows as they read and the new ones") {
    kvq::KVCache cache(chan_config("chan8"));
    const auto k = biased_keys(64, 10), v = kvq::test::gaussian(64 * kKv * kDim, 11);
    const auto q = kvq::test::gaussian(size_t(kHeads) * kDim, 12, 0.5f);
    const auto seq = cache.add_sequence();
    cache.append(0, seq, k.data(), v.data(), 40);
    cache.truncate(seq, 20);  // into the sealed block 0
    cache.append(0, seq, k.data() + 20 * kKv * kDim, v.data() + 20 * kKv * kDim, 44);
    // Block 0 sealed again over its first 20 rows as the first sealing stored them and rows 20..31 as
    // given (the old minimums and steps, fitted to rows 20..39 too, are not reused).
    const size_t token = size_t(kKv) * kDim;
    auto again = k;
    const auto first = expected_keys(k, 32, 8);
    std::copy(first.begin(), first.begin() + 20 * token, again.begin());
    const auto stored = expected_keys(again, 64, 8);
    CHECK(relative_error(attend(cache, 0, seq, q), attention(q, stored, v, 64)) < 2e-5);
    // Keys far outside the range block 0 was sealed with: staged as given (they were clamped to the old
    // range), next to its first 25 rows as they read.
    auto other = biased_keys(5, 13);
    for (float& x : other) x *= 4;
    cache.truncate(seq, 25);
    cache.append(0, seq, other.data(), v.data(), 5);
    std::vector<float> now(stored.begin(), stored.begin() + 25 * token);
    now.insert(now.end(), other.begin(), other.end());
    std::vector<float> values(v.begin(), v.begin() + 25 * token);
    values.insert(values.end(), v.begin(), v.begin() + 5 * token);
    CHECK(relative_error(attend(cache, 0, seq, q), attention(q, now, values, 30)) < 2e-5);
}
