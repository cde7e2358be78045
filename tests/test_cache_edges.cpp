// The cache at the edges of what its codecs store: rows beyond a codec's range (an fp16 scale or norm
// would overflow) are rejected like NaN, or poison their head under NanPolicy::propagate; zero rows give
// exact zeros; subnormal rows give finite output. Every failure leaves the cache exactly as it was.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvq/cache.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::NanPolicy;
using kvq::SealPolicy;

namespace {

constexpr int kKv = 2, kD = 64;
constexpr size_t kRow = kKv * kD;

CacheConfig config(const std::string& kc, const std::string& vc, SealPolicy seal) {
    CacheConfig cfg;
    cfg.n_kv_heads = kKv;
    cfg.n_heads = 4;
    cfg.head_dim = kD;
    cfg.block_tokens = 8;
    cfg.key_codec = kc;
    cfg.value_codec = vc;
    cfg.seal = seal;
    return cfg;
}

std::vector<float> attend(const KVCache& c, kvq::SequenceId s, const std::vector<float>& q) {
    std::vector<float> out(q.size());
    c.attend(0, s, q.data(), out.data());
    return out;
}

// Everything observable about a cache, bit for bit.
struct Snapshot {
    std::string dump;
    size_t bytes;
    kvq::PoolStats pool;
    std::vector<std::vector<float>> outs;
    Snapshot(const KVCache& c, const std::vector<float>& q) : dump(c.dump()), bytes(c.bytes_used()), pool(c.pool_stats()) {
        for (auto s : c.sequences()) {
            if (c.n_tokens(s) > 0) outs.push_back(attend(c, s, q));
        }
    }
    bool operator==(const Snapshot& o) const {
        if (dump != o.dump || bytes != o.bytes || outs.size() != o.outs.size()) return false;
        if (pool.blocks_used != o.pool.blocks_used || pool.blocks_total != o.pool.blocks_total) return false;
        for (size_t i = 0; i < outs.size(); ++i) {
            if (std::memcmp(outs[i].data(), o.outs[i].data(), outs[i].size() * sizeof(float)) != 0) return false;
        }
        return true;
    }
};

const std::vector<std::pair<std::string, std::string>> kPairs = {
    {"q8_0", "q4_0"}, {"f16", "q4_1"}, {"q5_0+rot", "q5_1"}, {"polar", "turbo3"}, {"turbo4_qjl", "f16"}};

}  // namespace

TEST_CASE("rows beyond a codec's range are rejected with the cache unchanged, or poison their head under propagate") {
    for (const auto& pair : kPairs) {
        const std::string &kc = pair.first, &vc = pair.second;  // clang 14 cannot capture bindings
        for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
            CAPTURE(kc);
            CAPTURE(vc);
            CacheConfig cfg = config(kc, vc, seal);
            KVCache cache(cfg);
            const auto seq = cache.add_sequence();
            auto k = kvq::test::gaussian(12 * kRow, 1), v = kvq::test::gaussian(12 * kRow, 2);
            cache.append(0, seq, k.data(), v.data(), 5);
            const auto q = kvq::test::gaussian(4 * kD, 3);
            const Snapshot before(cache, q);

            auto big_k = k;
            big_k[7 * kRow + kD + 1] = 3e38f;  // token 7 of the batch, kv head 1: beyond every fp16 field
            CHECK_THROWS_WITH_AS(cache.append(0, seq, big_k.data(), v.data(), 12),
                                 doctest::Contains("k of token 7, kv head 1 is beyond the key codec's range"),
                                 std::invalid_argument);
            auto big_v = v;
            big_v[2 * kRow + 5] = -1e38f;
            CHECK_THROWS_WITH_AS(cache.append(0, seq, k.data(), big_v.data(), 3),
                                 doctest::Contains("v of token 2, kv head 0 is beyond the value codec's range"),
                                 std::invalid_argument);
            CHECK(Snapshot(cache, q) == before);

            cfg.nan_policy = NanPolicy::propagate;
            KVCache lenient(cfg);
            const auto s2 = lenient.add_sequence();
            lenient.append(0, s2, big_k.data(), v.data(), 12);
            const auto out = attend(lenient, s2, q);
            for (int i = 0; i < 2 * kD; ++i) CHECK(std::isfinite(out[i]));  // heads 0, 1 read kv head 0
            bool head1_nonfinite = true;
            for (int i = 2 * kD; i < 4 * kD; ++i) head1_nonfinite = head1_nonfinite && !std::isfinite(out[i]);
            CHECK(head1_nonfinite);
        }
    }
}

TEST_CASE("centered keys: keys whose block mean or centered value would overflow fp16 are rejected") {
    CacheConfig cfg = config("q8_0", "q4_0", SealPolicy::on_block_full);
    cfg.center_keys = true;
    KVCache cache(cfg);
    const auto seq = cache.add_sequence();
    auto k = kvq::test::gaussian(8 * kRow, 4), v = kvq::test::gaussian(8 * kRow, 5);
    k[3 * kRow] = 70000.0f;  // within q8_0's range (8.3e6), but not as an fp16 mean
    const auto q = kvq::test::gaussian(4 * kD, 6);
    CHECK_THROWS_WITH_AS(cache.append(0, seq, k.data(), v.data(), 8), doctest::Contains("beyond the key codec's range"),
                         std::invalid_argument);
    CHECK(cache.n_tokens(seq) == 0);
    CHECK(cache.bytes_used() == cache.metadata_bytes());
    k[3 * kRow] = 30000.0f;
    cache.append(0, seq, k.data(), v.data(), 8);
    for (float x : attend(cache, seq, q)) CHECK(std::isfinite(x));
}

TEST_CASE("zero keys and values give exactly zero output, subnormal ones give finite output") {
    for (const auto& pair : kPairs) {
        const std::string &kc = pair.first, &vc = pair.second;  // clang 14 cannot capture bindings
        for (SealPolicy seal : {SealPolicy::on_append, SealPolicy::on_block_full}) {
            CAPTURE(kc);
            CAPTURE(vc);
            KVCache cache(config(kc, vc, seal));
            const auto zero = cache.add_sequence(), tiny = cache.add_sequence();
            const std::vector<float> zeros(20 * kRow, 0.0f);
            cache.append(0, zero, zeros.data(), zeros.data(), 20);
            auto k = kvq::test::gaussian(20 * kRow, 7), v = kvq::test::gaussian(20 * kRow, 8);
            for (float& x : k) x *= 1e-40f;
            for (float& x : v) x *= 1e-42f;
            cache.append(0, tiny, k.data(), v.data(), 20);
            const auto q = kvq::test::gaussian(4 * kD, 9);
            for (float x : attend(cache, zero, q)) REQUIRE(x == 0.0f);
            for (float x : attend(cache, tiny, q)) {
                REQUIRE(std::isfinite(x));
                CHECK(std::fabs(x) < 1e-30f);
            }
        }
    }
}
