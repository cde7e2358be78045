// kvq::Codec: parses a spec, builds the codec from the table, and checks every argument before the
// kernels run, so bad input throws without writing anything.
#include "kvq/codec.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "../simd/dispatch.hpp"
#include "../util/checked_size.hpp"
#include "key_formats.hpp"
#include "level_checks.hpp"
#include "rotated.hpp"
#include "table.hpp"

namespace kvq {
namespace {

[[noreturn]] void fail(const std::string& codec, const std::string& what) {
    throw std::invalid_argument("codec '" + codec + "': " + what);
}

void require(bool ok, const std::string& codec, const char* what) {
    if (!ok) fail(codec, what);
}

// The kernels read and write a prepared query as floats and integers in place. A caller's buffer may sit
// at any byte address (the C API and the tests pass odd ones); below this alignment it is bounced through
// an aligned thread-local copy, so the kernels never see a misaligned field. malloc'ed buffers never bounce.
constexpr uintptr_t kPrepAlign = alignof(std::max_align_t);

bool misaligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kPrepAlign != 0; }

uint8_t* bounce_buffer(size_t bytes) {
    thread_local std::vector<uint8_t> buf;  // operator new aligns to max_align_t
    if (buf.size() < bytes) buf.resize(bytes);
    return buf.data();
}

std::string shortest(double v) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    return buf;
}

}  // namespace

std::vector<std::string> codec_names() {
    std::vector<std::string> names;
    for (const auto& row : detail::codec_table()) names.emplace_back(row.name);
    return names;
}

namespace {
CodecInfo info_of(const detail::RowCodecTraits& row) {
    return {.name = row.name, .block = row.block, .bytes_per_block = row.bytes_per_block, .ggml_layout = row.ggml_layout(),
            .ggml_type = row.ggml_type, .layout = row.layout, .rotates = row.rotates(), .plain = row.plain};
}
}  // namespace

CodecInfo codec_info(std::string_view name) {
    const auto* row = detail::find_codec(name);
    if (!row) throw UnknownCodec("unknown codec '" + std::string(name) + "'");
    return info_of(*row);
}

std::string codec_for_ggml_type(int ggml_type) {
    const auto* row = detail::find_ggml_codec(ggml_type);
    return row ? row->name : "";
}

bool all_finite(const float* x, size_t n) { return detail::all_finite(x, n); }

const detail::CodecImpl& detail::impl_of(const Codec& c) { return *c.impl_; }

CodecSpec parse_codec_spec(std::string_view spec) {
    std::string_view base = spec;
    CodecSpec parsed;
    if (constexpr std::string_view suffix = "+rot"; base.size() > suffix.size() && base.ends_with(suffix)) {
        parsed.rot = true;
        base.remove_suffix(suffix.size());
    }
    if (const auto colon = base.find(':'); colon != std::string_view::npos) {
        parsed.params = std::string(base.substr(colon + 1));
        base = base.substr(0, colon);
        if (parsed.params.empty()) {
            throw BadParams("codec '" + std::string(spec) + "': nothing after ':' (give key=value parameters, or no ':')");
        }
    }
    const auto* row = detail::find_codec(base);
    if (!row) {
        std::string known;
        for (const auto& name : codec_names()) known += (known.empty() ? "" : ", ") + name;
        throw UnknownCodec("unknown codec '" + std::string(spec) + "' (known: " + known +
                           "; any may take the suffix +rot)");
    }
    parsed.info = info_of(*row);
    return parsed;
}

// The polar and turbo codecs' checks through the codec path join every SIMD level's run-time self-check
// (level_checks.hpp): this file is linked into every program that makes a codec, and this runs as it starts.
[[maybe_unused]] static const bool kCodecLevelChecks = (detail::add_codec_level_checks(), true);

Codec Codec::make(std::string_view spec, int head_dim, uint64_t seed) {
    if (detail::is_key_only_spec(spec)) {
        throw BadParams("codec '" + std::string(spec) + "': a key format with data fitted to a block of tokens, which is a "
                        "KVCache key codec (CacheConfig::key_codec), not a row codec");
    }
    CodecSpec parsed = parse_codec_spec(spec);
    if (head_dim <= 0 || head_dim > 65536) {
        throw BadHeadDim("codec '" + std::string(spec) + "': head_dim must be in 1..65536, got " +
                         std::to_string(head_dim));
    }
    const auto* row = detail::find_codec(parsed.info.name);
    std::unique_ptr<detail::CodecImpl> impl = detail::make_codec(*row, parsed.params, head_dim, seed);
    if (parsed.rot && !row->rotates()) impl = detail::make_rotated(std::move(impl), seed);
    Codec c;
    c.impl_ = std::move(impl);
    c.name_ = std::string(spec);
    c.info_ = std::move(parsed.info);
    c.head_dim_ = head_dim;
    c.rotated_ = parsed.rot || row->rotates();
    c.seed_ = seed;
    return c;
}

void Codec::check_rows_operation(const char* what) const {
    if (info_.per_channel) {
        fail(name_, std::string(what) + ": per-channel keys have no row operations (a row's codes need its block's "
                                        "per-channel minimums and steps, which KVCache keeps with the block)");
    }
}

size_t Codec::row_bytes() const { return impl_->row_bytes(); }
size_t Codec::query_bytes() const { return impl_->query_bytes(); }

InputLimit Codec::input_limit() const { return impl_->input_limit(); }

void Codec::check_range(const float* x, size_t n_rows) const {
    const InputLimit limit = input_limit();
    if (!limit.on_norm && limit.max_abs == FLT_MAX) return;  // every finite value fits
    for (size_t r = 0; r < n_rows; ++r) {
        const double size = limit.size_of(x + r * head_dim_, head_dim_);
        if (size > limit.max_abs) {
            fail(name_, "quantize_rows: row " + std::to_string(r) + (limit.on_norm ? " has norm " : " has |x| = ") +
                            shortest(size) + ", beyond the codec's range " + shortest(limit.max_abs) +
                            (limit.on_norm ? " for a row's L2 norm" : "") + " (a stored fp16 field would overflow)");
        }
    }
}

namespace {
constexpr size_t kFloat = sizeof(float);
using detail::CheckedSize;
using detail::strided;

// The buffers of a row operation, each size computed with checks (lib/util/checked_size.hpp).
void check_sizes(const std::string& codec, const char* op, std::initializer_list<detail::BufferSize> buffers) {
    detail::check_buffer_sizes(buffers, [&] { return "codec '" + codec + "': " + op; });
}
}  // namespace

void Codec::quantize_rows(const float* x, size_t n_rows, void* dst, size_t dst_stride, NanPolicy nan) const {
    check_rows_operation("quantize_rows");
    if (n_rows == 0) return;
    require(x && dst, name_, "quantize_rows: null pointer");
    if (dst_stride == 0) dst_stride = row_bytes();
    require(dst_stride >= row_bytes(), name_, "quantize_rows: dst_stride is smaller than row_bytes()");
    check_sizes(name_, "quantize_rows",
                {{"x", CheckedSize(n_rows) * head_dim_ * kFloat, "n_rows x head_dim floats"},
                 {"dst", strided(n_rows, dst_stride, row_bytes()), "n_rows rows dst_stride apart"}});
    if (nan == NanPolicy::reject) {
        const size_t n = n_rows * head_dim_;
        // One vectorized pass checks finiteness and the largest |x| together; the scalar passes only run
        // to name the bad value or row (or for codecs whose limit is on the row's norm).
        const float amax = detail::finite_max_abs(x, n);
        if (std::isnan(amax)) {
            for (size_t i = 0; i < n; ++i) {
                if (!std::isfinite(x[i])) {
                    throw NonFiniteInput("codec '" + name_ + "': quantize_rows: value " + std::to_string(i % head_dim_) +
                                         " of row " + std::to_string(i / head_dim_) + " is not finite (NaN or Inf)");
                }
            }
        }
        const InputLimit limit = input_limit();
        // A row's norm is at most √d·max|x|: only when that bound is beyond the limit are the norms needed.
        const double bound = limit.on_norm ? double(amax) * std::sqrt(double(head_dim_)) * (1 + 1e-9) : amax;
        if (bound > limit.max_abs) check_range(x, n_rows);
    }
    impl_->quantize_rows(x, n_rows, static_cast<uint8_t*>(dst), dst_stride);
}

void Codec::dequantize_rows(const void* src, size_t n_rows, float* y, size_t src_stride) const {
    check_rows_operation("dequantize_rows");
    if (n_rows == 0) return;
    require(src && y, name_, "dequantize_rows: null pointer");
    if (src_stride == 0) src_stride = row_bytes();
    require(src_stride >= row_bytes(), name_, "dequantize_rows: src_stride is smaller than row_bytes()");
    check_sizes(name_, "dequantize_rows",
                {{"src", strided(n_rows, src_stride, row_bytes()), "n_rows rows src_stride apart"},
                 {"y", CheckedSize(n_rows) * head_dim_ * kFloat, "n_rows x head_dim floats"}});
    impl_->dequantize_rows(static_cast<const uint8_t*>(src), src_stride, n_rows, y);
}

void Codec::prepare_queries(const float* q, int n_q, void* prep, NanPolicy nan) const {
    check_rows_operation("prepare_queries");
    require(n_q >= 0, name_, "prepare_queries: n_q is negative");
    if (n_q == 0) return;
    require(q && prep, name_, "prepare_queries: null pointer");
    check_sizes(name_, "prepare_queries",
                {{"q", CheckedSize(n_q) * head_dim_ * kFloat, "n_q x head_dim floats"},
                 {"prep", CheckedSize(n_q) * query_bytes(), "n_q x query_bytes()"}});
    if (nan == NanPolicy::reject && !detail::all_finite(q, static_cast<size_t>(n_q) * head_dim_)) {
        throw NonFiniteInput("codec '" + name_ + "': prepare_queries: query is not finite (NaN or Inf)");
    }
    if (!misaligned(prep)) {
        impl_->prepare_queries(q, n_q, static_cast<uint8_t*>(prep));
        return;
    }
    const size_t bytes = static_cast<size_t>(n_q) * query_bytes();
    uint8_t* aligned = bounce_buffer(bytes);
    impl_->prepare_queries(q, n_q, aligned);
    std::memcpy(prep, aligned, bytes);
}

void Codec::score_rows(const void* prep, int n_q, const void* rows, size_t n_rows, float* scores,
                       size_t score_stride, size_t row_stride) const {
    check_rows_operation("score_rows");
    require(n_q >= 0, name_, "score_rows: n_q is negative");
    if (n_q == 0 || n_rows == 0) return;
    require(prep && rows && scores, name_, "score_rows: null pointer");
    require(n_q == 1 || score_stride >= n_rows, name_, "score_rows: score_stride is smaller than n_rows");
    if (row_stride == 0) row_stride = row_bytes();
    require(row_stride >= row_bytes(), name_, "score_rows: row_stride is smaller than row_bytes()");
    check_sizes(name_, "score_rows",
                {{"prep", CheckedSize(n_q) * query_bytes(), "n_q x query_bytes()"},
                 {"rows", strided(n_rows, row_stride, row_bytes()), "n_rows rows row_stride apart"},
                 {"scores", strided(n_q, score_stride, n_rows) * kFloat, "n_q rows of n_rows floats, score_stride apart"}});
    const uint8_t* p = static_cast<const uint8_t*>(prep);
    if (misaligned(prep)) {
        const size_t bytes = static_cast<size_t>(n_q) * query_bytes();
        p = static_cast<const uint8_t*>(std::memcpy(bounce_buffer(bytes), prep, bytes));
    }
    impl_->score_rows(p, n_q, static_cast<const uint8_t*>(rows), row_stride,
                      n_rows, scores, score_stride);
}

void Codec::accumulate_rows(const float* w, size_t w_stride, int n_q, const void* rows, size_t n_rows,
                            float* acc, size_t row_stride) const {
    check_rows_operation("accumulate_rows");
    require(n_q >= 0, name_, "accumulate_rows: n_q is negative");
    if (n_q == 0 || n_rows == 0) return;
    require(w && rows && acc, name_, "accumulate_rows: null pointer");
    require(n_q == 1 || w_stride >= n_rows, name_, "accumulate_rows: w_stride is smaller than n_rows");
    if (row_stride == 0) row_stride = row_bytes();
    require(row_stride >= row_bytes(), name_, "accumulate_rows: row_stride is smaller than row_bytes()");
    check_sizes(name_, "accumulate_rows",
                {{"w", strided(n_q, w_stride, n_rows) * kFloat, "n_q rows of n_rows floats, w_stride apart"},
                 {"rows", strided(n_rows, row_stride, row_bytes()), "n_rows rows row_stride apart"},
                 {"acc", CheckedSize(n_q) * head_dim_ * kFloat, "n_q x head_dim floats"}});
    impl_->accumulate_rows(w, w_stride, n_q, static_cast<const uint8_t*>(rows), row_stride, n_rows, acc);
}

void Codec::finish_accumulate(float* acc, int n_q) const {
    check_rows_operation("finish_accumulate");
    require(n_q >= 0, name_, "finish_accumulate: n_q is negative");
    if (n_q == 0) return;
    require(acc != nullptr, name_, "finish_accumulate: null pointer");
    check_sizes(name_, "finish_accumulate",
                {{"acc", CheckedSize(n_q) * head_dim_ * kFloat, "n_q x head_dim floats"}});
    impl_->finish_accumulate(acc, n_q);
}

void Codec::effective_query(const float* q, float* out) const {
    check_rows_operation("effective_query");
    require(q && out, name_, "effective_query: null pointer");
    impl_->effective_query(q, out);
}

}  // namespace kvq
