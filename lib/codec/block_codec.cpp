#include "block_codec.hpp"

#include <vector>

#include "../ref/blocks.hpp"
#include "../ref/scalar_ops.hpp"
#include "../simd/dispatch.hpp"

namespace kvq::detail {
namespace {

class BlockCodecImpl final : public CodecImpl {
public:
    BlockCodecImpl(BlockCodec c, int head_dim, size_t row_bytes, size_t query_bytes)
        : codec_(c), head_dim_(head_dim), row_bytes_(row_bytes), query_bytes_(query_bytes) {}

    int head_dim() const override { return head_dim_; }
    size_t row_bytes() const override { return row_bytes_; }
    size_t query_bytes() const override { return query_bytes_; }
    InputLimit input_limit() const override { return {block_traits(codec_).max_abs, false}; }

    void quantize_rows(const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) const override {
        const auto quantize = active_kernels(codec_).quantize;
        if (dst_stride == row_bytes_) {  // rows back to back are one long row: one call, no per-row overhead
            quantize(x, dst, static_cast<int64_t>(n_rows) * head_dim_);
            return;
        }
        for (size_t r = 0; r < n_rows; ++r) quantize(x + r * head_dim_, dst + r * dst_stride, head_dim_);
    }
    void dequantize_rows(const uint8_t* src, size_t src_stride, size_t n_rows, float* y) const override {
        const auto dequantize = active_kernels(codec_).dequantize;
        if (src_stride == row_bytes_) {
            dequantize(src, y, static_cast<int64_t>(n_rows) * head_dim_);
            return;
        }
        for (size_t r = 0; r < n_rows; ++r) dequantize(src + r * src_stride, y + r * head_dim_, head_dim_);
    }
    void prepare_queries(const float* q, int n_q, uint8_t* prep) const override {
        const auto prepare = active_kernels(codec_).prepare_query;
        for (int i = 0; i < n_q; ++i) prepare(q + i * head_dim_, prep + i * query_bytes_, head_dim_);
    }
    void score_rows(const uint8_t* prep, int n_q, const uint8_t* rows, size_t row_stride, size_t n_rows,
                    float* scores, size_t score_stride) const override {
        active_kernels(codec_).score(prep, query_bytes_, n_q, rows, row_stride, n_rows, head_dim_, scores,
                                     score_stride);
    }
    void accumulate_rows(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                         size_t n_rows, float* acc) const override {
        active_kernels(codec_).accumulate(w, w_stride, n_q, rows, row_stride, n_rows, head_dim_, acc);
    }
    BlockCodec block_codec() const override { return codec_; }
    void effective_query(const float* q, float* out) const override {
        if (is_plain(codec_)) {
            for (int j = 0; j < head_dim_; ++j) out[j] = q[j];
            return;
        }
        // The quantized-key codecs score against the q8 query: its round trip is what they see.
        std::vector<uint8_t> prep(query_bytes_);
        scalar_kernels(codec_).prepare_query(q, prep.data(), head_dim_);
        for (int j = 0; j < head_dim_; ++j) {
            const auto b = load_block<BlockQ8Query>(prep.data() + (j / kQK) * sizeof(BlockQ8Query));
            out[j] = b.qs[j % kQK] * b.d;
        }
    }

private:
    BlockCodec codec_;
    int head_dim_;
    size_t row_bytes_;
    size_t query_bytes_;
};

}  // namespace

std::unique_ptr<CodecImpl> make_block_codec(BlockCodec c, int block, int bytes_per_block, int head_dim) {
    const size_t blocks = static_cast<size_t>(head_dim / block);
    const size_t query_bytes = is_plain(c) ? head_dim * sizeof(float) : blocks * sizeof(BlockQ8Query);
    return std::make_unique<BlockCodecImpl>(c, head_dim, blocks * bytes_per_block, query_bytes);
}

}  // namespace kvq::detail
