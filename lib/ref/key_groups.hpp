// q8_0 key rows in groups of 16 (the scalar specification of the layout): how the cache stores the key
// rows of its sealed blocks where the active SIMD level has a kernel for it (BlockKernels::score_groups,
// score_q8_0_groups16 in lib/simd/score_impl.hpp; docs/DESIGN.md, "Attention on quantized rows").
//
// A group holds the same bytes as 16 q8_0 rows of nb blocks (16 · nb · 34), rearranged so that one 64-byte
// register holds the same dword of 16 rows:
//   [nb × 16 fp16 scales: block t's, rows 0..15]  then per block t: [8 × 16 dwords: dword j of rows 0..15]
// with every code byte stored as k XOR 0x80 (k + 128, unsigned: what vpdpbusd multiplies). The score of a
// row is the same integer sum per block and the same float operations as in row order, so a kernel on
// groups gives its row kernel's bits. Files, exports and every other reader see ggml rows: the cache
// converts with groups_from_rows / rows_from_groups.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "blocks.hpp"

namespace kvq::detail {

inline constexpr size_t kGroupRows = 16;
inline constexpr size_t kMaxGroupsBlocks = 64;  // blocks a row (head_dim ≤ 2048) the group kernels take

// Bytes of a group of 16 rows of nb blocks.
constexpr size_t group_bytes(size_t nb) { return kGroupRows * nb * sizeof(BlockQ8_0); }

// Where row r's block t scale and dword j of its codes are within a group of nb blocks.
constexpr size_t group_scale_at(size_t t, size_t r) { return 2 * (kGroupRows * t + r); }
constexpr size_t group_dword_at(size_t nb, size_t t, size_t j, size_t r) {
    return 2 * kGroupRows * nb + 4 * (kGroupRows * (8 * t + j) + r);
}

// 16 rows (row_stride apart) into a group.
inline void group_from_rows(const uint8_t* rows, size_t row_stride, size_t nb, uint8_t* group) {
    for (size_t r = 0; r < kGroupRows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        for (size_t t = 0; t < nb; ++t) {
            const uint8_t* block = row + t * sizeof(BlockQ8_0);
            std::memcpy(group + group_scale_at(t, r), block, 2);
            for (size_t j = 0; j < 8; ++j) {
                for (size_t e = 0; e < 4; ++e) group[group_dword_at(nb, t, j, r) + e] = block[2 + 4 * j + e] ^ 0x80;
            }
        }
    }
}

// Row r of a group back in ggml's bytes.
inline void row_from_group(const uint8_t* group, size_t nb, size_t r, uint8_t* row) {
    for (size_t t = 0; t < nb; ++t) {
        uint8_t* block = row + t * sizeof(BlockQ8_0);
        std::memcpy(block, group + group_scale_at(t, r), 2);
        for (size_t j = 0; j < 8; ++j) {
            for (size_t e = 0; e < 4; ++e) block[2 + 4 * j + e] = group[group_dword_at(nb, t, j, r) + e] ^ 0x80;
        }
    }
}

// n_rows rows (a multiple of 16; row_stride apart) to and from n_rows / 16 groups, back to back. The
// two areas must not overlap.
inline void groups_from_rows(const uint8_t* rows, size_t row_stride, size_t n_rows, size_t nb, uint8_t* groups) {
    for (size_t g = 0; g < n_rows / kGroupRows; ++g) {
        group_from_rows(rows + g * kGroupRows * row_stride, row_stride, nb, groups + g * group_bytes(nb));
    }
}
inline void rows_from_groups(const uint8_t* groups, size_t n_rows, size_t nb, uint8_t* rows, size_t row_stride) {
    for (size_t r = 0; r < n_rows; ++r) {
        row_from_group(groups + r / kGroupRows * group_bytes(nb), nb, r % kGroupRows, rows + r * row_stride);
    }
}

}  // namespace kvq::detail
