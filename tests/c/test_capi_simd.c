/* The C API's SIMD level, report and full self-test. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "kvq/kvq.h"

static void count_line(const char* line, void* ctx) {
    int* n = (int*)ctx;
    ++*n;
    if (strstr(line, " ok ") == NULL) printf("%s\n", line);
}

int main(void) {
    const char* level = kvq_simd_level();
    CHECK(level != NULL && strlen(level) > 0);

    const size_t need = kvq_simd_report(NULL, 0);
    CHECK(need > 0);
    char small[8];
    CHECK(kvq_simd_report(small, sizeof small) == need);
    CHECK(strlen(small) == sizeof small - 1);  /* cut, and NUL-terminated */
    char report[2048];
    CHECK(need < sizeof report);
    CHECK(kvq_simd_report(report, sizeof report) == need);
    CHECK(strstr(report, "in use: ") != NULL);
    CHECK(strstr(report, level) != NULL);
    CHECK(strstr(report, "scalar") != NULL);
    printf("%s", report);

    int lines = 0;
    CHECK_OK(kvq_selftest(count_line, &lines));
    CHECK(lines >= 1);  /* (a NULL on_line is allowed too: the same call without the lines) */
    CHECK(strcmp(kvq_status_name(KVQ_ERR_SELFTEST_FAILED), "KVQ_ERR_SELFTEST_FAILED") == 0);
    return check_report("test_capi_simd");
}
