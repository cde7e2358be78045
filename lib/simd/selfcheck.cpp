// The run-time self-check (selfcheck.hpp): a few small cases per codec family that reach every code
// path a decode step takes: query groups of 4, 3, 2 and 1 (7 and 2 queries), odd row counts on both
// sides of the 64-row chunk, head sizes 64 and 128 (whose 4-block loops are unrolled) and 40 for the
// plain codecs (a tail shorter than a register), the softmax, the q8_0 key groups, the chanB scores and
// the primitives' contracts. Kernels only: the polar and turbo kernels take layouts only their codecs
// build, so their checks through the codec path are added from above (lib/codec/level_checks.hpp,
// dispatch.hpp's add_level_check).
#include "selfcheck.hpp"

#include "../ref/row_codecs.hpp"
#include "level_check.hpp"

namespace kvq::detail {

std::string quick_check_level(SimdLevel level) {
    if (level == SimdLevel::scalar) return {};
    size_t checks = 0;
    std::string bad = check_primitives(level, checks);
    auto fail = [&](const std::string& what, const std::string& finding) {
        if (bad.empty() && !finding.empty()) bad = what + ": " + finding;
    };
    // (head size, rows, queries): query groups 4 + 3, 4 + 1 and 2; row pairs and a single last row.
    struct Case {
        int n;
        size_t rows;
        int n_q;
    };
    for (int c = 0; c < static_cast<int>(BlockCodec::count) && bad.empty(); ++c) {
        const auto codec = static_cast<BlockCodec>(c);
        const int small = c <= static_cast<int>(BlockCodec::bf16) ? 40 : 64;
        for (const Case& k : {Case{128, 9, 7}, Case{small, 5, 5}, Case{small, 2, 2}}) {
            fail(codec_name(codec), check_block_codec(level, codec, k.n, k.rows, k.n_q, k.n == 128, 1000 + k.n, checks));
        }
    }
    if (bad.empty()) fail("softmax", check_softmax(level, 4, 37, 5, checks));
    if (bad.empty()) fail("q8_0 key groups", check_score_groups(level, 128, 2, true, 6, checks));
    for (int bits : {3, 4, 8}) {
        if (bad.empty()) fail("chan score", check_channel_score(level, bits, 136, 5, 4, 90 + bits, checks));
    }
    return bad;
}

}  // namespace kvq::detail
