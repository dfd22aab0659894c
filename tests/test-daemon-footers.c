/*
 * test-daemon-footers.c: the daemon's footer table, end to end.  Streams
 * over the same files hold one parse of each file's footer, whichever
 * columns they project and however many open at once; a changed file gets
 * a parse of its own; footer_memory bounds them all; nothing stays once
 * the streams close.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "daemon-harness.h"

/* Forty small files of 300 rows (row groups of 100): a dataset of many
 * shards, whose footers are most of what a stream over it holds. */
static const dh_spec many_spec = {40, 300, 0, 100, 0, 0, 0};
#define MANY_FILES 40
#define MANY_ROWS (MANY_FILES * 300)

static void many_opts(larder_stream_options_t *o, const char *const *source) {
  dh_opts(o, source, 64, 5, 1);
  o->unit_rows = 100;
  o->arena_bytes = 4u << 20;
}

/* Opens a stream on c with o and reads its first batch (the footers are
 * parsed by then, and the stream works). */
static larder_stream_t *open_one(larder_client_t *c, const larder_stream_options_t *o) {
  larder_stream_t *s;
  int rc = larder_stream_open(c, o, &s);
  if (rc) ASSERT_FAIL_("open: %s: %s", larder_strerror(rc), larder_client_last_error(c));
  larder_batch_t *b;
  ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
  ASSERT_GT(larder_batch_num_rows(b), 0);
  larder_batch_release(b);
  return s;
}

/* Waits until stat `key` of d reads want (a close reaches the daemon after
 * larder_stream_close returns). */
static void wait_stat(const dh_daemon *d, const char *key, uint64_t want) {
  uint64_t got = 0;
  for (int i = 0; i < 1000 * dh_slow(); i++) {
    got = dh_stat(d, key);
    if (got == want) return;
    usleep(10000);
  }
  ASSERT_FAIL_("stat %s is %llu, expected %llu", key, (unsigned long long)got,
               (unsigned long long)want);
}

/* One rank of a job: opens its stream, waits until every rank has opened
 * its own, then reads its share to the end. */
typedef struct rank_arg {
  const char *socket;
  larder_stream_options_t o;
  pthread_barrier_t *opened;
  int64_t rows; /* read; 0 when something failed */
} rank_arg_t;

static void *rank_thread(void *arg) {
  rank_arg_t *a = arg;
  larder_client_t *c = NULL;
  larder_stream_t *s = NULL;
  int ok = larder_client_connect(a->socket, &c) == 0 && larder_stream_open(c, &a->o, &s) == 0;
  pthread_barrier_wait(a->opened);
  larder_batch_t *b;
  int64_t rows = 0;
  int rc = 0;
  while (ok && (rc = larder_stream_next(s, 60000 * dh_slow(), &b)) == 0) {
    rows += larder_batch_num_rows(b);
    larder_batch_release(b);
  }
  if (ok && rc == LARDER_EEOF) a->rows = rows;
  if (s) larder_stream_close(s);
  if (c) larder_client_close(c);
  return NULL;
}

TEST_IMPL(daemon_footers_shared) {
  char dir[1024];
  ASSERT_EQ(dh_dataset(&many_spec, "footers-many", dir, sizeof(dir)), MANY_ROWS);
  const char *source[] = {dir};
  dh_daemon d;
  dh_init(&d, "footers", NULL);
  dh_start(&d);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));

  larder_stream_options_t o;
  many_opts(&o, source);
  larder_stream_t *a = open_one(c, &o);
  ASSERT_EQ(dh_stat(&d, "footer_files"), MANY_FILES);
  ASSERT_EQ(dh_stat(&d, "footers_parsed"), MANY_FILES);
  uint64_t bytes = dh_stat(&d, "footer_bytes");
  ASSERT_GT(bytes, 0);
  /* A small file's parse takes a few KiB, not the 64 KiB block each one
   * took before the blocks were sized to the footer. */
  ASSERT_LT(bytes / MANY_FILES, 16384);

  /* Another rank of the same job, and a job projecting other columns:
   * both take the parses there are. */
  larder_stream_options_t r1 = o;
  r1.rank = 1;
  r1.world_size = 2;
  larder_stream_t *b = open_one(c, &r1);
  const char *cols[] = {"name", "tags"};
  larder_stream_options_t other = o;
  other.columns = cols;
  other.num_columns = 2;
  larder_stream_t *p = open_one(c, &other);
  ASSERT_EQ(larder_stream_num_columns(p), 2);
  ASSERT_EQ(dh_stat(&d, "footer_files"), MANY_FILES);
  ASSERT_EQ(dh_stat(&d, "footers_parsed"), MANY_FILES);
  ASSERT_EQ(dh_stat(&d, "footers_shared"), 2 * MANY_FILES);
  ASSERT_EQ(dh_stat(&d, "footer_bytes"), bytes);

  /* They go with the last stream that reads them. */
  larder_stream_close(a);
  larder_stream_close(b);
  wait_stat(&d, "streams", 1);
  ASSERT_EQ(dh_stat(&d, "footer_files"), MANY_FILES);
  larder_stream_close(p);
  wait_stat(&d, "footer_files", 0);
  ASSERT_EQ(dh_stat(&d, "footer_bytes"), 0);

  /* Eight ranks opening at once, as torchrun starts them: each footer is
   * parsed once, and every rank reads its whole share.  The ranks keep
   * their streams until all have opened theirs: a rank that finished and
   * closed first would let the footers go, and a later one parse them
   * again (a CI run under ASan saw 80 parses, the ranks' opens spread out). */
  rank_arg_t ra[8];
  pthread_t th[8];
  pthread_barrier_t opened;
  ASSERT_OK(pthread_barrier_init(&opened, NULL, 8));
  uint64_t parsed = dh_stat(&d, "footers_parsed");
  for (int r = 0; r < 8; r++) {
    ra[r] = (rank_arg_t){d.socket, o, &opened, 0};
    ra[r].o.rank = r;
    ra[r].o.world_size = 8;
    ASSERT_OK(pthread_create(&th[r], NULL, rank_thread, &ra[r]));
  }
  int64_t rows = 0;
  for (int r = 0; r < 8; r++) {
    pthread_join(th[r], NULL);
    ASSERT_GT(ra[r].rows, 0);
    rows += ra[r].rows;
  }
  pthread_barrier_destroy(&opened);
  ASSERT_GE(rows, MANY_ROWS);
  ASSERT_EQ(dh_stat(&d, "footers_parsed") - parsed, MANY_FILES);
  wait_stat(&d, "footer_files", 0);

  larder_client_close(c);
  dh_stop(&d);
  return 0;
}

/* A file rewritten while a stream reads it: a new stream gets a parse of
 * the new version, the old stream keeps the old one, and each goes with
 * its stream. */
TEST_IMPL(daemon_footers_changed_file) {
  char dir[1024];
  ASSERT_EQ(dh_dataset(&many_spec, "footers-changed", dir, sizeof(dir)), MANY_ROWS);
  const char *source[] = {dir};
  dh_daemon d;
  dh_init(&d, "footers-changed", NULL);
  dh_start(&d);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_options_t o;
  many_opts(&o, source);
  larder_stream_t *a = open_one(c, &o);
  ASSERT_EQ(dh_stat(&d, "footer_files"), MANY_FILES);

  /* File 7, rewritten with other values: a new version of one file. */
  char path[1200], tmp[1300];
  snprintf(path, sizeof(path), "%s/part-%03d.parquet", dir, 7);
  ASSERT_EQ(access(path, R_OK), 0);
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  dh_spec changed = many_spec;
  changed.variant = 3;
  dh_write_file(&changed, 7, tmp);
  ASSERT_EQ(rename(tmp, path), 0);

  larder_stream_t *b = open_one(c, &o);
  ASSERT_EQ(dh_stat(&d, "footer_files"), MANY_FILES + 1);
  ASSERT_EQ(dh_stat(&d, "footers_parsed"), MANY_FILES + 1);
  larder_stream_close(a);
  wait_stat(&d, "footer_files", MANY_FILES);
  larder_stream_close(b);
  wait_stat(&d, "footer_files", 0);
  larder_client_close(c);
  dh_stop(&d);
  /* The dataset is shared with no other test, but leave it as written. */
  dh_write_file(&many_spec, 7, tmp);
  ASSERT_EQ(rename(tmp, path), 0);
  return 0;
}

/* footer_memory bounds the parses: an open that would pass it fails with
 * LARDER_ELIMIT and a message naming the setting, what it had parsed goes,
 * and the daemon and smaller opens carry on. */
TEST_IMPL(daemon_footers_limit) {
  char dir[1024];
  ASSERT_EQ(dh_dataset(&many_spec, "footers-limit", dir, sizeof(dir)), MANY_ROWS);
  const char *source[] = {dir};
  char one[1200];
  snprintf(one, sizeof(one), "%s/part-%03d.parquet", dir, 0);
  const char *one_source[] = {one};
  dh_daemon d;
  static const char *const fl[] = {"--footer_memory=32K", NULL};
  dh_init(&d, "footers-limit", fl);
  dh_start(&d);
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d.socket, &c));
  larder_stream_options_t o;
  many_opts(&o, source);
  larder_stream_t *s;
  ASSERT_EQ(larder_stream_open(c, &o, &s), LARDER_ELIMIT);
  ASSERT_STR_CONTAINS(larder_client_last_error(c), "footer_memory");
  wait_stat(&d, "footer_files", 0);
  ASSERT_EQ(dh_stat(&d, "footer_bytes"), 0);

  larder_stream_options_t small = o;
  small.sources = one_source;
  larder_stream_t *ok = open_one(c, &small);
  ASSERT_EQ(dh_stat(&d, "footer_files"), 1);
  larder_stream_close(ok);
  wait_stat(&d, "footer_files", 0);
  larder_client_close(c);
  ASSERT(dh_alive(&d));
  dh_stop(&d);
  return 0;
}
