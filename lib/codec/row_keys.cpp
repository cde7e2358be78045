#include "row_keys.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../ref/key_groups.hpp"
#include "../simd/dispatch.hpp"

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

bool GroupedKeys::takes(const Codec& codec, int block_tokens) {
    // A +rot q8_0 codec's rows are q8_0's too, but only plain q8_0 keys have ever been grouped.
    return !codec.rotated() && impl_of(codec).block_codec() == BlockCodec::q8_0 &&
           active_kernels(BlockCodec::q8_0).score_groups && static_cast<size_t>(codec.head_dim()) / kQK <= kMaxGroupsBlocks &&
           block_tokens > 0 && static_cast<size_t>(block_tokens) % kGroupRows == 0;
}

GroupedKeys::GroupedKeys(Codec codec, int block_tokens)
    : KeyFormat(std::move(codec), block_tokens, kGroupRows), nb_(static_cast<size_t>(head_dim()) / kQK) {
    if (!takes(codec_, block_tokens)) {
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

// Rows [lo, lo + n) of the groups (group 0 holding rows 0..15 at head.rows): the kernel on groups, whose
// scores are its row kernel's bit for bit, or where the level in use has none (it changed since the cache
// was made) the row kernel on the rows turned back to ggml's bytes.
const float* GroupedKeys::score(const uint8_t* prep, const float*, int g, const ConstKeyHead& head, size_t lo, size_t n,
                                float* scores, size_t stride, float*) const {
    const BlockKernels& k = active_kernels(BlockCodec::q8_0);
    const size_t qb = query_bytes(), rb = row_bytes();
    const size_t g0 = lo / kGroupRows, n_groups = (lo + n + kGroupRows - 1) / kGroupRows - g0;
    const size_t skip = lo - g0 * kGroupRows;  // rows of the first group before lo
    const uint8_t* first = head.rows + g0 * group_bytes(nb_);
    int i0 = 0;
    if (k.score_groups && nb_ <= kMaxGroupsBlocks) {
        // Whole groups go straight to the scores; a part of one through this thread's buffer (grown once).
        const bool whole = skip == 0 && n % kGroupRows == 0;
        thread_local std::vector<float> part;
        if (!whole && part.size() < 4 * kGroupRows * n_groups) part.resize(4 * kGroupRows * n_groups);
        for (; i0 < g; i0 += 4) {
            const int m = std::min(4, g - i0);
            float* out[4];
            for (int i = 0; i < m; ++i) out[i] = whole ? scores + (i0 + i) * stride : part.data() + i * kGroupRows * n_groups;
            k.score_groups(prep + i0 * qb, qb, m, first, n_groups, head_dim(), out);
            if (!whole) {
                for (int i = 0; i < m; ++i) std::copy_n(out[i] + skip, n, scores + (i0 + i) * stride);
            }
        }
    }
    if (i0 < g) {
        thread_local std::vector<uint8_t> rows;
        if (rows.size() < n * rb) rows.resize(n * rb);
        for (size_t r = 0; r < n; ++r) {
            const size_t at = skip + r;
            row_from_group(first + at / kGroupRows * group_bytes(nb_), nb_, at % kGroupRows, rows.data() + r * rb);
        }
        k.score(prep + i0 * qb, qb, g - i0, rows.data(), rb, n, head_dim(), scores + i0 * stride, stride);
    }
    return nullptr;
}

}  // namespace kvq::detail
