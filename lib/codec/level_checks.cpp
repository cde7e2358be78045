// The end-to-end part of a SIMD level's checks: a codec spec (polar, turbo*) through the whole codec path
// at a level against the specification. Above lib/simd (which checks kernels only, level_check.hpp):
// the rotated kernels take layouts only the codecs build. add_level_check() adds check_rotated_codecs to
// every level's run-time self-check (dispatch.hpp); kvq::selftest() (lib/check/) runs the larger grid.
#include "level_checks.hpp"

#include <cmath>
#include <random>
#include <sstream>
#include <vector>

#include "../simd/dispatch.hpp"
#include "../simd/level_check.hpp"
#include "kvq/codec.hpp"

namespace kvq::detail {

namespace {

std::vector<float> gaussian_rows(size_t rows, int d, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(rows * d);
    for (size_t r = 0; r < rows; ++r) {
        const float scale = r % 5 == 1 ? 0.0f : r % 5 == 2 ? 300.0f : r % 5 == 3 ? 1e-3f : 1.0f;
        for (int j = 0; j < d; ++j) x[r * d + j] = normal(rng) * scale;
    }
    return x;
}

double norm(const float* x, int d) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += double(x[j]) * x[j];
    return std::sqrt(s);
}

// The first difference, as "what: at i, got G, want W".
template <class T>
std::string differs(const char* what, size_t at, T got, T want) {
    std::ostringstream s;
    s.precision(9);
    s << what << " at " << at << ": " << +got << ", the specification gives " << +want;
    return s.str();
}

}  // namespace

std::string check_codec_path(SimdLevel level, const std::string& spec, int d, size_t rows, int n_q, uint64_t seed,
                             size_t& checks) {
    const Codec c = Codec::make(spec, d);
    const size_t stride = c.row_bytes() + (rows % 2) * 5;
    const auto x = gaussian_rows(rows, d, seed);
    const auto q = gaussian_rows(n_q, d, seed + 1);
    const auto w = gaussian_rows(n_q, static_cast<int>(rows), seed + 2);
    std::vector<uint8_t> codes(rows * stride, 0xEE);
    std::vector<float> xd(rows * d);
    {
        LevelOverride spec_level(SimdLevel::scalar);
        c.quantize_rows(x.data(), rows, codes.data(), stride);
        c.dequantize_rows(codes.data(), rows, xd.data(), stride);
    }
    struct Result {
        std::vector<uint8_t> codes, prep;
        std::vector<float> scores, acc;
    };
    auto run = [&](SimdLevel l) {
        LevelOverride at(l);
        Result r{std::vector<uint8_t>(rows * stride, 0xEE), std::vector<uint8_t>(n_q * c.query_bytes()),
                 std::vector<float>(n_q * rows), std::vector<float>(n_q * d, 0.0f)};
        c.quantize_rows(x.data(), rows, r.codes.data(), stride);
        c.prepare_queries(q.data(), n_q, r.prep.data());
        c.score_rows(r.prep.data(), n_q, codes.data(), rows, r.scores.data(), rows, stride);
        c.accumulate_rows(w.data(), rows, n_q, codes.data(), rows, r.acc.data(), stride);
        c.finish_accumulate(r.acc.data(), n_q);
        return r;
    };
    const Result want = run(SimdLevel::scalar), got = run(level);
    for (size_t i = 0; i < want.codes.size(); ++i) {
        if (got.codes[i] != want.codes[i]) return differs("quantize: byte", i, got.codes[i], want.codes[i]);
    }
    for (size_t i = 0; i < want.prep.size(); ++i) {
        if (got.prep[i] != want.prep[i]) return differs("prepare_queries: byte", i, got.prep[i], want.prep[i]);
    }
    checks += want.codes.size() + want.prep.size();
    for (int i = 0; i < n_q; ++i) {
        const double qn = norm(q.data() + i * d, d);
        double wx = 0;  // Σ |w|·‖x̃‖ bounds every output element's terms
        for (size_t r = 0; r < rows; ++r) {
            const double xn = norm(xd.data() + r * d, d);
            const size_t at = i * rows + r;
            if (!close_to(got.scores[at], want.scores[at], 1e-5 * qn * xn + 1e-6))
                return differs("score: query i, row r =", at, got.scores[at], want.scores[at]);
            wx += std::fabs(w[at]) * xn;
        }
        for (int j = 0; j < d; ++j) {
            const size_t at = i * d + j;
            if (!close_to(got.acc[at], want.acc[at], 1e-5 * wx + 1e-6))
                return differs("accumulate: query i, column j =", at, got.acc[at], want.acc[at]);
        }
    }
    checks += n_q * (rows + d);
    return {};
}

std::string check_codec_quantize(SimdLevel level, const std::string& spec, int d, size_t rows, uint64_t seed,
                                 size_t& checks) {
    const Codec c = Codec::make(spec, d);
    const size_t stride = c.row_bytes() + 3;
    auto x = parity_rows(rows, d, seed, true);
    if (rows >= 3) {  // a NaN row and an Inf row (stored as NaN/Inf under NanPolicy::propagate)
        x[(rows - 2) * d + d / 2] = NAN;
        x[(rows - 1) * d] = -INFINITY;
    }
    auto run = [&](SimdLevel l) {
        LevelOverride at(l);
        std::vector<uint8_t> out(rows * stride, 0xEE);
        c.quantize_rows(x.data(), rows, out.data(), stride, NanPolicy::propagate);
        return out;
    };
    const auto want = run(SimdLevel::scalar), got = run(level);
    for (size_t i = 0; i < want.size(); ++i) {
        if (got[i] != want[i]) return differs("quantize: byte", i, got[i], want[i]);
    }
    checks += want.size();
    return {};
}

std::string check_rotated_codecs(SimdLevel level) {
    if (level == SimdLevel::scalar) return {};
    size_t checks = 0;
    struct Case {
        int n;
        size_t rows;
        int n_q;
    };
    // Every row of the kernel grid (rotated_kernels.hpp): turbo4 and turbo3 (turbo), the int8 scores (17
    // rows: a group of 16 and a tail at avx512); turbo3.5 (turbo_split): the float path; turbo2_qjl: the
    // signs; tcq2 and tcq3: tcq's kernels (rotated_tcq_*.hpp); polar.
    for (const char* spec : {"turbo4", "turbo3", "turbo3.5", "turbo2_qjl", "tcq2", "tcq3", "polar"}) {
        for (const Case& k : {Case{128, 17, 7}, Case{64, 2, 2}}) {
            const std::string f = check_codec_path(level, spec, k.n, k.rows, k.n_q, 77, checks);
            if (!f.empty()) return std::string(spec) + ": " + f;
        }
        const std::string f = check_codec_quantize(level, spec, 128, 12, 78, checks);
        if (!f.empty()) return std::string(spec) + ": " + f;
    }
    return {};
}

void add_codec_level_checks() { add_level_check(check_rotated_codecs); }

}  // namespace kvq::detail
