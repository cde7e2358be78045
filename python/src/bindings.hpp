// Shared by every python/src/*.cpp: how a file adds its part of kvq._core, and how numpy arrays cross
// into C++ (without a copy when they are C-contiguous float32; float16, float64, strided arrays and torch
// tensors are converted once).
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>  // in every file alike: type casters must agree across translation units

#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace kvq::python {

namespace py = pybind11;

// A bind_*.cpp file defines `static const Registration r("name", bind_fn);`. When Python imports
// kvq._core, module.cpp calls every registered function in name order, so adding a file to python/src/
// (which CMake globs) is all it takes to add bindings.
using BindFunction = void (*)(py::module_&);
struct Registration {
    Registration(const char* name, BindFunction bind);
};
void bind_all(py::module_& m);

// One dimension of an expected shape: its name and size (kAny: any size). A first dimension named
// "..." with size kLeading stands for any number of leading dimensions.
inline constexpr py::ssize_t kAny = -1;
inline constexpr py::ssize_t kLeading = -2;
struct Dim {
    const char* name;
    py::ssize_t size = kAny;
};

// A numpy array checked against an expected shape. For float arrays, `array` is float32 and
// C-contiguous: the caller's own array when it was C-contiguous float32 (no copy), else a converted copy.
struct CheckedArray {
    py::array array;
    std::vector<py::ssize_t> shape;
    size_t size = 0;  // number of elements

    const float* floats() const { return static_cast<const float*>(array.data()); }
    const uint8_t* bytes() const { return static_cast<const uint8_t*>(array.data()); }
    py::ssize_t dim(int i) const { return shape[i < 0 ? shape.size() + i : i]; }
};

// what names the argument in errors ("append: k"). Takes a float32, float16 or float64 ndarray of the
// expected shape, strided or not, or a torch tensor (detached and moved to the CPU; bfloat16 via float32);
// anything else raises ValueError: "append: k: expected a float32, float16 or float64 array of shape
// (T, n_kv_heads=8, head_dim=128), got a int32 array of shape (4, 8, 128)".
CheckedArray float_array(py::handle obj, std::string_view what, std::initializer_list<Dim> dims);
// The same for a C-contiguous uint8 array (codes), never copied.
CheckedArray byte_array(py::handle obj, std::string_view what, std::initializer_list<Dim> dims);

// Raises ValueError naming the first NaN or Inf element (by its index in the array).
void require_finite(const CheckedArray& a, std::string_view what);

// A new C-contiguous array of the given shape, allocated while the GIL is held.
py::array_t<float> new_float_array(const std::vector<py::ssize_t>& shape);
py::array_t<uint8_t> new_byte_array(const std::vector<py::ssize_t>& shape);

[[noreturn]] void raise_value_error(const std::string& message);

// Releases the GIL for a call into kvq, as py::gil_scoped_release does, but safe at interpreter exit
// (gil.cpp): once Python has begun to exit, a thread never takes the GIL back from here (it sleeps until
// the process ends), and the exit waits until no call is inside kvq.
class WithoutGil {
public:
    WithoutGil();
    ~WithoutGil();
    WithoutGil(const WithoutGil&) = delete;
    WithoutGil& operator=(const WithoutGil&) = delete;

private:
    void* saved_;  // PyThreadState*
};

// Takes the GIL inside a WithoutGil region (a progress callback); throws std::runtime_error instead once
// the interpreter is exiting, so that the call ends early.
class WithGil {
public:
    WithGil();
    ~WithGil();
    WithGil(const WithGil&) = delete;
    WithGil& operator=(const WithGil&) = delete;

private:
    int state_;  // PyGILState_STATE
};

}  // namespace kvq::python
