// TurboQuant's coordinate codebook as stored: the Lloyd-Max centroids (lloyd_max.hpp) rounded to a grid
// of 255 steps, value = scale·n with n an int8 and scale = (largest centroid)/127, so that a SIMD level can
// score 32 codes with one byte shuffle and one int8 dot product against the int8 query, as ggml does for
// its 4-bit blocks. The rounding moves a centroid by at most scale/2 (0.4 % of a standard deviation at
// 4 bits), which adds under 0.5 % to the mean squared error.
//
// Codes are sign and magnitude: code m (m < 2^(b−1)) is the m-th positive centroid counted from zero, code
// 2^(b−1) + m its negative. So the magnitudes of a 4-bit code fit in one 8-float register and the sign is
// one xor (lib/simd/rotated_avx2.hpp).
#pragma once

#include <cstdint>
#include <vector>

#include "lloyd_max.hpp"

namespace kvq::detail {

struct TurboCodebook {
    int bits = 0;
    float scale = 0;              // value = scale · ints[code]
    std::vector<float> values;    // by code, zero-padded to 16 entries
    std::vector<int8_t> ints;     // by code, zero-padded to 16 entries
    std::vector<float> bounds;    // decision thresholds between the sorted values (midpoints)
    std::vector<uint8_t> code_by_rank;  // code of the k-th smallest value

    // The code of the nearest value.
    uint32_t encode(float x) const;
};

TurboCodebook make_turbo_codebook(const ScalarCodebook& lloyd);

}  // namespace kvq::detail
