#include "table.hpp"

#include <algorithm>
#include <array>
#include <iterator>
#include <string>
#include <utility>

#include "block_codec.hpp"
#include "polar.hpp"
#include "turbo.hpp"

namespace kvq::detail {
namespace {

template <BlockCodec C>
std::unique_ptr<CodecImpl> make_block(std::string_view params, int head_dim, uint64_t) {
    const BlockCodecTraits& t = block_traits(C);
    if (!params.empty()) {
        throw BadParams(std::string("codec '") + t.name + "' takes no parameters, got '" + std::string(params) + "'");
    }
    if (head_dim <= 0 || head_dim % t.block != 0) {
        throw BadHeadDim(std::string("codec '") + t.name + "' needs a head_dim that is a multiple of " +
                         std::to_string(t.block) + ", got " + std::to_string(head_dim));
    }
    return make_block_codec(C, t.block, t.bytes_per_block, head_dim);
}

template <int... I>
constexpr std::array<CodecTableRow, sizeof...(I)> block_rows(std::integer_sequence<int, I...>) {
    // ggml_layout: ggml's blocks of the type of the same name; iq4_nls writes iq4_nl's (its layout line says so).
    return {CodecTableRow{kBlockCodecs[I].name, kBlockCodecs[I].block, kBlockCodecs[I].bytes_per_block,
                          kBlockCodecs[I].blocks_of == BlockCodec::count,
                          kBlockCodecs[I].layout, make_block<static_cast<BlockCodec>(I)>, false,
                          kBlockCodecs[I].plain}...};
}

// The codecs that rotate rows themselves (lib/codec/polar.hpp, turbo.hpp). bytes_per_block leaves out
// the per-row fp16 norms. polar's row is that of its default (L=4, bits 4.2.2.2): 62 bits per 16 values,
// so 31 bytes per 64; its head_dim need only be a multiple of 2^L (16), and row_bytes is exact for any
// parameters.
const CodecTableRow kRotatedRows[] = {
    {"polar", 64, 31, false, "per 16 values (default L=4, bits 4.2.2.2): 46 bits of angle codes, fp16 radius",
     make_polar, true},
    {"turbo2", 8, 2, false, "per 8: 2-bit Lloyd-Max codes; per row: fp16 scale",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({2, 2, false, false}, "turbo2", p, d, s); }, true},
    {"turbo2.5", 16, 5, false, "per row: d/2 3-bit and d/2 2-bit Lloyd-Max codes, fp16 scale",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({3, 2, true, false}, "turbo2.5", p, d, s); }, true},
    {"turbo3", 8, 3, false, "per 8: 3-bit Lloyd-Max codes; per row: fp16 scale",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({3, 3, false, false}, "turbo3", p, d, s); }, true},
    {"turbo3.5", 16, 7, false, "per row: d/2 4-bit and d/2 3-bit Lloyd-Max codes, fp16 scale",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({4, 3, true, false}, "turbo3.5", p, d, s); }, true},
    {"turbo4", 8, 4, false, "per 8: 4-bit Lloyd-Max codes; per row: fp16 scale",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({4, 4, false, false}, "turbo4", p, d, s); }, true},
    {"tcq2", 32, 8, false, "per 32: 1-bit codes, 32 trellis bits (8-state TCQ); per row: fp16 scale",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({0, 0, false, false, TurboScale::ls, 2}, "tcq2", p, d, s); }, true},
    {"tcq3", 32, 12, false, "per 32: 2-bit codes, 32 trellis bits (8-state TCQ); per row: fp16 scale",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({0, 0, false, false, TurboScale::ls, 3}, "tcq3", p, d, s); }, true},
    {"turbo2_qjl", 8, 2, false, "per 8: 1-bit Lloyd-Max codes, 8 QJL sign bits; per row: fp16 norm, fp16 residual norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({1, 1, false, true}, "turbo2_qjl", p, d, s); }, true},
    {"turbo3_qjl", 8, 3, false, "per 8: 2-bit Lloyd-Max codes, 8 QJL sign bits; per row: fp16 norm, fp16 residual norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({2, 2, false, true}, "turbo3_qjl", p, d, s); }, true},
    {"turbo4_qjl", 8, 4, false, "per 8: 3-bit Lloyd-Max codes, 8 QJL sign bits; per row: fp16 norm, fp16 residual norm",
     [](std::string_view p, int d, uint64_t s) { return make_turbo({3, 3, false, true}, "turbo4_qjl", p, d, s); }, true},
};

// The table: every block codec of the specification (lib/ref/block_codecs.hpp), in its enum order, then
// the rotating codecs.
const auto kTable = [] {
    constexpr auto blocks = block_rows(std::make_integer_sequence<int, kBlockCodecCount>{});
    std::array<CodecTableRow, blocks.size() + std::size(kRotatedRows)> t{};
    std::copy(blocks.begin(), blocks.end(), t.begin());
    std::copy(std::begin(kRotatedRows), std::end(kRotatedRows), t.begin() + blocks.size());
    return t;
}();

}  // namespace

std::span<const CodecTableRow> codec_table() { return kTable; }

const CodecTableRow* find_codec(std::string_view name) {
    for (const auto& row : kTable) {
        if (name == row.name) return &row;
    }
    return nullptr;
}

}  // namespace kvq::detail
