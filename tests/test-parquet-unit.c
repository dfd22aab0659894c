/*
 * test-parquet-unit.c: unit tests of the Parquet module (daemon/pq_*.c)
 * through parquet.h and pq_internal.h.
 *
 * Conventions
 * -----------
 * - Every file is made in the test by tests/pqwrite.c and read from memory
 *   (pq_source_init_memory), so nothing depends on fixtures except the
 *   conformance smoke test, which reads tests/data/parquet-testing.
 * - Low-level decoders (bit unpacking, the RLE hybrid, DELTA_BINARY_PACKED,
 *   the Thrift reader) are checked against naive reference implementations
 *   written here or in pqwrite.c, on random data from a fixed seed.
 * - Decoder inputs live in buffers of exactly their length (malloc'd), so
 *   AddressSanitizer catches any read past the end.
 * - Rendering is checked through pq_json_append_row, which is what
 *   `larderctl cat` prints, with the expected text written out in full.
 */
#include <dirent.h>
#include <math.h>

#include "parquet/pq_internal.h"
#include "pqwrite.h"
#include "task.h"

#define UNIT_NAME "unit.parquet"
#define ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

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

/* A copy of n bytes in a buffer of exactly n bytes. */
static uint8_t *exact_copy(const void *p, size_t n) {
  uint8_t *c = malloc(n ? n : 1);
  ASSERT_NOT_NULL(c);
  if (n) memcpy(c, p, n);
  return c;
}

/* Reads every row group of a file in memory with a projection and a batch
 * size, appending each row's JSON and a newline to out.  Returns 0 or the
 * first error code (err filled). */
static int read_json(const uint8_t *data, size_t len, const char *const *cols, size_t ncols,
                     int64_t batch, const pq_options *opts, pqw_buf *out, pq_error *err) {
  pq_source src;
  pq_source_init_memory(&src, data, len, UNIT_NAME);
  pq_file *f = NULL;
  pq_projection *proj = NULL;
  pq_batch_t b;
  pq_batch_init(&b);
  pq_strbuf_t sb = {0};
  int rc = pq_file_open(&src, opts, &f, err);
  if (rc == 0) rc = pq_projection_create(f, cols, ncols, &proj, err);
  if (rc == 0) {
    const pq_file_meta_t *m = pq_file_meta(f);
    for (int g = 0; g < m->num_row_groups && rc == 0; g++) {
      pq_reader *r = NULL;
      rc = pq_reader_open(f, &src, proj, g, opts, &r, err);
      if (rc) break;
      int64_t total = 0;
      for (;;) {
        int64_t got = pq_reader_next(r, batch, &b, err);
        if (got < 0) {
          rc = (int)got;
          break;
        }
        if (got == 0) break;
        ASSERT_EQ(b.num_rows, got);
        ASSERT(got <= batch);
        for (int64_t i = 0; i < got; i++) {
          sb.len = 0;
          ASSERT_OK(pq_json_append_row(&sb, &b, i));
          pqw_put(out, sb.data, sb.len);
          pqw_u8(out, '\n');
        }
        total += got;
      }
      if (rc == 0) ASSERT_EQ(total, m->row_groups[g].num_rows);
      pq_reader_close(r);
    }
  }
  pq_strbuf_free(&sb);
  pq_batch_free(&b);
  pq_projection_free(proj);
  pq_file_close(f);
  return rc;
}

/* Reads the file and returns its JSON lines as a NUL-terminated string
 * (the caller frees it); the read must succeed. */
static char *json_of(const uint8_t *data, size_t len, const char *const *cols, size_t ncols,
                     int64_t batch) {
  pqw_buf out = {0};
  pq_error err = {0, ""};
  int rc = read_json(data, len, cols, ncols, batch, NULL, &out, &err);
  if (rc != 0) ASSERT_FAIL_("read failed: %d %s", rc, err.msg);
  pqw_u8(&out, 0);
  size_t n;
  return (char *)pqw_buf_take(&out, &n);
}

/* Builds a file of one row group from parallel arrays of column values and
 * levels (one per leaf; levels may be NULL for required flat columns). */
static uint8_t *build_file(const pqw_schema *schema, int ns, const pqw_values *vals,
                           const pqw_levels *const *lvs, int ncols, const pqw_chunk_opts *o,
                           int64_t rows, size_t *len) {
  pqw_file f;
  pqw_file_init(&f, schema, ns);
  pqw_chunk chunks[16];
  ASSERT(ncols <= 16);
  for (int c = 0; c < ncols; c++) pqw_chunk_build(&chunks[c], &vals[c], lvs ? lvs[c] : NULL, o);
  pqw_file_add_row_group(&f, rows, chunks, ncols);
  for (int c = 0; c < ncols; c++) pqw_chunk_free(&chunks[c]);
  return pqw_file_finish(&f, len);
}

/* Checks that the file renders as `expected` (JSON lines) with batch sizes
 * 1, 2 and 1000. */
static void expect_json(const uint8_t *data, size_t len, const char *expected) {
  static const int64_t batches[] = {1, 2, 1000};
  for (size_t i = 0; i < ARRAY_LEN(batches); i++) {
    char *got = json_of(data, len, NULL, 0, batches[i]);
    ASSERT_STR_EQ(got, expected);
    free(got);
  }
}

static pqw_values vals_fixed(int physical, const void *p, int64_t n) {
  pqw_values v;
  memset(&v, 0, sizeof(v));
  v.physical = physical;
  v.fixed = p;
  v.count = n;
  return v;
}

static pqw_values vals_flba(int32_t width, const void *p, int64_t n) {
  pqw_values v = vals_fixed(PQ_FIXED_LEN_BYTE_ARRAY, p, n);
  v.type_length = width;
  return v;
}

static pqw_values vals_bytes(const char *const *s, const int32_t *lens, int64_t n) {
  pqw_values v;
  memset(&v, 0, sizeof(v));
  v.physical = PQ_BYTE_ARRAY;
  v.bytes = s;
  v.lens = lens;
  v.count = n;
  return v;
}

static pqw_schema leaf_lt(const char *name, int physical, int rep, int logical) {
  pqw_schema s = pqw_leaf(name, physical, rep);
  s.logical = logical;
  return s;
}

static const char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/* Reference base64 with padding, into out (NUL-terminated). */
static void ref_base64(const uint8_t *p, size_t n, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < n; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16;
    if (i + 1 < n) v |= (uint32_t)p[i + 1] << 8;
    if (i + 2 < n) v |= p[i + 2];
    out[o++] = kB64[v >> 18];
    out[o++] = kB64[(v >> 12) & 63];
    out[o++] = i + 1 < n ? kB64[(v >> 6) & 63] : '=';
    out[o++] = i + 2 < n ? kB64[v & 63] : '=';
  }
  out[o] = '\0';
}

/* ------------------------------------------------------------------------ */
/* Bit unpacking                                                             */

/* Naive reference: w bits at bit offset `bit`, bits past the input zero. */
static uint64_t ref_bits(const uint8_t *in, size_t len, uint64_t bit, int w) {
  uint64_t v = 0;
  for (int b = 0; b < w; b++) {
    uint64_t pos = bit + (uint64_t)b;
    uint64_t byte = pos / 8 < len ? in[pos / 8] : 0;
    v |= ((byte >> (pos % 8)) & 1) << b;
  }
  return v;
}

TEST_IMPL(parquet_unit_unpack32) {
  rnd_seed(32);
  for (int w = 0; w <= 32; w++) {
    for (int trial = 0; trial < 60; trial++) {
      size_t len = rnd_below(trial < 10 ? 16 : 300);
      uint8_t *in = malloc(len ? len : 1);
      ASSERT_NOT_NULL(in);
      for (size_t i = 0; i < len; i++) in[i] = (uint8_t)rnd64();
      uint64_t max_index = w ? len * 8 / (size_t)w + 4 : 40;
      uint64_t start = rnd_below((uint32_t)max_index + 1);
      size_t n = rnd_below(trial % 3 == 0 ? 9 : 400);
      uint32_t *out = malloc((n ? n : 1) * sizeof(uint32_t));
      ASSERT_NOT_NULL(out);
      pq_unpack32(in, len, w, start, out, n);
      for (size_t i = 0; i < n; i++) {
        uint64_t want = ref_bits(in, len, (start + i) * (uint64_t)w, w);
        if (out[i] != want)
          ASSERT_FAIL_("w=%d len=%zu start=%llu i=%zu: got %u want %llu", w, len,
                       (unsigned long long)start, i, out[i], (unsigned long long)want);
      }
      free(out);
      free(in);
    }
  }
  return 0;
}

TEST_IMPL(parquet_unit_unpack64) {
  rnd_seed(64);
  for (int w = 0; w <= 64; w++) {
    for (int trial = 0; trial < 40; trial++) {
      size_t len = rnd_below(trial < 8 ? 20 : 600);
      uint8_t *in = malloc(len ? len : 1);
      ASSERT_NOT_NULL(in);
      for (size_t i = 0; i < len; i++) in[i] = (uint8_t)rnd64();
      uint64_t max_index = w ? len * 8 / (size_t)w + 4 : 40;
      uint64_t start = rnd_below((uint32_t)max_index + 1);
      size_t n = rnd_below(trial % 3 == 0 ? 9 : 300);
      uint64_t *out = malloc((n ? n : 1) * sizeof(uint64_t));
      ASSERT_NOT_NULL(out);
      pq_unpack64(in, len, w, start, out, n);
      for (size_t i = 0; i < n; i++) {
        uint64_t want = ref_bits(in, len, (start + i) * (uint64_t)w, w);
        if (out[i] != want)
          ASSERT_FAIL_("w=%d len=%zu start=%llu i=%zu: got %llu want %llu", w, len,
                       (unsigned long long)start, i, (unsigned long long)out[i],
                       (unsigned long long)want);
      }
      free(out);
      free(in);
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* RLE / bit-packing hybrid                                                  */

TEST_IMPL(parquet_unit_rle_runs) {
  /* Hand-made: an RLE run of 10 fives (width 3), then a bit-packed run of
   * one group holding 0..7, then an RLE run of 3 sevens. */
  const uint8_t bytes[] = {10 << 1, 5, (1 << 1) | 1, 0x88, 0xc6, 0xfa, 3 << 1, 7};
  uint8_t *in = exact_copy(bytes, sizeof(bytes));
  const uint32_t want[] = {5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 0, 1, 2, 3, 4, 5, 6, 7, 7, 7, 7};
  for (int step = 1; step <= 21; step++) {
    pq_rle_t r;
    pq_rle_init(&r, in, sizeof(bytes), 3);
    uint32_t got[32];
    int64_t done = 0;
    while (done < 21) {
      int64_t m = 21 - done < step ? 21 - done : step;
      ASSERT_EQ(pq_rle_get32(&r, got + done, m), m);
      done += m;
    }
    ASSERT_MEM_EQ(got, want, sizeof(want));
    ASSERT_EQ(pq_rle_get32(&r, got, 5), 0); /* the end */
    /* The same through the 16-bit decoder. */
    pq_rle_init(&r, in, sizeof(bytes), 3);
    uint16_t g16[32];
    done = 0;
    while (done < 21) {
      int64_t m = 21 - done < step ? 21 - done : step;
      ASSERT_EQ(pq_rle_get16(&r, g16 + done, m), m);
      done += m;
    }
    for (int i = 0; i < 21; i++) ASSERT_EQ(g16[i], want[i]);
  }
  /* Width 8: a bit-packed group of whole bytes, then an RLE run; wider
   * RLE values take two and four little-endian bytes. */
  const uint8_t b2[] = {(1 << 1) | 1, 1, 2, 3, 4, 5, 6, 7, 8, 4 << 1, 0x34};
  uint8_t *in2 = exact_copy(b2, sizeof(b2));
  pq_rle_t r;
  pq_rle_init(&r, in2, sizeof(b2), 8);
  uint32_t got[12];
  ASSERT_EQ(pq_rle_get32(&r, got, 12), 12);
  for (int i = 0; i < 8; i++) ASSERT_EQ(got[i], i + 1);
  for (int i = 8; i < 12; i++) ASSERT_EQ(got[i], 0x34);
  const uint8_t b3[] = {3 << 1, 0x34, 0x12, 2 << 1, 0x21, 0x43};
  uint8_t *in3 = exact_copy(b3, sizeof(b3));
  pq_rle_init(&r, in3, sizeof(b3), 16);
  ASSERT_EQ(pq_rle_get32(&r, got, 12), 5);
  ASSERT_EQ(got[0], 0x1234);
  ASSERT_EQ(got[4], 0x4321);
  free(in3);
  const uint8_t b4[] = {2 << 1, 0x78, 0x56, 0x34, 0x12};
  uint8_t *in4 = exact_copy(b4, sizeof(b4));
  pq_rle_init(&r, in4, sizeof(b4), 32);
  ASSERT_EQ(pq_rle_get32(&r, got, 12), 2);
  ASSERT_UINT_EQ(got[1], 0x12345678u);
  free(in4);
  free(in2);
  free(in);
  return 0;
}

TEST_IMPL(parquet_unit_rle_truncated) {
  /* Width 3, a bit-packed run that claims 3 groups (9 bytes) but has 5:
   * the 13 whole values there are decoded, then the data ends. */
  uint32_t vals[24];
  for (int i = 0; i < 24; i++) vals[i] = (uint32_t)(i * 5) & 7;
  pqw_buf b = {0};
  pqw_rle(&b, vals, 24, 3, PQW_RLE_PACKED_ONLY);
  ASSERT_EQ(b.len, 1 + 9);
  uint8_t *in = exact_copy(b.data, 1 + 5);
  pq_rle_t r;
  pq_rle_init(&r, in, 6, 3);
  uint32_t got[24];
  ASSERT_EQ(pq_rle_get32(&r, got, 24), 13);
  for (int i = 0; i < 13; i++) ASSERT_EQ(got[i], vals[i]);
  ASSERT_EQ(pq_rle_get32(&r, got, 24), 0);
  free(in);
  /* Every cut of a mixed stream decodes a correct prefix or fails cleanly. */
  uint32_t mixed[200];
  for (int i = 0; i < 200; i++) mixed[i] = i < 50 ? 9 : i < 90 ? (uint32_t)(i * 7) % 13 : 4;
  pqw_buf m = {0};
  pqw_rle(&m, mixed, 200, 4, PQW_RLE_AUTO);
  for (size_t cut = 0; cut <= m.len; cut++) {
    uint8_t *c = exact_copy(m.data, cut);
    pq_rle_init(&r, c, cut, 4);
    uint32_t out[200];
    int64_t n = pq_rle_get32(&r, out, 200);
    if (cut == m.len) ASSERT_EQ(n, 200);
    if (n > 0)
      for (int64_t i = 0; i < n; i++) ASSERT_EQ(out[i], mixed[i]);
    else ASSERT(n == 0 || n == LARDER_ECORRUPT);
    free(c);
  }
  /* An RLE run whose value bytes are missing (width 9: two bytes). */
  const uint8_t short_val[] = {4 << 1, 0x01};
  in = exact_copy(short_val, 2);
  pq_rle_init(&r, in, 2, 9);
  ASSERT_EQ(pq_rle_get32(&r, got, 4), LARDER_ECORRUPT);
  free(in);
  /* A run header cut in its varint, and one too long for 32 bits. */
  const uint8_t cut_hdr[] = {0x80};
  in = exact_copy(cut_hdr, 1);
  pq_rle_init(&r, in, 1, 2);
  ASSERT_EQ(pq_rle_get32(&r, got, 4), LARDER_ECORRUPT);
  free(in);
  const uint8_t long_hdr[] = {0xff, 0xff, 0xff, 0xff, 0x7f, 0x01};
  in = exact_copy(long_hdr, sizeof(long_hdr));
  pq_rle_init(&r, in, sizeof(long_hdr), 2);
  ASSERT_EQ(pq_rle_get32(&r, got, 4), LARDER_ECORRUPT);
  free(in);
  /* Width 33 is refused outright. */
  pq_rle_init(&r, short_val, 2, 33);
  ASSERT_EQ(pq_rle_get32(&r, got, 4), LARDER_ECORRUPT);
  pqw_buf_free(&b);
  pqw_buf_free(&m);
  return 0;
}

TEST_IMPL(parquet_unit_rle_widths) {
  rnd_seed(7);
  static const int modes[] = {PQW_RLE_AUTO, PQW_RLE_RUNS_ONLY, PQW_RLE_PACKED_ONLY};
  for (int w = 0; w <= 32; w++) {
    uint64_t mask = w == 32 ? 0xffffffffu : ((1ull << w) - 1);
    for (int trial = 0; trial < 12; trial++) {
      size_t n = 1 + rnd_below(trial < 4 ? 20 : 1500);
      uint32_t *v = malloc(n * sizeof(uint32_t));
      ASSERT_NOT_NULL(v);
      for (size_t i = 0; i < n;) {
        size_t run = 1 + rnd_below(trial % 2 ? 3 : 40);
        uint32_t x = (uint32_t)(rnd64() & mask);
        for (size_t k = 0; k < run && i < n; k++, i++) v[i] = x;
      }
      for (size_t mi = 0; mi < ARRAY_LEN(modes); mi++) {
        pqw_buf b = {0};
        pqw_rle(&b, v, n, w, modes[mi]);
        uint8_t *in = exact_copy(b.data, b.len);
        pq_rle_t r;
        pq_rle_init(&r, in, b.len, w);
        uint32_t *out = malloc(n * sizeof(uint32_t));
        ASSERT_NOT_NULL(out);
        size_t done = 0;
        while (done < n) {
          size_t m = 1 + rnd_below(300);
          if (m > n - done) m = n - done;
          ASSERT_EQ(pq_rle_get32(&r, out + done, (int64_t)m), (int64_t)m);
          done += m;
        }
        for (size_t i = 0; i < n; i++)
          if (out[i] != v[i])
            ASSERT_FAIL_("w=%d mode=%d n=%zu i=%zu: got %u want %u", w, modes[mi], n, i, out[i],
                         v[i]);
        if (modes[mi] == PQW_RLE_RUNS_ONLY) ASSERT_EQ(pq_rle_get32(&r, out, 1), 0);
        if (w <= 16) {
          uint16_t *o16 = malloc(n * sizeof(uint16_t));
          ASSERT_NOT_NULL(o16);
          pq_rle_init(&r, in, b.len, w);
          ASSERT_EQ(pq_rle_get16(&r, o16, (int64_t)n), (int64_t)n);
          for (size_t i = 0; i < n; i++) ASSERT_EQ(o16[i], v[i]);
          free(o16);
        }
        free(out);
        free(in);
        pqw_buf_free(&b);
      }
      free(v);
    }
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* DELTA_BINARY_PACKED                                                       */

/* Encodes v with the reference encoder and decodes it in random steps,
 * checking the values and where the encoding ends. */
static void delta_roundtrip(const int64_t *v, size_t n, int block, int mini, int bits) {
  pqw_buf b = {0};
  pqw_delta(&b, v, n, block, mini, bits);
  size_t enc_len = b.len;
  /* Bytes after the encoding must be left alone. */
  for (int i = 0; i < 7; i++) pqw_u8(&b, 0xa5);
  uint8_t *in = exact_copy(b.data, b.len);
  pq_delta_t *d = malloc(sizeof(*d));
  ASSERT_NOT_NULL(d);
  char why[200] = "";
  if (pq_delta_init(d, in, b.len, bits, why, sizeof(why)) != 0)
    ASSERT_FAIL_("init failed: %s (n=%zu block=%d mini=%d)", why, n, block, mini);
  ASSERT_UINT_EQ(d->total, n);
  size_t done = 0;
  if (bits == 32) {
    int32_t *out = malloc((n + 1) * sizeof(int32_t));
    ASSERT_NOT_NULL(out);
    while (done < n) {
      size_t m = 1 + rnd_below(200);
      if (m > n - done) m = n - done;
      ASSERT_EQ(pq_delta_get32(d, out + done, (int64_t)m), (int64_t)m);
      done += m;
    }
    for (size_t i = 0; i < n; i++)
      if (out[i] != (int32_t)v[i])
        ASSERT_FAIL_("n=%zu block=%d mini=%d i=%zu: got %d want %d", n, block, mini, i, out[i],
                     (int32_t)v[i]);
    ASSERT_EQ(pq_delta_get32(d, out, 1), 0);
    free(out);
  } else {
    int64_t *out = malloc((n + 1) * sizeof(int64_t));
    ASSERT_NOT_NULL(out);
    while (done < n) {
      size_t m = 1 + rnd_below(200);
      if (m > n - done) m = n - done;
      ASSERT_EQ(pq_delta_get64(d, out + done, (int64_t)m), (int64_t)m);
      done += m;
    }
    for (size_t i = 0; i < n; i++)
      if (out[i] != v[i])
        ASSERT_FAIL_("n=%zu block=%d mini=%d i=%zu: got %lld want %lld", n, block, mini, i,
                     (long long)out[i], (long long)v[i]);
    ASSERT_EQ(pq_delta_get64(d, out, 1), 0);
    free(out);
  }
  ASSERT_PTR_EQ(pq_delta_end(d), in + enc_len);
  /* Asking for more than there is returns what there is. */
  if (pq_delta_init(d, in, b.len, bits, why, sizeof(why)) != 0) ASSERT(0);
  int64_t *all = malloc((n + 10) * sizeof(int64_t));
  ASSERT_NOT_NULL(all);
  if (bits == 64) ASSERT_EQ(pq_delta_get64(d, all, (int64_t)n + 10), (int64_t)n);
  free(all);
  free(d);
  free(in);
  pqw_buf_free(&b);
}

static const size_t kDeltaTotals[] = {0,   1,   2,   3,   31,  32,  33,   65,  127,
                                      128, 129, 130, 255, 256, 257, 1000, 4097};
static const int kDeltaBlocks[][2] = {{128, 4}, {128, 1}, {256, 8}, {256, 4}, {1024, 32}};

static void delta_suite(int bits) {
  size_t max = 4097;
  int64_t *v = malloc(max * sizeof(int64_t));
  ASSERT_NOT_NULL(v);
  int64_t lo = bits == 32 ? INT32_MIN : INT64_MIN;
  int64_t hi = bits == 32 ? INT32_MAX : INT64_MAX;
  for (int pattern = 0; pattern < 7; pattern++) {
    for (size_t i = 0; i < max; i++) {
      uint64_t r = rnd64();
      switch (pattern) {
        case 0: v[i] = bits == 32 ? (int64_t)(int32_t)(uint32_t)r : (int64_t)r; break;
        case 1: v[i] = i % 2 ? hi : lo; break;       /* deltas wrap around */
        case 2: v[i] = 42; break;                    /* all deltas zero */
        case 3: v[i] = (int64_t)i * 3 - 1000; break; /* constant delta */
        case 4: v[i] = hi - (int64_t)(r % 5); break; /* near the top */
        case 5: v[i] = i % 3 == 0 ? lo : (int64_t)(r % 1000) - 500; break;
        default: v[i] = (int64_t)(r % 2000000) - 1000000; break;
      }
    }
    for (size_t t = 0; t < ARRAY_LEN(kDeltaTotals); t++)
      for (size_t k = 0; k < ARRAY_LEN(kDeltaBlocks); k++)
        delta_roundtrip(v, kDeltaTotals[t], kDeltaBlocks[k][0], kDeltaBlocks[k][1], bits);
  }
  free(v);
}

TEST_IMPL(parquet_unit_delta_int32) {
  rnd_seed(3232);
  delta_suite(32);
  return 0;
}

TEST_IMPL(parquet_unit_delta_int64) {
  rnd_seed(6464);
  delta_suite(64);
  /* The extremes one after the other, in every order. */
  const int64_t ext[] = {INT64_MIN, INT64_MAX,     0,        -1, 1, INT64_MIN, INT64_MIN + 1,
                         INT64_MAX, INT64_MAX - 1, INT64_MIN};
  for (size_t n = 1; n <= ARRAY_LEN(ext); n++) delta_roundtrip(ext, n, 128, 4, 64);
  return 0;
}

TEST_IMPL(parquet_unit_delta_malformed) {
  pq_delta_t *d = malloc(sizeof(*d));
  ASSERT_NOT_NULL(d);
  char why[200];
  struct {
    uint64_t block, mini;
  } bad[] = {{0, 4}, {100, 4}, {128, 3}, {128, 8}, {128, 0}, {(uint64_t)1 << 40, 4}};
  for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
    pqw_buf b = {0};
    pqw_uvarint(&b, bad[i].block);
    pqw_uvarint(&b, bad[i].mini);
    pqw_uvarint(&b, 10);
    pqw_zigzag(&b, 0);
    uint8_t *in = exact_copy(b.data, b.len);
    why[0] = '\0';
    ASSERT_EQ(pq_delta_init(d, in, b.len, 64, why, sizeof(why)), LARDER_ECORRUPT);
    ASSERT_STR_CONTAINS(why, "DELTA_BINARY_PACKED");
    free(in);
    pqw_buf_free(&b);
  }
  /* Every cut of the header fails; cuts of the body decode a prefix and
   * then fail. */
  int64_t v[300];
  for (int i = 0; i < 300; i++) v[i] = (int64_t)i * i - 7;
  pqw_buf b = {0};
  pqw_delta(&b, v, 300, 128, 4, 32);
  for (size_t cut = 0; cut < b.len; cut++) {
    uint8_t *in = exact_copy(b.data, cut);
    if (pq_delta_init(d, in, cut, 32, why, sizeof(why)) == 0) {
      int32_t out[300];
      int64_t got = pq_delta_get32(d, out, 300);
      ASSERT(got == LARDER_ECORRUPT || (got >= 0 && got <= 300));
      for (int64_t i = 0; i < got; i++) ASSERT_EQ(out[i], v[i]);
      if (got == 300) {
        /* Only the padding of the last miniblock was cut, which the
         * decoder accepts. */
        ASSERT_NOT_NULL(pq_delta_end(d));
        ASSERT(pq_delta_end(d) <= in + cut);
        ASSERT(cut > b.len - 64);
      } else {
        ASSERT_NULL(pq_delta_end(d));
      }
    } else {
      ASSERT_STR_CONTAINS(why, "truncated");
    }
    free(in);
  }
  /* Miniblock widths: above 32 is accepted for INT32 too (some writers
   * compute deltas in 64 bits; values wrap modulo 2^32), above 64 never. */
  for (int width = 33; width <= 65; width += 32) {
    pqw_buf w = {0};
    pqw_uvarint(&w, 128);
    pqw_uvarint(&w, 4);
    pqw_uvarint(&w, 5);
    pqw_zigzag(&w, 1);
    pqw_zigzag(&w, 0); /* min delta */
    for (int i = 0; i < 4; i++) pqw_u8(&w, (uint8_t)width);
    for (int i = 0; i < 300; i++) pqw_u8(&w, 0);
    uint8_t *in = exact_copy(w.data, w.len);
    ASSERT_OK(pq_delta_init(d, in, w.len, 32, why, sizeof(why)));
    int32_t out[5];
    int64_t got = pq_delta_get32(d, out, 5);
    if (width <= 64) {
      ASSERT_EQ(got, 5);
      for (int i = 0; i < 5; i++) ASSERT_EQ(out[i], 1);
    } else {
      ASSERT_EQ(got, LARDER_ECORRUPT);
    }
    ASSERT_OK(pq_delta_init(d, in, w.len, 64, why, sizeof(why)));
    int64_t out64[5];
    ASSERT_EQ(pq_delta_get64(d, out64, 5), width <= 64 ? 5 : LARDER_ECORRUPT);
    free(in);
    pqw_buf_free(&w);
  }
  /* INT32 deltas computed in 64 bits (as DuckDB writes them) decode
   * modulo 2^32: 0, then +2^32 + 5 (width 34), reads as 0, 5. */
  {
    pqw_buf w = {0};
    pqw_uvarint(&w, 128);
    pqw_uvarint(&w, 4);
    pqw_uvarint(&w, 2);
    pqw_zigzag(&w, 0);
    pqw_zigzag(&w, 0); /* min delta */
    pqw_u8(&w, 34);
    for (int i = 1; i < 4; i++) pqw_u8(&w, 0);
    uint64_t delta = ((uint64_t)1 << 32) + 5;
    pqw_bitpack(&w, &delta, 1, 34);
    for (int i = 0; i < 200; i++) pqw_u8(&w, 0);
    uint8_t *in = exact_copy(w.data, w.len);
    ASSERT_OK(pq_delta_init(d, in, w.len, 32, why, sizeof(why)));
    int32_t out[2];
    ASSERT_EQ(pq_delta_get32(d, out, 2), 2);
    ASSERT_EQ(out[0], 0);
    ASSERT_EQ(out[1], 5);
    free(in);
    pqw_buf_free(&w);
  }
  pqw_buf_free(&b);
  free(d);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Thrift                                                                    */

/* Writes one field of every kind the skipper must handle, then a last
 * field (id 1001) holding 42. */
static void thrift_every_type(pqw_buf *out) {
  pqw_thrift t;
  pqw_t_init(&t, out);
  pqw_t_push(&t);
  pqw_t_bool(&t, 1, 1);
  pqw_t_bool(&t, 2, 0);
  pqw_t_byte(&t, 3, -7);
  pqw_t_i16(&t, 4, -300);
  pqw_t_i32(&t, 5, 123456789);
  pqw_t_i64(&t, 6, INT64_MIN);
  pqw_t_double(&t, 7, 3.25);
  pqw_t_string(&t, 8, "hello");
  pqw_t_list_begin(&t, 9, PQ_TT_I32, 20); /* the long list header form */
  for (int i = 0; i < 20; i++) pqw_t_val_int(&t, i * 1000);
  pqw_t_list_begin(&t, 10, PQ_TT_TRUE, 3);
  pqw_t_val_bool(&t, 1);
  pqw_t_val_bool(&t, 0);
  pqw_t_val_bool(&t, 1);
  pqw_t_set_begin(&t, 11, PQ_TT_BINARY, 2);
  pqw_t_val_binary(&t, "ab", 2);
  pqw_t_val_binary(&t, "", 0);
  pqw_t_map_begin(&t, 12, PQ_TT_I32, PQ_TT_BINARY, 2);
  pqw_t_val_int(&t, 1);
  pqw_t_val_binary(&t, "one", 3);
  pqw_t_val_int(&t, 2);
  pqw_t_val_binary(&t, "two", 3);
  pqw_t_map_begin(&t, 13, PQ_TT_TRUE, PQ_TT_FALSE, 2);
  pqw_t_val_bool(&t, 1);
  pqw_t_val_bool(&t, 0);
  pqw_t_val_bool(&t, 0);
  pqw_t_val_bool(&t, 1);
  pqw_t_map_begin(&t, 14, 0, 0, 0);        /* an empty map has no type byte */
  pqw_t_list_begin(&t, 15, PQ_TT_LIST, 2); /* list<list<i64>> */
  pqw_u8(t.out, (uint8_t)(2 << 4 | PQ_TT_I64));
  pqw_t_val_int(&t, -1);
  pqw_t_val_int(&t, 1);
  pqw_u8(t.out, (uint8_t)(0 << 4 | PQ_TT_I64));
  pqw_t_list_begin(&t, 16, PQ_TT_STRUCT, 2); /* list<struct> */
  for (int i = 0; i < 2; i++) {
    pqw_t_push(&t);
    pqw_t_i32(&t, 1, i);
    pqw_t_string(&t, 2, "x");
    pqw_t_struct_end(&t);
  }
  pqw_t_map_begin(&t, 17, PQ_TT_BINARY, PQ_TT_LIST, 1); /* map<binary, list<struct>> */
  pqw_t_val_binary(&t, "k", 1);
  pqw_u8(t.out, (uint8_t)(1 << 4 | PQ_TT_STRUCT));
  pqw_t_push(&t);
  pqw_t_double(&t, 5, 1.0);
  pqw_t_struct_end(&t);
  pqw_t_struct_begin(&t, 18); /* struct { struct { i32; list<i64> }; binary } */
  pqw_t_struct_begin(&t, 1);
  pqw_t_i32(&t, 1, 5);
  pqw_t_list_begin(&t, 2, PQ_TT_I64, 1);
  pqw_t_val_int(&t, 99);
  pqw_t_struct_end(&t);
  pqw_t_binary(&t, 3, "\0\1", 2);
  pqw_t_struct_end(&t);
  pqw_t_map_begin(&t, 19, PQ_TT_STRUCT, PQ_TT_DOUBLE, 1); /* map<struct, double> */
  pqw_t_push(&t);
  pqw_t_byte(&t, 1, 1);
  pqw_t_struct_end(&t);
  pqw_t_val_double(&t, 2.5);
  pqw_t_list_begin(&t, 20, PQ_TT_BYTE, 3);
  for (int i = 0; i < 3; i++) pqw_t_val_byte(&t, (int8_t)i);
  pqw_t_list_begin(&t, 21, PQ_TT_DOUBLE, 1);
  pqw_t_val_double(&t, -1);
  pqw_t_set_begin(&t, 22, PQ_TT_MAP, 1); /* set<map<i16,i16>> */
  pqw_uvarint(t.out, 1);
  pqw_u8(t.out, (uint8_t)(PQ_TT_I16 << 4 | PQ_TT_I16));
  pqw_t_val_int(&t, 1);
  pqw_t_val_int(&t, 2);
  pqw_t_i32(&t, 900, -1); /* a long jump in ids: the long header form */
  pqw_t_i32(&t, -5, 3);   /* a negative id */
  pqw_t_i32(&t, 1001, 42);
  pqw_t_struct_end(&t);
}

TEST_IMPL(parquet_unit_thrift_skip) {
  pqw_buf b = {0};
  thrift_every_type(&b);
  uint8_t *in = exact_copy(b.data, b.len);
  pq_thrift_t t;
  pq_thrift_init(&t, in, b.len);
  int16_t last, id = 0;
  int type;
  int64_t answer = -1;
  int fields = 0;
  pq_thrift_struct_begin(&t, &last);
  while (pq_thrift_field(&t, &last, &id, &type)) {
    fields++;
    if (id == 1001) answer = pq_thrift_int(&t, type);
    else pq_thrift_skip(&t, type);
  }
  pq_thrift_struct_end(&t);
  if (t.failed) ASSERT_FAIL_("thrift failed: %s", t.why);
  ASSERT_EQ(answer, 42);
  ASSERT_EQ(fields, 25);
  ASSERT_PTR_EQ(t.p, in + b.len);
  ASSERT_EQ(t.depth, 0);
  /* Typed reads of the same fields. */
  pq_thrift_init(&t, in, b.len);
  pq_thrift_struct_begin(&t, &last);
  while (pq_thrift_field(&t, &last, &id, &type)) {
    switch (id) {
      case 1: ASSERT_EQ(pq_thrift_bool(type), 1); break;
      case 2: ASSERT_EQ(pq_thrift_bool(type), 0); break;
      case 3: ASSERT_EQ(pq_thrift_int(&t, type), -7); break;
      case 4: ASSERT_EQ(pq_thrift_int(&t, type), -300); break;
      case 5: ASSERT_EQ(pq_thrift_int(&t, type), 123456789); break;
      case 6: ASSERT_EQ(pq_thrift_int(&t, type), INT64_MIN); break;
      case 8: {
        size_t len;
        const uint8_t *s = pq_thrift_binary(&t, type, &len);
        ASSERT_EQ(len, 5);
        ASSERT_MEM_EQ(s, "hello", 5);
        break;
      }
      case 9: {
        int et;
        int64_t n = pq_thrift_list(&t, type, &et);
        ASSERT_EQ(n, 20);
        ASSERT_EQ(et, PQ_TT_I32);
        for (int i = 0; i < 20; i++) ASSERT_EQ(pq_thrift_int(&t, et), i * 1000);
        break;
      }
      case 10: {
        int et;
        ASSERT_EQ(pq_thrift_list(&t, type, &et), 3);
        ASSERT_EQ(pq_thrift_list_bool(&t), 1);
        ASSERT_EQ(pq_thrift_list_bool(&t), 0);
        ASSERT_EQ(pq_thrift_list_bool(&t), 1);
        break;
      }
      case -5: ASSERT_EQ(pq_thrift_int(&t, type), 3); break;
      default: pq_thrift_skip(&t, type); break;
    }
  }
  pq_thrift_struct_end(&t);
  ASSERT_EQ(t.failed, 0);
  /* Every cut fails as truncated, never reads past the cut. */
  for (size_t cut = 0; cut < b.len; cut++) {
    uint8_t *c = exact_copy(in, cut);
    pq_thrift_init(&t, c, cut);
    pq_thrift_struct_begin(&t, &last);
    while (pq_thrift_field(&t, &last, &id, &type)) pq_thrift_skip(&t, type);
    pq_thrift_struct_end(&t);
    ASSERT_EQ(t.failed, 1);
    ASSERT_EQ(t.truncated, 1);
    free(c);
  }
  free(in);
  pqw_buf_free(&b);
  return 0;
}

/* Skips a top-level struct; returns whether it failed. */
static int thrift_skip_all(const uint8_t *p, size_t n, char *why, size_t why_len) {
  pq_thrift_t t;
  pq_thrift_init(&t, p, n);
  int16_t last, id;
  int type;
  pq_thrift_struct_begin(&t, &last);
  while (pq_thrift_field(&t, &last, &id, &type)) pq_thrift_skip(&t, type);
  pq_thrift_struct_end(&t);
  snprintf(why, why_len, "%s", t.why);
  return t.failed;
}

/* A top-level struct with `depth` structs nested in field 1. */
static uint8_t *nested_structs(size_t depth, size_t *len) {
  pqw_buf b = {0};
  for (size_t i = 0; i < depth; i++) pqw_u8(&b, 1 << 4 | PQ_TT_STRUCT);
  for (size_t i = 0; i <= depth; i++) pqw_u8(&b, PQ_TT_STOP);
  return pqw_buf_take(&b, len);
}

/* A top-level struct whose field 1 is a list nested `depth` deep. */
static uint8_t *nested_lists(size_t depth, size_t *len) {
  pqw_buf b = {0};
  pqw_u8(&b, 1 << 4 | PQ_TT_LIST);
  for (size_t i = 1; i < depth; i++) pqw_u8(&b, 1 << 4 | PQ_TT_LIST);
  pqw_u8(&b, 0 << 4 | PQ_TT_I32);
  pqw_u8(&b, PQ_TT_STOP);
  return pqw_buf_take(&b, len);
}

TEST_IMPL(parquet_unit_thrift_depth) {
  char why[160];
  size_t len;
  /* The top-level struct counts as one level: 63 nested structs are the
   * deepest allowed (64 in all). */
  uint8_t *p = nested_structs(63, &len);
  ASSERT_EQ(thrift_skip_all(p, len, why, sizeof(why)), 0);
  free(p);
  p = nested_structs(64, &len);
  ASSERT_EQ(thrift_skip_all(p, len, why, sizeof(why)), 1);
  ASSERT_STR_CONTAINS(why, "nesting too deep");
  free(p);
  /* Far deeper input fails the same way, without recursing that deep. */
  p = nested_structs(200000, &len);
  ASSERT_EQ(thrift_skip_all(p, len, why, sizeof(why)), 1);
  ASSERT_STR_CONTAINS(why, "nesting too deep");
  free(p);
  p = nested_lists(10, &len);
  ASSERT_EQ(thrift_skip_all(p, len, why, sizeof(why)), 0);
  free(p);
  p = nested_lists(200000, &len);
  ASSERT_EQ(thrift_skip_all(p, len, why, sizeof(why)), 1);
  ASSERT_STR_CONTAINS(why, "nesting too deep");
  free(p);
  /* Maps of maps. */
  pqw_buf b = {0};
  pqw_u8(&b, 1 << 4 | PQ_TT_MAP);
  for (int i = 0; i < 5000; i++) {
    pqw_uvarint(&b, 1);
    pqw_u8(&b, PQ_TT_I32 << 4 | PQ_TT_MAP);
    pqw_u8(&b, 0);
  }
  pqw_uvarint(&b, 0);
  pqw_u8(&b, PQ_TT_STOP);
  ASSERT_EQ(thrift_skip_all(b.data, b.len, why, sizeof(why)), 1);
  ASSERT_STR_CONTAINS(why, "nesting too deep");
  pqw_buf_free(&b);
  return 0;
}

TEST_IMPL(parquet_unit_thrift_errors) {
  char why[160];
  /* Field type 13, 14, 15 do not exist. */
  for (int type = 13; type <= 15; type++) {
    uint8_t p[] = {(uint8_t)(1 << 4 | type), 0, 0};
    ASSERT_EQ(thrift_skip_all(p, sizeof(p), why, sizeof(why)), 1);
    ASSERT_STR_CONTAINS(why, "unknown field type");
  }
  /* A varint longer than ten bytes, and one that overflows 64 bits. */
  uint8_t v11[] = {
      1 << 4 | PQ_TT_I64, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0};
  ASSERT_EQ(thrift_skip_all(v11, sizeof(v11), why, sizeof(why)), 1);
  uint8_t v10[] = {
      1 << 4 | PQ_TT_I64, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0};
  ASSERT_EQ(thrift_skip_all(v10, sizeof(v10), why, sizeof(why)), 1);
  ASSERT_STR_CONTAINS(why, "varint");
  /* A field id that does not fit 16 bits (long form). */
  pqw_buf b = {0};
  pqw_u8(&b, PQ_TT_I32);
  pqw_zigzag(&b, 70000);
  pqw_u8(&b, 0);
  pqw_u8(&b, 0);
  ASSERT_EQ(thrift_skip_all(b.data, b.len, why, sizeof(why)), 1);
  ASSERT_STR_CONTAINS(why, "field id");
  pqw_buf_free(&b);
  /* A list of an unknown element type, and one longer than the input. */
  uint8_t lu[] = {1 << 4 | PQ_TT_LIST, 2 << 4 | 14, 0, 0, 0};
  ASSERT_EQ(thrift_skip_all(lu, sizeof(lu), why, sizeof(why)), 1);
  ASSERT_STR_CONTAINS(why, "element type");
  pqw_uvarint(&b, 0); /* reuse b */
  b.len = 0;
  pqw_u8(&b, 1 << 4 | PQ_TT_LIST);
  pqw_u8(&b, 0xf0 | PQ_TT_I32);
  pqw_uvarint(&b, (uint64_t)1 << 40);
  pqw_u8(&b, 0);
  pq_thrift_t t;
  pq_thrift_init(&t, b.data, b.len);
  int16_t last, id;
  int type;
  pq_thrift_struct_begin(&t, &last);
  ASSERT_EQ(pq_thrift_field(&t, &last, &id, &type), 1);
  int et;
  ASSERT_EQ(pq_thrift_list(&t, type, &et), 0);
  ASSERT_EQ(t.failed, 1);
  ASSERT_EQ(t.truncated, 1);
  /* A binary longer than the input. */
  b.len = 0;
  pqw_u8(&b, 1 << 4 | PQ_TT_BINARY);
  pqw_uvarint(&b, 1000);
  pqw_put(&b, "abc", 3);
  pq_thrift_init(&t, b.data, b.len);
  pq_thrift_struct_begin(&t, &last);
  ASSERT_EQ(pq_thrift_field(&t, &last, &id, &type), 1);
  size_t blen;
  ASSERT_NULL(pq_thrift_binary(&t, type, &blen));
  ASSERT_EQ(t.truncated, 1);
  /* Reading a field as the wrong type fails, and the failure sticks. */
  b.len = 0;
  pqw_thrift w;
  pqw_t_init(&w, &b);
  pqw_t_push(&w);
  pqw_t_string(&w, 1, "text");
  pqw_t_i32(&w, 2, 5);
  pqw_t_struct_end(&w);
  pq_thrift_init(&t, b.data, b.len);
  pq_thrift_struct_begin(&t, &last);
  ASSERT_EQ(pq_thrift_field(&t, &last, &id, &type), 1);
  ASSERT_EQ(pq_thrift_int(&t, type), 0);
  ASSERT_EQ(t.failed, 1);
  ASSERT_EQ(pq_thrift_field(&t, &last, &id, &type), 0);
  pqw_buf_free(&b);
  return 0;
}

TEST_IMPL(parquet_unit_page_header) {
  pqw_page h;
  pqw_page_init(&h, PQ_PAGE_DATA_V2);
  h.num_values = 1000;
  h.num_nulls = 10;
  h.num_rows = 900;
  h.encoding = PQ_ENC_RLE_DICTIONARY;
  h.def_length = 12;
  h.rep_length = 34;
  h.is_compressed = 0;
  h.crc = (int32_t)0xdeadbeefu;
  h.extra_id = 20; /* unknown fields are skipped */
  h.extra_type = PQ_TT_STRUCT;
  pqw_buf b = {0};
  uint8_t body[7] = {0};
  pqw_page_header(&b, &h, body, 7, 99);
  size_t hlen = b.len;
  pqw_put(&b, body, 7);
  uint8_t *in = exact_copy(b.data, b.len);
  pq_page_header_t ph;
  char why[200] = "";
  ASSERT_EQ(pq_page_header_parse(in, b.len, &ph, why, sizeof(why)), (int64_t)hlen);
  ASSERT_EQ(ph.type, PQ_PAGE_DATA_V2);
  ASSERT_EQ(ph.uncompressed_size, 99);
  ASSERT_EQ(ph.compressed_size, 7);
  ASSERT_EQ(ph.has_crc, 1);
  ASSERT_UINT_EQ(ph.crc, 0xdeadbeefu);
  ASSERT_EQ(ph.has_v2, 1);
  ASSERT_EQ(ph.num_values, 1000);
  ASSERT_EQ(ph.num_nulls, 10);
  ASSERT_EQ(ph.num_rows, 900);
  ASSERT_EQ(ph.encoding, PQ_ENC_RLE_DICTIONARY);
  ASSERT_EQ(ph.def_length, 12);
  ASSERT_EQ(ph.rep_length, 34);
  ASSERT_EQ(ph.is_compressed, 0);
  /* Every cut asks for more bytes. */
  for (size_t cut = 0; cut < hlen; cut++) {
    uint8_t *c = exact_copy(in, cut);
    ASSERT_EQ(pq_page_header_parse(c, cut, &ph, why, sizeof(why)), 0);
    free(c);
  }
  free(in);
  /* v1 and dictionary headers, with every unknown field type after them. */
  for (int et = PQ_TT_TRUE; et <= PQ_TT_STRUCT; et++) {
    pqw_page_init(&h, et % 2 ? PQ_PAGE_DATA : PQ_PAGE_DICTIONARY);
    h.num_values = 5;
    h.encoding = PQ_ENC_PLAIN;
    h.def_encoding = PQ_ENC_BIT_PACKED;
    h.extra_id = 9;
    h.extra_type = et;
    b.len = 0;
    pqw_page_header(&b, &h, body, 3, 3);
    ASSERT_EQ(pq_page_header_parse(b.data, b.len, &ph, why, sizeof(why)), (int64_t)b.len);
    ASSERT_EQ(ph.num_values, 5);
    if (et % 2) {
      ASSERT_EQ(ph.has_v1, 1);
      ASSERT_EQ(ph.def_encoding, PQ_ENC_BIT_PACKED);
    } else {
      ASSERT_EQ(ph.has_dict, 1);
    }
  }
  /* A header without sizes is corrupt. */
  pqw_page_init(&h, PQ_PAGE_DATA);
  h.compressed_size = PQW_OMIT;
  b.len = 0;
  pqw_page_header(&b, &h, body, 3, 3);
  ASSERT_EQ(pq_page_header_parse(b.data, b.len, &ph, why, sizeof(why)), LARDER_ECORRUPT);
  ASSERT_STR_CONTAINS(why, "sizes");
  pqw_buf_free(&b);
  return 0;
}

/* Files with an unknown field of every Thrift type in the FileMetaData and
 * in the page headers still read. */
TEST_IMPL(parquet_unit_thrift_unknown_fields) {
  for (int et = PQ_TT_TRUE; et <= PQ_TT_STRUCT; et++) {
    pqw_schema s[2] = {pqw_root(1), pqw_leaf("a", PQ_INT32, PQ_REQUIRED)};
    pqw_file f;
    pqw_file_init(&f, s, 2);
    pqw_chunk c;
    pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
    int32_t vals[3] = {7, 8, 9};
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DATA);
    h.num_values = 3;
    h.extra_id = 77;
    h.extra_type = et;
    pqw_chunk_page(&c, &h, vals, sizeof(vals), sizeof(vals));
    pqw_file_add_row_group(&f, 3, &c, 1);
    pqw_chunk_free(&c);
    size_t meta_start = f.out.len;
    pqw_file_meta(&f.out, &f);
    /* Replace the final STOP with an unknown field and a STOP. */
    f.out.len--;
    pqw_thrift t;
    pqw_t_init(&t, &f.out);
    pqw_t_push(&t);
    t.last[t.depth] = 6;
    pqw_t_field(&t, 100, et);
    switch (et) {
      case PQ_TT_TRUE:
      case PQ_TT_FALSE: break;
      case PQ_TT_BYTE: pqw_t_val_byte(&t, 1); break;
      case PQ_TT_I16:
      case PQ_TT_I32:
      case PQ_TT_I64: pqw_t_val_int(&t, -99); break;
      case PQ_TT_DOUBLE: pqw_t_val_double(&t, 1.5); break;
      case PQ_TT_BINARY: pqw_t_val_binary(&t, "zz", 2); break;
      case PQ_TT_LIST:
      case PQ_TT_SET:
        pqw_u8(t.out, 2 << 4 | PQ_TT_BINARY);
        pqw_t_val_binary(&t, "a", 1);
        pqw_t_val_binary(&t, "b", 1);
        break;
      case PQ_TT_MAP:
        pqw_uvarint(t.out, 1);
        pqw_u8(t.out, PQ_TT_I32 << 4 | PQ_TT_STRUCT);
        pqw_t_val_int(&t, 1);
        pqw_t_push(&t);
        pqw_t_string(&t, 3, "nested");
        pqw_t_struct_end(&t);
        break;
      case PQ_TT_STRUCT:
        pqw_t_push(&t);
        pqw_t_list_begin(&t, 1, PQ_TT_STRUCT, 1);
        pqw_t_push(&t);
        pqw_t_bool(&t, 1, 1);
        pqw_t_struct_end(&t);
        pqw_t_struct_end(&t);
        break;
      default: break;
    }
    pqw_t_struct_end(&t);
    pqw_tail(&f.out, meta_start);
    size_t len;
    uint8_t *data = pqw_buf_take(&f.out, &len);
    pqw_file_free(&f);
    expect_json(data, len, "{\"a\":7}\n{\"a\":8}\n{\"a\":9}\n");
    free(data);
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* JSON rendering                                                            */

static pqw_schema leaf_int(const char *name, int physical, int bits, int is_signed) {
  pqw_schema s = leaf_lt(name, physical, PQ_REQUIRED, PQ_LT_INTEGER);
  s.lt_bits = bits;
  s.lt_signed = is_signed;
  return s;
}

TEST_IMPL(parquet_unit_json_integers) {
  pqw_schema s[10] = {pqw_root(9),
                      leaf_int("i8", PQ_INT32, 8, 1),
                      leaf_int("u8", PQ_INT32, 8, 0),
                      leaf_int("i16", PQ_INT32, 16, 1),
                      leaf_int("u16", PQ_INT32, 16, 0),
                      leaf_int("u32", PQ_INT32, 32, 0),
                      leaf_int("u64", PQ_INT64, 64, 0),
                      pqw_leaf("i64", PQ_INT64, PQ_REQUIRED),
                      pqw_leaf("c8", PQ_INT32, PQ_REQUIRED),
                      pqw_leaf("cu16", PQ_INT32, PQ_REQUIRED)};
  s[8].converted = 15; /* INT_8 */
  s[9].converted = 12; /* UINT_16 */
  static const int32_t i8[] = {-128, 127, 0}, u8[] = {255, 0, 7};
  static const int32_t i16[] = {-32768, 32767, 1}, u16[] = {65535, 0, 2};
  static const int32_t u32[] = {-1, 0, INT32_MIN};
  static const int64_t u64[] = {-1, 0, INT64_MIN}, i64[] = {INT64_MIN, INT64_MAX, 0};
  static const int32_t c8[] = {-1, 127, -128}, cu16[] = {65535, 0, 1};
  pqw_values v[9] = {
      vals_fixed(PQ_INT32, i8, 3),  vals_fixed(PQ_INT32, u8, 3),  vals_fixed(PQ_INT32, i16, 3),
      vals_fixed(PQ_INT32, u16, 3), vals_fixed(PQ_INT32, u32, 3), vals_fixed(PQ_INT64, u64, 3),
      vals_fixed(PQ_INT64, i64, 3), vals_fixed(PQ_INT32, c8, 3),  vals_fixed(PQ_INT32, cu16, 3)};
  size_t len;
  uint8_t *data = build_file(s, 10, v, NULL, 9, NULL, 3, &len);
  expect_json(data, len,
              "{\"i8\":-128,\"u8\":255,\"i16\":-32768,\"u16\":65535,\"u32\":4294967295,"
              "\"u64\":18446744073709551615,\"i64\":-9223372036854775808,\"c8\":-1,"
              "\"cu16\":65535}\n"
              "{\"i8\":127,\"u8\":0,\"i16\":32767,\"u16\":0,\"u32\":0,\"u64\":0,"
              "\"i64\":9223372036854775807,\"c8\":127,\"cu16\":0}\n"
              "{\"i8\":0,\"u8\":7,\"i16\":1,\"u16\":2,\"u32\":2147483648,"
              "\"u64\":9223372036854775808,\"i64\":0,\"c8\":-128,\"cu16\":1}\n");
  free(data);
  return 0;
}

/* Big-endian two's complement bytes of v in w bytes. */
static void be_bytes(__int128 v, uint8_t *out, int w) {
  for (int i = w - 1; i >= 0; i--) {
    out[i] = (uint8_t)(v & 0xff);
    v >>= 8;
  }
}

TEST_IMPL(parquet_unit_json_decimal) {
  pqw_schema s[7] = {pqw_root(6),
                     pqw_leaf("d1", PQ_INT32, PQ_REQUIRED),
                     pqw_leaf("d2", PQ_INT64, PQ_REQUIRED),
                     pqw_leaf("d3", PQ_FIXED_LEN_BYTE_ARRAY, PQ_REQUIRED),
                     pqw_leaf("d4", PQ_BYTE_ARRAY, PQ_REQUIRED),
                     pqw_leaf("d5", PQ_FIXED_LEN_BYTE_ARRAY, PQ_REQUIRED),
                     pqw_leaf("d6", PQ_INT32, PQ_REQUIRED)};
  /* d1: the LogicalType; d2: only the legacy ConvertedType with the
   * element's scale and precision; the others both. */
  s[1].logical = PQ_LT_DECIMAL;
  s[1].lt_precision = 5;
  s[1].lt_scale = 3;
  s[2].converted = 5;
  s[2].precision = 18;
  s[2].scale = 2;
  s[3].type_length = 9;
  s[3].logical = PQ_LT_DECIMAL;
  s[3].lt_precision = 20;
  s[3].lt_scale = 4;
  s[4].logical = PQ_LT_DECIMAL;
  s[4].lt_precision = 10;
  s[4].lt_scale = 2;
  s[4].converted = 5;
  s[4].precision = 10;
  s[4].scale = 2;
  s[5].type_length = 24;
  s[5].logical = PQ_LT_DECIMAL;
  s[5].lt_precision = 50;
  s[5].lt_scale = 10;
  s[6].logical = PQ_LT_DECIMAL;
  s[6].lt_precision = 9;
  s[6].lt_scale = 0;
  static const int32_t d1[] = {-12340, 5, -5, 0, 99999};
  static const int64_t d2[] = {999999999999999999LL, -1, 100, 0, -999999999999999999LL};
  __int128 big20 = (__int128)9999999999999999LL * 10000 + 9999;
  __int128 d3v[] = {-123456789012345678LL, 1, 0, big20, -1};
  uint8_t d3[5 * 9];
  for (int i = 0; i < 5; i++) be_bytes(d3v[i], d3 + 9 * i, 9);
  static const char *const d4[] = {"\x01\x00", "\xff", "", "\x30\x39", "\xcf\xc7"};
  static const int32_t d4len[] = {2, 1, 0, 2, 2};
  /* 12345678901234567890123456789012345678901234567890 and its negation. */
  static const uint8_t big[24] = {0x00, 0x00, 0x00, 0x08, 0x72, 0x7f, 0x63, 0x69,
                                  0xaa, 0xf8, 0x3c, 0xa1, 0x50, 0x26, 0x74, 0x7a,
                                  0xf8, 0xc7, 0xf1, 0x96, 0xce, 0x3f, 0x0a, 0xd2};
  uint8_t d5[5 * 24];
  memcpy(d5, big, 24);
  unsigned carry = 1;
  for (int i = 23; i >= 0; i--) { /* two's complement negation */
    unsigned x = (unsigned)(uint8_t)~big[i] + carry;
    d5[24 + i] = (uint8_t)x;
    carry = x >> 8;
  }
  be_bytes(-1, d5 + 48, 24);
  be_bytes(0, d5 + 72, 24);
  be_bytes(10000000000LL, d5 + 96, 24);
  static const int32_t d6[] = {123, -7, 0, 999999999, -999999999};
  pqw_values v[6] = {vals_fixed(PQ_INT32, d1, 5), vals_fixed(PQ_INT64, d2, 5),
                     vals_flba(9, d3, 5),         vals_bytes(d4, d4len, 5),
                     vals_flba(24, d5, 5),        vals_fixed(PQ_INT32, d6, 5)};
  size_t len;
  uint8_t *data = build_file(s, 7, v, NULL, 6, NULL, 5, &len);
  expect_json(data, len,
              "{\"d1\":\"-12.340\",\"d2\":\"9999999999999999.99\",\"d3\":\"-12345678901234.5678\","
              "\"d4\":\"2.56\",\"d5\":\"1234567890123456789012345678901234567890.1234567890\","
              "\"d6\":\"123\"}\n"
              "{\"d1\":\"0.005\",\"d2\":\"-0.01\",\"d3\":\"0.0001\",\"d4\":\"-0.01\","
              "\"d5\":\"-1234567890123456789012345678901234567890.1234567890\",\"d6\":\"-7\"}\n"
              "{\"d1\":\"-0.005\",\"d2\":\"1.00\",\"d3\":\"0.0000\",\"d4\":\"0.00\","
              "\"d5\":\"-0.0000000001\",\"d6\":\"0\"}\n"
              "{\"d1\":\"0.000\",\"d2\":\"0.00\",\"d3\":\"9999999999999999.9999\","
              "\"d4\":\"123.45\",\"d5\":\"0.0000000000\",\"d6\":\"999999999\"}\n"
              "{\"d1\":\"99.999\",\"d2\":\"-9999999999999999.99\",\"d3\":\"-0.0001\","
              "\"d4\":\"-123.45\",\"d5\":\"1.0000000000\",\"d6\":\"-999999999\"}\n");
  free(data);
  return 0;
}

static pqw_schema leaf_time(const char *name, int physical, int logical, int unit, int utc) {
  pqw_schema s = leaf_lt(name, physical, PQ_REQUIRED, logical);
  s.lt_unit = unit;
  s.lt_utc = utc;
  return s;
}

TEST_IMPL(parquet_unit_json_temporal) {
  pqw_schema s[12] = {pqw_root(11),
                      leaf_lt("dt", PQ_INT32, PQ_REQUIRED, PQ_LT_DATE),
                      leaf_time("tm", PQ_INT32, PQ_LT_TIME, 1, 1),
                      leaf_time("tu", PQ_INT64, PQ_LT_TIME, 2, 0),
                      leaf_time("tn", PQ_INT64, PQ_LT_TIME, 3, 1),
                      leaf_time("tsm", PQ_INT64, PQ_LT_TIMESTAMP, 1, 1),
                      leaf_time("tsu", PQ_INT64, PQ_LT_TIMESTAMP, 2, 0),
                      leaf_time("tsn", PQ_INT64, PQ_LT_TIMESTAMP, 3, 1),
                      pqw_leaf("tsl", PQ_INT64, PQ_REQUIRED),
                      pqw_leaf("i96", PQ_INT96, PQ_REQUIRED),
                      pqw_leaf("tml", PQ_INT32, PQ_REQUIRED),
                      leaf_time("tsnl", PQ_INT64, PQ_LT_TIMESTAMP, 3, 0)};
  s[8].converted = 10; /* TIMESTAMP_MICROS: adjusted to UTC */
  s[10].converted = 7; /* TIME_MILLIS */
  static const int32_t dt[] = {0, -1, 18262, 11016, -719162};
  static const int32_t tm[] = {45296789, 0, 86399999, 1, 3600000};
  static const int64_t tu[] = {45296789012LL, 0, 86399999999LL, 1, 3600000000LL};
  static const int64_t tn[] = {45296789012345LL, 0, 86399999999999LL, 1, 1000};
  static const int64_t tsm[] = {1700000000123LL, 0, -1, 951782400000LL, 253402300799999LL};
  static const int64_t tsu[] = {1700000000123456LL, 0, -1, 951782400000000LL, 1};
  static const int64_t tsn[] = {1700000000123456789LL, 0, -1, -1000000000000000000LL,
                                4000000000000000000LL};
  static const int64_t tsl[] = {1, 0, -1000000, 86400000000LL, 1700000000123456LL};
  uint8_t i96[5 * 12];
  static const struct {
    uint64_t nanos;
    uint32_t jd;
  } i96v[] = {{0, 2440588},
              {43200000000000ull + 1, 2451545},
              {86399999999999ull, 2440587},
              {1000, 2440589},
              {0, 2451545 + 59}};
  for (int i = 0; i < 5; i++) {
    memcpy(i96 + 12 * i, &i96v[i].nanos, 8);
    memcpy(i96 + 12 * i + 8, &i96v[i].jd, 4);
  }
  static const int32_t tml[] = {1, 2, 3, 4, 5};
  pqw_values v[11] = {
      vals_fixed(PQ_INT32, dt, 5),  vals_fixed(PQ_INT32, tm, 5),  vals_fixed(PQ_INT64, tu, 5),
      vals_fixed(PQ_INT64, tn, 5),  vals_fixed(PQ_INT64, tsm, 5), vals_fixed(PQ_INT64, tsu, 5),
      vals_fixed(PQ_INT64, tsn, 5), vals_fixed(PQ_INT64, tsl, 5), vals_fixed(PQ_INT96, i96, 5),
      vals_fixed(PQ_INT32, tml, 5), vals_fixed(PQ_INT64, tsn, 5)};
  size_t len;
  uint8_t *data = build_file(s, 12, v, NULL, 11, NULL, 5, &len);
  expect_json(data, len,
              "{\"dt\":\"1970-01-01\",\"tm\":\"12:34:56.789\",\"tu\":\"12:34:56.789012\","
              "\"tn\":\"12:34:56.789012345\",\"tsm\":\"2023-11-14T22:13:20.123Z\","
              "\"tsu\":\"2023-11-14T22:13:20.123456\",\"tsn\":\"2023-11-14T22:13:20.123456789Z\","
              "\"tsl\":\"1970-01-01T00:00:00.000001Z\",\"i96\":\"1970-01-01T00:00:00.000000000\","
              "\"tml\":\"00:00:00.001\",\"tsnl\":\"2023-11-14T22:13:20.123456789\"}\n"
              "{\"dt\":\"1969-12-31\",\"tm\":\"00:00:00.000\",\"tu\":\"00:00:00.000000\","
              "\"tn\":\"00:00:00.000000000\",\"tsm\":\"1970-01-01T00:00:00.000Z\","
              "\"tsu\":\"1970-01-01T00:00:00.000000\",\"tsn\":\"1970-01-01T00:00:00.000000000Z\","
              "\"tsl\":\"1970-01-01T00:00:00.000000Z\",\"i96\":\"2000-01-01T12:00:00.000000001\","
              "\"tml\":\"00:00:00.002\",\"tsnl\":\"1970-01-01T00:00:00.000000000\"}\n"
              "{\"dt\":\"2020-01-01\",\"tm\":\"23:59:59.999\",\"tu\":\"23:59:59.999999\","
              "\"tn\":\"23:59:59.999999999\",\"tsm\":\"1969-12-31T23:59:59.999Z\","
              "\"tsu\":\"1969-12-31T23:59:59.999999\",\"tsn\":\"1969-12-31T23:59:59.999999999Z\","
              "\"tsl\":\"1969-12-31T23:59:59.000000Z\",\"i96\":\"1969-12-31T23:59:59.999999999\","
              "\"tml\":\"00:00:00.003\",\"tsnl\":\"1969-12-31T23:59:59.999999999\"}\n"
              "{\"dt\":\"2000-02-29\",\"tm\":\"00:00:00.001\",\"tu\":\"00:00:00.000001\","
              "\"tn\":\"00:00:00.000000001\",\"tsm\":\"2000-02-29T00:00:00.000Z\","
              "\"tsu\":\"2000-02-29T00:00:00.000000\",\"tsn\":\"1938-04-24T22:13:20.000000000Z\","
              "\"tsl\":\"1970-01-02T00:00:00.000000Z\",\"i96\":\"1970-01-02T00:00:00.000001000\","
              "\"tml\":\"00:00:00.004\",\"tsnl\":\"1938-04-24T22:13:20.000000000\"}\n"
              "{\"dt\":\"0001-01-01\",\"tm\":\"01:00:00.000\",\"tu\":\"01:00:00.000000\","
              "\"tn\":\"00:00:00.000001000\",\"tsm\":\"9999-12-31T23:59:59.999Z\","
              "\"tsu\":\"1970-01-01T00:00:00.000001\",\"tsn\":\"2096-10-02T07:06:40.000000000Z\","
              "\"tsl\":\"2023-11-14T22:13:20.123456Z\",\"i96\":\"2000-02-29T00:00:00.000000000\","
              "\"tml\":\"00:00:00.005\",\"tsnl\":\"2096-10-02T07:06:40.000000000\"}\n");
  free(data);
  /* Years outside 0..9999 take a sign and at least four digits (ISO 8601's
   * expanded form), as DuckDB and Arrow read them: 74 BC is year -73. */
  pqw_schema b[3] = {pqw_root(2), leaf_lt("dt", PQ_INT32, PQ_REQUIRED, PQ_LT_DATE),
                     leaf_time("ts", PQ_INT64, PQ_LT_TIMESTAMP, 1, 0)};
  static const int32_t bc_days[] = {-746181, -719528, -719529, 2932897};
  static const int64_t bc_ms[] = {-746181LL * 86400000 + 24940521, -719528LL * 86400000,
                                  -719529LL * 86400000, 2932897LL * 86400000};
  pqw_values bv[2] = {vals_fixed(PQ_INT32, bc_days, 4), vals_fixed(PQ_INT64, bc_ms, 4)};
  data = build_file(b, 3, bv, NULL, 2, NULL, 4, &len);
  expect_json(data, len,
              "{\"dt\":\"-0073-01-11\",\"ts\":\"-0073-01-11T06:55:40.521\"}\n"
              "{\"dt\":\"0000-01-01\",\"ts\":\"0000-01-01T00:00:00.000\"}\n"
              "{\"dt\":\"-0001-12-31\",\"ts\":\"-0001-12-31T00:00:00.000\"}\n"
              "{\"dt\":\"+10000-01-01\",\"ts\":\"+10000-01-01T00:00:00.000\"}\n");
  free(data);
  return 0;
}

/* Timestamps and times at the ends of int64.  Rendering them must not
 * overflow (UBSan) and must still give the proleptic Gregorian date. */
TEST_IMPL(parquet_unit_json_time_extremes) {
  pqw_schema s[4] = {pqw_root(3), leaf_time("ns", PQ_INT64, PQ_LT_TIMESTAMP, 3, 1),
                     leaf_time("us", PQ_INT64, PQ_LT_TIMESTAMP, 2, 1),
                     leaf_time("ms", PQ_INT64, PQ_LT_TIMESTAMP, 1, 1)};
  static const int64_t ext[] = {INT64_MIN, INT64_MAX};
  pqw_values v[3] = {vals_fixed(PQ_INT64, ext, 2), vals_fixed(PQ_INT64, ext, 2),
                     vals_fixed(PQ_INT64, ext, 2)};
  size_t len;
  uint8_t *data = build_file(s, 4, v, NULL, 3, NULL, 2, &len);
  expect_json(data, len,
              "{\"ns\":\"1677-09-21T00:12:43.145224192Z\","
              "\"us\":\"-290308-12-21T19:59:05.224192Z\","
              "\"ms\":\"-292275055-05-16T16:47:04.192Z\"}\n"
              "{\"ns\":\"2262-04-11T23:47:16.854775807Z\","
              "\"us\":\"+294247-01-10T04:00:54.775807Z\","
              "\"ms\":\"+292278994-08-17T07:12:55.807Z\"}\n");
  free(data);
  /* TIME(NANOS) at the extremes is out of any day; it must render
   * without undefined behaviour, whatever it prints. */
  pqw_schema t[2] = {pqw_root(1), leaf_time("tn", PQ_INT64, PQ_LT_TIME, 3, 1)};
  pqw_values tv = vals_fixed(PQ_INT64, ext, 2);
  data = build_file(t, 2, &tv, NULL, 1, NULL, 2, &len);
  char *text = json_of(data, len, NULL, 0, 10);
  ASSERT(strncmp(text, "{\"tn\":\"", 7) == 0);
  free(text);
  free(data);
  return 0;
}

/* Checks that the text of a JSON number is the shortest that reads back as
 * v (a double, or a float when is_float). */
static void check_shortest(const char *text, double v, int is_float) {
  char *end;
  double back = strtod(text, &end);
  ASSERT(*end == '\0');
  if (is_float) ASSERT((float)back == (float)v);
  else ASSERT(back == v);
  int digits = 0, seen = 0; /* significant digits */
  for (const char *p = text; *p && *p != 'e'; p++) {
    if (*p >= '1' && *p <= '9') seen = 1;
    digits += seen && *p >= '0' && *p <= '9';
  }
  /* Zeros that only pad a whole number ("100") are not significant. */
  if (strchr(text, '.') == NULL && strchr(text, 'e') == NULL)
    for (size_t n = strlen(text); n > 1 && text[n - 1] == '0' && digits > 1; n--) digits--;
  for (int d = 1; d < digits; d++) {
    char buf[512];
    snprintf(buf, sizeof(buf), "%.*g", d, v);
    double x = strtod(buf, NULL);
    if (is_float ? (float)x == (float)v : x == v)
      ASSERT_FAIL_("%s is not the shortest round trip of %.17g (%s is)", text, v, buf);
  }
}

TEST_IMPL(parquet_unit_json_float) {
  pqw_schema s[4] = {pqw_root(3), pqw_leaf("f", PQ_FLOAT, PQ_REQUIRED),
                     pqw_leaf("d", PQ_DOUBLE, PQ_REQUIRED),
                     leaf_lt("h", PQ_FIXED_LEN_BYTE_ARRAY, PQ_REQUIRED, PQ_LT_FLOAT16)};
  s[3].type_length = 2;
  const float f[] = {1.5f,   0.1f,        -0.0f, NAN, INFINITY, -INFINITY, 3.4028234663852886e38f,
                     1e-45f, 16777216.0f, -2.25f};
  const double d[] = {0.1,       1.0 / 3, 5e-324, 1.7976931348623157e308, -NAN,
                      -INFINITY, 0.5,     1e22,   9007199254740992.0,     -123.456};
  static const uint16_t h[] = {0x3c00, 0x3555, 0xc000, 0x7bff, 0x0001,
                               0x7c00, 0xfc00, 0x7e00, 0x8000, 0x3e00};
  pqw_values v[3] = {vals_fixed(PQ_FLOAT, f, 10), vals_fixed(PQ_DOUBLE, d, 10),
                     vals_flba(2, h, 10)};
  size_t len;
  uint8_t *data = build_file(s, 4, v, NULL, 3, NULL, 10, &len);
  expect_json(data, len,
              "{\"f\":1.5,\"d\":0.1,\"h\":1}\n"
              "{\"f\":0.1,\"d\":0.3333333333333333,\"h\":0.3333}\n"
              "{\"f\":-0,\"d\":5e-324,\"h\":-2}\n"
              "{\"f\":\"NaN\",\"d\":1.7976931348623157e+308,\"h\":65500}\n"
              "{\"f\":\"Infinity\",\"d\":\"NaN\",\"h\":6e-08}\n"
              "{\"f\":\"-Infinity\",\"d\":\"-Infinity\",\"h\":\"Infinity\"}\n"
              "{\"f\":3.4028235e+38,\"d\":0.5,\"h\":\"-Infinity\"}\n"
              "{\"f\":1e-45,\"d\":1e+22,\"h\":\"NaN\"}\n"
              "{\"f\":16777216,\"d\":9007199254740992,\"h\":-0}\n"
              "{\"f\":-2.25,\"d\":-123.456,\"h\":1.5}\n");
  free(data);
  /* Random doubles and floats print as their shortest round trip. */
  rnd_seed(99);
  enum { N = 300 };
  double *rd = malloc(N * sizeof(double));
  float *rf = malloc(N * sizeof(float));
  ASSERT(rd && rf);
  for (int i = 0; i < N; i++) {
    uint64_t bits = rnd64();
    memcpy(&rd[i], &bits, 8);
    if (!isfinite(rd[i])) rd[i] = (double)i / 7;
    if (i % 3 == 0) rd[i] = (double)(int64_t)(bits % 100000) / 1000;
    uint32_t fb = (uint32_t)bits;
    memcpy(&rf[i], &fb, 4);
    if (!isfinite(rf[i])) rf[i] = (float)i / 7;
  }
  pqw_schema s2[3] = {pqw_root(2), pqw_leaf("d", PQ_DOUBLE, PQ_REQUIRED),
                      pqw_leaf("f", PQ_FLOAT, PQ_REQUIRED)};
  pqw_values v2[2] = {vals_fixed(PQ_DOUBLE, rd, N), vals_fixed(PQ_FLOAT, rf, N)};
  data = build_file(s2, 3, v2, NULL, 2, NULL, N, &len);
  char *text = json_of(data, len, NULL, 0, 1000);
  char *line = text;
  for (int i = 0; i < N; i++) {
    char dtext[64], ftext[64];
    ASSERT_EQ(sscanf(line, "{\"d\":%63[^,],\"f\":%63[^}]}", dtext, ftext), 2);
    check_shortest(dtext, rd[i], 0);
    check_shortest(ftext, rf[i], 1);
    line = strchr(line, '\n') + 1;
  }
  free(text);
  free(data);
  free(rd);
  free(rf);
  return 0;
}

TEST_IMPL(parquet_unit_json_binary) {
  pqw_schema s[7] = {pqw_root(6),
                     pqw_leaf("bin", PQ_BYTE_ARRAY, PQ_REQUIRED),
                     pqw_leaf("fl", PQ_FIXED_LEN_BYTE_ARRAY, PQ_REQUIRED),
                     leaf_lt("str", PQ_BYTE_ARRAY, PQ_REQUIRED, PQ_LT_STRING),
                     leaf_lt("en", PQ_BYTE_ARRAY, PQ_REQUIRED, PQ_LT_ENUM),
                     leaf_lt("js", PQ_BYTE_ARRAY, PQ_REQUIRED, PQ_LT_JSON),
                     pqw_leaf("legacy", PQ_BYTE_ARRAY, PQ_REQUIRED)};
  s[2].type_length = 3;
  s[6].converted = 0; /* UTF8 */
  static const char *const bin[] = {"", "f", "fo", "foo", "foobar", "\xff\x00\xfe"};
  static const int32_t binlen[] = {0, 1, 2, 3, 6, 3};
  static const uint8_t fl[] = "abc\0\0\0\xff\xff\xffxyz123!!!";
  static const char *const str[] = {
      "plain", "a\"b\\c", "\n\t\r\b\f", "\x01\x1f\x7f", "\xc3\xa9\xf0\x9f\x98\x80", "\xff\xc3"};
  static const char *const en[] = {"A", "B", "C", "D", "E", "\x00x"};
  static const int32_t enlen[] = {1, 1, 1, 1, 1, 2};
  static const char *const js[] = {"{}", "[1]", "\"q\"", "null", "1.5", "{\"a\":[]}"};
  static const char *const legacy[] = {"\xe0\x80\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80",
                                       "\xc0\xaf",     "ok\xe2\x82",   "\xe2\x82\xac"};
  pqw_values v[6] = {vals_bytes(bin, binlen, 6), vals_flba(3, fl, 6),
                     vals_bytes(str, NULL, 6),   vals_bytes(en, enlen, 6),
                     vals_bytes(js, NULL, 6),    vals_bytes(legacy, NULL, 6)};
  size_t len;
  uint8_t *data = build_file(s, 7, v, NULL, 6, NULL, 6, &len);
#define FFFD "\xef\xbf\xbd"
  expect_json(data, len,
              "{\"bin\":\"\",\"fl\":\"YWJj\",\"str\":\"plain\",\"en\":\"A\",\"js\":\"{}\","
              "\"legacy\":\"" FFFD FFFD FFFD
              "\"}\n"
              "{\"bin\":\"Zg==\",\"fl\":\"AAAA\",\"str\":\"a\\\"b\\\\c\",\"en\":\"B\","
              "\"js\":\"[1]\",\"legacy\":\"" FFFD FFFD FFFD
              "\"}\n"
              "{\"bin\":\"Zm8=\",\"fl\":\"////\",\"str\":\"\\n\\t\\r\\b\\f\",\"en\":\"C\","
              "\"js\":\"\\\"q\\\"\",\"legacy\":\"" FFFD FFFD FFFD FFFD
              "\"}\n"
              "{\"bin\":\"Zm9v\",\"fl\":\"eHl6\",\"str\":\"\\u0001\\u001f\x7f\",\"en\":\"D\","
              "\"js\":\"null\",\"legacy\":\"" FFFD FFFD
              "\"}\n"
              "{\"bin\":\"Zm9vYmFy\",\"fl\":\"MTIz\",\"str\":\"\xc3\xa9\xf0\x9f\x98\x80\","
              "\"en\":\"E\",\"js\":\"1.5\",\"legacy\":\"ok" FFFD FFFD
              "\"}\n"
              "{\"bin\":\"/wD+\",\"fl\":\"ISEh\",\"str\":\"" FFFD FFFD
              "\",\"en\":\"\\u0000x\","
              "\"js\":\"{\\\"a\\\":[]}\",\"legacy\":\"\xe2\x82\xac\"}\n");
#undef FFFD
  free(data);
  /* pq_json_append_string on its own, with a long run of plain bytes. */
  pq_strbuf_t sb = {0};
  char longs[3000];
  memset(longs, 'x', sizeof(longs));
  ASSERT_OK(pq_json_append_string(&sb, (const uint8_t *)longs, sizeof(longs)));
  ASSERT_EQ(sb.len, sizeof(longs) + 2);
  ASSERT_EQ(sb.data[0], '"');
  ASSERT_EQ(sb.data[sb.len - 1], '"');
  ASSERT_EQ(sb.data[sb.len], '\0');
  pq_strbuf_free(&sb);
  return 0;
}

/* Writes one column of a nested file and checks its rendering. */
typedef struct nested_col {
  pqw_values v;
  pqw_levels lv;
} nested_col;

static void nested_case(const pqw_schema *s, int ns, const nested_col *cols, int ncols,
                        int64_t rows, const char *expected) {
  pqw_values v[4];
  const pqw_levels *lv[4];
  for (int i = 0; i < ncols; i++) {
    v[i] = cols[i].v;
    lv[i] = &cols[i].lv;
  }
  size_t len;
  uint8_t *data = build_file(s, ns, v, lv, ncols, NULL, rows, &len);
  expect_json(data, len, expected);
  free(data);
  /* And with one level entry per v1 page, so records span pages. */
  pqw_chunk_opts o = {0};
  o.page_entries = 1;
  data = build_file(s, ns, v, lv, ncols, &o, rows, &len);
  expect_json(data, len, expected);
  free(data);
  o.v2 = 1;
  data = build_file(s, ns, v, lv, ncols, &o, rows, &len);
  expect_json(data, len, expected);
  free(data);
}

static pqw_schema group_lt(const char *name, int rep, int n, int logical) {
  pqw_schema s = pqw_group(name, rep, n);
  s.logical = logical;
  return s;
}

TEST_IMPL(parquet_unit_json_nested) {
  /* A three-level list with null and empty lists and null elements. */
  {
    pqw_schema s[] = {pqw_root(1), group_lt("l", PQ_OPTIONAL, 1, PQ_LT_LIST),
                      pqw_group("list", PQ_REPEATED, 1),
                      pqw_leaf("element", PQ_INT32, PQ_OPTIONAL)};
    static const int32_t vals[] = {1, 2, 3};
    static const uint16_t def[] = {3, 3, 1, 0, 2, 3}, rep[] = {0, 1, 0, 0, 0, 1};
    nested_col c = {vals_fixed(PQ_INT32, vals, 3), {6, def, rep, 3, 1}};
    nested_case(s, 4, &c, 1, 4, "{\"l\":[1,2]}\n{\"l\":[]}\n{\"l\":null}\n{\"l\":[null,3]}\n");
  }
  /* An optional struct with a required and an optional field. */
  {
    pqw_schema s[] = {pqw_root(1), pqw_group("s", PQ_OPTIONAL, 2),
                      pqw_leaf("a", PQ_INT32, PQ_REQUIRED),
                      leaf_lt("b", PQ_BYTE_ARRAY, PQ_OPTIONAL, PQ_LT_STRING)};
    static const int32_t a[] = {1, 2, 3};
    static const uint16_t adef[] = {1, 0, 1, 1}, bdef[] = {2, 0, 1, 2};
    static const char *const b[] = {"x", ""};
    nested_col c[2] = {{vals_fixed(PQ_INT32, a, 3), {4, adef, NULL, 1, 0}},
                       {vals_bytes(b, NULL, 2), {4, bdef, NULL, 2, 0}}};
    nested_case(s, 4, c, 2, 4,
                "{\"s\":{\"a\":1,\"b\":\"x\"}}\n{\"s\":null}\n{\"s\":{\"a\":2,\"b\":null}}\n"
                "{\"s\":{\"a\":3,\"b\":\"\"}}\n");
  }
  /* A map with a null value, an empty map and a null map. */
  {
    pqw_schema s[] = {pqw_root(1), group_lt("m", PQ_OPTIONAL, 1, PQ_LT_MAP),
                      pqw_group("key_value", PQ_REPEATED, 2),
                      leaf_lt("key", PQ_BYTE_ARRAY, PQ_REQUIRED, PQ_LT_STRING),
                      pqw_leaf("value", PQ_INT32, PQ_OPTIONAL)};
    static const char *const keys[] = {"a", "b", "c"};
    static const int32_t vals[] = {1, 3};
    static const uint16_t kdef[] = {2, 2, 1, 0, 2}, vdef[] = {3, 2, 1, 0, 3};
    static const uint16_t rep[] = {0, 1, 0, 0, 0};
    nested_col c[2] = {{vals_bytes(keys, NULL, 3), {5, kdef, rep, 2, 1}},
                       {vals_fixed(PQ_INT32, vals, 2), {5, vdef, rep, 3, 1}}};
    nested_case(s, 5, c, 2, 4,
                "{\"m\":[{\"key\":\"a\",\"value\":1},{\"key\":\"b\",\"value\":null}]}\n"
                "{\"m\":[]}\n{\"m\":null}\n{\"m\":[{\"key\":\"c\",\"value\":3}]}\n");
  }
  /* Lists of lists. */
  {
    pqw_schema s[] = {pqw_root(1),
                      group_lt("ll", PQ_OPTIONAL, 1, PQ_LT_LIST),
                      pqw_group("list", PQ_REPEATED, 1),
                      group_lt("element", PQ_OPTIONAL, 1, PQ_LT_LIST),
                      pqw_group("list", PQ_REPEATED, 1),
                      pqw_leaf("element", PQ_INT32, PQ_REQUIRED)};
    static const int32_t vals[] = {1, 2, 3};
    static const uint16_t def[] = {4, 4, 4, 3, 2, 1, 0}, rep[] = {0, 2, 1, 0, 0, 0, 0};
    nested_col c = {vals_fixed(PQ_INT32, vals, 3), {7, def, rep, 4, 2}};
    nested_case(s, 6, &c, 1, 5,
                "{\"ll\":[[1,2],[3]]}\n{\"ll\":[[]]}\n{\"ll\":[null]}\n{\"ll\":[]}\n"
                "{\"ll\":null}\n");
  }
  /* A list of structs. */
  {
    pqw_schema s[] = {pqw_root(1),
                      group_lt("ls", PQ_OPTIONAL, 1, PQ_LT_LIST),
                      pqw_group("list", PQ_REPEATED, 1),
                      pqw_group("element", PQ_OPTIONAL, 2),
                      pqw_leaf("x", PQ_INT32, PQ_OPTIONAL),
                      leaf_lt("y", PQ_BYTE_ARRAY, PQ_OPTIONAL, PQ_LT_STRING)};
    static const int32_t x[] = {1};
    static const char *const y[] = {"a", "b"};
    static const uint16_t xdef[] = {4, 2, 3, 0, 1}, ydef[] = {4, 2, 4, 0, 1};
    static const uint16_t rep[] = {0, 1, 1, 0, 0};
    nested_col c[2] = {{vals_fixed(PQ_INT32, x, 1), {5, xdef, rep, 4, 1}},
                       {vals_bytes(y, NULL, 2), {5, ydef, rep, 4, 1}}};
    nested_case(s, 6, c, 2, 3,
                "{\"ls\":[{\"x\":1,\"y\":\"a\"},null,{\"x\":null,\"y\":\"b\"}]}\n"
                "{\"ls\":null}\n{\"ls\":[]}\n");
  }
  /* A repeated field without annotation, and a two-level list. */
  {
    pqw_schema s[] = {pqw_root(1), pqw_leaf("r", PQ_INT32, PQ_REPEATED)};
    static const int32_t vals[] = {1, 2, 3, 4};
    static const uint16_t def[] = {1, 1, 1, 0, 1}, rep[] = {0, 1, 1, 0, 0};
    nested_col c = {vals_fixed(PQ_INT32, vals, 4), {5, def, rep, 1, 1}};
    nested_case(s, 2, &c, 1, 3, "{\"r\":[1,2,3]}\n{\"r\":[]}\n{\"r\":[4]}\n");
  }
  {
    pqw_schema s[] = {pqw_root(1), group_lt("l2", PQ_OPTIONAL, 1, PQ_LT_LIST),
                      pqw_leaf("element", PQ_INT64, PQ_REPEATED)};
    static const int64_t vals[] = {1, 2};
    static const uint16_t def[] = {2, 2, 0, 1}, rep[] = {0, 1, 0, 0};
    nested_col c = {vals_fixed(PQ_INT64, vals, 2), {4, def, rep, 2, 1}};
    nested_case(s, 3, &c, 1, 3, "{\"l2\":[1,2]}\n{\"l2\":null}\n{\"l2\":[]}\n");
  }
  return 0;
}

/* Deprecated BIT_PACKED levels (v1 pages of old writers), packed from the
 * most significant bit. */
TEST_IMPL(parquet_unit_bit_packed_levels) {
  pqw_schema s[] = {pqw_root(1), pqw_leaf("a", PQ_INT32, PQ_OPTIONAL)};
  pqw_file f;
  pqw_file_init(&f, s, 2);
  pqw_chunk c;
  pqw_chunk_init(&c, PQ_INT32, PQ_UNCOMPRESSED);
  /* defs 1 0 1 1 0 1 1 1 | 1 0 */
  pqw_buf body = {0};
  pqw_u8(&body, 0xb7);
  pqw_u8(&body, 0x80);
  for (int i = 0; i < 7; i++) pqw_le32(&body, (uint32_t)(10 + i));
  pqw_page h;
  pqw_page_init(&h, PQ_PAGE_DATA);
  h.num_values = 10;
  h.def_encoding = PQ_ENC_BIT_PACKED;
  pqw_chunk_page(&c, &h, body.data, body.len, body.len);
  pqw_file_add_row_group(&f, 10, &c, 1);
  size_t len;
  uint8_t *data = pqw_file_finish(&f, &len);
  expect_json(data, len,
              "{\"a\":10}\n{\"a\":null}\n{\"a\":11}\n{\"a\":12}\n{\"a\":null}\n"
              "{\"a\":13}\n{\"a\":14}\n{\"a\":15}\n{\"a\":16}\n{\"a\":null}\n");
  free(data);
  pqw_chunk_free(&c);
  pqw_buf_free(&body);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Projection                                                                */

/* A file of two row groups: a INT32, b {c INT64?, d STRING?}?, e INT32. */
typedef struct proj_file {
  uint8_t *data;
  size_t len;
  pq_range_t chunk[2][4]; /* where each chunk lies */
} proj_file;

static void make_proj_file(proj_file *pf) {
  pqw_schema s[] = {pqw_root(3),
                    pqw_leaf("a", PQ_INT32, PQ_REQUIRED),
                    pqw_group("b", PQ_OPTIONAL, 2),
                    pqw_leaf("c", PQ_INT64, PQ_OPTIONAL),
                    leaf_lt("d", PQ_BYTE_ARRAY, PQ_OPTIONAL, PQ_LT_STRING),
                    pqw_leaf("e", PQ_INT32, PQ_REQUIRED)};
  pqw_file f;
  pqw_file_init(&f, s, 6);
  for (int g = 0; g < 2; g++) {
    int32_t a[3] = {g * 10 + 1, g * 10 + 2, g * 10 + 3};
    int64_t cv[2] = {g * 100 + 5, g * 100 + 6};
    const char *d[2] = {g ? "g1" : "g0", "zz"};
    int32_t e[3] = {-1, -2, -3};
    static const uint16_t cdef[] = {2, 0, 2}, ddef[] = {2, 0, 1};
    pqw_levels lc = {3, cdef, NULL, 2, 0}, ld = {3, ddef, NULL, 2, 0};
    pqw_values va = vals_fixed(PQ_INT32, a, 3), vc = vals_fixed(PQ_INT64, cv, 2);
    pqw_values vd = vals_bytes(d, NULL, 2), ve = vals_fixed(PQ_INT32, e, 3);
    pqw_chunk ch[4];
    pqw_chunk_build(&ch[0], &va, NULL, NULL);
    pqw_chunk_build(&ch[1], &vc, &lc, NULL);
    pqw_chunk_build(&ch[2], &vd, &ld, NULL);
    pqw_chunk_build(&ch[3], &ve, NULL, NULL);
    pqw_file_add_row_group(&f, 3, ch, 4);
    for (int c = 0; c < 4; c++) {
      pf->chunk[g][c].offset = (uint64_t)f.rg[g].cols[c].data_page_offset;
      pf->chunk[g][c].length = (uint64_t)f.rg[g].cols[c].total_compressed_size;
      pqw_chunk_free(&ch[c]);
    }
  }
  pf->data = pqw_file_finish(&f, &pf->len);
}

static pq_file *open_mem(const uint8_t *data, size_t len, pq_source *src) {
  pq_source_init_memory(src, data, len, UNIT_NAME);
  pq_file *f = NULL;
  pq_error err = {0, ""};
  int rc = pq_file_open(src, NULL, &f, &err);
  if (rc) ASSERT_FAIL_("open: %d %s", rc, err.msg);
  return f;
}

static void expect_ranges(pq_file *f, const char *const *cols, size_t n, int rg,
                          const pq_range_t *want, int nwant) {
  pq_projection *p = NULL;
  pq_error err = {0, ""};
  ASSERT_OK(pq_projection_create(f, cols, n, &p, &err));
  pq_range_t *r = NULL;
  int got = pq_projection_ranges(f, p, rg, &r, &err);
  ASSERT_EQ(got, nwant);
  for (int i = 0; i < nwant; i++) {
    ASSERT_UINT_EQ(r[i].offset, want[i].offset);
    ASSERT_UINT_EQ(r[i].length, want[i].length);
  }
  free(r);
  pq_projection_free(p);
}

TEST_IMPL(parquet_unit_projection) {
  proj_file pf;
  make_proj_file(&pf);
  pq_source src;
  pq_file *f = open_mem(pf.data, pf.len, &src);
  pq_error err = {0, ""};
  pq_projection *p = NULL;
  /* "a": one top-level column, one leaf. */
  const char *a[] = {"a"};
  ASSERT_OK(pq_projection_create(f, a, 1, &p, &err));
  ASSERT_EQ(pq_projection_num_leaves(p), 1);
  ASSERT_EQ(pq_projection_has_leaf(p, 0), 1);
  ASSERT_EQ(pq_projection_has_leaf(p, 1), 0);
  ASSERT_EQ(pq_projection_has_leaf(p, 99), 0);
  ASSERT_EQ(pq_projection_has_leaf(p, -1), 0);
  ASSERT_EQ(pq_projection_schema(p)->num_children, 1);
  ASSERT_STR_EQ(pq_projection_schema(p)->children[0].name, "a");
  pq_projection_free(p);
  /* "b.c": the struct b with only c. */
  const char *bc[] = {"b.c"};
  ASSERT_OK(pq_projection_create(f, bc, 1, &p, &err));
  ASSERT_EQ(pq_projection_num_leaves(p), 1);
  ASSERT_EQ(pq_projection_has_leaf(p, 1), 1);
  const pq_field_t *root = pq_projection_schema(p);
  ASSERT_EQ(root->num_children, 1);
  ASSERT_STR_EQ(root->children[0].name, "b");
  ASSERT_EQ(root->children[0].type, LARDER_TYPE_STRUCT);
  ASSERT_EQ(root->children[0].num_children, 1);
  ASSERT_STR_EQ(root->children[0].children[0].name, "c");
  pq_projection_free(p);
  char *text = json_of(pf.data, pf.len, bc, 1, 2);
  ASSERT_STR_EQ(text,
                "{\"b\":{\"c\":5}}\n{\"b\":null}\n{\"b\":{\"c\":6}}\n"
                "{\"b\":{\"c\":105}}\n{\"b\":null}\n{\"b\":{\"c\":106}}\n");
  free(text);
  /* Columns in the order asked; "b" selects the whole group. */
  const char *eb[] = {"e", "b"};
  text = json_of(pf.data, pf.len, eb, 2, 1000);
  ASSERT_STR_EQ(text,
                "{\"b\":{\"c\":5,\"d\":\"g0\"},\"e\":-1}\n{\"b\":null,\"e\":-2}\n"
                "{\"b\":{\"c\":6,\"d\":null},\"e\":-3}\n"
                "{\"b\":{\"c\":105,\"d\":\"g1\"},\"e\":-1}\n{\"b\":null,\"e\":-2}\n"
                "{\"b\":{\"c\":106,\"d\":null},\"e\":-3}\n");
  free(text);
  /* Unknown names. */
  const char *bad[][1] = {{"zzz"}, {"b.zz"}, {"a.x"}, {""}, {".a"}, {"b..c"}, {"B"}};
  for (size_t i = 0; i < ARRAY_LEN(bad); i++) {
    memset(&err, 0, sizeof(err));
    p = (pq_projection *)1;
    ASSERT_EQ(pq_projection_create(f, bad[i], 1, &p, &err), LARDER_ENOENT);
    ASSERT_NULL(p);
    ASSERT_EQ(err.code, LARDER_ENOENT);
    ASSERT_STR_CONTAINS(err.msg, UNIT_NAME);
    char quoted[64];
    snprintf(quoted, sizeof(quoted), "'%s'", bad[i][0]);
    ASSERT_STR_CONTAINS(err.msg, quoted);
  }
  const char *mixed[] = {"a", "nope"};
  ASSERT_EQ(pq_projection_create(f, mixed, 2, &p, &err), LARDER_ENOENT);
  ASSERT_STR_CONTAINS(err.msg, "'nope'");
  pq_file_close(f);
  free(pf.data);
  return 0;
}

/* A source without map() that records the reads made through it and fails
 * the test when one falls outside the allowed ranges. */
typedef struct rec_ctx {
  const uint8_t *data;
  size_t len;
  const pq_range_t *allowed;
  int nallowed;
  int reads;
} rec_ctx;

static int rec_read(const pq_source *src, uint64_t off, size_t len, void *buf) {
  rec_ctx *r = src->ctx;
  if (off > r->len || len > r->len - off) return LARDER_ECORRUPT;
  if (r->allowed) {
    int ok = 0;
    for (int i = 0; i < r->nallowed; i++)
      if (off >= r->allowed[i].offset && off + len <= r->allowed[i].offset + r->allowed[i].length)
        ok = 1;
    if (!ok)
      ASSERT_FAIL_("read of %zu bytes at %llu is outside the projection's ranges", len,
                   (unsigned long long)off);
    r->reads++;
  }
  memcpy(buf, r->data + off, len);
  return 0;
}

TEST_IMPL(parquet_unit_projection_ranges) {
  proj_file pf;
  make_proj_file(&pf);
  pq_source src;
  pq_file *f = open_mem(pf.data, pf.len, &src);
  const pq_range_t(*ch)[4] = pf.chunk;
  /* The writer lays chunks end to end. */
  ASSERT_UINT_EQ(ch[0][0].offset, 4);
  for (int i = 0; i < 7; i++)
    ASSERT_UINT_EQ(ch[i / 4][i % 4].offset + ch[i / 4][i % 4].length,
                   ch[(i + 1) / 4][(i + 1) % 4].offset);
  const char *a[] = {"a"}, *ad[] = {"a", "b.d"}, *ac[] = {"a", "b.c"}, *b[] = {"b"},
             *ae[] = {"e", "a"}, *cd[] = {"b.d", "b.c"};
  {
    pq_range_t w[] = {ch[0][0]};
    expect_ranges(f, a, 1, 0, w, 1);
  }
  {
    pq_range_t w[] = {ch[1][0]};
    expect_ranges(f, a, 1, 1, w, 1);
  }
  {
    pq_range_t w[] = {ch[0][0], ch[0][2]};
    expect_ranges(f, ad, 2, 0, w, 2);
  }
  { /* touching chunks stay apart: one range per column chunk */
    pq_range_t w[] = {ch[0][0], ch[0][1]};
    expect_ranges(f, ac, 2, 0, w, 2);
  }
  {
    pq_range_t w[] = {ch[1][1], ch[1][2]};
    expect_ranges(f, b, 1, 1, w, 2);
    expect_ranges(f, cd, 2, 1, w, 2);
  }
  { /* sorted by offset whatever the order asked */
    pq_range_t w[] = {ch[0][0], ch[0][3]};
    expect_ranges(f, ae, 2, 0, w, 2);
  }
  { /* every row group */
    pq_range_t w[] = {ch[0][0], ch[1][0]};
    expect_ranges(f, a, 1, -1, w, 2);
    pq_range_t all[8];
    for (int i = 0; i < 8; i++) all[i] = ch[i / 4][i % 4];
    expect_ranges(f, NULL, 0, -1, all, 8);
    pq_range_t w2[] = {ch[0][0], ch[0][3], ch[1][0], ch[1][3]};
    expect_ranges(f, ae, 2, -1, w2, 4);
  }
  /* A row group that does not exist. */
  pq_projection *p = NULL;
  pq_error err = {0, ""};
  ASSERT_OK(pq_projection_create(f, a, 1, &p, &err));
  pq_range_t *r = NULL;
  ASSERT_EQ(pq_projection_ranges(f, p, 2, &r, &err), LARDER_EINVAL);
  ASSERT_STR_CONTAINS(err.msg, UNIT_NAME);
  pq_projection_free(p);
  /* The reader asks its source only for bytes inside the ranges. */
  const char *const *sets[] = {a, ad, b, ae};
  const size_t setn[] = {1, 2, 1, 2};
  for (size_t k = 0; k < ARRAY_LEN(sets); k++) {
    for (int g = 0; g < 2; g++) {
      ASSERT_OK(pq_projection_create(f, sets[k], setn[k], &p, &err));
      int n = pq_projection_ranges(f, p, g, &r, &err);
      ASSERT_GT(n, 0);
      rec_ctx ctx = {pf.data, pf.len, r, n, 0};
      pq_source rs;
      memset(&rs, 0, sizeof(rs));
      rs.read = rec_read;
      rs.ctx = &ctx;
      rs.fd = -1;
      rs.size = pf.len;
      snprintf(rs.name, sizeof(rs.name), "%s", UNIT_NAME);
      pq_reader *rd = NULL;
      ASSERT_OK(pq_reader_open(f, &rs, p, g, NULL, &rd, &err));
      pq_batch_t batch;
      pq_batch_init(&batch);
      ASSERT_EQ(pq_reader_next(rd, 100, &batch, &err), 3);
      ASSERT_EQ(pq_reader_next(rd, 100, &batch, &err), 0);
      ASSERT_GT(ctx.reads, 0);
      pq_batch_free(&batch);
      pq_reader_close(rd);
      free(r);
      pq_projection_free(p);
    }
  }
  pq_file_close(f);
  free(pf.data);
  return 0;
}

/* One reader walks both row groups with pq_reader_set_row_group, and gets
 * what fresh readers get; it can start a row group over, and recovers from
 * a row group that failed. */
TEST_IMPL(parquet_unit_reader_reuse) {
  proj_file pf;
  make_proj_file(&pf);
  pq_source src;
  pq_file *f = open_mem(pf.data, pf.len, &src);
  pq_error err = {0, ""};
  pq_projection *p = NULL;
  ASSERT_OK(pq_projection_create(f, NULL, 0, &p, &err));
  pq_reader *r = NULL;
  ASSERT_OK(pq_reader_open(f, &src, p, 0, NULL, &r, &err));
  pq_batch_t b;
  pq_batch_init(&b);
  pq_strbuf_t sb = {0};
  pqw_buf out = {0};
  ASSERT_EQ(pq_reader_next(r, 1, &b, &err), 1); /* part of row group 0 */
  for (int pass = 0; pass < 3; pass++) {
    int g = pass == 1 ? 1 : 0;
    ASSERT_OK(pq_reader_set_row_group(r, g, &err));
    for (;;) {
      int64_t got = pq_reader_next(r, 2, &b, &err);
      ASSERT_GE(got, 0);
      if (got == 0) break;
      for (int64_t i = 0; i < got; i++) {
        sb.len = 0;
        ASSERT_OK(pq_json_append_row(&sb, &b, i));
        pqw_put(&out, sb.data, sb.len);
        pqw_u8(&out, '\n');
      }
    }
  }
  pqw_u8(&out, 0);
  const char *rg0 =
      "{\"a\":1,\"b\":{\"c\":5,\"d\":\"g0\"},\"e\":-1}\n{\"a\":2,\"b\":null,\"e\":-2}\n"
      "{\"a\":3,\"b\":{\"c\":6,\"d\":null},\"e\":-3}\n";
  const char *rg1 =
      "{\"a\":11,\"b\":{\"c\":105,\"d\":\"g1\"},\"e\":-1}\n{\"a\":12,\"b\":null,\"e\":-2}\n"
      "{\"a\":13,\"b\":{\"c\":106,\"d\":null},\"e\":-3}\n";
  char want[1024];
  snprintf(want, sizeof(want), "%s%s%s", rg0, rg1, rg0);
  ASSERT_STR_EQ((const char *)out.data, want);
  ASSERT_EQ(pq_reader_set_row_group(r, 2, &err), LARDER_EINVAL);
  ASSERT_EQ(pq_reader_set_row_group(r, -1, &err), LARDER_EINVAL);
  pqw_buf_free(&out);
  pq_reader_close(r);
  pq_projection_free(p);
  pq_file_close(f);
  free(pf.data);
  /* Row group 0 has a bad page CRC, row group 1 is fine. */
  pqw_schema s[] = {pqw_root(1), leaf_lt("s", PQ_BYTE_ARRAY, PQ_OPTIONAL, PQ_LT_STRING)};
  pqw_file wf;
  pqw_file_init(&wf, s, 2);
  for (int g = 0; g < 2; g++) {
    const char *vals[3] = {g ? "x1" : "x0", "yy", "zzz"};
    static const uint16_t def[4] = {1, 0, 1, 1};
    pqw_values v = vals_bytes(vals, NULL, 3);
    pqw_levels lv = {4, def, NULL, 1, 0};
    pqw_chunk_opts o = {0};
    o.crc = 1;
    o.encoding = PQ_ENC_RLE_DICTIONARY;
    pqw_chunk c;
    pqw_chunk_build(&c, &v, &lv, &o);
    if (g == 0) c.bytes.data[c.bytes.len - 1] ^= 1;
    pqw_file_add_row_group(&wf, 4, &c, 1);
    pqw_chunk_free(&c);
  }
  size_t len;
  uint8_t *data = pqw_file_finish(&wf, &len);
  f = open_mem(data, len, &src);
  ASSERT_OK(pq_projection_create(f, NULL, 0, &p, &err));
  ASSERT_OK(pq_reader_open(f, &src, p, 0, NULL, &r, &err));
  ASSERT_EQ(pq_reader_next(r, 10, &b, &err), LARDER_ECHECKSUM);
  ASSERT_EQ(pq_reader_next(r, 10, &b, &err), LARDER_EINVAL); /* stays failed */
  ASSERT_STR_CONTAINS(err.msg, "after an error");
  ASSERT_OK(pq_reader_set_row_group(r, 1, &err));
  ASSERT_EQ(pq_reader_next(r, 10, &b, &err), 4);
  sb.len = 0;
  ASSERT_OK(pq_json_append_row(&sb, &b, 0));
  ASSERT_STR_EQ(sb.data, "{\"s\":\"x1\"}");
  sb.len = 0;
  ASSERT_OK(pq_json_append_row(&sb, &b, 3));
  ASSERT_STR_EQ(sb.data, "{\"s\":\"zzz\"}");
  ASSERT_EQ(pq_reader_next(r, 10, &b, &err), 0);
  pq_strbuf_free(&sb);
  pq_batch_free(&b);
  pq_reader_close(r);
  pq_projection_free(p);
  pq_file_close(f);
  free(data);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Reading in batches                                                        */

enum { BATCH_ROWS = 1000 };

/* The batch file: x INT32? (v1 pages of 37 entries), s STRING? (dictionary,
 * v2 pages of 50), l list<INT64?>? (v1 pages of 5 entries, so records span
 * pages).  Row i of each is described by these functions. */
static int x_null(int i) { return i % 7 == 3; }
static int32_t x_val(int i) { return i * 3 - 500; }
static int s_null(int i) { return i % 11 == 5; }
static int l_null(int i) { return i % 9 == 4; }
static int l_len(int i) { return (i * 7) % 6; }
static int e_null(int i, int j) { return (i + j) % 5 == 0; }

static char *batch_expected(int from) {
  pqw_buf b = {0};
  char tmp[64];
  for (int i = from; i < BATCH_ROWS; i++) {
    pqw_put(&b, "{\"x\":", 5);
    if (x_null(i)) snprintf(tmp, sizeof(tmp), "null");
    else snprintf(tmp, sizeof(tmp), "%d", x_val(i));
    pqw_put(&b, tmp, strlen(tmp));
    if (s_null(i)) snprintf(tmp, sizeof(tmp), ",\"s\":null");
    else snprintf(tmp, sizeof(tmp), ",\"s\":\"str%d\"", i % 13);
    pqw_put(&b, tmp, strlen(tmp));
    pqw_put(&b, ",\"l\":", 5);
    if (l_null(i)) {
      pqw_put(&b, "null", 4);
    } else {
      pqw_u8(&b, '[');
      for (int j = 0; j < l_len(i); j++) {
        if (j) pqw_u8(&b, ',');
        if (e_null(i, j)) snprintf(tmp, sizeof(tmp), "null");
        else snprintf(tmp, sizeof(tmp), "%d", i * 10 + j);
        pqw_put(&b, tmp, strlen(tmp));
      }
      pqw_u8(&b, ']');
    }
    pqw_put(&b, "}\n", 2);
  }
  pqw_u8(&b, 0);
  size_t n;
  return (char *)pqw_buf_take(&b, &n);
}

static uint8_t *make_batch_file(size_t *len) {
  static int32_t xv[BATCH_ROWS];
  static uint16_t xdef[BATCH_ROWS], sdef[BATCH_ROWS];
  static char sbuf[BATCH_ROWS][16];
  static const char *sv[BATCH_ROWS];
  static int64_t lv[BATCH_ROWS * 6];
  static uint16_t ldef[BATCH_ROWS * 6], lrep[BATCH_ROWS * 6];
  int nx = 0, ns = 0, nl = 0, ne = 0;
  for (int i = 0; i < BATCH_ROWS; i++) {
    xdef[i] = !x_null(i);
    if (!x_null(i)) xv[nx++] = x_val(i);
    sdef[i] = !s_null(i);
    if (!s_null(i)) {
      snprintf(sbuf[ns], sizeof(sbuf[0]), "str%d", i % 13);
      sv[ns] = sbuf[ns];
      ns++;
    }
    if (l_null(i) || l_len(i) == 0) {
      ldef[ne] = l_null(i) ? 0 : 1;
      lrep[ne++] = 0;
    }
    for (int j = 0; !l_null(i) && j < l_len(i); j++) {
      lrep[ne] = j ? 1 : 0;
      ldef[ne++] = e_null(i, j) ? 2 : 3;
      if (!e_null(i, j)) lv[nl++] = i * 10 + j;
    }
  }
  pqw_schema s[] = {pqw_root(3),
                    pqw_leaf("x", PQ_INT32, PQ_OPTIONAL),
                    leaf_lt("s", PQ_BYTE_ARRAY, PQ_OPTIONAL, PQ_LT_STRING),
                    group_lt("l", PQ_OPTIONAL, 1, PQ_LT_LIST),
                    pqw_group("list", PQ_REPEATED, 1),
                    pqw_leaf("element", PQ_INT64, PQ_OPTIONAL)};
  pqw_file f;
  pqw_file_init(&f, s, 6);
  pqw_chunk ch[3];
  pqw_values vx = vals_fixed(PQ_INT32, xv, nx), vs = vals_bytes(sv, NULL, ns);
  pqw_values vl = vals_fixed(PQ_INT64, lv, nl);
  pqw_levels lx = {BATCH_ROWS, xdef, NULL, 1, 0}, ls = {BATCH_ROWS, sdef, NULL, 1, 0};
  pqw_levels ll = {ne, ldef, lrep, 3, 1};
  pqw_chunk_opts ox = {0}, os = {0}, ol = {0};
  ox.page_entries = 37;
  os.page_entries = 50;
  os.v2 = 1;
  os.encoding = PQ_ENC_RLE_DICTIONARY;
  os.codec = PQ_SNAPPY;
  ol.page_entries = 5;
  pqw_chunk_build(&ch[0], &vx, &lx, &ox);
  pqw_chunk_build(&ch[1], &vs, &ls, &os);
  pqw_chunk_build(&ch[2], &vl, &ll, &ol);
  ASSERT_GT(ch[2].num_pages, 100);
  pqw_file_add_row_group(&f, BATCH_ROWS, ch, 3);
  for (int c = 0; c < 3; c++) pqw_chunk_free(&ch[c]);
  return pqw_file_finish(&f, len);
}

TEST_IMPL(parquet_unit_batches) {
  size_t len;
  uint8_t *data = make_batch_file(&len);
  char *want = batch_expected(0);
  static const int64_t sizes[] = {1, 2, 3, 7, 64, 999, 1000, 5000};
  for (size_t k = 0; k < ARRAY_LEN(sizes); k++) {
    char *got = json_of(data, len, NULL, 0, sizes[k]);
    if (strcmp(got, want) != 0) {
      size_t i = 0;
      while (got[i] == want[i]) i++;
      ASSERT_FAIL_("batch %lld differs at byte %zu: got \"%.80s\" want \"%.80s\"",
                   (long long)sizes[k], i, got + (i > 40 ? i - 40 : 0),
                   want + (i > 40 ? i - 40 : 0));
    }
    free(got);
  }
  /* The arrays themselves, batch by batch, for x (validity, zeroed nulls). */
  pq_source src;
  pq_file *f = open_mem(data, len, &src);
  pq_projection *p = NULL;
  pq_error err = {0, ""};
  const char *x[] = {"x"};
  ASSERT_OK(pq_projection_create(f, x, 1, &p, &err));
  pq_reader *r = NULL;
  ASSERT_OK(pq_reader_open(f, &src, p, 0, NULL, &r, &err));
  pq_batch_t b;
  pq_batch_init(&b);
  int row = 0;
  for (int64_t step = 1; row < BATCH_ROWS; step = step * 2 % 97 + 1) {
    int64_t got = pq_reader_next(r, step, &b, &err);
    ASSERT_GT(got, 0);
    ASSERT_EQ(b.num_columns, 1);
    const pq_array_t *a = &b.columns[0];
    ASSERT_EQ(a->length, got);
    ASSERT_EQ(a->field->type, LARDER_TYPE_INT32);
    ASSERT_EQ(a->values.len, (size_t)got * 4);
    int64_t nulls = 0;
    for (int64_t i = 0; i < got; i++, row++) {
      int32_t v;
      memcpy(&v, a->values.data + 4 * i, 4);
      int valid = a->null_count == 0 || ((a->validity.data[i / 8] >> (i % 8)) & 1);
      ASSERT_EQ(valid, !x_null(row));
      ASSERT_EQ(v, x_null(row) ? 0 : x_val(row));
      nulls += x_null(row);
    }
    ASSERT_EQ(a->null_count, nulls);
    if (nulls) ASSERT_EQ(a->validity.len, (size_t)(got + 7) / 8);
    else ASSERT_EQ(a->validity.len, 0);
  }
  ASSERT_EQ(pq_reader_next(r, 10, &b, &err), 0);
  ASSERT_EQ(b.num_rows, 0);
  ASSERT_EQ(pq_reader_next(r, 10, &b, &err), 0);
  ASSERT(pq_batch_bytes(&b) < 1024);
  pq_batch_free(&b);
  pq_reader_close(r);
  pq_projection_free(p);
  pq_file_close(f);
  free(want);
  free(data);
  return 0;
}

TEST_IMPL(parquet_unit_skip) {
  size_t len;
  uint8_t *data = make_batch_file(&len);
  pq_source src;
  pq_file *f = open_mem(data, len, &src);
  pq_projection *p = NULL;
  pq_error err = {0, ""};
  ASSERT_OK(pq_projection_create(f, NULL, 0, &p, &err));
  static const int64_t skips[] = {0, 1, 4, 5, 36, 37, 38, 100, 501, 999, 1000, 1500};
  pq_strbuf_t sb = {0};
  for (size_t k = 0; k < ARRAY_LEN(skips); k++) {
    for (int twice = 0; twice < 2; twice++) {
      pq_reader *r = NULL;
      ASSERT_OK(pq_reader_open(f, &src, p, 0, NULL, &r, &err));
      int64_t want_skip = skips[k] < BATCH_ROWS ? skips[k] : BATCH_ROWS;
      if (twice) { /* in two steps, after reading a row */
        pq_batch_t one;
        pq_batch_init(&one);
        if (want_skip > 0) {
          ASSERT_EQ(pq_reader_next(r, 1, &one, &err), 1);
          ASSERT_EQ(pq_reader_skip(r, (want_skip - 1) / 2, &err), (want_skip - 1) / 2);
          int64_t rest = want_skip - 1 - (want_skip - 1) / 2;
          ASSERT_EQ(pq_reader_skip(r, rest, &err), rest);
        }
        pq_batch_free(&one);
      } else {
        ASSERT_EQ(pq_reader_skip(r, skips[k], &err), want_skip);
      }
      pqw_buf out = {0};
      pq_batch_t b;
      pq_batch_init(&b);
      for (;;) {
        int64_t got = pq_reader_next(r, 77, &b, &err);
        ASSERT_GE(got, 0);
        if (got == 0) break;
        for (int64_t i = 0; i < got; i++) {
          sb.len = 0;
          ASSERT_OK(pq_json_append_row(&sb, &b, i));
          pqw_put(&out, sb.data, sb.len);
          pqw_u8(&out, '\n');
        }
      }
      pqw_u8(&out, 0);
      char *want = batch_expected((int)want_skip);
      ASSERT_STR_EQ((const char *)out.data, want);
      free(want);
      pqw_buf_free(&out);
      pq_batch_free(&b);
      ASSERT_EQ(pq_reader_skip(r, 10, &err), 0);
      pq_reader_close(r);
    }
  }
  pq_strbuf_free(&sb);
  pq_projection_free(p);
  pq_file_close(f);
  free(data);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Every encoding, codec and page version                                    */

typedef struct enc_case {
  int physical;
  int encoding;
} enc_case;

static const enc_case kEncCases[] = {
    {PQ_INT32, PQ_ENC_PLAIN},
    {PQ_INT32, PQ_ENC_RLE_DICTIONARY},
    {PQ_INT32, PQ_ENC_PLAIN_DICTIONARY},
    {PQ_INT32, PQ_ENC_DELTA_BINARY_PACKED},
    {PQ_INT32, PQ_ENC_BYTE_STREAM_SPLIT},
    {PQ_INT64, PQ_ENC_PLAIN},
    {PQ_INT64, PQ_ENC_RLE_DICTIONARY},
    {PQ_INT64, PQ_ENC_DELTA_BINARY_PACKED},
    {PQ_INT64, PQ_ENC_BYTE_STREAM_SPLIT},
    {PQ_FLOAT, PQ_ENC_PLAIN},
    {PQ_FLOAT, PQ_ENC_BYTE_STREAM_SPLIT},
    {PQ_FLOAT, PQ_ENC_RLE_DICTIONARY},
    {PQ_DOUBLE, PQ_ENC_PLAIN},
    {PQ_DOUBLE, PQ_ENC_BYTE_STREAM_SPLIT},
    {PQ_DOUBLE, PQ_ENC_RLE_DICTIONARY},
    {PQ_BYTE_ARRAY, PQ_ENC_PLAIN},
    {PQ_BYTE_ARRAY, PQ_ENC_RLE_DICTIONARY},
    {PQ_BYTE_ARRAY, PQ_ENC_DELTA_LENGTH_BYTE_ARRAY},
    {PQ_BYTE_ARRAY, PQ_ENC_DELTA_BYTE_ARRAY},
    {PQ_FIXED_LEN_BYTE_ARRAY, PQ_ENC_PLAIN},
    {PQ_FIXED_LEN_BYTE_ARRAY, PQ_ENC_RLE_DICTIONARY},
    {PQ_FIXED_LEN_BYTE_ARRAY, PQ_ENC_DELTA_BYTE_ARRAY},
    {PQ_FIXED_LEN_BYTE_ARRAY, PQ_ENC_BYTE_STREAM_SPLIT},
    {PQ_BOOLEAN, PQ_ENC_PLAIN},
    {PQ_BOOLEAN, PQ_ENC_RLE},
    {PQ_INT96, PQ_ENC_PLAIN},
    {PQ_INT96, PQ_ENC_RLE_DICTIONARY},
};

enum { ENC_ROWS = 300, FLBA_W = 5 };

/* Appends the JSON of dense value k of the case's type. */
static void enc_value_json(pqw_buf *b, int physical, int k) {
  char tmp[96];
  switch (physical) {
    case PQ_INT32:
      snprintf(tmp, sizeof(tmp), "%d", k % 3 ? (k % 17) * 1000003 - 5000000 : -k);
      break;
    case PQ_INT64:
      snprintf(tmp, sizeof(tmp), "%lld",
               (long long)((int64_t)(k % 17) * 100000000007LL - (k % 3 ? 0 : INT64_MAX / 3)));
      break;
    case PQ_FLOAT: snprintf(tmp, sizeof(tmp), "%g", (double)((float)(k % 23 - 11) + 0.5f)); break;
    case PQ_DOUBLE: snprintf(tmp, sizeof(tmp), "%g", (k % 29) * 0.25 - 3); break;
    case PQ_BYTE_ARRAY:
      snprintf(tmp, sizeof(tmp), "\"%s%d\"", k % 4 ? "common-prefix-" : "s", k % 37);
      break;
    case PQ_FIXED_LEN_BYTE_ARRAY: {
      uint8_t v[FLBA_W] = {(uint8_t)k, (uint8_t)(k >> 8), (uint8_t)('a' + k % 26), 0xff,
                           (uint8_t)(k % 7)};
      tmp[0] = '"';
      ref_base64(v, FLBA_W, tmp + 1);
      strcat(tmp, "\"");
      break;
    }
    case PQ_BOOLEAN: snprintf(tmp, sizeof(tmp), "%s", k % 3 == 0 ? "true" : "false"); break;
    case PQ_INT96:
      snprintf(tmp, sizeof(tmp), "\"1970-01-%02dT00:00:00.%09d\"", 1 + k % 20, k * 1000 + 7);
      break;
    default: ASSERT(0);
  }
  pqw_put(b, tmp, strlen(tmp));
}

TEST_IMPL(parquet_unit_encodings) {
  static const int codecs[] = {PQ_UNCOMPRESSED, PQ_SNAPPY, PQ_GZIP, PQ_ZSTD, PQ_LZ4_RAW};
  int32_t i32[ENC_ROWS];
  int64_t i64[ENC_ROWS];
  float f32[ENC_ROWS];
  double f64[ENC_ROWS];
  static char sbuf[ENC_ROWS][32];
  const char *sv[ENC_ROWS];
  uint8_t flba[ENC_ROWS * FLBA_W], bools[ENC_ROWS], i96[ENC_ROWS * 12];
  for (int k = 0; k < ENC_ROWS; k++) {
    i32[k] = k % 3 ? (k % 17) * 1000003 - 5000000 : -k;
    i64[k] = (int64_t)(k % 17) * 100000000007LL - (k % 3 ? 0 : INT64_MAX / 3);
    f32[k] = (float)(k % 23 - 11) + 0.5f;
    f64[k] = (k % 29) * 0.25 - 3;
    snprintf(sbuf[k], sizeof(sbuf[k]), "%s%d", k % 4 ? "common-prefix-" : "s", k % 37);
    sv[k] = sbuf[k];
    uint8_t v[FLBA_W] = {(uint8_t)k, (uint8_t)(k >> 8), (uint8_t)('a' + k % 26), 0xff,
                         (uint8_t)(k % 7)};
    memcpy(flba + FLBA_W * k, v, FLBA_W);
    bools[k] = k % 3 == 0;
    uint64_t nanos = (uint64_t)k * 1000 + 7;
    uint32_t jd = 2440588 + (uint32_t)(k % 20);
    memcpy(i96 + 12 * k, &nanos, 8);
    memcpy(i96 + 12 * k + 8, &jd, 4);
  }
  static uint16_t def[ENC_ROWS];
  for (int i = 0; i < ENC_ROWS; i++) def[i] = i % 5 != 2;
  int files = 0;
  for (size_t c = 0; c < ARRAY_LEN(kEncCases); c++) {
    const enc_case *ec = &kEncCases[c];
    for (int optional = 0; optional < 2; optional++) {
      int nvals = 0;
      for (int i = 0; i < ENC_ROWS; i++) nvals += !optional || def[i];
      pqw_values v;
      switch (ec->physical) {
        case PQ_INT32: v = vals_fixed(PQ_INT32, i32, nvals); break;
        case PQ_INT64: v = vals_fixed(PQ_INT64, i64, nvals); break;
        case PQ_FLOAT: v = vals_fixed(PQ_FLOAT, f32, nvals); break;
        case PQ_DOUBLE: v = vals_fixed(PQ_DOUBLE, f64, nvals); break;
        case PQ_BYTE_ARRAY: v = vals_bytes(sv, NULL, nvals); break;
        case PQ_FIXED_LEN_BYTE_ARRAY: v = vals_flba(FLBA_W, flba, nvals); break;
        case PQ_BOOLEAN: v = vals_fixed(PQ_BOOLEAN, bools, nvals); break;
        default: v = vals_fixed(PQ_INT96, i96, nvals); break;
      }
      pqw_buf want = {0};
      for (int i = 0, k = 0; i < ENC_ROWS; i++) {
        pqw_put(&want, "{\"c\":", 5);
        if (optional && !def[i]) pqw_put(&want, "null", 4);
        else enc_value_json(&want, ec->physical, k++);
        pqw_put(&want, "}\n", 2);
      }
      pqw_u8(&want, 0);
      pqw_schema s[2] = {pqw_root(1),
                         pqw_leaf("c", ec->physical, optional ? PQ_OPTIONAL : PQ_REQUIRED)};
      if (ec->physical == PQ_BYTE_ARRAY) s[1].logical = PQ_LT_STRING;
      if (ec->physical == PQ_FIXED_LEN_BYTE_ARRAY) s[1].type_length = FLBA_W;
      pqw_levels lv = {ENC_ROWS, def, NULL, 1, 0};
      const pqw_levels *lvp = optional ? &lv : NULL;
      for (size_t z = 0; z < ARRAY_LEN(codecs); z++) {
        for (int v2 = 0; v2 < 2; v2++) {
          pqw_chunk_opts o = {0};
          o.codec = codecs[z];
          o.v2 = v2;
          o.encoding = ec->encoding;
          o.page_entries = 64 + (int64_t)c;
          o.crc = (int)(c + z) % 2;
          if (ec->encoding == PQ_ENC_DELTA_BINARY_PACKED && v2) {
            o.delta_block = 256;
            o.delta_mini = 8;
          }
          size_t len;
          uint8_t *data = build_file(s, 2, &v, &lvp, 1, &o, ENC_ROWS, &len);
          char *got = json_of(data, len, NULL, 0, 1000);
          if (strcmp(got, (const char *)want.data) != 0) {
            size_t i = 0;
            while (got[i] == want.data[i]) i++;
            ASSERT_FAIL_("%s %s %s v%d %s: differs at byte %zu: got \"%.60s\" want \"%.60s\"",
                         pq_physical_name(ec->physical), pq_encoding_name(ec->encoding),
                         pq_codec_name(codecs[z]), v2 + 1, optional ? "optional" : "required", i,
                         got + i, (const char *)want.data + i);
          }
          free(got);
          free(data);
          files++;
        }
      }
      pqw_buf_free(&want);
    }
  }
  ASSERT_EQ(files, (int)ARRAY_LEN(kEncCases) * 2 * 5 * 2);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* The conformance files                                                     */

/* Reads a file on disk completely; returns 0 or the error code. */
static int read_disk_file(const char *path, const pq_options *opts, int64_t *rows, pq_error *err) {
  pq_source src;
  int rc = pq_source_open_file(&src, path, err);
  if (rc) return rc;
  pq_file *f = NULL;
  pq_projection *p = NULL;
  pq_batch_t b;
  pq_batch_init(&b);
  pq_strbuf_t sb = {0};
  *rows = 0;
  rc = pq_file_open(&src, opts, &f, err);
  if (rc == 0) rc = pq_projection_create(f, NULL, 0, &p, err);
  for (int g = 0; rc == 0 && g < pq_file_meta(f)->num_row_groups; g++) {
    pq_reader *r = NULL;
    rc = pq_reader_open(f, &src, p, g, opts, &r, err);
    while (rc == 0) {
      int64_t got = pq_reader_next(r, 997, &b, err);
      if (got < 0) rc = (int)got;
      if (got <= 0) break;
      for (int64_t i = 0; i < got; i++) {
        sb.len = 0;
        ASSERT_OK(pq_json_append_row(&sb, &b, i));
      }
      *rows += got;
    }
    pq_reader_close(r);
  }
  pq_strbuf_free(&sb);
  pq_batch_free(&b);
  pq_projection_free(p);
  pq_file_close(f);
  pq_source_close_file(&src);
  return rc;
}

TEST_IMPL(parquet_unit_conformance_smoke) {
  char dir[512];
  test_data_path(dir, sizeof(dir), "parquet-testing/data");
  DIR *d = opendir(dir);
  if (d == NULL) {
    fprintf(stderr, "no %s\n", dir);
    return TEST_SKIP;
  }
  int files = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    size_t n = strlen(e->d_name);
    if (n < 8 || strcmp(e->d_name + n - 8, ".parquet") != 0) continue;
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    pq_error err = {0, ""};
    int64_t rows = 0;
    int rc = read_disk_file(path, NULL, &rows, &err);
    if (strstr(e->d_name, "corrupt-checksum")) {
      ASSERT_EQ(rc, LARDER_ECHECKSUM);
      ASSERT_STR_CONTAINS(err.msg, e->d_name);
      ASSERT_STR_CONTAINS(err.msg, "CRC");
      pq_options o;
      pq_options_init(&o);
      o.verify_crc = 0;
      rc = read_disk_file(path, &o, &rows, &err);
    }
    if (rc != 0) ASSERT_FAIL_("%s: %d %s", e->d_name, rc, err.msg);
    files++;
  }
  closedir(d);
  ASSERT_GT(files, 40);
  return 0;
}
