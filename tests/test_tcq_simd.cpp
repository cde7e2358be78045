// A SIMD level's tcqB Viterbi encoder (tcq_viterbi_avx2.hpp, tcq_viterbi_portable.hpp) against the
// specification's tcq_viterbi (lib/ref/tcq.hpp) on sequences where its decisions are ties: every value on
// a level, on a midpoint between two levels (of one subset or of neighbouring ranks), alternating, zeros,
// huge values whose e·e overflows to Inf, NaN; n from 1 to 300, so every count of values past a register.
#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kvq/simd.hpp"
#include "ref/tcq.hpp"
#include "simd/dispatch.hpp"
#include "test_util.hpp"

namespace kd = kvq::detail;

namespace {

// The sequences of one alphabet: value j of sequence `kind` (n values).
std::vector<std::function<float(int)>> tie_sequences(const kd::TcqAlphabet& a) {
    const float* L = a.levels;
    const int top = a.n_levels - 1;
    const auto gauss = kvq::test::gaussian(300, 5);
    std::vector<std::function<float(int)>> s;
    s.push_back([](int) { return 0.0f; });
    s.push_back([L](int) { return L[3]; });                                     // on a level
    s.push_back([L, top](int j) { return L[j % (top + 1)]; });                  // on every level in turn
    s.push_back([L](int) { return 0.5f * (L[1] + L[5]); });                     // between two levels of subset 1
    s.push_back([L](int j) { return 0.5f * (L[j % 4] + L[j % 4 + 4]); });       // within-subset midpoints
    s.push_back([L, top](int j) { return 0.5f * (L[j % top] + L[j % top + 1]); });  // neighbouring ranks
    s.push_back([L](int j) { return j % 2 ? L[2] : -L[2]; });                   // alternating ±level
    s.push_back([L](int j) { return j % 2 ? 0.5f * (L[0] + L[1]) : L[6]; });    // alternating midpoint, level
    s.push_back([L, top](int j) { return j % 3 ? L[top] : -L[top]; });
    s.push_back([](int j) { return j % 2 ? 1e20f : -1e20f; });                  // e·e is Inf: all costs Inf
    s.push_back([](int j) { return j % 5 ? FLT_MAX : 0.25f; });
    s.push_back([gauss](int j) { return j % 7 == 3 ? 3e19f : 2.0f * gauss[j]; });  // Inf from value 3 on
    s.push_back([gauss](int j) { return j == 40 ? NAN : gauss[j]; });           // NaN: every cost from 40 on
    s.push_back([gauss](int j) { return gauss[j]; });
    return s;
}

bool same_float(float x, float y) { return std::memcmp(&x, &y, sizeof x) == 0 || (std::isnan(x) && std::isnan(y)); }

}  // namespace

TEST_CASE("every SIMD level's tcq Viterbi encoder writes the specification's codes on ties, huge values, NaN") {
    int levels_with_own = 0;
    for (auto level : kvq::available_simd_levels()) {
        const kd::RotatedKernels* k = kd::level_rotated_kernels(level);
        if (level == kvq::SimdLevel::scalar || !k) continue;
        if (k->tcq_viterbi != kd::tcq_viterbi) ++levels_with_own;
        CAPTURE(std::string(kvq::simd_level_name(level)));
        for (int bits : {2, 3}) {
            const kd::TcqAlphabet& a = kd::tcq_alphabet(bits);
            const auto sequences = tie_sequences(a);
            for (size_t kind = 0; kind < sequences.size(); ++kind) {
                for (int n = 1; n <= 300; ++n) {
                    std::vector<float> t(n);
                    for (int j = 0; j < n; ++j) t[j] = sequences[kind](j);
                    std::vector<uint8_t> u_want(n), f_want(n), u_got(n, 0xEE), f_got(n, 0xEE);
                    const float want = kd::tcq_viterbi(a, t.data(), n, u_want.data(), f_want.data());
                    const float got = k->tcq_viterbi(a, t.data(), n, u_got.data(), f_got.data());
                    if (u_got == u_want && f_got == f_want && same_float(got, want)) continue;
                    CAPTURE(bits);
                    CAPTURE(kind);
                    CAPTURE(n);
                    CHECK(u_got == u_want);
                    CHECK(f_got == f_want);
                    CHECK(same_float(got, want));
                }
            }
        }
    }
    // Every SIMD level has its own (x86: tcq_viterbi_avx2.hpp; sse2 and neon: tcq_viterbi_portable.hpp).
    CHECK(levels_with_own == static_cast<int>(kvq::available_simd_levels().size()) - 1);
}
