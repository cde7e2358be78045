// Attention sinks (StreamingLLM, arXiv 2309.17453): the first N tokens of a sequence (BOS and the next
// few) draw much of every query's attention, so their keys are worth exact scores. SinkKeys wraps a key
// format: in a sequence's first block (the one sealed at position 0) the first N keys are kept in fp16
// beside the block and scored exactly, and the wrapped format's block statistics (means, per-channel
// ranges) are fitted without them (the sink rows are replaced by the mean of the block's other rows before
// the wrapped format seals it). Every block reserves the room; only a first block uses it. Measured on
// Gemma 3 270M in docs/eval.md, "Sink tokens: measured".
//
// | where (per kv head) | what                                                                    |
// |---------------------|-------------------------------------------------------------------------|
// | key rows            | the wrapped format's                                                    |
// | side data           | the wrapped format's side data, padded to 4 bytes; a u32 count of the   |
// |                     | sink rows held (0: not a first block); N × head_dim fp16                |
//
// The room costs every block (a pool's blocks are all of one size): (4 + 2·N·head_dim) bytes per kv head
// per block, 0.5 bits per key value for N = 1 at block_tokens 32, whatever the head size.
#pragma once

#include <memory>

#include "key_format.hpp"

namespace kvq::detail {

inline constexpr int kMaxSinkTokens = 16;

class SinkKeys : public KeyFormat {
public:
    SinkKeys(std::unique_ptr<const KeyFormat> inner, int sinks);

    std::string name() const override { return inner_->name() + "+sink" + std::to_string(sinks_); }
    size_t side_bytes() const override { return rows_at() + static_cast<size_t>(sinks_) * head_dim() * 2; }
    // The sink rows are fp16.
    InputLimit input_limit() const override;
    bool writes_rows() const override { return false; }
    void seal(const float* k, size_t n, size_t first_token, const KeyHead& head) const override;
    void read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const override;
    void convert_rows(uint8_t* rows, bool to_file) const override { inner_->convert_rows(rows, to_file); }
    // The count of sink rows: min(block_tokens, N) in a sequence's first block, 0 in every other.
    std::string side_error(const ConstKeyHead& head, size_t first_token) const override;
    size_t scratch_floats(int g) const override { return inner_->scratch_floats(g); }
    const float* score(const uint8_t* prep, const float* q, int g, const ConstKeyHead& head, size_t lo, size_t n,
                       float* scores, size_t stride, float* scratch) const override;

private:
    size_t count_at() const { return (inner_->side_bytes() + 3) / 4 * 4; }
    size_t rows_at() const { return count_at() + sizeof(uint32_t); }
    // The sink rows a block holds (0 but in a sequence's first block).
    size_t held(const uint8_t* side) const;
    template <class Head>
    Head inner_head(const Head& head) const {
        return {head.rows, inner_->side_bytes() ? head.side : nullptr, head.row_stride};
    }
    std::unique_ptr<const KeyFormat> inner_;
    int sinks_;
};

}  // namespace kvq::detail
