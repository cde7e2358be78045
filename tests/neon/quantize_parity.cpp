// NEON quantizers against the scalar specification, without the rest of the library: built by
// scripts/neon_qemu.sh with aarch64-linux-gnu-g++ and run under qemu-aarch64. Every ggml block codec (and
// iq4_nls) on NaN/Inf in every position, rounding ties at scale 1 (iq4_nl's at ±127), ±0, huge and
// subnormal scales and random blocks, in one call and in calls of 1, 3, 4 and 5 blocks; and
// finite_max_abs.

#include "simd/dispatch.hpp"
#include "simd/ops_neon.hpp"
#include "simd/kernels_impl.hpp"
#include "simd/quantize_iq4nl_impl.hpp"
#include <cfloat>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>
using namespace kvq;
using A = xsimd::neon64;
int main() {
    std::mt19937_64 rng(5); std::normal_distribution<float> nd;
    std::vector<float> x;
    auto block = [&](auto&& fill) { float b[32]; for (float& v : b) v = nd(rng); fill(b); x.insert(x.end(), b, b + 32); };
    const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
    for (int p = 0; p < 32; ++p) {
        for (float bad : {nan, -nan, inf, -inf}) block([&](float* b) { b[p] = bad; });
        block([&](float* b) { b[p] = nan; b[31 - p] = inf; });
        block([&](float* b) { b[p] = nan; b[(p + 1) % 32] = 1e30f; });
        block([&](float* b) { for (int j = 0; j < 32; ++j) b[j] = j == p ? nan : 0.0f; });
        block([&](float* b) { for (int j = 0; j < 32; ++j) b[j] = (j % 5 - 2) * 0.5f; b[p] = -b[p] ; });
        block([&](float* b) { b[p] = 127.0f; for (int j = 0; j < 32; ++j) if (j != p) b[j] = 0.5f + (j % 8); });
        block([&](float* b) { b[p] = -8.0f; for (int j = 0; j < 32; ++j) if (j != p) b[j] = (j % 16) - 7.5f; });
    }
    // iq4_nl, iq4_nls: at an extreme of ±127 their inverse scale is ±1 exactly: levels and midpoints are ties.
    for (float e : {127.0f, -127.0f}) {
        for (float sign : {1.0f, -1.0f}) {
            block([&](float* b) {
                for (int j = 0; j < 32; ++j) {
                    const float lo = detail::kIQ4NLValues[j % 15], hi = detail::kIQ4NLValues[j % 15 + 1];
                    b[j] = sign * (j < 15 ? (lo + hi) / 2 : j < 30 ? lo : hi);
                }
                b[31] = e;
            });
        }
    }
    for (float m : {FLT_MAX, -FLT_MAX, 1e-38f, 1e-40f, 1e-44f, 0.0f, -0.0f}) block([&](float* b) { for (int j = 0; j < 32; ++j) b[j] = m * (j % 5 - 2) / 2.0f; });
    for (int i = 0; i < 300; ++i) block([](float*) {});
    while (x.size() % (32 * 16)) block([](float*) {});
    struct K { const char* name; const detail::BlockKernels& ref; void (*f)(const float*, uint8_t*, int64_t); int bpb; };
    K ks[] = {{"q8_0", detail::kScalarQ8_0, simd::quantize_q8_0<A>, 34}, {"q4_0", detail::kScalarQ4_0, simd::quantize_sym<A, 4>, 18},
              {"q5_0", detail::kScalarQ5_0, simd::quantize_sym<A, 5>, 22}, {"q4_1", detail::kScalarQ4_1, simd::quantize_asym<A, 4>, 20},
              {"q5_1", detail::kScalarQ5_1, simd::quantize_asym<A, 5>, 24},
              {"iq4_nl", detail::kScalarIQ4_NL, simd::QuantizeIQ4NL<A, false>::quantize, 18},
              {"iq4_nls", detail::kScalarIQ4_NLS, simd::QuantizeIQ4NL<A, true>::quantize, 18}};
    int fails = 0;
    const size_t blocks = x.size() / 32;
    for (auto& k : ks) {
        for (size_t step : {blocks, size_t(1), size_t(3), size_t(4), size_t(5)}) {
            std::vector<uint8_t> a(blocks * k.bpb, 1), b(blocks * k.bpb, 2);
            for (size_t i = 0; i < blocks; i += step) {
                const size_t nb = std::min(step, blocks - i);
                k.ref.quantize(x.data() + i * 32, a.data() + i * k.bpb, int64_t(nb) * 32);
                k.f(x.data() + i * 32, b.data() + i * k.bpb, int64_t(nb) * 32);
            }
            size_t bad = 0;
            for (size_t i = 0; i < blocks; ++i) bad += memcmp(a.data() + i * k.bpb, b.data() + i * k.bpb, k.bpb) != 0;
            printf("%s step %zu: %zu/%zu blocks differ\n", k.name, step, bad, blocks);
            fails += bad != 0;
        }
    }
    // finite_max_abs
    {
        std::vector<float> v(301); for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(float(i)) * 3;
        float m = 0; for (float t : v) m = std::max(m, std::fabs(t));
        fails += simd::finite_max_abs<A>(v.data(), v.size()) != m;
        v[77] = inf; fails += !std::isnan(simd::finite_max_abs<A>(v.data(), v.size()));
        v[77] = nan; fails += !std::isnan(simd::finite_max_abs<A>(v.data(), v.size()));
        fails += std::isnan(simd::finite_max_abs<A>(v.data(), 77));
    }
    printf("%s\n", fails ? "FAIL" : "OK");
    return fails;
}
