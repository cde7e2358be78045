// Value formats (lib/codec/value_format.hpp) have the key formats' shape: side data of their own per block
// and kv head, placed by the block layout (lib/codec/block_layout.hpp) after the keys' side data, sealed
// with the block's first position, and read by the engine's accumulate. No value format kvq makes has side
// data yet; a centered value format written here (the values minus the block's fp16 mean per channel, as
// CenteredKeys does for keys) shows that a format with some needs nothing but its own code.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention/engine.hpp"
#include "codec/block_layout.hpp"
#include "codec/centering.hpp"
#include "codec/key_formats.hpp"
#include "codec/value_format.hpp"
#include "ref/half.hpp"
#include "test_util.hpp"

namespace {

using kvq::detail::ConstValueHead;
using kvq::detail::ValueHead;

// Side data per kv head: a u32 of the block's first position (what seal was told), then head_dim fp16 means.
class CenteredValues final : public kvq::detail::ValueFormat {
public:
    CenteredValues(kvq::Codec codec, int block_tokens) : ValueFormat(std::move(codec), block_tokens) {}

    size_t side_bytes() const override { return 4 + 2 * static_cast<size_t>(head_dim()); }
    bool writes_rows() const override { return false; }
    void seal(const float* v, size_t n, size_t first_token, const ValueHead& head) const override {
        const uint32_t at = static_cast<uint32_t>(first_token);
        std::memcpy(head.side, &at, 4);
        std::vector<uint16_t> mean(head_dim());
        std::vector<float> centered(n * head_dim());
        kvq::detail::center_block(v, head_dim(), n, head_dim(), mean.data(), centered.data());
        std::memcpy(head.side + 4, mean.data(), 2 * mean.size());
        impl_->quantize_rows(centered.data(), n, head.rows, head.row_stride);
    }
    void read_rows(const ConstValueHead& head, size_t lo, size_t n, float* out) const override {
        impl_->dequantize_rows(head.rows + lo * head.row_stride, head.row_stride, n, out);
        for (size_t r = 0; r < n; ++r) {
            for (int j = 0; j < head_dim(); ++j) out[r * head_dim() + j] += mean(head, j);
        }
    }
    std::string side_error(const ConstValueHead& head, size_t first_token) const override {
        uint32_t at;
        std::memcpy(&at, head.side, 4);
        return at == first_token ? std::string() : "sealed at " + std::to_string(at);
    }
    // acc_i += Σ_r w_ir·(row_r + mean) = w·rows + (Σ_r w_ir)·mean.
    void accumulate(const float* w, size_t w_stride, int g, const ConstValueHead& head, size_t lo, size_t n,
                    float* acc) const override {
        impl_->accumulate_rows(w, w_stride, g, head.rows + lo * head.row_stride, head.row_stride, n, acc);
        for (int i = 0; i < g; ++i) {
            float sum = 0;
            for (size_t r = 0; r < n; ++r) sum += w[i * w_stride + r];
            for (int j = 0; j < head_dim(); ++j) acc[i * head_dim() + j] += sum * mean(head, j);
        }
    }

private:
    float mean(const ConstValueHead& head, int j) const {
        uint16_t m;
        std::memcpy(&m, head.side + 4 + 2 * j, 2);
        return kvq::detail::f16_to_f32(m);
    }
};

}  // namespace

TEST_CASE("value formats: side data of their own, placed after the keys', sealed with the block's position, read by the engine") {
    const int d = 64, dv = 32, n_kv = 3, g = 2, bt = 16, n_blocks = 3;
    const size_t n_rows = n_blocks * bt - 5;  // a partial last block
    const auto keys = kvq::detail::make_key_format("f16+center", d, bt);  // centered: side data of its own too
    const CenteredValues values(kvq::Codec::make("q8_0", dv), bt);
    const kvq::detail::BlockLayout layout = kvq::detail::pool_block_layout(*keys, values, n_kv, false);

    // Where the layout puts them: keys' rows, values' rows, keys' side data, values' side data, each aligned.
    const size_t krows = keys->rows_bytes(), vrows = values.rows_bytes();
    CHECK(layout.values.offset == kvq::detail::align_block(n_kv * krows));
    CHECK(layout.keys.side_offset == kvq::detail::align_block(layout.values.offset + n_kv * vrows));
    CHECK(layout.keys.side_stride == keys->side_bytes());
    CHECK(layout.values.side_offset == kvq::detail::align_block(layout.keys.side_offset + n_kv * keys->side_bytes()));
    CHECK(layout.values.side_stride == values.side_bytes());
    CHECK(layout.bytes == layout.values.side_offset + n_kv * values.side_bytes());
    CHECK(values.bytes_per_token() == doctest::Approx(values.row_bytes() + double(values.side_bytes()) / bt));

    // Blocks sealed as the cache seals them (CacheImpl::seal), each head through the layout.
    const auto k = kvq::test::gaussian(n_rows * n_kv * d, 1), q = kvq::test::gaussian(size_t(n_kv) * g * d, 3);
    auto v = kvq::test::gaussian(n_rows * n_kv * dv, 2);
    for (size_t i = 0; i < v.size(); i += 3) v[i] += 20.0f;  // a bias the centering takes off
    std::vector<std::vector<uint8_t>> blocks(n_blocks, std::vector<uint8_t>(layout.bytes, 0xA5));
    std::vector<uint8_t*> table;
    std::vector<float> rows_k(bt * d), rows_v(bt * dv);
    for (int b = 0; b < n_blocks; ++b) {
        const size_t first = size_t(b) * bt, n = std::min<size_t>(bt, n_rows - first);
        uint8_t* block = blocks[b].data();
        for (int h = 0; h < n_kv; ++h) {
            for (size_t r = 0; r < n; ++r) {
                std::memcpy(&rows_k[r * d], &k[((first + r) * n_kv + h) * d], d * sizeof(float));
                std::memcpy(&rows_v[r * dv], &v[((first + r) * n_kv + h) * dv], dv * sizeof(float));
            }
            keys->seal(rows_k.data(), n, first, layout.key_head(block, h, keys->row_bytes()));
            values.seal(rows_v.data(), n, first, layout.value_head(block, h, values.row_bytes()));
        }
        table.push_back(block);
    }
    for (int b = 0; b < n_blocks; ++b) {
        for (int h = 0; h < n_kv; ++h) {
            const auto head = layout.value_head<const uint8_t>(table[b], h, values.row_bytes());
            CHECK(values.side_error(head, size_t(b) * bt).empty());
            CHECK_FALSE(values.side_error(head, size_t(b) * bt + 1).empty());
        }
    }

    // The engine over them, against double-precision attention over the rows as the formats read them back.
    kvq::detail::RowSource src;
    src.key = keys.get();
    src.value = &values;
    src.layout = layout;
    src.blocks = table;
    src.end_row = n_rows - (n_blocks - 1) * bt;
    const kvq::detail::AttentionShape shape{n_kv * g, n_kv, d, 0.125f, 0.0f, dv};
    std::vector<float> out(size_t(n_kv) * g * dv);
    kvq::detail::decode_attention(shape, std::span<const kvq::detail::RowSource>(&src, 1), q.data(), out.data(), nullptr, 1);
    std::vector<float> kr(n_rows * d), vr(n_rows * dv);
    double err = 0, norm = 0;
    for (int h = 0; h < n_kv; ++h) {
        for (int b = 0; b < n_blocks; ++b) {
            const size_t first = size_t(b) * bt, n = std::min<size_t>(bt, n_rows - first);
            keys->read_rows(src.key_head(b, h), 0, n, kr.data() + first * d);
            values.read_rows(src.value_head(b, h), 0, n, vr.data() + first * dv);
        }
        for (int i = 0; i < g; ++i) {
            const float* qi = q.data() + (h * g + i) * d;
            std::vector<double> w(n_rows);
            double top = -INFINITY, sum = 0;
            for (size_t r = 0; r < n_rows; ++r) {
                double s = 0;
                for (int j = 0; j < d; ++j) s += double(qi[j]) * kr[r * d + j];
                w[r] = s * shape.scale;
                top = std::max(top, w[r]);
            }
            for (double& x : w) sum += (x = std::exp(x - top));
            for (int j = 0; j < dv; ++j) {
                double x = 0;
                for (size_t r = 0; r < n_rows; ++r) x += w[r] / sum * vr[r * dv + j];
                const double got = out[(h * g + i) * dv + j];
                err += (got - x) * (got - x);
                norm += x * x;
            }
        }
    }
    CHECK(std::sqrt(err / norm) < 1e-5);  // float rounding: the means (20 in a third of the channels) are added back
}
