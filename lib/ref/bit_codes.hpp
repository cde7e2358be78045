// Codes of 0..8 bits packed back to back, little-endian: code i of a b-bit section starts at bit i·b
// (bit k of a byte is (byte >> k) & 1). Eight b-bit codes fill b whole bytes, so a SIMD kernel can load
// one 32-bit word for eight codes and shift each lane by b·lane.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq::detail {

// Sets code into a zeroed bit range starting at bit `bit` of base.
static inline void put_code(uint8_t* base, size_t bit, int bits, uint32_t code) {
    for (int i = 0; i < bits; ++i) {
        if ((code >> i) & 1u) base[(bit + i) >> 3] |= static_cast<uint8_t>(1u << ((bit + i) & 7));
    }
}

// Reads `bits` bits starting at bit `bit`; touches only the bytes that hold them.
static inline uint32_t get_code(const uint8_t* base, size_t bit, int bits) {
    if (bits == 0) return 0;
    const size_t byte = bit >> 3;
    const unsigned shift = bit & 7;
    uint32_t word = base[byte];
    if (shift + bits > 8) word |= static_cast<uint32_t>(base[byte + 1]) << 8;
    return (word >> shift) & ((1u << bits) - 1);
}

static inline size_t bytes_for_bits(size_t bits) { return (bits + 7) / 8; }

}  // namespace kvq::detail
