#include "input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace kvq::detail {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
    throw std::invalid_argument(path + ": " + problem);
}

const char* kind_of(mode_t mode) {
    return S_ISDIR(mode)                      ? "a directory"
           : S_ISFIFO(mode)                   ? "a FIFO"
           : S_ISSOCK(mode)                   ? "a socket"
           : S_ISCHR(mode) || S_ISBLK(mode)   ? "a device"
                                              : "not a regular file";
}

}  // namespace

InputFile::InputFile(const std::string& path) : path_(path) {
    if (path.find('\0') != std::string::npos) fail(path, "the path holds a NUL byte");
    // O_NONBLOCK: opening a FIFO would otherwise wait for a writer; cleared once the file is known regular.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd_ < 0) fail(path, std::string("cannot open: ") + std::strerror(errno));
    struct stat st;
    const int flags = ::fstat(fd_, &st) == 0 ? ::fcntl(fd_, F_GETFL) : -1;
    if (flags < 0) {
        const int err = errno;
        ::close(fd_);
        fail(path, std::string("cannot read: ") + std::strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd_);
        fail(path, std::string("is ") + kind_of(st.st_mode) + ", not a regular file; nothing was read");
    }
    if (::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        const int err = errno;
        ::close(fd_);
        fail(path, std::string("cannot read: ") + std::strerror(err));
    }
    size_ = static_cast<uint64_t>(st.st_size);
}

InputFile::~InputFile() { ::close(fd_); }

void InputFile::read(uint64_t offset, size_t n, void* dst) const {
    auto* p = static_cast<char*>(dst);
    while (n > 0) {
        const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail(path_, std::string("cannot read: ") + std::strerror(errno));
        if (r == 0) fail(path_, "truncated (the file ended " + std::to_string(n) + " bytes early; did it change while read?)");
        p += r;
        n -= static_cast<size_t>(r);
        offset += static_cast<uint64_t>(r);
    }
}

std::string read_text_file(const std::string& path, size_t max_bytes) {
    const InputFile f(path);
    if (f.size() > max_bytes) {
        fail(path, std::to_string(f.size()) + " bytes, more than the " + std::to_string(max_bytes) + " this file may have");
    }
    std::string text(static_cast<size_t>(f.size()), '\0');
    f.read(0, text.size(), text.data());
    return text;
}

}  // namespace kvq::detail
