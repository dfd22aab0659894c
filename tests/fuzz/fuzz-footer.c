/*
 * fuzz-footer.c: libFuzzer target over whole Parquet files.
 *
 * The input is a complete file, read from memory: the footer is parsed,
 * every column projected, and every row group read in batches of 1000 rows
 * under a 64 MiB ceiling per column chunk, so the footer parser, the schema
 * builder and the page decoders are all exercised together.  Every batch is
 * checked against the layout parquet.h promises (lengths, offsets, validity)
 * and a few rows of it rendered as JSON; every failure must name the file.
 * A broken promise aborts, which libFuzzer reports as a crash.
 *
 * fuzz-pages.c includes this file (with FUZZ_FOOTER_NO_MAIN) to reuse
 * fuzz_read_parquet.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/parquet.h"

#define FUZZ_NAME "fuzz.parquet"
/* Rows read per input at most: a footer may declare billions of cheap rows,
 * which is slow but not a bug. */
#define FUZZ_MAX_ROWS 200000

#define FUZZ_CHECK(cond)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: broken promise: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                   \
    }                                                                            \
  } while (0)

/* The serving layout's value widths, written out here rather than taken
 * from pq_field_value_width: the check must not share a mistake with the
 * code it checks. */
static size_t fuzz_type_width(const pq_field_t *f) {
  switch (f->type) {
    case LARDER_TYPE_INT8:
    case LARDER_TYPE_UINT8: return 1;
    case LARDER_TYPE_INT16:
    case LARDER_TYPE_UINT16:
    case LARDER_TYPE_FLOAT16: return 2;
    case LARDER_TYPE_INT32:
    case LARDER_TYPE_UINT32:
    case LARDER_TYPE_FLOAT32:
    case LARDER_TYPE_DATE32:
    case LARDER_TYPE_TIME32: return 4;
    case LARDER_TYPE_INT64:
    case LARDER_TYPE_UINT64:
    case LARDER_TYPE_FLOAT64:
    case LARDER_TYPE_TIME64:
    case LARDER_TYPE_TIMESTAMP: return 8;
    case LARDER_TYPE_DECIMAL128:
    case LARDER_TYPE_DECIMAL256:
    case LARDER_TYPE_FIXED_BINARY: return (size_t)f->byte_width;
    default: return 0;
  }
}

/* Checks one array (and its children) against the serving layout. */
static void fuzz_check_array(const pq_array_t *a) {
  const pq_field_t *f = a->field;
  int64_t n = a->length;
  FUZZ_CHECK(n >= 0);
  FUZZ_CHECK(a->null_count >= 0 && a->null_count <= n);
  if (f->type == LARDER_TYPE_NULL) return;
  if (a->null_count > 0 && f->type != LARDER_TYPE_NULL) {
    FUZZ_CHECK(a->validity.len * 8 >= (size_t)n);
    int64_t zeros = 0;
    for (int64_t i = 0; i < n; i++) zeros += !((a->validity.data[i >> 3] >> (i & 7)) & 1);
    FUZZ_CHECK(zeros == a->null_count);
  }
  const int32_t *off = (const int32_t *)(const void *)a->offsets.data;
  switch (f->type) {
    case LARDER_TYPE_BOOL: FUZZ_CHECK(a->values.len * 8 >= (size_t)n); break;
    case LARDER_TYPE_BINARY:
    case LARDER_TYPE_STRING:
      FUZZ_CHECK(a->offsets.len >= ((size_t)n + 1) * 4);
      FUZZ_CHECK(off[0] >= 0);
      for (int64_t i = 0; i < n; i++) FUZZ_CHECK(off[i] <= off[i + 1]);
      FUZZ_CHECK((size_t)off[n] <= a->values.len);
      break;
    case LARDER_TYPE_LIST:
    case LARDER_TYPE_MAP:
      FUZZ_CHECK(a->num_children == 1);
      FUZZ_CHECK(a->offsets.len >= ((size_t)n + 1) * 4);
      FUZZ_CHECK(off[0] >= 0);
      for (int64_t i = 0; i < n; i++) FUZZ_CHECK(off[i] <= off[i + 1]);
      FUZZ_CHECK(off[n] == a->children[0].length);
      fuzz_check_array(&a->children[0]);
      break;
    case LARDER_TYPE_STRUCT:
      for (int i = 0; i < a->num_children; i++) {
        FUZZ_CHECK(a->children[i].length == n);
        fuzz_check_array(&a->children[i]);
      }
      break;
    default: {
      size_t w = fuzz_type_width(f);
      FUZZ_CHECK(w > 0);
      FUZZ_CHECK(a->values.len >= (size_t)n * w);
      break;
    }
  }
}

/* A failure must be a known negative code with a message naming the file. */
static void fuzz_check_error(int rc, const pq_error *err) {
  FUZZ_CHECK(rc < 0 && rc > LARDER_ERRNO_MIN_);
  FUZZ_CHECK(err->code == rc);
  FUZZ_CHECK(err->msg[0] != '\0');
  if (rc != LARDER_ENOMEM) FUZZ_CHECK(strstr(err->msg, FUZZ_NAME) != NULL);
}

/* Reads everything; returns the rows read. */
static int64_t fuzz_read_parquet(const uint8_t *data, size_t size) {
  pq_source src;
  pq_source_init_memory(&src, data, size, FUZZ_NAME);
  pq_options opts;
  pq_options_init(&opts);
  opts.max_chunk_decoded_bytes = (uint64_t)64 << 20;
  /* Checksums would stop almost every mutation at the first page. */
  opts.verify_crc = 0;
  pq_error err;
  memset(&err, 0, sizeof(err));
  pq_file *f = NULL;
  int rc = pq_file_open(&src, &opts, &f, &err);
  if (rc != 0) {
    fuzz_check_error(rc, &err);
    FUZZ_CHECK(f == NULL);
    return 0;
  }
  const pq_file_meta_t *m = pq_file_meta(f);
  pq_projection *p = NULL;
  rc = pq_projection_create(f, NULL, 0, &p, &err);
  if (rc != 0) {
    fuzz_check_error(rc, &err);
    pq_file_close(f);
    return 0;
  }
  pq_range_t *ranges = NULL;
  int nr = pq_projection_ranges(f, p, -1, &ranges, &err);
  if (nr < 0) {
    fuzz_check_error(nr, &err);
  } else {
    for (int i = 0; i < nr; i++) {
      FUZZ_CHECK(ranges[i].offset + ranges[i].length <= size);
      /* Sorted and disjoint; touching chunks stay apart (parquet.h). */
      if (i) FUZZ_CHECK(ranges[i].offset >= ranges[i - 1].offset + ranges[i - 1].length);
    }
  }
  free(ranges);
  pq_batch_t b;
  pq_batch_init(&b);
  pq_strbuf_t sb = {0};
  int64_t total = 0;
  pq_reader *r = NULL;
  for (int g = 0; g < m->num_row_groups && total < FUZZ_MAX_ROWS; g++) {
    /* Odd row groups reuse the reader, to cover pq_reader_set_row_group. */
    if (r != NULL && (g % 2) == 1) {
      rc = pq_reader_set_row_group(r, g, &err);
    } else {
      pq_reader_close(r);
      r = NULL;
      rc = pq_reader_open(f, &src, p, g, &opts, &r, &err);
    }
    if (rc != 0) {
      fuzz_check_error(rc, &err);
      continue;
    }
    int64_t left = m->row_groups[g].num_rows;
    while (total < FUZZ_MAX_ROWS) {
      int64_t got = pq_reader_next(r, 1000, &b, &err);
      if (got < 0) {
        fuzz_check_error((int)got, &err);
        break;
      }
      if (got == 0) {
        FUZZ_CHECK(left == 0);
        break;
      }
      FUZZ_CHECK(got <= 1000 && got <= left);
      FUZZ_CHECK(b.num_rows == got);
      left -= got;
      total += got;
      FUZZ_CHECK(b.num_columns == pq_projection_schema(p)->num_children);
      for (int c = 0; c < b.num_columns; c++) {
        FUZZ_CHECK(b.columns[c].length == got);
        fuzz_check_array(&b.columns[c]);
      }
      for (int64_t i = 0; i < got && i < 4; i++) {
        sb.len = 0;
        FUZZ_CHECK(pq_json_append_row(&sb, &b, i) == 0);
      }
      sb.len = 0;
      FUZZ_CHECK(pq_json_append_row(&sb, &b, got - 1) == 0);
    }
  }
  pq_reader_close(r);
  pq_strbuf_free(&sb);
  pq_batch_free(&b);
  pq_projection_free(p);
  pq_file_close(f);
  return total;
}

#ifndef FUZZ_FOOTER_NO_MAIN
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  (void)fuzz_read_parquet(data, size);
  return 0;
}
#endif
