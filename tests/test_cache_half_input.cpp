// KVCache::append of keys and values held as 16-bit floats (HalfType::f16, bf16): the same bytes and
// attention as the float32 rows they hold exactly; bad arguments throw and store nothing.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kvq/cache.hpp"
#include "test_util.hpp"

namespace {

uint32_t bits_of(float x) {
    uint32_t u;
    std::memcpy(&u, &x, sizeof u);
    return u;
}

// f16 bits of 0 or a normal value f16 holds exactly.
uint16_t f16_bits(float x) {
    const uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) == 0) return static_cast<uint16_t>(u >> 16);
    const uint32_t sign = (u >> 16) & 0x8000u, exp = ((u >> 23) & 0xffu) - 127u + 15u, mant = (u & 0x7fffffu) >> 13;
    return static_cast<uint16_t>(sign | (exp << 10) | mant);
}

}  // namespace

TEST_CASE("cache: f16 and bf16 keys and values attend as the floats they hold") {
    kvq::CacheConfig cfg;
    cfg.n_layers = 1;
    cfg.n_kv_heads = 2;
    cfg.n_heads = 4;
    cfg.head_dim = 64;
    cfg.block_tokens = 16;
    const size_t tokens = 40, n = tokens * 2 * 64;
    for (const kvq::HalfType type : {kvq::HalfType::f16, kvq::HalfType::bf16}) {
        CAPTURE(type == kvq::HalfType::f16);
        std::vector<float> k(n), v(n);
        std::vector<uint16_t> k16(n), v16(n);
        for (size_t i = 0; i < n; ++i) {
            k[i] = static_cast<float>(int(i * 37 % 255) - 127) / 64.0f;  // exact in f16 and bf16
            v[i] = static_cast<float>(int(i * 11 % 201) - 100) / 64.0f;
            k16[i] = type == kvq::HalfType::f16 ? f16_bits(k[i]) : static_cast<uint16_t>(bits_of(k[i]) >> 16);
            v16[i] = type == kvq::HalfType::f16 ? f16_bits(v[i]) : static_cast<uint16_t>(bits_of(v[i]) >> 16);
        }
        kvq::KVCache halves(cfg), floats(cfg);
        const auto a = halves.add_sequence(), b = floats.add_sequence();
        halves.append(0, a, k16.data(), v16.data(), tokens, type);
        floats.append(0, b, k.data(), v.data(), tokens);
        const auto q = kvq::test::gaussian(4 * 64, 9);
        std::vector<float> out_h(4 * 64), out_f(4 * 64);
        halves.attend(0, a, q.data(), out_h.data());
        floats.attend(0, b, q.data(), out_f.data());
        CHECK(std::memcmp(out_h.data(), out_f.data(), out_h.size() * sizeof(float)) == 0);

        const size_t used = halves.bytes_used();
        k16[5] = type == kvq::HalfType::f16 ? 0x7e00u : 0x7fc0u;  // NaN
        CHECK_THROWS_AS(halves.append(0, a, k16.data(), v16.data(), 1, type), std::invalid_argument);
        CHECK_THROWS_AS(halves.append(0, a, k16.data(), v16.data(), 1, static_cast<kvq::HalfType>(9)), std::invalid_argument);
        CHECK_THROWS_AS(halves.append(0, a, k16.data(), v16.data(), size_t(1) << 62, type), std::invalid_argument);
        CHECK_THROWS_AS(halves.append(0, a, nullptr, v16.data(), 1, type), std::invalid_argument);
        CHECK(halves.n_tokens(a, 0) == tokens);
        CHECK(halves.bytes_used() == used);
    }
}
