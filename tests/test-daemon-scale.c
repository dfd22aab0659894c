/*
 * test-daemon-scale.c: the daemon's loop stays responsive at scale: a
 * dataset of a million units, and one client's costly units beside
 * another's cheap ones.
 *
 * Conventions
 * -----------
 * - Files too big to build with pqw_file (a million row groups) are written
 *   here with pqwrite's Thrift encoder directly, once, under dh_work_dir().
 * - Deadlines are generous and scale with dh_slow(); waits poll a condition
 *   with a deadline, never a sleep that assumes a thread has started.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "larder.h"
#include "daemon-harness.h"
#include "pqwrite.h"
#include "task.h"

/* Writes out's bytes to path, under a temporary name then renamed: a test
 * killed midway leaves no half file for the next run to trust. */
static void write_whole(const char *path, const pqw_buf *out) {
  char tmp[1100];
  snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
  FILE *fp = fopen(tmp, "wb");
  ASSERT_NOT_NULL(fp);
  ASSERT_EQ(fwrite(out->data, 1, out->len, fp), out->len);
  ASSERT_OK(fclose(fp));
  ASSERT_OK(rename(tmp, path));
}

/* Writes (once) a file of rgs row groups of one row each, one required
 * int64 column `id` holding the row's index; copies its path into path.
 * The footer is about 45 bytes a row group, so a million fit the reader's
 * 64 MiB ceiling. */
static void many_rg_file(int rgs, char *path, size_t len) {
  snprintf(path, len, "%s/one-row-groups-%d.parquet", dh_work_dir(), rgs);
  struct stat st;
  if (stat(path, &st) == 0) return;
  pqw_buf out = {0};
  pqw_put(&out, "PAR1", 4);
  int64_t *offset = malloc((size_t)rgs * sizeof(*offset));
  ASSERT_NOT_NULL(offset);
  int64_t chunk_len = 0;
  for (int g = 0; g < rgs; g++) {
    offset[g] = (int64_t)out.len;
    uint8_t body[8];
    for (int i = 0; i < 8; i++) body[i] = (uint8_t)((uint64_t)g >> (8 * i));
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 1;
    pqw_page_header(&out, &h, body, sizeof(body), sizeof(body));
    pqw_put(&out, body, sizeof(body));
    chunk_len = (int64_t)out.len - offset[g];
  }
  size_t meta_start = out.len;
  pqw_thrift t;
  pqw_t_init(&t, &out);
  pqw_t_push(&t);
  pqw_t_i32(&t, 1, 1);
  pqw_t_list_begin(&t, 2, PQ_TT_STRUCT, 2);
  pqw_t_push(&t);
  pqw_t_string(&t, 4, "schema");
  pqw_t_i32(&t, 5, 1);
  pqw_t_struct_end(&t);
  pqw_t_push(&t);
  pqw_t_i32(&t, 1, PQ_INT64);
  pqw_t_i32(&t, 3, PQ_REQUIRED);
  pqw_t_string(&t, 4, "id");
  pqw_t_struct_end(&t);
  pqw_t_i64(&t, 3, rgs);
  pqw_t_list_begin(&t, 4, PQ_TT_STRUCT, (uint64_t)rgs);
  for (int g = 0; g < rgs; g++) {
    pqw_t_push(&t);
    pqw_t_list_begin(&t, 1, PQ_TT_STRUCT, 1);
    pqw_t_push(&t);
    pqw_t_i64(&t, 2, offset[g] + chunk_len);
    pqw_t_struct_begin(&t, 3);
    pqw_t_i32(&t, 1, PQ_INT64);
    pqw_t_list_begin(&t, 2, PQ_TT_I32, 2);
    pqw_t_val_int(&t, PQ_ENC_PLAIN);
    pqw_t_val_int(&t, PQ_ENC_RLE);
    pqw_t_list_begin(&t, 3, PQ_TT_BINARY, 1);
    pqw_t_val_binary(&t, "id", 2);
    pqw_t_i32(&t, 4, 0);
    pqw_t_i64(&t, 5, 1);
    pqw_t_i64(&t, 6, chunk_len);
    pqw_t_i64(&t, 7, chunk_len);
    pqw_t_i64(&t, 9, offset[g]);
    pqw_t_struct_end(&t);
    pqw_t_struct_end(&t);
    pqw_t_i64(&t, 2, chunk_len);
    pqw_t_i64(&t, 3, 1);
    pqw_t_struct_end(&t);
  }
  pqw_t_struct_end(&t);
  pqw_tail(&out, meta_start);
  free(offset);
  write_whole(path, &out);
  pqw_buf_free(&out);
}

/* Writes a file of rgs row groups of rows rows and cols required
 * int64 columns c0, c1, ... (each a single PLAIN page holding the row
 * numbers); copies its path into path.  A unit of it costs a decode and a
 * cache write per column: with thousands of columns, a costly unit from a
 * small file. */
static void wide_file(int cols, int rows, int rgs, char *path, size_t len) {
  /* In the test's own directory: a hundred megabytes, written in a second,
   * not worth keeping between runs. */
  snprintf(path, len, "%s/wide-%dx%dx%d.parquet", test_tmpdir(), cols, rows, rgs);
  pqw_buf page = {0};
  pqw_buf body = {0};
  for (int r = 0; r < rows; r++) pqw_le64(&body, (uint64_t)r);
  pqw_page h;
  pqw_page_init(&h, PQ_PAGE_DATA);
  h.num_values = rows;
  pqw_page_header(&page, &h, body.data, body.len, body.len);
  pqw_put(&page, body.data, body.len);
  const int64_t chunk_len = (int64_t)page.len;
  pqw_buf out = {0};
  pqw_put(&out, "PAR1", 4);
  const int64_t first = (int64_t)out.len;
  for (int64_t k = 0; k < (int64_t)rgs * cols; k++) pqw_put(&out, page.data, page.len);
  size_t meta_start = out.len;
  pqw_thrift t;
  pqw_t_init(&t, &out);
  pqw_t_push(&t);
  pqw_t_i32(&t, 1, 1);
  pqw_t_list_begin(&t, 2, PQ_TT_STRUCT, (uint64_t)cols + 1);
  pqw_t_push(&t);
  pqw_t_string(&t, 4, "schema");
  pqw_t_i32(&t, 5, cols);
  pqw_t_struct_end(&t);
  char name[32];
  for (int c = 0; c < cols; c++) {
    snprintf(name, sizeof(name), "c%d", c);
    pqw_t_push(&t);
    pqw_t_i32(&t, 1, PQ_INT64);
    pqw_t_i32(&t, 3, PQ_REQUIRED);
    pqw_t_string(&t, 4, name);
    pqw_t_struct_end(&t);
  }
  pqw_t_i64(&t, 3, (int64_t)rows * rgs);
  pqw_t_list_begin(&t, 4, PQ_TT_STRUCT, (uint64_t)rgs);
  for (int g = 0; g < rgs; g++) {
    pqw_t_push(&t);
    pqw_t_list_begin(&t, 1, PQ_TT_STRUCT, (uint64_t)cols);
    for (int c = 0; c < cols; c++) {
      int64_t off = first + ((int64_t)g * cols + c) * chunk_len;
      snprintf(name, sizeof(name), "c%d", c);
      pqw_t_push(&t);
      pqw_t_i64(&t, 2, off + chunk_len);
      pqw_t_struct_begin(&t, 3);
      pqw_t_i32(&t, 1, PQ_INT64);
      pqw_t_list_begin(&t, 2, PQ_TT_I32, 2);
      pqw_t_val_int(&t, PQ_ENC_PLAIN);
      pqw_t_val_int(&t, PQ_ENC_RLE);
      pqw_t_list_begin(&t, 3, PQ_TT_BINARY, 1);
      pqw_t_val_binary(&t, name, strlen(name));
      pqw_t_i32(&t, 4, 0);
      pqw_t_i64(&t, 5, rows);
      pqw_t_i64(&t, 6, chunk_len);
      pqw_t_i64(&t, 7, chunk_len);
      pqw_t_i64(&t, 9, off);
      pqw_t_struct_end(&t);
      pqw_t_struct_end(&t);
    }
    pqw_t_i64(&t, 2, chunk_len * cols);
    pqw_t_i64(&t, 3, rows);
    pqw_t_struct_end(&t);
  }
  pqw_t_struct_end(&t);
  pqw_tail(&out, meta_start);
  write_whole(path, &out);
  pqw_buf_free(&out);
  pqw_buf_free(&page);
  pqw_buf_free(&body);
}

/* ------------------------------------------------------------------------ */
/* A million units                                                           */

typedef struct opener {
  const char *socket;
  const char *path;
  int batches;      /* to read after the open */
  atomic_int phase; /* 0 opening, 1 reading, 2 done */
  int rc;
  uint64_t samples;
  char err[512];
} opener_t;

static void *opener_main(void *arg) {
  opener_t *o = arg;
  larder_client_t *c = NULL;
  o->rc = larder_client_connect(o->socket, &c);
  larder_stream_t *s = NULL;
  if (o->rc == 0) {
    const char *src[1] = {o->path};
    larder_stream_options_t opts;
    dh_opts(&opts, src, 4096, 3, 1);
    o->rc = larder_stream_open(c, &opts, &s);
  }
  if (o->rc == 0) {
    o->samples = larder_stream_num_samples(s);
    atomic_store(&o->phase, 1);
    for (int i = 0; i < o->batches && o->rc == 0; i++) {
      larder_batch_t *b = NULL;
      o->rc = larder_stream_next(s, 120000 * dh_slow(), &b);
      if (o->rc == 0) larder_batch_release(b);
    }
    larder_stream_close(s);
  }
  if (o->rc != 0 && c) snprintf(o->err, sizeof(o->err), "%s", larder_client_last_error(c));
  if (c) larder_client_close(c);
  atomic_store(&o->phase, 2);
  return NULL;
}

/*
 * While one client opens a stream over a file of a million one-row row
 * groups (a million units) and reads its first batches, another client's
 * connect and `status` are answered within 2 s each (x3 under sanitizers).
 * With a units table of fixed buckets the loop walked chains of 250 on
 * every unit lookup, and status went unanswered for 45 s.
 */
TEST_IMPL(daemon_scale_million_units) {
  enum { RGS = 1000000 };
  char path[1024];
  double t0 = test_now_s();
  many_rg_file(RGS, path, sizeof(path));
  printf("  file ready in %.2f s\n", test_now_s() - t0);
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", NULL};
  dh_init(&d, "d", fl);
  dh_start(&d);
  opener_t o = {d.socket, path, 40, 0, 0, 0, ""};
  atomic_init(&o.phase, 0);
  pthread_t th;
  ASSERT_OK(pthread_create(&th, NULL, opener_main, &o));
  const double deadline = 2.0 * dh_slow();
  double worst = 0, worst_opening = 0;
  int asked = 0, asked_opening = 0, asked_reading = 0;
  double started = test_now_s();
  while (atomic_load(&o.phase) < 2) {
    int phase = atomic_load(&o.phase);
    double a = test_now_s();
    char *reply = dh_admin(&d, "status");
    double took = test_now_s() - a;
    ASSERT_NOT_NULL(reply);
    ASSERT_STR_CONTAINS(reply, "\"up\":true");
    free(reply);
    asked++;
    if (phase == 0) asked_opening++;
    if (phase == 1) asked_reading++;
    if (took > worst) worst = took;
    if (phase == 0 && took > worst_opening) worst_opening = took;
    if (took > deadline) {
      dh_print_log(&d);
      ASSERT_FAIL_("status took %.2f s (deadline %.2f s) while the other client was %s", took,
                   deadline, phase ? "reading" : "opening");
    }
    ASSERT(test_now_s() - started < 200.0 * dh_slow());
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
  pthread_join(th, NULL);
  printf(
      "  %d status replies (%d while opening, %d while reading), worst %.3f s "
      "(%.3f s while opening); open and %d batches in %.2f s\n",
      asked, asked_opening, asked_reading, worst, worst_opening, o.batches, test_now_s() - started);
  if (o.rc != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("the stream over a million row groups: %d %s", o.rc, o.err);
  }
  ASSERT_EQ(o.samples, RGS);
  ASSERT_GT(asked, 0);
  dh_stop(&d);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Costly units beside cheap ones                                            */

typedef struct costly {
  const char *socket;
  const char *path;
  atomic_int phase; /* 0 opening, 1 reading, 2 done */
  atomic_int stop;
  int rc;
  char err[512];
} costly_t;

/* Opens a stream over the wide file and holds it, reading nothing, until
 * told to stop: with a window of one batch, its work is its pinned units'
 * loads, a whole epoch of them. */
static void *costly_main(void *arg) {
  costly_t *x = arg;
  larder_client_t *c = NULL;
  x->rc = larder_client_connect(x->socket, &c);
  larder_stream_t *s = NULL;
  if (x->rc == 0) {
    const char *src[1] = {x->path};
    larder_stream_options_t opts;
    dh_opts(&opts, src, 64, 5, 1);
    opts.unit_rows = 64;
    opts.window = 1;
    opts.arena_bytes = 64u << 20;
    x->rc = larder_stream_open(c, &opts, &s);
  }
  if (x->rc == 0) {
    atomic_store(&x->phase, 1);
    while (!atomic_load(&x->stop)) {
      struct timespec ts = {0, 2 * 1000000L};
      nanosleep(&ts, NULL);
    }
    larder_stream_close(s);
  }
  if (x->rc != 0 && c) snprintf(x->err, sizeof(x->err), "%s", larder_client_last_error(c));
  if (c) larder_client_close(c);
  atomic_store(&x->phase, 2);
  return NULL;
}

/* Spins on a core until *arg is set: the control that takes the core a
 * worker decoding costly units would (the test's daemon runs its workers
 * at its own niceness, as this thread does). */
static void *hog_main(void *arg) {
  atomic_int *stop = arg;
  volatile uint64_t x = 0;
  while (!atomic_load(stop)) x++;
  return NULL;
}

static double cheap_epoch(larder_stream_t *s, larder_client_t *c);

/* n epochs of the cheap stream into e[], beside a thread that takes a core
 * as a worker decoding costly units would (hog_main). */
static void alone_with_hog(larder_stream_t *s, larder_client_t *c, double *e, int n) {
  atomic_int stop;
  atomic_init(&stop, 0);
  pthread_t hog;
  ASSERT_OK(pthread_create(&hog, NULL, hog_main, &stop));
  for (int k = 0; k < n; k++) e[k] = cheap_epoch(s, c);
  atomic_store(&stop, 1);
  pthread_join(hog, NULL);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* The median of n values (sorts them). */
static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof(*v), cmp_double);
  return v[n / 2];
}

/* Reads the cheap stream to the end of its current epoch; returns the
 * seconds it took from the first batch of the next. */
static double cheap_epoch(larder_stream_t *s, larder_client_t *c) {
  double t0 = test_now_s();
  uint64_t epoch = UINT64_MAX;
  for (;;) {
    larder_batch_t *b = NULL;
    int rc = larder_stream_next(s, 60000 * dh_slow(), &b);
    if (rc) ASSERT_FAIL_("cheap stream: %d %s", rc, larder_client_last_error(c));
    uint64_t e = larder_batch_epoch(b);
    int last = larder_batch_index(b) + 1 == larder_stream_batches_per_epoch(s);
    larder_batch_release(b);
    if (epoch == UINT64_MAX) epoch = e;
    ASSERT_EQ(e, epoch);
    if (last) return test_now_s() - t0;
  }
}

/*
 * A client whose units are costly (a file of 20000 columns: each unit is
 * 20000 column decodes, a tenth of a second or more) beside one
 * reading a small dataset from memory, one batch at a time: the cheap
 * client's 61 epochs take within 2x of their time alone (beside a thread
 * that takes a core as the costly worker does; the slower of the runs
 * just before and just after), all the while the costly client's units
 * decode (it must not have finished: then the test showed nothing).  The workers serve the
 * two jobs in turn, and the costly one runs on at most workers - 1 while
 * the cheap one's stream is open.  Without that, two workers both decoding
 * costly units made each of the cheap client's batches wait for one.
 */
TEST_IMPL(daemon_scale_costly_beside_cheap) {
  enum { WIDE_COLS = 20000, WIDE_ROWS = 8, WIDE_RGS = 40 };
  char wide[1024];
  double t0 = test_now_s();
  wide_file(WIDE_COLS, WIDE_ROWS, WIDE_RGS, wide, sizeof(wide));
  printf("  wide file ready in %.2f s\n", test_now_s() - t0);
  /* One batch prepared ahead, and a client window of one: each of the
   * cheap client's batches is a worker task that it waits for, as a
   * trainer waits on a cold or memory-short epoch.  No cache: the costly
   * units cost a worker's time only, not RocksDB's flushes besides, which
   * no scheduling of the workers could share out.  Workers as nice as
   * the loop: the daemon boosts them so while trainers wait (work.h),
   * and the control (hog_main) can then be the same. */
  dh_daemon d;
  static const char *const fl[] = {"--workers=2", "--prefetch_batches=1", "--cache_capacity=0",
                                   "--worker_nice=0", NULL};
  dh_init(&d, "d", fl);
  dh_start(&d);

  char mid_dir[1024];
  ASSERT_EQ(dh_mid_dataset(mid_dir, sizeof(mid_dir)), DH_MID_ROWS);
  const char *src[1] = {mid_dir};
  larder_stream_options_t o;
  dh_opts(&o, src, 512, 1, 0);
  o.unit_rows = 512;
  o.window = 1;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, &o, &s));
  cheap_epoch(s, c); /* cold: loads every unit */
  /* Alone but for a thread that takes a core as a worker decoding costly
   * units does, so that both runs have the same cores left: the ratio
   * measures how the workers are shared, not how many cores the machine
   * has (on two, a busy worker alone costs the cheap client about 1.5x). */
  enum { EPOCHS = 61 };
  double alone_e[EPOCHS], after_e[EPOCHS], beside_e[EPOCHS];
  alone_with_hog(s, c, alone_e, EPOCHS);

  costly_t x = {d.socket, wide, 0, 0, 0, ""};
  atomic_init(&x.phase, 0);
  atomic_init(&x.stop, 0);
  pthread_t th;
  ASSERT_OK(pthread_create(&th, NULL, costly_main, &x));
  /* Measure once its loads are under way: it has decoded a unit, so the
   * workers know its units for costly ones. */
  uint64_t cheap_units = dh_stat(&d, "units_decoded");
  double t1 = test_now_s(), deadline = t1 + 60.0 * dh_slow();
  while (dh_stat(&d, "units_decoded") == cheap_units && atomic_load(&x.phase) < 2 &&
         test_now_s() < deadline) {
    struct timespec ts = {0, 5 * 1000000L};
    nanosleep(&ts, NULL);
  }
  ASSERT(atomic_load(&x.phase) < 2); /* its open may not have returned yet */
  double t2 = test_now_s();
  for (int k = 0; k < EPOCHS; k++) beside_e[k] = cheap_epoch(s, c);
  double t3 = test_now_s();
  uint64_t costly_units = dh_stat(&d, "units_decoded") - cheap_units;
  int busy = atomic_load(&x.phase) == 1 && costly_units < WIDE_RGS;
  printf("  the costly client's first unit after %.2f s, %" PRIu64
         " units in the %.2f s "
         "measured\n",
         t2 - t1, costly_units, t3 - t2);
  atomic_store(&x.stop, 1);
  pthread_join(th, NULL);
  /* Alone again (its stream closed, its loads cancelled): the control is
   * the slower of the runs just before and just after, so that the
   * machine's load drifting during the test is not taken for unfairness. */
  alone_with_hog(s, c, after_e, EPOCHS);
  double before_sum = 0, after_sum = 0, beside_sum = 0;
  for (int k = 0; k < EPOCHS; k++) {
    before_sum += alone_e[k];
    after_sum += after_e[k];
    beside_sum += beside_e[k];
  }
  double alone = before_sum > after_sum ? before_sum : after_sum, beside = beside_sum;
  printf(
      "  cheap client's %d epochs: %.3f s alone before, %.3f s after, %.3f s beside costly "
      "units (%.2fx); median epochs %.2f, %.2f and %.2f ms\n",
      EPOCHS, before_sum, after_sum, beside_sum, beside / alone, median(alone_e, EPOCHS) * 1e3,
      median(after_e, EPOCHS) * 1e3, median(beside_e, EPOCHS) * 1e3);
  fflush(stdout);
  if (x.rc != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("costly stream: %d %s", x.rc, x.err);
  }
  ASSERT_DOUBLE_LE(beside, 2.0 * alone + 0.005);
  /* The costly client must still have been loading, or nothing was shown. */
  ASSERT(busy);
  larder_stream_close(s);
  larder_client_close(c);
  dh_stop(&d);
  return 0;
}
