// The codec table: the row-codec registry's rows (lib/ref/row_codecs.hpp, kRowCodecs, the one place a
// row codec is registered), and codecs built from them. Tests, benchmarks, the C API, Python, the ggml
// backend and the table tool all iterate it, so a codec with a row there is covered everywhere.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "codec_impl.hpp"
#include "../ref/row_codecs.hpp"

namespace kvq::detail {

inline constexpr std::span<const RowCodecTraits> codec_table() { return kRowCodecs; }
const RowCodecTraits* find_codec(std::string_view name);
// The row reading ggml type `ggml_type`: the one with blocks of its own of that type; nullptr if none.
const RowCodecTraits* find_ggml_codec(int ggml_type);

// Builds a row's codec for a head size; params is what follows "name:" in a spec (empty if none).
// Throws BadHeadDim or BadParams for head sizes or parameters the codec cannot take.
std::unique_ptr<CodecImpl> make_codec(const RowCodecTraits& row, std::string_view params, int head_dim, uint64_t seed);

}  // namespace kvq::detail
