// The sweep's parts (kvq/research/sweep.hpp): each K/V format made for a data set, the KVCache that holds
// it (sweep_formats.cpp), and decode time on that cache against f16 (sweep_timing.cpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "codec/key_format.hpp"
#include "codec/value_format.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/research/sweep.hpp"

namespace kvq::detail {

// A format's key format (lib/codec/key_formats.hpp) and value format (lib/codec/value_format.hpp), one kv
// head per block as the tables hold them, at a data set's head sizes; for a latent data set the value
// format is of the key codec's rows, read from the key rows' leading values. A format the data set cannot
// take carries the reason instead.
struct Prepared {
    KVFormat format;
    std::shared_ptr<const KeyFormat> keys, window_keys;  // "K/V|K2/V2": the sliding-window layers' too
    std::shared_ptr<const ValueFormat> values, window_values;
    bool latent = false;  // values in place in the key rows (KVData::latent)
    std::string error;

    // The format and codecs of a layer.
    const KVFormat& format_of(bool windowed) const { return format.on_layer(windowed); }
    const KeyFormat& keys_of(bool windowed) const { return windowed && window_keys ? *window_keys : *keys; }
    const ValueFormat& values_of(bool windowed) const { return windowed && window_values ? *window_values : *values; }
    // Whether a KVCache can hold the format.
    bool cache_holds() const { return error.empty(); }
};

const KVFormat& f16_format();

// The formats made at the data set's head sizes. On a latent data set a format is first checked as a latent
// KVCache of its shape would check it (cache_config, validate_config), so that a refusal is the cache's
// own reason (rotated, centered or per-channel keys; a value codec other than the key codec's).
std::vector<Prepared> prepare_formats(const std::vector<KVFormat>& formats, const KVData& data, const SweepOptions& options);

// The KVCache of the data set's first `layers` layers in one format: its shape, codecs, block size, softmax
// scale, windows, one thread; a latent data set's is a latent cache (latent_values, head_dim_v).
CacheConfig cache_config(const KVData& data, int layers, const KVFormat& format, const SweepOptions& options);

// Decode time per format (0 where a KVCache cannot hold it) and of f16/f16, the baseline.
struct DecodeTimes {
    std::vector<double> seconds;
    double f16_seconds = 0;
};
// Decode time is measured on the first layers only: the ratio to f16 does not need all of them, and one
// cache per format for every layer of a large dump would not fit in memory.
inline constexpr int kTimedLayers = 4;
DecodeTimes time_formats(const KVData& data, const std::vector<Prepared>& prepared, const SweepOptions& options);

}  // namespace kvq::detail
