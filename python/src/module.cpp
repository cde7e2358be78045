// kvq._core: the compiled half of the kvq Python package. The functions themselves live in the
// bind_*.cpp files, which register themselves (bindings.hpp).
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "bindings.hpp"

namespace kvq::python {
namespace {

std::vector<std::pair<std::string, BindFunction>>& registry() {
    static std::vector<std::pair<std::string, BindFunction>> functions;
    return functions;
}

}  // namespace

Registration::Registration(const char* name, BindFunction bind) { registry().emplace_back(name, bind); }

void bind_all(py::module_& m) {
    auto functions = registry();
    // Static initialization order across files is unspecified; name order is not.
    std::sort(functions.begin(), functions.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [name, bind] : functions) bind(m);
}

}  // namespace kvq::python

PYBIND11_MODULE(_core, m) {
    m.doc() = "kvq: quantized KV cache and attention on quantized rows (compiled module; use `import kvq`)";
    m.attr("__version__") = KVQ_VERSION;
    kvq::python::bind_all(m);
}
