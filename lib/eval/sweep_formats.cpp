// The sweep's formats made for a data set, and the KVCache that holds one (lib/eval/sweep_parts.hpp).
#include <stdexcept>

#include "codec/key_formats.hpp"
#include "sweep_parts.hpp"

namespace kvq::detail {
namespace {

std::shared_ptr<const KeyFormat> key_format(const KVFormat& f, int head_dim, int block_tokens, uint64_t seed) {
    return make_key_format(f.key_label(), head_dim, block_tokens, {false, seed});
}

// A latent's values are its key rows' leading values: the key codec's rows of dv() values.
std::shared_ptr<const ValueFormat> value_format(const KVFormat& f, const KVData& d, const KeyFormat& keys, const SweepOptions& o) {
    Codec codec = Codec::make(d.latent ? keys.codec().name() : f.value_codec, d.dv(), o.seed);
    return make_value_format(std::move(codec), o.block_tokens, o.int8_value_weights);
}

}  // namespace

const KVFormat& f16_format() {
    static const KVFormat f16 = KVFormat::parse("f16/f16");
    return f16;
}

std::vector<Prepared> prepare_formats(const std::vector<KVFormat>& formats, const KVData& d, const SweepOptions& options) {
    std::vector<Prepared> prepared;
    for (const auto& f : formats) {
        Prepared p;
        p.format = f;
        p.latent = d.latent;
        try {
            if (d.latent) validate_config(cache_config(d, 1, f, options));
            p.keys = key_format(f, d.head_dim, options.block_tokens, options.seed);
            p.values = value_format(f, d, *p.keys, options);
            if (const KVFormat* w = f.window.get()) {
                p.window_keys = key_format(*w, d.head_dim, options.block_tokens, options.seed);
                p.window_values = value_format(*w, d, *p.window_keys, options);
            }
        } catch (const std::invalid_argument& e) {
            p.error = e.what();
        }
        prepared.push_back(std::move(p));
    }
    return prepared;
}

CacheConfig cache_config(const KVData& data, int layers, const KVFormat& format, const SweepOptions& options) {
    CacheConfig c;
    c.n_layers = layers;
    c.n_kv_heads = data.kv_heads;
    c.n_heads = data.q_heads;
    c.head_dim = data.head_dim;
    c.head_dim_v = data.dv();
    c.latent_values = data.latent;
    c.key_codec = format.key_label();
    c.value_codec = format.value_codec;
    c.block_tokens = options.block_tokens;
    c.scale = data.softmax_scale();
    c.threads = 1;
    c.seed = options.seed;
    c.int8_value_weights = options.int8_value_weights;
    if (!data.windows.empty()) c.sliding_window.assign(data.windows.begin(), data.windows.begin() + layers);
    for (int l = 0; format.window && l < layers; ++l) {
        const KVFormat& f = format.on_layer(data.window(l) > 0);
        c.layer_codecs.push_back({f.key_label(), f.value_codec});
    }
    return c;
}

}  // namespace kvq::detail
