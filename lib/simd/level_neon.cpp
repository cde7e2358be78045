// The neon level: NEON on arm64 (the baseline of every arm64 CPU).
// The block-codec kernels, the softmax and the primitive checks come from kernels_impl.hpp; this file
// picks the instruction set (and, where it has them, the polar/turbo kernels).
#include "dispatch.hpp"
#include "ops_neon.hpp"
#include "kernels_impl.hpp"
#include "quantize_polar_impl.hpp"

namespace kvq::detail {

const LevelKernels& level_neon() {
    static const LevelKernels kernels = [] {
        LevelKernels k = simd::make_level<xsimd::neon64>();
        // turbo quantize; polar's gives other bytes than the specification on the selftest's extreme rows
        // under qemu-aarch64 (not yet understood), so polar quantizes with the specification here.
        k.rotated_quantize.turbo = simd::rotated_quantize_kernels<xsimd::neon64>().turbo;
        return k;
    }();
    return kernels;
}

}  // namespace kvq::detail
