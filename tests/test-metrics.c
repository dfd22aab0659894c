/*
 * test-metrics.c: the Prometheus series as Prometheus's own tools see
 * them (promtool check metrics on a scrape with every histogram filled),
 * and the per-workload groups: labelled by job and dataset, counters that
 * only grow as streams close, a bounded number of label sets, the job
 * from the options or $LARDER_JOB, and `larderctl clients` showing it.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test-ctl-common.h"

/* The body of GET /metrics on 127.0.0.1:port (malloc'd). */
static char *scrape(int port) {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT(s >= 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_OK(connect(s, (struct sockaddr *)&a, sizeof(a)));
  static const char req[] = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_EQ(write(s, req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
  size_t len = 0, cap = 1 << 16;
  char *buf = malloc(cap);
  ASSERT_NOT_NULL(buf);
  for (;;) {
    if (len + 4096 > cap) {
      cap *= 2;
      char *more = realloc(buf, cap);
      ASSERT_NOT_NULL(more);
      buf = more;
    }
    ssize_t n = read(s, buf + len, cap - len - 1);
    if (n <= 0) break;
    len += (size_t)n;
  }
  close(s);
  buf[len] = '\0';
  ASSERT_STR_CONTAINS(buf, "HTTP/1.1 200 OK\r\n");
  char *body = strstr(buf, "\r\n\r\n");
  ASSERT_NOT_NULL(body);
  char *out = strdup(body + 4);
  ASSERT_NOT_NULL(out);
  free(buf);
  return out;
}

/* The metrics port from `larderctl status --json`. */
static int metrics_port(const dh_daemon *d) {
  tc_out r;
  tc_ctl(&r, NULL, d->socket, "status", "--json", NULL);
  ASSERT_EQ(r.status, 0);
  static const char key[] = "\"metrics_endpoint\":\"http://127.0.0.1:";
  const char *ep = strstr(r.out, key);
  ASSERT_NOT_NULL(ep);
  int port = atoi(ep + strlen(key));
  ASSERT_GT(port, 0);
  tc_out_free(&r);
  return port;
}

/* The value of the series that starts a line with `series ` (name and
 * labels exactly), or -1 when there is none. */
static double value_of(const char *text, const char *series) {
  size_t n = strlen(series);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    if (strncmp(p, series, n) == 0 && p[n] == ' ') return strtod(p + n + 1, NULL);
  return -1;
}

/* Lines that start with prefix. */
static int count_lines(const char *text, const char *prefix) {
  int k = 0;
  size_t n = strlen(prefix);
  for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
    k += strncmp(p, prefix, n) == 0;
  return k;
}

static void check_text(const char *text) {
  char err[512];
  static char names[256][128];
  int nn = 0;
  if (tc_prom_check(text, err, sizeof(err), names, 256, &nn) < 0)
    ASSERT_FAIL_("the scrape does not parse: %s", err);
}

static void read_batches(larder_stream_t *s, int n) {
  for (int i = 0; i < n; i++) {
    larder_batch_t *b;
    ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
    larder_batch_release(b);
    usleep(1000); /* some compute between batches */
  }
}

static const char *last_component(const char *path) {
  const char *p = strrchr(path, '/');
  return p ? p + 1 : path;
}

/*
 * promtool check metrics accepts a scrape of a daemon that has served a
 * local stream and a remote one (through nginx), with every histogram
 * non-empty: the trainer's wait per batch, the time to the first batch,
 * and the remote requests.  The dataset label is the last path component
 * without glob characters, and of a URL without its credentials or query.
 */
TEST_IMPL(metrics_promtool) {
  if (system("command -v promtool >/dev/null 2>&1") != 0) {
    fprintf(stderr,
            "promtool is not installed (Debian: prometheus; scripts/deps.sh installs it)\n");
    return TEST_SKIP;
  }
  char std[1024], mid[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  ASSERT_EQ(dh_mid_dataset(mid, sizeof(mid)), DH_MID_ROWS);
  char ndir[700];
  snprintf(ndir, sizeof(ndir), "%s/nginx", test_tmpdir());
  int nport = tc_nginx_start(ndir, mid, "");
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_flag(&d, "--metrics_listen=127.0.0.1:0");
  dh_start(&d);
  int port = metrics_port(&d);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));

  char glob[1100];
  snprintf(glob, sizeof(glob), "%s/*.parquet", std);
  const char *src[1] = {glob};
  larder_stream_options_t o;
  dh_opts(&o, src, 64, 1, 1);
  o.unit_rows = DH_STD_UNIT_ROWS;
  o.arena_bytes = 1u << 20;
  o.job = "train-a";
  /* A small window: releases come back (in the ring, which the daemon
   * reads when it needs the room) before the stream is through. */
  o.window = 4;
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  read_batches(s, 12);
  larder_stream_close(s);

  char url[300];
  if (nport) {
    snprintf(url, sizeof(url), "http://user:s3cret@127.0.0.1:%d/part-002.parquet?token=s3cret",
             nport);
    src[0] = url;
    dh_opts(&o, src, 256, 1, 1);
    o.arena_bytes = 4u << 20;
    o.job = "train-b";
    o.window = 4;
    ASSERT_OK(larder_stream_open(c, &o, &s));
    read_batches(s, 4);
    larder_stream_close(s);
  } else {
    fprintf(stderr, "nginx is not available: no remote stream, the fetch histogram not checked\n");
  }
  larder_client_close(c);

  char *text = scrape(port);
  check_text(text);
  char series[1200];
  snprintf(series, sizeof(series),
           "larder_batch_wait_seconds_count{job=\"train-a\",dataset=\"%s\"}", last_component(std));
  ASSERT_GT(value_of(text, series), 4);
  snprintf(series, sizeof(series),
           "larder_stream_first_batch_seconds_count{job=\"train-a\",dataset=\"%s\"}",
           last_component(std));
  ASSERT_EQ(value_of(text, series), 1);
  snprintf(series, sizeof(series),
           "larder_stream_compute_seconds_total{job=\"train-a\",dataset=\"%s\"}",
           last_component(std));
  ASSERT(value_of(text, series) > 0);
  ASSERT_EQ(count_lines(text, "larder_batch_wait_seconds_bucket{job=\"train-a\","), 15);
  ASSERT(value_of(text, "larder_stage_seconds_total{stage=\"decode\"}") > 0);
  if (nport) {
    ASSERT_GT(value_of(text, "larder_fetch_request_duration_seconds_count"), 0);
    ASSERT(value_of(text, "larder_stage_seconds_total{stage=\"fetch\"}") > 0);
    ASSERT_EQ(value_of(text,
                       "larder_stream_first_batch_seconds_count{job=\"train-b\","
                       "dataset=\"part-002.parquet\"}"),
              1);
    ASSERT_NULL(strstr(text, "s3cret"));
  }

  /* promtool: exit status 0 and nothing said. */
  char path[700];
  snprintf(path, sizeof(path), "%s/scrape.prom", d.dir);
  FILE *f = fopen(path, "w");
  ASSERT_NOT_NULL(f);
  fputs(text, f);
  fclose(f);
  char cmd[900];
  snprintf(cmd, sizeof(cmd), "promtool check metrics < '%s' 2>&1", path);
  FILE *p = popen(cmd, "r");
  ASSERT_NOT_NULL(p);
  char said[8192];
  size_t n = fread(said, 1, sizeof(said) - 1, p);
  said[n] = '\0';
  int st = pclose(p);
  if (st != 0 || n != 0)
    ASSERT_FAIL_("promtool check metrics (status 0x%x) on %s:\n%s", st, path, said);
  free(text);
  dh_stop(&d);
  if (nport) tc_nginx_stop(ndir);
  return 0;
}

/*
 * The groups: a closed stream's counts stay in its (job, dataset) series,
 * which never go down; the job comes from the options, else $LARDER_JOB;
 * one that is not short printable ASCII fails the open; label values are
 * escaped; `larderctl clients` shows the job; and past METRICS_MAX_JOBS
 * (64) label sets, the streams count in job="other",dataset="other" (as
 * do those of a job "other" on a dataset "other", so that no series
 * repeats).
 */
TEST_IMPL(metrics_job_groups) {
  char std[1024];
  ASSERT_EQ(dh_std_dataset(std, sizeof(std)), DH_STD_ROWS);
  const char *ds = last_component(std);
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_flag(&d, "--metrics_listen=127.0.0.1:0");
  dh_start(&d);
  int port = metrics_port(&d);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  const char *src[1] = {std};
  larder_stream_options_t o;
  dh_opts(&o, src, 64, 1, 0);
  o.unit_rows = DH_STD_UNIT_ROWS;
  o.arena_bytes = 1u << 20;
  o.window = 4;

  /* Open, then closed: the counters stay. */
  o.job = "g";
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  read_batches(s, 5);
  char *text = scrape(port);
  check_text(text);
  char series[1200];
  snprintf(series, sizeof(series), "larder_stream_batches_total{job=\"g\",dataset=\"%s\"}", ds);
  double open_batches = value_of(text, series);
  ASSERT_GT(open_batches, 4);
  snprintf(series, sizeof(series), "larder_job_streams{job=\"g\",dataset=\"%s\"}", ds);
  ASSERT_EQ(value_of(text, series), 1);
  free(text);
  larder_stream_close(s);
  usleep(100000);
  text = scrape(port);
  ASSERT_EQ(value_of(text, series), 0);
  snprintf(series, sizeof(series), "larder_stream_batches_total{job=\"g\",dataset=\"%s\"}", ds);
  ASSERT(value_of(text, series) >= open_batches);
  free(text);

  /* $LARDER_JOB when the options name none; larderctl clients shows it. */
  setenv("LARDER_JOB", "from-env", 1);
  o.job = NULL;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  unsetenv("LARDER_JOB");
  read_batches(s, 1);
  tc_out r;
  tc_ctl(&r, NULL, d.socket, "clients", "--json", NULL);
  ASSERT_EQ(r.status, 0);
  ASSERT_STR_CONTAINS(r.out, "\"job\":\"from-env\"");
  tc_out_free(&r);
  tc_ctl(&r, NULL, d.socket, "clients", NULL);
  ASSERT_EQ(r.status, 0);
  ASSERT_STR_CONTAINS(r.out, "job from-env");
  tc_out_free(&r);
  larder_stream_close(s);

  /* Bad job names fail the open; quotes and backslashes are escaped. */
  o.job = "two\nlines";
  ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "job");
  o.job = "x123456789012345678901234567890123456789012345678901234567890abcd"; /* 65 */
  ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_EINVAL);
  o.job = "q\"b\\s";
  ASSERT_OK(larder_stream_open(c, &o, &s));
  read_batches(s, 1);
  larder_stream_close(s);
  text = scrape(port);
  check_text(text);
  snprintf(series, sizeof(series), "larder_job_streams{job=\"q\\\"b\\\\s\",dataset=\"%s\"}", ds);
  ASSERT_EQ(value_of(text, series), 0);
  free(text);

  /* A job named "other" on a dataset named "other" is the overflow group,
   * not a second series with the same labels. */
  char other[1100];
  snprintf(other, sizeof(other), "%s/other", test_tmpdir());
  ASSERT_OK(symlink(std, other));
  src[0] = other;
  o.job = "other";
  ASSERT_OK(larder_stream_open(c, &o, &s));
  larder_stream_close(s);
  src[0] = std;

  /* 3 groups so far; 70 more jobs: 64 named groups in all, then "other". */
  for (int i = 0; i < 70; i++) {
    char job[32];
    snprintf(job, sizeof(job), "job-%d", i);
    o.job = job;
    ASSERT_OK(larder_stream_open(c, &o, &s));
    larder_stream_close(s);
  }
  text = scrape(port);
  check_text(text);
  ASSERT_EQ(count_lines(text, "larder_job_streams{"), 65);
  ASSERT_EQ(count_lines(text, "larder_job_streams{job=\"other\",dataset=\"other\"} 0\n"), 1);
  snprintf(series, sizeof(series), "larder_job_streams{job=\"job-60\",dataset=\"%s\"}", ds);
  ASSERT_EQ(value_of(text, series), 0);
  snprintf(series, sizeof(series), "larder_job_streams{job=\"job-61\",dataset=\"%s\"}", ds);
  ASSERT_EQ(value_of(text, series), -1);
  free(text);
  larder_client_close(c);
  dh_stop(&d);
  return 0;
}
