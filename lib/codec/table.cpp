#include "table.hpp"

#include <string>

#include "block_codec.hpp"
#include "polar.hpp"
#include "turbo.hpp"

namespace kvq::detail {
namespace {

std::unique_ptr<CodecImpl> make_block(const RowCodecTraits& t, std::string_view params, int head_dim) {
    if (!params.empty()) {
        throw BadParams(std::string("codec '") + t.name + "' takes no parameters, got '" + std::string(params) + "'");
    }
    if (head_dim <= 0 || head_dim % t.block != 0) {
        throw BadHeadDim(std::string("codec '") + t.name + "' needs a head_dim that is a multiple of " +
                         std::to_string(t.block) + ", got " + std::to_string(head_dim));
    }
    return make_block_codec(t.id, t.block, t.bytes_per_block, head_dim);
}

}  // namespace

const RowCodecTraits* find_codec(std::string_view name) {
    for (const auto& row : kRowCodecs) {
        if (name == row.name) return &row;
    }
    return nullptr;
}

const RowCodecTraits* find_ggml_codec(int ggml_type) {
    for (const auto& row : kRowCodecs) {
        if (row.ggml_layout() && row.ggml_type == ggml_type) return &row;
    }
    return nullptr;
}

std::unique_ptr<CodecImpl> make_codec(const RowCodecTraits& row, std::string_view params, int head_dim, uint64_t seed) {
    switch (row.family) {
        case CodecFamily::block: return make_block(row, params, head_dim);
        case CodecFamily::turbo: return make_turbo(row.turbo, row.name, params, head_dim, seed);
        case CodecFamily::polar: return make_polar(params, head_dim, seed);
    }
    throw std::logic_error("make_codec: unknown codec family");
}

}  // namespace kvq::detail
