// Data-set files (.npy dumps, meta.json) opened so that what is not a regular file is refused before any
// read: a FIFO would block for a writer, /dev/zero never ends, a directory reads as nothing. Reads are
// exact: a file shorter than promised is an error, never a short buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvq::detail {

class InputFile {
public:
    // Throws std::invalid_argument naming `path` if it cannot be opened or is not a regular file.
    explicit InputFile(const std::string& path);
    ~InputFile();
    InputFile(const InputFile&) = delete;
    InputFile& operator=(const InputFile&) = delete;

    uint64_t size() const { return size_; }
    // Exactly n bytes at offset into dst; std::invalid_argument if the file ends first.
    void read(uint64_t offset, size_t n, void* dst) const;

private:
    std::string path_;
    int fd_ = -1;
    uint64_t size_ = 0;
};

// The whole text of a regular file of at most max_bytes (std::invalid_argument otherwise, before reading).
std::string read_text_file(const std::string& path, size_t max_bytes);

}  // namespace kvq::detail
