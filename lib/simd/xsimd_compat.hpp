// The one place that knows which xsimd version is installed. Debian 12 ships xsimd 8.1, whose horizontal
// sum is `hadd` (xsimd 9+: `reduce_add`, `hadd` later deprecated) and whose bitwise_cast takes the target
// batch type (xsimd 9+: the target element type), and on arm64 its float division is a reciprocal
// estimate refined by Newton steps, not IEEE division. Kernels call kvq::simd::reduce_add, bit_cast and
// divide instead.
//
// xsimd's transposing sum `haddp` is not used: xsimd 8.1's AVX-512 haddp returns the row sums in lane
// order 0,1,4,5,2,3,6,7,8,9,12,13,10,11,14,15, not row k in lane k (its own test cannot see it). Each
// level's Ops<A>::reduce_add_rows does that job with a stated contract, checked at every level by
// ops_check.hpp.
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

}  // namespace kvq::simd
