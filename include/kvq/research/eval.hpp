// kvq — accuracy against the FP32 reference.
//
// reference_attention computes softmax(scale · q Kᵀ) V in float32 with Eigen on the unquantized rows (in
// double for a query whose float scores overflow).
// attention_error runs the same attention on quantized rows, through the decode engine the cache uses (the
// key codec scores its codes, the value codec accumulates its codes), and compares, per query, with the
// metrics of DESIGN.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kvq/codec.hpp"

namespace kvq {

// q: n_q × d, k and v: n_rows × d (row-major floats), finite. out: n_q × d. weights (optional): n_q × n_rows.
// scale <= 0 means 1/sqrt(d); a NaN or Inf scale, or NaN/Inf in q, k or v, throws std::invalid_argument.
// A query whose float scores overflow (finite, |scale · q · k| beyond FLT_MAX) is computed in double.
void reference_attention(const float* q, int n_q, const float* k, const float* v, size_t n_rows, int d,
                         float scale, float* out, float* weights = nullptr);
// The same with values of d_v floats (v: n_rows × d_v, out: n_q × d_v), as DeepSeek's latent attention has
// (d 576, d_v 512); scale <= 0 means 1/sqrt(d).
void reference_attention(const float* q, int n_q, const float* k, const float* v, size_t n_rows, int d, int d_v,
                         float scale, float* out, float* weights = nullptr);

// Mean and worst case of one metric over the queries.
struct MetricSummary {
    double mean = 0;
    double worst = 0;  // max for errors, min for agreements and cosines
};

struct AttentionErrors {
    MetricSummary kl;           // KL(p_ref || p_quant) of the attention weights, nats
    MetricSummary score_rmse;   // RMSE of the scaled scores / standard deviation of the reference scores
    MetricSummary topk;         // |top-k(ref) ∩ top-k(quant)| / k
    MetricSummary output_l2;    // ||o_quant − o_ref|| / ||o_ref||
    MetricSummary cosine;       // cos(o_quant, o_ref)
    size_t queries = 0;
};

// The metrics for one set of per-query results (all arrays n_q × n_rows or n_q × d). A NaN or Inf in any of
// them (float scores that overflowed, NaN input) throws std::invalid_argument naming the query and array.
AttentionErrors compare_attention(const float* ref_scores, const float* ref_weights, const float* ref_out,
                                  const float* scores, const float* weights, const float* out, int n_q,
                                  size_t n_rows, int d, int top_k = 8);

// Quantizes k with key_codec and v with value_codec, runs attention on the codes and compares it
// with reference_attention on the original rows. q, k and v must be finite, and so must every scaled
// score in float (std::invalid_argument otherwise: the metrics compare float scores).
AttentionErrors attention_error(const float* q, int n_q, const float* k, const float* v, size_t n_rows,
                                const Codec& key_codec, const Codec& value_codec, float scale = 0,
                                int top_k = 8);

// Relative RMSE of a codec's round trip: ||dequantize(quantize(x)) − x|| / ||x|| over n_rows rows.
double roundtrip_relative_rmse(const Codec& codec, const float* x, size_t n_rows);

}  // namespace kvq
