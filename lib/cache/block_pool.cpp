#include "block_pool.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <string>

namespace kvq::detail {

void BlockPool::AlignedFree::operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(kAlignment)); }

BlockPool::BlockPool(size_t block_bytes, size_t max_blocks, size_t initial_blocks, size_t grow_blocks)
    : block_bytes_((block_bytes + kAlignment - 1) / kAlignment * kAlignment),
      max_blocks_(max_blocks),
      grow_blocks_(std::max<size_t>(grow_blocks, 1)) {
    if (initial_blocks > 0) grow_locked(initial_blocks);
}

size_t BlockPool::free_capacity_locked() const {
    if (max_blocks_ == 0) return std::numeric_limits<size_t>::max();
    const size_t taken = data_.size() - free_.size() + reserved_;
    return taken >= max_blocks_ ? 0 : max_blocks_ - taken;
}

void BlockPool::reserve(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    const size_t capacity = free_capacity_locked();
    if (capacity != std::numeric_limits<size_t>::max() && capacity < n) {
        throw PoolExhausted("KV cache pool exhausted: an open block's float staging needs the memory of " +
                            std::to_string(n) + " block(s) but only " + std::to_string(capacity) +
                            " are available (max_blocks = " + std::to_string(max_blocks_) + ", " +
                            std::to_string(data_.size() - free_.size()) + " in use, " + std::to_string(reserved_) +
                            " held by staging); nothing was changed");
    }
    reserved_ += n;
}

void BlockPool::unreserve(size_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ -= std::min(n, reserved_);
}

void BlockPool::grow_locked(size_t n) {
    if (data_.size() + n > std::numeric_limits<BlockId>::max() || n > std::numeric_limits<size_t>::max() / block_bytes_) {
        throw std::bad_alloc();
    }
    // Reserve everything first so that nothing below can fail after the chunk is in place.
    data_.reserve(data_.size() + n);
    refs_.reserve(refs_.size() + n);
    free_.reserve(free_.size() + n);
    chunks_.reserve(chunks_.size() + 1);
    std::unique_ptr<uint8_t[], AlignedFree> chunk(
        static_cast<uint8_t*>(::operator new[](n * block_bytes_, std::align_val_t(kAlignment))));
    uint8_t* base = chunk.get();
    chunks_.push_back(std::move(chunk));
    // Newest ids at the front of the free list, so blocks are handed out lowest id first.
    std::vector<BlockId> fresh;
    for (size_t i = 0; i < n; ++i) {
        fresh.push_back(static_cast<BlockId>(data_.size()));
        data_.push_back(base + i * block_bytes_);
        refs_.push_back(0);
    }
    free_.insert(free_.begin(), fresh.rbegin(), fresh.rend());
}

std::vector<BlockRef> BlockPool::allocate(size_t n, std::span<const BlockRef> release, bool exact) {
    std::lock_guard<std::mutex> lock(mu_);
    size_t freed_by_release = 0;
    for (const BlockRef& b : release) freed_by_release += refs_[b.id] == 1;
    const size_t capacity = free_capacity_locked();
    if (capacity != std::numeric_limits<size_t>::max() && capacity + freed_by_release < n) {
        throw PoolExhausted("KV cache pool exhausted: the operation needs " + std::to_string(n) +
                            " new block(s) but only " + std::to_string(capacity + freed_by_release) +
                            " are available (max_blocks = " + std::to_string(max_blocks_) +
                            ", " + std::to_string(data_.size() - free_.size()) + " in use); nothing was changed");
    }
    std::vector<BlockRef> out;
    out.reserve(n);
    // Growing is the one step that can fail (bad_alloc); it happens before anything is released.
    const size_t free_after_release = free_.size() + freed_by_release;
    if (free_after_release < n) {
        size_t grow = exact ? n - free_after_release : std::max(n - free_after_release, grow_blocks_);
        if (max_blocks_ != 0) grow = std::min(grow, max_blocks_ - data_.size());
        grow_locked(grow);
    }
    release_locked(release);
    for (size_t i = 0; i < n; ++i) {
        const BlockId id = free_.back();
        free_.pop_back();
        refs_[id] = 1;
        // Fresh blocks start zeroed: rows not yet written and padding hold no stale data from an
        // earlier sequence, so the same appends always give the same bytes.
        std::memset(data_[id], 0, block_bytes_);
        out.push_back({data_[id], id});
    }
    return out;
}

void BlockPool::retain(std::span<const BlockRef> blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const BlockRef& b : blocks) {
        if (refs_[b.id]++ == 1) ++shared_;
    }
}

void BlockPool::release(std::span<const BlockRef> blocks) {
    std::lock_guard<std::mutex> lock(mu_);
    release_locked(blocks);
}

void BlockPool::release_locked(std::span<const BlockRef> blocks) {
    for (const BlockRef& b : blocks) {
        const uint32_t r = --refs_[b.id];
        if (r == 1) --shared_;
        if (r == 0) free_.push_back(b.id);
    }
}

bool BlockPool::is_shared(BlockId id) const { return ref_count(id) > 1; }

uint32_t BlockPool::ref_count(BlockId id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return refs_[id];
}

size_t BlockPool::blocks_used() const {
    std::lock_guard<std::mutex> lock(mu_);
    return data_.size() - free_.size();
}

PoolStats BlockPool::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    PoolStats s;
    s.block_bytes = block_bytes_;
    s.blocks_total = data_.size();
    s.blocks_used = data_.size() - free_.size();
    s.blocks_shared = shared_;
    s.max_blocks = max_blocks_;
    s.blocks_reserved = reserved_;
    return s;
}

}  // namespace kvq::detail
