#include "value_format.hpp"

#include "../simd/dispatch.hpp"

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

// The rows of a block codec (f32 ... iq4_nls, +rot or not), accumulated by the level's kernel on the int8
// weight grid (BlockKernels::accumulate_grid, lib/ref/weight_grid.hpp) where the codec has one (q4_0), by
// its float kernel elsewhere. A +rot codec's rows are its block codec's bytes of the rotated rows: the
// accumulators stay in the rotated basis until finish, as accumulate_rows leaves them.
class GridValues final : public ValueFormat {
public:
    GridValues(Codec codec, BlockCodec blocks) : ValueFormat(std::move(codec)), blocks_(blocks) {}
    void accumulate(const float* w, size_t w_stride, int g, const uint8_t* rows, size_t row_stride, size_t n,
                    float* acc) const override {
        const BlockKernels& k = active_kernels(blocks_);  // the level in use now (LevelOverride included)
        (k.accumulate_grid ? k.accumulate_grid : k.accumulate)(w, w_stride, g, rows, row_stride, n, head_dim(), acc);
    }

private:
    BlockCodec blocks_;
};

}  // namespace

std::unique_ptr<const ValueFormat> make_value_format(Codec codec, bool int8_weights) {
    // The rotating codecs have no grid: their rows are accumulated on float weights either way.
    const BlockCodec blocks = impl_of(codec).block_codec();
    if (int8_weights && blocks != BlockCodec::count) return std::make_unique<GridValues>(std::move(codec), blocks);
    return std::make_unique<RowValues>(std::move(codec));
}

}  // namespace kvq::detail
