// kvq::attend_rows' argument checks and its double-precision finish (attend_rows_checks.hpp).
#include "attend_rows_checks.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "../ref/half.hpp"
#include "../util/checked_size.hpp"
#include "kvq/errors.hpp"

namespace kvq::detail {
namespace {

constexpr uint16_t kF16NegInf = 0xFC00;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

[[noreturn]] void bad(const std::string& what) { throw std::invalid_argument("attend_rows: " + what); }

size_t mask_element_bytes(MaskType t) { return t == MaskType::f16 ? 2 : 4; }

// The first element of n mask values that is NaN or +inf (n when none): kvq.h allows finite values and -inf.
// Branch-free over the row, so that the scan vectorizes (it runs on every call under NanPolicy::reject).
size_t first_bad_mask_value(const void* row, size_t n, MaskType type) {
    if (type == MaskType::f16) {
        const auto* h = static_cast<const uint8_t*>(row);
        constexpr size_t kRun = 256;
        for (size_t a = 0; a < n; a += kRun) {
            const size_t b = std::min(n, a + kRun);
            bool any = false;
            for (size_t t = a; t < b; ++t) {
                uint16_t x;
                std::memcpy(&x, h + 2 * t, 2);
                any |= (x & 0x7C00) == 0x7C00 && x != kF16NegInf;  // Inf or NaN exponent, other than -inf
            }
            if (any) {
                for (size_t t = a; t < b; ++t) {
                    uint16_t x;
                    std::memcpy(&x, h + 2 * t, 2);
                    if ((x & 0x7C00) == 0x7C00 && x != kF16NegInf) return t;
                }
            }
        }
        return n;
    }
    const auto* f = static_cast<const uint8_t*>(row);
    for (size_t t = 0; t < n; ++t) {
        float x;
        std::memcpy(&x, f + 4 * t, 4);
        if (std::isnan(x) || x == std::numeric_limits<float>::infinity()) return t;
    }
    return n;
}

float mask_value(const void* row, size_t t, MaskType type) {
    if (type == MaskType::f16) {
        uint16_t h;
        std::memcpy(&h, static_cast<const uint8_t*>(row) + 2 * t, 2);
        return f16_to_f32(h);
    }
    float f;
    std::memcpy(&f, static_cast<const uint8_t*>(row) + 4 * t, 4);
    return f;
}

// Whether n_a results at stride sa and n_b at stride sb (each d floats) do not overlap; the strides are
// within a checked extent, so the products below cannot wrap, but they are checked all the same.
bool disjoint(size_t sa, size_t n_a, size_t sb, size_t n_b, size_t d) {
    if (n_a <= 1) return n_b <= 1 || sb >= d;
    if (n_b <= 1) return sa >= d;
    if (sa > sb) {
        std::swap(sa, sb);
        std::swap(n_a, n_b);
    }
    const CheckedSize span = CheckedSize(sa) * n_a;
    return sa >= d && !span.too_large() && sb >= span.value();
}

}  // namespace

RowStrides check_attend_rows(const Codec& keys, const Codec& values, int n_heads, int n_kv_heads, const float* q,
                             RowsView& k, RowsView& v, size_t n_tokens, const float* /*out*/, const AttendOptions& o) {
    // Queries have the keys' head size, results the values' (they may differ: MLA's 576 and 512).
    const size_t heads = static_cast<size_t>(n_heads), d = static_cast<size_t>(keys.head_dim()), nq = o.n_queries;
    const size_t dv = static_cast<size_t>(values.head_dim());
    constexpr size_t kFloat = sizeof(float);
    if (k.head_stride == 0) k.head_stride = keys.row_bytes();
    if (v.head_stride == 0) v.head_stride = values.row_bytes();
    if (k.token_stride == 0) k.token_stride = static_cast<size_t>(n_kv_heads) * keys.row_bytes();
    if (v.token_stride == 0) v.token_stride = static_cast<size_t>(n_kv_heads) * values.row_bytes();

    // Strides in elements, with their defaults; a default that overflows saturates (too_large), and is
    // refused below where it is used (more than one row).
    const CheckedSize q_head = o.q_head_stride ? CheckedSize(o.q_head_stride) : CheckedSize(d);
    const CheckedSize q_row = o.q_row_stride ? CheckedSize(o.q_row_stride) : CheckedSize(heads) * q_head;
    const CheckedSize out_head = o.out_head_stride ? CheckedSize(o.out_head_stride) : CheckedSize(dv);
    const CheckedSize out_row = o.out_row_stride ? CheckedSize(o.out_row_stride) : CheckedSize(heads) * out_head;
    const size_t esize = mask_element_bytes(o.mask_type);
    const CheckedSize mask_row = o.mask_row_stride ? CheckedSize(o.mask_row_stride) : CheckedSize(n_tokens);
    const bool has_mask = o.mask && n_tokens > 0;

    // Every buffer, before any of them is read: (rows − 1)·row stride + (heads − 1)·head stride + item.
    using detail::strided;
    const auto per_rows = [&](CheckedSize row, CheckedSize head, size_t item) {
        return strided(nq, row * kFloat, strided(heads, head * kFloat, CheckedSize(item) * kFloat));
    };
    const char* const rows_how = "n_tokens tokens token_stride apart, each n_kv_heads rows head_stride apart";
    detail::check_buffer_sizes(
        {{"k", strided(n_tokens, k.token_stride, strided(n_kv_heads, k.head_stride, keys.row_bytes())), rows_how},
         {"v", strided(n_tokens, v.token_stride, strided(n_kv_heads, v.head_stride, values.row_bytes())), rows_how},
         {"q", per_rows(q_row, q_head, d), "n_queries rows q_row_stride apart, each n_heads heads q_head_stride apart, floats"},
         {"out", per_rows(out_row, out_head, dv), "n_queries rows out_row_stride apart, each n_heads heads out_head_stride apart, floats"},
         {"mask", has_mask ? strided(nq, mask_row * esize, CheckedSize(n_tokens) * esize) : CheckedSize(0),
          "n_queries rows of n_tokens elements, mask_row_stride apart"},
         {"sinks", o.sinks ? CheckedSize(heads) * kFloat : CheckedSize(0), "n_heads floats"}},
        [] { return "attend_rows"; });

    RowStrides s;  // a saturated stride is SIZE_MAX, and only ever multiplied by row 0 or head 0
    s.q_head = q_head.value();
    s.q_row = q_row.value();
    s.out_head = out_head.value();
    s.out_row = out_row.value();
    s.mask_row = mask_row.value();
    if (!disjoint(s.out_head, heads, s.out_row, nq, dv)) {
        bad("the result strides (head " + std::to_string(o.out_head_stride) + ", row " + std::to_string(o.out_row_stride) +
            " floats) make results overlap");
    }
    if (n_tokens > 1 && (k.token_stride < keys.row_bytes() || v.token_stride < values.row_bytes())) {
        bad("a token stride is smaller than the row bytes");
    }
    if (has_mask && nq > 1 && s.mask_row < n_tokens) bad("the mask row stride is smaller than n_tokens");

    // Values, now that every buffer is known to be one that can exist.
    if (o.nan == NanPolicy::reject) {
        for (size_t r = 0; r < nq; ++r) {
            for (size_t h = 0; h < heads; ++h) {
                if (!all_finite(q + r * s.q_row + h * s.q_head, d)) {
                    throw NonFiniteInput("attend_rows: the query of row " + std::to_string(r) + ", head " +
                                         std::to_string(h) + " is not finite (NaN or Inf)");
                }
            }
        }
        if (has_mask) {
            for (size_t r = 0; r < nq; ++r) {
                const void* row = static_cast<const uint8_t*>(o.mask) + r * s.mask_row * esize;
                if (const size_t t = first_bad_mask_value(row, n_tokens, o.mask_type); t < n_tokens) {
                    const float x = mask_value(row, t, o.mask_type);
                    throw NonFiniteInput("attend_rows: the mask of row " + std::to_string(r) + ", token " +
                                         std::to_string(t) + " is " + (std::isnan(x) ? "NaN" : "+inf") +
                                         " (a mask holds finite values or -inf)");
                }
            }
        }
    }
    if (o.sinks) {
        for (size_t h = 0; h < heads; ++h) {
            if (!std::isfinite(o.sinks[h])) bad("the sink of head " + std::to_string(h) + " is not finite");
        }
    }
    return s;
}

void finish_rows_exactly(const Codec& keys, const Codec& values, int n_heads, int n_kv_heads, const float* q,
                         const RowsView& k, const RowsView& v, size_t n_tokens, float* out, const AttendOptions& o,
                         const RowStrides& s, float scale) {
    if (n_tokens == 0) return;
    const size_t heads = static_cast<size_t>(n_heads), d = static_cast<size_t>(keys.head_dim());
    const size_t dv = static_cast<size_t>(values.head_dim());
    const size_t g = heads / static_cast<size_t>(n_kv_heads), esize = mask_element_bytes(o.mask_type);
    std::vector<float> row;  // sized only for a result that needs it: a call of finite results allocates nothing
    std::vector<double> score, acc;
    for (size_t r = 0; r < o.n_queries; ++r) {
        const void* mrow = o.mask ? static_cast<const uint8_t*>(o.mask) + r * s.mask_row * esize : nullptr;
        bool mask_checked = false;
        for (size_t h = 0; h < heads; ++h) {
            float* dst = out + r * s.out_row + h * s.out_head;
            if (all_finite(dst, dv)) continue;
            const float* qh = q + r * s.q_row + h * s.q_head;
            if (!all_finite(qh, d)) continue;  // NanPolicy::propagate: its NaN is owed
            if (mrow && !mask_checked) {
                if (first_bad_mask_value(mrow, n_tokens, o.mask_type) < n_tokens) break;  // likewise, the whole row
                mask_checked = true;
            }
            const size_t kvh = h / g;
            row.resize(std::max(d, dv));
            acc.resize(dv);
            score.assign(n_tokens, -std::numeric_limits<double>::infinity());
            double top = o.sinks ? static_cast<double>(o.sinks[h]) : -std::numeric_limits<double>::infinity();
            bool kept = false, finite_rows = true;
            for (size_t t = 0; t < n_tokens && finite_rows; ++t) {
                const float m = mrow ? mask_value(mrow, t, o.mask_type) : 0.0f;
                if (m == kNegInf) continue;
                keys.dequantize_rows(static_cast<const uint8_t*>(k.data) + t * k.token_stride + kvh * k.head_stride, 1, row.data());
                finite_rows = all_finite(row.data(), d);
                double dot = 0.0;
                for (size_t j = 0; j < d; ++j) dot += static_cast<double>(qh[j]) * row[j];
                double x = dot * scale;
                if (o.softcap > 0) x = o.softcap * std::tanh(x / o.softcap);
                score[t] = x + m;
                top = std::max(top, score[t]);
                kept = true;
            }
            if (!finite_rows) continue;  // a key row the codec reads as NaN/Inf: the NaN is the rows'
            std::fill(acc.begin(), acc.end(), 0.0);
            double sum = o.sinks ? std::exp(static_cast<double>(o.sinks[h]) - top) : 0.0;
            for (size_t t = 0; kept && t < n_tokens && finite_rows; ++t) {
                if (score[t] == -std::numeric_limits<double>::infinity()) continue;
                values.dequantize_rows(static_cast<const uint8_t*>(v.data) + t * v.token_stride + kvh * v.head_stride, 1, row.data());
                finite_rows = all_finite(row.data(), dv);
                const double w = std::exp(score[t] - top);
                sum += w;
                for (size_t j = 0; j < dv; ++j) acc[j] += w * row[j];
            }
            if (!finite_rows) continue;
            for (size_t j = 0; j < dv; ++j) {
                dst[j] = kept && sum > 0 ? static_cast<float>(std::clamp(acc[j] / sum, -double(FLT_MAX), double(FLT_MAX))) : 0.0f;
            }
        }
    }
}

}  // namespace kvq::detail
