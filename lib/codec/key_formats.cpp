#include "key_formats.hpp"

#include <charconv>
#include <string>

#include "centering.hpp"
#include "channel_keys.hpp"
#include "row_keys.hpp"
#include "sink_keys.hpp"

namespace kvq::detail {
namespace {

constexpr std::string_view kSink = "+sink";

// A key spec taken apart: the stored format's spec and the sink tokens (0: none).
struct KeySpec {
    std::string_view base;
    int sinks = 0;
};

KeySpec split(std::string_view spec) {
    KeySpec s{spec, 0};
    const size_t at = spec.rfind(kSink);
    if (at == std::string_view::npos) return s;
    const std::string_view n = spec.substr(at + kSink.size());
    int value = 0;
    const auto [end, err] = std::from_chars(n.data(), n.data() + n.size(), value);
    if (n.empty() || err != std::errc{} || end != n.data() + n.size() || value < 1 || value > kMaxSinkTokens || n[0] == '0') {
        throw BadParams("key codec '" + std::string(spec) + "': +sinkN keeps the first N = 1.." + std::to_string(kMaxSinkTokens) +
                        " tokens of a sequence in fp16, got '" + std::string(spec.substr(at)) + "'");
    }
    s.base = spec.substr(0, at);
    s.sinks = value;
    return s;
}

std::string centering_refused(std::string_view spec) {
    return "key codec '" + std::string(spec) + "' stores a per-channel minimum per block already; +center does not apply to it (center_keys does not apply)";
}

}  // namespace

bool keys_in_groups(const Codec& key, int block_tokens) { return GroupedKeys::takes(key, block_tokens); }

std::unique_ptr<const KeyFormat> make_key_format(std::string_view spec, int head_dim, int block_tokens,
                                                 const KeyFormatOptions& options) {
    const KeySpec s = split(spec);
    std::unique_ptr<const KeyFormat> format;
    if (const int bits = channel_key_bits(s.base)) {
        if (options.centered) throw BadParams(centering_refused(spec));
        format = std::make_unique<ChannelKeys>(bits, head_dim, block_tokens);
    } else {
        Codec rows = Codec::make(s.base, head_dim, options.seed);
        if (options.pool && keys_in_groups(rows, block_tokens)) {
            format = std::make_unique<GroupedKeys>(std::move(rows), block_tokens);
        } else {
            format = std::make_unique<RowKeys>(std::move(rows), block_tokens);
        }
        if (options.centered) format = std::make_unique<CenteredKeys>(std::move(format));
    }
    if (s.sinks) format = std::make_unique<SinkKeys>(std::move(format), s.sinks);
    return format;
}

bool is_key_only_spec(std::string_view spec) {
    const KeySpec s = split(spec);
    return s.sinks > 0 || channel_key_bits(s.base) != 0;
}

void check_key_spec(std::string_view spec, bool centered) {
    const KeySpec s = split(spec);
    if (channel_key_bits(s.base)) {
        if (centered) throw BadParams(centering_refused(spec));
        return;
    }
    parse_codec_spec(s.base);  // the row codec's name and parameters
}

}  // namespace kvq::detail
