// Encoding of the header and block tables (little-endian, byte by byte, so the host's byte order does not
// matter), with the checks of what a decoded header may hold. The files themselves: cache_file_io.cpp.
#include "cache_file.hpp"

#include <cmath>
#include <cstring>
#include <limits>

#include "crc32c.hpp"
#include "key_scales.hpp"

namespace kvq::detail::file {
namespace {

class Encoder {
public:
    std::vector<uint8_t> bytes;
    void u32(uint32_t x) {
        for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<uint8_t>(x >> (8 * i)));
    }
    void u64(uint64_t x) {
        for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<uint8_t>(x >> (8 * i)));
    }
    void i32(int32_t x) { u32(static_cast<uint32_t>(x)); }
    void f32(float x) {
        uint32_t bits;
        std::memcpy(&bits, &x, 4);
        u32(bits);
    }
    void str(const std::string& s) {
        u32(static_cast<uint32_t>(s.size()));
        bytes.insert(bytes.end(), s.begin(), s.end());
    }
    void crc() { u32(crc32c(bytes.data(), bytes.size())); }
};

// Reads fields in order from a section; running past its end is a BadCacheFile naming the section.
class Decoder {
public:
    Decoder(std::span<const uint8_t> bytes, const char* section) : b_(bytes), section_(section) {}
    size_t pos() const { return pos_; }
    size_t left() const { return b_.size() - pos_; }
    void need(uint64_t n, const char* what) const {
        if (n > left()) {
            bad(std::string(section_) + ": " + what + " needs " + std::to_string(n) + " bytes at offset " +
                std::to_string(pos_) + " but only " + std::to_string(left()) + " remain");
        }
    }
    uint32_t u32(const char* what) {
        need(4, what);
        uint32_t x = 0;
        for (int i = 0; i < 4; ++i) x |= uint32_t(b_[pos_ + i]) << (8 * i);
        pos_ += 4;
        return x;
    }
    uint64_t u64(const char* what) {
        need(8, what);
        uint64_t x = 0;
        for (int i = 0; i < 8; ++i) x |= uint64_t(b_[pos_ + i]) << (8 * i);
        pos_ += 8;
        return x;
    }
    int32_t i32(const char* what) { return static_cast<int32_t>(u32(what)); }
    float f32(const char* what) {
        const uint32_t bits = u32(what);
        float x;
        std::memcpy(&x, &bits, 4);
        return x;
    }
    std::string str(const char* what, uint32_t max) {
        const uint32_t n = u32(what);
        if (n > max) bad(std::string(section_) + ": " + what + " is " + std::to_string(n) + " bytes long (at most " + std::to_string(max) + ")");
        need(n, what);
        std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
        pos_ += n;
        return s;
    }

private:
    std::span<const uint8_t> b_;
    const char* section_;
    size_t pos_ = 0;
};

// The section's last 4 bytes are the CRC32C of the bytes before them.
void check_crc(std::span<const uint8_t> bytes, const char* section) {
    if (bytes.size() < 4) bad(std::string(section) + " is shorter than its CRC");
    Decoder d(bytes.subspan(bytes.size() - 4), section);
    const uint32_t stored = d.u32("CRC32C"), actual = crc32c(bytes.data(), bytes.size() - 4);
    if (stored != actual) {
        bad(std::string(section) + ": CRC32C mismatch (stored " + std::to_string(stored) + ", computed " +
            std::to_string(actual) + "): the file is corrupted");
    }
}

int dim_field(Decoder& d, const char* what) {
    const int32_t x = d.i32(what);
    if (x < 1 || x > kMaxDim) bad(std::string("header: ") + what + " = " + std::to_string(x) + " is outside 1.." + std::to_string(kMaxDim));
    return x;
}

uint32_t flag_field(Decoder& d, const char* what) {
    const uint32_t x = d.u32(what);
    if (x > 1) bad(std::string("header: ") + what + " = " + std::to_string(x) + " (must be 0 or 1)");
    return x;
}

// a + b, or a BadCacheFile when it overflows.
uint64_t add(uint64_t a, uint64_t b, const char* what) {
    if (a > std::numeric_limits<uint64_t>::max() - b) bad(std::string("header: ") + what + " overflows");
    return a + b;
}
uint64_t mul(uint64_t a, uint64_t b, const char* what) {
    if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a) bad(std::string("header: ") + what + " overflows");
    return a * b;
}

// Offsets and sizes: sections in order, aligned, and the file's size their sum.
void check_layout(const Header& h) {
    if (h.payload_offset % kPayloadAlignment != 0 || h.payload_offset < h.header_bytes) {
        bad("header: payload section offset " + std::to_string(h.payload_offset) + " is not a multiple of " +
            std::to_string(kPayloadAlignment) + " after the header");
    }
    uint64_t blocks_end = h.payload_offset, n_blocks = 0;
    for (const KindRecord& k : h.kinds) {
        if (k.block_bytes == 0 || k.block_bytes % kPayloadStride != 0) {
            bad("header: block payload size " + std::to_string(k.block_bytes) + " is not a positive multiple of " +
                std::to_string(kPayloadStride));
        }
        blocks_end = add(blocks_end, mul(k.n_blocks, k.block_bytes, "block section size"), "block section end");
        n_blocks = add(n_blocks, k.n_blocks, "block count");
    }
    if (n_blocks != h.n_blocks || h.kinds[0].block_bytes != h.block_bytes || h.kinds[0].key_row_bytes != h.key_row_bytes ||
        h.kinds[0].value_row_bytes != h.value_row_bytes) {
        bad("header: the kinds' blocks (" + std::to_string(n_blocks) + ") or their first kind's sizes disagree with the "
            "header's block count and sizes");
    }
    if (h.staging_bytes == 0 || h.staging_bytes % kPayloadStride != 0) {
        bad("header: staging payload size " + std::to_string(h.staging_bytes) + " is not a positive multiple of " +
            std::to_string(kPayloadStride));
    }
    const uint64_t payload_end = add(blocks_end, mul(h.n_staging, h.staging_bytes, "staging section size"), "staging section end");
    if (h.table_offset != payload_end) {
        bad("header: block tables at offset " + std::to_string(h.table_offset) + ", but the payloads end at " +
            std::to_string(payload_end));
    }
    if (add(h.table_offset, h.table_bytes, "table section end") != h.file_bytes) {
        bad("header: sections end at " + std::to_string(h.table_offset + h.table_bytes) + " but the file size field says " +
            std::to_string(h.file_bytes));
    }
}

}  // namespace

void bad(const std::string& what) { throw BadCacheFile("cache file: " + what); }

uint64_t kind_first_block(const Header& h, size_t kind) {
    uint64_t first = 0;
    for (size_t k = 0; k < kind; ++k) first += h.kinds[k].n_blocks;
    return first;
}

BlockPlace block_place(const Header& h, uint64_t i) {
    uint64_t offset = h.payload_offset;
    for (size_t k = 0;; ++k) {
        const KindRecord& r = h.kinds[k];
        if (i < r.n_blocks) return {k, offset + i * r.block_bytes, r.block_bytes};
        i -= r.n_blocks;
        offset += r.n_blocks * r.block_bytes;
    }
}

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

std::vector<uint8_t> encode_header(const Header& h) {
    const CacheConfig& c = h.config;
    Encoder e;
    e.bytes.assign(kMagic, kMagic + 8);
    e.u32(h.version);
    e.u32(0);  // header_bytes, filled in below
    for (uint64_t x : {h.file_bytes, h.payload_offset, h.n_blocks, h.block_bytes, h.n_staging, h.staging_bytes,
                       h.table_offset, h.table_bytes, h.n_sequences}) {
        e.u64(x);
    }
    for (int x : {c.n_layers, c.n_kv_heads, c.n_heads, c.head_dim, c.block_tokens}) e.i32(x);
    e.u32(c.seal == SealPolicy::on_block_full ? 1 : 0);
    e.u32(c.center_keys ? 1 : 0);
    e.u32(c.nan_policy == NanPolicy::propagate ? 1 : 0);
    e.u32(c.staging == StagingType::f16 ? 1 : 0);  // since version 2
    e.f32(c.scale);
    e.f32(c.softcap);
    e.u64(c.seed);
    e.u64(h.key_row_bytes);
    e.u64(h.value_row_bytes);
    e.str(c.key_codec);
    e.str(c.value_codec);
    e.u32(static_cast<uint32_t>(c.sliding_window.size()));
    for (int w : c.sliding_window) e.i32(w);
    // Since version 3: each layer's codecs (none when every layer has the default ones), then the kinds.
    e.u32(static_cast<uint32_t>(c.layer_codecs.size()));
    for (const LayerCodecs& l : c.layer_codecs) {
        e.str(l.key);
        e.str(l.value);
    }
    e.u32(static_cast<uint32_t>(h.kinds.size()));
    for (const KindRecord& k : h.kinds) {
        for (uint64_t x : {k.n_blocks, k.block_bytes, k.key_row_bytes, k.value_row_bytes}) e.u64(x);
    }
    if (h.version >= kExactTailFormatVersion) e.u32(static_cast<uint32_t>(c.exact_tail_tokens));
    if (h.version >= kKeyScalesFormatVersion) {
        e.u32(static_cast<uint32_t>(c.key_scales.size()));
        for (float x : c.key_scales) e.f32(x);
    }
    if (h.version >= kValueHeadFormatVersion) {
        e.i32(c.head_dim_v);
        e.u32(c.latent_values ? 1 : 0);
    }
    const uint32_t size = static_cast<uint32_t>(e.bytes.size() + 4);
    for (int i = 0; i < 4; ++i) e.bytes[12 + i] = static_cast<uint8_t>(size >> (8 * i));
    e.crc();
    return e.bytes;
}

Header decode_prefix(std::span<const uint8_t> prefix) {
    if (prefix.size() < kPrefixBytes || std::memcmp(prefix.data(), kMagic, 8) != 0) {
        bad("not a kvq cache file (it does not start with the magic \"KVQCACHE\")");
    }
    Decoder d(prefix.subspan(8), "header");
    Header h;
    h.version = d.u32("format version");
    if (h.version < kOldestFormatVersion || h.version > kFormatVersion) {
        bad("format version " + std::to_string(h.version) + " is not supported (this kvq reads versions " +
            std::to_string(kOldestFormatVersion) + ".." + std::to_string(kFormatVersion) +
            (h.version > kFormatVersion ? "; the file is from a newer kvq)" : ")"));
    }
    h.header_bytes = d.u32("header size");
    if (h.header_bytes < kPrefixBytes + 4 || h.header_bytes > kMaxHeaderBytes) {
        bad("header size " + std::to_string(h.header_bytes) + " is outside " + std::to_string(kPrefixBytes + 4) + ".." +
            std::to_string(kMaxHeaderBytes));
    }
    return h;
}

Header decode_header(std::span<const uint8_t> bytes) {
    Header h = decode_prefix(bytes);
    if (bytes.size() != h.header_bytes) bad("header: expected " + std::to_string(h.header_bytes) + " bytes");
    check_crc(bytes, "header");
    Decoder d(bytes.first(bytes.size() - 4), "header");
    d.u64("prefix");
    d.u64("prefix");
    h.file_bytes = d.u64("file size");
    h.payload_offset = d.u64("payload offset");
    h.n_blocks = d.u64("block count");
    h.block_bytes = d.u64("block size");
    h.n_staging = d.u64("staging count");
    h.staging_bytes = d.u64("staging size");
    h.table_offset = d.u64("table offset");
    h.table_bytes = d.u64("table size");
    h.n_sequences = d.u64("sequence count");
    CacheConfig& c = h.config;
    c.n_layers = dim_field(d, "n_layers");
    c.n_kv_heads = dim_field(d, "n_kv_heads");
    c.n_heads = dim_field(d, "n_heads");
    c.head_dim = dim_field(d, "head_dim");
    c.block_tokens = d.i32("block_tokens");
    c.seal = flag_field(d, "seal") ? SealPolicy::on_block_full : SealPolicy::on_append;
    c.center_keys = flag_field(d, "center_keys");
    c.nan_policy = flag_field(d, "nan_policy") ? NanPolicy::propagate : NanPolicy::reject;
    c.staging = h.version >= 2 && flag_field(d, "staging") ? StagingType::f16 : StagingType::f32;
    c.scale = d.f32("scale");
    c.softcap = d.f32("softcap");
    if (!(c.scale > 0) || !std::isfinite(c.scale)) bad("header: scale " + std::to_string(c.scale) + " is not positive and finite");
    c.seed = d.u64("seed");
    h.key_row_bytes = d.u64("key row size");
    h.value_row_bytes = d.u64("value row size");
    c.key_codec = d.str("key codec", kMaxSpecBytes);
    c.value_codec = d.str("value codec", kMaxSpecBytes);
    const uint32_t n_windows = d.u32("window count");
    if (n_windows != 0 && n_windows != static_cast<uint32_t>(c.n_layers)) {
        bad("header: " + std::to_string(n_windows) + " sliding windows for " + std::to_string(c.n_layers) + " layers");
    }
    for (uint32_t i = 0; i < n_windows; ++i) c.sliding_window.push_back(d.i32("sliding window"));
    if (h.version >= 3) {
        const uint32_t n_layer_codecs = d.u32("layer codec count");
        if (n_layer_codecs != 0 && n_layer_codecs != static_cast<uint32_t>(c.n_layers)) {
            bad("header: " + std::to_string(n_layer_codecs) + " layer codec pairs for " + std::to_string(c.n_layers) + " layers");
        }
        for (uint32_t i = 0; i < n_layer_codecs; ++i) {
            LayerCodecs& l = c.layer_codecs.emplace_back();
            l.key = d.str("layer key codec", kMaxSpecBytes);
            l.value = d.str("layer value codec", kMaxSpecBytes);
        }
        const uint32_t n_kinds = d.u32("kind count");
        if (n_kinds < 1 || n_kinds > static_cast<uint32_t>(c.n_layers)) {
            bad("header: " + std::to_string(n_kinds) + " kinds of layers for " + std::to_string(c.n_layers) + " layers");
        }
        d.need(uint64_t(n_kinds) * 32, "the kinds");
        for (uint32_t i = 0; i < n_kinds; ++i) {
            KindRecord& k = h.kinds.emplace_back();
            k.n_blocks = d.u64("kind block count");
            k.block_bytes = d.u64("kind block size");
            k.key_row_bytes = d.u64("kind key row size");
            k.value_row_bytes = d.u64("kind value row size");
        }
    } else {
        h.kinds.push_back({h.n_blocks, h.block_bytes, h.key_row_bytes, h.value_row_bytes});
    }
    if (h.version >= kExactTailFormatVersion) {
        const uint32_t tail = d.u32("exact_tail_tokens");
        if (tail > static_cast<uint32_t>(kMaxExactTailTokens) || (tail > 0 && c.seal != SealPolicy::on_block_full)) {
            bad("header: exact_tail_tokens " + std::to_string(tail) + " (at most " + std::to_string(kMaxExactTailTokens) +
                ", and only with seal = on_block_full)");
        }
        c.exact_tail_tokens = static_cast<int>(tail);
    }
    if (h.version >= kKeyScalesFormatVersion) {
        // 0 entries, or one per layer, kv head and channel: each positive and finite, and so its reciprocal
        // (CacheConfig::key_scales; the cache's own rule, checked here so a hostile file is a BadCacheFile).
        const uint32_t n = d.u32("key scale count");
        const uint64_t want = uint64_t(c.n_layers) * uint64_t(c.n_kv_heads) * uint64_t(c.head_dim);
        if (n != 0 && n != want) {
            bad("header: " + std::to_string(n) + " key scales for " + std::to_string(want) +
                " (n_layers x n_kv_heads x head_dim)");
        }
        d.need(uint64_t(n) * 4, "the key scales");
        c.key_scales.resize(n);
        for (uint32_t i = 0; i < n; ++i) {
            const float x = c.key_scales[i] = d.f32("key scale");
            if (!valid_key_scale(x)) {
                bad("header: key scale " + std::to_string(i) + " is " + std::to_string(x) +
                    " (key scales must be positive and finite, and so their reciprocals)");
            }
        }
    }
    c.head_dim_v = c.head_dim;
    if (h.version >= kValueHeadFormatVersion) {
        c.head_dim_v = dim_field(d, "head_dim_v");
        c.latent_values = flag_field(d, "latent_values");
    }
    if (d.left() != 0) bad("header: " + std::to_string(d.left()) + " bytes after the last field");
    check_layout(h);
    return h;
}

std::vector<uint8_t> encode_tables(const Tables& t) {
    Encoder e;
    for (uint32_t crc : t.crcs) e.u32(crc);
    for (const auto& layers : t.sequences) {
        for (const LayerRecord& r : layers) {
            e.u64(r.n_tokens);
            e.u64(r.first_pos);
            e.u32(r.staged);
            e.u32(r.staging);
            e.u32(static_cast<uint32_t>(r.blocks.size()));
            e.u32(static_cast<uint32_t>(r.poisoned.size()));
            for (uint32_t b : r.blocks) e.u32(b);
            for (const auto& [pos, head] : r.poisoned) {
                e.u64(pos);
                e.u32(head);
            }
        }
    }
    e.crc();
    return e.bytes;
}

Tables decode_tables(std::span<const uint8_t> bytes, const Header& h) {
    check_crc(bytes, "block tables");
    Decoder d(bytes.first(bytes.size() - 4), "block tables");
    Tables t;
    const uint64_t n_payloads = h.n_blocks + h.n_staging;  // both bounded by the file's size
    d.need(mul(n_payloads, 4, "CRC table size"), "the payload CRCs");
    for (uint64_t i = 0; i < n_payloads; ++i) t.crcs.push_back(d.u32("payload CRC"));
    // Every layer record takes at least 32 bytes: this bounds the sequence count before anything is sized.
    d.need(mul(mul(h.n_sequences, static_cast<uint64_t>(h.config.n_layers), "record count"), 32, "records"),
           "the sequence records");
    t.sequences.resize(h.n_sequences);
    for (auto& layers : t.sequences) {
        layers.resize(h.config.n_layers);
        for (LayerRecord& r : layers) {
            r.n_tokens = d.u64("n_tokens");
            r.first_pos = d.u64("first position");
            r.staged = d.u32("staged tokens");
            r.staging = d.u32("staging index");
            const uint32_t n_blocks = d.u32("block count"), n_poisoned = d.u32("poisoned count");
            d.need(uint64_t(n_blocks) * 4 + uint64_t(n_poisoned) * 12, "a block table");
            for (uint32_t i = 0; i < n_blocks; ++i) r.blocks.push_back(d.u32("block index"));
            for (uint32_t i = 0; i < n_poisoned; ++i) {
                const uint64_t pos = d.u64("poisoned position");
                r.poisoned.emplace_back(pos, d.u32("poisoned head"));
            }
        }
    }
    if (d.left() != 0) bad("block tables: " + std::to_string(d.left()) + " bytes after the last record");
    return t;
}

}  // namespace kvq::detail::file
