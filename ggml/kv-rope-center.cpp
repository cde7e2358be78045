// KVQ_KV_FORMATS' +ropecenter keys (kv-rope-center.hpp).
#include "kv-rope-center.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace kvq_ggml {

std::string setup_rope_center(KvFormat& f, const LayerCalibration& l, const kvq::Codec& codec, std::vector<double>& var) {
    const int64_t d = f.head_dim, width = l.width, heads = width / d;
    const std::vector<float>& qsq = l.qsq;
    if (l.rope_mode < 0) {
        return "the calibration file has no moments before the RoPE for layer " + std::to_string(f.layer) +
               " (+ropecenter needs a calibration written by this plugin's version 2)";
    }
    f.rope_mode = l.rope_mode;
    f.rope_dims = l.rope_dims;
    const int64_t n_pairs = l.rope_dims / 2;
    const auto ch = [&](int64_t i, bool second) { return l.rope_mode == GGML_ROPE_TYPE_NEOX ? i + (second ? n_pairs : 0) : 2 * i + (second ? 1 : 0); };
    f.rmean.assign(static_cast<size_t>(width), 0.0f);
    f.rope_pairs.assign(static_cast<size_t>(heads), {});
    for (int64_t h = 0; h < heads; ++h) {
        // A pair's stored energy around a fixed mean (kvar) against around its own mean turned to the
        // position (rvar; a turn keeps a pair's energy), weighted by the queries' energy there.
        std::vector<std::pair<double, int32_t>> gain;
        for (int64_t i = 0; i < n_pairs; ++i) {
            const int64_t a = h * d + ch(i, false), b = h * d + ch(i, true);
            gain.emplace_back((qsq[a] + qsq[b]) * ((l.kvar[a] + l.kvar[b]) - (l.rvar[a] + l.rvar[b])), static_cast<int32_t>(i));
        }
        std::sort(gain.begin(), gain.end(), [](const auto& x, const auto& y) { return x.first > y.first || (x.first == y.first && x.second < y.second); });
        for (size_t k = 0; k < gain.size() && k < kRopePairs && gain[k].first > 0; ++k) {
            const int32_t i = gain[k].second;
            f.rope_pairs[static_cast<size_t>(h)].push_back(i);
            for (const bool second : {false, true}) {
                const int64_t j = h * d + ch(i, second);
                f.rmean[j] = l.rmean[j];
                f.mean[j] = 0.0f;
            }
            // What is stored there: the pre-RoPE residual turned by the position, which mixes
            // the pair's two channels (the faster the pair turns, the more).
            const int64_t a = h * d + ch(i, false), b = h * d + ch(i, true);
            var[a] = var[b] = (l.rvar[a] + l.rvar[b]) / 2;
        }
    }
    // The position's bits go into the low bits of the blocks' fp16 scales (ggml's blocks all start
    // with one): at most 3 per block, a scale off by at most 7 units in its last place (0.7%).
    const kvq::CodecInfo& info = codec.info();
    const size_t blocks = static_cast<size_t>(heads) * (codec.row_bytes() / static_cast<size_t>(std::max(info.bytes_per_block, 1)));
    if (info.ggml_type < 0 || info.plain || info.bytes_per_block < 2 || codec.row_bytes() % static_cast<size_t>(info.bytes_per_block) != 0 ||
        blocks == 0 || (kPositionBits + blocks - 1) / blocks > 3) {
        return "+ropecenter keeps the row's position in the fp16 scales of at least 8 ggml blocks per cache row; " + f.spec + " has " +
               std::to_string(blocks);
    }
    const size_t head_blocks = codec.row_bytes() / static_cast<size_t>(info.bytes_per_block);
    f.position_bits = static_cast<int>((kPositionBits + blocks - 1) / blocks);
    for (size_t b = 0; b * static_cast<size_t>(f.position_bits) < kPositionBits; ++b) {
        f.position_scales.push_back(static_cast<uint32_t>(b / head_blocks * f.slot_row_bytes + b % head_blocks * static_cast<size_t>(info.bytes_per_block)));
    }
    f.angles = std::make_shared<AngleTables>();
    return "";
}

int64_t get_position(const KvFormat& f, const char* row) {
    int64_t p = 0;
    const uint16_t mask = static_cast<uint16_t>((1u << f.position_bits) - 1);
    int k = 0;
    for (const uint32_t offset : f.position_scales) {
        uint16_t d;
        std::memcpy(&d, row + offset, sizeof(d));
        p |= int64_t{d & mask} << k;
        k += f.position_bits;
    }
    return p;
}

void put_position(const KvFormat& f, char* row, int64_t p) {
    const uint16_t mask = static_cast<uint16_t>((1u << f.position_bits) - 1);
    int k = 0;
    for (const uint32_t offset : f.position_scales) {
        uint16_t d;
        std::memcpy(&d, row + offset, sizeof(d));
        d = static_cast<uint16_t>((d & ~mask) | ((p >> k) & mask));
        std::memcpy(row + offset, &d, sizeof(d));
        k += f.position_bits;
    }
}

void add_rope_mean(const KvFormat& f, float* y, size_t n, size_t first, int64_t p, float sign) {
    const auto d = static_cast<size_t>(f.head_dim);
    for (size_t h = first / d; h < (first + n) / d; ++h) {
        float* yh = y + (h * d - first);
        const float* m = f.rmean.data() + h * d;
        for (const int32_t i : f.rope_pairs[h]) {
            const double angle = std::fmod(static_cast<double>(p) * f.rope->theta[static_cast<size_t>(i)], 2.0 * M_PI);
            const float c = static_cast<float>(std::cos(angle)), s = static_cast<float>(std::sin(angle));
            const int64_t a = f.rope->a(i), b = f.rope->b(i);
            yh[a] += sign * (m[a] * c - m[b] * s);
            yh[b] += sign * (m[a] * s + m[b] * c);
        }
    }
}

namespace {

const ggml_tensor* root_of(const ggml_tensor* t) { return t && t->view_src ? t->view_src : t; }

// The mask rows of +ropecenter's attention for query rows r < rows and their heads i < g:
// out[(r·g + i)·n + t] = mask[r·n + t] + Σ_c coef[(r·g + i)·terms + c]·e[c·stride + t], −inf where the
// mask is (mask null: none). Keys in blocks, every row per block: the angles are read from memory once.
// Compiled for the vector units that ggml's CPU backend also picks at run time (the plugin's baseline
// is x86-64's SSE2).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
void bias_rows(const float* coef, int64_t rows, int64_t g, int64_t terms, const float* e, size_t stride, const float* mask, int64_t n,
               float* out) {
    constexpr int64_t kBlock = 64;
    for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
        const int64_t nb = std::min(kBlock, n - t0);
        for (int64_t q = 0; q < rows * g; ++q) {
            float acc[kBlock] = {};
            for (int64_t c = 0; c < terms; ++c) {
                const float w = coef[q * terms + c];
                const float* ec = e + static_cast<size_t>(c) * stride + t0;
                for (int64_t t = 0; t < kBlock; ++t) acc[t] += w * ec[t];  // (stride and the rows are whole blocks)
            }
            float* o = out + q * n + t0;
            const float* mr = mask ? mask + (q / g) * n + t0 : nullptr;
            for (int64_t t = 0; t < nb; ++t) o[t] = !mr ? acc[t] : mr[t] == -INFINITY ? -INFINITY : acc[t] + mr[t];
        }
    }
}

}  // namespace

void attend_rope_centered(const kvq::Codec& keys, const kvq::Codec& values, ggml_tensor* dst, const kvq::AttendOptions& options,
                          std::vector<float>& queries) {
    const ggml_tensor* q = dst->src[0];
    const ggml_tensor* k = dst->src[1];
    const ggml_tensor* v = dst->src[2];
    const ggml_tensor* mask = dst->src[3];
    KvFormat& f = *kv_format_of(k);
    const ggml_tensor* base = root_of(k);
    const int64_t d = f.head_dim, dv = v->ne[0], n_kv = k->ne[1], kv_heads = k->ne[2], n_heads = q->ne[2], g = n_heads / kv_heads,
                  n_rows = q->ne[1];
    const int64_t first_head = static_cast<int64_t>((k->view_offs % base->nb[1]) / f.slot_row_bytes);
    const float scale = options.scale != 0.0f ? options.scale : 1.0f / std::sqrt(static_cast<float>(d));
    thread_local std::vector<int64_t> positions;
    thread_local std::vector<float> coef, bias, qrows, out, mask_f32;
    positions.resize(static_cast<size_t>(n_kv));
    kvq::AttendOptions o = options;  // per chunk: its query rows and their f32 mask rows
    o.q_head_stride = o.q_row_stride = static_cast<size_t>(d);
    o.out_head_stride = o.out_row_stride = static_cast<size_t>(dv);
    o.mask_type = kvq::MaskType::f32;
    o.mask_row_stride = static_cast<size_t>(n_kv);
    o.sinks = nullptr;
    for (int64_t i3 = 0; i3 < q->ne[3]; ++i3) {
        size_t row_stride = 0, head_stride = 0;
        const float* qd = kv_format_queries(k, q, i3, queries, row_stride, head_stride);
        const char* kd = static_cast<const char*>(k->data) + i3 * k->nb[3];
        const char* rows0 = kd - static_cast<ptrdiff_t>(first_head) * static_cast<ptrdiff_t>(f.slot_row_bytes);  // cell 0's cache row
        for (int64_t t = 0; t < n_kv; ++t) positions[t] = get_position(f, rows0 + t * k->nb[1]);
        const auto* mask_rows = mask ? reinterpret_cast<const ggml_fp16_t*>(static_cast<const char*>(mask->data) + (i3 % mask->ne[3]) * mask->nb[3])
                                     : nullptr;
        for (int64_t hk = 0; hk < kv_heads; ++hk) {
            const int64_t head = first_head + hk;
            const std::vector<int32_t>& pairs = f.rope_pairs[static_cast<size_t>(head)];
            const auto np = static_cast<int64_t>(pairs.size());
            // cos and sin of p·θ for every key's position on this head's pairs (computed for changed cells).
            AngleTables& at = *f.angles;
            std::lock_guard<std::mutex> lock(at.mu);
            if (at.heads.size() != f.rope_pairs.size()) at.heads.assign(f.rope_pairs.size(), {});
            AngleTables::Head& ah = at.heads[static_cast<size_t>(head)];
            if (ah.cap < static_cast<size_t>(n_kv)) {
                const size_t cap = (std::max<size_t>(static_cast<size_t>(n_kv), 2 * ah.cap) + 63) / 64 * 64;  // whole blocks of 64
                std::vector<float> e(static_cast<size_t>(2 * np) * cap);
                for (int64_t c = 0; c < 2 * np; ++c) std::copy_n(ah.e.data() + c * ah.cap, ah.cap, e.data() + c * cap);
                ah.e = std::move(e);
                ah.pos.resize(cap, -1);
                ah.cap = cap;
            }
            for (int64_t t = 0; t < n_kv; ++t) {
                if (ah.pos[t] == positions[t]) continue;
                ah.pos[t] = positions[t];
                for (int64_t c = 0; c < np; ++c) {
                    const double angle = std::fmod(static_cast<double>(positions[t]) * f.rope->theta[static_cast<size_t>(pairs[c])], 2.0 * M_PI);
                    ah.e[2 * c * ah.cap + t] = static_cast<float>(std::cos(angle));
                    ah.e[(2 * c + 1) * ah.cap + t] = static_cast<float>(std::sin(angle));
                }
            }
            // In chunks of query rows, each query head of this kv head a query row of its own, whose mask row
            // adds scale · q·R_p·m: Σ over pairs of cos·(q_a m_a + q_b m_b) + sin·(q_b m_a − q_a m_b), with
            // q in the model's channels (the scaled query times s).
            const int64_t chunk = std::clamp<int64_t>((int64_t{1} << 21) / std::max<int64_t>(g * n_kv, 1), 1, n_rows);
            const float* m = f.rmean.data() + head * d;
            const float* s = f.key_scales ? f.scale.data() + head * d : nullptr;
            for (int64_t r0 = 0; r0 < n_rows; r0 += chunk) {
                const int64_t rows = std::min(chunk, n_rows - r0), nq = rows * g;
                qrows.resize(static_cast<size_t>(nq * d));
                coef.resize(static_cast<size_t>(nq * np * 2));
                bias.resize(static_cast<size_t>(nq * n_kv));
                out.resize(static_cast<size_t>(nq * dv));
                if (mask_rows) mask_f32.resize(static_cast<size_t>(rows * n_kv));
                for (int64_t r = 0; r < rows; ++r) {
                    if (mask_rows) {
                        const auto* mr = reinterpret_cast<const ggml_fp16_t*>(reinterpret_cast<const char*>(mask_rows) + (r0 + r) * mask->nb[1]);
                        ggml_fp16_to_fp32_row(mr, mask_f32.data() + r * n_kv, n_kv);
                    }
                    for (int64_t i = 0; i < g; ++i) {
                        const int64_t row = r * g + i;
                        const float* qh = qd + (r0 + r) * static_cast<int64_t>(row_stride) + (hk * g + i) * static_cast<int64_t>(head_stride);
                        std::copy_n(qh, d, qrows.data() + row * d);
                        float* cf = coef.data() + row * np * 2;
                        for (int64_t c = 0; c < np; ++c) {
                            const int64_t a = f.rope->a(pairs[c]), b = f.rope->b(pairs[c]);
                            const float qa = s ? qh[a] * s[a] : qh[a], qb = s ? qh[b] * s[b] : qh[b];
                            cf[2 * c] = scale * (qa * m[a] + qb * m[b]);
                            cf[2 * c + 1] = scale * (qb * m[a] - qa * m[b]);
                        }
                    }
                }
                bias_rows(coef.data(), rows, g, 2 * np, ah.e.data(), ah.cap, mask_rows ? mask_f32.data() : nullptr, n_kv, bias.data());
                o.n_queries = static_cast<size_t>(nq);
                o.mask = bias.data();
                const kvq::RowsView kr{kd + hk * k->nb[2], k->nb[1], 0};
                const kvq::RowsView vr{static_cast<const char*>(v->data) + i3 * v->nb[3] + hk * v->nb[2], v->nb[1], 0};
                kvq::attend_rows(keys, values, 1, 1, qrows.data(), kr, vr, static_cast<size_t>(n_kv), out.data(), o);
                for (int64_t r = 0; r < rows; ++r) {
                    for (int64_t i = 0; i < g; ++i) {
                        auto* o_row = reinterpret_cast<float*>(static_cast<char*>(dst->data) + (hk * g + i) * dst->nb[1] + (r0 + r) * dst->nb[2] +
                                                               i3 * dst->nb[3]);
                        std::copy_n(out.data() + (r * g + i) * dv, dv, o_row);
                    }
                }
            }
        }
    }
}

}  // namespace kvq_ggml
