// Scalar specification of the polar codec (layout and maths in polar.hpp).
#include "polar.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include "../rotation/hadamard.hpp"
#include "bit_codes.hpp"
#include "lloyd_max.hpp"
#include "polar_params.hpp"
#include "stored_norm.hpp"

namespace kvq::detail {
namespace {

class PolarCodec final : public CodecImpl {
public:
    PolarCodec(const PolarConfig& config, int d, uint64_t seed)
        : config_(config), d_(d), levels_(config.levels), group_(1 << config.levels), leaves_(group_ / 2),
          groups_(d >> config.levels), rot_(d, seed) {
        size_t bit = 0;
        for (int l = 1; l <= levels_; ++l) {
            const ScalarCodebook& cb = polar_angle_codebook(l, config.bits[l - 1]);
            Level level{bit, cb.bits, &cb, {}, {}};
            for (float angle : cb.centroids) {
                level.cos.push_back(std::cos(angle));
                level.sin.push_back(std::sin(angle));
            }
            level_.push_back(std::move(level));
            bit += size_t(d >> l) * cb.bits;
        }
        radius_off_ = bytes_for_bits(bit);
        row_bytes_ = polar_row_bytes(config, d);
    }

    int head_dim() const override { return d_; }
    size_t row_bytes() const override { return row_bytes_; }
    size_t query_bytes() const override { return sizeof(float) * (d_ / 2) * level_[0].cos.size(); }

    void quantize_rows(const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) const override {
        std::vector<float> y(d_), radius(leaves_);
        for (size_t r = 0; r < n_rows; ++r) {
            uint8_t* row = dst + r * dst_stride;
            std::memset(row, 0, row_bytes_);
            rot_.apply(x + r * d_, y.data());
            for (int g = 0; g < groups_; ++g) {
                const float* v = y.data() + g * group_;
                for (int j = 0; j < leaves_; ++j) {
                    radius[j] = std::sqrt(v[2 * j] * v[2 * j] + v[2 * j + 1] * v[2 * j + 1]);
                    float theta = std::atan2(v[2 * j + 1], v[2 * j]);
                    if (theta < 0) theta += 2 * std::numbers::pi_v<float>;
                    put(row, 1, g * leaves_ + j, theta);
                }
                for (int l = 2, nodes = leaves_ / 2; l <= levels_; ++l, nodes /= 2) {
                    for (int i = 0; i < nodes; ++i) {
                        const float a = radius[2 * i], b = radius[2 * i + 1];
                        put(row, l, g * nodes + i, std::atan2(b, a));
                        radius[i] = std::sqrt(a * a + b * b);
                    }
                }
                store_half(row + radius_off_ + 2 * g, radius[0]);
            }
        }
    }

    void dequantize_rows(const uint8_t* src, size_t src_stride, size_t n_rows, float* y) const override {
        std::vector<float> scratch(leaves_);
        for (size_t r = 0; r < n_rows; ++r) {
            float* yr = y + r * d_;
            decode_rotated(src + r * src_stride, yr, scratch.data());
            rot_.apply_inverse(yr, yr);
        }
    }

    // Per query: the level-1 table T[p·n₁ + c] = q′₂ₚ·cos θ_c + q′₂ₚ₊₁·sin θ_c for every pair p of q′ = R·q.
    void prepare_queries(const float* q, int n_q, uint8_t* prep) const override {
        const Level& l1 = level_[0];
        const size_t n1 = l1.cos.size();
        std::vector<float> rq(d_);
        for (int i = 0; i < n_q; ++i) {
            rot_.apply(q + size_t(i) * d_, rq.data());
            float* table = reinterpret_cast<float*>(prep + i * query_bytes());
            for (int p = 0; p < d_ / 2; ++p) {
                for (size_t c = 0; c < n1; ++c) table[p * n1 + c] = rq[2 * p] * l1.cos[c] + rq[2 * p + 1] * l1.sin[c];
            }
        }
    }

    void score_rows(const uint8_t* prep, int n_q, const uint8_t* rows, size_t row_stride, size_t n_rows,
                    float* scores, size_t score_stride) const override {
        const size_t n1 = level_[0].cos.size();
        std::vector<float> t(leaves_);
        for (size_t r = 0; r < n_rows; ++r) {
            const uint8_t* row = rows + r * row_stride;
            for (int i = 0; i < n_q; ++i) {
                const float* table = reinterpret_cast<const float*>(prep + i * query_bytes());
                float sum = 0;
                for (int g = 0; g < groups_; ++g) {
                    for (int j = 0; j < leaves_; ++j) {
                        const int p = g * leaves_ + j;
                        t[j] = table[p * n1 + code(row, 1, p)];
                    }
                    for (int l = 2, nodes = leaves_ / 2; l <= levels_; ++l, nodes /= 2) {
                        const Level& lv = level_[l - 1];
                        for (int k = 0; k < nodes; ++k) {
                            const uint32_t c = code(row, l, g * nodes + k);
                            t[k] = lv.cos[c] * t[2 * k] + lv.sin[c] * t[2 * k + 1];
                        }
                    }
                    sum += load_half(row + radius_off_ + 2 * g) * t[0];
                }
                scores[i * score_stride + r] = sum;
            }
        }
    }

    void accumulate_rows(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                         size_t n_rows, float* acc) const override {
        std::vector<float> v(d_), scratch(leaves_);
        for (size_t r = 0; r < n_rows; ++r) {
            decode_rotated(rows + r * row_stride, v.data(), scratch.data());
            for (int i = 0; i < n_q; ++i) {
                const float wi = w[i * w_stride + r];
                float* a = acc + size_t(i) * d_;
                for (int j = 0; j < d_; ++j) a[j] += wi * v[j];
            }
        }
    }

    void finish_accumulate(float* acc, int n_q) const override {
        for (int i = 0; i < n_q; ++i) rot_.apply_inverse(acc + size_t(i) * d_, acc + size_t(i) * d_);
    }

    // The tables hold the float query itself.
    void effective_query(const float* q, float* out) const override { std::copy(q, q + d_, out); }

private:
    struct Level {
        size_t bit;  // where the level's codes start
        int bits;
        const ScalarCodebook* codebook;
        std::vector<float> cos, sin;  // of the codebook's centroids
    };

    uint32_t code(const uint8_t* row, int l, int node) const {
        const Level& lv = level_[l - 1];
        return get_code(row, lv.bit + size_t(node) * lv.bits, lv.bits);
    }
    void put(uint8_t* row, int l, int node, float angle) const {
        const Level& lv = level_[l - 1];
        const int c = lv.codebook->encode(angle);
        put_code(row, lv.bit + size_t(node) * lv.bits, lv.bits, static_cast<uint32_t>(c));
    }

    // The row in the rotated basis: radius down the tree, a = a·cos ψ (left) and a·sin ψ (right).
    void decode_rotated(const uint8_t* row, float* y, float* a) const {
        const Level& l1 = level_[0];
        for (int g = 0; g < groups_; ++g) {
            a[0] = load_half(row + radius_off_ + 2 * g);
            for (int l = levels_, nodes = 1; l >= 2; --l, nodes *= 2) {
                const Level& lv = level_[l - 1];
                for (int k = nodes - 1; k >= 0; --k) {
                    const uint32_t c = code(row, l, g * nodes + k);
                    const float parent = a[k];
                    a[2 * k] = parent * lv.cos[c];
                    a[2 * k + 1] = parent * lv.sin[c];
                }
            }
            float* v = y + g * group_;
            for (int j = 0; j < leaves_; ++j) {
                const uint32_t c = code(row, 1, g * leaves_ + j);
                v[2 * j] = a[j] * l1.cos[c];
                v[2 * j + 1] = a[j] * l1.sin[c];
            }
        }
    }

    PolarConfig config_;
    int d_, levels_, group_, leaves_, groups_;
    Rotation rot_;
    std::vector<Level> level_;
    size_t radius_off_ = 0, row_bytes_ = 0;
};

}  // namespace

std::unique_ptr<CodecImpl> make_polar(std::string_view params, int head_dim, uint64_t seed) {
    return std::make_unique<PolarCodec>(parse_polar_params(params, head_dim), head_dim, seed);
}

}  // namespace kvq::detail
