// The key format (lib/codec/key_format.hpp) says how many bytes a sealed block's keys take, the block layout
// (lib/codec/block_layout.hpp) where they sit: their answers are what the cache's bytes_per_token and pool
// blocks, the planner and the accuracy tables' key blocks hold, for every kind of key format
// (lib/codec/key_formats.cpp makes them all).
#include <doctest/doctest.h>

#include <stdexcept>
#include <string>

#include "codec/block_layout.hpp"
#include "codec/key_formats.hpp"
#include "codec/value_format.hpp"
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
    const char* key;  // CacheConfig::key_codec (key formats included)
    bool center;
    size_t side;      // one kv head's side data: fp16 means (2d), chanB minimums and steps (4d), sinks
};

// Sinks: the wrapped format's side data padded to 4, a 4-byte count, N rows of fp16.
constexpr size_t sinks(size_t inner, size_t n) { return (inner + 3) / 4 * 4 + 4 + n * 2 * kDim; }

const KeyKind kKinds[] = {
    {"f16", false, 0},          {"q8_0", false, 0},           {"q4_0", false, 0},
    {"q4_0", true, 2 * kDim},   {"f16", true, 2 * kDim},      {"chan3", false, 4 * kDim},
    {"chan4", false, 4 * kDim}, {"chan8", false, 4 * kDim},   {"polar", false, 0},
    {"polar", true, 2 * kDim},  {"turbo4", false, 0},         {"turbo3", true, 2 * kDim},
    {"q4_0+rot", true, 2 * kDim}, {"q4_0+sink1", false, sinks(0, 1)}, {"q4_0+rot+sink4", true, sinks(2 * kDim, 4)},
    {"chan4+sink2", false, sinks(4 * kDim, 2)},
};

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

}  // namespace

TEST_CASE("key formats: the cache, the planner and the tables hold the bytes it gives, for every key codec kind") {
    const size_t vrow = kvq::Codec::make(kValue, kDim).row_bytes();
    for (const int bt : {32, 16, 20}) {
        for (const KeyKind& kind : kKinds) {
            CAPTURE(bt);
            CAPTURE(kind.key);
            CAPTURE(kind.center);
            const auto format = kvq::detail::make_key_format(kvq::detail::key_spec_centered(kind.key, kind.center), kDim, bt);
            const kvq::detail::KeyFormat& f = *format;
            const kvq::Codec& key = f.codec();

            // Its own answers, from the definitions.
            const size_t side = kind.side;
            REQUIRE(f.side_bytes() == side);
            CHECK(f.head_dim() == kDim);
            CHECK(f.block_tokens() == bt);
            CHECK(f.row_bytes() == key.row_bytes());
            CHECK(f.rows_bytes() == size_t(bt) * key.row_bytes());
            CHECK(f.bytes_per_token() == doctest::Approx(double(key.row_bytes()) + double(side) / bt));
            const kvq::detail::HeadBlock alone = kvq::detail::head_block(f.rows_bytes(), f.side_bytes());
            if (side == 0) {
                CHECK(alone.side_offset == kvq::detail::kNoSide);
                CHECK(alone.bytes == f.rows_bytes());
            } else {
                CHECK(alone.side_offset == align64(f.rows_bytes()));
                CHECK(alone.bytes == align64(alone.side_offset + side));
            }
            const auto values = kvq::detail::make_value_format(kvq::Codec::make(kValue, kDim), bt, false);
            const kvq::detail::BlockLayout block = kvq::detail::pool_block_layout(f, *values, kKv, false);
            CHECK(block.block_tokens == bt);
            CHECK(block.keys.offset == 0);
            CHECK(block.keys.head_stride == f.rows_bytes());
            CHECK(block.values.offset == align64(kKv * f.rows_bytes()));
            CHECK(block.values.head_stride == bt * vrow);
            CHECK(block.values.side_offset == kvq::detail::kNoSide);  // no value format has side data today
            if (side == 0) {
                CHECK(block.keys.side_offset == kvq::detail::kNoSide);
                CHECK(block.bytes == block.values.offset + kKv * bt * vrow);
            } else {
                CHECK(block.keys.side_offset == align64(block.values.offset + kKv * bt * vrow));
                CHECK(block.keys.side_stride == side);
                CHECK(block.bytes == block.keys.side_offset + kKv * side);
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
            CHECK(cache.bytes_per_token(0) == (double(key.row_bytes() + vrow) + double(side) / bt) * kKv);
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
            const auto q = kvq::detail::quantize_keys(f, k.data(), n_rows);
            CHECK(q.block_bytes == alone.bytes);
            CHECK(q.rows.size() == 3 * alone.bytes);
        }
    }
}

TEST_CASE("key formats: per-channel keys take no centering, and specs no format takes are refused") {
    CHECK_THROWS_WITH_AS(kvq::detail::make_key_format("chan4+center", 64, 32), doctest::Contains("+center does not apply"), kvq::BadParams);
    for (const char* bad : {"q4_0+sink0", "q4_0+sink17", "q4_0+sink", "q4_0+sinkx", "q4_0+sink01", "chan9", "nope+sink1"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(kvq::detail::make_key_format(bad, 64, 32), std::invalid_argument);
    }
    const auto plain = kvq::detail::make_key_format("q8_0", 64, 32);
    CHECK(plain->side_bytes() == 0);
    CHECK(plain->bytes_per_token() == double(plain->row_bytes()));
    CHECK(plain->name() == "q8_0");
    CHECK(kvq::detail::make_key_format("q4_0+rot+sink3", 64, 32)->name() == "q4_0+rot+sink3");
}
