#include "crc32c.hpp"

#include <array>

namespace kvq::detail {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, bit-reversed

// tables[k][b]: the CRC of byte b followed by k zero bytes, so eight bytes are folded in one step.
using Tables = std::array<std::array<uint32_t, 256>, 8>;

constexpr Tables make_tables() {
    Tables t{};
    for (uint32_t b = 0; b < 256; ++b) {
        uint32_t c = b;
        for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1u) ? kPolynomial : 0u);
        t[0][b] = c;
    }
    for (int k = 1; k < 8; ++k) {
        for (uint32_t b = 0; b < 256; ++b) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xFF];
    }
    return t;
}

constexpr Tables kTables = make_tables();

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
    const auto* p = static_cast<const uint8_t*>(data);
    uint32_t c = ~crc;
    for (; n >= 8; n -= 8, p += 8) {
        // Bytes in little-endian order whatever the host's order is (the file format is little-endian).
        const uint32_t lo = c ^ (uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24);
        c = kTables[7][lo & 0xFF] ^ kTables[6][(lo >> 8) & 0xFF] ^ kTables[5][(lo >> 16) & 0xFF] ^ kTables[4][lo >> 24] ^
            kTables[3][p[4]] ^ kTables[2][p[5]] ^ kTables[1][p[6]] ^ kTables[0][p[7]];
    }
    for (; n > 0; --n, ++p) c = (c >> 8) ^ kTables[0][(c ^ *p) & 0xFF];
    return ~c;
}

}  // namespace kvq::detail
