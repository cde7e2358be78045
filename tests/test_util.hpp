// Shared helpers for the C++ tests: seeded data and the ggml oracle files.
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

namespace kvq::test {

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
