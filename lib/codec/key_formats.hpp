// The one registration of key formats (lib/codec/key_format.hpp): which format a key spec and a cache's
// options make. The cache, the planner and the accuracy tables make their key formats here only.
//
// A key spec is a row codec's spec (the codec table's, lib/codec/table.cpp: "q8_0", "q4_0+rot",
// "polar:budget=3", ...) or "chanB" (B = 2..8, per-channel keys), either optionally followed by "+sinkN"
// (the first N = 1..16 tokens of a sequence kept in fp16). Options add centering (CacheConfig::center_keys,
// the tables' "+center") and, in the cache's pool, q8_0's groups of 16 rows.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "key_format.hpp"

namespace kvq::detail {

struct KeyFormatOptions {
    bool centered = false;  // keys minus the block's fp16 mean (lib/codec/centering.hpp)
    bool pool = false;      // a cache's pool blocks: q8_0 keys in groups of 16 where keys_in_groups says so
    uint64_t seed = 0;      // the row codec's (rotations)
};

// The key format of a spec for rows of head_dim values sealed block_tokens at a time (> 0). Throws what
// Codec::make throws for the row codec (UnknownCodec, BadParams, BadHeadDim), and BadParams for a spec or
// combination no format takes (naming the spec).
std::unique_ptr<const KeyFormat> make_key_format(std::string_view spec, int head_dim, int block_tokens,
                                                 const KeyFormatOptions& options = {});

// Whether a spec names a key format that is no row codec (values cannot use it); throws BadParams for a
// malformed one.
bool is_key_only_spec(std::string_view spec);
// A spec's syntax (and centering, if asked) checked without a head size: what make_key_format refuses for
// every head_dim. Throws BadParams or UnknownCodec.
void check_key_spec(std::string_view spec, bool centered = false);

// Whether a cache keeps the key rows of its sealed blocks in groups of 16 rows (GroupedKeys,
// lib/ref/key_groups.hpp; docs/DESIGN.md, "q8_0 keys in groups of 16 rows"): the one place that decides
// it. Yes exactly when
//   - the key codec is q8_0 (the only codec with a kernel for grouped keys),
//   - the SIMD level in use has that kernel (BlockKernels::score_groups; which level does is chosen in
//     lib/simd/level_<isa>.cpp: today the avx512 level's VNNI build) and the head fits it
//     (head_dim / 32 <= kMaxGroupsBlocks), and
//   - a block's rows make whole groups (block_tokens % 16 == 0).
// Why: that kernel scores a group's 16 rows with 8 loads and no transpose, faster than the row kernel
// (docs/PERFORMANCE.md, "q8_0 keys in groups of 16 rows"); without it the groups would only cost a
// regroup on every row read. When: once per layer kind, as the cache is made (or loaded), at the level in
// use then. The layout is the pool's only (files and readers see ggml rows), and it stays when the level
// changes later: a level without the kernel scores the groups' rows turned back to ggml's bytes.
bool keys_in_groups(const Codec& key, int block_tokens);

}  // namespace kvq::detail
