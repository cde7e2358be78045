// Sink keys (lib/codec/sink_keys.hpp, key spec "+sinkN"): a sequence's first N keys are kept in fp16 and
// scored exactly; every other key is the wrapped format's. Checked against a reference built from the
// definitions, against the plain format on keys whose first token is an outlier (as attention sinks are),
// and through the cache's operations that move blocks (save/load, fork, truncate into the first block).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cache_file_util.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "ref/half.hpp"
#include "test_util.hpp"

namespace {

constexpr int kKv = 2, kG = 2, kDim = 64, kBlock = 32;

kvq::CacheConfig sink_config(const std::string& key) {
    kvq::CacheConfig c;
    c.n_layers = 1;
    c.n_kv_heads = kKv;
    c.n_heads = kKv * kG;
    c.head_dim = kDim;
    c.block_tokens = kBlock;
    c.key_codec = key;
    c.value_codec = "q4_0";
    return c;
}

// Keys whose token 0 stands out (an attention sink: large, and in a direction of its own).
std::vector<float> sink_keys(size_t n) {
    auto k = kvq::test::gaussian(n * kKv * kDim, 11);
    for (int h = 0; h < kKv; ++h) {
        for (int j = 0; j < kDim; ++j) k[h * kDim + j] = (j % 7 == 0 ? 9.0f : 0.3f) * (j % 2 ? -1.0f : 1.0f) + k[h * kDim + j] * 0.1f;
    }
    return k;
}

// softmax(scale · s) · V in double: s[r] and rows of V per token, one query.
std::vector<double> attend_ref(const std::vector<double>& s, const std::vector<float>& v, size_t n, double scale) {
    double top = -INFINITY, sum = 0;
    for (double x : s) top = std::max(top, x * scale);
    std::vector<double> out(kDim, 0.0);
    for (size_t r = 0; r < n; ++r) {
        const double w = std::exp(s[r] * scale - top);
        sum += w;
        for (int j = 0; j < kDim; ++j) out[j] += w * v[r * kDim + j];
    }
    for (double& x : out) x /= sum;
    return out;
}

}  // namespace

TEST_CASE("sink keys: the first N keys of a sequence are scored exactly (fp16), every other key as the wrapped format scores it") {
    const size_t n = 3 * kBlock + 7;  // three sealed blocks and a staged tail
    const auto k = sink_keys(n);
    const auto v = kvq::test::gaussian(n * kKv * kDim, 12);
    const auto q = kvq::test::gaussian(size_t(kKv) * kG * kDim, 13);
    for (const int sinks : {1, 3}) {
        CAPTURE(sinks);
        const std::string spec = "q4_0+sink" + std::to_string(sinks);
        kvq::KVCache cache(sink_config(spec));
        const auto seq = cache.add_sequence();
        cache.append(0, seq, k.data(), v.data(), n);
        std::vector<float> out(q.size());
        cache.attend(0, seq, q.data(), out.data());

        const auto q4 = kvq::Codec::make("q4_0", kDim);
        const size_t sealed = 3 * kBlock;
        double worst = 0;
        for (int h = 0; h < kKv; ++h) {
            // Head h's keys and values as stored: q4_0 rows (the sealed blocks), exact f32 rows (the staging).
            std::vector<float> kh(n * kDim), vh(n * kDim), deq_k(n * kDim), deq_v(n * kDim);
            for (size_t t = 0; t < n; ++t) {
                std::copy_n(k.data() + (t * kKv + h) * kDim, kDim, kh.data() + t * kDim);
                std::copy_n(v.data() + (t * kKv + h) * kDim, kDim, vh.data() + t * kDim);
            }
            std::vector<uint8_t> rows(q4.row_bytes() * n);
            q4.quantize_rows(kh.data(), sealed, rows.data());
            q4.dequantize_rows(rows.data(), sealed, deq_k.data());
            q4.quantize_rows(vh.data(), sealed, rows.data());
            q4.dequantize_rows(rows.data(), sealed, deq_v.data());
            std::copy(kh.begin() + sealed * kDim, kh.end(), deq_k.begin() + sealed * kDim);
            std::copy(vh.begin() + sealed * kDim, vh.end(), deq_v.begin() + sealed * kDim);
            for (int i = 0; i < kG; ++i) {
                const float* qi = q.data() + (h * kG + i) * kDim;
                std::vector<float> eff(kDim);
                q4.effective_query(qi, eff.data());  // q4_0 rows score the query as q8_0 (ggml's dot product)
                std::vector<double> s(n);
                for (size_t r = 0; r < n; ++r) {
                    double dot = 0;
                    for (int j = 0; j < kDim; ++j) {
                        if (r < size_t(sinks)) {  // the sink: exact query against the fp16 key
                            dot += double(qi[j]) * kvq::detail::f16_to_f32(kvq::detail::f32_to_f16(kh[r * kDim + j]));
                        } else {
                            dot += double(r < sealed ? eff[j] : qi[j]) * deq_k[r * kDim + j];
                        }
                    }
                    s[r] = dot;
                }
                const auto want = attend_ref(s, deq_v, n, 1.0 / std::sqrt(double(kDim)));
                for (int j = 0; j < kDim; ++j) worst = std::max(worst, std::fabs(want[j] - out[(h * kG + i) * kDim + j]));
            }
        }
        CHECK(worst < 2e-5);
    }
}

TEST_CASE("sink keys: an outlier first token is scored far closer to the truth than by the plain format") {
    const size_t n = 4 * kBlock;
    const auto k = sink_keys(n);
    const auto v = kvq::test::gaussian(n * kKv * kDim, 12);
    // Queries that attend to the sink (most of their weight on token 0, as attention heads do), so that its
    // score's rounding moves the output.
    auto q = kvq::test::gaussian(size_t(kKv) * kG * kDim, 14, 0.2f);
    for (int i = 0; i < kKv * kG; ++i) {
        for (int j = 0; j < kDim; ++j) q[i * kDim + j] += 0.02f * k[(i / kG) * kDim + j];
    }
    auto error = [&](const std::string& key) {
        kvq::KVCache exact(sink_config("f32")), stored(sink_config(key));
        const auto a = exact.add_sequence(), b = stored.add_sequence();
        exact.append(0, a, k.data(), v.data(), n);
        stored.append(0, b, k.data(), v.data(), n);
        std::vector<float> want(q.size()), got(q.size());
        exact.attend(0, a, q.data(), want.data());
        stored.attend(0, b, q.data(), got.data());
        double e = 0;
        for (size_t i = 0; i < q.size(); ++i) e += (want[i] - got[i]) * (want[i] - got[i]);
        return std::sqrt(e);
    };
    for (const char* base : {"q4_0", "q4_0+rot", "chan3"}) {
        CAPTURE(base);
        const double plain = error(base), sink = error(std::string(base) + "+sink1");
        MESSAGE(std::string(base) << ": output error " << plain << " plain, " << sink << " with +sink1");
        CHECK(sink < 0.8 * plain);
    }
}

TEST_CASE("sink keys: kept through save and load, fork, and a truncate into the first block, and refused where they cannot be") {
    const size_t n = 2 * kBlock + 3;
    const auto k = sink_keys(n);
    const auto v = kvq::test::gaussian(n * kKv * kDim, 12);
    const auto q = kvq::test::gaussian(size_t(kKv) * kG * kDim, 15);
    for (const bool center : {false, true}) {
        CAPTURE(center);
        auto c = sink_config("q4_0+rot+sink2");
        c.center_keys = center;
        kvq::KVCache cache(c);
        const auto seq = cache.add_sequence();
        cache.append(0, seq, k.data(), v.data(), n);
        std::vector<float> out(q.size()), again(q.size());
        cache.attend(0, seq, q.data(), out.data());

        kvq::test::cache_file::TempDir dir;
        cache.save(dir / "sink.kvq");
        const kvq::KVCache loaded = kvq::KVCache::load(dir / "sink.kvq");
        loaded.attend(0, loaded.sequences().at(0), q.data(), again.data());
        CHECK(again == out);

        const auto child = cache.fork(seq);
        cache.attend(0, child, q.data(), again.data());
        CHECK(again == out);

        // Into the first block and back: its rows are sealed anew from their read-back, the sinks among them.
        cache.truncate(child, 5);
        cache.append(0, child, k.data() + 5 * kKv * kDim, v.data() + 5 * kKv * kDim, n - 5);
        cache.attend(0, child, q.data(), again.data());
        double diff = 0;
        for (size_t i = 0; i < q.size(); ++i) diff = std::max(diff, double(std::fabs(again[i] - out[i])));
        CHECK(diff < 0.05);
    }
    auto on_append = sink_config("q4_0+sink1");
    on_append.seal = kvq::SealPolicy::on_append;
    CHECK_THROWS_WITH_AS(kvq::KVCache{on_append}, doctest::Contains("needs seal"), kvq::BadParams);
    auto as_values = sink_config("q4_0");
    as_values.value_codec = "q4_0+sink1";
    CHECK_THROWS_WITH_AS(kvq::KVCache{as_values}, doctest::Contains("is a key codec"), kvq::BadParams);
    CHECK_THROWS_AS(kvq::KVCache{sink_config("q4_0+sink17")}, kvq::BadParams);
}

TEST_CASE("sink keys: a file whose sink counts do not fit their block's position is refused, CRCs recomputed (issue #50)") {
    namespace cf = kvq::test::cache_file;
    const size_t n = 2 * kBlock + 3;  // two sealed blocks (positions 0 and 32) and an open one
    const auto k = sink_keys(n);
    const auto v = kvq::test::gaussian(n * kKv * kDim, 12);
    const auto q = kvq::test::gaussian(size_t(kKv) * kG * kDim, 15);
    kvq::KVCache cache(sink_config("q4_0+sink2"));
    const auto seq = cache.add_sequence();
    cache.append(0, seq, k.data(), v.data(), n);
    cf::TempDir dir;
    cache.save(dir / "sink.kvq");
    const std::vector<uint8_t> file = cf::slurp(dir / "sink.kvq");
    // Kv head 0's count in the first block: a u32 of 2 followed by token 0's key in fp16.
    std::vector<uint8_t> pattern = {2, 0, 0, 0};
    for (int j = 0; j < 8; ++j) {
        const uint16_t h = kvq::detail::f32_to_f16(k[j]);
        pattern.push_back(static_cast<uint8_t>(h));
        pattern.push_back(static_cast<uint8_t>(h >> 8));
    }
    const auto found = std::search(file.begin(), file.end(), pattern.begin(), pattern.end());
    REQUIRE(found != file.end());
    const size_t payloads = cf::get_le(file, 24, 8), block = cf::get_le(file, 40, 8);
    const size_t first = static_cast<size_t>(found - file.begin());
    REQUIRE(cf::get_le(file, 32, 8) == 2);
    const size_t in_block = (first - payloads) % block, first_index = (first - payloads) / block;
    const size_t second = payloads + (1 - first_index) * block + in_block;  // the block at position 32
    REQUIRE(cf::get_le(file, second, 4) == 0);

    const auto forged_load = [&](size_t at, uint32_t count) {
        std::vector<uint8_t> b = file;
        cf::put_le(b, at, count, 4);
        cf::recompute_crcs(b);
        cf::spit(dir / "forged.kvq", b);
        return cf::error_of<kvq::BadCacheFile>([&] { (void)kvq::KVCache::load(dir / "forged.kvq"); });
    };
    for (const uint32_t count : {1u, 2u, 0xFFFFFFFFu}) {  // a sink count in the block at position 32
        CAPTURE(count);
        CHECK(forged_load(second, count).find("sink count is " + std::to_string(count)) != std::string::npos);
    }
    for (const uint32_t count : {0u, 1u}) {  // the first block's count, other than min(block_tokens, 2)
        CAPTURE(count);
        CHECK(forged_load(first, count).find("sink count is " + std::to_string(count)) != std::string::npos);
    }
    // Into a live cache too: refused, nothing added.
    std::vector<uint8_t> b = file;
    cf::put_le(b, second, 1, 4);
    cf::recompute_crcs(b);
    cf::spit(dir / "forged.kvq", b);
    CHECK_THROWS_AS(cache.load_into(dir / "forged.kvq"), kvq::BadCacheFile);
    CHECK(cache.sequences().size() == 1);
    // The file as saved (CRCs recomputed over the same bytes) still loads.
    b = file;
    cf::recompute_crcs(b);
    CHECK(b == file);
    std::vector<float> out(q.size()), again(q.size());
    cache.attend(0, seq, q.data(), out.data());
    const kvq::KVCache loaded = kvq::KVCache::load(dir / "sink.kvq");
    loaded.attend(0, loaded.sequences().at(0), q.data(), again.data());
    CHECK(again == out);
}
