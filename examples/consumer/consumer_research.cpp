// A C++ program on kvq's research library (kvq::research, which links the engine): the attention error
// of q8_0 keys and q4_0 values against the FP32 reference.
#include <kvq/codec.hpp>
#include <kvq/research/eval.hpp>

#include <cstdio>
#include <random>
#include <vector>

int main() {
    const int d = 64, n = 256, n_q = 4;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    std::vector<float> k(n * d), v(n * d), q(n_q * d);
    for (auto* x : {&k, &v, &q}) {
        for (float& value : *x) value = normal(rng);
    }
    const auto keys = kvq::Codec::make("q8_0", d);
    const auto values = kvq::Codec::make("q4_0", d);
    const auto err = kvq::attention_error(q.data(), n_q, k.data(), v.data(), n, keys, values);
    std::printf("q8_0/q4_0 attention vs fp32: output rel. L2 error %.4f, cosine %.5f\n", err.output_l2.mean,
                err.cosine.mean);
    return err.cosine.worst > 0.99 ? 0 : 1;
}
