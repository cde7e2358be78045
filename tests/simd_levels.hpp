// The SIMD levels the parity tests compare with the scalar specification (test_simd_parity.cpp,
// test_simd_scores.cpp).
#pragma once

#include <vector>

#include "kvq/simd.hpp"

namespace kvq::test {

// Every level this CPU runs but the scalar one, which is the specification.
inline std::vector<kvq::SimdLevel> simd_levels() {
    std::vector<kvq::SimdLevel> levels;
    for (auto l : kvq::available_simd_levels()) {
        if (l != kvq::SimdLevel::scalar) levels.push_back(l);
    }
    return levels;
}

}  // namespace kvq::test
