// The cache's internals, shared by its source files (and by save/load, which needs the block tables).
//
// Per sequence and layer, tokens at positions [0, n_tokens) live in three places:
//   released   [0, first_pos)                 dropped by the layer's sliding window (never read again)
//   pool       [first_pos, pool_end())         pool blocks: table[i] holds positions first_pos + i·bt …;
//                                              all full except possibly the last
//   staging    [pool_end(), n_tokens)          rows as `exact` stores them (float32 or float16:
//                                              CacheConfig::staging; SealPolicy::on_block_full): the exact
//                                              tail and the open block, only when pool_end() is a block
//                                              boundary
// The staging is a ring of staging_blocks blocks' rows in the staging layout: position p is in ring slot
// (p / bt) % staging_blocks, row p % bt (with exact_tail_tokens = 0 one slot, the open block). An append
// seals a block once it is full and all its tokens are more than exact_tail_tokens old; staged rows
// never exceed exact_tail_tokens + bt − 1, which the ring holds.
// first_pos is always a block boundary. Under on_block_full the last pool block is partly filled only
// after a truncate into a sealed block; appends fill it (quantized as they arrive) before staging again,
// except where the key format fits side data to the whole block (KeyFormat::writes_rows() is false) or an
// exact tail keeps recent tokens exact: the next append moves such a block's rows back to the staging, to
// be sealed anew.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "../attention/engine.hpp"
#include "../attention/thread_pool.hpp"
#include "../attention/scratch_pool.hpp"
#include "block_pool.hpp"
#include "kvq/cache.hpp"

namespace kvq::detail {

struct LayerState {
    std::vector<BlockRef> table;
    std::vector<uint8_t*> data;  // table[i].data, contiguous for the attention kernel
    size_t first_pos = 0;
    size_t n_tokens = 0;
    size_t staged = 0;
    // staging_blocks slots, each keys then values, each n_kv_heads × block_tokens rows of the staging
    // codec (f32 or f16); lazily sized (a ring: see the top).
    std::vector<uint8_t> staging;
    // (position, kv head) of rows that held NaN/Inf under NanPolicy::propagate in a codec that cannot store
    // them; attention over such a row returns NaN for that kv head's query heads.
    std::vector<std::pair<size_t, int>> poisoned;

    size_t pool_end() const { return n_tokens - staged; }
    void push_block(BlockRef b) {
        table.push_back(b);
        data.push_back(b.data);
    }
};

// A sequence is published (put into CacheImpl::seqs) only once it is complete, its blocks retained and
// its bytes counted; every entry point takes its lock, so any thread may name any id at any time: a reader
// (attend, save, fork's copy) shares it, a writer (append, truncate) and remove hold it alone. remove
// unpublishes the sequence first, then waits for its lock, so a thread that found it just before sees
// `removed` once it holds the lock and gets the same error as for an unknown id.
struct Sequence {
    std::vector<LayerState> layers;
    mutable std::shared_mutex mu;
    bool removed = false;  // under mu
    // Its bookkeeping's bytes, counted against the pool (BlockPool::charge_bookkeeping): its state and
    // 24 bytes per block table entry (under mu, held alone).
    size_t charged = 0;
};

// A sequence held for one call, with its lock (shared or alone).
template <class Lock>
struct Held {
    std::shared_ptr<Sequence> seq;
    Lock lock;
    Sequence* operator->() const { return seq.get(); }
};
using ReadHeld = Held<std::shared_lock<std::shared_mutex>>;
using WriteHeld = Held<std::unique_lock<std::shared_mutex>>;

}  // namespace kvq::detail

namespace kvq::detail::file {
struct Header;
class InFile;
}  // namespace kvq::detail::file

namespace kvq::detail {

// The configuration with center_keys (deprecated) as "+center" on every key spec: the default's and each
// layer's own (the flag itself as given).
CacheConfig centered_key_specs(CacheConfig c);

// What layers of one pair of codecs share: the key format and value codec, their input rules and the
// block layout (one size class of the pool). Layers without codecs of their own are of kind 0 with the
// default codecs.
struct LayerKind {
    Codec key;  // keys->codec(): the codec of the key rows
    Codec value;
    bool store_nonfinite_k = false;  // plain codecs keep NaN/Inf as they are (NanPolicy::propagate)
    bool store_nonfinite_v = false;
    // The rows each codec stores with finite fields; a row beyond counts as non-finite (NanPolicy).
    InputLimit key_limit, value_limit;
    BlockLayout layout;        // its pool blocks (lib/codec/block_layout.hpp: pool_block_layout)
    size_t staging_units = 0;  // the blocks' worth of pool capacity one layer's staging takes
    // The keys and values of a sealed block (lib/codec/key_format.hpp, value_format.hpp): bytes, sealing,
    // reading, scoring and accumulating.
    std::shared_ptr<const KeyFormat> keys;
    std::shared_ptr<const ValueFormat> values;
    KeyHead key_head(uint8_t* block, int h) const { return layout.key_head(block, h, key.row_bytes()); }
    ConstKeyHead key_head(const uint8_t* block, int h) const { return layout.key_head(block, h, key.row_bytes()); }
    ValueHead value_head(uint8_t* block, int h) const { return layout.value_head(block, h, value.row_bytes()); }
    ConstValueHead value_head(const uint8_t* block, int h) const { return layout.value_head(block, h, value.row_bytes()); }
};

// Everything a KVCache holds (kvq/cache.hpp keeps only a pointer to it).
struct CacheImpl {
    // Checks every rule of the configuration (validate_config's); allocate = false skips the blocks
    // allocated up front (initial_blocks), for validate_config.
    explicit CacheImpl(const CacheConfig& config, bool allocate = true);

    // As given, with n_heads, head_dim_v and scale resolved, center_keys folded into the key specs as
    // "+center" and then reporting whether every layer's keys are centered.
    CacheConfig cfg;
    std::shared_ptr<const KeyFormat> key_format;  // the default key format (cfg.key_codec)
    Codec key;    // the default codecs (cfg.key_codec's rows, cfg.value_codec)
    Codec value;
    Codec exact;  // f32 or f16 (CacheConfig::staging): the open block's rows (keys: head_dim values)
    Codec exact_v;  // the same of head_dim_v values (the staging's values)
    std::shared_ptr<const KeyFormat> exact_keys;  // exact's rows as a key format (the staging's keys)
    std::shared_ptr<const ValueFormat> exact_values;  // and as a value format (the staging's values)
    // Kinds in the order of the first layer of each; the pool's size class c is kind c.
    std::vector<LayerKind> kinds;
    std::vector<size_t> kind_of;  // by layer
    const LayerKind& kind(int layer) const { return kinds[kind_of[layer]]; }
    size_t block_bytes(int layer) const { return pool->block_bytes(kind_of[layer]); }
    detail::BlockLayout staging_layout;  // one slot of the float staging of one layer (staging_block_layout)
    size_t staging_blocks = 1;           // slots of a layer's staging (the ring, see the top)
    size_t staging_block_bytes = 0;      // one slot, keys and values
    size_t staging_layer_bytes = 0;      // per layer: staging_blocks slots (reserved against the pool at once)
    // The ring slots a layer of n tokens has written (slot s holds positions s·bt.. the first time round):
    // a layer's staging holds at least these and grows as its tokens come (an exact tail of 2^20 tokens
    // would otherwise take its whole ring, gigabytes, on the first token).
    size_t staging_slots_for(size_t n_tokens) const {
        return std::min(staging_blocks, std::max<size_t>(1, (n_tokens + bt() - 1) / bt()));
    }
    std::unique_ptr<detail::BlockPool> pool;
    // Runs the parts of one call: the engine's executor, or kvq's shared pool on up to cfg.threads
    // threads; empty for one thread.
    detail::ParallelRun runner;
    const detail::ParallelRun* run() const { return runner ? &runner : nullptr; }

    // Guards seqs and next_id (not the sequences' contents). Never held while waiting for a sequence's
    // lock; a call that holds several sequences' locks takes them in increasing id order (no cycle).
    mutable std::mutex seq_mu;
    std::map<SequenceId, std::shared_ptr<detail::Sequence>> seqs;
    SequenceId next_id = 0;
    std::atomic<size_t> staging_bytes{0};
    std::atomic<size_t> metadata_bytes{0};  // the sequences' Sequence::charged

    // Per call buffers of attend_batch and the decode kernel, leased per call (re-entrant executors) and
    // freed with the cache.
    struct BatchScratch {
        std::vector<ReadHeld> held;  // in increasing id order
        std::vector<size_t> order;   // entries by id
        std::vector<const detail::LayerState*> layers;
        std::vector<detail::RowSource> sources;
        std::vector<uint8_t*> staging;
        std::vector<detail::AttendTask> tasks;
        std::vector<std::pair<size_t, size_t>> ranges;
    };
    mutable detail::ScratchPool<BatchScratch> batch_scratch;
    mutable detail::ScratchPool<detail::DecodeScratch> decode_scratch;

    // Key channel scales (CacheConfig::key_scales): per layer whether it has any but 1 (empty: no scales),
    // and the reciprocals (as key_scales) the queries are multiplied by; query_scratch holds a call's q ⊘ s.
    std::vector<char> scaled_layer;
    std::vector<float> key_scale_inv;
    mutable detail::ScratchPool<std::vector<float>> query_scratch;
    bool scales_keys(int layer) const { return !scaled_layer.empty() && scaled_layer[layer]; }
    // k ⊙ s of n tokens (n × n_kv_heads × head_dim) into buf; k itself for a layer without scales.
    const float* scale_keys(int layer, const float* k, size_t n, std::vector<float>& buf) const;
    // q ⊘ s of n query sets (n × n_heads × head_dim; query head i reads kv head i / g()) into buf; q itself
    // for a layer without scales.
    const float* scale_queries(const char* what, int layer, const float* q, size_t n, std::vector<float>& buf) const;

    bool centered(int layer) const;  // whether a layer's key format centers its keys ("+center")
    int g() const { return cfg.n_heads / cfg.n_kv_heads; }
    int dv() const { return cfg.head_dim_v; }  // the values' head size (validated: never 0)
    bool latent() const { return cfg.latent_values; }
    // Bytes from one staged value row to the next (a latent's: its key rows').
    size_t staged_value_stride() const { return staging_layout.values.row_stride ? staging_layout.values.row_stride : exact_v.row_bytes(); }
    size_t bt() const { return static_cast<size_t>(cfg.block_tokens); }
    size_t sequence_metadata_bytes() const;  // the bookkeeping of one sequence (bytes_used counts it)
    // What a sequence's block tables cost per block they reference (a fork copies its parent's tables).
    static constexpr size_t kTableEntryBytes = sizeof(BlockRef) + sizeof(uint8_t*);
    // Gives back the charge of table entries a sequence no longer holds (under its lock, held alone).
    void uncharge_entries(detail::Sequence& seq, size_t entries);
    // Publishes complete sequences under fresh ids (their bytes already charged); never throws but bad_alloc,
    // and then publishes none.
    std::vector<SequenceId> publish(std::vector<std::shared_ptr<detail::Sequence>>& fresh);
    size_t window(int layer) const {
        return cfg.sliding_window.empty() ? 0 : static_cast<size_t>(cfg.sliding_window[layer]);
    }

    // Argument checks shared by the entry points; `what` names the entry point in messages.
    void check_layer(const char* what, int layer) const;
    // A sequence by id, held for one call (std::invalid_argument naming `what` if there is none, or it was
    // removed while this call waited for its lock).
    ReadHeld read(const char* what, SequenceId seq) const;
    WriteHeld write(const char* what, SequenceId seq) const;
    std::shared_ptr<detail::Sequence> find(const char* what, SequenceId seq) const;

    // Operations (cache_append.cpp, cache_sequences.cpp, cache_attend.cpp).
    void append(int layer, SequenceId seq, const float* k, const float* v, size_t n);
    void truncate(SequenceId seq, size_t n);
    SequenceId fork(SequenceId parent);
    void remove(SequenceId seq);
    void attend(int layer, SequenceId seq, const float* q, float* out) const;
    void attend_prefill(int layer, SequenceId seq, const float* q, size_t n_queries, float* out) const;
    void attend_batch(int layer, std::span<const SequenceId> seqs, const float* q, float* out) const;

    // Save and load (cache_save.cpp, cache_load.cpp). save: every sequence, or only *only.
    void save(const std::string& path, const SequenceId* only) const;
    // Adds the sequences of an opened file whose header has been read; changes nothing if it throws.
    std::vector<SequenceId> load(const detail::file::InFile& f, const detail::file::Header& h);
    size_t staging_payload_bytes() const;  // a staging payload in a file: the staging's ring, padded
    // The staging slot of position pos (its ring slot), and the row of kv head h's keys (or values) at
    // pos; staged_rows: positions pos..pos+n of one block (within one slot) as floats.
    const uint8_t* staging_slot(const detail::LayerState& st, size_t pos) const;
    void staged_rows(const detail::LayerState& st, bool keys, int h, size_t pos, size_t n, float* out) const;
    const uint8_t* staged_row(const detail::LayerState& st, bool keys, int h, size_t pos) const;
    uint8_t* staged_row(detail::LayerState& st, bool keys, int h, size_t pos) const {
        return const_cast<uint8_t*>(staged_row(static_cast<const detail::LayerState&>(st), keys, h, pos));
    }

    // Helpers of the operations.
    // Every kv head's key rows of a block from the pool's layout to the file's ggml rows (to_file) or back,
    // in place (KeyFormat::convert_rows; only q8_0 keys in groups of 16 differ).
    void convert_keys(const LayerKind& kind, uint8_t* block, bool to_file) const;
    // Quantizes the staged block that starts at position pos into a pool block.
    void seal(const LayerKind& kind, const detail::LayerState& st, size_t pos, uint8_t* block) const;
    void write_rows(const LayerKind& kind, detail::LayerState& st, size_t block_index, size_t row, const float* k, const float* v,
                    size_t n) const;
    // Attention of one query vector set (n_heads × head_dim) over positions [lo, hi) of a layer.
    void attend_range(const LayerKind& kind, const detail::LayerState& st, size_t lo, size_t hi, const float* q, float* out,
                      int threads) const;
    // The row sources of positions [lo, hi) of a layer (pool blocks, then the float staging); returns
    // how many of sources[0..2) it filled. The staging source's block table is staging_slots[0 ..
    // staging_blocks) (the ring's slots in position order), which must outlive the sources.
    size_t row_sources(const LayerKind& kind, const detail::LayerState& st, size_t lo, size_t hi, detail::RowSource* sources,
                       uint8_t** staging_slots) const;
    // After the engine: heads whose float scores overflowed again in double precision, and NaN into the
    // output heads that read a poisoned row of [lo, hi) (NanPolicy::propagate).
    void finish_output(const LayerKind& kind, const detail::LayerState& st, size_t lo, size_t hi, const float* q, float* out) const;
    // The same for kv head h's query heads, in double precision from the dequantized rows (positions
    // [lo, hi), lo >= first_pos): the fallback when float scores overflow.
    void attend_head_exact(const LayerKind& kind, const detail::LayerState& st, size_t lo, size_t hi, const float* q, float* out,
                           int h) const;
    std::string dump() const;
};

}  // namespace kvq::detail
