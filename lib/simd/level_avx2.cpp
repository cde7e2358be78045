// The avx2 level: AVX2 + FMA + F16C (compiled with -mavx2 -mfma -mf16c only).
// The block-codec kernels, the softmax and the primitive checks come from kernels_impl.hpp; this file
// picks the instruction set (and, where it has them, the polar/turbo kernels).
#include "dispatch.hpp"
#include "ops_avx2.hpp"
#include "kernels_impl.hpp"
#include "quantize_polar_impl.hpp"
#include "rotated_avx2.hpp"

namespace kvq::detail {

const LevelKernels& level_avx2() {
    static const LevelKernels kernels = [] {
        LevelKernels k = simd::make_level<xsimd::fma3<xsimd::avx2>>();
        k.rotated = simd::rotated_kernels_avx2();  // polar and turbo: 256-bit kernels at this level too
        k.rotated_quantize = simd::rotated_quantize_kernels<xsimd::fma3<xsimd::avx2>>();  // polar and turbo quantize
        return k;
    }();
    return kernels;
}

}  // namespace kvq::detail
