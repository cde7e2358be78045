// AVX-512 (F, BW, VL) score of per-channel key codes (`chanB`), bit for bit the specification
// channel_score_scalar (lib/ref/channel_codes.hpp). Included by the avx512 level's files.
//
// Per 16 codes (2B bytes, one masked 128-bit load): a broadcast to the four 128-bit lanes, one byte
// shuffle that gives code l's two bytes to dword l, a variable shift, a mask and a conversion, where the
// specification spends a shift and a mask per code on scalar words. Per query a product and then a sum
// into its 16 partials (no fma, as the specification), the last 8 codes of a row whose d is not a
// multiple of 16 into partials 0..7 under a mask, then the specification's tree of the partials in
// registers.
#pragma once

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "../ref/channel_codes.hpp"
#include "../ref/rotated_quantize.hpp"

namespace kvq::simd {
namespace {

void channel_score_avx512(const float* q, int n_q, int d, int bits, const uint8_t* rows, size_t row_stride,
                          size_t n_rows, float* scores, size_t score_stride) {
    // Code l of a group of 16 starts at bit l·B of the group: its dword takes bytes (l·B)/8 and the next
    // (none past the register: at B = 8 one byte holds the code), shifted right by (l·B) mod 8.
    alignas(64) int8_t pick[64];
    alignas(64) int32_t shift[16];
    for (int l = 0; l < 16; ++l) {  // dword l is bytes 4l..4l+3 (128-bit lane l / 4)
        const int bit = l * bits, byte = bit / 8;
        int8_t* p = pick + 4 * l;
        p[0] = static_cast<int8_t>(byte);
        p[1] = byte + 1 < 16 ? static_cast<int8_t>(byte + 1) : static_cast<int8_t>(0x80);
        p[2] = p[3] = static_cast<int8_t>(0x80);
        shift[l] = bit % 8;
    }
    const __m512i pickv = _mm512_load_si512(pick), shiftv = _mm512_load_si512(shift);
    const __m512i maskv = _mm512_set1_epi32((1 << bits) - 1);
    const __mmask16 group_bytes = static_cast<__mmask16>((1u << (2 * bits)) - 1), tail_bytes = static_cast<__mmask16>((1u << bits) - 1);
    const int groups = d / 16;
    const bool tail = d % 16 != 0;  // d is a multiple of 8: the last 8 codes
    thread_local std::vector<float> buf;
    if (buf.size() < static_cast<size_t>(d) + 32) buf.resize(static_cast<size_t>(d) + 32);
    float* values = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(buf.data()) + 63) / 64 * 64);
    auto codes16 = [&](const uint8_t* p, __mmask16 m) {
        const __m512i x = _mm512_broadcast_i32x4(_mm_maskz_loadu_epi8(m, p));
        const __m512i c = _mm512_and_si512(_mm512_srlv_epi32(_mm512_shuffle_epi8(x, pickv), shiftv), maskv);
        return _mm512_cvtepi32_ps(c);
    };
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        for (int g = 0; g < groups; ++g) _mm512_store_ps(values + 16 * g, codes16(row + 2 * bits * g, group_bytes));
        if (tail) _mm512_store_ps(values + 16 * groups, codes16(row + 2 * bits * groups, tail_bytes));
        for (int i = 0; i < n_q; ++i) {
            const float* qi = q + static_cast<size_t>(i) * d;
            __m512 acc = _mm512_setzero_ps();
            for (int g = 0; g < groups; ++g) {
                acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_loadu_ps(qi + 16 * g), _mm512_load_ps(values + 16 * g)));
            }
            if (tail) {
                const __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(0xFF, qi + 16 * groups), _mm512_load_ps(values + 16 * groups));
                acc = _mm512_mask_add_ps(acc, 0xFF, acc, p);
            }
            // sum16_float's tree in registers: p[i] + p[i + 8], then + 4, + 2, + 1.
            const __m256 a = _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1));
            const __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            const __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
            scores[i * score_stride + r] = _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
        }
    }
}

}  // namespace
}  // namespace kvq::simd
