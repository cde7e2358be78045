// kvq — how one cache stores keys and values: a key codec, a value codec, and whether keys are centered.
//
// Written "K/V", for example "q8_0/q4_0" or "q4_0+rot+center/q4_0". The key part may have "+center":
// each sealed block of `block_tokens` keys has its per-channel mean subtracted before quantizing and the
// mean kept in fp16 beside the block (a KVCache key codec's "+center"); the score adds q·mean back. The means
// count in the bits per value: 16 / block_tokens bits per key value (0.5 at 32 tokens per block).
//
// The key part may instead be "chanB" (B = 2..8): per-channel keys within a block, as KIVI (arXiv
// 2402.02750) and KVQuant (arXiv 2401.18079) quantize keys: for each channel of a block's keys, an fp16
// minimum and an fp16 step over the block's tokens, and a B-bit code per value, x̃ = min + step·code
// (B + 32 / block_tokens bits per key value). The score is q·min + Σ_c (q_c·step_c)·code_c. KVCache
// stores them (CacheConfig::key_codec "chanB", sealed a block at a time; lib/codec/channel_keys.hpp).
//
// "K/V|K2/V2" gives the sliding-window layers of a model (Gemma 3's local layers) the pair K2/V2 and the
// full-attention layers K/V, as CacheConfig::layer_codecs does in a KVCache; bits per value are then the
// mean over the layers; each pair's "+center" centers its own layers' keys only.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvq {

struct KVFormat {
    std::string key_codec;    // a KVCache key codec without "+center": a kvq::Codec spec, e.g. "q4_0+rot", or a key format's ("chan4", "q4_0+sink1")
    std::string value_codec;  // a kvq::Codec spec
    bool center_keys = false;  // the key part's "+center" (key_label() has it)
    // The format of sliding-window layers ("K/V|K2/V2"); null: every layer has this one.
    std::shared_ptr<const KVFormat> window;

    // The format a layer uses: window's on a sliding-window layer, if there is one; else this one.
    const KVFormat& on_layer(bool windowed) const { return windowed && window ? *window : *this; }
    std::string key_label() const;  // the key spec as a KVCache names it, e.g. "q4_0+rot+center+sink1"
    std::string label() const;      // "K/V", or "K/V|K2/V2"
    // Bits per stored value, everything counted, for rows of head_dim values (of this pair, not of window).
    double key_bits(int head_dim, int block_tokens = 32) const;
    double value_bits(int head_dim) const;

    // Parses "K/V" or "K/V|K2/V2"; throws std::invalid_argument for a malformed pair or an unknown codec name.
    static KVFormat parse(std::string_view spec);
};

// A comma-separated list of "K/V" pairs.
std::vector<KVFormat> parse_kv_formats(std::string_view list);
// Every key codec crossed with every value codec (each list comma-separated).
std::vector<KVFormat> cross_kv_formats(std::string_view key_codecs, std::string_view value_codecs);
// The pairs the table and the planner show by default: f16, the ggml pairs, the 4-bit-key variants
// (+rot, +center, both), polar and turbo pairs at comparable budgets, and any codec registered later
// as K and V of its own. The rest of the table is one --pairs away.
std::vector<KVFormat> default_kv_formats();
// The pairs the table shows for a latent data set (DeepSeek's MLA) by default: every codec of the codec
// table that a latent KVCache of these sizes holds (f16, bf16 and ggml's unrotated block codecs; f32
// aside), as K/K: the latent is stored once, so the value codec is the key codec.
std::vector<KVFormat> default_latent_formats(int head_dim = 576, int head_dim_v = 512);

}  // namespace kvq
