#include "dispatch.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>

#include "cpu_levels.hpp"
#include "selfcheck.hpp"

namespace kvq {
namespace detail {

namespace {

constexpr int kLevels = 5;
constexpr SimdLevel kAllLevels[kLevels] = {SimdLevel::scalar, SimdLevel::sse2, SimdLevel::avx2, SimdLevel::avx512,
                                           SimdLevel::neon};

bool scalar_all_finite(const float* x, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) return false;
    }
    return true;
}

float scalar_finite_max_abs(const float* x, size_t n) {
    float m = 0.0f;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) return std::numeric_limits<float>::quiet_NaN();
        m = std::max(m, std::fabs(x[i]));
    }
    return m;
}

// Whether a slot holds a kernel.
bool has(const BlockKernels& b, KernelOp op) {
    switch (op) {
        case KernelOp::quantize: return b.quantize;
        case KernelOp::dequantize: return b.dequantize;
        case KernelOp::prepare_query: return b.prepare_query;
        case KernelOp::score: return b.score;
        case KernelOp::accumulate: return b.accumulate;
        case KernelOp::accumulate_grid: return b.accumulate_grid;
        case KernelOp::score_groups: return b.score_groups;
        case KernelOp::count: break;
    }
    return false;
}
bool has(const LevelKernels& k, OtherKernel o) {
    switch (o) {
        case OtherKernel::tcq_viterbi: return k.rotated.tcq_viterbi;
        case OtherKernel::softmax_update: return k.softmax;
        case OtherKernel::chan_score: return k.channel_score;
        case OtherKernel::all_finite: return k.all_finite;
        case OtherKernel::finite_max_abs: return k.finite_max_abs;
        case OtherKernel::check_ops: return k.check_ops;
        case OtherKernel::count: break;
    }
    return false;
}

template <class Row>
bool has(const Row& row, RotatedOp op) {
    switch (op) {
        case RotatedOp::quantize: return row.quantize;
        case RotatedOp::score: return row.score;
        case RotatedOp::accumulate: return row.accumulate;
        case RotatedOp::count: break;
    }
    return false;
}
bool has(const RotatedKernels& k, RotatedCodec c, RotatedOp op) {
    return c == RotatedCodec::polar ? has(k.polar, op) : has(k.row(c), op);
}

// Every slot that holds a kernel its level did not name holds the specification's (filled below, or the
// scalar level's own).
void name_gaps(LevelKernels& k) {
    for (int c = 0; c < kBlockCodecCount; ++c) {
        for (int op = 0; op < static_cast<int>(KernelOp::count); ++op) {
            const char*& name = k.codec_names[c][op];
            if (has(k.codec[c], static_cast<KernelOp>(op)) && !name) name = kSpecKernel;
        }
    }
    for (int c = 0; c < kRotatedCodecCount; ++c) {
        for (int op = 0; op < static_cast<int>(RotatedOp::count); ++op) {
            const char*& name = k.rotated_names[c][op];
            if (has(k.rotated, static_cast<RotatedCodec>(c), static_cast<RotatedOp>(op)) && !name) name = kSpecKernel;
        }
    }
    for (int o = 0; o < static_cast<int>(OtherKernel::count); ++o) {
        if (has(k, static_cast<OtherKernel>(o)) && !k.other_names[o]) k.other_names[o] = kSpecKernel;
    }
}

// A codec writing another's blocks (blocks_of, iq4_nls) decodes with that codec's kernels at this level,
// whatever they are (the level's own or, filled later, the specification's), named as that codec's: so a
// level file never names them, and a SIMD kernel added for iq4_nl serves iq4_nls too. Its quantize
// stays its own (the level's, if the level file sets one, else the specification's).
void share_decoders(LevelKernels& k) {
    for (int c = 0; c < kBlockCodecCount; ++c) {
        const int o = static_cast<int>(blocks_codec(static_cast<BlockCodec>(c)));
        if (o == c) continue;
        const BlockKernels own = k.codec[c];
        k.codec[c] = k.codec[o];
        k.codec[c].quantize = own.quantize;
        for (int op = 0; op < static_cast<int>(KernelOp::count); ++op) {
            if (op != static_cast<int>(KernelOp::quantize)) k.codec_names[c][op] = k.codec_names[o][op];
        }
    }
}

LevelKernels scalar_level() {
    LevelKernels k{};
    for (int c = 0; c < static_cast<int>(BlockCodec::count); ++c) k.codec[c] = scalar_kernels(static_cast<BlockCodec>(c));
    share_decoders(k);  // (the specification already shares them: the same functions)
    k.all_finite = scalar_all_finite;
    k.finite_max_abs = scalar_finite_max_abs;
    k.rotated = scalar_rotated_kernels();
    k.softmax = softmax_update_scalar;
    k.channel_score = channel_score_scalar;
    name_gaps(k);
    return k;
}

// Every kernel a level lacks comes from the specification, so a lookup never returns a null call.
template <class T>
void fill(T*& p, T* ref) {
    if (!p) p = ref;
}
template <class Row>
void fill_row(Row& row, const Row& ref) {
    fill(row.quantize, ref.quantize);
    fill(row.score, ref.score);
    fill(row.accumulate, ref.accumulate);
}
void fill_missing(LevelKernels& k, const LevelKernels& ref) {
    for (int c = 0; c < static_cast<int>(BlockCodec::count); ++c) {
        BlockKernels& b = k.codec[c];
        const BlockKernels& s = ref.codec[c];
        fill(b.quantize, s.quantize);
        fill(b.dequantize, s.dequantize);
        fill(b.prepare_query, s.prepare_query);
        fill(b.score, s.score);
        fill(b.accumulate, s.accumulate);
    }
    fill(k.all_finite, ref.all_finite);
    fill(k.finite_max_abs, ref.finite_max_abs);
    // the rotated codecs slot by slot: a row a level gives only some kernels runs the specification's others
    for (int c = 0; c < kTurboRows; ++c) fill_row(k.rotated.turbo_rows[c], ref.rotated.turbo_rows[c]);
    fill_row(k.rotated.polar, ref.rotated.polar);
    fill(k.rotated.tcq_viterbi, ref.rotated.tcq_viterbi);
    fill(k.softmax, ref.softmax);
    fill(k.channel_score, ref.channel_score);
    name_gaps(k);
}

struct LevelState {
    bool present = false;      // compiled, and this CPU runs it
    LevelKernels kernels{};    // gaps filled from the specification
    bool checked = false, passed = false;
    std::string finding;       // what the self-check found
    double check_ms = 0;
};

// Every level's table and check state. The tables are written once (and by the test hook); the active
// level is chosen under the mutex on first use and read lock-free afterwards.
struct Dispatch {
    std::mutex mu;
    std::array<LevelState, kLevels> levels;
    std::atomic<int> active{-1};
    std::string reason;

    Dispatch() {
        cpu_init();  // may run before libgcc's own initializer (static initialization order)
        const LevelKernels ref = scalar_level();
        for (SimdLevel l : kAllLevels) {
            LevelState& s = levels[static_cast<int>(l)];
            // A level's kernels are not even constructed on a CPU that cannot run them (its file may use
            // the wider instructions anywhere).
            const LevelKernels* k = l == SimdLevel::scalar ? &ref : cpu_runs(l) ? compiled_level(l) : nullptr;
            if (!k) continue;
            s.present = true;
            s.kernels = *k;
            share_decoders(s.kernels);
            fill_missing(s.kernels, ref);
        }
        LevelState& scalar = levels[0];
        scalar.checked = scalar.passed = true;
        scalar.finding = "the specification";
    }
};

Dispatch& dispatch() {
    static Dispatch d;
    return d;
}

thread_local int t_override = -1;

struct AddedChecks {
    std::mutex mu;
    std::vector<LevelCheck> checks;
};
AddedChecks& added_checks() {
    static AddedChecks a;  // may be used during static initialization (codec.cpp)
    return a;
}

bool selfcheck_enabled() {
    const char* env = std::getenv("KVQ_SELFCHECK");
    return !(env && std::string(env) == "0");
}

// Runs the level's self-check once (under d.mu).
bool passes(Dispatch& d, SimdLevel level) {
    LevelState& s = d.levels[static_cast<int>(level)];
    if (!s.checked) {
        const auto t0 = std::chrono::steady_clock::now();
        s.finding = level_self_check(level);
        s.check_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        s.checked = true;
        s.passed = s.finding.empty();
    }
    return s.passed;
}

// The best runnable level at or below `wanted` that passes its self-check (under d.mu).
void choose(Dispatch& d, SimdLevel wanted, std::string why) {
    const bool check = selfcheck_enabled();
    std::string fallen;
    for (int i = static_cast<int>(wanted); i >= 0; --i) {
        const SimdLevel l = static_cast<SimdLevel>(i);
        if (l == SimdLevel::neon && wanted != SimdLevel::neon) continue;
        if (!d.levels[i].present) continue;
        if (check && !passes(d, l)) {
            fallen += std::string(fallen.empty() ? "" : "; ") + std::string(simd_level_name(l)) +
                      " failed its self-check (" + d.levels[i].finding + ")";
            continue;
        }
        if (!check) why += "; self-check skipped (KVQ_SELFCHECK=0)";
        d.reason = fallen.empty() ? why : why + "; " + fallen + ": using the best level below that passes";
        d.active.store(i);
        return;
    }
}

SimdLevel best_runnable(const Dispatch& d) {
    for (int i = kLevels - 1; i >= 0; --i) {
        if (d.levels[i].present) return static_cast<SimdLevel>(i);
    }
    return SimdLevel::scalar;
}

int active_index() {
    if (t_override >= 0) return t_override;
    Dispatch& d = dispatch();
    const int a = d.active.load(std::memory_order_acquire);
    if (a >= 0) return a;
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.active.load() < 0) {
        SimdLevel wanted = best_runnable(d);
        std::string why = "the best level this CPU runs";
        // The decode benchmark (bench/bench_decode.cpp, decode_level/) measured avx512 0.7-8% slower than
        // avx2 on an Intel Xeon (Sapphire Rapids, 2 threads, f16 and q8_0/q4_0 at 32k and 128k), as the
        // issue that reported the avx512 bug had on an AMD EPYC, while its int8 kernels were avx2's. So avx2
        // is the default where both run, unless the CPU has AVX512-VNNI: that build of the level
        // (vpdpbusd scores, 512-bit value accumulate) measured as fast for f16/f16 and q8_0/q4_0 at 32k
        // with 2 threads, 1.25x for q8_0/q8_0, and 1.2x for q8_0/q4_0 on one thread in cache (issue #19).
        if (wanted == SimdLevel::avx512 && cpu_has_avx512_vnni()) {
            why = "the fastest level this CPU runs (with AVX512-VNNI)";
        } else if (wanted == SimdLevel::avx512 && d.levels[static_cast<int>(SimdLevel::avx2)].present) {
            wanted = SimdLevel::avx2;
            why = "the fastest level this CPU runs (avx512 measured slower in decode; KVQ_SIMD=avx512 selects it)";
        }
        if (const char* env = std::getenv("KVQ_SIMD"); env && *env) {
            const SimdLevel asked = parse_simd_level(env);  // an unknown name is an error
            if (d.levels[static_cast<int>(asked)].present) {
                wanted = asked;
                why = "KVQ_SIMD=" + std::string(env);
            } else {
                why = "KVQ_SIMD=" + std::string(env) + " is not compiled or not run by this CPU; the best level it runs";
            }
        }
        choose(d, wanted, why);
    }
    return d.active.load();
}

const LevelKernels& active_level() { return dispatch().levels[active_index()].kernels; }

const LevelState* present_level(SimdLevel level) {
    const LevelState& s = dispatch().levels[static_cast<int>(level)];
    return s.present ? &s : nullptr;
}

// The test hook's kernel: the real one, plus one on every score.
template <int C>
void faulty_score(const uint8_t* prep, size_t prep_bytes, int n_q, const uint8_t* rows, size_t row_stride,
                  size_t n_rows, int64_t n, float* scores, size_t score_stride) {
    scalar_kernels(static_cast<BlockCodec>(C)).score(prep, prep_bytes, n_q, rows, row_stride, n_rows, n, scores, score_stride);
    for (int i = 0; i < n_q; ++i)
        for (size_t r = 0; r < n_rows; ++r) scores[i * score_stride + r] += 1.0f;
}
template <int... C>
constexpr auto faulty_table(std::integer_sequence<int, C...>) {
    return std::array<decltype(&faulty_score<0>), sizeof...(C)>{&faulty_score<C>...};
}

}  // namespace

void add_level_check(LevelCheck check) {
    AddedChecks& a = added_checks();
    std::lock_guard<std::mutex> lock(a.mu);
    if (std::find(a.checks.begin(), a.checks.end(), check) == a.checks.end()) a.checks.push_back(check);
}

std::string level_self_check(SimdLevel level) {
    std::string finding = quick_check_level(level);
    if (!finding.empty()) return finding;
    std::vector<LevelCheck> checks;
    {
        AddedChecks& a = added_checks();
        std::lock_guard<std::mutex> lock(a.mu);
        checks = a.checks;
    }
    for (LevelCheck check : checks) {
        finding = check(level);
        if (!finding.empty()) return finding;
    }
    return {};
}

const BlockKernels* level_kernels(BlockCodec c, SimdLevel level) {
    const LevelState* s = present_level(level);
    return s ? &s->kernels.codec[static_cast<int>(c)] : nullptr;
}

bool all_finite(const float* x, size_t n) { return active_level().all_finite(x, n); }
float finite_max_abs(const float* x, size_t n) { return active_level().finite_max_abs(x, n); }
const BlockKernels& active_kernels(BlockCodec c) { return active_level().codec[static_cast<int>(c)]; }
const RotatedKernels& active_rotated_kernels() { return active_level().rotated; }
SoftmaxUpdate active_softmax() { return active_level().softmax; }

const RotatedKernels* level_rotated_kernels(SimdLevel level) {
    const LevelState* s = present_level(level);
    return s ? &s->kernels.rotated : nullptr;
}

const char* level_rotated_kernel_name(SimdLevel level, RotatedCodec c, RotatedOp op) {
    const LevelState* s = present_level(level);
    return s ? s->kernels.rotated_names[static_cast<int>(c)][static_cast<int>(op)] : nullptr;
}

ChannelScore active_channel_score() { return active_level().channel_score; }
ChannelScore level_channel_score(SimdLevel level) {
    const LevelState* s = present_level(level);
    return s ? s->kernels.channel_score : nullptr;
}

SoftmaxUpdate level_softmax(SimdLevel level) {
    const LevelState* s = present_level(level);
    return s ? s->kernels.softmax : nullptr;
}

const char* (*level_check_ops(SimdLevel level))() {
    const LevelState* s = present_level(level);
    return s ? s->kernels.check_ops : nullptr;
}

LevelOverride::LevelOverride(SimdLevel level) : previous_(t_override) {
    if (!present_level(level)) {
        throw std::invalid_argument("SIMD level '" + std::string(simd_level_name(level)) +
                                    "' is not available in this build on this CPU");
    }
    t_override = static_cast<int>(level);
}
LevelOverride::~LevelOverride() { t_override = previous_; }

void inject_kernel_fault_for_testing(SimdLevel level, BlockCodec c, bool fault) {
    Dispatch& d = dispatch();
    std::lock_guard<std::mutex> lock(d.mu);
    LevelState& s = d.levels[static_cast<int>(level)];
    if (!s.present) return;
    static constexpr auto faulty = faulty_table(std::make_integer_sequence<int, static_cast<int>(BlockCodec::count)>{});
    const LevelKernels* compiled = level == SimdLevel::scalar ? nullptr : compiled_level(level);
    LevelKernels shared;  // the level's own kernels, decoders shared as the table has them
    if (compiled) {
        shared = *compiled;
        share_decoders(shared);
    }
    const LevelKernels* real = compiled ? &shared : nullptr;
    const int ci = static_cast<int>(c), op = static_cast<int>(KernelOp::score);
    const bool own = real && real->codec[ci].score;
    s.kernels.codec[ci].score = fault ? faulty[ci] : own ? real->codec[ci].score : scalar_kernels(c).score;
    s.kernels.codec_names[ci][op] = fault ? "faulty_score (test hook)" : own ? real->codec_names[ci][op] : kSpecKernel;
    s.checked = s.passed = level == SimdLevel::scalar;
    s.finding.clear();
    d.active.store(-1);
}

}  // namespace detail

SimdLevel parse_simd_level(std::string_view name) {
    for (SimdLevel l : detail::kAllLevels) {
        if (simd_level_name(l) == name) return l;
    }
    throw std::invalid_argument("unknown SIMD level '" + std::string(name) +
                                "' (expected scalar, sse2, avx2, avx512 or neon)");
}

std::vector<SimdLevel> available_simd_levels() {
    std::vector<SimdLevel> levels;
    for (SimdLevel l : detail::kAllLevels) {
        if (detail::present_level(l)) levels.push_back(l);
    }
    return levels;
}

SimdLevel simd_level() { return static_cast<SimdLevel>(detail::active_index()); }

void force_simd_level(SimdLevel level) {
    auto& d = detail::dispatch();
    if (!detail::present_level(level)) {
        throw std::invalid_argument("SIMD level '" + std::string(simd_level_name(level)) +
                                    "' is not available in this build on this CPU");
    }
    std::lock_guard<std::mutex> lock(d.mu);
    detail::choose(d, level, "force_simd_level(" + std::string(simd_level_name(level)) + ")");
}

SimdReport simd_report() {
    const SimdLevel in_use = simd_level();  // chooses (and checks) first if nothing is chosen yet
    auto& d = detail::dispatch();
    std::lock_guard<std::mutex> lock(d.mu);
    SimdReport r;
    r.in_use = in_use;
    r.reason = d.reason;
    for (SimdLevel l : detail::kAllLevels) {
        const auto& s = d.levels[static_cast<int>(l)];
        if (!detail::compiled(l)) continue;
        SimdLevelStatus st;
        st.level = l;
        st.cpu_runs = s.present;
        st.checked = s.checked;
        st.passed = s.passed;
        st.check_ms = s.check_ms;
        st.detail = !s.present ? "this CPU lacks its instructions"
                    : !s.checked ? "not checked (not used yet)"
                    : s.passed   ? (l == SimdLevel::scalar ? s.finding : "self-check passed")
                                 : "self-check failed: " + s.finding;
        r.levels.push_back(st);
    }
    return r;
}

std::vector<SimdKernel> simd_kernel_table() {
    std::vector<SimdKernel> table;
    auto& d = detail::dispatch();
    std::lock_guard<std::mutex> lock(d.mu);
    for (SimdLevel l : detail::kAllLevels) {
        const auto& s = d.levels[static_cast<int>(l)];
        if (!s.present) continue;
        const detail::LevelKernels& k = s.kernels;
        for (int c = 0; c < detail::kBlockCodecCount; ++c) {
            for (int op = 0; op < static_cast<int>(detail::KernelOp::count); ++op) {
                if (!detail::has(k.codec[c], static_cast<detail::KernelOp>(op))) continue;
                table.push_back({l, detail::codec_name(static_cast<detail::BlockCodec>(c)), detail::kKernelOpNames[op],
                                 k.codec_names[c][op]});
            }
        }
        for (int c = 0; c < detail::kRotatedCodecCount; ++c) {
            for (int op = 0; op < static_cast<int>(detail::RotatedOp::count); ++op) {
                table.push_back({l, detail::kRotatedCodecNames[c], detail::kRotatedOpNames[op], k.rotated_names[c][op]});
            }
        }
        for (int o = 0; o < static_cast<int>(detail::OtherKernel::count); ++o) {
            if (!detail::has(k, static_cast<detail::OtherKernel>(o))) continue;
            table.push_back({l, detail::kOtherKernelNames[o].codec, detail::kOtherKernelNames[o].op, k.other_names[o]});
        }
    }
    return table;
}

}  // namespace kvq
