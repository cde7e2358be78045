// Saving a cache: the chosen sequences' block tables, every block they reference once (shared blocks of
// forked sequences are one payload referenced from several tables), the float rows of open blocks, and
// the configuration, written to a temporary file that is renamed over the target (docs/file-format.md).
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "../codec/key_formats.hpp"
#include "cache_file.hpp"
#include "cache_impl.hpp"
#include "crc32c.hpp"

namespace kvq {
namespace {

using detail::file::align_up;

// What goes into the payload section, by file index: the blocks kind by kind, then the staging.
struct Payloads {
    std::vector<std::vector<const uint8_t*>> blocks;  // [kind][index within the kind]
    std::vector<const detail::LayerState*> staging;
};

}  // namespace

size_t detail::CacheImpl::staging_payload_bytes() const {
    return align_up(staging_layer_bytes, detail::file::kPayloadStride);
}

namespace {

// The staged rows (exact tail and open block) as a file stores them: the staging's ring of
// staging_blocks slots (or its first `bytes` of them, version 6, when no saved layer reached the others), each in the staging layout (keys, then values; per kv head block_tokens rows of
// the staging codec, f32 or f16), position p at slot (p / block_tokens) % staging_blocks, with every row
// not staged zero, so a cache's contents alone decide the bytes (a truncate leaves stale rows behind,
// which no read ever sees).
void staging_payload(const detail::CacheImpl& c, const detail::LayerState& st, size_t bytes, std::vector<uint8_t>& out) {
    out.assign(bytes, 0);
    for (size_t pos = st.pool_end(); pos < st.n_tokens; ++pos) {
        for (int h = 0; h < c.cfg.n_kv_heads; ++h) {
            for (const bool keys : {true, false}) {
                if (!keys && c.latent()) continue;  // a latent's values are its key rows
                const uint8_t* row = c.staged_row(st, keys, h, pos);
                std::memcpy(out.data() + (row - st.staging.data()), row, keys ? c.exact.row_bytes() : c.exact_v.row_bytes());
            }
        }
    }
}

// The block tables of the chosen sequences, with file indices for their blocks and staging buffers.
detail::file::Tables tables_of(const detail::CacheImpl& c, const std::vector<const detail::Sequence*>& chosen, Payloads& p) {
    detail::file::Tables t;
    std::unordered_map<detail::BlockId, uint32_t> index;  // within its kind
    p.blocks.assign(c.kinds.size(), {});
    for (const detail::Sequence* s : chosen) {
        auto& layers = t.sequences.emplace_back();
        for (size_t l = 0; l < s->layers.size(); ++l) {
            const detail::LayerState& st = s->layers[l];
            std::vector<const uint8_t*>& blocks = p.blocks[c.kind_of[l]];
            detail::file::LayerRecord& r = layers.emplace_back();
            r.n_tokens = st.n_tokens;
            r.first_pos = st.first_pos;
            r.staged = static_cast<uint32_t>(st.staged);
            if (!st.staging.empty()) {
                r.staging = static_cast<uint32_t>(p.staging.size());
                p.staging.push_back(&st);
            }
            for (const detail::BlockRef& b : st.table) {
                const auto [it, fresh] = index.emplace(b.id, static_cast<uint32_t>(blocks.size()));
                if (fresh) blocks.push_back(b.data);
                r.blocks.push_back(it->second);
            }
            for (const auto& [pos, head] : st.poisoned) r.poisoned.emplace_back(pos, static_cast<uint32_t>(head));
        }
    }
    // Indices within a kind become file indices: the blocks of the kinds before it come first.
    std::vector<uint32_t> first(c.kinds.size(), 0);
    for (size_t k = 1; k < c.kinds.size(); ++k) first[k] = first[k - 1] + static_cast<uint32_t>(p.blocks[k - 1].size());
    for (auto& layers : t.sequences) {
        for (size_t l = 0; l < layers.size(); ++l) {
            for (uint32_t& b : layers[l].blocks) b += first[c.kind_of[l]];
        }
    }
    return t;
}

}  // namespace

void detail::CacheImpl::save(const std::string& path, const SequenceId* only) const {
    // Every sequence saved is held as a reader while it is written out, in increasing id order (the map's).
    std::vector<ReadHeld> held;
    if (only) {
        held.push_back(read("save", *only));
    } else {
        std::vector<std::pair<SequenceId, std::shared_ptr<detail::Sequence>>> all;
        {
            std::lock_guard<std::mutex> lock(seq_mu);
            all.assign(seqs.begin(), seqs.end());
        }
        for (auto& [id, seq] : all) {
            ReadHeld h{std::move(seq), {}};
            h.lock = std::shared_lock<std::shared_mutex>(h.seq->mu);
            if (!h.seq->removed) held.push_back(std::move(h));  // removed meanwhile: not saved
        }
    }
    std::vector<const detail::Sequence*> chosen;
    for (const ReadHeld& h : held) chosen.push_back(h.seq.get());
    Payloads p;
    detail::file::Tables t = tables_of(*this, chosen, p);
    std::vector<uint8_t> buffer;
    // Block b of kind k as the file holds it: keys in ggml rows (a copy, where the pool groups them).
    const auto file_block = [&](size_t k, const uint8_t* b) {
        if (kinds[k].keys->rows_as_file()) return b;
        buffer.assign(b, b + pool->block_bytes(k));
        convert_keys(kinds[k], buffer.data(), true);
        return static_cast<const uint8_t*>(buffer.data());
    };
    for (size_t k = 0; k < kinds.size(); ++k) {
        for (const uint8_t* b : p.blocks[k]) t.crcs.push_back(detail::crc32c(file_block(k, b), pool->block_bytes(k)));
    }
    // Staging payloads of the ring's slots the saved tokens reached (the same for every payload: the most
    // any layer reached), not the whole ring: what the cache holds, decided by its tokens alone.
    size_t held_slots = p.staging.empty() ? staging_blocks : 1;
    for (const detail::LayerState* st : p.staging) held_slots = std::max(held_slots, staging_slots_for(st->n_tokens));
    const size_t payload_bytes = held_slots == staging_blocks ? staging_payload_bytes()
                                                              : align_up(held_slots * staging_block_bytes, detail::file::kPayloadStride);
    for (const detail::LayerState* st : p.staging) {
        staging_payload(*this, *st, payload_bytes, buffer);
        t.crcs.push_back(detail::crc32c(buffer.data(), buffer.size()));
    }
    const std::vector<uint8_t> tables = detail::file::encode_tables(t);

    detail::file::Header h;
    // The oldest version that holds the cache (3 without an exact tail or key scales), so an older kvq
    // reads its files.
    h.version = payload_bytes != staging_payload_bytes() || cfg.head_dim_v != cfg.head_dim || cfg.latent_values
                    ? detail::file::kHeldStagingFormatVersion
                : !cfg.key_scales.empty() ? detail::file::kKeyScalesFormatVersion
                : cfg.exact_tail_tokens  ? detail::file::kExactTailFormatVersion
                                         : detail::file::kExactTailFormatVersion - 1;
    if (cfg.key_scales.size() > detail::file::kMaxHeaderBytes / 4 - 4096) {
        throw std::invalid_argument("KVCache::save: " + std::to_string(cfg.key_scales.size()) +
                                    " key scales are more than a cache file's header holds");
    }
    h.config = cfg;
    // The keys by their format's name (its row codec's, with the wrappers' suffixes), the values by codec.
    h.config.key_codec = key_format->name();
    h.config.value_codec = value.name();
    // Each layer's codecs by name, unless every layer has the default ones.
    h.config.layer_codecs.clear();
    bool own_codecs = false;
    for (int l = 0; l < cfg.n_layers; ++l) {
        own_codecs |= kind(l).keys->name() != key_format->name() || kind(l).value.name() != value.name();
    }
    for (int l = 0; own_codecs && l < cfg.n_layers; ++l) h.config.layer_codecs.push_back({kind(l).keys->name(), kind(l).value.name()});
    // Centering as the oldest files say it where they can: when every key spec is centered (cfg.center_keys),
    // the center_keys field and the specs without "+center", which any kvq reads. Otherwise each centered
    // spec keeps its "+center", and a kvq that does not know the suffix refuses the file by that codec name,
    // as it refuses chanB (docs/file-format.md, "Versioning").
    if (cfg.center_keys) {
        h.config.key_codec = detail::key_spec_centered(h.config.key_codec, false);
        for (LayerCodecs& l : h.config.layer_codecs) l.key = detail::key_spec_centered(l.key, false);
    }
    for (size_t k = 0; k < kinds.size(); ++k) {
        h.kinds.push_back({p.blocks[k].size(), pool->block_bytes(k), kinds[k].key.row_bytes(), kinds[k].value.row_bytes()});
        h.n_blocks += p.blocks[k].size();
    }
    h.block_bytes = h.kinds[0].block_bytes;
    h.key_row_bytes = h.kinds[0].key_row_bytes;
    h.value_row_bytes = h.kinds[0].value_row_bytes;
    h.n_staging = p.staging.size();
    h.staging_bytes = payload_bytes;
    h.n_sequences = chosen.size();
    // The header's size does not depend on the offsets it holds, so it is known before they are.
    h.header_bytes = static_cast<uint32_t>(detail::file::encode_header(h).size());
    h.payload_offset = align_up(h.header_bytes, detail::file::kPayloadAlignment);
    h.table_offset = h.payload_offset + h.n_staging * h.staging_bytes;
    for (const detail::file::KindRecord& k : h.kinds) h.table_offset += k.n_blocks * k.block_bytes;
    h.table_bytes = tables.size();
    h.file_bytes = h.table_offset + h.table_bytes;
    const std::vector<uint8_t> header = detail::file::encode_header(h);

    detail::file::OutFile out(path);
    out.write(header.data(), header.size());
    out.zeros(h.payload_offset - header.size());
    for (size_t k = 0; k < kinds.size(); ++k) {
        for (const uint8_t* b : p.blocks[k]) out.write(file_block(k, b), h.kinds[k].block_bytes);
    }
    for (const detail::LayerState* st : p.staging) {
        staging_payload(*this, *st, payload_bytes, buffer);
        out.write(buffer.data(), buffer.size());
    }
    out.write(tables.data(), tables.size());
    out.commit();
}

void KVCache::save(const std::string& path) const { impl_->save(path, nullptr); }
void KVCache::save(const std::string& path, SequenceId seq) const { impl_->save(path, &seq); }

}  // namespace kvq
