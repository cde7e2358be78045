#include "table.hpp"

#include <stdexcept>
#include <string>

#include "block_codec.hpp"
#include "blocks.hpp"
#include "polar.hpp"
#include "turbo.hpp"

namespace kvq::detail {
namespace {

void check_no_params(const char* name, std::string_view params) {
    if (!params.empty()) {
        throw std::invalid_argument(std::string("codec '") + name + "' takes no parameters, got '" +
                                    std::string(params) + "'");
    }
}

template <BlockCodec C, int Block, int Bytes>
std::unique_ptr<CodecImpl> make_block(std::string_view params, int head_dim, uint64_t) {
    const char* name = codec_table()[static_cast<int>(C)].name;
    check_no_params(name, params);
    if (head_dim <= 0 || head_dim % Block != 0) {
        throw std::invalid_argument(std::string("codec '") + name + "' needs a head_dim that is a multiple of " +
                                    std::to_string(Block) + ", got " + std::to_string(head_dim));
    }
    return make_block_codec(C, Block, Bytes, head_dim);
}

// Rows 0..7 are indexed by BlockCodec; keep them in that order.
const CodecTableRow kTable[] = {
    {"f32", 1, 4, true, "float32 values", make_block<BlockCodec::f32, 1, 4>},
    {"f16", 1, 2, true, "IEEE binary16 values", make_block<BlockCodec::f16, 1, 2>},
    {"bf16", 1, 2, true, "bfloat16 values", make_block<BlockCodec::bf16, 1, 2>},
    {"q8_0", kQK, sizeof(BlockQ8_0), true, "per 32: fp16 d, 32 x int8; x = d*q",
     make_block<BlockCodec::q8_0, kQK, sizeof(BlockQ8_0)>},
    {"q4_0", kQK, sizeof(BlockQ4_0), true, "per 32: fp16 d, 16 bytes of nibbles; x = d*(q-8)",
     make_block<BlockCodec::q4_0, kQK, sizeof(BlockQ4_0)>},
    {"q4_1", kQK, sizeof(BlockQ4_1), true, "per 32: fp16 d, fp16 m, 16 bytes of nibbles; x = d*q + m",
     make_block<BlockCodec::q4_1, kQK, sizeof(BlockQ4_1)>},
    {"q5_0", kQK, sizeof(BlockQ5_0), true, "per 32: fp16 d, 4 bytes high bits, 16 bytes nibbles; x = d*(q-16)",
     make_block<BlockCodec::q5_0, kQK, sizeof(BlockQ5_0)>},
    {"q5_1", kQK, sizeof(BlockQ5_1), true, "per 32: fp16 d, fp16 m, 4 bytes high bits, 16 bytes nibbles; x = d*q + m",
     make_block<BlockCodec::q5_1, kQK, sizeof(BlockQ5_1)>},
    // Always rotated (lib/codec/polar.hpp, turbo.hpp). bytes_per_block leaves out the per-row fp16 norms.
    // polar's row is that of its default (L=4, bits 4.2.2.2): 62 bits per 16 values, so 31 bytes per 64;
    // its head_dim need only be a multiple of 2^L (16), and row_bytes is exact for any parameters.
    {"polar", 64, 31, false, "per 16 values (default L=4, bits 4.2.2.2): 46 bits of angle codes, fp16 radius",
     make_polar, true},
    {"turbo2", 8, 2, false, "per 8: 2-bit Lloyd-Max codes; per row: fp16 norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({2, 2, false, false}, "turbo2", p, d, s); }, true},
    {"turbo2.5", 16, 5, false, "per row: d/2 3-bit and d/2 2-bit Lloyd-Max codes, fp16 norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({3, 2, true, false}, "turbo2.5", p, d, s); }, true},
    {"turbo3", 8, 3, false, "per 8: 3-bit Lloyd-Max codes; per row: fp16 norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({3, 3, false, false}, "turbo3", p, d, s); }, true},
    {"turbo3.5", 16, 7, false, "per row: d/2 4-bit and d/2 3-bit Lloyd-Max codes, fp16 norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({4, 3, true, false}, "turbo3.5", p, d, s); }, true},
    {"turbo4", 8, 4, false, "per 8: 4-bit Lloyd-Max codes; per row: fp16 norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({4, 4, false, false}, "turbo4", p, d, s); }, true},
    {"turbo2_qjl", 8, 2, false, "per 8: 1-bit Lloyd-Max codes, 8 QJL sign bits; per row: fp16 norm, fp16 residual norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({1, 1, false, true}, "turbo2_qjl", p, d, s); }, true},
    {"turbo3_qjl", 8, 3, false, "per 8: 2-bit Lloyd-Max codes, 8 QJL sign bits; per row: fp16 norm, fp16 residual norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({2, 2, false, true}, "turbo3_qjl", p, d, s); }, true},
    {"turbo4_qjl", 8, 4, false, "per 8: 3-bit Lloyd-Max codes, 8 QJL sign bits; per row: fp16 norm, fp16 residual norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({3, 3, false, true}, "turbo4_qjl", p, d, s); }, true},
};
static_assert(sizeof kTable / sizeof kTable[0] >= static_cast<size_t>(BlockCodec::count));

}  // namespace

std::span<const CodecTableRow> codec_table() { return kTable; }

const CodecTableRow* find_codec(std::string_view name) {
    for (const auto& row : kTable) {
        if (name == row.name) return &row;
    }
    return nullptr;
}

}  // namespace kvq::detail
