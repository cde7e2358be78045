// Scalar specification of the TurboQuant codecs (layout and maths in turbo.hpp).
#include "turbo.hpp"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../rotation/hadamard.hpp"
#include "bit_codes.hpp"
#include "lloyd_max.hpp"
#include "qjl.hpp"
#include "stored_norm.hpp"

namespace kvq::detail {
namespace {

constexpr int kMaxQjlDim = 4096;  // the sketch keeps a dim × dim float matrix

class TurboCodec final : public CodecImpl {
public:
    TurboCodec(const TurboConfig& cfg, std::string name, int d, uint64_t seed)
        : name_(std::move(name)), d_(d), n_hi_(cfg.half_split ? d / 2 : d), rot_(d, seed),
          hi_(sphere_coordinate_codebook(cfg.bits_hi, d)), lo_(sphere_coordinate_codebook(cfg.bits_lo, d)) {
        const size_t code_bits = size_t(n_hi_) * hi_.bits + size_t(d - n_hi_) * lo_.bits;
        size_t off = bytes_for_bits(code_bits);
        if (cfg.qjl) {
            qjl_ = std::make_unique<QjlSketch>(d, seed);
            sign_off_ = off;
            off += bytes_for_bits(d);
        }
        norm_off_ = off;
        off += 2;
        if (qjl_) {
            gamma_off_ = off;
            off += 2;
        }
        row_bytes_ = off;
    }

    int head_dim() const override { return d_; }
    size_t row_bytes() const override { return row_bytes_; }
    size_t query_bytes() const override { return sizeof(float) * d_ * (qjl_ ? 2 : 1); }

    void quantize_rows(const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) const override {
        std::vector<float> u(d_), residual(d_);
        for (size_t r = 0; r < n_rows; ++r) {
            const float* xr = x + r * d_;
            uint8_t* row = dst + r * dst_stride;
            std::memset(row, 0, row_bytes_);
            const double norm = row_norm(xr, d_);
            rot_.apply(xr, u.data());
            // A row so small that 1/norm overflows float is stored as a zero row (its fp16 norm is 0
            // anyway); multiplying by an infinite inverse would turn it into NaN.
            const double inv_norm = norm > 0 ? 1.0 / norm : 0.0;
            const float inv = inv_norm <= FLT_MAX ? static_cast<float>(inv_norm) : 0.0f;
            for (int j = 0; j < d_; ++j) {
                u[j] *= inv;
                const ScalarCodebook& cb = codebook(j);
                const int code = cb.encode(u[j]);
                put_code(row, bit_offset(j), cb.bits, static_cast<uint32_t>(code));
                residual[j] = u[j] - cb.centroids[code];
            }
            store_half(row + norm_off_, static_cast<float>(norm));
            if (qjl_) {
                qjl_->sketch(residual.data(), row + sign_off_);
                store_half(row + gamma_off_, static_cast<float>(row_norm(residual.data(), d_)));
            }
        }
    }

    void dequantize_rows(const uint8_t* src, size_t src_stride, size_t n_rows, float* y) const override {
        for (size_t r = 0; r < n_rows; ++r) {
            const uint8_t* row = src + r * src_stride;
            float* yr = y + r * d_;
            const float norm = load_half(row + norm_off_);
            decode_centroids(row, yr);
            for (int j = 0; j < d_; ++j) yr[j] *= norm;
            if (qjl_) {
                std::vector<float> signs(d_);
                decode_signs(row, signs.data());
                qjl_->add_transposed(signs.data(), qjl_->scale() * norm * load_half(row + gamma_off_), yr);
            }
            rot_.apply_inverse(yr, yr);
        }
    }

    // Per query: the rotated query q′ = R·q, then (for _qjl) √(π/2)/d · S·q′.
    void prepare_queries(const float* q, int n_q, uint8_t* prep) const override {
        for (int i = 0; i < n_q; ++i) {
            float* p = reinterpret_cast<float*>(prep + i * query_bytes());
            rot_.apply(q + size_t(i) * d_, p);
            if (qjl_) {
                qjl_->project(p, p + d_);
                for (int k = 0; k < d_; ++k) p[d_ + k] *= qjl_->scale();
            }
        }
    }

    // score = ‖x‖ · (Σ_j q′_j c[code_j] + ‖r‖ · Σ_k sign_k (√(π/2)/d · S·q′)_k), sums in index order.
    void score_rows(const uint8_t* prep, int n_q, const uint8_t* rows, size_t row_stride, size_t n_rows,
                    float* scores, size_t score_stride) const override {
        std::vector<float> c(d_), signs(qjl_ ? d_ : 0);
        for (size_t r = 0; r < n_rows; ++r) {
            const uint8_t* row = rows + r * row_stride;
            decode_centroids(row, c.data());
            if (qjl_) decode_signs(row, signs.data());
            const float norm = load_half(row + norm_off_);
            const float gamma = qjl_ ? load_half(row + gamma_off_) : 0.0f;
            for (int i = 0; i < n_q; ++i) {
                const float* p = reinterpret_cast<const float*>(prep + i * query_bytes());
                float dot = 0;
                for (int j = 0; j < d_; ++j) dot += p[j] * c[j];
                if (qjl_) {
                    float sketch = 0;
                    for (int k = 0; k < d_; ++k) sketch += p[d_ + k] * signs[k];
                    dot += gamma * sketch;
                }
                scores[i * score_stride + r] = norm * dot;
            }
        }
    }

    // acc (rotated basis) += w·‖x‖·c[code]; the QJL parts are summed in sign space over the whole call and
    // mapped back with one Sᵀ product per query, so the d × d cost is paid once per call, not per row.
    void accumulate_rows(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                         size_t n_rows, float* acc) const override {
        std::vector<float> c(d_), signs(qjl_ ? d_ : 0), z(qjl_ ? size_t(n_q) * d_ : 0, 0.0f);
        for (size_t r = 0; r < n_rows; ++r) {
            const uint8_t* row = rows + r * row_stride;
            decode_centroids(row, c.data());
            if (qjl_) decode_signs(row, signs.data());
            const float norm = load_half(row + norm_off_);
            const float gamma = qjl_ ? load_half(row + gamma_off_) : 0.0f;
            for (int i = 0; i < n_q; ++i) {
                const float wn = w[i * w_stride + r] * norm;
                float* a = acc + size_t(i) * d_;
                for (int j = 0; j < d_; ++j) a[j] += wn * c[j];
                if (qjl_) {
                    const float wg = wn * gamma;
                    float* zi = z.data() + size_t(i) * d_;
                    for (int k = 0; k < d_; ++k) zi[k] += wg * signs[k];
                }
            }
        }
        if (qjl_) {
            for (int i = 0; i < n_q; ++i) qjl_->add_transposed(z.data() + size_t(i) * d_, qjl_->scale(), acc + size_t(i) * d_);
        }
    }

    void finish_accumulate(float* acc, int n_q) const override {
        for (int i = 0; i < n_q; ++i) rot_.apply_inverse(acc + size_t(i) * d_, acc + size_t(i) * d_);
    }

    // The codes are scored against the float query itself.
    void effective_query(const float* q, float* out) const override { std::copy(q, q + d_, out); }

private:
    const ScalarCodebook& codebook(int j) const { return j < n_hi_ ? hi_ : lo_; }
    size_t bit_offset(int j) const {
        return j < n_hi_ ? size_t(j) * hi_.bits : size_t(n_hi_) * hi_.bits + size_t(j - n_hi_) * lo_.bits;
    }
    void decode_centroids(const uint8_t* row, float* c) const {
        for (int j = 0; j < d_; ++j) {
            const ScalarCodebook& cb = codebook(j);
            c[j] = cb.centroids[get_code(row, bit_offset(j), cb.bits)];
        }
    }
    void decode_signs(const uint8_t* row, float* signs) const {
        for (int k = 0; k < d_; ++k) signs[k] = QjlSketch::sign_of(row + sign_off_, k);
    }

    std::string name_;
    int d_, n_hi_;
    Rotation rot_;
    const ScalarCodebook& hi_;
    const ScalarCodebook& lo_;
    std::unique_ptr<QjlSketch> qjl_;
    size_t sign_off_ = 0, norm_off_ = 0, gamma_off_ = 0, row_bytes_ = 0;
};

}  // namespace

std::unique_ptr<CodecImpl> make_turbo(const TurboConfig& config, std::string_view name, std::string_view params,
                                      int head_dim, uint64_t seed) {
    const std::string n(name);
    if (!params.empty()) {
        throw std::invalid_argument("codec '" + n + "' takes no parameters, got '" + std::string(params) + "'");
    }
    const int multiple = config.half_split ? 16 : 8;
    if (head_dim < multiple || head_dim % multiple != 0) {
        throw std::invalid_argument("codec '" + n + "' needs a head_dim that is a multiple of " + std::to_string(multiple) +
                                    ", got " + std::to_string(head_dim));
    }
    if (config.qjl && head_dim > kMaxQjlDim) {
        throw std::invalid_argument("codec '" + n + "' keeps a head_dim × head_dim QJL matrix; head_dim must be at most " +
                                    std::to_string(kMaxQjlDim) + ", got " + std::to_string(head_dim));
    }
    return std::make_unique<TurboCodec>(config, n, head_dim, seed);
}

}  // namespace kvq::detail
