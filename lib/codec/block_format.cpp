#include "block_format.hpp"

#include <stdexcept>
#include <utility>

namespace kvq::detail {

BlockFormat::BlockFormat(Codec codec, int block_tokens)
    : codec_(std::move(codec)), impl_(&impl_of(codec_)), block_tokens_(block_tokens) {}

double BlockFormat::bytes_per_token() const {
    const double side = side_bytes() ? static_cast<double>(side_bytes()) / block_tokens_ : 0.0;
    return static_cast<double>(row_bytes()) + side;
}

void BlockFormat::write_rows(const float*, size_t, size_t, const HeadRows&) const {
    throw std::logic_error("format '" + name() + "' does not write rows into a sealed block");
}

}  // namespace kvq::detail
