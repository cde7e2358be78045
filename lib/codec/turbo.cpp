// Scalar specification of the TurboQuant codecs (layout and maths in turbo.hpp).
#include "turbo.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../rotation/hadamard.hpp"
#include "../simd/dispatch.hpp"
#include "bit_codes.hpp"
#include "lloyd_max.hpp"
#include "qjl.hpp"
#include "rotated_kernels.hpp"
#include "stored_norm.hpp"

namespace kvq::detail {
namespace {

constexpr int kMaxQjlDim = 4096;  // the sketch keeps a dim × dim float matrix

class TurboCodec final : public CodecImpl {
public:
    TurboCodec(const TurboConfig& cfg, std::string name, int d, uint64_t seed)
        : name_(std::move(name)), rot_(d, seed), hi_(sphere_coordinate_codebook(cfg.bits_hi, d)),
          lo_(sphere_coordinate_codebook(cfg.bits_lo, d)) {
        l_.d = d;
        l_.n_hi = cfg.half_split ? d / 2 : d;
        l_.bits_hi = hi_.bits;
        l_.bits_lo = lo_.bits;
        l_.centroids_hi = hi_.centroids.data();
        l_.centroids_lo = lo_.centroids.data();
        size_t off = bytes_for_bits(size_t(l_.n_hi) * hi_.bits + size_t(d - l_.n_hi) * lo_.bits);
        if (cfg.qjl) {
            qjl_ = std::make_unique<QjlSketch>(d, seed);
            l_.qjl = true;
            l_.sign_off = off;
            off += bytes_for_bits(d);
        }
        l_.norm_off = off;
        off += 2;
        if (qjl_) {
            l_.gamma_off = off;
            off += 2;
        }
        row_bytes_ = off;
    }

    int head_dim() const override { return l_.d; }
    size_t row_bytes() const override { return row_bytes_; }
    size_t query_bytes() const override { return sizeof(float) * l_.d * (qjl_ ? 2 : 1); }

    void quantize_rows(const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) const override {
        const int d = l_.d;
        check_norms_fit_fp16(name_, x, n_rows, d);
        std::vector<float> u(d), residual(d);
        for (size_t r = 0; r < n_rows; ++r) {
            const float* xr = x + r * d;
            uint8_t* row = dst + r * dst_stride;
            std::memset(row, 0, row_bytes_);
            const double norm = row_norm(xr, d);
            rot_.apply(xr, u.data());
            const float inv = norm > 0 ? static_cast<float>(1.0 / norm) : 0.0f;
            for (int j = 0; j < d; ++j) {
                u[j] *= inv;
                const bool hi = j < l_.n_hi;
                const ScalarCodebook& cb = hi ? hi_ : lo_;
                const int code = cb.encode(u[j]);
                const size_t bit = hi ? size_t(j) * hi_.bits : size_t(l_.n_hi) * hi_.bits + size_t(j - l_.n_hi) * lo_.bits;
                put_code(row, bit, cb.bits, static_cast<uint32_t>(code));
                residual[j] = u[j] - cb.centroids[code];
            }
            store_half(row + l_.norm_off, static_cast<float>(norm));
            if (qjl_) {
                qjl_->sketch(residual.data(), row + l_.sign_off);
                store_half(row + l_.gamma_off, static_cast<float>(row_norm(residual.data(), d)));
            }
        }
    }

    void dequantize_rows(const uint8_t* src, size_t src_stride, size_t n_rows, float* y) const override {
        const int d = l_.d;
        std::vector<float> signs(qjl_ ? d : 0);
        for (size_t r = 0; r < n_rows; ++r) {
            const uint8_t* row = src + r * src_stride;
            float* yr = y + r * d;
            const float norm = load_half(row + l_.norm_off);
            turbo_decode_centroids(l_, row, yr);
            for (int j = 0; j < d; ++j) yr[j] *= norm;
            if (qjl_) {
                turbo_decode_signs(l_, row, signs.data());
                qjl_->add_transposed(signs.data(), qjl_->scale() * norm * load_half(row + l_.gamma_off), yr);
            }
            rot_.apply_inverse(yr, yr);
        }
    }

    // Per query: the rotated query q′ = R·q, then (for _qjl) √(π/2)/d · S·q′.
    void prepare_queries(const float* q, int n_q, uint8_t* prep) const override {
        const int d = l_.d;
        for (int i = 0; i < n_q; ++i) {
            float* p = reinterpret_cast<float*>(prep + i * query_bytes());
            rot_.apply(q + size_t(i) * d, p);
            if (qjl_) {
                qjl_->project(p, p + d);
                for (int k = 0; k < d; ++k) p[d + k] *= qjl_->scale();
            }
        }
    }

    void score_rows(const uint8_t* prep, int n_q, const uint8_t* rows, size_t row_stride, size_t n_rows,
                    float* scores, size_t score_stride) const override {
        active_rotated_kernels().turbo.score(l_, prep, query_bytes(), n_q, rows, row_stride, n_rows, scores,
                                             score_stride);
    }

    // acc (rotated basis) += w·‖x‖·c[code]; the QJL parts are summed in sign space over the whole call and
    // mapped back with one Sᵀ product per query, so the d × d cost is paid once per call, not per row.
    void accumulate_rows(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                         size_t n_rows, float* acc) const override {
        const int d = l_.d;
        std::vector<float> sketch(qjl_ ? size_t(n_q) * d : 0, 0.0f);
        active_rotated_kernels().turbo.accumulate(l_, w, w_stride, n_q, rows, row_stride, n_rows, acc,
                                                  sketch.data());
        if (qjl_) {
            for (int i = 0; i < n_q; ++i) {
                qjl_->add_transposed(sketch.data() + size_t(i) * d, qjl_->scale(), acc + size_t(i) * d);
            }
        }
    }

    void finish_accumulate(float* acc, int n_q) const override {
        for (int i = 0; i < n_q; ++i) rot_.apply_inverse(acc + size_t(i) * l_.d, acc + size_t(i) * l_.d);
    }

    // The codes are scored against the float query itself.
    void effective_query(const float* q, float* out) const override { std::copy(q, q + l_.d, out); }

private:
    std::string name_;
    Rotation rot_;
    const ScalarCodebook& hi_;
    const ScalarCodebook& lo_;
    std::unique_ptr<QjlSketch> qjl_;
    TurboLayout l_;
    size_t row_bytes_ = 0;
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
