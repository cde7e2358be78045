// Key channel scales at the cache's boundary (CacheConfig::key_scales): keys are stored as k ⊙ s and
// queries attend as q ⊘ s, so q·k is unchanged up to float rounding.
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "kvq/errors.hpp"

#include "cache_impl.hpp"

namespace kvq {

const float* detail::CacheImpl::scale_keys(int layer, const float* k, size_t n, std::vector<float>& buf) const {
    if (!scales_keys(layer)) return k;
    const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
    const float* s = cfg.key_scales.data() + static_cast<size_t>(layer) * row;
    buf.resize(n * row);
    for (size_t t = 0; t < n; ++t) {
        for (size_t j = 0; j < row; ++j) buf[t * row + j] = k[t * row + j] * s[j];
    }
    return buf.data();
}

// A finite query can overflow once divided by a small scale: refused, as a non-finite query is under
// NanPolicy::reject, whatever the policy (the caller's query was finite, so a NaN output would hide why).
const float* detail::CacheImpl::scale_queries(const char* what, int layer, const float* q, size_t n,
                                              std::vector<float>& buf) const {
    if (!scales_keys(layer)) return q;
    const size_t d = static_cast<size_t>(cfg.head_dim), heads = static_cast<size_t>(cfg.n_heads), g = static_cast<size_t>(this->g());
    const float* inv = key_scale_inv.data() + static_cast<size_t>(layer) * cfg.n_kv_heads * d;
    buf.resize(n * heads * d);
    for (size_t i = 0; i < n * heads; ++i) {
        const float* r = inv + (i % heads) / g * d;  // query head i % heads reads kv head (i % heads) / g
        bool finite = true;
        for (size_t j = 0; j < d; ++j) {
            buf[i * d + j] = q[i * d + j] * r[j];
            finite &= std::isfinite(buf[i * d + j]);
        }
        if (!finite) {
            throw NonFiniteInput(std::string("KVCache::") + what + ": query vector " + std::to_string(i) +
                                 " divided by layer " + std::to_string(layer) + "'s key_scales overflows float");
        }
    }
    return buf.data();
}

}  // namespace kvq
