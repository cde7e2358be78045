// Per-sequence reader/writer locks for the Python KVCache. The C++ cache lets different sequences be used
// from different threads at once but leaves overlapping use of one sequence undefined; Python threads
// cannot be trusted to keep that rule, so the binding enforces it: attends of a sequence share its lock,
// appends, truncation, forks and removal take it alone. Waiting happens with the GIL released.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>

#include "kvq/cache.hpp"

namespace kvq::python {

class SequenceLocks {
public:
    // The lock of a sequence (nullptr for an id the cache never gave out: the cache itself rejects it).
    std::shared_ptr<std::shared_mutex> find(SequenceId seq) {
        std::lock_guard guard(mutex_);
        auto it = locks_.find(seq);
        return it == locks_.end() ? nullptr : it->second;
    }
    void add(SequenceId seq) {
        std::lock_guard guard(mutex_);
        locks_.emplace(seq, std::make_shared<std::shared_mutex>());
    }
    void erase(SequenceId seq) {
        std::lock_guard guard(mutex_);
        locks_.erase(seq);
    }

private:
    std::mutex mutex_;
    std::map<SequenceId, std::shared_ptr<std::shared_mutex>> locks_;
};

// Holds a sequence's lock, shared or exclusive, for one call.
class SequenceGuard {
public:
    enum Mode { reader, writer };
    SequenceGuard(SequenceLocks& locks, SequenceId seq, Mode mode) : lock_(locks.find(seq)), mode_(mode) {
        if (!lock_) return;
        if (mode_ == reader) lock_->lock_shared();
        else lock_->lock();
    }
    ~SequenceGuard() {
        if (!lock_) return;
        if (mode_ == reader) lock_->unlock_shared();
        else lock_->unlock();
    }
    SequenceGuard(const SequenceGuard&) = delete;
    SequenceGuard& operator=(const SequenceGuard&) = delete;

private:
    std::shared_ptr<std::shared_mutex> lock_;
    Mode mode_;
};

}  // namespace kvq::python
