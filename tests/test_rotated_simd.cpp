// Every SIMD level with polar/turbo kernels against the scalar specification (rotated_scalar.cpp): scores
// and accumulations equal to float rounding, for every turbo codec and polar configurations that take
// each path of the kernels (level tables, lookups, gathers, levels above 4, the scalar fallback for
// L < 4), head sizes 16..256, odd and chunk-crossing row counts, 1..6 queries (a subnormal and a NaN one
// among 6) and strided rows.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kvq/codec.hpp"
#include "kvq/simd.hpp"
#include "simd/dispatch.hpp"
#include "test_util.hpp"

namespace {

std::vector<kvq::SimdLevel> rotated_simd_levels() {
    std::vector<kvq::SimdLevel> levels;
    for (auto l : kvq::available_simd_levels()) {
        if (l != kvq::SimdLevel::scalar && kvq::detail::level_rotated_kernels(l)) levels.push_back(l);
    }
    return levels;
}

struct Case {
    std::string spec;
    int d;
};

std::vector<Case> cases() {
    std::vector<Case> c;
    for (const char* t : {"turbo2", "turbo2.5", "turbo3", "turbo3.5", "turbo4", "turbo2_qjl", "turbo3_qjl", "turbo4_qjl"}) {
        for (int d : {16, 64, 96, 128, 256}) c.push_back({t, d});
    }
    for (const char* t : {"tcq2", "tcq3"}) {
        // 640: accumulate slices past the first; 2048: past the avx512 scores' super-blocks (AVX2's kernel then)
        for (int d : {32, 64, 96, 128, 256, 640, 2048}) c.push_back({t, d});
    }
    for (const char* p : {"polar", "polar:bits=4.3.3.3", "polar:bits=3.4.4.4", "polar:bits=2.1.0.1", "polar:bits=8.8.8.8",
                          "polar:bits=6.3.2.2.2", "polar:budget=3", "polar:budget=5", "polar:bits=4.2"}) {
        for (int d : {16, 64, 96, 128, 256}) {
            try {
                kvq::Codec::make(p, d);
                c.push_back({p, d});
            } catch (const std::invalid_argument&) {  // head size not divisible by 2^L
            }
        }
    }
    return c;
}

// Rows of mixed kinds: gaussian, a zero row, large and small norms.
std::vector<float> rows_for(size_t n, int d, uint64_t seed) {
    auto x = kvq::test::gaussian(n * d, seed);
    for (size_t r = 0; r < n; ++r) {
        const float scale = r % 5 == 1 ? 0.0f : r % 5 == 2 ? 300.0f : r % 5 == 3 ? 1e-3f : 1.0f;
        for (int j = 0; j < d; ++j) x[r * d + j] *= scale;
    }
    return x;
}

double norm(const float* x, int d) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += double(x[j]) * x[j];
    return std::sqrt(s);
}

struct Result {
    std::vector<float> scores, acc;
};

Result run(const kvq::Codec& c, const std::vector<uint8_t>& rows, size_t n_rows, size_t stride,
           const std::vector<float>& q, int n_q, const std::vector<float>& w) {
    const int d = c.head_dim();
    std::vector<uint8_t> prep(n_q * c.query_bytes());
    c.prepare_queries(q.data(), n_q, prep.data(), kvq::NanPolicy::propagate);
    Result r{std::vector<float>(n_q * n_rows), std::vector<float>(n_q * d, 0.0f)};
    c.score_rows(prep.data(), n_q, rows.data(), n_rows, r.scores.data(), n_rows, stride);
    c.accumulate_rows(w.data(), n_rows, n_q, rows.data(), n_rows, r.acc.data(), stride);
    c.finish_accumulate(r.acc.data(), n_q);
    return r;
}

}  // namespace

TEST_CASE("every SIMD level scores and accumulates polar and turbo rows as the scalar specification") {
    const auto levels = rotated_simd_levels();
    if (levels.empty()) MESSAGE("no SIMD level with polar/turbo kernels on this CPU: nothing to compare");
    const kvq::SimdLevel active = kvq::simd_level();
    for (const Case& cs : cases()) {
        CAPTURE(cs.spec);
        CAPTURE(cs.d);
        const kvq::Codec c = kvq::Codec::make(cs.spec, cs.d);
        for (size_t n_rows : {size_t(1), size_t(2), size_t(7), size_t(65), size_t(130)}) {
            for (int n_q : {1, 3, 6}) {
                const size_t stride = c.row_bytes() + (n_rows % 2) * 5;
                const auto x = rows_for(n_rows, cs.d, 100 + n_rows);
                auto q = kvq::test::gaussian(size_t(n_q) * cs.d, 200 + n_q);
                if (n_q == 6) {  // a subnormal query (its int8 blocks score as zero) and a NaN one (NaN scores)
                    for (int j = 0; j < cs.d; ++j) q[4 * cs.d + j] *= 1e-42f;
                    q[5 * cs.d + cs.d / 3] = NAN;
                }
                const auto w = kvq::test::gaussian(size_t(n_q) * n_rows, 300 + n_q);
                std::vector<uint8_t> rows(n_rows * stride, 0xEE);
                c.quantize_rows(x.data(), n_rows, rows.data(), stride);
                std::vector<float> xd(n_rows * cs.d);
                c.dequantize_rows(rows.data(), n_rows, xd.data(), stride);

                kvq::force_simd_level(kvq::SimdLevel::scalar);
                const Result want = run(c, rows, n_rows, stride, q, n_q, w);
                for (kvq::SimdLevel level : levels) {
                    CAPTURE(kvq::simd_level_name(level));
                    kvq::force_simd_level(level);
                    REQUIRE(kvq::simd_level() == level);  // not a level below that passed its self-check
                    const Result got = run(c, rows, n_rows, stride, q, n_q, w);
                    for (int i = 0; i < n_q; ++i) {
                        const double qn = norm(q.data() + i * cs.d, cs.d);
                        double wx = 0;  // Σ |w|·‖x̃‖ bounds every output element's terms
                        for (size_t r = 0; r < n_rows; ++r) {
                            const double xn = norm(xd.data() + r * cs.d, cs.d);
                            const float g = got.scores[i * n_rows + r], e = want.scores[i * n_rows + r];
                            CHECK(((std::isnan(g) && std::isnan(e)) || std::fabs(g - e) <= 1e-5 * qn * xn + 1e-6));
                            wx += std::fabs(w[i * n_rows + r]) * xn;
                        }
                        for (int j = 0; j < cs.d; ++j) {
                            CHECK(std::fabs(got.acc[i * cs.d + j] - want.acc[i * cs.d + j]) <= 1e-5 * wx + 1e-6);
                        }
                    }
                }
            }
        }
    }
    kvq::force_simd_level(active);
}
