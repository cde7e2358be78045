// The TurboQuant codecs (layout and maths in turbo.hpp): quantize, dequantize and the prepared query, with
// score and accumulate from the active level's rotated kernels (specification: lib/ref/rotated_scalar.cpp).
#include "turbo.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../rotation/hadamard.hpp"
#include "../simd/dispatch.hpp"
#include "../ref/bit_codes.hpp"
#include "../ref/lloyd_max.hpp"
#include "../ref/qjl.hpp"
#include "../ref/rotated_kernels.hpp"
#include "../ref/stored_norm.hpp"
#include "../ref/tcq.hpp"
#include "../ref/turbo_codebook.hpp"
#include "../ref/rotated_quantize.hpp"

namespace kvq::detail {
namespace {

constexpr int kMaxQjlDim = 4096;  // the sketch keeps a dim × dim float matrix

class TurboCodec final : public CodecImpl {
public:
    TurboCodec(const TurboConfig& cfg, std::string name, int d, uint64_t seed)
        : name_(std::move(name)), rot_(d, seed), hi_(codebook(cfg, cfg.bits_hi, d)), lo_(codebook(cfg, cfg.bits_lo, d)),
          scale_(cfg.scale), row_(kernel_row(cfg)) {
        if (cfg.trellis) {
            init_trellis(cfg.trellis);
            return;
        }
        l_.d = d;
        l_.n_hi = cfg.half_split ? d / 2 : d;
        l_.bits_hi = hi_.bits;
        l_.bits_lo = lo_.bits;
        l_.centroids_hi = hi_.values.data();
        l_.centroids_lo = lo_.values.data();
        l_.scale_hi = hi_.scale;
        l_.ints_hi = hi_.ints.data();
        if (l_.n_hi == d && d % 32 == 0 && hi_.bits >= 2 && hi_.bits <= 4) l_.int8_order = hi_.bits;
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
        build_quantize_layout();
        build_query_layout();
    }

    int head_dim() const override { return l_.d; }
    size_t row_bytes() const override { return row_bytes_; }
    size_t query_bytes() const override { return query_bytes_; }

    // The stored scale may exceed the norm: by at most 1/‖c‖ (ls: ⟨c, u⟩ ≤ ‖c‖) or 1/⟨c, u⟩ (unbiased).
    // Every code's centroid has u's sign and at least the smallest centroid magnitude c_min (the codebook
    // is symmetric with no zero), so ‖c‖ ≥ √(Σ c_min²) and ⟨c, u⟩ ≥ c_min·‖u‖₁ ≥ c_min: rows whose norm
    // keeps s within fp16 are accepted.
    // tcqB's levels are in σ units (s ≈ ‖x‖/√d), the ls bound with c_min = its smallest level magnitude.
    // It takes no unbiased scale: the trellis may pick a level against u's sign, so ⟨c, u⟩ has no floor.
    InputLimit input_limit() const override {
        if (scale_ == TurboScale::norm) return {65504.0f, true};
        if (tcq_bits_) {
            const double c_min = l_.centroids_hi[tcq_alphabet(tcq_bits_).n_levels / 2];
            return {static_cast<float>(65504.0 * std::min(std::sqrt(double(l_.d)) * c_min, 1.0)), true};
        }
        const double min_hi = smallest_magnitude(hi_), min_lo = smallest_magnitude(lo_);
        double factor;
        if (scale_ == TurboScale::ls) {
            factor = std::sqrt(l_.n_hi * min_hi * min_hi + (l_.d - l_.n_hi) * min_lo * min_lo);
        } else {
            factor = l_.n_hi == l_.d ? min_hi : std::min(min_hi, min_lo);
        }
        return {static_cast<float>(65504.0 * std::min(factor, 1.0)), true};
    }

    // The MSE stage at the active level (rotated_quantize.hpp); the QJL sign sketch of each row's residual
    // after it, in chunks of rows.
    void quantize_rows(const float* x, size_t n_rows, uint8_t* dst, size_t dst_stride) const override {
        const auto kernel = active_rotated_kernels().row(row_).quantize;
        if (!qjl_) {
            kernel(q_, x, n_rows, dst, dst_stride, nullptr);
            return;
        }
        const int d = l_.d;
        constexpr size_t kChunk = 16;
        std::vector<float> residual(kChunk * d);
        for (size_t r0 = 0; r0 < n_rows; r0 += kChunk) {
            const size_t n = std::min(kChunk, n_rows - r0);
            kernel(q_, x + r0 * d, n, dst + r0 * dst_stride, dst_stride, residual.data());
            for (size_t r = 0; r < n; ++r) {
                uint8_t* row = dst + (r0 + r) * dst_stride;
                const float* res = residual.data() + r * d;
                qjl_->sketch(res, row + l_.sign_off);
                store_half(row + l_.gamma_off, static_cast<float>(row_norm(res, d)));
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
            if (tcq_bits_) {
                tcq_decode_levels(l_, tcq_bits_, row, yr);
            } else {
                turbo_decode_centroids(l_, row, yr);
            }
            for (int j = 0; j < d; ++j) yr[j] *= norm;
            if (qjl_) {
                turbo_decode_signs(l_, row, signs.data());
                qjl_->add_transposed(signs.data(), qjl_->scale() * norm * load_half(row + l_.gamma_off), yr);
            }
            rot_.apply_inverse(yr, yr);
        }
    }

    // The layout of a prepared query is in rotated_kernels.hpp.
    void prepare_queries(const float* q, int n_q, uint8_t* prep) const override {
        const int d = l_.d;
        for (int i = 0; i < n_q; ++i) {
            uint8_t* p = prep + i * query_bytes_;
            float* qt = reinterpret_cast<float*>(p);
            int8_t* q8 = reinterpret_cast<int8_t*>(p + l_.prep_q8_off);
            float* scales = reinterpret_cast<float*>(p + l_.prep_scale_off);
            int32_t* sums = reinterpret_cast<int32_t*>(p + l_.prep_sum_off);
            rot_.apply(q + size_t(i) * d, qt);
            for (int b0 = 0; b0 < d; b0 += 32) {
                const int n = std::min(32, d - b0);
                float amax = 0;
                bool finite = true;
                for (int j = 0; j < n; ++j) {
                    amax = std::max(amax, std::fabs(qt[b0 + j]));
                    finite = finite && std::isfinite(qt[b0 + j]);
                }
                if (!finite) {  // NanPolicy::propagate: every score against this query is NaN
                    scales[b0 / 32] = NAN;
                    sums[b0 / 32] = 0;
                    for (int j = 0; j < n; ++j) qt[b0 + j] = NAN, q8[b0 + int8_position(j, n)] = 0;
                    continue;
                }
                // 127/amax overflows for a subnormal amax: such a block is scored as zero.
                const float scale = amax / 127.0f, inv = amax > 0 && 127.0f / amax <= FLT_MAX ? 127.0f / amax : 0.0f;
                scales[b0 / 32] = scale;
                int32_t sum = 0;
                for (int j = 0; j < n; ++j) {
                    const int v = static_cast<int>(std::lround(std::clamp(qt[b0 + j] * inv, -127.0f, 127.0f)));
                    qt[b0 + j] = scale * static_cast<float>(v);
                    q8[b0 + int8_position(j, n)] = static_cast<int8_t>(v);
                    sum += v;
                }
                sums[b0 / 32] = sum;
            }
            if (qjl_) {
                qjl_->project(qt, qt + d);
                for (int k = 0; k < d; ++k) qt[d + k] *= qjl_->scale();
            }
        }
    }

    void score_rows(const uint8_t* prep, int n_q, const uint8_t* rows, size_t row_stride, size_t n_rows,
                    float* scores, size_t score_stride) const override {
        active_rotated_kernels().row(row_).score(l_, prep, query_bytes(), n_q, rows, row_stride, n_rows, scores,
                                             score_stride);
    }

    // acc (rotated basis) += w·‖x‖·c[code]; the QJL parts are summed in sign space over the whole call and
    // mapped back with one Sᵀ product per query, so the d × d cost is paid once per call, not per row.
    void accumulate_rows(const float* w, size_t w_stride, int n_q, const uint8_t* rows, size_t row_stride,
                         size_t n_rows, float* acc) const override {
        const int d = l_.d;
        // The sign-space sums: this thread's buffer, grown once (no allocation on the decode path).
        thread_local std::vector<float> sketch_buffer;
        float* sketch = nullptr;
        if (qjl_) {
            const size_t need = size_t(n_q) * d;
            if (sketch_buffer.size() < need) sketch_buffer.resize(need);
            sketch = sketch_buffer.data();
            std::fill(sketch, sketch + need, 0.0f);
        }
        active_rotated_kernels().row(row_).accumulate(l_, w, w_stride, n_q, rows, row_stride, n_rows, acc, sketch);
        if (qjl_) {
            for (int i = 0; i < n_q; ++i) {
                qjl_->add_transposed(sketch + size_t(i) * d, qjl_->scale(), acc + size_t(i) * d);
            }
        }
    }

    void finish_accumulate(float* acc, int n_q) const override {
        for (int i = 0; i < n_q; ++i) rot_.apply_inverse(acc + size_t(i) * l_.d, acc + size_t(i) * l_.d);
    }

    // The codes are scored against q̃: the rotated query's int8 round trip, rotated back.
    void effective_query(const float* q, float* out) const override {
        std::vector<uint8_t> prep(query_bytes_);
        prepare_queries(q, 1, prep.data());
        rot_.apply_inverse(reinterpret_cast<const float*>(prep.data()), out);
    }

private:
    // The codec's row in the kernel grid (rotated_kernels.hpp).
    static RotatedCodec kernel_row(const TurboConfig& cfg) {
        if (cfg.trellis) return cfg.trellis == 2 ? RotatedCodec::tcq2 : RotatedCodec::tcq3;
        if (cfg.qjl) return RotatedCodec::turbo_qjl;
        return cfg.half_split ? RotatedCodec::turbo_split : RotatedCodec::turbo;
    }

    static TurboCodebook codebook(const TurboConfig& cfg, int bits, int d) {
        return cfg.trellis ? TurboCodebook{} : make_turbo_codebook(sphere_coordinate_codebook(bits, d));
    }

    // tcqB (tcq.hpp): f codes of B − 1 bits, the u plane, the scale; the int8 query in order 2, as the SIMD
    // kernels form the ranks (rotated_tcq_avx2.hpp).
    void init_trellis(int bits) {
        const TcqAlphabet& a = tcq_alphabet(bits);
        const int d = rot_.dim();
        l_.d = l_.n_hi = d;
        l_.bits_hi = l_.bits_lo = bits - 1;
        l_.centroids_hi = l_.centroids_lo = a.levels;
        l_.scale_hi = a.scale;
        l_.ints_hi = a.ints;
        l_.int8_order = 2;
        tcq_bits_ = bits;
        l_.plane_off = bytes_for_bits(size_t(d) * (bits - 1));
        l_.norm_off = l_.plane_off + bytes_for_bits(d);
        row_bytes_ = l_.norm_off + 2;
        q_.rot = rotation_layout(rot_);
        q_.scale_mode = static_cast<int>(scale_);
        q_.norm_off = l_.norm_off;
        q_.row_bytes = row_bytes_;
        q_.plane_off = l_.plane_off;
        build_query_layout();
    }

    void build_query_layout() {
        const int d = l_.d;
        l_.prep_q8_off = sizeof(float) * d * (qjl_ ? 2 : 1);
        l_.prep_scale_off = l_.prep_q8_off + (size_t(d) + 3) / 4 * 4;
        l_.prep_sum_off = l_.prep_scale_off + sizeof(float) * ((d + 31) / 32);
        query_bytes_ = l_.prep_sum_off + sizeof(int32_t) * ((d + 31) / 32);
    }

    void build_quantize_layout() {
        q_.rot = rotation_layout(rot_);
        q_.scale_mode = static_cast<int>(scale_);
        q_.norm_off = l_.norm_off;
        q_.row_bytes = row_bytes_;
        q_.n_sections = l_.n_hi == l_.d ? 1 : 2;
        for (int s = 0; s < q_.n_sections; ++s) {
            const TurboCodebook& cb = s == 0 ? hi_ : lo_;
            const int n = 1 << cb.bits;
            auto& t = rank_tables_[s];
            t.bounds.assign(16, 0.0f);
            std::copy(cb.bounds.begin(), cb.bounds.end(), t.bounds.begin());
            t.values.assign(16, 0.0f);
            t.ints.assign(16, 0);
            for (int k = 0; k < n; ++k) {
                t.values[k] = cb.values[cb.code_by_rank[k]];
                t.ints[k] = cb.ints[cb.code_by_rank[k]];
            }
            TurboSection& sec = q_.sections[s];
            sec.begin = s == 0 ? 0 : l_.n_hi;
            sec.count = s == 0 ? l_.n_hi : l_.d - l_.n_hi;
            sec.bits = cb.bits;
            sec.bit_off = s == 0 ? 0 : size_t(l_.n_hi) * hi_.bits;
            sec.bounds = t.bounds.data();
            sec.code_by_rank = cb.code_by_rank.data();
            sec.value_by_rank = t.values.data();
            sec.int_by_rank = t.ints.data();
            sec.scale = cb.scale;
        }
    }

    static double smallest_magnitude(const TurboCodebook& cb) {
        double m = INFINITY;
        for (int k = 0; k < (1 << cb.bits); ++k) m = std::min(m, std::fabs(double(cb.values[k])));
        return m;
    }

    // Where value j of a 32-block of n sits in the int8 query (rotated_kernels.hpp: int8_order).
    int int8_position(int j, int n) const {
        if (n != 32) return j;
        if (l_.int8_order == 4) return (j % 2) * 16 + j / 2;
        if (l_.int8_order == 2) return (j % 4) * 8 + j / 4;
        return j;
    }

    std::string name_;
    Rotation rot_;
    TurboCodebook hi_, lo_;
    TurboScale scale_;
    RotatedCodec row_;
    int tcq_bits_ = 0;  // B for tcqB, else 0
    std::unique_ptr<QjlSketch> qjl_;
    TurboLayout l_;
    struct RankTables {
        std::vector<float> bounds, values;
        std::vector<int8_t> ints;
    } rank_tables_[2];
    TurboQuantizeLayout q_;
    size_t row_bytes_ = 0, query_bytes_ = 0;
};

}  // namespace

std::unique_ptr<CodecImpl> make_turbo(const TurboConfig& config, std::string_view name, std::string_view params,
                                      int head_dim, uint64_t seed) {
    const std::string n(name);
    TurboConfig cfg = config;
    if (cfg.qjl) cfg.scale = TurboScale::norm;  // the residual sketch is of the unit vector: the norm scales it
    if (!params.empty()) {
        const std::string p(params);
        if (config.qjl) throw BadParams("codec '" + n + "' takes no parameters, got '" + p + "'");
        if (p == "scale=norm") cfg.scale = TurboScale::norm;
        else if (p == "scale=ls") cfg.scale = TurboScale::ls;
        else if (p == "scale=unbiased" && !config.trellis) cfg.scale = TurboScale::unbiased;
        else if (config.trellis) throw BadParams("codec '" + n + "' takes one parameter, scale=norm|ls, got '" + p + "'");
        else throw BadParams("codec '" + n + "' takes one parameter, scale=norm|ls|unbiased, got '" + p + "'");
    }
    const int multiple = config.trellis ? 32 : config.half_split ? 16 : 8;
    if (head_dim < multiple || head_dim % multiple != 0) {
        throw BadHeadDim("codec '" + n + "' needs a head_dim that is a multiple of " + std::to_string(multiple) +
                                    ", got " + std::to_string(head_dim));
    }
    if (config.qjl && head_dim > kMaxQjlDim) {
        throw BadHeadDim("codec '" + n + "' keeps a head_dim × head_dim QJL matrix; head_dim must be at most " +
                                    std::to_string(kMaxQjlDim) + ", got " + std::to_string(head_dim));
    }
    return std::make_unique<TurboCodec>(cfg, n, head_dim, seed);
}

}  // namespace kvq::detail
