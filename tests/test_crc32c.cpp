// crc32c: the CPU's instruction (where crc32c uses it) and the tables give the same checksum for every
// length, alignment and starting value; both on the RFC 3720 vectors.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "cache/crc32c.hpp"
#include "test_util.hpp"

TEST_CASE("crc32c: the instruction and the tables agree, every length and alignment") {
    using kvq::detail::crc32c;
    using kvq::detail::crc32c_portable;
    const std::string used = kvq::detail::crc32c_hardware() ? "the CPU's crc32 instruction" : "the tables";
    MESSAGE("crc32c uses " << used);
    CHECK(crc32c_portable("123456789", 9) == 0xE3069283u);
    CHECK(crc32c("123456789", 9) == 0xE3069283u);
    const auto noise = kvq::test::gaussian(1200, 11);
    const auto* bytes = reinterpret_cast<const uint8_t*>(noise.data());
    for (size_t offset = 0; offset < 9; ++offset) {
        for (size_t n = 0; n < 300; ++n) {
            CAPTURE(offset);
            CAPTURE(n);
            CHECK(crc32c(bytes + offset, n) == crc32c_portable(bytes + offset, n));
            CHECK(crc32c(bytes + offset, n, 0x12345678u) == crc32c_portable(bytes + offset, n, 0x12345678u));
        }
    }
    CHECK(crc32c(bytes, 4800) == crc32c_portable(bytes, 4800));
}
