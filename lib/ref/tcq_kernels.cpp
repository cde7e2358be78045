// The specification of the tcqB rows of the kernel grid (tcq2, tcq3; rotated_kernels.hpp): quantize (the
// Viterbi codes of the rotated row, rotated_quantize.hpp), score and accumulate on the codes, sums in
// index order as turbo's specification. SIMD levels must agree to float rounding (score, accumulate) and
// write the same bytes (quantize).
#include <cstring>

#include "half.hpp"
#include "rotated_quantize.hpp"
#include "tcq.hpp"

namespace kvq::detail {
namespace {

float half_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
}

// The level of rank_j (tcq.hpp), in σ units; the row's scale makes it the row's value.
template <int B>
float tcq_level(const TurboLayout& l, const uint8_t* row, int j) {
    return l.centroids_hi[tcq_rank(row, row + l.plane_off, B, j)];
}

}  // namespace

template <int B>
void tcq_quantize_rows_spec(const TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                            size_t dst_stride, float*) {
    const TcqAlphabet& a = tcq_alphabet(B);
    for (size_t r = 0; r < n_rows; ++r) tcq_quantize_row(a, l, x + r * l.rot.d, dst + r * dst_stride, tcq_viterbi);
}

// score = s · Σ_j q′_j level(rank_j)
template <int B>
void tcq_score_spec(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                    size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        const float norm = half_at(row + l.norm_off);
        for (int i = 0; i < n_q; ++i) {
            const float* p = reinterpret_cast<const float*>(prep + i * prep_bytes);
            float dot = 0;
            for (int j = 0; j < l.d; ++j) dot += p[j] * tcq_level<B>(l, row, j);
            scores[i * score_stride + r] = norm * dot;
        }
    }
}

template <int B>
void tcq_accumulate_spec(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                         size_t row_stride, size_t n_rows, float* acc, float*) {
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        const float norm = half_at(row + l.norm_off);
        for (int i = 0; i < n_q; ++i) {
            const float wn = w[i * w_stride + r] * norm;
            float* a = acc + size_t(i) * l.d;
            for (int j = 0; j < l.d; ++j) a[j] += wn * tcq_level<B>(l, row, j);
        }
    }
}

void tcq_decode_levels(const TurboLayout& l, int bits, const uint8_t* row, float* c) {
    for (int j = 0; j < l.d; ++j) c[j] = l.centroids_hi[tcq_rank(row, row + l.plane_off, bits, j)];
}

template void tcq_quantize_rows_spec<2>(const TurboQuantizeLayout&, const float*, size_t, uint8_t*, size_t, float*);
template void tcq_quantize_rows_spec<3>(const TurboQuantizeLayout&, const float*, size_t, uint8_t*, size_t, float*);
template void tcq_score_spec<2>(const TurboLayout&, const uint8_t*, size_t, int, const uint8_t*, size_t, size_t, float*, size_t);
template void tcq_score_spec<3>(const TurboLayout&, const uint8_t*, size_t, int, const uint8_t*, size_t, size_t, float*, size_t);
template void tcq_accumulate_spec<2>(const TurboLayout&, const float*, size_t, int, const uint8_t*, size_t, size_t, float*, float*);
template void tcq_accumulate_spec<3>(const TurboLayout&, const float*, size_t, int, const uint8_t*, size_t, size_t, float*, float*);

}  // namespace kvq::detail
