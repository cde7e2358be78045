#include "rotated.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <vector>

#include "../rotation/hadamard.hpp"

namespace kvq::detail {
namespace {

constexpr size_t kChunkRows = 64;  // rows rotated per temporary buffer

class RotatedCodec final : public CodecImpl {
public:
    RotatedCodec(std::unique_ptr<CodecImpl> inner, uint64_t seed)
        : inner_(std::move(inner)), rot_(inner_->head_dim(), seed) {}

    int head_dim() const override { return inner_->head_dim(); }
    size_t row_bytes() const override { return inner_->row_bytes(); }
    size_t query_bytes() const override { return inner_->query_bytes(); }
    // A rotated coordinate is at most the row's L2 norm; the unnormalized Walsh-Hadamard sums reach
    // sqrt(head_dim) times it, which must stay below FLT_MAX too.
    InputLimit input_limit() const override {
        const float fwht_max = FLT_MAX / (2.0f * std::sqrt(static_cast<float>(head_dim())));
        return {std::min(inner_->input_limit().max_abs, fwht_max), true};
    }

    void quantize_rows(const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) const override {
        const int d = head_dim();
        std::vector<float> tmp(std::min(n_rows, kChunkRows) * d);
        for (size_t r0 = 0; r0 < n_rows; r0 += kChunkRows) {
            const size_t n = std::min(kChunkRows, n_rows - r0);
            for (size_t r = 0; r < n; ++r) rot_.apply(x + (r0 + r) * d, tmp.data() + r * d);
            inner_->quantize_rows(tmp.data(), n, dst + r0 * dst_stride, dst_stride);
        }
    }
    void dequantize_rows(const uint8_t* src, size_t src_stride, size_t n_rows, float* y) const override {
        inner_->dequantize_rows(src, src_stride, n_rows, y);
        for (size_t r = 0; r < n_rows; ++r) rot_.apply_inverse(y + r * head_dim(), y + r * head_dim());
    }
    void prepare_queries(const float* q, int n_q, uint8_t* prep) const override {
        thread_local std::vector<float> tmp;  // grown once per thread: the decode path allocates nothing
        tmp.resize(static_cast<size_t>(n_q) * head_dim());
        for (int i = 0; i < n_q; ++i) rot_.apply(q + i * head_dim(), tmp.data() + i * head_dim());
        inner_->prepare_queries(tmp.data(), n_q, prep);
    }
    void score_rows(const uint8_t* prep, int n_q, const uint8_t* rows, size_t row_stride, size_t n_rows,
                    float* scores, size_t score_stride) const override {
        inner_->score_rows(prep, n_q, rows, row_stride, n_rows, scores, score_stride);
    }
    void accumulate_rows(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                         size_t n_rows, float* acc) const override {
        inner_->accumulate_rows(w, w_stride, n_q, rows, row_stride, n_rows, acc);
    }
    void finish_accumulate(float* acc, int n_q) const override {
        inner_->finish_accumulate(acc, n_q);
        for (int i = 0; i < n_q; ++i) rot_.apply_inverse(acc + i * head_dim(), acc + i * head_dim());
    }
    BlockCodec block_codec() const override { return inner_->block_codec(); }
    void effective_query(const float* q, float* out) const override {
        std::vector<float> tmp(head_dim());
        rot_.apply(q, tmp.data());
        inner_->effective_query(tmp.data(), out);
        rot_.apply_inverse(out, out);
    }

private:
    std::unique_ptr<CodecImpl> inner_;
    Rotation rot_;
};

}  // namespace

std::unique_ptr<CodecImpl> make_rotated(std::unique_ptr<CodecImpl> inner, uint64_t seed) {
    return std::make_unique<RotatedCodec>(std::move(inner), seed);
}

}  // namespace kvq::detail
