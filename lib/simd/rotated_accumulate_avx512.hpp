// AVX-512 accumulate of the turbo codecs (layouts: lib/ref/rotated_kernels.hpp), included by
// rotated_avx512.hpp. 16 codes at a time, cut from one 64-bit word with vpshufb and vpsrlvd and looked up
// with one vpermps in the section's table repeated to 16 entries (so no mask is needed); G queries × up
// to four groups of 16 columns stay in registers over a chunk of rows. The QJL signs go to the 256-bit
// sign accumulator (rotated_avx2.hpp), sections not in whole groups of 16 to the 256-bit kernel. tcqB rows
// take the same tiles over their ranks decoded per chunk (rotated_tcq_avx512.hpp).
//
// Results equal the scalar specification (rotated_scalar.cpp) to float rounding: the products
// (w·‖x‖)·c[code] are the specification's, added with fma.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "rotated_avx512.hpp"

namespace kvq::simd {
namespace {

namespace avx512 {

// ---- accumulate -------------------------------------------------------------------------------------

// How 16 B-bit codes are cut from a 64-bit word held in every 8 bytes of a register: dword j = the bytes
// (B·j)/8 and the next, shifted down by (B·j) % 8. Bits above a code are left: vpermps reads only the
// low 4 bits of an index, and the tables are repeated to 16 entries.
template <int B>
struct Cut16 {
    static constexpr std::array<int8_t, 64> bytes = [] {
        std::array<int8_t, 64> b{};
        for (int j = 0; j < 16; ++j)
            for (int k = 0; k < 4; ++k) b[4 * j + k] = k < 2 ? static_cast<int8_t>(B * j / 8 + k) : int8_t(-128);
        return b;
    }();
    static constexpr std::array<int32_t, 16> shifts = [] {
        std::array<int32_t, 16> s{};
        for (int j = 0; j < 16; ++j) s[j] = B * j % 8;
        return s;
    }();
};

// A section's table of 2^B values (zero-padded to 16) repeated to 16 entries.
template <int B>
__m512 table16(const float* centroids) {
    const __m512i wrap = _mm512_and_si512(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32((1 << B) - 1));
    return _mm512_permutexvar_ps(wrap, _mm512_loadu_ps(centroids));
}

// The values of 16 B-bit codes that start on a byte. Reads 2·B bytes, for B = 3 eight: a section's codes
// are followed by the next section's or by the row's 2-byte norm.
template <int B>
__m512 values16(const uint8_t* p, __m512 table) {
    uint64_t word = 0;
    std::memcpy(&word, p, B == 3 ? 8 : 2 * B);
    const __m512i cut = _mm512_shuffle_epi8(_mm512_set1_epi64(static_cast<long long>(word)),
                                            _mm512_loadu_si512(Cut16<B>::bytes.data()));
    const __m512i codes = _mm512_srlv_epi32(cut, _mm512_loadu_si512(Cut16<B>::shifts.data()));
    return _mm512_permutexvar_ps(codes, table);
}

// acc[i][16 (g0 + k) ...] += wn[i][r]·v for NG groups of 16 channels over the rows of a chunk, v =
// values(row, group), the accumulators in registers. wn = w·‖x‖, so that each weight is one broadcast
// from memory.
template <int NG, int G, class Values>
void accumulate_tile(const Values& values, const float (*wn)[kChunk], const uint8_t* rows, size_t row_stride,
                     size_t n_rows, int g0, float* const* acc) {
    __m512 a[G][NG];
    for (int i = 0; i < G; ++i)
        for (int k = 0; k < NG; ++k) a[i][k] = _mm512_loadu_ps(acc[i] + (g0 + k) * 16);
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        __m512 v[NG];
        for (int k = 0; k < NG; ++k) v[k] = values(row, g0 + k);
        for (int i = 0; i < G; ++i) {
            const __m512 wi = _mm512_set1_ps(wn[i][r]);
            for (int k = 0; k < NG; ++k) a[i][k] = _mm512_fmadd_ps(wi, v[k], a[i][k]);
        }
    }
    for (int i = 0; i < G; ++i)
        for (int k = 0; k < NG; ++k) _mm512_storeu_ps(acc[i] + (g0 + k) * 16, a[i][k]);
}

// Groups [g_begin, g_end) of 16 channels over a chunk: tiles of up to four groups.
template <int G, class Values>
void accumulate_tiles(const Values& values, int g_begin, int g_end, const float (*wn)[kChunk], const uint8_t* rows,
                      size_t row_stride, size_t n_rows, float* const* acc) {
    for (int g0 = g_begin; g0 < g_end; g0 += 4) {
        switch (std::min(4, g_end - g0)) {
            case 4: accumulate_tile<4, G>(values, wn, rows, row_stride, n_rows, g0, acc); break;
            case 3: accumulate_tile<3, G>(values, wn, rows, row_stride, n_rows, g0, acc); break;
            case 2: accumulate_tile<2, G>(values, wn, rows, row_stride, n_rows, g0, acc); break;
            default: accumulate_tile<1, G>(values, wn, rows, row_stride, n_rows, g0, acc); break;
        }
    }
}

// One B-bit section (channels j0..j1, multiples of 16; its bytes from byte0) over a chunk.
template <int B, int G>
void accumulate_section(size_t byte0, int j0, int j1, const float* centroids, const float (*wn)[kChunk],
                        const uint8_t* rows, size_t row_stride, size_t n_rows, float* const* acc) {
    const __m512 table = table16<B>(centroids);
    const int gf = j0 / 16;
    const auto values = [&](const uint8_t* row, int g) { return values16<B>(row + byte0 + (g - gf) * 2 * B, table); };
    accumulate_tiles<G>(values, gf, j1 / 16, wn, rows, row_stride, n_rows, acc);
}

template <int G>
void accumulate_section_any(int bits, size_t byte0, int j0, int j1, const float* centroids, const float (*wn)[kChunk],
                            const uint8_t* rows, size_t row_stride, size_t n_rows, float* const* acc) {
    switch (bits) {
        case 1: return accumulate_section<1, G>(byte0, j0, j1, centroids, wn, rows, row_stride, n_rows, acc);
        case 2: return accumulate_section<2, G>(byte0, j0, j1, centroids, wn, rows, row_stride, n_rows, acc);
        case 3: return accumulate_section<3, G>(byte0, j0, j1, centroids, wn, rows, row_stride, n_rows, acc);
        default: return accumulate_section<4, G>(byte0, j0, j1, centroids, wn, rows, row_stride, n_rows, acc);
    }
}

// Sections whose channels are not in whole groups of 16 go to the 256-bit kernel; the QJL signs to its
// sign accumulator.
// Query group i0's weights of a chunk's rows [r0, r0 + rn) times the rows' norms (wn), and its accumulator
// rows (ap).
template <int G>
void chunk_weights(const float* w, size_t w_stride, int i0, size_t r0, size_t rn, const float* norms, float* acc, int d,
                   float (*wn)[kChunk], float** ap) {
    for (int i = 0; i < G; ++i) {
        const float* wi = w + (i0 + i) * w_stride + r0;
        for (size_t r = 0; r < rn; ++r) wn[i][r] = wi[r] * norms[r];
        ap[i] = acc + size_t(i0 + i) * d;
    }
}

void turbo_accumulate(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                      size_t row_stride, size_t n_rows, float* acc, float* sketch) {
    if (l.d % 16 != 0 || l.n_hi % 16 != 0) {
        return avx2::turbo_accumulate(l, w, w_stride, n_q, rows, row_stride, n_rows, acc, sketch);
    }
    const size_t lo_byte = size_t(l.n_hi) * l.bits_hi / 8;
    for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
        const size_t rn = std::min(kChunk, n_rows - r0);
        const uint8_t* chunk = rows + r0 * row_stride;
        alignas(64) float norms[kChunk];
        for (size_t r = 0; r < rn; ++r) norms[r] = avx2::half_at(chunk + r * row_stride + l.norm_off);
        avx2::for_groups(n_q, [&]<int G>(int i0) {
            alignas(64) float wn[G][kChunk];
            float* ap[G];
            chunk_weights<G>(w, w_stride, i0, r0, rn, norms, acc, l.d, wn, ap);
            accumulate_section_any<G>(l.bits_hi, 0, 0, l.n_hi, l.centroids_hi, wn, chunk, row_stride, rn, ap);
            if (l.n_hi < l.d) {
                accumulate_section_any<G>(l.bits_lo, lo_byte, l.n_hi, l.d, l.centroids_lo, wn, chunk, row_stride, rn, ap);
            }
        });
        if (l.qjl) {
            avx2::accumulate_groups(avx2::SignSource{l}, w + r0, w_stride, n_q, chunk, row_stride, rn, 0, l.d / 8, sketch, l.d);
        }
    }
}

}  // namespace avx512

}  // namespace
}  // namespace kvq::simd
