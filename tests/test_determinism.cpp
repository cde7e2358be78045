// Determinism: the same inputs and seed give the same bytes on every call and at every SIMD level
// (quantized rows, prepared queries, dequantized values), on ordinary rows and on the edge rows (zeros,
// subnormals, values at the codec's range, NaN under NanPolicy::propagate). Attention from the cache is
// bit-identical between two runs at the same level (score and accumulate may differ between levels by
// float rounding only, which test_simd_parity.cpp and test_simd_scores.cpp bound).
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/simd.hpp"
#include "test_util.hpp"

using kvq::Codec;
using kvq::NanPolicy;

namespace {

constexpr int kD = 64;

// Ordinary rows, then one edge row each: zeros, subnormals, a row at the range, mixed magnitudes.
std::vector<float> rows_for(const Codec& c) {
    auto x = kvq::test::gaussian(12 * kD, 99);
    for (int j = 0; j < kD; ++j) x[8 * kD + j] = 0.0f;
    for (int j = 0; j < kD; ++j) x[9 * kD + j] *= 1e-41f;
    const kvq::InputLimit limit = c.input_limit();
    const double norm = limit.size_of(&x[10 * kD], kD);
    for (int j = 0; j < kD; ++j) x[10 * kD + j] = static_cast<float>(x[10 * kD + j] * (0.99 * limit.max_abs / norm));
    for (int j = 0; j < kD; j += 2) x[11 * kD + j] *= 1e-39f;
    return x;
}

struct Bytes {
    std::vector<uint8_t> rows, nan_rows, prep;
    std::vector<float> back;
};

Bytes encode(const Codec& c) {
    const auto x = rows_for(c);
    const size_t n = x.size() / kD;
    Bytes b;
    b.rows.resize(n * c.row_bytes());
    c.quantize_rows(x.data(), n, b.rows.data());
    auto with_nan = x;
    with_nan[3 * kD + 40] = NAN;
    with_nan[5 * kD + 1] = -INFINITY;
    b.nan_rows.resize(n * c.row_bytes());
    c.quantize_rows(with_nan.data(), n, b.nan_rows.data(), 0, NanPolicy::propagate);
    b.prep.resize(4 * c.query_bytes());
    c.prepare_queries(x.data(), 4, b.prep.data());
    b.back.resize(n * kD);
    c.dequantize_rows(b.rows.data(), n, b.back.data());
    return b;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("every codec gives the same bytes on every call and at every SIMD level") {
    const kvq::SimdLevel saved = kvq::simd_level();
    for (const auto& name : kvq::codec_names()) {
        for (const std::string& spec : {name, name + "+rot"}) {
            CAPTURE(spec);
            for (uint64_t seed : {kvq::kDefaultSeed, uint64_t(12345)}) {
                const Codec c = Codec::make(spec, kD, seed);
                kvq::force_simd_level(kvq::SimdLevel::scalar);
                const Bytes spec_bytes = encode(c);
                for (auto level : kvq::available_simd_levels()) {
                    CAPTURE(std::string(kvq::simd_level_name(level)));
                    kvq::force_simd_level(level);
                    const Bytes a = encode(c), b = encode(c);
                    CHECK(a.rows == b.rows);
                    CHECK(a.rows == spec_bytes.rows);
                    CHECK(a.nan_rows == spec_bytes.nan_rows);
                    CHECK(a.prep == spec_bytes.prep);
                    CHECK(same_bits(a.back, spec_bytes.back));
                }
            }
        }
    }
    kvq::force_simd_level(saved);
}

TEST_CASE("a cache gives bit-identical attention on every run at a given SIMD level") {
    const kvq::SimdLevel saved = kvq::simd_level();
    auto run = [](int threads) {
        kvq::CacheConfig cfg;
        cfg.n_layers = 2;
        cfg.n_kv_heads = 2;
        cfg.n_heads = 4;
        cfg.head_dim = kD;
        cfg.block_tokens = 16;
        cfg.key_codec = "q8_0+rot";
        cfg.value_codec = "turbo3";
        cfg.threads = threads;
        kvq::KVCache cache(cfg);
        const auto a = cache.add_sequence();
        const auto k = kvq::test::gaussian(100 * 2 * kD, 1), v = kvq::test::gaussian(100 * 2 * kD, 2);
        for (int layer = 0; layer < 2; ++layer) cache.append(layer, a, k.data(), v.data(), 70);
        const auto b = cache.fork(a);
        cache.truncate(b, 50);
        for (int layer = 0; layer < 2; ++layer) cache.append(layer, b, &k[70 * 2 * kD], &v[70 * 2 * kD], 30);
        const auto q = kvq::test::gaussian(4 * kD, 3);
        std::vector<float> out;
        for (auto s : {a, b}) {
            for (int layer = 0; layer < 2; ++layer) {
                std::vector<float> o(4 * kD);
                cache.attend(layer, s, q.data(), o.data());
                out.insert(out.end(), o.begin(), o.end());
            }
        }
        return std::make_pair(out, cache.bytes_used());
    };
    for (auto level : kvq::available_simd_levels()) {
        CAPTURE(std::string(kvq::simd_level_name(level)));
        kvq::force_simd_level(level);
        for (int threads : {1, 2}) {
            const auto first = run(threads), second = run(threads);
            CHECK(same_bits(first.first, second.first));
            CHECK(first.second == second.second);
        }
    }
    kvq::force_simd_level(saved);
}
