// kvq::selftest() (include/kvq/selftest.hpp): the parity grid of lib/simd/level_check.hpp (kernels) and
// lib/codec/level_checks.hpp (polar/turbo through the codec path) at every level the CPU runs, and cache
// attention at each level against the FP32 reference.
#include "kvq/selftest.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "../ref/row_codecs.hpp"
#include "../simd/dispatch.hpp"
#include "../codec/level_checks.hpp"
#include "../simd/level_check.hpp"
#include "selftest_levels.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"

namespace kvq {
namespace {

using detail::BlockCodec;

// Row counts: both sides of every boundary the kernels have (row pairs, 16/32-row steps, the 64-row
// chunk, two chunks).
constexpr size_t kRows[] = {1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129};
constexpr size_t kRowCount = sizeof kRows / sizeof kRows[0];

struct Family {
    std::string name;
    std::vector<BlockCodec> codecs;
};

// Accumulates one line: runs cases until the first failure.
struct Line {
    SelftestLine out;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
    Line(SimdLevel level, std::string family) {
        out.level = level;
        out.family = std::move(family);
        out.passed = true;
    }
    template <class F>
    void run(const std::string& what, F&& f) {
        if (!out.passed) return;
        ++out.cases;
        std::string bad;
        try {
            bad = f(out.checks);
        } catch (const std::exception& e) {
            bad = std::string("threw: ") + e.what();
        }
        if (!bad.empty()) {
            out.passed = false;
            out.detail = what + ": " + bad;
        }
    }
    SelftestLine finish() {
        out.ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        return out;
    }
};

std::string case_name(const std::string& codec, int d, size_t rows, int n_q) {
    return codec + " d=" + std::to_string(d) + " rows=" + std::to_string(rows) + " queries=" + std::to_string(n_q);
}

SelftestLine check_family(SimdLevel level, const Family& f) {
    Line line(level, f.name);
    size_t cycle = 0;
    for (BlockCodec c : f.codecs) {
        const bool plain = detail::is_plain(c);
        const std::vector<int> sizes = plain ? std::vector<int>{1, 7, 32, 33, 64, 100, 128, 250, 256}
                                             : std::vector<int>{32, 64, 96, 128, 160, 192, 224, 256};
        for (int n : sizes) {
            for (int n_q = 1; n_q <= 8; ++n_q) {
                const size_t rows = kRows[cycle++ % kRowCount];
                line.run(case_name(detail::codec_name(c), n, rows, n_q), [&](size_t& checks) {
                    return detail::check_block_codec(level, c, n, rows, n_q, cycle % 2 == 0, 1000 + cycle, checks);
                });
            }
        }
    }
    return line.finish();
}

SelftestLine check_rotated(SimdLevel level, const std::string& family, const std::vector<std::string>& specs) {
    Line line(level, family);
    size_t cycle = 0;
    for (const auto& spec : specs) {
        for (int d : {32, 64, 96, 128, 256}) {
            try {
                Codec::make(spec, d);
            } catch (const std::invalid_argument&) {
                continue;  // a polar configuration whose 2^levels does not divide d
            }
            for (int n_q : {1, 3, 4, 6, 8}) {
                const size_t rows = kRows[cycle++ % kRowCount];
                line.run(case_name(spec, d, rows, n_q), [&](size_t& checks) {
                    return detail::check_codec_path(level, spec, d, rows, n_q, 500 + cycle, checks);
                });
            }
            line.run(spec + " d=" + std::to_string(d) + " quantize, extreme rows", [&](size_t& checks) {
                return detail::check_codec_quantize(level, spec, d, 23, 900 + cycle, checks);
            });
        }
    }
    return line.finish();
}

SelftestLine check_softmax_all(SimdLevel level) {
    Line line(level, "softmax");
    for (int g = 1; g <= 8; ++g) {
        for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(9), size_t(16), size_t(24), size_t(32), size_t(64), size_t(129)}) {
            line.run("softmax g=" + std::to_string(g) + " n=" + std::to_string(n),
                     [&](size_t& checks) { return detail::check_softmax(level, g, n, 31 * g + n, checks); });
        }
    }
    return line.finish();
}

SelftestLine check_channel_scores(SimdLevel level) {
    Line line(level, "chanB scores");
    for (int bits = 2; bits <= 8; ++bits) {
        for (int d : {8, 16, 24, 128, 136}) {
            line.run("chan" + std::to_string(bits) + " d=" + std::to_string(d), [&](size_t& checks) {
                return detail::check_channel_score(level, bits, d, 7, 5, 17 * bits + d, checks);
            });
        }
    }
    return line.finish();
}

SelftestLine check_key_groups(SimdLevel level) {
    Line line(level, "q8_0 groups");
    for (int d : {32, 64, 96, 128, 256, 2048}) {
        for (bool extreme : {false, true}) {
            line.run("groups d=" + std::to_string(d) + (extreme ? " extreme" : ""), [&](size_t& checks) {
                return detail::check_score_groups(level, d, d >= 1024 ? 1 : 3, extreme, 23 * d + extreme, checks);
            });
        }
    }
    return line.finish();
}

SelftestLine check_primitives(SimdLevel level) {
    Line line(level, "primitives");
    line.run("Ops contracts", [&](size_t& checks) { return detail::check_primitives(level, checks); });
    return line.finish();
}

// Decode and prefill attention of a small cache at `level` against the FP32 reference (double) on the
// rows as stored: every token quantized when appended (SealPolicy::on_append), scores against the key
// codec's effective query.
std::string check_cache(SimdLevel level, const std::string& kc, const std::string& vc, int n_kv, int n_heads, int d,
                        size_t n_tokens, size_t& checks) {
    detail::LevelOverride at(level);
    CacheConfig cfg;
    cfg.n_layers = 1;
    cfg.n_kv_heads = n_kv;
    cfg.n_heads = n_heads;
    cfg.head_dim = d;
    cfg.key_codec = kc;
    cfg.value_codec = vc;
    cfg.block_tokens = 16;
    cfg.seal = SealPolicy::on_append;
    cfg.threads = 1;  // the level override is this thread's
    KVCache cache(cfg);
    const auto seq = cache.add_sequence();
    std::mt19937_64 rng(n_tokens * 131 + d);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const size_t row = static_cast<size_t>(n_kv) * d;
    std::vector<float> k(n_tokens * row), v(n_tokens * row), q(static_cast<size_t>(n_heads) * d);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    for (float& x : q) x = 1.5f * normal(rng);
    cache.append(0, seq, k.data(), v.data(), n_tokens);
    std::vector<float> out(q.size());
    cache.attend(0, seq, q.data(), out.data());

    const Codec keys = Codec::make(kc, d), values = Codec::make(vc, d);
    std::vector<float> kd(k.size()), vd(v.size());
    {
        std::vector<uint8_t> codes(std::max(keys.row_bytes(), values.row_bytes()));
        for (size_t t = 0; t < n_tokens * n_kv; ++t) {
            keys.quantize_rows(&k[t * d], 1, codes.data());
            keys.dequantize_rows(codes.data(), 1, &kd[t * d]);
            values.quantize_rows(&v[t * d], 1, codes.data());
            values.dequantize_rows(codes.data(), 1, &vd[t * d]);
        }
    }
    const int g = n_heads / n_kv;
    const double scale = 1.0 / std::sqrt(double(d));
    double worst = 0, size = 1e-30;
    std::vector<float> qe(d);
    std::vector<double> s(n_tokens), want(d);
    for (int h = 0; h < n_heads; ++h) {
        const int kv = h / g;
        keys.effective_query(&q[h * d], qe.data());
        double m = -INFINITY, sum = 0;
        for (size_t t = 0; t < n_tokens; ++t) {
            double dot = 0;
            for (int j = 0; j < d; ++j) dot += double(qe[j]) * kd[(t * n_kv + kv) * d + j];
            s[t] = dot * scale;
            m = std::max(m, s[t]);
        }
        std::fill(want.begin(), want.end(), 0.0);
        for (size_t t = 0; t < n_tokens; ++t) {
            const double p = std::exp(s[t] - m);
            sum += p;
            for (int j = 0; j < d; ++j) want[j] += p * vd[(t * n_kv + kv) * d + j];
        }
        for (int j = 0; j < d; ++j) {
            const double w = want[j] / sum;
            if (std::isnan(out[h * d + j])) return "cache attention: NaN in head " + std::to_string(h);
            worst = std::max(worst, std::fabs(out[h * d + j] - w));
            size = std::max(size, std::fabs(w));
        }
    }
    checks += q.size();
    if (worst / size > 1e-4) {
        char buf[160];
        std::snprintf(buf, sizeof buf, "attention differs from the FP32 reference by %.3g (relative to its largest value)",
                      worst / size);
        return buf;
    }
    return {};
}

SelftestLine check_caches(SimdLevel level) {
    Line line(level, "cache");
    struct Shape {
        int n_kv, n_heads, d;
        size_t tokens;
    };
    const char* pairs[][2] = {{"f32", "f32"}, {"f16", "f16"}, {"q8_0", "q4_0"}, {"q8_0", "q8_0"},
                              {"q4_0+rot", "q4_1"}, {"q5_0", "q5_1"}, {"turbo4", "turbo3.5"}, {"polar", "turbo2_qjl"},
                              {"tcq3", "tcq2"}};
    for (const auto& p : pairs) {
        for (const Shape& sh : {Shape{1, 1, 64, 5}, Shape{2, 8, 128, 40}, Shape{1, 4, 256, 67}, Shape{4, 12, 96, 33}}) {
            line.run(std::string(p[0]) + "/" + p[1] + " kv_heads=" + std::to_string(sh.n_kv) + " heads=" +
                         std::to_string(sh.n_heads) + " d=" + std::to_string(sh.d) + " tokens=" + std::to_string(sh.tokens),
                     [&](size_t& checks) { return check_cache(level, p[0], p[1], sh.n_kv, sh.n_heads, sh.d, sh.tokens, checks); });
        }
    }
    return line.finish();
}

}  // namespace

namespace {

SelftestResult selftest_at(const std::vector<SimdLevel>& levels, const std::function<void(const SelftestLine&)>& on_line) {
    SelftestResult result;
    auto add = [&](SelftestLine l) {
        if (on_line) on_line(l);
        result.lines.push_back(std::move(l));
    };
    // The plain codecs on one line, each block codec on its own: every row of the codec table is checked.
    std::vector<Family> families = {{"f32/f16/bf16", {}}};
    // The turbo family's rows on one line too.
    std::vector<std::string> turbo;
    for (const auto& t : detail::kRowCodecs) {
        if (t.family == detail::CodecFamily::turbo) turbo.push_back(t.name);
        if (t.family != detail::CodecFamily::block) continue;
        if (t.plain) families[0].codecs.push_back(t.id);
        else families.push_back({t.name, {t.id}});
    }
    const std::vector<std::string> polar = {"polar", "polar:bits=4.3.3.3", "polar:bits=2.1.0.1", "polar:bits=6.3.2.2.2",
                                            "polar:budget=3", "polar:bits=4.2"};
    for (SimdLevel level : levels) {
        if (level != SimdLevel::scalar) {
            add(check_primitives(level));
            for (const auto& f : families) add(check_family(level, f));
            add(check_rotated(level, "turbo", turbo));
            add(check_rotated(level, "polar", polar));
            add(check_softmax_all(level));
            add(check_channel_scores(level));
            add(check_key_groups(level));
        }
        add(check_caches(level));
    }
    return result;
}

}  // namespace

SelftestResult selftest(const std::function<void(const SelftestLine&)>& on_line) {
    return selftest_at(available_simd_levels(), on_line);
}

SelftestResult detail::selftest_levels(const std::vector<SimdLevel>& levels, const std::function<void(const SelftestLine&)>& on_line) {
    return selftest_at(levels, on_line);
}

std::string format_selftest_line(const SelftestLine& l) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%-7s %-13s %-4s %6zu cases %9zu values %8.1f ms", std::string(simd_level_name(l.level)).c_str(),
                  l.family.c_str(), l.passed ? "ok" : "FAIL", l.cases, l.checks, l.ms);
    return l.passed ? std::string(buf) : std::string(buf) + "  " + l.detail;
}

}  // namespace kvq
