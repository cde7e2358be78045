#include "centering.hpp"

#include <algorithm>
#include <vector>

#include "../ref/half.hpp"

namespace kvq::detail {

void center_block(const float* k, size_t k_stride, size_t n, int d, uint16_t* mean16, float* centered) {
    for (int j = 0; j < d; ++j) {
        double sum = 0;
        for (size_t t = 0; t < n; ++t) sum += k[t * k_stride + j];
        mean16[j] = f32_to_f16(static_cast<float>(sum / static_cast<double>(n)));
    }
    subtract_mean(k, k_stride, n, d, mean16, centered);
}

void subtract_mean(const float* k, size_t k_stride, size_t n, int d, const uint16_t* mean16, float* centered) {
    for (size_t t = 0; t < n; ++t) {
        for (int j = 0; j < d; ++j) centered[t * d + j] = k[t * k_stride + j] - f16_to_f32(mean16[j]);
    }
}

CenteredKeys::CenteredKeys(std::unique_ptr<const KeyFormat> inner)
    : KeyFormat(inner->codec(), inner->block_tokens(), inner->group_rows()),
      inner_(std::move(inner)),
      means_(Codec::make("f16", head_dim())) {}

InputLimit CenteredKeys::input_limit() const {
    InputLimit limit = inner_->input_limit();
    limit.max_abs = std::min(limit.max_abs / 2, 65504.0f);
    return limit;
}

void CenteredKeys::seal(const float* k, size_t n, size_t first_token, const KeyHead& head) const {
    thread_local std::vector<float> centered;
    centered.resize(n * head_dim());
    center_block(k, head_dim(), n, head_dim(), reinterpret_cast<uint16_t*>(head.side), centered.data());
    inner_->seal(centered.data(), n, first_token, inner_head(head));
}

void CenteredKeys::read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const {
    inner_->read_rows(inner_head(head), lo, n, out);
    const auto* mean = reinterpret_cast<const uint16_t*>(head.side);
    const int d = head_dim();
    for (size_t r = 0; r < n; ++r) {
        for (int j = 0; j < d; ++j) out[r * d + j] += f16_to_f32(mean[j]);
    }
}

const float* CenteredKeys::score(const uint8_t* prep, const float* q, int g, const ConstKeyHead& head, size_t lo, size_t n,
                                 float* scores, size_t stride, float* scratch) const {
    const float* inner_offsets = inner_->score(prep, q, g, inner_head(head), lo, n, scores, stride, scratch);
    // q·mean for the g queries by the f16 codec's score kernel at this level: its prepared query is the
    // float query as it is (prepare_query_f32), so q serves as one.
    float* offsets = scratch + inner_->scratch_floats(g);
    impl_of(means_).score_rows(reinterpret_cast<const uint8_t*>(q), g, head.side, means_bytes(), 1, offsets, 1);
    if (inner_offsets) {
        for (int i = 0; i < g; ++i) offsets[i] += inner_offsets[i];
    }
    return offsets;
}

}  // namespace kvq::detail
