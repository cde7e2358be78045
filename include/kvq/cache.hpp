// kvq — the block-wise (paged) KV cache and decode attention on quantized rows.
//
// Memory is a pool of blocks of `block_tokens` tokens; a block holds the key rows and the value rows of
// every kv head of one layer for those tokens, in the key and value codecs' byte layouts. Each sequence
// has a block table per layer. Sequences can be forked (blocks shared by reference count; the partly
// filled last block is copied on write), truncated and removed (blocks return to the pool).
//
//   kvq::CacheConfig cfg;
//   cfg.n_layers = 32; cfg.n_kv_heads = 8; cfg.n_heads = 32; cfg.head_dim = 128;   // Llama 3 8B
//   cfg.key_codec = "q8_0"; cfg.value_codec = "q4_0";
//   kvq::KVCache cache(cfg);
//   auto seq = cache.add_sequence();
//   cache.append(layer, seq, k, v, n_tokens);     // k, v: n_tokens × n_kv_heads × head_dim floats
//   cache.attend(layer, seq, q, out);             // q, out: n_heads × head_dim floats
//
// Attention is one fused pass per kv head: the g = n_heads / n_kv_heads query heads that share it are
// scored together, an online softmax keeps a running max and sum, and values are accumulated straight
// from their codes, so every byte of the cache is read once per step. Long contexts are split across
// `threads` by block ranges and merged (flash-decoding).
//
// What an engine hands the cache (its model's attention, and what the cache leaves to it):
// - Keys are stored after RoPE: append the keys exactly as the model's attention would multiply them with
//   the queries (rotated by their own positions), and attend with queries already rotated. The cache applies
//   no positional encoding and never re-rotates a stored key (as ggml's and vLLM's caches store them).
// - Positions are implicit: a sequence's tokens in a layer are numbered 0, 1, ... in append order, and
//   truncate(seq, n) drops the tail. Causal order, the sliding window (counted in these positions) and
//   attend_prefill's "query i is the i-th of the last n_queries tokens" all follow from it; a token cannot
//   be inserted or replaced in the middle (truncate and append again).
// - Batched prefill: append a prompt's n tokens in one call, then attend_prefill(layer, seq, q, n, out)
//   gives causal attention for all n queries; several sequences are several calls (decode steps of many
//   sequences: attend_batch). Padding is the engine's: append only real tokens.
// - Scaling and soft-capping: CacheConfig::scale (0 = 1/sqrt(head_dim); Gemma's query_pre_attn_scalar^-0.5)
//   and CacheConfig::softcap (Gemma 2's attn_logit_softcapping: s -> c·tanh(s/c)) apply to every layer,
//   in attend, attend_prefill and attend_batch. attend_rows (kvq/attention.hpp) over an engine's own rows
//   takes the scale only; an engine that needs soft-capping there uses the cache.
// - Masks other than causal + sliding window (bidirectional, packed sequences, ALiBi or other biases) are
//   not expressible: the engine keeps such models off the cache.
//
// Errors: every entry point checks its arguments and throws std::invalid_argument (bad shape, layer,
// sequence id, non-finite input under NanPolicy::reject) or kvq::PoolExhausted (no free block); the cache
// is unchanged when anything throws.
//
// Save and load: save() writes all sequences (or one) to a file, atomically (a temporary file renamed into
// place); load() makes a new cache from a file, load_into() adds a file's sequences to a live cache of the
// same configuration. Loading validates the whole file (header, CRC32C of every section and block, block
// tables) before it changes anything; format in docs/file-format.md.
//
// Thread safety: every entry point may be called from any thread at any time, with any id. Each sequence
// has a reader/writer lock that the cache takes itself: attends, saves, n_tokens and forks of a sequence
// share it, appends and truncates of it wait for one another and for its readers. A sequence appears in
// sequences() only once it is complete (add_sequence, fork, load_into); remove takes it out of reach
// first, then waits for the calls that hold it, and calls that found it just before then get
// std::invalid_argument as for an unknown id. So different sequences run fully in parallel, and a
// sequence removed under another thread's call is an error for that call, never a crash.
#ifndef KVQ_CACHE_HPP  // a guard, not #pragma once: see tests/CMakeLists.txt (precompiled header)
#define KVQ_CACHE_HPP

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvq/attention.hpp"  // Executor
#include "kvq/codec.hpp"

namespace kvq::detail {
struct CacheImpl;  // lib/cache/cache_impl.hpp
}

namespace kvq {

using SequenceId = int64_t;

// When rows are quantized.
enum class SealPolicy {
    on_append,      // every token is quantized as it is appended
    on_block_full,  // the open block stays in full precision until it fills, then it is quantized in one go
};

// How the open block's rows are held under SealPolicy::on_block_full until it is sealed.
enum class StagingType {
    f32,  // float32: the recent tokens exactly as given
    f16,  // IEEE binary16: half the memory; rows rounded to nearest even, |x| at most 65504 (larger is
          // beyond the cache's input range, as a too-large value is for a codec)
};

// 16-bit floats an engine may hold keys and values in (KVCache::append's overload): IEEE binary16 (ggml's
// F16) and bfloat16 (ggml's BF16).
enum class HalfType {
    f16,
    bf16,
};


// One layer's own codecs (CacheConfig::layer_codecs); an empty name means the cache's default codec.
struct LayerCodecs {
    std::string key;
    std::string value;
};

// Bounds of a configuration (checked by KVCache's constructor, so every cache can be saved and loaded):
// n_layers, n_kv_heads, n_heads and head_dim at most kMaxCacheDim, block_tokens 1..kMaxBlockTokens,
// threads 1..256, initial_blocks and grow_blocks at most kMaxPoolBlocks (a pool numbers its blocks with 32
// bits); a sequence holds at most kMaxSequenceTokens tokens per layer.
inline constexpr int kMaxCacheDim = 1 << 16;
inline constexpr int kMaxBlockTokens = 4096;
inline constexpr size_t kMaxPoolBlocks = 0xffffffffu;
inline constexpr size_t kMaxSequenceTokens = size_t(1) << 48;
// The longest exact tail (CacheConfig::exact_tail_tokens).
inline constexpr int kMaxExactTailTokens = 1 << 20;

struct CacheConfig {
    int n_layers = 1;
    int n_kv_heads = 1;
    int n_heads = 0;      // query heads; 0 means n_kv_heads. Must be a multiple of n_kv_heads (GQA)
    int head_dim = 128;   // of keys and queries
    // Of values and attention results; 0 means head_dim. DeepSeek's latent attention (MLA) attends with
    // 576-value keys and 512-value values.
    int head_dim_v = 0;
    // MLA's latent cache: per token and kv head one stored row of head_dim values (the latent and its
    // rotary part) serves as the key, and its first head_dim_v values, read in place, as the value; no
    // value bytes are stored, and append takes v = null. Needs a key codec whose leading head_dim_v values
    // are rows of their own: f32, f16, bf16 or a block codec with ggml's layout (q8_0, q4_0, q4_1, q5_0,
    // q5_1, iq4_nl; not rotated, and not iq4_nls, whose rows are iq4_nl's by another encoder), head_dim_v a multiple of its block and at most head_dim, value_codec
    // (and each layer's) empty or the key codec's, and no +center (center_keys), key_scales, chanB or +sinkN keys.
    bool latent_values = false;
    // A codec spec of the codec table (kvq/codec.hpp), or, for keys only, "chan2" .. "chan8": per-channel
    // keys (KIVI-style), per block and kv head an fp16 minimum and step per channel and a B-bit code per
    // value, scored as q·min + (q ⊙ step)·codes. They need seal = on_block_full (a block's ranges are known
    // when it is full; the open block stays in float) and take no +center; head_dim a multiple of 8.
    // Then, each at most once and in this order (the other order is read too): "+center", each sealed
    // block's keys minus their per-channel mean, the mean kept in fp16 beside the block and q·mean added to
    // the score (removes a key bias shared by the block's tokens; needs seal = on_block_full; 2·head_dim
    // bytes per kv head and block); "+sinkN" (N = 1..16): a sequence's first N keys kept in fp16 and scored
    // exactly (attention sinks), the rest as the codec stores them; it needs seal = on_block_full, and every
    // block keeps room for them (4 + 2·N·head_dim bytes per kv head), though only a sequence's first uses
    // it. So "q4_0+rot+center+sink1"; key_spec() reports it so.
    std::string key_codec = "q8_0";
    std::string value_codec = "q4_0";
    // Per layer: empty (every layer uses key_codec and value_codec), or one entry per layer giving that
    // layer its own codecs, e.g. q8_0 keys on Gemma 3's global layers and 4-bit keys on its windowed ones.
    // Layers of different codecs have blocks of different sizes; the pool keeps one size class for each
    // pair of codecs (at most 65535 distinct pairs), all within max_blocks and max_bytes. A layer's own key
    // codec's "+center" centers that layer's keys alone; center_keys and the seed apply to every layer.
    std::vector<LayerCodecs> layer_codecs;
    int block_tokens = 32;
    // Pool capacity in blocks (all layers together, a block of any size counting one); 0 = no limit. The
    // float staging of open blocks (SealPolicy::on_block_full: one per sequence and layer that has begun
    // one) counts against it in units of its layer's block size, so with one block size blocks and staging
    // together never hold more than max_blocks blocks' bytes. The bookkeeping (below) is not counted in
    // blocks; with max_blocks alone it is held within another max_blocks blocks' worth of bytes (of the
    // largest block size).
    size_t max_blocks = 0;
    // Capacity in bytes of everything the cache holds that grows with use: allocated blocks (free ones
    // included), the float staging of open blocks, and the bookkeeping: each sequence's state
    // (sequence_bookkeeping_bytes) and its block tables (24 bytes per entry, so a fork of a long sequence
    // costs bytes though it shares every block). add_sequence, fork, append, load_into that would pass it
    // throw PoolExhausted and change nothing. Not counted: the configuration's own fixed size, and per-call buffers (bounded by
    // the shape and threads, and by the arguments of attend_batch; kept by the cache for its next calls
    // and freed with it). 0 = no limit. The limit to set when layers have codecs of different sizes
    // (layer_codecs). Both limits hold when set.
    size_t max_bytes = 0;
    size_t initial_blocks = 0;  // blocks allocated up front
    size_t grow_blocks = 64;    // blocks added when the pool grows
    float scale = 0.0f;         // softmax scale; 0 means 1/sqrt(head_dim)
    float softcap = 0.0f;       // logit soft-cap c: s -> c·tanh(s/c); 0 = off (Gemma 2 uses 50)
    // Per layer, in tokens; empty, or 0 for a layer, = full attention. A block returns to the pool at an
    // append once it lies more than one block before the window of that append's first token (the slack
    // lets truncate go back block_tokens tokens), so attend_prefill after appending a whole prompt sees
    // everything its queries need, and the next append releases the rest.
    std::vector<int> sliding_window;
    SealPolicy seal = SealPolicy::on_block_full;
    StagingType staging = StagingType::f32;  // the open block's rows (saved in cache files)
    // The exact tail: the most recent T tokens of each sequence and layer stay in the staging precision
    // (f32 or f16) beyond the open block; a block is sealed (quantized) only once all its tokens are more
    // than T tokens old, so at least the last T tokens are read exactly (KIVI's and transformers'
    // QuantizedCache's residual of recent tokens). 0 = only the open block (up to block_tokens − 1 tokens),
    // as before. Needs seal = on_block_full when > 0; at most kMaxExactTailTokens. A layer's staging holds
    // staging_blocks(T) = ceil((T + block_tokens − 1) / block_tokens) blocks' rows (1 for T = 0), counted
    // against max_blocks and max_bytes and in bytes_used. After a truncate into sealed rows, those rows stay
    // as quantized as they were (their exact values are gone); the tokens appended after it are exact again.
    // Saved in cache files (format version 4; older files load as 0).
    int exact_tail_tokens = 0;
    // Static key channel scales s (docs/eval.md, "+qk"): empty (none), or n_layers × n_kv_heads × head_dim
    // floats (index (layer·n_kv_heads + kv head)·head_dim + channel), each positive and finite with a finite
    // reciprocal; a layer of all ones is stored as given. The cache stores k ⊙ s and attends with q ⊘ s (s of
    // the query head's kv head), so scores are unchanged while the keys' rounding error moves to the
    // channels where s is small. append applies them (input checks and codec ranges see k ⊙ s; a per-call
    // copy), attend/attend_prefill/attend_batch divide the queries (a buffer the cache keeps, not counted);
    // values are untouched. Cache files store them (format version 5) and their blocks and staged rows
    // hold k ⊙ s. center_keys and chanB keys work on k ⊙ s.
    std::vector<float> key_scales;
    // Deprecated: "+center" on every key codec (key_codec and each layer's own); giving both is the same.
    // config() reports the key codecs with "+center", and center_keys as whether every one has it.
    bool center_keys = false;
    NanPolicy nan_policy = NanPolicy::reject;  // NaN/Inf in keys, values, queries (see kvq/codec.hpp)
    // Attention multiplies q4_0 values (also q4_0+rot) by int8 weights: each softmax weight times block
    // scale is rounded to an int8 step per query, 32 columns and group of 16 rows of a block (counted
    // from the block's first row attended; the step: that group's largest / 127), as ggml's non-flash
    // attention rounds the softmax to q8_0. A relative rounding of at most 1/254 of a group's largest
    // weight; other value codecs ignore it. Faster where the level has the integer kernel (avx2, avx512);
    // elsewhere it rounds the same weights and runs the float kernel, which is slower (docs/PERFORMANCE.md,
    // "q4_0 values on int8 weights"). Not saved in cache files (LoadOptions sets it for a load).
    bool int8_value_weights = false;
    int threads = 1;            // threads for one attend call: it is split into parts for this many
    // Runs those parts; empty: kvq's own pool (hardware threads − 1 workers, shared by every cache of the
    // process), on at most `threads` threads per call. Not saved in cache files.
    Executor executor;
    uint64_t seed = kDefaultSeed;  // rotation seed for +rot, polar and turbo codecs
};

// The configuration a KVCache made from c would have (n_heads 0 and scale 0 replaced by their defaults),
// or the error its constructor would throw: BadParams, BadHeadDim or UnknownCodec (kvq/errors.hpp). Every
// interface (C, Python) checks a configuration with this function only, so the rules are the same everywhere.
CacheConfig validate_config(CacheConfig c);

// What KVCache::load takes from the caller rather than from the file: the pool's limits and how attend
// runs (files store none of them). Every other field of the loaded cache's config comes from the file.
struct LoadOptions {
    size_t max_blocks = 0;   // pool capacity in blocks; 0 = no limit. A file with more blocks: PoolExhausted
    size_t max_bytes = 0;    // pool capacity in bytes (CacheConfig::max_bytes); 0 = no limit
    size_t grow_blocks = 64; // blocks added when the pool grows after the load (the load takes exactly its own);
                             // 1..kMaxPoolBlocks
    int threads = 1;         // as CacheConfig::threads
    bool int8_value_weights = false;  // as CacheConfig::int8_value_weights
    Executor executor;       // as CacheConfig::executor
};

struct PoolStats {
    size_t block_bytes = 0;      // bytes of one block (of layer 0's codecs when layers differ)
    size_t blocks_total = 0;     // allocated
    size_t blocks_used = 0;      // referenced by at least one sequence
    size_t blocks_shared = 0;    // referenced by more than one sequence
    size_t max_blocks = 0;       // capacity (0 = unlimited)
    size_t blocks_reserved = 0;  // blocks' worth of memory the open blocks' float staging holds (counted
                                 // against max_blocks: blocks_total + blocks_reserved <= max_blocks)
    size_t bytes_total = 0;      // bytes of the allocated blocks (of every size class)
    size_t bytes_used = 0;       // bytes of the blocks in use
    size_t bytes_reserved = 0;   // bytes of the open blocks' float staging
    size_t max_bytes = 0;        // capacity in bytes (0 = unlimited): bytes_total + bytes_reserved +
                                 // KVCache::metadata_bytes() <= max_bytes
};

class KVCache {
public:
    explicit KVCache(const CacheConfig& config);
    ~KVCache();
    KVCache(const KVCache&) = delete;
    KVCache& operator=(const KVCache&) = delete;
    KVCache(KVCache&&) noexcept;
    KVCache& operator=(KVCache&&) noexcept;

    const CacheConfig& config() const;
    // The default codecs (CacheConfig::key_codec and value_codec), and those of one layer.
    const Codec& key_codec() const;
    const Codec& value_codec() const;
    const Codec& key_codec(int layer) const;
    const Codec& value_codec(int layer) const;
    // The key codec as a configuration spells it: key_codec()'s name with the key format's suffixes
    // ("q8_0+sink2": the rows are q8_0, the first two keys of a sequence are kept in fp16 beside them).
    std::string key_spec() const;
    std::string key_spec(int layer) const;

    SequenceId add_sequence();
    void remove(SequenceId seq);
    // A new sequence with the same tokens as parent; full blocks are shared, the open block is copied.
    SequenceId fork(SequenceId parent);
    // Keeps the first n_tokens tokens of every layer (n_tokens <= the sequence's length). A sealed block cut
    // into takes the next appends: codecs of rows quantize them into it as they arrive; keys with
    // parameters fitted to the whole block (chanB minimums and steps, center_keys means) are not given the
    // old block's parameters: the next append moves the block's rows back to the float staging (as they
    // read) and the block seals anew over them and the new rows (that append may then need staging from
    // the pool: PoolExhausted, with nothing changed, where a limit leaves no room).
    void truncate(SequenceId seq, size_t n_tokens);

    // k: n_tokens × n_kv_heads × head_dim floats, v: n_tokens × n_kv_heads × head_dim_v (C order; null with
    // latent_values, whose values are the keys' leading values). n_tokens whose buffers could not exist
    // (their byte size overflows) or that would take the sequence past kMaxSequenceTokens throw
    // std::invalid_argument before anything is read.
    void append(int layer, SequenceId seq, const float* k, const float* v, size_t n_tokens);
    // The same rows held as 16-bit floats (f16 or bf16 bit patterns, n_tokens × n_kv_heads × head_dim each):
    // converted to float32, which is exact, into a buffer of the call's size, then stored as the float
    // overload stores them (same bytes, same errors; f16 Inf/NaN are refused or kept as nan_policy says).
    void append(int layer, SequenceId seq, const uint16_t* k, const uint16_t* v, size_t n_tokens, HalfType type);

    // Decode attention over every token of the sequence in this layer (its window, if it has one).
    // q: n_heads × head_dim floats, out: n_heads × head_dim_v. Finite queries over finite keys and values give a finite output:
    // a head whose scores overflow float (a query of 1e38, say) is recomputed in double precision.
    void attend(int layer, SequenceId seq, const float* q, float* out) const;
    // Causal attention for the last n_queries tokens of the sequence (prefill): query i sees the tokens
    // up to and including its own position (within the layer's window). With a window, the queries may
    // reach back to the first token of the latest append. q: n_queries × n_heads × head_dim floats, out:
    // n_queries × n_heads × head_dim_v.
    void attend_prefill(int layer, SequenceId seq, const float* q, size_t n_queries, float* out) const;
    // Decode attention of many sequences of one layer in one call: q: seqs.size() × n_heads × head_dim
    // floats (sequence i's query vectors at i·n_heads·head_dim), out: seqs.size() × n_heads × head_dim_v. The work is split across
    // sequences, block ranges and kv heads; each result is bit-identical to attend() of that sequence.
    // A sequence may appear once.
    void attend_batch(int layer, std::span<const SequenceId> seqs, const float* q, float* out) const;

    size_t n_tokens(SequenceId seq, int layer = 0) const;
    std::vector<SequenceId> sequences() const;
    bool contains(SequenceId seq) const;

    // Writes every sequence (or one) with its block tables, shared blocks once, the open block's float rows
    // and the configuration to `path`: into `path.tmp.<pid>.<n>`, fsynced, renamed over `path`, directory
    // fsynced. Throws FileIOError (the temporary file removed, an old file at `path` untouched) or
    // std::invalid_argument (no such sequence, or a path holding a NUL byte). Reads the sequences as
    // attend does: no writer of them may run at the same time.
    void save(const std::string& path) const;
    void save(const std::string& path, SequenceId seq) const;
    // A new cache with the file's configuration (its codecs, shapes, seed, seal policy, windows,
    // nan_policy) holding the file's sequences, numbered 0, 1, … in the file's order. Pool limits and
    // threads are not stored in files: the cache has an unlimited pool and one thread, or what `options`
    // give. The pool grows by exactly the blocks the file holds (a file's payloads are in it, so nothing
    // is allocated beyond the file's length); a file with more blocks than options.max_blocks throws
    // PoolExhausted. Paths holding a NUL byte throw std::invalid_argument; anything but a regular file
    // (a FIFO, a directory, a device) throws FileIOError without being read.
    static KVCache load(const std::string& path);
    static KVCache load(const std::string& path, const LoadOptions& options);
    // Adds the file's sequences to this cache and returns their new ids, in the file's order. Throws
    // FileIOError, BadCacheFile, ConfigMismatch (codecs, seed, shapes, block_tokens, seal, centering,
    // scale, softcap, windows or key_scales differ) or PoolExhausted, and then has changed nothing: the whole file is
    // checked before any block is taken from the pool.
    std::vector<SequenceId> load_into(const std::string& path);

    // Bytes of the blocks in use (shared blocks counted once), the float staging of open blocks, and the
    // per-sequence bookkeeping (metadata_bytes()).
    size_t bytes_used() const;
    // The per-sequence bookkeeping alone: for each sequence, its per-layer state (about 130 bytes per
    // layer), so a cache of many layers costs memory per sequence before any token is appended, and its
    // block tables (24 bytes per entry). It counts against max_bytes (CacheConfig).
    size_t metadata_bytes() const;
    // The bookkeeping add_sequence adds to bytes_used() in a cache of n_layers layers.
    static size_t sequence_bookkeeping_bytes(int n_layers);
    double bytes_per_token() const;    // key + value bytes per token, all layers and kv heads, as stored
    double bytes_per_token(int layer) const;  // the same for one layer
    // bytes_per_token and bytes_per_token(layer) are the sealed format's bytes (codes, scales, key means,
    // per-channel parameters); the exact tail is not in them. This is one layer's bytes per token averaged
    // over a sequence holding n_tokens tokens there: min(n_tokens, exact_tail_tokens) tokens at the staging
    // precision (keys and values of every kv head, 4 or 2 bytes a value), the rest sealed. Like
    // bytes_per_token it leaves out the open block's rows beyond the tail (a working buffer of at most
    // block_tokens − 1 tokens); with exact_tail_tokens = 0 it is bytes_per_token(layer). n_tokens = 0: the
    // bytes of a sealed token.
    double average_bytes_per_token(int layer, size_t n_tokens) const;
    PoolStats pool_stats() const;
    std::string dump() const;          // block tables, for debugging

private:
    std::unique_ptr<detail::CacheImpl> impl_;
};

}  // namespace kvq

#endif  // KVQ_CACHE_HPP
