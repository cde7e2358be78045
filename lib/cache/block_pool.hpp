// The cache's memory: blocks with reference counts, in one size class per block layout of the cache
// (layers with other codecs have blocks of another size), under one limit in blocks and one in bytes.
//
// Each block is its own aligned allocation and never moves, so a sequence may keep raw pointers to its
// blocks and read them without taking the pool's lock while other threads allocate. A freed block stays
// allocated for reuse by its class; when another class (or float staging) needs the memory the limits
// leave no room for, free blocks of other classes are given back to the system first. So at every moment
// allocated blocks plus reserved staging stay within both limits. Every method takes the lock once per
// call, never per token.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
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

    // class_bytes: the block size of each class (rounded up to kAlignment); initial_blocks: blocks of each
    // class allocated up front. max_blocks and max_bytes: 0 = no limit.
    BlockPool(std::span<const size_t> class_bytes, size_t max_blocks, size_t max_bytes,
              std::span<const size_t> initial_blocks, size_t grow_blocks);
    ~BlockPool();
    BlockPool(const BlockPool&) = delete;
    BlockPool& operator=(const BlockPool&) = delete;

    size_t block_bytes(size_t cls = 0) const { return classes_[cls].bytes; }

    // Takes blocks[c] fresh blocks of each class c (reference count 1, zeroed) and reserves `units` and
    // `bytes` of memory outside the pool (the float staging of open blocks), in one step: `units` count
    // against max_blocks, `bytes` against max_bytes. `release` lists blocks the caller gives up in the same
    // operation; blocks that reach a count of zero that way count as free for this request. All or
    // nothing: if the limits cannot provide it all it throws PoolExhausted and nothing changes (the blocks
    // in `release` keep their counts). Growing may throw std::bad_alloc, also changing nothing. A class
    // grows by at least grow_blocks where the limits allow, or with `exact` by just the blocks missing
    // (loading a file). Returns the blocks class by class.
    // `bookkeeping` bytes are charged as charge_bookkeeping does, in the same step.
    std::vector<BlockRef> take(std::span<const size_t> blocks, size_t units, size_t bytes,
                               std::span<const BlockRef> release = {}, bool exact = false, size_t bookkeeping = 0);
    // take() of n blocks of one class.
    std::vector<BlockRef> allocate(size_t cls, size_t n, std::span<const BlockRef> release = {}, bool exact = false);
    // take() of memory outside the pool alone; unreserve gives it back.
    void reserve(size_t units, size_t bytes);
    void unreserve(size_t units, size_t bytes);
    // The cache's bookkeeping (its sequences' state and block tables): counted against max_bytes with the
    // blocks and the staging (free blocks of any class give way, as for take); where only max_blocks is
    // set, within max_blocks blocks' worth of bytes (of the largest class) of its own. PoolExhausted if
    // it does not fit, and nothing changed.
    void charge_bookkeeping(size_t bytes);
    void uncharge_bookkeeping(size_t bytes);
    // One more reference to each block (fork).
    void retain(std::span<const BlockRef> blocks);
    // One reference fewer; a block whose count reaches zero returns to its class's free list.
    void release(std::span<const BlockRef> blocks);
    // True if more than one block table holds the block (so it must be copied before a write).
    bool is_shared(BlockId id) const;
    uint32_t ref_count(BlockId id) const;

    PoolStats stats() const;
    size_t bytes_in_use() const;  // blocks referenced by some sequence, at their class's size

private:
    struct SizeClass {
        size_t bytes;
        std::vector<BlockId> free;  // ids with refs_ == 0, taken from the back
    };
    // How many more blocks of `bytes` the limits admit now, before any free block is given back.
    size_t room_locked(size_t bytes) const;
    // Gives back free blocks the request does not use (a class's free blocks beyond keep[c]) until `units`
    // more blocks' worth and `bytes` more bytes fit in the limits; false (nothing given back) if even
    // giving back all of them would not make room.
    bool shed_locked(size_t units, size_t bytes, std::span<const size_t> keep, bool dry_run);
    bool bookkeeping_fits_locked(size_t bytes) const;  // the max_blocks-only limit on bookkeeping
    void grow_locked(size_t cls, size_t n);  // adds exactly n blocks to the class
    void release_locked(std::span<const BlockRef> blocks);
    [[noreturn]] void exhausted_locked(const std::string& what) const;

    const size_t max_blocks_;
    const size_t max_bytes_;
    const size_t grow_blocks_;

    mutable std::mutex mu_;
    std::vector<SizeClass> classes_;
    std::vector<uint8_t*> data_;      // by id; nullptr: the block was given back and its id is vacant
    std::vector<uint32_t> refs_;      // by id
    std::vector<uint16_t> class_of_;  // by id
    std::vector<BlockId> vacant_;     // ids whose memory was given back, reused first
    size_t blocks_allocated_ = 0, bytes_allocated_ = 0;
    size_t blocks_used_ = 0, bytes_used_ = 0;
    size_t shared_ = 0;               // blocks with refs_ > 1
    size_t reserved_units_ = 0;       // block-sized units counted for memory outside the pool
    size_t reserved_bytes_ = 0;       // and its bytes
    size_t bookkeeping_bytes_ = 0;    // charge_bookkeeping's, counted against max_bytes
};

}  // namespace kvq::detail
