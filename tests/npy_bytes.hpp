// The bytes of a .npy file (format 1.0) as NumPy lays it out: magic, version, header length, the header
// dict padded with spaces to a multiple of 64 bytes and ended by '\n', then the raw data.
#ifndef KVQ_TESTS_NPY_BYTES_HPP
#define KVQ_TESTS_NPY_BYTES_HPP

#include <string>

namespace kvq::test {

inline std::string npy_bytes(const std::string& dict, const std::string& data = {}) {
    std::string header = dict;
    const size_t unpadded = 10 + header.size() + 1;
    header.append((64 - unpadded % 64) % 64, ' ');
    header += '\n';
    std::string s = "\x93NUMPY";
    s += '\x01';
    s += '\x00';
    s += static_cast<char>(header.size() & 0xff);
    s += static_cast<char>(header.size() >> 8);
    return s + header + data;
}

}  // namespace kvq::test

#endif
