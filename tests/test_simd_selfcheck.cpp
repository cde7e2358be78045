// The run-time self-check and the shipped parity check: every level's primitives keep their contracts,
// every level passes, a wrong kernel makes kvq fall back and say why, and no lookup is a null call.
#include <doctest/doctest.h>

#include <string>

#include "ref/row_codecs.hpp"
#include "kvq/codec.hpp"
#include "kvq/selftest.hpp"
#include "kvq/simd.hpp"
#include "codec/level_checks.hpp"
#include "simd/dispatch.hpp"
#include "simd/level_check.hpp"
#include "simd/selfcheck.hpp"

using kvq::SimdLevel;
using kvq::detail::BlockCodec;

TEST_CASE("every level's primitives keep their contracts (reductions, packs, widening, dot products, fp16)") {
    for (SimdLevel level : kvq::available_simd_levels()) {
        CAPTURE(kvq::simd_level_name(level));
        const auto check = kvq::detail::level_check_ops(level);
        if (level == SimdLevel::scalar) {
            CHECK((check == nullptr));
            continue;
        }
        REQUIRE((check != nullptr));
        const char* broken = check();
        CHECK_MESSAGE(broken == nullptr, (broken ? broken : ""));
    }
}

TEST_CASE("every level the CPU runs passes its self-check, and the report names the level in use") {
    for (SimdLevel level : kvq::available_simd_levels()) {
        CAPTURE(kvq::simd_level_name(level));
        CHECK(kvq::detail::level_self_check(level) == "");
    }
    const auto report = kvq::simd_report();
    MESSAGE(kvq::format_simd_report(report));
    bool found = false;
    for (const auto& l : report.levels) {
        if (l.level == report.in_use) {
            found = true;
            CHECK(l.cpu_runs);
            CHECK(l.passed);
        }
        if (!l.cpu_runs) CHECK_FALSE(l.passed);
    }
    CHECK(found);
    CHECK_FALSE(report.reason.empty());
}

namespace {
int g_added_check_calls = 0;
std::string counting_check(SimdLevel) {
    ++g_added_check_calls;
    return {};
}
}  // namespace

TEST_CASE("the run-time self-check: lib/simd's kernel checks, then the checks added from above (polar, turbo)") {
    // Added once however often it is added; it runs in every level's self-check after the kernels'.
    kvq::detail::add_level_check(counting_check);
    kvq::detail::add_level_check(counting_check);
    for (SimdLevel level : kvq::available_simd_levels()) {
        CAPTURE(kvq::simd_level_name(level));
        const int before = g_added_check_calls;
        CHECK(kvq::detail::level_self_check(level) == "");
        CHECK(g_added_check_calls == before + 1);
        // lib/codec's part: polar and turbo through the codec path (added by codec.cpp as the program starts).
        CHECK(kvq::detail::check_rotated_codecs(level) == "");
    }
}

TEST_CASE("no kernel lookup is a null call at any level") {
    for (SimdLevel level : kvq::available_simd_levels()) {
        CAPTURE(kvq::simd_level_name(level));
        for (int c = 0; c < static_cast<int>(BlockCodec::count); ++c) {
            const auto* k = kvq::detail::level_kernels(static_cast<BlockCodec>(c), level);
            REQUIRE((k != nullptr));
            CHECK((k->quantize != nullptr));
            CHECK((k->dequantize != nullptr));
            CHECK((k->prepare_query != nullptr));
            CHECK((k->score != nullptr));
            CHECK((k->accumulate != nullptr));
        }
        CHECK((kvq::detail::level_softmax(level) != nullptr));
        kvq::detail::LevelOverride at(level);
        const auto& r = kvq::detail::active_rotated_kernels();
        for (const auto& row : r.turbo_rows) {
            CHECK((row.quantize != nullptr));
            CHECK((row.score != nullptr));
            CHECK((row.accumulate != nullptr));
        }
        CHECK((r.polar.quantize != nullptr));
        CHECK((r.polar.score != nullptr));
        CHECK((r.polar.accumulate != nullptr));
        CHECK((r.tcq_viterbi != nullptr));
        CHECK((kvq::detail::active_softmax() != nullptr));
    }
    const bool no_neon = kvq::detail::level_kernels(BlockCodec::q8_0, SimdLevel::neon) == nullptr;
    const bool no_avx2 = kvq::detail::level_kernels(BlockCodec::q8_0, SimdLevel::avx2) == nullptr;
    CHECK((no_neon || no_avx2));  // a level this build or CPU lacks is no table at all
}

TEST_CASE("a wrong kernel injected into a level makes kvq fall back to the level below and report why") {
    const SimdLevel before = kvq::simd_level();
    const auto levels = kvq::available_simd_levels();
    const SimdLevel top = levels.back();
    if (top == SimdLevel::scalar) {
        MESSAGE("only the scalar level here: nothing to fall back from");
        return;
    }
    const SimdLevel below = levels[levels.size() - 2];
    kvq::detail::inject_kernel_fault_for_testing(top, BlockCodec::q4_0, true);
    kvq::force_simd_level(top);
    CHECK(kvq::simd_level() == below);
    auto report = kvq::simd_report();
    const std::string text = kvq::format_simd_report(report);
    MESSAGE(text);
    CHECK(report.in_use == below);
    CHECK(report.reason.find(std::string(kvq::simd_level_name(top)) + " failed its self-check") != std::string::npos);
    CHECK(report.reason.find("q4_0") != std::string::npos);
    for (const auto& l : report.levels) {
        if (l.level == top) {
            CHECK(l.checked);
            CHECK_FALSE(l.passed);
            CHECK(l.detail.find("score") != std::string::npos);
        }
    }
    // What the user computes now comes from the level below, so it is right.
    const auto c = kvq::Codec::make("q4_0", 64);
    std::vector<float> k(64, 0.5f), q(64, 1.0f);
    std::vector<uint8_t> row(c.row_bytes()), prep(c.query_bytes());
    c.quantize_rows(k.data(), 1, row.data());
    c.prepare_queries(q.data(), 1, prep.data());
    float s = 0;
    c.score_rows(prep.data(), 1, row.data(), 1, &s, 1);
    CHECK(s == doctest::Approx(32.0).epsilon(1e-3));

    // The full check's grid finds it too (kvq::selftest runs these cases at every level).
    size_t checks = 0;
    CHECK(kvq::detail::check_block_codec(top, BlockCodec::q4_0, 128, 65, 5, false, 7, checks).find("score") != std::string::npos);
    CHECK(kvq::detail::check_block_codec(below, BlockCodec::q4_0, 128, 65, 5, false, 7, checks) == "");

    kvq::detail::inject_kernel_fault_for_testing(top, BlockCodec::q4_0, false);
    kvq::force_simd_level(before);
    CHECK(kvq::simd_level() == before);
}

TEST_CASE("kvq::selftest: every codec at every level this CPU runs, and cache attention, pass") {
    const auto result = kvq::selftest();
    for (const auto& l : result.lines) {
        CAPTURE(kvq::format_selftest_line(l));
        CHECK(l.passed);
        CHECK(l.cases > 0);
    }
    CHECK(result.passed());
    size_t levels = 0;
    for (const auto& l : result.lines) levels += l.family == "cache";
    CHECK(levels == kvq::available_simd_levels().size());
}
