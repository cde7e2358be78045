#include "table.hpp"

#include <stdexcept>
#include <string>

#include "block_codec.hpp"
#include "blocks.hpp"

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
