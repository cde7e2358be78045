#include "key_formats.hpp"

#include <charconv>
#include <string>

#include "centering.hpp"
#include "channel_keys.hpp"
#include "row_keys.hpp"
#include "sink_keys.hpp"

namespace kvq::detail {
namespace {

constexpr std::string_view kCenter = "+center";
constexpr std::string_view kSink = "+sink";

[[noreturn]] void bad_spec(std::string_view spec, const std::string& what) {
    throw BadParams("key codec '" + std::string(spec) + "': " + what);
}

// N of a "+sinkN" suffix (n: what follows "+sink").
int sink_count(std::string_view spec, std::string_view n) {
    int value = 0;
    const auto [end, err] = std::from_chars(n.data(), n.data() + n.size(), value);
    if (n.empty() || err != std::errc{} || end != n.data() + n.size() || value < 1 || value > kMaxSinkTokens || n[0] == '0') {
        bad_spec(spec, "+sinkN keeps the first N = 1.." + std::to_string(kMaxSinkTokens) + " tokens of a sequence in fp16, got '+sink" +
                           std::string(n) + "'");
    }
    return value;
}

std::string centering_refused(std::string_view spec) {
    return "key codec '" + std::string(spec) + "' stores a per-channel minimum per block already; +center does not apply to it (center_keys does not apply)";
}

}  // namespace

std::string KeySpec::name() const { return rows + (center ? std::string(kCenter) : "") + (sinks ? std::string(kSink) + std::to_string(sinks) : ""); }

KeySpec parse_key_spec(std::string_view spec) {
    // The suffixes from the end: "+center" and "+sinkN", each at most once, in either order.
    KeySpec s;
    std::string_view rest = spec;
    for (;;) {
        if (rest.ends_with(kCenter)) {
            if (s.center) bad_spec(spec, "+center is given twice");
            s.center = true;
            rest.remove_suffix(kCenter.size());
            continue;
        }
        const size_t at = rest.rfind(kSink);
        if (at != std::string_view::npos && rest.find('+', at + 1) == std::string_view::npos) {
            if (s.sinks) bad_spec(spec, "+sinkN is given twice");
            s.sinks = sink_count(spec, rest.substr(at + kSink.size()));
            rest = rest.substr(0, at);
            continue;
        }
        break;
    }
    if (rest.find(kCenter) != std::string_view::npos) {
        bad_spec(spec, "+center follows the row codec's spec (and its +rot): name[:params][+rot][+center][+sinkN]");
    }
    s.rows = std::string(rest);
    return s;
}

std::string key_spec_centered(std::string_view spec, bool center) {
    KeySpec s = parse_key_spec(spec);
    s.center = center;
    return s.name();
}

bool keys_in_groups(const Codec& key, int block_tokens) { return GroupedKeys::takes(key, block_tokens); }

std::unique_ptr<const KeyFormat> make_key_format(std::string_view spec, int head_dim, int block_tokens,
                                                 const KeyFormatOptions& options) {
    const KeySpec s = parse_key_spec(spec);
    std::unique_ptr<const KeyFormat> format;
    if (const int bits = channel_key_bits(s.rows)) {
        if (s.center) throw BadParams(centering_refused(s.rows));
        format = std::make_unique<ChannelKeys>(bits, head_dim, block_tokens);
    } else {
        Codec rows = Codec::make(s.rows, head_dim, options.seed);
        if (options.pool && keys_in_groups(rows, block_tokens)) {
            format = std::make_unique<GroupedKeys>(std::move(rows), block_tokens);
        } else {
            format = std::make_unique<RowKeys>(std::move(rows), block_tokens);
        }
        if (s.center) format = std::make_unique<CenteredKeys>(std::move(format));
    }
    if (s.sinks) format = std::make_unique<SinkKeys>(std::move(format), s.sinks);
    return format;
}

bool is_key_only_spec(std::string_view spec) {
    const KeySpec s = parse_key_spec(spec);
    return s.center || s.sinks > 0 || channel_key_bits(s.rows) != 0;
}

void check_key_spec(std::string_view spec) {
    const KeySpec s = parse_key_spec(spec);
    if (channel_key_bits(s.rows)) {
        if (s.center) throw BadParams(centering_refused(s.rows));
        return;
    }
    parse_codec_spec(s.rows);  // the row codec's name and parameters
}

}  // namespace kvq::detail
