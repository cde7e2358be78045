// kvq — the text forms of the sweep, the memory plan and the codec table: Markdown (for people), CSV and
// JSON (for programs). The `kvq` command prints these; C++ programs can too.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kvq/research/planner.hpp"
#include "kvq/research/sweep.hpp"

namespace kvq {

enum class TableFormat { markdown, csv, json };
// "markdown" (or "md"), "csv", "json"; throws std::invalid_argument otherwise.
TableFormat parse_table_format(std::string_view name);

std::string format_sweep(const SweepResult& result, TableFormat format);
std::string format_plan(const ModelShape& model, const std::vector<MemoryPlan>& rows, const PlanOptions& options,
                        TableFormat format);
// The codec table (name, block, bytes, bits per value at head_dim, ggml layout, layout) and the SIMD level.
std::string format_codec_info(TableFormat format, int head_dim = 128);

// Bytes as people read them: "300.0 KiB", "1.50 GiB".
std::string human_bytes(double bytes);

}  // namespace kvq
