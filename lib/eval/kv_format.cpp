// KVFormat: parsing "K/V" pairs and counting their bits.
#include "kvq/research/kv_format.hpp"

#include <algorithm>
#include <stdexcept>

#include "codec/key_formats.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "spec_params.hpp"

namespace kvq {
namespace {

constexpr std::string_view kCenter = "+center";

// Checks the base name against the codec table, so a typo fails before any work starts.
void check_codec_name(std::string_view spec, std::string_view pair) {
    try {
        parse_codec_spec(spec);
    } catch (const UnknownCodec&) {
        std::string known;
        for (const auto& n : codec_names()) known += (known.empty() ? "" : ", ") + n;
        throw std::invalid_argument("K/V pair '" + std::string(pair) + "': unknown codec '" + std::string(spec) +
                                    "' (known: " + known + "; any may take +rot, keys also +center)");
    }
}

}  // namespace

std::string KVFormat::key_label() const { return detail::key_spec_centered(key_codec, center_keys); }
std::string KVFormat::label() const { return key_label() + "/" + value_codec + (window ? "|" + window->label() : ""); }

double KVFormat::key_bits(int head_dim, int block_tokens) const {
    // The key rows and their side data as the cache seals them (its key format, lib/codec/key_format.hpp).
    return detail::make_key_format(key_label(), head_dim, block_tokens)->bits_per_value();
}

double KVFormat::value_bits(int head_dim) const { return Codec::make(value_codec, head_dim).bits_per_value(); }

KVFormat KVFormat::parse(std::string_view spec) {
    if (const size_t bar = spec.find('|'); bar != std::string_view::npos) {
        if (spec.find('|', bar + 1) != std::string_view::npos) {
            throw std::invalid_argument("K/V pair '" + std::string(spec) + "': at most one '|' (full-attention layers | sliding-window layers)");
        }
        KVFormat f = parse(spec.substr(0, bar));
        f.window = std::make_shared<const KVFormat>(parse(spec.substr(bar + 1)));
        return f;
    }
    const size_t slash = spec.find('/');
    if (slash == std::string_view::npos || spec.find('/', slash + 1) != std::string_view::npos || slash == 0 ||
        slash + 1 == spec.size()) {
        throw std::invalid_argument("K/V pair '" + std::string(spec) + "': expected KEY_CODEC/VALUE_CODEC, e.g. q8_0/q4_0");
    }
    KVFormat f;
    f.value_codec = std::string(spec.substr(slash + 1));
    if (f.value_codec.find(kCenter) != std::string::npos) {
        throw std::invalid_argument("K/V pair '" + std::string(spec) + "': +center applies to keys only");
    }
    try {
        // "+center" anywhere among the key format's suffixes: the flag, and the rest of the spec.
        const std::string_view key = spec.substr(0, slash);
        f.center_keys = detail::parse_key_spec(key).center;
        f.key_codec = detail::key_spec_centered(key, false);
        detail::check_key_spec(f.key_label());
    } catch (const UnknownCodec&) {
        check_codec_name(f.key_codec, spec);  // names the codecs there are
    } catch (const std::invalid_argument& e) {
        throw std::invalid_argument("K/V pair '" + std::string(spec) + "': " + e.what());
    }
    if (detail::is_key_only_spec(f.value_codec)) {
        throw std::invalid_argument("K/V pair '" + std::string(spec) + "': '" + f.value_codec + "' is a key format; values need a row codec");
    }
    check_codec_name(f.value_codec, spec);
    return f;
}

std::vector<KVFormat> parse_kv_formats(std::string_view list) {
    std::vector<KVFormat> out;
    for (auto item : detail::split(list, ',')) {
        if (!item.empty()) out.push_back(KVFormat::parse(item));
    }
    if (out.empty()) throw std::invalid_argument("no K/V pairs given");
    return out;
}

std::vector<KVFormat> cross_kv_formats(std::string_view key_codecs, std::string_view value_codecs) {
    std::vector<KVFormat> out;
    for (auto k : detail::split(key_codecs, ',')) {
        for (auto v : detail::split(value_codecs, ',')) {
            if (!k.empty() && !v.empty()) out.push_back(KVFormat::parse(std::string(k) + "/" + std::string(v)));
        }
    }
    if (out.empty()) throw std::invalid_argument("no key or value codecs given");
    return out;
}

std::vector<KVFormat> default_kv_formats() {
    std::vector<KVFormat> out = parse_kv_formats(
        "f16/f16,q8_0/q8_0,q8_0/q4_0,q8_0/q4_1,q5_0/q4_0,q4_1/q4_0,q4_0/q4_0,q4_0+rot/q4_0,q4_0+center/q4_0,"
        "q4_0+rot+center/q4_0");
    const auto names = codec_names();
    auto have = [&](std::string_view n) { return std::find(names.begin(), names.end(), n) != names.end(); };
    // The rotating families at the budgets that compare with the rows above (each only if registered):
    // polar and TurboQuant-MSE for K and V, TurboQuant-prod (unbiased q·k) for K with MSE values, and
    // 8-bit keys with 3-bit values.
    // Then the pairs that real dumps chose (docs/accuracy.md, Gemma 3 270M): centered turbo keys, 5-bit
    // rotated centered keys with 3-bit polar values (4.5 bits per value, the best that KVCache holds), and
    // per-channel keys (chanB) at 4.25 and 3.5 bits per value.
    static const char* const rotating[][2] = {{"polar", "polar"},
                                              {"turbo4", "turbo4"},
                                              {"turbo3", "turbo3"},
                                              {"turbo4_qjl", "turbo4"},
                                              {"q8_0", "turbo3"},
                                              {"turbo4+center", "turbo4"},
                                              {"q5_0+rot+center", "polar:budget=3"},
                                              {"chan4", "polar:budget=3.5"},
                                              {"chan3", "polar:budget=3"}};
    auto base = [](std::string_view spec) { return spec.substr(0, spec.find_first_of(":+")); };
    for (const auto& [k, v] : rotating) {  // key formats that are no row codec (chanB) are not in the table
        if ((detail::is_key_only_spec(k) || have(base(k))) && have(base(v))) out.push_back(KVFormat::parse(std::string(k) + "/" + v));
    }
    // Any other codec registered later shows up as K and V of its own.
    static const std::string_view listed[] = {"f32",   "f16",    "bf16",   "q8_0",     "q4_0",       "q4_1",
                                              "q5_0",  "q5_1",   "iq4_nl", "polar",    "turbo2",     "turbo2.5",
                                              "turbo3", "turbo3.5", "turbo4", "turbo2_qjl", "turbo3_qjl", "turbo4_qjl"};
    for (const auto& name : names) {
        if (std::find(std::begin(listed), std::end(listed), name) == std::end(listed)) out.push_back(KVFormat::parse(name + "/" + name));
    }
    return out;
}

std::vector<KVFormat> default_latent_formats(int head_dim, int head_dim_v) {
    std::vector<KVFormat> out;
    for (const auto& name : codec_names()) {
        if (name == "f32") continue;
        CacheConfig c;
        c.head_dim = head_dim;
        c.head_dim_v = head_dim_v;
        c.latent_values = true;
        c.key_codec = c.value_codec = name;
        try {
            validate_config(c);  // the cache's own rule of which codecs a latent takes
        } catch (const std::invalid_argument&) {
            continue;
        }
        out.push_back(KVFormat::parse(name + "/" + name));
    }
    return out;
}

}  // namespace kvq
