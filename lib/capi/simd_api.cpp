// The C API's SIMD level, report and self-test (kvq.h): thin wrappers of include/kvq/simd.hpp and
// include/kvq/selftest.hpp.
#include <algorithm>
#include <cstring>
#include <string>

#include "boundary.hpp"
#include "kvq/selftest.hpp"
#include "kvq/simd.hpp"

extern "C" {

const char* kvq_simd_level(void) {
    try {
        return kvq::simd_level_name(kvq::simd_level()).data();  // a literal: NUL-terminated, static
    } catch (...) {
        return "scalar";
    }
}

size_t kvq_simd_report(char* buf, size_t capacity) {
    std::string text;
    try {
        text = kvq::format_simd_report(kvq::simd_report());
    } catch (const std::exception& e) {
        text = std::string("kvq: ") + e.what() + "\n";
    }
    if (buf && capacity > 0) {
        const size_t n = std::min(text.size(), capacity - 1);
        std::memcpy(buf, text.data(), n);
        buf[n] = '\0';
    }
    return text.size();
}

kvq_status kvq_selftest(void (*on_line)(const char* line, void* ctx), void* ctx) {
    return kvq::capi::guarded([&] {
        std::string first;
        const auto result = kvq::selftest([&](const kvq::SelftestLine& l) {
            if (on_line) on_line(kvq::format_selftest_line(l).c_str(), ctx);
            if (!l.passed && first.empty()) first = kvq::format_selftest_line(l);
        });
        if (result.passed()) return KVQ_OK;
        return kvq::capi::fail(KVQ_ERR_SELFTEST_FAILED, first.empty() ? "no level was checked" : first);
    });
}

}  // extern "C"
