// The cache file format (docs/file-format.md): its constants, the header and block tables as structs,
// their little-endian encoding with CRC32C (cache_file.cpp), and the two kinds of file access save and
// load need (an atomically replaced output file, an input file read at offsets: cache_file_io.cpp). The
// cache's own logic (which blocks, which sequences, validation against a cache) lives in cache_save.cpp,
// cache_load.cpp and cache_load_checks.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kvq/cache.hpp"

namespace kvq::detail::file {

inline constexpr char kMagic[8] = {'K', 'V', 'Q', 'C', 'A', 'C', 'H', 'E'};
// 2 added the staging type, 3 per-layer codecs (blocks of several sizes), 4 the exact tail (written only
// by a cache with one: others write version 3, which older kvq reads), 5 the key channel scales (written
// only by a cache with them), 6 the values' head size and latent values, and staging payloads that may
// hold only the first slots of the ring, those the sequences' tokens reached (written only by a cache
// whose values differ from its keys, or whose held slots are fewer than the ring's: a long exact tail's
// ring is gigabytes); versions 1 to 3 load with no tail, 1 to 4 with no key scales, 1 to 5 with values of
// the keys' head size and whole rings.
inline constexpr uint32_t kFormatVersion = 6;
inline constexpr uint32_t kExactTailFormatVersion = 4;
inline constexpr uint32_t kKeyScalesFormatVersion = 5;
inline constexpr uint32_t kHeldStagingFormatVersion = 6;
inline constexpr uint32_t kValueHeadFormatVersion = 6;
inline constexpr uint32_t kOldestFormatVersion = 1;
inline constexpr size_t kPrefixBytes = 16;           // magic, version, header size: read before the rest
inline constexpr uint64_t kPayloadAlignment = 4096;  // the payload section starts on a page (mmap)
inline constexpr uint64_t kPayloadStride = 64;       // each payload starts on a cache line
inline constexpr uint32_t kNoStaging = 0xFFFFFFFFu;
// Reader limits: far beyond any model, they keep a corrupt (or hostile) file from making the reader
// allocate or loop without bound before a CRC or a size check has caught it.
inline constexpr uint32_t kMaxHeaderBytes = 1u << 26;  // key scales: 4 bytes per layer, kv head and channel
inline constexpr int kMaxDim = kMaxCacheDim;  // n_layers, n_kv_heads, n_heads, head_dim (as CacheConfig)
inline constexpr uint32_t kMaxSpecBytes = 1024;
inline constexpr uint64_t kMaxTokens = kMaxSequenceTokens;

// The blocks of one kind of layer (one pair of codecs): stored one after another, kind by kind.
struct KindRecord {
    uint64_t n_blocks = 0;
    uint64_t block_bytes = 0;  // stride and size of a block payload of this kind (its pool block size)
    uint64_t key_row_bytes = 0;
    uint64_t value_row_bytes = 0;
};

// Everything the header holds. `config` carries only what a file stores (see DESIGN): shapes, codecs,
// seed, block_tokens, seal, centering, nan_policy, scale, softcap, windows; pool sizes and threads are
// left at their defaults.
struct Header {
    uint32_t version = kFormatVersion;
    uint32_t header_bytes = 0;
    uint64_t file_bytes = 0;
    uint64_t payload_offset = 0;
    uint64_t n_blocks = 0;       // of every kind
    uint64_t block_bytes = 0;    // of kind 0 (with one kind: the stride and size of every block payload)
    uint64_t n_staging = 0;
    uint64_t staging_bytes = 0;  // stride of a staging payload (float rows of one open block)
    uint64_t table_offset = 0;
    uint64_t table_bytes = 0;
    uint64_t n_sequences = 0;
    uint64_t key_row_bytes = 0;
    uint64_t value_row_bytes = 0;
    CacheConfig config;
    std::vector<KindRecord> kinds;  // at least one; version 1 and 2 files have one, from the fields above
};

// Where block payload i of a file is: its kind, its offset in the file and its size.
struct BlockPlace {
    size_t kind;
    uint64_t offset;
    uint64_t bytes;
};
BlockPlace block_place(const Header& h, uint64_t i);  // i < h.n_blocks
uint64_t kind_first_block(const Header& h, size_t kind);  // the file index of the kind's first block

// One layer of one sequence (see lib/cache/cache_impl.hpp for what the numbers mean).
struct LayerRecord {
    uint64_t n_tokens = 0;
    uint64_t first_pos = 0;
    uint32_t staged = 0;
    uint32_t staging = kNoStaging;  // index of its staging payload
    std::vector<uint32_t> blocks;   // indices of block payloads
    std::vector<std::pair<uint64_t, uint32_t>> poisoned;  // (position, kv head)
};

struct Tables {
    std::vector<uint32_t> crcs;  // CRC32C of each payload: the blocks, then the staging payloads
    std::vector<std::vector<LayerRecord>> sequences;  // [sequence][layer]
};

// Throws BadCacheFile("cache file: " + what).
[[noreturn]] void bad(const std::string& what);
uint64_t align_up(uint64_t n, uint64_t a);
// Header bytes for h (header_bytes, offsets and file_bytes as given), ending with their CRC32C.
std::vector<uint8_t> encode_header(const Header& h);
// Magic, version and header size from the first kPrefixBytes bytes; throws BadCacheFile.
Header decode_prefix(std::span<const uint8_t> prefix);
// The whole header (header_bytes bytes); checks its CRC, field ranges and the section layout.
Header decode_header(std::span<const uint8_t> bytes);
std::vector<uint8_t> encode_tables(const Tables& t);
// Checks the section's CRC and that every count fits in it; meaning is checked by the loader.
Tables decode_tables(std::span<const uint8_t> bytes, const Header& h);

// A file being written: `path.tmp.<pid>.<n>`, renamed over `path` by commit(). Destroyed without
// commit (an error on the way), it removes the temporary file. Errors throw FileIOError with errno's text.
class OutFile {
public:
    explicit OutFile(const std::string& path);
    ~OutFile();
    OutFile(const OutFile&) = delete;
    OutFile& operator=(const OutFile&) = delete;
    void write(const void* data, size_t n);
    void zeros(size_t n);
    uint64_t offset() const { return offset_; }
    void commit();  // fsync, close, rename over path, fsync the directory

private:
    [[noreturn]] void fail(const std::string& what, int err);
    std::string path_, tmp_;
    int fd_ = -1;
    uint64_t offset_ = 0;
};

// A file being read with pread. Reads beyond its end throw BadCacheFile (it is truncated); system
// errors throw FileIOError.
class InFile {
public:
    explicit InFile(const std::string& path);
    ~InFile();
    InFile(const InFile&) = delete;
    InFile& operator=(const InFile&) = delete;
    uint64_t size() const { return size_; }
    const std::string& path() const { return path_; }
    void read(uint64_t offset, size_t n, void* dst, const char* what) const;
    std::vector<uint8_t> read(uint64_t offset, size_t n, const char* what) const;

private:
    std::string path_;
    int fd_ = -1;
    uint64_t size_ = 0;
};

}  // namespace kvq::detail::file
