// kvq::selftest() at the levels named, not every level the CPU runs: the test command checks under
// emulation only the levels the host lacks (tests/levels/selftest.cpp, scripts/simd_levels.sh). Every level
// named must be one the CPU runs (kvq::available_simd_levels()).
#pragma once

#include <functional>
#include <vector>

#include "kvq/selftest.hpp"

namespace kvq::detail {

SelftestResult selftest_levels(const std::vector<SimdLevel>& levels, const std::function<void(const SelftestLine&)>& on_line = {});

}  // namespace kvq::detail
