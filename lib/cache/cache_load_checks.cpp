// The checks of a cache file before any payload is read (cache_load_checks.hpp).
#include "cache_load_checks.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

namespace kvq::detail::file {
namespace {

std::string float_text(float x) {
    char s[32];
    std::snprintf(s, sizeof s, "%.9g", static_cast<double>(x));
    return s;
}

// One layer's record against the cache's invariants (lib/cache/cache_impl.hpp).
void check_layer_record(const detail::CacheImpl& c, const Header& h, const LayerRecord& r, const std::string& where,
                        int layer) {
    const size_t window = c.window(layer);
    const uint64_t bt = c.bt();
    const auto fail = [&](const std::string& what) { bad(where + ": " + what); };
    if (r.n_tokens > kMaxTokens) fail("n_tokens " + std::to_string(r.n_tokens) + " is beyond 2^48");
    if (r.first_pos > r.n_tokens || r.first_pos % bt != 0) {
        fail("first position " + std::to_string(r.first_pos) + " is not a block boundary within the " +
             std::to_string(r.n_tokens) + " tokens");
    }
    const uint64_t window_start = window && r.n_tokens > window ? r.n_tokens - window : 0;
    if (r.first_pos > window_start) {
        fail("tokens released before position " + std::to_string(r.first_pos) + ", but the layer's window needs them from " +
             std::to_string(window_start));
    }
    // The exact tail and the open block: at most exact_tail_tokens + block_tokens − 1 staged tokens.
    if (r.staged >= bt + static_cast<uint64_t>(c.cfg.exact_tail_tokens) || r.staged > r.n_tokens - r.first_pos) {
        fail(std::to_string(r.staged) + " staged tokens do not fit the exact tail and the open block");
    }
    const bool staging_policy = c.cfg.seal == SealPolicy::on_block_full;
    if (r.staging != kNoStaging && !staging_policy) fail("has float rows under seal = on_append");
    if (r.staging != kNoStaging && r.staging >= h.n_staging) {
        fail("staging index " + std::to_string(r.staging) + " is out of range (" + std::to_string(h.n_staging) + ")");
    }
    // A payload of the ring's first slots holds a layer whose tokens reached no other slot (version 6).
    if (r.staging != kNoStaging && c.staging_slots_for(r.n_tokens) > staging_payload_slots(c, h)) {
        fail(std::to_string(r.n_tokens) + " tokens reach more ring slots than the file's staging payloads hold (" +
             std::to_string(staging_payload_slots(c, h)) + ")");
    }
    const uint64_t pool_end = r.n_tokens - r.staged;
    if (r.staged > 0 && (r.staging == kNoStaging || pool_end % bt != 0)) {
        fail("staged tokens without a staging payload or after a partly filled block");
    }
    const uint64_t n_blocks = (pool_end - r.first_pos + bt - 1) / bt;
    if (r.blocks.size() != n_blocks) {
        fail(std::to_string(r.blocks.size()) + " blocks for " + std::to_string(pool_end - r.first_pos) +
             " tokens in blocks of " + std::to_string(bt) + " (needs " + std::to_string(n_blocks) + ")");
    }
    // The layer's blocks are blocks of its kind (of its codecs' size).
    const size_t kind = c.kind_of[layer];
    const uint64_t lo = kind_first_block(h, kind), hi = lo + h.kinds[kind].n_blocks;
    for (uint32_t b : r.blocks) {
        if (b < lo || b >= hi) {
            fail("block index " + std::to_string(b) + " is outside " + std::to_string(lo) + ".." + std::to_string(hi) +
                 ", the blocks of the layer's codecs (kind " + std::to_string(kind) + ")");
        }
    }
    for (const auto& [pos, head] : r.poisoned) {
        if (pos < r.first_pos || pos >= r.n_tokens || head >= static_cast<uint32_t>(c.cfg.n_kv_heads)) {
            fail("non-finite row (" + std::to_string(pos) + ", kv head " + std::to_string(head) + ") is outside the layer");
        }
    }
}

}  // namespace

Header read_header(const InFile& f) {
    if (f.size() < kPrefixBytes) {
        bad("the file holds " + std::to_string(f.size()) + " bytes, less than a header (truncated, or not a cache file)");
    }
    const auto prefix = f.read(0, kPrefixBytes, "header");
    const Header p = decode_prefix(prefix);
    if (f.size() < p.header_bytes) {
        bad("the file holds " + std::to_string(f.size()) + " bytes, less than its " + std::to_string(p.header_bytes) +
            "-byte header (truncated)");
    }
    const Header h = decode_header(f.read(0, p.header_bytes, "header"));
    if (f.size() != h.file_bytes) {
        bad("the header gives a file of " + std::to_string(h.file_bytes) + " bytes, the file holds " +
            std::to_string(f.size()) + (f.size() < h.file_bytes ? " (truncated)" : " (data after the end)"));
    }
    // No CRC covers the padding before the payloads; it must be zero, so that no byte of a file can
    // change unnoticed.
    const auto padding = f.read(h.header_bytes, h.payload_offset - h.header_bytes, "padding");
    if (std::any_of(padding.begin(), padding.end(), [](uint8_t b) { return b != 0; })) {
        bad("the padding between the header and the payloads is not zero: the file is corrupted");
    }
    return h;
}

void check_matches(const detail::CacheImpl& c, const Header& h) {
    // The file's key specs as the cache names them: its center_keys field is "+center" on each.
    const CacheConfig f = detail::centered_key_specs(h.config);
    const auto differ = [](const std::string& field, const std::string& in_file, const std::string& in_cache) {
        throw ConfigMismatch("KVCache::load_into: the file's " + field + " is " + in_file + ", this cache's is " +
                             in_cache + "; a file loads only into a cache of the same configuration");
    };
    const auto same_int = [&](const char* field, long long a, long long b) {
        if (a != b) differ(field, std::to_string(a), std::to_string(b));
    };
    same_int("n_layers", f.n_layers, c.cfg.n_layers);
    same_int("n_kv_heads", f.n_kv_heads, c.cfg.n_kv_heads);
    same_int("n_heads", f.n_heads, c.cfg.n_heads);
    same_int("head_dim", f.head_dim, c.cfg.head_dim);
    same_int("head_dim_v", f.head_dim_v, c.cfg.head_dim_v);
    same_int("latent_values", f.latent_values, c.cfg.latent_values);
    if (f.key_codec != c.key_format->name()) differ("key_codec", "'" + f.key_codec + "'", "'" + c.key_format->name() + "'");
    if (f.value_codec != c.value.name()) differ("value_codec", "'" + f.value_codec + "'", "'" + c.value.name() + "'");
    // Each layer's codecs as the file names them (its own, or the defaults) against the cache's.
    for (int l = 0; l < c.cfg.n_layers; ++l) {
        const LayerCodecs own = f.layer_codecs.empty() ? LayerCodecs{} : f.layer_codecs[l];
        const std::string k = own.key.empty() ? f.key_codec : own.key, v = own.value.empty() ? f.value_codec : own.value;
        const std::string field = "codecs of layer " + std::to_string(l);
        if (k != c.kind(l).keys->name() || v != c.kind(l).value.name()) {
            differ(field, "'" + k + "/" + v + "'", "'" + c.kind(l).keys->name() + "/" + c.kind(l).value.name() + "'");
        }
    }
    if (f.seed != c.cfg.seed) differ("seed", std::to_string(f.seed), std::to_string(c.cfg.seed));
    same_int("block_tokens", f.block_tokens, c.cfg.block_tokens);
    if (f.seal != c.cfg.seal) {
        const auto name = [](SealPolicy s) { return s == SealPolicy::on_append ? "on_append" : "on_block_full"; };
        differ("seal", name(f.seal), name(c.cfg.seal));
    }
    if (f.staging != c.cfg.staging) {
        const auto name = [](StagingType s) { return s == StagingType::f16 ? "f16" : "f32"; };
        differ("staging", name(f.staging), name(c.cfg.staging));
    }
    same_int("exact_tail_tokens", f.exact_tail_tokens, c.cfg.exact_tail_tokens);
    // Bitwise: the scale is applied to every score, and a file promises the same attention output.
    if (std::memcmp(&f.scale, &c.cfg.scale, sizeof(float)) != 0) differ("scale", float_text(f.scale), float_text(c.cfg.scale));
    if (std::memcmp(&f.softcap, &c.cfg.softcap, sizeof(float)) != 0) {
        differ("softcap", float_text(f.softcap), float_text(c.cfg.softcap));
    }
    // Bitwise, as the scale: the stored keys are k ⊙ s of the file's s.
    if (f.key_scales.size() != c.cfg.key_scales.size()) {
        differ("key_scales", f.key_scales.empty() ? "none" : std::to_string(f.key_scales.size()) + " values",
               c.cfg.key_scales.empty() ? "none" : std::to_string(c.cfg.key_scales.size()) + " values");
    }
    for (size_t i = 0; i < f.key_scales.size(); ++i) {
        if (std::memcmp(&f.key_scales[i], &c.cfg.key_scales[i], sizeof(float)) != 0) {
            differ("key_scales[" + std::to_string(i) + "]", float_text(f.key_scales[i]), float_text(c.cfg.key_scales[i]));
        }
    }
    for (int l = 0; l < c.cfg.n_layers; ++l) {
        const long long w = f.sliding_window.empty() ? 0 : f.sliding_window[l];
        if (w != static_cast<long long>(c.window(l))) {
            differ("sliding_window of layer " + std::to_string(l), std::to_string(w), std::to_string(c.window(l)));
        }
    }
}

void check_sizes(const detail::CacheImpl& c, const Header& h) {
    const auto same = [](const char* what, uint64_t in_file, uint64_t here) {
        if (in_file != here) {
            bad(std::string(what) + " is " + std::to_string(in_file) + " bytes in the file but " + std::to_string(here) +
                " bytes in this kvq for the same configuration");
        }
    };
    if (h.kinds.size() != c.kinds.size()) {
        bad("the file has " + std::to_string(h.kinds.size()) + " kinds of layer codecs, this configuration " +
            std::to_string(c.kinds.size()));
    }
    for (size_t k = 0; k < c.kinds.size(); ++k) {
        same("a key row", h.kinds[k].key_row_bytes, c.kinds[k].key.row_bytes());
        same("a value row", h.kinds[k].value_row_bytes, c.kinds[k].value.row_bytes());
        same("a block", h.kinds[k].block_bytes, c.pool->block_bytes(k));
    }
    if (h.staging_bytes != c.staging_payload_bytes()) {
        // Version 6: the first m slots of the ring, 1 <= m < staging_blocks, padded to the payload stride.
        const uint64_t m = h.version >= kHeldStagingFormatVersion ? staging_payload_slots(c, h) : 0;
        const uint64_t stride = kPayloadStride;
        if (m == 0 || m >= c.staging_blocks || (m * c.staging_block_bytes + stride - 1) / stride * stride != h.staging_bytes) {
            same("a staging payload", h.staging_bytes, c.staging_payload_bytes());
        }
    }
}

uint64_t staging_payload_slots(const detail::CacheImpl& c, const Header& h) {
    if (h.staging_bytes == c.staging_payload_bytes()) return c.staging_blocks;
    return std::min<uint64_t>(c.staging_blocks, h.staging_bytes / c.staging_block_bytes);
}

std::vector<uint32_t> check_tables(const detail::CacheImpl& c, const Header& h, const Tables& t) {
    std::vector<uint32_t> refs(h.n_blocks, 0);
    std::vector<uint8_t> staging_used(h.n_staging, 0);
    for (size_t s = 0; s < t.sequences.size(); ++s) {
        for (size_t l = 0; l < t.sequences[s].size(); ++l) {
            const LayerRecord& r = t.sequences[s][l];
            const std::string where = "sequence " + std::to_string(s) + " of the file, layer " + std::to_string(l);
            check_layer_record(c, h, r, where, static_cast<int>(l));
            for (uint32_t b : r.blocks) ++refs[b];
            if (r.staging != kNoStaging && staging_used[r.staging]++) {
                bad(where + ": staging payload " + std::to_string(r.staging) + " is used twice");
            }
        }
    }
    for (size_t b = 0; b < refs.size(); ++b) {
        if (refs[b] == 0) bad("block " + std::to_string(b) + " is in no block table");
    }
    for (size_t i = 0; i < staging_used.size(); ++i) {
        if (!staging_used[i]) bad("staging payload " + std::to_string(i) + " belongs to no layer");
    }
    return refs;
}

}  // namespace kvq::detail::file
