// The key formats of row codecs: RowKeys, each token's key row in the codec's bytes (ggml's, for the
// ggml types), and GroupedKeys, q8_0 rows in groups of 16 in the pool's memory (lib/ref/key_groups.hpp;
// which caches use them: keys_in_groups in lib/codec/key_formats.hpp). No side data; rows can be written
// into a re-opened block as they come.
#pragma once

#include "key_format.hpp"

namespace kvq::detail {

class RowKeys : public KeyFormat {
public:
    // block_tokens: the rows of a block (any, for rows an engine owns: only the rows' bytes are used).
    RowKeys(Codec codec, int block_tokens) : KeyFormat(std::move(codec), block_tokens) {}

    void seal(const float* k, size_t n, size_t first_token, const KeyHead& head) const override;
    void write_rows(const float* k, size_t row, size_t n, const KeyHead& head) const override;
    void read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const override;
    const float* score(const uint8_t* prep, const float* q, int g, const ConstKeyHead& head, size_t lo, size_t n,
                       float* scores, size_t stride, float* scratch) const override;
};

// Blocks of a multiple of 16 rows of q8_0 keys, scored by the level's kernel on groups
// (BlockKernels::score_groups) where it has one, else on the rows turned back to ggml's bytes.
class GroupedKeys : public KeyFormat {
public:
    GroupedKeys(Codec codec, int block_tokens);
    // Whether keys of this codec in blocks of block_tokens rows can be grouped at the level in use: q8_0
    // (unrotated), a level with the kernel, a head it takes and whole groups (keys_in_groups asks).
    static bool takes(const Codec& codec, int block_tokens);

    void seal(const float* k, size_t n, size_t first_token, const KeyHead& head) const override;
    void write_rows(const float* k, size_t row, size_t n, const KeyHead& head) const override;
    void read_rows(const ConstKeyHead& head, size_t lo, size_t n, float* out) const override;
    void convert_rows(uint8_t* rows, bool to_file) const override;
    const float* score(const uint8_t* prep, const float* q, int g, const ConstKeyHead& head, size_t lo, size_t n,
                       float* scores, size_t stride, float* scratch) const override;

private:
    size_t nb_;  // q8_0 blocks per row
};

}  // namespace kvq::detail
