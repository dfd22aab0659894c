/*
 * test-daemon-values.c: a stream serves exactly the values the decoder
 * reads, row for row, whatever path assembled them.  The daemon builds
 * batches from row blocks (fixed-width columns, BOOL, BINARY and STRING
 * values inline or left in their blob past the inline limit, lists of
 * fixed-width values inline or, in units with null elements or long lists,
 * gathered from the blob) and from column blobs for everything else; each
 * served row is rendered as JSON and compared with the decoder's rendering
 * of the same row.  Files: DuckDB-written ones that cover each case
 * (tests/gen/rows-data.mjs) and every conformance file of parquet-testing
 * that the decoder reads.
 */
#include <dirent.h>
#include <limits.h>
#include <unistd.h>

#include "parquet/parquet.h"
#include "daemon-harness.h"

/* The decoder's rows of a file as JSON lines; returns the count, or -1 when
 * the decoder refuses the file (not this test's business). */
static int64_t decoder_rows(const char *path, char ***rows_out) {
  pq_error err = {0, ""};
  pq_source src;
  *rows_out = NULL;
  if (pq_source_open_file(&src, path, &err) != 0) return -1;
  pq_file *f = NULL;
  pq_projection *p = NULL;
  pq_batch_t b;
  pq_batch_init(&b);
  pq_strbuf_t sb = {0};
  char **rows = NULL;
  int64_t n = 0, cap = 0;
  int rc = pq_file_open(&src, NULL, &f, &err);
  if (rc == 0) rc = pq_projection_create(f, NULL, 0, &p, &err);
  for (int g = 0; rc == 0 && g < pq_file_meta(f)->num_row_groups; g++) {
    pq_reader *r = NULL;
    rc = pq_reader_open(f, &src, p, g, NULL, &r, &err);
    while (rc == 0) {
      int64_t got = pq_reader_next(r, 1000, &b, &err);
      if (got < 0) rc = (int)got;
      if (got <= 0) break;
      for (int64_t i = 0; i < got; i++) {
        sb.len = 0;
        ASSERT_OK(pq_json_append_row(&sb, &b, i));
        if (n == cap) {
          cap = cap ? cap * 2 : 1024;
          rows = realloc(rows, (size_t)cap * sizeof(char *));
          ASSERT_NOT_NULL(rows);
        }
        rows[n++] = strndup(sb.data, sb.len);
      }
    }
    pq_reader_close(r);
  }
  pq_strbuf_free(&sb);
  pq_batch_free(&b);
  pq_projection_free(p);
  pq_file_close(f);
  pq_source_close_file(&src);
  if (rc != 0) {
    for (int64_t i = 0; i < n; i++) free(rows[i]);
    free(rows);
    return -1;
  }
  *rows_out = rows;
  return n;
}

/* A served array as the decoder's pq_array_t (pointing into the arena), so
 * that the decoder's JSON renders it. */
static void as_pq_array(const larder_array_t *a, pq_array_t *out) {
  memset(out, 0, sizeof(*out));
  out->length = larder_array_length(a);
  out->null_count = larder_array_null_count(a);
  out->validity.data = (uint8_t *)larder_array_validity(a);
  out->validity.len = out->validity.data ? (size_t)(out->length + 7) / 8 : 0;
  out->offsets.data = (uint8_t *)larder_array_offsets(a);
  out->values.data = (uint8_t *)larder_array_values(a);
  out->values.len = larder_array_values_size(a);
  out->num_children = larder_array_num_children(a);
  if (out->num_children) {
    out->children = calloc((size_t)out->num_children, sizeof(pq_array_t));
    ASSERT_NOT_NULL(out->children);
    for (int i = 0; i < out->num_children; i++)
      as_pq_array(larder_array_child(a, i), &out->children[i]);
  }
}

static void set_fields(pq_array_t *a, const pq_field_t *f) {
  a->field = f;
  ASSERT_EQ(a->num_children, f->num_children);
  for (int i = 0; i < a->num_children; i++) set_fields(&a->children[i], &f->children[i]);
}

static void free_pq_array(pq_array_t *a) {
  for (int i = 0; i < a->num_children; i++) free_pq_array(&a->children[i]);
  free(a->children);
}

/* The schema the decoder serves the file as (the stream's must match). */
static pq_projection *file_projection(const char *path, pq_source *src, pq_file **f) {
  pq_error err = {0, ""};
  ASSERT_OK(pq_source_open_file(src, path, &err));
  ASSERT_OK(pq_file_open(src, NULL, f, &err));
  pq_projection *p = NULL;
  ASSERT_OK(pq_projection_create(*f, NULL, 0, &p, &err));
  return p;
}

/* Fails with the first difference between the decoder's row and the
 * served one, and a window of text around it. */
static void expect_same_row(const char *path, int64_t k, const char *want, const char *got,
                            size_t len) {
  size_t i = 0, wl = strlen(want);
  while (i < len && i < wl && want[i] == got[i]) i++;
  if (i == len && i == wl) return;
  size_t from = i > 100 ? i - 100 : 0;
  char *served = strndup(got, len); /* the renderer's buffer has no NUL */
  ASSERT_FAIL_("%s row %lld differs at byte %zu:\n  served  ...%.200s\n  decoder ...%.200s", path,
               (long long)k, i, served + from, want + from);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/*
 * Streams the file through the daemon and checks every served row: in
 * order (shuffle off) row k of the epoch is the decoder's row k; shuffled,
 * every decoder row is served and every served row is a decoder row (the
 * padding of the last batch repeats rows).  Returns the rows checked.
 */
static int64_t check_file(const dh_daemon *d, const char *path, char **want, int64_t n, int shuffle,
                          uint32_t batch, uint32_t unit_rows) {
  pq_source src;
  pq_file *f = NULL;
  pq_projection *proj = file_projection(path, &src, &f);
  const pq_field_t *schema = pq_projection_schema(proj);
  const char *sources[1] = {path};
  larder_stream_options_t o;
  dh_opts(&o, sources, batch, 7, 1);
  o.shuffle = shuffle;
  o.unit_rows = unit_rows;
  o.shuffle_window = 3;
  o.arena_bytes = 64u << 20;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d->socket, &c));
  larder_stream_t *s;
  if (larder_stream_open(c, &o, &s) != 0)
    ASSERT_FAIL_("%s: the decoder reads it, the daemon does not: %s", path,
                 larder_client_last_error(c));
  char **got = NULL;
  int64_t num_got = 0, cap = 0;
  pq_strbuf_t sb = {0};
  larder_batch_t *b;
  int rc;
  while ((rc = larder_stream_next(s, 60000 * dh_slow(), &b)) == 0) {
    pq_batch_t pb;
    memset(&pb, 0, sizeof(pb));
    pb.schema = schema;
    pb.num_rows = larder_batch_num_rows(b);
    pb.num_columns = larder_batch_num_columns(b);
    ASSERT_EQ(pb.num_columns, schema->num_children);
    pb.columns = calloc((size_t)pb.num_columns, sizeof(pq_array_t));
    ASSERT_NOT_NULL(pb.columns);
    for (int i = 0; i < pb.num_columns; i++) {
      as_pq_array(larder_batch_column(b, i), &pb.columns[i]);
      set_fields(&pb.columns[i], &schema->children[i]);
      ASSERT_EQ(pb.columns[i].length, pb.num_rows);
    }
    for (int64_t i = 0; i < pb.num_rows; i++) {
      sb.len = 0;
      ASSERT_OK(pq_json_append_row(&sb, &pb, i));
      if (!shuffle && num_got < n) expect_same_row(path, num_got, want[num_got], sb.data, sb.len);
      if (num_got == cap) {
        cap = cap ? cap * 2 : 1024;
        got = realloc(got, (size_t)cap * sizeof(char *));
        ASSERT_NOT_NULL(got);
      }
      got[num_got++] = strndup(sb.data, sb.len);
    }
    for (int i = 0; i < pb.num_columns; i++) free_pq_array(&pb.columns[i]);
    free(pb.columns);
    larder_batch_release(b);
  }
  if (rc != LARDER_EEOF)
    ASSERT_FAIL_("%s: the stream failed after %lld rows: %s", path, (long long)num_got,
                 larder_client_last_error(c));
  ASSERT(num_got >= n);
  if (shuffle) {
    char **w = malloc((size_t)(n ? n : 1) * sizeof(char *));
    ASSERT_NOT_NULL(w);
    memcpy(w, want, (size_t)n * sizeof(char *));
    qsort(w, (size_t)n, sizeof(char *), cmp_str);
    qsort(got, (size_t)num_got, sizeof(char *), cmp_str);
    int64_t j = 0;
    for (int64_t i = 0; i < num_got; i++) {
      while (j < n && strcmp(w[j], got[i]) < 0) {
        ASSERT_FAIL_("%s: the decoder's row %s was not served", path, w[j]);
      }
      if (j >= n || strcmp(w[j], got[i]) != 0) {
        /* A repeat (padding) of the row served just before. */
        if (i == 0 || strcmp(got[i - 1], got[i]) != 0)
          ASSERT_FAIL_("%s: served a row the decoder does not have: %.600s", path, got[i]);
        continue;
      }
      j++;
    }
    if (j != n) ASSERT_FAIL_("%s: %lld decoder rows were not served", path, (long long)(n - j));
    free(w);
  }
  for (int64_t i = 0; i < num_got; i++) free(got[i]);
  free(got);
  pq_strbuf_free(&sb);
  larder_stream_close(s);
  larder_client_close(c);
  pq_projection_free(proj);
  pq_file_close(f);
  pq_source_close_file(&src);
  return num_got;
}

static int rows_dataset(char *dir, size_t dirlen) {
  snprintf(dir, dirlen, "%s/rows-data", dh_work_dir());
  char stamp[PATH_MAX];
  snprintf(stamp, sizeof(stamp), "%s/.done-4", dir); /* bumped when rows-data.mjs changes */
  if (access(stamp, F_OK) == 0) return 0;
  if (test_system("command -v node >/dev/null 2>&1 && test -d tests/node_modules/@duckdb") != 0)
    return -1;
  if (test_system("rm -rf '%s' && node tests/gen/rows-data.mjs '%s' >/dev/null && touch '%s'", dir,
                  dir, stamp) != 0)
    return -1;
  return 0;
}

static void free_rows(char **rows, int64_t n) {
  for (int64_t i = 0; i < n; i++) free(rows[i]);
  free(rows);
}

/*
 * The DuckDB files that cover each row-block case, in order and shuffled,
 * with units small enough that batches mix units that inline a list with
 * units that cannot, and a cold and a warm (cached) pass.
 */
TEST_IMPL(daemon_values_row_blocks) {
  char dir[1024];
  if (rows_dataset(dir, sizeof(dir)) != 0) {
    fprintf(stderr, "node or @duckdb/node-api is missing\n");
    return TEST_SKIP;
  }
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  static const char *const files[] = {"mixed.parquet", "uniform.parquet"};
  for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
    char **want;
    int64_t n = decoder_rows(path, &want);
    ASSERT(n > 0);
    for (int pass = 0; pass < 2; pass++) {
      check_file(&d, path, want, n, 0, 100, 256);
      check_file(&d, path, want, n, 1, 64, 256);
    }
    check_file(&d, path, want, n, 1, 1000, 1000);
    free_rows(want, n);
  }
  /* Row blocks past 1 MiB, whose units are cut evenly from one row group
   * and whose rows take about 600 bytes: in wide.parquet, 2.5 MiB (a huge
   * page and a tail of small pages) and 1.7 MiB (small pages); in
   * wide-fit.parquet, 3.9 and 1.95 MiB (rounded up to whole huge pages). */
  static const struct {
    const char *file;
    int64_t rows;
    uint32_t unit_rows[2];
  } wide[] = {{"wide.parquet", 8192, {4096, 3000}}, {"wide-fit.parquet", 6400, {6400, 3200}}};
  for (size_t i = 0; i < sizeof(wide) / sizeof(wide[0]); i++) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, wide[i].file);
    char **want;
    int64_t n = decoder_rows(path, &want);
    ASSERT_EQ(n, wide[i].rows);
    for (int pass = 0; pass < 2; pass++) {
      check_file(&d, path, want, n, 0, 500, wide[i].unit_rows[0]);
      check_file(&d, path, want, n, 1, 256, wide[i].unit_rows[1]);
    }
    free_rows(want, n);
  }
  ASSERT_EQ(dh_stat(&d, "stream_errors"), 0);
  dh_stop(&d);
  return 0;
}

/* Reads a stream of dict.parquet to its end (2 epochs, shuffled, batches of
 * 8); checks every row's string (1,000,000 times the letter of id % 3) and
 * that each epoch serves each of the 240 ids once.  Returns 0 or the error
 * that ended the stream (its message in err). */
static int read_dict_stream(const dh_daemon *d, const char *path, uint32_t unit_rows, char *err,
                            size_t errlen) {
  const char *sources[1] = {path};
  larder_stream_options_t o;
  dh_opts(&o, sources, 8, 11, 2);
  o.unit_rows = unit_rows;
  o.arena_bytes = 256u << 20;
  larder_client_t *c;
  ASSERT_OK(larder_client_connect(d->socket, &c));
  larder_stream_t *s;
  int rc = larder_stream_open(c, &o, &s);
  if (rc) {
    snprintf(err, errlen, "%s", larder_client_last_error(c));
    larder_client_close(c);
    return rc;
  }
  static char letters[3][1000000];
  for (int k = 0; k < 3; k++) memset(letters[k], 'a' + k, sizeof(letters[k]));
  int seen[2][240] = {{0}};
  larder_batch_t *b;
  while ((rc = larder_stream_next(s, 120000 * dh_slow(), &b)) == 0) {
    const larder_array_t *id = larder_batch_column_by_name(b, "id");
    const larder_array_t *big = larder_batch_column_by_name(b, "big");
    ASSERT_NOT_NULL(id);
    ASSERT_NOT_NULL(big);
    const int64_t *ids = larder_array_values(id);
    const int32_t *off = larder_array_offsets(big);
    const char *chars = larder_array_values(big);
    for (int64_t i = 0; i < larder_batch_num_rows(b); i++) {
      ASSERT(ids[i] >= 0 && ids[i] < 240);
      ASSERT_EQ(off[i + 1] - off[i], 1000000);
      ASSERT(memcmp(chars + off[i], letters[ids[i] % 3], 1000000) == 0);
      ASSERT(larder_batch_epoch(b) < 2);
      seen[larder_batch_epoch(b)][ids[i]]++;
    }
    larder_batch_release(b);
  }
  if (rc != LARDER_EEOF) {
    snprintf(err, errlen, "%s", larder_client_last_error(c));
  } else {
    rc = 0;
    for (int e = 0; e < 2; e++)
      for (int i = 0; i < 240; i++) ASSERT_EQ(seen[e][i], 1);
  }
  larder_stream_close(s);
  larder_client_close(c);
  return rc;
}

/*
 * A file whose dictionary makes a few KB decode to 240 MB: the daemon cuts
 * units from the footer's sizes, which say 3 MB.  With max_chunk_decoded_
 * bytes at 128 MiB, units of 64 rows (the least a stream may ask; the row
 * group is cut into 4 of 60 rows, 60 MB each) are served, although the row
 * group decodes to almost twice the ceiling: a unit deep in the row group
 * steps over the rows before it without gathering their values, and a load
 * that decodes units ahead for the cache stops at the ceiling rather than
 * failing the unit it was for (both used to fail the stream).  A unit of
 * the whole row group fails, with an error that names unit_rows.
 */
TEST_IMPL(daemon_values_dictionary_units) {
  char dir[1024];
  if (rows_dataset(dir, sizeof(dir)) != 0) {
    fprintf(stderr, "node or @duckdb/node-api is missing\n");
    return TEST_SKIP;
  }
  char path[PATH_MAX];
  snprintf(path, sizeof(path), "%s/dict.parquet", dir);
  static const char *const flags[] = {"--max_chunk_decoded_bytes=128M", "--memory_limit=1G", NULL};
  dh_daemon d;
  dh_init(&d, "d", flags);
  dh_start(&d);
  char err[1024] = "";
  int rc = read_dict_stream(&d, path, 64, err, sizeof(err));
  if (rc) ASSERT_FAIL_("units of 64 rows: %s", err);
  /* Again, now that the cache holds what the loads decoded. */
  rc = read_dict_stream(&d, path, 64, err, sizeof(err));
  if (rc) ASSERT_FAIL_("units of 64 rows, cached: %s", err);
  ASSERT_EQ(dh_stat(&d, "stream_errors"), 0);
  rc = read_dict_stream(&d, path, 0, err, sizeof(err));
  ASSERT_EQ(rc, LARDER_ELIMIT);
  if (strstr(err, "unit_rows") == NULL || strstr(err, "row group 0") == NULL)
    ASSERT_FAIL_("the error does not say what to change: %s", err);
  dh_stop(&d);
  return 0;
}

/* Every conformance file the decoder reads is served as the decoder reads
 * it. */
TEST_IMPL(daemon_values_conformance) {
  char dir[1024];
  snprintf(dir, sizeof(dir), "%s/parquet-testing/data", test_data_dir());
  DIR *dd = opendir(dir);
  ASSERT_NOT_NULL(dd);
  char **names = NULL;
  size_t num = 0;
  struct dirent *e;
  while ((e = readdir(dd)) != NULL) {
    size_t len = strlen(e->d_name);
    if (len < 8 || strcmp(e->d_name + len - 8, ".parquet") != 0) continue;
    names = realloc(names, (num + 1) * sizeof(char *));
    ASSERT_NOT_NULL(names);
    names[num++] = strdup(e->d_name);
  }
  closedir(dd);
  qsort(names, num, sizeof(char *), cmp_str);
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  int checked = 0;
  for (size_t i = 0; i < num; i++) {
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    char **want;
    int64_t n = decoder_rows(path, &want);
    if (n > 0) {
      check_file(&d, path, want, n, 0, 7, 16);
      check_file(&d, path, want, n, 1, 5, 16);
      checked++;
    }
    if (n >= 0) free_rows(want, n);
    free(names[i]);
  }
  free(names);
  fprintf(stderr, "%d conformance files served as decoded\n", checked);
  ASSERT(checked >= 30);
  ASSERT_EQ(dh_stat(&d, "stream_errors"), 0);
  dh_stop(&d);
  return 0;
}
