/*
 * test-parquet-hostile.c: the Parquet reader against hostile input.
 *
 * Conventions
 * -----------
 * - Every input is made here with tests/pqwrite.c (or cut from one) and read
 *   from memory; some variants go through a source without map() so that
 *   the read-ahead path is covered too.
 * - A hostile input must give a clean error: the right LARDER_* code and a
 *   message that names the file (HOSTILE_NAME), the column where one
 *   applies, and what was wrong.  It must never crash, hang or allocate in
 *   proportion to a size the input merely claims; these tests run under
 *   ASan and UBSan too.
 * - "Never allocates what it claims" is checked two ways: under ASan an
 *   allocation hook records the largest single request; elsewhere the
 *   address space is capped (RLIMIT_AS) so that such a request fails,
 *   which turns into LARDER_ENOMEM and fails the code check.
 * - Random variants (bit flips, overwrites) use fixed seeds and assert only
 *   that the reader survives: success, or a negative code with a message.
 */
#include <dirent.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parquet/pq_internal.h"
#include "pqwrite.h"
#include "task.h"

#define HOSTILE_NAME "hostile.parquet"
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

#if defined(__SANITIZE_ADDRESS__)
#define HOSTILE_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HOSTILE_ASAN 1
#endif
#endif

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */

static uint64_t rng_state = 1;

static void rnd_seed(uint64_t s) { rng_state = s; }

static uint64_t rnd64(void) { /* splitmix64 */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static uint32_t rnd_below(uint32_t n) { return n ? (uint32_t)(rnd64() % n) : 0; }

/* A source without map(), so that the reader copies through its buffers. */
static int plain_read(const pq_source *src, uint64_t off, size_t len, void *buf) {
  if (off > src->size || len > src->size - off) return LARDER_ECORRUPT;
  if (len) memcpy(buf, (const uint8_t *)src->ctx + off, len);
  return 0;
}

static void init_source(pq_source *src, const uint8_t *data, size_t len, int no_map) {
  pq_source_init_memory(src, data, len, HOSTILE_NAME);
  if (no_map) {
    src->map = NULL;
    src->read = plain_read;
  }
}

/* Opens and reads every row group of a file in memory, rendering every row
 * as JSON.  Returns 0 or the first error (err filled); *rows counts the
 * rows read. */
static int read_all_ex(const uint8_t *data, size_t len, const pq_options *opts, int64_t batch,
                       int no_map, pq_error *err, int64_t *rows) {
  pq_source src;
  init_source(&src, data, len, no_map);
  pq_file *f = NULL;
  pq_projection *p = NULL;
  pq_batch_t b;
  pq_batch_init(&b);
  pq_strbuf_t sb = {0};
  int64_t n = 0;
  memset(err, 0, sizeof(*err));
  int rc = pq_file_open(&src, opts, &f, err);
  if (rc == 0) rc = pq_projection_create(f, NULL, 0, &p, err);
  if (rc == 0) {
    pq_range_t *r = NULL;
    int nr = pq_projection_ranges(f, p, -1, &r, err);
    if (nr < 0) rc = nr;
    free(r);
  }
  for (int g = 0; rc == 0 && g < pq_file_meta(f)->num_row_groups; g++) {
    pq_reader *r = NULL;
    rc = pq_reader_open(f, &src, p, g, opts, &r, err);
    while (rc == 0) {
      int64_t got = pq_reader_next(r, batch, &b, err);
      if (got < 0) rc = (int)got;
      if (got <= 0) break;
      for (int64_t i = 0; i < got; i++) {
        sb.len = 0;
        ASSERT_OK(pq_json_append_row(&sb, &b, i));
      }
      n += got;
    }
    pq_reader_close(r);
  }
  pq_strbuf_free(&sb);
  pq_batch_free(&b);
  pq_projection_free(p);
  pq_file_close(f);
  if (rows) *rows = n;
  if (rc != 0) {
    ASSERT(rc < 0);
    ASSERT_EQ(err->code, rc);
  }
  return rc;
}

static int read_all(const uint8_t *data, size_t len, const pq_options *opts, pq_error *err) {
  return read_all_ex(data, len, opts, 1000, 0, err, NULL);
}

/* The read must fail with `code`, naming the file, the column and its row
 * group (when column is not NULL) and the reason. */
static void expect_fail_at(int line, const uint8_t *data, size_t len, const pq_options *opts,
                           int code, const char *column, const char *what) {
  for (int no_map = 0; no_map < 2; no_map++) {
    pq_error err;
    int64_t rows;
    int rc = read_all_ex(data, len, opts, 1000, no_map, &err, &rows);
    if (rc != code)
      ASSERT_FAIL_("case at line %d: expected %s, got %s (%d): %s", line, larder_err_name(code),
                   larder_err_name(rc), rc, err.msg);
    ASSERT_STR_CONTAINS(err.msg, HOSTILE_NAME);
    if (column) {
      char col[160];
      snprintf(col, sizeof(col), "column '%s', row group ", column);
      ASSERT_STR_CONTAINS(err.msg, col);
    }
    if (what) ASSERT_STR_CONTAINS(err.msg, what);
  }
}

#define expect_fail(...) expect_fail_at(__LINE__, __VA_ARGS__)

/* A survivable outcome of a random variant. */
static void expect_survives(int rc, const pq_error *err) {
  if (rc == 0) return;
  ASSERT(rc < 0 && rc > LARDER_ERRNO_MIN_);
  ASSERT(err->msg[0] != '\0');
  ASSERT_STR_CONTAINS(err->msg, HOSTILE_NAME);
}

/* ---- allocation watch ---------------------------------------------------- */

#ifdef HOSTILE_ASAN
int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void *, size_t),
                                              void (*free_hook)(const volatile void *));
static volatile size_t g_max_alloc;
static volatile int g_watching;
static void watch_malloc(const volatile void *p, size_t n) {
  (void)p;
  if (g_watching && n > g_max_alloc) g_max_alloc = n;
}
static void watch_free(const volatile void *p) { (void)p; }
#endif

/* From here on, no single allocation may reach `limit` bytes. */
static void alloc_watch_begin(size_t limit) {
#ifdef HOSTILE_ASAN
  (void)limit;
  static int installed;
  if (!installed) installed = __sanitizer_install_malloc_and_free_hooks(watch_malloc, watch_free);
  ASSERT(installed);
  g_max_alloc = 0;
  g_watching = 1;
#else
  /* Cap the address space a little above what the process maps now. */
  long pages = 0;
  FILE *f = fopen("/proc/self/statm", "r");
  ASSERT_NOT_NULL(f);
  ASSERT_EQ(fscanf(f, "%ld", &pages), 1);
  fclose(f);
  /* Only the soft limit moves, so later calls may raise it again; the
   * margin leaves room for the codecs' own state. */
  struct rlimit rl;
  ASSERT_OK(getrlimit(RLIMIT_AS, &rl));
  if (limit < ((size_t)64 << 20)) limit = (size_t)64 << 20;
  rl.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + limit;
  if (rl.rlim_max != RLIM_INFINITY && rl.rlim_cur > rl.rlim_max) rl.rlim_cur = rl.rlim_max;
  ASSERT_OK(setrlimit(RLIMIT_AS, &rl));
#endif
}

/* Ends the watch: fails the test when an allocation reached the limit
 * (ASan builds; other builds saw LARDER_ENOMEM from the reader instead),
 * and lifts the cap. */
static void alloc_watch_check(size_t limit, const char *what) {
#ifdef HOSTILE_ASAN
  g_watching = 0;
  if (g_max_alloc >= limit)
    ASSERT_FAIL_("%s: the reader allocated %zu bytes at once (limit %zu)", what,
                 (size_t)g_max_alloc, limit);
#else
  (void)limit;
  (void)what;
  struct rlimit rl;
  ASSERT_OK(getrlimit(RLIMIT_AS, &rl));
  rl.rlim_cur = rl.rlim_max;
  ASSERT_OK(setrlimit(RLIMIT_AS, &rl));
#endif
}

/* ---- building blocks ------------------------------------------------------ */

/* A file of one row group whose chunks the caller made. */
static uint8_t *file_of(const pqw_schema *s, int ns, pqw_chunk *chunks, int nc, int64_t rows,
                        size_t *len) {
  pqw_file f;
  pqw_file_init(&f, s, ns);
  pqw_file_add_row_group(&f, rows, chunks, nc);
  for (int i = 0; i < nc; i++) pqw_chunk_free(&chunks[i]);
  return pqw_file_finish(&f, len);
}

static pqw_values vals_fixed(int physical, const void *p, int64_t n) {
  pqw_values v;
  memset(&v, 0, sizeof(v));
  v.physical = physical;
  v.fixed = p;
  v.count = n;
  return v;
}

static pqw_values vals_bytes(const char *const *s, int64_t n) {
  pqw_values v;
  memset(&v, 0, sizeof(v));
  v.physical = PQ_BYTE_ARRAY;
  v.bytes = s;
  v.count = n;
  return v;
}

/* Appends to c a v1 data page of an optional INT32 column whose levels and
 * values are given as raw bytes. */
static void page_v1(pqw_chunk *c, int32_t num_values, const pqw_buf *body, int encoding) {
  pqw_page h;
  pqw_page_init(&h, PQ_PAGE_DATA);
  h.num_values = num_values;
  h.encoding = encoding;
  pqw_chunk_page_raw(c, &h, body->data, body->len, 0);
}

static const pqw_schema kOptInt[] = {
    {"schema", -1, -1, 1, -1, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0},
    {"a", PQ_INT32, PQ_OPTIONAL, -1, -1, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0}};
static const pqw_schema kReqInt[] = {
    {"schema", -1, -1, 1, -1, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0},
    {"a", PQ_INT32, PQ_REQUIRED, -1, -1, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0}};

/* A well-formed one-column file (optional INT32, n rows, value i, every
 * 4th null) for footer-level tampering.  *fp keeps the pqw_file open. */
static void simple_file(pqw_file *f, int64_t n, int codec) {
  int32_t *v = malloc((size_t)n * sizeof(int32_t) + 4);
  uint16_t *def = malloc((size_t)n * sizeof(uint16_t) + 2);
  ASSERT(v && def);
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) {
    def[i] = i % 4 != 1;
    if (def[i]) v[k++] = (int32_t)i;
  }
  pqw_values vals = vals_fixed(PQ_INT32, v, k);
  pqw_levels lv = {n, def, NULL, 1, 0};
  pqw_chunk_opts o = {0};
  o.codec = codec;
  pqw_chunk c;
  pqw_chunk_build(&c, &vals, &lv, &o);
  pqw_file_init(f, kOptInt, 2);
  pqw_file_add_row_group(f, n, &c, 1);
  pqw_chunk_free(&c);
  free(v);
  free(def);
}

/* A small file with many column kinds, codecs and page kinds, in two row
 * groups: the seed of the truncation and bit-flip tests. */
static uint8_t *rich_file(size_t *len, int crc) {
  pqw_schema s[] = {pqw_root(7),
                    pqw_leaf("id", PQ_INT32, PQ_REQUIRED),
                    pqw_leaf("name", PQ_BYTE_ARRAY, PQ_OPTIONAL),
                    pqw_group("l", PQ_OPTIONAL, 1),
                    pqw_group("list", PQ_REPEATED, 1),
                    pqw_leaf("element", PQ_INT64, PQ_OPTIONAL),
                    pqw_leaf("d", PQ_DOUBLE, PQ_REQUIRED),
                    pqw_leaf("b", PQ_BOOLEAN, PQ_OPTIONAL),
                    pqw_leaf("t", PQ_INT64, PQ_REQUIRED),
                    pqw_leaf("f", PQ_FIXED_LEN_BYTE_ARRAY, PQ_REQUIRED)};
  s[2].logical = PQ_LT_STRING;
  s[3].logical = PQ_LT_LIST;
  s[7].logical = PQ_LT_TIMESTAMP;
  s[7].lt_unit = 2;
  s[9].type_length = 3;
  s[9].logical = PQ_LT_DECIMAL;
  s[9].lt_precision = 6;
  s[9].lt_scale = 2;
  pqw_file f;
  pqw_file_init(&f, s, 10);
  enum { N = 24 };
  for (int g = 0; g < 2; g++) {
    int32_t id[N];
    const char *names[N];
    static const char *const pool[] = {"alpha", "beta", "gamma", "", "delta"};
    uint16_t ndef[N], bdef[N];
    int64_t le[N * 3];
    uint16_t ldef[N * 3], lrep[N * 3];
    double d[N];
    uint8_t bo[N];
    int64_t t[N];
    uint8_t fl[N * 3];
    int nn = 0, nl = 0, ne = 0, nb = 0;
    for (int i = 0; i < N; i++) {
      id[i] = g * 1000 + i;
      ndef[i] = i % 5 != 3;
      if (ndef[i]) names[nn++] = pool[i % 5];
      int llen = i % 4;
      if (i % 7 == 6) {
        ldef[ne] = 0;
        lrep[ne++] = 0;
      } else if (llen == 0) {
        ldef[ne] = 1;
        lrep[ne++] = 0;
      }
      for (int j = 0; i % 7 != 6 && j < llen; j++) {
        lrep[ne] = j ? 1 : 0;
        ldef[ne++] = (i + j) % 3 ? 3 : 2;
        if ((i + j) % 3) le[nl++] = i * 100 + j;
      }
      d[i] = i * 0.5 - 3;
      bdef[i] = i % 3 != 0;
      if (bdef[i]) bo[nb++] = (uint8_t)(i % 2);
      t[i] = 1700000000000000LL + i * 1000003LL;
      fl[3 * i] = 0;
      fl[3 * i + 1] = (uint8_t)(i >> 8);
      fl[3 * i + 2] = (uint8_t)i;
    }
    pqw_values vid = vals_fixed(PQ_INT32, id, N), vname = vals_bytes(names, nn);
    pqw_values vl = vals_fixed(PQ_INT64, le, nl), vd = vals_fixed(PQ_DOUBLE, d, N);
    pqw_values vb = vals_fixed(PQ_BOOLEAN, bo, nb), vt = vals_fixed(PQ_INT64, t, N);
    pqw_values vf = vals_fixed(PQ_FIXED_LEN_BYTE_ARRAY, fl, N);
    vf.type_length = 3;
    pqw_levels lname = {N, ndef, NULL, 1, 0}, ll = {ne, ldef, lrep, 3, 1};
    pqw_levels lb = {N, bdef, NULL, 1, 0};
    pqw_chunk_opts o[7];
    memset(o, 0, sizeof(o));
    for (int c = 0; c < 7; c++) o[c].crc = crc;
    o[0].page_entries = 10;
    o[1].encoding = PQ_ENC_RLE_DICTIONARY;
    o[1].v2 = 1;
    o[1].codec = PQ_SNAPPY;
    o[1].page_entries = 9;
    o[2].codec = PQ_GZIP;
    o[2].page_entries = 7;
    o[3].encoding = PQ_ENC_BYTE_STREAM_SPLIT;
    o[3].codec = PQ_ZSTD;
    o[4].encoding = PQ_ENC_RLE;
    o[4].v2 = 1;
    o[5].encoding = PQ_ENC_DELTA_BINARY_PACKED;
    o[5].codec = PQ_LZ4_RAW;
    o[6].encoding = PQ_ENC_DELTA_BYTE_ARRAY;
    o[6].page_entries = 11;
    pqw_chunk ch[7];
    pqw_chunk_build(&ch[0], &vid, NULL, &o[0]);
    pqw_chunk_build(&ch[1], &vname, &lname, &o[1]);
    pqw_chunk_build(&ch[2], &vl, &ll, &o[2]);
    pqw_chunk_build(&ch[3], &vd, NULL, &o[3]);
    pqw_chunk_build(&ch[4], &vb, &lb, &o[4]);
    pqw_chunk_build(&ch[5], &vt, NULL, &o[5]);
    pqw_chunk_build(&ch[6], &vf, NULL, &o[6]);
    pqw_file_add_row_group(&f, N, ch, 7);
    for (int c = 0; c < 7; c++) pqw_chunk_free(&ch[c]);
  }
  return pqw_file_finish(&f, len);
}

/* Where the FileMetaData of a well-formed file starts. */
static size_t meta_start(const uint8_t *data, size_t len) {
  uint32_t flen;
  memcpy(&flen, data + len - 8, 4);
  ASSERT(flen + 12 <= len);
  return len - 8 - flen;
}

/* ------------------------------------------------------------------------ */
/* Truncation and random damage                                              */

TEST_IMPL(parquet_hostile_truncated) {
  size_t len;
  uint8_t *data = rich_file(&len, 1);
  pq_error err;
  int64_t rows;
  ASSERT_OK(read_all_ex(data, len, NULL, 1000, 0, &err, &rows));
  ASSERT_EQ(rows, 48);
  size_t ms = meta_start(data, len);
  /* 1. Every prefix of the file. */
  for (size_t cut = 0; cut < len; cut++) {
    uint8_t *c = malloc(cut ? cut : 1);
    ASSERT_NOT_NULL(c);
    memcpy(c, data, cut);
    int rc = read_all_ex(c, cut, NULL, 1000, (int)(cut % 2), &err, NULL);
    ASSERT(rc < 0);
    expect_survives(rc, &err);
    free(c);
  }
  /* 2. The data cut short under an intact footer: every cut point. */
  size_t tail = len - ms;
  for (size_t cut = 4; cut < ms; cut++) {
    size_t n = cut + tail;
    uint8_t *c = malloc(n);
    ASSERT_NOT_NULL(c);
    memcpy(c, data, cut);
    memcpy(c + cut, data + ms, tail);
    int rc = read_all_ex(c, n, NULL, (int64_t)(1 + cut % 7), (int)(cut % 2), &err, NULL);
    ASSERT(rc < 0);
    expect_survives(rc, &err);
    free(c);
  }
  /* 3. The footer itself cut short, with a tail that says so. */
  for (size_t k = 0; k < tail - 8; k++) {
    size_t n = ms + k + 8;
    uint8_t *c = malloc(n);
    ASSERT_NOT_NULL(c);
    memcpy(c, data, ms + k);
    uint32_t fl = (uint32_t)k;
    memcpy(c + ms + k, &fl, 4);
    memcpy(c + ms + k + 4, "PAR1", 4);
    int rc = read_all_ex(c, n, NULL, 1000, 0, &err, NULL);
    ASSERT(rc < 0);
    expect_survives(rc, &err);
    if (k > 0) ASSERT_STR_CONTAINS(err.msg, "footer");
    free(c);
  }
  free(data);
  return 0;
}

TEST_IMPL(parquet_hostile_bitflips) {
  rnd_seed(20240611);
  size_t len0, len1;
  uint8_t *files[2];
  size_t lens[2];
  files[0] = rich_file(&len0, 1);
  files[1] = rich_file(&len1, 0);
  lens[0] = len0;
  lens[1] = len1;
  int ok = 0, failed = 0;
  pq_options opts;
  pq_options_init(&opts);
  opts.max_chunk_decoded_bytes = 64u << 20;
  for (int variant = 0; variant < 3000; variant++) {
    int which = variant % 2;
    size_t len = lens[which];
    uint8_t *c = malloc(len);
    ASSERT_NOT_NULL(c);
    memcpy(c, files[which], len);
    size_t ms = meta_start(c, len);
    int flips = 1 + (int)rnd_below(3);
    for (int k = 0; k < flips; k++) {
      size_t pos;
      if (variant % 3 == 0) pos = ms + rnd_below((uint32_t)(len - 8 - ms)); /* footer */
      else pos = rnd_below((uint32_t)len);
      c[pos] ^= (uint8_t)(1u << rnd_below(8));
    }
    opts.verify_crc = variant % 4 != 0;
    pq_error err;
    int rc = read_all_ex(c, len, &opts, 1 + rnd_below(40), variant % 5 == 0, &err, NULL);
    expect_survives(rc, &err);
    if (rc == 0) ok++;
    else failed++;
    free(c);
  }
  /* Whole bytes of the footer overwritten with 0x00, 0xff, or noise. */
  for (int variant = 0; variant < 1500; variant++) {
    size_t len = lens[1];
    uint8_t *c = malloc(len);
    ASSERT_NOT_NULL(c);
    memcpy(c, files[1], len);
    size_t ms = meta_start(c, len);
    size_t pos = ms + rnd_below((uint32_t)(len - 8 - ms));
    int kind = variant % 3;
    c[pos] = kind == 0 ? 0x00 : kind == 1 ? 0xff : (uint8_t)rnd64();
    if (variant % 2 && pos + 1 < len - 8) c[pos + 1] = (uint8_t)rnd64();
    pq_error err;
    int rc = read_all_ex(c, len, &opts, 1 + rnd_below(40), 0, &err, NULL);
    expect_survives(rc, &err);
    if (rc == 0) ok++;
    else failed++;
    free(c);
  }
  /* Both outcomes happen: flips that hit padding or values read fine. */
  ASSERT_GT(ok, 50);
  ASSERT_GT(failed, 500);
  free(files[0]);
  free(files[1]);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Lying sizes                                                               */

TEST_IMPL(parquet_hostile_page_size_lies) {
  int32_t v[4] = {1, 2, 3, 4};
  /* compressed_page_size past the end of the chunk. */
  {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 4;
    h.compressed_size = 1000;
    pqw_chunk_page(&c, &h, v, sizeof(v), sizeof(v));
    size_t len;
    uint8_t *d = file_of(kReqInt, 2, &c, 1, 4, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "runs past the column chunk");
    free(d);
  }
  /* Negative, INT32_MAX and missing sizes. */
  static const int32_t bad[] = {-1, INT32_MIN + 2, INT32_MAX};
  for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 4;
    h.compressed_size = bad[i];
    pqw_chunk_page(&c, &h, v, sizeof(v), sizeof(v));
    size_t len;
    uint8_t *d = file_of(kReqInt, 2, &c, 1, 4, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", bad[i] < 0 ? "sizes" : "past");
    free(d);
  }
  /* A page that claims fewer bytes than it has: the rest reads as the next
   * page's header. */
  {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 2;
    h.compressed_size = 8;
    pqw_chunk_page(&c, &h, v, sizeof(v), sizeof(v));
    size_t len;
    uint8_t *d = file_of(kReqInt, 2, &c, 1, 4, &len);
    pq_error err;
    int rc = read_all(d, len, NULL, &err);
    ASSERT(rc < 0);
    expect_survives(rc, &err);
    ASSERT_STR_CONTAINS(err.msg, "column 'a'");
    free(d);
  }
  /* A snappy page whose declared uncompressed size is too small or big. */
  static const int32_t usz[] = {8, 17, 0};
  for (size_t i = 0; i < ARRAY_LEN(usz); i++) {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_SNAPPY);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 4;
    h.uncompressed_size = usz[i];
    pqw_chunk_page_raw(&c, &h, v, sizeof(v), 0);
    size_t len;
    uint8_t *d = file_of(kReqInt, 2, &c, 1, 4, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "snappy");
    free(d);
  }
  /* v2: level lengths that exceed the page, or are negative. */
  static const int32_t rl[][2] = {{0, 100}, {-1, 2}, {2, -1}, {INT32_MAX, INT32_MAX}};
  for (size_t i = 0; i < ARRAY_LEN(rl); i++) {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA_V2);
    h.num_values = 4;
    h.num_rows = 4;
    h.rep_length = rl[i][0];
    h.def_length = rl[i][1];
    uint8_t body[2 + 16] = {4 << 1, 1};
    memcpy(body + 2, v, 16);
    pqw_chunk_page(&c, &h, body, sizeof(body), sizeof(body));
    size_t len;
    uint8_t *d = file_of(kOptInt, 2, &c, 1, 4, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "level lengths");
    free(d);
  }
  return 0;
}

/* Writes "PAR1", a FileMetaData of raw Thrift bytes, and the tail. */
static uint8_t *file_with_meta(const pqw_buf *meta, size_t *len) {
  pqw_buf b = {0};
  pqw_put(&b, "PAR1", 4);
  size_t ms = b.len;
  pqw_put(&b, meta->data, meta->len);
  pqw_tail(&b, ms);
  return pqw_buf_take(&b, len);
}

TEST_IMPL(parquet_hostile_footer_lies) {
  pqw_file f;
  size_t len;
  uint8_t *d;
  pq_error err;
  /* The footer length in the tail: past the file, zero, over the limit. */
  simple_file(&f, 10, PQ_UNCOMPRESSED);
  d = pqw_file_finish(&f, &len);
  ASSERT_OK(read_all(d, len, NULL, &err));
  uint32_t saved;
  memcpy(&saved, d + len - 8, 4);
  static const uint32_t fl[] = {0, 0xffffffffu, 0x7fffffffu, 0};
  for (size_t i = 0; i < 3; i++) {
    uint32_t x = i == 2 ? (uint32_t)len - 11 : fl[i];
    memcpy(d + len - 8, &x, 4);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, NULL,
                i == 0 ? "empty footer" : "exceeds the file size");
  }
  memcpy(d + len - 8, &saved, 4);
  pq_options small;
  pq_options_init(&small);
  small.max_footer_bytes = 16;
  expect_fail(d, len, &small, LARDER_ELIMIT, NULL, "exceeds the limit");
  /* A footer length that points into the data: garbage metadata. */
  uint32_t x = saved + 20;
  memcpy(d + len - 8, &x, 4);
  ASSERT(read_all(d, len, NULL, &err) < 0);
  expect_survives(read_all(d, len, NULL, &err), &err);
  memcpy(d + len - 8, &saved, 4);
  /* The magic. */
  memcpy(d + len - 4, "PARE", 4);
  expect_fail(d, len, NULL, LARDER_EUNSUPPORTED, NULL, "encrypted");
  memcpy(d + len - 4, "PAR2", 4);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, NULL, "PAR1");
  expect_fail(d, 11, NULL, LARDER_ECORRUPT, NULL, "too short");
  expect_fail(d, 0, NULL, LARDER_ECORRUPT, NULL, "too short");
  free(d);
  /* Column chunk offsets and sizes. */
  struct {
    int64_t dpo, tcs;
    const char *what;
  } offs[] = {{0, -1, "outside the data"},         {-5, -1, "outside the data"},
              {1 << 20, -1, "outside the data"},   {INT64_MAX, -1, "outside the data"},
              {INT64_MIN, -1, "outside the data"}, {-1, 0, "claims 0 bytes"},
              {-1, -7, "claims -7 bytes"},         {-1, 1 << 20, "past the data"},
              {-1, INT64_MAX, "past the data"}};
  for (size_t i = 0; i < ARRAY_LEN(offs); i++) {
    simple_file(&f, 10, PQ_UNCOMPRESSED);
    if (offs[i].dpo != -1) f.rg[0].cols[0].data_page_offset = offs[i].dpo;
    if (offs[i].tcs != -1) f.rg[0].cols[0].total_compressed_size = offs[i].tcs;
    d = pqw_file_finish(&f, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", offs[i].what);
    free(d);
  }
  /* A dictionary offset past the data page (ignored) or before the file. */
  simple_file(&f, 10, PQ_UNCOMPRESSED);
  f.rg[0].cols[0].dictionary_page_offset = 1 << 20;
  d = pqw_file_finish(&f, &len);
  ASSERT_OK(read_all(d, len, NULL, &err));
  free(d);
  /* Negative num_values and sizes in the column metadata. */
  simple_file(&f, 10, PQ_UNCOMPRESSED);
  f.rg[0].cols[0].num_values = -1;
  d = pqw_file_finish(&f, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "negative");
  free(d);
  /* The chunk's type disagrees with the schema's. */
  simple_file(&f, 10, PQ_UNCOMPRESSED);
  f.rg[0].cols[0].type = PQ_INT64;
  d = pqw_file_finish(&f, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "does not match");
  free(d);
  /* No metadata in the chunk; a chunk stored in another file. */
  simple_file(&f, 10, PQ_UNCOMPRESSED);
  f.rg[0].cols[0].omit_meta = 1;
  d = pqw_file_finish(&f, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "no column metadata");
  free(d);
  /* Row group row counts: missing, negative, and overflowing in sum. */
  simple_file(&f, 10, PQ_UNCOMPRESSED);
  f.rg[0].omit_num_rows = 1;
  d = pqw_file_finish(&f, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, NULL, "row count");
  free(d);
  simple_file(&f, 10, PQ_UNCOMPRESSED);
  f.rg[0].num_rows = -3;
  d = pqw_file_finish(&f, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, NULL, "row count");
  free(d);
  {
    simple_file(&f, 10, PQ_UNCOMPRESSED);
    pqw_chunk c;
    int32_t one = 1;
    pqw_values v = vals_fixed(PQ_INT32, &one, 1);
    uint16_t def1 = 1;
    pqw_levels lv = {1, &def1, NULL, 1, 0};
    pqw_chunk_build(&c, &v, &lv, NULL);
    pqw_file_add_row_group(&f, INT64_MAX, &c, 1);
    pqw_chunk_free(&c);
    f.num_rows = 5; /* else the file's own count is checked first */
    d = pqw_file_finish(&f, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, NULL, "overflow");
    free(d);
  }
  /* The file's num_rows is stale: the row groups win. */
  simple_file(&f, 10, PQ_UNCOMPRESSED);
  f.num_rows = 12345;
  d = pqw_file_finish(&f, &len);
  int64_t rows;
  ASSERT_OK(read_all_ex(d, len, NULL, 3, 0, &err, &rows));
  ASSERT_EQ(rows, 10);
  free(d);
  /* More or fewer column chunks than leaves. */
  for (int extra = -1; extra <= 1; extra += 2) {
    simple_file(&f, 10, PQ_UNCOMPRESSED);
    if (extra > 0) {
      f.rg[0].cols = realloc(f.rg[0].cols, 2 * sizeof(pqw_colmeta));
      ASSERT_NOT_NULL(f.rg[0].cols);
      f.rg[0].cols[1] = f.rg[0].cols[0];
    }
    f.rg[0].num_columns += extra;
    d = pqw_file_finish(&f, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, NULL, "column chunks");
    free(d);
  }
  return 0;
}

TEST_IMPL(parquet_hostile_schema_lies) {
  struct {
    int root_children, leaf_type, leaf_rep, type_length, leaf_children, n;
    int code;
    const char *what;
  } cases[] = {
      {3, PQ_INT32, PQ_OPTIONAL, 0, -1, 2, LARDER_ECORRUPT, "claims 3 children"},
      {INT32_MAX, PQ_INT32, PQ_OPTIONAL, 0, -1, 2, LARDER_ECORRUPT, "children"},
      {-2, PQ_INT32, PQ_OPTIONAL, 0, -1, 2, LARDER_ECORRUPT, "claims -2 children"},
      {0, PQ_INT32, PQ_OPTIONAL, 0, -1, 2, LARDER_ECORRUPT, "1 elements after the tree"},
      {1, 9, PQ_OPTIONAL, 0, -1, 2, LARDER_ECORRUPT, "unknown physical type 9"},
      {1, -7, PQ_OPTIONAL, 0, 0, 2, LARDER_ECORRUPT, "unknown physical type -7"},
      {1, PQ_FIXED_LEN_BYTE_ARRAY, PQ_OPTIONAL, 0, -1, 2, LARDER_ECORRUPT, "fixed length 0"},
      {1, PQ_FIXED_LEN_BYTE_ARRAY, PQ_OPTIONAL, -4, -1, 2, LARDER_ECORRUPT, "fixed length -4"},
      {1, PQ_FIXED_LEN_BYTE_ARRAY, PQ_OPTIONAL, INT32_MAX, -1, 2, LARDER_ECORRUPT, "fixed length"},
      {1, PQ_INT32, 5, 0, -1, 2, LARDER_ECORRUPT, "repetition 5"},
      {1, PQ_INT32, -1, 0, -1, 2, LARDER_ECORRUPT, "no repetition"},
      {1, PQ_INT32, PQ_OPTIONAL, 0, 5, 2, LARDER_ECORRUPT, "claims 5 children"},
      {1, PQ_INT32, PQ_OPTIONAL, 0, -1, 1, LARDER_ECORRUPT, "claims 1 children"},
  };
  for (size_t i = 0; i < ARRAY_LEN(cases); i++) {
    pqw_schema s[2] = {pqw_root(cases[i].root_children),
                       pqw_leaf("a", cases[i].leaf_type, cases[i].leaf_rep)};
    s[1].type_length = cases[i].type_length;
    s[1].num_children = cases[i].leaf_children;
    pqw_file f;
    pqw_file_init(&f, s, cases[i].n);
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    int32_t v = 5;
    h.num_values = 1;
    pqw_chunk_page(&c, &h, &v, 4, 4);
    pqw_file_add_row_group(&f, 1, &c, 1);
    pqw_chunk_free(&c);
    size_t len;
    uint8_t *d = pqw_file_finish(&f, &len);
    pq_error err;
    int rc = read_all(d, len, NULL, &err);
    if (rc != cases[i].code) ASSERT_FAIL_("case %zu: got %d: %s", i, rc, err.msg);
    ASSERT_STR_CONTAINS(err.msg, HOSTILE_NAME);
    ASSERT_STR_CONTAINS(err.msg, "schema");
    if (cases[i].what) ASSERT_STR_CONTAINS(err.msg, cases[i].what);
    free(d);
  }
  /* No schema at all, and an empty one. */
  pqw_buf m = {0};
  pqw_thrift t;
  pqw_t_init(&t, &m);
  pqw_t_push(&t);
  pqw_t_i32(&t, 1, 1);
  pqw_t_i64(&t, 3, 0);
  pqw_t_struct_end(&t);
  size_t len;
  uint8_t *d = file_with_meta(&m, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, NULL, "no schema");
  free(d);
  m.len = 0;
  pqw_t_init(&t, &m);
  pqw_t_push(&t);
  pqw_t_list_begin(&t, 2, PQ_TT_STRUCT, 0);
  pqw_t_struct_end(&t);
  d = file_with_meta(&m, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, NULL, "empty schema");
  free(d);
  /* A column chunk in another file, an encrypted column, an encrypted
   * footer in plaintext mode (FileMetaData field 8). */
  for (int k = 0; k < 3; k++) {
    pqw_file f;
    simple_file(&f, 4, PQ_UNCOMPRESSED);
    m.len = 0;
    pqw_file_meta(&m, &f);
    pqw_file_free(&f);
    /* Re-write with an extra field: simplest by appending one to the last
     * struct we can reach, the top-level one. */
    m.len--;
    pqw_t_init(&t, &m);
    pqw_t_push(&t);
    t.last[t.depth] = 6; /* created_by was the last field */
    if (k == 2) {
      pqw_t_struct_begin(&t, 8);
      pqw_t_struct_end(&t);
    } else {
      /* A row group list with one column chunk carrying field 1 or 8. */
      pqw_t_list_begin(&t, 4, PQ_TT_STRUCT, 1);
      pqw_t_push(&t);
      pqw_t_list_begin(&t, 1, PQ_TT_STRUCT, 1);
      pqw_t_push(&t);
      if (k == 0) pqw_t_string(&t, 1, "other.parquet");
      else pqw_t_struct_begin(&t, 8), pqw_t_struct_end(&t);
      pqw_t_struct_end(&t);
      pqw_t_i64(&t, 3, 4);
      pqw_t_struct_end(&t);
    }
    pqw_t_struct_end(&t);
    d = file_with_meta(&m, &len);
    expect_fail(d, len, NULL, LARDER_EUNSUPPORTED, NULL, "not supported");
    free(d);
  }
  pqw_buf_free(&m);
  return 0;
}

/* Lists in the footer that claim more elements than there are bytes. */
TEST_IMPL(parquet_hostile_footer_list_sizes) {
  static const uint64_t sizes[] = {15, 1000, (uint64_t)INT32_MAX, (uint64_t)1 << 40,
                                   UINT64_MAX >> 1};
  for (int which = 0; which < 5; which++) {
    for (size_t k = 0; k < ARRAY_LEN(sizes); k++) {
      pqw_buf m = {0};
      pqw_thrift t;
      pqw_t_init(&t, &m);
      pqw_t_push(&t);
      pqw_t_i32(&t, 1, 1);
      /* schema: a root and one leaf (or the lie) */
      pqw_t_list_begin(&t, 2, PQ_TT_STRUCT, which == 0 ? sizes[k] : 2);
      pqw_t_push(&t);
      pqw_t_string(&t, 4, "schema");
      pqw_t_i32(&t, 5, 1);
      pqw_t_struct_end(&t);
      pqw_t_push(&t);
      pqw_t_i32(&t, 1, PQ_INT32);
      pqw_t_i32(&t, 3, PQ_REQUIRED);
      pqw_t_string(&t, 4, "a");
      pqw_t_struct_end(&t);
      pqw_t_i64(&t, 3, 1);
      pqw_t_list_begin(&t, 4, PQ_TT_STRUCT, which == 1 ? sizes[k] : 1);
      pqw_t_push(&t);
      pqw_t_list_begin(&t, 1, PQ_TT_STRUCT, which == 2 ? sizes[k] : 1);
      pqw_t_push(&t);
      pqw_t_struct_begin(&t, 3);
      pqw_t_i32(&t, 1, PQ_INT32);
      pqw_t_list_begin(&t, 2, PQ_TT_I32, which == 3 ? sizes[k] : 1);
      pqw_t_val_int(&t, 0);
      pqw_t_i64(&t, 9, 4);
      pqw_t_struct_end(&t);
      pqw_t_struct_end(&t);
      pqw_t_i64(&t, 3, 1);
      pqw_t_struct_end(&t);
      pqw_t_list_begin(&t, 5, PQ_TT_STRUCT, which == 4 ? sizes[k] : 0);
      pqw_t_struct_end(&t);
      size_t len;
      uint8_t *d = file_with_meta(&m, &len);
      alloc_watch_begin((size_t)64 << 20);
      pq_error err;
      int rc = read_all(d, len, NULL, &err);
      alloc_watch_check((size_t)64 << 20, "footer list sizes");
      /* Reading on past a short list parses whatever follows: any clean
       * refusal will do. */
      if (rc != LARDER_ECORRUPT && rc != LARDER_EUNSUPPORTED)
        ASSERT_FAIL_("list %d of %llu: got %d: %s", which, (unsigned long long)sizes[k], rc,
                     err.msg);
      ASSERT_STR_CONTAINS(err.msg, HOSTILE_NAME);
      if (!strstr(err.msg, "footer") && !strstr(err.msg, "schema"))
        ASSERT_FAIL_("list %d of %llu: %s", which, (unsigned long long)sizes[k], err.msg);
      free(d);
      pqw_buf_free(&m);
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Dictionaries                                                              */

/* A chunk with a 3-entry INT32 dictionary and one data page of the given
 * index bytes (bit width byte first). */
static uint8_t *dict_file(const uint8_t *idx, size_t idx_len, int32_t num_values,
                          int32_t dict_count, int dict_encoding, size_t *len) {
  pqw_chunk c;
  pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
  int32_t dv[3] = {100, 200, 300};
  pqw_page h;
  pqw_page_init(&h, PQ_PAGE_DICTIONARY);
  h.num_values = dict_count;
  h.encoding = dict_encoding;
  pqw_chunk_page(&c, &h, dv, sizeof(dv), sizeof(dv));
  pqw_page_init(&h, PQ_PAGE_DATA);
  h.num_values = num_values;
  h.encoding = PQ_ENC_RLE_DICTIONARY;
  pqw_chunk_page(&c, &h, idx, idx_len, idx_len);
  return file_of(kReqInt, 2, &c, 1, num_values > 0 ? num_values : 1, len);
}

TEST_IMPL(parquet_hostile_dictionary) {
  size_t len;
  uint8_t *d;
  /* Good: indices 0 1 2 1 in a bit-packed run of width 2. */
  uint8_t good[] = {2, (1 << 1) | 1, 0x64, 0x00};
  d = dict_file(good, sizeof(good), 4, 3, PQ_ENC_PLAIN, &len);
  pq_error err;
  ASSERT_OK(read_all(d, len, NULL, &err));
  free(d);
  /* Index 7 of 3 (RLE run), and index 3 in a bit-packed run. */
  uint8_t oor[] = {3, 4 << 1, 7};
  d = dict_file(oor, sizeof(oor), 4, 3, PQ_ENC_PLAIN, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "dictionary index 7 out of range");
  free(d);
  uint8_t oor2[] = {2, (1 << 1) | 1, 0xe4, 0x00};
  d = dict_file(oor2, sizeof(oor2), 4, 3, PQ_ENC_PLAIN, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "dictionary index 3 out of range");
  free(d);
  /* An empty dictionary referenced. */
  uint8_t zero[] = {0, 4 << 1};
  d = dict_file(zero, sizeof(zero), 4, 0, PQ_ENC_PLAIN, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "out of range");
  free(d);
  /* Bit width 33, missing indices, indices that end early. */
  uint8_t w33[] = {33, 2, 0};
  d = dict_file(w33, sizeof(w33), 4, 3, PQ_ENC_PLAIN, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "index width 33");
  free(d);
  d = dict_file(w33, 0, 4, 3, PQ_ENC_PLAIN, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "indices missing");
  free(d);
  uint8_t few[] = {2, 2 << 1, 1};
  d = dict_file(few, sizeof(few), 4, 3, PQ_ENC_PLAIN, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "indices end after 2 of 4");
  free(d);
  /* Negative and oversized dictionary counts; a dictionary in RLE. */
  d = dict_file(good, sizeof(good), 4, -1, PQ_ENC_PLAIN, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "declares -1 values");
  free(d);
  d = dict_file(good, sizeof(good), 4, INT32_MIN, PQ_ENC_PLAIN, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "values");
  free(d);
  d = dict_file(good, sizeof(good), 4, 1000, PQ_ENC_PLAIN, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "declares 1000 values");
  free(d);
  d = dict_file(good, sizeof(good), 4, INT32_MAX, PQ_ENC_PLAIN, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "values");
  free(d);
  d = dict_file(good, sizeof(good), 4, 3, PQ_ENC_RLE, &len);
  expect_fail(d, len, NULL, LARDER_EUNSUPPORTED, "a", "dictionary encoded as RLE");
  free(d);
  /* Two dictionaries; a dictionary after a data page; none at all. */
  for (int k = 0; k < 3; k++) {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    int32_t dv[3] = {1, 2, 3};
    pqw_page dh, h;
    pqw_page_init(&dh, PQ_PAGE_DICTIONARY);
    dh.num_values = 3;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 4;
    h.encoding = PQ_ENC_RLE_DICTIONARY;
    if (k == 0) pqw_chunk_page(&c, &dh, dv, 12, 12);
    if (k == 1) { /* a PLAIN data page, then the dictionary */
      pqw_page ph;
      pqw_page_init(&ph, PQ_PAGE_DATA);
      ph.num_values = 3;
      pqw_chunk_page(&c, &ph, dv, 12, 12);
    }
    if (k < 2) pqw_chunk_page(&c, &dh, dv, 12, 12);
    pqw_chunk_page(&c, &h, good, sizeof(good), sizeof(good));
    d = file_of(kReqInt, 2, &c, 1, k == 1 ? 7 : 4, &len);
    static const char *const what[] = {"second dictionary", "dictionary page after data",
                                       "no dictionary"};
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", what[k]);
    free(d);
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Sizes that would make a naive reader allocate                             */

/* A page whose header declares a huge uncompressed size over a tiny body,
 * for codec and page kind. */
static uint8_t *huge_page_file(int codec, int kind, int32_t usize, size_t *len) {
  int32_t v[4] = {1, 2, 3, 4};
  pqw_chunk c;
  pqw_chunk_init(&c, PQ_INT32, codec);
  pqw_page h;
  if (kind == 2) { /* a dictionary page */
    pqw_page_init(&h, PQ_PAGE_DICTIONARY);
    h.num_values = 4;
    h.uncompressed_size = usize;
    pqw_chunk_page_raw(&c, &h, v, sizeof(v), 0);
    uint8_t idx[] = {2, (1 << 1) | 1, 0xe4, 0};
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 4;
    h.encoding = PQ_ENC_RLE_DICTIONARY;
    pqw_chunk_page_raw(&c, &h, idx, sizeof(idx), 0);
  } else {
    pqw_page_init(&h, kind ? PQ_PAGE_DATA_V2 : PQ_PAGE_DATA);
    h.num_values = 4;
    h.num_rows = 4;
    h.uncompressed_size = usize;
    pqw_chunk_page_raw(&c, &h, v, sizeof(v), 0);
  }
  return file_of(kReqInt, 2, &c, 1, 4, len);
}

/* The brief's case: uncompressed_page_size = 2^31 - 1 over a few bytes of
 * SNAPPY or ZSTD must fail (ELIMIT or ECORRUPT) without allocating it. */
TEST_IMPL(parquet_hostile_huge_uncompressed_size) {
  static const int codecs[] = {PQ_SNAPPY, PQ_ZSTD, PQ_GZIP, PQ_LZ4_RAW};
  const size_t limit = (size_t)256 << 20;
  alloc_watch_begin(limit);
  for (size_t z = 0; z < ARRAY_LEN(codecs); z++) {
    for (int kind = 0; kind < 3; kind++) {
      size_t len;
      uint8_t *d = huge_page_file(codecs[z], kind, INT32_MAX, &len);
      pq_error err;
      int rc = read_all(d, len, NULL, &err);
      char what[96];
      snprintf(what, sizeof(what), "%s %s page declaring 2^31-1 bytes", pq_codec_name(codecs[z]),
               kind == 0   ? "v1"
               : kind == 1 ? "v2"
                           : "dictionary");
      if (rc != LARDER_ELIMIT && rc != LARDER_ECORRUPT)
        ASSERT_FAIL_("%s: got %s: %s", what, larder_err_name(rc), err.msg);
      ASSERT_STR_CONTAINS(err.msg, HOSTILE_NAME);
      ASSERT_STR_CONTAINS(err.msg, "column 'a'");
      alloc_watch_check(limit, what);
      free(d);
      alloc_watch_begin(limit);
    }
  }
  alloc_watch_check(limit, "huge uncompressed size");
  /* With a small ceiling the size is refused before anything is read. */
  pq_options o;
  pq_options_init(&o);
  o.max_chunk_decoded_bytes = 1 << 20;
  size_t len;
  uint8_t *d = huge_page_file(PQ_SNAPPY, 0, INT32_MAX, &len);
  expect_fail(d, len, &o, LARDER_ELIMIT, "a", "max_chunk_decoded_bytes");
  free(d);
  return 0;
}

/* A page of num_values = 2^30 in a few bytes: the level buffers it implies
 * are charged against the ceiling before they are allocated. */
TEST_IMPL(parquet_hostile_huge_num_values) {
  static const int32_t counts[] = {1 << 30, INT32_MAX, 1 << 24};
  for (size_t i = 0; i < ARRAY_LEN(counts); i++) {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_buf body = {0};
    /* definition levels: one RLE run of count nulls */
    pqw_buf lv = {0};
    pqw_uvarint(&lv, (uint64_t)counts[i] << 1);
    pqw_u8(&lv, 0);
    pqw_le32(&body, (uint32_t)lv.len);
    pqw_put(&body, lv.data, lv.len);
    page_v1(&c, counts[i], &body, PQ_ENC_PLAIN);
    size_t len;
    uint8_t *d = file_of(kOptInt, 2, &c, 1, 10, &len);
    pq_options o;
    pq_options_init(&o);
    o.max_chunk_decoded_bytes = 16 << 20;
    alloc_watch_begin((size_t)32 << 20);
    if (counts[i] == (1 << 24)) {
      /* 32 MiB of levels is over a 16 MiB ceiling too. */
      expect_fail(d, len, &o, LARDER_ELIMIT, "a", "max_chunk_decoded_bytes");
    } else {
      expect_fail(d, len, &o, LARDER_ELIMIT, "a", "max_chunk_decoded_bytes");
      /* With the default ceiling, 2^31 - 1 values need 4 GiB of levels. */
      if (counts[i] == INT32_MAX) expect_fail(d, len, NULL, LARDER_ELIMIT, "a", "ceiling");
    }
    alloc_watch_check((size_t)32 << 20, "huge num_values");
    free(d);
    pqw_buf_free(&body);
    pqw_buf_free(&lv);
  }
  return 0;
}

/*
 * Counts no file could hold: a row group and its column chunk claiming 2^62
 * values (and, alone, a chunk claiming 2^40 in a few bytes) fail the open
 * as corrupt, naming the file, the column and the row group; a page whose
 * header claims more values than the ceiling allows to decode says that
 * the page alone is too big (err.whole_page), which larderd uses to leave
 * out its advice about smaller units.
 */
TEST_IMPL(parquet_hostile_absurd_value_count) {
  static const int64_t claims[][2] = {{1ll << 62, 1ll << 62}, {10, 1ll << 40}};
  for (size_t i = 0; i < ARRAY_LEN(claims); i++) {
    pqw_file f;
    simple_file(&f, 10, PQ_UNCOMPRESSED);
    f.rg[0].num_rows = claims[i][0];
    f.rg[0].cols[0].num_values = claims[i][1];
    size_t len;
    uint8_t *d = pqw_file_finish(&f, &len);
    char what[64];
    snprintf(what, sizeof(what), "claims %lld values", (long long)claims[i][1]);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", what);
    pq_source src;
    init_source(&src, d, len, 0);
    pq_file *pf = NULL;
    pq_error err;
    ASSERT_EQ(pq_file_open(&src, NULL, &pf, &err), LARDER_ECORRUPT);
    ASSERT_STR_CONTAINS(err.msg, HOSTILE_NAME ": column 'a', row group 0: ");
    ASSERT(strstr(err.msg, "unit_rows") == NULL);
    free(d);
  }
  /* A page of 2^30 nulls in a few bytes: its levels alone pass the ceiling. */
  pqw_chunk c;
  pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
  pqw_buf body = {0}, lv = {0};
  pqw_uvarint(&lv, (uint64_t)1 << 31); /* one RLE run of 2^30 zeros */
  pqw_u8(&lv, 0);
  pqw_le32(&body, (uint32_t)lv.len);
  pqw_put(&body, lv.data, lv.len);
  page_v1(&c, 1 << 30, &body, PQ_ENC_PLAIN);
  size_t len;
  uint8_t *d = file_of(kOptInt, 2, &c, 1, 10, &len);
  pq_options o;
  pq_options_init(&o);
  o.max_chunk_decoded_bytes = 16 << 20;
  expect_fail(d, len, &o, LARDER_ELIMIT, "a", "a page of 1073741824 values");
  pq_error err;
  ASSERT_EQ(read_all(d, len, &o, &err), LARDER_ELIMIT);
  ASSERT_EQ(err.whole_page, 1);
  ASSERT_STR_CONTAINS(err.msg, "max_chunk_decoded_bytes");
  free(d);
  pqw_buf_free(&body);
  pqw_buf_free(&lv);
  /* A ceiling passed by reads, each within it, is not the page's alone. */
  enum { PER_PAGE = 100000, PAGES = 4 };
  int32_t *v = calloc(PER_PAGE * PAGES, sizeof(int32_t));
  ASSERT_NOT_NULL(v);
  pqw_values vals = vals_fixed(PQ_INT32, v, PER_PAGE * PAGES);
  pqw_chunk_opts co = {0};
  co.page_entries = PER_PAGE;
  pqw_chunk big;
  pqw_chunk_build(&big, &vals, NULL, &co);
  d = file_of(kReqInt, 2, &big, 1, PER_PAGE * PAGES, &len);
  o.max_chunk_decoded_bytes = 1 << 20;
  ASSERT_EQ(read_all(d, len, &o, &err), LARDER_ELIMIT);
  ASSERT_EQ(err.whole_page, 0);
  free(d);
  free(v);
  return 0;
}

/* Small pages that decompress to far more than their header declares. */
TEST_IMPL(parquet_hostile_decompression_bomb) {
  static const struct {
    int codec;
    size_t real;
    const char *name;
  } bombs[] = {{PQ_SNAPPY, 8u << 20, "snappy"},
               {PQ_ZSTD, 64u << 20, "zstd"},
               {PQ_GZIP, 32u << 20, "gzip"},
               {PQ_LZ4_RAW, 8u << 20, "lz4"}};
  for (size_t i = 0; i < ARRAY_LEN(bombs); i++) {
    uint8_t *zeros = calloc(1, bombs[i].real);
    ASSERT_NOT_NULL(zeros);
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, bombs[i].codec);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 1 << 18;
    h.uncompressed_size = 1 << 20; /* within the ceiling, below the truth */
    pqw_chunk_page_raw(&c, &h, zeros, bombs[i].real, 0);
    free(zeros);
    ASSERT(c.bytes.len < (4u << 20));
    size_t len;
    uint8_t *d = file_of(kReqInt, 2, &c, 1, 1 << 18, &len);
    alloc_watch_begin((size_t)8 << 20);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", bombs[i].name);
    alloc_watch_check((size_t)8 << 20, bombs[i].name);
    free(d);
  }
  return 0;
}

/* A chunk that really decodes to more than max_chunk_decoded_bytes. */
TEST_IMPL(parquet_hostile_chunk_ceiling) {
  enum { PER_PAGE = 100000, PAGES = 4 };
  int32_t *v = calloc(PER_PAGE * PAGES, sizeof(int32_t));
  ASSERT_NOT_NULL(v);
  for (int i = 0; i < PER_PAGE * PAGES; i++) v[i] = i % 10;
  pqw_values vals = vals_fixed(PQ_INT32, v, PER_PAGE * PAGES);
  pqw_chunk_opts o = {0};
  o.codec = PQ_ZSTD;
  o.page_entries = PER_PAGE;
  pqw_chunk c;
  pqw_chunk_build(&c, &vals, NULL, &o);
  ASSERT(c.bytes.len < (1u << 20));
  size_t len;
  uint8_t *d = file_of(kReqInt, 2, &c, 1, PER_PAGE * PAGES, &len);
  pq_error err;
  ASSERT_OK(read_all(d, len, NULL, &err));
  pq_options opts;
  pq_options_init(&opts);
  opts.max_chunk_decoded_bytes = 1 << 20;
  expect_fail(d, len, &opts, LARDER_ELIMIT, "a", "max_chunk_decoded_bytes");
  /* The same in small batches: the ceiling is per chunk, not per batch. */
  int64_t rows;
  int rc = read_all_ex(d, len, &opts, 1000, 0, &err, &rows);
  ASSERT_EQ(rc, LARDER_ELIMIT);
  ASSERT_LT(rows, PER_PAGE * PAGES);
  ASSERT_STR_CONTAINS(err.msg, "max_chunk_decoded_bytes");
  free(d);
  free(v);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Many pages                                                                */

TEST_IMPL(parquet_hostile_many_pages) {
  enum { N = 40000 };
  int32_t *v = malloc(N * sizeof(int32_t));
  uint16_t *def = malloc(N * sizeof(uint16_t));
  ASSERT(v && def);
  int k = 0;
  for (int i = 0; i < N; i++) {
    def[i] = i % 3 != 0;
    if (def[i]) v[k++] = i;
  }
  pqw_schema s[] = {pqw_root(2), pqw_leaf("a", PQ_INT32, PQ_REQUIRED),
                    pqw_leaf("b", PQ_INT32, PQ_OPTIONAL)};
  pqw_values va = vals_fixed(PQ_INT32, v, N), vb = vals_fixed(PQ_INT32, v, k);
  for (int i = 0; i < N; i++) v[i] = i; /* a: every value */
  k = 0;
  pqw_chunk c[2];
  pqw_chunk_opts o = {0};
  o.page_entries = 1;
  pqw_chunk_build(&c[0], &va, NULL, &o);
  ASSERT_EQ(c[0].num_pages, N);
  /* b: the non-null values, one level entry per page */
  int32_t *bv = malloc(N * sizeof(int32_t));
  ASSERT_NOT_NULL(bv);
  for (int i = 0; i < N; i++)
    if (def[i]) bv[k++] = i;
  vb = vals_fixed(PQ_INT32, bv, k);
  pqw_levels lb = {N, def, NULL, 1, 0};
  o.v2 = 1;
  pqw_chunk_build(&c[1], &vb, &lb, &o);
  size_t len;
  uint8_t *d = file_of(s, 3, c, 2, N, &len);
  pq_source src;
  init_source(&src, d, len, 0);
  pq_file *f = NULL;
  pq_error err;
  ASSERT_OK(pq_file_open(&src, NULL, &f, &err));
  pq_projection *p = NULL;
  ASSERT_OK(pq_projection_create(f, NULL, 0, &p, &err));
  pq_reader *r = NULL;
  ASSERT_OK(pq_reader_open(f, &src, p, 0, NULL, &r, &err));
  pq_batch_t b;
  pq_batch_init(&b);
  int64_t row = 0;
  for (;;) {
    int64_t got = pq_reader_next(r, 4099, &b, &err);
    if (got < 0) ASSERT_FAIL_("%s", err.msg);
    if (got == 0) break;
    for (int64_t i = 0; i < got; i++, row++) {
      int32_t x, y;
      memcpy(&x, b.columns[0].values.data + 4 * i, 4);
      memcpy(&y, b.columns[1].values.data + 4 * i, 4);
      ASSERT_EQ(x, row);
      int valid = (b.columns[1].validity.data[i / 8] >> (i % 8)) & 1;
      ASSERT_EQ(valid, row % 3 != 0);
      ASSERT_EQ(y, row % 3 != 0 ? row : 0);
    }
  }
  ASSERT_EQ(row, N);
  pq_batch_free(&b);
  pq_reader_close(r);
  pq_projection_free(p);
  pq_file_close(f);
  free(d);
  free(v);
  free(bv);
  free(def);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Levels                                                                    */

static const pqw_schema kList[] = {
    {"schema", -1, -1, 1, -1, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0},
    {"l", -1, PQ_OPTIONAL, 1, -1, 0, 0, 0, -1, PQ_LT_LIST, 0, 0, 0, 0, 0, 0},
    {"list", -1, PQ_REPEATED, 1, -1, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0},
    {"element", PQ_INT32, PQ_OPTIONAL, -1, -1, 0, 0, 0, -1, 0, 0, 0, 0, 0, 0, 0}};

/* Levels as a v1 page holds them, in RLE runs only with one-byte values:
 * valid for any bit width up to 8, so values above the maximum survive
 * encoding. */
static void levels_runs(pqw_buf *body, const uint16_t *lv, int n) {
  uint32_t v[64];
  for (int i = 0; i < n; i++) v[i] = lv[i];
  pqw_buf tmp = {0};
  pqw_rle(&tmp, v, (size_t)n, 8, PQW_RLE_RUNS_ONLY);
  pqw_le32(body, (uint32_t)tmp.len);
  pqw_put(body, tmp.data, tmp.len);
  pqw_buf_free(&tmp);
}

/* A v1 page of the list column from explicit levels and values. */
static uint8_t *list_file(const uint16_t *rep, const uint16_t *def, int n, int32_t num_values,
                          int64_t rows, size_t *len) {
  pqw_buf body = {0};
  levels_runs(&body, rep, n);
  levels_runs(&body, def, n);
  for (int i = 0; i < n; i++)
    if (def[i] == 3) pqw_le32(&body, (uint32_t)(i * 10));
  pqw_chunk c;
  pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
  page_v1(&c, num_values, &body, PQ_ENC_PLAIN);
  pqw_buf_free(&body);
  return file_of(kList, 4, &c, 1, rows, len);
}

TEST_IMPL(parquet_hostile_levels) {
  size_t len;
  uint8_t *d;
  pq_error err;
  static const uint16_t rep[] = {0, 1, 0, 1, 1}, def[] = {3, 3, 2, 3, 1};
  d = list_file(rep, def, 5, 5, 2, &len);
  ASSERT_OK(read_all(d, len, NULL, &err));
  free(d);
  /* Repetition levels that start at 1 (ARROW-GH-45185). */
  static const uint16_t rep1[] = {1, 1, 0, 1, 1};
  d = list_file(rep1, def, 5, 5, 2, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "l.list.element", "repetition levels start with 1");
  free(d);
  /* Fewer levels than num_values (ARROW-GH-41321, -RS-GH-6229-LEVELS). */
  d = list_file(rep, def, 5, 9, 2, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "l.list.element", "only 5 levels");
  free(d);
  /* Flat optional column: a level run too short, a length past the page,
   * a malformed run, an unknown level encoding. */
  for (int k = 0; k < 4; k++) {
    pqw_buf body = {0}, lv = {0};
    if (k == 0) {
      pqw_uvarint(&lv, 5 << 1);
      pqw_u8(&lv, 1);
      pqw_le32(&body, (uint32_t)lv.len);
      pqw_put(&body, lv.data, lv.len);
    } else if (k == 1) {
      pqw_le32(&body, 1000);
      pqw_u8(&body, 2);
    } else if (k == 2) {
      pqw_le32(&body, 2);
      pqw_u8(&body, 0x81); /* varint cut short */
      pqw_u8(&body, 0x80);
    } else {
      pqw_le32(&body, 2);
      pqw_u8(&body, 10 << 1);
      pqw_u8(&body, 1);
    }
    for (int i = 0; i < 10; i++) pqw_le32(&body, (uint32_t)i);
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 10;
    if (k == 3) h.def_encoding = 99;
    pqw_chunk_page(&c, &h, body.data, body.len, body.len);
    d = file_of(kOptInt, 2, &c, 1, 10, &len);
    static const char *const what[] = {"only 5 levels", "declared", "malformed run",
                                       "levels encoded as"};
    expect_fail(d, len, NULL, k == 3 ? LARDER_EUNSUPPORTED : LARDER_ECORRUPT, "a", what[k]);
    free(d);
    pqw_buf_free(&body);
    pqw_buf_free(&lv);
  }
  /* Levels say 10 values are present, the page holds 4. */
  {
    pqw_buf body = {0};
    uint16_t all[10] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    pqw_levels_v1(&body, all, 10, 1);
    for (int i = 0; i < 4; i++) pqw_le32(&body, (uint32_t)i);
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    page_v1(&c, 10, &body, PQ_ENC_PLAIN);
    d = file_of(kOptInt, 2, &c, 1, 10, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "PLAIN");
    free(d);
    pqw_buf_free(&body);
  }
  return 0;
}

/* Levels above the column's maximum must be refused, whatever encodes
 * them: RLE runs store their value in whole bytes, so a bit width that
 * fits the maximum does not bound them. */
TEST_IMPL(parquet_hostile_level_above_max) {
  size_t len;
  uint8_t *d;
  static const uint16_t rep[] = {0, 1, 0, 1, 1}, def[] = {3, 3, 2, 3, 1};
  /* A repeated column without nulls (every definition level the maximum)
   * and a repetition level of 2 where the maximum is 1: nothing downstream
   * notices, so only the level check can refuse it. */
  {
    pqw_schema rs[] = {pqw_root(1), pqw_leaf("r", PQ_INT32, PQ_REPEATED)};
    static const uint16_t rr[] = {0, 2, 0}, rd[] = {1, 1, 1};
    pqw_buf body = {0};
    levels_runs(&body, rr, 3);
    levels_runs(&body, rd, 3);
    for (int i = 0; i < 3; i++) pqw_le32(&body, (uint32_t)i);
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    page_v1(&c, 3, &body, PQ_ENC_PLAIN);
    pqw_buf_free(&body);
    d = file_of(rs, 2, &c, 1, 2, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "r", "repetition level 2 exceeds the maximum 1");
    free(d);
  }
  /* A flat optional column with definition level 2 (maximum 1). */
  {
    static const uint16_t fd[] = {1, 2, 0, 1};
    pqw_buf body = {0};
    levels_runs(&body, fd, 4);
    for (int i = 0; i < 3; i++) pqw_le32(&body, (uint32_t)i);
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    page_v1(&c, 4, &body, PQ_ENC_PLAIN);
    pqw_buf_free(&body);
    d = file_of(kOptInt, 2, &c, 1, 4, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "definition level 2 exceeds the maximum 1");
    free(d);
  }
  /* Levels above the maximum. */
  static const uint16_t def4[] = {3, 3, 2, 3, 4}, rep2[] = {0, 1, 0, 2, 1};
  d = list_file(rep, def4, 5, 5, 2, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "l.list.element",
              "definition level 4 exceeds the maximum 3");
  free(d);
  d = list_file(rep2, def, 5, 5, 2, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "l.list.element",
              "repetition level 2 exceeds the maximum 1");
  free(d);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Checksums                                                                 */

TEST_IMPL(parquet_hostile_crc) {
  for (int kind = 0; kind < 3; kind++) {
    int32_t v[6] = {10, 20, 30, 10, 20, 30};
    pqw_values vals = vals_fixed(PQ_INT32, v, 6);
    pqw_chunk_opts o = {0};
    o.crc = 1;
    o.v2 = kind == 1;
    o.encoding = kind == 2 ? PQ_ENC_RLE_DICTIONARY : PQ_ENC_PLAIN;
    o.codec = kind == 1 ? PQ_SNAPPY : PQ_UNCOMPRESSED;
    pqw_chunk c;
    pqw_chunk_build(&c, &vals, NULL, &o);
    /* Corrupt the stored CRC of the first page by flipping a body byte:
     * the last byte of the first page. */
    size_t first_end = c.num_pages > 1 ? c.page_off[1] : c.bytes.len;
    c.bytes.data[first_end - 1] ^= 0x40;
    size_t len;
    uint8_t *d = file_of(kReqInt, 2, &c, 1, 6, &len);
    expect_fail(d, len, NULL, LARDER_ECHECKSUM, "a", "CRC mismatch");
    pq_options o2;
    pq_options_init(&o2);
    o2.verify_crc = 0;
    pq_error err;
    int rc = read_all(d, len, &o2, &err);
    /* Unchecked, the damage is either harmless or a clean error. */
    expect_survives(rc, &err);
    ASSERT(rc != LARDER_ECHECKSUM);
    free(d);
  }
  /* A wrong CRC over intact data: unchecked reads give the values. */
  {
    int32_t v[3] = {7, 8, 9};
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 3;
    h.crc = 12345;
    pqw_chunk_page(&c, &h, v, sizeof(v), sizeof(v));
    size_t len;
    uint8_t *d = file_of(kReqInt, 2, &c, 1, 3, &len);
    expect_fail(d, len, NULL, LARDER_ECHECKSUM, "a", "stored 00003039");
    pq_options o2;
    pq_options_init(&o2);
    o2.verify_crc = 0;
    pq_error err;
    int64_t rows;
    ASSERT_OK(read_all_ex(d, len, &o2, 2, 0, &err, &rows));
    ASSERT_EQ(rows, 3);
    free(d);
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Schemas                                                                   */

TEST_IMPL(parquet_hostile_deep_schema) {
  /* 10000 nested groups: refused cleanly (and without deep recursion). */
  enum { DEEP = 10000 };
  pqw_schema *s = malloc((DEEP + 2) * sizeof(pqw_schema));
  ASSERT_NOT_NULL(s);
  s[0] = pqw_root(1);
  for (int i = 1; i <= DEEP; i++) s[i] = pqw_group("g", PQ_OPTIONAL, 1);
  s[DEEP + 1] = pqw_leaf("x", PQ_INT32, PQ_OPTIONAL);
  pqw_file f;
  pqw_file_init(&f, s, DEEP + 2);
  pqw_chunk c;
  pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
  pqw_page h;
  pqw_page_init(&h, PQ_PAGE_DATA);
  h.num_values = 0;
  pqw_chunk_page(&c, &h, "", 0, 0);
  pqw_file_add_row_group(&f, 0, &c, 1);
  pqw_chunk_free(&c);
  size_t len;
  uint8_t *d = pqw_file_finish(&f, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, NULL, "deeper than");
  free(d);
  /* 60 nested optional groups read fine: the value is 60 objects deep. */
  enum { OK_DEPTH = 60 };
  s[0] = pqw_root(1);
  for (int i = 1; i <= OK_DEPTH; i++) s[i] = pqw_group("g", PQ_OPTIONAL, 1);
  s[OK_DEPTH + 1] = pqw_leaf("x", PQ_INT32, PQ_OPTIONAL);
  uint16_t def[3] = {OK_DEPTH + 1, 0, OK_DEPTH};
  int32_t one = 42;
  pqw_values v = vals_fixed(PQ_INT32, &one, 1);
  pqw_levels lv = {3, def, NULL, OK_DEPTH + 1, 0};
  pqw_chunk_build(&c, &v, &lv, NULL);
  d = file_of(s, OK_DEPTH + 2, &c, 1, 3, &len);
  pq_source src;
  init_source(&src, d, len, 0);
  pq_file *pf = NULL;
  pq_error err;
  ASSERT_OK(pq_file_open(&src, NULL, &pf, &err));
  pq_projection *p = NULL;
  ASSERT_OK(pq_projection_create(pf, NULL, 0, &p, &err));
  pq_reader *r = NULL;
  ASSERT_OK(pq_reader_open(pf, &src, p, 0, NULL, &r, &err));
  pq_batch_t b;
  pq_batch_init(&b);
  ASSERT_EQ(pq_reader_next(r, 10, &b, &err), 3);
  pq_strbuf_t sb = {0};
  for (int row = 0; row < 3; row++) {
    sb.len = 0;
    ASSERT_OK(pq_json_append_row(&sb, &b, row));
    pqw_buf want = {0};
    pqw_put(&want, "{", 1);
    int depth = row == 0 ? OK_DEPTH : row == 1 ? 0 : OK_DEPTH;
    for (int i = 0; i < depth; i++) pqw_put(&want, "\"g\":{", 5);
    if (row == 1) pqw_put(&want, "\"g\":null", 8);
    else pqw_put(&want, row == 0 ? "\"x\":42" : "\"x\":null", row == 0 ? 6 : 8);
    for (int i = 0; i < depth; i++) pqw_put(&want, "}", 1);
    pqw_put(&want, "}", 2);
    ASSERT_STR_EQ(sb.data, (const char *)want.data);
    pqw_buf_free(&want);
  }
  pq_strbuf_free(&sb);
  pq_batch_free(&b);
  pq_reader_close(r);
  pq_projection_free(p);
  pq_file_close(pf);
  free(d);
  free(s);
  /* An empty group is refused when read. */
  pqw_schema e[] = {pqw_root(2), pqw_group("empty", PQ_OPTIONAL, 0),
                    pqw_leaf("a", PQ_INT32, PQ_REQUIRED)};
  int32_t vals[2] = {1, 2};
  pqw_values va = vals_fixed(PQ_INT32, vals, 2);
  pqw_chunk_build(&c, &va, NULL, NULL);
  d = file_of(e, 3, &c, 1, 2, &len);
  expect_fail(d, len, NULL, LARDER_EUNSUPPORTED, NULL, "'empty' contains a group with no columns");
  free(d);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Row counts                                                                */

TEST_IMPL(parquet_hostile_row_counts) {
  /* The row group declares 100 rows, the column holds 50. */
  pqw_file f;
  simple_file(&f, 50, PQ_UNCOMPRESSED);
  f.rg[0].num_rows = 100;
  size_t len;
  uint8_t *d = pqw_file_finish(&f, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "declares more rows than the column holds");
  free(d);
  /* The same for a list column (records counted by repetition levels). */
  static const uint16_t rep[] = {0, 1, 0, 1, 1}, def[] = {3, 3, 2, 3, 1};
  d = list_file(rep, def, 5, 5, 3, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "l.list.element", "declares more rows");
  free(d);
  /* Columns of different lengths (ARROW-GH-41317). */
  pqw_schema s[] = {pqw_root(2), pqw_leaf("a", PQ_INT32, PQ_REQUIRED),
                    pqw_leaf("b", PQ_INT32, PQ_REQUIRED)};
  int32_t v[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  pqw_values v10 = vals_fixed(PQ_INT32, v, 10), v7 = vals_fixed(PQ_INT32, v, 7);
  pqw_chunk c[2];
  pqw_chunk_build(&c[0], &v10, NULL, NULL);
  pqw_chunk_build(&c[1], &v7, NULL, NULL);
  d = file_of(s, 3, c, 2, 10, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "b", "declares more rows");
  /* Only the projected columns count. */
  pq_source src;
  init_source(&src, d, len, 0);
  pq_file *pf = NULL;
  pq_error err;
  ASSERT_OK(pq_file_open(&src, NULL, &pf, &err));
  const char *a[] = {"a"};
  pq_projection *p = NULL;
  ASSERT_OK(pq_projection_create(pf, a, 1, &p, &err));
  pq_reader *r = NULL;
  ASSERT_OK(pq_reader_open(pf, &src, p, 0, NULL, &r, &err));
  pq_batch_t b;
  pq_batch_init(&b);
  ASSERT_EQ(pq_reader_next(r, 100, &b, &err), 10);
  pq_batch_free(&b);
  pq_reader_close(r);
  pq_projection_free(p);
  pq_file_close(pf);
  free(d);
  /* Struct fields inside a list that disagree on the elements. */
  pqw_schema ls[] = {pqw_root(1),
                     pqw_group("ls", PQ_OPTIONAL, 1),
                     pqw_group("list", PQ_REPEATED, 1),
                     pqw_group("element", PQ_OPTIONAL, 2),
                     pqw_leaf("x", PQ_INT32, PQ_OPTIONAL),
                     pqw_leaf("y", PQ_INT32, PQ_OPTIONAL)};
  ls[1].logical = PQ_LT_LIST;
  static const uint16_t xr[] = {0, 1, 0}, xd[] = {4, 4, 4}, yr[] = {0, 1, 1, 0},
                        yd[] = {4, 4, 4, 4};
  pqw_values vx = vals_fixed(PQ_INT32, v, 3), vy = vals_fixed(PQ_INT32, v, 4);
  pqw_levels lx = {3, xd, xr, 4, 1}, ly = {4, yd, yr, 4, 1};
  pqw_chunk_build(&c[0], &vx, &lx, NULL);
  pqw_chunk_build(&c[1], &vy, &ly, NULL);
  d = file_of(ls, 6, c, 2, 2, &len);
  expect_fail(d, len, NULL, LARDER_ECORRUPT, "ls.list.element", "disagree");
  free(d);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Encodings, codecs and page kinds                                          */

TEST_IMPL(parquet_hostile_encodings) {
  size_t len;
  uint8_t *d;
  int32_t v[4] = {1, 2, 3, 4};
  struct {
    int physical, encoding, code;
    const char *what;
  } bad[] = {
      {PQ_INT32, 99, LARDER_EUNSUPPORTED, "values encoded as"},
      {PQ_INT32, 1, LARDER_EUNSUPPORTED, "GROUP_VAR_INT"},
      {PQ_INT32, PQ_ENC_RLE, LARDER_EUNSUPPORTED, "RLE values of type INT32"},
      {PQ_FLOAT, PQ_ENC_DELTA_BINARY_PACKED, LARDER_ECORRUPT,
       "DELTA_BINARY_PACKED values of type FLOAT"},
      {PQ_INT32, PQ_ENC_DELTA_LENGTH_BYTE_ARRAY, LARDER_ECORRUPT, "of type INT32"},
      {PQ_BOOLEAN, PQ_ENC_BYTE_STREAM_SPLIT, LARDER_ECORRUPT,
       "BYTE_STREAM_SPLIT values of type BOOLEAN"},
      {PQ_INT32, PQ_ENC_BYTE_STREAM_SPLIT, LARDER_ECORRUPT, "BYTE_STREAM_SPLIT: 15 bytes"},
      {PQ_INT32, PQ_ENC_DELTA_BINARY_PACKED, LARDER_ECORRUPT, "DELTA_BINARY_PACKED"},
  };
  for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
    pqw_schema s[] = {pqw_root(1), pqw_leaf("a", bad[i].physical, PQ_REQUIRED)};
    pqw_chunk c;
    pqw_chunk_init(&c, bad[i].physical, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 4;
    h.encoding = bad[i].encoding;
    pqw_chunk_page(&c, &h, v, bad[i].encoding == PQ_ENC_BYTE_STREAM_SPLIT ? 15 : 16, 16);
    d = file_of(s, 2, &c, 1, 4, &len);
    expect_fail(d, len, NULL, bad[i].code, "a", bad[i].what);
    free(d);
  }
  /* Delta encodings that lie. */
  {
    /* DELTA_BINARY_PACKED declaring 2 values for a 4-value page. */
    pqw_buf body = {0};
    int64_t x[2] = {1, 2};
    pqw_delta(&body, x, 2, 128, 4, 32);
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    page_v1(&c, 4, &body, PQ_ENC_DELTA_BINARY_PACKED);
    d = file_of(kReqInt, 2, &c, 1, 4, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "holds 2 values, the page needs 4");
    free(d);
    pqw_buf_free(&body);
  }
  pqw_schema sb[] = {pqw_root(1), pqw_leaf("s", PQ_BYTE_ARRAY, PQ_REQUIRED)};
  for (int k = 0; k < 4; k++) {
    pqw_buf body = {0};
    if (k == 0) { /* DLBA lengths beyond the page */
      int64_t lens[3] = {1, 1000, 1};
      pqw_delta(&body, lens, 3, 128, 4, 32);
      pqw_put(&body, "abc", 3);
    } else if (k == 1) { /* DLBA negative length */
      int64_t lens[3] = {1, -5, 1};
      pqw_delta(&body, lens, 3, 128, 4, 32);
      pqw_put(&body, "abcdef", 6);
    } else if (k == 2) { /* DBA prefix longer than the previous value */
      int64_t pre[3] = {0, 1, 9}, suf[3] = {2, 1, 1};
      pqw_delta(&body, pre, 3, 128, 4, 32);
      pqw_delta(&body, suf, 3, 128, 4, 32);
      pqw_put(&body, "abcde", 4);
    } else { /* DBA prefix and suffix counts disagree */
      int64_t pre[3] = {0, 1, 1}, suf[2] = {2, 1};
      pqw_delta(&body, pre, 3, 128, 4, 32);
      pqw_delta(&body, suf, 2, 128, 4, 32);
      pqw_put(&body, "abc", 3);
    }
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_BYTE_ARRAY, PQ_UNCOMPRESSED);
    page_v1(&c, 3, &body, k < 2 ? PQ_ENC_DELTA_LENGTH_BYTE_ARRAY : PQ_ENC_DELTA_BYTE_ARRAY);
    d = file_of(sb, 2, &c, 1, 3, &len);
    static const char *const what[] = {"lengths exceed the page", "negative length",
                                       "prefix 9 longer than the previous value",
                                       "2 lengths for 3 values"};
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "s", what[k]);
    free(d);
    pqw_buf_free(&body);
  }
  /* PLAIN byte arrays that run past the page. */
  {
    pqw_buf body = {0};
    pqw_le32(&body, 2);
    pqw_put(&body, "ab", 2);
    pqw_le32(&body, 0x7fffffff);
    pqw_put(&body, "cd", 2);
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_BYTE_ARRAY, PQ_UNCOMPRESSED);
    page_v1(&c, 2, &body, PQ_ENC_PLAIN);
    d = file_of(sb, 2, &c, 1, 2, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "s", "runs past the page");
    free(d);
    pqw_buf_free(&body);
  }
  /* Codecs: unknown, LZO, and garbage for a real one. */
  static const struct {
    int codec, code;
    const char *what;
  } codecs[] = {{99, LARDER_EUNSUPPORTED, "codec 99"},  {PQ_LZO, LARDER_EUNSUPPORTED, "LZO"},
                {-1, LARDER_EUNSUPPORTED, "codec -1"},  {PQ_ZSTD, LARDER_ECORRUPT, "zstd"},
                {PQ_BROTLI, LARDER_ECORRUPT, "brotli"}, {PQ_LZ4, LARDER_ECORRUPT, "lz4"}};
  for (size_t i = 0; i < ARRAY_LEN(codecs); i++) {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, codecs[i].codec);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 4;
    pqw_chunk_page(&c, &h, "garbage!garbage!", 16, 16);
    d = file_of(kReqInt, 2, &c, 1, 4, &len);
    expect_fail(d, len, NULL, codecs[i].code, "a", codecs[i].what);
    free(d);
  }
  return 0;
}

TEST_IMPL(parquet_hostile_page_kinds) {
  size_t len;
  uint8_t *d;
  int32_t v[3] = {1, 2, 3};
  pq_error err;
  int64_t rows;
  /* Index pages, unknown page types and empty data pages are skipped. */
  {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_INDEX);
    pqw_chunk_page(&c, &h, "xx", 2, 2);
    pqw_page_init(&h, 9);
    pqw_chunk_page(&c, &h, "yyy", 3, 3);
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 0;
    pqw_chunk_page(&c, &h, "", 0, 0);
    h.num_values = 3;
    pqw_chunk_page(&c, &h, v, 12, 12);
    d = file_of(kReqInt, 2, &c, 1, 3, &len);
    ASSERT_OK(read_all_ex(d, len, NULL, 2, 0, &err, &rows));
    ASSERT_EQ(rows, 3);
    free(d);
  }
  /* A data page without its sub-header, or with the wrong one, or with a
   * negative count; a page without a type. */
  for (int k = 0; k < 5; k++) {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, k == 1 ? PQ_PAGE_DATA_V2 : PQ_PAGE_DATA);
    h.num_values = k == 3 ? -3 : 3;
    if (k <= 1) h.omit_sub = 1;
    if (k == 2) h.sub_id = 8; /* a v1 page with a v2 header */
    if (k == 4) h.type = PQW_OMIT;
    pqw_chunk_page(&c, &h, v, 12, 12);
    d = file_of(kReqInt, 2, &c, 1, 3, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", k == 4 ? "lacks its type" : "data page header");
    free(d);
  }
  /* A page header cut off by the end of the chunk; garbage headers. */
  for (int k = 0; k < 3; k++) {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 3;
    pqw_chunk_page(&c, &h, v, 12, 12);
    if (k == 0) pqw_put(&c.bytes, "\x15\x00\x15", 3); /* half a header */
    if (k == 1) pqw_put(&c.bytes, "\xff\xff\xff\xff", 4);
    if (k == 2) pqw_put(&c.bytes, "\x1c\x1c\x1c\x1c\x1c\x1c\x1c\x1c", 8);
    d = file_of(kReqInt, 2, &c, 1, 6, &len);
    int rc = read_all(d, len, NULL, &err);
    ASSERT_EQ(rc, LARDER_ECORRUPT);
    ASSERT_STR_CONTAINS(err.msg, HOSTILE_NAME);
    ASSERT_STR_CONTAINS(err.msg, "column 'a'");
    if (k == 0) ASSERT_STR_CONTAINS(err.msg, "cut short");
    else ASSERT_STR_CONTAINS(err.msg, "page header");
    free(d);
  }
  /* A page header nested too deep, and one with a huge statistics blob. */
  {
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    for (int i = 0; i < 100; i++) pqw_u8(&c.bytes, 0x1c);
    for (int i = 0; i < 101; i++) pqw_u8(&c.bytes, 0);
    d = file_of(kReqInt, 2, &c, 1, 3, &len);
    expect_fail(d, len, NULL, LARDER_ECORRUPT, "a", "nesting too deep");
    free(d);
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Files that change while they are read                                     */

/* A file source maps the file; when the file shrinks under the reader, the
 * pages past the new end fault (SIGBUS), which must become LARDER_EIO. */
TEST_IMPL(parquet_hostile_file_truncated_while_read) {
  pqw_file f;
  simple_file(&f, 200000, PQ_UNCOMPRESSED); /* about 800 KB of pages */
  size_t len;
  uint8_t *data = pqw_file_finish(&f, &len);
  char path[600];
  snprintf(path, sizeof(path), "%s/shrinking.parquet", test_tmpdir());
  FILE *fp = fopen(path, "wb");
  ASSERT_NOT_NULL(fp);
  ASSERT_EQ(fwrite(data, 1, len, fp), len);
  ASSERT_OK(fclose(fp));
  free(data);
  for (int cut = 0; cut < 2; cut++) {
    pq_source src;
    pq_error err;
    ASSERT_OK(pq_source_open_file(&src, path, &err));
    pq_file *pf = NULL;
    ASSERT_OK(pq_file_open(&src, NULL, &pf, &err));
    pq_projection *p = NULL;
    ASSERT_OK(pq_projection_create(pf, NULL, 0, &p, &err));
    pq_reader *r = NULL;
    ASSERT_OK(pq_reader_open(pf, &src, p, 0, NULL, &r, &err));
    pq_batch_t b;
    pq_batch_init(&b);
    int64_t got = 0;
    if (cut == 1) ASSERT_EQ(pq_reader_next(r, 1000, &b, &err), 1000);
    ASSERT_OK(truncate(path, cut ? 8192 : 0));
    int64_t rc = 0;
    while ((rc = pq_reader_next(r, 5000, &b, &err)) > 0) got += rc;
    ASSERT_EQ(rc, LARDER_EIO);
    ASSERT_STR_CONTAINS(err.msg, path);
    ASSERT_STR_CONTAINS(err.msg, "column 'a', row group 0");
    ASSERT_STR_CONTAINS(err.msg, "truncated or changed");
    ASSERT_LT(got, 200000);
    /* The reader stays failed; closing everything is fine. */
    ASSERT(pq_reader_next(r, 10, &b, &err) < 0);
    pq_batch_free(&b);
    pq_reader_close(r);
    pq_projection_free(p);
    pq_file_close(pf);
    pq_source_close_file(&src);
    /* Put the file back for the next round. */
    pqw_file f2;
    simple_file(&f2, 200000, PQ_UNCOMPRESSED);
    data = pqw_file_finish(&f2, &len);
    fp = fopen(path, "wb");
    ASSERT_NOT_NULL(fp);
    ASSERT_EQ(fwrite(data, 1, len, fp), len);
    ASSERT_OK(fclose(fp));
    free(data);
  }
  /* Opening a file that is shorter than its footer says. */
  ASSERT_OK(truncate(path, 5000));
  pq_source src;
  pq_error err;
  ASSERT_OK(pq_source_open_file(&src, path, &err));
  pq_file *pf = NULL;
  ASSERT(pq_file_open(&src, NULL, &pf, &err) < 0);
  ASSERT_STR_CONTAINS(err.msg, path);
  pq_source_close_file(&src);
  return 0;
}

/* A FIFO where a file was expected fails at once: opening it must not wait
 * for a writer (that held a daemon worker for good). */
TEST_IMPL(parquet_hostile_fifo_source) {
  char path[600];
  snprintf(path, sizeof(path), "%s/fifo.parquet", test_tmpdir());
  ASSERT_OK(mkfifo(path, 0600));
  pq_source src;
  pq_error err;
  ASSERT_EQ(pq_source_open_file(&src, path, &err), LARDER_EIO);
  ASSERT_STR_CONTAINS(err.msg, "not a regular file");
  unlink(path);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The bad_data files of parquet-testing                                     */

TEST_IMPL(parquet_hostile_bad_data) {
  char dir[512];
  test_data_path(dir, sizeof(dir), "parquet-testing/bad_data");
  DIR *dp = opendir(dir);
  if (dp == NULL) return TEST_SKIP;
  int files = 0;
  struct dirent *e;
  while ((e = readdir(dp)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n < 8 || strcmp(e->d_name + n - 8, ".parquet") != 0) continue;
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    size_t len;
    uint8_t *data = test_read_file(path, &len);
    ASSERT_NOT_NULL(data);
    pq_error err;
    int rc = read_all(data, len, NULL, &err);
    if (rc == 0) ASSERT_FAIL_("%s read without an error", e->d_name);
    ASSERT_STR_CONTAINS(err.msg, HOSTILE_NAME);
    if (strstr(e->d_name, "41317")) ASSERT_STR_CONTAINS(err.msg, "declares more rows");
    if (strstr(e->d_name, "DICTHEADER")) ASSERT_STR_CONTAINS(err.msg, "column 'name'");
    if (strstr(e->d_name, "1481")) ASSERT_STR_CONTAINS(err.msg, "physical type");
    free(data);
    files++;
  }
  closedir(dp);
  ASSERT_GT(files, 0);
  return 0;
}
