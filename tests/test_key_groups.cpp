// q8_0 keys in groups of 16 rows (lib/ref/key_groups.hpp): where the level in use has a kernel for them
// (AVX512-VNNI), a cache keeps the keys of its sealed blocks grouped. The layout is the pool's business
// only: a grouped cache gives the same bits as one that keeps rows, in every operation (decode, prefill,
// batch, truncate into a sealed block, fork, windows, centering, 1 to 8 queries a kv head), its files are
// byte for byte the same, and it still attends correctly after the level changes to one without the
// kernel (which scores the groups' rows through its row kernel). Blocks that are not a multiple of 16
// rows keep rows.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "cache_file_util.hpp"
#include "cache_model.hpp"
#include "kvq/cache.hpp"
#include "kvq/simd.hpp"
#include "cache/cache_impl.hpp"
#include "codec/key_formats.hpp"
#include "kvq/codec.hpp"
#include "ref/key_groups.hpp"
#include "simd/dispatch.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SimdLevel;

namespace {

struct RestoreLevel {
    SimdLevel saved = kvq::simd_level();
    ~RestoreLevel() { kvq::force_simd_level(saved); }
};

bool has_group_kernel(SimdLevel level) {
    const auto* k = kvq::detail::level_kernels(kvq::detail::BlockCodec::q8_0, level);
    return k && k->score_groups;
}

bool runs(SimdLevel level) {
    for (SimdLevel l : kvq::available_simd_levels()) {
        if (l == level) return true;
    }
    return false;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}



// The outputs of one run of operations on a cache (the same calls on every cache).
struct Trace {
    std::vector<std::vector<float>> outputs;
};

struct Case {
    int n_kv, n_heads, d, bt;
    std::string v;
    bool center = false;
    int window = 0;
    int threads = 1;
};

// Appends, attends, truncates into a sealed block, appends again, forks, attends a batch: every result.
void run_ops(KVCache& c, const Case& k, Trace& t) {
    const size_t row = static_cast<size_t>(k.n_kv) * k.d, qn = static_cast<size_t>(k.n_heads) * k.d;
    std::vector<float> kk, vv;
    kvq::test::random_tokens(160, k.n_kv, k.d, 11, kk, vv, 0.3f);
    const auto q = kvq::test::gaussian(4 * qn, 12, 1.5f);
    std::vector<float> out(qn), prefill(3 * qn), batch(2 * qn);
    const auto seq = c.add_sequence();
    size_t pos = 0;
    const auto append = [&](kvq::SequenceId s, size_t n) {
        c.append(0, s, &kk[pos * row], &vv[pos * row], n);
        pos += n;
    };
    const auto attend = [&](kvq::SequenceId s) {
        c.attend(0, s, q.data(), out.data());
        t.outputs.push_back(out);
    };
    for (size_t n : {5, 37, 28}) {
        append(seq, n);
        attend(seq);
    }
    c.attend_prefill(0, seq, q.data() + qn, 3, prefill.data());
    t.outputs.push_back(prefill);
    c.truncate(seq, 40);  // into the second block, sealed
    append(seq, 30);
    attend(seq);
    const auto child = c.fork(seq);
    append(child, 41);
    attend(child);
    const kvq::SequenceId both[2] = {seq, child};
    c.attend_batch(0, both, q.data(), batch.data());
    t.outputs.push_back(batch);
}

CacheConfig config(const Case& k) {
    CacheConfig cfg;
    cfg.n_kv_heads = k.n_kv;
    cfg.n_heads = k.n_heads;
    cfg.head_dim = k.d;
    cfg.block_tokens = k.bt;
    cfg.key_codec = "q8_0";
    cfg.value_codec = k.v;
    cfg.center_keys = k.center;
    if (k.window) cfg.sliding_window = {k.window};
    cfg.threads = k.threads;
    return cfg;
}

}  // namespace

TEST_CASE("q8_0 key groups: keys_in_groups is the one decision (q8_0, the level's kernel, a fitting head, whole groups)") {
    RestoreLevel restore;
    const kvq::Codec q8 = kvq::Codec::make("q8_0", 128), q4 = kvq::Codec::make("q4_0", 128);
    const kvq::Codec q8_wide = kvq::Codec::make("q8_0", 32 * 65);  // 65 blocks a row: more than the kernel takes
    for (SimdLevel level : kvq::available_simd_levels()) {
        CAPTURE(kvq::simd_level_name(level));
        kvq::force_simd_level(level);
        if (kvq::simd_level() != level) continue;  // fell back (failed its self-check)
        const bool kernel = has_group_kernel(level);
        CHECK(kvq::detail::keys_in_groups(q8, 32) == kernel);
        CHECK(kvq::detail::keys_in_groups(q8, 16) == kernel);
        CHECK_FALSE(kvq::detail::keys_in_groups(q8, 24));  // not whole groups
        CHECK_FALSE(kvq::detail::keys_in_groups(q4, 32));  // no kernel for grouped q4_0 keys
        CHECK_FALSE(kvq::detail::keys_in_groups(q8_wide, 32));
    }
}

TEST_CASE("q8_0 key groups: the layout's bytes, row by row") {
    // Row r's block t: its scale at 2·(16t + r), byte 4j + e of its codes at 32·nb + 4·(16·(8t + j) + r) + e,
    // flipped to unsigned.
    constexpr size_t nb = 3, row_bytes = nb * 34;
    std::vector<uint8_t> rows(16 * row_bytes), groups(kvq::detail::group_bytes(nb)), back(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint8_t>(i * 7 + 3);
    kvq::detail::groups_from_rows(rows.data(), row_bytes, 16, nb, groups.data());
    CHECK(groups.size() == rows.size());
    for (size_t r = 0; r < 16; ++r) {
        for (size_t t = 0; t < nb; ++t) {
            const uint8_t* block = rows.data() + r * row_bytes + t * 34;
            CHECK(std::memcmp(groups.data() + 2 * (16 * t + r), block, 2) == 0);
            for (size_t j = 0; j < 8; ++j) {
                for (size_t e = 0; e < 4; ++e) {
                    CHECK(groups[32 * nb + 4 * (16 * (8 * t + j) + r) + e] == (block[2 + 4 * j + e] ^ 0x80));
                }
            }
        }
    }
    kvq::detail::rows_from_groups(groups.data(), 16, nb, back.data(), row_bytes);
    CHECK(back == rows);
}

TEST_CASE("q8_0 key groups: a grouped cache gives a row cache's bits, files and results after a level change") {
    if (!runs(SimdLevel::avx512) || !has_group_kernel(SimdLevel::avx512)) {
        MESSAGE("this CPU has no level with the q8_0 group kernel (AVX512-VNNI): every cache keeps rows");
        return;
    }
    RestoreLevel restore;
    const SimdLevel grouped = SimdLevel::avx512;
    const SimdLevel rows = runs(SimdLevel::avx2) ? SimdLevel::avx2 : SimdLevel::scalar;
    REQUIRE(!has_group_kernel(rows));
    const kvq::test::cache_file::TempDir dir;
    const std::vector<Case> cases = {
        {2, 8, 128, 32, "q4_0"},               // 4 queries a kv head, Llama's head size
        {2, 16, 64, 16, "q8_0", true},         // 8 queries (two groups of 4), centered keys
        {1, 4, 96, 48, "q4_0", false, 40, 2},  // 3 blocks a row, a window, 2 threads
        {2, 6, 64, 16, "q8_0"},                // 3 queries a kv head
        {4, 4, 128, 32, "q4_0"},               // 1 (multi-head attention)
        {2, 12, 64, 16, "q4_0", true},         // 6: a group of 4 and one of 2
        {2, 4, 128, 24, "q4_0"},               // blocks of 24 rows: rows, not groups
    };
    for (size_t ci = 0; ci < cases.size(); ++ci) {
        const Case& k = cases[ci];
        CAPTURE(ci);
        const CacheConfig cfg = config(k);
        kvq::force_simd_level(rows);
        KVCache row_cache(cfg);
        kvq::force_simd_level(grouped);
        KVCache group_cache(cfg);
        Trace tr, tg;
        run_ops(row_cache, k, tr);
        run_ops(group_cache, k, tg);
        REQUIRE(tr.outputs.size() == tg.outputs.size());
        for (size_t i = 0; i < tr.outputs.size(); ++i) {
            CAPTURE(i);
            CHECK(same_bits(tg.outputs[i], tr.outputs[i]));
        }
        const std::string fr = dir / ("rows" + std::to_string(ci) + ".kvq"), fg = dir / ("groups" + std::to_string(ci) + ".kvq");
        row_cache.save(fr);
        group_cache.save(fg);
        CHECK(kvq::test::cache_file::slurp(fr) == kvq::test::cache_file::slurp(fg));

        // A file loaded into a grouped cache, and both caches after a change to a level without the kernel.
        const auto q = kvq::test::gaussian(static_cast<size_t>(k.n_heads) * k.d, 99, 1.5f);
        std::vector<float> a(q.size()), b(q.size()), c(q.size());
        KVCache loaded = KVCache::load(fg);
        const auto ids = loaded.sequences();
        REQUIRE(ids.size() == 2);
        for (size_t s = 0; s < ids.size(); ++s) {
            const auto id_r = row_cache.sequences()[s], id_g = group_cache.sequences()[s];
            row_cache.attend(0, id_r, q.data(), a.data());
            group_cache.attend(0, id_g, q.data(), b.data());
            loaded.attend(0, ids[s], q.data(), c.data());
            CHECK(same_bits(b, a));
            CHECK(same_bits(c, b));
            kvq::force_simd_level(rows);
            row_cache.attend(0, id_r, q.data(), a.data());
            group_cache.attend(0, id_g, q.data(), b.data());
            CHECK(same_bits(b, a));  // both scored by the rows level's row kernel
            kvq::force_simd_level(grouped);
        }
    }
}
