// The shared thread pool (lib/attention/thread_pool.hpp): every part of a job runs exactly once, its
// writes are visible to the caller when run() returns (whether the caller saw the last part finish while
// spinning or after sleeping), and a job never runs on more threads than asked, with several callers at
// once. Part of the "concurrency" suite that scripts/sanitize.sh runs under ThreadSanitizer, which checks
// the happens-before edges the spinning waits rely on.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "attention/thread_pool.hpp"

TEST_SUITE("concurrency") {
    TEST_CASE("the thread pool runs every part once, from several callers, and the caller sees the parts' writes") {
        kvq::detail::ThreadPool pool(3);
        constexpr int kCallers = 3, kJobs = 40;
        std::vector<std::thread> callers;
        std::vector<int> failures(kCallers, 0);
        for (int c = 0; c < kCallers; ++c) {
            callers.emplace_back([&, c] {
                for (int j = 0; j < kJobs; ++j) {
                    const int n_parts = 1 + (j * 7 + c) % 17, max_threads = 1 + (j + c) % 4;
                    std::vector<int> runs(n_parts, 0);  // plain ints: written by the parts, read after run()
                    std::atomic<int> running{0}, most{0};
                    pool.run(n_parts, [&](int i) {
                        const int now = running.fetch_add(1) + 1;
                        int seen = most.load();
                        while (now > seen && !most.compare_exchange_weak(seen, now)) {
                        }
                        // Parts of different lengths, some longer than the waits' spin, so both the
                        // spinning and the sleeping waits are taken.
                        if (i % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(i % 2 ? 50 : 400));
                        ++runs[i];
                        running.fetch_sub(1);
                    }, max_threads);
                    for (int i = 0; i < n_parts; ++i) failures[c] += runs[i] != 1;
                    failures[c] += most.load() > max_threads;
                }
            });
        }
        for (auto& t : callers) t.join();
        for (int c = 0; c < kCallers; ++c) CHECK(failures[c] == 0);
    }
}
