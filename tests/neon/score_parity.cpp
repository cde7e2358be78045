// NEON block-codec scores (ScoreBlocks, as make_level<neon64> wires them) against the scalar specification,
// without the rest of the library: built by scripts/neon_qemu.sh and run under qemu-aarch64. q8_0, q4_0 and iq4_nl,
// d = 32/96/128/256 (128: the unrolled q8_0 four-query kernel), 1-8 queries, 1-65 rows, to float rounding.
#include "simd/dispatch.hpp"
#include "simd/ops_neon.hpp"
#include "simd/kernels_impl.hpp"
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>
using namespace kvq;
using A = xsimd::neon64;
int main() {
    std::mt19937 rng(3); std::normal_distribution<float> nd;
    int fails = 0, checks = 0;
    struct K { const detail::BlockKernels& ref; void (*score)(const uint8_t*, size_t, int, const uint8_t*, size_t, size_t, int64_t, float*, size_t); int bpb; };
    K ks[] = {{detail::kScalarQ8_0, simd::ScoreBlocks<A, simd::LayoutQ8_0>::score, 34}, {detail::kScalarQ4_0, simd::ScoreBlocks<A, simd::LayoutQ4_0>::score, 18},
              {detail::kScalarIQ4_NL, simd::ScoreBlocks<A, simd::LayoutIQ4_NL>::score, 18}};
    for (auto& k : ks) for (int n : {32, 96, 128, 256}) for (int n_q = 1; n_q <= 8; ++n_q) for (size_t rows : {1, 2, 3, 31, 32, 33, 65}) {
        size_t rb = n / 32 * k.bpb, qb = n / 32 * 40;
        std::vector<float> x(rows * n), q(n_q * n); for (auto& v : x) v = nd(rng); for (auto& v : q) v = nd(rng);
        std::vector<uint8_t> keys(rows * rb), prep(n_q * qb);
        for (size_t r = 0; r < rows; ++r) k.ref.quantize(x.data() + r * n, keys.data() + r * rb, n);
        for (int i = 0; i < n_q; ++i) k.ref.prepare_query(q.data() + i * n, prep.data() + i * qb, n);
        std::vector<float> a(n_q * rows), b(n_q * rows);
        k.ref.score(prep.data(), qb, n_q, keys.data(), rb, rows, n, a.data(), rows);
        k.score(prep.data(), qb, n_q, keys.data(), rb, rows, n, b.data(), rows);
        for (size_t j = 0; j < a.size(); ++j) { ++checks; if (std::fabs(a[j] - b[j]) > 1e-4f * (1 + std::fabs(a[j]))) ++fails; }
    }
    std::printf("neon score parity: %d of %d scores differ\n", fails, checks);
    return fails != 0;
}
