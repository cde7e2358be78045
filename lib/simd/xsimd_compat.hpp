// The one place that knows which xsimd version is installed. Debian 12 ships xsimd 8.1, whose horizontal
// sum is `hadd` (xsimd 9+: `reduce_add`, `hadd` later deprecated), whose bitwise_cast takes the target
// batch type (xsimd 9+: the target element type), whose arm64 float division is a reciprocal estimate
// refined by Newton steps, not IEEE division, and whose AVX-512 archs have no fused multiply-add (there
// xsimd::fma is a multiply and an add: two roundings, two instructions). Kernels call
// kvq::simd::reduce_add, bit_cast, divide and fmadd instead.
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

// x·y + z, rounded once where the arch has fused multiply-add (fma3<avx2>, the AVX-512 archs, arm64):
// what every kernel that says fma means (ops_check.hpp checks it at every level). sse2 has no such
// instruction: there it is x·y, rounded, plus z.
template <class A>
inline xsimd::batch<float, A> fmadd(const xsimd::batch<float, A>& x, const xsimd::batch<float, A>& y,
                                    const xsimd::batch<float, A>& z) noexcept {
#if defined(__AVX512F__)
    if constexpr (std::is_base_of_v<xsimd::avx512f, A>) {
        return _mm512_fmadd_ps(x, y, z);
    } else {
        return xsimd::fma(x, y, z);
    }
#else
    return xsimd::fma(x, y, z);
#endif
}

// Whether fmadd rounds once at arch A.
template <class A>
constexpr bool fmadd_is_fused() {
#if defined(__AVX512F__)
    if (std::is_base_of_v<xsimd::avx512f, A>) return true;
#endif
#if defined(__FMA__)
    if (std::is_base_of_v<xsimd::fma3<xsimd::avx2>, A>) return true;
#endif
#if defined(__aarch64__) || defined(_M_ARM64)
    if (std::is_base_of_v<xsimd::neon64, A>) return true;
#endif
    return false;
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
