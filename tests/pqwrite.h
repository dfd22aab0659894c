/*
 * pqwrite.h: a tiny Parquet writer for the tests, written independently of
 * the reader (it shares only the enum numbers of daemon/parquet/parquet.h and
 * daemon/parquet/pq_internal.h), so that tests can make well-formed files of any
 * shape and hostile files that lie in every field.
 *
 * Conventions
 * -----------
 * - Layers, each usable on its own:
 *     pqw_buf      a growable byte buffer; running out of memory aborts.
 *     pqw_thrift   a Thrift compact-protocol encoder (fields, structs, lists,
 *                  maps), with raw access for hand-made malformed bytes.
 *     pqw_page     a PageHeader: every field may lie; PQW_AUTO fills a size
 *                  or CRC from the body, PQW_OMIT leaves a field out.
 *     pqw_chunk    a column chunk: pages appended one by one (any header,
 *                  any body) or built from values and levels by
 *                  pqw_chunk_build (PLAIN, dictionary, delta, byte stream
 *                  split, RLE booleans; v1 or v2 pages; any codec below).
 *     pqw_file     "PAR1", row groups of chunks, and a FileMetaData whose
 *                  column metadata the test may edit (to lie) before
 *                  pqw_file_finish writes the footer.
 * - Encoders for the pieces of pages: PLAIN values, the RLE / bit-packing
 *   hybrid (with or without the v1 4-byte length), DELTA_BINARY_PACKED
 *   (a straightforward reference encoder), compression (UNCOMPRESSED,
 *   SNAPPY, GZIP, ZSTD, LZ4_RAW) and CRC-32.
 * - Nothing here depends on the test harness, so the fuzz targets can
 *   include pqwrite.c directly.
 */
#ifndef LARDER_TESTS_PQWRITE_H
#define LARDER_TESTS_PQWRITE_H

#include <stddef.h>
#include <stdint.h>

#include "parquet/pq_internal.h"

/* ------------------------------------------------------------------------ */
/* Buffers                                                                   */

typedef struct pqw_buf {
  uint8_t *data;
  size_t len, cap;
} pqw_buf;

void pqw_reserve(pqw_buf *b, size_t extra);
void pqw_put(pqw_buf *b, const void *p, size_t n);
void pqw_u8(pqw_buf *b, uint8_t v);
void pqw_le16(pqw_buf *b, uint16_t v);
void pqw_le32(pqw_buf *b, uint32_t v);
void pqw_le64(pqw_buf *b, uint64_t v);
void pqw_uvarint(pqw_buf *b, uint64_t v);
void pqw_zigzag(pqw_buf *b, int64_t v); /* zigzag varint */
void pqw_buf_free(pqw_buf *b);
/* Hands the bytes to the caller (who frees them) and empties b. */
uint8_t *pqw_buf_take(pqw_buf *b, size_t *len);

/* ------------------------------------------------------------------------ */
/* Thrift compact protocol                                                   */

#define PQW_THRIFT_MAX_DEPTH 256

typedef struct pqw_thrift {
  pqw_buf *out;
  int depth;
  int16_t last[PQW_THRIFT_MAX_DEPTH];
} pqw_thrift;

void pqw_t_init(pqw_thrift *t, pqw_buf *out);
/* A field header (id, PQ_TT_* type), with the delta form when it fits. */
void pqw_t_field(pqw_thrift *t, int16_t id, int type);
void pqw_t_i32(pqw_thrift *t, int16_t id, int32_t v);
void pqw_t_i64(pqw_thrift *t, int16_t id, int64_t v);
void pqw_t_i16(pqw_thrift *t, int16_t id, int16_t v);
void pqw_t_byte(pqw_thrift *t, int16_t id, int8_t v);
void pqw_t_bool(pqw_thrift *t, int16_t id, int v);
void pqw_t_double(pqw_thrift *t, int16_t id, double v);
void pqw_t_binary(pqw_thrift *t, int16_t id, const void *p, size_t n);
void pqw_t_string(pqw_thrift *t, int16_t id, const char *s);
/* Opens a struct: as a field (pqw_t_struct_begin), or as a list element or
 * the top-level struct (pqw_t_push).  pqw_t_struct_end writes STOP. */
void pqw_t_struct_begin(pqw_thrift *t, int16_t id);
void pqw_t_push(pqw_thrift *t);
void pqw_t_struct_end(pqw_thrift *t);
/* A list (or set) field header and its size; then write n elements. */
void pqw_t_list_begin(pqw_thrift *t, int16_t id, int elem_type, uint64_t n);
void pqw_t_set_begin(pqw_thrift *t, int16_t id, int elem_type, uint64_t n);
/* A map field header: n, then (when n > 0) the key and value types. */
void pqw_t_map_begin(pqw_thrift *t, int16_t id, int key_type, int val_type, uint64_t n);
/* Bare values (list elements, map entries). */
void pqw_t_val_int(pqw_thrift *t, int64_t v); /* i16 / i32 / i64 */
void pqw_t_val_binary(pqw_thrift *t, const void *p, size_t n);
void pqw_t_val_bool(pqw_thrift *t, int v); /* 1 true, 2 false */
void pqw_t_val_byte(pqw_thrift *t, int8_t v);
void pqw_t_val_double(pqw_thrift *t, double v);

/* ------------------------------------------------------------------------ */
/* Page headers                                                              */

#define PQW_AUTO INT32_MIN       /* computed from the body */
#define PQW_OMIT (INT32_MIN + 1) /* the field is left out */

typedef struct pqw_page {
  int32_t type;              /* PQ_PAGE_* or any number; PQW_OMIT */
  int32_t uncompressed_size; /* PQW_AUTO: the body's size before compression */
  int32_t compressed_size;   /* PQW_AUTO: the body's size */
  int32_t crc;               /* PQW_OMIT (default), PQW_AUTO, or a value */
  /* DataPageHeader, DictionaryPageHeader, DataPageHeaderV2 */
  int32_t num_values;
  int32_t encoding;
  int32_t def_encoding, rep_encoding; /* v1; PQW_OMIT to leave out */
  int32_t num_nulls, num_rows;        /* v2 */
  int32_t def_length, rep_length;     /* v2 */
  int is_compressed;                  /* v2: -1 left out (default), 0, 1 */
  int omit_sub;                       /* leave out the sub-header the type calls for */
  int16_t sub_id;                     /* write the sub-header under this field id (0: by type) */
  /* An extra unknown field (id, any PQ_TT_ type with a zero value) to
   * check that readers skip it; 0: none. */
  int16_t extra_id;
  int extra_type;
} pqw_page;

/* Defaults: sizes PQW_AUTO, no CRC, RLE level encodings, PLAIN values. */
void pqw_page_init(pqw_page *h, int type);
/* Writes the header for a body of body_len bytes (raw_len before
 * compression) at body. */
void pqw_page_header(pqw_buf *out, const pqw_page *h, const uint8_t *body, size_t body_len,
                     size_t raw_len);

/* ------------------------------------------------------------------------ */
/* Encoders                                                                  */

/* Bits needed for values up to max (0 for 0). */
int pqw_bit_width(uint64_t max);
/* Packs n values of w bits (0..64), LSB first, padding to whole bytes. */
void pqw_bitpack(pqw_buf *out, const uint64_t *v, size_t n, int w);

enum { PQW_RLE_AUTO = 0, PQW_RLE_RUNS_ONLY = 1, PQW_RLE_PACKED_ONLY = 2 };
/* The RLE / bit-packing hybrid without a length prefix.  AUTO uses an RLE
 * run for 8 or more equal values and bit-packed groups otherwise. */
void pqw_rle(pqw_buf *out, const uint32_t *v, size_t n, int w, int mode);
/* Levels as a v1 page holds them: a 4-byte length, then the hybrid. */
void pqw_levels_v1(pqw_buf *out, const uint16_t *lv, size_t n, int max_level);
/* Levels as a v2 page holds them (no length). */
void pqw_levels_v2(pqw_buf *out, const uint16_t *lv, size_t n, int max_level);

/* DELTA_BINARY_PACKED of n values, with deltas computed modulo 2^bits
 * (bits 32 or 64), block_size a multiple of 128 and block_size /
 * mini_count a multiple of 32. */
void pqw_delta(pqw_buf *out, const int64_t *v, size_t n, int block_size, int mini_count, int bits);

/* Compresses n bytes with codec (UNCOMPRESSED, SNAPPY, GZIP, ZSTD,
 * LZ4_RAW); aborts for others. */
void pqw_compress(int codec, const uint8_t *in, size_t n, pqw_buf *out);
uint32_t pqw_crc32(const uint8_t *p, size_t n);

/* ------------------------------------------------------------------------ */
/* Column chunks                                                             */

typedef struct pqw_chunk {
  pqw_buf bytes; /* the pages, headers included */
  int physical;
  int codec;
  int64_t num_values;        /* level entries (ColumnMetaData.num_values) */
  int64_t uncompressed_size; /* headers plus uncompressed bodies */
  uint32_t encodings;        /* bit (1 << encoding) for each one used */
  size_t dict_len;           /* bytes of a leading dictionary page, or 0 */
  int num_pages;
  /* Where each page starts (up to 64 are recorded), for tests that patch. */
  size_t page_off[64];
} pqw_chunk;

void pqw_chunk_init(pqw_chunk *c, int physical, int codec);
void pqw_chunk_free(pqw_chunk *c);
/* Appends a page: the header per h, then body_len bytes of body, which
 * stand for raw_len bytes before compression. */
void pqw_chunk_page(pqw_chunk *c, const pqw_page *h, const void *body, size_t body_len,
                    size_t raw_len);
/* Appends a page from its uncompressed body: compresses with the chunk's
 * codec (for v2 pages, all but the first levels_len bytes, unless
 * h->is_compressed is 0). */
void pqw_chunk_page_raw(pqw_chunk *c, const pqw_page *h, const void *raw, size_t raw_len,
                        size_t levels_len);

/* Dense non-null values of one leaf column. */
typedef struct pqw_values {
  int physical;
  int32_t type_length; /* FIXED_LEN_BYTE_ARRAY */
  int64_t count;
  const void *fixed;        /* fixed width: count values back to back
                               (BOOLEAN: one byte each, INT96: 12 bytes) */
  const char *const *bytes; /* BYTE_ARRAY values */
  const int32_t *lens;      /* their lengths; NULL: strlen */
} pqw_values;

/* Levels; def (rep) may be NULL when max_def (max_rep) is 0. */
typedef struct pqw_levels {
  int64_t n;
  const uint16_t *def, *rep;
  int max_def, max_rep;
} pqw_levels;

typedef struct pqw_chunk_opts {
  int codec;
  int v2;
  /* Level entries per page; 0: one page.  v1 pages are cut there even
   * inside a record; v2 pages at the next record boundary. */
  int64_t page_entries;
  /* PQ_ENC_PLAIN (default 0), PQ_ENC_RLE_DICTIONARY, PQ_ENC_PLAIN_DICTIONARY
   * (legacy: the dictionary page says PLAIN_DICTIONARY too),
   * PQ_ENC_DELTA_BINARY_PACKED, PQ_ENC_DELTA_LENGTH_BYTE_ARRAY,
   * PQ_ENC_DELTA_BYTE_ARRAY, PQ_ENC_BYTE_STREAM_SPLIT, PQ_ENC_RLE
   * (booleans). */
  int encoding;
  int crc;                     /* store page CRCs */
  int delta_block, delta_mini; /* 0: 128 and 4 */
} pqw_chunk_opts;

/* Builds a well-formed chunk from values and levels (no levels: a required
 * flat column of v->count values). */
void pqw_chunk_build(pqw_chunk *c, const pqw_values *v, const pqw_levels *lv,
                     const pqw_chunk_opts *o);

/* ------------------------------------------------------------------------ */
/* Files                                                                     */

/* One SchemaElement.  Use the constructors, then adjust fields. */
typedef struct pqw_schema {
  const char *name;         /* NULL: no name field */
  int type;                 /* physical type, or -1: none (a group) */
  int repetition;           /* -1: none (other values are written as given) */
  int num_children;         /* -1: none */
  int converted;            /* -1: none */
  int32_t type_length;      /* 0: none */
  int32_t scale, precision; /* written when precision > 0 */
  int field_id;             /* -1: none */
  int logical;              /* LogicalType member (PQ_LT_*), 0: none */
  int lt_unit;              /* TIME / TIMESTAMP: 1 MILLIS, 2 MICROS, 3 NANOS */
  int lt_utc;
  int lt_bits, lt_signed;         /* INTEGER */
  int32_t lt_scale, lt_precision; /* DECIMAL */
} pqw_schema;

pqw_schema pqw_root(int num_children);
pqw_schema pqw_group(const char *name, int repetition, int num_children);
pqw_schema pqw_leaf(const char *name, int physical, int repetition);

/* A ColumnChunk as the footer describes it; every field may be edited. */
typedef struct pqw_colmeta {
  int type;
  uint32_t encodings;
  char path[256]; /* dotted path_in_schema */
  int codec;
  int64_t num_values, total_uncompressed_size, total_compressed_size;
  int64_t data_page_offset;
  int64_t dictionary_page_offset; /* -1: none */
  int64_t file_offset;
  int omit_meta; /* no meta_data struct */
  /* Statistics (ColumnMetaData field 12), written when stat_fields is set:
   * PQW_STAT_VALUES writes min_value/max_value, PQW_STAT_LEGACY the
   * deprecated min/max, each value only when its pointer is set; null_count
   * always.  The pointers are the test's, read by pqw_file_finish. */
  int stat_fields;
  const void *stat_min, *stat_max;
  size_t stat_min_len, stat_max_len;
  int64_t stat_null_count;
} pqw_colmeta;

enum { PQW_STAT_VALUES = 1, PQW_STAT_LEGACY = 2 };

typedef struct pqw_rowgroup {
  int64_t num_rows, total_byte_size;
  int omit_num_rows;
  int num_columns;
  pqw_colmeta *cols;
} pqw_rowgroup;

typedef struct pqw_file {
  pqw_buf out;
  int num_schema;
  pqw_schema *schema;
  int num_rg;
  pqw_rowgroup *rg;
  int64_t num_rows; /* -1: the sum of the row groups' */
  int32_t version;
  const char *created_by;
  int num_kv;
  const char *kv[8][2];
  /* Leaves of the schema, in order (derived by pqw_file_init). */
  int num_leaves;
  int leaf_type[256];
  char leaf_path[256][128];
} pqw_file;

/* Copies the schema and writes "PAR1". */
void pqw_file_init(pqw_file *f, const pqw_schema *schema, int n);
/* Appends the chunks (one per leaf, in order) as a row group and records
 * their metadata.  Returns the row group's index. */
int pqw_file_add_row_group(pqw_file *f, int64_t num_rows, pqw_chunk *chunks, int n);
/* Writes the FileMetaData of f (Thrift) into out. */
void pqw_file_meta(pqw_buf *out, const pqw_file *f);
/* Writes the footer and tail, returns the file (the caller frees it) and
 * releases f. */
uint8_t *pqw_file_finish(pqw_file *f, size_t *len);
void pqw_file_free(pqw_file *f);
/* Appends a tail to `file` for a FileMetaData that starts at meta_start:
 * its length and "PAR1". */
void pqw_tail(pqw_buf *file, size_t meta_start);

#endif /* LARDER_TESTS_PQWRITE_H */
