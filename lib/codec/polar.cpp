// The polar codec (layout and maths in polar.hpp): quantize, dequantize and the prepared query, with its
// score and accumulate from the active level's rotated kernels (specification: lib/ref/rotated_scalar.cpp).
#include "polar.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>
#include <vector>

#include "../rotation/hadamard.hpp"
#include "../simd/dispatch.hpp"
#include "../ref/bit_codes.hpp"
#include "../ref/lloyd_max.hpp"
#include "../ref/polar_params.hpp"
#include "../ref/rotated_kernels.hpp"
#include "../ref/stored_norm.hpp"
#include "../ref/rotated_quantize.hpp"

namespace kvq::detail {
namespace {

class PolarCodec final : public CodecImpl {
public:
    PolarCodec(const PolarConfig& config, int d, uint64_t seed)
        : d_(d), levels_(config.levels), rot_(d, seed) {
        l_.d = d;
        l_.levels = levels_;
        size_t bit = 0;
        for (int level = 1; level <= levels_; ++level) {
            const ScalarCodebook& cb = polar_angle_codebook(level, config.bits[level - 1]);
            codebooks_.push_back(&cb);
            l_.bits[level - 1] = cb.bits;
            l_.bit_off[level - 1] = bit;
            bit += size_t(d >> level) * cb.bits;
            auto& cs = cossin_[level - 1];
            for (float angle : cb.centroids) {
                cs.push_back(std::cos(angle));
                cs.push_back(std::sin(angle));
                if (level == 1) {
                    cos1_.push_back(std::cos(angle));
                    sin1_.push_back(std::sin(angle));
                }
            }
            l_.cossin[level - 1] = cs.data();
        }
        // Zero padding to whole registers (rotated_kernels.hpp).
        cos1_.resize(std::max<size_t>(cos1_.size(), 16), 0.0f);
        sin1_.resize(std::max<size_t>(sin1_.size(), 16), 0.0f);
        for (int level = 2; level <= levels_; ++level) {
            auto& cs = cossin_[level - 1];
            cs.resize(std::max<size_t>(cs.size(), 16), 0.0f);
            l_.cossin[level - 1] = cs.data();
        }
        l_.cos1 = cos1_.data();
        l_.sin1 = sin1_.data();
        if (levels_ >= 4) build_batch_factors();
        l_.radius_off = bytes_for_bits(bit);
        row_bytes_ = polar_row_bytes(config, d);
        l_.row_bytes = row_bytes_;
        q_.rot = rotation_layout(rot_);
        q_.levels = levels_;
        for (int level = 1; level <= levels_; ++level) {
            const auto t = polar_tangents(level, l_.bits[level - 1], codebooks_[level - 1]->boundaries.data());
            tangents_[level - 1].assign(std::max<size_t>(t.size(), 32), 0.0f);
            std::copy(t.begin(), t.end(), tangents_[level - 1].begin());
            q_.tangents[level - 1] = tangents_[level - 1].data();
            q_.bits[level - 1] = l_.bits[level - 1];
            q_.bit_off[level - 1] = l_.bit_off[level - 1];
        }
        q_.radius_off = l_.radius_off;
        q_.row_bytes = row_bytes_;
    }

    int head_dim() const override { return d_; }
    size_t row_bytes() const override { return row_bytes_; }
    size_t query_bytes() const override { return sizeof(float) * (d_ + size_t(d_ / 2) * (size_t(1) << l_.bits[0])); }

    // At the active level (rotated_quantize.hpp).
    void quantize_rows(const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) const override {
        active_rotated_kernels().polar.quantize(q_, x, n_rows, dst, dst_stride);
    }

    void dequantize_rows(const uint8_t* src, size_t src_stride, size_t n_rows, float* y) const override {
        for (size_t r = 0; r < n_rows; ++r) {
            float* yr = y + r * d_;
            polar_decode_rotated(l_, src + r * src_stride, yr);
            rot_.apply_inverse(yr, yr);
        }
    }

    // Per query: q′ = R·q, each 16-value batch as its evens then its odds (for in-register decoding), then
    // the level-1 table T[p·n₁ + c] = q′₂ₚ·cos θ_c + q′₂ₚ₊₁·sin θ_c (for the scalar specification).
    void prepare_queries(const float* q, int n_q, uint8_t* prep) const override {
        const size_t n1 = size_t(1) << l_.bits[0];
        const int whole = d_ / kPolarBatch * kPolarBatch;
        thread_local std::vector<float> rq;  // grown once per thread: the decode path allocates nothing
        rq.resize(d_);
        for (int i = 0; i < n_q; ++i) {
            rot_.apply(q + size_t(i) * d_, rq.data());
            float* p = reinterpret_cast<float*>(prep + i * query_bytes());
            for (int j = 0; j < d_; ++j) {
                const int b = j / kPolarBatch, k = j % kPolarBatch;
                p[j < whole ? b * kPolarBatch + (k % 2) * (kPolarBatch / 2) + k / 2 : j] = rq[j];
            }
            float* table = p + d_;
            for (int pair = 0; pair < d_ / 2; ++pair) {
                for (size_t c = 0; c < n1; ++c) {
                    table[pair * n1 + c] = rq[2 * pair] * cos1_[c] + rq[2 * pair + 1] * sin1_[c];
                }
            }
        }
    }

    void score_rows(const uint8_t* prep, int n_q, const uint8_t* rows, size_t row_stride, size_t n_rows,
                    float* scores, size_t score_stride) const override {
        active_rotated_kernels().polar.score(l_, prep, query_bytes(), n_q, rows, row_stride, n_rows, scores,
                                             score_stride);
    }

    void accumulate_rows(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                         size_t n_rows, float* acc) const override {
        active_rotated_kernels().polar.accumulate(l_, w, w_stride, n_q, rows, row_stride, n_rows, acc);
    }

    void finish_accumulate(float* acc, int n_q) const override {
        for (int i = 0; i < n_q; ++i) rot_.apply_inverse(acc + size_t(i) * d_, acc + size_t(i) * d_);
    }

    // The tables hold the float query itself.
    void effective_query(const float* q, float* out) const override { std::copy(q, q + d_, out); }

private:
    // batch_factors (rotated_kernels.hpp): for level ℓ, a batch's 8 leaves have ancestors 0..2^(4−ℓ)−1
    // (leaf j under ancestor j >> (ℓ−1), on its side (j >> (ℓ−2)) & 1).
    void build_batch_factors() {
        for (int level = 2; level <= 4; ++level) {
            const int bits = l_.bits[level - 1], nodes = 1 << (4 - level), width = nodes * bits;
            if (width > 12) continue;  // at most 4096 entries (128 KiB)
            auto& table = batch_factors_[level - 2];
            table.resize((size_t(1) << width) * 8);
            for (size_t k = 0; k < (size_t(1) << width); ++k) {
                for (int j = 0; j < 8; ++j) {
                    const int node = j >> (level - 1), side = (j >> (level - 2)) & 1;
                    const size_t code = (k >> (node * bits)) & ((size_t(1) << bits) - 1);
                    table[k * 8 + j] = cossin_[level - 1][2 * code + side];
                }
            }
            l_.batch_factors[level - 2] = table.data();
        }
        const int w3 = 2 * l_.bits[2], w4 = l_.bits[3];
        if (w3 + w4 > 8) return;
        const float* t3 = l_.batch_factors[1];
        const float* t4 = l_.batch_factors[2];
        batch_factors34_.resize((size_t(1) << (w3 + w4)) * 8);
        for (size_t k = 0; k < (size_t(1) << (w3 + w4)); ++k) {
            const size_t k3 = k & ((size_t(1) << w3) - 1), k4 = k >> w3;
            for (int j = 0; j < 8; ++j) batch_factors34_[k * 8 + j] = t3[k3 * 8 + j] * t4[k4 * 8 + j];
        }
        l_.batch_factors34 = batch_factors34_.data();
    }

    int d_, levels_;
    Rotation rot_;
    std::vector<const ScalarCodebook*> codebooks_;
    std::vector<float> cos1_, sin1_;
    std::vector<float> cossin_[kPolarMaxLevels];
    std::vector<float> batch_factors_[3], batch_factors34_;
    PolarLayout l_;
    std::vector<float> tangents_[kPolarMaxLevels];  // each level's polar_tangents, zero-padded to 32
    PolarQuantizeLayout q_;
    size_t row_bytes_ = 0;
};

}  // namespace

std::unique_ptr<CodecImpl> make_polar(std::string_view params, int head_dim, uint64_t seed) {
    return std::make_unique<PolarCodec>(parse_polar_params(params, head_dim), head_dim, seed);
}

}  // namespace kvq::detail
