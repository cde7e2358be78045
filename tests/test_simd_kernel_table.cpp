// The kernel tables of the SIMD levels (lib/simd/level_<isa>.cpp, the one place that chooses kernels):
// every slot that holds a kernel is named, every named slot holds a kernel, lookups are never null, and
// simd_kernel_table() reports exactly what dispatch calls.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "kvq/simd.hpp"
#include "levels/kernel_golden.hpp"
#include "ref/row_codecs.hpp"
#include "simd/dispatch.hpp"
#include "test_util.hpp"

using kvq::SimdLevel;
using kvq::detail::BlockCodec;
using kvq::detail::BlockKernels;

namespace {

const kvq::SimdKernel* find(const std::vector<kvq::SimdKernel>& table, SimdLevel l, const std::string& codec,
                            const std::string& op) {
    for (const auto& k : table) {
        if (k.level == l && k.codec == codec && k.op == op) return &k;
    }
    return nullptr;
}

}  // namespace

TEST_CASE("every level's kernel table: each (codec, op) named and non-null, one line each") {
    const auto table = kvq::simd_kernel_table();
    REQUIRE(!table.empty());
    std::set<std::tuple<int, std::string, std::string>> seen;
    for (const auto& k : table) {
        CAPTURE(kvq::simd_level_name(k.level));
        CAPTURE(k.codec);
        CAPTURE(k.op);
        CHECK(!k.kernel.empty());
        CHECK(seen.insert({static_cast<int>(k.level), k.codec, k.op}).second);  // one line per (codec, op)
        if (k.level == SimdLevel::scalar) CHECK(k.kernel == "spec");
    }
    for (SimdLevel level : kvq::available_simd_levels()) {
        CAPTURE(kvq::simd_level_name(level));
        for (int c = 0; c < kvq::detail::kBlockCodecCount; ++c) {
            const auto codec = static_cast<BlockCodec>(c);
            CAPTURE(kvq::detail::codec_name(codec));
            const BlockKernels* k = kvq::detail::level_kernels(codec, level);
            REQUIRE(k != nullptr);
            // The five operations every codec has: non-null at every level, and in the table.
            CHECK((k->quantize != nullptr));
            CHECK((k->dequantize != nullptr));
            CHECK((k->prepare_query != nullptr));
            CHECK((k->score != nullptr));
            CHECK((k->accumulate != nullptr));
            for (const char* op : {"quantize", "dequantize", "prepare_query", "score", "accumulate"}) {
                CAPTURE(op);
                CHECK(find(table, level, kvq::detail::codec_name(codec), op) != nullptr);
            }
            // The optional ones: in the table exactly where the slot holds a kernel.
            CHECK((find(table, level, kvq::detail::codec_name(codec), "accumulate_grid") != nullptr) ==
                  (k->accumulate_grid != nullptr));
            CHECK((find(table, level, kvq::detail::codec_name(codec), "score_groups") != nullptr) ==
                  (k->score_groups != nullptr));
            // accumulate_grid is q4_0's at every level (the specification's at scalar).
            CHECK((k->accumulate_grid != nullptr) == (codec == BlockCodec::q4_0));
        }
        CHECK((kvq::detail::level_softmax(level) != nullptr));
        CHECK((kvq::detail::level_channel_score(level) != nullptr));
        for (const auto& name : {std::pair{"turbo", "score"}, {"turbo", "accumulate"}, {"turbo", "quantize"},
                                 {"turbo_split", "score"}, {"turbo_qjl", "accumulate"}, {"tcq2", "quantize"},
                                 {"tcq3", "score"}, {"tcq3", "accumulate"},
                                 {"polar", "score"}, {"polar", "accumulate"}, {"polar", "quantize"},
                                 {"softmax", "update"}, {"chanB", "score"}, {"floats", "all_finite"},
                                 {"floats", "finite_max_abs"}}) {
            const char* codec = name.first;  // not a structured binding: clang 14 cannot capture one (CAPTURE)
            const char* op = name.second;
            CAPTURE(codec);
            CAPTURE(op);
            CHECK(find(table, level, codec, op) != nullptr);
        }
    }
}

TEST_CASE("the kernel table names the level files' choices (x86: the int8 kernels of avx2 and avx512)") {
    const auto table = kvq::simd_kernel_table();
    auto kernel = [&](SimdLevel l, const char* codec, const char* op) {
        const auto* k = find(table, l, codec, op);
        return k ? k->kernel : std::string("(none)");
    };
    // iq4_nl: the int8 kernels through its layout at every SIMD level, and a quantize of its own (iq4_nls's too).
    for (SimdLevel level : kvq::available_simd_levels()) {
        CAPTURE(kvq::simd_level_name(level));
        CHECK(kernel(level, "iq4_nl", "quantize") == (level == SimdLevel::scalar ? "spec" : "quantize_iq4_nl"));
        CHECK(kernel(level, "iq4_nls", "quantize") == (level == SimdLevel::scalar ? "spec" : "quantize_iq4_nls"));
        // (avx512's VNNI build: score_blocks<iq4_nl,Rows16>, 16 rows per register)
        CHECK(kernel(level, "iq4_nl", "score").rfind(level == SimdLevel::scalar ? "spec" : "score_blocks<iq4_nl", 0) == 0);
        CHECK(kernel(level, "iq4_nl", "dequantize") == (level == SimdLevel::scalar ? "spec" : "dequantize_blocks<iq4_nl>"));
        // The turbo/tcq, polar and chanB decode kernels: a level's own at every SIMD level.
        for (const auto& name : {std::pair{"turbo", "score"}, {"turbo", "accumulate"}, {"tcq2", "score"},
                                 {"tcq3", "accumulate"}, {"polar", "score"}, {"polar", "accumulate"},
                                 {"chanB", "score"}}) {
            CAPTURE(name.first);
            CHECK((kernel(level, name.first, name.second) == "spec") == (level == SimdLevel::scalar));
        }
    }
    const auto levels = kvq::available_simd_levels();
    auto has = [&](SimdLevel l) { return std::find(levels.begin(), levels.end(), l) != levels.end(); };
    if (has(SimdLevel::avx2)) {
        CHECK(kernel(SimdLevel::avx2, "q4_0", "accumulate") == "accumulate_sym_avx2<q4_0>");
        CHECK(kernel(SimdLevel::avx2, "q4_0", "accumulate_grid") == "accumulate_grid_q4_0_avx2");
        CHECK(kernel(SimdLevel::avx2, "q4_0", "score") == "score_blocks<q4_0,Q4_0Pairs>");
        CHECK(kernel(SimdLevel::avx2, "q8_0", "score_groups") == "(none)");
        CHECK(kernel(SimdLevel::avx2, "iq4_nl", "accumulate") == "accumulate_sym_avx2<iq4_nl>");
    }
    if (has(SimdLevel::avx512)) {
        CHECK(kernel(SimdLevel::avx512, "q4_0", "accumulate") == "accumulate_sym_avx512<q4_0>");
        CHECK(kernel(SimdLevel::avx512, "chanB", "score") == "channel_score_avx512");
        CHECK(kernel(SimdLevel::avx512, "iq4_nl", "accumulate") == "accumulate_sym_avx512<iq4_nl>");
    }
    if (has(SimdLevel::avx2)) CHECK(kernel(SimdLevel::avx2, "chanB", "score") == "channel_score_portable");
    if (has(SimdLevel::sse2)) {
        CHECK(kernel(SimdLevel::sse2, "turbo", "score") == "turbo_score_portable");
        CHECK(kernel(SimdLevel::sse2, "chanB", "score") == "channel_score_portable");
        CHECK(kernel(SimdLevel::sse2, "q4_0", "accumulate") == "accumulate_scaled<q4_0>");
        CHECK(kernel(SimdLevel::sse2, "iq4_nl", "accumulate") == "accumulate_scaled<iq4_nl>");
    }
    const std::string text = kvq::format_simd_kernel_table(table);
    MESSAGE(text);
    CHECK(text.rfind("codec", 0) == 0);
    CHECK(text.find("q4_0") != std::string::npos);
}

// The levels this CPU lacks are compared where scripts/simd_levels.sh runs them (qemu, the neon build),
// by kvq_level_selftest --kernels; avx512's build without VNNI there too (KVQ_AVX512_VNNI=0).
TEST_CASE("every level's kernel table is its checked-in listing, line for line (tests/data/kernels)") {
    const std::string dir = std::string(kvq::test::data_dir()) + "/kernels";
    for (SimdLevel level : kvq::available_simd_levels()) {
        CAPTURE(kvq::test::kernel_build_name(level));
        CHECK(kvq::test::check_kernel_listing(level, dir) == "");
    }
}

TEST_CASE("a kernel listing that lacks a line, or has one more, fails the comparison") {
    const SimdLevel level = kvq::available_simd_levels().back();
    const std::string listing = kvq::test::kernel_listing(level);
    REQUIRE(listing.find("tcq3        score") != std::string::npos);
    if (const char* env = std::getenv("KVQ_UPDATE_GOLDEN"); env && std::string(env) == "1") return;
    // The real listing, with its tcq3 score line dropped: written to a temporary directory and compared.
    const std::string tmp = std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/kvq_golden_test";
    std::filesystem::create_directories(tmp);
    const size_t at = listing.find("tcq3        score");
    const std::string without = listing.substr(0, at) + listing.substr(listing.find('\n', at) + 1);
    std::ofstream(tmp + "/" + kvq::test::kernel_build_name(level) + ".txt", std::ios::binary) << without;
    CHECK(kvq::test::check_kernel_listing(level, tmp).find("tcq3") != std::string::npos);
    std::ofstream(tmp + "/" + kvq::test::kernel_build_name(level) + ".txt", std::ios::binary) << listing + "extra line\n";
    CHECK(kvq::test::check_kernel_listing(level, tmp) != "");
    std::filesystem::remove_all(tmp);
}
