/*
 * runner.c: runs the tests listed in test-list.h, each in a child process
 * with its own timeout, and prints one line per test and a closing
 * "N passed, N failed, N skipped" line.
 *
 * Usage: run-tests [name-substring...]   run the matching tests (all if none)
 *        run-tests --list                list the tests
 *        run-tests --one NAME            run NAME in this process (debugging)
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "task.h"

typedef struct test_entry {
  const char *name;
  int (*fn)(void);
  int timeout_ms;
} test_entry;

#define TEST_ENTRY(name, timeout_ms) TEST_DECLARE(name)
#include "test-list.h"
#undef TEST_ENTRY

static const test_entry tests[] = {
#define TEST_ENTRY(name, timeout_ms) {#name, run_test_##name, timeout_ms},
#include "test-list.h"
#undef TEST_ENTRY
    {NULL, NULL, 0}};

static char tmpdir_path[512];

const char *test_data_dir(void) {
  const char *d = getenv("LARDER_TEST_DATA");
  return d && *d ? d : "tests/data";
}

char *test_data_path(char *buf, size_t size, const char *name) {
  snprintf(buf, size, "%s/%s", test_data_dir(), name);
  return buf;
}

const char *test_tmpdir(void) {
  if (tmpdir_path[0] == '\0') {
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir_path, sizeof(tmpdir_path), "%s/larder-test-XXXXXX",
             base && *base ? base : "/tmp");
    if (mkdtemp(tmpdir_path) == NULL) {
      perror("mkdtemp");
      abort();
    }
  }
  return tmpdir_path;
}

uint8_t *test_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (f == NULL) return NULL;
  if (fseek(f, 0, SEEK_END) != 0) {
    fclose(f);
    return NULL;
  }
  long size = ftell(f);
  rewind(f);
  uint8_t *buf = malloc(size > 0 ? (size_t)size + 1 : 1);
  if (buf == NULL || fread(buf, 1, (size_t)size, f) != (size_t)size) {
    free(buf);
    fclose(f);
    return NULL;
  }
  fclose(f);
  buf[size > 0 ? size : 0] = 0; /* so that text can be searched as a string */
  *len = (size_t)size;
  return buf;
}

int test_system(const char *fmt, ...) {
  char cmd[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(cmd, sizeof(cmd), fmt, ap);
  va_end(ap);
  int rc = system(cmd);
  if (rc == -1 || !WIFEXITED(rc)) return -1;
  return WEXITSTATUS(rc);
}

double test_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

double test_now_s(void) { return test_now_ms() / 1e3; }

void test_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

void test_copy_file(const char *from, const char *to) {
  if (test_system("cp '%s' '%s'", from, to) != 0) ASSERT_FAIL_("cannot copy %s to %s", from, to);
}

/* Removes the per-test scratch directory the child may have made. */
static void remove_tree(const char *path) {
  char cmd[600];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", path);
  if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", path);
}

/* Prints the end of every daemon log a failed test left in its scratch
 * directory: a daemon that died (a sanitizer report, an abort) shows up in
 * the test only as a closed connection, and the scratch directory is gone
 * once the runner moves on. */
static void print_daemon_logs(const char *scratch) {
  char cmd[700];
  snprintf(cmd, sizeof(cmd), "find '%s' -name 'larderd*.log' -type f 2>/dev/null", scratch);
  FILE *list = popen(cmd, "r");
  if (list == NULL) return;
  char path[1024];
  while (fgets(path, sizeof(path), list) != NULL) {
    path[strcspn(path, "\n")] = '\0';
    size_t len;
    uint8_t *log = test_read_file(path, &len);
    if (log == NULL) continue;
    size_t from = len > 8000 ? len - 8000 : 0;
    fprintf(stderr, "---- %s (last %zu bytes) ----\n%s\n----\n", path, len - from,
            (const char *)log + from);
    free(log);
  }
  pclose(list);
  fflush(stderr);
}

static int run_in_child(const test_entry *t) {
  /* The scratch directory name is fixed before the fork so that the parent
   * can remove it whatever happens to the child. */
  tmpdir_path[0] = '\0';
  char scratch[512];
  snprintf(scratch, sizeof(scratch), "%s", test_tmpdir());
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    perror("fork");
    return 1;
  }
  if (pid == 0) {
    setpgid(0, 0);
    int rc = t->fn();
    fflush(NULL);
    _exit(rc);
  }
  setpgid(pid, pid);
  double deadline = test_now_ms() + t->timeout_ms;
  int status = 0;
  int timed_out = 0;
  for (;;) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      perror("waitpid");
      break;
    }
    if (test_now_ms() > deadline) {
      timed_out = 1;
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      break;
    }
    usleep(2000);
  }
  /* Kill whatever the test left running in its process group (daemons). */
  kill(-pid, SIGKILL);
  int failed = timed_out || !WIFEXITED(status) ||
               (WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != TEST_SKIP);
  if (failed) print_daemon_logs(scratch);
  remove_tree(scratch);
  tmpdir_path[0] = '\0';
  if (timed_out) return -2;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

/* daemon-harness.c: the child of dh_spawn_holder. */
int dh_holder_main(int argc, char **argv);

static int matches(const char *name, int argc, char **argv) {
  if (argc <= 1) return 1;
  for (int i = 1; i < argc; i++)
    if (strstr(name, argv[i]) != NULL) return 1;
  return 0;
}

int main(int argc, char **argv) {
  signal(SIGPIPE, SIG_IGN);
  /* A daemon without credentials would end its credential chain at the
   * instance metadata service, 169.254.169.254: no test may reach it.
   * The tests of that source unset this and point the endpoint at a
   * loopback fake. */
  setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (const test_entry *t = tests; t->name; t++) printf("%s\n", t->name);
    return 0;
  }
  if (argc >= 2 && strcmp(argv[1], "--hold-client") == 0) return dh_holder_main(argc - 2, argv + 2);
  if (argc == 3 && strcmp(argv[1], "--one") == 0) {
    for (const test_entry *t = tests; t->name; t++)
      if (strcmp(t->name, argv[2]) == 0) {
        int rc = t->fn();
        if (tmpdir_path[0]) remove_tree(tmpdir_path);
        return rc;
      }
    fprintf(stderr, "no test named %s\n", argv[2]);
    return 2;
  }
  int passed = 0, failed = 0, skipped = 0;
  for (const test_entry *t = tests; t->name; t++) {
    if (!matches(t->name, argc, argv)) continue;
    double start = test_now_ms();
    int rc = run_in_child(t);
    double ms = test_now_ms() - start;
    if (rc == 0) {
      passed++;
      printf("ok      %-44s %8.0f ms\n", t->name, ms);
    } else if (rc == TEST_SKIP) {
      skipped++;
      printf("skip    %-44s\n", t->name);
    } else {
      failed++;
      if (rc == -2) printf("FAIL    %-44s timed out after %d ms\n", t->name, t->timeout_ms);
      else printf("FAIL    %-44s exit status %d\n", t->name, rc);
    }
    fflush(stdout);
  }
  printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
  return failed ? 1 : 0;
}
