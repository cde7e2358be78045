// The polar and turbo quantizers of every SIMD level write the bytes of the scalar specification
// (lib/ref/rotated_quantize_scalar.cpp): every turbo codec and scale, polar configurations of 1..7
// levels and 0..8 bits (wide codes and small heads take the specification's own path), head sizes whose
// rotation has one or several Hadamard blocks, rows of every kind of parity_rows (zeros, ties, huge,
// tiny, subnormal) and NaN/Inf rows under NanPolicy::propagate, into strided rows whose gaps must stay
// untouched, and rows whose rotated pairs lie exactly on polar's thresholds (axes, diagonals, equal
// radii: test_polar_codes.cpp says which cells those take).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ref/rotated_quantize.hpp"
#include "kvq/codec.hpp"
#include "kvq/simd.hpp"
#include "simd/dispatch.hpp"
#include "simd/level_check.hpp"

namespace {

std::vector<kvq::SimdLevel> quantize_levels() {
    std::vector<kvq::SimdLevel> levels;
    for (auto l : kvq::available_simd_levels()) {
        if (l != kvq::SimdLevel::scalar && kvq::detail::level_rotated_kernels(l)) levels.push_back(l);
    }
    return levels;
}

std::vector<std::string> specs() {
    std::vector<std::string> s;
    for (const char* t : {"turbo2", "turbo3", "turbo4", "turbo2.5", "turbo3.5", "turbo2_qjl", "turbo3_qjl", "turbo4_qjl",
                          "tcq2", "tcq3"}) {
        s.push_back(t);
    }
    for (const char* t : {"turbo4:scale=norm", "turbo3:scale=unbiased", "turbo2.5:scale=norm", "turbo3.5:scale=unbiased",
                          "tcq3:scale=norm", "tcq2:scale=unbiased"}) {
        s.push_back(t);
    }
    for (const char* p : {"polar", "polar:bits=4.3.3.3", "polar:bits=2.1.0.1", "polar:bits=8.8.8.8", "polar:bits=7.5.3",
                          "polar:bits=6.3.2.2.2", "polar:budget=3", "polar:budget=5", "polar:bits=4.2", "polar:bits=3"}) {
        s.push_back(p);
    }
    return s;
}

// parity_rows' kinds, rows of one or two ±1s (rotated: every pair on a diagonal or an axis, radii equal,
// so polar's angles are on thresholds), then a row with a NaN, one with an Inf, one with both infinities.
std::vector<float> rows_for(size_t n, int d, uint64_t seed) {
    auto x = kvq::detail::parity_rows(n, d, seed, true);
    for (size_t r = 0; r + 3 < n; r += 7) {
        std::fill(x.begin() + r * d, x.begin() + (r + 1) * d, 0.0f);
        x[r * d + r % d] = 1.0f;
        if (r % 2) x[r * d + (r * 5 + 1) % d] = r % 4 == 1 ? -1.0f : 1.0f;
    }
    x[(n - 3) * d + d / 3] = NAN;
    x[(n - 2) * d + 1] = -INFINITY;
    x[(n - 1) * d] = INFINITY;
    x[(n - 1) * d + d - 1] = -INFINITY;
    return x;
}

std::vector<uint8_t> quantize(const kvq::Codec& c, const std::vector<float>& x, size_t n, size_t stride) {
    std::vector<uint8_t> out(n * stride, 0xEE);
    c.quantize_rows(x.data(), n, out.data(), stride, kvq::NanPolicy::propagate);
    return out;
}

}  // namespace

// Every level ships polar/turbo quantizers, in each of its builds (the avx512 level's VNNI build once
// had none: the level then quantized with the specification at a thirtieth of the speed, untested here).
// (neon's polar quantize is the specification's: lib/simd/level_neon.cpp says why.)
TEST_CASE("every SIMD level the CPU runs has quantizers of its own for every turbo and tcq row") {
    namespace kd = kvq::detail;
    for (auto l : kvq::available_simd_levels()) {
        if (l == kvq::SimdLevel::scalar) continue;
        CAPTURE(std::string(kvq::simd_level_name(l)));
        for (int c = 0; c < kd::kRotatedCodecCount; ++c) {
            const auto row = static_cast<kd::RotatedCodec>(c);
            if (row == kd::RotatedCodec::polar && l == kvq::SimdLevel::neon) continue;
            CAPTURE(kd::kRotatedCodecNames[c]);
            const char* name = kd::level_rotated_kernel_name(l, row, kd::RotatedOp::quantize);
            REQUIRE(name != nullptr);
            CHECK(std::string(name) != kd::kSpecKernel);
        }
    }
}

TEST_CASE("every SIMD level quantizes polar and turbo rows to the specification's bytes") {
    const auto levels = quantize_levels();
    if (levels.empty()) MESSAGE("no SIMD level with polar/turbo quantizers on this CPU");
    size_t compared = 0;
    for (const auto& spec : specs()) {
        for (int d : {16, 32, 48, 64, 96, 128, 256, 640, 1024, 2048}) {
            std::unique_ptr<kvq::Codec> c;
            try {
                c = std::make_unique<kvq::Codec>(kvq::Codec::make(spec, d));
            } catch (const std::invalid_argument&) {  // head size the configuration cannot take
                continue;
            }
            CAPTURE(spec);
            CAPTURE(d);
            const size_t n = d >= 1024 ? 15 : 41, stride = c->row_bytes() + 3;
            const auto x = rows_for(n, d, 7 + d);
            std::vector<uint8_t> want;
            {
                kvq::detail::LevelOverride at(kvq::SimdLevel::scalar);
                want = quantize(*c, x, n, stride);
            }
            for (auto level : levels) {
                CAPTURE(std::string(kvq::simd_level_name(level)));
                kvq::detail::LevelOverride at(level);
                const auto got = quantize(*c, x, n, stride);
                size_t first = 0;
                while (first < got.size() && got[first] == want[first]) ++first;
                CAPTURE(first / stride);  // the row
                CAPTURE(first % stride);  // the byte
                CHECK(first == got.size());
                compared += got.size();
            }
        }
    }
    CHECK((levels.empty() || compared > 1000000));
}

TEST_CASE("the SIMD quantizers take one row or many rows and the QJL chunks as the specification does") {
    for (auto level : quantize_levels()) {
        CAPTURE(std::string(kvq::simd_level_name(level)));
        for (const char* spec : {"turbo4", "turbo3_qjl", "polar"}) {
            CAPTURE(spec);
            const kvq::Codec c = kvq::Codec::make(spec, 128);
            const auto x = kvq::detail::parity_rows(37, 128, 3, false);
            std::vector<uint8_t> want, one(c.row_bytes());
            {
                kvq::detail::LevelOverride at(kvq::SimdLevel::scalar);
                want = quantize(c, x, 37, c.row_bytes());
            }
            kvq::detail::LevelOverride at(level);
            CHECK(quantize(c, x, 37, c.row_bytes()) == want);
            for (size_t r = 0; r < 37; r += 6) {
                c.quantize_rows(x.data() + r * 128, 1, one.data(), 0, kvq::NanPolicy::propagate);
                CHECK(std::equal(one.begin(), one.end(), want.begin() + r * c.row_bytes()));
            }
        }
    }
}

// The quantizers take rows in pairs, quads and tiles of four, and a group of rows with a row they do not
// take (NaN, Inf, huge) row by row: every count of rows 1..17 with such a row at every position, head
// sizes whose codes end inside a register or whose rotation has blocks narrower than one.
TEST_CASE("the SIMD quantizers give the specification's bytes for 1..17 rows, a bad row anywhere, odd head sizes") {
    size_t compared = 0;
    for (auto level : quantize_levels()) {
        CAPTURE(std::string(kvq::simd_level_name(level)));
        for (const char* spec : {"turbo2", "turbo3", "turbo4", "turbo2.5", "turbo3.5", "turbo3_qjl", "tcq2", "tcq3", "polar",
                                 "polar:bits=4.3.3.3", "polar:bits=7.5.3", "polar:bits=3.2"}) {
            for (int d : {24, 48, 80, 128, 144, 200}) {
                std::unique_ptr<kvq::Codec> c;
                try {
                    c = std::make_unique<kvq::Codec>(kvq::Codec::make(spec, d));
                } catch (const std::invalid_argument&) {
                    continue;
                }
                CAPTURE(spec);
                CAPTURE(d);
                for (size_t n = 1; n <= 17; ++n) {
                    CAPTURE(n);
                    for (size_t bad = 0; bad <= n; ++bad) {  // bad == n: none
                        CAPTURE(bad);
                        auto x = kvq::detail::parity_rows(n, d, 100 * n + bad, false);
                        if (bad < n) x[bad * d + (bad * 7) % d] = bad % 3 == 0 ? NAN : bad % 3 == 1 ? INFINITY : 3e38f;
                        const size_t stride = c->row_bytes() + 1;
                        std::vector<uint8_t> want;
                        {
                            kvq::detail::LevelOverride at(kvq::SimdLevel::scalar);
                            want = quantize(*c, x, n, stride);
                        }
                        kvq::detail::LevelOverride at(level);
                        CHECK(quantize(*c, x, n, stride) == want);
                        compared += want.size();
                    }
                }
            }
        }
    }
    CHECK((quantize_levels().empty() || compared > 1000000));
}
