// The one place that knows which xsimd version is installed. Debian 12 ships xsimd 8.1, whose horizontal
// sum is `hadd` (xsimd 9+: `reduce_add`, `hadd` later deprecated) and whose bitwise_cast takes the target
// batch type (xsimd 9+: the target element type), and on arm64 its float division is a reciprocal
// estimate refined by Newton steps, not IEEE division. Kernels call kvq::simd::reduce_add,
// reduce_add_rows, bit_cast and divide instead.
#pragma once

#include <xsimd/xsimd.hpp>

#include <cstddef>
#include <type_traits>

namespace kvq::simd {

template <class T, class A>
inline T reduce_add(const xsimd::batch<T, A>& x) noexcept {
#if XSIMD_VERSION_MAJOR < 9
    return xsimd::hadd(x);
#else
    return xsimd::reduce_add(x);
#endif
}

// The bits of x as a batch of T.
template <class T, class U, class A>
inline xsimd::batch<T, A> bit_cast(const xsimd::batch<U, A>& x) noexcept {
#if XSIMD_VERSION_MAJOR < 9
    return xsimd::bitwise_cast<xsimd::batch<T, A>>(x);
#else
    return xsimd::bitwise_cast<T>(x);
#endif
}

// a / b correctly rounded, as the scalar specification divides (xsimd 8.1's arm64 division is not: it
// is off on subnormals and can be an ulp off elsewhere).
template <class A>
inline xsimd::batch<float, A> divide(const xsimd::batch<float, A>& a, const xsimd::batch<float, A>& b) noexcept {
#if defined(__aarch64__) || defined(_M_ARM64)
    if constexpr (std::is_same_v<A, xsimd::neon64>) return vdivq_f32(a, b);
#endif
    return a / b;
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
