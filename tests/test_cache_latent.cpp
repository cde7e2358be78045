// Keys and values of different head sizes (CacheConfig::head_dim_v) and DeepSeek's latent cache
// (CacheConfig::latent_values: one stored row per token whose leading head_dim_v values are the value).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/errors.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

// Attention in double over the rows as the codecs read them back: query head h of kv head h / g.
std::vector<float> reference(const kvq::Codec& kc, const kvq::Codec& vc, const std::vector<float>& k,
                             const std::vector<float>* v, size_t n, int n_kv, int n_heads, const std::vector<float>& q) {
    const int dk = kc.head_dim(), dv = vc.head_dim(), g = n_heads / n_kv;
    std::vector<float> kd(n * n_kv * dk), vd(n * n_kv * dv), qe(dk), out(n_heads * dv);
    for (size_t r = 0; r < n * n_kv; ++r) {
        std::vector<uint8_t> row(kc.row_bytes());
        kc.quantize_rows(&k[r * dk], 1, row.data());
        kc.dequantize_rows(row.data(), 1, &kd[r * dk]);
        if (v) {
            std::vector<uint8_t> vrow(vc.row_bytes());
            vc.quantize_rows(&(*v)[r * dv], 1, vrow.data());
            vc.dequantize_rows(vrow.data(), 1, &vd[r * dv]);
        } else {
            std::copy_n(&kd[r * dk], dv, &vd[r * dv]);  // the latent: the key's leading values
        }
    }
    for (int h = 0; h < n_heads; ++h) {
        kc.effective_query(&q[h * dk], qe.data());
        std::vector<double> s(n);
        double mx = -INFINITY, sum = 0;
        for (size_t t = 0; t < n; ++t) {
            double dot = 0;
            for (int j = 0; j < dk; ++j) dot += double(qe[j]) * kd[(t * n_kv + h / g) * dk + j];
            s[t] = dot / std::sqrt(double(dk));
            mx = std::max(mx, s[t]);
        }
        std::vector<double> acc(dv, 0.0);
        for (size_t t = 0; t < n; ++t) {
            const double w = std::exp(s[t] - mx);
            sum += w;
            for (int j = 0; j < dv; ++j) acc[j] += w * vd[(t * n_kv + h / g) * dv + j];
        }
        for (int j = 0; j < dv; ++j) out[h * dv + j] = static_cast<float>(acc[j] / sum);
    }
    return out;
}

}  // namespace

TEST_CASE("cache: values of another head size (192/128) attend as attend_rows on the same rows, bit for bit") {
    CacheConfig cfg;
    cfg.n_kv_heads = 2;
    cfg.n_heads = 8;
    cfg.head_dim = 192;
    cfg.head_dim_v = 128;
    cfg.key_codec = "q8_0";
    cfg.value_codec = "q4_0";
    cfg.block_tokens = 256;
    cfg.seal = kvq::SealPolicy::on_append;
    KVCache cache(cfg);
    CHECK(cache.config().head_dim_v == 128);
    CHECK(cache.value_codec().head_dim() == 128);
    CHECK(cache.bytes_per_token() == doctest::Approx(2 * (cache.key_codec().row_bytes() + cache.value_codec().row_bytes())));
    const auto s = cache.add_sequence();
    const size_t n = 600;
    const auto k = kvq::test::gaussian(n * 2 * 192, 1), v = kvq::test::gaussian(n * 2 * 128, 2);
    cache.append(0, s, k.data(), v.data(), n);
    const auto q = kvq::test::gaussian(8 * 192, 3, 0.3f);
    std::vector<float> got(8 * 128, NAN);
    cache.attend(0, s, q.data(), got.data());
    const auto& kc = cache.key_codec();
    const auto& vc = cache.value_codec();
    std::vector<uint8_t> kt(n * 2 * kc.row_bytes()), vt(n * 2 * vc.row_bytes());
    kc.quantize_rows(k.data(), n * 2, kt.data());
    vc.quantize_rows(v.data(), n * 2, vt.data());
    std::vector<float> rows(8 * 128, NAN);
    kvq::attend_rows(kc, vc, 8, 2, q.data(), {kt.data()}, {vt.data()}, n, rows.data());
    CHECK(same_bits(got, rows));
    CHECK(max_abs_diff(got, reference(kc, vc, k, &v, n, 2, 8, q)) < 2e-5f);
    // prefill and batch give 128-value results too
    std::vector<float> pre(3 * 8 * 128, NAN), batch(2 * 8 * 128, NAN);
    const auto q3 = kvq::test::gaussian(3 * 8 * 192, 4, 0.3f);
    cache.attend_prefill(0, s, q3.data(), 3, pre.data());
    std::vector<float> last(8 * 128);
    cache.attend(0, s, q3.data() + 2 * 8 * 192, last.data());
    CHECK(max_abs_diff(std::vector<float>(pre.begin() + 2 * 8 * 128, pre.end()), last) < 1e-5f);
    const auto s2 = cache.fork(s);
    const kvq::SequenceId ids[] = {s, s2};
    std::vector<float> q2(q.begin(), q.end());
    q2.insert(q2.end(), q.begin(), q.end());
    cache.attend_batch(0, ids, q2.data(), batch.data());
    CHECK(same_bits(std::vector<float>(batch.begin(), batch.begin() + 8 * 128), got));
    CHECK(same_bits(std::vector<float>(batch.begin() + 8 * 128, batch.end()), got));
}

TEST_CASE("cache: a latent cache (MLA, 576/512) stores keys only and its values are their leading 512 values") {
    for (const char* codec : {"q8_0", "q4_0", "f16"}) {
        for (const auto seal : {kvq::SealPolicy::on_append, kvq::SealPolicy::on_block_full}) {
            CAPTURE(codec);
            CAPTURE(int(seal));
            CacheConfig cfg;
            cfg.n_layers = 2;
            cfg.n_kv_heads = 1;
            cfg.n_heads = 16;
            cfg.head_dim = 576;
            cfg.head_dim_v = 512;
            cfg.latent_values = true;
            cfg.key_codec = codec;
            cfg.value_codec = "";
            cfg.block_tokens = 256;
            cfg.seal = seal;
            KVCache cache(cfg);
            // one row per token: no value bytes
            CHECK(cache.bytes_per_token(0) == doctest::Approx(double(cache.key_codec().row_bytes())));
            CHECK(cache.value_codec().name() == cache.key_codec().name());
            CHECK(cache.value_codec().head_dim() == 512);
            const auto s = cache.add_sequence();
            const size_t n = 700;  // two sealed blocks and an open one
            const auto k = kvq::test::gaussian(n * 576, 10);
            cache.append(0, s, k.data(), nullptr, n - 100);
            cache.append(0, s, k.data() + (n - 100) * 576, nullptr, 100);
            CHECK_THROWS_AS(cache.append(0, s, k.data(), k.data(), 1), std::invalid_argument);  // v must be null
            const auto q = kvq::test::gaussian(16 * 576, 11, 0.05f);
            std::vector<float> got(16 * 512, NAN);
            cache.attend(0, s, q.data(), got.data());
            const auto& kc = cache.key_codec();
            const auto want = reference(kc, cache.value_codec(), k, nullptr, n, 1, 16, q);
            // on_block_full keeps the open block's 188 rows exact: the reference quantizes them (a bound, not bits)
            CHECK(max_abs_diff(got, want) < (seal == kvq::SealPolicy::on_append ? 2e-5f : 0.05f));
            if (seal == kvq::SealPolicy::on_append) {
                // the row API on the same bytes, V a view of K: the same bits
                std::vector<uint8_t> kt(n * kc.row_bytes());
                kc.quantize_rows(k.data(), n, kt.data());
                std::vector<float> rows(16 * 512, NAN);
                kvq::attend_rows(kc, cache.value_codec(), 16, 1, q.data(), {kt.data()}, {kt.data(), kc.row_bytes()}, n, rows.data());
                CHECK(same_bits(got, rows));
            }
            // saved and loaded: the same cache, the same output
            const std::string path = "latent_" + std::string(codec) + std::to_string(int(seal)) + ".kvq";
            cache.save(path);
            KVCache back = KVCache::load(path);
            std::remove(path.c_str());
            CHECK(back.config().latent_values);
            CHECK(back.config().head_dim_v == 512);
            std::vector<float> again(16 * 512, NAN);
            back.attend(0, back.sequences()[0], q.data(), again.data());
            CHECK(same_bits(again, got));
            // truncate into a sealed block and append again: still the keys' own values
            cache.truncate(s, 300);
            cache.append(0, s, k.data() + 300 * 576, nullptr, n - 300);
            std::vector<float> after(16 * 512, NAN);
            cache.attend(0, s, q.data(), after.data());
            CHECK(max_abs_diff(after, want) < (seal == kvq::SealPolicy::on_append ? 2e-5f : 0.05f));
        }
    }
}

TEST_CASE("cache: what a latent cache refuses, with its reason") {
    CacheConfig cfg;
    cfg.n_kv_heads = 1;
    cfg.head_dim = 576;
    cfg.head_dim_v = 512;
    cfg.latent_values = true;
    cfg.key_codec = "q8_0";
    cfg.value_codec = "";
    CHECK_NOTHROW(kvq::validate_config(cfg));
    const auto refused = [&](CacheConfig c, const char* why) {
        CAPTURE(why);
        CHECK_THROWS_WITH_AS(kvq::validate_config(c), doctest::Contains(why), kvq::BadParams);
    };
    CacheConfig c = cfg;
    c.key_codec = "q4_0+rot";
    refused(c, "leading values");
    c.key_codec = "turbo4";
    refused(c, "leading values");
    c = cfg;
    c.value_codec = "q4_0";
    refused(c, "must be empty or the key codec");
    c = cfg;
    c.head_dim_v = 600;
    refused(c, "at most head_dim");
    c = cfg;
    c.head_dim_v = 500;
    refused(c, "multiple of");
    c = cfg;
    c.center_keys = true;
    refused(c, "center_keys");
    c = cfg;
    c.key_codec = "q8_0+sink4";
    refused(c, "leading values");
    c = cfg;
    c.latent_values = false;
    c.value_codec = "q4_0";
    c.head_dim_v = 0;
    CHECK(kvq::validate_config(c).head_dim_v == 576);  // 0: the keys' head size
    c.head_dim_v = -1;
    CHECK_THROWS_AS(kvq::validate_config(c), kvq::BadHeadDim);
}
