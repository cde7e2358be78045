// A decode step allocates nothing once its buffers have grown (issue #19): attend and attend_batch, on
// one thread and split over kvq's thread pool, counted by replacing the global operator new of this
// test program (every thread's allocations count while the counter is on).
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <new>
#include <string>
#include <vector>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "test_util.hpp"

namespace {

std::atomic<bool> counting{false};
std::atomic<long> allocations{0};
// A thread's first call: its buffers grow there, once (a pool worker may first take a part of any call).
// What it allocates in a later call counts. Per allocations_of (generation): the pool outlives caches.
std::atomic<long> generation{0}, call{0};
struct FirstCall {
    long generation = -1, call = -1;
};
thread_local FirstCall first;

void count() {
    if (!counting.load(std::memory_order_relaxed)) return;
    const long g = generation.load(std::memory_order_relaxed), c = call.load(std::memory_order_relaxed);
    if (first.generation != g) first = {g, c};
    if (c != first.call) allocations.fetch_add(1, std::memory_order_relaxed);
}

void* allocate(std::size_t n) {
    count();
    if (void* p = std::malloc(n ? n : 1)) return p;
    throw std::bad_alloc();
}

void* allocate_aligned(std::size_t n, std::align_val_t a) {
    count();
    const std::size_t align = static_cast<std::size_t>(a);
    if (void* p = std::aligned_alloc(align, (n + align - 1) / align * align)) return p;
    throw std::bad_alloc();
}

// Allocations made by f once every thread's buffers have grown: those of a thread in any call after its
// first. A pool worker grows its buffers the first time it takes a part, and on a loaded machine it may
// sit out many calls in a row (the caller takes every part while it waits to be scheduled), even past a
// warm-up; its first call is its growth whenever it comes. With the pool, calls go on until 50 in a row
// allocate nothing (at most 2000), so that the workers take parts and show a per-call allocation; on one
// thread 3 do. Then 3 more calls, counted alike.
template <class F>
long allocations_of(int threads, F&& f) {
    generation.fetch_add(1);
    auto counted_call = [&] {
        call.fetch_add(1);
        allocations = 0;
        counting = true;
        f();
        counting = false;
        return allocations.load();
    };
    const int quiet_needed = threads > 1 ? 50 : 3;
    long total = 0;
    for (int i = 0, quiet = 0; i < 2000 && quiet < quiet_needed; ++i) {
        const long a = counted_call();
        total += a;
        quiet = a == 0 ? quiet + 1 : 0;
    }
    for (int i = 0; i < 3; ++i) total += counted_call();
    return total;
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
        for (const std::string codecs : {"q8_0/q4_0", "f16/f16", "q4_0+rot/q4_0+rot", "turbo4/q4_0", "turbo4_qjl/turbo4", "polar/polar", "chan3/q4_0",
                                         "q8_0/q4_0 key_scales"}) {
            CAPTURE(threads);
            CAPTURE(codecs);
            kvq::CacheConfig cfg;
            cfg.n_layers = 1;
            cfg.n_kv_heads = 2;
            cfg.n_heads = 8;
            cfg.head_dim = 128;
            const std::string pair = codecs.substr(0, codecs.find(' '));
            cfg.key_codec = pair.substr(0, pair.find('/'));
            cfg.value_codec = pair.substr(pair.find('/') + 1);
            if (pair != codecs) cfg.key_scales.assign(2 * 128, 1.5f);  // q ⊘ s in a buffer the cache keeps
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

TEST_CASE("decode: attend_rows with options (query rows, a mask, threads) allocates nothing once warm") {
    const auto keys = kvq::Codec::make("q8_0", 128), values = kvq::Codec::make("q4_0", 128);
    const size_t n = 3000, rows = 3;
    std::vector<uint8_t> k(n * keys.row_bytes()), v(n * values.row_bytes());
    const auto x = kvq::test::gaussian(n * 128, 4);
    keys.quantize_rows(x.data(), n, k.data());
    values.quantize_rows(x.data(), n, v.data());
    std::vector<uint16_t> mask(rows * n, 0);
    for (size_t i = 0; i < rows; ++i) {
        for (size_t t = n - 100 + i; t < n; ++t) mask[i * n + t] = 0xFC00;  // -inf: causal
    }
    const auto q = kvq::test::gaussian(rows * 4 * 128, 5);
    std::vector<float> out(rows * 4 * 128);
    for (int threads : {1, 2}) {
        CAPTURE(threads);
        kvq::AttendOptions o;
        o.n_queries = rows;
        o.mask = mask.data();
        o.threads = threads;
        CHECK(allocations_of(threads, [&] {
                  kvq::attend_rows(keys, values, 4, 1, q.data(), {k.data()}, {v.data()}, n, out.data(), o);
              }) == 0);
    }
    // Through an engine's executor (the ggml plugin's way), whose contract kvq checks (run_checked).
    kvq::AttendOptions o;
    o.n_queries = rows;
    o.mask = mask.data();
    o.threads = 4;
    o.executor = [](int parts, const std::function<void(int)>& task) {
        for (int i = 0; i < parts; ++i) task(i);
    };
    CHECK(allocations_of(1, [&] { kvq::attend_rows(keys, values, 4, 1, q.data(), {k.data()}, {v.data()}, n, out.data(), o); }) == 0);
}
