/*
 * test-local-access.c: local files are read as the client that names them.
 *
 * The daemon runs as root in these tests, so it could read anything: each
 * check is that a client of another user (nobody) gets exactly what that
 * user could open itself, for streams, prefetch, evict --dataset and the
 * commands larderctl runs itself (inspect, cat), with data cached by root
 * beforehand; that a thread acting as a client changes no other thread;
 * and that a directory swapped for a symbolic link while datasets open
 * never leads outside local_roots.
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cred.h"
#include "plan/dataset.h"
#include "util.h"
#include "test-ctl-common.h"

static const tc_cred nobody = {65534, 65534, {0}, 0};

static void copy_file(const char *from, const char *to, mode_t mode) {
  ASSERT_EQ(test_system("cp '%s' '%s'", from, to), 0);
  ASSERT_OK(chmod(to, mode));
}

/* Whether `larderctl ls` (as root) lists an object whose name holds s. */
static int ls_has(const char *socket, const char *s) {
  tc_out r;
  tc_ctl(&r, NULL, socket, "ls", NULL);
  int has = r.status == 0 && strstr(r.out, s) != NULL;
  tc_out_free(&r);
  return has;
}

/*
 * A root-only file, a file in a root-only directory and a glob that takes
 * in a root-only file: root reads them all (and caches them); nobody gets
 * "Permission denied" for each, from the stream, from a prefetch (nobody is
 * an admin here, through admin_group), and from inspect and cat, while a
 * file it may read stays open to it.  evict --dataset, resolved as nobody,
 * follows a link into the root-only directory only for root.
 */
TEST_IMPL(local_access_uids) {
  if (tc_need_root()) return TEST_SKIP;
  char std[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  char data[700], from[1200], pub[800], secret[800], priv[800], hidden[900], glob_src[800];
  snprintf(data, sizeof(data), "%s/data", test_tmpdir());
  ASSERT_OK(mkdir(data, 0755));
  snprintf(from, sizeof(from), "%s/part-000.parquet", std);
  snprintf(pub, sizeof(pub), "%s/pub.parquet", data);
  copy_file(from, pub, 0644);
  snprintf(secret, sizeof(secret), "%s/secret.parquet", data);
  copy_file(from, secret, 0600);
  snprintf(priv, sizeof(priv), "%s/private", data);
  ASSERT_OK(mkdir(priv, 0700));
  snprintf(hidden, sizeof(hidden), "%s/hidden.parquet", priv);
  copy_file(from, hidden, 0644);
  snprintf(glob_src, sizeof(glob_src), "%s/*.parquet", data);

  dh_daemon d;
  char roots[800];
  snprintf(roots, sizeof(roots), "--local_roots=%s", data);
  static const char *const fl[] = {"--socket_mode=0666", "--admin_group=65534", NULL};
  dh_init(&d, "d", fl);
  dh_flag(&d, roots);
  tc_open_tmpdir(d.dir);
  dh_start(&d);

  /* Root reads everything, and so fills the cache with it. */
  tc_expect_open(NULL, d.socket, secret, 0, NULL);
  tc_expect_open(NULL, d.socket, hidden, 0, NULL);
  tc_expect_open(NULL, d.socket, priv, 0, NULL);
  tc_expect_open(NULL, d.socket, glob_src, 0, NULL);
  double deadline = test_now_ms() + 30000 * dh_slow();
  while (!(ls_has(d.socket, "hidden.parquet") && ls_has(d.socket, "secret.parquet")) &&
         test_now_ms() < deadline)
    usleep(20000);
  ASSERT(ls_has(d.socket, "hidden.parquet"));

  /* nobody: what it may read, and nothing else, cached or not. */
  tc_expect_open(&nobody, d.socket, pub, 0, NULL);
  tc_expect_open(&nobody, d.socket, secret, LARDER_EACCES, "Permission denied");
  tc_expect_open(&nobody, d.socket, hidden, LARDER_EACCES, NULL);
  tc_expect_open(&nobody, d.socket, priv, LARDER_EACCES, NULL);
  tc_expect_open(&nobody, d.socket, glob_src, LARDER_EACCES, "secret.parquet");

  /* prefetch: the same rule. */
  tc_out r;
  tc_ctl(&r, &nobody, d.socket, "prefetch", secret, NULL);
  if (r.status == 0) tc_out_print("prefetch of a root-only file as nobody", &r);
  ASSERT(r.status != 0);
  ASSERT_STR_CONTAINS(r.err, "Permission denied");
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "prefetch", hidden, NULL);
  ASSERT(r.status != 0);
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "prefetch", pub, NULL);
  if (r.status != 0) tc_out_print("prefetch as nobody", &r);
  ASSERT_EQ(r.status, 0);
  tc_out_free(&r);

  /* evict --dataset resolves a link as the admin who names it: nobody
   * cannot follow one into the directory it may not search, root can. */
  char alias[800];
  snprintf(alias, sizeof(alias), "%s/alias.parquet", data);
  ASSERT_OK(symlink("private/hidden.parquet", alias));
  tc_ctl(&r, &nobody, d.socket, "evict", "--dataset", alias, NULL);
  tc_out_free(&r);
  ASSERT(ls_has(d.socket, "hidden.parquet"));
  tc_ctl(&r, NULL, d.socket, "evict", "--dataset", alias, NULL);
  if (r.status != 0) tc_out_print("evict --dataset as root", &r);
  ASSERT_EQ(r.status, 0);
  tc_out_free(&r);
  ASSERT(!ls_has(d.socket, "hidden.parquet"));

  /* inspect and cat read the file in larderctl itself, as the user. */
  tc_ctl(&r, &nobody, d.socket, "inspect", secret, NULL);
  ASSERT(r.status != 0);
  ASSERT_STR_CONTAINS(r.err, "Permission denied");
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "cat", hidden, NULL);
  ASSERT(r.status != 0);
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "inspect", pub, NULL);
  ASSERT_EQ(r.status, 0);
  tc_out_free(&r);

  /* Access taken away is taken away for the next open. */
  ASSERT_OK(chmod(pub, 0600));
  tc_expect_open(&nobody, d.socket, pub, LARDER_EACCES, "Permission denied");
  ASSERT_OK(chmod(pub, 0644));
  tc_expect_open(&nobody, d.socket, pub, 0, NULL);
  ASSERT_EQ(dh_stat(&d, "stream_errors"), 0);
  dh_stop(&d);
  return 0;
}

typedef struct probe {
  const char *path;
  atomic_int go, done;
  int rc;
} probe_t;

static void *probe_main(void *arg) {
  probe_t *p = arg;
  while (!atomic_load(&p->go)) usleep(100);
  int fd = open(p->path, O_RDONLY);
  p->rc = fd >= 0 ? 0 : errno;
  if (fd >= 0) close(fd);
  atomic_store(&p->done, 1);
  return NULL;
}

/*
 * cred_enter changes the calling thread alone: acting as nobody it cannot
 * open a root-only file, which another thread of the process still can at
 * the same time; cred_leave gives the thread its access back.  A daemon
 * without CAP_SETUID serves its own uid and root as itself, and refuses
 * other users with a message that names what it lacks.
 */
TEST_IMPL(local_access_cred_threads) {
  if (tc_need_root()) return TEST_SKIP;
  char path[700];
  snprintf(path, sizeof(path), "%s/root-only", test_tmpdir());
  int fd = open(path, O_CREAT | O_WRONLY, 0600);
  ASSERT(fd >= 0);
  close(fd);
  ASSERT(cred_can_switch());
  gid_t groups[1] = {4242};
  acl_peer_t peer = {65534, 65534, groups, 1};
  cred_saved_t saved;
  char err[512];
  /* The probe thread exists before the switch: a thread created while
   * its creator acts as a client inherits the client's credentials. */
  probe_t p = {path, 0, 0, -1};
  pthread_t th;
  ASSERT_OK(pthread_create(&th, NULL, probe_main, &p));
  ASSERT_OK(cred_enter(&peer, &saved, err, sizeof(err)));
  ASSERT_EQ(open(path, O_RDONLY), -1);
  ASSERT_EQ(errno, EACCES);
  atomic_store(&p.go, 1);
  ASSERT_OK(pthread_join(th, NULL));
  ASSERT_EQ(p.rc, 0);
  cred_leave(&saved);
  fd = open(path, O_RDONLY);
  ASSERT(fd >= 0);
  close(fd);
  ASSERT_OK(chmod(test_tmpdir(), 0755));

  /* Without the capabilities (a child that became uid 4242). */
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (setgroups(0, NULL) != 0 || setgid(4242) != 0 || setuid(4242) != 0) _exit(2);
    cred_init();
    if (cred_can_switch()) _exit(7);
    acl_peer_t self = {4242, 4242, NULL, 0}, root = {0, 0, NULL, 0};
    acl_peer_t other = {4343, 4343, NULL, 0};
    cred_saved_t s;
    char e[512] = "";
    if (cred_enter(&self, &s, e, sizeof(e)) != 0 || s.switched) _exit(3);
    if (cred_enter(&root, &s, e, sizeof(e)) != 0 || s.switched) _exit(4);
    if (cred_enter(&other, &s, e, sizeof(e)) != LARDER_EACCES) _exit(5);
    if (strstr(e, "CAP_SETUID") == NULL || strstr(e, "uid 4343") == NULL) _exit(6);
    _exit(0);
  }
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* A directory swapped for a link while datasets open                        */

typedef struct swapper {
  char a[800], b[800];
  atomic_int stop;
  uint64_t swaps;
} swapper_t;

static void *swap_main(void *arg) {
  swapper_t *s = arg;
  while (!atomic_load(&s->stop)) {
    if (renameat2(AT_FDCWD, s->a, AT_FDCWD, s->b, RENAME_EXCHANGE) == 0) s->swaps++;
  }
  return NULL;
}

/* Lays out root/d/x.parquet (ids of part-000), root/l -> ../outside, and
 * outside/x.parquet (ids of part-001, another file); sets sw to swap root/d
 * with root/l.  Returns the inode of the file outside. */
static ino_t swap_layout(const char *std, char *root, size_t rootlen, char *src, size_t srclen,
                         swapper_t *sw) {
  char outside[700], from[1200], to[900];
  snprintf(root, rootlen, "%s/root", test_tmpdir());
  snprintf(outside, sizeof(outside), "%s/outside", test_tmpdir());
  ASSERT_OK(mkdir(root, 0755));
  ASSERT_OK(mkdir(outside, 0755));
  snprintf(to, sizeof(to), "%s/d", root);
  ASSERT_OK(mkdir(to, 0755));
  snprintf(from, sizeof(from), "%s/part-000.parquet", std);
  snprintf(to, sizeof(to), "%s/d/x.parquet", root);
  copy_file(from, to, 0644);
  snprintf(from, sizeof(from), "%s/part-001.parquet", std);
  snprintf(to, sizeof(to), "%s/x.parquet", outside);
  copy_file(from, to, 0644);
  struct stat st;
  ASSERT_OK(stat(to, &st));
  snprintf(to, sizeof(to), "%s/l", root);
  ASSERT_OK(symlink("../outside", to));
  snprintf(src, srclen, "%s/d/x.parquet", root);
  memset(sw, 0, sizeof(*sw));
  snprintf(sw->a, sizeof(sw->a), "%s/d", root);
  snprintf(sw->b, sizeof(sw->b), "%s/l", root);
  return st.st_ino;
}

/*
 * dataset_open over root/d/x.parquet, 100,000 times, while another thread
 * swaps root/d with a link to a directory outside the root: every open
 * either fails or holds the file inside; none holds the file outside.
 */
TEST_IMPL(local_access_swap_race) {
  char std[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  char root[700], src[900];
  swapper_t sw;
  ino_t outside_ino = swap_layout(std, root, sizeof(root), src, sizeof(src), &sw);
  const char *roots[2] = {root, NULL};
  const char *sources[1] = {src};
  dataset_options_t dopts;
  memset(&dopts, 0, sizeof(dopts));
  dopts.unit_rows = 4096;
  dopts.unit_bytes = 4u << 20;
  pq_options_init(&dopts.pq);
  dopts.allowed_roots = roots;
  footers_t *footers;
  ASSERT_OK(footers_create(NULL, &footers));
  pthread_t th;
  ASSERT_OK(pthread_create(&th, NULL, swap_main, &sw));
  int opens = getenv("LARDER_SWAP_OPENS") ? atoi(getenv("LARDER_SWAP_OPENS")) : 100000;
  int ok = 0, refused = 0, escaped = 0;
  for (int i = 0; i < opens; i++) {
    /* Half of them through the footer table, which keeps the descriptor
     * for every dataset that shares the file. */
    dopts.footers = i % 2 ? footers : NULL;
    dataset_t *ds = NULL;
    char err[600];
    if (dataset_open(sources, 1, NULL, 0, &dopts, &ds, err, sizeof(err)) != 0) {
      refused++;
      continue;
    }
    struct stat st;
    ASSERT_OK(fstat(dataset_file_fd(&ds->files[0]), &st));
    if (st.st_ino == outside_ino) escaped++;
    else ok++;
    dataset_free(ds);
  }
  atomic_store(&sw.stop, 1);
  ASSERT_OK(pthread_join(th, NULL));
  fprintf(stderr, "%d opens: %d inside, %d refused, %d outside; %llu swaps\n", opens, ok, refused,
          escaped, (unsigned long long)sw.swaps);
  footers_destroy(footers);
  ASSERT_EQ(escaped, 0);
  ASSERT_GT(ok, 0);
  return 0;
}

/*
 * The same race through the daemon: streams opened while root/d
 * and the link swap places; every batch delivered holds the inside file's
 * ids (0..2499), never the outside file's (2500..4999).
 */
TEST_IMPL(local_access_swap_streams) {
  if (tc_need_root()) return TEST_SKIP;
  char std[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  char root[700], src[900], arg[800];
  swapper_t sw;
  (void)swap_layout(std, root, sizeof(root), src, sizeof(src), &sw);
  dh_daemon d;
  static const char *const fl[] = {"--socket_mode=0666", NULL};
  dh_init(&d, "d", fl);
  snprintf(arg, sizeof(arg), "--local_roots=%s", root);
  dh_flag(&d, arg);
  tc_open_tmpdir(d.dir);
  dh_start(&d);
  pthread_t th;
  ASSERT_OK(pthread_create(&th, NULL, swap_main, &sw));
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  int ok = 0, refused = 0;
  int opens = getenv("LARDER_SWAP_STREAMS") ? atoi(getenv("LARDER_SWAP_STREAMS")) : 2000;
  for (int i = 0; i < opens; i++) {
    const char *s[1] = {src};
    larder_stream_options_t o;
    dh_opts(&o, s, 256, (uint64_t)i, 1);
    o.arena_bytes = 4u << 20;
    larder_stream_t *st;
    if (larder_stream_open(c, &o, &st) != 0) {
      refused++;
      continue;
    }
    larder_batch_t *b;
    int rc = larder_stream_next(st, 60000 * dh_slow(), &b);
    if (rc == 0) {
      int64_t ids[256];
      int64_t n = dh_batch_ids(b, ids, 256);
      ASSERT_GT(n, 0);
      for (int64_t k = 0; k < n; k++) ASSERT_LT(ids[k], 2500);
      larder_batch_release(b);
      ok++;
    }
    larder_stream_close(st);
  }
  atomic_store(&sw.stop, 1);
  ASSERT_OK(pthread_join(th, NULL));
  fprintf(stderr, "%d stream opens: %d read inside, %d refused; %llu swaps\n", opens, ok, refused,
          (unsigned long long)sw.swaps);
  ASSERT_GT(ok, 0);
  larder_client_close(c);
  dh_stop(&d);
  return 0;
}

/*
 * Under systemd's PrivateTmp the daemon's /tmp is not the trainers': a
 * source under /tmp that the daemon cannot see says so, instead of a bare
 * "No such file or directory".  (A child in a mount namespace of its own,
 * with a systemd-private-* directory bound over /tmp, stands for the
 * unit; skipped where mounts are not allowed.)  And a path the unit's
 * ProtectSystem makes read-only gets the drop-in that allows it.
 */
TEST_IMPL(local_access_private_tmp) {
  char hint[600];
  ASSERT_OK(setenv("INVOCATION_ID", "0123456789abcdef", 1));
  util_sandbox_hint(EROFS, "/srv/metrics/larder.prom", 0, hint, sizeof(hint));
  ASSERT_STR_CONTAINS(hint, "ReadWritePaths=/srv/metrics");
  util_sandbox_hint(EACCES, "/data/cache", 1, hint, sizeof(hint));
  ASSERT_STR_CONTAINS(hint, "ReadWritePaths=/data/cache");
  util_sandbox_hint(ENOENT, "/data/cache", 1, hint, sizeof(hint));
  ASSERT_STR_EQ(hint, "");
  ASSERT_OK(unsetenv("INVOCATION_ID"));
  util_sandbox_hint(EROFS, "/data/cache", 1, hint, sizeof(hint));
  ASSERT_STR_EQ(hint, "");

  if (geteuid() != 0) return TEST_SKIP;
  char file[700], priv[700];
  snprintf(file, sizeof(file), "/tmp/larder-private-tmp-%d.parquet", (int)getpid());
  FILE *f = fopen(file, "w");
  ASSERT_NOT_NULL(f);
  fputs("not parquet", f);
  ASSERT_OK(fclose(f));
  snprintf(priv, sizeof(priv), "%s/systemd-private-larder-tmp", test_tmpdir());
  ASSERT_OK(mkdir(priv, 0700));
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
        mount(priv, "/tmp", NULL, MS_BIND, NULL) != 0)
      _exit(77);
    if (!util_private_tmp()) _exit(3);
    dataset_options_t dopts;
    memset(&dopts, 0, sizeof(dopts));
    dopts.unit_rows = 4096;
    dopts.unit_bytes = 4u << 20;
    pq_options_init(&dopts.pq);
    const char *src[1] = {file};
    dataset_t *ds = NULL;
    char err[1024];
    int rc = dataset_open(src, 1, NULL, 0, &dopts, &ds, err, sizeof(err));
    if (rc != LARDER_ENOENT) _exit(4);
    if (strstr(err, "private /tmp") == NULL) _exit(5);
    _exit(0);
  }
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  unlink(file);
  ASSERT(WIFEXITED(st));
  if (WEXITSTATUS(st) == 77) {
    fprintf(stderr, "no mount namespace here\n");
    return TEST_SKIP;
  }
  ASSERT_EQ(WEXITSTATUS(st), 0);
  /* This process's /tmp is no private one. */
  ASSERT_EQ(util_private_tmp(), 0);
  return 0;
}
