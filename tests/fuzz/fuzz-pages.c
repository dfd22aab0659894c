/*
 * fuzz-pages.c: libFuzzer target focused on page decoding.
 *
 * The input is a column chunk: byte 0 picks one of the variants below (a
 * one-leaf schema and a codec), bytes 1-2 the row group's row count
 * (little-endian), and the rest are the chunk's bytes (page headers and
 * bodies).  A fixed, valid footer is built around them with the tests'
 * writer (tests/pqwrite.c), so the fuzzer spends its time in page headers,
 * levels, value decoders and decompression rather than in the footer.  The
 * file is then read and checked as fuzz-footer.c does.
 *
 * Seeds: with LARDER_FUZZ_SEED_DIR set, LLVMFuzzerInitialize writes seeds
 * there and exits: well-formed chunks of every variant in several encodings
 * (made by pqw_chunk_build), and the column chunks of the files named in
 * LARDER_FUZZ_SEED_FILES (colon-separated paths) whose leaf matches a
 * variant.  tests/fuzz/run.sh does this before fuzzing.
 */
#define FUZZ_FOOTER_NO_MAIN 1
#include "fuzz-footer.c"

#include "../pqwrite.c"

#include <sys/stat.h>

enum { V_FLAT = 0, V_LIST, V_STRUCT, V_REPEATED };

typedef struct variant {
  const char *name;
  int physical;
  int32_t type_length;
  int repetition; /* of the leaf, for V_FLAT */
  int shape;
  int codec;
  int logical; /* on the leaf */
} variant;

static const variant kVariants[16] = {
    {"int32_req", PQ_INT32, 0, PQ_REQUIRED, V_FLAT, PQ_UNCOMPRESSED, 0},
    {"int32_opt_snappy", PQ_INT32, 0, PQ_OPTIONAL, V_FLAT, PQ_SNAPPY, 0},
    {"string_opt", PQ_BYTE_ARRAY, 0, PQ_OPTIONAL, V_FLAT, PQ_UNCOMPRESSED, PQ_LT_STRING},
    {"list_int64", PQ_INT64, 0, PQ_OPTIONAL, V_LIST, PQ_UNCOMPRESSED, 0},
    {"flba16_req_zstd", PQ_FIXED_LEN_BYTE_ARRAY, 16, PQ_REQUIRED, V_FLAT, PQ_ZSTD, 0},
    {"bool_opt", PQ_BOOLEAN, 0, PQ_OPTIONAL, V_FLAT, PQ_UNCOMPRESSED, 0},
    {"double_req_gzip", PQ_DOUBLE, 0, PQ_REQUIRED, V_FLAT, PQ_GZIP, 0},
    {"int32_opt_zstd", PQ_INT32, 0, PQ_OPTIONAL, V_FLAT, PQ_ZSTD, 0},
    {"binary_req_snappy", PQ_BYTE_ARRAY, 0, PQ_REQUIRED, V_FLAT, PQ_SNAPPY, 0},
    {"list_int64_snappy", PQ_INT64, 0, PQ_OPTIONAL, V_LIST, PQ_SNAPPY, 0},
    {"int96_opt", PQ_INT96, 0, PQ_OPTIONAL, V_FLAT, PQ_UNCOMPRESSED, 0},
    {"int64_opt_lz4raw", PQ_INT64, 0, PQ_OPTIONAL, V_FLAT, PQ_LZ4_RAW, PQ_LT_TIMESTAMP},
    {"decimal_flba5_opt", PQ_FIXED_LEN_BYTE_ARRAY, 5, PQ_OPTIONAL, V_FLAT, PQ_UNCOMPRESSED,
     PQ_LT_DECIMAL},
    {"struct_int32", PQ_INT32, 0, PQ_OPTIONAL, V_STRUCT, PQ_UNCOMPRESSED, 0},
    {"repeated_int32_brotli", PQ_INT32, 0, PQ_REPEATED, V_REPEATED, PQ_BROTLI, 0},
    {"float_opt_lz4", PQ_FLOAT, 0, PQ_OPTIONAL, V_FLAT, PQ_LZ4, 0},
};

/* The variant's schema; returns the element count. */
static int variant_schema(const variant *v, pqw_schema *s) {
  pqw_schema leaf =
      pqw_leaf(v->shape == V_LIST ? "element" : "c", v->physical,
               v->shape == V_LIST || v->shape == V_STRUCT ? PQ_OPTIONAL : v->repetition);
  leaf.type_length = v->type_length;
  leaf.logical = v->logical;
  if (v->logical == PQ_LT_TIMESTAMP) {
    leaf.lt_unit = 2;
    leaf.lt_utc = 1;
  }
  if (v->logical == PQ_LT_DECIMAL) {
    leaf.lt_precision = 10;
    leaf.lt_scale = 2;
  }
  s[0] = pqw_root(1);
  switch (v->shape) {
    case V_LIST:
      s[1] = pqw_group("l", PQ_OPTIONAL, 1);
      s[1].logical = PQ_LT_LIST;
      s[2] = pqw_group("list", PQ_REPEATED, 1);
      s[3] = leaf;
      return 4;
    case V_STRUCT:
      s[1] = pqw_group("s", PQ_OPTIONAL, 1);
      s[2] = leaf;
      return 3;
    default: s[1] = leaf; return 2;
  }
}

static int variant_max_def(const variant *v) {
  switch (v->shape) {
    case V_LIST: return 3;
    case V_STRUCT: return 2;
    case V_REPEATED: return 1;
    default: return v->repetition == PQ_OPTIONAL;
  }
}

static int variant_max_rep(const variant *v) {
  return v->shape == V_LIST || v->shape == V_REPEATED;
}

/* Builds the file around the chunk; the caller frees it. */
static uint8_t *build_file_around(const variant *v, const uint8_t *chunk, size_t len, int64_t rows,
                                  size_t *out_len) {
  pqw_schema s[4];
  int ns = variant_schema(v, s);
  pqw_file f;
  pqw_file_init(&f, s, ns);
  pqw_chunk c;
  pqw_chunk_init(&c, v->physical, v->codec);
  pqw_put(&c.bytes, chunk, len);
  c.num_values = rows;
  c.uncompressed_size = (int64_t)len;
  c.encodings = 1u << PQ_ENC_PLAIN | 1u << PQ_ENC_RLE;
  pqw_file_add_row_group(&f, rows, &c, 1);
  pqw_chunk_free(&c);
  return pqw_file_finish(&f, out_len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4) return 0;
  const variant *v = &kVariants[data[0] & 15];
  int64_t rows = (int64_t)data[1] | (int64_t)data[2] << 8;
  size_t len;
  uint8_t *file = build_file_around(v, data + 3, size - 3, rows, &len);
  (void)fuzz_read_parquet(file, len);
  free(file);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Seeds                                                                     */

static int seed_count;

static void write_seed(const char *dir, int vi, int64_t rows, const uint8_t *chunk, size_t len) {
  if (len > (1u << 20) - 3) return;
  char path[1024];
  snprintf(path, sizeof(path), "%s/seed-%s-%04d", dir, kVariants[vi].name, seed_count++);
  FILE *f = fopen(path, "wb");
  if (f == NULL) return;
  uint8_t head[3] = {(uint8_t)vi, (uint8_t)rows, (uint8_t)(rows >> 8)};
  fwrite(head, 1, 3, f);
  fwrite(chunk, 1, len, f);
  fclose(f);
}

/* Well-formed chunks of every variant, in the encodings it allows, v1 and
 * v2, with a CRC on some. */
static void generated_seeds(const char *dir) {
  enum { N = 60 };
  int32_t i32[N];
  int64_t i64[N];
  float f32[N];
  double f64[N];
  uint8_t bools[N], fixed[N * 16];
  char sbuf[N][16];
  const char *strs[N];
  for (int i = 0; i < N; i++) {
    i32[i] = i % 7 * 1000 - 3000;
    i64[i] = (int64_t)(i % 5) * 1000000007LL - (i % 3 ? 0 : INT64_MAX / 5);
    f32[i] = (float)i / 4;
    f64[i] = i * 0.125 - 2;
    bools[i] = i % 3 == 0;
    for (int k = 0; k < 16; k++) fixed[i * 16 + k] = (uint8_t)(i * 31 + k * (i % 4));
    snprintf(sbuf[i], sizeof(sbuf[i]), "v%d", i % 9);
    strs[i] = sbuf[i];
  }
  uint16_t def[N], rep[N];
  for (int vi = 0; vi < 16; vi++) {
    const variant *v = &kVariants[vi];
    int max_def = variant_max_def(v), max_rep = variant_max_rep(v);
    int nvals = 0, rows = 0;
    for (int i = 0; i < N; i++) {
      rep[i] = max_rep && i % 4 != 0 ? 1 : 0;
      def[i] = (uint16_t)(max_def == 0 ? 0 : i % 6 == 5 ? max_def - 1 : max_def);
      /* An empty repeated field can only start a record. */
      if (v->shape == V_REPEATED && rep[i] != 0) def[i] = (uint16_t)max_def;
      nvals += max_def == 0 || def[i] == max_def;
      rows += rep[i] == 0;
    }
    pqw_values vals;
    memset(&vals, 0, sizeof(vals));
    vals.physical = v->physical;
    vals.count = nvals;
    vals.type_length = v->type_length;
    switch (v->physical) {
      case PQ_INT32: vals.fixed = i32; break;
      case PQ_INT64: vals.fixed = i64; break;
      case PQ_FLOAT: vals.fixed = f32; break;
      case PQ_DOUBLE: vals.fixed = f64; break;
      case PQ_BOOLEAN: vals.fixed = bools; break;
      case PQ_BYTE_ARRAY: vals.bytes = strs; break;
      default: vals.fixed = fixed; break; /* FLBA, INT96 */
    }
    pqw_levels lv = {N, max_def ? def : NULL, max_rep ? rep : NULL, max_def, max_rep};
    int encs[6], ne = 0;
    encs[ne++] = PQ_ENC_PLAIN;
    if (v->physical != PQ_BOOLEAN) encs[ne++] = PQ_ENC_RLE_DICTIONARY;
    if (v->physical == PQ_INT32 || v->physical == PQ_INT64) encs[ne++] = PQ_ENC_DELTA_BINARY_PACKED;
    if (v->physical == PQ_BYTE_ARRAY) {
      encs[ne++] = PQ_ENC_DELTA_LENGTH_BYTE_ARRAY;
      encs[ne++] = PQ_ENC_DELTA_BYTE_ARRAY;
    }
    if (v->physical == PQ_FIXED_LEN_BYTE_ARRAY) encs[ne++] = PQ_ENC_DELTA_BYTE_ARRAY;
    if (v->physical == PQ_FLOAT || v->physical == PQ_DOUBLE ||
        v->physical == PQ_FIXED_LEN_BYTE_ARRAY)
      encs[ne++] = PQ_ENC_BYTE_STREAM_SPLIT;
    if (v->physical == PQ_BOOLEAN) encs[ne++] = PQ_ENC_RLE;
    /* The writer compresses only some codecs; others get no seeds. */
    int codec_ok = v->codec == PQ_UNCOMPRESSED || v->codec == PQ_SNAPPY || v->codec == PQ_GZIP ||
                   v->codec == PQ_ZSTD || v->codec == PQ_LZ4_RAW;
    if (!codec_ok) continue;
    for (int e = 0; e < ne; e++) {
      for (int v2 = 0; v2 < 2; v2++) {
        pqw_chunk_opts o;
        memset(&o, 0, sizeof(o));
        o.codec = v->codec;
        o.v2 = v2;
        o.encoding = encs[e];
        o.page_entries = 16 + 7 * e;
        o.crc = (e + v2) % 2;
        pqw_chunk c;
        pqw_chunk_build(&c, &vals, &lv, &o);
        write_seed(dir, vi, rows, c.bytes.data, c.bytes.len);
        pqw_chunk_free(&c);
      }
    }
  }
}

/* The column chunks of real files whose leaf matches a variant. */
static void file_seeds(const char *dir, const char *path) {
  pq_source src;
  pq_error err;
  if (pq_source_open_file(&src, path, &err) != 0) return;
  pq_file *f = NULL;
  if (pq_file_open(&src, NULL, &f, &err) == 0) {
    const pq_file_meta_t *m = pq_file_meta(f);
    for (int g = 0; g < m->num_row_groups; g++) {
      for (int c = 0; c < m->num_leaves; c++) {
        const pq_schema_node_t *leaf = m->leaves[c];
        const pq_column_chunk_t *cc = &m->row_groups[g].columns[c];
        for (int vi = 0; vi < 16; vi++) {
          const variant *v = &kVariants[vi];
          if (v->physical != (int)leaf->physical || v->codec != (int)cc->codec ||
              variant_max_def(v) != leaf->def_level || variant_max_rep(v) != leaf->rep_level)
            continue;
          if (v->physical == PQ_FIXED_LEN_BYTE_ARRAY && v->type_length != leaf->type_length)
            continue;
          if (cc->range_length > (1u << 20)) continue;
          const uint8_t *p = src.map ? src.map(&src, cc->range_offset, cc->range_length) : NULL;
          if (p == NULL) continue;
          int64_t rows = m->row_groups[g].num_rows;
          write_seed(dir, vi, rows > 65535 ? 65535 : rows, p, (size_t)cc->range_length);
          break;
        }
      }
    }
    pq_file_close(f);
  }
  pq_source_close_file(&src);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *dir = getenv("LARDER_FUZZ_SEED_DIR");
  if (dir == NULL || *dir == '\0') return 0;
  mkdir(dir, 0755);
  generated_seeds(dir);
  const char *files = getenv("LARDER_FUZZ_SEED_FILES");
  if (files != NULL) {
    char *copy = strdup(files);
    for (char *tok = strtok(copy, ":"); tok != NULL; tok = strtok(NULL, ":")) file_seeds(dir, tok);
    free(copy);
  }
  fprintf(stderr, "fuzz-pages: wrote %d seeds to %s\n", seed_count, dir);
  exit(0);
}
