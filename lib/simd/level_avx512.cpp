// The avx512 level: AVX-512 F/BW/VL/DQ (compiled with -mavx512f -mavx512bw -mavx512vl -mavx512dq, plus the
// AVX2/FMA/F16C every such CPU has).
// The block-codec kernels, the softmax and the primitive checks come from kernels_impl.hpp; this file
// picks the instruction set (and, where it has them, the polar/turbo kernels).
#include "dispatch.hpp"
#include "ops_avx512.hpp"
#include "kernels_impl.hpp"
#include "channel_avx512.hpp"
#include "quantize_polar_impl.hpp"
#include "rotated_avx2.hpp"

namespace kvq::detail {

const LevelKernels& level_avx512() {
    static const LevelKernels kernels = [] {
        LevelKernels k = simd::make_level<xsimd::avx512bw>();
        k.channel_score = simd::channel_score_avx512;  // chanB key scores
        k.rotated = simd::rotated_kernels_avx2();  // polar and turbo: 256-bit kernels at this level too
        k.rotated_quantize = simd::rotated_quantize_kernels<xsimd::avx512bw>();  // polar and turbo quantize
        return k;
    }();
    return kernels;
}

}  // namespace kvq::detail
