/* Linked into every C test: when KVQ_SIMD names a level, the test runs only if that level is the one in
 * use (the CPU runs it and it passed its self-check); otherwise it exits with 77, which ctest reports
 * as skipped, so a level this CPU lacks is never reported as tested. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvq/kvq.h"

__attribute__((constructor)) static void kvq_test_level_guard(void) {
    const char* wanted = getenv("KVQ_SIMD");
    if (!wanted || !*wanted) return;
    if (strcmp(kvq_simd_level(), wanted) != 0) {
        char report[1024];
        kvq_simd_report(report, sizeof report);
        printf("skipped: KVQ_SIMD=%s is not the level in use here\n%s", wanted, report);
        exit(77);
    }
}
