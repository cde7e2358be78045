// Score and accumulate of the turbo and polar codecs (layouts: lib/ref/rotated_kernels.hpp) for the
// levels without AVX2: sse2 and neon, written once over the level's xsimd float batches (Ops<A> for fp16).
//
// A row's values are decoded once, into floats on the stack, two at a time: a code pair's bits index a
// table of value pairs made per call from the layout's centroids (2^(2B) pairs for B-bit codes). turbo's
// kernels take the row decoder as a parameter (Slices), so another row of the grid on TurboLayout brings
// its own (tcq's: rotated_tcq_portable.hpp). Then every query runs over the decoded values with batches: a dot
// product per row (score), or register tiles of 16 columns over up to kRows rows (accumulate), as the
// AVX2 kernels do on their decoded values. Rows are decoded kSlice values at a time, so any head_dim
// takes the same stack.
//
// Results equal the scalar specification (rotated_scalar.cpp) to float rounding: the same products,
// summed in another order (score) or in the same order with fma where the level has one (accumulate).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../ref/bit_codes.hpp"
#include "../ref/rotated_kernels.hpp"
#include "ops.hpp"

namespace kvq::simd {
namespace {

namespace portable {

using detail::PolarLayout;
using detail::TurboLayout;

constexpr int kSlice = 256;  // values of a row decoded at a time (a multiple of 32)
constexpr int kRows = 16;    // rows decoded together for accumulate

// Two floats, copied as one 8-byte word.
struct Pair {
    float v[2];
};

// The pair tables of one call.
struct Tables {
    Pair hi[256], lo[256];  // index c0 | c1 << B
    bool pairs_hi = false, pairs_lo = false;  // whether the section's width has a pair table (B ≤ 4)

    static bool make_codes(Pair* t, const float* centroids, int b) {
        if (b < 1 || b > 4) return false;
        const int n = 1 << b;
        for (int c1 = 0; c1 < n; ++c1)
            for (int c0 = 0; c0 < n; ++c0) t[c0 | c1 << b] = {{centroids[c0], centroids[c1]}};
        return true;
    }

    explicit Tables(const TurboLayout& l) {
        pairs_hi = make_codes(hi, l.centroids_hi, l.bits_hi);
        if (l.n_hi < l.d) pairs_lo = make_codes(lo, l.centroids_lo, l.bits_lo);
    }
};

// Eight B-bit codes (B bytes), assembled in registers: a narrow store and a wide reload would stall store
// forwarding. The host is little-endian (x86-64, arm64).
template <int B>
uint32_t load_codes(const uint8_t* p) {
    if constexpr (B == 1) return p[0];
    if constexpr (B == 2 || B == 3) {
        uint16_t lo;
        std::memcpy(&lo, p, 2);
        return B == 2 ? lo : lo | uint32_t{p[2]} << 16;
    }
    uint32_t w;
    std::memcpy(&w, p, 4);
    return w;
}

// Values [j0, j1) of one B-bit section (channel s0 at bit 0 of `codes`; j0 − s0 a multiple of 8) into out:
// eight codes (B bytes) at a time, four pair lookups.
template <int B>
void decode_codes(const Pair* pairs, const uint8_t* codes, int s0, int j0, int j1, float* out) {
    constexpr uint32_t mask = (1u << (2 * B)) - 1;
    for (int j = j0; j < j1; j += 8) {
        const uint32_t w = load_codes<B>(codes + (j - s0) / 8 * B);
        for (int k = 0; k < 4; ++k) std::memcpy(out + (j - j0) + 2 * k, &pairs[(w >> (2 * B * k)) & mask], 8);
    }
}

void decode_codes_any(const Pair* pairs, bool have_pairs, const float* centroids, int b, const uint8_t* codes, int s0,
                      int j0, int j1, float* out) {
    if (have_pairs) {
        switch (b) {
            case 1: return decode_codes<1>(pairs, codes, s0, j0, j1, out);
            case 2: return decode_codes<2>(pairs, codes, s0, j0, j1, out);
            case 3: return decode_codes<3>(pairs, codes, s0, j0, j1, out);
            case 4: return decode_codes<4>(pairs, codes, s0, j0, j1, out);
            default: break;
        }
    }
    for (int j = j0; j < j1; ++j) out[j - j0] = centroids[detail::get_code(codes, size_t(j - s0) * b, b)];
}

// Values [j0, j1) of a row (in the rotated basis, before the row's norm) into out.
void decode_slice(const TurboLayout& l, const Tables& t, const uint8_t* row, int j0, int j1, float* out) {
    const int split = std::clamp(l.n_hi, j0, j1);
    if (j0 < split) decode_codes_any(t.hi, t.pairs_hi, l.centroids_hi, l.bits_hi, row, 0, j0, split, out);
    if (split < j1) {
        const uint8_t* lo = row + size_t(l.n_hi) * l.bits_hi / 8;
        decode_codes_any(t.lo, t.pairs_lo, l.centroids_lo, l.bits_lo, lo, l.n_hi, split, j1, out + (split - j0));
    }
}

// turbo's row decoder: values [j0, j1) of a row, by its sections' pair tables.
struct TurboSlices {
    const TurboLayout& l;
    Tables t;
    explicit TurboSlices(const TurboLayout& layout) : l(layout), t(layout) {}
    void operator()(const uint8_t* row, int j0, int j1, float* out) const { decode_slice(l, t, row, j0, j1, out); }
};

// The QJL signs [j0, j1) (multiples of 8) as ±1.
void decode_signs(const uint8_t* signs, int j0, int j1, float* out) {
    for (int j = j0; j < j1; ++j) out[j - j0] = (signs[j >> 3] >> (j & 7)) & 1 ? -1.0f : 1.0f;
}

template <class A>
float half_at(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return Ops<A>::f16_value(h);
}

// Σ_j x_j·y_j over n values: four batches at a time in four chains, then one batch, then one value.
template <class A>
float dot(const float* x, const float* y, int n) {
    using F = xsimd::batch<float, A>;
    constexpr int W = static_cast<int>(F::size);
    F a0(0.0f), a1(0.0f), a2(0.0f), a3(0.0f);
    int j = 0;
    for (; j + 4 * W <= n; j += 4 * W) {
        a0 = fmadd(F::load_unaligned(x + j), F::load_unaligned(y + j), a0);
        a1 = fmadd(F::load_unaligned(x + j + W), F::load_unaligned(y + j + W), a1);
        a2 = fmadd(F::load_unaligned(x + j + 2 * W), F::load_unaligned(y + j + 2 * W), a2);
        a3 = fmadd(F::load_unaligned(x + j + 3 * W), F::load_unaligned(y + j + 3 * W), a3);
    }
    for (; j + W <= n; j += W) a0 = fmadd(F::load_unaligned(x + j), F::load_unaligned(y + j), a0);
    float s = reduce_add((a0 + a1) + (a2 + a3));
    for (; j < n; ++j) s += x[j] * y[j];
    return s;
}

// score = ‖x‖ · (Σ_j q̃_j c_j + ‖r‖ · Σ_k sign_k p_k), q̃ and p the prepared floats.
template <class A, class Slices = TurboSlices>
void turbo_score(const TurboLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                 size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    const Slices slices(l);
    alignas(64) float c[kSlice], s[kSlice];
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        for (int i = 0; i < n_q; ++i) scores[i * score_stride + r] = 0.0f;
        for (int j0 = 0; j0 < l.d; j0 += kSlice) {
            const int j1 = std::min(l.d, j0 + kSlice), n = j1 - j0;
            slices(row, j0, j1, c);
            for (int i = 0; i < n_q; ++i) {
                scores[i * score_stride + r] += dot<A>(c, reinterpret_cast<const float*>(prep + i * prep_bytes) + j0, n);
            }
        }
        const float norm = half_at<A>(row + l.norm_off);
        if (!l.qjl) {
            for (int i = 0; i < n_q; ++i) scores[i * score_stride + r] *= norm;
            continue;
        }
        const float gamma = half_at<A>(row + l.gamma_off);
        float sk[4] = {};
        for (int i0 = 0; i0 < n_q; i0 += 4) {
            const int g = std::min(4, n_q - i0);
            for (int i = 0; i < g; ++i) sk[i] = 0.0f;
            for (int j0 = 0; j0 < l.d; j0 += kSlice) {
                const int j1 = std::min(l.d, j0 + kSlice);
                decode_signs(row + l.sign_off, j0, j1, s);
                for (int i = 0; i < g; ++i) {
                    sk[i] += dot<A>(s, reinterpret_cast<const float*>(prep + (i0 + i) * prep_bytes) + l.d + j0, j1 - j0);
                }
            }
            for (int i = 0; i < g; ++i) {
                float& out = scores[(i0 + i) * score_stride + r];
                out = norm * (out + gamma * sk[i]);
            }
        }
    }
}

// acc[j0..j0+n) += Σ_r wn[r] · x[r][0..n) over rn rows, 16 columns at a time in registers.
template <class A>
void accumulate_rows(const float* wn, const float (*x)[kSlice], int rn, int n, float* acc) {
    using F = xsimd::batch<float, A>;
    constexpr int W = static_cast<int>(F::size), T = 16 / W;
    int j = 0;
    for (; j + 16 <= n; j += 16) {
        F a[T];
        for (int k = 0; k < T; ++k) a[k] = F::load_unaligned(acc + j + k * W);
        for (int r = 0; r < rn; ++r) {
            const F w(wn[r]);
            for (int k = 0; k < T; ++k) a[k] = fmadd(w, F::load_aligned(x[r] + j + k * W), a[k]);
        }
        for (int k = 0; k < T; ++k) a[k].store_unaligned(acc + j + k * W);
    }
    for (; j + W <= n; j += W) {
        F a = F::load_unaligned(acc + j);
        for (int r = 0; r < rn; ++r) a = fmadd(F(wn[r]), F::load_aligned(x[r] + j), a);
        a.store_unaligned(acc + j);
    }
    for (; j < n; ++j) {  // a polar row's last values, fewer than a batch
        for (int r = 0; r < rn; ++r) acc[j] += wn[r] * x[r][j];
    }
}

// acc (rotated basis) += Σ_r w·‖x_r‖·c_r; QJL: sketch += Σ_r w·‖x_r‖·‖r_r‖·sign_r.
template <class A, class Slices = TurboSlices>
void turbo_accumulate(const TurboLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                      size_t row_stride, size_t n_rows, float* acc, float* sketch) {
    static_assert(kSlice % 16 == 0);
    const Slices slices(l);
    alignas(64) float x[kRows][kSlice];
    float norm[kRows], gamma[kRows], wn[kRows];
    for (size_t r0 = 0; r0 < n_rows; r0 += kRows) {
        const int rn = static_cast<int>(std::min<size_t>(kRows, n_rows - r0));
        const uint8_t* chunk = rows + r0 * row_stride;
        for (int r = 0; r < rn; ++r) {
            norm[r] = half_at<A>(chunk + r * row_stride + l.norm_off);
            gamma[r] = l.qjl ? half_at<A>(chunk + r * row_stride + l.gamma_off) : 0.0f;
        }
        for (int j0 = 0; j0 < l.d; j0 += kSlice) {
            const int j1 = std::min(l.d, j0 + kSlice), n = j1 - j0;
            for (int r = 0; r < rn; ++r) slices(chunk + r * row_stride, j0, j1, x[r]);
            for (int i = 0; i < n_q; ++i) {
                for (int r = 0; r < rn; ++r) wn[r] = w[i * w_stride + r0 + r] * norm[r];
                accumulate_rows<A>(wn, x, rn, n, acc + size_t(i) * l.d + j0);
            }
            if (!l.qjl) continue;
            for (int r = 0; r < rn; ++r) decode_signs(chunk + r * row_stride + l.sign_off, j0, j1, x[r]);
            for (int i = 0; i < n_q; ++i) {
                for (int r = 0; r < rn; ++r) wn[r] = w[i * w_stride + r0 + r] * norm[r] * gamma[r];
                accumulate_rows<A>(wn, x, rn, n, sketch + size_t(i) * l.d + j0);
            }
        }
    }
}


// ---- polar ----
// A row is decoded group by group by the specification's own decode (polar_decode_group: the radius down
// the angle tree, then each level-1 pair), kSlice values at a time; then the batches above.

// The values of the row's whole groups (the specification's extent).
int polar_extent(const PolarLayout& l) { return l.d >> l.levels << l.levels; }

// Values [j0, j1) (whole groups) of a polar row into out, in the rotated basis.
void polar_slice(const PolarLayout& l, const uint8_t* row, int j0, int j1, float* out) {
    const int group = 1 << l.levels;
    for (int j = j0; j < j1; j += group) detail::polar_decode_group(l, row, j / group, out + (j - j0));
}

// score = q′ · row: the prepared query holds each whole 16-value batch of the row as its 8 even then its
// 8 odd values, so the decoded slice is put in that order first.
template <class A>
void polar_score(const PolarLayout& l, const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows,
                 size_t row_stride, size_t n_rows, float* scores, size_t score_stride) {
    static_assert(kSlice % 256 == 0);  // whole groups (2^levels ≤ 256 values) and batches
    const int d = polar_extent(l), batches = l.d / detail::kPolarBatch;
    alignas(64) float y[kSlice], yp[kSlice];
    for (size_t r = 0; r < n_rows; ++r) {
        const uint8_t* row = rows + r * row_stride;
        for (int i = 0; i < n_q; ++i) scores[i * score_stride + r] = 0.0f;
        for (int j0 = 0; j0 < d; j0 += kSlice) {
            const int j1 = std::min(d, j0 + kSlice), n = j1 - j0;
            polar_slice(l, row, j0, j1, y);
            int j = j0;
            for (; j + detail::kPolarBatch <= j1 && j / detail::kPolarBatch < batches; j += detail::kPolarBatch) {
                for (int t = 0; t < detail::kPolarBatch / 2; ++t) {
                    yp[j - j0 + t] = y[j - j0 + 2 * t];
                    yp[j - j0 + detail::kPolarBatch / 2 + t] = y[j - j0 + 2 * t + 1];
                }
            }
            for (; j < j1; ++j) yp[j - j0] = y[j - j0];
            for (int i = 0; i < n_q; ++i) {
                scores[i * score_stride + r] += dot<A>(yp, reinterpret_cast<const float*>(prep + i * prep_bytes) + j0, n);
            }
        }
    }
}

template <class A>
void polar_accumulate(const PolarLayout& l, const float* w, size_t w_stride, int n_q, const uint8_t* rows,
                      size_t row_stride, size_t n_rows, float* acc) {
    const int d = polar_extent(l);
    alignas(64) float x[kRows][kSlice];
    float wr[kRows];
    for (size_t r0 = 0; r0 < n_rows; r0 += kRows) {
        const int rn = static_cast<int>(std::min<size_t>(kRows, n_rows - r0));
        const uint8_t* chunk = rows + r0 * row_stride;
        for (int j0 = 0; j0 < d; j0 += kSlice) {
            const int j1 = std::min(d, j0 + kSlice);
            for (int r = 0; r < rn; ++r) polar_slice(l, chunk + r * row_stride, j0, j1, x[r]);
            for (int i = 0; i < n_q; ++i) {
                for (int r = 0; r < rn; ++r) wr[r] = w[i * w_stride + r0 + r];
                accumulate_rows<A>(wr, x, rn, j1 - j0, acc + size_t(i) * l.d + j0);
            }
        }
    }
}

}  // namespace portable

}  // namespace
}  // namespace kvq::simd
