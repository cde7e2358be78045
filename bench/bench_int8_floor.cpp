// The integer floor of the q8_0 key scores: the int8 dot products alone (4 queries of one GQA group
// against rows of d = 128 int8 keys, the rows in L1), with the instructions kvq's kernels use and nothing
// else: no block scales, conversions, reductions or row loads from L2. ns/row here against
// codec/score_cached/q8_0/<level> (same group and d) in the same run shows how far a score kernel is from
// the CPU's integer multiply rate, on any machine:
//   floor/int8_dot4/avx2         per 32 values and query: sign_epi8, maddubs, madd (ggml's sign trick;
//                                one abs_epi8 per 32 keys)
//   floor/int8_dot4/avx2_nosign  the same without the sign operations (what ggml's trick costs; its
//                                integers are not the dot product, it times the instructions only)
//   floor/int8_dot4/avx512_vnni  one 256-bit vpdpbusd per 32 values and query, one chain per query
//   floor/int8_dot4/avx512_vnni_zmm  one 512-bit vpdpbusd per 16 rows, 4 values and query, the keys'
//                                bytes taken as registers of dword j of 16 rows and each query's dword
//                                broadcast from memory, two chains per query: the shape of
//                                score_q8_0_rows16 after its transposes (8 a row), at the CPU's rate
// A probe the CPU cannot run is reported as skipped.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <cstdint>
#include <random>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

namespace {

constexpr int kRows = 64, kDim = 128, kQueries = 4;
alignas(64) int8_t g_keys[kRows][kDim];
alignas(64) int8_t g_queries[kQueries][kDim];

void fill() {
    std::mt19937 rng(1);
    for (auto& row : g_keys)
        for (int8_t& v : row) v = static_cast<int8_t>(int(rng() % 255) - 127);
    for (auto& row : g_queries)
        for (int8_t& v : row) v = static_cast<int8_t>(int(rng() % 255) - 127);
}

template <bool Sign>
__attribute__((target("avx2"), noinline)) void dot4_avx2(int passes, __m256i* out) {
    __m256i acc[kQueries] = {};
    const __m256i one = _mm256_set1_epi16(1);
    for (int p = 0; p < passes; ++p) {
        for (int r = 0; r < kRows; ++r) {
            for (int b = 0; b < kDim / 32; ++b) {
                const __m256i k = _mm256_load_si256(reinterpret_cast<const __m256i*>(&g_keys[r][32 * b]));
                const __m256i ak = Sign ? _mm256_abs_epi8(k) : k;
                for (int i = 0; i < kQueries; ++i) {
                    __m256i y = _mm256_load_si256(reinterpret_cast<const __m256i*>(&g_queries[i][32 * b]));
                    if (Sign) y = _mm256_sign_epi8(y, k);
                    acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(ak, y), one));
                }
            }
        }
    }
    for (int i = 0; i < kQueries; ++i) out[i] = acc[i];
}

__attribute__((target("avx512f,avx512vl,avx512vnni"), noinline)) void dot4_vnni(int passes, __m256i* out) {
    __m256i acc[kQueries] = {};
    for (int p = 0; p < passes; ++p) {
        for (int r = 0; r < kRows; ++r) {
            for (int b = 0; b < kDim / 32; ++b) {
                const __m256i k = _mm256_load_si256(reinterpret_cast<const __m256i*>(&g_keys[r][32 * b]));
                for (int i = 0; i < kQueries; ++i) {
                    const __m256i y = _mm256_load_si256(reinterpret_cast<const __m256i*>(&g_queries[i][32 * b]));
                    acc[i] = _mm256_dpbusd_epi32(acc[i], k, y);
                }
            }
        }
    }
    for (int i = 0; i < kQueries; ++i) out[i] = acc[i];
}

// A register: dword j of 16 rows of one key block (8 registers a block of 16 rows, as score_q8_0_rows16's
// transposed keys); per query and register, one dpbusd against the query's dword j, broadcast.
__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline)) void dot4_vnni_zmm(int passes, __m256i* out) {
    __m512i acc[kQueries][2] = {};
    const auto* keys = reinterpret_cast<const __m512i*>(g_keys);
    constexpr int kRegs = kRows * kDim / 64;
    for (int p = 0; p < passes; ++p) {
        for (int k = 0; k < kRegs; k += 2) {
            const __m512i k0 = _mm512_load_si512(keys + k), k1 = _mm512_load_si512(keys + k + 1);
            const int at = 32 * (k / 8 % (kDim / 32)) + 4 * (k % 8);  // register k: block k/8 mod 4, dword k mod 8
            for (int i = 0; i < kQueries; ++i) {
                int32_t y0, y1;
                std::memcpy(&y0, &g_queries[i][at], 4);
                std::memcpy(&y1, &g_queries[i][at + 4], 4);
                acc[i][0] = _mm512_dpbusd_epi32(acc[i][0], k0, _mm512_set1_epi32(y0));
                acc[i][1] = _mm512_dpbusd_epi32(acc[i][1], k1, _mm512_set1_epi32(y1));
            }
        }
    }
    for (int i = 0; i < kQueries; ++i) {
        alignas(64) int32_t s[16];
        _mm512_store_si512(s, _mm512_add_epi32(acc[i][0], acc[i][1]));
        out[i] = _mm256_add_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(s)),
                                  _mm256_load_si256(reinterpret_cast<const __m256i*>(s + 8)));
    }
}

template <class Kernel>
void run(benchmark::State& state, bool supported, Kernel kernel) {
    if (!supported) {
        state.SkipWithError("this CPU lacks the instructions");
        return;
    }
    fill();
    constexpr int kPasses = 256;
    __m256i out[kQueries];
    double seconds = 0;
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        kernel(kPasses, out);
        benchmark::DoNotOptimize(out);
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double rows = double(state.iterations()) * kPasses * kRows;
    state.counters["ns/row"] = benchmark::Counter(seconds / rows * 1e9, benchmark::Counter::kDefaults, benchmark::Counter::kIs1000);
}

void avx2(benchmark::State& s) { run(s, __builtin_cpu_supports("avx2"), dot4_avx2<true>); }
void avx2_nosign(benchmark::State& s) { run(s, __builtin_cpu_supports("avx2"), dot4_avx2<false>); }
void avx512_vnni(benchmark::State& s) {
    run(s, __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"), dot4_vnni);
}

BENCHMARK(avx2)->Name("floor/int8_dot4/avx2");
BENCHMARK(avx2_nosign)->Name("floor/int8_dot4/avx2_nosign");
void avx512_vnni_zmm(benchmark::State& s) {
    run(s, __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni"), dot4_vnni_zmm);
}

BENCHMARK(avx512_vnni)->Name("floor/int8_dot4/avx512_vnni");
BENCHMARK(avx512_vnni_zmm)->Name("floor/int8_dot4/avx512_vnni_zmm");

}  // namespace
#endif
