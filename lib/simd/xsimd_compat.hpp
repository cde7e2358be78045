// The one place that knows which xsimd version is installed. Debian 12 ships xsimd 8.1, whose horizontal
// sum is `hadd` and whose transposing sum is `haddp`; xsimd 9+ renamed the first to `reduce_add` (and
// later deprecated `hadd`). Kernels call kvq::simd::reduce_add / reduce_add_rows only.
#pragma once

#include <xsimd/xsimd.hpp>

#include <cstddef>

namespace kvq::simd {

template <class T, class A>
inline T reduce_add(const xsimd::batch<T, A>& x) noexcept {
#if XSIMD_VERSION_MAJOR < 9
    return xsimd::hadd(x);
#else
    return xsimd::reduce_add(x);
#endif
}

// out[k] = sum of the lanes of rows[k], for k < count <= batch size: one transposing reduction instead
// of `count` separate horizontal sums.
template <class A>
inline void reduce_add_rows(const xsimd::batch<float, A>* rows, int count, float* out) noexcept {
    using F = xsimd::batch<float, A>;
    constexpr int N = static_cast<int>(F::size);
    F padded[N];
    for (int k = 0; k < N; ++k) padded[k] = k < count ? rows[k] : F(0.0f);
    alignas(64) float sums[N];
    xsimd::haddp(padded).store_aligned(sums);
    for (int k = 0; k < count; ++k) out[k] = sums[k];
}

}  // namespace kvq::simd
