// A small persistent thread pool for splitting attention calls across threads, shared by every cache of
// the process (shared_pool()).
//
// run() may be called from several threads at once (each attend() of a different sequence): jobs queue up
// and workers take parts from the first job that still admits a helper. The calling thread takes parts of
// its own job too, so a job always finishes even when every worker is busy with another caller's job;
// waking a sleeping worker therefore never sits on the critical path of a short job. A job runs on at
// most max_threads threads at once, the caller included, so a cache configured for 2 threads uses 2 of a
// larger shared pool.
//
// Waiting spins briefly before it sleeps: a caller whose parts are done waits for the workers' last
// parts (up to kCallerSpin), and a worker that finds no job waits for the next (up to kWorkerSpin, and
// at most kMaxSpinners workers at once, so that a job does not draw every recently busy worker of a
// large pool to the lock), each on an atomic, then on the condition variable (measured on a 2-core
// Zen 4 VM: a condition variable's wake-up took about 25 µs there, twice per call, against a 4k-token
// decode step's 340 µs on two threads).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include "kvq/attention.hpp"  // Executor

namespace kvq::detail {

// Runs an engine's executor and checks that it kept its contract (kvq/cache.hpp, Executor): each task
// index in [0, n) run exactly once, all of them done when it returns. An index out of range or one run
// a second time is not run (the second call would race the first on the same buffers); an index never
// run leaves output unwritten. Each is an ExecutorError once the executor returns, after any task it
// left running has finished.
void run_checked(const Executor& ex, int n, const std::function<void(int)>& task);

class ThreadPool {
public:
    explicit ThreadPool(int workers);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int workers() const { return static_cast<int>(threads_.size()); }

    // Calls task(i) once for every i in [0, n_parts), on the calling thread and on up to max_threads − 1
    // workers at a time, and returns when all calls have returned. The task must not throw.
    template <class F>
    void run(int n_parts, F&& task, int max_threads = 1 << 30) {
        using Fn = std::remove_reference_t<F>;
        run_erased(n_parts, const_cast<void*>(static_cast<const void*>(&task)),
                   [](void* f, int i) { (*static_cast<Fn*>(f))(i); }, max_threads - 1);
    }

private:
    struct Job {
        void* fn;
        void (*call)(void*, int);
        int n_parts;
        int max_helpers;  // workers that may run parts at once
        int helpers = 0;  // workers running a part now (under mu_)
        int next = 0;     // next part to hand out (under mu_)
        // Parts finished: written under mu_, read by the spinning caller without it. A worker's increment
        // is its last touch of the job, which may leave the caller's stack as soon as the count is full.
        std::atomic<int> done{0};
    };

    // How long a waiting caller spins for its job's last parts (about one part of a 4k-token step), and
    // a worker for the next job; how many workers may spin at once.
    static constexpr std::chrono::microseconds kCallerSpin{100}, kWorkerSpin{30};
    static constexpr int kMaxSpinners = 2;

    void run_erased(int n_parts, void* fn, void (*call)(void*, int), int max_helpers);
    // The first queued job that admits another helper, or null (under mu_).
    Job* job_for_worker_locked();
    void worker_loop();
    // Hands out the next part of `job` (under mu_), removing the job from the queue once all are out.
    int take_part_locked(Job* job);

    std::mutex mu_;
    std::condition_variable work_cv_;  // workers wait for jobs
    std::condition_variable done_cv_;  // callers wait for their parts to finish
    // Jobs in arrival order. A vector, not a deque: its capacity only grows, so once it has held as many
    // jobs at once as a process ever queues, queuing allocates nothing (a deque allocates and frees chunks
    // as jobs come and go, which put an allocation on one decode step in four).
    std::vector<Job*> queue_;
    std::atomic<int> queued_{0};    // queue_.size(), for workers spinning without the lock
    std::atomic<int> spinners_{0};  // workers spinning now
    bool stop_ = false;
    std::vector<std::thread> threads_;
};

// The process's pool: hardware threads − 1 workers (at least one), made on first use.
ThreadPool& shared_pool();

}  // namespace kvq::detail
