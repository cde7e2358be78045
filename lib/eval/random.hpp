// A small seeded generator whose numbers are the same with every compiler and standard library
// (std::normal_distribution is not specified bit for bit), so a data set's seed names one data set.
#pragma once

#include <cmath>
#include <cstdint>

#include "../util/splitmix64.hpp"

namespace kvq::detail {

// A seed for one part of a data set (for example one layer and head), independent of the other parts.
inline uint64_t derive_seed(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
    uint64_t s = seed ^ 0x6b76712d64617461ull;  // "kvq-data"
    for (uint64_t x : {a, b, c}) {
        s ^= x + 0x9e3779b97f4a7c15ull + (s << 6) + (s >> 2);
        splitmix64(s);
    }
    return splitmix64(s);
}

class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    uint64_t next() { return splitmix64(state_); }
    // Uniform in [0, 1).
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
    // Uniform integer in [0, n).
    uint64_t below(uint64_t n) { return n ? next() % n : 0; }
    // Standard normal (Box–Muller, both values used).
    double normal() {
        if (has_spare_) {
            has_spare_ = false;
            return spare_;
        }
        double u1;
        do u1 = uniform(); while (u1 <= 0.0);
        const double u2 = uniform();
        const double r = std::sqrt(-2.0 * std::log(u1));
        spare_ = r * std::sin(2.0 * M_PI * u2);
        has_spare_ = true;
        return r * std::cos(2.0 * M_PI * u2);
    }

private:
    uint64_t state_;
    double spare_ = 0;
    bool has_spare_ = false;
};

}  // namespace kvq::detail
