// Block layouts of the ggml-compatible codecs. Each struct is byte-identical to ggml's block of the
// same name (ggml/src/ggml-common.h); the size asserts pin that down.
//
// | codec  | bytes | layout (32 values per block)                                              |
// |--------|-------|---------------------------------------------------------------------------|
// | q8_0   | 34    | fp16 d; int8 qs[32];          x = d·q                                     |
// | q4_0   | 18    | fp16 d; qs[16] nibbles;       x = d·(q−8); low nibble j, high nibble j+16   |
// | q4_1   | 20    | fp16 d, m; qs[16] nibbles;    x = d·q + m                                  |
// | q5_0   | 22    | fp16 d; qh[4]; qs[16];        x = d·(q−16); bit 4 of value j in qh bit j    |
// | q5_1   | 24    | fp16 d, m; qh[4]; qs[16];     x = d·q + m                                  |
// | iq4_nl | 18    | fp16 d; qs[16] nibbles;       x = d·kIQ4NLValues[q]; nibbles as q4_0         |
//
// The prepared query of the quantized-key codecs is BlockQ8Query: the query quantized to int8 per
// block with a float scale (more exact than ggml's fp16 one) and the block sum, so that a key block
// costs one integer dot product, as ggml's vec_dot does.
#pragma once

#include <cmath>
#include <cstdint>

// Rows are plain bytes at any address (callers may stride them by any byte count), so every block
// type is packed: alignment 1, the compiler emits loads that are valid at any address, and its
// layout (no padding either way) is unchanged.

namespace kvq::detail {

inline constexpr int kQK = 32;  // values per block of every ggml-layout codec here

struct __attribute__((packed)) BlockQ8_0 {
    uint16_t d;
    int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8_0) == 34, "ggml block_q8_0 is 34 bytes");

struct __attribute__((packed)) BlockQ4_0 {
    uint16_t d;
    uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_0) == 18, "ggml block_q4_0 is 18 bytes");

struct __attribute__((packed)) BlockQ4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ4_1) == 20, "ggml block_q4_1 is 20 bytes");

struct __attribute__((packed)) BlockQ5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_0) == 22, "ggml block_q5_0 is 22 bytes");

struct __attribute__((packed)) BlockQ5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockQ5_1) == 24, "ggml block_q5_1 is 24 bytes");

struct __attribute__((packed)) BlockIQ4_NL {
    uint16_t d;
    uint8_t qs[kQK / 2];
};
static_assert(sizeof(BlockIQ4_NL) == 18, "ggml block_iq4_nl is 18 bytes");
// iq4_nl's 16 levels (ggml's kvalues_iq4nl): a non-uniform grid, denser near zero.
inline constexpr int8_t kIQ4NLValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

struct __attribute__((packed)) BlockQ8Query {
    float d;        // scale: x ≈ d·q
    float s;        // d·Σq, for codecs with an offset m
    int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8Query) == 40, "prepared query block");
static_assert(alignof(BlockQ8_0) == 1 && alignof(BlockQ5_1) == 1 && alignof(BlockQ8Query) == 1);

// The value of largest |x| in a block, the first of equals (ggml's amax/max loop of q4_0, q5_0, iq4_nl);
// the SIMD quantizers take it for blocks with ties. static: SIMD levels include it with their own flags.
static inline float signed_extreme(const float* xb) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
        if (amax < std::fabs(xb[j])) {
            amax = std::fabs(xb[j]);
            max = xb[j];
        }
    }
    return max;
}

}  // namespace kvq::detail
