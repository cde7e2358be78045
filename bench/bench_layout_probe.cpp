// What a key layout of kvq's own would buy the q8_0 scores (issue #19; docs/DESIGN.md, "what issue #19's
// 3× needs"): a probe, not a kernel of the library.
//   probe/score_q8_0_t16/avx512_vnni  4 queries against 4096 q8_0 key rows of d = 128 (in L2, as
//       codec/score_cached/q8_0/<level>), 32 rows a call, the rows stored transposed per group of 16:
//       the group's 4 × 16 fp16 block scales, then per block 8 registers' worth of bytes, register j
//       holding dword j of the 16 rows with each byte made unsigned (k + 128). A block of 16 rows is then
//       8 loads and, per query, 8 vpdpbusd against its dwords broadcast from memory, one conversion and
//       one fma: score_q8_0_rows16's work without its 8 inserts, 8 sign flips, 24 shuffles and gather.
//       The group is as many bytes as its 16 ggml rows (2176). Each score is checked against the
//       specification's order (an fma per block over exact integer sums), so the probe times a correct
//       kernel; ns/row against codec/score_cached/q8_0/avx512 and floor/int8_dot4/avx512_vnni_zmm in one
//       run says how much of the way to the integer floor the layout goes.
// A probe the CPU cannot run is reported as skipped.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "spec/half.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12 warns that the AVX-512 conversion intrinsics' own undefined operand is used uninitialized when
// they are called from a function with a target attribute (a false positive, GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace {

constexpr int kDim = 128, kBlocks = kDim / 32, kQueries = 4;
constexpr size_t kRows = 4096, kCallRows = 32, kGroupBytes = 16 * kBlocks * 34;  // 2176

struct Query {
    float d[kBlocks];
    int8_t qs[kDim];
};

struct Data {
    std::vector<uint8_t> t16;          // the transposed groups, 64-byte aligned
    std::vector<float> want;           // [query][row]: the specification's scores
    Query q[kQueries];
    uint8_t* groups() { return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(t16.data()) + 63) / 64 * 64); }
};

Data make_data() {
    Data x;
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> code(-127, 127);
    std::normal_distribution<float> scale(0.0f, 0.02f);
    std::vector<int8_t> k(kRows * kDim);
    std::vector<uint16_t> dk(kRows * kBlocks);
    for (int8_t& v : k) v = static_cast<int8_t>(code(rng));
    for (uint16_t& v : dk) v = kvq::detail::f32_to_f16(std::fabs(scale(rng)) + 1e-3f);
    for (Query& q : x.q) {
        for (float& d : q.d) d = std::fabs(scale(rng)) + 1e-3f;
        for (int8_t& v : q.qs) v = static_cast<int8_t>(code(rng));
    }
    x.t16.assign(kRows / 16 * kGroupBytes + 64, 0);
    for (size_t g = 0; g < kRows / 16; ++g) {
        uint8_t* at = x.groups() + g * kGroupBytes;
        for (int b = 0; b < kBlocks; ++b) {
            for (int r = 0; r < 16; ++r) std::memcpy(at + 32 * b + 2 * r, &dk[(16 * g + r) * kBlocks + b], 2);
            for (int j = 0; j < 8; ++j) {
                for (int r = 0; r < 16; ++r) {
                    for (int e = 0; e < 4; ++e) {
                        at[128 + 512 * b + 64 * j + 4 * r + e] =
                            static_cast<uint8_t>(k[(16 * g + r) * kDim + 32 * b + 4 * j + e] + 128);
                    }
                }
            }
        }
    }
    x.want.resize(kQueries * kRows);
    for (int i = 0; i < kQueries; ++i) {
        for (size_t r = 0; r < kRows; ++r) {
            float s = 0.0f;
            for (int b = 0; b < kBlocks; ++b) {
                int32_t dot = 0;
                for (int j = 0; j < 32; ++j) dot += k[r * kDim + 32 * b + j] * x.q[i].qs[32 * b + j];
                s = std::fma(static_cast<float>(dot), kvq::detail::f16_to_f32(dk[r * kBlocks + b]) * x.q[i].d[b], s);
            }
            x.want[i * kRows + r] = s;
        }
    }
    return x;
}

typedef int32_t Dword __attribute__((may_alias, aligned(1)));

// n_rows (a multiple of 16) transposed rows from groups against the queries, query i's scores at out[i].
__attribute__((target("avx2,f16c,fma,avx512f,avx512bw,avx512vl,avx512vnni"), noinline)) void score_t16(
    const Query* q, const uint8_t* groups, size_t n_rows, float* const* out) {
    int32_t neg[kBlocks][kQueries];  // −128·Σy: what the unsigned keys add
    for (int b = 0; b < kBlocks; ++b) {
        for (int i = 0; i < kQueries; ++i) {
            const __m256i y = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[i].qs + 32 * b)),
                                               _mm256_set1_epi8(static_cast<char>(0x80)));
            const __m256i sad = _mm256_sad_epu8(y, _mm256_setzero_si256());
            const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
            neg[b][i] = -128 * (_mm_cvtsi128_si32(_mm_add_epi64(s2, _mm_unpackhi_epi64(s2, s2))) - 128 * 32);
        }
    }
    for (size_t r0 = 0; r0 < n_rows; r0 += 16) {
        const uint8_t* g = groups + r0 / 16 * kGroupBytes;
        __m512 acc[kQueries];
        for (__m512& a : acc) a = _mm512_setzero_ps();
        for (int b = 0; b < kBlocks; ++b) {
            const __m512 dk = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(g + 32 * b)));
            __m512i kt[8];
            for (int j = 0; j < 8; ++j) kt[j] = _mm512_load_si512(g + 128 + 512 * b + 64 * j);
            for (int i = 0; i < kQueries; ++i) {
                const auto* y = reinterpret_cast<const Dword*>(q[i].qs + 32 * b);  // broadcast from memory
                __m512i s0 = _mm512_set1_epi32(neg[b][i]), s1 = _mm512_setzero_si512();
                for (int j = 0; j < 8; j += 2) {
                    s0 = _mm512_dpbusd_epi32(s0, kt[j], _mm512_set1_epi32(y[j]));
                    s1 = _mm512_dpbusd_epi32(s1, kt[j + 1], _mm512_set1_epi32(y[j + 1]));
                }
                const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
                acc[i] = _mm512_fmadd_ps(sum, _mm512_mul_ps(dk, _mm512_set1_ps(q[i].d[b])), acc[i]);
            }
        }
        for (int i = 0; i < kQueries; ++i) _mm512_storeu_ps(out[i] + r0, acc[i]);
    }
}

void score_q8_0_t16(benchmark::State& state) {
    if (!(__builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
          __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("f16c"))) {
        state.SkipWithError("this CPU lacks the instructions");
        return;
    }
    Data x = make_data();
    std::vector<float> scores(kQueries * kRows);
    float* out[kQueries];
    for (size_t r0 = 0; r0 < kRows; r0 += kCallRows) {
        for (int i = 0; i < kQueries; ++i) out[i] = scores.data() + i * kRows + r0;
        score_t16(x.q, x.groups() + r0 / 16 * kGroupBytes, kCallRows, out);
    }
    for (size_t i = 0; i < scores.size(); ++i) {
        if (scores[i] != x.want[i]) {
            state.SkipWithError("the probe's scores differ from the specification's");
            return;
        }
    }
    constexpr int kRepeats = 64;
    float call_scores[kQueries][kCallRows];
    for (int i = 0; i < kQueries; ++i) out[i] = call_scores[i];
    double seconds = 0;
    for (auto _ : state) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int p = 0; p < kRepeats; ++p) {
            for (size_t r0 = 0; r0 < kRows; r0 += kCallRows) {
                score_t16(x.q, x.groups() + r0 / 16 * kGroupBytes, kCallRows, out);
                benchmark::DoNotOptimize(call_scores);
            }
        }
        seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    const double rows = double(state.iterations()) * kRepeats * kRows;
    state.counters["ns/row"] = benchmark::Counter(seconds / rows * 1e9, benchmark::Counter::kDefaults, benchmark::Counter::kIs1000);
}

BENCHMARK(score_q8_0_t16)->Name("probe/score_q8_0_t16/avx512_vnni")->Unit(benchmark::kMillisecond);

}  // namespace
#endif
