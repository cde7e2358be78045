// .npy reading and writing. The header is a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// parsed here by a small scanner that accepts exactly the three keys NumPy writes.
#include "kvq/research/npy.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <utility>

#include "input_file.hpp"
#include "ref/half.hpp"

namespace kvq {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// NumPy writes headers of a few hundred bytes and by default reads none beyond 10000.
constexpr size_t kMaxNpyHeaderBytes = size_t(1) << 16;

[[noreturn]] void fail(const std::string& what, const std::string& problem) {
    throw std::invalid_argument(what + ": " + problem);
}

// Scanner over the header dict.
struct HeaderScanner {
    const std::string& text;
    const std::string& what;
    size_t pos = 0;

    void skip_space() {
        while (pos < text.size() && (text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t')) ++pos;
    }
    bool take(char c) {
        skip_space();
        if (pos < text.size() && text[pos] == c) {
            ++pos;
            return true;
        }
        return false;
    }
    void expect(char c) {
        if (!take(c)) fail(what, std::string("corrupt .npy header (expected '") + c + "' at " + std::to_string(pos) + " in " + text + ")");
    }
    std::string string_literal() {
        skip_space();
        if (pos >= text.size() || (text[pos] != '\'' && text[pos] != '"')) fail(what, "corrupt .npy header (expected a quoted string): " + text);
        const char quote = text[pos++];
        const size_t end = text.find(quote, pos);
        if (end == std::string::npos) fail(what, "corrupt .npy header (unterminated string): " + text);
        std::string s = text.substr(pos, end - pos);
        pos = end + 1;
        return s;
    }
    bool boolean() {
        skip_space();
        for (const auto& [word, value] : {std::pair{"True", true}, std::pair{"False", false}}) {
            if (text.compare(pos, std::strlen(word), word) == 0) {
                pos += std::strlen(word);
                return value;
            }
        }
        fail(what, "corrupt .npy header (expected True or False): " + text);
    }
    std::vector<size_t> shape_tuple() {
        expect('(');
        std::vector<size_t> shape;
        while (!take(')')) {
            skip_space();
            size_t start = pos;
            while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') ++pos;
            if (start == pos) fail(what, "corrupt .npy header (bad shape): " + text);
            size_t n = 0;
            for (size_t i = start; i < pos; ++i) {
                if (__builtin_mul_overflow(n, size_t{10}, &n) || __builtin_add_overflow(n, size_t(text[i] - '0'), &n)) {
                    fail(what, "shape number " + text.substr(start, pos - start) + " is beyond " + std::to_string(SIZE_MAX));
                }
            }
            shape.push_back(n);
            if (!take(',')) {
                expect(')');
                break;
            }
        }
        return shape;
    }
};

// What a header promises: the array's shape and dtype, where its data starts and how many bytes it holds.
struct NpyHeader {
    std::vector<size_t> shape;
    std::string dtype;
    size_t item = 0;
    size_t data_offset = 0;
    size_t data_bytes = 0;
};

// The length of the header dict and where it starts, from the first 12 (or fewer) bytes of a file.
std::pair<size_t, size_t> header_extent(const uint8_t* p, size_t n_bytes, const std::string& what) {
    if (n_bytes < kMagicLen + 4 || std::memcmp(p, kMagic, kMagicLen) != 0) fail(what, "not a .npy file (bad magic)");
    const int major = p[6];
    if (major == 1) return {p[8] | (size_t(p[9]) << 8), 10};
    if (major != 2 && major != 3) fail(what, "unsupported .npy format version " + std::to_string(major));
    if (n_bytes < 12) fail(what, "truncated .npy header");
    const size_t len = p[8] | (size_t(p[9]) << 8) | (size_t(p[10]) << 16) | (size_t(p[11]) << 24);
    if (len > kMaxNpyHeaderBytes) {
        fail(what, ".npy header of " + std::to_string(len) + " bytes, beyond the " + std::to_string(kMaxNpyHeaderBytes) +
                       " read here (NumPy writes a few hundred)");
    }
    return {len, 12};
}

NpyHeader parse_header(const std::string& header, size_t data_offset, const std::string& what) {
    std::string descr;
    bool fortran = false, have_descr = false, have_order = false, have_shape = false;
    NpyHeader h;
    h.data_offset = data_offset;
    HeaderScanner scan{header, what};
    scan.expect('{');
    while (!scan.take('}')) {
        const std::string key = scan.string_literal();
        scan.expect(':');
        if (key == "descr") {
            descr = scan.string_literal();
            have_descr = true;
        } else if (key == "fortran_order") {
            fortran = scan.boolean();
            have_order = true;
        } else if (key == "shape") {
            h.shape = scan.shape_tuple();
            have_shape = true;
        } else {
            fail(what, "corrupt .npy header (unknown key '" + key + "')");
        }
        if (!scan.take(',')) {
            scan.expect('}');
            break;
        }
    }
    if (!have_descr || !have_order || !have_shape) fail(what, "corrupt .npy header (needs descr, fortran_order and shape): " + header);
    if (fortran) fail(what, "Fortran-order arrays are not supported (save np.ascontiguousarray(x))");
    if (descr == "<f4" || descr == "=f4") {
        h.dtype = "float32";
        h.item = 4;
    } else if (descr == "<f2" || descr == "=f2") {
        h.dtype = "float16";
        h.item = 2;
    } else {
        fail(what, "dtype '" + descr + "' is not supported (expected little-endian float32 '<f4' or float16 '<f2')");
    }
    // The element count and the byte count must not wrap: a shape of huge numbers promises more than any file.
    size_t n = 1;
    for (size_t s : h.shape) {
        if (__builtin_mul_overflow(n, s, &n)) fail(what, "shape " + shape_string(h.shape) + " holds more elements than fit in 64 bits");
    }
    if (__builtin_mul_overflow(n, h.item, &h.data_bytes) || h.data_bytes > SIZE_MAX - data_offset) {
        fail(what, "shape " + shape_string(h.shape) + " of " + h.dtype + " holds more bytes than fit in 64 bits");
    }
    return h;
}

void check_data_size(const NpyHeader& h, uint64_t n_bytes, const std::string& what) {
    if (n_bytes - h.data_offset != h.data_bytes) {
        fail(what, "data size " + std::to_string(n_bytes - h.data_offset) + " bytes does not match shape " +
                       shape_string(h.shape) + " of " + h.dtype + " (" + std::to_string(h.data_bytes) + " bytes)");
    }
}

// The array of a checked header from its data bytes.
NpyArray to_array(NpyHeader h, const uint8_t* data) {
    NpyArray a;
    a.shape = std::move(h.shape);
    a.dtype = h.dtype;
    const size_t n = h.data_bytes / h.item;
    a.data.resize(n);
    if (n == 0) return a;  // (memcpy of nothing from or to a null pointer is still undefined)
    if (h.item == 4) {
        std::memcpy(a.data.data(), data, n * 4);
    } else {
        for (size_t i = 0; i < n; ++i) a.data[i] = detail::f16_to_f32(static_cast<uint16_t>(data[2 * i] | (data[2 * i + 1] << 8)));
    }
    return a;
}

}  // namespace

size_t NpyArray::size() const {
    size_t n = 1;
    for (size_t s : shape) n *= s;
    return n;
}

std::string shape_string(const std::vector<size_t>& shape) {
    std::string s = "(";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

NpyArray parse_npy(const void* bytes, size_t n_bytes, const std::string& what) {
    const auto* p = static_cast<const uint8_t*>(bytes);
    const auto [header_len, offset] = header_extent(p, n_bytes, what);
    if (header_len > n_bytes - offset) fail(what, "truncated .npy header");
    const NpyHeader h = parse_header(std::string(reinterpret_cast<const char*>(p + offset), header_len), offset + header_len, what);
    check_data_size(h, n_bytes, what);
    return to_array(h, p + h.data_offset);
}

// The header first, then exactly the bytes it promises, once the file's size is seen to match: a file
// of the wrong size is refused before its data is read (or memory is taken for it).
NpyArray read_npy(const std::string& path) {
    const detail::InputFile f(path);
    uint8_t prefix[12] = {};
    const size_t prefix_len = static_cast<size_t>(std::min<uint64_t>(f.size(), sizeof prefix));
    f.read(0, prefix_len, prefix);
    const auto [header_len, offset] = header_extent(prefix, prefix_len, path);
    if (header_len > f.size() - offset) fail(path, "truncated .npy header");
    std::string header(header_len, '\0');
    f.read(offset, header_len, header.data());
    const NpyHeader h = parse_header(header, offset + header_len, path);
    check_data_size(h, f.size(), path);
    std::vector<uint8_t> data(h.data_bytes);
    f.read(h.data_offset, data.size(), data.data());
    return to_array(h, data.data());
}

void write_npy(const std::string& path, const float* data, size_t n_values, const std::vector<size_t>& shape) {
    size_t n = 1;
    for (size_t s : shape) {
        if (__builtin_mul_overflow(n, s, &n)) throw std::invalid_argument("write_npy: shape " + shape_string(shape) + " holds more values than fit in 64 bits");
    }
    if (n != n_values) {
        throw std::invalid_argument("write_npy: shape " + shape_string(shape) + " holds " + std::to_string(n) +
                                    " values, got " + std::to_string(n_values));
    }
    std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_string(shape) + ", }";
    // Pad with spaces so the data starts on a 64-byte boundary, ending in a newline, as NumPy does.
    const size_t unpadded = kMagicLen + 4 + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header += '\n';
    std::ofstream f(path, std::ios::binary);
    if (!f) throw std::invalid_argument(path + ": cannot open for writing");
    f.write(kMagic, kMagicLen);
    const char version[2] = {1, 0};
    f.write(version, 2);
    const char len[2] = {static_cast<char>(header.size() & 0xff), static_cast<char>(header.size() >> 8)};
    f.write(len, 2);
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(n * sizeof(float)));
    if (!f) throw std::invalid_argument(path + ": write failed");
}

}  // namespace kvq
