/*
 * test-order-auto.c: shuffle_row_groups = auto (daemon/plan/clustered.h).
 * The verdict from the statistics of files DuckDB and arrow-rs wrote, the
 * same rows in different orders (tests/gen/order-data.mjs); then, against
 * the real daemon, that auto serves the order of the setting it chose,
 * and that the stream's open note and larderctl clients say which and why.
 */
#include <limits.h>
#include <unistd.h>

#include "plan/clustered.h"
#include "plan/dataset.h"
#include "daemon-harness.h"
#include "pqwrite.h"
#include "test-ctl-common.h"

/* The files, made once per work directory; -1 without node and DuckDB. */
static int order_data(char *dir, size_t dirlen) {
  snprintf(dir, dirlen, "%s/order-data", dh_work_dir());
  char stamp[PATH_MAX];
  snprintf(stamp, sizeof(stamp), "%s/.done-3", dir); /* bumped when order-data.mjs changes */
  if (access(stamp, F_OK) == 0) return 0;
  if (test_system("command -v node >/dev/null 2>&1 && test -d tests/node_modules/@duckdb") != 0)
    return -1;
  if (test_system("rm -rf '%s' && node tests/gen/order-data.mjs '%s' >/dev/null && touch '%s'", dir,
                  dir, stamp) != 0)
    return -1;
  return 0;
}

/* dataset_open's verdict on dir/file read with columns (NULL: all). */
static clustered_verdict_t verdict(const char *dir, const char *file, const char *const *columns,
                                   size_t ncols) {
  char path[PATH_MAX + 64];
  if (file) snprintf(path, sizeof(path), "%s/%s", dir, file);
  else snprintf(path, sizeof(path), "%s", dir);
  const char *src[1] = {path};
  dataset_options_t dopts;
  memset(&dopts, 0, sizeof(dopts));
  dopts.unit_rows = 256;
  dopts.unit_bytes = 4u << 20;
  pq_options_init(&dopts.pq);
  dataset_t *ds = NULL;
  char err[600];
  int rc = dataset_open(src, 1, columns, ncols, &dopts, &ds, err, sizeof(err));
  if (rc) ASSERT_FAIL_("dataset_open %s: %s", path, err);
  clustered_verdict_t v = ds->order;
  dataset_free(ds);
  return v;
}

#define EXPECT_TOGETHER(v)                                         \
  do {                                                             \
    if (!(v).together) ASSERT_FAIL_("not together: %s", (v).note); \
    ASSERT_STR_CONTAINS((v).note, "row groups kept together");     \
  } while (0)

#define EXPECT_SINGLY(v, why)                                 \
  do {                                                        \
    if ((v).together) ASSERT_FAIL_("together: %s", (v).note); \
    ASSERT_STR_CONTAINS((v).note, "units mixed singly");      \
    ASSERT_STR_CONTAINS((v).note, why);                       \
  } while (0)

TEST_IMPL(order_auto_verdicts) {
  char dir[PATH_MAX];
  if (order_data(dir, sizeof(dir)) != 0) {
    fprintf(stderr, "node or @duckdb/node-api is missing\n");
    return TEST_SKIP;
  }
  static const char *const cls_x[] = {"cls", "x"};
  static const char *const dec_x[] = {"dec", "x"};
  static const char *const flag_x[] = {"flag", "x"};
  static const char *const x_only[] = {"x"};
  /* Rows in no order: every column's row groups overlap. */
  EXPECT_TOGETHER(verdict(dir, "random.parquet", NULL, 0));
  EXPECT_TOGETHER(verdict(dir, "arrow-random.parquet", NULL, 0));
  /* The signed order of a DECIMAL stored as 16 bytes: negative values
   * compared as unsigned bytes would put every minimum above its maximum. */
  EXPECT_TOGETHER(verdict(dir, "random.parquet", dec_x, 2));
  /* Sorted by an integer label, a string label, a boolean, a decimal, the
   * row number: by both writers, whichever column the trainer reads. */
  EXPECT_SINGLY(verdict(dir, "by-label.parquet", NULL, 0), "column 'label'");
  EXPECT_SINGLY(verdict(dir, "by-label.parquet", x_only, 1), "column 'label'");
  EXPECT_SINGLY(verdict(dir, "arrow-by-label.parquet", NULL, 0), "column 'label'");
  EXPECT_SINGLY(verdict(dir, "by-cls.parquet", cls_x, 2), "column 'cls'");
  EXPECT_SINGLY(verdict(dir, "by-flag.parquet", flag_x, 2), "column 'flag'");
  EXPECT_SINGLY(verdict(dir, "by-dec.parquet", dec_x, 2), "column 'dec'");
  EXPECT_SINGLY(verdict(dir, "by-id.parquet", NULL, 0), "column 'id'");
  /* A directory of files: the row groups of all of them together. */
  clustered_verdict_t v = verdict(dir, "split-random", NULL, 0);
  EXPECT_TOGETHER(v);
  ASSERT_STR_CONTAINS(v.note, "over 10 row groups");
  EXPECT_SINGLY(verdict(dir, "split-by-label", NULL, 0), "column 'label'");
  /* Files without statistics (the tests' own writer): nothing says the
   * rows are in no order. */
  EXPECT_SINGLY(verdict(dh_std_dir(), NULL, NULL, 0), "no statistics");
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Statistics as a hostile or unusual writer leaves them                     */

#define HOSTILE_RGS 8

typedef struct stat_case {
  int fields; /* PQW_STAT_*; 0: none */
  int32_t min, max;
  size_t min_len, max_len; /* 0: 4 */
  int64_t null_count;
  int no_min, no_max;
} stat_case;

/* A file of one required INT32 column "a" in nrg row groups of 2 rows,
 * row group g's statistics as st(g) says; returns clustered_check's verdict
 * on it. */
static clustered_verdict_t stats_verdict(int nrg, stat_case (*st)(int g, int nrg)) {
  static const pqw_schema schema[] = {
      {"schema", -1, -1, 1, -1, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0},
      {"a", PQ_INT32, PQ_REQUIRED, -1, -1, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0}};
  pqw_file f;
  pqw_file_init(&f, schema, 2);
  int32_t v[2] = {1, 2};
  pqw_values vals;
  memset(&vals, 0, sizeof(vals));
  vals.physical = PQ_INT32;
  vals.fixed = v;
  vals.count = 2;
  pqw_levels lv = {2, NULL, NULL, 0, 0};
  pqw_chunk_opts o = {0};
  stat_case *cases = calloc((size_t)nrg, sizeof(*cases));
  uint8_t(*bytes)[2][40] = calloc((size_t)nrg, sizeof(*bytes));
  ASSERT(cases && bytes);
  for (int g = 0; g < nrg; g++) {
    pqw_chunk c;
    pqw_chunk_build(&c, &vals, &lv, &o);
    pqw_file_add_row_group(&f, 2, &c, 1);
    pqw_chunk_free(&c);
    cases[g] = st(g, nrg);
    pqw_colmeta *m = &f.rg[g].cols[0];
    m->stat_fields = cases[g].fields;
    m->stat_null_count = cases[g].null_count;
    memcpy(bytes[g][0], &cases[g].min, 4);
    memcpy(bytes[g][1], &cases[g].max, 4);
    if (!cases[g].no_min) m->stat_min = bytes[g][0];
    if (!cases[g].no_max) m->stat_max = bytes[g][1];
    m->stat_min_len = cases[g].min_len ? cases[g].min_len : 4;
    m->stat_max_len = cases[g].max_len ? cases[g].max_len : 4;
  }
  size_t len;
  uint8_t *file = pqw_file_finish(&f, &len);
  pq_source src;
  pq_source_init_memory(&src, file, len, "stats.parquet");
  pq_file *pf;
  pq_error err;
  memset(&err, 0, sizeof(err));
  ASSERT_OK(pq_file_open(&src, NULL, &pf, &err));
  pq_projection *proj;
  ASSERT_OK(pq_projection_create(pf, NULL, 0, &proj, &err));
  const pq_file *files[1] = {pf};
  const pq_projection *projs[1] = {proj};
  clustered_verdict_t out;
  ASSERT_OK(clustered_check(files, projs, 1, &out));
  pq_projection_free(proj);
  pq_file_close(pf);
  free(file);
  free(cases);
  free(bytes);
  return out;
}

/* Every row group spans about -1000 .. 1000: rows in no order. */
static stat_case st_spread(int g, int nrg) {
  (void)nrg;
  return (stat_case){PQW_STAT_VALUES, -1000 + g % 100, 1000 - g % 100, 0, 0, 0, 0, 0};
}
/* Row group g holds [10g, 10g + 9]: sorted. */
static stat_case st_sorted(int g, int nrg) {
  (void)nrg;
  return (stat_case){PQW_STAT_VALUES, 10 * g, 10 * g + 9, 0, 0, 0, 0, 0};
}
/* Sorted, in the deprecated fields only (signed order: usable for INT32). */
static stat_case st_sorted_legacy(int g, int nrg) {
  stat_case c = st_sorted(g, nrg);
  c.fields = PQW_STAT_LEGACY;
  return c;
}
/* Sorted in the deprecated fields, spread in the current ones: the current
 * ones win. */
static stat_case st_both(int g, int nrg) {
  stat_case c = st_spread(g, nrg);
  c.fields = PQW_STAT_VALUES | PQW_STAT_LEGACY;
  return c;
}
/* Spread, but the middle row group says nothing. */
static stat_case st_missing(int g, int nrg) {
  stat_case c = st_spread(g, nrg);
  if (g == nrg / 2) c.fields = 0;
  return c;
}
/* Spread, and the middle row group holds only nulls (no min, no max). */
static stat_case st_all_null(int g, int nrg) {
  stat_case c = st_spread(g, nrg);
  if (g == nrg / 2) {
    c.no_min = c.no_max = 1;
    c.null_count = 2;
  }
  return c;
}
/* Spread, but one row group's minimum is above its maximum. */
static stat_case st_inverted(int g, int nrg) {
  stat_case c = st_spread(g, nrg);
  if (g == nrg - 1) c.min = 5000;
  return c;
}
/* Spread, but one row group's values are 3 bytes and 40 bytes long. */
static stat_case st_bad_len(int g, int nrg) {
  stat_case c = st_spread(g, nrg);
  if (g == 1) c.min_len = 3;
  if (g == 2) c.max_len = 40;
  return c;
}
/* A binary label sorted: the first half 0, the second 1. */
static stat_case st_binary(int g, int nrg) {
  int v = g >= nrg / 2;
  return (stat_case){PQW_STAT_VALUES, v, v, 0, 0, 0, 0, 0};
}

TEST_IMPL(order_auto_hostile_stats) {
  clustered_verdict_t v;
  EXPECT_TOGETHER(stats_verdict(HOSTILE_RGS, st_spread));
  EXPECT_SINGLY(stats_verdict(HOSTILE_RGS, st_sorted), "column 'a'");
  EXPECT_SINGLY(stats_verdict(HOSTILE_RGS, st_sorted_legacy), "column 'a'");
  EXPECT_TOGETHER(stats_verdict(HOSTILE_RGS, st_both));
  EXPECT_SINGLY(stats_verdict(HOSTILE_RGS, st_missing), "no statistics");
  EXPECT_TOGETHER(stats_verdict(HOSTILE_RGS, st_all_null));
  EXPECT_SINGLY(stats_verdict(HOSTILE_RGS, st_inverted), "malformed");
  EXPECT_SINGLY(stats_verdict(HOSTILE_RGS, st_bad_len), "malformed");
  EXPECT_SINGLY(stats_verdict(HOSTILE_RGS, st_binary), "column 'a'");
  /* One row group: nothing to keep apart, and nothing to say. */
  v = stats_verdict(1, st_sorted);
  ASSERT(v.together);
  ASSERT_STR_EQ(v.note, "");
  /* More row groups than are examined: an even sample still sees the sort,
   * and still sees rows in no order as such. */
  v = stats_verdict(CLUSTERED_MAX_ROW_GROUPS + 1000, st_sorted);
  EXPECT_SINGLY(v, "column 'a'");
  v = stats_verdict(CLUSTERED_MAX_ROW_GROUPS + 1000, st_spread);
  EXPECT_TOGETHER(v);
  char want[64];
  snprintf(want, sizeof(want), "over %d row groups", CLUSTERED_MAX_ROW_GROUPS);
  ASSERT_STR_CONTAINS(v.note, want);
  return 0;
}

/* The ids of a run, epoch 0, in order. */
static int same_order(const dh_run *a, const dh_run *b) {
  if (a->n != b->n) return 0;
  for (size_t i = 0; i < a->n; i++)
    if (a->b[i].hash != b->b[i].hash) return 0;
  return 1;
}

/* Opens a stream with o, checks its note, and checks what larderctl
 * clients says of it (human and JSON) while it is open. */
static void expect_note(const dh_daemon *d, const larder_stream_options_t *o, const char *note,
                        const char *human, const char *json) {
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d->socket, &c));
  larder_stream_t *s;
  ASSERT_OK(larder_stream_open(c, o, &s));
  ASSERT_STR_CONTAINS(larder_stream_note(s), note);
  tc_out r;
  tc_ctl(&r, NULL, d->socket, "clients", NULL);
  if (r.status != 0) tc_out_print("clients", &r);
  ASSERT_EQ(r.status, 0);
  ASSERT_STR_CONTAINS(r.out, human);
  tc_out_free(&r);
  tc_ctl(&r, NULL, d->socket, "clients", "--json", NULL);
  ASSERT_EQ(r.status, 0);
  ASSERT(tc_json_valid(r.out));
  ASSERT_STR_CONTAINS(r.out, json);
  tc_out_free(&r);
  larder_stream_close(s);
  larder_client_close(c);
}

TEST_IMPL(order_auto_daemon) {
  char dir[PATH_MAX];
  if (order_data(dir, sizeof(dir)) != 0) {
    fprintf(stderr, "node or @duckdb/node-api is missing\n");
    return TEST_SKIP;
  }
  char random[PATH_MAX + 32], by_label[PATH_MAX + 32];
  snprintf(random, sizeof(random), "%s/random.parquet", dir);
  snprintf(by_label, sizeof(by_label), "%s/by-label.parquet", dir);
  const char *src_random[1] = {random}, *src_label[1] = {by_label};
  static const char *const f_auto[] = {"--unit_rows=256", NULL};
  static const char *const f_true[] = {"--unit_rows=256", "--shuffle_row_groups=true", NULL};
  static const char *const f_false[] = {"--unit_rows=256", "--shuffle_row_groups=false", NULL};
  dh_daemon da, dt, df;
  dh_init(&da, "auto", f_auto);
  dh_init(&dt, "true", f_true);
  dh_init(&df, "false", f_false);
  dh_start(&da);
  dh_start(&dt);
  dh_start(&df);
  /* Windows of 16 units: two row groups of 8 when they stay together. */
  larder_stream_options_t o;
  for (int k = 0; k < 2; k++) {
    dh_opts(&o, k == 0 ? src_random : src_label, 128, 11, 1);
    o.shuffle_window = 16;
    o.arena_bytes = 8u << 20;
    dh_run a = {0}, t = {0}, f = {0};
    ASSERT_OK(dh_collect(da.socket, &o, 0, &a));
    ASSERT_OK(dh_collect(dt.socket, &o, 0, &t));
    ASSERT_OK(dh_collect(df.socket, &o, 0, &f));
    ASSERT_EQ(a.n, 160);
    ASSERT(!same_order(&t, &f)); /* the two settings differ here */
    if (k == 0) {
      dh_expect_same(&a, &t);
      expect_note(&da, &o, "row groups kept together", "row groups together (auto)",
                  "\"order\":\"row_groups\",\"order_auto\":true");
    } else {
      dh_expect_same(&a, &f);
      expect_note(&da, &o, "sorted or grouped by column 'label'", "units mixed singly (auto)",
                  "\"order\":\"units\",\"order_auto\":true");
    }
    /* Set explicitly, the setting is followed and nothing is explained. */
    expect_note(&dt, &o, "", "row groups together ·",
                "\"order\":\"row_groups\",\"order_auto\":false");
    expect_note(&df, &o, "", "units mixed singly ·", "\"order\":\"units\",\"order_auto\":false");
    dh_run_free(&a);
    dh_run_free(&t);
    dh_run_free(&f);
  }
  /* Without shuffle nothing is chosen. */
  dh_opts(&o, src_random, 128, 11, 1);
  o.shuffle = 0;
  expect_note(&da, &o, "", "stream", "\"order\":\"dataset\"");
  dh_stop(&da);
  dh_stop(&dt);
  dh_stop(&df);
  return 0;
}
