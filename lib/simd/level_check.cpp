#include "level_check.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "dispatch.hpp"
#include "../ref/half.hpp"
#include "../ref/key_groups.hpp"
#include "../ref/weight_grid.hpp"

namespace kvq::detail {

std::vector<float> parity_rows(size_t rows, int n, uint64_t seed, bool extreme) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_int_distribution<int> small(-4, 4);
    std::vector<float> x(rows * n);
    for (size_t r = 0; r < rows; ++r) {
        float* row = x.data() + r * n;
        const int kind = static_cast<int>((r + seed) % 10);
        for (int j = 0; j < n; ++j) {
            float v = normal(rng);
            switch (kind) {
                case 0: v = 0.0f; break;
                case 1: v = (j % 3 == 0) ? -0.0f : 0.0f; break;
                case 2: v = 1.25f; break;
                case 3: v = static_cast<float>(small(rng)) * 0.5f; break;
                case 4: v = (j % 2 ? 1.0f : -1.0f) * (j % 32 == 5 ? 2.0f : 0.5f); break;
                case 5: v *= extreme ? 1e30f : 1e4f; break;
                case 6: v *= extreme ? 1e-30f : 1e-6f; break;
                case 7: v *= extreme ? 1e-41f : 3e-5f; break;
                case 8: v = v * 1e-3f + 5.0f; break;
                default: break;
            }
            row[j] = v;
        }
        if (kind == 3 && n >= 2) row[n - 1] = -row[0];  // a +a/-a tie in the last block
    }
    return x;
}

namespace {

// The first difference, as "what: at i, got G, want W".
template <class T>
std::string differs(const char* what, size_t at, T got, T want) {
    std::ostringstream s;
    s.precision(9);
    s << what << " at " << at << ": " << +got << ", the specification gives " << +want;
    return s.str();
}

constexpr double kRounding = 2e-6;  // relative to the sum of the magnitudes of a result's terms

}  // namespace

bool same_float(float a, float b) {
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    return ua == ub || (std::isnan(a) && std::isnan(b));
}

bool close_to(float got, float want, double tol) {
    if (std::isnan(want) || std::isnan(got)) return std::isnan(want) && std::isnan(got);
    if (std::isinf(want) || std::isinf(got)) return got == want;
    return std::fabs(double(got) - double(want)) <= tol;
}

std::string check_block_codec(SimdLevel level, BlockCodec c, int n, size_t rows, int n_q, bool extreme, uint64_t seed,
                              size_t& checks) {
    const BlockKernels& ref = scalar_kernels(c);
    const BlockKernels* level_k = level_kernels(c, level);
    if (!level_k) return "level not available";
    const BlockKernels& simd = *level_k;
    const RowCodecTraits& traits = block_traits(c);
    const bool plain = traits.plain;
    const int block = traits.block;
    const size_t block_bytes = traits.bytes_per_block;
    const size_t row_bytes = size_t(n / block) * block_bytes, stride = row_bytes + 3;
    const size_t qbytes = plain ? n * sizeof(float) : size_t(n / 32) * 40;

    // Quantize and prepare: the same bytes.
    const auto x = parity_rows(rows, n, seed, extreme);
    std::vector<uint8_t> a(rows * stride, 0xAB), b(rows * stride, 0xAB);
    for (size_t r = 0; r < rows; ++r) {
        ref.quantize(x.data() + r * n, a.data() + r * stride, n);
        simd.quantize(x.data() + r * n, b.data() + r * stride, n);
    }
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i] != b[i]) return differs("quantize: byte", i, b[i], a[i]);
    }
    checks += a.size();
    std::vector<uint8_t> pa(qbytes), pb(qbytes);
    for (size_t r = 0; r < rows; ++r) {
        ref.prepare_query(x.data() + r * n, pa.data(), n);
        simd.prepare_query(x.data() + r * n, pb.data(), n);
        for (size_t i = 0; i < qbytes; ++i) {
            if (pa[i] != pb[i]) return differs("prepare_query: byte", r * qbytes + i, pb[i], pa[i]);
        }
        checks += qbytes;
    }
    // Dequantize the quantized rows, and rows of random bytes (any scale bits at all): the same bits.
    std::vector<uint8_t> random(rows * stride);
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (auto& v : random) v = static_cast<uint8_t>(rng());
    for (const auto* bytes : {&a, &random}) {
        std::vector<float> ya(n), yb(n);
        for (size_t r = 0; r < rows; ++r) {
            ref.dequantize(bytes->data() + r * stride, ya.data(), n);
            simd.dequantize(bytes->data() + r * stride, yb.data(), n);
            for (int j = 0; j < n; ++j) {
                if (!same_float(ya[j], yb[j])) return differs("dequantize: value", r * n + j, yb[j], ya[j]);
            }
            checks += n;
        }
    }

    // Scores and accumulations on ordinary data, to float rounding.
    const auto k = parity_rows(rows, n, seed + 7, false);
    std::vector<uint8_t> keys(rows * stride);
    for (size_t r = 0; r < rows; ++r) ref.quantize(k.data() + r * n, keys.data() + r * stride, n);
    std::vector<float> kd(rows * n);  // dequantized keys, for the error bound
    for (size_t r = 0; r < rows; ++r) ref.dequantize(keys.data() + r * stride, kd.data() + r * n, n);
    const auto q = parity_rows(n_q, n, seed + 99, false);
    std::vector<uint8_t> prep(n_q * qbytes);
    for (int i = 0; i < n_q; ++i) ref.prepare_query(q.data() + i * n, prep.data() + i * qbytes, n);
    std::vector<float> qe(n_q * n);  // the query the kernels see
    for (int i = 0; i < n_q; ++i) {
        for (int j = 0; j < n; ++j) {
            if (plain) {
                qe[i * n + j] = q[i * n + j];
                continue;
            }
            const uint8_t* blk = prep.data() + i * qbytes + (j / 32) * 40;
            float d;
            std::memcpy(&d, blk, 4);
            qe[i * n + j] = d * static_cast<int8_t>(blk[8 + j % 32]);
        }
    }
    const size_t score_stride = rows + 5;
    std::vector<float> sa(n_q * score_stride, -1.0f), sb(n_q * score_stride, -1.0f);
    ref.score(prep.data(), qbytes, n_q, keys.data(), stride, rows, n, sa.data(), score_stride);
    simd.score(prep.data(), qbytes, n_q, keys.data(), stride, rows, n, sb.data(), score_stride);
    for (int i = 0; i < n_q; ++i) {
        for (size_t r = 0; r < score_stride; ++r) {
            const size_t at = i * score_stride + r;
            if (r >= rows) {
                if (sb[at] != -1.0f) return differs("score: writes outside the rows, at", at, sb[at], -1.0f);
                continue;
            }
            double mag = 0, row_max = 0;
            for (int j = 0; j < n; ++j) row_max = std::max(row_max, double(std::fabs(kd[r * n + j])));
            for (int j = 0; j < n; ++j) mag += std::fabs(double(qe[i * n + j])) * (std::fabs(double(kd[r * n + j])) + row_max);
            if (!close_to(sb[at], sa[at], kRounding * mag + 1e-35)) return differs("score: query i, row r =", at, sb[at], sa[at]);
        }
    }
    checks += n_q * rows;
    const size_t w_stride = rows + 2;
    const auto w = parity_rows(n_q, static_cast<int>(w_stride), seed + 5, false);
    const std::vector<float> acc0 = parity_rows(n_q, n, seed + 17, false);
    std::vector<float> aa = acc0, ab = acc0;
    ref.accumulate(w.data(), w_stride, n_q, keys.data(), stride, rows, n, aa.data());
    simd.accumulate(w.data(), w_stride, n_q, keys.data(), stride, rows, n, ab.data());
    for (int i = 0; i < n_q; ++i) {
        for (int j = 0; j < n; ++j) {
            double mag = std::fabs(acc0[i * n + j]);
            for (size_t r = 0; r < rows; ++r) mag += std::fabs(double(w[i * w_stride + r]) * kd[r * n + j]);
            if (!close_to(ab[i * n + j], aa[i * n + j], kRounding * mag + 1e-35))
                return differs("accumulate: query i, column j =", i * n + j, ab[i * n + j], aa[i * n + j]);
        }
    }
    checks += n_q * n;
    if (!ref.accumulate_grid) return {};
    // accumulate_grid (weights on the int8 grid, lib/ref/weight_grid.hpp): to float rounding of the rounded
    // weights' terms, |ŵ| ≤ |w·d| + m/254 (m: the group's largest |w·d|; d: a block's first field) and |q| ≤ 8.
    if (!simd.accumulate_grid) return "accumulate_grid: missing at this level";
    std::vector<float> ga = acc0, gb = acc0;
    ref.accumulate_grid(w.data(), w_stride, n_q, keys.data(), stride, rows, n, ga.data());
    simd.accumulate_grid(w.data(), w_stride, n_q, keys.data(), stride, rows, n, gb.data());
    for (int i = 0; i < n_q; ++i) {
        for (int j = 0; j < n; ++j) {
            double mag = std::fabs(acc0[i * n + j]);
            for (size_t r0 = 0; r0 < rows; r0 += kGridRows) {
                const size_t r1 = std::min(rows, r0 + kGridRows);
                double m = 0;
                for (size_t r = r0; r < r1; ++r) {
                    uint16_t h;
                    std::memcpy(&h, keys.data() + r * stride + (j / block) * block_bytes, 2);
                    m = std::max(m, std::fabs(double(w[i * w_stride + r]) * f16_to_f32(h)));
                }
                for (size_t r = r0; r < r1; ++r) mag += std::fabs(double(w[i * w_stride + r]) * kd[r * n + j]) + m * 8 / 254;
            }
            if (!close_to(gb[i * n + j], ga[i * n + j], kRounding * mag + 1e-35))
                return differs("accumulate_grid: query i, column j =", i * n + j, gb[i * n + j], ga[i * n + j]);
        }
    }
    checks += n_q * n;
    return {};
}

std::string check_softmax(SimdLevel level, int g, size_t n, uint64_t seed, size_t& checks) {
    const SoftmaxUpdate simd = level_softmax(level);
    if (!simd) return "level not available";
    const int d = 40;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 4.0f);
    std::vector<float> offsets(g);
    for (float& o : offsets) o = normal(rng);
    // Two blocks in a row: the second starts from the first's state (and rescales the accumulator).
    std::vector<SoftmaxState> sa(g), sb(g);
    std::vector<float> aa(g * d), ab;
    for (float& v : aa) v = normal(rng);
    ab = aa;
    for (int block = 0; block < 2; ++block) {
        std::vector<float> s(g * n);
        for (float& v : s) v = normal(rng) * (block + 1);
        if (n > 3) s[3] = -std::numeric_limits<float>::infinity();  // a masked row
        std::vector<float> t = s;
        const float* off = block ? offsets.data() : nullptr;
        softmax_update_scalar(s.data(), g, n, off, 0.125f, sa.data(), aa.data(), d);
        simd(t.data(), g, n, off, 0.125f, sb.data(), ab.data(), d);
        for (size_t i = 0; i < s.size(); ++i) {
            if (!same_float(t[i], s[i])) return differs("softmax weight", block * s.size() + i, t[i], s[i]);
        }
        for (int i = 0; i < g; ++i) {
            if (!same_float(sb[i].max, sa[i].max) || !same_float(sb[i].sum, sa[i].sum))
                return differs("softmax state sum of query", i, sb[i].sum, sa[i].sum);
        }
        for (size_t i = 0; i < aa.size(); ++i) {
            if (!same_float(ab[i], aa[i])) return differs("softmax rescaled accumulator", i, ab[i], aa[i]);
        }
        checks += s.size() + 2 * g + aa.size();
    }
    return {};
}

std::string check_channel_score(SimdLevel level, int bits, int d, size_t rows, int n_q, uint64_t seed, size_t& checks) {
    const ChannelScore simd = level_channel_score(level);
    if (!simd) return "level not available";
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    const size_t stride = static_cast<size_t>(d) * bits / 8 + 1;
    std::vector<uint8_t> codes(rows * stride);
    for (auto& c : codes) c = static_cast<uint8_t>(rng());
    std::vector<float> q(static_cast<size_t>(n_q) * d);
    for (float& x : q) x = normal(rng);
    if (!q.empty()) q[0] = -0.0f;
    std::vector<float> want(static_cast<size_t>(n_q) * rows), got(want.size(), 1.0f);
    channel_score_scalar(q.data(), n_q, d, bits, codes.data(), stride, rows, want.data(), rows);
    simd(q.data(), n_q, d, bits, codes.data(), stride, rows, got.data(), rows);
    for (size_t i = 0; i < want.size(); ++i) {
        if (!same_float(got[i], want[i])) return "chan" + std::to_string(bits) + " " + differs("score", i, got[i], want[i]);
    }
    checks += want.size();
    return {};
}

std::string check_score_groups(SimdLevel level, int d, size_t n_groups, bool extreme, uint64_t seed, size_t& checks) {
    const BlockKernels* k = level_kernels(BlockCodec::q8_0, level);
    if (!k) return "level not available";
    const size_t nb = static_cast<size_t>(d) / kQK, row_bytes = nb * sizeof(BlockQ8_0), rows = n_groups * kGroupRows;
    const auto x = parity_rows(rows + 4, d, seed, extreme);  // the last 4 are the queries
    std::vector<uint8_t> row_bytes_all(rows * row_bytes), groups(rows * row_bytes, 0xEE), back(rows * row_bytes);
    k->quantize(x.data(), row_bytes_all.data(), static_cast<int64_t>(rows) * d);
    // The layout: rows to groups and back give the same bytes.
    groups_from_rows(row_bytes_all.data(), row_bytes, rows, nb, groups.data());
    rows_from_groups(groups.data(), rows, nb, back.data(), row_bytes);
    for (size_t i = 0; i < back.size(); ++i) {
        if (back[i] != row_bytes_all[i]) return differs("key groups: byte", i, back[i], row_bytes_all[i]);
    }
    checks += back.size();
    if (!k->score_groups) return {};  // the level keeps keys in rows
    const size_t qbytes = nb * sizeof(BlockQ8Query);
    std::vector<uint8_t> prep(4 * qbytes);
    for (int i = 0; i < 4; ++i) k->prepare_query(x.data() + (rows + i) * d, prep.data() + i * qbytes, d);
    // The kernel on groups gives the bits of this level's score of the same rows, for 1-4 queries.
    std::vector<float> want(4 * rows), got(4 * rows, 1.0f);
    for (int n_q = 4; n_q >= 1; --n_q) {
        k->score(prep.data(), qbytes, n_q, row_bytes_all.data(), row_bytes, rows, d, want.data(), rows);
        std::fill(got.begin(), got.end(), 1.0f);
        float* out[4];
        for (int i = 0; i < n_q; ++i) out[i] = got.data() + i * rows;
        k->score_groups(prep.data(), qbytes, n_q, groups.data(), n_groups, d, out);
        for (size_t i = 0; i < n_q * rows; ++i) {
            if (!same_float(got[i], want[i])) {
                return "with " + std::to_string(n_q) + " queries, " +
                       differs("score_groups (against this level's score of the rows): score", i, got[i], want[i]);
            }
        }
        checks += n_q * rows;
    }
    return {};
}

std::string check_primitives(SimdLevel level, size_t& checks) {
    const auto check = level_check_ops(level);
    if (!check) return {};
    ++checks;
    const char* broken = check();
    return broken ? std::string("primitive ") + broken : std::string();
}

}  // namespace kvq::detail
