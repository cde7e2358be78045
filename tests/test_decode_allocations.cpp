// A decode step allocates nothing once its buffers have grown (issue #19): attend and attend_batch, on
// one thread and split over kvq's thread pool, counted by replacing the global operator new of this
// test program (every thread's allocations count while the counter is on).
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "kvq/cache.hpp"
#include "test_util.hpp"

namespace {

std::atomic<bool> counting{false};
std::atomic<long> allocations{0};

void* allocate(std::size_t n) {
    if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}

void* allocate_aligned(std::size_t n, std::align_val_t a) {
    if (counting.load(std::memory_order_relaxed)) allocations.fetch_add(1, std::memory_order_relaxed);
    const std::size_t align = static_cast<std::size_t>(a);
    if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
    throw std::bad_alloc();
}

// Allocations made by f once every thread's buffers have grown.
template <class F>
long allocations_of(int threads, F&& f) {
    // A pool worker grows its buffers the first time it takes a part, and on a loaded machine it may sit
    // out many calls in a row (the caller takes every part while it waits to be scheduled). So with the
    // pool, warm until 50 calls in a row allocate nothing, at most 2000 calls; on one thread the first
    // call grows every buffer, and 3 quiet calls do. A per-call allocation still shows below.
    const int quiet_needed = threads > 1 ? 50 : 3;
    for (int i = 0, quiet = 0; i < 2000 && quiet < quiet_needed; ++i) {
        allocations = 0;
        counting = true;
        f();
        counting = false;
        quiet = allocations.load() == 0 ? quiet + 1 : 0;
    }
    allocations = 0;
    counting = true;
    for (int i = 0; i < 3; ++i) f();
    counting = false;
    return allocations.load();
}

}  // namespace

void* operator new(std::size_t n) { return allocate(n); }
void* operator new[](std::size_t n) { return allocate(n); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate_aligned(n, a); }
void* operator new[](std::size_t n, std::align_val_t a) { return allocate_aligned(n, a); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

TEST_CASE("decode: attend and attend_batch allocate nothing once warm, on one thread and on the pool") {
    for (int threads : {1, 2}) {
        for (const std::string codecs : {"q8_0/q4_0", "f16/f16", "q4_0+rot/q4_0+rot", "turbo4/q4_0", "turbo4_qjl/turbo4", "polar/polar", "chan3/q4_0"}) {
            CAPTURE(threads);
            CAPTURE(codecs);
            kvq::CacheConfig cfg;
            cfg.n_layers = 1;
            cfg.n_kv_heads = 2;
            cfg.n_heads = 8;
            cfg.head_dim = 128;
            cfg.key_codec = codecs.substr(0, codecs.find('/'));
            cfg.value_codec = codecs.substr(codecs.find('/') + 1);
            cfg.threads = threads;
            kvq::KVCache cache(cfg);
            const size_t n = 1100;  // 34 sealed blocks and an open one: two parts with two threads
            const auto k = kvq::test::gaussian(n * 2 * 128, 1), v = kvq::test::gaussian(n * 2 * 128, 2);
            std::vector<kvq::SequenceId> seqs;
            for (int s = 0; s < 4; ++s) {
                seqs.push_back(cache.add_sequence());
                cache.append(0, seqs.back(), k.data(), v.data(), n - s);
            }
            const auto q = kvq::test::gaussian(4 * 8 * 128, 3);
            std::vector<float> out(4 * 8 * 128);
            CHECK(allocations_of(threads, [&] { cache.attend(0, seqs[0], q.data(), out.data()); }) == 0);
            CHECK(allocations_of(threads, [&] { cache.attend_batch(0, seqs, q.data(), out.data()); }) == 0);
        }
    }
}
