// The key block format (lib/codec/key_format.hpp) is the one place a sealed block's key bytes are worked
// out: its answers are what the cache's bytes_per_token and pool blocks, the planner and the accuracy
// tables' key blocks hold, for every kind of key codec.
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include "codec/channel_keys.hpp"
#include "codec/key_format.hpp"
#include "eval/quantized_attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/research/kv_format.hpp"
#include "kvq/research/planner.hpp"
#include "test_util.hpp"

namespace {

constexpr int kKv = 3, kDim = 128;  // three kv heads: the 64-byte alignment of every offset matters
const char* const kValue = "q4_0";

struct KeyKind {
    const char* key;  // CacheConfig::key_codec (chanB included)
    bool center;
    kvq::detail::KeySide side;
};

using kvq::detail::KeySide;
const KeyKind kKinds[] = {
    {"f16", false, KeySide::none},         {"q8_0", false, KeySide::none},  {"q4_0", false, KeySide::none},
    {"q4_0", true, KeySide::means},        {"f16", true, KeySide::means},   {"chan3", false, KeySide::channel_params},
    {"chan4", false, KeySide::channel_params}, {"chan8", false, KeySide::channel_params},
    {"polar", false, KeySide::none},       {"polar", true, KeySide::means}, {"turbo4", false, KeySide::none},
    {"turbo3", true, KeySide::means},      {"q4_0+rot", true, KeySide::means},
};

kvq::Codec key_codec(const char* spec, int dim) {
    const int bits = kvq::detail::channel_key_bits(spec);
    return bits ? kvq::detail::make_channel_key_codec(bits, dim) : kvq::Codec::make(spec, dim);
}

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

TEST_CASE("key block format: the cache, the planner and the tables hold the bytes it gives, for every key codec kind") {
    const size_t vrow = kvq::Codec::make(kValue, kDim).row_bytes();
    for (const int bt : {32, 16, 20}) {
        for (const KeyKind& kind : kKinds) {
            CAPTURE(bt);
            CAPTURE(kind.key);
            CAPTURE(kind.center);
            const kvq::Codec key = key_codec(kind.key, kDim);
            const kvq::detail::KeyBlockFormat f(key, kind.center, bt);

            // Its own answers, from the definitions.
            REQUIRE(f.side() == kind.side);
            CHECK(f.head_dim() == kDim);
            CHECK(f.block_tokens() == bt);
            CHECK(f.row_bytes() == key.row_bytes());
            CHECK(f.rows_bytes() == size_t(bt) * key.row_bytes());
            const size_t side = kind.side == KeySide::means ? 2 * kDim : kind.side == KeySide::channel_params ? 4 * kDim : 0;
            CHECK(f.side_bytes() == side);
            CHECK(f.side_bytes_per_token() == doctest::Approx(double(side) / bt));
            CHECK(f.bytes_per_token() == doctest::Approx(double(key.row_bytes()) + double(side) / bt));
            if (kind.side == KeySide::none) {
                CHECK(f.head_side_offset() == kvq::detail::kNoKeySide);
                CHECK(f.head_block_bytes() == f.rows_bytes());
            } else {
                CHECK(f.head_side_offset() == align64(f.rows_bytes()));
                CHECK(f.head_block_bytes() == align64(f.head_side_offset() + side));
            }
            const auto block = f.cache_block(kKv, bt * vrow);
            CHECK(block.value_offset == align64(kKv * f.rows_bytes()));
            CHECK(block.value_offset % 64 == 0);
            if (kind.side == KeySide::none) {
                CHECK(block.side_offset == kvq::detail::kNoKeySide);
                CHECK(block.bytes == block.value_offset + kKv * bt * vrow);
            } else {
                CHECK(block.side_offset == align64(block.value_offset + kKv * bt * vrow));
                CHECK(block.bytes == block.side_offset + kKv * side);
            }

            // The cache: bytes per token and its pool's block size.
            kvq::CacheConfig c;
            c.n_layers = 1;
            c.n_kv_heads = kKv;
            c.n_heads = kKv;
            c.head_dim = kDim;
            c.block_tokens = bt;
            c.key_codec = kind.key;
            c.value_codec = kValue;
            c.center_keys = kind.center;
            const kvq::KVCache cache(c);
            CHECK(cache.bytes_per_token(0) == (double(key.row_bytes() + vrow) + f.side_bytes_per_token()) * kKv);
            CHECK(cache.pool_stats().block_bytes == align64(block.bytes));

            // The planner, on a model of the same shape.
            kvq::ModelShape m;
            m.name = "one layer";
            m.n_layers = 1;
            m.n_heads = kKv;
            m.n_kv_heads = kKv;
            m.head_dim = kDim;
            const std::string label = std::string(kind.key) + (kind.center ? "+center" : "") + "/" + kValue;
            const double planned = kvq::kv_bytes_per_token(m, kvq::KVFormat::parse(label), bt);
            CHECK(planned == (f.bytes_per_token() + double(vrow)) * kKv);
            CHECK(planned == doctest::Approx(cache.bytes_per_token(0)));

            // The tables' key blocks (one kv head): as the format places them.
            const size_t n_rows = 2 * size_t(bt) + 5;
            const auto k = kvq::test::gaussian(n_rows * kDim, 7, 0.5f);
            const auto q = kvq::detail::quantize_keys(key, k.data(), n_rows, kind.center, bt);
            CHECK(q.block_bytes == f.head_block_bytes());
            CHECK(q.rows.size() == 3 * f.head_block_bytes());
            CHECK(q.centered == (kind.side == KeySide::means));
            CHECK(q.per_channel == (kind.side == KeySide::channel_params));
            if (q.centered) CHECK(q.mean_offset == f.head_side_offset());
            if (q.per_channel) CHECK(q.channel_offset == f.head_side_offset());
        }
    }
}

TEST_CASE("key block format: per-channel keys take no centering") {
    CHECK_THROWS_AS(kvq::detail::KeyBlockFormat(kvq::detail::make_channel_key_codec(4, 64), true, 32), std::invalid_argument);
    const kvq::detail::KeyBlockFormat plain(kvq::Codec::make("q8_0", 64), false, 32);
    CHECK(plain.side_bytes() == 0);
    CHECK(plain.side_bytes_per_token() == 0.0);
}
