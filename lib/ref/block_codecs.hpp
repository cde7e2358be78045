// The block codecs of the specification, one row each: everything the rest of kvq asks about a block
// codec (its name, layout, input limit, scalar kernels, the round-trip bound the tests hold it to) is in
// its row here. The codec table (lib/codec/table.cpp), the SIMD levels' fallbacks, the self-check, the
// C API, Python and the tests all read these rows; a block codec is added by adding its enum value, its
// scalar kernels and its row (and, optionally, SIMD kernels in lib/simd/kernels_impl.hpp). A codec that
// writes another codec's blocks with a different encoder (iq4_nls) names that codec in its row's
// blocks_of: it then takes that codec's decode kernels at every level, its own quantize only.
#pragma once

#include <cstddef>

#include "kernels.hpp"

namespace kvq::detail {

enum class BlockCodec : int { f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_nls, count };

struct BlockCodecTraits {
    BlockCodec id;
    // kvq's name. For a codec with blocks of its own (blocks_of == count) also ggml's name for the type,
    // its bytes identical to ggml's reference quantizer's. iq4_nls is the one exception: its blocks are
    // ggml's iq4_nl (a ggml engine reads them as GGML_TYPE_IQ4_NL), encoded as ggml's tensor quantizer
    // (quantize_iq4_nl) encodes them; no ggml type is called iq4_nls.
    const char* name;
    int block;            // values per block; a row's head_dim must be a multiple
    int bytes_per_block;
    bool plain;           // values stored as they are; queries are used as floats, not quantized
    float max_abs;        // the largest |x_j| stored with finite fields (an fp16 scale, min or value)
    const char* layout;   // one line for `kvq info`
    const BlockKernels* scalar;  // the specification
    // Round trip, for the tests: |x_j − x'_j| ≤ max_rel_error · max_j |x_j| over the block (plain codecs:
    // over the value itself), derived from the layout (see each row) for any input within max_abs.
    double max_rel_error;
    // The codec whose blocks this one writes, if another: same layout, same decoding (dispatch gives it
    // that codec's dequantize, prepare_query, score, accumulate kernels at every level), same ggml type;
    // only quantize differs. BlockCodec::count: its own blocks.
    BlockCodec blocks_of = BlockCodec::count;
};

inline constexpr float kF16Max = 65504.0f;

// In enum order (checked below). Bounds: d = amax/127 (q8_0) rounds half a step plus 127 times the
// fp16 error of d (2^-11 relative); q4_0/q5_0 truncate x/d + 8.5 (16.5), so a full step |d| = amax/8
// (16); q4_1/q5_1 half a step of (max − min)/15 (31) ≤ 2·amax/15 (31) plus the fp16 errors of d and min;
// iq4_nl: codes chosen at d₀ = max/−127 are at most 12·|d₀| (half its widest gap) from x/d₀, and the
// weighted least-squares d moves at most 0.35·|d₀| from d₀, so |x − d·q| ≤ (12 + 0.35·127)·amax/127.
// iq4_nls: d is the x²-weighted least-squares scale of one candidate's codes, a mean of x_j/q_j weighted
// by x_j²q_j², at an inverse scale putting the block's extreme at u ∈ {127} ∪ [−134, −120] (in level
// units); over any 31 other values (|u_j| ≤ |u|) d·id stays in [0.89, 1.19] (found by a fractional-
// program search over the worst value u_j, the same for all 31: 0.895..1.181), so δ = |d|/amax is in
// [0.89/134, 1.19/120]. The stored codes are the nearest levels at d: a value inside the grid is at most
// 12·|d| away (half the widest gap), one beyond it at most amax − 113·|d|; plus 127 times the fp16 error
// of d. So |x − d·q| ≤ max(12·1.19/120, 1 − 113·0.89/134)·amax + 127·2⁻¹¹·1.19/120·amax.
inline constexpr BlockCodecTraits kBlockCodecs[] = {
    {BlockCodec::f32, "f32", 1, 4, true, 3.4028234e38f, "float32 values", &kScalarF32, 0.0},
    {BlockCodec::f16, "f16", 1, 2, true, kF16Max, "IEEE binary16 values", &kScalarF16, 0x1p-11},
    {BlockCodec::bf16, "bf16", 1, 2, true, 0x1.fep127f, "bfloat16 values", &kScalarBF16, 0x1p-8},
    {BlockCodec::q8_0, "q8_0", 32, 34, false, kF16Max * 127, "per 32: fp16 d, 32 x int8; x = d*q", &kScalarQ8_0,
     0.5 / 127 + 0x1p-11 * 1.01},
    {BlockCodec::q4_0, "q4_0", 32, 18, false, kF16Max * 8, "per 32: fp16 d, 16 bytes of nibbles; x = d*(q-8)",
     &kScalarQ4_0, 1.0 / 8 + 0x1p-11 * 1.01},
    {BlockCodec::q4_1, "q4_1", 32, 20, false, kF16Max, "per 32: fp16 d, fp16 m, 16 bytes of nibbles; x = d*q + m",
     &kScalarQ4_1, 1.0 / 15 + 3 * 0x1p-11 * 1.01},
    {BlockCodec::q5_0, "q5_0", 32, 22, false, kF16Max * 16,
     "per 32: fp16 d, 4 bytes high bits, 16 bytes nibbles; x = d*(q-16)", &kScalarQ5_0, 1.0 / 16 + 0x1p-11 * 1.01},
    {BlockCodec::q5_1, "q5_1", 32, 24, false, kF16Max,
     "per 32: fp16 d, fp16 m, 4 bytes high bits, 16 bytes nibbles; x = d*q + m", &kScalarQ5_1,
     1.0 / 31 + 3 * 0x1p-11 * 1.01},
    // |d| ≤ 6·amax/127 (a code's ratio x/q is at most 6·d₀), so amax ≤ 16·65504 keeps d finite in fp16.
    {BlockCodec::iq4_nl, "iq4_nl", 32, 18, false, kF16Max * 16,
     "per 32: fp16 d, 16 bytes of nibbles; x = d*kvalues[q] (16 non-uniform levels, -127..113)", &kScalarIQ4_NL,
     (12 + 0.35 * 127) / 127},
    // iq4_nl's blocks, ggml's scale-searching encoder. |d| ≤ 1.19·amax/120 keeps d finite in fp16 as above.
    {BlockCodec::iq4_nls, "iq4_nls", 32, 18, false, kF16Max * 16,
     "ggml block_iq4_nl (read as iq4_nl) from ggml's scale search (quantize_iq4_nl, ntry 7): per 32: fp16 d, "
     "16 bytes of nibbles; x = d*kvalues[q]",
     &kScalarIQ4_NLS, 1 - 113 * 0.89 / 134 + 127 * 1.19 / 120 * 0x1p-11, BlockCodec::iq4_nl},
};
inline constexpr int kBlockCodecCount = static_cast<int>(BlockCodec::count);

constexpr bool block_codecs_in_order() {
    if (sizeof kBlockCodecs / sizeof kBlockCodecs[0] != static_cast<size_t>(kBlockCodecCount)) return false;
    for (int i = 0; i < kBlockCodecCount; ++i) {
        if (static_cast<int>(kBlockCodecs[i].id) != i) return false;
    }
    return true;
}
static_assert(block_codecs_in_order(), "kBlockCodecs: one row per BlockCodec, in enum order");

// A codec writing another's blocks: that codec has blocks of its own and the same block, size and kind.
constexpr bool blocks_of_consistent() {
    for (const auto& t : kBlockCodecs) {
        if (t.blocks_of == BlockCodec::count) continue;
        const auto& o = kBlockCodecs[static_cast<int>(t.blocks_of)];
        if (o.blocks_of != BlockCodec::count || o.block != t.block || o.bytes_per_block != t.bytes_per_block ||
            o.plain != t.plain || o.max_abs != t.max_abs)
            return false;
    }
    return true;
}
static_assert(blocks_of_consistent(), "kBlockCodecs: blocks_of names a codec with its own blocks of the same layout");

// static: SIMD files include this header (see half.hpp).
static constexpr const BlockCodecTraits& block_traits(BlockCodec c) { return kBlockCodecs[static_cast<int>(c)]; }
static constexpr const char* codec_name(BlockCodec c) { return block_traits(c).name; }
static constexpr bool is_plain(BlockCodec c) { return block_traits(c).plain; }
// The codec whose blocks (and decode kernels) codec c uses: c itself, or its row's blocks_of.
static constexpr BlockCodec blocks_codec(BlockCodec c) {
    return block_traits(c).blocks_of == BlockCodec::count ? c : block_traits(c).blocks_of;
}
// ggml's name for the type of codec c's blocks (for plain and ggml-layout codecs alike).
static constexpr const char* ggml_type_name(BlockCodec c) { return codec_name(blocks_codec(c)); }
// The scalar specification's kernels of codec c.
static constexpr const BlockKernels& scalar_kernels(BlockCodec c) { return *block_traits(c).scalar; }

}  // namespace kvq::detail
