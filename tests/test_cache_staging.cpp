// Float16 staging of the open block (CacheConfig::staging): the rows are held as IEEE binary16 until the
// block seals, so a sealed block holds what float32 staging of the same f16-rounded rows would, the open
// block reads back f16-rounded, the staging takes half the memory and pool capacity, values beyond 65504
// are refused, and the type is saved, checked by load_into, and a version 1 file still loads.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/crc32c.hpp"
#include "kvq/cache.hpp"
#include "ref/half.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::StagingType;

namespace {

CacheConfig config(StagingType staging) {
    CacheConfig c;
    c.n_layers = 2;
    c.n_kv_heads = 2;
    c.n_heads = 4;
    c.head_dim = 64;
    c.staging = staging;
    return c;
}

std::vector<float> rounded_to_f16(std::vector<float> x) {
    for (float& v : x) v = kvq::detail::f16_to_f32(kvq::detail::f32_to_f16(v));
    return x;
}

std::vector<float> attend(const KVCache& c, kvq::SequenceId s, const std::vector<float>& q) {
    std::vector<float> out(q.size());
    c.attend(1, s, q.data(), out.data());
    return out;
}

std::string temp_path(const char* name) {
    return (std::filesystem::temp_directory_path() / (std::string("kvq_staging_") + name)).string();
}

}  // namespace

TEST_CASE("staging f16: sealed blocks as float32 staging of f16-rounded rows, the open block f16-rounded") {
    const CacheConfig c16 = config(StagingType::f16), c32 = config(StagingType::f32);
    const size_t token = size_t(c16.n_kv_heads) * c16.head_dim;
    const auto k = kvq::test::gaussian(80 * token, 1), v = kvq::test::gaussian(80 * token, 2);
    const auto q = kvq::test::gaussian(size_t(c16.n_heads) * c16.head_dim, 3);
    KVCache half(c16), full(c32);
    const auto a = half.add_sequence(), b = full.add_sequence();
    const auto k16 = rounded_to_f16(k), v16 = rounded_to_f16(v);
    for (int l = 0; l < 2; ++l) {
        half.append(l, a, k.data(), v.data(), 64);      // two sealed blocks
        full.append(l, b, k16.data(), v16.data(), 64);  // the same rows, rounded by the caller
    }
    CHECK(attend(half, a, q) == attend(full, b, q));  // bit for bit: the same sealed bytes
    for (int l = 0; l < 2; ++l) {
        half.append(l, a, k.data() + 64 * token, v.data() + 64 * token, 16);  // an open block
        full.append(l, b, k16.data() + 64 * token, v16.data() + 64 * token, 16);
    }
    const auto oh = attend(half, a, q), of = attend(full, b, q);
    for (size_t i = 0; i < oh.size(); ++i) CHECK(oh[i] == doctest::Approx(of[i]).epsilon(1e-5));

    // Half the staging memory: each sequence's two layers hold one open block each.
    const size_t staging32 = 2 * size_t(2) * 2 * 32 * 64 * sizeof(float);
    CHECK(full.bytes_used() - half.bytes_used() == staging32 / 2);
    CHECK(half.pool_stats().blocks_reserved <= full.pool_stats().blocks_reserved);
}

TEST_CASE("staging f16: a value beyond 65504 is refused and nothing is stored, where f32 staging takes it") {
    std::vector<float> k(2 * 64, 0.5f), v(2 * 64, 0.5f);
    k[70] = 70000.0f;  // q8_0 keys store it; f16 staging cannot
    KVCache half(config(StagingType::f16)), full(config(StagingType::f32));
    const auto a = half.add_sequence(), b = full.add_sequence();
    CHECK_THROWS_AS(half.append(0, a, k.data(), v.data(), 1), std::invalid_argument);
    CHECK(half.n_tokens(a) == 0);
    CHECK(half.bytes_used() == KVCache(config(StagingType::f16)).bytes_used() + KVCache::sequence_bookkeeping_bytes(2));
    full.append(0, b, k.data(), v.data(), 1);
    CHECK(full.n_tokens(b) == 1);
}

TEST_CASE("staging f16: saved and loaded bit for bit, load_into names the staging type, version 1 files load") {
    const CacheConfig c16 = config(StagingType::f16);
    const size_t token = size_t(c16.n_kv_heads) * c16.head_dim;
    const auto k = kvq::test::gaussian(45 * token, 4), v = kvq::test::gaussian(45 * token, 5);
    const auto q = kvq::test::gaussian(size_t(c16.n_heads) * c16.head_dim, 6);
    KVCache cache(c16);
    const auto s = cache.add_sequence();
    for (int l = 0; l < 2; ++l) cache.append(l, s, k.data(), v.data(), 45);  // a sealed block, 13 staged rows
    const std::string path = temp_path("f16.kvq");
    cache.save(path);
    const KVCache loaded = KVCache::load(path);
    CHECK(loaded.config().staging == StagingType::f16);
    CHECK(attend(loaded, loaded.sequences()[0], q) == attend(cache, s, q));

    KVCache other(config(StagingType::f32));
    try {
        other.load_into(path);
        FAIL("load_into a cache of another staging type");
    } catch (const kvq::ConfigMismatch& e) {
        CHECK(std::string(e.what()).find("staging") != std::string::npos);
    }

    // A version 1 file: the same header without the staging field (f32 staging), the CRC redone.
    KVCache f32_cache(config(StagingType::f32));
    const auto s32 = f32_cache.add_sequence();
    for (int l = 0; l < 2; ++l) f32_cache.append(l, s32, k.data(), v.data(), 45);
    f32_cache.save(path);
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> b{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    in.close();
    uint32_t header_bytes;
    std::memcpy(&header_bytes, b.data() + 12, 4);
    uint32_t staging_field;
    std::memcpy(&staging_field, b.data() + 120, 4);
    REQUIRE(staging_field == 0);
    // Version 3's fields at the header's end (no layer codecs, one kind of 32 bytes) go too.
    constexpr uint32_t kV3Fields = 4 + 4 + 32;
    b.erase(b.begin() + header_bytes - 4 - kV3Fields, b.begin() + header_bytes - 4);
    b.erase(b.begin() + 120, b.begin() + 124);
    header_bytes -= 4 + kV3Fields;
    const uint32_t version = 1;
    std::memcpy(b.data() + 8, &version, 4);
    std::memcpy(b.data() + 12, &header_bytes, 4);
    const uint32_t crc = kvq::detail::crc32c(b.data(), header_bytes - 4);
    std::memcpy(b.data() + header_bytes - 4, &crc, 4);
    b.insert(b.begin() + header_bytes, 4 + kV3Fields, 0);  // the payloads stay where the file's offsets say
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    const KVCache v1 = KVCache::load(path);
    CHECK(v1.config().staging == StagingType::f32);
    CHECK(attend(v1, v1.sequences()[0], q) == attend(f32_cache, s32, q));
    std::remove(path.c_str());
}
