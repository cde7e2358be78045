// kvq-polar-accuracy: the polar and turbo codecs against q4_0 and q4_0+rot at equal or fewer bits, on
// seeded N(0,1) data (the numbers in docs/polar.md). Keys are scored on their codes (values f32), values
// accumulated from their codes (keys f32), and both compared with the FP32 reference.
//   kvq-polar-accuracy [head_dim]
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kvq/codec.hpp"
#include "kvq/research/eval.hpp"

int main(int argc, char** argv) {
    const int d = argc > 1 ? std::atoi(argv[1]) : 128;
    const size_t n_rows = 2048;
    const int n_q = 64;
    std::mt19937_64 rng(4321);
    std::normal_distribution<float> normal;
    auto gaussian = [&](size_t n, float sigma) {
        std::vector<float> x(n);
        for (float& v : x) v = sigma * normal(rng);
        return x;
    };
    // Query scale 2: the softmax is peaked but not one-hot.
    const auto q = gaussian(size_t(n_q) * d, 2.0f), k = gaussian(n_rows * d, 1.0f), v = gaussian(n_rows * d, 1.0f);
    const kvq::Codec f32 = kvq::Codec::make("f32", d);

    std::printf("gaussian data: head_dim %d, %zu keys, %d queries\n\n", d, n_rows, n_q);
    std::printf("| codec | bits/value | round-trip rel. RMSE | keys: KL mean | keys: KL worst | keys: top-8 | keys: score RMSE | values: out rel. L2 |\n");
    std::printf("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for (const char* spec : {"q8_0", "q4_1", "q4_0", "q4_0+rot", "polar:budget=4.5", "turbo4", "polar:budget=4.125",
                             "polar", "polar:budget=3.875", "turbo3.5", "turbo3", "polar:budget=3", "turbo2.5",
                             "turbo2", "turbo4_qjl", "turbo3_qjl", "turbo2_qjl"}) {
        const kvq::Codec c = kvq::Codec::make(spec, d);
        const double rt = kvq::roundtrip_relative_rmse(c, k.data(), n_rows);
        const auto as_keys = kvq::attention_error(q.data(), n_q, k.data(), v.data(), n_rows, c, f32);
        const auto as_values = kvq::attention_error(q.data(), n_q, k.data(), v.data(), n_rows, f32, c);
        std::printf("| %s | %.3f | %.4f | %.2e | %.2e | %.3f | %.4f | %.4f |\n", spec, c.bits_per_value(), rt,
                    as_keys.kl.mean, as_keys.kl.worst, as_keys.topk.mean, as_keys.score_rmse.mean, as_values.output_l2.mean);
    }
    return 0;
}
