// Fuzz target: arbitrary floats (raw bits: NaN, Inf, subnormals, huge values; or scaled ranges that
// hit every codec's grid) quantized by every codec in the table, plain and +rot, at every SIMD level,
// under both NaN policies. Properties:
// - NanPolicy::reject throws exactly when a value is NaN/Inf or a row is beyond input_limit(), and then
//   writes nothing; otherwise every row round-trips within the codec's bound (tests/codec_bounds.hpp)
//   and reads back finite;
// - NanPolicy::propagate never throws, stores the same bytes as reject for rows reject accepts, and a
//   row holding NaN/Inf reads back with non-finite values;
// - quantize and prepare_queries give the same bytes at every SIMD level.
#include <cfloat>

#include "codec_bounds.hpp"
#include "fuzz_common.hpp"

using namespace kvq;
using namespace kvq::fuzz;

namespace {

std::vector<float> make_row(FuzzedDataProvider& in, int d) {
    switch (in.ConsumeIntegralInRange<int>(0, 2)) {
        case 0: return raw_floats(in, d);
        case 1: {
            const float scale = std::pow(10.0f, float(in.ConsumeIntegralInRange<int>(-45, 38)));
            std::vector<float> x(d);
            for (float& v : x) v = in.ConsumeFloatingPointInRange<float>(-1.0f, 1.0f) * scale;
            return x;
        }
        default: {
            static const float special[] = {0.0f, -0.0f, 1.0f, -1.0f, 1e-45f, FLT_MIN, 1e-39f, 65504.0f, 65520.0f,
                                            8319008.0f, 524032.0f, 1e20f, FLT_MAX, -FLT_MAX, NAN, INFINITY, -INFINITY};
            std::vector<float> x(d);
            for (float& v : x) v = special[in.ConsumeIntegralInRange<size_t>(0, std::size(special) - 1)];
            return x;
        }
    }
}

// What reject must do with these rows: the problem, or empty if they are acceptable.
bool acceptable(const Codec& c, const std::vector<float>& x, size_t n_rows) {
    const int d = c.head_dim();
    const InputLimit limit = c.input_limit();
    for (size_t r = 0; r < n_rows; ++r) {
        double amax = 0, norm = 0;
        for (int j = 0; j < d; ++j) {
            const float v = x[r * d + j];
            if (!std::isfinite(v)) return false;
            amax = std::max(amax, std::fabs(double(v)));
            norm += double(v) * v;
        }
        if ((limit.on_norm ? std::sqrt(norm) : amax) > limit.max_abs) return false;
    }
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    const auto codec = pick_codec(in);
    if (!codec) return 0;
    const Codec& c = *codec;
    const int d = c.head_dim();
    const size_t n_rows = in.ConsumeIntegralInRange<size_t>(1, 3);
    std::vector<float> x;
    for (size_t r = 0; r < n_rows; ++r) {
        const auto row = make_row(in, d);
        x.insert(x.end(), row.begin(), row.end());
    }
    const bool accept = acceptable(c, x, n_rows);
    const size_t rb = c.row_bytes();

    std::vector<uint8_t> first_reject, first_propagate, first_prep;
    at_every_simd_level([&](SimdLevel level) {
        const std::string at = c.name() + " at " + std::string(simd_level_name(level));
        std::vector<uint8_t> rejected(n_rows * rb, 0xA5);
        bool threw = false;
        try {
            c.quantize_rows(x.data(), n_rows, rejected.data());
        } catch (const std::invalid_argument&) {
            threw = true;
        }
        require(threw != accept, at + (accept ? ": rejected acceptable rows" : ": accepted rows it must reject"));
        if (threw) {
            for (uint8_t b : rejected) require(b == 0xA5, at + ": wrote bytes before throwing");
        } else {
            std::vector<float> back(n_rows * d);
            c.dequantize_rows(rejected.data(), n_rows, back.data());
            for (size_t r = 0; r < n_rows; ++r) {
                const std::string why = test::check_round_trip(c, x.data() + r * d, back.data() + r * d);
                require(why.empty(), at + ": " + why);
            }
            if (first_reject.empty()) first_reject = rejected;
            require(rejected == first_reject, at + ": quantize bytes differ from the scalar level");
        }

        std::vector<uint8_t> propagated(n_rows * rb);
        c.quantize_rows(x.data(), n_rows, propagated.data(), 0, NanPolicy::propagate);  // must not throw
        if (!threw) require(propagated == rejected, at + ": propagate stored other bytes for acceptable rows");
        if (first_propagate.empty()) first_propagate = propagated;
        require(propagated == first_propagate, at + ": propagate bytes differ from the scalar level");
        std::vector<float> back(n_rows * d);
        c.dequantize_rows(propagated.data(), n_rows, back.data());
        for (size_t r = 0; r < n_rows; ++r) {
            bool bad_in = false, bad_out = false;
            for (int j = 0; j < d; ++j) {
                bad_in = bad_in || !std::isfinite(x[r * d + j]);
                bad_out = bad_out || !std::isfinite(back[r * d + j]);
            }
            require(!bad_in || bad_out, at + ": a row with NaN/Inf read back all finite under propagate");
        }

        // The same floats as queries.
        std::vector<uint8_t> prep(n_rows * c.query_bytes(), 0x5A);
        bool finite = true;
        for (float v : x) finite = finite && std::isfinite(v);
        try {
            c.prepare_queries(x.data(), int(n_rows), prep.data());
            require(finite, at + ": prepared a non-finite query under reject");
        } catch (const std::invalid_argument&) {
            require(!finite, at + ": refused a finite query");
            for (uint8_t b : prep) require(b == 0x5A, at + ": wrote a prepared query before throwing");
            c.prepare_queries(x.data(), int(n_rows), prep.data(), NanPolicy::propagate);
        }
        if (first_prep.empty()) first_prep = prep;
        require(prep == first_prep, at + ": prepared query bytes differ from the scalar level");
    });
    return 0;
}
