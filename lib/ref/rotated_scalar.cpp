// Scalar specification of scoring and accumulating the turbo and polar codecs on their codes (layouts in
// turbo.hpp, polar.hpp, rotated_kernels.hpp). Sums run in index order; SIMD levels must agree to float
// rounding.
#include <cstring>

#include "bit_codes.hpp"
#include "half.hpp"
#include "rotated_kernels.hpp"

namespace kvq::detail {
namespace {

float half_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
}

float turbo_centroid(const TurboLayout& l, const uint8_t* row, int j) {
    if (j < l.n_hi) return l.centroids_hi[get_code(row, size_t(j) * l.bits_hi, l.bits_hi)];
    const size_t bit = size_t(l.n_hi) * l.bits_hi + size_t(j - l.n_hi) * l.bits_lo;
    return l.centroids_lo[get_code(row, bit, l.bits_lo)];
}

float sign_at(const uint8_t* signs, int k) { return (signs[k >> 3] >> (k & 7)) & 1 ? -1.0f : 1.0f; }

uint32_t polar_code(const PolarLayout& l, const uint8_t* row, int level, int node) {
    return get_code(row, l.bit_off[level - 1] + size_t(node) * l.bits[level - 1], l.bits[level - 1]);
}

}  // namespace

// score = ‖x‖ · (Σ_j q′_j c[code_j] + ‖r‖ · Σ_k sign_k (√(π/2)/d · S·q′)_k)
void turbo_score_spec(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                 size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        const float norm = half_at(row + l.norm_off);
        for (int i = 0; i < n_q; ++i) {
            const float* p = reinterpret_cast<const float*>(prep + i * prep_bytes);
            float dot = 0;
            for (int j = 0; j < l.d; ++j) dot += p[j] * turbo_centroid(l, row, j);
            if (l.qjl) {
                float sketch = 0;
                for (int k = 0; k < l.d; ++k) sketch += p[l.d + k] * sign_at(row + l.sign_off, k);
                dot += half_at(row + l.gamma_off) * sketch;
            }
            scores[i * score_stride + r] = norm * dot;
        }
    }
}

void turbo_accumulate_spec(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                      size_t row_stride, size_t n_rows, float* acc, float* sketch) {
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        const float norm = half_at(row + l.norm_off);
        for (int i = 0; i < n_q; ++i) {
            const float wn = w[i * w_stride + r] * norm;
            float* a = acc + size_t(i) * l.d;
            for (int j = 0; j < l.d; ++j) a[j] += wn * turbo_centroid(l, row, j);
            if (l.qjl) {
                const float wg = wn * half_at(row + l.gamma_off);
                float* z = sketch + size_t(i) * l.d;
                for (int k = 0; k < l.d; ++k) z[k] += wg * sign_at(row + l.sign_off, k);
            }
        }
    }
}

// The tree, bottom-up: t = T[code] at the leaves, t = cos ψ·t_left + sin ψ·t_right above, radius·t at the
// top of each group.
void polar_score_spec(const PolarLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                 size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    const int leaves = 1 << (l.levels - 1), groups = l.d >> l.levels;
    const size_t n1 = size_t(1) << l.bits[0];
    float t[128];
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        for (int i = 0; i < n_q; ++i) {
            const float* table = reinterpret_cast<const float*>(prep + i * prep_bytes) + l.d;
            float sum = 0;
            for (int g = 0; g < groups; ++g) {
                for (int j = 0; j < leaves; ++j) {
                    const int p = g * leaves + j;
                    t[j] = table[p * n1 + polar_code(l, row, 1, p)];
                }
                for (int level = 2, nodes = leaves / 2; level <= l.levels; ++level, nodes /= 2) {
                    const float* cs = l.cossin[level - 1];
                    for (int k = 0; k < nodes; ++k) {
                        const uint32_t c = polar_code(l, row, level, g * nodes + k);
                        t[k] = cs[2 * c] * t[2 * k] + cs[2 * c + 1] * t[2 * k + 1];
                    }
                }
                sum += half_at(row + l.radius_off + 2 * g) * t[0];
            }
            scores[i * score_stride + r] = sum;
        }
    }
}

void polar_accumulate_spec(const PolarLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                      size_t row_stride, size_t n_rows, float* acc) {
    const int group = 1 << l.levels;
    float v[256];
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        for (int g = 0; g < l.d / group; ++g) {
            polar_decode_group(l, row, g, v);
            for (int i = 0; i < n_q; ++i) {
                const float wi = w[i * w_stride + r];
                float* a = acc + size_t(i) * l.d + size_t(g) * group;
                for (int j = 0; j < group; ++j) a[j] += wi * v[j];
            }
        }
    }
}

void turbo_decode_centroids(const TurboLayout& l, const uint8_t* row, float* c) {
    for (int j = 0; j < l.d; ++j) c[j] = turbo_centroid(l, row, j);
}

void turbo_decode_signs(const TurboLayout& l, const uint8_t* row, float* signs) {
    for (int k = 0; k < l.d; ++k) signs[k] = sign_at(row + l.sign_off, k);
}

// Group g of a row in the rotated basis (2^L values): the radius down the tree, a·cos ψ to the left and
// a·sin ψ to the right, then (a·cos θ, a·sin θ) for each level-1 pair.
void polar_decode_group(const PolarLayout& l, const uint8_t* row, int g, float* v) {
    const int leaves = 1 << (l.levels - 1);
    float a[128];
    a[0] = half_at(row + l.radius_off + 2 * g);
    for (int level = l.levels, nodes = 1; level >= 2; --level, nodes *= 2) {
        const float* cs = l.cossin[level - 1];
        for (int k = nodes - 1; k >= 0; --k) {  // downwards, so a[k] is read before a[2k], a[2k+1] are written
            const uint32_t c = polar_code(l, row, level, g * nodes + k);
            const float parent = a[k];
            a[2 * k] = parent * cs[2 * c];
            a[2 * k + 1] = parent * cs[2 * c + 1];
        }
    }
    for (int j = 0; j < leaves; ++j) {
        const uint32_t c = polar_code(l, row, 1, g * leaves + j);
        v[2 * j] = a[j] * l.cos1[c];
        v[2 * j + 1] = a[j] * l.sin1[c];
    }
}

void polar_decode_rotated(const PolarLayout& l, const uint8_t* row, float* y) {
    const int group = 1 << l.levels;
    for (int g = 0; g < l.d / group; ++g) polar_decode_group(l, row, g, y + size_t(g) * group);
}

}  // namespace kvq::detail
