// The codec table: the one place a codec is registered. Tests, benchmarks, the C API, Python and the
// table tool all iterate it, so a codec with a row here is covered everywhere.
#pragma once

#include <memory>
#include <span>
#include <string_view>

#include "codec_impl.hpp"

namespace kvq::detail {

struct CodecTableRow {
    const char* name;
    int block;            // values per block; head_dim must be a multiple
    int bytes_per_block;  // stored bytes per block
    bool ggml_layout;     // bytes identical to ggml's type of the same name
    const char* layout;   // one line for `kvq info`
    // Builds the codec for a head size; params is what follows "name:" in a spec (empty if none).
    // Throws BadHeadDim or BadParams for head sizes or parameters the codec cannot take.
    std::unique_ptr<CodecImpl> (*make)(std::string_view params, int head_dim, uint64_t seed);
    bool rotates = false;  // the codec rotates rows itself (polar, turbo): "+rot" adds nothing
    bool plain = false;    // values stored as they are (f32, f16, bf16)
};

std::span<const CodecTableRow> codec_table();
const CodecTableRow* find_codec(std::string_view name);

}  // namespace kvq::detail
