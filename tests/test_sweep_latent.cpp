// `kvq table`'s latent rows (DeepSeek's MLA, issue 54): the mla data set has DeepSeek V3's shapes, its
// reference is attention with 576-value keys and their first 512 values as the values, its quantized rows
// are a latent KVCache's, f32 is exact and fewer bits give more error, and formats a latent cache refuses
// are rows with the cache's reason.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "codec/key_formats.hpp"
#include "eval/json_reader.hpp"
#include "eval/quantized_attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/research/eval.hpp"
#include "kvq/research/report.hpp"
#include "kvq/research/sweep.hpp"
#include "sweep_rows.hpp"

namespace {

using kvq::test::row;
using kvq::test::sweep;

constexpr int kDk = 576, kDv = 512;
const char* kTiny = "mla:tokens=96,q_heads=4,query_positions=2";

// Attention as the definition reads, in double: scores q·k over all dk values, the output a weighted sum of
// the key rows' first dv values (V a view of K). q: dk floats, k: n rows of dk floats; out: dv values.
std::vector<double> naive_latent_attention(const float* q, const float* k, size_t n, int dk, int dv, double scale) {
    std::vector<double> s(n), out(size_t(dv), 0.0);
    double top = -INFINITY, sum = 0;
    for (size_t r = 0; r < n; ++r) {
        double dot = 0;
        for (int j = 0; j < dk; ++j) dot += double(q[j]) * k[r * dk + j];
        top = std::max(top, s[r] = dot * scale);
    }
    for (double& x : s) sum += (x = std::exp(x - top));
    for (size_t r = 0; r < n; ++r)
        for (int j = 0; j < dv; ++j) out[j] += s[r] / sum * k[r * dk + j];
    return out;
}

double relative_l2(const float* got, const std::vector<double>& want) {
    double diff = 0, norm = 0;
    for (size_t j = 0; j < want.size(); ++j) {
        diff += (got[j] - want[j]) * (got[j] - want[j]);
        norm += want[j] * want[j];
    }
    return std::sqrt(diff / norm);
}

}  // namespace

TEST_CASE("mla data set: DeepSeek V3's shapes, the values are the keys' first 512, reproducible from the seed") {
    const auto d = kvq::make_dataset("mla");
    CHECK(d.latent);
    CHECK(d.head_dim == kDk);
    CHECK(d.dv() == kDv);
    CHECK(d.kv_heads == 1);
    CHECK(d.q_heads == 128);
    CHECK(d.layers == 1);
    CHECK(d.tokens == 2048);
    CHECK(d.v.empty());  // no values of their own
    CHECK(d.softmax_scale() == doctest::Approx(1.0 / std::sqrt(192.0)));
    const auto k = d.keys(0, 0, 8), v = d.values(0, 0, 8);
    REQUIRE(v.size() == 8 * size_t(kDv));
    for (size_t t = 0; t < 8; ++t) CHECK(std::equal(v.begin() + t * kDv, v.begin() + (t + 1) * kDv, k.begin() + t * kDk));
    // The recipe of bench/mla_accuracy.py: rope values of std 3, latent channels of log-normal scale (median 1).
    double rope = 0;
    for (size_t t = 0; t < size_t(d.tokens); ++t)
        for (int j = kDv; j < kDk; ++j) rope += double(d.k[t * kDk + j]) * d.k[t * kDk + j];
    CHECK(std::sqrt(rope / (d.tokens * 64.0)) == doctest::Approx(3.0).epsilon(0.02));
    const auto s = kvq::data_stats(d);
    MESSAGE("entropy " << s.entropy_min << " / " << s.entropy_median << " / " << s.entropy_max << " of " << s.entropy_log_context);
    CHECK(s.entropy_min < 1.0);  // heads from sharp ...
    CHECK(s.entropy_max > 0.75 * s.entropy_log_context);  // ... to nearly uniform
    CHECK(kvq::make_dataset("mla:tokens=64,seed=5").k == kvq::make_dataset("mla:tokens=64", 5).k);
    CHECK(kvq::make_dataset("mla:tokens=64,seed=5").q != kvq::make_dataset("mla:tokens=64", 6).q);
    CHECK_THROWS_WITH_AS(kvq::make_dataset("mla:q_heads=0"), doctest::Contains("q_heads must be positive"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::make_dataset("mla:head_dim=128"), doctest::Contains("key one of layers"), std::invalid_argument);
    kvq::KVData bad = kvq::make_dataset("mla:tokens=16");
    bad.head_dim_v = kDk + 32;
    CHECK_THROWS_WITH_AS(bad.validate(), doctest::Contains("at most head_dim"), std::invalid_argument);
}

TEST_CASE("reference_attention with values narrower than keys is the naive attention over V = K[:, :d_v]") {
    const auto d = kvq::make_dataset(kTiny);
    const size_t n = 50;
    const auto k = d.keys(0, 0, n), v = d.values(0, 0, n), q = d.queries(0, 0, 0);
    std::vector<float> out(size_t(d.q_heads) * kDv), w(size_t(d.q_heads) * n);
    kvq::reference_attention(q.data(), d.q_heads, k.data(), v.data(), n, kDk, kDv, d.softmax_scale(), out.data(), w.data());
    for (int h = 0; h < d.q_heads; ++h) {
        const auto want = naive_latent_attention(q.data() + h * kDk, k.data(), n, kDk, kDv, d.softmax_scale());
        CHECK(relative_l2(out.data() + h * kDv, want) < 1e-5);
    }
}

TEST_CASE("sweep on a latent: its rows are a latent KVCache's, measured against the naive reference") {
    const auto d = kvq::make_dataset(kTiny);
    const int g = d.q_heads;
    for (const char* codec : {"q8_0", "q4_0", "f16"}) {
        CAPTURE(codec);
        const auto r = sweep(kTiny, std::string(codec) + "/" + codec);
        REQUIRE(r.rows.size() == 1);
        REQUIRE(r.rows[0].error.empty());
        kvq::CacheConfig c;
        c.n_heads = g;
        c.head_dim = kDk;
        c.head_dim_v = kDv;
        c.latent_values = true;
        c.key_codec = codec;
        c.value_codec = "";
        c.scale = d.softmax_scale();
        c.seal = kvq::SealPolicy::on_append;  // the bytes the sweep measures: every row quantized
        kvq::KVCache cache(c);
        const auto seq = cache.add_sequence();
        const auto keys = kvq::detail::make_key_format(codec, kDk, 32);
        const auto values = kvq::detail::make_value_format(kvq::Codec::make(codec, kDv), 32, false);
        size_t appended = 0;
        double error_sum = 0;
        for (int i = 0; i < d.n_queries(); ++i) {
            const size_t n = size_t(d.query_positions[i]) + 1;
            cache.append(0, seq, d.k.data() + appended * kDk, nullptr, n - appended);
            appended = n;
            const auto q = d.queries(0, 0, i);
            std::vector<float> from_cache(size_t(g) * kDv), out(size_t(g) * kDv), scores(g * n), weights(g * n);
            cache.attend(0, seq, q.data(), from_cache.data());
            // The sweep's quantized attention reads the values in place from the key codes, as the cache does.
            const auto kc = kvq::detail::quantize_keys(*keys, d.k.data(), n);
            kvq::detail::quantized_attention(kc, kvq::detail::latent_values(*values), q.data(), g, 0, n, d.softmax_scale(),
                                             scores.data(), weights.data(), out.data());
            CHECK(std::memcmp(out.data(), from_cache.data(), out.size() * sizeof(float)) == 0);
            for (int h = 0; h < g; ++h) {
                error_sum += relative_l2(from_cache.data() + h * kDv,
                                         naive_latent_attention(q.data() + h * kDk, d.k.data(), n, kDk, kDv, d.softmax_scale()));
            }
        }
        // The sweep's output error is the cache's against the naive reference (float rounding of its own aside).
        CHECK(r.rows[0].errors.queries == size_t(g) * d.n_queries());
        CHECK(r.rows[0].errors.output_l2.mean == doctest::Approx(error_sum / (g * d.n_queries())).epsilon(2e-3));
    }
}

TEST_CASE("sweep on a latent: f32 is exact, fewer bits give more error, bits and bytes are the latent's") {
    const auto r = sweep("mla:tokens=512,q_heads=16", "f32/f32,f16/f16,q8_0/q8_0,q5_0/q5_0,q4_0/q4_0");
    for (const auto& x : r.rows) {
        CAPTURE(x.format.label());
        CHECK(x.error.empty());
        CHECK(x.latent);
        CHECK(x.head_dim == kDk);
        CHECK(x.head_dim_v == kDv);
        CHECK(x.value_bits == 0);  // the values have no bytes of their own
    }
    CHECK(row(r, "f32/f32").errors.kl.worst < 1e-6);
    CHECK(row(r, "f32/f32").errors.output_l2.worst < 1e-5);
    const char* order[] = {"f32/f32", "f16/f16", "q8_0/q8_0", "q5_0/q5_0", "q4_0/q4_0"};
    for (int i = 0; i + 1 < 5; ++i) {
        CAPTURE(order[i]);
        CHECK(row(r, order[i]).errors.kl.mean < row(r, order[i + 1]).errors.kl.mean);
        CHECK(row(r, order[i]).errors.output_l2.mean < row(r, order[i + 1]).errors.output_l2.mean);
    }
    // Bits per stored latent value; bytes per token of DeepSeek V3: 61 layers of one 576-value row.
    CHECK(row(r, "q8_0/q8_0").key_bits == 8.5);
    CHECK(row(r, "q4_0/q4_0").key_bits == 4.5);
    CHECK(r.latent_model.name == "deepseek-v3");
    CHECK(row(r, "f16/f16").bytes_per_token == 61 * kDk * 2);
    CHECK(row(r, "q8_0/q8_0").bytes_per_token == 61 * (kDk / 32) * 34);
    CHECK(row(r, "q8_0/q8_0").compression == doctest::Approx(16 / 8.5));
}

TEST_CASE("sweep on a latent: formats a latent cache refuses are rows with its reason, the rest are timed against f16") {
    const auto r = sweep(kTiny, "q8_0/q8_0,q8_0/q4_0,q4_0+rot/q4_0+rot,q4_0+center/q4_0,turbo4/turbo4,chan4/q4_0", true);
    REQUIRE(r.rows.size() == 6);
    CHECK(row(r, "q8_0/q8_0").error.empty());
    CHECK(row(r, "q8_0/q8_0").decode_vs_f16 > 0);  // the f16 latent baseline is timed though not asked for
    const std::pair<const char*, const char*> refused[] = {
        {"q8_0/q4_0", "the value codec must be empty or the key codec"},
        {"q4_0+rot/q4_0+rot", "does not keep its leading values as rows of their own"},
        {"q4_0+center/q4_0", "takes no center_keys"},
        {"turbo4/turbo4", "does not keep its leading values as rows of their own"},
        {"chan4/q4_0", "latent_values"},
    };
    for (const auto& refusal : refused) {
        const auto& [pair, reason] = refusal;
        CAPTURE(refusal.first);  // (a structured binding cannot be captured by clang 15's lambdas)
        const auto& x = row(r, pair);
        CHECK(x.error.find(reason) != std::string::npos);
        CHECK(x.errors.queries == 0);
        CHECK(x.bytes_per_token == 0);
        CHECK(x.decode_seconds == 0);
    }
    // With no pairs given, a latent data set takes the pairs a latent cache holds, all of them measured.
    const auto defaults = sweep(kTiny, "");
    CHECK(defaults.rows.size() == kvq::default_latent_formats().size());
    for (const auto& x : defaults.rows) CHECK(x.error.empty());
    const auto names = kvq::default_latent_formats();
    for (const char* pair : {"f16/f16", "bf16/bf16", "q8_0/q8_0", "q5_0/q5_0", "q4_0/q4_0", "iq4_nl/iq4_nl"}) {
        CAPTURE(pair);
        CHECK(std::count_if(names.begin(), names.end(), [&](const kvq::KVFormat& f) { return f.label() == pair; }) == 1);
    }
    for (const auto& f : names) CHECK(f.key_codec.find("turbo") == std::string::npos);
}

TEST_CASE("sweep output with latent rows: V = K[:512] and no V bits in Markdown, head_dim_v and latent in CSV and JSON") {
    kvq::SweepOptions o;
    o.formats = kvq::parse_kv_formats("q8_0/q8_0,q8_0/q4_0");
    o.timing = false;
    const auto r = kvq::run_sweep({kvq::make_dataset("llm:layers=1,kv_heads=1,tokens=64"), kvq::make_dataset(kTiny)}, o);
    const std::string md = kvq::format_sweep(r, kvq::TableFormat::markdown);
    CHECK(md.find("| " + std::string(kTiny) + " | q8_0 | K[:512] | 8.50 | — | 36.5 | 1.88× |") != std::string::npos);
    CHECK(md.find("KiB/token and vs f16: llama-3-8b (") != std::string::npos);
    CHECK(md.find("; latent rows: deepseek-v3 (61 layers, MLA latent 512 + rope 64") != std::string::npos);
    CHECK(md.find("K bits are the latent's bits per stored value") != std::string::npos);
    const auto json = kvq::detail::parse_json(kvq::format_sweep(r, kvq::TableFormat::json));
    CHECK(*json.find("latent_model")->find("name")->as_string() == "deepseek-v3");
    const auto* rows = json.find("rows")->as_array();
    REQUIRE(rows->size() == 4);
    CHECK(!*(*rows)[0].find("latent")->as_bool());
    CHECK(*(*rows)[0].find("value_bits")->as_number() == 8.5);
    CHECK(*(*rows)[2].find("latent")->as_bool());
    CHECK(*(*rows)[2].find("head_dim_v")->as_number() == kDv);
    CHECK((*rows)[2].find("value_bits")->is_null());
    CHECK(*(*rows)[2].find("key_bits")->as_number() == 8.5);
    CHECK((*rows)[3].find("error")->as_string()->find("latent_values") != std::string::npos);
    // Without latent data there is no latent model.
    o.formats = kvq::parse_kv_formats("q8_0/q8_0");
    const auto plain = kvq::detail::parse_json(kvq::format_sweep(kvq::run_sweep({kvq::make_dataset("gaussian:tokens=64")}, o), kvq::TableFormat::json));
    CHECK(plain.find("latent_model")->is_null());
}
