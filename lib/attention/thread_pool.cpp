#include "thread_pool.hpp"

#include <algorithm>
#include <functional>
#include <memory>
#include <string>

#include "kvq/errors.hpp"

namespace kvq::detail {
namespace {

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

// Spins until ready() or `limit` has passed; true if ready. It yields now and then, so that where
// threads outnumber cores a spinning thread gives its core to one with work (a worker running the very
// part it waits for).
template <class F>
bool spin_until(F&& ready, std::chrono::microseconds limit) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
        for (int i = 0; i < 64; ++i) {
            if (ready()) return true;
            cpu_relax();
        }
        if (std::chrono::steady_clock::now() >= end) return ready();
        std::this_thread::yield();
    }
}

}  // namespace

ThreadPool::ThreadPool(int workers) {
    queue_.reserve(64);
    threads_.reserve(std::max(workers, 0));
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
}

int ThreadPool::take_part_locked(Job* job) {
    const int i = job->next++;
    if (job->next == job->n_parts) {
        queue_.erase(std::find(queue_.begin(), queue_.end(), job));
        queued_.store(static_cast<int>(queue_.size()), std::memory_order_relaxed);
    }
    return i;
}

ThreadPool::Job* ThreadPool::job_for_worker_locked() {
    for (Job* job : queue_) {
        if (job->helpers < job->max_helpers) return job;
    }
    return nullptr;
}

void ThreadPool::run_erased(int n_parts, void* fn, void (*call)(void*, int), int max_helpers) {
    if (n_parts <= 0) return;
    if (n_parts == 1 || threads_.empty() || max_helpers <= 0) {
        for (int i = 0; i < n_parts; ++i) call(fn, i);
        return;
    }
    Job job{fn, call, n_parts, max_helpers};
    std::unique_lock<std::mutex> lock(mu_);
    queue_.push_back(&job);
    queued_.store(static_cast<int>(queue_.size()), std::memory_order_relaxed);
    // One wake-up per part the caller will not take first; extra wake-ups only cost a spurious check.
    const int wake = std::min(n_parts - 1, max_helpers);
    if (wake >= workers()) {
        work_cv_.notify_all();
    } else {
        for (int i = 0; i < wake; ++i) work_cv_.notify_one();
    }
    while (job.next < job.n_parts) {
        const int i = take_part_locked(&job);
        lock.unlock();
        call(fn, i);
        lock.lock();
        job.done.fetch_add(1, std::memory_order_release);
    }
    // A worker's last touch of the job is its increment of done; once done == n_parts, no worker will
    // touch it again and it may leave the stack.
    lock.unlock();
    const auto all_done = [&] { return job.done.load(std::memory_order_acquire) == n_parts; };
    if (spin_until(all_done, kCallerSpin)) return;
    lock.lock();
    done_cv_.wait(lock, all_done);
}

void ThreadPool::worker_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        Job* job = nullptr;
        if (!stop_ && !(job = job_for_worker_locked())) {  // spin a while for the next job, then sleep
            lock.unlock();
            if (spinners_.fetch_add(1, std::memory_order_relaxed) < kMaxSpinners) {
                spin_until([&] { return queued_.load(std::memory_order_relaxed) > 0; }, kWorkerSpin);
            }
            spinners_.fetch_sub(1, std::memory_order_relaxed);
            lock.lock();
        }
        work_cv_.wait(lock, [&] { return stop_ || (job = job_for_worker_locked()) != nullptr; });
        if (stop_) return;
        const int i = take_part_locked(job);
        ++job->helpers;
        lock.unlock();
        job->call(job->fn, i);
        lock.lock();
        --job->helpers;
        const int n_parts = job->n_parts;
        if (job->done.fetch_add(1, std::memory_order_release) + 1 == n_parts) done_cv_.notify_all();
    }
}

ThreadPool& shared_pool() {
    static ThreadPool pool(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1));
    return pool;
}

void run_checked(const Executor& ex, int n, const std::function<void(int)>& task) {
    enum : uint8_t { not_run, running, done };
    // The tasks' states: on the stack up to kOnStack tasks (a decode step's parts), so that a call through
    // an engine's executor allocates nothing; the checked task captures one pointer (std::function keeps
    // it in place).
    constexpr int kOnStack = 1024;
    std::atomic<uint8_t> on_stack[kOnStack];
    std::unique_ptr<std::atomic<uint8_t>[]> on_heap;
    if (n > kOnStack) on_heap = std::make_unique<std::atomic<uint8_t>[]>(static_cast<size_t>(n));
    struct Check {
        std::atomic<uint8_t>* state;
        int n;
        const std::function<void(int)>* task;
        std::atomic<int> out_of_range{0}, twice{0};
        std::atomic<long long> bad_index{0};
    } c{on_heap ? on_heap.get() : on_stack, n, &task};
    for (int i = 0; i < n; ++i) c.state[i].store(not_run, std::memory_order_relaxed);
    const std::function<void(int)> checked = [p = &c](int i) {
        if (i < 0 || i >= p->n) {
            if (!p->out_of_range.fetch_add(1)) p->bad_index = i;
            return;
        }
        uint8_t expected = not_run;
        if (!p->state[i].compare_exchange_strong(expected, running, std::memory_order_acquire)) {
            if (!p->twice.fetch_add(1)) p->bad_index = i;
            return;
        }
        (*p->task)(i);
        p->state[i].store(done, std::memory_order_release);
    };
    ex(n, checked);
    int never = -1;
    for (int i = 0; i < n; ++i) {
        uint8_t s = c.state[i].load(std::memory_order_acquire);
        while (s == running) {  // returned early: this task still runs on another thread
            std::this_thread::yield();
            s = c.state[i].load(std::memory_order_acquire);
        }
        if (s == not_run && never < 0) never = i;
    }
    if (!c.out_of_range && !c.twice && never < 0) return;
    const std::string of = " of " + std::to_string(n) + " tasks";
    if (c.out_of_range) {
        throw ExecutorError("executor: called the task with index " + std::to_string(c.bad_index.load()) +
                            ", outside 0.." + std::to_string(n - 1) + of);
    }
    if (c.twice) throw ExecutorError("executor: ran task " + std::to_string(c.bad_index.load()) + of + " more than once");
    throw ExecutorError("executor: returned without running task " + std::to_string(never) + of);
}

}  // namespace kvq::detail
