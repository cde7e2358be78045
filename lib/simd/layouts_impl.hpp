// The block layouts as the SIMD kernels see them (over the xsimd arch A and Ops<A>, ops.hpp): each
// block's values as signed int8 bytes, its scale and offset, and the dequantize of whole blocks (the
// specification's operations). Included by kernels_impl.hpp in one level's file.
#pragma once

#include <cstring>

#include "../ref/row_codecs.hpp"
#include "loops.hpp"

namespace kvq::simd {
namespace {

using detail::BlockQ8Query;

// Layouts: the block's values as signed int8 Bytes, and its scale and offset.
// The nibble layouts also give their codes before the offset (raw, 0..31) and the per-block term that
// the offset or the minimum adds to a dot product: x = d·(raw − off) or x = d·raw + m, so
// q·x = d·dq·Σ raw·y + bias·kBiasScale·s with bias·kBiasScale = −off·d or m and s = dq·Σy
// (BlockQ8Query::s).
struct LayoutQ8_0 {
    using Block = detail::BlockQ8_0;
    static constexpr bool has_min = false, unsigned_raw = false;
    template <class O>
    static auto bytes(const Block& b) { return O::load_q8(b.qs); }
    template <class O>
    static auto raw(const Block& b) { return bytes<O>(b); }
};
struct LayoutQ4_0 {
    using Block = detail::BlockQ4_0;
    static constexpr bool has_min = false, unsigned_raw = true;
    template <class O>
    static auto raw(const Block& b) { return O::load_nibbles(b.qs); }
    template <class O>
    static auto bytes(const Block& b) { return O::sub(raw<O>(b), 8); }
    static constexpr float kBiasScale = -8.0f;
    template <class O>
    static float bias(const Block&, float d) { return d; }
};
struct LayoutQ4_1 {
    using Block = detail::BlockQ4_1;
    static constexpr bool has_min = true, unsigned_raw = true;
    template <class O>
    static auto raw(const Block& b) { return O::load_nibbles(b.qs); }
    template <class O>
    static auto bytes(const Block& b) { return raw<O>(b); }
    static constexpr float kBiasScale = 1.0f;
    template <class O>
    static float bias(const Block& b, float) { return O::f16_value(b.m); }
};
struct LayoutQ5_0 {
    using Block = detail::BlockQ5_0;
    static constexpr bool has_min = false, unsigned_raw = true;
    template <class O>
    static auto raw(const Block& b) { return O::add_high_bits(O::load_nibbles(b.qs), b.qh); }
    template <class O>
    static auto bytes(const Block& b) { return O::sub(raw<O>(b), 16); }
    static constexpr float kBiasScale = -16.0f;
    template <class O>
    static float bias(const Block&, float d) { return d; }
};
struct LayoutQ5_1 {
    using Block = detail::BlockQ5_1;
    static constexpr bool has_min = true, unsigned_raw = true;
    template <class O>
    static auto raw(const Block& b) { return O::add_high_bits(O::load_nibbles(b.qs), b.qh); }
    template <class O>
    static auto bytes(const Block& b) { return raw<O>(b); }
    static constexpr float kBiasScale = 1.0f;
    template <class O>
    static float bias(const Block& b, float) { return O::f16_value(b.m); }
};

// iq4_nl: x = d·kIQ4NLValues[code]. Its bytes are the codes' levels (-127..113, looked up in registers:
// load_iq4_nl), signed like q8_0's, so it takes q8_0's kernels: no offset, the sign trick or VNNI's
// k ^ 0x80 in the dot products.
struct LayoutIQ4_NL {
    using Block = detail::BlockIQ4_NL;
    static constexpr bool has_min = false, unsigned_raw = false;
    template <class O>
    static auto bytes(const Block& b) { return O::load_iq4_nl(b.qs); }
    template <class O>
    static auto raw(const Block& b) { return bytes<O>(b); }
};

template <class O, class L>
float offset_of(const typename L::Block& b) {
    if constexpr (L::has_min) {
        return O::f16_value(b.m);
    } else {
        return 0.0f;
    }
}

// The 32 values of a block as floats: q·d (+ m), the specification's operations.
template <class A, class L>
void dequantize_block(const typename L::Block& b, xsimd::batch<float, A>* v) {
    using O = Ops<A>;
    using F = typename O::F;
    O::widen(L::template bytes<O>(b), v);
    const F d(O::f16_value(b.d));
    for (int k = 0; k < kPerBlock<A>; ++k) {
        if constexpr (L::has_min) {
            v[k] = v[k] * d + F(offset_of<O, L>(b));
        } else {
            v[k] = v[k] * d;
        }
    }
}

template <class A, class L>
void dequantize_blocks(const uint8_t* src, float* y, int64_t n) {
    const auto* b = reinterpret_cast<const typename L::Block*>(src);
    for (int64_t i = 0; i < n / kQK; ++i) {
        xsimd::batch<float, A> v[kPerBlock<A>];
        dequantize_block<A, L>(b[i], v);
        for (int k = 0; k < kPerBlock<A>; ++k) v[k].store_unaligned(y + i * kQK + k * kLanes<A>);
    }
}

}  // namespace
}  // namespace kvq::simd
