// The exception the cache throws for NaN/Inf input under NanPolicy::reject. It is a std::invalid_argument,
// so C++ callers see nothing new; the C API maps it to KVQ_ERR_NON_FINITE by its type alone, without
// reading the caller's buffers again (whose sizes, on the error path, need not be what the call claims).
#pragma once

#include <stdexcept>

namespace kvq::detail {

class NonFiniteInput : public std::invalid_argument {
public:
    using std::invalid_argument::invalid_argument;
};

}  // namespace kvq::detail
