#include "thread_pool.hpp"

#include <algorithm>

namespace kvq::detail {

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
    if (job->next == job->n_parts) queue_.erase(std::find(queue_.begin(), queue_.end(), job));
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
        ++job.done;
    }
    // A worker touches the job only under mu_, and its last touch is ++done; once done == n_parts
    // (seen under mu_), no worker will touch it again and it may leave the stack.
    done_cv_.wait(lock, [&] { return job.done == job.n_parts; });
}

void ThreadPool::worker_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        Job* job = nullptr;
        work_cv_.wait(lock, [&] { return stop_ || (job = job_for_worker_locked()) != nullptr; });
        if (stop_) return;
        const int i = take_part_locked(job);
        ++job->helpers;
        lock.unlock();
        job->call(job->fn, i);
        lock.lock();
        --job->helpers;
        if (++job->done == job->n_parts) done_cv_.notify_all();
    }
}

ThreadPool& shared_pool() {
    static ThreadPool pool(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) - 1));
    return pool;
}

}  // namespace kvq::detail
