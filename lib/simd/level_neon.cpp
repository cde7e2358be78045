// The neon level: NEON on arm64 (the baseline of every arm64 CPU).
// The block-codec kernels, the softmax and the primitive checks come from kernels_impl.hpp; this file
// picks the instruction set (and, where it has them, the polar/turbo kernels).
#include "dispatch.hpp"
#include "ops_neon.hpp"
#include "kernels_impl.hpp"

namespace kvq::detail {

const LevelKernels& level_neon() {
    static const LevelKernels kernels = simd::make_level<xsimd::neon64>();
    return kernels;
}

}  // namespace kvq::detail
