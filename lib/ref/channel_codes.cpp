#include "channel_codes.hpp"

#include <cstring>
#include <vector>

#include "rotated_quantize.hpp"

namespace kvq::detail {
namespace {

// A constant-size word copy per bit width: the compiler makes it one load, where a run-time size called
// memcpy per 8 codes.
template <int B>
void unpack_b(const uint8_t* row, int d, uint8_t* out) {
    constexpr uint64_t mask = (uint64_t(1) << B) - 1;
    for (int j = 0; j < d; j += 8, row += B) {
        uint64_t word = 0;
        std::memcpy(&word, row, B);  // little-endian hosts (x86-64, arm64)
        for (int i = 0; i < 8; ++i) out[j + i] = static_cast<uint8_t>((word >> (i * B)) & mask);
    }
}

}  // namespace

void unpack_channel_codes(const uint8_t* row, int d, int bits, uint8_t* out) {
    switch (bits) {
        case 2: return unpack_b<2>(row, d, out);
        case 3: return unpack_b<3>(row, d, out);
        case 4: return unpack_b<4>(row, d, out);
        case 5: return unpack_b<5>(row, d, out);
        case 6: return unpack_b<6>(row, d, out);
        case 7: return unpack_b<7>(row, d, out);
        default: std::memcpy(out, row, static_cast<size_t>(d));  // 8 bits: the codes are the bytes
    }
}

void channel_score_scalar(const float* q, int n_q, int d, int bits, const uint8_t* rows, size_t row_stride,
                          size_t n_rows, float* scores, size_t score_stride) {
    thread_local std::vector<uint8_t> codes;
    thread_local std::vector<float> values;
    if (codes.size() < static_cast<size_t>(d)) codes.resize(static_cast<size_t>(d)), values.resize(static_cast<size_t>(d));
    const int whole = d / 16 * 16;
    for (size_t r = 0; r < n_rows; ++r) {
        unpack_channel_codes(rows + r * row_stride, d, bits, codes.data());
        for (int j = 0; j < d; ++j) values[j] = static_cast<float>(codes[j]);
        for (int i = 0; i < n_q; ++i) {
            const float* qi = q + static_cast<size_t>(i) * d;
            float partial[16] = {};
            for (int j0 = 0; j0 < whole; j0 += 16) {
                for (int l = 0; l < 16; ++l) partial[l] += qi[j0 + l] * values[j0 + l];
            }
            for (int j = whole; j < d; ++j) partial[j - whole] += qi[j] * values[j];
            scores[i * score_stride + r] = sum16_float(partial);
        }
    }
}

}  // namespace kvq::detail
