// Static key channel scales (CacheConfig::key_scales): the cache stores k ⊙ s and attends with q ⊘ s, so
// f32 keys give the same attention as without them, quantized keys put their error where s is small, and
// files keep the scales (format version 5) and refuse a cache of other scales.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "cache_file_util.hpp"
#include "kvq/errors.hpp"
#include "test_util.hpp"

namespace {

using namespace kvq::test::cache_file;

constexpr int kLayers = 2, kKv = 2, kHeads = 4, kDim = 64;  // GQA: two query heads per kv head
constexpr size_t kRow = size_t(kKv) * kDim, kQuery = size_t(kHeads) * kDim;

CacheConfig scales_config(const std::string& kc, const std::string& vc) {
    CacheConfig c;
    c.n_layers = kLayers;
    c.n_kv_heads = kKv;
    c.n_heads = kHeads;
    c.head_dim = kDim;
    c.block_tokens = 8;
    c.key_codec = kc;
    c.value_codec = vc;
    return c;
}

// Scales in [lo, hi], different for every layer, kv head and channel; layer 1 all ones when ones_layer.
std::vector<float> some_scales(float lo, float hi, bool ones_layer = false) {
    std::vector<float> s(size_t(kLayers) * kRow);
    for (size_t i = 0; i < s.size(); ++i) s[i] = lo + (hi - lo) * float((i * 37) % 101) / 100.0f;
    if (ones_layer) std::fill(s.begin() + kRow, s.end(), 1.0f);
    return s;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
    return m;
}

void random_tokens(size_t n, int n_kv, int d, uint64_t seed, std::vector<float>& k, std::vector<float>& v) {
    k = kvq::test::gaussian(n * n_kv * d, seed);
    v = kvq::test::gaussian(n * n_kv * d, seed ^ 0x5bd1e995u);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("key scales: f32 keys attend as without scales (attend, attend_prefill, attend_batch, GQA, both seals)") {
    for (const SealPolicy seal : {SealPolicy::on_block_full, SealPolicy::on_append}) {
        CAPTURE(static_cast<int>(seal));
        CacheConfig plain_cfg = scales_config("f32", "f32");
        plain_cfg.seal = seal;
        CacheConfig scaled_cfg = plain_cfg;
        scaled_cfg.key_scales = some_scales(0.25f, 4.0f, true);
        KVCache plain(plain_cfg), scaled(scaled_cfg);
        std::vector<float> k, v;
        random_tokens(45, kKv, kDim, 5, k, v);
        std::vector<SequenceId> ids;
        for (int s = 0; s < 2; ++s) {
            ids.push_back(plain.add_sequence());
            CHECK(scaled.add_sequence() == ids.back());
            for (int l = 0; l < kLayers; ++l) {
                plain.append(l, ids.back(), &k[s * 5 * kRow], &v[s * 5 * kRow], 37 + s);
                scaled.append(l, ids.back(), &k[s * 5 * kRow], &v[s * 5 * kRow], 37 + s);
            }
        }
        const auto q = kvq::test::gaussian(5 * kQuery, 3, 2.0f);
        for (int l = 0; l < kLayers; ++l) {
            CAPTURE(l);
            std::vector<float> a(kQuery), b(kQuery);
            plain.attend(l, ids[0], q.data(), a.data());
            scaled.attend(l, ids[0], q.data(), b.data());
            CHECK(max_abs_diff(a, b) < 1e-5);
            if (l == 1) CHECK(same_bits(a, b));  // a layer of ones is stored as given
            std::vector<float> pa(5 * kQuery), pb(5 * kQuery);
            plain.attend_prefill(l, ids[1], q.data(), 5, pa.data());
            scaled.attend_prefill(l, ids[1], q.data(), 5, pb.data());
            CHECK(max_abs_diff(pa, pb) < 1e-5);
            std::vector<float> ba(2 * kQuery), bb(2 * kQuery);
            plain.attend_batch(l, ids, q.data(), ba.data());
            scaled.attend_batch(l, ids, q.data(), bb.data());
            CHECK(max_abs_diff(ba, bb) < 1e-5);
            // attend_batch is attend of each sequence, bit for bit, with scales too.
            scaled.attend(l, ids[1], q.data() + kQuery, b.data());
            CHECK(same_bits(std::vector<float>(bb.begin() + kQuery, bb.end()), b));
        }
    }
}

TEST_CASE("key scales: the half append path stores what the float path stores") {
    CacheConfig cfg = scales_config("q8_0", "q4_0");
    cfg.key_scales = some_scales(0.5f, 3.0f);
    KVCache halves(cfg), floats(cfg);
    const size_t n = 20;
    std::vector<uint16_t> k16(n * kRow), v16(n * kRow);
    std::vector<float> k(n * kRow), v(n * kRow);
    // Values f16 and bf16 hold exactly: j/64 for |j| < 128.
    for (size_t i = 0; i < k.size(); ++i) {
        k[i] = float(int((i * 37) % 255) - 127) / 64.0f;
        v[i] = float(int((i * 91) % 255) - 127) / 64.0f;
    }
    for (const kvq::HalfType type : {kvq::HalfType::f16, kvq::HalfType::bf16}) {
        CAPTURE(static_cast<int>(type));
        for (size_t i = 0; i < k.size(); ++i) {
            uint32_t kb, vb;
            std::memcpy(&kb, &k[i], 4);
            std::memcpy(&vb, &v[i], 4);
            if (type == kvq::HalfType::bf16) {
                k16[i] = uint16_t(kb >> 16), v16[i] = uint16_t(vb >> 16);
            } else {
                const auto f16 = [](uint32_t u) -> uint16_t {
                    if ((u & 0x7fffffffu) == 0) return uint16_t(u >> 16);
                    return uint16_t(((u >> 16) & 0x8000u) | ((((u >> 23) & 0xffu) - 112u) << 10) | ((u & 0x7fffffu) >> 13));
                };
                k16[i] = f16(kb), v16[i] = f16(vb);
            }
        }
        const SequenceId a = halves.add_sequence(), b = floats.add_sequence();
        for (int l = 0; l < kLayers; ++l) {
            halves.append(l, a, k16.data(), v16.data(), n, type);
            floats.append(l, b, k.data(), v.data(), n);
        }
        const auto q = kvq::test::gaussian(kQuery, 4);
        for (int l = 0; l < kLayers; ++l) {
            std::vector<float> x(kQuery), y(kQuery);
            halves.attend(l, a, q.data(), x.data());
            floats.attend(l, b, q.data(), y.data());
            CHECK(same_bits(x, y));
        }
    }
}

TEST_CASE("key scales: q4_0+rot keys read by queries on a few channels err less with those channels scaled up") {
    // Queries that read 8 of 64 channels; keys of equal size on every channel. Scaled up by 8 there (s = 8,
    // q ⊘ s), the keys' rounding error, spread over every channel by the rotation, reaches the scores
    // through q ⊘ s: an eighth as much of it as without scales.
    CacheConfig cfg = scales_config("q4_0+rot", "f32");
    cfg.n_layers = 1;
    std::vector<float> s(kRow, 1.0f);
    for (int h = 0; h < kKv; ++h) {
        for (int j = 0; j < 8; ++j) s[h * kDim + j * 8] = 8.0f;
    }
    const size_t n = 200;
    std::vector<float> k, v;
    random_tokens(n, kKv, kDim, 17, k, v);
    double err[2] = {0, 0};
    for (int scaled = 0; scaled < 2; ++scaled) {
        CacheConfig c = cfg;
        if (scaled) c.key_scales = s;
        KVCache cache(c);
        const SequenceId id = cache.add_sequence();
        cache.append(0, id, k.data(), v.data(), n);
        for (uint64_t trial = 0; trial < 8; ++trial) {
            auto q = kvq::test::gaussian(kQuery, 100 + trial, 3.0f);
            for (size_t i = 0; i < q.size(); ++i) {
                if (i % kDim % 8 != 0) q[i] = 0.0f;
            }
            std::vector<float> out(kQuery);
            cache.attend(0, id, q.data(), out.data());
            const auto ref = kvq::test::decode_attention_double(q, k, v, n, kHeads, kKv, kDim);
            err[scaled] += kvq::test::relative_error(out, ref);
        }
    }
    MESSAGE("relative attention error without scales " << err[0] / 8 << ", with " << err[1] / 8);
    CHECK(err[1] < 0.5 * err[0]);
}

TEST_CASE("key scales: scores that overflow float are recomputed in double on the stored rows, as without scales") {
    CacheConfig plain_cfg = scales_config("f32", "f32");
    CacheConfig scaled_cfg = plain_cfg;
    scaled_cfg.key_scales = some_scales(1.0f, 2.0f);  // q ⊘ s no larger than q
    KVCache plain(plain_cfg), scaled(scaled_cfg);
    std::vector<float> k, v;
    random_tokens(30, kKv, kDim, 8, k, v);
    const SequenceId a = plain.add_sequence(), b = scaled.add_sequence();
    plain.append(0, a, k.data(), v.data(), 30);
    scaled.append(0, b, k.data(), v.data(), 30);
    auto q = kvq::test::gaussian(kQuery, 12);
    for (float& x : q) x = std::clamp(x, -3.0f, 3.0f) * 1e38f;  // finite, and scores far beyond float
    std::vector<float> x(kQuery), y(kQuery);
    plain.attend(0, a, q.data(), x.data());
    scaled.attend(0, b, q.data(), y.data());
    for (float f : y) REQUIRE(std::isfinite(f));
    // Both softmaxes are one-hot at the same key.
    CHECK(max_abs_diff(x, y) < 1e-5);
}

TEST_CASE("key scales: a finite query that overflows once divided by the scales is refused, under every policy") {
    for (kvq::NanPolicy policy : {kvq::NanPolicy::reject, kvq::NanPolicy::propagate}) {
        CacheConfig cfg = scales_config("q8_0", "q8_0");
        cfg.nan_policy = policy;
        cfg.key_scales = some_scales(1e-3f, 1e-2f);  // 1/s up to 1000
        KVCache cache(cfg);
        std::vector<float> k, v;
        random_tokens(9, kKv, kDim, 3, k, v);
        const SequenceId id = cache.add_sequence();
        const SequenceId id2 = cache.add_sequence();
        cache.append(0, id, k.data(), v.data(), 9);
        cache.append(0, id2, k.data(), v.data(), 9);
        auto q = kvq::test::gaussian(2 * kQuery, 5);
        q[kQuery + 3] = 1e37f;  // finite, but 1e37 × 1/s is not; query vector 4 + 0 (the second token's head 0)
        std::vector<float> out(2 * kQuery, 7.0f);
        CHECK_THROWS_AS(cache.attend(0, id, q.data() + kQuery, out.data()), kvq::NonFiniteInput);
        CHECK_THROWS_WITH_AS(cache.attend_prefill(0, id, q.data(), 2, out.data()),
                             doctest::Contains("query vector 4 divided by layer 0's key_scales overflows"),
                             kvq::NonFiniteInput);
        const SequenceId ids[] = {id, id2};
        CHECK_THROWS_AS(cache.attend_batch(0, std::span<const SequenceId>(ids), q.data(), out.data()), kvq::NonFiniteInput);
        for (float f : out) CHECK(f == 7.0f);  // nothing written
        q[kQuery + 3] = 1.0f;
        cache.attend(0, id, q.data() + kQuery, out.data());  // and the cache still attends
        for (size_t i = 0; i < kQuery; ++i) REQUIRE(std::isfinite(out[i]));
    }
}

TEST_CASE("key scales: bad scales are refused by validate_config and the constructor") {
    CacheConfig cfg = scales_config("q8_0", "q4_0");
    const auto refused = [&](std::vector<float> s, const char* fragment) {
        CacheConfig c = cfg;
        c.key_scales = std::move(s);
        const std::string what = error_of<kvq::BadParams>([&] { kvq::validate_config(c); });
        CHECK(what.find(fragment) != std::string::npos);
        CHECK_THROWS_AS(KVCache{c}, std::invalid_argument);
    };
    refused(std::vector<float>(kRow, 1.0f), "key_scales has 128 entries");
    const std::vector<float> good = some_scales(0.5f, 2.0f);
    for (const float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            1e-45f /* its reciprocal overflows */}) {
        CAPTURE(bad);
        std::vector<float> s = good;
        s[kRow + 5] = bad;
        refused(s, "key_scales[133] (layer 1)");
    }
    cfg.key_scales = good;
    CHECK(kvq::validate_config(cfg).key_scales == good);
}

TEST_CASE("key scales: save and load keep the scales and the outputs bit for bit, load_into refuses other scales") {
    TempDir dir;
    CacheConfig cfg = scales_config("q4_0+rot", "q4_0");
    cfg.center_keys = true;
    cfg.key_scales = some_scales(0.5f, 4.0f);
    KVCache cache = populated(cfg);
    const std::string path = dir / "scaled.kvq";
    cache.save(path);
    const auto bytes = slurp(path);
    CHECK(bytes[8] == 5);
    KVCache loaded = KVCache::load(path);
    CHECK(loaded.config().key_scales == cfg.key_scales);
    CHECK(same_bits(outputs(loaded, loaded.sequences()), outputs(cache, cache.sequences())));
    loaded.save(dir / "again.kvq");
    CHECK(slurp(dir / "again.kvq") == bytes);
    // The loaded cache goes on as the saved one.
    append(cache, 0, 13, 50);
    append(loaded, 0, 13, 50);
    CHECK(same_bits(outputs(loaded, loaded.sequences()), outputs(cache, cache.sequences())));
    // Into a cache of the same scales, and not into one of other scales or none.
    KVCache same(cfg);
    CHECK(same.load_into(path).size() == 3);
    for (const bool none : {false, true}) {
        CacheConfig other = cfg;
        if (none) {
            other.key_scales.clear();
        } else {
            other.key_scales[77] = std::nextafter(other.key_scales[77], 10.0f);
        }
        KVCache live = populated(other);
        const Snapshot before(live);
        const std::string what = error_of<kvq::ConfigMismatch>([&] { live.load_into(path); });
        CHECK(what.find(none ? "key_scales is 256 values" : "key_scales[77]") != std::string::npos);
        CHECK(Snapshot(live) == before);
    }
    // A cache without scales writes version 3 (older kvq reads it), which loads without scales.
    CacheConfig plain = cfg;
    plain.key_scales.clear();
    populated(plain).save(dir / "plain.kvq");
    CHECK(slurp(dir / "plain.kvq")[8] == 3);
    CHECK(KVCache::load(dir / "plain.kvq").config().key_scales.empty());
}

TEST_CASE("key scales: a file of bad scales (NaN, zero, a wrong count) is BadCacheFile, with the cache unchanged") {
    TempDir dir;
    CacheConfig cfg = scales_config("q8_0", "q4_0");
    cfg.key_scales = some_scales(0.5f, 4.0f);
    KVCache cache = populated(cfg);
    const std::string path = dir / "good.kvq", bad = dir / "bad.kvq";
    cache.save(path);
    const auto good = slurp(path);
    uint32_t header_bytes;
    std::memcpy(&header_bytes, &good[12], 4);
    const size_t n = cfg.key_scales.size(), first = header_bytes - 4 - 4 * n;  // the scales end the header
    const auto with_crc = [&](std::vector<uint8_t> b) {
        const uint32_t crc = kvq::detail::crc32c(b.data(), header_bytes - 4);
        std::memcpy(&b[header_bytes - 4], &crc, 4);
        return b;
    };
    KVCache live = populated(cfg);
    const Snapshot before(live);
    const auto refused = [&](std::vector<uint8_t> b, const char* fragment) {
        spit(bad, with_crc(std::move(b)));
        const std::string into = error_of<kvq::BadCacheFile>([&] { live.load_into(bad); });
        CHECK(into.find(fragment) != std::string::npos);
        CHECK(Snapshot(live) == before);
        const std::string load = error_of<kvq::BadCacheFile>([&] { KVCache::load(bad); });
        CHECK(load.find(fragment) != std::string::npos);
    };
    for (const float x : {std::numeric_limits<float>::quiet_NaN(), 0.0f, -2.0f, 1e-45f}) {
        CAPTURE(x);
        auto b = good;
        std::memcpy(&b[first + 4 * 9], &x, 4);
        refused(b, "key scale 9 is");
    }
    auto b = good;
    const uint32_t one = 1;
    std::memcpy(&b[first - 4], &one, 4);
    refused(b, "1 key scales for 256");
    CHECK(live.load_into(path).size() == 3);  // the good file, after all that
}

TEST_CASE("key scales: append checks k ⊙ s against the key codec's range and stores nothing when it fails") {
    CacheConfig cfg = scales_config("q8_0", "q4_0");
    cfg.key_scales.assign(size_t(kLayers) * kRow, 1000.0f);
    KVCache cache(cfg);
    const SequenceId id = cache.add_sequence();
    std::vector<float> k(kRow, 1.0f), v(kRow, 1.0f);
    cache.append(0, id, k.data(), v.data(), 1);
    k[3] = 1e4f;  // within q8_0's range, 1e7 once scaled is not
    const std::string what = error_of<std::invalid_argument>([&] { cache.append(0, id, k.data(), v.data(), 1); });
    CHECK(what.find("k (times key_scales) of token 0, kv head 0 is beyond the key codec's range") != std::string::npos);
    CHECK(cache.n_tokens(id, 0) == 1);
    KVCache plain(scales_config("q8_0", "q4_0"));
    const SequenceId p = plain.add_sequence();
    plain.append(0, p, k.data(), v.data(), 1);
    CHECK(cache.dump().find("key channel scales") != std::string::npos);
}
