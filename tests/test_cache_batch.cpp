// Batched decode (KVCache::attend_batch) and an engine's own executor: every result bit-identical to the
// single-sequence call, whatever the thread count, window, seal policy or executor.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SequenceId;

namespace {

CacheConfig batch_config(int threads) {
    CacheConfig cfg;
    cfg.n_layers = 2;
    cfg.n_kv_heads = 2;
    cfg.n_heads = 8;
    cfg.head_dim = 64;
    cfg.block_tokens = 16;
    cfg.threads = threads;
    cfg.sliding_window = {0, 40};
    return cfg;
}

// Sequences of different lengths (short, mid-block, long enough to split across threads), and forks.
std::vector<SequenceId> fill(KVCache& cache, uint64_t seed) {
    const auto& c = cache.config();
    std::vector<SequenceId> seqs;
    for (size_t n : {1, 17, 40, 333, 700}) {
        const auto s = cache.add_sequence();
        for (int l = 0; l < c.n_layers; ++l) {
            std::vector<float> k = kvq::test::gaussian(n * c.n_kv_heads * c.head_dim, seed + n + l);
            std::vector<float> v = kvq::test::gaussian(n * c.n_kv_heads * c.head_dim, seed + 2 * n + l);
            cache.append(l, s, k.data(), v.data(), n);
        }
        seqs.push_back(s);
    }
    seqs.push_back(cache.fork(seqs[3]));
    return seqs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("attend_batch equals attend of each sequence bit for bit") {
    for (int threads : {1, 2, 3}) {
        for (auto seal : {kvq::SealPolicy::on_block_full, kvq::SealPolicy::on_append}) {
            CAPTURE(threads);
            CacheConfig cfg = batch_config(threads);
            cfg.seal = seal;
            KVCache cache(cfg);
            const auto seqs = fill(cache, 10);
            const size_t vec = 8 * 64;
            const auto q = kvq::test::gaussian(seqs.size() * vec, 11);
            for (int layer : {0, 1}) {
                std::vector<float> batched(q.size());
                cache.attend_batch(layer, seqs, q.data(), batched.data());
                for (size_t i = 0; i < seqs.size(); ++i) {
                    std::vector<float> one(vec);
                    cache.attend(layer, seqs[i], q.data() + i * vec, one.data());
                    CHECK(same_bits(one, std::vector<float>(batched.begin() + i * vec, batched.begin() + (i + 1) * vec)));
                }
                // A subset, in another order.
                const std::vector<SequenceId> some = {seqs[4], seqs[0], seqs[2]};
                std::vector<float> part(some.size() * vec);
                cache.attend_batch(layer, some, q.data(), part.data());
                std::vector<float> one(vec);
                cache.attend(layer, seqs[4], q.data(), one.data());
                CHECK(same_bits(one, std::vector<float>(part.begin(), part.begin() + vec)));
            }
        }
    }
}

TEST_CASE("attend_batch: bad arguments throw and write nothing") {
    KVCache cache(batch_config(2));
    const auto seqs = fill(cache, 20);
    const auto q = kvq::test::gaussian(3 * 8 * 64, 21);
    std::vector<float> out(q.size(), 7.0f);
    const std::vector<SequenceId> twice = {seqs[0], seqs[1], seqs[0]};
    CHECK_THROWS_WITH_AS(cache.attend_batch(0, twice, q.data(), out.data()), doctest::Contains("given twice"), std::invalid_argument);
    const std::vector<SequenceId> unknown = {seqs[0], 12345};
    CHECK_THROWS_AS(cache.attend_batch(0, unknown, q.data(), out.data()), std::invalid_argument);
    CHECK_THROWS_AS(cache.attend_batch(5, std::vector<SequenceId>{seqs[0]}, q.data(), out.data()), std::invalid_argument);
    const auto empty = cache.add_sequence();
    CHECK_THROWS_AS(cache.attend_batch(0, std::vector<SequenceId>{seqs[0], empty}, q.data(), out.data()), std::invalid_argument);
    auto bad_q = q;
    bad_q[8 * 64 + 3] = NAN;
    CHECK_THROWS_AS(cache.attend_batch(0, std::vector<SequenceId>{seqs[0], seqs[1]}, bad_q.data(), out.data()),
                    std::invalid_argument);
    for (float x : out) CHECK(x == 7.0f);
    cache.attend_batch(0, std::vector<SequenceId>{}, q.data(), out.data());  // nothing to do
}

TEST_CASE("an engine's executor runs the parts and gives the built-in pool's results") {
    std::atomic<int> calls{0}, parts{0};
    // A small executor of the engine's own: two threads of its own, parts handed out by an atomic index.
    kvq::Executor executor = [&](int n, const std::function<void(int)>& task) {
        ++calls;
        std::atomic<int> next{0};
        auto work = [&] {
            for (int i; (i = next++) < n;) {
                task(i);
                ++parts;
            }
        };
        std::thread a(work), b(work);
        a.join();
        b.join();
    };
    CacheConfig builtin = batch_config(2);
    CacheConfig engine = builtin;
    engine.executor = executor;
    KVCache a(builtin), b(engine);
    const auto sa = fill(a, 30), sb = fill(b, 30);
    const size_t vec = 8 * 64;
    const auto q = kvq::test::gaussian(sa.size() * vec, 31);
    std::vector<float> oa(q.size()), ob(q.size());
    a.attend_batch(0, sa, q.data(), oa.data());
    b.attend_batch(0, sb, q.data(), ob.data());
    CHECK(same_bits(oa, ob));
    CHECK(calls.load() >= 1);
    CHECK(parts.load() > static_cast<int>(sa.size()));  // long sequences split into several parts
    std::vector<float> one_a(vec), one_b(vec);
    a.attend(0, sa[4], q.data(), one_a.data());
    b.attend(0, sb[4], q.data(), one_b.data());
    CHECK(same_bits(one_a, one_b));
    // Prefill runs its queries on the executor too.
    const int before = calls.load();
    std::vector<float> pa(3 * vec), pb(3 * vec);
    a.attend_prefill(1, sa[4], q.data(), 3, pa.data());
    b.attend_prefill(1, sb[4], q.data(), 3, pb.data());
    CHECK(same_bits(pa, pb));
    CHECK(calls.load() > before);
}

namespace {
// Threads of this process (Linux: /proc/self/task), or -1 where that cannot be read.
int thread_count() {
    std::error_code ec;
    int n = 0;
    for (auto it = std::filesystem::directory_iterator("/proc/self/task", ec); !ec && it != std::filesystem::directory_iterator();
         it.increment(ec)) {
        ++n;
    }
    return ec ? -1 : n;
}
}  // namespace

TEST_CASE("caches of one process share kvq's pool: many caches start no threads of their own") {
    const int before = thread_count();
    std::vector<std::unique_ptr<KVCache>> caches;
    for (int i = 0; i < 8; ++i) caches.push_back(std::make_unique<KVCache>(batch_config(8)));
    // Each cache splits its calls for 8 threads, all on the one shared pool.
    for (auto& c : caches) {
        const auto s = fill(*c, 40);
        std::vector<float> out(s.size() * 8 * 64);
        const auto q = kvq::test::gaussian(out.size(), 41);
        c->attend_batch(0, s, q.data(), out.data());
        for (float x : out) REQUIRE(std::isfinite(x));
    }
    if (before > 0) {
        // At most the shared pool's workers were added (it may have started in this test), not 8 × 7.
        const int hw = static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
        CHECK(thread_count() - before <= hw - 1);
    }
}

TEST_CASE("attend_rows (rows the caller owns, any token stride) equals KVCache::attend on the same rows") {
    // A cache of 256-token blocks that quantizes on append stores exactly the rows attend_rows reads in
    // its 256-token steps: the same engine gives the same bits.
    for (const char* pair : {"q8_0/q4_0", "f16/f16", "q4_0+rot/q8_0", "turbo4/q4_1"}) {
        CAPTURE(pair);
        const std::string p(pair);
        CacheConfig cfg;
        cfg.n_kv_heads = 2;
        cfg.n_heads = 6;
        cfg.head_dim = 64;
        cfg.key_codec = p.substr(0, p.find('/'));
        cfg.value_codec = p.substr(p.find('/') + 1);
        cfg.block_tokens = 256;
        cfg.seal = kvq::SealPolicy::on_append;
        KVCache cache(cfg);
        const auto s = cache.add_sequence();
        const size_t n = 600;
        const auto k = kvq::test::gaussian(n * 2 * 64, 50), v = kvq::test::gaussian(n * 2 * 64, 51);
        cache.append(0, s, k.data(), v.data(), n);
        const auto q = kvq::test::gaussian(6 * 64, 52);
        std::vector<float> want(q.size()), got(q.size());
        cache.attend(0, s, q.data(), want.data());
        // The same rows in a ggml-like tensor: [head_dim, n_kv_heads, n_ctx] with padding between tokens.
        const auto& kc = cache.key_codec();
        const auto& vc = cache.value_codec();
        const size_t k_tok = 2 * kc.row_bytes() + 16, v_tok = 2 * vc.row_bytes() + 8;
        std::vector<uint8_t> kt(n * k_tok), vt(n * v_tok);
        for (size_t t = 0; t < n; ++t) {
            for (int h = 0; h < 2; ++h) {
                kc.quantize_rows(&k[(t * 2 + h) * 64], 1, &kt[t * k_tok + h * kc.row_bytes()]);
                vc.quantize_rows(&v[(t * 2 + h) * 64], 1, &vt[t * v_tok + h * vc.row_bytes()]);
            }
        }
        kvq::attend_rows(kc, vc, 6, 2, q.data(), {kt.data(), k_tok, kc.row_bytes()}, {vt.data(), v_tok, vc.row_bytes()}, n,
                         got.data());
        CHECK(same_bits(got, want));
    }
    const auto c = kvq::Codec::make("q8_0", 64);
    std::vector<float> q(64, 1.0f), out(64);
    CHECK_THROWS_AS(kvq::attend_rows(c, c, 3, 2, q.data(), {q.data()}, {q.data()}, 1, out.data()), std::invalid_argument);
    q[5] = NAN;
    CHECK_THROWS_AS(kvq::attend_rows(c, c, 1, 1, q.data(), {q.data()}, {q.data()}, 0, out.data()), std::invalid_argument);
}
