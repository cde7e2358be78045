// Fuzz target: loading arbitrary cache files. The input picks one of a few valid files (small caches with
// forks, open blocks, windows, either seal policy, layers of their own codecs) and mutates it — flipped bits, overwritten fields,
// truncation, appended bytes — or is taken as the whole file as it is; it may then recompute every CRC32C,
// so that mutations get past the checksums and reach the validation of the header and block tables.
// Properties: load_into (into a cache under either NanPolicy) either throws (BadCacheFile, ConfigMismatch,
// PoolExhausted, FileIOError) and
// changes nothing observable (dump, bytes, pool, every attention output), or adds sequences that behave
// as sequences: attention and appends on every layer work (under reject, with finite output: a file's rows
// obey the cache's input rules), saving and loading them again gives the same attention, and removing them
// returns the pool to where it was. KVCache::load (with the pool limit) never crashes either, and takes no
// block beyond the file's.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>

#include "cache/cache_file.hpp"
#include "cache/crc32c.hpp"
#include "fuzz_common.hpp"
#include "kvq/cache.hpp"

using namespace kvq;
using namespace kvq::fuzz;

namespace {

constexpr int kD = 32;

// Configurations 0-2: 4-token blocks; 3: 16-token blocks and 4 queries per kv head, whose sealed q8_0 key
// blocks the cache keeps in groups of 16 rows where the SIMD level has a kernel for them
// (lib/ref/key_groups.hpp): files hold rows, which loading groups again; 4: sink keys over centered
// rotated q4_0 (lib/codec/sink_keys.hpp: a hostile file's sink count and fp16 rows). 3 also has key channel
// scales (format version 5: a hostile file's scale count and values); 5: a latent cache (MLA: values read
// from the key rows, latent_values) with an exact tail (format version 6: a hostile file's head_dim_v,
// latent flag and held staging slots).
constexpr int kConfigs = 6;

CacheConfig base_config(int which) {
    CacheConfig c;
    c.n_layers = 2;
    c.n_kv_heads = 1 + which % 2;
    c.n_heads = (which == 3 ? 4 : 2) * c.n_kv_heads;
    c.head_dim = kD;
    c.block_tokens = which == 3 ? 16 : 4;
    c.key_codec = which == 2 ? "polar" : which == 4 ? "q4_0+rot+sink2" : "q8_0";
    c.value_codec = which == 1 ? "q4_1+rot" : "q4_0";
    c.seal = which == 1 ? SealPolicy::on_append : SealPolicy::on_block_full;
    c.center_keys = which == 2 || which == 4;
    if (which == 1) c.sliding_window = {6, 0};
    if (which == 0) c.layer_codecs = {{}, {"q4_0", "q8_0"}};  // blocks of two sizes (file format 3)
    if (which == 3) {
        c.key_scales.resize(size_t(c.n_layers) * c.n_kv_heads * kD);
        for (size_t i = 0; i < c.key_scales.size(); ++i) c.key_scales[i] = 0.5f + static_cast<float>(i % 7) / 4.0f;
    }
    if (which == 5) {
        c.value_codec = "";
        c.latent_values = true;
        c.head_dim_v = kD;
        c.exact_tail_tokens = 6;
    }
    c.nan_policy = NanPolicy::propagate;
    return c;
}

std::vector<float> rows(size_t n, int n_kv, float start) {
    std::vector<float> x(n * n_kv * kD);
    for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(start + 0.37f * static_cast<float>(i));
    return x;
}

void append(KVCache& c, SequenceId s, int layer, size_t n, float start) {
    const auto k = rows(n, c.config().n_kv_heads, start), v = rows(n, c.config().n_kv_heads, start + 1);
    c.append(layer, s, k.data(), c.config().latent_values ? nullptr : v.data(), n);  // a latent's values are its keys
}

std::string temp_path(const char* name) {
    const char* dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    return std::string(dir) + "/kvq_fuzz_" + std::to_string(getpid()) + "_" + name;
}

std::vector<uint8_t> slurp(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void spit(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::remove(path.c_str());
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// The valid files the mutations start from, made once.
const std::vector<uint8_t>& base_file(int which) {
    static std::vector<uint8_t> files[kConfigs];
    if (files[which].empty()) {
        KVCache c(base_config(which));
        const SequenceId a = c.add_sequence();
        const size_t sealed = which == 3 ? 16 : 0;  // a sealed block of 16 tokens in configuration 3
        for (int l = 0; l < 2; ++l) append(c, a, l, sealed + 6 + 5 * l, 0.1f * l);
        const SequenceId b = c.fork(a);
        append(c, b, 0, 3, 2.0f);
        if (which == 0) c.truncate(a, 5);
        const std::string path = temp_path("base");
        c.save(path);
        files[which] = slurp(path);
        std::remove(path.c_str());
    }
    return files[which];
}

uint64_t get(const std::vector<uint8_t>& b, size_t at, int bytes) {
    uint64_t x = 0;
    for (int i = 0; i < bytes && at + i < b.size(); ++i) x |= uint64_t(b[at + i]) << (8 * i);
    return x;
}

void put(std::vector<uint8_t>& b, size_t at, uint64_t x, int bytes) {
    for (int i = 0; i < bytes && at + i < b.size(); ++i) b[at + i] = static_cast<uint8_t>(x >> (8 * i));
}

// Recomputes every CRC32C the file's own (possibly mutated) offsets point at, where they are in bounds.
void fix_crcs(std::vector<uint8_t>& b) {
    const uint64_t header = get(b, 12, 4), payloads = get(b, 24, 8), n_blocks = get(b, 32, 8),
                   block = get(b, 40, 8), n_staging = get(b, 48, 8), staging = get(b, 56, 8),
                   table = get(b, 64, 8), table_bytes = get(b, 72, 8);
    if (table <= b.size() && table_bytes <= b.size() - table && table_bytes >= 4 && n_blocks < 4096 && n_staging < 4096) {
        for (uint64_t i = 0; i < n_blocks + n_staging && (i + 1) * 4 <= table_bytes - 4; ++i) {
            const uint64_t at = i < n_blocks ? payloads + i * block : payloads + n_blocks * block + (i - n_blocks) * staging;
            const uint64_t size = i < n_blocks ? block : staging;
            if (at <= b.size() && size <= b.size() - at) put(b, table + 4 * i, detail::crc32c(b.data() + at, size), 4);
        }
        put(b, table + table_bytes - 4, detail::crc32c(b.data() + table, table_bytes - 4), 4);
    }
    if (header >= 4 && header <= b.size()) put(b, header - 4, detail::crc32c(b.data(), header - 4), 4);
}

std::vector<uint8_t> mutated(FuzzedDataProvider& in, const std::vector<uint8_t>& base) {
    std::vector<uint8_t> b = base;
    const int n = in.ConsumeIntegralInRange<int>(0, 8);
    for (int i = 0; i < n && !b.empty(); ++i) {
        const size_t at = in.ConsumeIntegralInRange<size_t>(0, b.size() - 1);
        switch (in.ConsumeIntegralInRange<int>(0, 4)) {
            case 0: b[at] ^= static_cast<uint8_t>(1u << in.ConsumeIntegralInRange<int>(0, 7)); break;
            case 1: put(b, at & ~size_t(3), in.ConsumeIntegral<uint32_t>(), 4); break;
            case 2: put(b, at & ~size_t(7), in.ConsumeIntegral<uint64_t>(), 8); break;
            case 3: b.resize(at); break;
            default: {
                const auto extra = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(1, 64));
                b.insert(b.begin() + static_cast<long>(at), extra.begin(), extra.end());
            }
        }
    }
    if (in.ConsumeBool()) fix_crcs(b);
    return b;
}

std::string observe(const KVCache& c) {
    std::string s = c.dump() + std::to_string(c.bytes_used());
    const PoolStats p = c.pool_stats();
    s += "/" + std::to_string(p.blocks_total) + "/" + std::to_string(p.blocks_used) + "/" + std::to_string(p.blocks_shared);
    const std::vector<float> q = rows(1, c.config().n_heads, 5.0f);
    for (SequenceId id : c.sequences()) {
        for (int l = 0; l < c.config().n_layers; ++l) {
            if (c.n_tokens(id, l) == 0) continue;
            std::vector<float> out(q.size());
            c.attend(l, id, q.data(), out.data());
            s.append(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float));
        }
    }
    return s;
}

// Loaded sequences are ordinary ones: saved and loaded again they attend alike; they take appends.
void exercise(KVCache& c, const std::vector<SequenceId>& ids, size_t blocks_before) {
    const std::string path = temp_path("again");
    CacheConfig unlimited = c.config();
    unlimited.max_blocks = 0;
    KVCache copy(unlimited);
    for (SequenceId id : ids) {
        c.save(path, id);
        const auto again = copy.load_into(path);
        require(again.size() == 1, "a saved sequence did not load as one");
    }
    std::remove(path.c_str());
    const std::vector<float> q = rows(1, c.config().n_heads, 5.0f);
    for (size_t i = 0; i < ids.size(); ++i) {
        for (int l = 0; l < c.config().n_layers; ++l) {
            require(copy.n_tokens(static_cast<SequenceId>(i), l) == c.n_tokens(ids[i], l), "token counts differ");
            if (c.n_tokens(ids[i], l) == 0) continue;
            std::vector<float> a(q.size()), b(q.size());
            c.attend(l, ids[i], q.data(), a.data());
            copy.attend(l, static_cast<SequenceId>(i), q.data(), b.data());
            require(same_floats(a, b), "a loaded sequence attends differently after another save and load");
            if (c.config().nan_policy == NanPolicy::reject) {
                for (float x : a) require(std::isfinite(x), "a sequence loaded into a reject cache attends to non-finite output");
            }
            try {
                append(c, ids[i], l, 3, 1.0f);
                c.attend(l, ids[i], q.data(), a.data());
            } catch (const PoolExhausted&) {
                require(c.config().max_blocks > 0, "PoolExhausted from a pool without a limit");
            }
        }
    }
    for (SequenceId id : ids) c.remove(id);
    require(c.pool_stats().blocks_used == blocks_before, "removing the loaded sequences did not free their blocks");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    const int which = in.ConsumeIntegralInRange<int>(0, kConfigs - 1);
    const bool raw = in.ConsumeIntegralInRange<int>(0, 7) == 0;
    CacheConfig cfg = base_config(in.ConsumeIntegralInRange<int>(0, 7) == 0 ? (which + 1) % kConfigs : which);
    // A limit that holds the live sequence below (its blocks and its open blocks' float staging, which
    // counts against max_blocks) plus 0..8 blocks for the file.
    const size_t spare = in.ConsumeBool() ? SIZE_MAX : in.ConsumeIntegralInRange<size_t>(0, 8);
    if (spare != SIZE_MAX) {
        KVCache probe(cfg);
        append(probe, probe.add_sequence(), 0, 5, 3.0f);
        cfg.max_blocks = probe.pool_stats().blocks_used + probe.pool_stats().blocks_reserved + spare;
    }
    // The base files are saved under propagate; a reject cache must refuse what reject never stores.
    if (in.ConsumeBool()) cfg.nan_policy = NanPolicy::reject;
    const std::vector<uint8_t> file = raw ? in.ConsumeRemainingBytes<uint8_t>() : mutated(in, base_file(which));
    const std::string path = temp_path("input");
    spit(path, file);

    KVCache live(cfg);
    const SequenceId own = live.add_sequence();
    append(live, own, 0, 5, 3.0f);
    const std::string before = observe(live);
    const size_t blocks_before = live.pool_stats().blocks_used;
    try {
        const auto ids = live.load_into(path);
        exercise(live, ids, blocks_before);
    } catch (const BadCacheFile&) {
        require(observe(live) == before, "a rejected file changed the cache");
    } catch (const ConfigMismatch&) {
        require(observe(live) == before, "a file of another configuration changed the cache");
    } catch (const PoolExhausted&) {
        require(cfg.max_blocks > 0, "PoolExhausted from a pool without a limit");
        require(observe(live) == before, "PoolExhausted while loading changed the cache");
    } catch (const FileIOError& e) {
        fail(std::string("I/O error on a file the target wrote: ") + e.what());
    }
    try {
        LoadOptions options;
        options.max_blocks = cfg.max_blocks;
        KVCache loaded = KVCache::load(path, options);
        observe(loaded);
        const PoolStats p = loaded.pool_stats();
        require(p.blocks_total == p.blocks_used, "KVCache::load allocated blocks beyond the file's");
    } catch (const BadCacheFile&) {
    } catch (const PoolExhausted&) {
        require(cfg.max_blocks > 0, "PoolExhausted from a load without a limit");
    }
    std::remove(path.c_str());
    return 0;
}
