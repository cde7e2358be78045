// The edges of every codec in the table (plain and +rot): rows at odd addresses, zero rows, subnormal
// values, the largest values a codec can store, and NaN/Inf under both NaN policies. Run under the
// sanitizers (scripts/sanitize.sh) these also prove the kernels free of undefined behaviour there.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>

#include "codec_bounds.hpp"
#include "kvq/codec.hpp"
#include "kvq/simd.hpp"
#include "test_util.hpp"

using kvq::Codec;
using kvq::NanPolicy;

namespace {

// Every codec, plain and +rot, at every SIMD level this build and CPU run.
struct Case {
    kvq::SimdLevel level;
    std::string spec;
};
std::vector<Case> all_cases() {
    std::vector<Case> cases;
    for (auto level : kvq::available_simd_levels()) {
        for (const auto& name : kvq::codec_names()) {
            cases.push_back({level, name});
            cases.push_back({level, name + "+rot"});
        }
    }
    return cases;
}
// Puts back the SIMD level a test found.
struct RestoreSimdLevel {
    kvq::SimdLevel saved = kvq::simd_level();
    ~RestoreSimdLevel() { kvq::force_simd_level(saved); }
};

bool is_plain(const std::string& spec) { return spec == "f32" || spec == "f16" || spec == "bf16"; }

std::vector<float> dequantize(const Codec& c, const std::vector<uint8_t>& rows, size_t n_rows) {
    std::vector<float> y(n_rows * c.head_dim());
    c.dequantize_rows(rows.data(), n_rows, y.data());
    return y;
}

std::vector<float> scores(const Codec& c, const std::vector<float>& q, const std::vector<uint8_t>& rows,
                          size_t n_rows, NanPolicy nan = NanPolicy::reject) {
    std::vector<uint8_t> prep(c.query_bytes());
    c.prepare_queries(q.data(), 1, prep.data(), nan);
    std::vector<float> s(n_rows);
    c.score_rows(prep.data(), 1, rows.data(), n_rows, s.data(), n_rows);
    return s;
}

}  // namespace

TEST_CASE("rows, strides and prepared queries at any byte address give the same results") {
    const int d = 64;
    const size_t n = 5;
    const auto x = kvq::test::gaussian(n * d, 21);
    const auto q = kvq::test::gaussian(d, 22);
    const auto w = kvq::test::gaussian(n, 23);
    RestoreSimdLevel restore;
    for (const Case& kase : all_cases()) {
        const kvq::SimdLevel level = kase.level;  // named copies: clang 14 cannot capture bindings in CAPTURE
        const std::string& spec = kase.spec;
        kvq::force_simd_level(level);
        CAPTURE(spec);
        CAPTURE(std::string(kvq::simd_level_name(level)));
        const Codec c = Codec::make(spec, d);
        const size_t rb = c.row_bytes(), stride = rb + 3;
        std::vector<uint8_t> packed(n * rb), odd(1 + n * stride), prep(c.query_bytes()), prep_odd(1 + c.query_bytes());
        c.quantize_rows(x.data(), n, packed.data());
        c.quantize_rows(x.data(), n, odd.data() + 1, stride);
        for (size_t r = 0; r < n; ++r) CHECK(std::memcmp(packed.data() + r * rb, odd.data() + 1 + r * stride, rb) == 0);

        std::vector<float> y1(n * d), y2(n * d);
        c.dequantize_rows(packed.data(), n, y1.data());
        c.dequantize_rows(odd.data() + 1, n, y2.data(), stride);
        CHECK(y1 == y2);

        c.prepare_queries(q.data(), 1, prep.data());
        c.prepare_queries(q.data(), 1, prep_odd.data() + 1);
        CHECK(std::memcmp(prep.data(), prep_odd.data() + 1, prep.size()) == 0);
        std::vector<float> s1(n), s2(n);
        c.score_rows(prep.data(), 1, packed.data(), n, s1.data(), n);
        c.score_rows(prep_odd.data() + 1, 1, odd.data() + 1, n, s2.data(), n, stride);
        CHECK(s1 == s2);

        std::vector<float> a1(d, 0.0f), a2(d, 0.0f);
        c.accumulate_rows(w.data(), n, 1, packed.data(), n, a1.data());
        c.accumulate_rows(w.data(), n, 1, odd.data() + 1, n, a2.data(), stride);
        CHECK(a1 == a2);
    }
}

TEST_CASE("zero rows store exact zeros, score exactly 0 and add nothing") {
    const int d = 64;
    const std::vector<float> zeros(2 * d, 0.0f);
    const auto q = kvq::test::gaussian(d, 1);
    RestoreSimdLevel restore;
    for (const Case& kase : all_cases()) {
        const kvq::SimdLevel level = kase.level;  // named copies: clang 14 cannot capture bindings in CAPTURE
        const std::string& spec = kase.spec;
        kvq::force_simd_level(level);
        CAPTURE(spec);
        CAPTURE(std::string(kvq::simd_level_name(level)));
        const Codec c = Codec::make(spec, d);
        std::vector<uint8_t> rows(2 * c.row_bytes());
        c.quantize_rows(zeros.data(), 2, rows.data());
        for (float v : dequantize(c, rows, 2)) REQUIRE(v == 0.0f);
        for (float s : scores(c, q, rows, 2)) CHECK(s == 0.0f);
        std::vector<float> acc(d, 0.0f);
        const float w[2] = {0.7f, 0.3f};
        c.accumulate_rows(w, 2, 1, rows.data(), 2, acc.data());
        c.finish_accumulate(acc.data(), 1);
        for (float a : acc) REQUIRE(a == 0.0f);
    }
}

TEST_CASE("subnormal and tiny values are stored within each codec's bound, never as garbage") {
    const int d = 64;
    // Rows: all subnormal; subnormal beside 1.0; scales whose inverse overflows float; smallest normal.
    std::vector<std::vector<float>> rows;
    for (float scale : {1e-45f, 1e-42f, 3e-39f, 1e-38f, FLT_MIN, 1e-30f}) {
        auto x = kvq::test::gaussian(d, 31);
        for (float& v : x) v *= scale;
        rows.push_back(x);
    }
    auto mixed = kvq::test::gaussian(d, 32);
    for (int j = 0; j < d; ++j) mixed[j] = j % 2 ? mixed[j] * 1e-40f : mixed[j];
    rows.push_back(mixed);
    RestoreSimdLevel restore;
    for (const Case& kase : all_cases()) {
        const kvq::SimdLevel level = kase.level;  // named copies: clang 14 cannot capture bindings in CAPTURE
        const std::string& spec = kase.spec;
        kvq::force_simd_level(level);
        CAPTURE(spec);
        CAPTURE(std::string(kvq::simd_level_name(level)));
        const Codec c = Codec::make(spec, d);
        for (size_t i = 0; i < rows.size(); ++i) {
            CAPTURE(i);
            std::vector<uint8_t> bytes(c.row_bytes());
            c.quantize_rows(rows[i].data(), 1, bytes.data());
            const auto back = dequantize(c, bytes, 1);
            CHECK_MESSAGE(kvq::test::check_round_trip(c, rows[i].data(), back.data()) == "", "round trip");
            if (spec == "f32") CHECK(back == rows[i]);
            // A subnormal query is scored as its effective query says, finitely.
            std::vector<float> qe(d);
            c.effective_query(rows[i].data(), qe.data());
            const auto s = scores(c, rows[i], bytes, 1);
            double ref = 0, mag = 0;
            for (int j = 0; j < d; ++j) ref += double(qe[j]) * back[j], mag += std::fabs(double(qe[j]) * back[j]);
            CHECK(std::isfinite(s[0]));
            CHECK(std::fabs(s[0] - ref) <= 1e-5 * mag + 1e-44);
        }
    }
}

TEST_CASE("rows up to the codec's range round-trip, beyond it they are rejected and nothing is written") {
    const int d = 64;
    RestoreSimdLevel restore;
    for (const Case& kase : all_cases()) {
        const kvq::SimdLevel level = kase.level;  // named copies: clang 14 cannot capture bindings in CAPTURE
        const std::string& spec = kase.spec;
        kvq::force_simd_level(level);
        CAPTURE(spec);
        CAPTURE(std::string(kvq::simd_level_name(level)));
        const Codec c = Codec::make(spec, d);
        const kvq::InputLimit limit = c.input_limit();
        REQUIRE(limit.max_abs > 0.0f);
        CHECK(limit.on_norm == c.rotated());
        // At the limit: one value at it (per-value limits), or a row whose norm is just under it.
        auto x = kvq::test::gaussian(d, 41);
        double norm = 0;
        for (float v : x) norm += double(v) * v;
        const double to_limit = limit.on_norm ? 0.999 * limit.max_abs / std::sqrt(norm) : 0.999 * limit.max_abs / 4.0;
        for (float& v : x) v = static_cast<float>(v * to_limit);
        if (!limit.on_norm) x[5] = -limit.max_abs, x[40] = limit.max_abs;
        std::vector<uint8_t> bytes(c.row_bytes());
        REQUIRE_NOTHROW(c.quantize_rows(x.data(), 1, bytes.data()));
        const auto back = dequantize(c, bytes, 1);
        CHECK_MESSAGE(kvq::test::check_round_trip(c, x.data(), back.data()) == "", "round trip at the limit");

        if (limit.max_abs == FLT_MAX) continue;  // every finite value fits (f32)
        for (float& v : x) v *= 1.01f;
        std::vector<uint8_t> untouched(2 * c.row_bytes(), 0xA5);
        std::vector<float> two(x);
        two.insert(two.end(), x.begin(), x.end());
        CHECK_THROWS_WITH_AS(c.quantize_rows(two.data(), 2, untouched.data()),
                             doctest::Contains("row 0"), std::invalid_argument);  // beyond range, or Inf
        for (uint8_t b : untouched) REQUIRE(b == 0xA5);
    }
}

TEST_CASE("under NanPolicy::propagate NaN and Inf are stored and every read of them gives non-finite") {
    const int d = 64;
    const auto q = kvq::test::gaussian(d, 51);
    RestoreSimdLevel restore;
    for (const Case& kase : all_cases()) {
        const kvq::SimdLevel level = kase.level;  // named copies: clang 14 cannot capture bindings in CAPTURE
        const std::string& spec = kase.spec;
        kvq::force_simd_level(level);
        CAPTURE(spec);
        CAPTURE(std::string(kvq::simd_level_name(level)));
        const Codec c = Codec::make(spec, d);
        for (float bad : {NAN, INFINITY, -INFINITY}) {
            CAPTURE(bad);
            auto x = kvq::test::gaussian(2 * d, 52);
            x[d + 40] = bad;  // row 1, block 1 of the q-codecs
            std::vector<uint8_t> rows(2 * c.row_bytes());
            c.quantize_rows(x.data(), 2, rows.data(), 0, NanPolicy::propagate);
            const auto back = dequantize(c, rows, 2);
            for (int j = 0; j < d; ++j) REQUIRE(std::isfinite(back[j]));  // row 0 is untouched
            if (is_plain(spec)) {
                const bool same = std::isnan(bad) ? std::isnan(back[d + 40]) : back[d + 40] == bad;
                CHECK(same);
            } else if (!c.rotated()) {
                for (int j = 32; j < 64; ++j) REQUIRE(std::isnan(back[d + j]));  // the whole block
                for (int j = 0; j < 32; ++j) REQUIRE(std::isfinite(back[d + j]));
            } else {
                for (int j = 0; j < d; ++j) REQUIRE(!std::isfinite(back[d + j]));  // rotation mixed it in
            }
            const auto s = scores(c, q, rows, 2);
            CHECK(std::isfinite(s[0]));
            CHECK(!std::isfinite(s[1]));
            std::vector<float> acc(d, 0.0f);
            const float w[2] = {0.5f, 0.5f};
            c.accumulate_rows(w, 2, 1, rows.data(), 2, acc.data());
            c.finish_accumulate(acc.data(), 1);
            CHECK(!std::isfinite(acc[40]));
        }
    }
}

TEST_CASE("a NaN or Inf query is rejected by default and gives non-finite scores under propagate") {
    const int d = 64;
    const auto k = kvq::test::gaussian(3 * d, 61);
    RestoreSimdLevel restore;
    for (const Case& kase : all_cases()) {
        const kvq::SimdLevel level = kase.level;  // named copies: clang 14 cannot capture bindings in CAPTURE
        const std::string& spec = kase.spec;
        kvq::force_simd_level(level);
        CAPTURE(spec);
        CAPTURE(std::string(kvq::simd_level_name(level)));
        const Codec c = Codec::make(spec, d);
        std::vector<uint8_t> rows(3 * c.row_bytes());
        c.quantize_rows(k.data(), 3, rows.data());
        for (float bad : {NAN, INFINITY}) {
            auto q = kvq::test::gaussian(d, 62);
            q[7] = bad;
            std::vector<uint8_t> prep(c.query_bytes(), 0x3C);
            CHECK_THROWS_WITH_AS(c.prepare_queries(q.data(), 1, prep.data()), doctest::Contains("not finite"),
                                 std::invalid_argument);
            for (uint8_t b : prep) REQUIRE(b == 0x3C);
            for (float s : scores(c, q, rows, 3, NanPolicy::propagate)) CHECK(!std::isfinite(s));
        }
    }
}

TEST_CASE("under propagate, values beyond an fp16 codec's range are stored as the overflow they are") {
    const int d = 32;
    auto x = kvq::test::gaussian(d, 71);
    x[3] = 1e30f;
    RestoreSimdLevel restore;
    for (const Case& kase : all_cases()) {
        const kvq::SimdLevel level = kase.level;  // named copies: clang 14 cannot capture bindings in CAPTURE
        const std::string& spec = kase.spec;
        kvq::force_simd_level(level);
        const Codec c = Codec::make(spec, d);
        if (c.rotated() || c.input_limit().max_abs > 1e30f) continue;  // f32, bf16 hold 1e30
        CAPTURE(spec);
        CAPTURE(std::string(kvq::simd_level_name(level)));
        std::vector<uint8_t> rows(c.row_bytes());
        CHECK_THROWS_AS(c.quantize_rows(x.data(), 1, rows.data()), std::invalid_argument);
        c.quantize_rows(x.data(), 1, rows.data(), 0, NanPolicy::propagate);
        const auto back = dequantize(c, rows, 1);
        CHECK(!std::isfinite(back[3]));
    }
}
