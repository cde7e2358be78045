// The avx2 level: AVX2 + FMA + F16C (compiled with -mavx2 -mfma -mf16c only).
// The one place that chooses this level's kernels: one line per (codec, op), naming the kernel (from
// kernels_impl.hpp and the headers included here) and what `kvq info --kernels` calls it. Slots not set
// here take the scalar specification (dispatch.cpp; "spec" in the table): any a line below does not name.
#include "dispatch.hpp"
#include "ops_avx2.hpp"
#include "quantize_iq4nl_impl.hpp"
#include "kernels_impl.hpp"
#include "accumulate_avx2.hpp"
#include "accumulate_grid_avx2.hpp"
#include "quantize_polar_impl.hpp"
#include "rotated_avx2.hpp"
#include "rotated_tcq_avx2.hpp"
#include "quantize_tcq_avx2.hpp"
#include "channel_portable.hpp"

namespace kvq::simd {
namespace {

using detail::BlockCodec;
using detail::KernelOp;
using detail::OtherKernel;

detail::LevelKernels make() {
    using A = xsimd::fma3<xsimd::avx2>;
    using C = BlockCodec;
    using Op = KernelOp;
    using K = OtherKernel;
    using R = detail::RotatedCodec;
    using RO = detail::RotatedOp;
    detail::LevelKernels k;
    // plain codecs: values as they are, queries as floats
    k.set<Op::quantize>(C::f32, quantize_plain<A, PlainF32>, "quantize_plain<f32>");
    k.set<Op::dequantize>(C::f32, dequantize_plain<A, PlainF32>, "dequantize_plain<f32>");
    k.set<Op::prepare_query>(C::f32, prepare_query_f32, "prepare_query_f32");
    k.set<Op::score>(C::f32, ScorePlain<A, PlainF32>::score, "score_plain<f32>");
    k.set<Op::accumulate>(C::f32, accumulate_plain<A, PlainF32>, "accumulate_plain<f32>");
    k.set<Op::quantize>(C::f16, quantize_plain<A, PlainF16>, "quantize_plain<f16>");
    k.set<Op::dequantize>(C::f16, dequantize_plain<A, PlainF16>, "dequantize_plain<f16>");
    k.set<Op::prepare_query>(C::f16, prepare_query_f32, "prepare_query_f32");
    k.set<Op::score>(C::f16, ScorePlain<A, PlainF16>::score, "score_plain<f16>");
    k.set<Op::accumulate>(C::f16, accumulate_plain<A, PlainF16>, "accumulate_plain<f16>");
    k.set<Op::quantize>(C::bf16, quantize_plain<A, PlainBF16>, "quantize_plain<bf16>");
    k.set<Op::dequantize>(C::bf16, dequantize_plain<A, PlainBF16>, "dequantize_plain<bf16>");
    k.set<Op::prepare_query>(C::bf16, prepare_query_f32, "prepare_query_f32");
    k.set<Op::score>(C::bf16, ScorePlain<A, PlainBF16>::score, "score_plain<bf16>");
    k.set<Op::accumulate>(C::bf16, accumulate_plain<A, PlainBF16>, "accumulate_plain<bf16>");
    // ggml block codecs: int8 queries (prepare_query_q8)
    k.set<Op::quantize>(C::q8_0, quantize_q8_0<A>, "quantize_q8_0");
    k.set<Op::dequantize>(C::q8_0, dequantize_blocks<A, LayoutQ8_0>, "dequantize_blocks<q8_0>");
    k.set<Op::prepare_query>(C::q8_0, prepare_query_q8<A>, "prepare_query_q8");
    k.set<Op::score>(C::q8_0, ScoreBlocks<A, LayoutQ8_0>::score, "score_blocks<q8_0>");
    k.set<Op::accumulate>(C::q8_0, accumulate_sym_avx2<detail::BlockQ8_0, CodesQ8_0>, "accumulate_sym_avx2<q8_0>");
    k.set<Op::quantize>(C::q4_0, quantize_sym<A, 4>, "quantize_sym<4>");
    k.set<Op::dequantize>(C::q4_0, dequantize_blocks<A, LayoutQ4_0>, "dequantize_blocks<q4_0>");
    k.set<Op::prepare_query>(C::q4_0, prepare_query_q8<A>, "prepare_query_q8");
    k.set<Op::score>(C::q4_0, ScoreBlocks<A, LayoutQ4_0, Q4_0Pairs<A>>::score, "score_blocks<q4_0,Q4_0Pairs>");
    k.set<Op::accumulate>(C::q4_0, accumulate_sym_avx2<detail::BlockQ4_0, CodesQ4_0>, "accumulate_sym_avx2<q4_0>");
    k.set<Op::accumulate_grid>(C::q4_0, accumulate_grid_q4_0_avx2, "accumulate_grid_q4_0_avx2");
    k.set<Op::quantize>(C::q4_1, quantize_asym<A, 4>, "quantize_asym<4>");
    k.set<Op::dequantize>(C::q4_1, dequantize_blocks<A, LayoutQ4_1>, "dequantize_blocks<q4_1>");
    k.set<Op::prepare_query>(C::q4_1, prepare_query_q8<A>, "prepare_query_q8");
    k.set<Op::score>(C::q4_1, ScoreBlocks<A, LayoutQ4_1>::score, "score_blocks<q4_1>");
    k.set<Op::accumulate>(C::q4_1, accumulate_tiles<A, LayoutQ4_1>, "accumulate_tiles<q4_1>");
    k.set<Op::quantize>(C::q5_0, quantize_sym<A, 5>, "quantize_sym<5>");
    k.set<Op::dequantize>(C::q5_0, dequantize_blocks<A, LayoutQ5_0>, "dequantize_blocks<q5_0>");
    k.set<Op::prepare_query>(C::q5_0, prepare_query_q8<A>, "prepare_query_q8");
    k.set<Op::score>(C::q5_0, ScoreBlocks<A, LayoutQ5_0>::score, "score_blocks<q5_0>");
    k.set<Op::accumulate>(C::q5_0, accumulate_scaled<A, LayoutQ5_0>, "accumulate_scaled<q5_0>");
    k.set<Op::quantize>(C::q5_1, quantize_asym<A, 5>, "quantize_asym<5>");
    k.set<Op::dequantize>(C::q5_1, dequantize_blocks<A, LayoutQ5_1>, "dequantize_blocks<q5_1>");
    k.set<Op::prepare_query>(C::q5_1, prepare_query_q8<A>, "prepare_query_q8");
    k.set<Op::score>(C::q5_1, ScoreBlocks<A, LayoutQ5_1>::score, "score_blocks<q5_1>");
    k.set<Op::accumulate>(C::q5_1, accumulate_tiles<A, LayoutQ5_1>, "accumulate_tiles<q5_1>");
    // iq4_nl: its levels looked up in registers (load_iq4_nl), then q8_0's int8 kernels. quantize (and
    // iq4_nls's): a block per lane (quantize_iq4nl_impl.hpp), each summing its 32 products in order.
    k.set<Op::quantize>(C::iq4_nl, QuantizeIQ4NL<A, false>::quantize, "quantize_iq4_nl");
    k.set<Op::quantize>(C::iq4_nls, QuantizeIQ4NL<A, true>::quantize, "quantize_iq4_nls");
    k.set<Op::dequantize>(C::iq4_nl, dequantize_blocks<A, LayoutIQ4_NL>, "dequantize_blocks<iq4_nl>");
    k.set<Op::prepare_query>(C::iq4_nl, prepare_query_q8<A>, "prepare_query_q8");
    k.set<Op::score>(C::iq4_nl, ScoreBlocks<A, LayoutIQ4_NL>::score, "score_blocks<iq4_nl>");
    k.set<Op::accumulate>(C::iq4_nl, accumulate_sym_avx2<detail::BlockIQ4_NL, CodesIQ4_NL>, "accumulate_sym_avx2<iq4_nl>");
    // polar and turbo: the 256-bit kernels (rotated_avx2.hpp)
    k.set<R::turbo, RO::quantize>(TurboQuantize<A>::turbo, "turbo_quantize");
    k.set<R::turbo, RO::score>(avx2::turbo_score, "turbo_score_avx2");
    k.set<R::turbo, RO::accumulate>(avx2::turbo_accumulate, "turbo_accumulate_avx2");
    k.set<R::turbo_split, RO::quantize>(TurboQuantize<A>::turbo, "turbo_quantize");
    k.set<R::turbo_split, RO::score>(avx2::turbo_score, "turbo_score_avx2");
    k.set<R::turbo_split, RO::accumulate>(avx2::turbo_accumulate, "turbo_accumulate_avx2");
    k.set<R::turbo_qjl, RO::quantize>(TurboQuantize<A>::turbo, "turbo_quantize");
    k.set<R::turbo_qjl, RO::score>(avx2::turbo_score, "turbo_score_avx2");
    k.set<R::turbo_qjl, RO::accumulate>(avx2::turbo_accumulate, "turbo_accumulate_avx2");
    // tcq2, tcq3: their own kernels (rotated_tcq_avx2.hpp, quantize_tcq_avx2.hpp)
    k.set<R::tcq2, RO::quantize>(avx2::tcq_quantize<A, 2>, "tcq_quantize_avx2");
    k.set<R::tcq2, RO::score>(avx2::tcq_score<2>, "tcq_score_avx2<2>");
    k.set<R::tcq2, RO::accumulate>(avx2::tcq_accumulate<2>, "tcq_accumulate_avx2<2>");
    k.set<R::tcq3, RO::quantize>(avx2::tcq_quantize<A, 3>, "tcq_quantize_avx2");
    k.set<R::tcq3, RO::score>(avx2::tcq_score<3>, "tcq_score_avx2<3>");
    k.set<R::tcq3, RO::accumulate>(avx2::tcq_accumulate<3>, "tcq_accumulate_avx2<3>");
    k.set<R::polar, RO::quantize>(PolarQuantize<A>::polar, "polar_quantize");
    k.set<R::polar, RO::score>(avx2::polar_score, "polar_score_avx2");
    k.set<R::polar, RO::accumulate>(avx2::polar_accumulate, "polar_accumulate_avx2");
    k.set<K::tcq_viterbi>(avx2::tcq_viterbi, "tcq_viterbi_avx2");
    k.set<K::chan_score>(portable::channel_score<A>, "channel_score_portable");  // chanB key scores
    k.set<K::softmax_update>(softmax_update_lanes, "softmax_update_lanes");
    k.set<K::all_finite>(all_finite<A>, "all_finite");
    k.set<K::finite_max_abs>(finite_max_abs<A>, "finite_max_abs");
    k.set<K::check_ops>(check_ops<A>, "check_ops");
    return k;
}

}  // namespace
}  // namespace kvq::simd

namespace kvq::detail {

const LevelKernels& level_avx2() {
    static const LevelKernels kernels = simd::make();
    return kernels;
}

}  // namespace kvq::detail
