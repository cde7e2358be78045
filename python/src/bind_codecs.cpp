// kvq.codecs, kvq.codec_info, kvq.quantize, kvq.dequantize, kvq.simd_level, simd_report, simd_kernel_table, selftest: the codec table and one
// codec's rows, from numpy.
#include <string>

#include "bindings.hpp"
#include "kvq/codec.hpp"
#include "kvq/selftest.hpp"
#include "kvq/simd.hpp"

namespace kvq::python {
namespace {

using namespace pybind11::literals;

py::dict codec_info_dict(const std::string& spec, int head_dim, uint64_t seed) {
    const Codec codec = Codec::make(spec, head_dim, seed);
    const CodecInfo& info = codec.info();
    py::dict d;
    d["name"] = codec.name();
    d["base"] = info.name;
    d["block"] = info.block;
    d["bytes_per_block"] = info.bytes_per_block;
    d["head_dim"] = head_dim;
    d["row_bytes"] = codec.row_bytes();
    d["bits_per_value"] = codec.bits_per_value();
    d["rotated"] = codec.rotated();
    d["ggml_layout"] = info.ggml_layout && !codec.rotated();
    d["ggml_type"] = codec.rotated() ? -1 : info.ggml_type;
    d["rotates"] = info.rotates;
    d["plain"] = info.plain;
    d["layout"] = info.layout;
    return d;
}

py::array quantize(py::handle x_obj, const std::string& spec, uint64_t seed, const std::string& nan_policy) {
    if (nan_policy != "reject" && nan_policy != "propagate") {
        raise_value_error("nan_policy must be 'reject' or 'propagate', got '" + nan_policy + "'");
    }
    const NanPolicy nan = nan_policy == "reject" ? NanPolicy::reject : NanPolicy::propagate;
    const CheckedArray x = float_array(x_obj, "quantize: x", {{"...", kLeading}, {"head_dim"}});
    const Codec codec = Codec::make(spec, static_cast<int>(x.dim(-1)), seed);
    auto shape = x.shape;
    shape.back() = static_cast<py::ssize_t>(codec.row_bytes());
    auto codes = new_byte_array(shape);
    const size_t rows = x.size / codec.head_dim();
    uint8_t* dst = codes.mutable_data();
    {
        WithoutGil unlocked;
        codec.quantize_rows(x.floats(), rows, dst, 0, nan);
    }
    return codes;
}

py::array dequantize(py::handle codes_obj, const std::string& spec, int head_dim, uint64_t seed) {
    const Codec codec = Codec::make(spec, head_dim, seed);
    const auto row_bytes = static_cast<py::ssize_t>(codec.row_bytes());
    const CheckedArray codes = byte_array(codes_obj, "dequantize: codes", {{"...", kLeading}, {"row_bytes", row_bytes}});
    auto shape = codes.shape;
    shape.back() = head_dim;
    auto y = new_float_array(shape);
    const size_t rows = codes.size / codec.row_bytes();
    float* dst = y.mutable_data();
    {
        WithoutGil unlocked;
        codec.dequantize_rows(codes.bytes(), rows, dst);
    }
    return y;
}

void bind_codecs(py::module_& m) {
    m.attr("DEFAULT_SEED") = kDefaultSeed;
    m.def("codecs", &kvq::codec_names, "Names in the codec table, in table order. Any name may take the suffix '+rot'.");
    m.def("codec_info", &codec_info_dict, "codec"_a, "head_dim"_a = 128, py::kw_only(), "seed"_a = kDefaultSeed,
          "A codec's table row and its size for rows of head_dim values: name, base, block, bytes_per_block,\n"
          "head_dim, row_bytes, bits_per_value (everything stored, scales included), rotated, ggml_layout,\n"
          "ggml_type (ggml's type id of the row bytes, -1 if none), rotates (the codec always rotates), plain, layout.");
    m.def("quantize", &quantize, "x"_a, "codec"_a, py::kw_only(), "seed"_a = kDefaultSeed, "nan_policy"_a = "reject",
          "Quantizes the rows of x (float32 or float16, shape (..., head_dim)) with a codec.\n"
          "Returns uint8 codes of shape x.shape[:-1] + (row_bytes,); for ggml-layout codecs these are ggml's bytes.\n"
          "nan_policy='reject' raises ValueError for NaN/Inf or a row beyond the codec's fp16 range;\n"
          "'propagate' stores them (they read back as NaN/Inf).");
    m.def("dequantize", &dequantize, "codes"_a, "codec"_a, "head_dim"_a, py::kw_only(), "seed"_a = kDefaultSeed,
          "Turns codes of shape (..., row_bytes) back into float32 rows of shape (..., head_dim).");
    m.def("simd_level", [] { return std::string(simd_level_name(kvq::simd_level())); },
          "The SIMD instruction set the kernels run with on this machine.");
    m.def("available_simd_levels", [] {
              std::vector<std::string> names;
              for (auto l : kvq::available_simd_levels()) names.emplace_back(simd_level_name(l));
              return names;
          },
          "The SIMD levels compiled into this build that this CPU runs, scalar first.");
    m.def("force_simd_level", [](const std::string& name) { kvq::force_simd_level(kvq::parse_simd_level(name)); },
          "name"_a,
          "Uses this SIMD level from now on (or, if it fails its self-check, the best level below it that\n"
          "passes); ValueError for an unknown level or one this CPU does not run. For tests and benchmarks:\n"
          "not safe while other threads are computing.");
    m.def("simd_report", [] {
              const auto r = kvq::simd_report();
              py::list levels;
              for (const auto& l : r.levels) {
                  py::dict d;
                  d["name"] = std::string(simd_level_name(l.level));
                  d["cpu_runs"] = l.cpu_runs;
                  d["checked"] = l.checked;
                  d["passed"] = l.passed;
                  d["detail"] = l.detail;
                  d["check_ms"] = l.check_ms;
                  levels.append(d);
              }
              py::dict out;
              out["in_use"] = std::string(simd_level_name(r.in_use));
              out["reason"] = r.reason;
              out["levels"] = levels;
              out["text"] = kvq::format_simd_report(r);
              return out;
          },
          "Which SIMD levels this build has, which this CPU runs, which passed their self-check, which is in\n"
          "use and why: {'in_use', 'reason', 'levels': [{'name', 'cpu_runs', 'checked', 'passed', 'detail',\n"
          "'check_ms'}], 'text'}.");
    m.def("simd_kernel_table", [] {
              const auto table = kvq::simd_kernel_table();
              py::list lines;
              for (const auto& k : table) {
                  py::dict d;
                  d["level"] = std::string(simd_level_name(k.level));
                  d["codec"] = k.codec;
                  d["op"] = k.op;
                  d["kernel"] = k.kernel;
                  lines.append(d);
              }
              py::dict out;
              out["lines"] = lines;
              out["text"] = kvq::format_simd_kernel_table(table);
              return out;
          },
          "Which kernel runs for each (codec, op) at every SIMD level this build has and this CPU runs (the\n"
          "choices of lib/simd/level_<isa>.cpp; 'spec' where the scalar specification fills a gap):\n"
          "{'lines': [{'level', 'codec', 'op', 'kernel'}], 'text'}.");
    m.def("selftest", [](py::object on_line) {
              std::vector<kvq::SelftestLine> lines;
              {
                  WithoutGil release;
                  kvq::selftest([&](const kvq::SelftestLine& l) {
                      lines.push_back(l);
                      if (!on_line.is_none()) {
                          WithGil acquire;
                          on_line(kvq::format_selftest_line(l));
                      }
                  });
              }
              py::list out;
              bool passed = !lines.empty();
              for (const auto& l : lines) {
                  py::dict d;
                  d["level"] = std::string(simd_level_name(l.level));
                  d["family"] = l.family;
                  d["passed"] = l.passed;
                  d["cases"] = l.cases;
                  d["checks"] = l.checks;
                  d["detail"] = l.detail;
                  d["ms"] = l.ms;
                  d["text"] = kvq::format_selftest_line(l);
                  out.append(d);
                  passed = passed && l.passed;
              }
              py::dict r;
              r["passed"] = passed;
              r["lines"] = out;
              return r;
          },
          "on_line"_a = py::none(),
          "The full parity check (kvq::selftest): every codec at every SIMD level this CPU runs against the\n"
          "scalar specification, and cache attention against the FP32 reference. on_line(text) sees each\n"
          "line as it finishes. Returns {'passed': bool, 'lines': [{'level', 'family', 'passed', 'cases',\n"
          "'checks', 'detail', 'ms', 'text'}]}.");
}

const Registration registration("codecs", bind_codecs);

}  // namespace
}  // namespace kvq::python
