// What the save/load tests share (tests/test_cache_file*.cpp): a directory per test case, file bytes in
// and out, caches populated with forks, open blocks and odd lengths, and a snapshot of everything
// observable about a cache, to check that a failed load changed nothing.
#pragma once

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cache/crc32c.hpp"
#include "kvq/cache.hpp"
#include "test_util.hpp"

using kvq::CacheConfig;
using kvq::KVCache;
using kvq::SealPolicy;
using kvq::SequenceId;
namespace fs = std::filesystem;

namespace kvq::test::cache_file {

// Little-endian fields of a file's bytes.
inline uint64_t get_le(const std::vector<uint8_t>& b, size_t at, int bytes) {
    uint64_t x = 0;
    for (int i = 0; i < bytes; ++i) x |= uint64_t(b.at(at + i)) << (8 * i);
    return x;
}
inline void put_le(std::vector<uint8_t>& b, size_t at, uint64_t x, int bytes) {
    for (int i = 0; i < bytes; ++i) b.at(at + i) = static_cast<uint8_t>(x >> (8 * i));
}

// Every CRC32C of a file recomputed (payloads, tables, header), as a forger would after editing it
// (docs/file-format.md: the header's fields at 12, 24, ..., 72).
inline void recompute_crcs(std::vector<uint8_t>& b) {
    const uint64_t header = get_le(b, 12, 4), payloads = get_le(b, 24, 8), n_blocks = get_le(b, 32, 8),
                   block = get_le(b, 40, 8), n_staging = get_le(b, 48, 8), staging = get_le(b, 56, 8),
                   table = get_le(b, 64, 8), table_bytes = get_le(b, 72, 8);
    for (uint64_t i = 0; i < n_blocks + n_staging; ++i) {
        const uint64_t at = i < n_blocks ? payloads + i * block : payloads + n_blocks * block + (i - n_blocks) * staging;
        put_le(b, table + 4 * i, kvq::detail::crc32c(b.data() + at, i < n_blocks ? block : staging), 4);
    }
    put_le(b, table + table_bytes - 4, kvq::detail::crc32c(b.data() + table, table_bytes - 4), 4);
    put_le(b, header - 4, kvq::detail::crc32c(b.data(), header - 4), 4);
}

// A directory of its own for each test case, removed afterwards.
struct TempDir {
    fs::path path;
    TempDir() {
        static int n = 0;
        path = fs::temp_directory_path() / ("kvq_test_file_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    std::string operator/(const std::string& name) const { return (path / name).string(); }
    size_t entries() const { return static_cast<size_t>(std::distance(fs::directory_iterator(path), fs::directory_iterator())); }
};

inline std::vector<uint8_t> slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
    // A new file rather than a truncated one: ext4 flushes a file truncated and rewritten (auto_da_alloc),
    // which made the loops over thousands of bad files wait on the disk.
    fs::remove(path);
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline CacheConfig config(const std::string& kc, const std::string& vc) {
    CacheConfig c;
    c.n_layers = 2;
    c.n_kv_heads = 2;
    c.n_heads = 4;
    c.head_dim = 64;
    c.block_tokens = 8;
    c.key_codec = kc;
    c.value_codec = vc;
    return c;
}

inline void append(KVCache& c, SequenceId s, size_t n, uint64_t seed) {
    const size_t row = size_t(c.config().n_kv_heads) * c.config().head_dim;
    for (int l = 0; l < c.config().n_layers; ++l) {
        const auto k = kvq::test::gaussian(n * row, seed + 2 * l), v = kvq::test::gaussian(n * row, seed + 2 * l + 1);
        c.append(l, s, k.data(), v.data(), n);
    }
}

// Every layer's attention for every sequence, and the token counts, as bytes.
inline std::vector<std::vector<float>> outputs(const KVCache& c, const std::vector<SequenceId>& ids) {
    const auto q = kvq::test::gaussian(size_t(c.config().n_heads) * c.config().head_dim, 99);
    std::vector<std::vector<float>> all;
    for (SequenceId s : ids) {
        for (int l = 0; l < c.config().n_layers; ++l) {
            std::vector<float> out(q.size(), 0.0f);
            if (c.n_tokens(s, l) > 0) c.attend(l, s, q.data(), out.data());
            out.push_back(static_cast<float>(c.n_tokens(s, l)));
            all.push_back(out);
        }
    }
    return all;
}

inline bool same_bits(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
        if (a[i].size() != b[i].size() || std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0) {
            return false;
        }
    }
    return true;
}

// Everything observable about a cache (dump includes block ids and reference counts).
struct Snapshot {
    std::string dump;
    size_t bytes;
    kvq::PoolStats pool;
    std::vector<std::vector<float>> outs;
    explicit Snapshot(const KVCache& c)
        : dump(c.dump()), bytes(c.bytes_used()), pool(c.pool_stats()), outs(outputs(c, c.sequences())) {}
    bool operator==(const Snapshot& o) const {
        return dump == o.dump && bytes == o.bytes && pool.blocks_total == o.pool.blocks_total &&
               pool.blocks_used == o.pool.blocks_used && pool.blocks_shared == o.pool.blocks_shared &&
               same_bits(outs, o.outs);
    }
};

// A cache with forks sharing blocks, open blocks, and a sequence with an odd length.
inline KVCache populated(const CacheConfig& cfg) {
    KVCache c(cfg);
    const SequenceId a = c.add_sequence();
    append(c, a, 21, 1);  // two full blocks and 5 open tokens
    const SequenceId b = c.fork(a);
    append(c, b, 4, 10);
    const SequenceId e = c.add_sequence();
    append(c, e, 3, 20);
    return c;
}

template <class E>
inline std::string error_of(auto&& f) {
    try {
        f();
    } catch (const E& e) {
        return e.what();
    }
    FAIL("expected an exception");
    return {};
}

}  // namespace kvq::test::cache_file
