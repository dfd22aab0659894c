/*
 * main.c: larderd's entry point: command line, configuration, the cache,
 * then the server loop.
 *
 *   larderd [--config PATH] [--key=value ...] [--help] [--help-config]
 *           [--version]
 *
 * The foreground is the default (systemd runs it so, and so do the
 * tests).  --daemonize (or daemonize = true) detaches without systemd: a
 * double fork and setsid, working directory /, stdin from /dev/null,
 * stdout and stderr to log_file (else /dev/null once the socket listens;
 * until then startup errors still reach the terminal).  The command
 * returns once the daemon listens, with status 0, or 1 when it failed to
 * start.  pid_file is written once the socket listens and removed at exit.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config.h"
#include "log.h"
#include "serve/server.h"
#include "util.h"

#define DEFAULT_CONFIG "/etc/larder/larderd.conf"

static void usage(FILE *out) {
  fprintf(out,
          "usage: larderd [--config PATH] [--KEY=VALUE ...]\n"
          "       larderd --daemonize --pid_file=PATH --log_file=PATH [...]\n"
          "\n"
          "Serves shuffled training batches from Parquet shards to trainers on this\n"
          "host.  Settings come from %s (or --config) and\n"
          "--KEY=VALUE flags; `larderd --help-config` lists every key.  It runs in the\n"
          "foreground unless --daemonize (or daemonize = true) is given.\n",
          DEFAULT_CONFIG);
}

/* --daemonize: the write end of the pipe the first process waits on. */
static int ready_fd = -1;
static char pid_path[PATH_MAX];
static int log_to_null; /* --daemonize without log_file */

/* Makes a relative path absolute (the daemon's working directory becomes
 * /).  Returns 0 or -1 (out of memory). */
static int absolutize(char **slot) {
  char *p = *slot;
  if (p == NULL || *p == '\0' || *p == '/') return 0;
  char cwd[PATH_MAX];
  if (getcwd(cwd, sizeof(cwd)) == NULL) return 0;
  size_t n = strlen(cwd) + strlen(p) + 2;
  char *abs = malloc(n);
  if (abs == NULL) return -1;
  snprintf(abs, n, "%s/%s", cwd, p);
  free(p);
  *slot = abs;
  return 0;
}

static int write_pid_file(const char *path) {
  char tmp[PATH_MAX + 8];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -errno;
  char buf[32];
  int n = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
  int ok = write(fd, buf, (size_t)n) == n;
  if (close(fd) != 0) ok = 0;
  if (!ok || rename(tmp, path) != 0) {
    int e = errno ? errno : EIO;
    unlink(tmp);
    return -e;
  }
  return 0;
}

/* Removes the pid file if it still names this process. */
static void remove_pid_file(void) {
  if (pid_path[0] == '\0') return;
  FILE *f = fopen(pid_path, "r");
  int pid = 0;
  if (f) {
    if (fscanf(f, "%d", &pid) != 1) pid = 0;
    fclose(f);
  }
  if (pid == (int)getpid()) unlink(pid_path);
}

static void on_ready(server_t *srv) {
  if (srv->cfg.pid_file && *srv->cfg.pid_file) {
    int rc = write_pid_file(srv->cfg.pid_file);
    if (rc) log_err("cannot write the pid file %s: %s", srv->cfg.pid_file, strerror(-rc));
    else snprintf(pid_path, sizeof(pid_path), "%s", srv->cfg.pid_file);
  }
  if (ready_fd >= 0) {
    if (log_to_null) {
      int fd = open("/dev/null", O_WRONLY | O_CLOEXEC);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        close(fd);
      }
    }
    char one = '1';
    if (write(ready_fd, &one, 1) != 1) {
      /* The first process is gone; nothing to tell. */
    }
    close(ready_fd);
    ready_fd = -1;
  }
}

/*
 * The double fork.  The first process waits until the daemon says it is
 * ready (or exits) and returns that as its status; the second, a session
 * leader, forks the daemon and exits, so the daemon is no session leader
 * and can never take a controlling terminal.
 */
static int daemonize(const char *log_file) {
  int p[2];
  if (pipe2(p, O_CLOEXEC) != 0) {
    fprintf(stderr, "larderd: pipe: %s\n", strerror(errno));
    return -1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "larderd: fork: %s\n", strerror(errno));
    return -1;
  }
  if (pid > 0) {
    close(p[1]);
    char c = 0;
    ssize_t n;
    do n = read(p[0], &c, 1);
    while (n < 0 && errno == EINTR);
    int st;
    waitpid(pid, &st, 0); /* the middle process exits at once */
    if (n == 1 && c == '1') _exit(0);
    if (log_file && *log_file)
      fprintf(stderr, "larderd: the daemon failed to start; see %s\n", log_file);
    else fprintf(stderr, "larderd: the daemon failed to start\n");
    _exit(1);
  }
  close(p[0]);
  if (setsid() < 0) _exit(1);
  pid = fork();
  if (pid < 0) _exit(1);
  if (pid > 0) _exit(0);
  ready_fd = p[1];
  if (chdir("/") != 0) {
    /* / always exists */
  }
  int fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (fd >= 0) {
    dup2(fd, 0);
    close(fd);
  }
  if (log_file && *log_file) {
    int rc = log_open_file(log_file);
    if (rc) {
      char hint[600];
      fprintf(stderr, "larderd: cannot open the log file %s: %s%s\n", log_file, strerror(-rc),
              util_sandbox_hint(-rc, log_file, 0, hint, sizeof(hint)));
      _exit(1);
    }
  } else {
    log_to_null = 1;
  }
  return 0;
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb;
  (void)flag;
  (void)ftw;
  return remove(path) == 0 || errno == ENOENT ? 0 : -1;
}

/* Moves the cache's database aside (so that a crash meanwhile leaves no
 * half-deleted one where the store looks) and deletes it.  Returns 0, or
 * LARDER_EIO with a message in err.  The main thread, before the loop. */
static int discard_cache_db(const char *cache_dir, char *err, size_t errlen) {
  char db[PATH_MAX], aside[PATH_MAX];
  snprintf(db, sizeof(db), "%s/db", cache_dir);
  snprintf(aside, sizeof(aside), "%s/db.discarded.%ld", cache_dir, (long)getpid());
  if (rename(db, aside) != 0) {
    snprintf(err, errlen, "cannot move the corrupt database aside: %s", strerror(errno));
    return LARDER_EIO;
  }
  if (nftw(aside, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    /* The new cache can start beside what is left of the old one. */
    log_warn("could not delete all of %s: %s", aside, strerror(errno));
  }
  return 0;
}

/* Everything between parsing the command line and the end of serving; main
 * owns srv and frees it whatever this returns, so every early exit here
 * (a bad flag, a cache that will not open) leaks nothing. */
/*
 * Returns the number of cores this process may run on: its CPU affinity,
 * which taskset, systemd's CPUAffinity= and a container's cpuset narrow,
 * or every online core where the mask cannot be read (a host of more cores
 * than a cpu_set_t holds).  The default worker count.
 *
 * Counting every online core instead, a daemon confined to 2 cores of 16
 * would start 16 workers that take turns on its 2, and preempt the loop
 * that hands batches out.  Tested by daemon_workers_affinity.
 */
static int usable_cores(void) {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  return cores > 0 ? (int)cores : 2;
}

/* Who holds the RocksDB lock of the cache in dir: ": larderd, pid N" (the
 * holder's command name and pid, from the lock's fcntl record), or "" when
 * that cannot be told. */
static void cache_holder(const char *dir, char *out, size_t size) {
  out[0] = '\0';
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/db/LOCK", dir);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return;
  struct flock fl;
  memset(&fl, 0, sizeof(fl));
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  int got = fcntl(fd, F_GETLK, &fl) == 0 && fl.l_type != F_UNLCK && fl.l_pid > 0;
  close(fd);
  if (!got) return;
  char comm_path[64], comm[64] = "";
  snprintf(comm_path, sizeof(comm_path), "/proc/%d/comm", (int)fl.l_pid);
  FILE *f = fopen(comm_path, "r");
  if (f) {
    if (fgets(comm, sizeof(comm), f)) comm[strcspn(comm, "\n")] = '\0';
    fclose(f);
  }
  snprintf(out, size, ": %s%spid %d", comm, comm[0] ? ", " : "", (int)fl.l_pid);
}

static int larderd_run(server_t *srv, int argc, char **argv) {
  const char *config_path = NULL;
  int explicit_config = 0;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
      config_path = argv[++i];
      explicit_config = 1;
    } else if (strncmp(argv[i], "--config=", 9) == 0) {
      config_path = argv[i] + 9;
      explicit_config = 1;
    }
  }
  char err[512];
  if (config_path == NULL) config_path = DEFAULT_CONFIG;
  if (config_load_file(&srv->cfg, config_path, !explicit_config, err, sizeof(err)) != 0) {
    fprintf(stderr, "larderd: %s\n", err);
    return 2;
  }
  if (srv->cfg.path) srv->config_path = strdup(srv->cfg.path);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    /* argv[i] is not NULL for i < argc (C11 5.1.2.2.1), which the analyzer
     * does not know. */
    /* NOLINTNEXTLINE(clang-analyzer-core.NonNullParamChecker) */
    if (strcmp(a, "--config") == 0) {
      i++;
      continue;
    }
    if (strncmp(a, "--config=", 9) == 0) continue;
    if (strncmp(a, "--", 2) != 0) {
      fprintf(stderr, "larderd: unexpected argument '%s'\n", a);
      usage(stderr);
      return 2;
    }
    const char *eq = strchr(a, '=');
    char key[128];
    const char *value;
    if (eq) {
      snprintf(key, sizeof(key), "%.*s", (int)(eq - a - 2), a + 2);
      value = eq + 1;
    } else if (i + 1 < argc) {
      snprintf(key, sizeof(key), "%s", a + 2);
      value = argv[++i];
    } else {
      fprintf(stderr, "larderd: %s needs a value\n", a);
      return 2;
    }
    if (config_set(&srv->cfg, key, value, err, sizeof(err)) != 0) {
      fprintf(stderr, "larderd: %s\n", err);
      return 2;
    }
  }
  if (config_systemd_credentials(&srv->cfg, err, sizeof(err)) != 0) {
    fprintf(stderr, "larderd: %s\n", err);
    return 2;
  }
  log_set_level(srv->cfg.log_level);
  if (srv->cfg.daemonize) {
    /* The working directory becomes /: relative paths must not change
     * their meaning. */
    if (absolutize(&srv->cfg.socket) || absolutize(&srv->cfg.cache_dir) ||
        absolutize(&srv->cfg.pid_file) || absolutize(&srv->cfg.log_file) ||
        absolutize(&srv->cfg.metrics_textfile) || absolutize(&srv->config_path)) {
      fprintf(stderr, "larderd: out of memory\n");
      return 1;
    }
    if (daemonize(srv->cfg.log_file) != 0) return 1;
  } else if (srv->cfg.log_file && *srv->cfg.log_file) {
    int rc = log_open_file(srv->cfg.log_file);
    if (rc) {
      char hint[600];
      fprintf(stderr, "larderd: cannot open the log file %s: %s%s\n", srv->cfg.log_file,
              strerror(-rc), util_sandbox_hint(-rc, srv->cfg.log_file, 0, hint, sizeof(hint)));
      return 2;
    }
  }
  srv->on_ready = on_ready;
  util_heap_setup();
  srv->workers = srv->cfg.workers ? (int)srv->cfg.workers : usable_cores();

  store_options_t so;
  store_options_init(&so);
  so.dir = srv->cfg.cache_dir;
  so.capacity_bytes = srv->cfg.cache_capacity;
  so.idle_evict_s = (uint32_t)srv->cfg.cache_idle_evict;
  so.skip_block_checksums = !srv->cfg.cache_verify_blocks;
  uint64_t flushes = srv->cfg.cache_flush_threads;
  so.flush_threads =
      flushes ? (int)(flushes > 64 ? 64 : flushes) : store_default_flush_threads(srv->workers);
  int rc = store_open(&so, &srv->store, err, sizeof(err));
  if (rc == LARDER_ECORRUPT) {
    /* A cache that RocksDB finds corrupt at open (a lost .sst file, a
     * damaged CURRENT or MANIFEST, after a disk fault) is discarded and
     * started anew, once.  Refusing to start instead, the daemon would be
     * restarted by systemd in a loop, every trainer on the node down for
     * the sake of a cache whose contents the sources hold anyway.  Tested
     * by daemon_cache_corrupt_at_start. */
    log_err("the cache in %s is corrupt (%s): discarding it and starting an empty one",
            srv->cfg.cache_dir, err);
    rc = discard_cache_db(srv->cfg.cache_dir, err, sizeof(err));
    if (rc == 0) rc = store_open(&so, &srv->store, err, sizeof(err));
  }
  if (rc == LARDER_ENOSPC || rc == LARDER_EACCES || rc == LARDER_EIO) {
    /* A cache that cannot be opened (a full disk, a read-only or failing
     * filesystem, a directory that cannot be made) does not stop the
     * daemon from starting, and every trainer on the node with it: it
     * serves without a cache instead, as it does once a disk fills while
     * it runs.  A cache that another larderd holds (LARDER_EBUSY), or a
     * configuration error, does stop it.  Tested by daemon_cache_unusable. */
    char hint[600];
    int e = strstr(err, "Read-only file system") ? EROFS : rc == LARDER_EACCES ? EACCES : 0;
    log_err(
        "cannot open the cache in %s: %s; serving without a cache, every epoch decoded "
        "from the sources, until larderd is restarted with a usable cache_dir%s",
        srv->cfg.cache_dir, err, util_sandbox_hint(e, srv->cfg.cache_dir, 1, hint, sizeof(hint)));
    snprintf(srv->cache_error, sizeof(srv->cache_error), "%s", err);
    srv->store = NULL;
    rc = 0;
  }
  if (rc == LARDER_EBUSY) {
    char holder[512];
    cache_holder(srv->cfg.cache_dir, holder, sizeof(holder));
    log_err(
        "cannot open the cache in %s: another process holds it%s (%s); give this larderd "
        "a cache_dir of its own, or stop the other",
        srv->cfg.cache_dir, holder, err);
    return 1;
  }
  if (rc) {
    log_err("cannot open the cache in %s: %s", srv->cfg.cache_dir, err);
    return 1;
  }
  if (srv->store && srv->cfg.stage_capacity > 0) {
    char dir[4200];
    snprintf(dir, sizeof(dir), "%s/stage", srv->cfg.cache_dir);
    rc = stage_open(dir, srv->cfg.stage_capacity, (uint32_t)srv->cfg.cache_idle_evict, &srv->stage);
    /* Without it the daemon serves as well, fetching such row groups
     * again for each of their units' loads. */
    if (rc) log_warn("cannot open the staging area %s: %s", dir, larder_strerror(rc));
  }
  int status = server_run(srv);
  stage_close(srv->stage);
  store_close(srv->store);
  remove_pid_file();
  log_notice("stopped");
  return status;
}

int main(int argc, char **argv) {
  /* The informational flags answer before anything is allocated. */
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    if (strcmp(argv[i], "--help-config") == 0) {
      config_print_reference(stdout);
      return 0;
    }
    if (strcmp(argv[i], "--version") == 0) {
      printf("larderd %s\n", LARDERD_VERSION);
      return 0;
    }
  }
  /* Every local file that open streams read holds a descriptor: take all
   * that the hard limit allows (the unit's LimitNOFILE). */
  struct rlimit nofile;
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &nofile);
  }
  server_t *srv = calloc(1, sizeof(*srv));
  if (srv == NULL || config_defaults(&srv->cfg) != 0) {
    fprintf(stderr, "larderd: out of memory\n");
    free(srv);
    return 1;
  }
  int status = larderd_run(srv, argc, argv);
  config_free(&srv->cfg);
  free(srv->config_path);
  free(srv);
  return status;
}
