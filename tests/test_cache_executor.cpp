// An engine's executor (CacheConfig::executor) as work-stealing pools are (issue #36): it may run other
// work between kvq's tasks on the calling thread, other kvq calls on other caches included, and each call
// must still give the results it gives alone. An executor that breaks its contract (a task never run, run
// twice, an index out of range) makes the call throw ExecutorError, never return stale output or crash.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "kvq/cache.hpp"
#include "kvq/errors.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SequenceId;

namespace {

CacheConfig executor_config(int threads) {
    CacheConfig cfg;
    cfg.n_layers = 1;
    cfg.n_kv_heads = 2;
    cfg.n_heads = 8;
    cfg.head_dim = 64;
    cfg.block_tokens = 16;
    cfg.threads = threads;
    return cfg;
}

// Sequences long enough that one attend is split into many parts.
std::vector<SequenceId> fill(KVCache& cache, uint64_t seed, size_t n_seqs) {
    std::vector<SequenceId> seqs;
    const size_t row = 2 * 64;
    for (size_t i = 0; i < n_seqs; ++i) {
        const size_t n = 300 + 211 * i;
        const auto k = kvq::test::gaussian(n * row, seed + i), v = kvq::test::gaussian(n * row, seed + 100 + i);
        seqs.push_back(cache.add_sequence());
        cache.append(0, seqs.back(), k.data(), v.data(), n);
    }
    return seqs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("an executor that runs another kvq call between the tasks of one, on the same thread: both results exact") {
    // The inner cache is of another shape, so that its call needs larger buffers than the outer one's.
    CacheConfig inner_cfg = executor_config(3);
    inner_cfg.n_heads = 16;
    KVCache reference(executor_config(3)), inner(inner_cfg);
    const auto ref_seqs = fill(reference, 1, 3), inner_seqs = fill(inner, 50, 4);
    const size_t vec = 8 * 64, inner_vec = 16 * 64;
    const auto q = kvq::test::gaussian(3 * vec, 7), inner_q = kvq::test::gaussian(4 * inner_vec, 8);
    std::vector<float> expected(q.size()), inner_expected(inner_q.size());
    reference.attend_batch(0, ref_seqs, q.data(), expected.data());
    inner.attend_batch(0, inner_seqs, inner_q.data(), inner_expected.data());

    // Before each task: a whole attend_batch (and an attend) of the inner cache, as a work-stealing pool
    // would run a job it stole; the inner cache runs on kvq's own pool.
    int nested = 0;
    bool inner_exact = true;
    CacheConfig outer_cfg = executor_config(3);
    outer_cfg.executor = [&](int n, const std::function<void(int)>& task) {
        for (int i = 0; i < n; ++i) {
            std::vector<float> got(inner_q.size()), one(inner_vec);
            inner.attend_batch(0, inner_seqs, inner_q.data(), got.data());
            inner.attend(0, inner_seqs[1], inner_q.data() + inner_vec, one.data());
            inner_exact &= same_bits(got, inner_expected) &&
                           std::memcmp(one.data(), inner_expected.data() + inner_vec, inner_vec * sizeof(float)) == 0;
            ++nested;
            task(i);
        }
    };
    KVCache outer(outer_cfg);
    const auto seqs = fill(outer, 1, 3);
    std::vector<float> got(q.size());
    outer.attend_batch(0, seqs, q.data(), got.data());
    CHECK(nested > 3);
    CHECK(inner_exact);
    CHECK(same_bits(got, expected));
    std::vector<float> one(vec), one_expected(vec);
    outer.attend(0, seqs[2], q.data(), one.data());
    reference.attend(0, ref_seqs[2], q.data(), one_expected.data());
    CHECK(same_bits(one, one_expected));

    // And the outer cache's own call nested in its own executor (the same cache, another sequence).
    bool reentered = false;
    CacheConfig self_cfg = executor_config(3);
    KVCache* self = nullptr;
    std::vector<SequenceId> self_seqs;
    self_cfg.executor = [&](int n, const std::function<void(int)>& task) {
        for (int i = n - 1; i >= 0; --i) {
            if (!reentered) {
                reentered = true;  // one level deep
                std::vector<float> o(vec);
                self->attend(0, self_seqs[0], q.data(), o.data());
                std::vector<float> e(vec);
                reference.attend(0, ref_seqs[0], q.data(), e.data());
                CHECK(same_bits(o, e));
            }
            task(i);
        }
    };
    KVCache self_cache(self_cfg);
    self = &self_cache;
    self_seqs = fill(self_cache, 1, 3);
    std::vector<float> self_got(q.size());
    self_cache.attend_batch(0, self_seqs, q.data(), self_got.data());
    CHECK(reentered);
    CHECK(same_bits(self_got, expected));
}

TEST_CASE("an executor that breaks its contract: ExecutorError, not stale output") {
    KVCache reference(executor_config(2));
    const auto ref_seqs = fill(reference, 1, 2);
    const size_t vec = 8 * 64;
    const auto q = kvq::test::gaussian(2 * vec, 7);
    std::vector<float> expected(q.size());
    reference.attend_batch(0, ref_seqs, q.data(), expected.data());

    struct Broken {
        const char* name;
        kvq::Executor executor;
        const char* message;
    };
    const std::vector<Broken> broken = {
        {"skips the last task", [](int n, const std::function<void(int)>& t) { for (int i = 0; i + 1 < n; ++i) t(i); },
         "without running task"},
        {"runs nothing", [](int, const std::function<void(int)>&) {}, "without running task 0"},
        {"runs task 0 twice", [](int n, const std::function<void(int)>& t) { t(0); for (int i = 0; i < n; ++i) t(i); },
         "ran task 0"},
        {"passes n", [](int n, const std::function<void(int)>& t) { for (int i = 0; i <= n; ++i) t(i); }, "outside 0.."},
        {"passes -1", [](int n, const std::function<void(int)>& t) { t(-1); for (int i = 0; i < n; ++i) t(i); }, "index -1"},
    };
    for (const Broken& b : broken) {
        CAPTURE(b.name);
        CacheConfig cfg = executor_config(2);
        cfg.executor = b.executor;
        KVCache cache(cfg);
        const auto seqs = fill(cache, 1, 2);
        std::vector<float> out(q.size(), 0.0f);
        CHECK_THROWS_WITH_AS(cache.attend_batch(0, seqs, q.data(), out.data()), doctest::Contains(b.message),
                             kvq::ExecutorError);
        CHECK_THROWS_AS(cache.attend(0, seqs[1], q.data(), out.data()), kvq::ExecutorError);
        CHECK_THROWS_AS(cache.attend_prefill(0, seqs[1], q.data(), 2, out.data()), kvq::ExecutorError);
        // The cache is unharmed: the same call with a faithful executor afterwards is exact.
    }
    // A cache whose executor fails now and then keeps working between the failures.
    bool fail = true;
    CacheConfig cfg = executor_config(2);
    cfg.executor = [&](int n, const std::function<void(int)>& t) {
        for (int i = 0; i < n - (fail ? 1 : 0); ++i) t(i);
    };
    KVCache cache(cfg);
    const auto seqs = fill(cache, 1, 2);
    std::vector<float> out(q.size());
    CHECK_THROWS_AS(cache.attend_batch(0, seqs, q.data(), out.data()), kvq::ExecutorError);
    fail = false;
    cache.attend_batch(0, seqs, q.data(), out.data());
    CHECK(same_bits(out, expected));
}
