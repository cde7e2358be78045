// Buffers a call keeps while its parts run, leased per call rather than kept per thread.
//
// A thread_local buffer is not safe there: an engine's executor may run other work on the calling thread
// while the call waits for its parts (work-stealing pools do), and that work may be another kvq call, which
// would take the same buffer from under the first (issue #36). Each call leases a buffer of its own; it
// returns to the pool when the call ends, grown to what the call needed, and the pool frees them all when
// it goes (a cache's pools go with the cache). The pool holds at most as many buffers as calls ran at once.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

namespace kvq::detail {

template <class T>
class ScratchPool {
public:
    class Lease {
    public:
        explicit Lease(ScratchPool& pool) : pool_(pool), item_(pool.take()) {}
        ~Lease() { pool_.give_back(std::move(item_)); }
        Lease(const Lease&) = delete;
        Lease& operator=(const Lease&) = delete;
        T& operator*() const { return *item_; }
        T* operator->() const { return item_.get(); }

    private:
        ScratchPool& pool_;
        std::unique_ptr<T> item_;
    };

    Lease lease() { return Lease(*this); }

    // Buffers made so far (each either leased or free).
    size_t made() const {
        std::lock_guard<std::mutex> lock(mu_);
        return made_;
    }

private:
    std::unique_ptr<T> take() {
        std::lock_guard<std::mutex> lock(mu_);
        if (!free_.empty()) {
            std::unique_ptr<T> item = std::move(free_.back());
            free_.pop_back();
            return item;
        }
        free_.reserve(made_ + 1);  // give_back never allocates
        auto item = std::make_unique<T>();
        ++made_;
        return item;
    }
    void give_back(std::unique_ptr<T> item) noexcept {
        std::lock_guard<std::mutex> lock(mu_);
        free_.push_back(std::move(item));
    }

    mutable std::mutex mu_;
    std::vector<std::unique_ptr<T>> free_;
    size_t made_ = 0;
};

}  // namespace kvq::detail
