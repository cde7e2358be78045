// The ggml-layout codecs give ggml's bytes: on ggml's own output (tests/data, made by ggml d99724f; for
// iq4_nls, ggml's iq4_nl tensor quantizer in ggml 0.25.3),
// on hand-computed blocks with ties, zeros and extremes, and on 10^5 random rows against the oracle.
#include <doctest/doctest.h>

#include <cstring>
#include <random>

#include "ggml_oracle.hpp"
#include "ref/row_codecs.hpp"
#include "kvq/codec.hpp"
#include "test_util.hpp"

using kvq::Codec;

namespace {

constexpr int kRows = 256, kDim = 128;

// The oracle includes a row at 1e20 scale, whose fp16 scales overflow: kvq rejects such rows by default
// and stores them as ggml does (Inf scale) only under NanPolicy::propagate.
std::vector<uint8_t> quantize(const Codec& c, const float* x, size_t rows) {
    std::vector<uint8_t> out(rows * c.row_bytes());
    c.quantize_rows(x, rows, out.data(), 0, kvq::NanPolicy::propagate);
    return out;
}

using OracleFn = void (*)(const float*, uint8_t*, int64_t);
struct GgmlType {
    const char* name;
    bool plain;
    OracleFn oracle;  // nullptr: no oracle for this type (plain types)
};

// The oracle transcription of each quantized block codec's ggml reference quantizer.
OracleFn oracle_for(kvq::detail::BlockCodec c) {
    using kvq::detail::BlockCodec;
    namespace g = kvq::test::ggml;
    switch (c) {
        case BlockCodec::q8_0: return g::quantize_row_q8_0_ref;
        case BlockCodec::q4_0: return g::quantize_row_q4_0_ref;
        case BlockCodec::q4_1: return g::quantize_row_q4_1_ref;
        case BlockCodec::q5_0: return g::quantize_row_q5_0_ref;
        case BlockCodec::q5_1: return g::quantize_row_q5_1_ref;
        case BlockCodec::iq4_nl: return g::quantize_row_iq4_nl_ref;
        case BlockCodec::iq4_nls: return g::quantize_iq4_nl;  // ggml's tensor quantizer (its scale search)
        default: return nullptr;
    }
}

// Every registry row with a ggml type but f32 (ggml's f32 is the float itself: no file). A quantized codec
// without an oracle fails the test below.
std::vector<GgmlType> ggml_types() {
    std::vector<GgmlType> types;
    for (const auto& t : kvq::detail::kRowCodecs) {
        if (t.ggml_type != kvq::detail::kNoGgmlType && t.id != kvq::detail::BlockCodec::f32) {
            types.push_back({t.name, t.plain, oracle_for(t.id)});
        }
    }
    return types;
}
const std::vector<GgmlType> kTypes = ggml_types();

// iq4_nl's blocks below ggml's eps (1e-15) store d = 0 and codes ggml leaves indeterminate (its code
// buffer from before); there only the scale is compared.
bool same_row(const std::string& name, const uint8_t* got, const uint8_t* expected, size_t row_bytes) {
    if (name != "iq4_nl") return std::memcmp(got, expected, row_bytes) == 0;
    for (size_t b = 0; b < row_bytes; b += 18) {
        uint16_t d;
        std::memcpy(&d, expected + b, 2);
        const size_t compared = (d & 0x7FFF) == 0 ? 2 : 18;
        if (std::memcmp(got + b, expected + b, compared) != 0) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("bytes equal ggml's own quantizer output on its 256 oracle rows, edge cases included") {
    const auto input = kvq::test::read_floats("input.f32");
    REQUIRE(input.size() == size_t(kRows) * kDim);
    for (const auto& t : kTypes) {
        CAPTURE(t.name);
        const Codec c = Codec::make(t.name, kDim);
        const auto expected = kvq::test::read_file(std::string(t.name) + ".bin");
        REQUIRE(expected.size() == kRows * c.row_bytes());
        const auto got = quantize(c, input.data(), kRows);
        for (int r = 0; r < kRows; ++r) {
            CAPTURE(r);
            CHECK(same_row(t.name, got.data() + r * c.row_bytes(), expected.data() + r * c.row_bytes(), c.row_bytes()));
        }
        REQUIRE_MESSAGE((t.oracle || t.plain), "a quantized block codec needs its oracle in tests/ggml_oracle.hpp");
        if (t.oracle) {
            std::vector<uint8_t> oracle(expected.size());
            t.oracle(input.data(), oracle.data(), int64_t(kRows) * kDim);
            for (int r = 0; r < kRows; ++r) {  // the oracle itself is ggml
                CHECK(same_row(t.name, oracle.data() + r * c.row_bytes(), expected.data() + r * c.row_bytes(), c.row_bytes()));
            }
        }
    }
}

TEST_CASE("dequantized values equal ggml's to_float on its oracle rows") {
    for (const auto& t : kTypes) {
        if (!t.oracle) continue;
        const char* name = t.name;
        CAPTURE(name);
        const Codec c = Codec::make(name, kDim);
        const auto bytes = kvq::test::read_file(std::string(name) + ".bin");
        const auto expected = kvq::test::read_floats(std::string(name) + ".dequant.f32");
        std::vector<float> got(size_t(kRows) * kDim);
        c.dequantize_rows(bytes.data(), kRows, got.data());
        int mismatches = 0;
        for (size_t i = 0; i < got.size(); ++i) mismatches += std::memcmp(&got[i], &expected[i], 4) != 0;
        CHECK(mismatches == 0);
    }
}

TEST_CASE("10^5 random rows give the oracle's bytes for every quantized block codec") {
    constexpr int rows = 100000, dim = 64;
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal;
    std::uniform_real_distribution<float> log_scale(-6.0f, 6.0f);
    std::vector<float> x(size_t(rows) * dim);
    for (int r = 0; r < rows; ++r) {
        const float scale = std::exp(log_scale(rng));
        const float bias = (r % 3 == 0) ? normal(rng) * scale : 0.0f;
        for (int j = 0; j < dim; ++j) x[size_t(r) * dim + j] = normal(rng) * scale + bias;
    }
    for (const auto& t : kTypes) {
        if (!t.oracle) continue;
        CAPTURE(t.name);
        const Codec c = Codec::make(t.name, dim);
        const auto got = quantize(c, x.data(), rows);
        std::vector<uint8_t> expected(got.size());
        t.oracle(x.data(), expected.data(), int64_t(rows) * dim);
        size_t first_bad = got.size();
        for (size_t i = 0; i < got.size() && first_bad == got.size(); ++i) if (got[i] != expected[i]) first_bad = i;
        CHECK_MESSAGE(first_bad == got.size(), "first differing byte at row ", first_bad / c.row_bytes());
    }
}

TEST_CASE("hand-computed q8_0 and q4_0 blocks") {
    const Codec q8 = Codec::make("q8_0", 32), q4 = Codec::make("q4_0", 32);
    float x[32];

    SUBCASE("all zeros: d = 0 and every code is the zero point") {
        std::fill(x, x + 32, 0.0f);
        const auto b8 = quantize(q8, x, 1);
        for (uint8_t v : b8) CHECK(v == 0);
        const auto b4 = quantize(q4, x, 1);
        CHECK(b4[0] == 0x00);  // d = 0 / -8 = -0.0, fp16 0x8000, as ggml writes it
        CHECK(b4[1] == 0x80);
        for (int j = 2; j < 18; ++j) CHECK(b4[j] == 0x88);  // q = 8 means 0
    }
    SUBCASE("all equal positive: q4_0 maps the extreme to -8 with a negative d") {
        std::fill(x, x + 32, 2.0f);
        const auto b4 = quantize(q4, x, 1);
        uint16_t d;
        std::memcpy(&d, b4.data(), 2);
        CHECK(d == kvq::detail::f32_to_f16(-0.25f));
        for (int j = 2; j < 18; ++j) CHECK(b4[j] == 0x00);  // (-8 + 8) in both nibbles
        const auto b8 = quantize(q8, x, 1);
        for (int j = 2; j < 34; ++j) CHECK(int8_t(b8[j]) == 127);
    }
    SUBCASE("the negative extreme maps to -8 and the positive side clamps at 15") {
        for (int j = 0; j < 32; ++j) x[j] = 0.0f;
        x[0] = -8.0f;   // extreme: d = 1, q = 0
        x[1] = 7.0f;    // 7 + 8.5 = 15.5 -> 15
        x[16] = 7.9f;   // 15.9 + ... -> 16 -> clamped 15
        x[17] = 0.5f;   // 0.5 + 8.5 = 9 (truncation, not rounding of the tie)
        x[2] = -0.5f;   // -0.5 + 8.5 = 8
        const auto b4 = quantize(q4, x, 1);
        CHECK(b4[2 + 0] == (0x0 | (0xF << 4)));
        CHECK(b4[2 + 1] == (0xF | (0x9 << 4)));
        CHECK(b4[2 + 2] == (0x8 | (0x8 << 4)));
    }
    SUBCASE("q8_0 rounds ties away from zero, as roundf does") {
        for (int j = 0; j < 32; ++j) x[j] = 0.0f;
        x[0] = 127.0f;  // d = 1
        x[1] = 2.5f;
        x[2] = -2.5f;
        x[3] = 0.5f;
        const auto b8 = quantize(q8, x, 1);
        CHECK(int8_t(b8[2]) == 127);
        CHECK(int8_t(b8[3]) == 3);
        CHECK(int8_t(b8[4]) == -3);
        CHECK(int8_t(b8[5]) == 1);
    }
}
