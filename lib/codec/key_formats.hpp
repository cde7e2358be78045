// The one registration of key formats (lib/codec/key_format.hpp): which format a key spec and a cache's
// options make. The cache, the planner and the accuracy tables make their key formats here only.
//
// A key spec is a row codec's spec (the codec table's, lib/codec/table.cpp: "q8_0", "q4_0+rot",
// "polar:budget=3", ...) or "chanB" (B = 2..8, per-channel keys), then optionally the format suffixes, each
// at most once: "+center" (keys minus the block's fp16 mean per channel, CenteredKeys; not for chanB) and
// "+sinkN" (the first N = 1..16 tokens of a sequence kept in fp16, SinkKeys). A format's name puts them in
// this order, "q4_0+rot+center+sink1"; a spec may give the two in either order ("q4_0+sink1+center", as
// kvq eval and older tables wrote it). CacheConfig::center_keys is "+center" on every key spec.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "key_format.hpp"

namespace kvq::detail {

// A key spec taken apart: the row codec's spec (or "chanB") and the format suffixes.
struct KeySpec {
    std::string rows;
    bool center = false;  // "+center"
    int sinks = 0;        // "+sinkN" (0: none)

    // The spec with the suffixes in a format name's order: rows[+center][+sinkN].
    std::string name() const;
};
// Throws BadParams for a suffix given twice or a malformed +sinkN (naming the spec); the row codec's spec
// is not checked here.
KeySpec parse_key_spec(std::string_view spec);
// The spec with "+center" (center) or without it, its suffixes in a format name's order.
std::string key_spec_centered(std::string_view spec, bool center);

struct KeyFormatOptions {
    bool pool = false;  // a cache's pool blocks: q8_0 keys in groups of 16 where keys_in_groups says so
    uint64_t seed = 0;  // the row codec's (rotations)
};

// The key format of a spec for rows of head_dim values sealed block_tokens at a time (> 0). Throws
// what Codec::make throws for the row codec (UnknownCodec, BadParams, BadHeadDim), and BadParams for a spec
// or combination no format takes (naming the spec).
std::unique_ptr<const KeyFormat> make_key_format(std::string_view spec, int head_dim, int block_tokens,
                                                 const KeyFormatOptions& options = {});

// Whether a spec names a key format that is no row codec (values cannot use it); throws BadParams for a
// malformed one.
bool is_key_only_spec(std::string_view spec);
// A spec's syntax checked without a head size: what make_key_format refuses for every head_dim. Throws
// BadParams or UnknownCodec.
void check_key_spec(std::string_view spec);

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
