// detail::attention_scores, the decode engine's scoring step as a measurement (the accuracy tables' KL and
// top-k): per query head, the scaled and soft-capped scores of every row of a source, in row order, from
// the same key side as the decode loop, so that their softmax weighs the values as decode_attention does.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "attention/engine.hpp"
#include "codec/centering.hpp"
#include "codec/key_formats.hpp"
#include "ref/half.hpp"
#include "test_util.hpp"

TEST_CASE("attention_scores: every query head's scores over a window of centered blocks, and their softmax is the output") {
    const int d = 64, n_kv = 2, g = 3, bt = 16, n_blocks = 4;
    const size_t first = 5, n_rows = 3 * bt + 9;  // rows 5..56: a window into the first block, a partial last
    const auto keys = kvq::Codec::make("q8_0", d), values = kvq::Codec::make("q4_0", d);
    const size_t krb = keys.row_bytes(), vrb = values.row_bytes();
    // A block: each kv head's bt key rows, then the fp16 means of every head; the values apart.
    kvq::detail::BlockLayout layout;
    layout.block_tokens = bt;
    layout.keys.head_stride = bt * krb;
    layout.keys.side_offset = n_kv * bt * krb;
    layout.keys.side_stride = d * sizeof(uint16_t);
    layout.values.head_stride = bt * vrb;
    const size_t block_bytes = layout.keys.side_offset + n_kv * d * sizeof(uint16_t);
    // The centered q8_0 key format reads that side data as its means.
    const auto format = kvq::detail::make_key_format("q8_0+center", d, bt);
    REQUIRE(format->side_bytes() == layout.keys.side_stride);
    std::vector<uint8_t> kbytes(n_blocks * block_bytes), vbytes(n_blocks * n_kv * bt * vrb);
    auto k = kvq::test::gaussian(size_t(n_blocks) * n_kv * bt * d, 1), v = kvq::test::gaussian(k.size(), 2);
    for (size_t i = 0; i < k.size(); i += 2) k[i] += 3.0f;  // a bias for centering to take off
    std::vector<float> deq_k(k.size()), deq_v(v.size()), centered(bt * d);  // [block][head][row][d]
    std::vector<float> means(size_t(n_blocks) * n_kv * d);                   // [block][head][d]
    std::vector<uint8_t*> kb, vb;
    for (int b = 0; b < n_blocks; ++b) {
        uint8_t* block = kbytes.data() + b * block_bytes;
        for (int h = 0; h < n_kv; ++h) {
            const size_t at = (size_t(b) * n_kv + h) * bt * d;
            auto* mean = reinterpret_cast<uint16_t*>(block + layout.keys.side_offset) + h * d;
            kvq::detail::center_block(k.data() + at, d, bt, d, mean, centered.data());
            keys.quantize_rows(centered.data(), bt, block + h * layout.keys.head_stride);
            keys.dequantize_rows(block + h * layout.keys.head_stride, bt, deq_k.data() + at);
            for (int j = 0; j < d; ++j) means[(size_t(b) * n_kv + h) * d + j] = kvq::detail::f16_to_f32(mean[j]);
            uint8_t* vrows = vbytes.data() + (size_t(b) * n_kv + h) * bt * vrb;
            values.quantize_rows(v.data() + at, bt, vrows);
            values.dequantize_rows(vrows, bt, deq_v.data() + at);
        }
        kb.push_back(block);
        vb.push_back(vbytes.data() + size_t(b) * n_kv * bt * vrb);
    }
    kvq::detail::RowSource src;
    src.key = format.get();
    const auto value_format = kvq::detail::make_value_format(values, bt, false);
    src.value = value_format.get();
    src.layout = layout;
    src.blocks = kb;
    src.value_blocks = vb;
    src.first_row = first;
    src.end_row = n_rows - 3 * bt;
    const auto q = kvq::test::gaussian(size_t(n_kv) * g * d, 3);
    // q8_0 scores the query as it quantizes it (int8, as ggml's q8_0 dot product); q·mean takes q as it is.
    std::vector<float> q_eff(q.size());
    for (int i = 0; i < n_kv * g; ++i) keys.effective_query(q.data() + i * d, q_eff.data() + i * d);
    const size_t n = n_rows - first;
    for (const float softcap : {0.0f, 2.0f}) {
        CAPTURE(softcap);
        const kvq::detail::AttentionShape shape{n_kv * g, n_kv, d, 0.3f, softcap};
        std::vector<float> scores(size_t(n_kv) * g * n), out(size_t(n_kv) * g * d);
        kvq::detail::attention_scores(shape, src, q.data(), scores.data());
        kvq::detail::decode_attention(shape, std::span<const kvq::detail::RowSource>(&src, 1), q.data(), out.data(), nullptr, 1);
        double score_err = 0, out_err = 0, out_norm = 0;
        for (int i = 0; i < n_kv * g; ++i) {
            const int h = i / g;
            std::vector<double> w(n);
            double top = -INFINITY, sum = 0;
            for (size_t r = 0; r < n; ++r) {
                const size_t row = first + r, at = ((row / bt * n_kv + h) * bt + row % bt) * d;
                const float* mean = means.data() + (row / bt * n_kv + h) * d;
                double dot = 0;
                for (int j = 0; j < d; ++j) dot += double(q_eff[i * d + j]) * deq_k[at + j] + double(q[i * d + j]) * mean[j];
                double s = dot * shape.scale;
                if (softcap > 0) s = softcap * std::tanh(s / softcap);
                score_err = std::max(score_err, std::fabs(s - scores[i * n + r]));
                w[r] = scores[i * n + r];
                top = std::max(top, w[r]);
            }
            for (double& x : w) sum += (x = std::exp(x - top));
            for (int j = 0; j < d; ++j) {
                double x = 0;
                for (size_t r = 0; r < n; ++r) {
                    const size_t row = first + r;
                    x += w[r] / sum * deq_v[((row / bt * n_kv + h) * bt + row % bt) * d + j];
                }
                out_err += (x - out[i * d + j]) * (x - out[i * d + j]);
                out_norm += x * x;
            }
        }
        CHECK(score_err < 1e-4);
        CHECK(std::sqrt(out_err / out_norm) < 1e-5);
    }
}
