// The sse2 level: SSE2, the x86-64 baseline (compiled with the default flags).
// The one place that chooses this level's kernels: one line per (codec, op), naming the kernel (from
// kernels_impl.hpp and the headers included here) and what `kvq info --kernels` calls it. Slots not set
// here take the scalar specification (dispatch.cpp; "spec" in the table): any a line below does not name.
#include "dispatch.hpp"
#include "ops_sse2.hpp"
#include "quantize_iq4nl_impl.hpp"
#include "kernels_impl.hpp"
#include "quantize_polar_impl.hpp"
#include "channel_portable.hpp"
#include "tcq_viterbi_portable.hpp"
#include "rotated_tcq_portable.hpp"

namespace kvq::simd {
namespace {

using detail::BlockCodec;
using detail::KernelOp;
using detail::OtherKernel;

detail::LevelKernels make() {
    using A = xsimd::sse2;
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
    k.set<Op::accumulate>(C::q8_0, accumulate_scaled<A, LayoutQ8_0>, "accumulate_scaled<q8_0>");
    k.set<Op::quantize>(C::q4_0, quantize_sym<A, 4>, "quantize_sym<4>");
    k.set<Op::dequantize>(C::q4_0, dequantize_blocks<A, LayoutQ4_0>, "dequantize_blocks<q4_0>");
    k.set<Op::prepare_query>(C::q4_0, prepare_query_q8<A>, "prepare_query_q8");
    k.set<Op::score>(C::q4_0, ScoreBlocks<A, LayoutQ4_0>::score, "score_blocks<q4_0>");
    k.set<Op::accumulate>(C::q4_0, accumulate_scaled<A, LayoutQ4_0>, "accumulate_scaled<q4_0>");
    k.set<Op::accumulate_grid>(C::q4_0, accumulate_scaled_grid<A, LayoutQ4_0>, "accumulate_scaled_grid<q4_0>");
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
    k.set<Op::accumulate>(C::iq4_nl, accumulate_scaled<A, LayoutIQ4_NL>, "accumulate_scaled<iq4_nl>");
    // turbo, polar: rows decoded to floats (pair tables; polar's tree), then batches (rotated_portable.hpp)
    k.set<R::turbo, RO::quantize>(TurboQuantize<A>::turbo, "turbo_quantize");
    k.set<R::turbo, RO::score>(portable::turbo_score<A>, "turbo_score_portable");
    k.set<R::turbo, RO::accumulate>(portable::turbo_accumulate<A>, "turbo_accumulate_portable");
    k.set<R::turbo_split, RO::quantize>(TurboQuantize<A>::turbo, "turbo_quantize");
    k.set<R::turbo_split, RO::score>(portable::turbo_score<A>, "turbo_score_portable");
    k.set<R::turbo_split, RO::accumulate>(portable::turbo_accumulate<A>, "turbo_accumulate_portable");
    k.set<R::turbo_qjl, RO::quantize>(TurboQuantize<A>::turbo, "turbo_quantize");
    k.set<R::turbo_qjl, RO::score>(portable::turbo_score<A>, "turbo_score_portable");
    k.set<R::turbo_qjl, RO::accumulate>(portable::turbo_accumulate<A>, "turbo_accumulate_portable");
    // tcq2, tcq3: turbo's portable kernels over the tcq row decoder (rotated_tcq_portable.hpp); quantize: the
    // specification's row steps with the portable Viterbi encoder (tcq_viterbi_portable.hpp)
    k.set<R::tcq2, RO::quantize>(portable::tcq_quantize<A, 2>, "tcq_quantize<tcq_viterbi_portable>");
    k.set<R::tcq2, RO::score>(portable::tcq_score<A, 2>, "tcq_score_portable<2>");
    k.set<R::tcq2, RO::accumulate>(portable::tcq_accumulate<A, 2>, "tcq_accumulate_portable<2>");
    k.set<R::tcq3, RO::quantize>(portable::tcq_quantize<A, 3>, "tcq_quantize<tcq_viterbi_portable>");
    k.set<R::tcq3, RO::score>(portable::tcq_score<A, 3>, "tcq_score_portable<3>");
    k.set<R::tcq3, RO::accumulate>(portable::tcq_accumulate<A, 3>, "tcq_accumulate_portable<3>");
    k.set<R::polar, RO::quantize>(PolarQuantize<A>::polar, "polar_quantize");
    k.set<R::polar, RO::score>(portable::polar_score<A>, "polar_score_portable");
    k.set<R::polar, RO::accumulate>(portable::polar_accumulate<A>, "polar_accumulate_portable");
    k.set<K::tcq_viterbi>(portable::tcq_viterbi<A>, "tcq_viterbi_portable");
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

const LevelKernels& level_sse2() {
    static const LevelKernels kernels = simd::make();
    return kernels;
}

}  // namespace kvq::detail
