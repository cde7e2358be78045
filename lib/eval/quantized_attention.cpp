#include "quantized_attention.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "spec/half.hpp"

namespace kvq::detail {

QuantizedKeys quantize_keys(const Codec& codec, const float* k, size_t n_rows, bool center, int block_tokens) {
    const size_t d = codec.head_dim();
    QuantizedKeys out;
    out.rows.resize(n_rows * codec.row_bytes());
    if (!center) {
        codec.quantize_rows(k, n_rows, out.rows.data());
        return out;
    }
    out.block_tokens = block_tokens;
    const size_t n_blocks = (n_rows + block_tokens - 1) / block_tokens;
    out.means.assign(n_blocks * d, 0.0f);
    std::vector<float> residual(size_t(block_tokens) * d);
    for (size_t b = 0; b < n_blocks; ++b) {
        const size_t first = b * block_tokens, n = std::min<size_t>(block_tokens, n_rows - first);
        float* mean = out.means.data() + b * d;
        for (size_t j = 0; j < d; ++j) {
            double s = 0;
            for (size_t r = 0; r < n; ++r) s += k[(first + r) * d + j];
            mean[j] = f16_to_f32(f32_to_f16(static_cast<float>(s / n)));  // stored as fp16 with the block
        }
        for (size_t r = 0; r < n; ++r)
            for (size_t j = 0; j < d; ++j) residual[r * d + j] = k[(first + r) * d + j] - mean[j];
        codec.quantize_rows(residual.data(), n, out.rows.data() + first * codec.row_bytes());
    }
    return out;
}

QuantizedKeys quantize_channel_keys(const float* k, size_t n_rows, int head_dim, int bits, int block_tokens) {
    const size_t d = head_dim;
    const int top = (1 << bits) - 1;
    QuantizedKeys out;
    out.channel_bits = bits;
    out.block_tokens = block_tokens;
    const size_t n_blocks = (n_rows + block_tokens - 1) / block_tokens;
    out.rows.resize(n_rows * d);
    out.mins.resize(n_blocks * d);
    out.steps.resize(n_blocks * d);
    auto f16 = [](float x) { return f16_to_f32(f32_to_f16(x)); };
    for (size_t b = 0; b < n_blocks; ++b) {
        const size_t first = b * block_tokens, n = std::min<size_t>(block_tokens, n_rows - first);
        for (size_t j = 0; j < d; ++j) {
            float lo = k[first * d + j], hi = lo;
            for (size_t r = 1; r < n; ++r) lo = std::min(lo, k[(first + r) * d + j]), hi = std::max(hi, k[(first + r) * d + j]);
            const float mn = f16(lo), step = f16((hi - lo) / static_cast<float>(top));
            if (!std::isfinite(mn) || !std::isfinite(step)) {
                throw std::invalid_argument("chan" + std::to_string(bits) + " keys: channel " + std::to_string(j) + " of block " +
                                            std::to_string(b) + " has a minimum or step beyond fp16 (keys not finite, or a range over 65504)");
            }
            out.mins[b * d + j] = mn;
            out.steps[b * d + j] = step;
            const float inv = step > 0 ? 1.0f / step : 0.0f;
            for (size_t r = 0; r < n; ++r) {
                const float c = std::round((k[(first + r) * d + j] - mn) * inv);
                out.rows[(first + r) * d + j] = static_cast<uint8_t>(std::clamp(c, 0.0f, static_cast<float>(top)));
            }
        }
    }
    return out;
}

std::vector<uint8_t> quantize_values(const Codec& codec, const float* v, size_t n_rows) {
    std::vector<uint8_t> rows(n_rows * codec.row_bytes());
    codec.quantize_rows(v, n_rows, rows.data());
    return rows;
}

void softmax_rows(float* s, int n_q, size_t n, size_t stride) {
    for (int i = 0; i < n_q; ++i) {
        float* row = s + i * stride;
        const float m = *std::max_element(row, row + n);
        double sum = 0;
        for (size_t r = 0; r < n; ++r) sum += (row[r] = std::exp(row[r] - m));
        const float inv = static_cast<float>(1.0 / sum);
        for (size_t r = 0; r < n; ++r) row[r] *= inv;
    }
}

void quantized_attention(const Codec& keys, const QuantizedKeys& k, const Codec& values, const std::vector<uint8_t>& v,
                         const float* q, int n_q, size_t first, size_t n_rows, float scale, std::vector<uint8_t>& prep,
                         float* scores, float* weights, float* out) {
    const size_t d = keys.head_dim(), n = n_rows - first;
    if (k.channel_bits) {
        // Per block: q·min once, then the codes against q scaled channel by channel by the steps.
        const size_t bt = k.block_tokens;
        std::vector<float> qs(d);
        for (int i = 0; i < n_q; ++i) {
            for (size_t start = first; start < n_rows;) {
                const size_t block = start / bt, end = std::min(n_rows, (block + 1) * bt);
                const float* mn = k.mins.data() + block * d;
                const float* st = k.steps.data() + block * d;
                float base = 0;
                for (size_t j = 0; j < d; ++j) base += q[i * d + j] * mn[j], qs[j] = q[i * d + j] * st[j];
                for (size_t r = start; r < end; ++r) {
                    const uint8_t* code = k.rows.data() + r * d;
                    float dot = 0;
                    for (size_t j = 0; j < d; ++j) dot += qs[j] * static_cast<float>(code[j]);
                    scores[i * n + (r - first)] = base + dot;
                }
                start = end;
            }
        }
    } else {
        prep.resize(size_t(n_q) * keys.query_bytes());
        keys.prepare_queries(q, n_q, prep.data());
        keys.score_rows(prep.data(), n_q, k.rows.data() + first * keys.row_bytes(), n, scores, n);
    }
    if (!k.means.empty()) {
        // The score of a centered key adds q·mean of its block back (one dot product per block).
        const size_t bt = k.block_tokens;
        for (int i = 0; i < n_q; ++i) {
            for (size_t start = first; start < n_rows;) {
                const size_t block = start / bt, end = std::min(n_rows, (block + 1) * bt);
                const float* mean = k.means.data() + block * d;
                float dot = 0;
                for (size_t j = 0; j < d; ++j) dot += q[i * d + j] * mean[j];
                for (size_t r = start; r < end; ++r) scores[i * n + (r - first)] += dot;
                start = end;
            }
        }
    }
    const size_t total = size_t(n_q) * n;
    for (size_t i = 0; i < total; ++i) weights[i] = scores[i] *= scale;
    softmax_rows(weights, n_q, n, n);
    std::fill(out, out + size_t(n_q) * d, 0.0f);
    values.accumulate_rows(weights, n, n_q, v.data() + first * values.row_bytes(), n, out);
    values.finish_accumulate(out, n_q);
}

}  // namespace kvq::detail
