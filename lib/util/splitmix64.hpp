// SplitMix64 (Steele, Lea, Flood 2014): the one generator behind every seeded choice in kvq — rotation
// signs, the QJL sketch, the built-in data sets — so a seed means the same bits on every compiler.
#pragma once

#include <cstdint>

namespace kvq::detail {

inline uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

}  // namespace kvq::detail
