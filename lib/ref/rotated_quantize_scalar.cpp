// Scalar specification of the polar and turbo quantizers (the order of operations: rotated_quantize.hpp).
#include "rotated_quantize.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "../rotation/hadamard.hpp"
#include "bit_codes.hpp"
#include "stored_norm.hpp"
#include "tcq.hpp"

namespace kvq::detail {
namespace {

constexpr int kMaxRowValues = 4096;  // head_dim bound of the stack buffers; beyond it a heap buffer

int rank_of(const float* bounds, int n_bounds, float v) {
    return static_cast<int>(std::upper_bound(bounds, bounds + n_bounds, v) - bounds);
}

// #{k < n : x·tangents[k] < y}: a prefix of the ascending tangents (rotated_quantize.hpp), so a binary search.
uint32_t rank_below(const float* tangents, int n, float x, float y) {
    return static_cast<uint32_t>(std::partition_point(tangents, tangents + n, [&](float t) { return x * t < y; }) - tangents);
}

}  // namespace

void turbo_quantize_rows_spec(const TurboQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                              size_t dst_stride, float* residual) {
    const int d = l.rot.d;
    for (size_t r = 0; r < n_rows; ++r) {
        turbo_quantize_row_spec(l, x + r * d, dst + r * dst_stride, residual ? residual + r * d : nullptr);
    }
}

void polar_quantize_rows_spec(const PolarQuantizeLayout& l, const float* x, size_t n_rows, uint8_t* dst,
                              size_t dst_stride) {
    for (size_t r = 0; r < n_rows; ++r) polar_quantize_row_spec(l, x + r * l.rot.d, dst + r * dst_stride);
}

namespace {

// y = R·x into y; returns ‖x‖ (in double, 16 partial sums).
double rotate_row(const TurboQuantizeLayout& l, const float* x, float* y) {
    double sq[16] = {};
    for (int j = 0; j < l.rot.d; ++j) sq[j % 16] += double(x[j]) * double(x[j]);
    l.rot.rotation->apply(x, y);
    return std::sqrt(sum16_double(sq));
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
    const double norm = rotate_row(l, x, u);
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

void tcq_quantize_row(const TcqAlphabet& a, const TurboQuantizeLayout& l, const float* x, uint8_t* row,
                      TcqViterbi viterbi) {
    const int d = l.rot.d;
    thread_local std::vector<float> buffer;
    thread_local std::vector<uint8_t> path;
    if (buffer.size() < size_t(d) * 2) buffer.resize(size_t(d) * 2), path.resize(size_t(d) * 2);
    float* u = buffer.data();
    float* t = u + d;
    uint8_t* bit = path.data();
    uint8_t* f = bit + d;
    std::memset(row, 0, l.row_bytes);
    const double norm = rotate_row(l, x, u);
    const float inv = turbo_inverse_norm(norm), root_d = static_cast<float>(std::sqrt(double(d)));
    float cu[16] = {}, cc[16] = {};  // ⟨c, u⟩ and ‖c‖²
    if (inv != 0.0f) {
        for (int j = 0; j < d; ++j) u[j] = u[j] * inv, t[j] = u[j] * root_d;
        viterbi(a, t, d, bit, f);
        for (int j = 0; j < d; ++j) {
            put_code(row, size_t(j) * (a.bits - 1), a.bits - 1, f[j]);
            if (bit[j]) row[l.plane_off + (j >> 3)] |= static_cast<uint8_t>(1u << (j & 7));
        }
        for (int j = 0; j < d; ++j) {
            const float c = a.levels[tcq_rank(row, row + l.plane_off, a.bits, j)];
            cu[j % 16] = cu[j % 16] + c * u[j];
            cc[j % 16] = cc[j % 16] + c * c;
        }
    }
    // c is in σ units, so the norm's own scale is ‖x‖/√d.
    turbo_store_scale(l, l.scale_mode == 0 ? norm / std::sqrt(double(d)) : norm, sum16_float(cu), sum16_float(cc), row);
}

uint32_t polar_level1_code(float a, float b, int bits, const float* tangents) {
    const float ax = std::fabs(a), ay = std::fabs(b);
    const bool g = ax < ay;
    const float mx = g ? ay : ax, mn = g ? ax : ay;
    const uint32_t i = bits > 3 ? rank_below(tangents, (1 << (bits - 3)) - 1, mx, mn) : 0;
    const uint32_t x = b < 0.0f ? (1u << bits) - 1 : 0, y = a < 0.0f ? (1u << (bits - 1)) - 1 : 0;
    const uint32_t z = g && bits >= 2 ? (1u << (bits - 2)) - 1 : 0;
    return x ^ y ^ z ^ i;
}

uint32_t polar_node_code(float s1, float s2, int bits, const float* tangents) {
    return rank_below(tangents, (1 << bits) - 1, s1, s2);
}

std::vector<float> polar_tangents(int level, int bits, const float* thresholds) {
    std::vector<float> t;
    if (level == 1) {
        for (int k = 1; k < (bits >= 3 ? 1 << (bits - 3) : 0); ++k) {
            t.push_back(static_cast<float>(std::tan(k * std::numbers::pi / double(1 << (bits - 1)))));
        }
    } else {
        for (int k = 0; k < (1 << bits) - 1; ++k) {
            const double u = std::tan(double(thresholds[k]));
            t.push_back(static_cast<float>(u * u));
        }
    }
    return t;
}

void polar_quantize_row_spec(const PolarQuantizeLayout& l, const float* x, uint8_t* row) {
    const int d = l.rot.d, group = 1 << l.levels, leaves = group / 2;
    float stack[kMaxRowValues];
    std::vector<float> heap(d > kMaxRowValues ? d : 0);
    float* y = d > kMaxRowValues ? heap.data() : stack;
    float sq[1 << 7];  // squared radii; leaves ≤ 2^(kPolarMaxLevels − 1)
    std::memset(row, 0, l.row_bytes);
    l.rot.rotation->apply(x, y);
    auto put = [&](int level, int node, uint32_t code) {
        const int bits = l.bits[level - 1];
        put_code(row, l.bit_off[level - 1] + size_t(node) * bits, bits, code);
    };
    for (int g = 0; g < d / group; ++g) {
        const float* v = y + g * group;
        for (int j = 0; j < leaves; ++j) {
            const float a = v[2 * j], b = v[2 * j + 1];
            put(1, g * leaves + j, polar_level1_code(a, b, l.bits[0], l.tangents[0]));
            sq[j] = a * a + b * b;
        }
        for (int level = 2, nodes = leaves / 2; level <= l.levels; ++level, nodes /= 2) {
            for (int i = 0; i < nodes; ++i) {
                const float s1 = sq[2 * i], s2 = sq[2 * i + 1];
                put(level, g * nodes + i, polar_node_code(s1, s2, l.bits[level - 1], l.tangents[level - 1]));
                sq[i] = s1 + s2;
            }
        }
        store_half(row + l.radius_off + 2 * g, std::sqrt(sq[0]));
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

}  // namespace kvq::detail
