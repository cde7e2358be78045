#include "value_format.hpp"

namespace kvq::detail {
namespace {

class RowValues final : public ValueFormat {
public:
    explicit RowValues(Codec codec) : ValueFormat(std::move(codec)) {}
    void accumulate(const float* w, size_t w_stride, int g, const uint8_t* rows, size_t row_stride, size_t n,
                    float* acc) const override {
        impl_->accumulate_rows(w, w_stride, g, rows, row_stride, n, acc);
    }
};

class GridValues final : public ValueFormat {
public:
    explicit GridValues(Codec codec) : ValueFormat(std::move(codec)) {}
    void accumulate(const float* w, size_t w_stride, int g, const uint8_t* rows, size_t row_stride, size_t n,
                    float* acc) const override {
        impl_->accumulate_attention(w, w_stride, g, rows, row_stride, n, acc);
    }
};

}  // namespace

std::unique_ptr<const ValueFormat> make_value_format(Codec codec, bool int8_weights) {
    if (int8_weights) return std::make_unique<GridValues>(std::move(codec));
    return std::make_unique<RowValues>(std::move(codec));
}

}  // namespace kvq::detail
