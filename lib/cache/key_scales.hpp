// The rule for one key channel scale (CacheConfig::key_scales), shared by the config check and the cache
// file reader: positive and finite, and so its reciprocal, which the queries are multiplied by.
#pragma once

#include <cmath>

namespace kvq::detail {

inline float key_scale_reciprocal(float s) { return static_cast<float>(1.0 / static_cast<double>(s)); }

inline bool valid_key_scale(float s) {
    const float inv = key_scale_reciprocal(s);
    return s > 0 && std::isfinite(s) && std::isfinite(inv) && inv > 0;
}

}  // namespace kvq::detail
