// TurboQuant (Zandieh, Daliri, Hadian, Mirrokni, arXiv 2504.19874): rotate, quantize every coordinate of
// the unit vector with the Lloyd-Max codebook of a rotated unit vector's coordinate density, keep the norm.
//
// | codec          | row layout (d values)                                                | bits/value |
// |----------------|----------------------------------------------------------------------|------------|
// | turboB (B=2…4) | d B-bit codes; fp16 ‖x‖                                              | B + 16/d   |
// | turbo2.5 / 3.5 | d/2 codes of B+1 bits, d/2 codes of B bits; fp16 ‖x‖                 | B.5 + 16/d |
// | turboB_qjl     | d (B−1)-bit codes; d QJL sign bits of the residual; fp16 ‖x‖; fp16 ‖r‖ | B + 32/d   |
// | tcqB (B=2, 3)  | d (B−1)-bit codes; the u plane, d trellis bits; fp16 scale           | B + 16/d   |
//
// Codes are packed back to back (bit_codes.hpp), each section starting on a byte. The fractional codecs
// split the rotated channels in two halves, the first at the higher width: after the rotation no channel
// is special, so the split needs no calibration (the paper instead gives outlier channels found in the
// data the higher width). The _qjl codecs are TurboQuant-prod: the (B−1)-bit stage plus a 1-bit QJL
// sketch of the unit vector's residual r (qjl.hpp), which makes q·k̃ an unbiased estimate of q·k.
//
// A row is x̃ = ‖x‖ · Rᵀ(c[code] + √(π/2)/d · ‖r‖ · Sᵀ signs), R the seeded randomized Hadamard rotation,
// c the Lloyd-Max centroids on an int8 grid (turbo_codebook.hpp). Scores work in the rotated basis: the
// query is rotated and rounded to int8 per 32 values once (q̃, as ggml's q8_0 query; for _qjl also
// projected by S once), then each row costs one pass over its codes; the score is q̃·x̃ (effective_query).
// The codecs always rotate; "+rot" on them changes nothing.
//
// tcqB is trellis-coded quantization (TCQ, Marcellin & Fischer 1990) of the same rotated row: an 8-state
// trellis over an alphabet of 2^(B+1) levels, encoded by Viterbi, in the bitshift form of QTIP (arXiv
// 2406.11235) in which a value decodes from its own code and the three trellis bits before it, so rows
// decode in parallel (lib/ref/tcq.hpp). At B bits its squared error is 0.70× turboB's at 3 bits, 0.73× at
// 2. The levels are in units of the coordinate's σ, so its scale is about ‖x‖/√d (scale=norm stores
// exactly that; it takes no scale=unbiased, the trellis may pick a level against the coordinate's sign);
// head_dim must be a multiple of 32.
//
// The fp16 field after the codes is the row's scale s, x̃ = s · Rᵀc (+ the QJL part). Which s is stored is
// a parameter of the MSE codecs (same bits, same layout, same kernels; the _qjl codecs keep the norm):
//   scale=ls        s = ‖x‖·⟨c, u⟩/‖c‖², u = Rx/‖x‖ (the default): the least-squares fit of the codes to the
//                   row, the least error these codes allow; about (1 − D)-shrunk on average, D the
//                   codebook's error. Chosen by measurement (docs/accuracy.md): never more error than the
//                   norm on a row, 32% less attention KL on the llm data set, 0-12% less on real keys;
//   scale=norm      s = ‖x‖ (TurboQuant as published): E_R[x̃] = (1 − D)·x;
//   scale=unbiased  s = ‖x‖/⟨c, u⟩ (EDEN, arXiv 2108.08842): ⟨x̃, x⟩ = ‖x‖² for every row, so E_R[x̃] = x over
//                   a uniformly random rotation, at a little more error than ls.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "codec_impl.hpp"
#include "../ref/row_codecs.hpp"  // TurboConfig

namespace kvq::detail {

// params: empty or "scale=norm|ls|unbiased" (not for _qjl). Throws std::invalid_argument for a head size
// the configuration cannot take (d must be a multiple of 8, of 16 for the split codecs, of 32 for tcqB, at
// most 4096 with QJL) or for other params.
std::unique_ptr<CodecImpl> make_turbo(const TurboConfig& config, std::string_view name, std::string_view params,
                                      int head_dim, uint64_t seed);

}  // namespace kvq::detail
