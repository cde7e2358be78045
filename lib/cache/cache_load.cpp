// Loading a cache file: the header, the configuration (checked against this cache's), the block tables
// (checked against each other and the cache's rules; those checks are in cache_load_checks.cpp), the
// CRC32C of every payload and the rows it holds; only then are blocks taken from the pool and filled, and
// the sequences added in one step. Anything that fails on the way leaves the cache as it was
// (docs/file-format.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "cache_file.hpp"
#include "cache_impl.hpp"
#include "cache_load_checks.hpp"
#include "crc32c.hpp"

namespace kvq {
namespace {

using detail::file::bad;
using detail::file::Header;
using detail::file::InFile;
using detail::file::LayerRecord;
using detail::file::Tables;

// Payload i (blocks first, then staging payloads): its offset, size and stored CRC.
struct PayloadRef {
    uint64_t offset;
    size_t bytes;
    uint32_t crc;
};

PayloadRef payload(const Header& h, const Tables& t, uint64_t i) {
    if (i < h.n_blocks) {
        const detail::file::BlockPlace b = detail::file::block_place(h, i);
        return {b.offset, static_cast<size_t>(b.bytes), t.crcs[i]};
    }
    const uint64_t j = i - h.n_blocks;
    return {h.table_offset - (h.n_staging - j) * h.staging_bytes, static_cast<size_t>(h.staging_bytes), t.crcs[i]};
}

void read_payload(const InFile& f, const Header& h, const Tables& t, uint64_t i, uint8_t* dst, const char* when) {
    const PayloadRef p = payload(h, t, i);
    f.read(p.offset, p.bytes, dst, "payload");
    const uint32_t crc = detail::crc32c(dst, p.bytes);
    if (crc != p.crc) {
        const std::string what = i < h.n_blocks ? "block " + std::to_string(i)
                                                : "staging payload " + std::to_string(i - h.n_blocks);
        bad(what + ": CRC32C mismatch (stored " + std::to_string(p.crc) + ", computed " + std::to_string(crc) + ")" + when);
    }
}

// A row the cache's input rules do not admit: (row within its payload, kv head).
using BadRows = std::vector<std::pair<uint32_t, int>>;

// The rows of each block that some table reads: a prefix (first_pos is a block boundary), the longest any
// table referencing the block reads. Rows past it (left by a truncate, or never written) are never read.
std::vector<uint32_t> live_rows(const detail::CacheImpl& c, const Tables& t, uint64_t n_blocks) {
    std::vector<uint32_t> live(n_blocks, 0);
    const uint64_t bt = c.bt();
    for (const auto& layers : t.sequences) {
        for (const LayerRecord& r : layers) {
            const uint64_t pool_end = r.n_tokens - r.staged;
            for (size_t i = 0; i < r.blocks.size(); ++i) {
                const uint64_t start = r.first_pos + i * bt;
                const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(bt, pool_end - start));
                live[r.blocks[i]] = std::max(live[r.blocks[i]], n);
            }
        }
    }
    return live;
}

// The positions at which the tables place each block (that of a block's first row): the first one seen
// and, for a hostile file, one that differs from it (kNoStart: none). The format-owned fields of a block's
// side data (sink counts) are checked against both.
constexpr uint64_t kNoStart = UINT64_MAX;
struct BlockStarts {
    uint64_t first = kNoStart, other = kNoStart;
};
std::vector<BlockStarts> block_starts(const detail::CacheImpl& c, const Tables& t, uint64_t n_blocks) {
    std::vector<BlockStarts> at(n_blocks);
    for (const auto& layers : t.sequences) {
        for (const LayerRecord& r : layers) {
            for (size_t i = 0; i < r.blocks.size(); ++i) {
                BlockStarts& b = at[r.blocks[i]];
                const uint64_t start = r.first_pos + i * c.bt();
                if (b.first == kNoStart) {
                    b.first = start;
                } else if (start != b.first) {
                    b.other = start;
                }
            }
        }
    }
    return at;
}

bool all_finite(const float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) return false;
    }
    return true;
}

// The live rows of a block of the file (as attention reads them: dequantized, the formats' side data
// applied) that are not finite: what append never stores under NanPolicy::reject, and records as
// non-finite under propagate.
BadRows bad_block_rows(const detail::CacheImpl& c, size_t k, const uint8_t* file_block, uint32_t live, uint64_t index,
                       const BlockStarts& starts) {
    const detail::LayerKind& kind = c.kinds[k];
    BadRows bad;
    const size_t d = static_cast<size_t>(c.cfg.head_dim), dv = static_cast<size_t>(c.dv());
    std::vector<float> rows(static_cast<size_t>(live) * std::max(d, dv));
    // The block in the pool's layout (a copy, where the key format's differs from the file's).
    std::vector<uint8_t> copy;
    const uint8_t* block = file_block;
    if (!kind.keys->rows_as_file()) {
        copy.assign(file_block, file_block + c.pool->block_bytes(k));
        c.convert_keys(kind, copy.data(), false);
        block = copy.data();
    }
    for (int h = 0; h < c.cfg.n_kv_heads; ++h) {
        for (const uint64_t start : {starts.first, starts.other}) {
            if (start == kNoStart) continue;
            std::string e = kind.keys->side_error(kind.key_head(block, h), start);
            if (e.empty() && !c.latent()) e = kind.values->side_error(kind.value_head(block, h), start);
            if (!e.empty()) detail::file::bad("block " + std::to_string(index) + ", kv head " + std::to_string(h) + ": " + e);
        }
        std::vector<char> row_bad(live, 0);
        kind.keys->read_rows(kind.key_head(block, h), 0, live, rows.data());
        for (uint32_t r = 0; r < live; ++r) row_bad[r] |= !all_finite(rows.data() + r * d, d);
        if (!c.latent()) {  // a latent's values are its keys' leading values, just checked
            kind.values->read_rows(kind.value_head(block, h), 0, live, rows.data());
            for (uint32_t r = 0; r < live; ++r) row_bad[r] |= !all_finite(rows.data() + r * dv, dv);
        }
        for (uint32_t r = 0; r < live; ++r) {
            if (row_bad[r]) bad.emplace_back(r, h);
        }
    }
    return bad;
}

// The staged rows of an open block (a staging payload) against the rules append applies to its input:
// finite, and within the range of the codec that will quantize them when the block is sealed.
// The payload is the staging's ring (cache_impl.hpp): staged row r is position pool_end + r.
BadRows bad_staged_rows(const detail::CacheImpl& c, const detail::LayerKind& kind, const uint8_t* staging, uint64_t pool_end,
                        uint32_t staged) {
    BadRows bad;
    const size_t d = static_cast<size_t>(c.cfg.head_dim), dv = static_cast<size_t>(c.dv()), bt = c.bt();
    std::vector<float> k(d), v(dv);
    for (int h = 0; h < c.cfg.n_kv_heads; ++h) {
        for (uint32_t r = 0; r < staged; ++r) {
            const uint64_t pos = pool_end + r;
            const uint8_t* slot = staging + (pos / bt) % c.staging_blocks * c.staging_block_bytes;
            c.exact.dequantize_rows(c.staging_layout.key_head(slot, h, c.exact.row_bytes()).rows + pos % bt * c.exact.row_bytes(), 1, k.data());
            c.exact_v.dequantize_rows(c.staging_layout.value_head(slot, h, c.exact_v.row_bytes()).rows + pos % bt * c.staged_value_stride(), 1, v.data());
            const bool ok = all_finite(k.data(), d) && all_finite(v.data(), dv) &&
                            kind.key_limit.admits(k.data(), static_cast<int>(d)) &&
                            (c.latent() || kind.value_limit.admits(v.data(), static_cast<int>(dv)));
            if (!ok) bad.emplace_back(r, h);
        }
    }
    return bad;
}

// Applies the cache's NanPolicy to the rows found: reject refuses the file (and any non-finite row it
// lists); propagate records them as non-finite rows of every layer that reads them.
void apply_nan_policy(const detail::CacheImpl& c, Tables& t, const std::vector<BadRows>& block_bad,
                      const std::vector<BadRows>& staging_bad) {
    const uint64_t bt = c.bt();
    for (size_t s = 0; s < t.sequences.size(); ++s) {
        for (size_t l = 0; l < t.sequences[s].size(); ++l) {
            LayerRecord& r = t.sequences[s][l];
            const std::string where = "sequence " + std::to_string(s) + " of the file, layer " + std::to_string(l);
            if (c.cfg.nan_policy == NanPolicy::reject && !r.poisoned.empty()) {
                bad(where + ": lists non-finite rows, which a cache with nan_policy = reject never holds");
            }
            const uint64_t pool_end = r.n_tokens - r.staged;
            const auto found = [&](uint64_t pos, int head, const char* kind) {
                if (c.cfg.nan_policy == NanPolicy::reject) {
                    bad(where + ": the " + kind + " row of position " + std::to_string(pos) + ", kv head " +
                        std::to_string(head) +
                        " holds NaN or Inf or is beyond the codec's range, which nan_policy = reject does not admit");
                }
                const std::pair<uint64_t, uint32_t> p(pos, static_cast<uint32_t>(head));
                if (std::find(r.poisoned.begin(), r.poisoned.end(), p) == r.poisoned.end()) r.poisoned.push_back(p);
            };
            for (size_t i = 0; i < r.blocks.size(); ++i) {
                const uint64_t start = r.first_pos + i * bt;
                for (const auto& [row, head] : block_bad[r.blocks[i]]) {
                    if (start + row < pool_end) found(start + row, head, "block");
                }
            }
            if (r.staging != detail::file::kNoStaging) {
                for (const auto& [row, head] : staging_bad[r.staging]) {
                    if (row < r.staged) found(pool_end + row, head, "staged");
                }
            }
        }
    }
}

}  // namespace

std::vector<SequenceId> detail::CacheImpl::load(const InFile& f, const Header& h) {
    detail::file::check_matches(*this, h);
    detail::file::check_sizes(*this, h);
    Tables t = detail::file::decode_tables(f.read(h.table_offset, h.table_bytes, "block tables"), h);
    const std::vector<uint32_t> refs = detail::file::check_tables(*this, h, t);
    // Every payload's CRC before the pool is asked for a block: a bad file must not even grow the pool.
    const uint64_t n_payloads = h.n_blocks + h.n_staging;
    // Sized by the payloads there are: a file without any may name sizes no file could hold.
    uint64_t largest = h.n_staging ? h.staging_bytes : 0;
    for (const detail::file::KindRecord& k : h.kinds) largest = std::max(largest, k.n_blocks ? k.block_bytes : 0);
    std::vector<uint8_t> scratch(largest);
    // And every row a table reads against the cache's input rules (NanPolicy, the codecs' ranges): a file
    // whose CRCs were recomputed over NaN, an Inf scale or a value too large to seal is no better than
    // that input given to append.
    const std::vector<uint32_t> live = live_rows(*this, t, h.n_blocks);
    const std::vector<BlockStarts> starts = block_starts(*this, t, h.n_blocks);
    std::vector<uint32_t> staged_of(h.n_staging, 0);
    std::vector<uint64_t> pool_end_of(h.n_staging, 0);
    std::vector<size_t> kind_of_staging(h.n_staging, 0);
    for (const auto& layers : t.sequences) {
        for (size_t l = 0; l < layers.size(); ++l) {
            const LayerRecord& r = layers[l];
            if (r.staging == detail::file::kNoStaging) continue;
            staged_of[r.staging] = r.staged;
            pool_end_of[r.staging] = r.n_tokens - r.staged;
            kind_of_staging[r.staging] = kind_of[l];
        }
    }
    std::vector<BadRows> block_bad(h.n_blocks), staging_bad(h.n_staging);
    for (uint64_t i = 0; i < n_payloads; ++i) {
        read_payload(f, h, t, i, scratch.data(), ": the file is corrupted");
        if (i < h.n_blocks) {
            block_bad[i] = bad_block_rows(*this, detail::file::block_place(h, i).kind, scratch.data(), live[i], i, starts[i]);
        } else {
            const uint64_t j = i - h.n_blocks;
            staging_bad[j] = bad_staged_rows(*this, kinds[kind_of_staging[j]], scratch.data(), pool_end_of[j], staged_of[j]);
        }
    }
    apply_nan_policy(*this, t, block_bad, staging_bad);

    // Sequences with their float rows, not yet in the cache.
    const char* changed = " since it was checked: the file changed while loading";
    std::vector<std::shared_ptr<detail::Sequence>> fresh;
    size_t staging_added = 0, units = 0, charged = 0;
    for (const auto& layers : t.sequences) {
        auto& seq = fresh.emplace_back(std::make_shared<detail::Sequence>());
        size_t table_entries = 0;
        for (const LayerRecord& r : layers) table_entries += r.blocks.size();
        seq->charged = sequence_metadata_bytes() + table_entries * kTableEntryBytes;
        charged += seq->charged;
        seq->layers.resize(layers.size());
        for (size_t l = 0; l < layers.size(); ++l) {
            const LayerRecord& r = layers[l];
            detail::LayerState& st = seq->layers[l];
            st.n_tokens = r.n_tokens;
            st.first_pos = r.first_pos;
            st.staged = r.staged;
            for (const auto& [pos, head] : r.poisoned) st.poisoned.emplace_back(pos, static_cast<int>(head));
            st.table.reserve(r.blocks.size());
            st.data.reserve(r.blocks.size());
            if (r.staging == detail::file::kNoStaging) continue;
            read_payload(f, h, t, h.n_blocks + r.staging, scratch.data(), changed);
            // The slots its tokens reach (the rest of the ring is zero and comes as the tail fills).
            st.staging.assign(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(staging_slots_for(r.n_tokens) * staging_block_bytes));
            staging_added += staging_layer_bytes;
            units += kind(static_cast<int>(l)).staging_units;
            // propagate: as append does, a codec that cannot store the row gets it zeroed (it is recorded).
            for (const auto& [row, head] : staging_bad[r.staging]) {
                const size_t pos = st.pool_end() + row;
                if (!kind(static_cast<int>(l)).store_nonfinite_k) std::memset(staged_row(st, true, head, pos), 0, exact.row_bytes());
                if (!kind(static_cast<int>(l)).store_nonfinite_v) std::memset(staged_row(st, false, head, pos), 0, exact.row_bytes());
            }
        }
    }

    // The staging counts against the pool, then exactly the file's blocks (PoolExhausted: nothing
    // changed): the pool never outgrows what the file holds.
    std::vector<size_t> want;
    for (const detail::file::KindRecord& k : h.kinds) want.push_back(k.n_blocks);
    // By file index: the kinds' blocks one after another (take returns them class by class).
    const std::vector<detail::BlockRef> blocks = pool->take(want, units, staging_added, {}, true, charged);
    std::vector<SequenceId> ids;
    try {
        for (uint64_t i = 0; i < h.n_blocks; ++i) {
            read_payload(f, h, t, i, blocks[i].data, changed);
            convert_keys(kinds[detail::file::block_place(h, i).kind], blocks[i].data, false);  // files hold ggml rows
        }
        std::vector<detail::BlockRef> extra;  // a block in k tables gets k − 1 more references
        for (uint64_t i = 0; i < h.n_blocks; ++i) extra.insert(extra.end(), refs[i] - 1, blocks[i]);
        for (size_t s = 0; s < fresh.size(); ++s) {
            for (size_t l = 0; l < fresh[s]->layers.size(); ++l) {
                for (uint32_t b : t.sequences[s][l].blocks) fresh[s]->layers[l].push_block(blocks[b]);  // reserved
            }
        }
        // Published complete, in one step: blocks filled and retained, bytes counted.
        pool->retain(extra);
        staging_bytes += staging_added;
        try {
            ids = publish(fresh);
        } catch (...) {
            staging_bytes -= staging_added;
            pool->release(extra);
            throw;
        }
    } catch (...) {
        pool->release(blocks);
        pool->unreserve(units, staging_added);
        pool->uncharge_bookkeeping(charged);
        throw;
    }
    return ids;
}

namespace {

// BadCacheFile and ConfigMismatch messages name the file they are about.
template <class F>
auto with_path(const std::string& path, const char* what, F&& f) {
    try {
        return f();
    } catch (const BadCacheFile& e) {
        throw BadCacheFile(std::string("KVCache::") + what + ": '" + path + "': " + e.what());
    } catch (const ConfigMismatch& e) {
        throw ConfigMismatch(std::string(e.what()) + " ('" + path + "')");
    }
}

}  // namespace

std::vector<SequenceId> KVCache::load_into(const std::string& path) {
    return with_path(path, "load_into", [&] {
        const InFile f(path);
        return impl_->load(f, detail::file::read_header(f));
    });
}

KVCache KVCache::load(const std::string& path) { return load(path, LoadOptions{}); }

KVCache KVCache::load(const std::string& path, const LoadOptions& options) {
    return with_path(path, "load", [&] {
        const InFile f(path);
        const Header h = detail::file::read_header(f);
        if (options.threads < 1 || options.threads > 256 || options.grow_blocks < 1 || options.grow_blocks > kMaxPoolBlocks) {
            throw std::invalid_argument("KVCache::load: LoadOptions need threads in 1..256 and grow_blocks in 1.." +
                                        std::to_string(kMaxPoolBlocks) + ", got " +
                                        std::to_string(options.threads) + " and " + std::to_string(options.grow_blocks));
        }
        // Before the cache is made: its pool's limit against the file's blocks.
        if (options.max_blocks != 0 && h.n_blocks > options.max_blocks) {
            throw PoolExhausted("KVCache::load: '" + path + "' holds " + std::to_string(h.n_blocks) +
                                " blocks, more than max_blocks = " + std::to_string(options.max_blocks));
        }
        uint64_t block_bytes = 0;
        for (const detail::file::KindRecord& k : h.kinds) block_bytes += k.n_blocks * k.block_bytes;
        if (options.max_bytes != 0 && block_bytes > options.max_bytes) {
            throw PoolExhausted("KVCache::load: '" + path + "' holds " + std::to_string(block_bytes) +
                                " bytes of blocks, more than max_bytes = " + std::to_string(options.max_bytes));
        }
        CacheConfig config = h.config;
        config.max_blocks = options.max_blocks;
        config.max_bytes = options.max_bytes;
        config.grow_blocks = options.grow_blocks;
        config.threads = options.threads;
        config.int8_value_weights = options.int8_value_weights;
        config.executor = options.executor;
        std::unique_ptr<KVCache> cache;
        try {
            cache = std::make_unique<KVCache>(config);
        } catch (const std::invalid_argument& e) {
            bad(std::string("its configuration is not one this kvq can make: ") + e.what());
        }
        cache->impl_->load(f, h);
        return std::move(*cache);
    });
}

}  // namespace kvq
