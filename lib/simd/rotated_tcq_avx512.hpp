// AVX-512 pieces of the tcqB kernels (format: lib/ref/tcq.hpp; the AVX2 kernels and tcq_subsets:
// rotated_tcq_avx2.hpp), included by rotated_accumulate_avx512.hpp. With mask registers the s1 and s0 bits
// need no spreading: tcq_subsets's words are the masks of the lanes to set.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "rotated_avx2.hpp"

namespace kvq::simd {
namespace {

namespace avx512 {

// The levels of group g (values 16g..16g+15) of a tcqB row, for accumulate_tiles: the f codes cut with
// vpsrlvd and moved up to 4·f, s1 and s0 or-ed in under their masks, one vpermps in centroids_hi. Index
// bits above the rank are left: vpermps reads 4 bits, and tcq2's 8 levels are repeated to 16.
template <int B>
struct TcqValues16 {
    const detail::TurboLayout& l;
    __m512 table;

    explicit TcqValues16(const detail::TurboLayout& layout)
        : l(layout),
          table(_mm512_permutexvar_ps(_mm512_and_si512(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                       _mm512_set1_epi32(B == 3 ? 15 : 7)),
                                      _mm512_loadu_ps(layout.centroids_hi))) {}

    __m512 operator()(const uint8_t* row, int g) const {
        const uint8_t* plane = row + l.plane_off + 2 * g;
        uint16_t u;
        std::memcpy(&u, plane, 2);
        const avx2::Subsets s = avx2::tcq_subsets(u, g ? plane[-1] : 0);
        uint32_t f = 0;  // the group's (B − 1)-bit codes
        std::memcpy(&f, row + (B - 1) * 2 * g, (B - 1) * 2);
        const __m512i shifts = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                                  _mm512_set1_epi32(B - 1));
        __m512i idx = _mm512_slli_epi32(_mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(f)), shifts), 2);
        idx = _mm512_mask_or_epi32(idx, static_cast<__mmask16>(s.s1), idx, _mm512_set1_epi32(2));
        idx = _mm512_mask_or_epi32(idx, static_cast<__mmask16>(s.s0), idx, _mm512_set1_epi32(1));
        return _mm512_permutexvar_ps(idx, table);
    }
};

}  // namespace avx512

}  // namespace
}  // namespace kvq::simd
