// The cache's memory: fixed-size blocks with reference counts, allocated up front or in chunks.
//
// Blocks never move once allocated (a chunk is one allocation that lives as long as the pool), so a
// sequence may keep raw pointers to its blocks and read them without taking the pool's lock while other
// threads allocate. Every method takes the lock once per call, never per token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kvq/cache.hpp"

namespace kvq::detail {

using BlockId = uint32_t;

// A block as a block table holds it: its bytes and its id in the pool.
struct BlockRef {
    uint8_t* data = nullptr;
    BlockId id = 0;
};

class BlockPool {
public:
    static constexpr size_t kAlignment = 64;  // cache line; blocks start on one

    BlockPool(size_t block_bytes, size_t max_blocks, size_t initial_blocks, size_t grow_blocks);
    BlockPool(const BlockPool&) = delete;
    BlockPool& operator=(const BlockPool&) = delete;

    size_t block_bytes() const { return block_bytes_; }

    // Takes n fresh blocks (reference count 1). `release` lists blocks the caller gives up in the same
    // operation; blocks that reach a count of zero that way count as free for this request. All or
    // nothing: if the pool cannot provide n blocks it throws PoolExhausted and changes nothing
    // (the blocks in `release` keep their counts). Growing may throw std::bad_alloc, also changing nothing.
    // The pool grows by at least grow_blocks, or with `exact` by just the blocks missing (loading a file).
    std::vector<BlockRef> allocate(size_t n, std::span<const BlockRef> release = {}, bool exact = false);
    // Counts n blocks' worth of memory that lives outside the pool (the float staging of open blocks)
    // against max_blocks: all or nothing, PoolExhausted if the pool cannot spare them. unreserve gives
    // them back.
    void reserve(size_t n);
    void unreserve(size_t n);
    // One more reference to each block (fork).
    void retain(std::span<const BlockRef> blocks);
    // One reference fewer; a block whose count reaches zero returns to the free list.
    void release(std::span<const BlockRef> blocks);
    // True if more than one block table holds the block (so it must be copied before a write).
    bool is_shared(BlockId id) const;
    uint32_t ref_count(BlockId id) const;

    PoolStats stats() const;
    size_t blocks_used() const;

private:
    size_t free_capacity_locked() const;  // free blocks plus blocks the pool may still grow by
    void grow_locked(size_t n);  // adds exactly n blocks
    void release_locked(std::span<const BlockRef> blocks);

    const size_t block_bytes_;
    const size_t max_blocks_;
    const size_t grow_blocks_;

    mutable std::mutex mu_;
    struct AlignedFree {
        void operator()(uint8_t* p) const;
    };
    std::vector<std::unique_ptr<uint8_t[], AlignedFree>> chunks_;
    std::vector<uint8_t*> data_;      // by id
    std::vector<uint32_t> refs_;      // by id
    std::vector<BlockId> free_;       // ids with refs_ == 0, taken from the back
    size_t shared_ = 0;               // blocks with refs_ > 1
    size_t reserved_ = 0;             // block-sized units counted for memory outside the pool
};

}  // namespace kvq::detail
