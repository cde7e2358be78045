// Saving a cache: the chosen sequences' block tables, every block they reference once (shared blocks of
// forked sequences are one payload referenced from several tables), the float rows of open blocks, and
// the configuration, written to a temporary file that is renamed over the target (docs/file-format.md).
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "cache_file.hpp"
#include "cache_impl.hpp"
#include "crc32c.hpp"

namespace kvq {
namespace {

using detail::file::align_up;

// What goes into the payload section, by file index.
struct Payloads {
    std::vector<const uint8_t*> blocks;
    std::vector<const detail::LayerState*> staging;
};

}  // namespace

size_t detail::CacheImpl::staging_payload_bytes() const {
    return align_up(staging_layer_bytes, detail::file::kPayloadStride);
}

namespace {

// The open block's rows as a file stores them: the staging layout (keys, then values; per kv head
// block_tokens rows of the staging codec, f32 or f16), with the rows past `staged` zero, so a cache's contents alone decide the bytes
// (a truncate leaves stale rows behind, which no read ever sees).
void staging_payload(const detail::CacheImpl& c, const detail::LayerState& st, std::vector<uint8_t>& out) {
    out.assign(c.staging_payload_bytes(), 0);
    const size_t head = c.staging_layout.k_head_stride, half = c.staging_layer_bytes / 2;
    for (size_t part = 0; part < 2; ++part) {
        for (int h = 0; h < c.cfg.n_kv_heads; ++h) {
            const size_t at = part * half + h * head;
            std::memcpy(out.data() + at, st.staging.data() + at, st.staged * c.exact.row_bytes());
        }
    }
}

// The block tables of the chosen sequences, with file indices for their blocks and staging buffers.
detail::file::Tables tables_of(const std::vector<const detail::Sequence*>& chosen, Payloads& p) {
    detail::file::Tables t;
    std::unordered_map<detail::BlockId, uint32_t> index;
    for (const detail::Sequence* s : chosen) {
        auto& layers = t.sequences.emplace_back();
        for (const detail::LayerState& st : s->layers) {
            detail::file::LayerRecord& r = layers.emplace_back();
            r.n_tokens = st.n_tokens;
            r.first_pos = st.first_pos;
            r.staged = static_cast<uint32_t>(st.staged);
            if (!st.staging.empty()) {
                r.staging = static_cast<uint32_t>(p.staging.size());
                p.staging.push_back(&st);
            }
            for (const detail::BlockRef& b : st.table) {
                const auto [it, fresh] = index.emplace(b.id, static_cast<uint32_t>(p.blocks.size()));
                if (fresh) p.blocks.push_back(b.data);
                r.blocks.push_back(it->second);
            }
            for (const auto& [pos, head] : st.poisoned) r.poisoned.emplace_back(pos, static_cast<uint32_t>(head));
        }
    }
    return t;
}

}  // namespace

void detail::CacheImpl::save(const std::string& path, const SequenceId* only) const {
    std::vector<const detail::Sequence*> chosen;
    if (only) {
        chosen.push_back(&find("save", *only));
    } else {
        std::lock_guard<std::mutex> lock(seq_mu);
        for (const auto& entry : seqs) chosen.push_back(entry.second.get());
    }
    Payloads p;
    detail::file::Tables t = tables_of(chosen, p);
    std::vector<uint8_t> buffer;
    for (const uint8_t* b : p.blocks) t.crcs.push_back(detail::crc32c(b, pool->block_bytes()));
    for (const detail::LayerState* st : p.staging) {
        staging_payload(*this, *st, buffer);
        t.crcs.push_back(detail::crc32c(buffer.data(), buffer.size()));
    }
    const std::vector<uint8_t> tables = detail::file::encode_tables(t);

    detail::file::Header h;
    h.config = cfg;
    h.config.key_codec = key.name();
    h.config.value_codec = value.name();
    h.n_blocks = p.blocks.size();
    h.block_bytes = pool->block_bytes();
    h.n_staging = p.staging.size();
    h.staging_bytes = staging_payload_bytes();
    h.n_sequences = chosen.size();
    h.key_row_bytes = key.row_bytes();
    h.value_row_bytes = value.row_bytes();
    // The header's size does not depend on the offsets it holds, so it is known before they are.
    h.header_bytes = static_cast<uint32_t>(detail::file::encode_header(h).size());
    h.payload_offset = align_up(h.header_bytes, detail::file::kPayloadAlignment);
    h.table_offset = h.payload_offset + h.n_blocks * h.block_bytes + h.n_staging * h.staging_bytes;
    h.table_bytes = tables.size();
    h.file_bytes = h.table_offset + h.table_bytes;
    const std::vector<uint8_t> header = detail::file::encode_header(h);

    detail::file::OutFile out(path);
    out.write(header.data(), header.size());
    out.zeros(h.payload_offset - header.size());
    for (const uint8_t* b : p.blocks) out.write(b, h.block_bytes);
    for (const detail::LayerState* st : p.staging) {
        staging_payload(*this, *st, buffer);
        out.write(buffer.data(), buffer.size());
    }
    out.write(tables.data(), tables.size());
    out.commit();
}

void KVCache::save(const std::string& path) const { impl_->save(path, nullptr); }
void KVCache::save(const std::string& path, SequenceId seq) const { impl_->save(path, &seq); }

}  // namespace kvq
