/* A few checks for the C tests: each failure prints where and why (with kvq_last_error()) and the
 * program exits non-zero at the end. */
#ifndef KVQ_TESTS_C_CHECK_H
#define KVQ_TESTS_C_CHECK_H

#include <kvq/kvq.h>

#include <stdio.h>
#include <string.h>

static int check_failures = 0;
static int check_count = 0;

#define CHECK(cond)                                                                               \
    do {                                                                                          \
        ++check_count;                                                                            \
        if (!(cond)) {                                                                            \
            ++check_failures;                                                                     \
            fprintf(stderr, "%s:%d: CHECK(%s) failed; last error: %s\n", __FILE__, __LINE__, #cond, \
                    kvq_last_error());                                                            \
        }                                                                                         \
    } while (0)

#define CHECK_STR_EQ(a, b) CHECK(strcmp((a), (b)) == 0)

/* The call returns `expected` and the thread's last-error message contains `fragment`. */
#define CHECK_STATUS(call, expected, fragment)                                                         \
    do {                                                                                               \
        const kvq_status got_ = (call);                                                                \
        ++check_count;                                                                                 \
        if (got_ != (expected) || strstr(kvq_last_error(), (fragment)) == NULL) {                      \
            ++check_failures;                                                                          \
            fprintf(stderr, "%s:%d: %s returned %s (wanted %s), message \"%s\" (wanted \"%s\" in it)\n", \
                    __FILE__, __LINE__, #call, kvq_status_name(got_), kvq_status_name(expected),        \
                    kvq_last_error(), (fragment));                                                     \
        }                                                                                              \
    } while (0)

#define CHECK_OK(call)                                                                             \
    do {                                                                                           \
        const kvq_status got_ = (call);                                                            \
        ++check_count;                                                                             \
        if (got_ != KVQ_OK) {                                                                      \
            ++check_failures;                                                                      \
            fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call,              \
                    kvq_status_name(got_), kvq_last_error());                                      \
        }                                                                                          \
    } while (0)

static int check_report(const char* name) {
    printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
    return check_failures == 0 ? 0 : 1;
}

#endif
