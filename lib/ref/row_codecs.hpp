// The row-codec registry: every codec of a row of a KV cache is one row of kRowCodecs, and everything
// kvq asks about it is in that row: its name, layout, ggml type, and how it is built (a block codec's
// scalar kernels, input limit and round-trip bound; a turbo codec's configuration). The codec layer
// builds codecs from these rows (lib/codec/table.cpp), the SIMD levels take a block codec's
// specification kernels where they have none of their own, and the self-check, the C API, Python, the
// ggml backend and the tests all read them. A codec is added here:
//   - a block codec: its BlockCodec value, its row below (at that index), its scalar kernels (kernels.hpp),
//     optionally SIMD kernels in lib/simd/ (level files name them);
//   - a turbo variant of widths, split, QJL or trellis the turbo kernels take: its row below, with its TurboConfig;
//   - a new family: a CodecFamily value and its builder in lib/codec/table.cpp.
// A codec that writes another codec's blocks with a different encoder (iq4_nls) names that codec in its
// row's blocks_of: it then takes that codec's decode kernels at every level, its own quantize only.
// The key-only formats fitted to a block of tokens (chanB, +sinkN) are KVCache key formats, not rows
// (lib/codec/key_formats.hpp).
#pragma once

#include <cstddef>
#include <string_view>

#include "kernels.hpp"

namespace kvq::detail {

enum class BlockCodec : int { f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl, iq4_nls, count };

// How a row's codec is built (lib/codec/table.cpp): blocks of the row's layout with the row's kernels
// (lib/codec/block_codec.hpp), or one of the codecs that rotate rows themselves (turbo.hpp, polar.hpp).
enum class CodecFamily : int { block, turbo, polar };

enum class TurboScale { norm, ls, unbiased };

// A turbo-family codec (lib/codec/turbo.hpp).
struct TurboConfig {
    int bits_hi = 4;   // width of the first n_hi channels
    int bits_lo = 4;   // width of the others
    bool half_split = false;  // n_hi = d/2 (fractional codecs); otherwise n_hi = d
    bool qjl = false;  // add the QJL residual sketch and residual norm
    TurboScale scale = TurboScale::ls;  // set by the spec's "scale=" parameter; the _qjl codecs use norm
    int trellis = 0;   // B for tcqB (the bits fields unused), else 0
};

// ggml's type ids (enum ggml_type in ggml.h; stable, GGUF stores them).
inline constexpr int kNoGgmlType = -1;

struct RowCodecTraits {
    // kvq's name. A row with a ggml type and blocks of its own has ggml's name for the type (the ggml
    // backend checks it against ggml when it registers).
    const char* name;
    int block;            // values per block; a row's head_dim must be a multiple
    int bytes_per_block;  // the rotating codecs: without their per-row fp16 fields
    // The ggml type whose blocks these bytes are (GGML_TYPE_Q4_0 = 2, ...), byte for byte as ggml's
    // reference quantizer writes them; kNoGgmlType for bytes no ggml type has. iq4_nls writes iq4_nl's
    // blocks (GGML_TYPE_IQ4_NL) with ggml's tensor quantizer's encoder: its type is iq4_nl's, but the
    // codec that reads that type is iq4_nl, whose name is ggml's (codec_for_ggml_type).
    int ggml_type = kNoGgmlType;
    const char* layout = "";  // one line for `kvq info`
    CodecFamily family = CodecFamily::block;

    // Block codecs (family block) only.
    BlockCodec id = BlockCodec::count;  // its index in kRowCodecs and in every SIMD level's kernel table
    bool plain = false;    // values stored as they are; queries are used as floats, not quantized
    float max_abs = 0.0f;  // the largest |x_j| stored with finite fields (an fp16 scale, min or value)
    const BlockKernels* scalar = nullptr;  // the specification
    // Round trip, for the tests: |x_j − x'_j| ≤ max_rel_error · max_j |x_j| over the block (plain codecs:
    // over the value itself), derived from the layout (see each row) for any input within max_abs.
    double max_rel_error = 0.0;
    // The codec whose blocks this one writes, if another: same layout, same decoding (dispatch gives it
    // that codec's dequantize, prepare_query, score, accumulate kernels at every level), same ggml type;
    // only quantize differs. BlockCodec::count: its own blocks.
    BlockCodec blocks_of = BlockCodec::count;

    // Turbo codecs (family turbo) only.
    TurboConfig turbo{};

    constexpr bool rotates() const { return family != CodecFamily::block; }  // "+rot" adds nothing
    // Bytes identical to ggml's type of the same name.
    constexpr bool ggml_layout() const { return ggml_type != kNoGgmlType && blocks_of == BlockCodec::count; }
};

inline constexpr float kF16Max = 65504.0f;

// The block codecs first, in BlockCodec order (checked below), then the codecs that rotate rows.
//
// Block bounds: d = amax/127 (q8_0) rounds half a step plus 127 times the fp16 error of d (2^-11
// relative); q4_0/q5_0 truncate x/d + 8.5 (16.5), so a full step |d| = amax/8 (16); q4_1/q5_1 half a
// step of (max − min)/15 (31) ≤ 2·amax/15 (31) plus the fp16 errors of d and min; iq4_nl: codes chosen
// at d₀ = max/−127 are at most 12·|d₀| (half its widest gap) from x/d₀, and the weighted least-squares d
// moves at most 0.35·|d₀| from d₀, so |x − d·q| ≤ (12 + 0.35·127)·amax/127.
// iq4_nls: d is the x²-weighted least-squares scale of one candidate's codes, a mean of x_j/q_j weighted
// by x_j²q_j², at an inverse scale putting the block's extreme at u ∈ {127} ∪ [−134, −120] (in level
// units); over any 31 other values (|u_j| ≤ |u|) d·id stays in [0.89, 1.19] (found by a fractional-
// program search over the worst value u_j, the same for all 31: 0.895..1.181), so δ = |d|/amax is in
// [0.89/134, 1.19/120]. The stored codes are the nearest levels at d: a value inside the grid is at most
// 12·|d| away (half the widest gap), one beyond it at most amax − 113·|d|; plus 127 times the fp16 error
// of d. So |x − d·q| ≤ max(12·1.19/120, 1 − 113·0.89/134)·amax + 127·2⁻¹¹·1.19/120·amax.
//
// The rotating codecs' bytes_per_block leave out the per-row fp16 norms. polar's row is that of its
// default (L=4, bits 4.2.2.2): 62 bits per 16 values, so 31 bytes per 64; its head_dim need only be a
// multiple of 2^L (16), and row_bytes is exact for any parameters.
inline constexpr RowCodecTraits kRowCodecs[] = {
    {.name = "f32", .block = 1, .bytes_per_block = 4, .ggml_type = 0, .layout = "float32 values",
     .id = BlockCodec::f32, .plain = true, .max_abs = 3.4028234e38f, .scalar = &kScalarF32, .max_rel_error = 0.0},
    {.name = "f16", .block = 1, .bytes_per_block = 2, .ggml_type = 1, .layout = "IEEE binary16 values",
     .id = BlockCodec::f16, .plain = true, .max_abs = kF16Max, .scalar = &kScalarF16, .max_rel_error = 0x1p-11},
    {.name = "bf16", .block = 1, .bytes_per_block = 2, .ggml_type = 30, .layout = "bfloat16 values",
     .id = BlockCodec::bf16, .plain = true, .max_abs = 0x1.fep127f, .scalar = &kScalarBF16, .max_rel_error = 0x1p-8},
    {.name = "q8_0", .block = 32, .bytes_per_block = 34, .ggml_type = 8,
     .layout = "per 32: fp16 d, 32 x int8; x = d*q",
     .id = BlockCodec::q8_0, .max_abs = kF16Max * 127, .scalar = &kScalarQ8_0,
     .max_rel_error = 0.5 / 127 + 0x1p-11 * 1.01},
    {.name = "q4_0", .block = 32, .bytes_per_block = 18, .ggml_type = 2,
     .layout = "per 32: fp16 d, 16 bytes of nibbles; x = d*(q-8)",
     .id = BlockCodec::q4_0, .max_abs = kF16Max * 8, .scalar = &kScalarQ4_0,
     .max_rel_error = 1.0 / 8 + 0x1p-11 * 1.01},
    {.name = "q4_1", .block = 32, .bytes_per_block = 20, .ggml_type = 3,
     .layout = "per 32: fp16 d, fp16 m, 16 bytes of nibbles; x = d*q + m",
     .id = BlockCodec::q4_1, .max_abs = kF16Max, .scalar = &kScalarQ4_1,
     .max_rel_error = 1.0 / 15 + 3 * 0x1p-11 * 1.01},
    {.name = "q5_0", .block = 32, .bytes_per_block = 22, .ggml_type = 6,
     .layout = "per 32: fp16 d, 4 bytes high bits, 16 bytes nibbles; x = d*(q-16)",
     .id = BlockCodec::q5_0, .max_abs = kF16Max * 16, .scalar = &kScalarQ5_0,
     .max_rel_error = 1.0 / 16 + 0x1p-11 * 1.01},
    {.name = "q5_1", .block = 32, .bytes_per_block = 24, .ggml_type = 7,
     .layout = "per 32: fp16 d, fp16 m, 4 bytes high bits, 16 bytes nibbles; x = d*q + m",
     .id = BlockCodec::q5_1, .max_abs = kF16Max, .scalar = &kScalarQ5_1,
     .max_rel_error = 1.0 / 31 + 3 * 0x1p-11 * 1.01},
    // |d| ≤ 6·amax/127 (a code's ratio x/q is at most 6·d₀), so amax ≤ 16·65504 keeps d finite in fp16.
    {.name = "iq4_nl", .block = 32, .bytes_per_block = 18, .ggml_type = 20,
     .layout = "per 32: fp16 d, 16 bytes of nibbles; x = d*kvalues[q] (16 non-uniform levels, -127..113)",
     .id = BlockCodec::iq4_nl, .max_abs = kF16Max * 16, .scalar = &kScalarIQ4_NL,
     .max_rel_error = (12 + 0.35 * 127) / 127},
    // iq4_nl's blocks, ggml's scale-searching encoder. |d| ≤ 1.19·amax/120 keeps d finite in fp16 as above.
    {.name = "iq4_nls", .block = 32, .bytes_per_block = 18, .ggml_type = 20,
     .layout = "ggml block_iq4_nl (read as iq4_nl) from ggml's scale search (quantize_iq4_nl, ntry 7): per 32: "
               "fp16 d, 16 bytes of nibbles; x = d*kvalues[q]",
     .id = BlockCodec::iq4_nls, .max_abs = kF16Max * 16, .scalar = &kScalarIQ4_NLS,
     .max_rel_error = 1 - 113 * 0.89 / 134 + 127 * 1.19 / 120 * 0x1p-11, .blocks_of = BlockCodec::iq4_nl},

    {.name = "polar", .block = 64, .bytes_per_block = 31,
     .layout = "per 16 values (default L=4, bits 4.2.2.2): 46 bits of angle codes, fp16 radius",
     .family = CodecFamily::polar},
    {.name = "turbo2", .block = 8, .bytes_per_block = 2, .layout = "per 8: 2-bit Lloyd-Max codes; per row: fp16 scale",
     .family = CodecFamily::turbo, .turbo = {.bits_hi = 2, .bits_lo = 2}},
    {.name = "turbo2.5", .block = 16, .bytes_per_block = 5,
     .layout = "per row: d/2 3-bit and d/2 2-bit Lloyd-Max codes, fp16 scale",
     .family = CodecFamily::turbo, .turbo = {.bits_hi = 3, .bits_lo = 2, .half_split = true}},
    {.name = "turbo3", .block = 8, .bytes_per_block = 3, .layout = "per 8: 3-bit Lloyd-Max codes; per row: fp16 scale",
     .family = CodecFamily::turbo, .turbo = {.bits_hi = 3, .bits_lo = 3}},
    {.name = "turbo3.5", .block = 16, .bytes_per_block = 7,
     .layout = "per row: d/2 4-bit and d/2 3-bit Lloyd-Max codes, fp16 scale",
     .family = CodecFamily::turbo, .turbo = {.bits_hi = 4, .bits_lo = 3, .half_split = true}},
    {.name = "turbo4", .block = 8, .bytes_per_block = 4, .layout = "per 8: 4-bit Lloyd-Max codes; per row: fp16 scale",
     .family = CodecFamily::turbo, .turbo = {.bits_hi = 4, .bits_lo = 4}},
    {.name = "tcq2", .block = 32, .bytes_per_block = 8,
     .layout = "per 32: 1-bit codes, 32 trellis bits (8-state TCQ); per row: fp16 scale",
     .family = CodecFamily::turbo, .turbo = {.bits_hi = 0, .bits_lo = 0, .trellis = 2}},
    {.name = "tcq3", .block = 32, .bytes_per_block = 12,
     .layout = "per 32: 2-bit codes, 32 trellis bits (8-state TCQ); per row: fp16 scale",
     .family = CodecFamily::turbo, .turbo = {.bits_hi = 0, .bits_lo = 0, .trellis = 3}},
    {.name = "turbo2_qjl", .block = 8, .bytes_per_block = 2,
     .layout = "per 8: 1-bit Lloyd-Max codes, 8 QJL sign bits; per row: fp16 norm, fp16 residual norm",
     .family = CodecFamily::turbo, .turbo = {.bits_hi = 1, .bits_lo = 1, .qjl = true}},
    {.name = "turbo3_qjl", .block = 8, .bytes_per_block = 3,
     .layout = "per 8: 2-bit Lloyd-Max codes, 8 QJL sign bits; per row: fp16 norm, fp16 residual norm",
     .family = CodecFamily::turbo, .turbo = {.bits_hi = 2, .bits_lo = 2, .qjl = true}},
    {.name = "turbo4_qjl", .block = 8, .bytes_per_block = 4,
     .layout = "per 8: 3-bit Lloyd-Max codes, 8 QJL sign bits; per row: fp16 norm, fp16 residual norm",
     .family = CodecFamily::turbo, .turbo = {.bits_hi = 3, .bits_lo = 3, .qjl = true}},
};
inline constexpr int kBlockCodecCount = static_cast<int>(BlockCodec::count);

// Row i < kBlockCodecCount is block codec i, the rest rotate; only block rows have block fields.
constexpr bool block_rows_in_order() {
    int i = 0;
    for (const auto& t : kRowCodecs) {
        const bool block = i < kBlockCodecCount;
        if ((t.family == CodecFamily::block) != block || (t.scalar != nullptr) != block) return false;
        if (t.id != (block ? static_cast<BlockCodec>(i) : BlockCodec::count)) return false;
        if (!block && (t.plain || t.blocks_of != BlockCodec::count)) return false;
        ++i;
    }
    return i > kBlockCodecCount;
}
static_assert(block_rows_in_order(), "kRowCodecs: the block codecs first, one row per BlockCodec in enum order");

// A codec writing another's blocks: that codec has blocks of its own and the same block, size, kind and
// ggml type.
constexpr bool blocks_of_consistent() {
    for (int i = 0; i < kBlockCodecCount; ++i) {
        const auto& t = kRowCodecs[i];
        if (t.blocks_of == BlockCodec::count) continue;
        const auto& o = kRowCodecs[static_cast<int>(t.blocks_of)];
        if (o.blocks_of != BlockCodec::count || o.block != t.block || o.bytes_per_block != t.bytes_per_block ||
            o.plain != t.plain || o.max_abs != t.max_abs || o.ggml_type != t.ggml_type)
            return false;
    }
    return true;
}
static_assert(blocks_of_consistent(), "kRowCodecs: blocks_of names a codec with its own blocks of the same layout");

// Names are unique; a ggml type is read by one codec (the row with its own blocks of that type); only
// block codecs have ggml types.
constexpr bool names_and_ggml_types_unique() {
    for (const auto& a : kRowCodecs) {
        if (a.ggml_type != kNoGgmlType && a.family != CodecFamily::block) return false;
        for (const auto& b : kRowCodecs) {
            if (&a == &b) continue;
            if (std::string_view(a.name) == b.name) return false;
            if (a.ggml_layout() && b.ggml_layout() && a.ggml_type == b.ggml_type) return false;
        }
    }
    return true;
}
static_assert(names_and_ggml_types_unique(), "kRowCodecs: one row per name, one reader per ggml type");

// static: SIMD files include this header (see half.hpp).
static constexpr const RowCodecTraits& block_traits(BlockCodec c) { return kRowCodecs[static_cast<int>(c)]; }
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
