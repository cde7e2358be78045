// Fuzz target: the cache's integer kernels on arbitrary bytes, at every SIMD level this build and CPU
// have (whether or not the level is the one in use). Rows, scales, prepared queries and weights come
// from the input bit for bit, so scales and weights may be NaN, Inf, subnormal or huge, and codes take
// every byte (q8_0's −128 too). Properties:
// - q8_0 key groups (lib/ref/key_groups.hpp): rows to groups and back give the same bytes; where a level
//   has a kernel on groups (BlockKernels::score_groups), it gives the bits of that level's score of the
//   same rows, for 1–4 queries (NaNs count as equal);
// - q4_0 values on the int8 weight grid (BlockKernels::accumulate_grid, lib/ref/weight_grid.hpp): every
//   level gives the scalar specification's sums to float rounding, for 1–8 queries and 1–48 rows (so
//   whole and partial 16-row groups), any row stride; a query and block with a non-finite w·d in a group
//   gives NaN there at every level; sums whose magnitude reaches 1e30 (the specification's float sums
//   may overflow, where the kernels' integer sums do not) or with a group whose largest |w·d| is below
//   1e-30 (rounded in subnormal floats) are owed nothing else;
// - the online softmax's block update (lib/ref/softmax.hpp) gives the scalar specification's bits at
//   every level (weights, state, rescaled accumulator) for 1–8 queries and 1–80 rows, from any state;
//   a query whose scores, offset or state hold a NaN is owed NaN-ness only (a NaN enters the block max
//   in another order), and a NaN sum at both;
// - nothing reads outside its buffers (ASan) or hits undefined behaviour (UBSan).
#include <cfloat>

#include "fuzz_common.hpp"
#include "ref/blocks.hpp"
#include "ref/half.hpp"
#include "ref/key_groups.hpp"
#include "ref/row_codecs.hpp"
#include "ref/softmax.hpp"
#include "ref/weight_grid.hpp"
#include "simd/dispatch.hpp"

using namespace kvq;
using namespace kvq::fuzz;
using kvq::detail::BlockKernels;
using kvq::detail::BlockQ4_0;
using kvq::detail::BlockQ8_0;
using kvq::detail::BlockQ8Query;
using kvq::detail::kQK;

namespace {

std::vector<uint8_t> take_bytes(FuzzedDataProvider& in, size_t n) {
    std::vector<uint8_t> b(n, 0);
    const auto got = in.ConsumeBytes<uint8_t>(n);
    if (!got.empty()) std::memcpy(b.data(), got.data(), got.size());
    return b;
}

// Weights: bit for bit from the input, or in a softmax's range [0, 1] (where real sums live).
std::vector<float> take_weights(FuzzedDataProvider& in, size_t n) {
    if (in.ConsumeBool()) return raw_floats(in, n);
    std::vector<float> w(n);
    for (float& v : w) v = in.ConsumeFloatingPointInRange<float>(0.0f, 1.0f);
    return w;
}

void check_key_groups(FuzzedDataProvider& in) {
    const size_t nb = in.ConsumeIntegralInRange<size_t>(1, 5), n = nb * kQK;
    const size_t n_groups = in.ConsumeIntegralInRange<size_t>(1, 3), rows = n_groups * detail::kGroupRows;
    const size_t row_bytes = nb * sizeof(BlockQ8_0), qbytes = nb * sizeof(BlockQ8Query);
    const auto prep = take_bytes(in, 4 * qbytes);
    const auto row_data = take_bytes(in, rows * row_bytes);
    // The buffer ends where the groups end, so a read past them is past the allocation.
    std::vector<uint8_t> groups(detail::group_bytes(nb) * n_groups), back(rows * row_bytes);
    detail::groups_from_rows(row_data.data(), row_bytes, rows, nb, groups.data());
    detail::rows_from_groups(groups.data(), rows, nb, back.data(), row_bytes);
    require(back == row_data, "key groups: rows to groups and back changed a byte");
    for (SimdLevel level : available_simd_levels()) {
        const BlockKernels* k = detail::level_kernels(detail::BlockCodec::q8_0, level);
        if (!k || !k->score_groups) continue;
        for (int n_q = 1; n_q <= 4; ++n_q) {
            std::vector<float> want(size_t(n_q) * rows), got(size_t(n_q) * rows);
            k->score(prep.data(), qbytes, n_q, row_data.data(), row_bytes, rows, static_cast<int64_t>(n), want.data(), rows);
            float* out[4];
            for (int i = 0; i < n_q; ++i) out[i] = got.data() + i * rows;
            k->score_groups(prep.data(), qbytes, n_q, groups.data(), n_groups, static_cast<int64_t>(n), out);
            require(same_floats(got, want), std::string("score_groups at ") + std::string(simd_level_name(level)) + " with " +
                                                std::to_string(n_q) + " queries differs from the level's score of the rows");
        }
    }
}

void check_weight_grid(FuzzedDataProvider& in) {
    const size_t nb = in.ConsumeIntegralInRange<size_t>(1, 5), n = nb * kQK;
    const int n_q = in.ConsumeIntegralInRange<int>(1, 8);
    const size_t rows = in.ConsumeIntegralInRange<size_t>(1, 48);
    const size_t row_bytes = nb * sizeof(BlockQ4_0), stride = row_bytes + in.ConsumeIntegralInRange<size_t>(0, 3);
    const size_t w_stride = rows + in.ConsumeIntegralInRange<size_t>(0, 2);
    const bool zero_acc = in.ConsumeBool();
    const auto w = take_weights(in, size_t(n_q) * w_stride);
    std::vector<float> acc0(size_t(n_q) * n, 0.0f);
    if (!zero_acc) {
        for (float& v : acc0) v = in.ConsumeFloatingPointInRange<float>(-4.0f, 4.0f);
    }
    // The buffer ends exactly where the last row ends.
    auto vals = take_bytes(in, (rows - 1) * stride + row_bytes);
    auto d = [&](size_t r, size_t t) {
        uint16_t h;
        std::memcpy(&h, vals.data() + r * stride + t * sizeof(BlockQ4_0), 2);
        return detail::f16_to_f32(h);
    };
    auto code = [&](size_t r, size_t j) {  // q = c − 8, c the stored nibble of column j
        const uint8_t b = vals[r * stride + (j / kQK) * sizeof(BlockQ4_0) + 2 + (j % kQK) % 16];
        return static_cast<int>((j % kQK) < 16 ? b & 0x0F : b >> 4) - 8;
    };

    const BlockKernels& ref = detail::scalar_kernels(detail::BlockCodec::q4_0);
    std::vector<float> want = acc0;
    ref.accumulate_grid(w.data(), w_stride, n_q, vals.data(), stride, rows, static_cast<int64_t>(n), want.data());
    // What each sum is owed: its magnitude (|acc0| plus, per 16-row group, Σ|w·d·q| and the grid's
    // rounding, at most m/254 per weight and 8 per code), and whether its query and block have a
    // non-finite w·d in some group (then the specification's weights there are NaN).
    std::vector<double> mag(acc0.size());
    std::vector<bool> nan_lane(acc0.size(), false), tiny(acc0.size(), false);
    for (int i = 0; i < n_q; ++i) {
        for (size_t t = 0; t < nb; ++t) {
            bool bad = false, small = false;
            double slack = 0;  // the grid's rounding: at most m/254 per weight and 8 per code, per group
            for (size_t r0 = 0; r0 < rows; r0 += detail::kGridRows) {
                const size_t r1 = std::min(rows, r0 + detail::kGridRows);
                double m = 0;
                for (size_t r = r0; r < r1; ++r) {
                    bad = bad || !std::isfinite(w[i * w_stride + r] * d(r, t));
                    m = std::max(m, std::fabs(double(w[i * w_stride + r]) * d(r, t)));
                }
                small = small || (m > 0 && m < 1e-30);
                slack += m * 8 / 254 * double(r1 - r0);
            }
            for (size_t jj = 0; jj < kQK; ++jj) {
                const size_t j = t * kQK + jj;
                double s = std::fabs(double(acc0[i * n + j])) + slack;
                for (size_t r = 0; r < rows; ++r) s += std::fabs(double(w[i * w_stride + r]) * d(r, t) * code(r, j));
                mag[i * n + j] = s;
                nan_lane[i * n + j] = bad;
                tiny[i * n + j] = small;
            }
        }
    }
    for (SimdLevel level : available_simd_levels()) {
        const BlockKernels* k = detail::level_kernels(detail::BlockCodec::q4_0, level);
        if (!k || !k->accumulate_grid) continue;
        std::vector<float> got = acc0;
        k->accumulate_grid(w.data(), w_stride, n_q, vals.data(), stride, rows, static_cast<int64_t>(n), got.data());
        const std::string at = std::string("accumulate_grid at ") + std::string(simd_level_name(level));
        for (size_t e = 0; e < got.size(); ++e) {
            if (nan_lane[e]) {
                require(std::isnan(want[e]) && std::isnan(got[e]), at + ": a non-finite w·d did not give NaN");
                continue;
            }
            if (!(mag[e] < 1e30) || tiny[e]) continue;  // the float sums may overflow or lose their digits
            require(std::fabs(double(got[e]) - double(want[e])) <= 2e-6 * mag[e],
                    at + ": differs from the specification beyond float rounding");
        }
    }
}

bool same_bits(float a, float b) {
    return std::memcmp(&a, &b, sizeof a) == 0 || (std::isnan(a) && std::isnan(b));
}

void check_softmax(FuzzedDataProvider& in) {
    const int g = in.ConsumeIntegralInRange<int>(1, 8), d = in.ConsumeIntegralInRange<int>(1, 64);
    const size_t n = in.ConsumeIntegralInRange<size_t>(1, 80);
    const bool raw = in.ConsumeBool(), with_offsets = in.ConsumeBool();
    const float scale = raw ? raw_floats(in, 1)[0] : in.ConsumeFloatingPointInRange<float>(0.01f, 1.0f);
    std::vector<float> scores, offsets;
    if (raw) {
        scores = raw_floats(in, size_t(g) * n);
        offsets = raw_floats(in, size_t(g));
    } else {  // attention's range, with masked rows
        for (size_t i = 0; i < size_t(g) * n; ++i) {
            scores.push_back(in.ConsumeIntegralInRange<int>(0, 15) == 0 ? -INFINITY
                                                                         : in.ConsumeFloatingPointInRange<float>(-60.0f, 60.0f));
        }
        for (int i = 0; i < g; ++i) offsets.push_back(in.ConsumeFloatingPointInRange<float>(-8.0f, 8.0f));
    }
    std::vector<detail::SoftmaxState> state0(g);
    if (in.ConsumeBool()) {  // a state from earlier blocks
        const auto st = raw ? raw_floats(in, 2 * size_t(g)) : std::vector<float>();
        for (int i = 0; i < g; ++i) {
            state0[i].max = raw ? st[2 * i] : in.ConsumeFloatingPointInRange<float>(-60.0f, 60.0f);
            state0[i].sum = raw ? st[2 * i + 1] : in.ConsumeFloatingPointInRange<float>(0.0f, 100.0f);
        }
    }
    const auto acc0 = raw_floats(in, size_t(g) * d);
    const float* off = with_offsets ? offsets.data() : nullptr;

    std::vector<float> ws = scores, wa = acc0;
    std::vector<detail::SoftmaxState> sw = state0;
    detail::softmax_update_scalar(ws.data(), g, n, off, scale, sw.data(), wa.data(), d);
    // A query with a NaN among its inputs: its block max may take the NaN or skip it, by lane order.
    std::vector<bool> nan_in(g, std::isnan(scale));
    for (int i = 0; i < g; ++i) {
        nan_in[i] = nan_in[i] || std::isnan(state0[i].max) || std::isnan(state0[i].sum) || (off && std::isnan(off[i]));
        for (size_t r = 0; r < n; ++r) nan_in[i] = nan_in[i] || std::isnan(scores[i * n + r]);
    }
    for (SimdLevel level : available_simd_levels()) {
        const detail::SoftmaxUpdate update = detail::level_softmax(level);
        if (!update) continue;
        std::vector<float> gs = scores, ga = acc0;
        std::vector<detail::SoftmaxState> sg = state0;
        update(gs.data(), g, n, off, scale, sg.data(), ga.data(), d);
        const std::string at = "softmax at " + std::string(simd_level_name(level));
        for (int i = 0; i < g; ++i) {
            if (nan_in[i]) {
                require(std::isnan(sw[i].sum) == std::isnan(sg[i].sum), at + ": a NaN sum at one level only");
                continue;
            }
            require(same_bits(sg[i].max, sw[i].max) && same_bits(sg[i].sum, sw[i].sum),
                    at + ": the state differs from the specification's");
            for (size_t r = 0; r < n; ++r) {
                require(same_bits(gs[i * n + r], ws[i * n + r]), at + ": a weight differs from the specification's");
            }
            for (int j = 0; j < d; ++j) {
                require(same_bits(ga[i * d + j], wa[i * d + j]), at + ": the rescaled accumulator differs");
            }
        }
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
        case 0: check_key_groups(in); break;
        case 1: check_weight_grid(in); break;
        default: check_softmax(in); break;
    }
    return 0;
}
