// numpy arrays into C++: checked, and never copied when they are already what the library reads.
#include <cmath>
#include <stdexcept>

#include "bindings.hpp"

namespace kvq::python {
using namespace pybind11::literals;
namespace {

std::string describe_expected(std::initializer_list<Dim> dims) {
    std::string s = "(";
    bool first = true;
    for (const Dim& d : dims) {
        if (!first) s += ", ";
        first = false;
        s += d.name;
        if (d.size >= 0) s += "=" + std::to_string(d.size);
    }
    if (dims.size() == 1 && dims.begin()->size != kLeading) s += ",";
    return s + ")";
}

std::string describe_shape(const py::array& a) {
    std::string s = "(";
    for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
    if (a.ndim() == 1) s += ",";
    return s + ")";
}

std::string describe_got(py::handle obj) {
    if (!py::isinstance<py::array>(obj)) {
        return "an object of type " + py::str(py::type::handle_of(obj).attr("__name__")).cast<std::string>();
    }
    const auto a = py::reinterpret_borrow<py::array>(obj);
    const bool contiguous = a.flags() & py::array::c_style;
    return std::string("a ") + (contiguous ? "" : "non-contiguous ") +
           py::str(a.dtype()).cast<std::string>() + " array of shape " + describe_shape(a);
}

bool shape_matches(const py::array& a, std::initializer_list<Dim> dims) {
    const bool leading = dims.size() > 0 && dims.begin()->size == kLeading;
    const py::ssize_t fixed = static_cast<py::ssize_t>(dims.size()) - (leading ? 1 : 0);
    if (leading ? a.ndim() < fixed : a.ndim() != fixed) return false;
    const py::ssize_t offset = a.ndim() - fixed;
    py::ssize_t i = 0;
    for (const Dim& d : dims) {
        if (d.size == kLeading) continue;
        if (d.size >= 0 && a.shape(offset + i) != d.size) return false;
        ++i;
    }
    return true;
}

CheckedArray checked(py::array a) {
    CheckedArray out;
    out.shape.assign(a.shape(), a.shape() + a.ndim());
    out.size = static_cast<size_t>(a.size());
    out.array = std::move(a);
    return out;
}

[[noreturn]] void raise_expected(py::handle obj, std::string_view what, const char* dtype,
                                 std::initializer_list<Dim> dims) {
    raise_value_error(std::string(what) + ": expected a " + dtype + " array of shape " +
                      describe_expected(dims) + ", got " + describe_got(obj));
}

}  // namespace

void raise_value_error(const std::string& message) { throw py::value_error(message); }

// A torch tensor as a numpy array (detached, on the CPU; bfloat16, which numpy lacks, as float32); anything
// else unchanged.
py::object from_torch(py::handle obj) {
    const py::handle type = py::type::handle_of(obj);
    if (py::str(type.attr("__module__")).cast<std::string>() != "torch" || !py::hasattr(obj, "numpy")) {
        return py::reinterpret_borrow<py::object>(obj);
    }
    py::object t = obj.attr("detach")().attr("cpu")();
    if (py::str(t.attr("dtype")).cast<std::string>() == "torch.bfloat16") t = t.attr("float")();
    return t.attr("numpy")();
}

CheckedArray float_array(py::handle input, std::string_view what, std::initializer_list<Dim> dims) {
    const char* expected = "float32, float16 or float64";
    const py::object obj = from_torch(input);
    if (!py::isinstance<py::array>(obj)) raise_expected(input, what, expected, dims);
    auto a = py::reinterpret_borrow<py::array>(obj);
    if (!shape_matches(a, dims) || a.dtype().kind() != 'f' || a.dtype().itemsize() < 2 || a.dtype().itemsize() > 8) {
        raise_expected(obj, what, expected, dims);
    }
    if (py::isinstance<py::array_t<float>>(a) && (a.flags() & py::array::c_style)) return checked(std::move(a));
    // float16, float64 or a strided view: one conversion to C-contiguous float32 (numpy's: exact from
    // float16, rounded to nearest from float64, where values beyond float32's range become Inf and are
    // then refused as non-finite), then the same path.
    const py::object numpy = py::module_::import("numpy");
    return checked(numpy.attr("ascontiguousarray")(a, "dtype"_a = numpy.attr("float32")).cast<py::array>());
}

CheckedArray byte_array(py::handle obj, std::string_view what, std::initializer_list<Dim> dims) {
    if (!py::isinstance<py::array>(obj)) raise_expected(obj, what, "C-contiguous uint8", dims);
    auto a = py::reinterpret_borrow<py::array>(obj);
    if (!(a.flags() & py::array::c_style) || !shape_matches(a, dims) || !py::isinstance<py::array_t<uint8_t>>(a)) {
        raise_expected(obj, what, "C-contiguous uint8", dims);
    }
    return checked(std::move(a));
}

void require_finite(const CheckedArray& a, std::string_view what) {
    const float* x = a.floats();
    for (size_t i = 0; i < a.size; ++i) {
        if (!std::isfinite(x[i])) {
            raise_value_error(std::string(what) + ": element " + std::to_string(i) +
                              " (flat index) is not finite (NaN or Inf)");
        }
    }
}

py::array_t<float> new_float_array(const std::vector<py::ssize_t>& shape) { return py::array_t<float>(shape); }
py::array_t<uint8_t> new_byte_array(const std::vector<py::ssize_t>& shape) { return py::array_t<uint8_t>(shape); }

}  // namespace kvq::python
