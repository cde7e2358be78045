// Key centering (the key spec suffix "+center"; CacheConfig::center_keys): a block's keys are stored minus their
// per-channel mean, and the mean is kept as fp16 with the block; the score adds q·mean back. This removes
// a key bias shared by the block's tokens (large k_proj biases, as in Qwen models) before the codec sees
// it. CenteredKeys is the key format (lib/codec/key_format.hpp) that wraps another with it.
//
// | where (per kv head)    | what                                     |
// |------------------------|------------------------------------------|
// | key rows               | the wrapped format's, of k − mean        |
// | side data              | head_dim fp16 means, then the wrapped format's side data |
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "key_format.hpp"

namespace kvq::detail {

class CenteredKeys : public KeyFormat {
public:
    explicit CenteredKeys(std::unique_ptr<const KeyFormat> inner);

    std::string name() const override { return inner_->name() + "+center"; }
    size_t side_bytes() const override { return means_bytes() + inner_->side_bytes(); }
    // k − mean can be twice as large as the largest key; the mean is fp16.
    InputLimit input_limit() const override;
    bool writes_rows() const override { return false; }  // the mean is fitted to the whole block
    void seal(const float* k, size_t n, size_t first_token, const KeyHead& head) const override;
    void read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const override;
    void convert_rows(uint8_t* rows, bool to_file) const override { inner_->convert_rows(rows, to_file); }
    size_t scratch_floats(int g) const override { return inner_->scratch_floats(g) + static_cast<size_t>(g); }
    const float* score(const uint8_t* prep, const float* q, int g, const ConstKeyHead& head, size_t lo, size_t n,
                       float* scores, size_t stride, float* scratch) const override;

private:
    size_t means_bytes() const { return static_cast<size_t>(head_dim()) * sizeof(uint16_t); }
    template <class Head>
    Head inner_head(const Head& head) const {
        return {head.rows, inner_->side_bytes() ? head.side + means_bytes() : nullptr, head.row_stride};
    }
    std::unique_ptr<const KeyFormat> inner_;
    Codec means_;  // f16 rows of head_dim: the means read back at the level's speed (F16C where it has it)
};

// One block of n key rows of d floats (row r at k + r·k_stride): mean16 (d values) = the per-channel mean,
// summed in double and rounded to fp16, and centered (n × d, packed) = k − that fp16 mean. The mean is
// rounded before it is subtracted, so that adding the stored mean back restores exactly what was taken off.
void center_block(const float* k, size_t k_stride, size_t n, int d, uint16_t* mean16, float* centered);

// centered (n × d, packed) = k − mean16 (center_block's second step).
void subtract_mean(const float* k, size_t k_stride, size_t n, int d, const uint16_t* mean16, float* centered);

}  // namespace kvq::detail
