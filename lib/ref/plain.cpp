// Scalar specification of the plain codecs f32, f16 (IEEE binary16) and bf16. Their prepared query is
// the float query itself; scores are float dot products summed in index order.
#include <cstring>

#include "half.hpp"
#include "kernels.hpp"

namespace kvq::detail {
namespace {

struct PlainF32 {
    using T = float;
    static T encode(float x) { return x; }
    static float decode(T v) { return v; }
};
struct PlainF16 {
    using T = uint16_t;
    static T encode(float x) { return f32_to_f16(x); }
    static float decode(T v) { return f16_to_f32(v); }
};
struct PlainBF16 {
    using T = uint16_t;
    static T encode(float x) { return f32_to_bf16(x); }
    static float decode(T v) { return bf16_to_f32(v); }
};

template <class P>
void quantize_plain(const float* x, uint8_t* dst, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        const typename P::T v = P::encode(x[j]);
        std::memcpy(dst + j * sizeof v, &v, sizeof v);
    }
}

template <class P>
void dequantize_plain(const uint8_t* src, float* y, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        typename P::T v;
        std::memcpy(&v, src + j * sizeof v, sizeof v);
        y[j] = P::decode(v);
    }
}

void prepare_query_f32(const float* q, uint8_t* prep, int64_t n) { std::memcpy(prep, q, n * sizeof(float)); }

template <class P>
void score_plain(const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows, size_t row_stride,
                 size_t n_rows, int64_t n, float* scores, size_t score_stride) {
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        for (int i = 0; i < n_q; ++i) {
            const uint8_t* q = prep + i * prep_bytes;  // float values at any address
            float sum = 0.0f;
            for (int64_t j = 0; j < n; ++j) {
                typename P::T v;
                float qj;
                std::memcpy(&v, row + j * sizeof v, sizeof v);
                std::memcpy(&qj, q + j * sizeof qj, sizeof qj);
                sum += qj * P::decode(v);
            }
            scores[i * score_stride + r] = sum;
        }
    }
}

template <class P>
void accumulate_plain(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                      size_t n_rows, int64_t n, float* acc) {
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        for (int i = 0; i < n_q; ++i) {
            const float wi = w[i * w_stride + r];
            float* a = acc + i * n;
            for (int64_t j = 0; j < n; ++j) {
                typename P::T v;
                std::memcpy(&v, row + j * sizeof v, sizeof v);
                a[j] += wi * P::decode(v);
            }
        }
    }
}

template <class P>
constexpr BlockKernels plain_kernels() {
    return {quantize_plain<P>, dequantize_plain<P>, prepare_query_f32, score_plain<P>, accumulate_plain<P>, nullptr};
}

}  // namespace

const BlockKernels kScalarF32 = plain_kernels<PlainF32>();
const BlockKernels kScalarF16 = plain_kernels<PlainF16>();
const BlockKernels kScalarBF16 = plain_kernels<PlainBF16>();

}  // namespace kvq::detail
