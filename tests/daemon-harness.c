/*
 * daemon-harness.c: see daemon-harness.h.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "util.h"
#include "daemon-harness.h"
#include "pqwrite.h"

static void mkdir_p(const char *path) {
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof(tmp), "%s", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    mkdir(tmp, 0755);
    *p = '/';
  }
  if (mkdir(tmp, 0755) != 0 && errno != EEXIST) ASSERT_FAIL_("mkdir %s: %s", tmp, strerror(errno));
}

int dh_asan(void) {
#if defined(__SANITIZE_ADDRESS__)
  return 1;
#else
  return 0;
#endif
}

int dh_slow(void) {
#if defined(__SANITIZE_ADDRESS__)
  return 3;
#endif
  const char *s = getenv("LARDER_TEST_SLOW");
  if (s && atoi(s) > 0) return atoi(s);
  /* UBSan has no predefined macro in gcc; the Makefile's flavour shows in
   * the binary's path. */
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n > 0) {
    exe[n] = '\0';
    if (strstr(exe, "/ubsan/") || strstr(exe, "/asan/")) return 3;
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Daemons                                                                   */

static const char *larderd_bin(void) {
  static char path[PATH_MAX];
  const char *env = getenv("LARDERD_BIN");
  if (env && *env) return env;
  /* The larderd of the same flavour, next to run-tests. */
  ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 16);
  if (n <= 0) return NULL;
  path[n] = '\0';
  char *slash = strrchr(path, '/');
  if (slash == NULL) return NULL;
  strcpy(slash + 1, "larderd");
  return path;
}

void dh_init(dh_daemon *d, const char *name, const char *const *flags) {
  memset(d, 0, sizeof(*d));
  snprintf(d->dir, sizeof(d->dir), "%s/%s", test_tmpdir(), name);
  mkdir_p(d->dir);
  snprintf(d->socket, sizeof(d->socket), "%s/sock", d->dir);
  snprintf(d->cache, sizeof(d->cache), "%s/cache", d->dir);
  snprintf(d->log, sizeof(d->log), "%s/larderd.log", d->dir);
  snprintf(d->config, sizeof(d->config), "%s/larderd.conf", d->dir);
  FILE *f = fopen(d->config, "w");
  ASSERT_NOT_NULL(f);
  fputs("# empty: the tests pass every setting as a flag\n", f);
  fclose(f);
  for (size_t i = 0; flags && flags[i]; i++) dh_flag(d, flags[i]);
}

void dh_flag(dh_daemon *d, const char *flag) {
  const char *eq = strchr(flag, '=');
  size_t klen = eq ? (size_t)(eq - flag) : strlen(flag);
  for (int i = 0; i < d->num_flags; i++)
    if (strncmp(d->flags[i], flag, klen) == 0 && d->flags[i][klen] == '=') {
      snprintf(d->flags[i], sizeof(d->flags[i]), "%s", flag);
      return;
    }
  ASSERT(d->num_flags < DH_MAX_FLAGS);
  snprintf(d->flags[d->num_flags++], sizeof(d->flags[0]), "%s", flag);
}

void dh_set_cache(dh_daemon *d, const char *subdir) {
  snprintf(d->cache, sizeof(d->cache), "%s/%s", d->dir, subdir);
}

static int try_connect(const char *path) {
  int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return -1;
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
  if (connect(s, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
    close(s);
    return -1;
  }
  return s;
}

void dh_print_log(const dh_daemon *d) {
  const char *keep = getenv("LARDER_TEST_KEEP_LOGS");
  if (keep && *keep) {
    /* A copy that outlives the test's scratch directory. */
    test_system("mkdir -p '%s' && cp '%s' '%s/larderd-%d.log'", keep, d->log, keep, (int)d->pid);
    fprintf(stderr, "daemon log kept in %s/larderd-%d.log\n", keep, (int)d->pid);
  }
  char *log = dh_read_log(d);
  if (log == NULL) return;
  size_t n = strlen(log);
  fprintf(stderr, "---- %s (last 6000 bytes) ----\n%s\n----\n", d->log,
          n > 6000 ? log + n - 6000 : log);
  free(log);
}

void dh_start(dh_daemon *d) {
  dh_spawn(d);
  pid_t pid = d->pid;
  double deadline = test_now_ms() + 30000.0 * dh_slow();
  for (;;) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      d->pid = 0;
      dh_print_log(d);
      ASSERT_FAIL_("larderd exited during startup (status 0x%x)", status);
    }
    int s = try_connect(d->socket);
    if (s >= 0) {
      close(s);
      return;
    }
    if (test_now_ms() > deadline) {
      dh_print_log(d);
      ASSERT_FAIL_("larderd did not accept on %s in time", d->socket);
    }
    test_sleep_ms(5);
  }
}

int dh_wait_exit(dh_daemon *d, int timeout_ms) {
  double deadline = test_now_ms() + timeout_ms;
  for (;;) {
    int status;
    if (waitpid(d->pid, &status, WNOHANG) == d->pid) {
      d->pid = 0;
      return status;
    }
    if (test_now_ms() > deadline) return -1;
    test_sleep_ms(5);
  }
}

void dh_spawn(dh_daemon *d) {
  ASSERT_EQ(d->pid, 0);
  const char *bin = larderd_bin();
  if (bin == NULL || access(bin, X_OK) != 0)
    ASSERT_FAIL_("no larderd binary at %s (set LARDERD_BIN)", bin ? bin : "(null)");
  mkdir_p(d->cache);
  char a_config[700], a_socket[700], a_cache[700];
  snprintf(a_config, sizeof(a_config), "--config=%s", d->config);
  snprintf(a_socket, sizeof(a_socket), "--socket=%s", d->socket);
  snprintf(a_cache, sizeof(a_cache), "--cache_dir=%s", d->cache);
  char *argv[DH_MAX_FLAGS + 8];
  int argc = 0;
  argv[argc++] = (char *)bin;
  argv[argc++] = a_config;
  argv[argc++] = a_socket;
  argv[argc++] = a_cache;
  for (int i = 0; i < d->num_flags; i++) argv[argc++] = d->flags[i];
  argv[argc] = NULL;
  int logfd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  ASSERT(logfd >= 0);
  char banner[256];
  int bn = snprintf(banner, sizeof(banner), "==== start %d ====\n", d->starts);
  if (write(logfd, banner, (size_t)bn) < 0) {}
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    dup2(logfd, 1);
    dup2(logfd, 2);
    /* Nothing of the test's (client sockets, pipes) may leak into the
     * daemon: it would keep connections open and skew the fd counts. */
    for (int fd = 3; fd < 1024; fd++) close(fd);
    signal(SIGPIPE, SIG_DFL);
    execv(bin, argv);
    _exit(127);
  }
  close(logfd);
  d->pid = pid;
  d->starts++;
}

int dh_stop_status(dh_daemon *d, int timeout_ms) {
  ASSERT(d->pid > 0);
  kill(d->pid, SIGTERM);
  double deadline = test_now_ms() + timeout_ms;
  int status = 0;
  for (;;) {
    pid_t r = waitpid(d->pid, &status, WNOHANG);
    if (r == d->pid) break;
    if (test_now_ms() > deadline) {
      kill(d->pid, SIGKILL);
      waitpid(d->pid, &status, 0);
      d->pid = 0;
      return -1;
    }
    test_sleep_ms(5);
  }
  d->pid = 0;
  return status;
}

void dh_stop(dh_daemon *d) {
  int status = dh_stop_status(d, 30000 * dh_slow());
  if (status == -1) {
    dh_print_log(d);
    ASSERT_FAIL_("%s", "larderd did not exit after SIGTERM");
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    dh_print_log(d);
    if (WIFSIGNALED(status)) ASSERT_FAIL_("larderd died of signal %d", WTERMSIG(status));
    ASSERT_FAIL_("larderd exited with status %d after SIGTERM", WEXITSTATUS(status));
  }
  dh_check_log(d);
}

void dh_kill(dh_daemon *d) {
  ASSERT(d->pid > 0);
  kill(d->pid, SIGKILL);
  int status;
  waitpid(d->pid, &status, 0);
  d->pid = 0;
}

int dh_alive(dh_daemon *d) {
  if (d->pid <= 0) return 0;
  int status;
  pid_t r = waitpid(d->pid, &status, WNOHANG);
  if (r == d->pid) {
    d->pid = 0;
    return 0;
  }
  return 1;
}

char *dh_read_log(const dh_daemon *d) {
  size_t len;
  uint8_t *p = test_read_file(d->log, &len);
  if (p == NULL) return NULL;
  char *s = realloc(p, len + 1);
  if (s == NULL) {
    free(p);
    return NULL;
  }
  s[len] = '\0';
  return s;
}

void dh_check_log(const dh_daemon *d) {
  static const char *const bad[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                    "runtime error:",          "WARNING: ThreadSanitizer",
                                    "AddressSanitizer:",       "SUMMARY: "};
  char *log = dh_read_log(d);
  if (log == NULL) return;
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    if (strstr(log, bad[i])) {
      dh_print_log(d);
      free(log);
      ASSERT_FAIL_("larderd's log has a sanitizer report (\"%s\")", bad[i]);
    }
  free(log);
}

/* ------------------------------------------------------------------------ */
/* Admin and stats                                                           */

char *dh_admin(const dh_daemon *d, const char *command) {
  int fd = dh_raw_connect(d->socket);
  Larder__Frame *r = dh_raw_hello(fd, WIRE_PROTOCOL_VERSION);
  if (r == NULL || r->msg_case != LARDER__FRAME__MSG_HELLO_REPLY) {
    wire_free(r);
    close(fd);
    return NULL;
  }
  wire_free(r);
  Larder__AdminRequest req = LARDER__ADMIN_REQUEST__INIT;
  req.request_id = 7;
  req.command = (char *)command;
  req.json = 1;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_ADMIN_REQUEST;
  f.admin_request = &req;
  char *text = NULL;
  if (dh_raw_send(fd, &f) == 0) {
    for (;;) {
      int rc;
      r = dh_raw_recv(fd, 20000 * dh_slow(), NULL, NULL, &rc);
      if (r == NULL) break;
      if (r->msg_case == LARDER__FRAME__MSG_ADMIN_REPLY) {
        text = strdup(r->admin_reply->text ? r->admin_reply->text : "");
        wire_free(r);
        break;
      }
      wire_free(r);
    }
  }
  close(fd);
  return text;
}

/* Skips one JSON value at p; returns the position after it. */
static const char *json_skip(const char *p) {
  while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
  if (*p == '"') {
    for (p++; *p && *p != '"'; p++)
      if (*p == '\\' && p[1]) p++;
    return *p ? p + 1 : p;
  }
  if (*p == '{' || *p == '[') {
    int depth = 0;
    for (; *p; p++) {
      if (*p == '"') {
        p = json_skip(p) - 1;
        continue;
      }
      if (*p == '{' || *p == '[') depth++;
      if (*p == '}' || *p == ']') {
        if (--depth == 0) return p + 1;
      }
    }
    return p;
  }
  while (*p && *p != ',' && *p != '}' && *p != ']') p++;
  return p;
}

/* The value of key in the object at obj (pointing at '{'), or NULL. */
static const char *json_find(const char *obj, const char *key, size_t klen) {
  const char *p = obj;
  while (*p && *p != '{') p++;
  if (*p != '{') return NULL;
  p++;
  for (;;) {
    while (*p == ' ' || *p == ',' || *p == '\n') p++;
    if (*p != '"') return NULL;
    const char *k = p + 1;
    const char *kend = json_skip(p) - 1;
    p = kend + 1;
    while (*p == ' ' || *p == ':') p++;
    if ((size_t)(kend - k) == klen && strncmp(k, key, klen) == 0) return p;
    p = json_skip(p);
  }
}

static const char *json_path(const char *json, const char *key) {
  const char *obj = json;
  for (;;) {
    const char *dot = strchr(key, '.');
    size_t klen = dot ? (size_t)(dot - key) : strlen(key);
    const char *v = json_find(obj, key, klen);
    if (v == NULL || dot == NULL) return v;
    obj = v;
    key = dot + 1;
  }
}

int dh_json_has(const char *json, const char *key) { return json && json_path(json, key) != NULL; }

const char *dh_json_find(const char *obj, const char *key) {
  return obj ? json_path(obj, key) : NULL;
}

const char *dh_json_stream(const char *json, int pid, int n) {
  const char *p = dh_json_find(json, "per_stream");
  if (p == NULL || *p != '[') return NULL;
  p++;
  for (;;) {
    while (*p == ' ' || *p == ',') p++;
    if (*p != '{') return NULL;
    const char *v = json_find(p, "pid", 3);
    if (v && atoi(v) == pid && n-- == 0) return p;
    p = json_skip(p);
  }
}

uint64_t dh_json_u64(const char *json, const char *key) {
  const char *v = json ? json_path(json, key) : NULL;
  if (v == NULL) ASSERT_FAIL_("no \"%s\" in %s", key, json ? json : "(null)");
  if (strncmp(v, "true", 4) == 0) return 1;
  if (strncmp(v, "false", 5) == 0) return 0;
  return strtoull(v, NULL, 10);
}

uint64_t dh_stat(const dh_daemon *d, const char *key) {
  char *json = dh_admin(d, "stats");
  ASSERT_NOT_NULL(json);
  uint64_t v = dh_json_u64(json, key);
  free(json);
  return v;
}

/* ------------------------------------------------------------------------ */
/* /proc                                                                     */

int dh_fd_count(pid_t pid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  if (dir == NULL) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(dir);
  return n;
}

int dh_thread_nices(pid_t pid, const char *comm, int *nices, int max) {
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
  DIR *dir = opendir(path);
  if (dir == NULL) return 0;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char name[64] = "", stat[1024] = "";
    snprintf(path, sizeof(path), "/proc/%d/task/%s/comm", (int)pid, e->d_name);
    FILE *f = fopen(path, "r");
    if (f == NULL) continue; /* the thread has exited */
    if (fgets(name, sizeof(name), f) == NULL) name[0] = 0;
    fclose(f);
    name[strcspn(name, "\n")] = 0;
    if (strcmp(name, comm) != 0) continue;
    snprintf(path, sizeof(path), "/proc/%d/task/%s/stat", (int)pid, e->d_name);
    f = fopen(path, "r");
    if (f == NULL) continue;
    size_t len = fread(stat, 1, sizeof(stat) - 1, f);
    fclose(f);
    stat[len] = 0;
    /* Field 19 is the niceness; fields are counted from the pid, and the
     * name in parentheses (field 2) may hold spaces. */
    const char *p = strrchr(stat, ')');
    int field = 2;
    while (p != NULL && field < 19) {
      p = strchr(p + 1, ' ');
      field++;
    }
    if (p != NULL && n < max) nices[n] = atoi(p + 1);
    if (p != NULL) n++;
  }
  closedir(dir);
  return n;
}

int dh_can_unnice(void) {
  pid_t child = fork();
  if (child == 0) {
    errno = 0;
    int base = getpriority(PRIO_PROCESS, 0);
    if (errno != 0 || base >= 19) _exit(1);
    if (setpriority(PRIO_PROCESS, 0, base + 1) != 0) _exit(1);
    _exit(setpriority(PRIO_PROCESS, 0, base) == 0 ? 0 : 1);
  }
  int status = 0;
  if (child < 0 || waitpid(child, &status, 0) != child) return 0;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

int dh_memfd_count(pid_t pid) { return dh_fd_kind_count(pid, "/memfd:"); }

int dh_fd_kind_count(pid_t pid, const char *prefix) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
  DIR *dir = opendir(path);
  if (dir == NULL) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(dir)) != NULL) {
    if (e->d_name[0] == '.') continue;
    char link[PATH_MAX], target[PATH_MAX];
    snprintf(link, sizeof(link), "%s/%s", path, e->d_name);
    ssize_t len = readlink(link, target, sizeof(target) - 1);
    if (len <= 0) continue;
    target[len] = '\0';
    if (strncmp(target, prefix, strlen(prefix)) == 0) n++;
  }
  closedir(dir);
  return n;
}

/* A "Name:   N kB" field of /proc/PID/status, or -1. */
static long status_kb(pid_t pid, const char *field) {
  char path[64], line[256];
  snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  long kb = -1;
  size_t n = strlen(field);
  while (fgets(line, sizeof(line), f))
    if (strncmp(line, field, n) == 0) kb = strtol(line + n, NULL, 10);
  fclose(f);
  return kb;
}

long dh_rss_kb(pid_t pid) { return status_kb(pid, "VmRSS:"); }

long dh_peak_rss_kb(pid_t pid, int reset) {
  if (reset) {
    /* "5" resets the peak to the current RSS (Linux 4.0). */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/clear_refs", (int)pid);
    FILE *c = fopen(path, "w");
    if (c) {
      fputs("5", c);
      fclose(c);
    }
  }
  return status_kb(pid, "VmHWM:");
}

double dh_cpu_ms(pid_t pid) {
  char path[64], buf[2048];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* Fields after the command name (which may hold spaces): state is 3rd,
   * utime 14th, stime 15th. */
  const char *p = strrchr(buf, ')');
  if (p == NULL) return -1;
  unsigned long long ut = 0, st = 0;
  if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

int dh_wait_fds(pid_t pid, int want, int timeout_ms) {
  double deadline = test_now_ms() + timeout_ms;
  int n;
  while ((n = dh_fd_count(pid)) > want && test_now_ms() < deadline) test_sleep_ms(10);
  return n;
}

/* ------------------------------------------------------------------------ */
/* Datasets                                                                  */

const char *dh_work_dir(void) {
  static char dir[PATH_MAX];
  if (dir[0] == '\0') {
    const char *base = getenv("LARDER_TEST_WORK");
    snprintf(dir, sizeof(dir), "%s/daemon", base && *base ? base : "tests/work");
    mkdir_p(dir);
    /* Absolute, as liblarder sends paths: the daemon refuses relative
     * ones, which raw-protocol tests send as they are. */
    char real[PATH_MAX];
    if (realpath(dir, real) != NULL) snprintf(dir, sizeof(dir), "%s", real);
  }
  return dir;
}

const dh_spec dh_std_spec = {4, 2500, 2000, 1000, PQ_SNAPPY, 0, 0};

int64_t dh_std_dataset(char *dir, size_t dirlen) {
  return dh_dataset(&dh_std_spec, "std", dir, dirlen);
}

const dh_spec dh_mid_spec = {6, 10000, 0, 2500, PQ_ZSTD, 0, 0};

int64_t dh_mid_dataset(char *dir, size_t dirlen) {
  return dh_dataset(&dh_mid_spec, "mid", dir, dirlen);
}

static int file_rows(const dh_spec *s, int f) {
  return f == s->files - 1 && s->last_rows ? s->last_rows : s->rows_per_file;
}

static int64_t file_first_id(const dh_spec *s, int f) {
  return s->id_base + (int64_t)f * s->rows_per_file;
}

int64_t dh_spec_id(const dh_spec *spec, int f, int rg, int64_t row) {
  return file_first_id(spec, f) + (int64_t)rg * spec->rg_rows + row;
}

static void name_of(int64_t id, char *buf, size_t size) {
  int n = snprintf(buf, size, "r%lld:", (long long)id);
  int extra = (int)(id % 13);
  for (int i = 0; i < extra && (size_t)(n + i) < size - 1; i++)
    buf[n + i] = (char)('a' + (id + i) % 26);
  buf[n + extra] = '\0';
}

long dh_damage_largest_table(const char *db_dir) {
  char path[PATH_MAX], best[PATH_MAX] = "";
  DIR *dh = opendir(db_dir);
  ASSERT_NOT_NULL(dh);
  off_t best_size = 0;
  struct dirent *e;
  while ((e = readdir(dh)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n < 4 || strcmp(e->d_name + n - 4, ".sst") != 0) continue;
    struct stat sb;
    snprintf(path, sizeof(path), "%s/%s", db_dir, e->d_name);
    if (stat(path, &sb) == 0 && sb.st_size > best_size) {
      best_size = sb.st_size;
      snprintf(best, sizeof(best), "%s", path);
    }
  }
  closedir(dh);
  ASSERT_GT(best_size, 16384);
  int fd = open(best, O_WRONLY | O_CLOEXEC);
  ASSERT(fd >= 0);
  static char junk[8192];
  memset(junk, 0xA5, sizeof(junk));
  ASSERT_EQ(pwrite(fd, junk, sizeof(junk), best_size / 3), (ssize_t)sizeof(junk));
  close(fd);
  return (long)best_size;
}

void dh_write_file(const dh_spec *spec, int fi, const char *path) {
  pqw_schema s[9] = {pqw_root(6),
                     pqw_leaf("id", PQ_INT64, PQ_REQUIRED),
                     pqw_leaf("label", PQ_INT32, PQ_REQUIRED),
                     pqw_leaf("x", PQ_DOUBLE, PQ_REQUIRED),
                     pqw_leaf("name", PQ_BYTE_ARRAY, PQ_REQUIRED),
                     pqw_leaf("opt", PQ_INT64, PQ_OPTIONAL),
                     pqw_group("tags", PQ_OPTIONAL, 1),
                     pqw_group("list", PQ_REPEATED, 1),
                     pqw_leaf("element", PQ_INT32, PQ_REQUIRED)};
  s[4].logical = PQ_LT_STRING;
  s[6].logical = PQ_LT_LIST;
  pqw_file f;
  pqw_file_init(&f, s, 9);
  int rows = file_rows(spec, fi);
  int64_t first = file_first_id(spec, fi);
  int v = spec->variant;
  for (int start = 0; start < rows; start += spec->rg_rows) {
    int n = rows - start < spec->rg_rows ? rows - start : spec->rg_rows;
    int64_t *ids = malloc((size_t)n * 8);
    int32_t *labels = malloc((size_t)n * 4);
    double *xs = malloc((size_t)n * 8);
    char **names = malloc((size_t)n * sizeof(char *));
    int64_t *opts = malloc((size_t)n * 8);
    uint16_t *odef = malloc((size_t)n * 2);
    int32_t *tvals = malloc((size_t)n * 4 * 4);
    uint16_t *tdef = malloc((size_t)n * 4 * 2), *trep = malloc((size_t)n * 4 * 2);
    ASSERT(ids && labels && xs && names && opts && odef && tvals && tdef && trep);
    int64_t no = 0, nt = 0, nl = 0;
    for (int i = 0; i < n; i++) {
      int64_t id = first + start + i;
      ids[i] = id;
      labels[i] = (int32_t)((id * 7 + v) % 10);
      xs[i] = (double)id * 0.5 + v;
      char buf[64];
      name_of(id, buf, sizeof(buf));
      names[i] = strdup(buf);
      if (id % 7 == 3) odef[i] = 0;
      else {
        odef[i] = 1;
        opts[no++] = id * 3 + v;
      }
      if (id % 11 == 5) {
        tdef[nl] = 0;
        trep[nl++] = 0;
      } else if (id % 4 == 0) {
        tdef[nl] = 1;
        trep[nl++] = 0;
      } else {
        for (int k = 0; k < id % 4; k++) {
          tvals[nt++] = (int32_t)(id + k + v);
          tdef[nl] = 2;
          trep[nl++] = k ? 1 : 0;
        }
      }
    }
    pqw_values vals[6];
    memset(vals, 0, sizeof(vals));
    vals[0].physical = PQ_INT64, vals[0].fixed = ids, vals[0].count = n;
    vals[1].physical = PQ_INT32, vals[1].fixed = labels, vals[1].count = n;
    vals[2].physical = PQ_DOUBLE, vals[2].fixed = xs, vals[2].count = n;
    vals[3].physical = PQ_BYTE_ARRAY, vals[3].bytes = (const char *const *)names, vals[3].count = n;
    vals[4].physical = PQ_INT64, vals[4].fixed = opts, vals[4].count = no;
    vals[5].physical = PQ_INT32, vals[5].fixed = tvals, vals[5].count = nt;
    pqw_levels lopt = {n, odef, NULL, 1, 0};
    pqw_levels ltags = {nl, tdef, trep, 2, 1};
    const pqw_levels *lv[6] = {NULL, NULL, NULL, NULL, &lopt, &ltags};
    pqw_chunk_opts o;
    memset(&o, 0, sizeof(o));
    o.codec = spec->codec;
    o.crc = 1;
    o.page_entries = 500;
    pqw_chunk chunks[6];
    for (int c = 0; c < 6; c++) {
      pqw_chunk_opts oc = o;
      /* A mix of encodings, as real writers produce. */
      if (c == 1) oc.encoding = PQ_ENC_RLE_DICTIONARY;
      if (c == 3 && fi % 2) oc.encoding = PQ_ENC_DELTA_LENGTH_BYTE_ARRAY;
      if (c == 5) oc.v2 = 1;
      pqw_chunk_build(&chunks[c], &vals[c], lv[c], &oc);
    }
    pqw_file_add_row_group(&f, n, chunks, 6);
    for (int c = 0; c < 6; c++) pqw_chunk_free(&chunks[c]);
    for (int i = 0; i < n; i++) free(names[i]);
    free(ids), free(labels), free(xs), free(names), free(opts), free(odef), free(tvals);
    free(tdef), free(trep);
  }
  size_t len;
  uint8_t *data = pqw_file_finish(&f, &len);
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", path, (int)getpid());
  FILE *out = fopen(tmp, "wb");
  ASSERT_NOT_NULL(out);
  ASSERT_EQ(fwrite(data, 1, len, out), len);
  ASSERT_OK(fclose(out));
  free(data);
  ASSERT_OK(rename(tmp, path));
}

static void spec_string(const dh_spec *s, char *buf, size_t size) {
  snprintf(buf, size, "v3 files=%d rows=%d last=%d rg=%d codec=%d base=%lld variant=%d\n", s->files,
           s->rows_per_file, s->last_rows, s->rg_rows, s->codec, (long long)s->id_base, s->variant);
}

int64_t dh_dataset(const dh_spec *spec, const char *name, char *dir, size_t dirlen) {
  snprintf(dir, dirlen, "%s/%s", dh_work_dir(), name);
  char want[256], stamp[PATH_MAX];
  spec_string(spec, want, sizeof(want));
  int64_t total = 0;
  for (int f = 0; f < spec->files; f++) total += file_rows(spec, f);
  snprintf(stamp, sizeof(stamp), "%s/.spec", dir);
  size_t len;
  uint8_t *have = test_read_file(stamp, &len);
  if (have && len == strlen(want) && memcmp(have, want, len) == 0) {
    free(have);
    return total;
  }
  free(have);
  /* Write into a private directory, then rename it into place, so that
   * concurrent runs (several flavours) never see half a dataset. */
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", dir, (int)getpid());
  test_system("rm -rf '%s'", tmp);
  mkdir_p(tmp);
  for (int f = 0; f < spec->files; f++) {
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/part-%03d.parquet", tmp, f);
    dh_write_file(spec, f, path);
  }
  char tstamp[PATH_MAX + 16];
  snprintf(tstamp, sizeof(tstamp), "%s/.spec", tmp);
  FILE *sf = fopen(tstamp, "w");
  ASSERT_NOT_NULL(sf);
  fputs(want, sf);
  fclose(sf);
  test_system("rm -rf '%s'", dir);
  if (rename(tmp, dir) != 0) test_system("rm -rf '%s'", tmp); /* another run won */
  return total;
}

static int64_t i64_at(const larder_array_t *a, int64_t i) {
  int64_t v;
  memcpy(&v, (const uint8_t *)larder_array_values(a) + i * 8, 8);
  return v;
}

static int is_valid(const larder_array_t *a, int64_t i) {
  const uint8_t *v = larder_array_validity(a);
  return v == NULL || (v[i / 8] >> (i % 8)) & 1;
}

void dh_expect_row(const larder_batch_t *b, int64_t i, int variant) {
  const larder_array_t *id_a = larder_batch_column_by_name(b, "id");
  ASSERT_NOT_NULL(id_a);
  int64_t id = i64_at(id_a, i);
  const larder_array_t *a;
  if ((a = larder_batch_column_by_name(b, "label"))) {
    int32_t v;
    memcpy(&v, (const uint8_t *)larder_array_values(a) + i * 4, 4);
    ASSERT_EQ(v, (id * 7 + variant) % 10);
  }
  if ((a = larder_batch_column_by_name(b, "x"))) {
    double v;
    memcpy(&v, (const uint8_t *)larder_array_values(a) + i * 8, 8);
    ASSERT_DOUBLE_EQ(v, (double)id * 0.5 + variant);
  }
  if ((a = larder_batch_column_by_name(b, "name"))) {
    char want[64];
    name_of(id, want, sizeof(want));
    const int32_t *off = larder_array_offsets(a);
    ASSERT_NOT_NULL(off);
    int32_t len = off[i + 1] - off[i];
    ASSERT_EQ(len, (int64_t)strlen(want));
    ASSERT_MEM_EQ((const uint8_t *)larder_array_values(a) + off[i], want, (size_t)len);
  }
  if ((a = larder_batch_column_by_name(b, "opt"))) {
    if (id % 7 == 3) ASSERT(!is_valid(a, i));
    else {
      ASSERT(is_valid(a, i));
      ASSERT_EQ(i64_at(a, i), id * 3 + variant);
    }
  }
  if ((a = larder_batch_column_by_name(b, "tags"))) {
    ASSERT_EQ(larder_array_type(a), LARDER_TYPE_LIST);
    const int32_t *off = larder_array_offsets(a);
    ASSERT_NOT_NULL(off);
    if (id % 11 == 5) {
      ASSERT(!is_valid(a, i));
      ASSERT_EQ(off[i + 1] - off[i], 0);
    } else {
      ASSERT(is_valid(a, i));
      ASSERT_EQ(off[i + 1] - off[i], id % 4);
      const larder_array_t *e = larder_array_child(a, 0);
      ASSERT_NOT_NULL(e);
      for (int32_t k = 0; k < off[i + 1] - off[i]; k++) {
        int32_t v;
        memcpy(&v, (const uint8_t *)larder_array_values(e) + (off[i] + k) * 4, 4);
        ASSERT_EQ(v, id + k + variant);
      }
    }
  }
}

int dh_demo_dataset(int rows, int shards, char *dir, size_t dirlen) {
  snprintf(dir, dirlen, "%s/demo-%d-%d", dh_work_dir(), rows, shards);
  char stamp[PATH_MAX];
  snprintf(stamp, sizeof(stamp), "%s/.done", dir);
  if (access(stamp, F_OK) == 0) return 0;
  if (test_system("command -v node >/dev/null 2>&1 && test -d tests/node_modules/@duckdb") != 0)
    return -1;
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof(tmp), "%s.tmp%d", dir, (int)getpid());
  if (test_system("rm -rf '%s' && node tests/gen/demo-data.mjs '%s' %d %d >/dev/null", tmp, tmp,
                  rows, shards) != 0) {
    test_system("rm -rf '%s'", tmp);
    return -1;
  }
  test_system("touch '%s/.done'", tmp);
  test_system("rm -rf '%s'", dir);
  if (rename(tmp, dir) != 0) test_system("rm -rf '%s'", tmp);
  return access(stamp, F_OK) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------------------ */
/* Streams                                                                   */

static uint64_t hash_array(const larder_array_t *a, uint64_t h) {
  int64_t len = larder_array_length(a), nulls = larder_array_null_count(a);
  h = util_hash64(&len, 8, h);
  h = util_hash64(&nulls, 8, h);
  const uint8_t *v = larder_array_validity(a);
  if (v) h = util_hash64(v, (size_t)(len + 7) / 8, h);
  const int32_t *off = larder_array_offsets(a);
  if (off) h = util_hash64(off, (size_t)(len + 1) * 4, h);
  const void *vals = larder_array_values(a);
  uint64_t size = larder_array_values_size(a);
  if (vals && size) h = util_hash64(vals, (size_t)size, h);
  for (int i = 0; i < larder_array_num_children(a); i++)
    h = hash_array(larder_array_child(a, i), h);
  return h;
}

uint64_t dh_batch_hash(const larder_batch_t *b) {
  int64_t rows = larder_batch_num_rows(b);
  uint64_t h = util_hash64(&rows, 8, 0x6261746368ull);
  for (int i = 0; i < larder_batch_num_columns(b); i++) {
    const larder_array_t *a = larder_batch_column(b, i);
    const char *name = larder_array_name(a);
    h = util_hash64(name, strlen(name), h);
    h = hash_array(a, h);
  }
  return h;
}

int64_t dh_batch_ids(const larder_batch_t *b, int64_t *ids, int64_t cap) {
  const larder_array_t *a = larder_batch_column_by_name(b, "id");
  if (a == NULL) return 0;
  int64_t n = larder_array_length(a);
  ASSERT_EQ(n, larder_batch_num_rows(b));
  ASSERT_EQ(larder_array_type(a), LARDER_TYPE_INT64);
  if (n > cap) n = cap;
  memcpy(ids, larder_array_values(a), (size_t)n * 8);
  return n;
}

static void run_add(dh_run *run, const larder_batch_t *b) {
  if (run->n == run->cap) {
    size_t cap = run->cap ? run->cap * 2 : 64;
    dh_batch *p = realloc(run->b, cap * sizeof(*p));
    ASSERT_NOT_NULL(p);
    run->b = p;
    run->cap = cap;
  }
  dh_batch *r = &run->b[run->n++];
  r->epoch = larder_batch_epoch(b);
  r->index = larder_batch_index(b);
  r->rows = larder_batch_num_rows(b);
  r->hash = dh_batch_hash(b);
  r->ids = NULL;
  if (larder_batch_column_by_name(b, "id")) {
    r->ids = malloc((size_t)(r->rows ? r->rows : 1) * 8);
    ASSERT_NOT_NULL(r->ids);
    dh_batch_ids(b, r->ids, r->rows);
  }
  if (run->check_rows)
    for (int64_t i = 0; i < r->rows; i++)
      dh_expect_row(b, i, run->variant_of && r->ids ? run->variant_of(r->ids[i]) : run->variant);
}

int dh_collect(const char *socket, const larder_stream_options_t *opts, uint64_t max_batches,
               dh_run *run) {
  larder_client_t *c;
  int rc = larder_client_connect(socket, &c);
  if (rc) {
    run->rc = rc;
    snprintf(run->err, sizeof(run->err), "connect: %s", larder_strerror(rc));
    return rc;
  }
  larder_stream_t *s;
  rc = larder_stream_open(c, opts, &s);
  if (rc) {
    run->rc = rc;
    snprintf(run->err, sizeof(run->err), "%s", larder_client_last_error(c));
    larder_client_close(c);
    return rc;
  }
  run->batches_per_epoch = larder_stream_batches_per_epoch(s);
  run->num_samples = larder_stream_num_samples(s);
  uint64_t got = 0;
  while (max_batches == 0 || got < max_batches) {
    larder_batch_t *b;
    rc = larder_stream_next(s, 120000 * dh_slow(), &b);
    if (rc == LARDER_EEOF) {
      rc = 0;
      break;
    }
    if (rc) {
      snprintf(run->err, sizeof(run->err), "%s", larder_client_last_error(c));
      break;
    }
    run_add(run, b);
    larder_batch_release(b);
    got++;
  }
  run->rc = rc;
  larder_stream_close(s);
  larder_client_close(c);
  return rc;
}

typedef struct collect_arg {
  const char *socket;
  const larder_stream_options_t *opts;
  dh_run *run;
} collect_arg;

static void *collect_thread(void *p) {
  collect_arg *a = p;
  dh_collect(a->socket, a->opts, 0, a->run);
  return NULL;
}

void dh_collect_many(const char *socket, const larder_stream_options_t *opts, int n, dh_run *runs) {
  pthread_t *th = calloc((size_t)n, sizeof(pthread_t));
  collect_arg *args = calloc((size_t)n, sizeof(collect_arg));
  ASSERT(th && args);
  for (int i = 0; i < n; i++) {
    args[i] = (collect_arg){socket, &opts[i], &runs[i]};
    ASSERT_OK(pthread_create(&th[i], NULL, collect_thread, &args[i]));
  }
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  free(th);
  free(args);
}

void dh_run_free(dh_run *run) {
  for (size_t i = 0; i < run->n; i++) free(run->b[i].ids);
  free(run->b);
  run->b = NULL;
  run->n = run->cap = 0;
}

void dh_expect_same(const dh_run *a, const dh_run *b) {
  ASSERT_EQ(a->rc, 0);
  ASSERT_EQ(b->rc, 0);
  ASSERT_EQ(a->n, b->n);
  for (size_t i = 0; i < a->n; i++) {
    if (a->b[i].epoch != b->b[i].epoch || a->b[i].index != b->b[i].index ||
        a->b[i].rows != b->b[i].rows || a->b[i].hash != b->b[i].hash)
      ASSERT_FAIL_("batch %zu differs: (%" PRIu64 ",%" PRIu64 ") %016" PRIx64 " vs (%" PRIu64
                   ",%" PRIu64 ") %016" PRIx64,
                   i, a->b[i].epoch, a->b[i].index, a->b[i].hash, b->b[i].epoch, b->b[i].index,
                   b->b[i].hash);
  }
}

void dh_opts(larder_stream_options_t *o, const char *const *source, uint32_t batch_size,
             uint64_t seed, uint64_t epochs) {
  larder_stream_options_init(o);
  o->sources = source;
  o->num_sources = 1;
  o->batch_size = batch_size;
  o->seed = seed;
  o->epochs = epochs;
  o->rank = 0;
  o->world_size = 1;
}

pid_t dh_spawn_holder(const char *socket, const larder_stream_options_t *o, int streams,
                      uint64_t seed_step, int reads, int hold, int drain, int *ready_fd) {
  int pfd[2];
  ASSERT_OK(pipe(pfd));
  char a[20][128];
  int n = 0;
  snprintf(a[n++], 128, "--hold-client");
  snprintf(a[n++], 128, "%d", pfd[1]);
  snprintf(a[n++], 128, "%llu", (unsigned long long)o->batch_size);
  snprintf(a[n++], 128, "%llu", (unsigned long long)o->seed);
  snprintf(a[n++], 128, "%llu", (unsigned long long)o->epochs);
  snprintf(a[n++], 128, "%llu", (unsigned long long)o->unit_rows);
  snprintf(a[n++], 128, "%llu", (unsigned long long)o->shuffle_window);
  snprintf(a[n++], 128, "%llu", (unsigned long long)o->arena_bytes);
  snprintf(a[n++], 128, "%llu", (unsigned long long)o->window);
  snprintf(a[n++], 128, "%d", o->rank);
  snprintf(a[n++], 128, "%d", o->world_size);
  snprintf(a[n++], 128, "%d", streams);
  snprintf(a[n++], 128, "%llu", (unsigned long long)seed_step);
  snprintf(a[n++], 128, "%d", reads);
  snprintf(a[n++], 128, "%d", hold);
  snprintf(a[n++], 128, "%d", drain);
  char *argv[24];
  argv[0] = (char *)"run-tests";
  for (int i = 0; i < n; i++) argv[i + 1] = a[i];
  argv[n + 1] = (char *)socket;
  argv[n + 2] = (char *)o->sources[0];
  argv[n + 3] = NULL;
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    /* Only async-signal-safe calls until exec. */
    close(pfd[0]);
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  close(pfd[1]);
  *ready_fd = pfd[0];
  return pid;
}

int dh_holder_main(int argc, char **argv) {
  if (argc != 17) return 100;
  int fd = atoi(argv[0]);
  larder_stream_options_t o;
  const char *src[1] = {argv[16]};
  dh_opts(&o, src, (uint32_t)strtoul(argv[1], NULL, 10), strtoull(argv[2], NULL, 10),
          strtoull(argv[3], NULL, 10));
  o.unit_rows = (uint32_t)strtoul(argv[4], NULL, 10);
  o.shuffle_window = (uint32_t)strtoul(argv[5], NULL, 10);
  o.arena_bytes = strtoull(argv[6], NULL, 10);
  o.window = (uint32_t)strtoul(argv[7], NULL, 10);
  o.rank = atoi(argv[8]);
  o.world_size = atoi(argv[9]);
  int streams = atoi(argv[10]);
  uint64_t seed_step = strtoull(argv[11], NULL, 10);
  int reads = atoi(argv[12]), hold = atoi(argv[13]), drain = atoi(argv[14]);
  const char *socket = argv[15];
  larder_client_t *c;
  if (larder_client_connect(socket, &c)) return 1;
  larder_stream_t *s[8];
  if (streams < 1 || streams > 8) return 2;
  uint64_t seed0 = o.seed;
  for (int i = 0; i < streams; i++) {
    o.seed = seed0 + (uint64_t)i * seed_step;
    if (larder_stream_open(c, &o, &s[i])) return 3;
    larder_batch_t *b;
    for (int k = 0; k < reads; k++) {
      if (larder_stream_next(s[i], 60000, &b)) return 4;
      if (k >= hold) larder_batch_release(b);
    }
  }
  if (write(fd, "x", 1) != 1) return 5;
  for (;;) {
    larder_batch_t *b;
    if (drain && larder_stream_next(s[0], 60000, &b) == 0) {
      larder_batch_release(b);
      continue;
    }
    pause();
  }
}

/* ------------------------------------------------------------------------ */
/* Raw protocol                                                              */

int dh_raw_connect(const char *socket_path) {
  int s = try_connect(socket_path);
  if (s < 0) ASSERT_FAIL_("cannot connect to %s: %s", socket_path, strerror(errno));
  return s;
}

int dh_raw_write(int fd, const void *buf, size_t len) {
  const uint8_t *p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        struct pollfd pf = {fd, POLLOUT, 0};
        poll(&pf, 1, 100);
        continue;
      }
      return -errno;
    }
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

int dh_raw_send(int fd, const Larder__Frame *f) {
  size_t len;
  uint8_t *buf = wire_encode(f, &len);
  ASSERT_NOT_NULL(buf);
  int rc = dh_raw_write(fd, buf, len);
  free(buf);
  return rc;
}

Larder__Frame *dh_raw_recv(int fd, int timeout_ms, int *fds, int *num_fds, int *rc) {
  uint8_t hdr[4];
  size_t have = 0;
  uint8_t *body = NULL;
  uint32_t len = 0;
  double deadline = test_now_ms() + timeout_ms;
  int local_fds[8], nlocal = 0;
  if (num_fds) *num_fds = 0;
  for (;;) {
    size_t want = have < 4 ? 4 - have : 4 + (size_t)len - have;
    if (have >= 4 && want == 0) break;
    int left = (int)(deadline - test_now_ms());
    if (left <= 0) {
      *rc = LARDER_ETIMEDOUT;
      free(body);
      for (int i = 0; i < nlocal; i++) close(local_fds[i]);
      return NULL;
    }
    struct pollfd pf = {fd, POLLIN, 0};
    if (poll(&pf, 1, left) <= 0) continue;
    uint8_t *dst = have < 4 ? hdr + have : body + (have - 4);
    int64_t n = wire_recvmsg(fd, dst, want, local_fds, 8, &nlocal, 0);
    if (n == -EAGAIN || n == -EINTR) continue;
    if (n <= 0) {
      *rc = LARDER_ECLOSED;
      free(body);
      for (int i = 0; i < nlocal; i++) close(local_fds[i]);
      return NULL;
    }
    have += (size_t)n;
    if (have == 4) {
      len = (uint32_t)hdr[0] | (uint32_t)hdr[1] << 8 | (uint32_t)hdr[2] << 16 |
            (uint32_t)hdr[3] << 24;
      ASSERT(len <= WIRE_MAX_FRAME);
      body = malloc((size_t)len + 4);
      ASSERT_NOT_NULL(body);
      if (len == 0) break;
    }
  }
  uint8_t *full = malloc((size_t)len + 4);
  ASSERT_NOT_NULL(full);
  memcpy(full, hdr, 4);
  if (len) memcpy(full + 4, body, len);
  free(body);
  Larder__Frame *f = wire_decode(full, (size_t)len + 4, 0, NULL);
  free(full);
  ASSERT_NOT_NULL(f);
  if (fds && num_fds) {
    for (int i = 0; i < nlocal; i++) fds[i] = local_fds[i];
    *num_fds = nlocal;
  } else {
    for (int i = 0; i < nlocal; i++) close(local_fds[i]);
  }
  *rc = 0;
  return f;
}

Larder__Frame *dh_raw_hello(int fd, uint32_t version) {
  Larder__Hello h = LARDER__HELLO__INIT;
  h.protocol_version = version;
  h.client_name = (char *)"daemon-harness";
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_HELLO;
  f.hello = &h;
  if (dh_raw_send(fd, &f) != 0) return NULL;
  int rc;
  return dh_raw_recv(fd, 20000 * dh_slow(), NULL, NULL, &rc);
}

uint8_t *dh_open_frame(uint32_t request_id, char **sources, size_t n, uint32_t batch_size,
                       size_t *len) {
  Larder__OpenStream os = LARDER__OPEN_STREAM__INIT;
  os.request_id = request_id;
  os.n_sources = n;
  os.sources = sources;
  os.batch_size = batch_size;
  os.world_size = 1;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_OPEN_STREAM;
  f.open_stream = &os;
  uint8_t *buf = wire_encode(&f, len);
  ASSERT_NOT_NULL(buf);
  return buf;
}

Larder__Frame *dh_raw_open(int fd, uint32_t request_id, const larder_stream_options_t *o,
                           int *arena_fd) {
  return dh_raw_open_ring(fd, request_id, o, arena_fd, NULL);
}

Larder__Frame *dh_raw_open_ring(int fd, uint32_t request_id, const larder_stream_options_t *o,
                                int *arena_fd, int *ring_fd) {
  Larder__OpenStream req = LARDER__OPEN_STREAM__INIT;
  req.ring = ring_fd != NULL;
  req.request_id = request_id;
  req.n_sources = o->num_sources;
  req.sources = (char **)(uintptr_t)o->sources;
  req.n_columns = o->columns ? o->num_columns : 0;
  req.columns = (char **)(uintptr_t)o->columns;
  req.batch_size = o->batch_size;
  req.seed = o->seed;
  req.shuffle = o->shuffle;
  req.shuffle_window = o->shuffle_window;
  req.unit_rows = o->unit_rows;
  req.epochs = o->epochs;
  req.rank = o->rank > 0 ? (uint32_t)o->rank : 0;
  req.world_size = o->world_size > 0 ? (uint32_t)o->world_size : 1;
  req.drop_last = o->drop_last;
  req.start_epoch = o->start_epoch;
  req.start_batch = o->start_batch;
  req.window = o->window;
  req.arena_bytes = o->arena_bytes;
  req.memory_kind = (Larder__MemoryKind)o->memory_kind;
  req.cuda_device = o->cuda_device > 0 ? o->cuda_device : 0;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_OPEN_STREAM;
  f.open_stream = &req;
  *arena_fd = -1;
  if (ring_fd) *ring_fd = -1;
  if (dh_raw_send(fd, &f) != 0) return NULL;
  for (;;) {
    int fds[8], nfds = 0, rc;
    Larder__Frame *r = dh_raw_recv(fd, 60000 * dh_slow(), fds, &nfds, &rc);
    if (r == NULL) return NULL;
    for (int i = 0; i < nfds; i++) {
      if (*arena_fd < 0) *arena_fd = fds[i];
      else if (ring_fd && *ring_fd < 0) *ring_fd = fds[i];
      else close(fds[i]);
    }
    if (r->msg_case == LARDER__FRAME__MSG_OPEN_STREAM_REPLY ||
        r->msg_case == LARDER__FRAME__MSG_ERROR)
      return r;
    wire_free(r);
  }
}

int dh_raw_wait_closed(int fd, int timeout_ms, int *err_code) {
  double deadline = test_now_ms() + timeout_ms;
  for (;;) {
    int left = (int)(deadline - test_now_ms());
    if (left <= 0) return 0;
    int rc;
    Larder__Frame *f = dh_raw_recv(fd, left, NULL, NULL, &rc);
    if (f == NULL) return rc == LARDER_ECLOSED;
    if (f->msg_case == LARDER__FRAME__MSG_ERROR && err_code) *err_code = f->error->code;
    wire_free(f);
  }
}

void dh_std_opts(larder_stream_options_t *o, const char *const *source, size_t nsrc,
                 uint32_t batch_size, uint64_t seed, uint64_t epochs, uint64_t arena_bytes) {
  dh_opts(o, source, batch_size, seed, epochs);
  o->num_sources = nsrc;
  o->unit_rows = DH_STD_UNIT_ROWS;
  o->shuffle_window = 8;
  o->arena_bytes = arena_bytes;
}

const char *const *dh_std_source(void) {
  static char dir[1024];
  static const char *source[1];
  if (source[0] == NULL) {
    ASSERT_EQ(dh_std_dataset(dir, sizeof(dir)), DH_STD_ROWS);
    source[0] = dir;
  }
  return source;
}

const char *dh_std_dir(void) { return dh_std_source()[0]; }

void dh_wait_log(const dh_daemon *d, const char *needle, int n, double timeout_ms) {
  double deadline = test_now_ms() + timeout_ms;
  for (;;) {
    char *log = dh_read_log(d);
    int count = 0;
    for (const char *p = log; p && (p = strstr(p, needle)) != NULL; p++) count++;
    free(log);
    if (count >= n) return;
    if (test_now_ms() > deadline) {
      dh_print_log(d);
      ASSERT_FAIL_("\"%s\" is not in the daemon's log %d times", needle, n);
    }
    test_sleep_ms(10);
  }
}
