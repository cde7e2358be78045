// Shared helpers of the sweep's tests (test_sweep.cpp, test_sweep_latent.cpp): one data set's sweep and
// its row of a K/V pair.
#ifndef KVQ_TESTS_SWEEP_ROWS_HPP
#define KVQ_TESTS_SWEEP_ROWS_HPP

#include <stdexcept>
#include <string>

#include "kvq/research/sweep.hpp"

namespace kvq::test {

// The sweep of one data set spec over a comma-separated list of pairs (empty: the default pairs), decode
// time of one sample each if timed.
inline SweepResult sweep(const std::string& data, const std::string& pairs, bool timing = false) {
    SweepOptions o;
    if (!pairs.empty()) o.formats = parse_kv_formats(pairs);
    o.timing = timing;
    o.timing_repeats = 1;
    return run_sweep({make_dataset(data)}, o);
}

inline const SweepRow& row(const SweepResult& r, const std::string& label) {
    for (const auto& x : r.rows) {
        if (x.format.label() == label) return x;
    }
    throw std::logic_error("no row " + label);
}

}  // namespace kvq::test

#endif  // KVQ_TESTS_SWEEP_ROWS_HPP
