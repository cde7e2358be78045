// "+center" is a key spec suffix, as "+sinkN" is (lib/codec/key_formats.hpp): the key format registration
// parses it, a cache takes it in its key specs (its own per layer), and CacheConfig::center_keys is the
// same as "+center" on every key spec. Files of caches whose keys are all centered keep the center_keys
// field and specs without the suffix, as every kvq wrote them; files of caches centered on some layers
// only carry "+center" in those layers' specs (docs/file-format.md).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cache_file_util.hpp"
#include "codec/key_formats.hpp"

using namespace kvq::test::cache_file;
using kvq::LayerCodecs;

namespace {

// The string field at a file's offset (u32 length, then the bytes).
std::string string_at(const std::vector<uint8_t>& b, size_t at) {
    const size_t n = get_le(b, at, 4);
    return std::string(b.begin() + at + 4, b.begin() + at + 4 + n);
}
constexpr size_t kCenterField = 112, kKeyCodecField = 156;  // docs/file-format.md

}  // namespace

TEST_CASE("+center: a key spec suffix after the row codec's spec, in either order with +sinkN") {
    using kvq::detail::make_key_format;
    CHECK(make_key_format("q4_0+center", 64, 32)->name() == "q4_0+center");
    CHECK(make_key_format("q4_0+rot+center+sink1", 64, 32)->name() == "q4_0+rot+center+sink1");
    CHECK(make_key_format("q4_0+rot+sink1+center", 64, 32)->name() == "q4_0+rot+center+sink1");  // as kvq eval wrote it
    CHECK(make_key_format("q4_0+center", 64, 32)->side_bytes() == 2 * 64);
    CHECK(kvq::detail::key_spec_centered("q4_0+sink2", true) == "q4_0+center+sink2");
    CHECK(kvq::detail::key_spec_centered("q4_0+sink2+center", false) == "q4_0+sink2");
    CHECK(kvq::detail::is_key_only_spec("q8_0+center"));
    for (const char* bad : {"q4_0+center+rot", "q4_0+center+center", "q4_0+sink1+center+sink1", "chan4+center", "q4_0+centre"}) {
        CAPTURE(bad);
        CHECK_THROWS_AS(make_key_format(bad, 64, 32), std::invalid_argument);
    }
    CHECK_THROWS_WITH_AS(make_key_format("q4_0+center+rot", 64, 32), doctest::Contains("[+rot][+center][+sinkN]"), kvq::BadParams);
    // Not a row codec: Codec::make and value codecs refuse it.
    CHECK_THROWS_AS(kvq::Codec::make("q8_0+center", 64), kvq::BadParams);
    CHECK_THROWS_WITH_AS(KVCache(config("q8_0", "q4_0+center")), doctest::Contains("values need a row codec"), kvq::BadParams);
}

TEST_CASE("+center: a key spec with it is center_keys bit for bit, both given are the same, the cache reports it") {
    const CacheConfig flag = [] {
        CacheConfig c = config("q4_0+rot", "q4_0");
        c.center_keys = true;
        return c;
    }();
    CacheConfig spec = config("q4_0+rot+center", "q4_0"), both = spec;
    both.center_keys = true;
    KVCache a = populated(flag), b = populated(spec), c = populated(both);
    CHECK(same_bits(outputs(a, a.sequences()), outputs(b, b.sequences())));
    CHECK(same_bits(outputs(a, a.sequences()), outputs(c, c.sequences())));
    for (const KVCache* x : {&a, &b, &c}) {
        CHECK(x->key_spec() == "q4_0+rot+center");
        CHECK(x->key_codec().name() == "q4_0+rot");  // the rows' codec
        CHECK(x->config().key_codec == "q4_0+rot+center");
        CHECK(x->config().center_keys);  // every key spec is centered
        CHECK(x->bytes_per_token() == a.bytes_per_token());
    }
    // center_keys on every key spec, a layer's own included; on_append cannot seal a block's mean.
    CacheConfig layers = flag;
    layers.layer_codecs = {{}, {"q8_0", ""}};
    CHECK(KVCache(layers).key_spec(1) == "q8_0+center");
    spec.seal = SealPolicy::on_append;
    CHECK_THROWS_WITH_AS(KVCache{spec}, doctest::Contains("on_block_full"), kvq::BadParams);
    CacheConfig latent = config("f16+center", "");
    latent.latent_values = true;
    CHECK_THROWS_AS(KVCache{latent}, kvq::BadParams);
}

TEST_CASE("+center: a layer's own key spec centers that layer only") {
    CacheConfig c = config("q8_0", "q4_0");
    c.layer_codecs = {{}, {"q4_0+center", ""}};
    const KVCache mixed = populated(c);
    CHECK(mixed.key_spec(0) == "q8_0");
    CHECK(mixed.key_spec(1) == "q4_0+center");
    CHECK_FALSE(mixed.config().center_keys);  // not every layer's
    // Layer 1 attends as a cache of centered q4_0 keys alone, layer 0 as one of plain q8_0 keys.
    for (const auto& [layer, key] : {std::pair{0, "q8_0"}, std::pair{1, "q4_0+center"}}) {
        CacheConfig one = config(key, "q4_0");
        const KVCache alone = populated(one);
        const auto all = outputs(mixed, mixed.sequences()), own = outputs(alone, alone.sequences());
        for (size_t s = 0; s < 3; ++s) CHECK(all[s * 2 + layer] == own[s * 2 + layer]);  // same appends per layer
    }
}

TEST_CASE("+center in files: all centered keeps the center_keys field (older files load so), some layers carry the suffix") {
    TempDir dir;
    // Every key spec centered, by the flag or the suffix: the file has the field and plain specs, byte for
    // byte what a cache with center_keys always wrote (version 3), and loads with the suffix in its specs.
    CacheConfig by_flag = config("q4_0", "q4_0");
    by_flag.center_keys = true;
    populated(by_flag).save(dir / "flag.kvq");
    populated(config("q4_0+center", "q4_0")).save(dir / "spec.kvq");
    const auto flag_file = slurp(dir / "flag.kvq");
    CHECK(slurp(dir / "spec.kvq") == flag_file);
    CHECK(flag_file[8] == 3);
    CHECK(get_le(flag_file, kCenterField, 4) == 1);
    CHECK(string_at(flag_file, kKeyCodecField) == "q4_0");
    const KVCache back = KVCache::load(dir / "flag.kvq");
    CHECK(back.key_spec() == "q4_0+center");
    CHECK(back.config().key_codec == "q4_0+center");
    CHECK(back.config().center_keys);
    const KVCache src = populated(by_flag);
    CHECK(same_bits(outputs(back, back.sequences()), outputs(src, src.sequences())));
    KVCache into(config("q4_0+center", "q4_0"));  // a cache that names it by the suffix takes the file
    CHECK(into.load_into(dir / "flag.kvq").size() == 3);

    // One layer centered: no field, the suffix in that layer's spec; same bits back, same bytes again.
    CacheConfig mixed = config("q8_0", "q4_0");
    mixed.layer_codecs = {{}, {"q4_0+sink1+center", ""}};
    const KVCache m = populated(mixed);
    m.save(dir / "mixed.kvq");
    const auto mixed_file = slurp(dir / "mixed.kvq");
    CHECK(mixed_file[8] == 3);
    CHECK(get_le(mixed_file, kCenterField, 4) == 0);
    CHECK(string_at(mixed_file, kKeyCodecField) == "q8_0");
    CHECK(std::string(mixed_file.begin(), mixed_file.end()).find("q4_0+center+sink1") != std::string::npos);
    const KVCache m2 = KVCache::load(dir / "mixed.kvq");
    CHECK(m2.key_spec(1) == "q4_0+center+sink1");
    CHECK(m2.key_spec(0) == "q8_0");
    CHECK(same_bits(outputs(m2, m2.sequences()), outputs(m, m.sequences())));
    m2.save(dir / "again.kvq");
    CHECK(slurp(dir / "again.kvq") == mixed_file);
    // A cache centered everywhere does not take it: the first layer differs.
    CacheConfig all = mixed;
    all.center_keys = true;
    KVCache other(all);
    CHECK_THROWS_WITH_AS(other.load_into(dir / "mixed.kvq"), doctest::Contains("'q8_0+center'"), kvq::ConfigMismatch);
}
