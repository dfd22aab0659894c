/*
 * test-ctl.c: larderctl against a running daemon, in human and --json
 * output: status, stats (and --watch through a pty), clients, ls, evict
 * while a stream reads, prefetch (its progress bar through a pty, plain
 * lines, JSON Lines, resuming), verify, config, SIGHUP and `larderctl
 * reload`, remote inspect and cat through the daemon, the Prometheus
 * endpoint and textfile, --daemonize, and systemd-analyze verify on the
 * installed units.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "test-ctl-common.h"

static void std_opts(larder_stream_options_t *o, uint32_t batch_size, uint64_t epochs) {
  dh_std_opts(o, dh_std_source(), 1, batch_size, 5, epochs, 1u << 20);
}

#define EXPECT_RUN(o, want)         \
  do {                              \
    if ((o)->status != (want)) {    \
      tc_out_print(#o, o);          \
      ASSERT_EQ((o)->status, want); \
    }                               \
  } while (0)

#define EXPECT_JSON(o)                 \
  do {                                 \
    if (!tc_json_valid((o)->out)) {    \
      tc_out_print("not JSON", o);     \
      ASSERT(tc_json_valid((o)->out)); \
    }                                  \
  } while (0)

/* A number from a stats JSON text (key dotted, as dh_json_find). */
static double json_num(const char *json, const char *key) {
  const char *v = dh_json_find(json, key);
  if (v == NULL) ASSERT_FAIL_("no \"%s\" in %s", key, json ? json : "(null)");
  return strtod(v, NULL);
}

/* Waits until the daemon holds a rate sample of its own (stats' window
 * no longer runs from its start), so that a stream opened now opens
 * inside the window of the rates. */
static void wait_rate_sample(const dh_daemon *d) {
  double deadline = test_now_ms() + 30000.0 * dh_slow();
  for (;;) {
    char *json = dh_admin(d, "stats");
    ASSERT_NOT_NULL(json);
    int sampled = json_num(json, "rates.window_s") + 0.1 < json_num(json, "uptime_s");
    free(json);
    if (sampled) return;
    if (test_now_ms() > deadline) ASSERT_FAIL_("%s", "no rate sample in time");
    usleep(50000);
  }
}

/* ------------------------------------------------------------------------ */

/*
 * status, stats, clients, ls, verify and config, human and --json, with a
 * trainer stream open (opened inside the rates' window: its batches/s is
 * the header's, it being the only one); stats --watch refreshes in place on a terminal; and
 * status of a daemon that is not running.
 */
TEST_IMPL(ctl_status_stats) {
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", NULL};
  dh_init(&d, "d", fl);
  dh_start(&d);
  wait_rate_sample(&d);
  larder_stream_options_t o;
  std_opts(&o, 64, 3);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  for (int i = 0; i < 40; i++) {
    larder_batch_t *b;
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    larder_batch_release(b);
  }
  usleep(1200000); /* a rate sample or two */
  tc_out r;
  char pid[32];
  snprintf(pid, sizeof(pid), "\"pid\":%d", (int)getpid());

  /* status */
  tc_ctl(&r, NULL, d.socket, "status", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "larderd 0.1.0 is up");
  ASSERT_STR_CONTAINS(r.out, d.cache);
  ASSERT_STR_CONTAINS(r.out, d.config);
  ASSERT_STR_CONTAINS(r.out, "uptime");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "--json", "status", NULL);
  EXPECT_RUN(&r, 0);
  EXPECT_JSON(&r);
  ASSERT_STR_CONTAINS(r.out, "\"up\":true");
  ASSERT_STR_CONTAINS(r.out, "\"version\":\"0.1.0\"");
  ASSERT_EQ(dh_json_u64(r.out, "cache_capacity_bytes"), 64ull << 30);
  ASSERT(dh_json_has(r.out, "uptime_s"));
  ASSERT(dh_json_has(r.out, "config_path"));
  tc_out_free(&r);

  /* stats: the trainer, its dataset, the stages and a verdict */
  tc_ctl(&r, NULL, d.socket, "stats", NULL);
  EXPECT_RUN(&r, 0);
  char line[64];
  snprintf(line, sizeof(line), " %d ", (int)getpid());
  ASSERT_STR_CONTAINS(r.out, "Cache");
  ASSERT_STR_CONTAINS(r.out, "hit ratio");
  ASSERT_STR_CONTAINS(r.out, "Fetch");
  /* The stream's open files: their footers, within footer_memory. */
  ASSERT_STR_CONTAINS(r.out, "(memory_limit)");
  ASSERT_STR_CONTAINS(r.out, "(footer_memory) · 4 files");
  ASSERT_STR_CONTAINS(r.out, "Clients");
  ASSERT_STR_CONTAINS(r.out, line);
  ASSERT_STR_CONTAINS(r.out, dh_std_dir());
  ASSERT_STR_CONTAINS(r.out, "decode");
  ASSERT_STR_CONTAINS(r.out, "cache read");
  ASSERT_STR_CONTAINS(r.out, "assembly");
  ASSERT_STR_CONTAINS(r.out, "Limit: ");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "stats", "--json", NULL);
  EXPECT_RUN(&r, 0);
  EXPECT_JSON(&r);
  const char *st = dh_json_stream(r.out, (int)getpid(), 0);
  ASSERT_NOT_NULL(st);
  ASSERT_GE(dh_json_u64(st, "batches"), 40);
  ASSERT(dh_json_has(st, "batches_per_s"));
  ASSERT(dh_json_has(st, "bytes_per_s"));
  ASSERT(dh_json_has(st, "stall"));
  ASSERT_EQ(dh_json_u64(st, "world_size"), 1);
  /* The window the test's options leave to liblarder's default. */
  ASSERT_EQ(dh_json_u64(st, "window"), LARDER_DEFAULT_WINDOW);
  ASSERT(dh_json_has(r.out, "verdict.limit"));
  ASSERT(dh_json_has(r.out, "stages.decode_ns"));
  ASSERT(dh_json_has(r.out, "rates.fetch_bytes_per_s"));
  ASSERT(dh_json_has(r.out, "cache.used_bytes"));
  ASSERT_STR_CONTAINS(r.out, "\"datasets\":[{\"dataset\":");
  ASSERT_EQ(dh_json_u64(r.out, "streams"), 1);
  /* The only stream's batches/s is the daemon's: one window, one way
   * (the stream opened inside it, after the window's first sample). */
  double all_bps = json_num(r.out, "rates.batches_per_s"), st_bps = json_num(st, "batches_per_s");
  if (fabs(all_bps - st_bps) > 0.001 * all_bps + 0.01) tc_out_print("batches/s differ", &r);
  ASSERT_DOUBLE_LE(fabs(all_bps - st_bps), 0.001 * all_bps + 0.01);
  ASSERT_DOUBLE_GE(all_bps, 1.0);
  tc_out_free(&r);

  /* clients */
  tc_ctl(&r, NULL, d.socket, "clients", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "liblarder/0.1");
  ASSERT_STR_CONTAINS(r.out, "rank 0/1");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "clients", "--json", NULL);
  EXPECT_RUN(&r, 0);
  EXPECT_JSON(&r);
  ASSERT_STR_CONTAINS(r.out, pid);
  ASSERT_STR_CONTAINS(r.out, "\"streams\":[{\"stream\":1");
  char window[32];
  snprintf(window, sizeof(window), "\"window\":%d,", LARDER_DEFAULT_WINDOW);
  ASSERT_STR_CONTAINS(r.out, window);
  tc_out_free(&r);
  /* A client named with an escape sequence and invalid UTF-8 is listed
   * in printable ASCII, and the JSON stays valid. */
  {
    int raw = dh_raw_connect(d.socket);
    ASSERT(raw >= 0);
    Larder__Hello h = LARDER__HELLO__INIT;
    h.protocol_version = WIRE_PROTOCOL_VERSION;
    h.client_name = (char *)"evil\033[2J\xff\n";
    Larder__Frame hf = LARDER__FRAME__INIT;
    hf.msg_case = LARDER__FRAME__MSG_HELLO;
    hf.hello = &h;
    ASSERT_OK(dh_raw_send(raw, &hf));
    int rrc;
    Larder__Frame *rep = dh_raw_recv(raw, 20000 * dh_slow(), NULL, NULL, &rrc);
    ASSERT_NOT_NULL(rep);
    wire_free(rep);
    tc_ctl(&r, NULL, d.socket, "clients", NULL);
    EXPECT_RUN(&r, 0);
    ASSERT_STR_CONTAINS(r.out, "evil?[2J??");
    ASSERT_NULL(strchr(r.out, '\033'));
    tc_out_free(&r);
    tc_ctl(&r, NULL, d.socket, "clients", "--json", NULL);
    EXPECT_RUN(&r, 0);
    EXPECT_JSON(&r);
    tc_out_free(&r);
    close(raw);
  }

  /* stats --watch on a terminal: redrawn in place (cursor home, erase) */
  char cmd[2048];
  snprintf(cmd, sizeof(cmd), "%s --socket %s stats --watch --interval 0.3 --count 3", tc_ctl_bin(),
           d.socket);
  const char *argv[] = {"/usr/bin/script", "-qfec", cmd, "/dev/null", NULL};
  if (access(argv[0], X_OK) == 0) {
    tc_run(&r, NULL, 60000 * dh_slow(), argv);
    EXPECT_RUN(&r, 0);
    ASSERT_STR_CONTAINS(r.out, "\033[H");
    ASSERT_STR_CONTAINS(r.out, "\033[K");
    ASSERT_STR_CONTAINS(r.out, "stats --watch");
    int frames = 0;
    for (const char *p = r.out; (p = strstr(p, "Limit: ")) != NULL; p++) frames++;
    ASSERT_EQ(frames, 3);
    tc_out_free(&r);
  }
  /* ... and JSON Lines when asked */
  tc_ctl(&r, NULL, d.socket, "stats", "--watch", "--json", "--count", "2", "--interval", "0.2",
         NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_EQ(tc_json_lines(r.out), 2);
  tc_out_free(&r);

  larder_stream_close(s);
  larder_client_close(c);

  /* ls and verify once the cache holds the dataset */
  tc_ctl(&r, NULL, d.socket, "ls", NULL);
  EXPECT_RUN(&r, 0);
  {
    /* Names and identities whole, never cut to a column's width. */
    char whole[1200];
    snprintf(whole, sizeof(whole), "%s/part-000.parquet (size=", dh_std_dir());
    ASSERT_STR_CONTAINS(r.out, whole);
    ASSERT_STR_CONTAINS(r.out, ";ctime=");
    ASSERT_NULL(strstr(r.out, "..."));
  }
  ASSERT_STR_CONTAINS(r.out, "4 objects");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "ls", "--json", NULL);
  EXPECT_RUN(&r, 0);
  EXPECT_JSON(&r);
  ASSERT_EQ(dh_json_u64(r.out, "total.objects"), 4);
  ASSERT_GT(dh_json_u64(r.out, "total.bytes"), 0);
  ASSERT_STR_CONTAINS(r.out, "\"last_use_unix\":");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "ls", "/nonexistent/", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "holds nothing under /nonexistent/");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "verify", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "every checksum matches");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "verify", "--json", NULL);
  EXPECT_RUN(&r, 0);
  EXPECT_JSON(&r);
  ASSERT_GT(dh_json_u64(r.out, "checked"), 0);
  ASSERT_EQ(dh_json_u64(r.out, "bad"), 0);
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "config", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "workers");
  ASSERT_STR_CONTAINS(r.out, "= 2");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "config", "--json", NULL);
  EXPECT_RUN(&r, 0);
  EXPECT_JSON(&r);
  ASSERT_STR_CONTAINS(r.out, "{\"key\":\"workers\",\"value\":\"2\",\"live\":false}");
  tc_out_free(&r);

  dh_stop(&d);
  /* Not running: status says so (exit 1), in both forms. */
  tc_ctl(&r, NULL, d.socket, "status", NULL);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.out, "larderd is not running");
  ASSERT_STR_CONTAINS(r.out, d.socket);
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "status", "--json", NULL);
  EXPECT_RUN(&r, 1);
  EXPECT_JSON(&r);
  ASSERT_STR_CONTAINS(r.out, "\"up\":false");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "stats", NULL);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.err, "cannot connect to larderd");
  tc_out_free(&r);
  return 0;
}

/* Usage errors exit 2; the socket comes from --socket, else $LARDER_SOCKET. */
TEST_IMPL(ctl_usage) {
  tc_out r;
  const char *ctl = tc_ctl_bin();
  const char *a1[] = {ctl, NULL};
  tc_run(&r, NULL, 30000, a1);
  EXPECT_RUN(&r, 2);
  ASSERT_STR_CONTAINS(r.err, "usage: larderctl");
  tc_out_free(&r);
  const char *a2[] = {ctl, "frobnicate", NULL};
  tc_run(&r, NULL, 30000, a2);
  EXPECT_RUN(&r, 2);
  ASSERT_STR_CONTAINS(r.err, "unknown command 'frobnicate'");
  tc_out_free(&r);
  const char *a3[] = {ctl, "evict", NULL};
  tc_run(&r, NULL, 30000, a3);
  EXPECT_RUN(&r, 2);
  ASSERT_STR_CONTAINS(r.err, "--all");
  tc_out_free(&r);
  const char *a4[] = {ctl, "evict", "--all", "--prefix", "s3://b/", NULL};
  tc_run(&r, NULL, 30000, a4);
  EXPECT_RUN(&r, 2);
  tc_out_free(&r);
  const char *a5[] = {ctl, "stats", "--interval", "0", NULL};
  tc_run(&r, NULL, 30000, a5);
  EXPECT_RUN(&r, 2);
  tc_out_free(&r);
  const char *a6[] = {ctl, "prefetch", NULL};
  tc_run(&r, NULL, 30000, a6);
  EXPECT_RUN(&r, 2);
  tc_out_free(&r);
  const char *a7[] = {ctl, "--help", NULL};
  tc_run(&r, NULL, 30000, a7);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "prefetch SOURCE");
  tc_out_free(&r);
  const char *a8[] = {ctl, "evict", "--help", NULL};
  tc_run(&r, NULL, 30000, a8);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "--dry-run");
  tc_out_free(&r);
  /* $LARDER_SOCKET, when --socket is not given. */
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  setenv("LARDER_SOCKET", d.socket, 1);
  const char *a9[] = {ctl, "status", NULL};
  tc_run(&r, NULL, 30000, a9);
  EXPECT_RUN(&r, 0);
  tc_out_free(&r);
  setenv("LARDER_SOCKET", "/nonexistent/larder.sock", 1);
  tc_run(&r, NULL, 30000, a9);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.out, "/nonexistent/larder.sock");
  tc_out_free(&r);
  unsetenv("LARDER_SOCKET");
  /* An unknown admin command from a newer client gets a clear error. */
  char *reply = dh_admin(&d, "frobnicate");
  ASSERT_NOT_NULL(reply);
  ASSERT_STR_CONTAINS(reply, "unknown admin command");
  free(reply);
  dh_stop(&d);
  return 0;
}

/* ------------------------------------------------------------------------ */

/*
 * Evicting what a stream is reading: the stream's batches stay byte for
 * byte what an undisturbed run delivered; what it needs again is decoded
 * again.  --dry-run frees nothing.
 */
TEST_IMPL(ctl_evict_while_streaming) {
  dh_daemon d;
  /* A pool too small to keep units: every later use reads the cache. */
  static const char *const fl[] = {"--memory_limit=64K", NULL};
  dh_init(&d, "d", fl);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 50, 3);
  dh_run ref = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &ref));
  ASSERT_GT(dh_stat(&d, "cache.entries"), 0);

  tc_out r;
  tc_ctl(&r, NULL, d.socket, "evict", "--all", "--dry-run", "--json", NULL);
  EXPECT_RUN(&r, 0);
  EXPECT_JSON(&r);
  uint64_t would = dh_json_u64(r.out, "bytes");
  ASSERT_GT(would, 0);
  ASSERT_EQ(dh_json_u64(r.out, "objects"), 4);
  ASSERT_STR_CONTAINS(r.out, "\"dry_run\":true");
  tc_out_free(&r);
  ASSERT_EQ(dh_stat(&d, "cache.used_bytes"), would);

  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  uint64_t evicted = 0;
  for (size_t k = 0; k < ref.n; k++) {
    larder_batch_t *b;
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    ASSERT_EQ(larder_batch_epoch(b), ref.b[k].epoch);
    ASSERT_EQ(larder_batch_index(b), ref.b[k].index);
    if (dh_batch_hash(b) != ref.b[k].hash) ASSERT_FAIL_("batch %zu differs after an eviction", k);
    larder_batch_release(b);
    if (k == ref.n / 4) {
      uint64_t decoded = dh_stat(&d, "units_decoded");
      tc_ctl(&r, NULL, d.socket, "evict", "--all", NULL);
      EXPECT_RUN(&r, 0);
      ASSERT_STR_CONTAINS(r.out, "freed ");
      ASSERT_STR_CONTAINS(r.out, "the whole cache");
      tc_out_free(&r);
      evicted++;
      /* Read on: the stream must decode again what it needs.  The units
       * of the batches prepared and pinned before the eviction stay in
       * memory, so how soon depends on how far ahead the daemon was. */
      size_t from = k;
      while (dh_stat(&d, "units_decoded") == decoded && k + 1 < ref.n) {
        ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
        k++;
        if (dh_batch_hash(b) != ref.b[k].hash)
          ASSERT_FAIL_("batch %zu differs after an eviction", k);
        larder_batch_release(b);
      }
      fprintf(stderr, "decoding again %zu batches after the eviction\n", k - from);
      ASSERT_GT(dh_stat(&d, "units_decoded"), decoded);
    }
    if (k == ref.n / 2) {
      tc_ctl(&r, NULL, d.socket, "evict", "--dataset", dh_std_dir(), NULL);
      EXPECT_RUN(&r, 0);
      ASSERT_STR_CONTAINS(r.out, dh_std_dir());
      tc_out_free(&r);
      evicted++;
    }
    if (k == 3 * ref.n / 4) {
      /* By object: the first one ls lists. */
      tc_ctl(&r, NULL, d.socket, "ls", "--json", NULL);
      EXPECT_RUN(&r, 0);
      const char *id = strstr(r.out, "\"id\":\"");
      ASSERT_NOT_NULL(id);
      char oid[17];
      memcpy(oid, id + 6, 16);
      oid[16] = '\0';
      tc_out_free(&r);
      tc_ctl(&r, NULL, d.socket, "evict", oid, "--json", NULL);
      EXPECT_RUN(&r, 0);
      ASSERT_EQ(dh_json_u64(r.out, "objects"), 1);
      tc_out_free(&r);
      evicted++;
    }
  }
  larder_batch_t *b;
  ASSERT_EQ(larder_stream_next(s, 60000 * dh_slow(), &b), LARDER_EEOF);
  larder_stream_close(s);
  larder_client_close(c);
  ASSERT_EQ(evicted, 3);
  /* By prefix, everything left; then nothing is left to evict. */
  char prefix[1100];
  ASSERT_NOT_NULL(realpath(dh_std_dir(), prefix));
  tc_ctl(&r, NULL, d.socket, "evict", "--prefix", prefix, NULL);
  EXPECT_RUN(&r, 0);
  tc_out_free(&r);
  ASSERT_EQ(dh_stat(&d, "cache.used_bytes"), 0);
  tc_ctl(&r, NULL, d.socket, "evict", "no-such-object", NULL);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.err, "no cached object is no-such-object");
  tc_out_free(&r);
  ASSERT_EQ(dh_stat(&d, "stream_errors"), 0);
  dh_run_free(&ref);
  dh_stop(&d);
  return 0;
}

/* ------------------------------------------------------------------------ */

static int count_str(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) n++;
  return n;
}

/* The largest number directly before a '%' in the text from p to the next
 * blank line (a section of stats' human output), or -1 for none. */
static double max_percent(const char *p) {
  const char *end = strstr(p, "\n\n");
  double max = -1;
  for (const char *q = p; *q && (end == NULL || q < end); q++) {
    if (*q != '%') continue;
    const char *n = q;
    while (n > p && (isdigit((unsigned char)n[-1]) || n[-1] == '.')) n--;
    if (n < q && strtod(n, NULL) > max) max = strtod(n, NULL);
  }
  return max;
}

/*
 * stats while six rate-limited fetches run at once (a prefetch of remote
 * shards): the stages read as the average number at work per second of
 * the window (fetch time summed over parallel requests passes the window),
 * in --json as <stage>_s_per_s consistent with <stage>_ns and window_s;
 * no percentage passes 100%; and the prefetch is listed as a running job.
 */
TEST_IMPL(ctl_stats_stage_busy) {
  char mid[1024];
  ASSERT_EQ(dh_mid_dataset(mid, sizeof(mid)), DH_MID_ROWS);
  char ndir[700];
  snprintf(ndir, sizeof(ndir), "%s/nginx", test_tmpdir());
  int port = tc_nginx_start(ndir, mid, "--limit-rate 8k");
  if (port == 0) {
    fprintf(stderr, "nginx is not available\n");
    return TEST_SKIP;
  }
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", "--footer_guess=8K", NULL};
  dh_init(&d, "d", fl);
  dh_start(&d);
  char urls[6][200];
  const char *args[16];
  int na = 0;
  args[na++] = tc_ctl_bin();
  args[na++] = "--socket";
  args[na++] = d.socket;
  args[na++] = "prefetch";
  for (int i = 0; i < 6; i++) {
    snprintf(urls[i], sizeof(urls[i]), "http://127.0.0.1:%d/part-%03d.parquet", port, i);
    args[na++] = urls[i];
  }
  args[na] = NULL;
  char outpath[700];
  snprintf(outpath, sizeof(outpath), "%s/prefetch.out", test_tmpdir());
  fflush(NULL);
  pid_t pid = fork();
  ASSERT(pid >= 0);
  if (pid == 0) {
    int fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    execv(args[0], (char *const *)args);
    _exit(127);
  }
  /* --json: until a window holds more fetch time than it lasted. */
  int parallel = 0, job_seen = 0;
  double deadline = test_now_ms() + 90000.0 * dh_slow();
  while (!parallel) {
    if (test_now_ms() > deadline) ASSERT_FAIL_("%s", "no window with parallel fetches in time");
    char *json = dh_admin(&d, "stats");
    ASSERT_NOT_NULL(json);
    double win = json_num(json, "stages.window_s"), busy = json_num(json, "stages.fetch_s_per_s");
    double want = json_num(json, "stages.fetch_ns") / 1e9 / win;
    ASSERT_DOUBLE_LE(fabs(busy - want), 1e-4 * want + 1e-6);
    ASSERT_EQ(dh_json_u64(json, "stages.workers"), 2);
    static const char *const shares[] = {"stages.worker_share.decode",
                                         "stages.worker_share.cache_read",
                                         "stages.worker_share.assemble"};
    for (int i = 0; i < 3; i++) {
      ASSERT_DOUBLE_GE(json_num(json, shares[i]), 0);
      ASSERT_DOUBLE_LE(json_num(json, shares[i]), 1);
    }
    job_seen |= dh_json_u64(json, "admin_jobs.prefetches") == 1;
    ASSERT_EQ(dh_json_u64(json, "trainers"), 0);
    parallel = busy > 1.5;
    free(json);
    if (!parallel) usleep(50000);
  }
  ASSERT(job_seen);
  /* The same for people, while the fetches go on: no stage line shows
   * seconds (of summed time), nor a percentage over 100. */
  parallel = 0;
  tc_out r;
  while (!parallel) {
    if (test_now_ms() > deadline) ASSERT_FAIL_("%s", "no stats with parallel fetches in time");
    tc_ctl(&r, NULL, d.socket, "stats", NULL);
    EXPECT_RUN(&r, 0);
    const char *st = strstr(r.out, "\nStages · ");
    ASSERT_NOT_NULL(st);
    const char *f = strstr(st, "\n  fetch ");
    ASSERT_NOT_NULL(f);
    char *e;
    double busy = strtod(f + 9, &e);
    ASSERT(e > f + 9);
    ASSERT(strncmp(e, " s/s  requests in flight", 24) == 0);
    if (max_percent(st + 1) > 100) tc_out_print("a stage over 100%", &r);
    ASSERT_DOUBLE_LE(max_percent(st + 1), 100);
    ASSERT_STR_CONTAINS(st, "% of 2 workers");
    parallel = busy > 1.5;
    if (parallel) {
      ASSERT_STR_CONTAINS(r.out, "\nJobs · 1 larderctl job running (1 prefetch)\n");
      fprintf(stderr, "---- stats during the prefetch ----\n%s----\n", r.out);
    }
    tc_out_free(&r);
    if (!parallel) usleep(50000);
  }
  kill(pid, SIGINT);
  int status;
  waitpid(pid, &status, 0);
  dh_stop(&d);
  tc_nginx_stop(ndir);
  return 0;
}

/*
 * prefetch of remote shards (nginx, rate-limited so it takes a few
 * seconds): interrupted, then resumed through a pty with its progress bar
 * captured; plain lines when stdout is a pipe; JSON Lines with --json.
 */
TEST_IMPL(ctl_prefetch_progress) {
  char mid[1024];
  ASSERT_EQ(dh_mid_dataset(mid, sizeof(mid)), DH_MID_ROWS);
  char ndir[700];
  snprintf(ndir, sizeof(ndir), "%s/nginx", test_tmpdir());
  /* 8 KB/s a connection (after an 8 KB burst): each row group's range of
   * about 20 KB takes over a second, whatever the machine. */
  int port = tc_nginx_start(ndir, mid, "--limit-rate 8k");
  if (port == 0) {
    fprintf(stderr, "nginx is not available\n");
    return TEST_SKIP;
  }
  dh_daemon d;
  /* A pool too small to keep units: after an evict, prefetch fetches
   * again, and trainers read what it cached. */
  static const char *const fl[] = {"--workers=8", "--footer_guess=8K", "--memory_limit=64K", NULL};
  dh_init(&d, "d", fl);
  dh_start(&d);
  char urls[6][200];
  tc_out r0;
  const char *args[16];
  int na = 0;
  args[na++] = tc_ctl_bin();
  args[na++] = "--socket";
  args[na++] = d.socket;
  args[na++] = "prefetch";
  for (int i = 0; i < 6; i++) {
    snprintf(urls[i], sizeof(urls[i]), "http://127.0.0.1:%d/part-%03d.parquet", port, i);
    args[na++] = urls[i];
  }
  args[na] = NULL;

  /* 1. Interrupted once something is cached.  The six requests run at
   * once at one rate and end within moments of each other, so the
   * interrupt may come too late on a loaded machine: the prefetch then
   * ended by itself (exit 0), and the round starts again from an empty
   * cache. */
  char outpath[700];
  snprintf(outpath, sizeof(outpath), "%s/prefetch1.out", test_tmpdir());
  for (int attempt = 1;; attempt++) {
    uint64_t puts0 = dh_stat(&d, "cache.puts");
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
      int fd = open(outpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      execv(args[0], (char *const *)args);
      _exit(127);
    }
    double deadline = test_now_ms() + 60000.0 * dh_slow();
    while (dh_stat(&d, "cache.puts") < puts0 + 2) {
      if (test_now_ms() > deadline) ASSERT_FAIL_("%s", "nothing was cached in time");
      usleep(5000);
    }
    kill(pid, SIGINT);
    int status;
    waitpid(pid, &status, 0);
    if (WIFSIGNALED(status) || WEXITSTATUS(status) != 0) break;
    fprintf(stderr, "prefetch ended before its interrupt (round %d): again\n", attempt);
    ASSERT_LT(attempt, 5);
    tc_ctl(&r0, NULL, d.socket, "evict", "--all", NULL);
    EXPECT_RUN(&r0, 0);
    tc_out_free(&r0);
  }
  /* The daemon lets the job go with the connection: no fetch stays in
   * flight for it. */
  double settle = test_now_ms() + 60000.0 * dh_slow();
  while (dh_stat(&d, "fetch_inflight") != 0 && test_now_ms() < settle) usleep(10000);
  ASSERT_EQ(dh_stat(&d, "fetch_inflight"), 0);
  /* Step 2 resumes from a known part: the first three files cached, the
   * other three not (whatever the interrupted round left). */
  tc_ctl(&r0, NULL, d.socket, "evict", "--all", NULL);
  EXPECT_RUN(&r0, 0);
  tc_out_free(&r0);
  tc_ctl(&r0, NULL, d.socket, "prefetch", urls[0], urls[1], urls[2], NULL);
  EXPECT_RUN(&r0, 0);
  tc_out_free(&r0);
  uint64_t units_total = DH_MID_UNITS / 5; /* unit_rows 4096: one unit per row group */

  /* 2. Resumed on a terminal: a bar redrawn in place, then the summary. */
  char cmd[4096];
  size_t off = 0;
  for (int i = 0; i < na; i++)
    off += (size_t)snprintf(cmd + off, sizeof(cmd) - off, "%s ", args[i]);
  const char *sargv[] = {"/usr/bin/script", "-qfec", cmd, "/dev/null", NULL};
  tc_out r;
  if (access(sargv[0], X_OK) != 0) {
    fprintf(stderr, "no script(1); the pty part is skipped\n");
  } else {
    tc_run(&r, NULL, 120000 * dh_slow(), sargv);
    EXPECT_RUN(&r, 0);
    ASSERT_STR_CONTAINS(r.out, "already cached: ");
    ASSERT_STR_CONTAINS(r.out, "fetching the rest");
    ASSERT_GE(count_str(r.out, "\r["), 2); /* redrawn at least twice */
    ASSERT_GE(count_str(r.out, "\033[K"), 2);
    ASSERT_STR_CONTAINS(r.out, "MB/s");
    ASSERT_STR_CONTAINS(r.out, "ETA ");
    ASSERT_STR_CONTAINS(r.out, "100%");
    /* Decoded bytes, and those fetched for them. */
    ASSERT_STR_CONTAINS(r.out, " decoded, ");
    ASSERT_STR_CONTAINS(r.out, " fetched (");
    ASSERT_STR_CONTAINS(r.out, "done in ");
    char want[64];
    snprintf(want, sizeof(want), "(%llu/%llu units)", (unsigned long long)units_total,
             (unsigned long long)units_total);
    ASSERT_STR_CONTAINS(r.out, want);
    /* The captured session, for whoever reads the test log. */
    fprintf(stderr, "---- prefetch on a pty (escapes shown as \\r, \\e) ----\n");
    for (const char *p = r.out; *p; p++) {
      if (*p == '\r') fputs("\\r", stderr);
      else if (*p == '\033') fputs("\\e", stderr);
      else fputc(*p, stderr);
    }
    fprintf(stderr, "----\n");
    const char *already = strstr(r.out, "already cached: ");
    uint64_t before = strtoull(already + 16, NULL, 10);
    ASSERT_GE(before, 1);
    ASSERT_LT(before, units_total);
    tc_out_free(&r);
  }

  /* 3. Plain lines when stdout is not a terminal (the local copy of the
   * same shards: quicker). */
  tc_ctl(&r, NULL, d.socket, "prefetch", mid, NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_NULL(strchr(r.out, '\r'));
  ASSERT_NULL(strchr(r.out, '\033'));
  ASSERT_STR_CONTAINS(r.out, "prefetch: ");
  ASSERT_STR_CONTAINS(r.out, "100%");
  ASSERT_STR_CONTAINS(r.out, "done in ");
  ASSERT_NULL(strstr(r.out, " fetched (")); /* local files: nothing fetched */
  tc_out_free(&r);

  /* 4. JSON Lines: start, progress..., done; then everything is cached. */
  tc_ctl(&r, NULL, d.socket, "evict", "--all", NULL);
  EXPECT_RUN(&r, 0);
  tc_out_free(&r);
  args[na++] = "--json";
  args[na] = NULL;
  uint64_t fetched0 = dh_stat(&d, "fetch_bytes");
  tc_run(&r, NULL, 120000 * dh_slow(), args);
  EXPECT_RUN(&r, 0);
  uint64_t fetched1 = dh_stat(&d, "fetch_bytes");
  ASSERT_GE(tc_json_lines(r.out), 3);
  ASSERT_STR_CONTAINS(r.out, "{\"event\":\"start\"");
  ASSERT_STR_CONTAINS(r.out, "{\"event\":\"progress\"");
  const char *done = strstr(r.out, "{\"event\":\"done\"");
  ASSERT_NOT_NULL(done);
  ASSERT_EQ(dh_json_u64(done, "cached_units"), units_total);
  /* Whether the cache admits units at all, for the note on units not
   * kept: here it does. */
  ASSERT_STR_CONTAINS(done, "\"admission\":\"on\"");
  ASSERT_EQ(dh_json_u64(done, "failed_units"), 0);
  /* Every row group's chunks were fetched for the job, and nothing the
   * daemon did not fetch in the meantime (footers too) is counted. */
  fprintf(stderr, "prefetch after an evict: %llu bytes fetched for it, the daemon %llu\n",
          (unsigned long long)dh_json_u64(done, "fetched_bytes"),
          (unsigned long long)(fetched1 - fetched0));
  ASSERT_GT(dh_json_u64(done, "fetched_bytes"), 0);
  ASSERT_LE(dh_json_u64(done, "fetched_bytes"), fetched1 - fetched0);
  tc_out_free(&r);
  /* Run again: nothing to do. */
  tc_run(&r, NULL, 120000 * dh_slow(), args);
  EXPECT_RUN(&r, 0);
  done = strstr(r.out, "{\"event\":\"done\"");
  ASSERT_NOT_NULL(done);
  ASSERT_EQ(dh_json_u64(done, "cached_before_units"), units_total);
  ASSERT_EQ(dh_json_u64(done, "fetched_bytes"), 0);
  tc_out_free(&r);
  /* A trainer over the same URLs now reads everything from the cache. */
  const char *src[6];
  for (int i = 0; i < 6; i++) src[i] = urls[i];
  larder_stream_options_t o;
  dh_opts(&o, src, 500, 1, 1);
  o.num_sources = 6;
  uint64_t fetched = dh_stat(&d, "fetch_bytes");
  uint64_t decoded = dh_stat(&d, "units_decoded");
  dh_run run = {0};
  run.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &run));
  dh_run_free(&run);
  ASSERT_EQ(dh_stat(&d, "units_decoded"), decoded);
  ASSERT_EQ(dh_stat(&d, "fetch_bytes") - fetched < 2000000, 1); /* footers, at most */
  /* A missing object fails the prefetch clearly. */
  char bad[200];
  snprintf(bad, sizeof(bad), "http://127.0.0.1:%d/missing.parquet", port);
  tc_ctl(&r, NULL, d.socket, "prefetch", bad, NULL);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.err, "missing.parquet");
  tc_out_free(&r);
  dh_stop(&d);
  tc_nginx_stop(ndir);
  return 0;
}

/* ------------------------------------------------------------------------ */

static void write_config(const dh_daemon *d, const char *text) {
  FILE *f = fopen(d->config, "w");
  ASSERT_NOT_NULL(f);
  fputs(text, f);
  fclose(f);
}

/*
 * SIGHUP (and larderctl reload) changes what can change live: the cache
 * capacity, the allowlist; keys that need a restart are named; a broken
 * file keeps the current configuration.
 */
TEST_IMPL(ctl_reload_sighup) {
  dh_daemon d;
  static const char *const fl[] = {"--fetch_retries=0", NULL};
  dh_init(&d, "d", fl);
  write_config(&d, "[larderd]\ncache_capacity = 1G\n");
  dh_start(&d);
  tc_out r;
  tc_ctl(&r, NULL, d.socket, "status", "--json", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_EQ(dh_json_u64(r.out, "cache_capacity_bytes"), 1ull << 30);
  ASSERT_EQ(dh_json_u64(r.out, "allowlist_rules"), 0);
  tc_out_free(&r);
  /* No allowlist: an unreachable URL fails as a remote error. */
  char msg[1200];
  int rc = tc_open_as(NULL, d.socket, "http://127.0.0.1:9/data/x.parquet", msg, sizeof(msg));
  ASSERT_NE(rc, 0);
  ASSERT_NE(rc, LARDER_EACCES);

  write_config(&d,
               "[larderd]\ncache_capacity = 2G\nsocket_mode = 0600\n"
               "[access]\nallow = http://127.0.0.1:9/allowed/\nallow = s3://bucket/p/ uid=4242\n");
  kill(d.pid, SIGHUP);
  ASSERT(tc_wait_log(&d, "these keys changed but need a restart: socket_mode", 10000 * dh_slow()));
  tc_ctl(&r, NULL, d.socket, "status", "--json", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_EQ(dh_json_u64(r.out, "cache_capacity_bytes"), 2ull << 30);
  ASSERT_EQ(dh_json_u64(r.out, "allowlist_rules"), 2);
  tc_out_free(&r);
  ASSERT_EQ(dh_stat(&d, "cache.capacity_bytes"), 2ull << 30);
  rc = tc_open_as(NULL, d.socket, "http://127.0.0.1:9/data/x.parquet", msg, sizeof(msg));
  ASSERT_EQ(rc, LARDER_EACCES);
  ASSERT_STR_CONTAINS(
      msg, "not allowed: http://127.0.0.1:9/data/x.parquet is outside the configured sources");

  /* larderctl reload: says what changed. */
  write_config(&d, "[larderd]\ncache_capacity = 3G\n");
  tc_ctl(&r, NULL, d.socket, "reload", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "cache_capacity");
  ASSERT_STR_CONTAINS(r.out, "allow");
  ASSERT_STR_CONTAINS(r.out, "reloaded ");
  tc_out_free(&r);
  rc = tc_open_as(NULL, d.socket, "http://127.0.0.1:9/data/x.parquet", msg, sizeof(msg));
  ASSERT_NE(rc, LARDER_EACCES);
  ASSERT_EQ(dh_stat(&d, "cache.capacity_bytes"), 3ull << 30);

  /* A broken file: refused, the current configuration stays. */
  write_config(&d, "[larderd]\ncache_capacity = 4G\nallow = ftp://nowhere/\n");
  kill(d.pid, SIGHUP);
  ASSERT(tc_wait_log(&d, "keeping the current configuration", 10000 * dh_slow()));
  tc_ctl(&r, NULL, d.socket, "reload", "--json", NULL);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.err, "ftp://nowhere/");
  tc_out_free(&r);
  ASSERT_EQ(dh_stat(&d, "cache.capacity_bytes"), 3ull << 30);
  /* A log level change is live too. */
  write_config(&d, "[larderd]\ncache_capacity = 3G\nlog_level = debug\n");
  tc_ctl(&r, NULL, d.socket, "reload", "--json", NULL);
  EXPECT_RUN(&r, 0);
  EXPECT_JSON(&r);
  ASSERT_STR_CONTAINS(r.out, "log_level");
  tc_out_free(&r);
  dh_stop(&d);
  return 0;
}

/* ------------------------------------------------------------------------ */

/* GET path from 127.0.0.1:port; returns the whole response (caller frees). */
static char *http_get(int port, const char *method, const char *path) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT(s >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_OK(connect(s, (struct sockaddr *)&a, sizeof(a)));
  char req[512];
  int n = snprintf(req, sizeof(req), "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n",
                   method, path);
  ASSERT_EQ(write(s, req, (size_t)n), n);
  char *buf = NULL;
  size_t len = 0;
  for (;;) {
    char tmp[65536];
    ssize_t r = read(s, tmp, sizeof(tmp));
    if (r <= 0) break;
    char *p = realloc(buf, len + (size_t)r + 1);
    ASSERT_NOT_NULL(p);
    buf = p;
    memcpy(buf + len, tmp, (size_t)r);
    len += (size_t)r;
    buf[len] = '\0';
  }
  close(s);
  ASSERT_NOT_NULL(buf);
  return buf;
}

/* Every family name must be documented in daemon/serve/metrics.h's comment. */
static void expect_documented(char (*names)[128], int n) {
  size_t len;
  uint8_t *h = test_read_file("daemon/serve/metrics.h", &len);
  if (h == NULL) {
    fprintf(stderr, "daemon/serve/metrics.h not found from %s: documentation not checked\n",
            getcwd(NULL, 0));
    return;
  }
  char *doc = realloc(h, len + 1);
  ASSERT_NOT_NULL(doc);
  doc[len] = '\0';
  for (int i = 0; i < n; i++) {
    char pat[160];
    snprintf(pat, sizeof(pat), " %.127s", names[i]);
    const char *p = doc;
    int found = 0;
    while ((p = strstr(p, pat)) != NULL) {
      char after = p[strlen(pat)];
      if (after == ' ' || after == '{' || after == '\n') {
        found = 1;
        break;
      }
      p++;
    }
    if (!found) ASSERT_FAIL_("metric %s is not documented in daemon/serve/metrics.h", names[i]);
  }
  free(doc);
}

/*
 * Prometheus metrics: the HTTP endpoint and the node_exporter textfile
 * parse as text format 0.0.4, carry the stats.h counters, the cache
 * gauges and series labelled by job and dataset (no pid, no stream id),
 * and every name is documented.
 */
TEST_IMPL(ctl_metrics_scrape) {
  dh_daemon d;
  char textfile[700];
  dh_init(&d, "d", NULL);
  snprintf(textfile, sizeof(textfile), "--metrics_textfile=%s/larder.prom", d.dir);
  dh_flag(&d, "--metrics_listen=127.0.0.1:0");
  dh_flag(&d, textfile);
  dh_flag(&d, "--metrics_interval=1");
  dh_start(&d);
  tc_out r;
  tc_ctl(&r, NULL, d.socket, "status", "--json", NULL);
  EXPECT_RUN(&r, 0);
  const char *ep = strstr(r.out, "\"metrics_endpoint\":\"http://127.0.0.1:");
  ASSERT_NOT_NULL(ep);
  int port = atoi(ep + strlen("\"metrics_endpoint\":\"http://127.0.0.1:"));
  ASSERT_GT(port, 0);
  tc_out_free(&r);

  larder_stream_options_t o;
  std_opts(&o, 64, 2);
  o.job = "scrape";
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  for (int i = 0; i < 10; i++) {
    larder_batch_t *b;
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    larder_batch_release(b);
  }
  char *resp = http_get(port, "GET", "/metrics");
  ASSERT_STR_CONTAINS(resp, "HTTP/1.1 200 OK\r\n");
  ASSERT_STR_CONTAINS(resp, "Content-Type: text/plain; version=0.0.4");
  const char *body = strstr(resp, "\r\n\r\n");
  ASSERT_NOT_NULL(body);
  body += 4;
  char err[512];
  static char names[256][128];
  int nn = 0;
  int samples = tc_prom_check(body, err, sizeof(err), names, 256, &nn);
  if (samples < 0) ASSERT_FAIL_("the scrape does not parse: %s", err);
  ASSERT_GT(samples, 40);
  ASSERT_STR_CONTAINS(body, "larder_up 1\n");
  ASSERT_STR_CONTAINS(body, "# TYPE larder_batches_total counter\n");
  ASSERT_STR_CONTAINS(body, "# TYPE larder_clients gauge\n");
  ASSERT_STR_CONTAINS(body, "larder_cache_capacity_bytes ");
  ASSERT_STR_CONTAINS(body, "larder_cache_used_bytes ");
  ASSERT_STR_CONTAINS(body, "larder_cache_entries ");
  /* Per (job, dataset): the job the trainer named, and the dataset's last
   * path component; never a pid or a stream id. */
  char series[2400];
  snprintf(series, sizeof(series), "larder_stream_batches_total{job=\"scrape\",dataset=\"%s\"} ",
           strrchr(dh_std_dir(), '/') ? strrchr(dh_std_dir(), '/') + 1 : dh_std_dir());
  ASSERT_STR_CONTAINS(body, series);
  ASSERT_NULL(strstr(body, "pid=\""));
  ASSERT_NULL(strstr(body, "stream=\""));
  ASSERT_STR_CONTAINS(body, "# TYPE larder_batch_wait_seconds histogram\n");
  ASSERT_STR_CONTAINS(body, "larder_stage_seconds_total{stage=\"decode\"} ");
  expect_documented(names, nn);
  free(resp);
  /* HEAD, other paths. */
  resp = http_get(port, "HEAD", "/metrics");
  ASSERT_STR_CONTAINS(resp, "200 OK");
  ASSERT_NULL(strstr(resp, "larder_up"));
  free(resp);
  resp = http_get(port, "GET", "/other");
  ASSERT_STR_CONTAINS(resp, "404 Not Found");
  free(resp);
  resp = http_get(port, "POST", "/metrics");
  ASSERT_STR_CONTAINS(resp, "405");
  free(resp);
  larder_stream_close(s);
  larder_client_close(c);

  /* The textfile: the same format, rewritten every metrics_interval. */
  char path[700];
  snprintf(path, sizeof(path), "%s/larder.prom", d.dir);
  usleep(1500000);
  size_t len;
  uint8_t *t = test_read_file(path, &len);
  ASSERT_NOT_NULL(t);
  char *text = realloc(t, len + 1);
  text[len] = '\0';
  samples = tc_prom_check(text, err, sizeof(err), names, 256, &nn);
  if (samples < 0) ASSERT_FAIL_("the textfile does not parse: %s", err);
  ASSERT_STR_CONTAINS(text, "larder_up 1\n");
  free(text);
  dh_stop(&d);
  /* A clean exit leaves a last copy that says the daemon is down. */
  t = test_read_file(path, &len);
  ASSERT_NOT_NULL(t);
  text = realloc(t, len + 1);
  text[len] = '\0';
  ASSERT_STR_CONTAINS(text, "larder_up 0\n");
  free(text);
  return 0;
}

/* ------------------------------------------------------------------------ */

/* Remote inspect and cat go through the daemon (nginx here) and print what
 * the local commands print for the same file. */
TEST_IMPL(ctl_remote_inspect_cat) {
  char mid[1024];
  ASSERT_EQ(dh_mid_dataset(mid, sizeof(mid)), DH_MID_ROWS);
  char ndir[700];
  snprintf(ndir, sizeof(ndir), "%s/nginx", test_tmpdir());
  int port = tc_nginx_start(ndir, mid, "");
  if (port == 0) {
    fprintf(stderr, "nginx is not available\n");
    return TEST_SKIP;
  }
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  char url[200], local[1200];
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/part-002.parquet", port);
  snprintf(local, sizeof(local), "%s/part-002.parquet", mid);
  tc_out a, b;
  /* cat, whole (several frames of rows), then with every option. */
  tc_ctl(&a, NULL, d.socket, "cat", url, NULL);
  EXPECT_RUN(&a, 0);
  tc_ctl(&b, NULL, d.socket, "cat", local, NULL);
  EXPECT_RUN(&b, 0);
  ASSERT_EQ(strlen(a.out), strlen(b.out));
  ASSERT_STR_EQ(a.out, b.out);
  ASSERT_GT(strlen(a.out), 500000); /* several frames: one a row group at least */
  tc_out_free(&a);
  tc_out_free(&b);
  tc_ctl(&a, NULL, d.socket, "cat", url, "--columns", "id,tags,name", "--offset", "2400", "--limit",
         "2700", NULL);
  EXPECT_RUN(&a, 0);
  tc_ctl(&b, NULL, d.socket, "cat", local, "--columns", "id,tags,name", "--offset", "2400",
         "--limit", "2700", NULL);
  EXPECT_RUN(&b, 0);
  ASSERT_STR_EQ(a.out, b.out);
  int lines = 0;
  for (const char *p = a.out; *p; p++) lines += *p == '\n';
  ASSERT_EQ(lines, 2700);
  ASSERT_EQ(tc_json_lines(a.out), 2700);
  tc_out_free(&a);
  tc_out_free(&b);
  tc_ctl(&a, NULL, d.socket, "cat", url, "--offset", "999999", NULL);
  EXPECT_RUN(&a, 0);
  ASSERT_STR_EQ(a.out, "");
  tc_out_free(&a);
  tc_ctl(&a, NULL, d.socket, "cat", url, "--columns", "nosuch", NULL);
  EXPECT_RUN(&a, 1);
  ASSERT_STR_CONTAINS(a.err, "nosuch");
  tc_out_free(&a);
  /* inspect: the same description, but for the file's name. */
  tc_ctl(&a, NULL, d.socket, "inspect", url, "--json", NULL);
  EXPECT_RUN(&a, 0);
  EXPECT_JSON(&a);
  tc_ctl(&b, NULL, d.socket, "inspect", local, "--json", NULL);
  EXPECT_RUN(&b, 0);
  const char *ra = strstr(a.out, ",\"size\":"), *rb = strstr(b.out, ",\"size\":");
  ASSERT_NOT_NULL(ra);
  ASSERT_NOT_NULL(rb);
  ASSERT_STR_EQ(ra, rb);
  ASSERT_STR_CONTAINS(a.out, url);
  tc_out_free(&a);
  tc_out_free(&b);
  tc_ctl(&a, NULL, d.socket, "inspect", url, NULL);
  EXPECT_RUN(&a, 0);
  ASSERT_STR_CONTAINS(a.out, "row group 3: 2500 rows");
  ASSERT_STR_CONTAINS(a.out, "ZSTD");
  tc_out_free(&a);
  /* Errors name the URL and the cause. */
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/missing.parquet", port);
  tc_ctl(&a, NULL, d.socket, "cat", url, NULL);
  EXPECT_RUN(&a, 1);
  ASSERT_STR_CONTAINS(a.err, "missing.parquet");
  ASSERT_STR_CONTAINS(a.err, "404");
  tc_out_free(&a);
  dh_stop(&d);
  /* Without a daemon, a URL cannot be read. */
  snprintf(url, sizeof(url), "http://127.0.0.1:%d/part-002.parquet", port);
  tc_ctl(&a, NULL, d.socket, "inspect", url, NULL);
  EXPECT_RUN(&a, 1);
  ASSERT_STR_CONTAINS(a.err, "cannot connect to larderd");
  tc_out_free(&a);
  tc_nginx_stop(ndir);
  return 0;
}

/* ------------------------------------------------------------------------ */

static int proc_field(pid_t pid, int field, long *out) {
  char path[64], buf[1024];
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (f == NULL) return -1;
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  char *p = strrchr(buf, ')');
  if (p == NULL) return -1;
  /* Fields after the name: 3 state, 4 ppid, 5 pgrp, 6 session. */
  p += 2;
  for (int i = 3; i < field; i++) {
    p = strchr(p, ' ');
    if (p == NULL) return -1;
    p++;
  }
  if (field == 3) *out = *p;
  else *out = strtol(p, NULL, 10);
  return 0;
}

static int gone(pid_t pid) {
  long state;
  return proc_field(pid, 3, &state) != 0 || state == 'Z' || state == 'X';
}

/* larderd --daemonize: returns once the socket listens, writes the pid
 * file, logs to the log file, is no session leader, and cleans up on
 * SIGTERM; a second instance fails with a clear message. */
TEST_IMPL(ctl_daemonize) {
  char dir[700], sock[800], cache[800], pidf[800], logf[800], conf[800];
  snprintf(dir, sizeof(dir), "%s/dz", test_tmpdir());
  ASSERT_OK(mkdir(dir, 0755));
  snprintf(sock, sizeof(sock), "--socket=%s/sock", dir);
  snprintf(cache, sizeof(cache), "--cache_dir=%s/cache", dir);
  snprintf(pidf, sizeof(pidf), "%s/larderd.pid", dir);
  snprintf(logf, sizeof(logf), "%s/larderd.log", dir);
  snprintf(conf, sizeof(conf), "%s/larderd.conf", dir);
  FILE *f = fopen(conf, "w");
  ASSERT_NOT_NULL(f);
  fputs("[larderd]\ndaemonize = true\n", f);
  fclose(f);
  char a_conf[900], a_pid[900], a_log[900];
  snprintf(a_conf, sizeof(a_conf), "--config=%s", conf);
  snprintf(a_pid, sizeof(a_pid), "--pid_file=%s", pidf);
  snprintf(a_log, sizeof(a_log), "--log_file=%s", logf);
  const char *bin = getenv("LARDERD_BIN");
  char path[PATH_MAX];
  if (bin == NULL || !*bin) {
    snprintf(path, sizeof(path), "%s", tc_ctl_bin());
    char *slash = strrchr(path, '/');
    ASSERT_NOT_NULL(slash);
    snprintf(slash + 1, sizeof(path) - (size_t)(slash + 1 - path), "larderd");
    bin = path;
  }
  const char *argv[] = {bin, a_conf, sock, cache, a_pid, a_log, NULL};
  tc_out r;
  double t0 = test_now_ms();
  tc_run(&r, NULL, 60000 * dh_slow(), argv);
  EXPECT_RUN(&r, 0);
  tc_out_free(&r);
  fprintf(stderr, "larderd --daemonize returned after %.0f ms\n", test_now_ms() - t0);
  /* Listening already. */
  tc_ctl(&r, NULL, sock + 9, "status", "--json", NULL);
  EXPECT_RUN(&r, 0);
  int pid = (int)dh_json_u64(r.out, "pid");
  tc_out_free(&r);
  size_t len;
  uint8_t *pf = test_read_file(pidf, &len);
  ASSERT_NOT_NULL(pf);
  ASSERT_EQ(atoi((char *)pf), pid);
  free(pf);
  long sid, ppid;
  ASSERT_OK(proc_field(pid, 6, &sid));
  ASSERT_OK(proc_field(pid, 4, &ppid));
  ASSERT_NE(sid, pid);             /* not a session leader */
  ASSERT_NE(sid, (long)getsid(0)); /* but in a session of its own */
  ASSERT_NE(ppid, (long)getpid());
  char cwd[64], link[PATH_MAX];
  snprintf(cwd, sizeof(cwd), "/proc/%d/cwd", pid);
  ssize_t n = readlink(cwd, link, sizeof(link) - 1);
  ASSERT_GT(n, 0);
  link[n] = '\0';
  ASSERT_STR_EQ(link, "/");
  /* A second daemon on the same socket fails, and says where to look. */
  char cache2[900];
  snprintf(cache2, sizeof(cache2), "--cache_dir=%s/cache2", dir);
  const char *argv2[] = {bin, a_conf, sock, cache2, a_pid, a_log, NULL};
  tc_run(&r, NULL, 60000 * dh_slow(), argv2);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.err, "failed to start; see ");
  tc_out_free(&r);
  pf = test_read_file(pidf, &len);
  ASSERT_NOT_NULL(pf);
  ASSERT_EQ(atoi((char *)pf), pid); /* the first one's file is untouched */
  free(pf);
  ASSERT_OK(kill(pid, SIGTERM));
  double deadline = test_now_ms() + 30000.0 * dh_slow();
  while (!gone(pid)) {
    if (test_now_ms() > deadline) ASSERT_FAIL_("larderd %d did not stop", pid);
    usleep(10000);
  }
  deadline = test_now_ms() + 5000;
  while (access(pidf, F_OK) == 0 && test_now_ms() < deadline) usleep(10000);
  ASSERT_NE(access(pidf, F_OK), 0);
  uint8_t *log = test_read_file(logf, &len);
  ASSERT_NOT_NULL(log);
  char *text = realloc(log, len + 1);
  text[len] = '\0';
  ASSERT_STR_CONTAINS(text, "ready");
  ASSERT_STR_CONTAINS(text, "another larderd is already listening");
  ASSERT_STR_CONTAINS(text, "stopped");
  ASSERT_NULL(strstr(text, "Sanitizer"));
  ASSERT_NULL(strstr(text, "runtime error:"));
  free(text);
  return 0;
}

/* ------------------------------------------------------------------------ */

/* The installed systemd units pass systemd-analyze verify (with ExecStart
 * pointing into DESTDIR). */
TEST_IMPL(ctl_systemd_verify) {
  if (access("/usr/bin/systemd-analyze", X_OK) != 0 || access("Makefile", R_OK) != 0 ||
      test_system("command -v make >/dev/null") != 0) {
    fprintf(stderr, "no systemd-analyze, make or Makefile here\n");
    return TEST_SKIP;
  }
  char dest[700];
  snprintf(dest, sizeof(dest), "%s/destdir", test_tmpdir());
  if (test_system("make -s --no-print-directory install DESTDIR='%s' PREFIX=/usr >'%s.log' 2>&1",
                  dest, dest) != 0) {
    test_system("tail -30 '%s.log' >&2", dest);
    ASSERT_FAIL_("%s", "make install failed");
  }
  ASSERT_EQ(
      test_system(
          "test -x '%s/usr/bin/larderd' && test -f '%s/usr/lib/systemd/system/larderd.service'",
          dest, dest),
      0);
  ASSERT_EQ(
      test_system("sed -i 's|/usr/bin/|%s/usr/bin/|g' '%s/usr/lib/systemd/system/larderd.service'",
                  dest, dest),
      0);
  int rc = test_system(
      "cd '%s/usr/lib/systemd/system' && systemd-analyze verify "
      "./larderd.socket ./larderd.service >'%s/verify.log' 2>&1",
      dest, dest);
  if (rc != 0) {
    test_system("cat '%s/verify.log' >&2", dest);
    ASSERT_EQ(rc, 0);
  }
  /* The installed example config is the reference the daemon prints. */
  ASSERT_EQ(
      test_system("'%s/usr/bin/larderd' --help-config | cmp -s - '%s/etc/larder/larderd.conf'",
                  dest, dest),
      0);
  return 0;
}

/*
 * Failures say what failed, in the form asked for: with --json a failed
 * command prints one JSON error object ({"error":{"code","message"}}) on
 * stdout, for a daemon that cannot be reached and for one that refuses;
 * status tells a socket the user may not open from a daemon that is not
 * running; example-trainer refuses a number that is not one (it became 0).
 */
TEST_IMPL(ctl_errors_clear) {
  char missing[1024];
  snprintf(missing, sizeof(missing), "%s/none.sock", test_tmpdir());
  tc_out r;
  tc_ctl(&r, NULL, missing, "--json", "stats", NULL);
  EXPECT_RUN(&r, 1);
  EXPECT_JSON(&r);
  ASSERT_STR_CONTAINS(r.out, "\"LARDER_ECONNECT\"");
  ASSERT_STR_CONTAINS(r.out, missing);
  tc_out_free(&r);
  tc_ctl(&r, NULL, missing, "status", NULL);
  EXPECT_RUN(&r, 1);
  ASSERT_STR_CONTAINS(r.out, "not running");
  tc_out_free(&r);

  dh_daemon d;
  static const char *const fl[] = {"--socket_mode=0600", NULL};
  dh_init(&d, "d", fl);
  tc_open_tmpdir(d.dir);
  dh_start(&d);
  if (geteuid() == 0) {
    static const tc_cred nobody = {65534, 65534, {0}, 0};
    tc_ctl(&r, &nobody, d.socket, "status", NULL);
    EXPECT_RUN(&r, 1);
    ASSERT_STR_CONTAINS(r.out, "cannot be reached");
    ASSERT_STR_CONTAINS(r.out, strerror(EACCES));
    ASSERT_NULL(strstr(r.out, "not running"));
    tc_out_free(&r);
  }
  /* A refusal from the daemon: a bad option of a command. */
  tc_ctl(&r, NULL, d.socket, "--json", "prefetch", "/no/such/dir", "--unit-rows", "abc", NULL);
  EXPECT_RUN(&r, 1);
  EXPECT_JSON(&r);
  ASSERT_STR_CONTAINS(r.out, "\"LARDER_EINVAL\"");
  ASSERT_STR_CONTAINS(r.out, "unit-rows");
  tc_out_free(&r);
  dh_stop(&d);

  char trainer[PATH_MAX];
  snprintf(trainer, sizeof(trainer), "%s", tc_ctl_bin());
  char *slash = strrchr(trainer, '/');
  ASSERT_NOT_NULL(slash);
  snprintf(slash + 1, sizeof(trainer) - (size_t)(slash + 1 - trainer), "example-trainer");
  const char *argv[] = {trainer, "--batch-size", "abc", "x.parquet", NULL};
  tc_run(&r, NULL, 30000, argv);
  EXPECT_RUN(&r, 2);
  ASSERT_STR_CONTAINS(r.err, "--batch-size abc");
  tc_out_free(&r);
  const char *help[] = {trainer, "--help", NULL};
  tc_run(&r, NULL, 30000, help);
  EXPECT_RUN(&r, 0);
  static const char *const flags[] = {
      "--socket",     "--batch-size", "--epochs", "--compute-ms", "--columns",
      "--seed",       "--no-shuffle", "--rank",   "--world-size", "--local-world-size",
      "--partitions", "--unit-rows",  "--window"};
  for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
    ASSERT_STR_CONTAINS(r.out, flags[i]);
  tc_out_free(&r);
  return 0;
}

/*
 * The numbers as an operator reads them: config shows sizes as written
 * (1500M, not 1572864000) and "auto" for the values chosen at startup;
 * status --json counts the other clients, not the larderctl asking;
 * reload --json lists the keys that changed and those that need a restart.
 */
TEST_IMPL(ctl_output_forms) {
  dh_daemon d;
  static const char *const fl[] = {"--memory_limit=1500M", NULL};
  dh_init(&d, "d", fl);
  FILE *f = fopen(d.config, "w");
  ASSERT_NOT_NULL(f);
  fprintf(f, "max_clients = 77\nunit_bytes = 3M\n");
  ASSERT_OK(fclose(f));
  dh_start(&d);
  tc_out r;
  tc_ctl(&r, NULL, d.socket, "config", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "= 1500M\n");
  ASSERT_STR_CONTAINS(r.out, "= 3M\n");
  ASSERT_STR_CONTAINS(r.out, "cache_flush_threads          = auto\n");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "--json", "status", NULL);
  EXPECT_RUN(&r, 0);
  EXPECT_JSON(&r);
  ASSERT_STR_CONTAINS(r.out, "\"clients\":0,");
  tc_out_free(&r);
  f = fopen(d.config, "w");
  ASSERT_NOT_NULL(f);
  fprintf(f, "max_clients = 78\nunit_bytes = 3M\nworker_nice = 11\n");
  ASSERT_OK(fclose(f));
  tc_ctl(&r, NULL, d.socket, "--json", "reload", NULL);
  EXPECT_RUN(&r, 0);
  EXPECT_JSON(&r);
  ASSERT_STR_CONTAINS(r.out, "\"changed\":[\"max_clients\"]");
  ASSERT_STR_CONTAINS(r.out, "\"restart_needed\":[\"worker_nice\"]");
  tc_out_free(&r);
  /* A name JSON must escape (\u001b) reaches the person whole. */
  char odd[1200];
  std_opts(&(larder_stream_options_t){0}, 64, 1);
  snprintf(odd, sizeof(odd), "%s/odd\x1bname", test_tmpdir());
  ASSERT_EQ(test_system("mkdir -p '%s' && cp '%s'/*.parquet '%s'/", odd, dh_std_dir(), odd), 0);
  tc_ctl(&r, NULL, d.socket, "prefetch", odd, NULL);
  EXPECT_RUN(&r, 0);
  char want[1300];
  snprintf(want, sizeof(want), "prefetch %s:", odd);
  ASSERT_STR_CONTAINS(r.out, want);
  tc_out_free(&r);
  dh_stop(&d);
  return 0;
}

/*
 * A second larderd pointed at a cache another one holds stops at once,
 * saying which process holds it (the RocksDB lock's holder, by pid).
 */
TEST_IMPL(ctl_cache_held) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  char bin[PATH_MAX], sock[700], cache[700], conf[700];
  snprintf(bin, sizeof(bin), "%s", getenv("LARDERD_BIN") ? getenv("LARDERD_BIN") : "larderd");
  snprintf(sock, sizeof(sock), "--socket=%s/second.sock", d.dir);
  snprintf(cache, sizeof(cache), "--cache_dir=%s", d.cache);
  snprintf(conf, sizeof(conf), "--config=%s", d.config);
  const char *argv[] = {bin, conf, sock, cache, "--log_level=warning", NULL};
  tc_out r;
  tc_run(&r, NULL, 60000, argv);
  EXPECT_RUN(&r, 1);
  char want[64];
  snprintf(want, sizeof(want), "pid %d", (int)d.pid);
  ASSERT_STR_CONTAINS(r.err, "another process holds it");
  ASSERT_STR_CONTAINS(r.err, want);
  tc_out_free(&r);
  ASSERT(dh_alive(&d));
  dh_stop(&d);
  return 0;
}

/*
 * The hit ratio is the trainers': a prefetch warms the cache without
 * counting as misses (stats say nothing was served yet, and count the
 * prefetch's bytes apart), and a trainer's epoch after it is all hits.
 */
TEST_IMPL(ctl_hit_ratio_after_prefetch) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 64, 1);
  tc_out r;
  char units[32];
  snprintf(units, sizeof(units), "%u", (unsigned)DH_STD_UNIT_ROWS);
  tc_ctl(&r, NULL, d.socket, "prefetch", dh_std_dir(), "--unit-rows", units, NULL);
  EXPECT_RUN(&r, 0);
  tc_out_free(&r);
  ASSERT_GT(dh_stat(&d, "prefetch_loaded_bytes"), 0);
  ASSERT_EQ(dh_stat(&d, "cache_miss_bytes"), 0);
  tc_ctl(&r, NULL, d.socket, "stats", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "hit ratio   - (nothing served yet)");
  tc_out_free(&r);
  dh_run run = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &run));
  dh_run_free(&run);
  ASSERT_GT(dh_stat(&d, "cache_hit_bytes"), 0);
  ASSERT_EQ(dh_stat(&d, "cache_miss_bytes"), 0);
  tc_ctl(&r, NULL, d.socket, "stats", NULL);
  EXPECT_RUN(&r, 0);
  ASSERT_STR_CONTAINS(r.out, "hit ratio   100.0%");
  tc_out_free(&r);
  dh_stop(&d);
  return 0;
}
