// The sweep behind `kvq table`: exact formats give no error, fewer bits give more, +rot and +center do
// what they are for on the data they are for, and the CSV and JSON forms parse.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "eval/json_reader.hpp"
#include "codec/channel_keys.hpp"
#include "codec/key_formats.hpp"
#include "eval/quantized_attention.hpp"
#include "ref/half.hpp"
#include "kvq/cache.hpp"
#include "kvq/research/report.hpp"
#include "kvq/research/sweep.hpp"
#include "sweep_rows.hpp"

namespace {

using kvq::test::row;
using kvq::test::sweep;

// RFC 4180 fields of one line (quotes, doubled quotes).
std::vector<std::string> csv_fields(const std::string& line) {
    std::vector<std::string> out(1);
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
        const char c = line[i];
        if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') out.back() += '"', ++i;
        else if (c == '"') quoted = !quoted;
        else if (c == ',' && !quoted) out.emplace_back();
        else out.back() += c;
    }
    return out;
}

// Two layers of the same one-layer data set: layer 0 full attention, layer 1 a window of 24 tokens.
kvq::KVData full_and_window(const kvq::KVData& src) {
    kvq::KVData d = src;
    d.name = "two";
    d.layers = 2;
    d.k.insert(d.k.end(), src.k.begin(), src.k.end());
    d.v.insert(d.v.end(), src.v.begin(), src.v.end());
    d.q.insert(d.q.end(), src.q.begin(), src.q.end());
    d.windows = {0, 24};
    return d;
}

const char* kSmall = "llm:layers=1,kv_heads=2,tokens=256,query_positions=2";

}  // namespace

TEST_CASE("sweep: f32 is exact, also with centered keys, fewer bits give more error") {
    const auto r = sweep(kSmall, "f32/f32,f32+center/f32,q8_0/q8_0,q4_0/q4_0");
    CHECK(row(r, "f32/f32").errors.kl.worst < 1e-6);
    CHECK(row(r, "f32/f32").errors.output_l2.worst < 1e-5);
    // Centering subtracts the block mean and adds q·mean back: exact up to float rounding.
    CHECK(row(r, "f32+center/f32").errors.kl.worst < 1e-5);
    CHECK(row(r, "f32+center/f32").errors.score_rmse.worst < 1e-4);
    CHECK(row(r, "q8_0/q8_0").errors.kl.mean > 0);
    CHECK(row(r, "q8_0/q8_0").errors.kl.mean < row(r, "q4_0/q4_0").errors.kl.mean);
    CHECK(row(r, "q8_0/q8_0").errors.output_l2.mean < row(r, "q4_0/q4_0").errors.output_l2.mean);
    CHECK(row(r, "q4_0/q4_0").errors.queries == 2 * 4 * 2);  // kv heads × group × positions
}

TEST_CASE("sweep: +center rescues 4-bit keys with a large per-channel bias, +rot keys with outlier channels") {
    const auto biased = sweep("llm:layers=1,kv_heads=4,tokens=512,rope=0,key_bias=6,outlier_channels=0", "q4_0/f32,q4_0+center/f32");
    CHECK(row(biased, "q4_0+center/f32").errors.kl.mean < 0.5 * row(biased, "q4_0/f32").errors.kl.mean);
    const auto outliers = sweep("llm:layers=1,kv_heads=4,tokens=512,key_bias=0", "q4_0/f32,q4_0+rot/f32");
    CHECK(row(outliers, "q4_0+rot/f32").errors.kl.mean < 0.5 * row(outliers, "q4_0/f32").errors.kl.mean);
}

TEST_CASE("sweep: bits, bytes per token and compression count everything stored") {
    const auto r = sweep(kSmall, "f16/f16,q8_0/q4_0,q4_0+center/q4_0");
    CHECK(row(r, "q4_0+center/q4_0").key_bits == 5.0);
    CHECK(row(r, "q8_0/q4_0").key_bits == 8.5);
    CHECK(row(r, "q8_0/q4_0").value_bits == 4.5);
    CHECK(r.model.name == "llama-3-8b");
    CHECK(row(r, "f16/f16").bytes_per_token == 128 * 1024);
    CHECK(row(r, "f16/f16").compression == 1.0);
    CHECK(row(r, "q8_0/q4_0").compression == doctest::Approx(16.0 * 2 / (8.5 + 4.5)));
}

TEST_CASE("sweep: decode time is measured against f16 in the same run, or not at all") {
    const auto untimed = sweep(kSmall, "q8_0/q4_0");
    CHECK(untimed.rows[0].decode_seconds == 0);
    const auto timed = sweep(kSmall, "f16/f16,q8_0/q4_0", true);
    CHECK(row(timed, "f16/f16").decode_seconds > 0);
    CHECK(row(timed, "q8_0/q4_0").decode_vs_f16 > 0);
}

TEST_CASE("sweep: a codec that cannot take the head size gives an error row, progress reaches the total") {
    kvq::SweepOptions o;
    o.formats = kvq::parse_kv_formats("f16/f16,q4_0/q4_0");
    o.timing = true;
    o.timing_repeats = 1;
    size_t calls = 0, last_done = 0, last_total = 0;
    o.progress = [&](size_t done, size_t total) {
        ++calls;
        last_done = done;
        last_total = total;
    };
    const auto r = kvq::run_sweep({kvq::make_dataset("llm:layers=2,kv_heads=2,tokens=128,head_dim=48")}, o);
    CHECK(row(r, "f16/f16").error.empty());
    CHECK(row(r, "q4_0/q4_0").error.find("multiple of 32") != std::string::npos);
    CHECK(calls == 2 * 2 + 1);  // layers × kv heads, then the timing
    CHECK(last_done == last_total);
}

TEST_CASE("sweep output: CSV and JSON parse, with one record per row") {
    kvq::SweepOptions o;
    o.formats = kvq::parse_kv_formats("f16/f16,q8_0/q4_0,q4_0+rot+center/q4_0");
    o.timing = false;
    const auto r = kvq::run_sweep({kvq::make_dataset(kSmall), kvq::make_dataset("llm:layers=1,kv_heads=1,tokens=64,head_dim=48")}, o);
    REQUIRE(r.rows.size() == 6);

    std::istringstream csv(kvq::format_sweep(r, kvq::TableFormat::csv));
    std::string line;
    std::getline(csv, line);
    const auto header = csv_fields(line);
    CHECK(header.front() == "dataset");
    CHECK(header.back() == "error");
    size_t n = 0;
    while (std::getline(csv, line)) {
        const auto fields = csv_fields(line);
        CHECK(fields.size() == header.size());
        ++n;
    }
    CHECK(n == r.rows.size());

    const auto json = kvq::detail::parse_json(kvq::format_sweep(r, kvq::TableFormat::json));
    const auto* rows = json.find("rows")->as_array();
    REQUIRE(rows);
    REQUIRE(rows->size() == r.rows.size());
    CHECK(*(*rows)[2].find("key")->as_string() == "q4_0+rot");
    CHECK(*(*rows)[2].find("key_centered")->as_bool());
    CHECK(*(*rows)[2].find("key_bits")->as_number() == 5.0);
    CHECK((*rows)[4].find("kl_mean")->is_null());  // q8_0 cannot take head_dim 48
    CHECK(*json.find("model")->find("name")->as_string() == "llama-3-8b");

    const std::string md = kvq::format_sweep(r, kvq::TableFormat::markdown);
    CHECK(md.find("| llm:layers=1,kv_heads=2,tokens=256,query_positions=2 | q4_0+rot+center | q4_0 | 5.00 | 4.50 |") != std::string::npos);
}

TEST_CASE("plan and info output parse as JSON") {
    const auto m = kvq::model_preset("gemma-3-27b");
    const auto rows = kvq::plan_memory(m, kvq::default_kv_formats(), {.context = 4096, .batch = 2});
    const auto plan = kvq::detail::parse_json(kvq::format_plan(m, rows, {.context = 4096, .batch = 2}, kvq::TableFormat::json));
    CHECK(plan.find("rows")->as_array()->size() == rows.size());
    CHECK(*plan.find("context")->as_number() == 4096);
    const auto info = kvq::detail::parse_json(kvq::format_codec_info(kvq::TableFormat::json));
    CHECK(info.find("codecs")->as_array()->size() == kvq::codec_names().size());
    CHECK(info.find("simd_level")->as_string());
}

TEST_CASE("sweep: its attention output is KVCache::attend's, bit for bit, +center, +rot, chanB, windows and int8 value weights included") {
    const auto d = kvq::make_dataset("llm:layers=1,kv_heads=2,q_per_kv=2,tokens=256,query_positions=1");
    const int dim = d.head_dim, g = d.group();
    constexpr int kBlock = 32;
    constexpr uint64_t kSeed = 7;
    // Both must hold the same bytes: quantized on append, or (centered keys) a whole number of sealed blocks.
    struct Case {
        const char* pair;
        kvq::SealPolicy seal;
        size_t n;
    };
    const Case cases[] = {
        {"q8_0/q4_0", kvq::SealPolicy::on_append, 250},
        {"turbo4/q4_0", kvq::SealPolicy::on_append, 250},
        {"polar/turbo3", kvq::SealPolicy::on_append, 250},
        {"q4_0+rot+center/q4_0", kvq::SealPolicy::on_block_full, 256},
        {"q4_1+center/q8_0", kvq::SealPolicy::on_block_full, 256},
        {"turbo4+center/turbo4", kvq::SealPolicy::on_block_full, 256},
        {"turbo3:scale=ls+center/turbo3:scale=unbiased", kvq::SealPolicy::on_block_full, 256},
        {"polar+center/q4_0", kvq::SealPolicy::on_block_full, 256},
        {"chan3/q4_0", kvq::SealPolicy::on_block_full, 256},
        {"chan4/polar:budget=3.5", kvq::SealPolicy::on_block_full, 256},
        {"chan8/turbo3", kvq::SealPolicy::on_block_full, 256},
        {"q4_0+rot+sink1/q4_0", kvq::SealPolicy::on_block_full, 256},
        {"q4_0+sink3+center/q4_0", kvq::SealPolicy::on_block_full, 256},
        {"chan3+sink2/q4_0", kvq::SealPolicy::on_block_full, 256},
    };
    for (const int window : {0, 100}) {  // 100: the window starts inside a block (row 150 or 156)
        for (const bool int8 : {false, true}) {
            for (const Case& t : cases) {
                const auto f = kvq::KVFormat::parse(t.pair);
                if (int8 && f.value_codec != "q4_0") continue;
                CAPTURE(t.pair);
                CAPTURE(window);
                CAPTURE(int8);
                kvq::CacheConfig c;
                c.n_kv_heads = d.kv_heads;
                c.n_heads = d.q_heads;
                c.head_dim = dim;
                c.key_codec = f.key_codec;
                c.value_codec = f.value_codec;
                c.center_keys = f.center_keys;
                c.block_tokens = kBlock;
                c.seal = t.seal;
                c.seed = kSeed;
                c.sliding_window = {window};
                c.int8_value_weights = int8;
                kvq::KVCache cache(c);
                const auto seq = cache.add_sequence();
                cache.append(0, seq, d.k.data(), d.v.data(), t.n);
                std::vector<float> from_cache(size_t(d.q_heads) * dim);
                cache.attend(0, seq, d.q.data(), from_cache.data());

                const auto keys = kvq::detail::make_key_format(f.key_label(), dim, kBlock, {false, kSeed});
                const auto values = kvq::detail::make_value_format(kvq::Codec::make(f.value_codec, dim, kSeed), kBlock, int8);
                const size_t first = window ? t.n - window : 0, n = t.n - first;
                for (int h = 0; h < d.kv_heads; ++h) {
                    const auto k = d.keys(0, h, t.n), v = d.values(0, h, t.n), q = d.queries(0, h, 0);
                    const auto kc = kvq::detail::quantize_keys(*keys, k.data(), t.n);
                    const auto vc = kvq::detail::quantize_values(*values, v.data(), t.n);
                    std::vector<float> scores(g * n), weights(g * n), out(g * dim);
                    kvq::detail::quantized_attention(kc, vc, q.data(), g, first, t.n, d.softmax_scale(), scores.data(),
                                                     weights.data(), out.data());
                    const auto head = from_cache.begin() + h * g * dim;
                    const std::vector<float> cached(head, head + g * dim);
                    CHECK(std::memcmp(out.data(), cached.data(), out.size() * sizeof(float)) == 0);
                    // The weights, a softmax of the engine's scores, give the same output up to rounding (and
                    // up to the int8 grid's, about 1% of the output's norm here).
                    std::vector<float> rows(n * dim);
                    REQUIRE(vc.block_bytes == values->rows_bytes());  // rows back to back: no side data
                    values->read_rows({vc.rows.data(), nullptr, values->row_bytes()}, first, n, rows.data());
                    double diff = 0, norm = 0;
                    for (int i = 0; i < g; ++i) {
                        for (int j = 0; j < dim; ++j) {
                            double x = 0;
                            for (size_t r = 0; r < n; ++r) x += double(weights[i * n + r]) * rows[r * dim + j];
                            diff += (x - out[i * dim + j]) * (x - out[i * dim + j]);
                            norm += x * x;
                        }
                    }
                    CHECK(std::sqrt(diff / norm) < (int8 ? 2e-2 : 1e-5));
                }
            }
        }
    }
}

// Issue #19's bound on rounding the value weights: the output error of q8_0/q4_0 against FP32 within 10%
// of the exact weights'. Other value codecs ignore the flag.
TEST_CASE("sweep: int8 value weights add under 10% to q8_0/q4_0's output error, and change nothing else") {
    for (const char* data : {"gaussian:layers=1,kv_heads=2,tokens=512", "llm:layers=1,kv_heads=2,tokens=512"}) {
        CAPTURE(data);
        kvq::SweepOptions o;
        o.formats = kvq::parse_kv_formats("q8_0/q4_0,q8_0/q8_0");
        o.timing = false;
        const auto exact = kvq::run_sweep({kvq::make_dataset(data)}, o);
        o.int8_value_weights = true;
        const auto grid = kvq::run_sweep({kvq::make_dataset(data)}, o);
        const double e0 = row(exact, "q8_0/q4_0").errors.output_l2.mean, e1 = row(grid, "q8_0/q4_0").errors.output_l2.mean;
        CAPTURE(e0);
        CAPTURE(e1);
        CHECK(e1 != e0);
        CHECK(e1 < 1.1 * e0);
        CHECK(row(grid, "q8_0/q8_0").errors.output_l2.mean == row(exact, "q8_0/q8_0").errors.output_l2.mean);
    }
}

TEST_CASE("sweep: a sliding-window layer is measured on its window, and full and window layers are reported apart") {
    // Two layers of the same data; layer 1 has a window of 24 of the 64 tokens.
    const auto src = kvq::make_dataset("llm:layers=1,kv_heads=2,q_per_kv=2,tokens=64,query_positions=1");
    const kvq::KVData d = full_and_window(src);
    // The last 24 tokens alone, with the query at the end: what layer 1 should see.
    kvq::KVData tail = src;
    tail.name = "tail";
    tail.tokens = 24;
    tail.query_positions = {23};
    const size_t row = size_t(src.kv_heads) * src.head_dim;
    tail.k.assign(src.k.begin() + 40 * row, src.k.end());
    tail.v.assign(src.v.begin() + 40 * row, src.v.end());
    kvq::SweepOptions o;
    o.timing = false;
    o.formats = kvq::parse_kv_formats("q4_0/q4_0,turbo3/q4_0");
    const auto r = kvq::run_sweep({d, src, tail}, o).rows;
    REQUIRE(r.size() == 2 * 3 + 2 + 2);  // "two": all, full, window per format; then src and tail
    for (int f = 0; f < 2; ++f) {
        const auto &all = r[3 * f], &full = r[3 * f + 1], &window = r[3 * f + 2], &whole = r[6 + f], &last = r[8 + f];
        CHECK(all.layers == "all");
        CHECK(full.layers == "full");
        CHECK(window.layers == "window");
        CHECK(whole.layers == "all");
        CHECK(all.errors.queries == full.errors.queries + window.errors.queries);
        // Row-wise codecs: the full layer is the whole data, the window layer is the last 24 tokens alone.
        CHECK(full.errors.kl.mean == doctest::Approx(whole.errors.kl.mean).epsilon(1e-9));
        CHECK(window.errors.kl.mean == doctest::Approx(last.errors.kl.mean).epsilon(1e-9));
        CHECK(window.errors.output_l2.mean == doctest::Approx(last.errors.output_l2.mean).epsilon(1e-9));
        CHECK(std::fabs(window.errors.kl.mean - whole.errors.kl.mean) > 1e-3 * whole.errors.kl.mean);  // the window matters
        CHECK(all.errors.kl.mean == doctest::Approx(0.5 * (full.errors.kl.mean + window.errors.kl.mean)).epsilon(1e-9));
    }
    const std::string table = kvq::format_sweep(kvq::run_sweep({d}, o), kvq::TableFormat::markdown);
    CHECK(table.find("| two [window] | q4_0 | q4_0 |") != std::string::npos);
    CHECK(table.find("| two [full] | turbo3 | q4_0 |") != std::string::npos);
}

TEST_CASE("chanB keys: per-channel minimum and step per block, exact bits, and errors") {
    // Two blocks of 32 rows, head_dim 8: channel c = offset_c + token-dependent variation.
    const int d = 8, n = 40;  // the second block is partial (8 rows)
    std::vector<float> k(size_t(n) * d);
    for (int t = 0; t < n; ++t)
        for (int c = 0; c < d; ++c) k[size_t(t) * d + c] = 100.0f * (c - 3) + (c + 1) * std::sin(0.37f * t + c);
    for (int bits : {2, 3, 4, 5, 8}) {
        CAPTURE(bits);
        const auto format = kvq::detail::make_key_format("chan" + std::to_string(bits), d, 32);
        const kvq::Codec& codec = format->codec();
        CHECK(codec.row_bytes() == size_t(bits));  // d = 8 codes of `bits` bits
        const auto q = kvq::detail::quantize_keys(*format, k.data(), n);
        REQUIRE(format->side_bytes() == 4 * size_t(d));
        REQUIRE(q.rows.size() == 2 * q.block_bytes);
        for (int b = 0; b < 2; ++b) {
            const uint8_t* block = q.rows.data() + b * q.block_bytes;
            const auto* params = reinterpret_cast<const uint16_t*>(block + kvq::detail::head_block(format->rows_bytes(), format->side_bytes()).side_offset);
            const int rows = b == 0 ? 32 : 8;
            std::vector<float> y(size_t(rows) * d);
            kvq::detail::dequantize_channel_rows(block, codec.row_bytes(), rows, d, bits, params, y.data());
            for (int r = 0; r < rows; ++r) {
                for (int c = 0; c < d; ++c) {
                    const float step = kvq::detail::f16_to_f32(params[d + c]), x = k[size_t(b * 32 + r) * d + c];
                    // Half a step, plus the fp16 rounding of the minimum (|min| ≤ 600: 0.25) and of the step.
                    CHECK(std::fabs(y[size_t(r) * d + c] - x) <= 0.5f * step + 0.25f + (1 << bits) * step * 1e-3f);
                }
            }
        }
    }
    const auto f = kvq::KVFormat::parse("chan4/q4_0");
    CHECK(f.key_label() == "chan4");
    CHECK(f.key_bits(128, 32) == 5.0);
    CHECK(f.key_bits(128, 64) == 4.5);
    CHECK_THROWS_WITH_AS(kvq::KVFormat::parse("chan4+center/q4_0"), doctest::Contains("+center does not apply"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::KVFormat::parse("chan9/q4_0"), doctest::Contains("chan2 .. chan8"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(kvq::KVFormat::parse("chan4+rot/q4_0"), doctest::Contains("chan2 .. chan8"), std::invalid_argument);
    CHECK_THROWS_AS(kvq::KVFormat::parse("q4_0/chan4"), std::invalid_argument);
    std::vector<float> big(32 * 8, 1.0f);
    big[5] = 1e6f;
    CHECK_THROWS_WITH_AS(kvq::detail::quantize_keys(*kvq::detail::make_key_format("chan4", 8, 32), big.data(), 32),
                         doctest::Contains("beyond fp16"), std::invalid_argument);
    CHECK_THROWS_AS(kvq::detail::make_channel_key_codec(4, 12), kvq::BadHeadDim);  // 12 3-bit codes: not whole bytes
}

TEST_CASE("chanB keys in the sweep: scores are min + step·code dotted with q, on llm keys chan4 beats q4_0 at 5 bits") {
    kvq::SweepOptions o;
    o.formats = kvq::parse_kv_formats("chan4/f32,q4_0+rot+center/f32,q4_0/f32,chan8/f32,chan2/f32");
    o.timing = true;  // chanB rows are timed too, on a KVCache that holds them
    o.timing_repeats = 1;
    const auto r = kvq::run_sweep({kvq::make_dataset("llm:layers=1,kv_heads=2,tokens=512")}, o).rows;
    REQUIRE(r.size() == 5);
    MESSAGE("KL chan4 " << r[0].errors.kl.mean << ", q4_0+rot+center " << r[1].errors.kl.mean << ", q4_0 " << r[2].errors.kl.mean
                        << ", chan8 " << r[3].errors.kl.mean << ", chan2 " << r[4].errors.kl.mean);
    CHECK(r[0].error.empty());
    CHECK(r[0].key_bits == 5.0);
    CHECK(r[0].decode_seconds > 0.0);
    CHECK(r[1].decode_seconds > 0.0);
    CHECK(r[0].errors.kl.mean < r[2].errors.kl.mean);
    CHECK(r[3].errors.kl.mean < 0.01 * r[0].errors.kl.mean);  // 8-bit codes: far below 4-bit
    CHECK(r[4].errors.kl.mean > r[0].errors.kl.mean);
    CHECK(kvq::kv_bytes_per_token(kvq::model_preset("llama-3-8b"), kvq::KVFormat::parse("chan4/f16"), 32) ==
          doctest::Approx(32 * 8 * (128 * 4 / 8.0 + 4.0 * 128 / 32 + 256)));
}

TEST_CASE("+center on the rotating codecs: on keys with a large per-channel bias it removes what the rotation spreads") {
    kvq::SweepOptions o;
    o.timing = false;
    o.formats = kvq::parse_kv_formats("turbo4/f32,turbo4+center/f32,turbo3:scale=ls/f32,turbo3:scale=ls+center/f32,polar/f32,polar+center/f32");
    const auto r = kvq::run_sweep({kvq::make_dataset("llm:layers=1,kv_heads=2,tokens=512,key_bias=4,rope=0")}, o).rows;
    REQUIRE(r.size() == 6);
    for (size_t i = 0; i < 6; i += 2) {
        CAPTURE(r[i].format.label());
        MESSAGE(r[i].format.label() << ": KL " << r[i].errors.kl.mean << ", centered " << r[i + 1].errors.kl.mean);
        CHECK(r[i + 1].key_bits == doctest::Approx(r[i].key_bits + 0.5));
        CHECK(r[i + 1].errors.kl.mean < 0.5 * r[i].errors.kl.mean);
    }
}

TEST_CASE("sweep: a K/V|K2/V2 format measures each layer with its own pair, and times a KVCache of both") {
    const kvq::KVData d = full_and_window(kvq::make_dataset("llm:layers=1,kv_heads=2,q_per_kv=2,tokens=64,query_positions=1"));
    kvq::SweepOptions o;
    o.timing = true;
    o.timing_repeats = 1;
    o.formats = kvq::parse_kv_formats("q8_0/q8_0,q4_0+rot/q4_0,q8_0/q8_0|q4_0+rot/q4_0");
    const auto r = kvq::run_sweep({d}, o).rows;
    REQUIRE(r.size() == 9);  // all, full, window per format
    const auto &q8_full = r[1], &q4_window = r[5], &all = r[6], &full = r[7], &window = r[8];
    CHECK(all.format.label() == "q8_0/q8_0|q4_0+rot/q4_0");
    CHECK(full.errors.kl.mean == q8_full.errors.kl.mean);
    CHECK(window.errors.kl.mean == q4_window.errors.kl.mean);
    CHECK(window.errors.output_l2.mean == q4_window.errors.output_l2.mean);
    CHECK(full.key_bits == q8_full.key_bits);
    CHECK(window.value_bits == q4_window.value_bits);
    CHECK(all.key_bits == doctest::Approx(0.5 * (q8_full.key_bits + q4_window.key_bits)));
    CHECK(all.decode_seconds > 0);  // a KVCache with layer_codecs holds it
    const std::string table = kvq::format_sweep(kvq::run_sweep({d}, o), kvq::TableFormat::markdown);
    CHECK(table.find("| two [window] | q8_0\\|q4_0+rot | q8_0\\|q4_0 |") != std::string::npos);
    // Keys centered on one side only: "+center" is a layer's key spec, so a KVCache holds it and it is timed.
    o.formats = kvq::parse_kv_formats("q8_0/q8_0|q4_0+rot+center/q4_0");
    const auto half = kvq::run_sweep({d}, o).rows;
    CHECK(half[0].error.empty());
    CHECK(half[0].decode_seconds > 0);
}

TEST_CASE("sweep: block_tokens beyond what a KVCache takes is refused, naming the range (it was taken without timing)") {
    const auto data = kvq::make_dataset("llm:layers=1,kv_heads=1,tokens=64,head_dim=32");
    kvq::SweepOptions o;
    o.formats = kvq::parse_kv_formats("q4_0+center/q4_0");
    o.timing = false;
    for (const int bt : {0, -1, kvq::kMaxBlockTokens + 1, 1 << 30}) {
        CAPTURE(bt);
        o.block_tokens = bt;
        CHECK_THROWS_WITH_AS(kvq::run_sweep({data}, o), doctest::Contains("block_tokens must be in 1..4096"), std::invalid_argument);
    }
    o.block_tokens = kvq::kMaxBlockTokens;
    CHECK(kvq::run_sweep({data}, o).rows.size() == 1);
}
