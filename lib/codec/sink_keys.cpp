#include "sink_keys.hpp"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "../ref/half.hpp"

namespace kvq::detail {

SinkKeys::SinkKeys(std::unique_ptr<const KeyFormat> inner, int sinks)
    : KeyFormat(inner->codec(), inner->block_tokens(), inner->group_rows()), inner_(std::move(inner)), sinks_(sinks) {}

InputLimit SinkKeys::input_limit() const {
    InputLimit limit = inner_->input_limit();
    limit.max_abs = std::min(limit.max_abs, 65504.0f);  // a bound on the norm bounds every value too
    return limit;
}

size_t SinkKeys::held(const uint8_t* side) const {
    uint32_t count;
    std::memcpy(&count, side + count_at(), sizeof(count));
    return std::min<size_t>(count, static_cast<size_t>(sinks_));  // a hostile file's count: never past the room
}

std::string SinkKeys::side_error(const ConstKeyHead& head, size_t first_token) const {
    if (std::string e = inner_->side_error(inner_head(head), first_token); !e.empty()) return e;
    uint32_t count;
    std::memcpy(&count, head.side + count_at(), sizeof(count));
    // What seal writes: blocks are sealed whole (block_tokens rows) in a cache.
    const size_t want = first_token == 0 ? std::min<size_t>(static_cast<size_t>(block_tokens()), static_cast<size_t>(sinks_)) : 0;
    if (count == want) return {};
    return "its sink count is " + std::to_string(count) + " where a block at position " + std::to_string(first_token) +
           " of '" + name() + "' holds " + std::to_string(want);
}

void SinkKeys::seal(const float* k, size_t n, size_t first_token, const KeyHead& head) const {
    const size_t d = static_cast<size_t>(head_dim());
    const uint32_t count = first_token == 0 ? static_cast<uint32_t>(std::min<size_t>(n, sinks_)) : 0;
    std::memset(head.side + count_at(), 0, side_bytes() - count_at());
    std::memcpy(head.side + count_at(), &count, sizeof(count));
    auto* rows16 = reinterpret_cast<uint16_t*>(head.side + rows_at());
    for (size_t i = 0; i < count * d; ++i) rows16[i] = f32_to_f16(k[i]);
    if (count == 0 || count == n) {
        inner_->seal(k, n, first_token, inner_head(head));
        return;
    }
    // The wrapped format's statistics without the sinks: their rows replaced by the mean of the others.
    thread_local std::vector<float> rest;
    rest.assign(k, k + n * d);
    for (size_t j = 0; j < d; ++j) {
        double sum = 0;
        for (size_t r = count; r < n; ++r) sum += k[r * d + j];
        const float mean = static_cast<float>(sum / static_cast<double>(n - count));
        for (size_t r = 0; r < count; ++r) rest[r * d + j] = mean;
    }
    inner_->seal(rest.data(), n, first_token, inner_head(head));
}

void SinkKeys::read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const {
    inner_->read_rows(inner_head(head), lo, n, out);
    const size_t d = static_cast<size_t>(head_dim()), count = held(head.side);
    const auto* rows16 = reinterpret_cast<const uint16_t*>(head.side + rows_at());
    for (size_t r = lo; r < std::min(lo + n, count); ++r) {
        for (size_t j = 0; j < d; ++j) out[(r - lo) * d + j] = f16_to_f32(rows16[r * d + j]);
    }
}

const float* SinkKeys::score(const uint8_t* prep, const float* q, int g, const ConstKeyHead& head, size_t lo, size_t n,
                             float* scores, size_t stride, float* scratch) const {
    const float* offsets = inner_->score(prep, q, g, inner_head(head), lo, n, scores, stride, scratch);
    const size_t count = held(head.side);
    if (lo >= count) return offsets;
    const size_t d = static_cast<size_t>(head_dim());
    const auto* rows16 = reinterpret_cast<const uint16_t*>(head.side + rows_at());
    // The exact score, less what the caller adds to every score of the query.
    for (size_t r = lo; r < std::min(lo + n, count); ++r) {
        for (int i = 0; i < g; ++i) {
            const float* qi = q + static_cast<size_t>(i) * d;
            float dot = 0.0f;
            for (size_t j = 0; j < d; ++j) dot += qi[j] * f16_to_f32(rows16[r * d + j]);
            scores[i * stride + (r - lo)] = offsets ? dot - offsets[i] : dot;
        }
    }
    return offsets;
}

}  // namespace kvq::detail
