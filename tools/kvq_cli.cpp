// kvq-cli: `kvq table`, `kvq plan` and `kvq info` from C++ (the same library calls as the Python `kvq`
// command, which adds --plot). Run without arguments for help.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kvq/datasets.hpp"
#include "kvq/planner.hpp"
#include "kvq/report.hpp"
#include "kvq/sweep.hpp"

namespace {

const char* kUsage = R"(usage:
  kvq-cli table [--data SPEC]... [--pairs K/V,...] [--keys A,B --values C,D] [--model NAME|CONFIG]
                [--format markdown|csv|json] [--seed N] [--no-timing] [--repeats N] [--progress|--no-progress]
  kvq-cli plan  [--model NAME|CONFIG] [--config CONFIG] [--context N] [--batch N] [--pairs K/V,...] [--format F]
  kvq-cli plan  --list
  kvq-cli info  [--format F]
data SPECs: gaussian, llm (both take key=value knobs: llm:tokens=2048,rope=0), npy:DIR. Default: gaussian and llm.
K/V pairs: KEY_CODEC/VALUE_CODEC, e.g. q8_0/q4_0 or q4_0+rot+center/q4_0 (default: the standard list).
)";

struct Args {
    std::vector<std::string> items;
    size_t pos = 0;
    bool done() const { return pos >= items.size(); }
    std::string value(const std::string& flag) {
        if (pos >= items.size()) throw std::invalid_argument(flag + " needs a value");
        return items[pos++];
    }
};

size_t parse_count(const std::string& flag, const std::string& text) {
    size_t used = 0;
    unsigned long long x = 0;
    try {
        x = std::stoull(text, &used);
    } catch (const std::exception&) {
        used = 0;
    }
    if (used != text.size() || x == 0 || text[0] == '-') throw std::invalid_argument(flag + " needs a positive integer, got '" + text + "'");
    return x;
}

int table(Args& a) {
    std::vector<std::string> data_specs;
    std::string pairs, keys, values, model = "llama-3-8b";
    kvq::TableFormat format = kvq::TableFormat::markdown;
    kvq::SweepOptions o;
    uint64_t seed = 0;
    bool progress = isatty(2);
    while (!a.done()) {
        const std::string f = a.items[a.pos++];
        if (f == "--data") data_specs.push_back(a.value(f));
        else if (f == "--pairs") pairs = a.value(f);
        else if (f == "--keys") keys = a.value(f);
        else if (f == "--values") values = a.value(f);
        else if (f == "--model" || f == "--config") model = a.value(f);
        else if (f == "--format") format = kvq::parse_table_format(a.value(f));
        else if (f == "--seed") seed = std::stoull(a.value(f));
        else if (f == "--no-timing") o.timing = false;
        else if (f == "--repeats") o.timing_repeats = static_cast<int>(parse_count(f, a.value(f)));
        else if (f == "--progress") progress = true;
        else if (f == "--no-progress") progress = false;
        else throw std::invalid_argument("table: unknown option '" + f + "'");
    }
    if (data_specs.empty()) data_specs = {"gaussian", "llm"};
    if (!pairs.empty() && (!keys.empty() || !values.empty())) throw std::invalid_argument("table: give --pairs or --keys/--values, not both");
    if (!pairs.empty()) o.formats = kvq::parse_kv_formats(pairs);
    else if (!keys.empty() || !values.empty()) o.formats = kvq::cross_kv_formats(keys.empty() ? "q8_0" : keys, values.empty() ? "q4_0" : values);
    o.model = kvq::load_model(model);
    std::vector<kvq::KVData> data;
    for (const auto& spec : data_specs) data.push_back(kvq::make_dataset(spec, seed));
    const auto start = std::chrono::steady_clock::now();
    if (progress) {
        o.progress = [start](size_t done, size_t total) {
            const int width = 30, filled = static_cast<int>(width * done / total);
            const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
            std::fprintf(stderr, "\r[%s%s] %zu/%zu  %.0fs", std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done, total, s);
            if (done == total) std::fprintf(stderr, "\n");
        };
    }
    const auto result = kvq::run_sweep(data, o);
    std::cout << kvq::format_sweep(result, format);
    return 0;
}

int plan(Args& a) {
    std::string model = "llama-3-8b", pairs;
    kvq::PlanOptions o;
    kvq::TableFormat format = kvq::TableFormat::markdown;
    bool list = false;
    while (!a.done()) {
        const std::string f = a.items[a.pos++];
        if (f == "--model" || f == "--config") model = a.value(f);
        else if (f == "--context") o.context = parse_count(f, a.value(f));
        else if (f == "--batch") o.batch = parse_count(f, a.value(f));
        else if (f == "--pairs") pairs = a.value(f);
        else if (f == "--format") format = kvq::parse_table_format(a.value(f));
        else if (f == "--list") list = true;
        else throw std::invalid_argument("plan: unknown option '" + f + "'");
    }
    if (list) {
        for (const auto& m : kvq::model_presets()) std::cout << m.name << ": " << m.describe() << "\n";
        return 0;
    }
    const kvq::ModelShape m = kvq::load_model(model);
    const auto formats = pairs.empty() ? kvq::default_kv_formats() : kvq::parse_kv_formats(pairs);
    std::cout << kvq::format_plan(m, kvq::plan_memory(m, formats, o), o, format);
    return 0;
}

int info(Args& a) {
    kvq::TableFormat format = kvq::TableFormat::markdown;
    while (!a.done()) {
        const std::string f = a.items[a.pos++];
        if (f == "--format") format = kvq::parse_table_format(a.value(f));
        else throw std::invalid_argument("info: unknown option '" + f + "'");
    }
    std::cout << kvq::format_codec_info(format);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    Args a{{argv + 1, argv + argc}};
    if (a.done() || a.items[0] == "-h" || a.items[0] == "--help") {
        std::cout << kUsage;
        return a.done() ? 2 : 0;
    }
    const std::string command = a.items[a.pos++];
    try {
        if (command == "table") return table(a);
        if (command == "plan") return plan(a);
        if (command == "info") return info(a);
        std::cerr << "kvq-cli: unknown command '" << command << "'\n" << kUsage;
        return 2;
    } catch (const std::exception& e) {
        std::cerr << "kvq-cli " << command << ": " << e.what() << "\n";
        return 1;
    }
}
