/*
 * test-acl.c: access control.  The allowlist of URL prefixes (with owner
 * uids and gids), the admin commands, local roots and the per-client
 * limits, each checked with clients running under other users: the tests
 * run as root, start the daemon as root, and fork children that drop to
 * nobody, to made-up uids, and to groups given as primary or supplementary
 * groups (SO_PEERGROUPS).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "acl.h"
#include "pqwrite.h"
#include "test-ctl-common.h"

static const tc_cred nobody = {65534, 65534, {0}, 0};

#define EXPECT_RUN(o, want)         \
  do {                              \
    if ((o)->status != (want)) {    \
      tc_out_print(#o, o);          \
      ASSERT_EQ((o)->status, want); \
    }                               \
  } while (0)

/* ------------------------------------------------------------------------ */

static int url_ok(const acl_t *a, const acl_peer_t *p, const char *url) {
  char err[2400];
  int rc = acl_check_url(a, p, url, err, sizeof(err));
  if (rc) ASSERT_STR_CONTAINS(err, "not allowed: ");
  return rc == 0;
}

/* The rules themselves: prefixes, boundaries, dot segments, owners. */
TEST_IMPL(acl_rules) {
  char err[512];
  acl_t *a;
  /* No rule: everything, as before the allowlist existed. */
  ASSERT_OK(acl_create(NULL, 0, "", &a, err, sizeof(err)));
  acl_peer_t p = {65534, 65534, NULL, 0};
  ASSERT(url_ok(a, &p, "s3://anything/at/all"));
  ASSERT(url_ok(NULL, &p, "s3://anything/at/all"));
  ASSERT(!acl_is_admin(a, &p));
  acl_free(a);

  static const char *const allow[] = {"s3://Bucket/data/", "https://Example.com",
                                      "http://h:8080/pub/ uid=4242 gid=4343",
                                      "http://h:8080/team/ user=root group=65534"};
  ASSERT_OK(acl_create(allow, 4, "4444", &a, err, sizeof(err)));
  ASSERT_EQ(acl_num_rules(a), 4);
  ASSERT(url_ok(a, &p, "s3://Bucket/data/x.parquet"));
  ASSERT(url_ok(a, &p, "S3://Bucket/data/x.parquet"));  /* scheme: any case */
  ASSERT(!url_ok(a, &p, "s3://bucket/data/x.parquet")); /* bucket: exact */
  ASSERT(!url_ok(a, &p, "s3://Bucket/data"));           /* above the prefix */
  ASSERT(!url_ok(a, &p, "s3://Bucket/datafile"));
  ASSERT(url_ok(a, &p, "s3://Bucket/data/sub/*.parquet"));
  ASSERT(!url_ok(a, &p, "s3://Bucket/data/../secret/x")); /* dot segments */
  ASSERT(!url_ok(a, &p, "s3://Bucket/data/%2e%2E/secret/x"));
  ASSERT(!url_ok(a, &p, "s3://Bucket/data/./x"));
  ASSERT(!url_ok(a, &p, "s3://Bucket/data/sub/.."));
  ASSERT(url_ok(a, &p, "s3://Bucket/data/a..b/x"));
  ASSERT(!url_ok(a, &p, "s3://Bucket/data/x y")); /* spaces */
  /* Encoded separators, which HTTP servers decode before resolving "..". */
  ASSERT(!url_ok(a, &p, "https://example.com/x/..%2fsecret"));
  ASSERT(!url_ok(a, &p, "https://example.com/x/..%2Fsecret"));
  ASSERT(!url_ok(a, &p, "https://example.com/x/..%5csecret"));
  ASSERT(!url_ok(a, &p, "https://example.com/x%00.parquet"));
  ASSERT(url_ok(a, &p, "https://example.com/x%20y.parquet"));
  ASSERT(url_ok(a, &p, "https://example.com/x?p=a%2Fb")); /* the query is no path */
  ASSERT(url_ok(a, &p, "https://example.com/any/path"));  /* host: any case */
  ASSERT(url_ok(a, &p, "https://EXAMPLE.COM"));
  ASSERT(url_ok(a, &p, "https://example.com?x=1"));
  ASSERT(!url_ok(a, &p, "https://example.com.evil.org/x")); /* host boundary */
  ASSERT(!url_ok(a, &p, "https://example.com@evil.org/x"));
  ASSERT(!url_ok(a, &p, "https://example.com:8443/x"));
  ASSERT(!url_ok(a, &p, "http://example.com/x"));
  ASSERT(!url_ok(a, &p, "/local/path.parquet"));
  /* Owners. */
  ASSERT(!url_ok(a, &p, "http://h:8080/pub/x"));
  acl_peer_t u4242 = {4242, 100, NULL, 0};
  ASSERT(url_ok(a, &u4242, "http://h:8080/pub/x"));
  acl_peer_t g4343 = {5000, 4343, NULL, 0};
  ASSERT(url_ok(a, &g4343, "http://h:8080/pub/x"));
  gid_t sup[] = {10, 4343};
  acl_peer_t s4343 = {5000, 5000, sup, 2};
  ASSERT(url_ok(a, &s4343, "http://h:8080/pub/x"));
  ASSERT(!url_ok(a, &u4242, "http://h:8080/pubx"));
  ASSERT(url_ok(a, &p, "http://h:8080/team/x")); /* group=65534 by number */
  acl_peer_t root = {0, 0, NULL, 0};
  ASSERT(url_ok(a, &root, "http://h:8080/team/x")); /* user=root by name */
  ASSERT(!url_ok(a, &u4242, "http://h:8080/team/x"));
  /* Admins: root, the daemon's own user, the admin group. */
  ASSERT(acl_is_admin(a, &root));
  ASSERT(!acl_is_admin(a, &u4242));
  gid_t adm[] = {4444};
  acl_peer_t a4444 = {5001, 5001, adm, 1};
  ASSERT(acl_is_admin(a, &a4444));
  acl_free(a);

  /* Bad rules are refused with the reason. */
  ASSERT_EQ(acl_rule_check("ftp://host/x/", err, sizeof(err)), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(err, "only http://, https:// and s3://");
  ASSERT_EQ(acl_rule_check("/data/train", err, sizeof(err)), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(err, "local_roots");
  ASSERT_EQ(acl_rule_check("s3://b/ uid=no-such-user-here", err, sizeof(err)), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(err, "unknown user");
  ASSERT_EQ(acl_rule_check("s3://b/ colour=red", err, sizeof(err)), LARDER_EINVAL);
  ASSERT_EQ(acl_rule_check("s3://", err, sizeof(err)), LARDER_EINVAL);
  ASSERT_EQ(acl_rule_check("", err, sizeof(err)), LARDER_EINVAL);
  ASSERT_EQ(acl_rule_check("s3://b/p/../q/", err, sizeof(err)), LARDER_EINVAL);
  ASSERT_OK(acl_rule_check("s3://b/p/ gid=10 uid=0", err, sizeof(err)));
  ASSERT_EQ(acl_create(NULL, 0, "no-such-group-here", &a, err, sizeof(err)), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(err, "admin_group");

  /* local_roots */
  int oom;
  char **r = acl_split_roots("/data:/scratch, /more", &oom);
  ASSERT_NOT_NULL(r);
  ASSERT_STR_EQ(r[0], "/data");
  ASSERT_STR_EQ(r[1], "/scratch");
  ASSERT_STR_EQ(r[2], "/more");
  ASSERT_NULL(r[3]);
  free(r);
  ASSERT_NULL(acl_split_roots("", &oom));
  ASSERT_EQ(oom, 0);
  return 0;
}

/* ------------------------------------------------------------------------ */

/*
 * The allowlist under different users: URLs outside it are refused for
 * streams, inspect and cat, with "not allowed: URL is outside the
 * configured sources"; rules limited to a uid or a gid admit only those
 * (primary or supplementary group); a rule change on SIGHUP applies at
 * once.
 */
TEST_IMPL(acl_allowlist_uids) {
  if (tc_need_root()) return TEST_SKIP;
  char std[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  char root[700], ndir[700];
  snprintf(root, sizeof(root), "%s/www", test_tmpdir());
  snprintf(ndir, sizeof(ndir), "%s/nginx", test_tmpdir());
  static const char *const subdirs[] = {"open", "team", "grp", "secret"};
  for (int i = 0; i < 4; i++) {
    char dir[800], file[900], from[1200];
    snprintf(dir, sizeof(dir), "%s/%s", root, subdirs[i]);
    ASSERT_EQ(test_system("mkdir -p '%s'", dir), 0);
    snprintf(file, sizeof(file), "%s/part.parquet", dir);
    snprintf(from, sizeof(from), "%s/part-000.parquet", std);
    test_copy_file(from, file);
  }
  int port = tc_nginx_start(ndir, root, "");
  if (port == 0) {
    fprintf(stderr, "nginx is not available\n");
    return TEST_SKIP;
  }
  dh_daemon d;
  static const char *const fl[] = {"--socket_mode=0666", NULL};
  dh_init(&d, "d", fl);
  FILE *f = fopen(d.config, "w");
  ASSERT_NOT_NULL(f);
  fprintf(f,
          "[access]\n"
          "allow = http://127.0.0.1:%d/open/\n"
          "allow = http://127.0.0.1:%d/team/ uid=4242\n"
          "allow = http://127.0.0.1:%d/grp/ gid=4343\n",
          port, port, port);
  fclose(f);
  tc_open_tmpdir(d.dir);
  dh_start(&d);
  char u_open[200], u_team[200], u_grp[200], u_secret[200], u_dots[200], u_glob[200];
  snprintf(u_open, sizeof(u_open), "http://127.0.0.1:%d/open/part.parquet", port);
  snprintf(u_team, sizeof(u_team), "http://127.0.0.1:%d/team/part.parquet", port);
  snprintf(u_grp, sizeof(u_grp), "http://127.0.0.1:%d/grp/part.parquet", port);
  snprintf(u_secret, sizeof(u_secret), "http://127.0.0.1:%d/secret/part.parquet", port);
  snprintf(u_dots, sizeof(u_dots), "http://127.0.0.1:%d/open/../secret/part.parquet", port);
  snprintf(u_glob, sizeof(u_glob), "http://127.0.0.1:%d/op*", port);

  /* nobody: the open prefix only. */
  tc_expect_open(&nobody, d.socket, u_open, 0, NULL);
  tc_expect_open(&nobody, d.socket, u_team, LARDER_EACCES, "not allowed: ");
  tc_expect_open(&nobody, d.socket, u_grp, LARDER_EACCES, "not allowed: ");
  tc_expect_open(&nobody, d.socket, u_secret, LARDER_EACCES, "not allowed: ");
  tc_expect_open(&nobody, d.socket, u_dots, LARDER_EACCES, "not allowed: ");
  tc_expect_open(&nobody, d.socket, u_glob, LARDER_EACCES, "not allowed: ");
  char msg[1200];
  ASSERT_EQ(tc_open_as(&nobody, d.socket, u_secret, msg, sizeof(msg)), LARDER_EACCES);
  char want[400];
  snprintf(want, sizeof(want), "not allowed: %s is outside the configured sources", u_secret);
  ASSERT_STR_CONTAINS(msg, want);
  /* uid 4242: its own prefix too, not the group's. */
  tc_cred u4242 = {4242, 4242, {0}, 0};
  tc_expect_open(&u4242, d.socket, u_team, 0, NULL);
  tc_expect_open(&u4242, d.socket, u_open, 0, NULL);
  tc_expect_open(&u4242, d.socket, u_grp, LARDER_EACCES, "not allowed: ");
  /* gid 4343 as the primary group, or as a supplementary one. */
  tc_cred g_primary = {5000, 4343, {0}, 0};
  tc_expect_open(&g_primary, d.socket, u_grp, 0, NULL);
  tc_expect_open(&g_primary, d.socket, u_team, LARDER_EACCES, "not allowed: ");
  tc_cred g_sup = {5001, 5001, {100, 4343}, 2};
  tc_expect_open(&g_sup, d.socket, u_grp, 0, NULL);
  tc_cred g_none = {5002, 5002, {100}, 1};
  tc_expect_open(&g_none, d.socket, u_grp, LARDER_EACCES, "not allowed: ");
  /* root is subject to the allowlist as well: it guards the daemon's
   * credentials, not the caller's. */
  tc_expect_open(NULL, d.socket, u_secret, LARDER_EACCES, "not allowed: ");

  /* inspect and cat through the daemon follow the same rules. */
  tc_out r;
  tc_ctl(&r, &nobody, d.socket, "cat", u_secret, "--limit", "1", NULL);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.err, "is outside the configured sources");
  ASSERT_STR_EQ(r.out, "");
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "inspect", u_team, NULL);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.err, "not allowed");
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "cat", u_open, "--limit", "2", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_EQ(tc_json_lines(r.out), 2);
  tc_out_free(&r);
  tc_ctl(&r, &u4242, d.socket, "inspect", u_team, "--json", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT(tc_json_valid(r.out));
  tc_out_free(&r);

  /* Nothing was fetched for a refused request. */
  char *log = dh_read_log(&d);
  ASSERT_NOT_NULL(log);
  ASSERT_STR_CONTAINS(log, "outside the allowlist");
  free(log);
  size_t len;
  char access_log[800];
  snprintf(access_log, sizeof(access_log), "%s/access.log", ndir);
  uint8_t *al = test_read_file(access_log, &len);
  if (al) {
    char *t = realloc(al, len + 1);
    t[len] = '\0';
    ASSERT_NULL(strstr(t, "/secret/"));
    free(t);
  }

  /* SIGHUP: the secret prefix for everyone now, the open one no more. */
  f = fopen(d.config, "w");
  ASSERT_NOT_NULL(f);
  fprintf(f, "allow = http://127.0.0.1:%d/secret/\n", port);
  fclose(f);
  kill(d.pid, SIGHUP);
  ASSERT(tc_wait_log(&d, "reloaded", 10000 * dh_slow()));
  tc_expect_open(&nobody, d.socket, u_secret, 0, NULL);
  tc_expect_open(&nobody, d.socket, u_open, LARDER_EACCES, "not allowed: ");
  dh_stop(&d);
  tc_nginx_stop(ndir);
  return 0;
}

/*
 * Admin commands (evict, prefetch, verify, reload, config) need root, the
 * daemon's user or the admin group; the rest is open to anyone who can
 * reach the socket.  Secrets never show, in config output or in the log.
 */
TEST_IMPL(acl_admin_uids) {
  if (tc_need_root()) return TEST_SKIP;
  char std[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  dh_daemon d;
  static const char *const fl[] = {"--socket_mode=0666", "--admin_group=4444",
                                   "--s3_secret_key=SeCrEtVaLuE123",
                                   "--s3_session_token=ToKeNvAlUe456", NULL};
  dh_init(&d, "d", fl);
  tc_open_tmpdir(d.dir);
  dh_start(&d);
  /* Something cached, so that evict has work. */
  const char *src[1] = {std};
  larder_stream_options_t o;
  dh_opts(&o, src, 100, 1, 1);
  dh_run run = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &run));
  dh_run_free(&run);
  uint64_t used = dh_stat(&d, "cache.used_bytes");
  ASSERT_GT(used, 0);

  static const char *const open_cmds[][2] = {
      {"status", NULL}, {"stats", NULL}, {"ls", NULL}, {"clients", NULL}};
  static const char *const admin_cmds[][3] = {{"evict", "--all", NULL},
                                              {"prefetch", NULL, NULL},
                                              {"verify", NULL, NULL},
                                              {"reload", NULL, NULL},
                                              {"config", NULL, NULL}};
  tc_out r;
  tc_cred plain = {4242, 4242, {100}, 1};
  const tc_cred *users[] = {&nobody, &plain};
  for (int u = 0; u < 2; u++) {
    for (size_t i = 0; i < sizeof(open_cmds) / sizeof(open_cmds[0]); i++) {
      tc_ctl(&r, users[u], d.socket, open_cmds[i][0], NULL);
      EXPECT_RUN(&r, 0);
      tc_out_free(&r);
    }
    for (size_t i = 0; i < sizeof(admin_cmds) / sizeof(admin_cmds[0]); i++) {
      const char *arg = admin_cmds[i][1];
      if (strcmp(admin_cmds[i][0], "prefetch") == 0) arg = std;
      tc_ctl(&r, users[u], d.socket, admin_cmds[i][0], arg, NULL);
      EXPECT_RUN(&r, 1);
      ASSERT_STR_CONTAINS(r.err, "not allowed: `larderctl ");
      ASSERT_STR_CONTAINS(r.err, "admin group 4444");
      tc_out_free(&r);
    }
  }
  ASSERT_EQ(dh_stat(&d, "cache.used_bytes"), used);
  /* The admin group, as a supplementary or the primary group. */
  tc_cred adm_sup = {4300, 4300, {4444}, 1};
  tc_ctl(&r, &adm_sup, d.socket, "evict", "--all", "--dry-run", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "would free");
  tc_out_free(&r);
  tc_ctl(&r, &adm_sup, d.socket, "verify", NULL);
  EXPECT_RUN(&r, 0);
  tc_out_free(&r);
  tc_ctl(&r, &adm_sup, d.socket, "config", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "s3_secret_key                = (set)");
  ASSERT_NULL(strstr(r.out, "SeCrEtVaLuE123"));
  ASSERT_NULL(strstr(r.out, "ToKeNvAlUe456"));
  tc_out_free(&r);
  tc_ctl(&r, &adm_sup, d.socket, "config", "--json", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT(tc_json_valid(r.out));
  ASSERT_NULL(strstr(r.out, "SeCrEtVaLuE123"));
  tc_out_free(&r);
  tc_cred adm_primary = {4301, 4444, {0}, 0};
  tc_ctl(&r, &adm_primary, d.socket, "reload", NULL);
  EXPECT_RUN(&r, 0);
  tc_out_free(&r);
  tc_ctl(&r, &adm_primary, d.socket, "prefetch", std, NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "done in ");
  tc_out_free(&r);
  tc_ctl(&r, &adm_primary, d.socket, "evict", "--all", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "freed");
  tc_out_free(&r);
  ASSERT_EQ(dh_stat(&d, "cache.used_bytes"), 0);
  /* root */
  tc_ctl(&r, NULL, d.socket, "verify", NULL);
  EXPECT_RUN(&r, 0);
  tc_out_free(&r);
  dh_stop(&d);
  char *log = dh_read_log(&d);
  ASSERT_NOT_NULL(log);
  ASSERT_STR_CONTAINS(log, "refused: not root or in the admin group");
  ASSERT_NULL(strstr(log, "SeCrEtVaLuE123"));
  ASSERT_NULL(strstr(log, "ToKeNvAlUe456"));
  free(log);
  return 0;
}

/*
 * Local paths stay inside local_roots: other directories, "..", symlinks
 * out of a root and globs that would walk outside are refused, for every
 * user, and the message names only the source given.  The key is live.
 */
TEST_IMPL(acl_local_roots) {
  if (tc_need_root()) return TEST_SKIP;
  char std[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  char data[700], other[700], from[1200], file[800], link[800], arg[900];
  snprintf(data, sizeof(data), "%s/data", test_tmpdir());
  snprintf(other, sizeof(other), "%s/other", test_tmpdir());
  ASSERT_OK(mkdir(data, 0755));
  ASSERT_OK(mkdir(other, 0755));
  snprintf(from, sizeof(from), "%s/part-000.parquet", std);
  snprintf(file, sizeof(file), "%s/x.parquet", data);
  test_copy_file(from, file);
  snprintf(file, sizeof(file), "%s/secret-name.parquet", other);
  test_copy_file(from, file);
  /* A symlink out of the root, in a directory of its own (a directory
   * source with it in would be refused as a whole). */
  snprintf(link, sizeof(link), "%s/links", data);
  ASSERT_OK(mkdir(link, 0755));
  snprintf(link, sizeof(link), "%s/links/link.parquet", data);
  ASSERT_OK(symlink("../../other/secret-name.parquet", link));
  dh_daemon d;
  snprintf(arg, sizeof(arg), "--local_roots=%s", data);
  static const char *const fl[] = {"--socket_mode=0666", NULL};
  dh_init(&d, "d", fl);
  dh_flag(&d, arg);
  tc_open_tmpdir(d.dir);
  dh_start(&d);
  char src[900], msg[1200];
  snprintf(src, sizeof(src), "%s/x.parquet", data);
  tc_expect_open(&nobody, d.socket, src, 0, NULL);
  tc_expect_open(&nobody, d.socket, data, 0, NULL);
  tc_expect_open(NULL, d.socket, file, LARDER_EACCES, "not allowed: ");
  tc_expect_open(&nobody, d.socket, file, LARDER_EACCES, "not allowed: ");
  snprintf(src, sizeof(src), "%s/../other/secret-name.parquet", data);
  tc_expect_open(&nobody, d.socket, src, LARDER_EACCES, "not allowed: ");
  tc_expect_open(&nobody, d.socket, link, LARDER_EACCES, "not allowed: ");
  ASSERT_EQ(tc_open_as(&nobody, d.socket, link, msg, sizeof(msg)), LARDER_EACCES);
  ASSERT_NULL(strstr(msg, "secret-name"));
  snprintf(src, sizeof(src), "%s/*/secret*.parquet", test_tmpdir());
  ASSERT_EQ(tc_open_as(&nobody, d.socket, src, msg, sizeof(msg)), LARDER_EACCES);
  ASSERT_STR_CONTAINS(msg, "outside the configured sources");
  ASSERT_NULL(strstr(msg, "secret-name"));
  snprintf(src, sizeof(src), "%s/*.parquet", other);
  tc_expect_open(&nobody, d.socket, src, LARDER_EACCES, "not allowed: ");
  tc_expect_open(&nobody, d.socket, other, LARDER_EACCES, "not allowed: ");
  /* Outside the roots, what exists and what does not look the same (they
   * answered "no such file", "not allowed" and "no .parquet files"), and a
   * pattern may not climb out with "..". */
  snprintf(src, sizeof(src), "%s/no-such.parquet", other);
  tc_expect_open(&nobody, d.socket, src, LARDER_EACCES, "not allowed: ");
  snprintf(src, sizeof(src), "%s/no-such-dir/x.parquet", other);
  tc_expect_open(&nobody, d.socket, src, LARDER_EACCES, "not allowed: ");
  tc_expect_open(&nobody, d.socket, test_tmpdir(), LARDER_EACCES, "not allowed: ");
  snprintf(src, sizeof(src), "%s/*/../../other/secret-name.parque?", data);
  tc_expect_open(&nobody, d.socket, src, LARDER_EACCES, "not allowed: ");
  snprintf(src, sizeof(src), "%s/*/../../other/no-such.parque?", data);
  tc_expect_open(&nobody, d.socket, src, LARDER_EACCES, "not allowed: ");
  /* A link inside whose name is a pattern (which matches nothing, so it
   * names itself) to a directory outside: refused before the daemon lists
   * that directory (it answered "directory has no .parquet files", or
   * listed it). */
  {
    char odd[800], empty[800];
    snprintf(empty, sizeof(empty), "%s/empty", other);
    ASSERT_OK(mkdir(empty, 0755));
    snprintf(odd, sizeof(odd), "%s/[s]", data);
    ASSERT_OK(symlink("../other/empty", odd));
    ASSERT_EQ(tc_open_as(&nobody, d.socket, odd, msg, sizeof(msg)), LARDER_EACCES);
    ASSERT_STR_CONTAINS(msg, "outside the configured sources");
    ASSERT_OK(unlink(odd));
    ASSERT_OK(rmdir(empty));
  }
  /* Inside the roots a missing file is still just missing. */
  snprintf(src, sizeof(src), "%s/no-such.parquet", data);
  tc_expect_open(&nobody, d.socket, src, LARDER_ENOENT, NULL);
  /* prefetch (root) is held to the roots too. */
  tc_out r;
  tc_ctl(&r, NULL, d.socket, "prefetch", other, NULL);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.err, "outside the configured sources");
  tc_out_free(&r);
  snprintf(src, sizeof(src), "%s/links", data);
  tc_expect_open(&nobody, d.socket, src, LARDER_EACCES, "not allowed: ");
  dh_stop(&d);
  /* The key is live (set in the file this time: flags win over the file,
   * on reload as at startup). */
  dh_init(&d, "d2", fl);
  FILE *f = fopen(d.config, "w");
  ASSERT_NOT_NULL(f);
  fprintf(f, "local_roots = %s\n", data);
  fclose(f);
  tc_open_tmpdir(d.dir);
  dh_start(&d);
  tc_expect_open(&nobody, d.socket, other, LARDER_EACCES, "not allowed: ");
  f = fopen(d.config, "w");
  ASSERT_NOT_NULL(f);
  fprintf(f, "local_roots = %s:%s\n", data, other);
  fclose(f);
  kill(d.pid, SIGHUP);
  ASSERT(tc_wait_log(&d, "reloaded", 10000 * dh_slow()));
  tc_expect_open(&nobody, d.socket, other, 0, NULL);
  tc_expect_open(&nobody, d.socket, data, 0, NULL);
  dh_stop(&d);
  return 0;
}

/* ------------------------------------------------------------------------ */

static int send_opens(int fd, const larder_stream_options_t *o, int n) {
  uint8_t *all = NULL;
  size_t total = 0;
  for (int i = 0; i < n; i++) {
    Larder__OpenStream os = LARDER__OPEN_STREAM__INIT;
    os.request_id = (uint32_t)(100 + i);
    os.sources = (char **)o->sources;
    os.n_sources = o->num_sources;
    os.batch_size = o->batch_size;
    os.epochs = 1;
    os.world_size = 1;
    os.arena_bytes = 1u << 20;
    Larder__Frame f = LARDER__FRAME__INIT;
    f.msg_case = LARDER__FRAME__MSG_OPEN_STREAM;
    f.open_stream = &os;
    size_t len;
    uint8_t *buf = wire_encode(&f, &len);
    ASSERT_NOT_NULL(buf);
    all = realloc(all, total + len);
    ASSERT_NOT_NULL(all);
    memcpy(all + total, buf, len);
    total += len;
    free(buf);
  }
  /* One write: the daemon reads them all before any open can finish. */
  int rc = dh_raw_write(fd, all, total);
  free(all);
  return rc;
}

/*
 * Per-client limits: arena bytes over a client's streams, requests in
 * progress, connections per user; each refusal says which limit.
 */
TEST_IMPL(acl_client_limits) {
  if (tc_need_root()) return TEST_SKIP;
  char std[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  dh_daemon d;
  static const char *const fl[] = {"--socket_mode=0666", "--max_arena_bytes_per_client=3100K",
                                   "--max_pending_per_client=2", "--max_clients_per_uid=2", NULL};
  dh_init(&d, "d", fl);
  tc_open_tmpdir(d.dir);
  dh_start(&d);
  const char *src[1] = {std};
  larder_stream_options_t o;
  dh_opts(&o, src, 64, 1, 1);
  o.arena_bytes = 1u << 20;
  /* A ring of one page: the sizes below count on it. */
  o.window = 4;

  /* Arenas: three of 1 MiB, with a descriptor ring of a page each, fit in
   * 3100K; a fourth does not. */
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s[4];
  for (int i = 0; i < 3; i++) ASSERT_OK(larder_stream_open(c, &o, &s[i]));
  ASSERT_EQ(larder_stream_open(c, &o, &s[3]), LARDER_ELIMIT);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "max_arena_bytes_per_client");
  larder_stream_close(s[0]);
  /* Closed streams give their bytes back (the close is processed in order
   * with the next open on the connection). */
  ASSERT_OK(larder_stream_open(c, &o, &s[0]));
  for (int i = 0; i < 3; i++) larder_stream_close(s[i]);
  larder_client_close(c);

  /* Requests in progress: six opens at once, two may be pending. */
  int fd = dh_raw_connect(d.socket);
  Larder__Frame *h = dh_raw_hello(fd, WIRE_PROTOCOL_VERSION);
  ASSERT_NOT_NULL(h);
  wire_free(h);
  ASSERT_OK(send_opens(fd, &o, 6));
  int limited = 0, opened = 0, other = 0;
  for (int got = 0; got < 6;) {
    int rc;
    int fds[8], nfds = 0;
    Larder__Frame *f = dh_raw_recv(fd, 30000 * dh_slow(), fds, &nfds, &rc);
    ASSERT_NOT_NULL(f);
    for (int i = 0; i < nfds; i++) close(fds[i]);
    if (f->msg_case == LARDER__FRAME__MSG_ERROR && f->error->stream_id == 0) {
      if (f->error->code == LARDER_ELIMIT) {
        ASSERT_STR_CONTAINS(f->error->message, "max_pending_per_client");
        limited++;
      } else {
        other++;
      }
      got++;
    } else if (f->msg_case == LARDER__FRAME__MSG_OPEN_STREAM_REPLY) {
      opened++;
      got++;
    }
    wire_free(f);
  }
  ASSERT_EQ(other, 0);
  ASSERT_GE(limited, 3);
  ASSERT_LE(opened, 2);
  ASSERT_GE(opened, 1);
  close(fd);

  /* Connections per user: a third from uid 4242 is refused, other users
   * are not affected. */
  int p[2];
  ASSERT_OK(pipe(p));
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(p[0]);
    if (setgroups(0, NULL) != 0 || setgid(4242) != 0 || setuid(4242) != 0) _exit(2);
    larder_client_t *cs[3];
    int rc0 = larder_client_connect(d.socket, &cs[0]);
    int rc1 = larder_client_connect(d.socket, &cs[1]);
    int rc2 = larder_client_connect(d.socket, &cs[2]);
    char out[600];
    snprintf(out, sizeof(out), "%d %d %d", rc0, rc1, rc2);
    if (write(p[1], out, strlen(out) + 1) < 0) _exit(3);
    _exit(0);
  }
  close(p[1]);
  char buf[600] = "";
  ssize_t n = read(p[0], buf, sizeof(buf) - 1);
  ASSERT_GT(n, 0);
  int r0, r1, r2;
  ASSERT_EQ(sscanf(buf, "%d %d %d", &r0, &r1, &r2), 3);
  ASSERT_EQ(r0, 0);
  ASSERT_EQ(r1, 0);
  ASSERT_EQ(r2, LARDER_ELIMIT);
  tc_expect_open(&nobody, d.socket, std, 0, NULL);
  close(p[0]);
  int st;
  waitpid(pid, &st, 0);
  char *log = dh_read_log(&d);
  free(log);
  ASSERT_EQ(dh_stat(&d, "stream_errors"), 0);
  dh_stop(&d);
  return 0;
}

/*
 * Shared memory per user: the arenas of all of one user's connections
 * together stay under max_arena_bytes_per_uid (the per-client cap alone
 * would let a user hold max_clients_per_uid times it); another user's
 * streams do not count, and a closed stream gives its bytes back.
 */
TEST_IMPL(acl_uid_arena_limit) {
  if (tc_need_root()) return TEST_SKIP;
  char std[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  dh_daemon d;
  /* Arenas of the default 256 MiB (sparse memfds: nothing is touched
   * until batches are written) and a descriptor ring each: two fit in
   * 600M, three do not. */
  static const char *const fl[] = {"--socket_mode=0666", "--max_arena_bytes_per_uid=600M", NULL};
  dh_init(&d, "d", fl);
  tc_open_tmpdir(d.dir);
  dh_start(&d);
  const char *src[1] = {std};
  larder_stream_options_t o;
  dh_opts(&o, src, 64, 1, 1);
  larder_client_t *c1, *c2;
  ASSERT_OK(larder_client_connect(d.socket, &c1));
  ASSERT_OK(larder_client_connect(d.socket, &c2));
  larder_stream_t *s1[2], *s2;
  for (int i = 0; i < 2; i++) ASSERT_OK(larder_stream_open(c1, &o, &s1[i]));
  ASSERT_EQ(larder_stream_open(c2, &o, &s2), LARDER_ELIMIT);
  ASSERT_STR_CONTAINS(larder_client_last_error(c2), "max_arena_bytes_per_uid");
  ASSERT_STR_CONTAINS(larder_client_last_error(c2), "uid 0 already hold");
  /* Another user has a budget of its own. */
  tc_expect_open(&nobody, d.socket, std, 0, NULL);
  /* The refused client carries on, and gets the room a closed stream
   * gives back (a close and an open on two connections reach the daemon in
   * no set order: retry for a while). */
  larder_stream_close(s1[1]);
  int rc = LARDER_ELIMIT;
  for (int tries = 0; tries < 200 && rc == LARDER_ELIMIT; tries++) {
    rc = larder_stream_open(c2, &o, &s2);
    if (rc == LARDER_ELIMIT) {
      struct timespec ts = {0, 10000000L};
      nanosleep(&ts, NULL);
    }
  }
  ASSERT_OK(rc);
  larder_batch_t *b;
  ASSERT_OK(larder_stream_next(s2, 30000 * dh_slow(), &b));
  larder_batch_release(b);
  ASSERT_OK(larder_stream_next(s1[0], 30000 * dh_slow(), &b));
  larder_batch_release(b);
  larder_stream_close(s2);
  larder_stream_close(s1[0]);
  larder_client_close(c1);
  larder_client_close(c2);
  ASSERT_EQ(dh_stat(&d, "stream_errors"), 0);
  dh_stop(&d);
  return 0;
}

/* Waits up to timeout_ms until `larderctl ls --json` as root lists objects
 * under every one of the n directories. */
static void wait_listed(const char *socket, const char *const *dirs, int n, int timeout_ms) {
  struct timespec t0;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  for (;;) {
    tc_out r;
    tc_ctl(&r, NULL, socket, "ls", "--json", NULL);
    EXPECT_RUN(&r, 0);
    int all = 1;
    for (int i = 0; i < n; i++) all = all && strstr(r.out, dirs[i]) != NULL;
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double ms = (double)(t.tv_sec - t0.tv_sec) * 1e3 + (double)(t.tv_nsec - t0.tv_nsec) / 1e6;
    if (all) {
      tc_out_free(&r);
      return;
    }
    if (ms > timeout_ms) {
      tc_out_print("ls --json", &r);
      ASSERT_FAIL_("the cache did not list the objects of all %d datasets in %d ms", n, timeout_ms);
    }
    tc_out_free(&r);
    struct timespec ts = {0, 20000000L};
    nanosleep(&ts, NULL);
  }
}

/* Asserts that o's stdout does not contain needle. */
static void expect_absent(const tc_out *o, const char *needle, const char *what) {
  if (strstr(o->out, needle) == NULL) return;
  tc_out_print(what, o);
  ASSERT_FAIL_("%s shows \"%s\"", what, needle);
}

/*
 * What one user sees of another: `larderctl clients`, `ls` and `stats` show
 * a user who is not an admin their own clients, streams and cached objects
 * only (no other user's pid, uid or source path), with the counters over
 * everyone; root sees everything.  Here nobody holds a stream of one
 * dataset and root one of another.
 */
TEST_IMPL(acl_listings_own_only) {
  if (tc_need_root()) return TEST_SKIP;
  char std[1024], mine[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  static const dh_spec nobody_spec = {2, 600, 0, 300, 0, 0, 0};
  ASSERT_EQ(dh_dataset(&nobody_spec, "acl-listings-nobody", mine, sizeof(mine)), 1200);
  dh_daemon d;
  static const char *const fl[] = {"--socket_mode=0666", NULL};
  dh_init(&d, "d", fl);
  tc_open_tmpdir(d.dir);
  dh_start(&d);

  /* nobody's trainer: a child that holds one batch of its stream until the
   * pipe `go` closes.  Forked before this process uses liblarder. */
  int ready[2], go[2];
  ASSERT_OK(pipe(ready));
  ASSERT_OK(pipe(go));
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    close(ready[0]);
    close(go[1]);
    if (setgroups(0, NULL) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(2);
    larder_client_t *c;
    if (larder_client_connect(d.socket, &c) != 0) _exit(3);
    const char *src[1] = {mine};
    larder_stream_options_t o;
    dh_opts(&o, src, 16, 1, 1);
    o.arena_bytes = 1u << 20;
    larder_stream_t *s;
    larder_batch_t *b;
    if (larder_stream_open(c, &o, &s) != 0 || larder_stream_next(s, 60000, &b) != 0) _exit(4);
    if (write(ready[1], "r", 1) != 1) _exit(5);
    char x;
    while (read(go[0], &x, 1) > 0) {}
    larder_batch_release(b);
    larder_stream_close(s);
    larder_client_close(c);
    _exit(0);
  }
  close(ready[1]);
  close(go[0]);
  char x = 0;
  ASSERT_EQ(read(ready[0], &x, 1), 1);
  close(ready[0]);

  /* root's trainer. */
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  const char *src[1] = {std};
  larder_stream_options_t o;
  dh_opts(&o, src, 16, 1, 1);
  o.arena_bytes = 1u << 20;
  larder_stream_t *s;
  larder_batch_t *b;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
  const char *dirs[2] = {std, mine};
  wait_listed(d.socket, dirs, 2, 30000 * dh_slow());

  char child_pid[64], root_pid[64];
  snprintf(child_pid, sizeof(child_pid), "\"pid\":%d,", (int)pid);
  snprintf(root_pid, sizeof(root_pid), "\"pid\":%d,", (int)getpid());
  tc_out r;

  /* root sees both users. */
  tc_ctl(&r, NULL, d.socket, "clients", "--json", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT(tc_json_valid(r.out));
  ASSERT_STR_CONTAINS(r.out, child_pid);
  ASSERT_STR_CONTAINS(r.out, root_pid);
  ASSERT_STR_CONTAINS(r.out, std);
  ASSERT_STR_CONTAINS(r.out, mine);
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "stats", "--json", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "\"uid\":65534,");
  ASSERT_STR_CONTAINS(r.out, "\"uid\":0,");
  ASSERT_STR_CONTAINS(r.out, std);
  ASSERT_STR_CONTAINS(r.out, mine);
  tc_out_free(&r);

  /* nobody sees its own. */
  tc_ctl(&r, &nobody, d.socket, "clients", "--json", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT(tc_json_valid(r.out));
  ASSERT_STR_CONTAINS(r.out, child_pid);
  ASSERT_STR_CONTAINS(r.out, mine);
  expect_absent(&r, root_pid, "nobody's clients --json");
  expect_absent(&r, "\"uid\":0,", "nobody's clients --json");
  expect_absent(&r, std, "nobody's clients --json");
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "clients", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, " 65534 ");
  expect_absent(&r, std, "nobody's clients");
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "ls", "--json", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT(tc_json_valid(r.out));
  ASSERT_STR_CONTAINS(r.out, mine);
  expect_absent(&r, std, "nobody's ls --json");
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "ls", NULL);
  EXPECT_RUN(&r, 0);
  expect_absent(&r, std, "nobody's ls");
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "stats", "--json", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT(tc_json_valid(r.out));
  ASSERT_STR_CONTAINS(r.out, "\"uid\":65534,");
  ASSERT_STR_CONTAINS(r.out, mine);
  ASSERT_EQ(dh_json_u64(r.out, "streams"), 2); /* the counters are everyone's */
  expect_absent(&r, "\"uid\":0,", "nobody's stats --json");
  expect_absent(&r, std, "nobody's stats --json");
  tc_out_free(&r);
  tc_ctl(&r, &nobody, d.socket, "stats", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "(and 1 stream of other users, listed to admins only)");
  expect_absent(&r, std, "nobody's stats");
  tc_out_free(&r);
  /* Another user without streams sees none, and none of the objects. */
  tc_cred plain = {4242, 4242, {0}, 0};
  tc_ctl(&r, &plain, d.socket, "ls", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "listed to admins only");
  expect_absent(&r, std, "uid 4242's ls");
  expect_absent(&r, mine, "uid 4242's ls");
  tc_out_free(&r);
  tc_ctl(&r, &plain, d.socket, "clients", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "no client of yours is connected");
  tc_out_free(&r);

  larder_batch_release(b);
  larder_stream_close(s);
  larder_client_close(c);
  close(go[1]);
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  dh_stop(&d);
  return 0;
}
