// libFuzzer target: the C API's sizes, counts and strides (issue #36, item 3). The input picks an entry
// point and each of its size arguments: a small value, or an extreme one (0, 1, SIZE_MAX and near it,
// PTRDIFF_MAX ± 1, 2^32, 2^48, 2^62, a buffer size's breaking point for the codec's row and query bytes),
// or any 64 bits. The target works out every buffer's extent itself, in 128-bit arithmetic (not with the
// library's helper), and then
//  - an extent beyond PTRDIFF_MAX (no buffer is that large): the call gets KVQ_ERR_INVALID_ARGUMENT and the
//    outputs (small real buffers here) are untouched, and nothing past those buffers is read (ASan);
//  - every extent within a small real buffer (allocated to exactly that size): the call gets KVQ_OK and
//    the same result, bit for bit, as the same call on packed rows; bytes between strided outputs are
//    untouched; or an argument error where an argument is invalid whatever the sizes (a stride below the
//    row bytes, a negative count), with the outputs untouched;
//  - an extent that fits PTRDIFF_MAX but not the buffer is a caller's promise that cannot be checked: not
//    called.
// kvq_attend_rows_ex likewise for its q, out and mask rows (issue #50).
// The cache: append, attend_prefill, attend_batch and truncate with extreme counts are refused, nothing
// changed (token count, bytes, the attention output), or behave.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fuzzer/FuzzedDataProvider.h>
#include <string>
#include <vector>

#include "fuzz_common.hpp"
#include "kvq/kvq.h"

namespace {

using kvq::fuzz::fail;
using kvq::fuzz::require;
using u128 = unsigned __int128;

constexpr u128 kMaxBuffer = static_cast<u128>(PTRDIFF_MAX);
constexpr size_t kCap = size_t(1) << 20;  // real buffers up to 1 MiB
constexpr uint8_t kFill = 0xA5;

// (n − 1)·stride + item, 0 for n = 0, item for n = 1, in 128 bits (saturating far beyond 2^64).
u128 extent(u128 n, u128 stride, u128 item) {
    if (n == 0) return 0;
    if (n == 1) return item;
    const u128 big = u128(1) << 100;
    if (n > big / (stride + 1)) return big;
    return (n - 1) * stride + item;
}

// A count or stride: small, extreme, near a breaking point of one of `units`, or any 64 bits.
size_t pick_size(FuzzedDataProvider& in, size_t small_max, std::initializer_list<size_t> units) {
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
        case 0:
        case 1: return in.ConsumeIntegralInRange<size_t>(0, small_max);
        case 2: {
            static const size_t extremes[] = {0, 1, 2, 3, SIZE_MAX, SIZE_MAX - 1, SIZE_MAX / 2, SIZE_MAX / 2 + 1,
                                              size_t(PTRDIFF_MAX), size_t(PTRDIFF_MAX) + 1, size_t(1) << 32,
                                              (size_t(1) << 32) - 1, size_t(1) << 48, (size_t(1) << 48) + 1,
                                              size_t(1) << 62, SIZE_MAX / 3};
            return extremes[in.ConsumeIntegralInRange<size_t>(0, std::size(extremes) - 1)];
        }
        default: {
            if (in.ConsumeBool()) return in.ConsumeIntegral<size_t>();
            std::vector<size_t> u(units);
            const size_t unit = u[in.ConsumeIntegralInRange<size_t>(0, u.size() - 1)];
            const size_t top = in.ConsumeBool() ? size_t(PTRDIFF_MAX) : SIZE_MAX;
            return top / unit + in.ConsumeIntegralInRange<size_t>(0, 2) - 1;
        }
    }
}

int32_t pick_count(FuzzedDataProvider& in, int32_t small_max) {
    switch (in.ConsumeIntegralInRange<int>(0, 5)) {
        case 0: return -1;
        case 1: return INT32_MIN;
        case 2: return INT32_MAX;
        case 3: return 0;
        default: return in.ConsumeIntegralInRange<int32_t>(1, small_max);
    }
}

enum class Expect { ok, refused, unknowable };

// Every extent within kMaxBuffer and the cap: ok; any beyond kMaxBuffer: refused; else unknowable.
Expect classify(std::initializer_list<u128> extents) {
    bool beyond = false, large = false;
    for (u128 e : extents) {
        beyond |= e > kMaxBuffer;
        large |= e > kCap;
    }
    return beyond ? Expect::refused : large ? Expect::unknowable : Expect::ok;
}

bool all_bytes(const std::vector<uint8_t>& b, uint8_t v) {
    for (uint8_t x : b) {
        if (x != v) return false;
    }
    return true;
}

bool same_bits(const float* a, const float* b, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (std::isnan(a[i]) && std::isnan(b[i])) continue;
        if (std::memcmp(a + i, b + i, sizeof(float)) != 0) return false;
    }
    return true;
}

// Kernels choose their path by the stride too (AVX512-VNNI's 16-row q8_0 kernel gathers scales with int32
// offsets: strides below 2^27 only), and paths agree to float rounding, not to the bit. So the same bits
// where the strides take the packed call's path, float rounding otherwise (the inputs are in [-1, 1]).
bool same_result(const float* a, const float* ref, size_t n, size_t stride) {
    if (stride < (size_t(1) << 27)) return same_bits(a, ref, n);
    for (size_t i = 0; i < n; ++i) {
        if (std::isnan(a[i]) != std::isnan(ref[i])) return false;
        if (!std::isnan(a[i]) && std::fabs(double(a[i]) - ref[i]) > 1e-4 * (1 + std::fabs(double(ref[i])))) return false;
    }
    return true;
}

std::vector<float> gaussianish(FuzzedDataProvider& in, size_t n) {
    std::vector<float> x(n);
    uint32_t s = in.ConsumeIntegral<uint32_t>() | 1;
    for (auto& v : x) {
        s ^= s << 13, s ^= s >> 17, s ^= s << 5;
        v = static_cast<float>(static_cast<int32_t>(s)) * (1.0f / 2147483648.0f);
    }
    return x;
}

void status_is(kvq_status got, kvq_status want, const char* what) {
    if (got != want) {
        fail(std::string(what) + ": " + kvq_status_name(got) + " (wanted " + kvq_status_name(want) + "): " + kvq_last_error());
    }
}

struct Codecs {
    kvq_codec* c = nullptr;
    kvq_codec* v = nullptr;
    ~Codecs() {
        kvq_codec_destroy(c);
        kvq_codec_destroy(v);
    }
};

// Real rows at the strided positions of a buffer of exactly `bytes` bytes (kFill elsewhere), and the
// same rows packed.
struct Rows {
    std::vector<uint8_t> strided, packed;
};
Rows make_rows(const kvq_codec* c, FuzzedDataProvider& in, size_t n, size_t stride, size_t bytes) {
    const size_t rb = kvq_codec_row_bytes(c);
    const int d = kvq_codec_head_dim(c);
    Rows r;
    r.packed.assign(n * rb, 0);
    const std::vector<float> x = gaussianish(in, n * d);
    if (n) status_is(kvq_codec_quantize_rows(c, x.data(), n, r.packed.data(), 0), KVQ_OK, "quantize packed rows");
    r.strided.assign(bytes, kFill);
    for (size_t i = 0; i < n; ++i) std::memcpy(r.strided.data() + i * stride, r.packed.data() + i * rb, rb);
    for (size_t i = 0; i < n; ++i) std::memcpy(r.packed.data() + i * rb, r.strided.data() + i * stride, rb);  // overlaps
    return r;
}

void fuzz_rows(const kvq_codec* c, FuzzedDataProvider& in, int op) {
    const size_t rb = kvq_codec_row_bytes(c), qb = kvq_codec_query_bytes(c);
    const int d = kvq_codec_head_dim(c);
    const size_t fb = sizeof(float) * d;
    const size_t n_rows = pick_size(in, 6, {rb, fb});
    const size_t stride = pick_size(in, 3 * rb, {rb});
    const size_t stride_eff = stride ? stride : rb;
    const u128 rows_extent = extent(n_rows, stride_eff, rb);
    const bool bad_stride = stride != 0 && stride < rb;
    if (op == 0 || op == 1) {  // quantize_rows, dequantize_rows
        const Expect e = classify({rows_extent, u128(n_rows) * fb});
        if (e == Expect::unknowable) return;
        if (e == Expect::refused) {
            std::vector<float> x(d, 0.5f), y(d, 7.0f);
            std::vector<uint8_t> rows(rb, kFill);
            if (op == 0) {
                status_is(kvq_codec_quantize_rows(c, x.data(), n_rows, rows.data(), stride), KVQ_ERR_INVALID_ARGUMENT,
                          "quantize_rows, sizes overflowing");
                require(all_bytes(rows, kFill), "quantize_rows wrote on a refused call");
            } else {
                status_is(kvq_codec_dequantize_rows(c, rows.data(), n_rows, y.data(), stride), KVQ_ERR_INVALID_ARGUMENT,
                          "dequantize_rows, sizes overflowing");
                require(std::vector<float>(d, 7.0f) == y, "dequantize_rows wrote on a refused call");
            }
            return;
        }
        const size_t bytes = static_cast<size_t>(rows_extent);
        Rows r = make_rows(c, in, n_rows, stride_eff, bytes);
        if (op == 0) {
            const std::vector<float> x = gaussianish(in, n_rows * d);
            std::vector<uint8_t> dst(bytes, kFill), packed(n_rows * rb, 0);
            const kvq_status s = kvq_codec_quantize_rows(c, x.data(), n_rows, dst.data(), stride);
            if (bad_stride && n_rows) {
                status_is(s, KVQ_ERR_INVALID_ARGUMENT, "quantize_rows, stride below the row bytes");
                require(all_bytes(dst, kFill), "quantize_rows wrote on a refused call");
                return;
            }
            status_is(s, KVQ_OK, "quantize_rows within the buffer");
            if (n_rows) status_is(kvq_codec_quantize_rows(c, x.data(), n_rows, packed.data(), 0), KVQ_OK, "packed");
            std::vector<uint8_t> marks(bytes, 0);
            for (size_t i = 0; i < n_rows; ++i) {
                require(std::memcmp(dst.data() + i * stride_eff, packed.data() + i * rb, rb) == 0,
                        "quantize_rows: a strided row differs from the packed one");
                std::memset(marks.data() + i * stride_eff, 1, rb);
            }
            for (size_t i = 0; i < bytes; ++i) require(marks[i] || dst[i] == kFill, "quantize_rows wrote between rows");
        } else {
            std::vector<float> y(n_rows * d, 7.0f), ref(n_rows * d, 0.0f);
            const kvq_status s = kvq_codec_dequantize_rows(c, r.strided.data(), n_rows, y.data(), stride);
            if (bad_stride && n_rows) {
                status_is(s, KVQ_ERR_INVALID_ARGUMENT, "dequantize_rows, stride below the row bytes");
                return;
            }
            status_is(s, KVQ_OK, "dequantize_rows within the buffer");
            if (n_rows) status_is(kvq_codec_dequantize_rows(c, r.packed.data(), n_rows, ref.data(), 0), KVQ_OK, "packed");
            require(same_bits(y.data(), ref.data(), y.size()), "dequantize_rows: strided and packed rows differ");
        }
        return;
    }
    // score_rows (op 2), accumulate_rows (op 3): n_q, n_rows, the output's stride, the rows' stride.
    const int32_t n_q = pick_count(in, 3);
    const size_t out_stride = pick_size(in, 10, {sizeof(float), 1});
    const u128 nq = n_q < 0 ? 0 : u128(n_q);
    const u128 out_extent = extent(nq, out_stride, n_rows) * sizeof(float);
    const bool nothing = n_q <= 0 || n_rows == 0;
    const bool invalid = n_q < 0 || (!nothing && (bad_stride || (n_q > 1 && out_stride < n_rows)));
    const Expect e = nothing || invalid ? Expect::ok
                                        : classify({rows_extent, out_extent, nq * qb, nq * fb});
    if (e == Expect::unknowable) return;
    // Buffers of the real extents where the call is to succeed; of one row and query where it is refused.
    const bool real = e == Expect::ok && !nothing && !invalid;
    const size_t n_q_real = real ? size_t(n_q) : 1;
    const size_t rows_real = real ? size_t(rows_extent) : rb;
    const size_t n_real = real ? n_rows : 1;
    const size_t out_real = real ? size_t(out_extent / sizeof(float)) : 1;
    const size_t stride_real = real ? stride_eff : rb;
    Rows r = make_rows(c, in, n_real, stride_real, rows_real);
    const std::vector<float> q = gaussianish(in, n_q_real * d);
    std::vector<uint8_t> prep(n_q_real * qb);
    status_is(kvq_codec_prepare_queries(c, q.data(), static_cast<int32_t>(n_q_real), prep.data()), KVQ_OK, "prepare");
    const bool expect_ok = e == Expect::ok && !invalid;
    if (op == 2) {
        std::vector<float> scores(out_real, 7.0f);
        const kvq_status s = kvq_codec_score_rows(c, prep.data(), n_q, r.strided.data(), n_rows, scores.data(), out_stride, stride);
        if (!expect_ok) {
            status_is(s, KVQ_ERR_INVALID_ARGUMENT, "score_rows, sizes overflowing or invalid");
            require(std::vector<float>(out_real, 7.0f) == scores, "score_rows wrote on a refused call");
            return;
        }
        status_is(s, KVQ_OK, "score_rows within the buffers");
        if (nothing) return;
        std::vector<float> ref(n_q_real * n_rows);
        status_is(kvq_codec_score_rows(c, prep.data(), n_q, r.packed.data(), n_rows, ref.data(), n_rows, 0), KVQ_OK,
                  "packed score_rows");
        std::vector<uint8_t> marks(out_real, 0);
        for (size_t i = 0; i < n_q_real; ++i) {
            require(same_result(scores.data() + i * out_stride, ref.data() + i * n_rows, n_rows, stride_eff),
                    std::string("score_rows: strided and packed scores differ (") + kvq_codec_name(c) + ", n_q " +
                        std::to_string(n_q) + ", n_rows " + std::to_string(n_rows) + ", score_stride " +
                        std::to_string(out_stride) + ", row_stride " + std::to_string(stride) + ")");
            std::memset(marks.data() + i * out_stride, 1, n_rows);
        }
        for (size_t i = 0; i < out_real; ++i) require(marks[i] || scores[i] == 7.0f, "score_rows wrote between rows");
    } else {
        std::vector<float> w(out_real, 0.25f), acc(n_q_real * d, 0.0f), ref(n_q_real * d, 0.0f);
        const std::vector<float> wv = gaussianish(in, out_real);
        w = wv;
        const kvq_status s = kvq_codec_accumulate_rows(c, w.data(), out_stride, n_q, r.strided.data(), n_rows, acc.data(), stride);
        if (!expect_ok) {
            status_is(s, KVQ_ERR_INVALID_ARGUMENT, "accumulate_rows, sizes overflowing or invalid");
            require(std::vector<float>(n_q_real * d, 0.0f) == acc, "accumulate_rows wrote on a refused call");
            return;
        }
        status_is(s, KVQ_OK, "accumulate_rows within the buffers");
        if (nothing) return;
        std::vector<float> packed_w(n_q_real * n_rows);
        for (size_t i = 0; i < n_q_real; ++i) std::memcpy(&packed_w[i * n_rows], &w[i * out_stride], n_rows * sizeof(float));
        status_is(kvq_codec_accumulate_rows(c, packed_w.data(), n_rows, n_q, r.packed.data(), n_rows, ref.data(), 0), KVQ_OK,
                  "packed accumulate_rows");
        require(same_result(acc.data(), ref.data(), acc.size(), stride_eff),
                std::string("accumulate_rows: strided and packed sums differ (") + kvq_codec_name(c) + ", n_q " +
                    std::to_string(n_q) + ", n_rows " + std::to_string(n_rows) + ", w_stride " + std::to_string(out_stride) +
                    ", row_stride " + std::to_string(stride) + ")");
    }
}

void fuzz_attend_rows(const Codecs& cs, FuzzedDataProvider& in) {
    const kvq_codec *kc = cs.c, *vc = cs.v;
    const size_t kb = kvq_codec_row_bytes(kc), vb = kvq_codec_row_bytes(vc);
    const int d = kvq_codec_head_dim(kc);
    const int32_t n_kv = in.ConsumeBool() ? in.ConsumeIntegralInRange<int32_t>(1, 3) : pick_count(in, 3);
    const int32_t g = in.ConsumeIntegralInRange<int32_t>(1, 2);
    const int32_t n_heads = n_kv > 0 && n_kv <= 3 ? n_kv * g : pick_count(in, 6);
    const size_t n_tokens = pick_size(in, 5, {kb, vb});
    size_t ts[2], hs[2];
    for (int i = 0; i < 2; ++i) {
        hs[i] = pick_size(in, 3 * (i ? vb : kb), {i ? vb : kb});
        ts[i] = pick_size(in, 8 * (i ? vb : kb), {i ? vb : kb});
    }
    const bool heads_ok = n_kv > 0 && n_heads > 0 && n_heads % n_kv == 0 && n_heads <= 6;
    if (!heads_ok) {
        if (n_heads > 0 && n_heads <= 6) {  // q and out are real: a bad head count is refused
            std::vector<float> q(size_t(n_heads) * d, 0.5f), out(size_t(n_heads) * d, 7.0f);
            uint8_t k[1] = {kFill}, v[1] = {kFill};
            status_is(kvq_attend_rows(kc, vc, n_heads, n_kv, q.data(), k, ts[0], hs[0], v, ts[1], hs[1], n_tokens, 0.0f, out.data()),
                      KVQ_ERR_INVALID_ARGUMENT, "attend_rows, bad head counts");
            require(std::vector<float>(out.size(), 7.0f) == out, "attend_rows wrote on a refused call");
        }
        return;
    }
    const size_t hk = hs[0] ? hs[0] : kb, hv = hs[1] ? hs[1] : vb;
    const size_t tk = ts[0] ? ts[0] : size_t(n_kv) * kb, tv = ts[1] ? ts[1] : size_t(n_kv) * vb;
    const u128 ek = extent(n_tokens, tk, extent(n_kv, hk, kb)), ev = extent(n_tokens, tv, extent(n_kv, hv, vb));
    const bool invalid = n_tokens > 1 && (tk < kb || tv < vb);
    const Expect e = invalid ? Expect::ok : classify({ek, ev});
    if (e == Expect::unknowable) return;
    const std::vector<float> q = gaussianish(in, size_t(n_heads) * d);
    std::vector<float> out(size_t(n_heads) * d, 7.0f);
    if (e == Expect::refused || invalid) {
        std::vector<uint8_t> k(kb, kFill), v(vb, kFill);
        status_is(kvq_attend_rows(kc, vc, n_heads, n_kv, q.data(), k.data(), ts[0], hs[0], v.data(), ts[1], hs[1], n_tokens,
                                  0.0f, out.data()),
                  KVQ_ERR_INVALID_ARGUMENT, "attend_rows, sizes overflowing or invalid");
        require(std::vector<float>(out.size(), 7.0f) == out, "attend_rows wrote on a refused call");
        return;
    }
    // Real rows at every (token, head) position, and the same rows packed as [token][kv head].
    const size_t n_rows = n_tokens * n_kv;
    std::vector<uint8_t> k(size_t(ek), kFill), v(size_t(ev), kFill), kp(n_rows * kb), vp(n_rows * vb);
    Rows kr = make_rows(kc, in, n_rows, kb, n_rows * kb), vr = make_rows(vc, in, n_rows, vb, n_rows * vb);
    for (size_t t = 0; t < n_tokens; ++t) {
        for (int32_t h = 0; h < n_kv; ++h) {
            std::memcpy(k.data() + t * tk + h * hk, kr.packed.data() + (t * n_kv + h) * kb, kb);
            std::memcpy(v.data() + t * tv + h * hv, vr.packed.data() + (t * n_kv + h) * vb, vb);
        }
    }
    for (size_t t = 0; t < n_tokens; ++t) {  // what the strided buffers hold, overlaps included
        for (int32_t h = 0; h < n_kv; ++h) {
            std::memcpy(kp.data() + (t * n_kv + h) * kb, k.data() + t * tk + h * hk, kb);
            std::memcpy(vp.data() + (t * n_kv + h) * vb, v.data() + t * tv + h * hv, vb);
        }
    }
    status_is(kvq_attend_rows(kc, vc, n_heads, n_kv, q.data(), k.data(), ts[0], hs[0], v.data(), ts[1], hs[1], n_tokens, 0.0f,
                              out.data()),
              KVQ_OK, "attend_rows within the buffers");
    std::vector<float> ref(out.size());
    status_is(kvq_attend_rows(kc, vc, n_heads, n_kv, q.data(), kp.data(), 0, 0, vp.data(), 0, 0, n_tokens, 0.0f, ref.data()),
              KVQ_OK, "packed attend_rows");
    require(same_result(out.data(), ref.data(), out.size(), std::max({tk, tv, hk, hv})),
            "attend_rows: strided and packed rows give other outputs");
}

// kvq_attend_rows_ex (issue #50): every count and stride of k, v, q, out and the mask at the extremes.
// Each buffer's extent in 128 bits: beyond PTRDIFF_MAX (or an argument invalid whatever the sizes: a token
// stride below a row, mask rows shorter than n_tokens, results that overlap), INVALID_ARGUMENT with out
// untouched and nothing read past the small buffers; within buffers of exactly that size, KVQ_OK and the
// packed call's result, nothing written between the results.
void fuzz_attend_rows_ex(const Codecs& cs, FuzzedDataProvider& in) {
    const kvq_codec *kc = cs.c, *vc = cs.v;
    const size_t kb = kvq_codec_row_bytes(kc), vb = kvq_codec_row_bytes(vc);
    const size_t d = size_t(kvq_codec_head_dim(kc)), fd = d * sizeof(float);
    const int32_t n_kv = in.ConsumeIntegralInRange<int32_t>(1, 2), n_heads = n_kv * in.ConsumeIntegralInRange<int32_t>(1, 2);
    const size_t heads = size_t(n_heads);
    const size_t n_tokens = pick_size(in, 4, {kb, vb, 2, 4});
    size_t ts[2], hs[2];
    for (int i = 0; i < 2; ++i) {
        hs[i] = pick_size(in, 3 * (i ? vb : kb), {i ? vb : kb});
        ts[i] = pick_size(in, 8 * (i ? vb : kb), {i ? vb : kb});
    }
    kvq_attend_options o = kvq_attend_options_default();
    o.n_queries = pick_size(in, 3, {fd, heads * fd, 2 * n_tokens + 1});
    o.q_head_stride = pick_size(in, 3 * d, {4, fd});
    o.q_row_stride = pick_size(in, 4 * heads * d, {4, fd});
    o.out_head_stride = pick_size(in, 3 * d, {4, fd});
    o.out_row_stride = pick_size(in, 4 * heads * d, {4, fd});
    const bool with_mask = in.ConsumeBool();
    o.mask_type = in.ConsumeBool() ? KVQ_MASK_F16 : KVQ_MASK_F32;
    const size_t es = o.mask_type == KVQ_MASK_F16 ? 2 : 4;
    o.mask_row_stride = pick_size(in, 2 * n_tokens + 2, {es});
    const size_t nq = o.n_queries;

    const u128 hk = hs[0] ? hs[0] : kb, hv = hs[1] ? hs[1] : vb;
    const u128 tk = ts[0] ? ts[0] : u128(n_kv) * kb, tv = ts[1] ? ts[1] : u128(n_kv) * vb;
    const u128 qh = o.q_head_stride ? o.q_head_stride : d, qr = o.q_row_stride ? u128(o.q_row_stride) : heads * qh;
    const u128 oh = o.out_head_stride ? o.out_head_stride : d, orow = o.out_row_stride ? u128(o.out_row_stride) : heads * oh;
    const u128 mr = o.mask_row_stride ? o.mask_row_stride : n_tokens;
    const u128 ek = extent(n_tokens, tk, extent(n_kv, hk, kb)), ev = extent(n_tokens, tv, extent(n_kv, hv, vb));
    const u128 eq = extent(nq, qr * 4, extent(heads, qh * 4, fd)), eo = extent(nq, orow * 4, extent(heads, oh * 4, fd));
    const u128 em = with_mask && n_tokens > 0 ? extent(nq, mr * es, u128(n_tokens) * es) : 0;
    // Results overlap (kvq.h: they may not): the smaller stride times its count passes the larger.
    const bool overlap = [&] {
        u128 sa = oh, sb = orow, na = heads, nb = nq;
        if (na <= 1) return nb > 1 && sb < d;
        if (nb <= 1) return sa < d;
        if (sa > sb) std::swap(sa, sb), std::swap(na, nb);
        return sa < d || sb < sa * na;
    }();
    const bool invalid = (n_tokens > 1 && (tk < kb || tv < vb)) || (with_mask && n_tokens > 0 && nq > 1 && mr < n_tokens) || overlap;
    if (nq == 0) {  // nothing to do, whatever the rest
        float out = 7.0f, q = 0.5f;
        uint8_t k[1] = {kFill};
        status_is(kvq_attend_rows_ex(kc, vc, n_heads, n_kv, &q, k, ts[0], hs[0], k, ts[1], hs[1], n_tokens, &o, &out), KVQ_OK,
                  "attend_rows_ex, no query rows");
        require(out == 7.0f, "attend_rows_ex wrote with no query rows");
        return;
    }
    const Expect e = classify({ek, ev, eq, eo, em});
    if (e == Expect::refused || (invalid && e == Expect::ok)) {
        // Small real buffers: whatever is read past them, ASan sees.
        const std::vector<float> q = gaussianish(in, heads * d);
        std::vector<float> out(heads * d, 7.0f), mask(n_tokens ? 1 : 0, 0.0f);
        std::vector<uint8_t> k(kb, kFill), v(vb, kFill);
        o.mask = with_mask ? static_cast<const void*>(mask.data()) : nullptr;
        status_is(kvq_attend_rows_ex(kc, vc, n_heads, n_kv, q.data(), k.data(), ts[0], hs[0], v.data(), ts[1], hs[1], n_tokens,
                                     &o, out.data()),
                  KVQ_ERR_INVALID_ARGUMENT, "attend_rows_ex, sizes overflowing or invalid");
        require(std::vector<float>(out.size(), 7.0f) == out, "attend_rows_ex wrote on a refused call");
        return;
    }
    if (e == Expect::unknowable) return;
    // Buffers of exactly their extents, real values at the strided positions, and the same packed.
    const size_t n_rows = n_tokens * size_t(n_kv);
    Rows kr = make_rows(kc, in, n_rows, kb, n_rows * kb), vr = make_rows(vc, in, n_rows, vb, n_rows * vb);
    std::vector<uint8_t> k(size_t(ek), kFill), v(size_t(ev), kFill);
    for (size_t t = 0; t < n_tokens; ++t) {
        for (size_t h = 0; h < size_t(n_kv); ++h) {
            std::memcpy(k.data() + size_t(t * tk + h * hk), kr.packed.data() + (t * n_kv + h) * kb, kb);
            std::memcpy(v.data() + size_t(t * tv + h * hv), vr.packed.data() + (t * n_kv + h) * vb, vb);
        }
    }
    std::vector<uint8_t> kp(n_rows * kb), vp(n_rows * vb);
    for (size_t t = 0; t < n_tokens; ++t) {  // what the strided buffers hold, overlaps included
        for (size_t h = 0; h < size_t(n_kv); ++h) {
            std::memcpy(kp.data() + (t * n_kv + h) * kb, k.data() + size_t(t * tk + h * hk), kb);
            std::memcpy(vp.data() + (t * n_kv + h) * vb, v.data() + size_t(t * tv + h * hv), vb);
        }
    }
    std::vector<float> q(size_t(eq) / 4, 0.0f), qp(nq * heads * d), out(size_t(eo) / 4, 7.0f), ref(nq * heads * d, 7.0f);
    const std::vector<float> qx = gaussianish(in, nq * heads * d);
    for (size_t r = 0; r < nq; ++r) {
        for (size_t h = 0; h < heads; ++h) std::memcpy(q.data() + size_t(r * qr + h * qh), qx.data() + (r * heads + h) * d, fd);
    }
    for (size_t r = 0; r < nq; ++r) {  // overlapping queries: what the buffer holds
        for (size_t h = 0; h < heads; ++h) std::memcpy(qp.data() + (r * heads + h) * d, q.data() + size_t(r * qr + h * qh), fd);
    }
    // Mask rows of 0 or -inf (token 0 always kept), and the same packed.
    std::vector<uint8_t> mask(size_t(em), kFill), mp(nq * n_tokens * es);
    const uint16_t keep16 = 0, drop16 = 0xFC00;
    const float keep32 = 0.0f, drop32 = -INFINITY;
    for (size_t r = 0; r < nq && with_mask; ++r) {
        for (size_t t = 0; t < n_tokens; ++t) {
            const bool drop = t > 0 && in.ConsumeBool();
            std::memcpy(mask.data() + size_t(r * mr * es) + t * es, es == 2 ? static_cast<const void*>(drop ? &drop16 : &keep16)
                                                                            : static_cast<const void*>(drop ? &drop32 : &keep32), es);
        }
    }
    for (size_t r = 0; r < nq && with_mask; ++r) std::memcpy(mp.data() + r * n_tokens * es, mask.data() + size_t(r * mr * es), n_tokens * es);
    o.mask = with_mask ? mask.data() : nullptr;
    status_is(kvq_attend_rows_ex(kc, vc, n_heads, n_kv, q.data(), k.data(), ts[0], hs[0], v.data(), ts[1], hs[1], n_tokens, &o,
                                 out.data()),
              KVQ_OK, "attend_rows_ex within the buffers");
    kvq_attend_options packed = kvq_attend_options_default();
    packed.n_queries = nq;
    packed.mask_type = o.mask_type;
    packed.mask = with_mask ? mp.data() : nullptr;
    status_is(kvq_attend_rows_ex(kc, vc, n_heads, n_kv, qp.data(), kp.data(), 0, 0, vp.data(), 0, 0, n_tokens, &packed, ref.data()),
              KVQ_OK, "packed attend_rows_ex");
    std::vector<uint8_t> written(out.size(), 0);
    for (size_t r = 0; r < nq; ++r) {
        for (size_t h = 0; h < heads; ++h) {
            const size_t at = size_t(r * orow + h * oh);
            require(same_result(out.data() + at, ref.data() + (r * heads + h) * d, d, size_t(std::max({tk, tv, hk, hv}))),
                    "attend_rows_ex: strided and packed buffers give other outputs");
            std::fill(written.begin() + at, written.begin() + at + d, uint8_t{1});
        }
    }
    for (size_t i = 0; i < out.size(); ++i) require(written[i] || out[i] == 7.0f, "attend_rows_ex wrote between the results");
}

void fuzz_cache(FuzzedDataProvider& in) {
    enum { KV = 2, H = 4, D = 32, T = 5 };
    kvq_cache_params p = kvq_cache_params_default();
    p.n_kv_heads = KV;
    p.n_heads = H;
    p.head_dim = D;
    p.block_tokens = 4;
    p.seal = in.ConsumeBool() ? KVQ_SEAL_ON_APPEND : KVQ_SEAL_ON_BLOCK_FULL;
    kvq_cache* cache = nullptr;
    status_is(kvq_cache_create(&p, &cache), KVQ_OK, "cache create");
    int64_t seq = 0;
    status_is(kvq_cache_add_sequence(cache, &seq), KVQ_OK, "add_sequence");
    const std::vector<float> k = gaussianish(in, T * KV * D), v = gaussianish(in, T * KV * D), q = gaussianish(in, T * H * D);
    status_is(kvq_cache_append(cache, 0, seq, k.data(), v.data(), T), KVQ_OK, "append");
    std::vector<float> before(H * D), out(T * H * D, 7.0f);
    status_is(kvq_cache_attend(cache, 0, seq, q.data(), before.data()), KVQ_OK, "attend");
    const size_t bytes = kvq_cache_bytes_used(cache);
    const size_t n = pick_size(in, T + 1, {KV * D * sizeof(float), H * D * sizeof(float), sizeof(int64_t)});
    const int op = in.ConsumeIntegralInRange<int>(0, 3);
    kvq_status s = KVQ_OK;
    bool refused = false;
    if (op == 0) {  // append: k and v hold T tokens
        const u128 e = u128(n) * KV * D * sizeof(float);
        if (e <= kMaxBuffer && n > T) goto done;  // a promise that cannot be checked
        s = kvq_cache_append(cache, 0, seq, k.data(), v.data(), n);
        refused = e > kMaxBuffer;
    } else if (op == 1) {  // attend_prefill: q holds T queries, the layer T tokens
        const u128 e = u128(n) * H * D * sizeof(float);
        s = kvq_cache_attend_prefill(cache, 0, seq, q.data(), n, out.data());
        refused = e > kMaxBuffer || n > T;
    } else if (op == 2) {  // attend_batch: one id
        const u128 e = u128(n) * H * D * sizeof(float), ids = u128(n) * sizeof(int64_t);
        if (e <= kMaxBuffer && ids <= kMaxBuffer && n > 1) goto done;
        s = kvq_cache_attend_batch(cache, 0, &seq, n, q.data(), out.data());
        refused = e > kMaxBuffer || ids > kMaxBuffer;
    } else {  // truncate
        s = kvq_cache_truncate(cache, seq, n);
        refused = n > T;
    }
    if (refused) {
        status_is(s, KVQ_ERR_INVALID_ARGUMENT, "cache call with an overflowing or too large count");
        require(std::vector<float>(out.size(), 7.0f) == out, "a refused cache call wrote its output");
        size_t tokens = 0;
        status_is(kvq_cache_n_tokens(cache, seq, 0, &tokens), KVQ_OK, "n_tokens");
        require(tokens == T && kvq_cache_bytes_used(cache) == bytes, "a refused cache call changed the cache");
        std::vector<float> after(H * D);
        status_is(kvq_cache_attend(cache, 0, seq, q.data(), after.data()), KVQ_OK, "attend after");
        require(same_bits(after.data(), before.data(), after.size()), "a refused cache call changed attention");
    } else {
        status_is(s, KVQ_OK, "cache call within the buffers");
    }
done:
    kvq_cache_destroy(cache);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    FuzzedDataProvider in(data, size);
    static const char* const specs[] = {"q8_0", "q4_0", "q4_1+rot", "f16", "polar", "turbo3", "q5_1", "turbo2_qjl", "tcq2"};
    const int op = in.ConsumeIntegralInRange<int>(0, 6);
    if (op == 5) {
        fuzz_cache(in);
        return 0;
    }
    Codecs cs;
    const int d = in.ConsumeBool() ? 32 : 64;
    const char* key = specs[in.ConsumeIntegralInRange<size_t>(0, std::size(specs) - 1)];
    const char* value = specs[in.ConsumeIntegralInRange<size_t>(0, std::size(specs) - 1)];
    if (kvq_codec_create(key, d, KVQ_DEFAULT_SEED, &cs.c) != KVQ_OK) fail(std::string("codec ") + key);
    if (kvq_codec_create(value, d, KVQ_DEFAULT_SEED, &cs.v) != KVQ_OK) fail(std::string("codec ") + value);
    if (op == 6) {
        fuzz_attend_rows_ex(cs, in);
    } else if (op == 4) {
        fuzz_attend_rows(cs, in);
    } else {
        fuzz_rows(cs.c, in, op);
    }
    return 0;
}
