// The SIMD levels' names and the text forms of the dispatch's report and kernel table (kvq/simd.hpp):
// what needs no dispatch state, apart from dispatch.cpp.
#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "dispatch.hpp"

namespace kvq {

std::string_view simd_level_name(SimdLevel level) {
    switch (level) {
        case SimdLevel::scalar: return "scalar";
        case SimdLevel::sse2: return "sse2";
        case SimdLevel::avx2: return "avx2";
        case SimdLevel::avx512: return "avx512";
        case SimdLevel::neon: return "neon";
    }
    return "unknown";
}

std::string format_simd_kernel_table(const std::vector<SimdKernel>& table) {
    // Columns: codec, op, then one per level in the table's order. Rows in each level's order: a line
    // only some levels have (q8_0 score_groups) goes after the line that precedes it at its level.
    std::vector<SimdLevel> levels;
    std::vector<std::pair<std::string, std::string>> keys;
    size_t after = 0;  // where the next new line goes
    for (size_t i = 0; i < table.size(); ++i) {
        const auto& k = table[i];
        if (std::find(levels.begin(), levels.end(), k.level) == levels.end()) {
            levels.push_back(k.level);
            after = 0;
        }
        const std::pair<std::string, std::string> key{k.codec, k.op};
        const auto at = std::find(keys.begin(), keys.end(), key);
        if (at != keys.end()) {
            after = static_cast<size_t>(at - keys.begin()) + 1;
        } else {
            keys.insert(keys.begin() + static_cast<std::ptrdiff_t>(after), key);
            ++after;
        }
    }
    const std::string none = "-";
    std::vector<std::vector<std::string>> rows;
    rows.push_back({"codec", "op"});
    for (SimdLevel l : levels) rows[0].emplace_back(simd_level_name(l));
    for (const auto& key : keys) {
        std::vector<std::string> row{key.first, key.second};
        for (SimdLevel l : levels) {
            const auto it = std::find_if(table.begin(), table.end(), [&](const SimdKernel& k) {
                return k.level == l && k.codec == key.first && k.op == key.second;
            });
            row.push_back(it == table.end() ? none : it->kernel);
        }
        rows.push_back(std::move(row));
    }
    std::vector<size_t> width(rows[0].size(), 0);
    for (const auto& row : rows)
        for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
    std::string s;
    for (const auto& row : rows) {
        std::string line;
        for (size_t i = 0; i < row.size(); ++i) {
            line += row[i];
            if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
        }
        s += line + "\n";
    }
    return s;
}

std::string format_simd_report(const SimdReport& r) {
    std::string s;
    for (const auto& l : r.levels) {
        char ms[32] = "";
        if (l.checked && l.level != SimdLevel::scalar) std::snprintf(ms, sizeof ms, " (%.1f ms)", l.check_ms);
        s += std::string(l.level == r.in_use ? "* " : "  ") + std::string(simd_level_name(l.level)) +
             std::string(8 - simd_level_name(l.level).size(), ' ') + l.detail + ms + "\n";
    }
    s += "in use: " + std::string(simd_level_name(r.in_use)) + " (" + r.reason + ")\n";
    return s;
}

}  // namespace kvq
