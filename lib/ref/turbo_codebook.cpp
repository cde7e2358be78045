#include "turbo_codebook.hpp"

#include <algorithm>
#include <cmath>

namespace kvq::detail {

uint32_t TurboCodebook::encode(float x) const {
    return code_by_rank[std::upper_bound(bounds.begin(), bounds.end(), x) - bounds.begin()];
}

TurboCodebook make_turbo_codebook(const ScalarCodebook& lloyd) {
    TurboCodebook cb;
    cb.bits = lloyd.bits;
    const int n = 1 << cb.bits, half = n / 2;
    cb.scale = lloyd.centroids.back() / 127.0f;  // symmetric: the largest is −the smallest
    std::vector<int> rounded(n);
    for (int k = 0; k < n; ++k) rounded[k] = static_cast<int>(std::lround(lloyd.centroids[k] / cb.scale));
    cb.values.assign(std::max(16, n), 0.0f);
    cb.ints.assign(std::max(16, n), 0);
    cb.code_by_rank.resize(n);
    for (int k = 0; k < n; ++k) {  // k: rank, ascending
        const int code = k >= half ? k - half : (half - 1 - k) | half;
        cb.code_by_rank[k] = static_cast<uint8_t>(code);
        cb.ints[code] = static_cast<int8_t>(rounded[k]);
        cb.values[code] = cb.scale * static_cast<float>(rounded[k]);
    }
    for (int k = 0; k + 1 < n; ++k) {
        cb.bounds.push_back(0.5f * (cb.values[cb.code_by_rank[k]] + cb.values[cb.code_by_rank[k + 1]]));
    }
    return cb;
}

}  // namespace kvq::detail
