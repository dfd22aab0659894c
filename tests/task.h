/*
 * task.h: the test harness, after libuv's.
 *
 * Conventions
 * -----------
 * - Each test is TEST_IMPL(name) in a file of its own feature
 *   (test-<feature>.c) and is listed in test-list.h with its timeout.
 * - The runner (runner.c) forks one child per test, so a crash or a hang
 *   fails that test alone; a test that outlives its timeout is killed.
 * - ASSERT_* macros print the failing expression with both values, then
 *   abort(), which the parent reports as a failure.
 * - A test returns 0 when it passed, or TEST_SKIP with a reason on stderr.
 * - Fixtures come from LARDER_TEST_DATA (tests/data by default); scratch
 *   space from test_tmpdir(), which the runner removes afterwards.
 */
#ifndef LARDER_TASK_H
#define LARDER_TASK_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SKIP 77

#define TEST_IMPL(name) int run_test_##name(void)
#define TEST_DECLARE(name) int run_test_##name(void);

#define ASSERT_FAIL_(fmt, ...)                                                          \
  do {                                                                                  \
    fprintf(stderr, "Assertion failed in %s on line %d: " fmt "\n", __FILE__, __LINE__, \
            __VA_ARGS__);                                                               \
    fflush(stderr);                                                                     \
    abort();                                                                            \
  } while (0)

#define ASSERT(expr)                        \
  do {                                      \
    if (!(expr)) ASSERT_FAIL_("%s", #expr); \
  } while (0)

#define ASSERT_BASE_(a, op, b, type, fmt)                                                    \
  do {                                                                                       \
    type eval_a_ = (type)(a);                                                                \
    type eval_b_ = (type)(b);                                                                \
    if (!(eval_a_ op eval_b_))                                                               \
      ASSERT_FAIL_("`%s %s %s` (%" fmt " %s %" fmt ")", #a, #op, #b, eval_a_, #op, eval_b_); \
  } while (0)

#define ASSERT_EQ(a, b) ASSERT_BASE_(a, ==, b, int64_t, PRId64)
#define ASSERT_NE(a, b) ASSERT_BASE_(a, !=, b, int64_t, PRId64)
#define ASSERT_GE(a, b) ASSERT_BASE_(a, >=, b, int64_t, PRId64)
#define ASSERT_GT(a, b) ASSERT_BASE_(a, >, b, int64_t, PRId64)
#define ASSERT_LE(a, b) ASSERT_BASE_(a, <=, b, int64_t, PRId64)
#define ASSERT_LT(a, b) ASSERT_BASE_(a, <, b, int64_t, PRId64)
#define ASSERT_UINT_EQ(a, b) ASSERT_BASE_(a, ==, b, uint64_t, PRIu64)
#define ASSERT_DOUBLE_EQ(a, b) ASSERT_BASE_(a, ==, b, double, "g")
#define ASSERT_DOUBLE_LE(a, b) ASSERT_BASE_(a, <=, b, double, "g")
#define ASSERT_DOUBLE_GE(a, b) ASSERT_BASE_(a, >=, b, double, "g")
#define ASSERT_OK(a) ASSERT_EQ(a, 0)
#define ASSERT_NULL(a) ASSERT((a) == NULL)
#define ASSERT_NOT_NULL(a) ASSERT((a) != NULL)
#define ASSERT_PTR_EQ(a, b) ASSERT((const void *)(a) == (const void *)(b))

#define ASSERT_STR_EQ(a, b)                                                       \
  do {                                                                            \
    const char *sa_ = (a), *sb_ = (b);                                            \
    if (sa_ == NULL || sb_ == NULL || strcmp(sa_, sb_) != 0)                      \
      ASSERT_FAIL_("`%s == %s` (\"%s\" == \"%s\")", #a, #b, sa_ ? sa_ : "(null)", \
                   sb_ ? sb_ : "(null)");                                         \
  } while (0)

#define ASSERT_STR_CONTAINS(hay, needle)                                                      \
  do {                                                                                        \
    const char *sh_ = (hay), *sn_ = (needle);                                                 \
    if (sh_ == NULL || strstr(sh_, sn_) == NULL)                                              \
      ASSERT_FAIL_("`%s` does not contain \"%s\" (\"%s\")", #hay, sn_, sh_ ? sh_ : "(null)"); \
  } while (0)

#define ASSERT_MEM_EQ(a, b, n) ASSERT(memcmp((a), (b), (n)) == 0)

/* Directory of test fixtures (LARDER_TEST_DATA or "tests/data"). */
const char *test_data_dir(void);
/* Writes "<data dir>/<name>" into buf and returns buf. */
char *test_data_path(char *buf, size_t size, const char *name);
/* A scratch directory private to the running test, made on first use. */
const char *test_tmpdir(void);
/* Reads a whole file into a malloc'd buffer, followed by a NUL byte that *len
 * does not count; NULL when it cannot. */
uint8_t *test_read_file(const char *path, size_t *len);
/* Runs a shell command and returns its exit status (or -1). */
int test_system(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The monotonic clock, in milliseconds and in seconds: what deadlines are
 * measured against. */
double test_now_ms(void);
double test_now_s(void);
/* Sleeps ms milliseconds (resuming after signals). */
void test_sleep_ms(int ms);
/* Copies a file with cp(1); fails the test when it cannot. */
void test_copy_file(const char *from, const char *to);

#endif /* LARDER_TASK_H */
