// Concurrency: what kvq promises may run at once does, with the same results as one thread. These tests
// form the doctest suite "concurrency", which scripts/sanitize.sh runs under ThreadSanitizer.
#include <doctest/doctest.h>

#include <thread>
#include <vector>

#include "kvq/codec.hpp"
#include "test_util.hpp"

TEST_SUITE("concurrency") {

TEST_CASE("one Codec is used from several threads at once with the same results as from one") {
    const int d = 128, n = 64, threads = 4;
    const auto x = kvq::test::gaussian(size_t(n) * d, 81);
    const auto q = kvq::test::gaussian(size_t(2) * d, 82);
    const auto w = kvq::test::gaussian(size_t(2) * n, 83);
    for (const char* spec : {"f16", "q8_0", "q4_0+rot"}) {
        CAPTURE(spec);
        const auto c = kvq::Codec::make(spec, d);
        struct Result {
            std::vector<uint8_t> rows, prep;
            std::vector<float> scores, acc;
        };
        auto work = [&](Result& r) {
            r.rows.resize(n * c.row_bytes());
            r.prep.resize(2 * c.query_bytes());
            r.scores.resize(2 * n);
            r.acc.assign(2 * d, 0.0f);
            for (int rep = 0; rep < 8; ++rep) {
                c.quantize_rows(x.data(), n, r.rows.data());
                c.prepare_queries(q.data(), 2, r.prep.data());
                c.score_rows(r.prep.data(), 2, r.rows.data(), n, r.scores.data(), n);
            }
            c.accumulate_rows(w.data(), n, 2, r.rows.data(), n, r.acc.data());
            c.finish_accumulate(r.acc.data(), 2);
        };
        Result alone;
        work(alone);
        std::vector<Result> results(threads);
        std::vector<std::thread> pool;
        for (int t = 0; t < threads; ++t) pool.emplace_back(work, std::ref(results[t]));
        for (auto& t : pool) t.join();
        for (const auto& r : results) {
            CHECK(r.rows == alone.rows);
            CHECK(r.prep == alone.prep);
            CHECK(r.scores == alone.scores);
            CHECK(r.acc == alone.acc);
        }
    }
}

TEST_CASE("codecs are made from several threads at once") {
    std::vector<std::thread> pool;
    std::vector<size_t> bytes(4);
    for (int t = 0; t < 4; ++t) {
        pool.emplace_back([&, t] {
            for (const auto& name : kvq::codec_names()) bytes[t] += kvq::Codec::make(name + "+rot", 64).row_bytes();
        });
    }
    for (auto& t : pool) t.join();
    for (size_t b : bytes) CHECK(b == bytes[0]);
    CHECK(bytes[0] > 0);
}

}  // TEST_SUITE
