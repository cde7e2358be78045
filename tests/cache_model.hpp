// A model of what a KVCache layer must compute, built from the public codec API only: the tokens a test
// appended, which of them are quantized (sealed) and which still exact, and the block key means when
// keys are centered. Expected attention is kvq::reference_attention on the dequantized rows.
//
// Sealed keys are scored against the key codec's effective query, exact (staged) keys against the query
// itself, and centered blocks add q·mean back. One reference call covers all three with doubled rows:
//   q' = [effective_query(q), q],  k' = [dequantized key (minus mean), 0 or mean]  (sealed)
//                                  k' = [0, k]                                      (exact)
// so q'·k' is exactly the score the cache should compute; v' = [v or its dequantized row, 0].
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "ref/half.hpp"
#include "kvq/cache.hpp"
#include "kvq/research/eval.hpp"
#include "test_util.hpp"

namespace kvq::test {

// Tokens of one sequence in one layer, as appended: n × n_kv × d floats each.
struct LayerTokens {
    int n_kv = 0, d = 0;
    std::vector<float> k, v;
    LayerTokens(int kv_heads, int head_dim) : n_kv(kv_heads), d(head_dim) {}
    size_t n() const { return k.size() / (static_cast<size_t>(n_kv) * d); }
    void add(const float* kk, const float* vv, size_t count) {
        k.insert(k.end(), kk, kk + count * n_kv * d);
        v.insert(v.end(), vv, vv + count * n_kv * d);
    }
    void truncate(size_t count) {
        k.resize(count * n_kv * d);
        v.resize(count * n_kv * d);
    }
    const float* krow(size_t t, int h) const { return &k[(t * n_kv + h) * d]; }
    const float* vrow(size_t t, int h) const { return &v[(t * n_kv + h) * d]; }

    // Per-channel keys (chanB): each sealed block's per-channel minimum and step (per kv head: d minimums,
    // d steps, fp16-rounded), fixed when the block is sealed.
    std::map<size_t, std::vector<float>> chan_params;
    // Key j of row t (kv head h) as a sealed chanB block holds it: min + step·(nearest code, clamped).
    float chan_key(size_t t, int h, int j, size_t bt, int bits) const {
        const float* p = &chan_params.at(t / bt)[static_cast<size_t>(h) * 2 * d];
        const float inv = p[d + j] > 0 ? 1.0f / p[d + j] : 0.0f;
        return p[j] + p[d + j] * std::clamp(std::round((krow(t, h)[j] - p[j]) * inv), 0.0f, static_cast<float>((1 << bits) - 1));
    }
    // A chanB block re-opened by a truncate, rows [block·bt, end) kept: the next append moves them back to
    // the staging as they read (keys min + step·code, values the value codec's rows); the block seals anew.
    void restage_channels(size_t block, size_t bt, size_t end, int bits, const Codec& vc) {
        std::vector<uint8_t> vb(vc.row_bytes());
        for (size_t t = block * bt; t < end; ++t) {
            for (int h = 0; h < n_kv; ++h) {
                for (int j = 0; j < d; ++j) k[(t * n_kv + h) * d + j] = chan_key(t, h, j, bt, bits);
                vc.quantize_rows(vrow(t, h), 1, vb.data());
                vc.dequantize_rows(vb.data(), 1, &v[(t * n_kv + h) * d]);
            }
        }
        chan_params.erase(block);
    }
    void seal_channels(size_t block, size_t bt, int bits) {
        std::vector<float>& p = chan_params[block];
        p.assign(static_cast<size_t>(n_kv) * 2 * d, 0.0f);
        const auto f16 = [](float x) { return detail::f16_to_f32(detail::f32_to_f16(x)); };
        for (int h = 0; h < n_kv; ++h) {
            for (int j = 0; j < d; ++j) {
                float lo = krow(block * bt, h)[j], hi = lo;
                for (size_t t = block * bt; t < (block + 1) * bt; ++t) lo = std::min(lo, krow(t, h)[j]), hi = std::max(hi, krow(t, h)[j]);
                p[(h * 2) * d + j] = f16(lo);
                p[(h * 2 + 1) * d + j] = f16((hi - lo) / static_cast<float>((1 << bits) - 1));
            }
        }
    }
};

// B of a chanB key codec, 0 for any other.
inline int channel_bits(const Codec& kc) { return kc.info().per_channel ? kc.name()[4] - '0' : 0; }

// Random tokens: keys N(0,1) plus an optional per-channel bias (a k_proj bias), values N(0,1).
inline void random_tokens(size_t n, int n_kv, int d, uint64_t seed, std::vector<float>& k, std::vector<float>& v,
                          float key_bias = 0.0f) {
    k = gaussian(n * n_kv * d, seed);
    v = gaussian(n * n_kv * d, seed ^ 0x5bd1e995u);
    if (key_bias != 0.0f) {
        const auto bias = gaussian(static_cast<size_t>(d), 77);
        for (size_t i = 0; i < k.size(); ++i) k[i] += key_bias * bias[i % d];
    }
}

// Expected decode attention of query vectors q (n_heads × d) over positions [lo, hi) of `tok`, when
// positions below sealed_end are quantized (block by block from position 0) and the rest exact.
// kc, vc: the codecs of cfg (the cache's own, which are expensive to make for some codecs).
inline std::vector<float> expected_attention(const CacheConfig& cfg, const Codec& kc, const Codec& vc,
                                             const LayerTokens& tok, size_t lo, size_t hi, size_t sealed_end,
                                             const float* q) {
    const int d = cfg.head_dim, n_kv = cfg.n_kv_heads, g = cfg.n_heads / cfg.n_kv_heads;
    const size_t bt = cfg.block_tokens, n = hi - lo;
    const float scale = cfg.scale > 0 ? cfg.scale : 1.0f / std::sqrt(static_cast<float>(d));
    std::vector<float> out(static_cast<size_t>(cfg.n_heads) * d);
    std::vector<uint8_t> kb(kc.row_bytes()), vb(vc.row_bytes());
    for (int h = 0; h < n_kv; ++h) {
        std::vector<float> qq(static_cast<size_t>(g) * 2 * d), kk(n * 2 * d, 0.0f), vv(n * 2 * d, 0.0f);
        for (int i = 0; i < g; ++i) {
            const float* qi = q + static_cast<size_t>(h * g + i) * d;
            if (channel_bits(kc)) {
                std::copy(qi, qi + d, &qq[i * 2 * d]);  // scored against the query itself (scaled per block)
            } else {
                kc.effective_query(qi, &qq[i * 2 * d]);
            }
            std::copy(qi, qi + d, &qq[i * 2 * d + d]);
        }
        std::vector<float> mean(d, 0.0f), row(d);
        size_t mean_block = SIZE_MAX;
        for (size_t r = 0; r < n; ++r) {
            const size_t t = lo + r;
            float* kr = &kk[r * 2 * d];
            float* vr = &vv[r * 2 * d];
            if (t >= sealed_end) {
                std::copy(tok.krow(t, h), tok.krow(t, h) + d, kr + d);
                std::copy(tok.vrow(t, h), tok.vrow(t, h) + d, vr);
                continue;
            }
            if (cfg.center_keys && t / bt != mean_block) {  // the mean of the block's keys, rounded to fp16
                mean_block = t / bt;
                for (int j = 0; j < d; ++j) {
                    double s = 0;
                    for (size_t u = mean_block * bt; u < (mean_block + 1) * bt; ++u) s += tok.krow(u, h)[j];
                    mean[j] = detail::f16_to_f32(detail::f32_to_f16(static_cast<float>(s / bt)));
                }
            }
            if (const int bits = channel_bits(kc)) {  // min + step·(nearest code, clamped)
                for (int j = 0; j < d; ++j) kr[j] = tok.chan_key(t, h, j, bt, bits);
                vc.quantize_rows(tok.vrow(t, h), 1, vb.data());
                vc.dequantize_rows(vb.data(), 1, vr);
                continue;
            }
            for (int j = 0; j < d; ++j) row[j] = tok.krow(t, h)[j] - mean[j];
            kc.quantize_rows(row.data(), 1, kb.data());
            kc.dequantize_rows(kb.data(), 1, kr);
            std::copy(mean.begin(), mean.end(), kr + d);
            vc.quantize_rows(tok.vrow(t, h), 1, vb.data());
            vc.dequantize_rows(vb.data(), 1, vr);
        }
        std::vector<float> o(static_cast<size_t>(g) * 2 * d);
        if (cfg.softcap == 0) {
            reference_attention(qq.data(), g, kk.data(), vv.data(), n, 2 * d, scale, o.data());
        } else {  // reference_attention has no soft-cap: the same maths in double
            for (int i = 0; i < g; ++i) {
                std::vector<double> s(n);
                double m = -INFINITY, sum = 0;
                for (size_t r = 0; r < n; ++r) {
                    double dot = 0;
                    for (int j = 0; j < 2 * d; ++j) dot += double(qq[i * 2 * d + j]) * kk[r * 2 * d + j];
                    s[r] = cfg.softcap * std::tanh(dot * scale / cfg.softcap);
                    m = std::max(m, s[r]);
                }
                for (size_t r = 0; r < n; ++r) sum += (s[r] = std::exp(s[r] - m));
                for (int j = 0; j < d; ++j) {
                    double acc = 0;
                    for (size_t r = 0; r < n; ++r) acc += s[r] * vv[r * 2 * d + j];
                    o[i * 2 * d + j] = static_cast<float>(acc / sum);
                }
            }
        }
        for (int i = 0; i < g; ++i) std::copy(&o[i * 2 * d], &o[i * 2 * d] + d, &out[(h * g + i) * d]);
    }
    return out;
}

// Layer `layer`'s tokens in `cache` (its own codecs, CacheConfig::layer_codecs).
inline std::vector<float> expected_attention(const KVCache& cache, const LayerTokens& tok, size_t lo, size_t hi,
                                             size_t sealed_end, const float* q, int layer = 0) {
    return expected_attention(cache.config(), cache.key_codec(layer), cache.value_codec(layer), tok, lo, hi, sealed_end, q);
}

// Positions below this are quantized in a cache that was only appended to (no truncation into a block):
// every full block whose tokens are all more than exact_tail_tokens old.
inline size_t sealed_end(const CacheConfig& cfg, size_t n) {
    if (cfg.seal == SealPolicy::on_append) return n;
    const size_t tail = static_cast<size_t>(cfg.exact_tail_tokens);
    return n > tail ? (n - tail) / cfg.block_tokens * cfg.block_tokens : 0;
}

// Largest |a − b| relative to the largest |b| (at least 1): float rounding is ~1e-6 here, a wrong row
// or weight is ~1e-2.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    double diff = 0, scale = 1;
    for (size_t i = 0; i < a.size(); ++i) {
        diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
        if (std::isnan(a[i]) != std::isnan(b[i])) return INFINITY;
    }
    return diff / scale;
}

inline constexpr double kFloatRounding = 2e-5;

}  // namespace kvq::test
