// Key centering (lib/codec/centering.hpp), the one implementation the cache and the accuracy tables share:
// its known answers, and that a centered cache stores exactly its means and the codec's bytes of its rows.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cache_file_util.hpp"
#include "codec/centering.hpp"
#include "ref/half.hpp"

namespace {

bool contains(const std::vector<uint8_t>& hay, const void* needle, size_t n) {
    const auto* p = static_cast<const uint8_t*>(needle);
    return std::search(hay.begin(), hay.end(), p, p + n) != hay.end();
}

}  // namespace

TEST_CASE("centering: the fp16-rounded mean of the block's rows is subtracted, rows read at their stride") {
    // Three rows of two channels, each row followed by a value that is not the block's (stride 3).
    const float k[] = {1, -8, 99, 2, -8, 99, 4, -8.5f, 99};
    uint16_t mean16[2];
    float centered[6];
    kvq::detail::center_block(k, 3, 3, 2, mean16, centered);
    CHECK(mean16[0] == 0x40AB);  // 7/3 rounds to 2.333984375 in fp16
    CHECK(kvq::detail::f16_to_f32(mean16[1]) == -8.1640625f);  // -24.5/3 = -8.1666…, fp16 steps of 1/128
    const float expect[] = {1 - 2.333984375f, -8 + 8.1640625f, 2 - 2.333984375f, -8 + 8.1640625f, 4 - 2.333984375f, -8.5f + 8.1640625f};
    CHECK(std::memcmp(centered, expect, sizeof expect) == 0);

    // Rows added later take the stored mean off as it is.
    const float more[] = {3, 0};
    float out[2];
    kvq::detail::subtract_mean(more, 2, 1, 2, mean16, out);
    CHECK(out[0] == 3 - 2.333984375f);
    CHECK(out[1] == 8.1640625f);
}

TEST_CASE("centering: a centered cache stores center_block's means and the key codec's bytes of its rows") {
    using namespace kvq::test::cache_file;
    const int d = 64, n_kv = 2, bt = 16;
    for (const auto staging : {kvq::StagingType::f32, kvq::StagingType::f16}) {
        CacheConfig cfg = config("q8_0", "q4_0");
        cfg.n_layers = 1;
        cfg.block_tokens = bt;
        cfg.center_keys = true;
        cfg.staging = staging;
        KVCache cache(cfg);
        const auto seq = cache.add_sequence();
        auto k = kvq::test::gaussian(48 * n_kv * d, 1), v = kvq::test::gaussian(48 * n_kv * d, 2);
        for (size_t i = 0; i < k.size(); i += 3) k[i] += 4.0f;  // a bias for the mean to take off
        cache.append(0, seq, k.data(), v.data(), 48);  // three sealed blocks
        cache.truncate(seq, 40);                       // rows 40..47 of block 2 go; the block re-opens
        const auto k2 = kvq::test::gaussian(8 * n_kv * d, 3), v2 = kvq::test::gaussian(8 * n_kv * d, 4);
        cache.append(0, seq, k2.data(), v2.data(), 8);
        TempDir dir;
        cache.save(dir / "c.kvq");
        const auto file = slurp(dir / "c.kvq");

        // The rows as the staging held them (f16 staging rounds them), token-major.
        auto staged = [&](std::vector<float> x) {
            if (staging == kvq::StagingType::f16)
                for (float& f : x) f = kvq::detail::f16_to_f32(kvq::detail::f32_to_f16(f));
            return x;
        };
        const auto ks = staged(k);
        const auto codec = kvq::Codec::make("q8_0", d);
        for (int b = 0; b < 3; ++b) {
            for (int h = 0; h < n_kv; ++h) {
                CAPTURE(b);
                CAPTURE(h);
                const float* rows = ks.data() + (size_t(b) * bt * n_kv + h) * d;
                uint16_t mean16[d];
                std::vector<float> centered(bt * d);
                kvq::detail::center_block(rows, size_t(n_kv) * d, bt, d, mean16, centered.data());
                if (b == 2) {
                    // Re-opened by the truncate, sealed anew: rows 0..7 as the first sealing stored them
                    // (dequantized, the mean added back), rows 8..15 the new keys, as the staging holds them.
                    std::vector<uint8_t> first(bt * codec.row_bytes());
                    codec.quantize_rows(centered.data(), bt, first.data());
                    std::vector<float> again(bt * d);
                    codec.dequantize_rows(first.data(), 8, again.data());
                    for (int r = 0; r < 8; ++r) {
                        for (int j = 0; j < d; ++j) {
                            again[r * d + j] += kvq::detail::f16_to_f32(mean16[j]);
                            again[(8 + r) * d + j] = k2[(size_t(r) * n_kv + h) * d + j];
                        }
                    }
                    again = staged(again);
                    kvq::detail::center_block(again.data(), d, bt, d, mean16, centered.data());
                }
                std::vector<uint8_t> bytes(bt * codec.row_bytes());
                codec.quantize_rows(centered.data(), bt, bytes.data());
                CHECK(contains(file, mean16, sizeof mean16));
                CHECK(contains(file, bytes.data(), bytes.size()));
            }
        }
    }
}
