// kvq — the exceptions of the C++ API. Bad input throws a std::invalid_argument (or one of the types
// below derived from it, which say what was wrong); a resource that ran out or a file that failed throws a
// std::runtime_error type. Every throwing call changes nothing. The C API returns one status per type
// (kvq.h: KVQ_ERR_*).
#ifndef KVQ_ERRORS_HPP  // a guard, not #pragma once: see tests/CMakeLists.txt (precompiled header)
#define KVQ_ERRORS_HPP

#include <stdexcept>

namespace kvq {

// A codec spec names no codec of the table (KVQ_ERR_UNKNOWN_CODEC).
class UnknownCodec : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

// A head size the codec cannot take: not a multiple of its block, or outside 1..65536 (KVQ_ERR_BAD_HEAD_DIM).
class BadHeadDim : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

// Parameters that are invalid or contradict each other: a codec spec's (what follows "name:"), or a
// CacheConfig's fields (KVQ_ERR_BAD_PARAMS).
class BadParams : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

// A sequence id the cache does not hold (never given out, or removed, also while the call waited for the
// sequence's lock) (KVQ_ERR_BAD_SEQUENCE).
class UnknownSequence : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

// NaN or Inf in rows or queries under NanPolicy::reject (KVQ_ERR_NON_FINITE).
class NonFiniteInput : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

// No free block is left in a pool with max_blocks set (KVQ_ERR_POOL_EXHAUSTED).
class PoolExhausted : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// An engine's executor (CacheConfig::executor) broke its contract: it called the task with an index outside
// [0, n), ran a task twice, or returned without running every task. The call that used it throws this
// once every task the executor started has returned; the cache is unchanged, the call's output
// unspecified (KVQ_ERR_EXECUTOR).
class ExecutorError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A cache file could not be opened, read, written, synced or renamed; the message names the file and
// holds the system's error text (errno). Saving leaves an existing file at the path as it was (KVQ_ERR_IO).
class FileIOError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

// A file is not a cache file this version can read: wrong magic, unsupported format version, truncated,
// a CRC32C that does not match, or contents that contradict each other. The message says which
// (KVQ_ERR_BAD_FILE).
class BadCacheFile : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

// load_into: the file was saved by a cache whose configuration differs from this one's; the message names
// the first field that differs, with both values (KVQ_ERR_CONFIG_MISMATCH).
class ConfigMismatch : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

}  // namespace kvq

#endif  // KVQ_ERRORS_HPP
