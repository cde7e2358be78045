// The sse2 level: SSE2, the x86-64 baseline (compiled with the default flags).
// Every kernel comes from kernels_impl.hpp; this file only picks the instruction set.
#include "dispatch.hpp"
#include "ops_sse2.hpp"
#include "kernels_impl.hpp"

namespace kvq::detail {

const LevelKernels& level_sse2() {
    static const LevelKernels kernels = simd::make_level<xsimd::sse2>();
    return kernels;
}

}  // namespace kvq::detail
