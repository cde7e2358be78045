// Shared helpers for the C++ tests: seeded data and the ggml oracle files.
#ifndef KVQ_TESTS_TEST_UTIL_HPP  // a guard, not #pragma once: see tests/CMakeLists.txt (precompiled header)
#define KVQ_TESTS_TEST_UTIL_HPP

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvq::test {

// Decode attention in double over n tokens: q is n_heads × d, k and v are n × n_kv × d; query head i
// uses kv head i / (n_heads / n_kv), scale 1/sqrt(d).
inline std::vector<float> decode_attention_double(const std::vector<float>& q, const std::vector<float>& k,
                                                  const std::vector<float>& v, size_t n, int n_heads, int n_kv, int d) {
    std::vector<float> out(size_t(n_heads) * d);
    const double scale = 1.0 / std::sqrt(double(d));
    for (int i = 0; i < n_heads; ++i) {
        const int h = i / (n_heads / n_kv);
        std::vector<double> s(n);
        double top = -1e300, sum = 0;
        for (size_t t = 0; t < n; ++t) {
            double dot = 0;
            for (int j = 0; j < d; ++j) dot += double(q[size_t(i) * d + j]) * k[(t * n_kv + h) * d + j];
            top = std::max(top, s[t] = dot * scale);
        }
        std::vector<double> acc(d, 0.0);
        for (size_t t = 0; t < n; ++t) {
            const double w = std::exp(s[t] - top);
            sum += w;
            for (int j = 0; j < d; ++j) acc[j] += w * v[(t * n_kv + h) * d + j];
        }
        for (int j = 0; j < d; ++j) out[size_t(i) * d + j] = float(acc[j] / sum);
    }
    return out;
}

// ‖a − b‖ / ‖b‖, in double.
inline double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a.size(); ++i) diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), norm += double(b[i]) * b[i];
    return std::sqrt(diff / norm);
}

// The directory of the test data (tests/data), compiled into data_dir.cpp.
const char* data_dir();

inline std::vector<float> gaussian(size_t n, uint64_t seed, float sigma = 1.0f) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> dist(0.0f, sigma);
    std::vector<float> x(n);
    for (float& v : x) v = dist(rng);
    return x;
}

inline std::vector<uint8_t> read_file(const std::string& name) {
    const std::string path = std::string(data_dir()) + "/" + name;
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open test data " + path);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline std::vector<float> read_floats(const std::string& name) {
    const auto bytes = read_file(name);
    std::vector<float> x(bytes.size() / 4);
    std::memcpy(x.data(), bytes.data(), x.size() * 4);
    return x;
}

}  // namespace kvq::test

#endif  // KVQ_TESTS_TEST_UTIL_HPP
