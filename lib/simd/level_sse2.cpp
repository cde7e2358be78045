// The sse2 level: SSE2, the x86-64 baseline (compiled with the default flags).
// The block-codec kernels, the softmax and the primitive checks come from kernels_impl.hpp; this file
// picks the instruction set (and, where it has them, the polar/turbo kernels).
#include "dispatch.hpp"
#include "ops_sse2.hpp"
#include "kernels_impl.hpp"
#include "quantize_polar_impl.hpp"

namespace kvq::detail {

const LevelKernels& level_sse2() {
    static const LevelKernels kernels = [] {
        LevelKernels k = simd::make_level<xsimd::sse2>();
        k.rotated_quantize = simd::rotated_quantize_kernels<xsimd::sse2>();  // polar and turbo quantize
        return k;
    }();
    return kernels;
}

}  // namespace kvq::detail
