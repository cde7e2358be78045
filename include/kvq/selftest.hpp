// The full parity check, shipped in the library so that any machine can be verified: every codec at
// every SIMD level this CPU runs against the scalar specification (quantize and prepared-query bytes
// identical, dequantized values bit-identical, scores and accumulations to float rounding, over head
// sizes 32-256 and odd ones for the plain codecs, 1-8 queries and 1-129 rows), the softmax, the SIMD
// primitives' contracts, and cache attention at each level against the FP32 reference on the stored
// rows. About a second per level. `kvq selftest`, kvq_selftest() and kvq.selftest() run it too.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "kvq/simd.hpp"

namespace kvq {

struct SelftestLine {
    SimdLevel level = SimdLevel::scalar;
    std::string family;   // "primitives", "f32/f16/bf16", "q8_0", ..., "turbo", "polar", "softmax", "cache"
    bool passed = false;
    size_t cases = 0;     // calls compared
    size_t checks = 0;    // values compared
    std::string detail;   // the first difference, when it failed
    double ms = 0;
};

struct SelftestResult {
    std::vector<SelftestLine> lines;  // one per level and family
    bool passed() const {
        for (const auto& l : lines) {
            if (!l.passed) return false;
        }
        return !lines.empty();
    }
};

// Runs the check at every level this CPU runs (scalar is the reference, so it is checked only through
// the cache line); on_line, if given, sees each line as it is finished.
SelftestResult selftest(const std::function<void(const SelftestLine&)>& on_line = {});

// "avx512  q8_0          ok    1234 cases  567890 values  12.3 ms" (or "FAIL ... : detail").
std::string format_selftest_line(const SelftestLine& line);

}  // namespace kvq
