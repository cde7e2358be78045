#include "block_pool.hpp"

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <string>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace kvq::detail {
namespace {

constexpr size_t kUnlimited = std::numeric_limits<size_t>::max();

uint8_t* new_block(size_t bytes) { return static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t(BlockPool::kAlignment))); }
void delete_block(uint8_t* p) { ::operator delete[](p, std::align_val_t(BlockPool::kAlignment)); }

// Blocks given back to make room for blocks of another size leave holes of their size in the allocator's
// heap, which blocks of the other size do not fit: the allocator keeps the holes' pages and takes new ones,
// so the process would hold up to twice the limit after a few rounds of churn between sizes (issue #36).
// Returning the free pages to the system after such a shed keeps the process within the limit.
void return_free_pages() {
#if defined(__GLIBC__)
    malloc_trim(0);
#endif
}

std::string limit_text(size_t limit) { return limit ? std::to_string(limit) : std::string("unlimited"); }

}  // namespace

BlockPool::BlockPool(std::span<const size_t> class_bytes, size_t max_blocks, size_t max_bytes,
                     std::span<const size_t> initial_blocks, size_t grow_blocks)
    : max_blocks_(max_blocks), max_bytes_(max_bytes), grow_blocks_(std::max<size_t>(grow_blocks, 1)) {
    for (size_t b : class_bytes) classes_.push_back({(b + kAlignment - 1) / kAlignment * kAlignment, {}});
    try {
        for (size_t c = 0; c < initial_blocks.size(); ++c) {
            if (initial_blocks[c] > room_locked(classes_[c].bytes)) {
                exhausted_locked(std::to_string(initial_blocks[c]) + " initial block(s)");
            }
            grow_locked(c, initial_blocks[c]);
        }
    } catch (...) {
        for (uint8_t* p : data_) delete_block(p);
        throw;
    }
}

BlockPool::~BlockPool() {
    for (uint8_t* p : data_) {
        if (p) delete_block(p);
    }
}

size_t BlockPool::room_locked(size_t bytes) const {
    size_t room = kUnlimited;
    if (max_blocks_) room = max_blocks_ > blocks_allocated_ + reserved_units_ ? max_blocks_ - blocks_allocated_ - reserved_units_ : 0;
    if (max_bytes_) {
        const size_t taken = bytes_allocated_ + reserved_bytes_ + bookkeeping_bytes_;
        room = std::min(room, max_bytes_ > taken ? (max_bytes_ - taken) / bytes : 0);
    }
    return room;
}

bool BlockPool::shed_locked(size_t units, size_t bytes, std::span<const size_t> keep, bool dry_run) {
    const auto fits = [&](size_t shed_blocks, size_t shed_bytes) {
        return (!max_blocks_ || blocks_allocated_ - shed_blocks + reserved_units_ + units <= max_blocks_) &&
               (!max_bytes_ || bytes_allocated_ - shed_bytes + reserved_bytes_ + bookkeeping_bytes_ + bytes <= max_bytes_);
    };
    const auto spare = [&](size_t c) {
        const size_t k = c < keep.size() ? keep[c] : 0;
        return classes_[c].free.size() > k ? classes_[c].free.size() - k : 0;
    };
    size_t spare_blocks = 0, spare_bytes = 0;
    for (size_t c = 0; c < classes_.size(); ++c) spare_blocks += spare(c), spare_bytes += spare(c) * classes_[c].bytes;
    if (!fits(spare_blocks, spare_bytes)) return false;
    for (size_t c = 0; !dry_run && c < classes_.size() && !fits(0, 0); ++c) {
        // The highest ids (the front: the free list hands blocks out from the back).
        std::vector<BlockId>& free = classes_[c].free;
        size_t n = 0;
        for (; n < spare(c) && !fits(0, 0); ++n) {
            const BlockId id = free[n];
            delete_block(data_[id]);
            data_[id] = nullptr;
            vacant_.push_back(id);
            --blocks_allocated_;
            bytes_allocated_ -= classes_[c].bytes;
        }
        free.erase(free.begin(), free.begin() + static_cast<std::ptrdiff_t>(n));
    }
    return true;
}

[[noreturn]] void BlockPool::exhausted_locked(const std::string& what) const {
    throw PoolExhausted("KV cache pool exhausted: " + what + " do(es) not fit (max_blocks = " + limit_text(max_blocks_) +
                        ", max_bytes = " + limit_text(max_bytes_) + "; " + std::to_string(blocks_used_) + " block(s) in use, " +
                        std::to_string(bytes_used_) + " bytes, staging holding " + std::to_string(reserved_units_) +
                        " block(s)' worth, " + std::to_string(reserved_bytes_) + " bytes); nothing was changed");
}

void BlockPool::reserve(size_t units, size_t bytes) { take({}, units, bytes); }

bool BlockPool::bookkeeping_fits_locked(size_t bytes) const {
    if (max_bytes_ || !max_blocks_) return true;  // under max_bytes with the rest (take's check), or unlimited
    size_t largest = 0;
    for (const SizeClass& c : classes_) largest = std::max(largest, c.bytes);
    const size_t limit = largest > kUnlimited / max_blocks_ ? kUnlimited : max_blocks_ * largest;
    return bookkeeping_bytes_ <= limit && bytes <= limit - bookkeeping_bytes_;
}

void BlockPool::charge_bookkeeping(size_t bytes) { take({}, 0, 0, {}, false, bytes); }

void BlockPool::uncharge_bookkeeping(size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    bookkeeping_bytes_ -= std::min(bytes, bookkeeping_bytes_);
}

void BlockPool::unreserve(size_t units, size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    reserved_units_ -= std::min(units, reserved_units_);
    reserved_bytes_ -= std::min(bytes, reserved_bytes_);
}

void BlockPool::grow_locked(size_t cls, size_t n) {
    SizeClass& c = classes_[cls];
    const size_t fresh_ids = n > vacant_.size() ? n - vacant_.size() : 0;
    if (data_.size() + fresh_ids > std::numeric_limits<BlockId>::max()) throw std::bad_alloc();
    // Everything that can fail first (the blocks, the vectors' room), so that a throw changes nothing.
    data_.reserve(data_.size() + fresh_ids);
    refs_.reserve(refs_.size() + fresh_ids);
    class_of_.reserve(class_of_.size() + fresh_ids);
    c.free.reserve(c.free.size() + n);
    std::vector<uint8_t*> blocks;
    blocks.reserve(n);
    try {
        for (size_t i = 0; i < n; ++i) blocks.push_back(new_block(c.bytes));
    } catch (...) {
        for (uint8_t* p : blocks) delete_block(p);
        throw;
    }
    // Newest ids at the front of the free list, so blocks are handed out lowest id first.
    std::vector<BlockId> ids;
    for (uint8_t* p : blocks) {
        BlockId id;
        if (!vacant_.empty()) {
            id = vacant_.back();
            vacant_.pop_back();
            data_[id] = p;
        } else {
            id = static_cast<BlockId>(data_.size());
            data_.push_back(p);
            refs_.push_back(0);
            class_of_.push_back(0);
        }
        refs_[id] = 0;
        class_of_[id] = static_cast<uint16_t>(cls);
        ids.push_back(id);
    }
    std::sort(ids.begin(), ids.end());
    c.free.insert(c.free.begin(), ids.rbegin(), ids.rend());
    blocks_allocated_ += n;
    bytes_allocated_ += n * c.bytes;
}

std::vector<BlockRef> BlockPool::allocate(size_t cls, size_t n, std::span<const BlockRef> release, bool exact) {
    std::vector<size_t> blocks(cls + 1, 0);
    blocks[cls] = n;
    return take(blocks, 0, 0, release, exact);
}

std::vector<BlockRef> BlockPool::take(std::span<const size_t> blocks, size_t units, size_t bytes,
                                      std::span<const BlockRef> release, bool exact, size_t bookkeeping) {
    std::lock_guard<std::mutex> lock(mu_);
    // What the request needs beyond the free blocks (those `release` frees included), class by class, and
    // the free blocks it takes as they are (the rest may give way).
    std::vector<size_t> freed(classes_.size(), 0), missing(classes_.size(), 0), keep(classes_.size(), 0);
    for (const BlockRef& b : release) freed[class_of_[b.id]] += refs_[b.id] == 1;
    size_t missing_blocks = units, missing_bytes = bytes + bookkeeping, classes_missing = 0;
    for (size_t c = 0; c < blocks.size(); ++c) {
        const size_t free = classes_[c].free.size() + freed[c];
        missing[c] = blocks[c] > free ? blocks[c] - free : 0;
        keep[c] = blocks[c] > freed[c] ? std::min(blocks[c] - freed[c], classes_[c].free.size()) : 0;
        missing_blocks += missing[c];
        missing_bytes += missing[c] * classes_[c].bytes;
        classes_missing += missing[c] > 0;
    }
    // Checked whole before anything changes; then free blocks the request does not use give way.
    if (!bookkeeping_fits_locked(bookkeeping) || !shed_locked(missing_blocks, missing_bytes, keep, true)) {
        std::string what;
        for (size_t c = 0; c < blocks.size(); ++c) {
            if (blocks[c]) what += std::to_string(blocks[c]) + " block(s) of " + std::to_string(classes_[c].bytes) + " bytes, ";
        }
        if (bytes) what += "float staging of " + std::to_string(bytes) + " bytes, ";
        if (bookkeeping) {
            what += "bookkeeping of " + std::to_string(bookkeeping) + " bytes (sequences' state and block tables; " +
                    std::to_string(bookkeeping_bytes_) + " bytes held), ";
        }
        exhausted_locked(what.empty() ? std::string("the request") : what.substr(0, what.size() - 2));
    }
    const size_t allocated = blocks_allocated_;
    shed_locked(missing_blocks, missing_bytes, keep, false);
    if (blocks_allocated_ < allocated) return_free_pages();
    reserved_units_ += units;
    reserved_bytes_ += bytes;
    bookkeeping_bytes_ += bookkeeping;
    // Growing is the one step that can fail (bad_alloc); it happens before anything is released. A single
    // class that grows grows by grow_blocks where the limits leave room.
    try {
        for (size_t c = 0; c < blocks.size(); ++c) {
            if (missing[c] == 0) continue;
            size_t grow = missing[c];
            if (!exact && classes_missing == 1) grow = std::max(grow, std::min(grow_blocks_, room_locked(classes_[c].bytes)));
            grow_locked(c, grow);
        }
    } catch (...) {
        reserved_units_ -= units;
        reserved_bytes_ -= bytes;
        bookkeeping_bytes_ -= bookkeeping;
        throw;
    }
    release_locked(release);
    std::vector<BlockRef> out;
    for (size_t c = 0; c < blocks.size(); ++c) {
        SizeClass& sc = classes_[c];
        for (size_t i = 0; i < blocks[c]; ++i) {
            const BlockId id = sc.free.back();
            sc.free.pop_back();
            refs_[id] = 1;
            // Fresh blocks start zeroed: rows not yet written and padding hold no stale data from an
            // earlier sequence, so the same appends always give the same bytes.
            std::memset(data_[id], 0, sc.bytes);
            out.push_back({data_[id], id});
        }
        blocks_used_ += blocks[c];
        bytes_used_ += blocks[c] * sc.bytes;
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
        if (r == 0) {
            SizeClass& c = classes_[class_of_[b.id]];
            c.free.push_back(b.id);
            --blocks_used_;
            bytes_used_ -= c.bytes;
        }
    }
}

bool BlockPool::is_shared(BlockId id) const { return ref_count(id) > 1; }

uint32_t BlockPool::ref_count(BlockId id) const {
    std::lock_guard<std::mutex> lock(mu_);
    return refs_[id];
}

size_t BlockPool::bytes_in_use() const {
    std::lock_guard<std::mutex> lock(mu_);
    return bytes_used_;
}

PoolStats BlockPool::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    PoolStats s;
    s.block_bytes = classes_[0].bytes;
    s.blocks_total = blocks_allocated_;
    s.blocks_used = blocks_used_;
    s.blocks_shared = shared_;
    s.max_blocks = max_blocks_;
    s.blocks_reserved = reserved_units_;
    s.bytes_total = bytes_allocated_;
    s.bytes_used = bytes_used_;
    s.bytes_reserved = reserved_bytes_;
    s.max_bytes = max_bytes_;
    return s;
}

}  // namespace kvq::detail
