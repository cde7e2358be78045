// kvq::attend_rows with AttendOptions (include/kvq/attention.hpp): several query rows, an additive mask,
// strides, threads and an engine's executor, against a float reference on the rows the codecs store.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "kvq/attention.hpp"
#include "kvq/codec.hpp"
#include "kvq/errors.hpp"
#include "ref/half.hpp"
#include "test_util.hpp"

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows stored as a ggml KV tensor [head_dim, n_kv_heads, n_tokens] with padding between tokens.
struct Rows {
    std::vector<uint8_t> bytes;
    size_t token_stride = 0, head_stride = 0;
    std::vector<float> decoded;  // [token][kv head][head_dim], as the codec reads them back

    Rows(const kvq::Codec& c, size_t n, int n_kv, uint64_t seed) {
        head_stride = c.row_bytes();
        token_stride = n_kv * c.row_bytes() + 16;
        bytes.assign(n * token_stride + 1, 0);
        const int d = c.head_dim();
        const auto x = kvq::test::gaussian(n * n_kv * d, seed);
        decoded.resize(x.size());
        for (size_t t = 0; t < n; ++t) {
            for (int h = 0; h < n_kv; ++h) {
                uint8_t* row = &bytes[t * token_stride + h * head_stride];
                c.quantize_rows(&x[(t * n_kv + h) * d], 1, row);
                c.dequantize_rows(row, 1, &decoded[(t * n_kv + h) * d]);
            }
        }
    }
    Rows() = default;
    kvq::RowsView view() const { return {bytes.data(), token_stride, head_stride}; }
};

// The values of DeepSeek's latent attention: the leading dv values of each key row, read in place (a view
// of the key rows, as llama.cpp's V of an MLA layer); block codecs only, whose leading blocks are those values.
struct LatentValues {
    const Rows& keys;
    int dk, dv;
    Rows decoded_view() const {
        Rows v;
        const size_t rows = keys.decoded.size() / static_cast<size_t>(dk);
        v.decoded.resize(rows * dv);
        for (size_t r = 0; r < rows; ++r) std::copy_n(&keys.decoded[r * dk], dv, &v.decoded[r * dv]);
        return v;
    }
};

// The float reference (in double): per query row i and head h, softmax over the tokens the mask keeps of
// cap(scale · q'·k) + mask, q' the query as the key codec scores it (effective_query).
std::vector<float> reference(const kvq::Codec& keys, const Rows& k, const Rows& v, int n_heads, int n_kv, size_t n,
                             const std::vector<float>& q, size_t n_rows, const std::vector<float>& mask, float scale,
                             float softcap, const float* sinks = nullptr) {
    const int d = keys.head_dim(), g = n_heads / n_kv;
    const int dv = static_cast<int>(v.decoded.size() / (n * n_kv));  // the values' head size (may differ)
    std::vector<float> out(n_rows * n_heads * dv, 0.0f), qe(d);
    for (size_t i = 0; i < n_rows; ++i) {
        for (int h = 0; h < n_heads; ++h) {
            keys.effective_query(&q[(i * n_heads + h) * d], qe.data());
            const int kvh = h / g;
            std::vector<double> s(n, -INFINITY);
            double mx = -INFINITY;
            for (size_t t = 0; t < n; ++t) {
                const float m = mask.empty() ? 0.0f : mask[i * n + t];
                if (m == kNegInf) continue;
                double dot = 0;
                for (int j = 0; j < d; ++j) dot += double(qe[j]) * k.decoded[(t * n_kv + kvh) * d + j];
                dot *= scale;
                if (softcap > 0) dot = softcap * std::tanh(dot / softcap);
                s[t] = dot + m;
                mx = std::max(mx, s[t]);
            }
            if (mx == -INFINITY) continue;  // keeps nothing: zeros
            if (sinks) mx = std::max(mx, double(sinks[h]));
            double sum = sinks ? std::exp(sinks[h] - mx) : 0.0;  // the sink: a token without a value
            std::vector<double> acc(dv, 0.0);
            for (size_t t = 0; t < n; ++t) {
                if (s[t] == -INFINITY) continue;
                const double w = std::exp(s[t] - mx);
                sum += w;
                for (int j = 0; j < dv; ++j) acc[j] += w * v.decoded[(t * n_kv + kvh) * dv + j];
            }
            for (int j = 0; j < dv; ++j) out[(i * n_heads + h) * dv + j] = static_cast<float>(acc[j] / sum);
        }
    }
    return out;
}

// A mask of n_rows rows over n tokens: row i causal up to `past + i` with a sliding window of `window`
// (0: none), finite values in [-1, 1] elsewhere, every third row with holes of removed tokens, and row
// `empty_row` (if < n_rows) removing everything.
std::vector<float> make_mask(size_t n_rows, size_t n, size_t past, size_t window, size_t empty_row, uint64_t seed) {
    const auto noise = kvq::test::gaussian(n_rows * n, seed, 0.5f);
    std::vector<float> m(n_rows * n);
    for (size_t i = 0; i < n_rows; ++i) {
        for (size_t t = 0; t < n; ++t) {
            const size_t pos = past + i;
            bool keep = t <= pos && (window == 0 || pos - t < window) && i != empty_row;
            if (i % 3 == 1 && t % 7 == 3) keep = false;
            // Rounded to f16, so that the f16 and f32 masks mean the same.
            m[i * n + t] = keep ? kvq::detail::f16_to_f32(kvq::detail::f32_to_f16(std::clamp(noise[i * n + t], -1.0f, 1.0f))) : kNegInf;
        }
    }
    return m;
}

std::vector<uint16_t> to_f16(const std::vector<float>& x) {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = kvq::detail::f32_to_f16(x[i]);
    return h;
}

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
    float m = 0;
    for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
    return m;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("attend_rows with options: query rows, masks, scale, softcap and threads against a float reference") {
    const int n_heads = 6, n_kv = 2, d = 64;
    const size_t n = 700, n_rows = 11;  // 3 blocks of 256 tokens; 11 rows: tiles of 10 rows and 1 (g = 3)
    const auto q = kvq::test::gaussian(n_rows * n_heads * d, 7);
    for (const char* pair : {"q8_0/q4_0", "f16/f16", "bf16/q5_1", "q4_1/iq4_nl", "q5_0/q8_0"}) {
        const std::string p(pair);
        const auto keys = kvq::Codec::make(p.substr(0, p.find('/')), d);
        const auto values = kvq::Codec::make(p.substr(p.find('/') + 1), d);
        const Rows k(keys, n, n_kv, 1), v(values, n, n_kv, 2);
        for (const size_t window : {size_t(0), size_t(300)}) {
            const auto mask = make_mask(n_rows, n, n - n_rows, window, 4, 3);
            const auto mask16 = to_f16(mask);
            for (const float softcap : {0.0f, 2.0f}) {
                const float scale = 0.2f;
                const auto want = reference(keys, k, v, n_heads, n_kv, n, q, n_rows, mask, scale, softcap);
                for (const int threads : {1, 3}) {
                    CAPTURE(pair);
                    CAPTURE(window);
                    CAPTURE(softcap);
                    CAPTURE(threads);
                    kvq::AttendOptions o;
                    o.scale = scale;
                    o.softcap = softcap;
                    o.n_queries = n_rows;
                    o.mask = mask16.data();
                    o.threads = threads;
                    std::vector<float> got(want.size(), NAN);
                    kvq::attend_rows(keys, values, n_heads, n_kv, q.data(), k.view(), v.view(), n, got.data(), o);
                    // float kernels against double: a few 1e-6 of the outputs' size (about 1)
                    CHECK(max_abs_diff(got, want) < 2e-5f);
                    // the row that keeps nothing is exactly zero
                    CHECK(std::all_of(got.begin() + 4 * n_heads * d, got.begin() + 5 * n_heads * d, [](float x) { return x == 0.0f; }));
                    // the same mask as f32 gives the same bits
                    std::vector<float> got32(want.size(), NAN);
                    o.mask = mask.data();
                    o.mask_type = kvq::MaskType::f32;
                    kvq::attend_rows(keys, values, n_heads, n_kv, q.data(), k.view(), v.view(), n, got32.data(), o);
                    CHECK(same_bits(got, got32));
                }
            }
        }
    }
}

TEST_CASE("attend_rows with options: no mask, one query row and one thread gives the plain overload's bits") {
    const auto keys = kvq::Codec::make("q8_0", 128), values = kvq::Codec::make("q4_0", 128);
    const size_t n = 600;
    const Rows k(keys, n, 2, 11), v(values, n, 2, 12);
    const auto q = kvq::test::gaussian(8 * 128, 13);
    std::vector<float> want(8 * 128), got(8 * 128);
    kvq::attend_rows(keys, values, 8, 2, q.data(), k.view(), v.view(), n, want.data(), 0.1f, 3.0f);
    kvq::AttendOptions o;
    o.scale = 0.1f;
    o.softcap = 3.0f;
    kvq::attend_rows(keys, values, 8, 2, q.data(), k.view(), v.view(), n, got.data(), o);
    CHECK(same_bits(got, want));
}

TEST_CASE("attend_rows with options: strides of queries, results and mask rows, and rows no query keeps are not read") {
    const int n_heads = 4, n_kv = 1, d = 64;
    const size_t n = 900, n_rows = 5;
    const auto keys = kvq::Codec::make("q8_0", d), values = kvq::Codec::make("q4_0", d);
    Rows k(keys, n, n_kv, 21), v(values, n, n_kv, 22);
    const auto q = kvq::test::gaussian(n_rows * n_heads * d, 23);
    const auto mask = make_mask(n_rows, n, 500, 200, 99, 24);  // rows keep tokens 301..504 at most
    kvq::AttendOptions o;
    o.n_queries = n_rows;
    o.mask = mask.data();
    o.mask_type = kvq::MaskType::f32;
    std::vector<float> want(n_rows * n_heads * d);
    kvq::attend_rows(keys, values, n_heads, n_kv, q.data(), k.view(), v.view(), n, want.data(), o);
    CHECK(max_abs_diff(want, reference(keys, k, v, n_heads, n_kv, n, q, n_rows, mask, 1.0f / 8, 0.0f)) < 2e-5f);

    // Queries and results as [head][row] (ggml's permuted layouts), the mask rows padded: the same bits.
    std::vector<float> qt(q.size()), got(want.size() * 2, NAN);
    for (size_t i = 0; i < n_rows; ++i) {
        for (int h = 0; h < n_heads; ++h) std::copy_n(&q[(i * n_heads + h) * d], d, &qt[(h * n_rows + i) * d]);
    }
    std::vector<float> padded(n_rows * (n + 7), 5.0f);
    for (size_t i = 0; i < n_rows; ++i) std::copy_n(&mask[i * n], n, &padded[i * (n + 7)]);
    kvq::AttendOptions t = o;
    t.q_head_stride = n_rows * d;
    t.q_row_stride = d;
    t.out_head_stride = 2 * n_rows * d;  // every other slot
    t.out_row_stride = 2 * d;
    t.mask = padded.data();
    t.mask_row_stride = n + 7;
    kvq::attend_rows(keys, values, n_heads, n_kv, qt.data(), k.view(), v.view(), n, got.data(), t);
    std::vector<float> back(want.size());
    for (size_t i = 0; i < n_rows; ++i) {
        for (int h = 0; h < n_heads; ++h) std::copy_n(&got[(h * 2 * n_rows + 2 * i) * d], d, &back[(i * n_heads + h) * d]);
    }
    CHECK(same_bits(back, want));

    // Rows no query row keeps are not read: garbage there (NaN scales) changes nothing.
    for (size_t tok : {size_t(0), size_t(100), size_t(300), size_t(505), size_t(899)}) {
        std::memset(&k.bytes[tok * k.token_stride], 0xff, keys.row_bytes());
        std::memset(&v.bytes[tok * v.token_stride], 0xff, values.row_bytes());
    }
    for (const int threads : {1, 2}) {
        o.threads = threads;
        std::vector<float> again(want.size());
        kvq::attend_rows(keys, values, n_heads, n_kv, q.data(), k.view(), v.view(), n, again.data(), o);
        CHECK(max_abs_diff(again, want) < 1e-5f);
    }
}

TEST_CASE("attend_rows with options: an engine's executor, any order, gives the pool's bits") {
    const auto keys = kvq::Codec::make("q8_0", 128), values = kvq::Codec::make("q4_0", 128);
    const size_t n = 5000;  // parts of one query row's tokens, merged
    const Rows k(keys, n, 1, 31), v(values, n, 1, 32);
    const auto q = kvq::test::gaussian(2 * 4 * 128, 33);
    const auto mask = make_mask(2, n, n - 2, 0, 99, 34);
    kvq::AttendOptions o;
    o.n_queries = 2;
    o.mask = mask.data();
    o.mask_type = kvq::MaskType::f32;
    o.threads = 4;
    std::vector<float> pool(2 * 4 * 128), mine(pool.size()), one(pool.size());
    kvq::attend_rows(keys, values, 4, 1, q.data(), k.view(), v.view(), n, pool.data(), o);
    int calls = 0;
    o.executor = [&](int parts, const std::function<void(int)>& task) {
        ++calls;
        for (int i = parts - 1; i >= 0; --i) task(i);  // backwards, on this thread
    };
    kvq::attend_rows(keys, values, 4, 1, q.data(), k.view(), v.view(), n, mine.data(), o);
    CHECK(calls == 1);
    CHECK(same_bits(mine, pool));
    o.threads = 1;
    kvq::attend_rows(keys, values, 4, 1, q.data(), k.view(), v.view(), n, one.data(), o);
    CHECK(calls == 1);  // one thread: no executor call
    CHECK(max_abs_diff(one, pool) < 1e-5f);
    CHECK(max_abs_diff(one, reference(keys, k, v, 4, 1, n, q, 2, mask, 1.0f / std::sqrt(128.0f), 0.0f)) < 2e-5f);
}

TEST_CASE("attend_rows with options: an executor that runs another attend_rows between the tasks of one (issue #36)") {
    // A work-stealing executor: between this call's tasks it runs another call on the same thread, with
    // another shape (more parts), whose buffers must not be the outer call's.
    const auto keys = kvq::Codec::make("q8_0", 128), values = kvq::Codec::make("q4_0", 128);
    const size_t n = 5000, n2 = 9000;
    const Rows k(keys, n, 1, 41), v(values, n, 1, 42), k2(keys, n2, 1, 43), v2(values, n2, 1, 44);
    const auto q = kvq::test::gaussian(2 * 4 * 128, 45), q2 = kvq::test::gaussian(3 * 4 * 128, 46);
    kvq::AttendOptions o, o2;
    o.n_queries = 2;
    o.threads = 4;
    o2.n_queries = 3;
    o2.threads = 8;
    std::vector<float> alone(2 * 4 * 128), alone2(3 * 4 * 128), outer(alone.size()), inner(alone2.size());
    kvq::attend_rows(keys, values, 4, 1, q.data(), k.view(), v.view(), n, alone.data(), o);
    kvq::attend_rows(keys, values, 4, 1, q2.data(), k2.view(), v2.view(), n2, alone2.data(), o2);
    int nested = 0;
    o.executor = [&](int parts, const std::function<void(int)>& task) {
        for (int i = 0; i < parts; ++i) {
            task(i);
            if (i == 0) {
                ++nested;
                kvq::attend_rows(keys, values, 4, 1, q2.data(), k2.view(), v2.view(), n2, inner.data(), o2);
            }
        }
    };
    kvq::attend_rows(keys, values, 4, 1, q.data(), k.view(), v.view(), n, outer.data(), o);
    CHECK(nested == 1);
    CHECK(same_bits(outer, alone));
    CHECK(same_bits(inner, alone2));
}

TEST_CASE("attend_rows with options: an executor that breaks its contract gets ExecutorError") {
    const auto keys = kvq::Codec::make("q8_0", 128), values = kvq::Codec::make("q4_0", 128);
    const size_t n = 5000;
    const Rows k(keys, n, 1, 51), v(values, n, 1, 52);
    const auto q = kvq::test::gaussian(4 * 128, 53);
    std::vector<float> out(4 * 128);
    kvq::AttendOptions o;
    o.threads = 4;
    const auto run = [&] { kvq::attend_rows(keys, values, 4, 1, q.data(), k.view(), v.view(), n, out.data(), o); };
    o.executor = [](int parts, const std::function<void(int)>& task) {
        for (int i = 1; i < parts; ++i) task(i);  // never runs task 0
    };
    CHECK_THROWS_AS(run(), kvq::ExecutorError);
    o.executor = [](int parts, const std::function<void(int)>& task) {
        for (int i = 0; i < parts; ++i) task(i);
        task(0);  // twice
    };
    CHECK_THROWS_AS(run(), kvq::ExecutorError);
    o.executor = [](int parts, const std::function<void(int)>& task) {
        for (int i = 0; i <= parts; ++i) task(i);  // one past the end
    };
    CHECK_THROWS_AS(run(), kvq::ExecutorError);
}

TEST_CASE("attend_rows with options: bad input throws and writes nothing") {
    const auto c = kvq::Codec::make("q8_0", 64);
    const Rows k(c, 10, 1, 41);
    std::vector<float> q(3 * 2 * 64, 0.5f), out(3 * 2 * 64, 7.0f);
    auto call = [&](const kvq::AttendOptions& o) {
        kvq::attend_rows(c, c, 2, 1, q.data(), k.view(), k.view(), 10, out.data(), o);
    };
    kvq::AttendOptions o;
    o.n_queries = 3;
    o.threads = 0;
    CHECK_THROWS_AS(call(o), std::invalid_argument);
    o.threads = 257;
    CHECK_THROWS_AS(call(o), std::invalid_argument);
    o.threads = 1;
    o.out_head_stride = 64;
    o.out_row_stride = 64;  // rows on top of heads
    CHECK_THROWS_AS(call(o), std::invalid_argument);
    o.out_row_stride = 0;
    o.scale = -1;
    CHECK_THROWS_AS(call(o), std::invalid_argument);
    o.scale = 0;
    o.softcap = NAN;
    CHECK_THROWS_AS(call(o), std::invalid_argument);
    o.softcap = 0;
    std::vector<uint16_t> mask(10);
    o.mask = mask.data();
    o.mask_row_stride = 9;  // shorter than n_tokens
    CHECK_THROWS_AS(call(o), std::invalid_argument);
    o.mask = nullptr;
    o.mask_type = static_cast<kvq::MaskType>(7);
    CHECK_THROWS_AS(call(o), std::invalid_argument);
    o.mask_type = kvq::MaskType::f16;
    q[2 * 64 + 5] = NAN;  // row 1, head 0
    CHECK_THROWS_AS(call(o), kvq::NonFiniteInput);
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
    // propagate: the NaN query's own outputs are NaN, the others are not
    o.nan = kvq::NanPolicy::propagate;
    call(o);
    CHECK(std::all_of(out.begin() + 2 * 64, out.begin() + 3 * 64, [](float x) { return std::isnan(x); }));
    CHECK(std::none_of(out.begin(), out.begin() + 2 * 64, [](float x) { return std::isnan(x); }));
    CHECK(std::none_of(out.begin() + 3 * 64, out.end(), [](float x) { return std::isnan(x); }));
    // no token at all: zeros; no query row: nothing written
    std::fill(out.begin(), out.end(), 7.0f);
    q[2 * 64 + 5] = 0.5f;
    kvq::attend_rows(c, c, 2, 1, q.data(), k.view(), k.view(), 0, out.data(), o);
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 0.0f; }));
    o.n_queries = 0;
    std::fill(out.begin(), out.end(), 7.0f);
    call(o);
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
}

TEST_CASE("attend_rows with options: attention sinks join each head's softmax as a token without a value") {
    const int n_heads = 4, n_kv = 2, d = 64;
    const size_t n = 300, n_rows = 3;
    const auto keys = kvq::Codec::make("f16", d), values = kvq::Codec::make("q8_0", d);
    const Rows k(keys, n, n_kv, 51), v(values, n, n_kv, 52);
    const auto q = kvq::test::gaussian(n_rows * n_heads * d, 53);
    const auto mask = make_mask(n_rows, n, n - n_rows, 0, 1, 54);  // row 1 keeps nothing
    const std::vector<float> sinks = {-1.0f, 0.5f, 3.0f, 8.0f};
    for (const int threads : {1, 2}) {
        CAPTURE(threads);
        kvq::AttendOptions o;
        o.n_queries = n_rows;
        o.mask = mask.data();
        o.mask_type = kvq::MaskType::f32;
        o.sinks = sinks.data();
        o.threads = threads;
        std::vector<float> got(n_rows * n_heads * d, NAN);
        kvq::attend_rows(keys, values, n_heads, n_kv, q.data(), k.view(), v.view(), n, got.data(), o);
        const auto want = reference(keys, k, v, n_heads, n_kv, n, q, n_rows, mask, 1.0f / 8, 0.0f, sinks.data());
        CHECK(max_abs_diff(got, want) < 2e-5f);
        CHECK(max_abs_diff(got, reference(keys, k, v, n_heads, n_kv, n, q, n_rows, mask, 1.0f / 8, 0.0f)) > 1e-2f);
        CHECK(std::all_of(got.begin() + n_heads * d, got.begin() + 2 * n_heads * d, [](float x) { return x == 0.0f; }));
    }
    kvq::AttendOptions o;
    const std::vector<float> bad = {0.0f, NAN, 0.0f, 0.0f};
    o.sinks = bad.data();
    std::vector<float> out(n_heads * d, 7.0f);
    CHECK_THROWS_AS(kvq::attend_rows(keys, values, n_heads, n_kv, q.data(), k.view(), v.view(), n, out.data(), o),
                    std::invalid_argument);
    CHECK(out[0] == 7.0f);
}

TEST_CASE("attend_rows with options: keys and values of different head sizes, and values that are a view of the keys (MLA)") {
    const int n_heads = 8, n_kv = 1;
    const size_t n = 600, n_rows = 5;
    // DeepSeek's latent cache (576-value latents whose first 512 are the value) and llama.cpp's other
    // hsk != hsv cases (192/128, 64/128) on separate value rows.
    struct Case {
        int dk, dv;
        const char* keys;
        const char* values;
        bool latent;
    };
    for (const Case c : {Case{576, 512, "q8_0", "q8_0", true}, Case{576, 512, "q4_0", "q4_0", true}, Case{576, 512, "f16", "f16", true},
                         Case{192, 128, "q8_0", "q4_0", false}, Case{64, 128, "f16", "q5_0", false}}) {
        CAPTURE(c.dk);
        CAPTURE(c.keys);
        CAPTURE(c.latent);
        const auto keys = kvq::Codec::make(c.keys, c.dk);
        const auto values = kvq::Codec::make(c.values, c.dv);
        const Rows k(keys, n, n_kv, 11);
        const Rows v = c.latent ? LatentValues{k, c.dk, c.dv}.decoded_view() : Rows(values, n, n_kv, 12);
        const kvq::RowsView vv = c.latent ? k.view() : v.view();  // the latent: the keys' own bytes
        const auto q = kvq::test::gaussian(n_rows * n_heads * c.dk, 13, 0.3f);
        const auto mask = make_mask(n_rows, n, n - n_rows, 0, n_rows, 14);
        const auto mask16 = to_f16(mask);
        const float scale = 1.0f / std::sqrt(float(c.dk));
        const auto want = reference(keys, k, v, n_heads, n_kv, n, q, n_rows, mask, scale, 0.0f);
        for (const int threads : {1, 2}) {
            kvq::AttendOptions o;
            o.n_queries = n_rows;
            o.mask = mask16.data();
            o.threads = threads;
            std::vector<float> got(n_rows * n_heads * c.dv, NAN);
            kvq::attend_rows(keys, values, n_heads, n_kv, q.data(), k.view(), vv, n, got.data(), o);
            CHECK(max_abs_diff(got, want) < 2e-5f);
            // one query row, no mask: the decode step
            std::vector<float> one(n_heads * c.dv, NAN);
            kvq::attend_rows(keys, values, n_heads, n_kv, q.data(), k.view(), vv, n, one.data());
            const auto want1 = reference(keys, k, v, n_heads, n_kv, n, q, 1, {}, scale, 0.0f);
            CHECK(max_abs_diff(one, want1) < 2e-5f);
        }
    }
}

TEST_CASE("attend_rows with options: finite inputs whose scores overflow float give the double reference (issue #50)") {
    // A scale of 3.4e38, or queries of 1e38: q·k·scale is ±Inf in float and the softmax computed Inf − Inf
    // (all-NaN output, no error). Now those results are computed in double, as KVCache::attend does.
    const int n_heads = 4, n_kv = 2, d = 64;
    const size_t n = 300, n_rows = 3;
    const auto keys = kvq::Codec::make("f16", d), values = kvq::Codec::make("q4_0", d);  // f16 keys score the query as given
    const Rows k(keys, n, n_kv, 11), v(values, n, n_kv, 12);
    const auto mask = make_mask(n_rows, n, n - n_rows, 0, 99, 13);
    const auto mask16 = to_f16(mask);
    const std::vector<float> sinks = {0.5f, -1.0f, 2.0f, 0.0f};
    auto q = kvq::test::gaussian(n_rows * n_heads * d, 14);
    for (const int which : {0, 1, 2}) {
        float scale = 3.4e38f;
        auto qq = q;
        if (which == 1) {  // queries of 1e38 in every channel of 4 heads, the default scale
            scale = 1.0f / std::sqrt(float(d));
            for (size_t i = 0; i < 4 * size_t(d); ++i) qq[i] = i % 3 ? 1e38f : -1e38f;
        }
        for (const bool with_mask : {false, true}) {
            for (const int threads : {1, 3}) {
                CAPTURE(which);
                CAPTURE(with_mask);
                CAPTURE(threads);
                kvq::AttendOptions o;
                o.scale = scale;
                o.n_queries = n_rows;
                o.threads = threads;
                if (with_mask) o.mask = mask16.data();
                if (which == 2) o.sinks = sinks.data();
                const auto want = reference(keys, k, v, n_heads, n_kv, n, qq, n_rows, with_mask ? mask : std::vector<float>{},
                                            scale, 0.0f, o.sinks);
                std::vector<float> got(want.size(), NAN);
                kvq::attend_rows(keys, values, n_heads, n_kv, qq.data(), k.view(), v.view(), n, got.data(), o);
                CHECK(std::all_of(got.begin(), got.end(), [](float x) { return std::isfinite(x); }));
                CHECK(max_abs_diff(got, want) < 1e-5f);
            }
        }
    }
    // The plain overload (kvq_attend_rows' path) and quantized keys: finite as well.
    const auto q8 = kvq::Codec::make("q8_0", d);
    const Rows k8(q8, n, n_kv, 15);
    std::vector<float> out(n_heads * d, NAN);
    kvq::attend_rows(q8, values, n_heads, n_kv, q.data(), k8.view(), v.view(), n, out.data(), 3.4e38f);
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
}

TEST_CASE("attend_rows with options: a mask value that is NaN or +inf is refused under NanPolicy::reject (issue #50)") {
    const auto c = kvq::Codec::make("q8_0", 64);
    const Rows k(c, 10, 1, 41);
    const std::vector<float> q = kvq::test::gaussian(2 * 2 * 64, 42);
    std::vector<float> out(2 * 2 * 64, 7.0f), m32(2 * 10, 0.0f);
    std::vector<uint16_t> m16(2 * 10, 0);
    kvq::AttendOptions o;
    o.n_queries = 2;
    auto call = [&] { kvq::attend_rows(c, c, 2, 1, q.data(), k.view(), k.view(), 10, out.data(), o); };
    for (const float x : {NAN, INFINITY}) {
        std::fill(m32.begin(), m32.end(), 0.0f);
        m32[17] = x;
        o.mask = m32.data();
        o.mask_type = kvq::MaskType::f32;
        CHECK_THROWS_AS(call(), kvq::NonFiniteInput);
    }
    for (const uint16_t x : {uint16_t(0x7C00), uint16_t(0x7E00), uint16_t(0xFC01)}) {
        std::fill(m16.begin(), m16.end(), uint16_t(0));
        m16[3] = x;
        o.mask = m16.data();
        o.mask_type = kvq::MaskType::f16;
        CHECK_THROWS_AS(call(), kvq::NonFiniteInput);
    }
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
    m16[3] = 0xFC00;  // -inf: removes the token
    m16[4] = 0x7BFF;  // 65504: finite
    call();
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return std::isfinite(x); }));
}

TEST_CASE("attend_rows with options: q, out, mask and sinks whose extents overflow are refused before any access (issue #50)") {
    const auto c = kvq::Codec::make("q8_0", 64);
    const Rows k(c, 10, 1, 41);
    const std::vector<float> q = kvq::test::gaussian(2 * 2 * 64, 42);
    std::vector<float> out(2 * 2 * 64, 7.0f);
    std::vector<uint16_t> mask(2 * 10, 0);
    for (const size_t x : {SIZE_MAX, SIZE_MAX / 2, SIZE_MAX / 4, SIZE_MAX / 8, size_t(PTRDIFF_MAX)}) {
        for (int field = 0; field < 6; ++field) {
            if (field == 5 && x == SIZE_MAX / 8) continue;  // 2^62 bytes between f16 mask rows: a buffer that could exist
            kvq::AttendOptions o;
            o.n_queries = 2;
            o.mask = mask.data();
            size_t* f[] = {&o.n_queries, &o.q_row_stride, &o.q_head_stride, &o.out_row_stride, &o.out_head_stride, &o.mask_row_stride};
            *f[field] = x;
            CAPTURE(field);
            CAPTURE(x);
            CHECK_THROWS_WITH_AS(kvq::attend_rows(c, c, 2, 1, q.data(), k.view(), k.view(), 10, out.data(), o),
                                 doctest::Contains("overflows"), std::invalid_argument);
        }
    }
    CHECK(std::all_of(out.begin(), out.end(), [](float x) { return x == 7.0f; }));
}
