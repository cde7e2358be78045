#include "value_format.hpp"

#include <utility>

#include "../simd/dispatch.hpp"

namespace kvq::detail {

namespace {

// Each token's value row in the codec's bytes (ggml's, for the ggml types); rows can be written into a
// re-opened block as they come.
class RowValues : public ValueFormat {
public:
    RowValues(Codec codec, int block_tokens) : ValueFormat(std::move(codec), block_tokens) {}

    void seal(const float* v, size_t n, size_t, const ValueHead& head) const override {
        impl_->quantize_rows(v, n, head.rows, head.row_stride);
    }
    void write_rows(const float* v, size_t row, size_t n, const ValueHead& head) const override {
        impl_->quantize_rows(v, n, head.rows + row * head.row_stride, head.row_stride);
    }
    void read_rows(const ConstValueHead& head, size_t lo, size_t n, float* out) const override {
        impl_->dequantize_rows(head.rows + lo * head.row_stride, head.row_stride, n, out);
    }
    void accumulate(const float* w, size_t w_stride, int g, const ConstValueHead& head, size_t lo, size_t n,
                    float* acc) const override {
        impl_->accumulate_rows(w, w_stride, g, head.rows + lo * head.row_stride, head.row_stride, n, acc);
    }
};

// The rows of a block codec (f32 ... iq4_nls, +rot or not), accumulated by the level's kernel on the int8
// weight grid (BlockKernels::accumulate_grid, lib/ref/weight_grid.hpp) where the codec has one (q4_0), by
// its float kernel elsewhere. A +rot codec's rows are its block codec's bytes of the rotated rows: the
// accumulators stay in the rotated basis until finish, as accumulate_rows leaves them.
class GridValues final : public RowValues {
public:
    GridValues(Codec codec, int block_tokens, BlockCodec blocks) : RowValues(std::move(codec), block_tokens), blocks_(blocks) {}
    void accumulate(const float* w, size_t w_stride, int g, const ConstValueHead& head, size_t lo, size_t n,
                    float* acc) const override {
        const BlockKernels& k = active_kernels(blocks_);  // the level in use now (LevelOverride included)
        (k.accumulate_grid ? k.accumulate_grid : k.accumulate)(w, w_stride, g, head.rows + lo * head.row_stride, head.row_stride,
                                                               n, head_dim(), acc);
    }

private:
    BlockCodec blocks_;
};

}  // namespace

std::unique_ptr<const ValueFormat> make_value_format(Codec codec, int block_tokens, bool int8_weights) {
    const BlockCodec blocks = impl_of(codec).block_codec();
    if (int8_weights && blocks != BlockCodec::count) return std::make_unique<GridValues>(std::move(codec), block_tokens, blocks);
    return std::make_unique<RowValues>(std::move(codec), block_tokens);
}

}  // namespace kvq::detail
