// Markdown, CSV and JSON forms of the sweep, the plan and the codec table. Numbers in CSV and JSON keep
// full precision (%.9g); Markdown rounds for reading.
#include "kvq/research/report.hpp"

#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <stdexcept>

#include "kvq/codec.hpp"
#include "kvq/simd.hpp"

namespace kvq {
namespace {

std::string fmt(const char* f, ...) {
    char buf[256];
    va_list args;
    va_start(args, f);
    std::vsnprintf(buf, sizeof buf, f, args);
    va_end(args);
    return buf;
}

// Whole numbers (byte counts) exactly, others to 9 significant digits.
std::string num(double x) {
    if (!std::isfinite(x)) return "null";
    if (x == std::floor(x) && std::fabs(x) < 0x1p53) return fmt("%.0f", x);
    return fmt("%.9g", x);
}

std::string json_string(std::string_view s) {
    std::string out = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') out += '\\', out += c;
        else if (static_cast<unsigned char>(c) < 0x20) out += fmt("\\u%04x", c);
        else out += c;
    }
    return out + "\"";
}

std::string csv_field(std::string_view s) {
    if (s.find_first_of(",\"\n") == std::string_view::npos) return std::string(s);
    std::string out = "\"";
    for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
    return out + "\"";
}

// Markdown cells.
std::string sci(double x) { return x == 0 ? "0" : fmt("%.1e", x); }
std::string fixed(double x, int digits) { return fmt("%.*f", digits, x); }
std::string times(double x) { return x > 0 ? fmt("%.2f×", x) : "—"; }

std::string join(const std::vector<std::string>& cells, const char* sep) {
    std::string s;
    for (size_t i = 0; i < cells.size(); ++i) s += (i ? sep : "") + cells[i];
    return s;
}

std::string markdown_row(const std::vector<std::string>& cells) { return "| " + join(cells, " | ") + " |\n"; }

std::string escape_bar(const std::string& cell) {
    std::string out;
    for (char c : cell) {
        if (c == '|') out += '\\';
        out += c;
    }
    return out;
}

std::string model_json(const ModelShape& m) {
    std::string windows = "[";
    for (size_t i = 0; i < m.sliding_window.size(); ++i) {
        if (i) windows += ',';
        windows += std::to_string(m.sliding_window[i]);
    }
    return "{\"name\": " + json_string(m.name) + ", \"source\": " + json_string(m.source) + ", \"layers\": " +
           std::to_string(m.n_layers) + ", \"heads\": " + std::to_string(m.n_heads) + ", \"kv_heads\": " +
           std::to_string(m.n_kv_heads) + ", \"head_dim\": " + std::to_string(m.head_dim) + ", \"value_dim\": " +
           std::to_string(m.value_row_dim()) + ", \"mla_latent_dim\": " + std::to_string(m.mla_latent_dim) +
           ", \"mla_rope_dim\": " + std::to_string(m.mla_rope_dim) + ", \"sliding_window\": " + windows + "]}";
}

const char* kSweepColumns[] = {"dataset", "layers", "key", "value", "key_centered", "head_dim", "head_dim_v", "latent", "key_bits", "value_bits",
                               "bytes_per_token", "compression_vs_f16", "kl_mean", "kl_worst", "score_rmse_mean",
                               "score_rmse_worst", "topk_mean", "topk_worst", "output_err_mean", "output_err_worst",
                               "cosine_mean", "cosine_worst", "queries", "decode_seconds", "decode_vs_f16", "error"};

// A field of a format, and of its sliding-window layers' format after '|' ("K/V|K2/V2" formats).
template <class F>
std::string both(const KVFormat& f, F&& field) {
    return f.window ? field(f) + "|" + field(*f.window) : field(f);
}
std::string key_codecs(const KVFormat& f) { return both(f, [](const KVFormat& x) { return x.key_codec; }); }
std::string value_codecs(const KVFormat& f) { return both(f, [](const KVFormat& x) { return x.value_codec; }); }
std::string centered(const KVFormat& f) { return both(f, [](const KVFormat& x) { return std::string(x.center_keys ? "true" : "false"); }); }
// Markdown cells: a '|' inside one is escaped.
std::string key_cell(const KVFormat& f) { return both(f, [](const KVFormat& x) { return x.key_label(); }); }

std::vector<std::string> sweep_values(const SweepRow& r) {
    const auto& e = r.errors;
    const bool ok = r.error.empty();
    auto v = [&](double x) { return ok ? num(x) : std::string("null"); };
    return {r.dataset, r.layers, key_codecs(r.format), value_codecs(r.format), centered(r.format),
            std::to_string(r.head_dim), std::to_string(r.head_dim_v), r.latent ? "true" : "false", v(r.key_bits),
            r.latent ? "null" : v(r.value_bits),  // a latent's values have no bits of their own
            r.bytes_per_token > 0 ? num(r.bytes_per_token) : "null", r.compression > 0 ? num(r.compression) : "null",
            v(e.kl.mean), v(e.kl.worst), v(e.score_rmse.mean), v(e.score_rmse.worst), v(e.topk.mean), v(e.topk.worst),
            v(e.output_l2.mean), v(e.output_l2.worst), v(e.cosine.mean), v(e.cosine.worst), std::to_string(e.queries),
            r.decode_seconds > 0 ? num(r.decode_seconds) : "null", r.decode_vs_f16 > 0 ? num(r.decode_vs_f16) : "null",
            r.error};
}

}  // namespace

TableFormat parse_table_format(std::string_view name) {
    if (name == "markdown" || name == "md") return TableFormat::markdown;
    if (name == "csv") return TableFormat::csv;
    if (name == "json") return TableFormat::json;
    throw std::invalid_argument("unknown output format '" + std::string(name) + "' (markdown, csv, json)");
}

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    while (b >= 1024 && u < 5) b /= 1024, ++u;
    return u == 0 ? fmt("%.0f B", b) : fmt(b >= 10 ? "%.1f %s" : "%.2f %s", b, units[u]);
}

std::string format_sweep(const SweepResult& result, TableFormat format) {
    std::string s;
    if (format == TableFormat::csv) {
        s = join({std::begin(kSweepColumns), std::end(kSweepColumns)}, ",") + "\n";
        for (const auto& r : result.rows) {
            auto cells = sweep_values(r);
            for (auto& c : cells) c = c == "null" ? "" : csv_field(c);
            s += join(cells, ",") + "\n";
        }
        return s;
    }
    if (format == TableFormat::json) {
        s = "{\"model\": " + model_json(result.model) + ",\n \"latent_model\": " +
            (result.latent_model.n_layers > 0 ? model_json(result.latent_model) : "null") + ",\n \"timing\": " + json_string(result.timing_method) + ",\n \"rows\": [\n";
        for (size_t i = 0; i < result.rows.size(); ++i) {
            const auto cells = sweep_values(result.rows[i]);
            s += "  {";
            for (size_t c = 0; c < cells.size(); ++c) {
                const std::string name = kSweepColumns[c];
                const bool text = name == "dataset" || name == "layers" || name == "key" || name == "value" || name == "error";
                s += (c ? ", " : "") + json_string(name) + ": " + (text ? json_string(cells[c]) : cells[c]);
            }
            s += i + 1 < result.rows.size() ? "},\n" : "}\n";
        }
        return s + " ]}\n";
    }
    const ModelShape& m = result.model;
    s += markdown_row({"data", "K", "V", "K bits", "V bits", "KiB/token", "vs f16", "KL mean", "KL worst", "score RMSE",
                       "worst", "top-8", "worst", "out err", "worst", "decode vs f16"});
    s += "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n";
    const SweepRow* latent = nullptr;  // the first latent row, for the note on them
    bool other = false;
    for (const auto& r : result.rows) {
        const auto& e = r.errors;
        if (r.latent && !latent) latent = &r;
        other = other || !r.latent;
        // Rows over part of a data set's layers (full-attention or sliding-window ones) say so.
        const std::string data = r.layers == "all" ? r.dataset : r.dataset + " [" + r.layers + "]";
        const std::string kib = r.bytes_per_token > 0 ? fixed(r.bytes_per_token / 1024, 1) : "—";
        if (!r.error.empty()) {
            s += markdown_row({data, escape_bar(key_cell(r.format)), escape_bar(value_codecs(r.format)), "—", "—", kib, times(r.compression),
                               "(" + r.error + ")", "", "", "", "", "", "", "", ""});
            continue;
        }
        // A latent's values are its key rows' first head_dim_v values, with no bits of their own.
        const std::string values = r.latent ? "K[:" + std::to_string(r.head_dim_v) + "]" : escape_bar(value_codecs(r.format));
        s += markdown_row({data, escape_bar(key_cell(r.format)), values, fixed(r.key_bits, 2), r.latent ? "—" : fixed(r.value_bits, 2), kib,
                           times(r.compression), sci(e.kl.mean), sci(e.kl.worst), fixed(e.score_rmse.mean, 4),
                           fixed(e.score_rmse.worst, 4), fixed(e.topk.mean, 3), fixed(e.topk.worst, 3),
                           fixed(e.output_l2.mean, 4), fixed(e.output_l2.worst, 4), times(r.decode_vs_f16)});
    }
    std::string counts;
    bool windowed = false;
    for (const auto& r : result.rows) windowed = windowed || r.layers != "all";
    for (size_t i = 0; i < result.rows.size(); ++i) {
        const auto& r = result.rows[i];
        if ((i == 0 || r.dataset != result.rows[i - 1].dataset) && r.error.empty() && r.layers == "all") {
            counts += (counts.empty() ? "" : ", ") + r.dataset + " " + std::to_string(r.errors.queries);
        }
    }
    std::string bytes_of = other ? m.name + " (" + m.describe() + ")" : "";
    if (latent) {
        const ModelShape& lm = result.latent_model;
        bytes_of += (other ? "; latent rows: " : "") + lm.name + " (" + lm.describe() + ")";
    }
    s += "\nKiB/token and vs f16: " + bytes_of + ". Errors against the FP32 reference: KL of the "
         "attention weights (nats), score RMSE / score std, top-8 agreement, relative L2 error of the output; mean and "
         "worst over the queries (" + counts + ")" + (windowed ? "; [full] and [window]: the same over the full-attention and the sliding-window layers only" : "") + ". Decode time: " + result.timing_method + ".\n";
    if (latent) {
        const std::string dk = std::to_string(latent->head_dim), dv = std::to_string(latent->head_dim_v);
        s += "Latent rows (V = K[:" + dv + "], DeepSeek's MLA): one " + dk + "-value row per token and layer, stored in K's codec, "
             "is the key, and its first " + dv + " values are the value, read in place (a KVCache with latent_values). K bits are "
             "the latent's bits per stored value (its bytes per token and layer × 8 / " + dk + "); V stores nothing of its own. "
             "Their decode time is relative to an f16 latent cache.\n";
    }
    return s;
}

std::string format_plan(const ModelShape& m, const std::vector<MemoryPlan>& rows, const PlanOptions& o, TableFormat format) {
    std::string s;
    if (format == TableFormat::json) {
        s = "{\"model\": " + model_json(m) + ",\n \"context\": " + std::to_string(o.context) + ", \"batch\": " +
            std::to_string(o.batch) + ", \"block_tokens\": " + std::to_string(o.block_tokens) + ",\n \"rows\": [\n";
        for (size_t i = 0; i < rows.size(); ++i) {
            const auto& r = rows[i];
            s += "  {\"key\": " + json_string(key_codecs(r.format)) + ", \"value\": " + json_string(value_codecs(r.format)) +
                 ", \"key_centered\": " + (r.format.center_keys ? "true" : "false") + ", \"supported\": " +
                 (r.supported ? "true" : "false") + ", \"key_bits\": " + num(r.key_bits) + ", \"value_bits\": " +
                 (m.is_mla() ? std::string("null") : num(r.value_bits)) + ", \"bytes_per_token\": " + num(r.bytes_per_token) + ", \"bytes_total\": " +
                 num(r.bytes_total) + ", \"fp16_bytes_per_token\": " + num(r.fp16_bytes_per_token) +
                 ", \"fp16_bytes_total\": " + num(r.fp16_bytes_total) + ", \"compression_vs_f16\": " + num(r.compression) + ", \"cache_bytes_total\": " + num(r.cache_bytes_total) +
                 ", \"error\": " + json_string(r.error) + (i + 1 < rows.size() ? "},\n" : "}\n");
        }
        return s + " ]}\n";
    }
    if (format == TableFormat::csv) {
        s = "model,key,value,key_centered,supported,key_bits,value_bits,bytes_per_token,bytes_total,fp16_bytes_per_token,"
            "fp16_bytes_total,compression_vs_f16,cache_bytes_total,context,batch,error\n";
        for (const auto& r : rows) {
            s += join({csv_field(m.name), key_codecs(r.format), value_codecs(r.format), r.format.center_keys ? "true" : "false",
                       r.supported ? "true" : "false", num(r.key_bits), m.is_mla() ? "" : num(r.value_bits), num(r.bytes_per_token),
                       num(r.bytes_total), num(r.fp16_bytes_per_token), num(r.fp16_bytes_total), num(r.compression),
                       num(r.cache_bytes_total), std::to_string(o.context), std::to_string(o.batch), csv_field(r.error)},
                      ",") + "\n";
        }
        return s;
    }
    s = m.name + ": " + m.describe() + ". Context " + std::to_string(o.context) + " tokens × batch " + std::to_string(o.batch) + ".\n";
    if (m.is_mla()) s += "MLA: the key codec stores the latent row; values are read from it, so V does not apply.\n";
    if (m.local_layers()) s += "Per token: a token held by every layer; the context column applies the sliding windows.\n";
    s += "\n";
    s += markdown_row({"K/V", "K bits", "V bits", "per token", "f16 per token", "context × batch", "f16 context × batch", "vs f16",
                       "in a KVCache"});
    s += "|---|--:|--:|--:|--:|--:|--:|--:|--:|\n";
    for (const auto& r : rows) {
        if (!r.supported) {
            s += markdown_row({escape_bar(r.format.label()), "—", "—", "—", human_bytes(r.fp16_bytes_per_token), "—", human_bytes(r.fp16_bytes_total),
                               "(" + r.error + ")", "—"});
            continue;
        }
        s += markdown_row({escape_bar(r.format.label()), fixed(r.key_bits, 2), m.is_mla() ? "—" : fixed(r.value_bits, 2),
                           human_bytes(r.bytes_per_token), human_bytes(r.fp16_bytes_per_token), human_bytes(r.bytes_total),
                           human_bytes(r.fp16_bytes_total), times(r.compression),
                           m.is_mla() ? "—" : human_bytes(r.cache_bytes_total)});
    }
    s += "\n\"in a KVCache\": what kvq's cache holds after decoding (whole blocks, each open block's float32 staging, the "
         "block of slack before each window, bookkeeping).\n";
    return s;
}

std::string format_codec_info(TableFormat format, int head_dim) {
    std::string levels;
    for (auto l : available_simd_levels()) {
        if (!levels.empty()) levels += ',';
        levels += simd_level_name(l);
    }
    const SimdReport report = simd_report();
    const std::string level(simd_level_name(report.in_use));
    std::string s;
    if (format == TableFormat::json) {
        s = "{\"simd_level\": " + json_string(level) + ", \"simd_available\": " + json_string(levels) +
            ", \"simd_reason\": " + json_string(report.reason) + ",\n \"codecs\": [\n";
    } else if (format == TableFormat::csv) {
        s = "name,block,bytes_per_block,bits_per_value,ggml_layout,layout\n";
    } else {
        s = "SIMD levels (* in use):\n\n```\n" + format_simd_report(report) + "```\n\n" +
            markdown_row({"codec", "block", "bytes/block", "bits/value (d=" + std::to_string(head_dim) + ")", "ggml layout", "layout"}) +
            "|---|--:|--:|--:|---|---|\n";
    }
    const auto names = codec_names();
    for (size_t i = 0; i < names.size(); ++i) {
        const CodecInfo c = codec_info(names[i]);
        std::string bits = "—";
        try {
            bits = fmt("%.3f", Codec::make(c.name, head_dim).bits_per_value());
        } catch (const std::invalid_argument&) {
        }
        if (format == TableFormat::json) {
            s += "  {\"name\": " + json_string(c.name) + ", \"block\": " + std::to_string(c.block) + ", \"bytes_per_block\": " +
                 std::to_string(c.bytes_per_block) + ", \"bits_per_value\": " + (bits == "—" ? "null" : bits) +
                 ", \"ggml_layout\": " + (c.ggml_layout ? "true" : "false") + ", \"layout\": " + json_string(c.layout) +
                 (i + 1 < names.size() ? "},\n" : "}\n");
        } else if (format == TableFormat::csv) {
            s += join({c.name, std::to_string(c.block), std::to_string(c.bytes_per_block), bits == "—" ? "" : bits,
                       c.ggml_layout ? "true" : "false", csv_field(c.layout)}, ",") + "\n";
        } else {
            s += markdown_row({c.name, std::to_string(c.block), std::to_string(c.bytes_per_block), bits, c.ggml_layout ? "yes" : "no", c.layout});
        }
    }
    if (format == TableFormat::json) s += " ]}\n";
    else if (format == TableFormat::markdown) s += "\nAny codec takes the suffix +rot (seeded randomized Hadamard rotation); keys also take +center.\n";
    return s;
}

}  // namespace kvq
