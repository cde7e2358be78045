// Status names, the thread-local last-error message and the version calls of the C API.
#include <algorithm>
#include <cstring>

#include "boundary.hpp"

namespace kvq::capi {
namespace {

// A fixed buffer, not a std::string: recording an error must not allocate (it runs inside catch
// handlers of noexcept functions, possibly after std::bad_alloc).
constexpr size_t kMessageCapacity = 1024;
thread_local char t_message[kMessageCapacity] = "";

}  // namespace

kvq_status fail(kvq_status status, std::string_view message) noexcept {
    const size_t n = std::min(message.size(), kMessageCapacity - 1);
    std::memcpy(t_message, message.data(), n);
    t_message[n] = '\0';
    return status;
}

}  // namespace kvq::capi

extern "C" {

const char* kvq_last_error(void) { return kvq::capi::t_message; }

const char* kvq_status_name(kvq_status status) {
    switch (status) {
        case KVQ_OK: return "KVQ_OK";
        case KVQ_ERR_INVALID_ARGUMENT: return "KVQ_ERR_INVALID_ARGUMENT";
        case KVQ_ERR_BAD_PARAMS: return "KVQ_ERR_BAD_PARAMS";
        case KVQ_ERR_UNKNOWN_CODEC: return "KVQ_ERR_UNKNOWN_CODEC";
        case KVQ_ERR_BAD_HEAD_DIM: return "KVQ_ERR_BAD_HEAD_DIM";
        case KVQ_ERR_POOL_EXHAUSTED: return "KVQ_ERR_POOL_EXHAUSTED";
        case KVQ_ERR_BAD_SEQUENCE: return "KVQ_ERR_BAD_SEQUENCE";
        case KVQ_ERR_BAD_LAYER: return "KVQ_ERR_BAD_LAYER";
        case KVQ_ERR_NON_FINITE: return "KVQ_ERR_NON_FINITE";
        case KVQ_ERR_OUT_OF_MEMORY: return "KVQ_ERR_OUT_OF_MEMORY";
        case KVQ_ERR_INTERNAL: return "KVQ_ERR_INTERNAL";
        case KVQ_ERR_IO: return "KVQ_ERR_IO";
        case KVQ_ERR_BAD_FILE: return "KVQ_ERR_BAD_FILE";
        case KVQ_ERR_CONFIG_MISMATCH: return "KVQ_ERR_CONFIG_MISMATCH";
        case KVQ_ERR_SELFTEST_FAILED: return "KVQ_ERR_SELFTEST_FAILED";
        case KVQ_ERR_EXECUTOR: return "KVQ_ERR_EXECUTOR";
        case KVQ_STATUS_MAX_: break;
    }
    return "unknown status";
}

uint32_t kvq_version(void) { return KVQ_VERSION; }
const char* kvq_version_string(void) { return KVQ_VERSION_STRING; }

}  // extern "C"

// The header's version macros must say what the build says (CMake's project(VERSION)).
#ifdef KVQ_PROJECT_VERSION
static_assert(std::string_view(KVQ_VERSION_STRING) == KVQ_PROJECT_VERSION,
              "KVQ_VERSION_STRING in include/kvq/kvq.h differs from project(VERSION) in CMakeLists.txt");
static_assert(KVQ_VERSION_MAJOR == KVQ_PROJECT_VERSION_MAJOR && KVQ_VERSION_MINOR == KVQ_PROJECT_VERSION_MINOR &&
                  KVQ_VERSION_PATCH == KVQ_PROJECT_VERSION_PATCH,
              "KVQ_VERSION_* in include/kvq/kvq.h differ from project(VERSION) in CMakeLists.txt");
#endif
