/* A minimal test harness: checks that print both values and the location,
 * count failures, and a closing line "N passed, N failed" per executable.
 * Every test is a function `static void test_x(void)` run with RUN(test_x). */
#ifndef PT_TEST_H
#define PT_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int pt_test_failures_;
static int pt_test_checks_;
static int pt_test_case_failed_;
static int pt_test_passed_, pt_test_failed_;

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        pt_test_checks_++;                                                                         \
        if (!(cond)) {                                                                             \
            pt_test_failures_++;                                                                   \
            pt_test_case_failed_ = 1;                                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);               \
        }                                                                                          \
    } while (0)

#define CHECK_EQ(a, b)                                                                             \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        pt_test_checks_++;                                                                         \
        if (a_ != b_) {                                                                            \
            pt_test_failures_++;                                                                   \
            pt_test_case_failed_ = 1;                                                              \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", __FILE__,         \
                    __LINE__, #a, #b, a_, b_);                                                     \
        }                                                                                          \
    } while (0)

/* |a - b| <= atol + rtol * |b| */
#define CHECK_NEAR(a, b, atol, rtol)                                                               \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                                 \
        pt_test_checks_++;                                                                         \
        if (!(fabs(a_ - b_) <= (atol) + (rtol)*fabs(b_))) {                                        \
            pt_test_failures_++;                                                                   \
            pt_test_case_failed_ = 1;                                                              \
            fprintf(stderr, "%s:%d: CHECK_NEAR failed: %s ~ %s (%.9g vs %.9g, diff %.3g)\n",       \
                    __FILE__, __LINE__, #a, #b, a_, b_, fabs(a_ - b_));                            \
        }                                                                                          \
    } while (0)

#define CHECK_OK(expr)                                                                             \
    do {                                                                                           \
        int s_ = (int)(expr);                                                                      \
        pt_test_checks_++;                                                                         \
        if (s_ != 0) {                                                                             \
            pt_test_failures_++;                                                                   \
            pt_test_case_failed_ = 1;                                                              \
            fprintf(stderr, "%s:%d: CHECK_OK failed: %s returned %d (%s)\n", __FILE__, __LINE__,   \
                    #expr, s_, pt_error_message());                                                \
        }                                                                                          \
    } while (0)

#define RUN(fn)                                                                                    \
    do {                                                                                           \
        pt_test_case_failed_ = 0;                                                                  \
        fn();                                                                                      \
        if (pt_test_case_failed_) {                                                                \
            pt_test_failed_++;                                                                     \
            fprintf(stderr, "FAIL %s\n", #fn);                                                     \
        } else {                                                                                   \
            pt_test_passed_++;                                                                     \
            fprintf(stderr, "ok   %s\n", #fn);                                                     \
        }                                                                                          \
    } while (0)

/* Prints the closing line and returns the process exit status. */
#define TEST_DONE()                                                                                \
    (printf("%d passed, %d failed\n", pt_test_passed_, pt_test_failed_), pt_test_failed_ ? 1 : 0)

#endif
