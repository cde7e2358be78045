// Fuzz target: arbitrary bytes decoded as rows of every codec in the table (plain and +rot), at any
// address and stride, at every SIMD level. Properties:
// - dequantize_rows, score_rows and accumulate_rows read nothing outside the rows (ASan) and hit no
//   undefined behaviour (UBSan);
// - dequantize gives the same values at every SIMD level;
// - a value reads back non-finite only where a stored float field is NaN or Inf (a plain value, an
//   fp16 scale or min; for +rot codecs, any field of the row, or plain values so large that the inverse
//   rotation's sums may overflow: Σ|stored| ≥ FLT_MAX / 2);
// - score = effective query · dequantized row, and accumulate adds w · dequantized row, to float
//   rounding, wherever that reference is finite.
#include <cfloat>

#include "ref/half.hpp"
#include "fuzz_common.hpp"

using namespace kvq;
using namespace kvq::fuzz;

namespace {

bool f16_finite(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return (h & 0x7C00) != 0x7C00;
}

// For each value of the row: are the stored fields it is decoded from finite? Empty if the codec's
// layout is not known here (a codec added later is still checked for consistency, just not this).
std::vector<bool> fields_finite(const Codec& c, const uint8_t* row) {
    const std::string spec = c.name();
    const std::string base = spec.substr(0, spec.find_first_of(":+"));
    const int d = c.head_dim();
    std::vector<bool> ok(d, true);
    if (base == "f32") {
        for (int j = 0; j < d; ++j) {
            float v;
            std::memcpy(&v, row + 4 * j, 4);
            ok[j] = std::isfinite(v);
        }
    } else if (base == "f16") {
        for (int j = 0; j < d; ++j) ok[j] = f16_finite(row + 2 * j);
    } else if (base == "bf16") {
        for (int j = 0; j < d; ++j) {
            uint16_t h;
            std::memcpy(&h, row + 2 * j, 2);
            ok[j] = (h & 0x7F80) != 0x7F80;
        }
    } else if (base == "q8_0" || base == "q4_0" || base == "q5_0" || base == "q4_1" || base == "q5_1") {
        const bool with_min = base == "q4_1" || base == "q5_1";
        const size_t block_bytes = codec_info(base).bytes_per_block;
        for (int b = 0; b < d / 32; ++b) {
            const uint8_t* p = row + b * block_bytes;
            const bool fine = f16_finite(p) && (!with_min || f16_finite(p + 2));
            for (int j = 0; j < 32; ++j) ok[b * 32 + j] = fine;
        }
    } else {
        return {};
    }
    if (c.rotated()) {  // the inverse rotation mixes every value into every other
        bool all = true;
        for (bool b : ok) all = all && b;
        // and may overflow where plain stored values are huge: each value read back is at most Σ|stored|
        // (the rotation is orthonormal, block by block for head sizes that are not powers of two), so a
        // finite result is owed only below FLT_MAX, with room for the rounding of the partial sums
        // (quantized codecs' values stay below 65504 · 127).
        const size_t width = base == "f32" ? 4 : base == "f16" || base == "bf16" ? 2 : 0;
        if (all && width) {
            double l1 = 0;
            for (int j = 0; j < d; ++j) {
                float v;
                if (width == 4) {
                    std::memcpy(&v, row + 4 * j, 4);
                } else {
                    uint16_t h;
                    std::memcpy(&h, row + 2 * j, 2);
                    v = base == "f16" ? detail::f16_to_f32(h) : detail::bf16_to_f32(h);
                }
                l1 += std::fabs(double(v));
            }
            all = l1 < 0.5 * FLT_MAX;
        }
        ok.assign(d, all);
    }
    return ok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    const auto codec = pick_codec(in);
    if (!codec) return 0;
    const Codec& c = *codec;
    const int d = c.head_dim();
    const int n_q = in.ConsumeIntegralInRange<int>(1, 3);
    const size_t n_rows = in.ConsumeIntegralInRange<size_t>(1, 6);
    const size_t offset = in.ConsumeIntegralInRange<size_t>(0, 3);
    const size_t stride = c.row_bytes() + in.ConsumeIntegralInRange<size_t>(0, 5);
    std::vector<float> q(size_t(n_q) * d), w(size_t(n_q) * n_rows);
    for (float& v : q) v = in.ConsumeFloatingPointInRange<float>(-8.0f, 8.0f);
    for (float& v : w) v = in.ConsumeFloatingPointInRange<float>(-2.0f, 2.0f);
    // The buffer ends exactly where the last row ends, so any read past a row is past the allocation.
    std::vector<uint8_t> buf(offset + (n_rows - 1) * stride + c.row_bytes(), 0);
    const auto bytes = in.ConsumeRemainingBytes<uint8_t>();
    if (!bytes.empty()) std::memcpy(buf.data(), bytes.data(), std::min(bytes.size(), buf.size()));
    const uint8_t* rows = buf.data() + offset;

    std::vector<float> reference;  // dequantized at the first level
    at_every_simd_level([&](SimdLevel level) {
        const std::string at = c.name() + " at " + std::string(simd_level_name(level));
        std::vector<float> y(n_rows * d);
        c.dequantize_rows(rows, n_rows, y.data(), stride);
        if (reference.empty()) {
            reference = y;
        } else {
            require(same_floats(y, reference), at + ": dequantize differs from the scalar level");
        }
        for (size_t r = 0; r < n_rows; ++r) {
            const auto ok = fields_finite(c, rows + r * stride);
            for (size_t j = 0; j < ok.size(); ++j) {
                require(!ok[j] || std::isfinite(y[r * d + j]),
                        at + ": a value with finite stored fields reads back non-finite");
            }
        }

        std::vector<uint8_t> prep(size_t(n_q) * c.query_bytes());
        c.prepare_queries(q.data(), n_q, prep.data());
        std::vector<float> scores(size_t(n_q) * n_rows), qe(d);
        c.score_rows(prep.data(), n_q, rows, n_rows, scores.data(), n_rows, stride);
        for (int i = 0; i < n_q; ++i) {
            c.effective_query(q.data() + i * d, qe.data());
            for (size_t r = 0; r < n_rows; ++r) {
                double ref = 0, mag = 0, qn = 0, kn = 0;
                for (int j = 0; j < d; ++j) {
                    const double t = double(qe[j]) * reference[r * d + j];
                    ref += t, mag += std::fabs(t);
                    qn += double(qe[j]) * qe[j], kn += double(reference[r * d + j]) * reference[r * d + j];
                }
                const double rot = c.rotated() ? std::sqrt(qn * kn) : 0.0;  // the rotation's rounding
                if (!std::isfinite(mag) || mag + rot > 1e30) continue;
                const double s = scores[i * n_rows + r];
                require(std::fabs(s - ref) <= 3e-5 * (mag + rot) + 1e-30,
                        at + ": score differs from effective query · dequantized row");
            }
        }

        std::vector<float> acc(size_t(n_q) * d, 0.0f);
        c.accumulate_rows(w.data(), n_rows, n_q, rows, n_rows, acc.data(), stride);
        c.finish_accumulate(acc.data(), n_q);
        for (int i = 0; i < n_q; ++i) {
            double total_mag = 0;  // the rotation spreads every column's rounding over the row
            for (int j = 0; j < d; ++j) {
                for (size_t r = 0; r < n_rows; ++r) total_mag += std::fabs(double(w[i * n_rows + r]) * reference[r * d + j]);
            }
            if (!std::isfinite(total_mag) || total_mag > 1e30) continue;
            for (int j = 0; j < d; ++j) {
                double ref = 0, mag = 0;
                for (size_t r = 0; r < n_rows; ++r) {
                    const double t = double(w[i * n_rows + r]) * reference[r * d + j];
                    ref += t, mag += std::fabs(t);
                }
                const double tol = 3e-5 * (c.rotated() ? total_mag : mag) + 1e-30;
                require(std::fabs(acc[i * d + j] - ref) <= tol, at + ": accumulate differs from Σ w · dequantized row");
            }
        }
    });
    return 0;
}
