// kvq — a small reader and writer for NumPy's .npy files (format versions 1.0, 2.0 and 3.0).
//
// Only what K/V dumps need: little-endian float32 ('<f4') or float16 ('<f2') arrays in C order. Anything
// else (another dtype, big-endian data, Fortran order, a damaged header, a file shorter than its shape
// says) throws std::invalid_argument with a message naming the file and the problem.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace kvq {

struct NpyArray {
    std::vector<size_t> shape;
    std::string dtype;        // as stored: "float32" or "float16"
    std::vector<float> data;  // the values in C order, converted to float32

    size_t size() const;  // product of shape (1 for a 0-d array)
};

NpyArray read_npy(const std::string& path);
// Parses .npy bytes already in memory; `what` names them in error messages.
NpyArray parse_npy(const void* bytes, size_t n_bytes, const std::string& what = "npy data");

// Writes a float32 array in C order (format 1.0). Throws std::invalid_argument if the file cannot be
// written or the shape does not match n_values.
void write_npy(const std::string& path, const float* data, size_t n_values, const std::vector<size_t>& shape);

// Shape as NumPy prints it: "(2, 3)".
std::string shape_string(const std::vector<size_t>& shape);

}  // namespace kvq
