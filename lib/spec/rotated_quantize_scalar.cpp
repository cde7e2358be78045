// Scalar specification of the polar and turbo quantizers (the order of operations: rotated_quantize.hpp).
#include "rotated_quantize.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <vector>

#include "../rotation/hadamard.hpp"
#include "bit_codes.hpp"
#include "stored_norm.hpp"

namespace kvq::detail {
namespace {

constexpr int kMaxRowValues = 4096;  // head_dim bound of the stack buffers; beyond it a heap buffer

int rank_of(const float* bounds, int n_bounds, float v) {
    return static_cast<int>(std::upper_bound(bounds, bounds + n_bounds, v) - bounds);
}

// The angle of (x, y) folded into [0, π/2] before its quadrant: the Cephes atanf range reduction
// (min/max ratio, and ± π/4 above tan(π/8)) with one division.
float angle_first_quadrant(float y, float x, bool& big) {
    const float ax = std::fabs(x), ay = std::fabs(y);
    big = ay > ax;
    const float mx = big ? ay : ax, mn = big ? ax : ay;
    const bool red = mn > 0.414213562f * mx;
    const float num = red ? mn - mx : mn, den = red ? mn + mx : mx;
    float t = num / den;
    if (!(den > 0.0f)) t = 0.0f;
    const float z = t * t;
    float p = ((8.05374449538e-2f * z + -1.38776856032e-1f) * z + 1.99777106478e-1f) * z + -3.33329491539e-1f;
    p = p * z;
    p = p * t;
    p = p + t;
    if (red) p = p + 0.785398163f;
    return big ? 1.57079633f - p : p;
}

void turbo_rows(const TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride,
                float* residual) {
    const int d = l.rot.d;
    for (size_t r = 0; r < n_rows; ++r) {
        turbo_quantize_row_spec(l, x + r * d, dst + r * dst_stride, residual ? residual + r * d : nullptr);
    }
}

void polar_rows(const PolarQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) {
    for (size_t r = 0; r < n_rows; ++r) polar_quantize_row_spec(l, x + r * l.rot.d, dst + r * dst_stride);
}

}  // namespace

// p[i] + p[i + 8], then + 4, + 2, + 1: written out, as the loop `for w = 8, 4, 2, 1: p[i] += p[i + w]`.
template <class T>
static T sum16(const T* p) {
    const T a0 = p[0] + p[8], a1 = p[1] + p[9], a2 = p[2] + p[10], a3 = p[3] + p[11];
    const T a4 = p[4] + p[12], a5 = p[5] + p[13], a6 = p[6] + p[14], a7 = p[7] + p[15];
    const T b0 = a0 + a4, b1 = a1 + a5, b2 = a2 + a6, b3 = a3 + a7;
    const T c0 = b0 + b2, c1 = b1 + b3;
    return c0 + c1;
}

double sum16_double(const double* partials) { return sum16(partials); }
float sum16_float(const float* partials) { return sum16(partials); }

float turbo_inverse_norm(double norm) {
    // A row so small that 1/norm overflows float is stored as a zero row (its fp16 scale is 0 anyway);
    // multiplying by an infinite inverse would turn it into NaN.
    const double inv = norm > 0 ? 1.0 / norm : 0.0;
    return inv <= FLT_MAX ? static_cast<float>(inv) : 0.0f;
}

void turbo_store_scale(const TurboQuantizeLayout& l, double norm, float cu, float cc, uint8_t* row) {
    double scale = norm;
    if (l.scale_mode == 1) scale = cc > 0 ? norm * double(cu) / double(cc) : 0.0;
    if (l.scale_mode == 2) scale = cu > 0 ? norm / double(cu) : 0.0;
    if (!std::isfinite(norm)) scale = norm;  // NanPolicy::propagate: stored as the NaN/Inf it is
    store_half(row + l.norm_off, static_cast<float>(scale));
}

void turbo_quantize_row_spec(const TurboQuantizeLayout& l, const float* x, uint8_t* row, float* residual) {
    const int d = l.rot.d;
    float stack[kMaxRowValues];
    std::vector<float> heap(d > kMaxRowValues ? d : 0);
    float* u = d > kMaxRowValues ? heap.data() : stack;
    std::memset(row, 0, l.row_bytes);
    double sq[16] = {};
    for (int j = 0; j < d; ++j) sq[j % 16] += double(x[j]) * double(x[j]);
    const double norm = std::sqrt(sum16_double(sq));
    l.rot.rotation->apply(x, u);
    const float inv = turbo_inverse_norm(norm);
    float cu[16] = {}, cc[16] = {};  // ⟨c, u⟩ and ‖c‖²
    for (int s = 0; s < l.n_sections; ++s) {
        const TurboSection& sec = l.sections[s];
        const int n_bounds = (1 << sec.bits) - 1;
        for (int j = sec.begin; j < sec.begin + sec.count; ++j) {
            u[j] = u[j] * inv;
            const int rank = rank_of(sec.bounds, n_bounds, u[j]);
            put_code(row, sec.bit_off + size_t(j - sec.begin) * sec.bits, sec.bits, sec.code_by_rank[rank]);
            const float c = sec.value_by_rank[rank];
            cu[j % 16] = cu[j % 16] + c * u[j];
            cc[j % 16] = cc[j % 16] + c * c;
            if (residual) residual[j] = u[j] - c;
        }
    }
    turbo_store_scale(l, norm, sum16_float(cu), sum16_float(cc), row);
}

float polar_angle_q1(float y, float x) {
    bool big;
    return angle_first_quadrant(y, x, big);
}

float polar_angle(float y, float x) {
    bool big;
    float a = angle_first_quadrant(y, x, big);
    if (x < 0.0f) a = 3.14159265f - a;
    if (y < 0.0f) a = 6.28318531f - a;
    return a;
}

void polar_quantize_row_spec(const PolarQuantizeLayout& l, const float* x, uint8_t* row) {
    const int d = l.rot.d, group = 1 << l.levels, leaves = group / 2;
    float stack[kMaxRowValues];
    std::vector<float> heap(d > kMaxRowValues ? d : 0);
    float* y = d > kMaxRowValues ? heap.data() : stack;
    float radius[1 << 7];  // leaves ≤ 2^(kPolarMaxLevels − 1)
    std::memset(row, 0, l.row_bytes);
    l.rot.rotation->apply(x, y);
    auto put = [&](int level, int node, float angle) {
        const int bits = l.bits[level - 1];
        const int code = rank_of(l.bounds[level - 1], (1 << bits) - 1, angle);
        put_code(row, l.bit_off[level - 1] + size_t(node) * bits, bits, static_cast<uint32_t>(code));
    };
    for (int g = 0; g < d / group; ++g) {
        const float* v = y + g * group;
        for (int j = 0; j < leaves; ++j) {
            const float a = v[2 * j], b = v[2 * j + 1];
            put(1, g * leaves + j, polar_angle(b, a));
            radius[j] = std::sqrt(a * a + b * b);
        }
        for (int level = 2, nodes = leaves / 2; level <= l.levels; ++level, nodes /= 2) {
            for (int i = 0; i < nodes; ++i) {
                const float a = radius[2 * i], b = radius[2 * i + 1];
                put(level, g * nodes + i, polar_angle_q1(b, a));
                radius[i] = std::sqrt(a * a + b * b);
            }
        }
        store_half(row + l.radius_off + 2 * g, radius[0]);
    }
}

RotationLayout rotation_layout(const Rotation& r) {
    RotationLayout l;
    l.d = r.dim();
    l.signs = r.signs().data();
    l.n_blocks = static_cast<int>(r.blocks().size());
    for (int i = 0; i < l.n_blocks; ++i) l.blocks[i] = r.blocks()[i];
    l.rotation = &r;
    return l;
}

const RotatedQuantizeKernels& scalar_rotated_quantize() {
    static const RotatedQuantizeKernels k{turbo_rows, polar_rows};
    return k;
}

}  // namespace kvq::detail
