// The files save and load use: an output file written beside its destination and renamed over it, and an
// input file read with pread that is a regular file and reports a short read as truncation.
#include "cache_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace kvq::detail::file {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

std::string directory_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    if (slash == std::string::npos) return ".";
    return slash == 0 ? "/" : path.substr(0, slash);
}

std::atomic<uint64_t> g_tmp_counter{0};

// A C string ends at its first NUL: a path holding one would name another file than the caller's.
void check_path(const std::string& path, const char* function) {
    if (path.find('\0') != std::string::npos) {
        throw std::invalid_argument(std::string(function) + ": the path holds a NUL byte (at offset " +
                                    std::to_string(path.find('\0')) + "); no file was touched");
    }
}

}  // namespace

OutFile::OutFile(const std::string& path) : path_(path) {
    check_path(path, "KVCache::save");
    // Unique per process and call, so concurrent saves to one path never share a temporary file.
    tmp_ = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(g_tmp_counter++);
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd_ < 0) {
        const int err = errno;
        throw FileIOError("KVCache::save: cannot create '" + tmp_ + "': " + errno_text(err));
    }
}

OutFile::~OutFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void OutFile::fail(const std::string& what, int err) {
    throw FileIOError("KVCache::save: " + what + ": " + errno_text(err) + "; '" + path_ + "' was not changed");
}

void OutFile::write(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    while (n > 0) {
        const ssize_t w = ::write(fd_, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) fail("cannot write '" + tmp_ + "'", w < 0 ? errno : ENOSPC);
        p += w;
        n -= static_cast<size_t>(w);
        offset_ += static_cast<uint64_t>(w);
    }
}

void OutFile::zeros(size_t n) {
    static const uint8_t zero[4096] = {};
    while (n > 0) {
        const size_t k = std::min(n, sizeof zero);
        write(zero, k);
        n -= k;
    }
}

void OutFile::commit() {
    if (::fsync(fd_) != 0) fail("cannot sync '" + tmp_ + "'", errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) fail("cannot close '" + tmp_ + "'", errno);
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("cannot rename '" + tmp_ + "' to '" + path_ + "'", errno);
    tmp_.clear();  // renamed: nothing to remove any more
    // The rename is durable only once the directory is; it has happened, so a failure here is reported
    // but the new file stays.
    const std::string dir = directory_of(path_);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || ::fsync(dfd) != 0) {
        const int err = errno;
        if (dfd >= 0) ::close(dfd);
        throw FileIOError("KVCache::save: '" + path_ + "' was written but its directory '" + dir +
                          "' could not be synced: " + errno_text(err));
    }
    ::close(dfd);
}

InFile::InFile(const std::string& path) : path_(path) {
    check_path(path, "KVCache::load");
    // O_NONBLOCK: opening a FIFO (or some devices) would otherwise wait for a writer; nothing but a
    // regular file is read, and the flag is cleared once that is known.
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd_ < 0) {
        const int err = errno;
        throw FileIOError("cannot open cache file '" + path + "': " + errno_text(err));
    }
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
        const int err = errno;
        ::close(fd_);
        throw FileIOError("cannot stat cache file '" + path + "': " + errno_text(err));
    }
    if (!S_ISREG(st.st_mode)) {
        ::close(fd_);
        const char* kind = S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : S_ISSOCK(st.st_mode) ? "a socket"
                          : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device" : "not a regular file";
        throw FileIOError("cache file '" + path + "' is " + kind + ", not a regular file; nothing was read");
    }
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0 || ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK) != 0) {
        const int err = errno;
        ::close(fd_);
        throw FileIOError("cannot read cache file '" + path + "': " + errno_text(err));
    }
    size_ = static_cast<uint64_t>(st.st_size);
}

InFile::~InFile() { ::close(fd_); }

void InFile::read(uint64_t offset, size_t n, void* dst, const char* what) const {
    auto* p = static_cast<uint8_t*>(dst);
    while (n > 0) {
        const ssize_t r = ::pread(fd_, p, n, static_cast<off_t>(offset));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            const int err = errno;
            throw FileIOError("cannot read cache file '" + path_ + "': " + errno_text(err));
        }
        if (r == 0) bad(std::string(what) + ": the file ends at byte " + std::to_string(offset) + " (truncated)");
        p += r;
        n -= static_cast<size_t>(r);
        offset += static_cast<uint64_t>(r);
    }
}

std::vector<uint8_t> InFile::read(uint64_t offset, size_t n, const char* what) const {
    std::vector<uint8_t> bytes(n);
    read(offset, n, bytes.data(), what);
    return bytes;
}

}  // namespace kvq::detail::file
