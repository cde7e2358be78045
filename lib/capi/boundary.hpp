// The C API's side of the boundary: what the opaque handles hold, the thread-local error message, and
// `guarded`, which every entry point runs its body through so that no exception reaches C.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>

#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/kvq.h"

struct kvq_codec {
    kvq::Codec codec;
};

// Hidden: internals of the shared library, not exported with the rest of namespace kvq (lib/kvq.map).
#if defined(__GNUC__)
#define KVQ_CAPI_HIDDEN __attribute__((visibility("hidden")))
#else
#define KVQ_CAPI_HIDDEN
#endif
namespace kvq {
namespace capi KVQ_CAPI_HIDDEN {

// Records the message for kvq_last_error() and returns status. Never allocates, never throws, so it is
// safe inside catch handlers of noexcept functions (long messages are cut).
kvq_status fail(kvq_status status, std::string_view message) noexcept;

// Runs body (returning kvq_status) and turns every exception into a status and a message.
template <class Body>
kvq_status guarded(Body&& body) noexcept {
    try {
        return body();
    } catch (const kvq::PoolExhausted& e) {
        return fail(KVQ_ERR_POOL_EXHAUSTED, e.what());
    } catch (const kvq::ExecutorError& e) {
        return fail(KVQ_ERR_EXECUTOR, e.what());
    } catch (const kvq::FileIOError& e) {
        return fail(KVQ_ERR_IO, e.what());
    } catch (const kvq::BadCacheFile& e) {
        return fail(KVQ_ERR_BAD_FILE, e.what());
    } catch (const kvq::ConfigMismatch& e) {
        return fail(KVQ_ERR_CONFIG_MISMATCH, e.what());
    } catch (const kvq::UnknownSequence& e) {
        return fail(KVQ_ERR_BAD_SEQUENCE, e.what());
    } catch (const kvq::NonFiniteInput& e) {
        return fail(KVQ_ERR_NON_FINITE, e.what());
    } catch (const kvq::UnknownCodec& e) {
        return fail(KVQ_ERR_UNKNOWN_CODEC, e.what());
    } catch (const kvq::BadHeadDim& e) {
        return fail(KVQ_ERR_BAD_HEAD_DIM, e.what());
    } catch (const kvq::BadParams& e) {
        return fail(KVQ_ERR_BAD_PARAMS, e.what());
    } catch (const std::invalid_argument& e) {
        return fail(KVQ_ERR_INVALID_ARGUMENT, e.what());
    } catch (const std::bad_alloc&) {
        return fail(KVQ_ERR_OUT_OF_MEMORY, "out of memory");
    } catch (const std::exception& e) {
        return fail(KVQ_ERR_INTERNAL, e.what());
    } catch (...) {
        return fail(KVQ_ERR_INTERNAL, "unknown exception");
    }
}

inline bool any_non_finite(const float* x, size_t n) {
    if (!x) return false;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(x[i])) return true;
    }
    return false;
}

// Reads a caller's versioned struct (see the ABI notes in kvq.h) into `into`, which holds the defaults.
// min_size is the struct's size in the first release: never change it.
template <class T>
kvq_status read_versioned(const T* in, size_t min_size, const char* null_message, T& into) noexcept {
    if (!in) return fail(KVQ_ERR_INVALID_ARGUMENT, null_message);
    if (in->size < min_size) return fail(KVQ_ERR_INVALID_ARGUMENT, "struct size field too small (set it to sizeof)");
    const auto* bytes = reinterpret_cast<const unsigned char*>(in);
    for (size_t i = sizeof(T); i < in->size; ++i) {
        if (bytes[i] != 0) {
            return fail(KVQ_ERR_INVALID_ARGUMENT,
                        "struct from a newer kvq.h sets fields this library does not know; upgrade libkvq");
        }
    }
    std::memcpy(static_cast<void*>(&into), in, in->size < sizeof(T) ? in->size : sizeof(T));
    into.size = sizeof(T);
    return KVQ_OK;
}

// Writes a struct to a caller's versioned struct: only the fields that fit in its size.
template <class T>
kvq_status write_versioned(const T& from, size_t min_size, T* out) noexcept {
    if (!out) return fail(KVQ_ERR_INVALID_ARGUMENT, "output struct is NULL");
    if (out->size < min_size) return fail(KVQ_ERR_INVALID_ARGUMENT, "struct size field too small (set it to sizeof)");
    const size_t caller_size = out->size;
    std::memcpy(static_cast<void*>(out), &from, caller_size < sizeof(T) ? caller_size : sizeof(T));
    out->size = caller_size;
    return KVQ_OK;
}

}  // namespace capi
}  // namespace kvq
