#include "key_formats.hpp"

#include <string>

#include "../ref/key_groups.hpp"
#include "centering.hpp"
#include "channel_keys.hpp"
#include "row_keys.hpp"

namespace kvq::detail {
namespace {

std::string centering_refused(std::string_view spec) {
    return "key codec '" + std::string(spec) + "' stores a per-channel minimum per block already; +center does not apply to it (center_keys does not apply)";
}

}  // namespace

bool keys_in_groups(const Codec& key, int block_tokens) {
    // can_score_groups(): q8_0, with the level in use's score_groups kernel, and a head it takes.
    return impl_of(key).can_score_groups() && block_tokens > 0 && static_cast<size_t>(block_tokens) % kGroupRows == 0;
}

std::unique_ptr<const KeyFormat> make_key_format(std::string_view spec, int head_dim, int block_tokens,
                                                 const KeyFormatOptions& options) {
    std::unique_ptr<const KeyFormat> format;
    if (const int bits = channel_key_bits(spec)) {
        if (options.centered) throw BadParams(centering_refused(spec));
        format = std::make_unique<ChannelKeys>(bits, head_dim, block_tokens);
    } else {
        Codec rows = Codec::make(spec, head_dim, options.seed);
        if (options.pool && keys_in_groups(rows, block_tokens)) {
            format = std::make_unique<GroupedKeys>(std::move(rows), block_tokens);
        } else {
            format = std::make_unique<RowKeys>(std::move(rows), block_tokens);
        }
        if (options.centered) format = std::make_unique<CenteredKeys>(std::move(format));
    }
    return format;
}

bool is_key_only_spec(std::string_view spec) { return channel_key_bits(spec) != 0; }

void check_key_spec(std::string_view spec, bool centered) {
    if (channel_key_bits(spec)) {
        if (centered) throw BadParams(centering_refused(spec));
        return;
    }
    parse_codec_spec(spec);  // the row codec's name and parameters
}

}  // namespace kvq::detail
