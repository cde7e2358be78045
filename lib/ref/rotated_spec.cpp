// The scalar level's rows of the rotated codecs' kernel grid (rotated_kernels.hpp): the specification of
// every (codec, op), one line a row. Every SIMD level's empty slot takes the kernel named here.
#include "rotated_kernels.hpp"
#include "rotated_quantize.hpp"
#include "tcq.hpp"

namespace kvq::detail {

const RotatedKernels& scalar_rotated_kernels() {
    static const RotatedKernels k = [] {
        using R = RotatedCodec;
        RotatedKernels s;
        auto row = [&](R c) -> TurboRowKernels& { return s.turbo_rows[static_cast<int>(c)]; };
        row(R::turbo) = {turbo_quantize_rows_spec, turbo_score_spec, turbo_accumulate_spec};
        row(R::turbo_split) = {turbo_quantize_rows_spec, turbo_score_spec, turbo_accumulate_spec};
        row(R::turbo_qjl) = {turbo_quantize_rows_spec, turbo_score_spec, turbo_accumulate_spec};
        row(R::tcq2) = {tcq_quantize_rows_spec<2>, tcq_score_spec<2>, tcq_accumulate_spec<2>};
        row(R::tcq3) = {tcq_quantize_rows_spec<3>, tcq_score_spec<3>, tcq_accumulate_spec<3>};
        s.polar = {polar_quantize_rows_spec, polar_score_spec, polar_accumulate_spec};
        s.tcq_viterbi = tcq_viterbi;
        return s;
    }();
    return k;
}

}  // namespace kvq::detail
