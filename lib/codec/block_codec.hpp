// CodecImpl for the block codecs (f32, f16, bf16 and the ggml layouts): a row is head_dim/block blocks;
// kernels come from the active SIMD level. head_dim must already be checked to be a multiple of block.
#pragma once

#include <memory>

#include "codec_impl.hpp"
#include "../ref/row_codecs.hpp"

namespace kvq::detail {

std::unique_ptr<CodecImpl> make_block_codec(BlockCodec c, int block, int bytes_per_block, int head_dim);

}  // namespace kvq::detail
