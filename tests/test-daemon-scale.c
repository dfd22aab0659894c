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

#include "../client/larder.h"
#include "daemon-harness.h"
#include "pqwrite.h"
#include "task.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
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
  /* Written under a temporary name and renamed: a test killed midway
   * leaves no half file for the next run to trust. */
  char tmp[1100];
  snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
  FILE *fp = fopen(tmp, "wb");
  ASSERT_NOT_NULL(fp);
  ASSERT_EQ(fwrite(out.data, 1, out.len, fp), out.len);
  ASSERT_OK(fclose(fp));
  ASSERT_OK(rename(tmp, path));
  pqw_buf_free(&out);
}

/* ------------------------------------------------------------------------ */
/* A million units                                                           */

typedef struct opener {
  const char *socket;
  const char *path;
  int batches;         /* to read after the open */
  atomic_int phase;    /* 0 opening, 1 reading, 2 done */
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
  double t0 = now_s();
  many_rg_file(RGS, path, sizeof(path));
  printf("  file ready in %.2f s\n", now_s() - t0);
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
  double started = now_s();
  while (atomic_load(&o.phase) < 2) {
    int phase = atomic_load(&o.phase);
    double a = now_s();
    char *reply = dh_admin(&d, "status");
    double took = now_s() - a;
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
    ASSERT(now_s() - started < 200.0 * dh_slow());
    struct timespec ts = {0, 50 * 1000000L};
    nanosleep(&ts, NULL);
  }
  pthread_join(th, NULL);
  printf("  %d status replies (%d while opening, %d while reading), worst %.3f s "
         "(%.3f s while opening); open and %d batches in %.2f s\n",
         asked, asked_opening, asked_reading, worst, worst_opening, o.batches, now_s() - started);
  if (o.rc != 0) {
    dh_print_log(&d);
    ASSERT_FAIL_("the stream over a million row groups: %d %s", o.rc, o.err);
  }
  ASSERT_EQ(o.samples, RGS);
  ASSERT_GT(asked, 0);
  dh_stop(&d);
  return 0;
}
