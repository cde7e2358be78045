#include "channel_keys.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../ref/bit_codes.hpp"
#include "../ref/channel_codes.hpp"
#include "../ref/half.hpp"
#include "../ref/rotated_quantize.hpp"
#include "../simd/dispatch.hpp"
#include "codec_impl.hpp"

namespace kvq::detail {
namespace {

float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

void pack_code(uint8_t* row, int j, int bits, uint32_t code) { put_code(row, static_cast<size_t>(j) * bits, bits, code); }

// The codes as a CodecImpl, for the engine: a prepared query is d floats, the query already scaled by a
// block's steps (prepare_channel_queries), and score_rows is Σ_j scaled_j·code_j, the active level's
// kernel of the specification channel_score_scalar (lib/ref/channel_codes.hpp). Rows
// hold codes only: quantize_rows packs values that are codes already (rounded, clamped), dequantize_rows
// gives the codes, accumulate_rows weights the codes; the cache and the tables never use these three on
// keys (their Codec refuses them), but every kernel stays total.
class ChannelCodes final : public CodecImpl {
public:
    ChannelCodes(int bits, int d) : bits_(bits), d_(d) {}
    int head_dim() const override { return d_; }
    size_t row_bytes() const override { return static_cast<size_t>(d_) * bits_ / 8; }
    size_t query_bytes() const override { return static_cast<size_t>(d_) * sizeof(float); }
    InputLimit input_limit() const override { return {65504.0f, false}; }  // fp16 minimums and steps

    void quantize_rows(const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) const override {
        const float top = static_cast<float>((1 << bits_) - 1);
        for (size_t r = 0; r < n_rows; ++r) {
            uint8_t* row = dst + r * dst_stride;
            std::memset(row, 0, row_bytes());
            for (int j = 0; j < d_; ++j) {
                const float c = std::round(x[r * d_ + j]);
                pack_code(row, j, bits_, c >= 0 ? static_cast<uint32_t>(std::min(c, top)) : 0u);  // NaN: 0
            }
        }
    }
    void dequantize_rows(const uint8_t* src, size_t src_stride, size_t n_rows, float* y) const override {
        std::vector<uint8_t> codes(static_cast<size_t>(d_));
        for (size_t r = 0; r < n_rows; ++r) {
            unpack_channel_codes(src + r * src_stride, d_, bits_, codes.data());
            for (int j = 0; j < d_; ++j) y[r * d_ + j] = codes[j];
        }
    }
    void prepare_queries(const float* q, int n_q, uint8_t* prep) const override {
        std::memcpy(prep, q, static_cast<size_t>(n_q) * query_bytes());
    }
    void score_rows(const uint8_t* prep, int n_q, const uint8_t* rows, size_t row_stride, size_t n_rows, float* scores,
                    size_t score_stride) const override {
        active_channel_score()(reinterpret_cast<const float*>(prep), n_q, d_, bits_, rows, row_stride, n_rows, scores,
                               score_stride);
    }
    void accumulate_rows(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride, size_t n_rows,
                         float* acc) const override {
        std::vector<uint8_t> codes(static_cast<size_t>(d_));
        for (size_t r = 0; r < n_rows; ++r) {
            unpack_channel_codes(rows + r * row_stride, d_, bits_, codes.data());
            for (int i = 0; i < n_q; ++i) {
                for (int j = 0; j < d_; ++j) acc[i * d_ + j] += w[i * w_stride + r] * static_cast<float>(codes[j]);
            }
        }
    }
    void effective_query(const float* q, float* out) const override { std::copy(q, q + d_, out); }

private:
    int bits_, d_;
};

}  // namespace

int channel_key_bits(std::string_view spec) {
    if (!spec.starts_with("chan")) return 0;
    const std::string_view b = spec.substr(4);
    if (b.size() != 1 || b[0] < '0' + kMinChannelBits || b[0] > '0' + kMaxChannelBits) {
        throw BadParams("per-channel keys are chan2 .. chan8 (bits per code; no parameters, no +rot: a rotation "
                        "mixes the channels whose ranges the per-channel steps fit), got '" + std::string(spec) + "'");
    }
    return b[0] - '0';
}

Codec make_channel_key_codec(int bits, int head_dim) {
    const std::string name = "chan" + std::to_string(bits);
    if (bits < kMinChannelBits || bits > kMaxChannelBits) throw BadParams("per-channel keys are chan2 .. chan8, got " + name);
    if (head_dim <= 0 || head_dim > 65536 || head_dim % 8 != 0) {
        throw BadHeadDim("key codec '" + name + "' needs a head_dim that is a multiple of 8 in 8..65536 (a row's " +
                         std::to_string(bits) + "-bit codes fill whole bytes), got " + std::to_string(head_dim));
    }
    Codec c;
    c.impl_ = std::make_shared<ChannelCodes>(bits, head_dim);
    c.name_ = name;
    c.info_.name = name;
    c.info_.block = 8;
    c.info_.bytes_per_block = bits;
    c.info_.layout = "per block of tokens and channel: fp16 min, fp16 step; per value: a " + std::to_string(bits) +
                     "-bit code (x = min + step * code)";
    c.info_.per_channel = true;
    c.head_dim_ = head_dim;
    return c;
}

void quantize_channel_block(const float* k, size_t k_stride, size_t n, int d, int bits, uint16_t* params, uint8_t* codes,
                            size_t code_stride) {
    const float top = static_cast<float>((1 << bits) - 1);
    std::vector<uint16_t> p(2 * static_cast<size_t>(d));
    for (int j = 0; j < d; ++j) {
        float lo = k[j], hi = lo;
        for (size_t r = 1; r < n; ++r) lo = std::min(lo, k[r * k_stride + j]), hi = std::max(hi, k[r * k_stride + j]);
        const float mn = round_f16(lo), step = round_f16((hi - lo) / top);
        if (!std::isfinite(mn) || !std::isfinite(step)) {
            throw std::invalid_argument("chan" + std::to_string(bits) + " keys: channel " + std::to_string(j) +
                                        " has a minimum or step beyond fp16 (keys not finite, or a range over 65504)");
        }
        p[j] = f32_to_f16(mn);
        p[d + j] = f32_to_f16(step);
    }
    std::copy(p.begin(), p.end(), params);
    quantize_channel_rows(k, k_stride, n, d, bits, params, codes, code_stride);
}

void quantize_channel_rows(const float* k, size_t k_stride, size_t n, int d, int bits, const uint16_t* params, uint8_t* codes,
                           size_t code_stride) {
    const float top = static_cast<float>((1 << bits) - 1);
    const size_t row_bytes = static_cast<size_t>(d) * bits / 8;
    for (size_t r = 0; r < n; ++r) std::memset(codes + r * code_stride, 0, row_bytes);
    for (int j = 0; j < d; ++j) {
        const float mn = f16_to_f32(params[j]), step = f16_to_f32(params[d + j]);
        const float inv = step > 0 ? 1.0f / step : 0.0f;
        for (size_t r = 0; r < n; ++r) {
            const float c = std::clamp(std::round((k[r * k_stride + j] - mn) * inv), 0.0f, top);
            pack_code(codes + r * code_stride, j, bits, static_cast<uint32_t>(c));
        }
    }
}

void dequantize_channel_rows(const uint8_t* codes, size_t code_stride, size_t n, int d, int bits, const uint16_t* params,
                             float* out) {
    std::vector<uint8_t> c(static_cast<size_t>(d));
    for (size_t r = 0; r < n; ++r) {
        unpack_channel_codes(codes + r * code_stride, d, bits, c.data());
        for (int j = 0; j < d; ++j) out[r * d + j] = f16_to_f32(params[j]) + f16_to_f32(params[d + j]) * static_cast<float>(c[j]);
    }
}

void prepare_channel_queries(const float* q, int n_q, int d, const uint16_t* params, float* scaled, float* offsets) {
    // The block's minimums and steps converted once (not once per query), this thread's buffer.
    thread_local std::vector<float> p;
    if (p.size() < 2 * static_cast<size_t>(d)) p.resize(2 * static_cast<size_t>(d));
    for (int j = 0; j < 2 * d; ++j) p[j] = f16_to_f32(params[j]);
    const float* mn = p.data();
    const float* step = mn + d;
    for (int i = 0; i < n_q; ++i) {
        const float* qi = q + static_cast<size_t>(i) * d;
        float* si = scaled + static_cast<size_t>(i) * d;
        for (int j = 0; j < d; ++j) si[j] = qi[j] * step[j];
    }
    // q_i·min in increasing j, four queries' sums side by side (each in its own order: the same bits as
    // one query at a time, with four dependency chains in flight instead of one).
    for (int i0 = 0; i0 < n_q; i0 += 4) {
        const int n = std::min(4, n_q - i0);
        float base[4] = {};
        for (int j = 0; j < d; ++j) {
            for (int k = 0; k < n; ++k) base[k] += q[static_cast<size_t>(i0 + k) * d + j] * mn[j];
        }
        for (int k = 0; k < n; ++k) offsets[i0 + k] = base[k];
    }
}

void ChannelKeys::seal(const float* k, size_t n, size_t, const KeyHead& head) const {
    // The keys were checked at append (finite, |x| <= 65504): the minimums and steps fit fp16.
    quantize_channel_block(k, head_dim(), n, head_dim(), bits_, reinterpret_cast<uint16_t*>(head.side), head.rows,
                           head.row_stride);
}

void ChannelKeys::read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const {
    dequantize_channel_rows(head.rows + lo * head.row_stride, head.row_stride, n, head_dim(), bits_,
                            reinterpret_cast<const uint16_t*>(head.side), out);
}

const float* ChannelKeys::score(const uint8_t*, const float* q, int g, const ConstKeyHead& head, size_t lo, size_t n,
                                float* scores, size_t stride, float* scratch) const {
    float* offsets = scratch + static_cast<size_t>(g) * head_dim();
    prepare_channel_queries(q, g, head_dim(), reinterpret_cast<const uint16_t*>(head.side), scratch, offsets);
    impl_->score_rows(reinterpret_cast<const uint8_t*>(scratch), g, head.rows + lo * head.row_stride, head.row_stride, n,
                      scores, stride);
    return offsets;
}

}  // namespace kvq::detail
