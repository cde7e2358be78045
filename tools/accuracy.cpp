// kvq-accuracy: the first accuracy-vs-compression table, on seeded N(0,1) data. For every codec in the
// table (and its +rot form): bits per value, round-trip error, and attention error when it stores the
// keys (values f32) and when it stores the values (keys f32), against the FP32 reference.
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kvq/codec.hpp"
#include "kvq/eval.hpp"
#include "kvq/simd.hpp"

int main(int argc, char** argv) {
    const int d = argc > 1 ? std::atoi(argv[1]) : 128;
    const size_t n_rows = 1024;
    const int n_q = 32;
    std::mt19937_64 rng(1234);
    std::normal_distribution<float> normal;
    auto gaussian = [&](size_t n) {
        std::vector<float> x(n);
        for (float& v : x) v = normal(rng);
        return x;
    };
    // Queries scaled so attention is neither uniform nor one-hot (entropy well below log n).
    auto q = gaussian(size_t(n_q) * d);
    for (float& v : q) v *= 2.0f;
    const auto k = gaussian(n_rows * d), v = gaussian(n_rows * d);

    std::printf("kvq accuracy on gaussian data: head_dim %d, %zu keys, %d queries, SIMD %s\n\n", d, n_rows, n_q,
                std::string(kvq::simd_level_name(kvq::simd_level())).c_str());
    std::printf("| codec | bits/value | round-trip rel. RMSE | as keys: KL mean | as keys: top-8 | as values: out rel. L2 |\n");
    std::printf("|---|---:|---:|---:|---:|---:|\n");
    const kvq::Codec f32 = kvq::Codec::make("f32", d);
    for (const auto& name : kvq::codec_names()) {
        // polar and turbo* rotate anyway: their "+rot" form is the same codec.
        const bool rotates = kvq::codec_info(name).rotates;
        for (const std::string& spec : {name, name + "+rot"}) {
            if (rotates && spec != name) continue;
            const kvq::Codec c = kvq::Codec::make(spec, d);
            const double rt = kvq::roundtrip_relative_rmse(c, k.data(), n_rows);
            const auto as_keys = kvq::attention_error(q.data(), n_q, k.data(), v.data(), n_rows, c, f32);
            const auto as_values = kvq::attention_error(q.data(), n_q, k.data(), v.data(), n_rows, f32, c);
            std::printf("| %s | %.3f | %.4f | %.2e | %.3f | %.4f |\n", spec.c_str(), c.bits_per_value(), rt,
                        as_keys.kl.mean, as_keys.topk.mean, as_values.output_l2.mean);
        }
    }
    return 0;
}
