#include "row_keys.hpp"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../ref/key_groups.hpp"

namespace kvq::detail {

void RowKeys::seal(const float* k, size_t n, size_t, const KeyHead& head) const {
    impl_->quantize_rows(k, n, head.rows, head.row_stride);
}

void RowKeys::write_rows(const float* k, size_t row, size_t n, const KeyHead& head) const {
    impl_->quantize_rows(k, n, head.rows + row * head.row_stride, head.row_stride);
}

void RowKeys::read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const {
    impl_->dequantize_rows(head.rows + lo * head.row_stride, head.row_stride, n, out);
}

const float* RowKeys::score(const uint8_t* prep, const float*, int g, const ConstKeyHead& head, size_t lo, size_t n,
                            float* scores, size_t stride, float*) const {
    impl_->score_rows(prep, g, head.rows + lo * head.row_stride, head.row_stride, n, scores, stride);
    return nullptr;
}

GroupedKeys::GroupedKeys(Codec codec, int block_tokens)
    : KeyFormat(std::move(codec), block_tokens, kGroupRows), nb_(static_cast<size_t>(head_dim()) / kQK) {
    if (!impl_->can_score_groups() || block_tokens <= 0 || static_cast<size_t>(block_tokens) % kGroupRows != 0) {
        throw std::logic_error("key format '" + name() + "': no grouped layout for it (keys_in_groups)");
    }
}

namespace {
// A head's rows in ggml's bytes, for the conversions (one per thread, grown once).
std::vector<uint8_t>& ggml_rows(size_t bytes) {
    thread_local std::vector<uint8_t> rows;
    rows.resize(bytes);
    return rows;
}
}  // namespace

void GroupedKeys::seal(const float* k, size_t n, size_t, const KeyHead& head) const {
    std::vector<uint8_t>& rows = ggml_rows(rows_bytes());
    std::memset(rows.data(), 0, rows.size());  // rows a partial block does not have: zero codes and scales
    impl_->quantize_rows(k, n, rows.data(), row_bytes());
    groups_from_rows(rows.data(), row_bytes(), block_tokens_, nb_, head.rows);
}

void GroupedKeys::write_rows(const float* k, size_t row, size_t n, const KeyHead& head) const {
    std::vector<uint8_t>& rows = ggml_rows(rows_bytes());
    rows_from_groups(head.rows, block_tokens_, nb_, rows.data(), row_bytes());
    impl_->quantize_rows(k, n, rows.data() + row * row_bytes(), row_bytes());
    groups_from_rows(rows.data(), row_bytes(), block_tokens_, nb_, head.rows);
}

void GroupedKeys::read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const {
    thread_local std::vector<uint8_t> row;  // the read-back is called row by row (the double fallback)
    row.resize(row_bytes());
    for (size_t r = lo; r < lo + n; ++r) {
        row_from_group(head.rows + r / kGroupRows * group_bytes(nb_), nb_, r % kGroupRows, row.data());
        impl_->dequantize_rows(row.data(), row_bytes(), 1, out + (r - lo) * head_dim());
    }
}

void GroupedKeys::convert_rows(uint8_t* rows, bool to_file) const {
    std::vector<uint8_t>& copy = ggml_rows(rows_bytes());  // the head's key area as it was
    std::memcpy(copy.data(), rows, copy.size());
    if (to_file) {
        rows_from_groups(copy.data(), block_tokens_, nb_, rows, row_bytes());
    } else {
        groups_from_rows(copy.data(), row_bytes(), block_tokens_, nb_, rows);
    }
}

const float* GroupedKeys::score(const uint8_t* prep, const float*, int g, const ConstKeyHead& head, size_t lo, size_t n,
                                float* scores, size_t stride, float*) const {
    impl_->score_groups(prep, g, head.rows, lo, n, scores, stride);
    return nullptr;
}

}  // namespace kvq::detail
