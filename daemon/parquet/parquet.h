/*
 * parquet.h: larder's Parquet reader (module prefix pq_).
 *
 * Conventions
 * -----------
 * - Scope: the footer (Thrift compact FileMetaData), the schema tree with its
 *   logical and converted types, data pages v1 and v2 with every standard
 *   encoding and codec, and Dremel assembly of nested columns into the
 *   Arrow-like serving layout described in client/larder.h.
 * - No event loop and no global state.  A pq_file and a pq_projection are
 *   immutable once made and may be shared by any number of threads.  A
 *   pq_reader and a pq_batch belong to one thread at a time.
 * - Bytes arrive through a pq_source, so local files, memory and ranges that
 *   the remote fetcher brought in all go through the same decoder.
 * - Errors: functions return 0 (or a count) on success and a negative
 *   larder_errno_t on failure.  They then fill the caller's pq_error with a
 *   message that names the file, the column and the row group where they
 *   apply, and what was wrong.  No function aborts on bad input.
 * - Memory: every allocation driven by the file is bounded, either by the
 *   file's real size or by pq_options.max_chunk_decoded_bytes, the ceiling on
 *   decoded bytes per column chunk that turns a decompression bomb into
 *   LARDER_ELIMIT instead of an out-of-memory kill.
 * - Ownership: pq_file_close, pq_projection_free, pq_reader_close and
 *   pq_batch_free release what the matching constructor made.  Pointers into
 *   a pq_file (schema, metadata) live as long as the pq_file; a pq_batch's
 *   arrays point at the pq_field nodes of the projection they were read with.
 *
 * Output layout
 * -------------
 * pq_reader_next fills a pq_batch: one pq_array per projected top-level
 * field, each the root of a tree that mirrors the field's pq_field tree.  An
 * array of `length` slots has up to three buffers, exactly as in Arrow:
 *   validity  bitmap, LSB first, bit set = present; empty when null_count 0
 *   offsets   int32 (or int64 for LARGE_* types), length + 1 entries, for
 *             BINARY/STRING and LIST/MAP
 *   values    fixed-width elements (BOOL as a bitmap), or the bytes of
 *             BINARY/STRING values
 * STRUCT arrays have one child per field; LIST one child (the elements); MAP
 * one STRUCT child with "key" and "value".  Dictionaries are expanded, INT96
 * becomes TIMESTAMP(ns), DECIMAL becomes DECIMAL128 (precision <= 38) or
 * DECIMAL256, narrow integers are narrowed, and FLOAT16 keeps its two bytes.
 * A null slot of a fixed-width array holds zero bytes; a null slot of a
 * variable-width array is empty.  Every buffer has 64 bytes of slack after
 * its capacity, so word-at-a-time loops may overrun safely.
 */
#ifndef LARDER_PARQUET_H
#define LARDER_PARQUET_H

#include <stddef.h>
#include <stdint.h>

#include "larder.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */

typedef struct pq_error {
  int code;      /* a negative larder_errno_t, or 0 */
  char msg[512]; /* "<file>: column '<path>', row group <n>: <what>" */
  /* With LARDER_ELIMIT: one page alone needs more decoded bytes than
   * max_chunk_decoded_bytes (its header claims that many values), so
   * reading fewer rows at once would not help. */
  int whole_page;
} pq_error;

/* Formats msg into err (when err is not NULL), clears whole_page and
 * returns code.  Any thread. */
int pq_error_set(pq_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ------------------------------------------------------------------------ */
/* Byte sources                                                              */

typedef struct pq_source {
  /*
   * Reads exactly len bytes at offset off into buf.  Returns 0, or a negative
   * larder_errno_t (LARDER_EIO, LARDER_ECORRUPT for a short read).  Called
   * only from the thread that uses the reader.
   */
  int (*read)(const struct pq_source *src, uint64_t off, size_t len, void *buf);
  /*
   * Optional.  When the source already holds [off, off + len) in memory it
   * may return a pointer to it (valid until the source is closed) and spare
   * the decoder a copy; otherwise NULL.
   */
  const uint8_t *(*map)(const struct pq_source *src, uint64_t off, size_t len);
  /*
   * Optional.  Says that [off, off + len) will be read soon: a mapped file
   * fills its page tables for the range in one call, instead of taking a
   * page fault for every 4 KiB the decoder touches.
   */
  void (*will_read)(const struct pq_source *src, uint64_t off, uint64_t len);
  void *ctx;   /* the callbacks' own state */
  intptr_t fd; /* file sources: the descriptor */
  /* Set when map() returns memory that can fault (a mapped file that may be
   * truncated under us): readers then catch SIGBUS and fail with LARDER_EIO
   * instead of taking the process down. */
  int may_fault;
  uint64_t size;  /* total size of the object in bytes */
  char name[256]; /* path or URL, for error messages only */
} pq_source;

/* Opens path read-only and maps it, so that pages decode straight from the
 * page cache.  Returns 0 or a negative code (ENOENT, EIO).  The caller closes
 * it with pq_source_close_file.  A file truncated while it is read makes the
 * reader fail with LARDER_EIO (SIGBUS is caught; see pq_util.c). */
int pq_source_open_file(pq_source *src, const char *path, pq_error *err);
/* The same over a descriptor the caller already holds (and keeps: the
 * source works on a duplicate of it, closed by pq_source_close_file), for
 * a file that must not be opened by its path again.  name is for
 * messages.  Returns 0, LARDER_EIO (not a regular file) or LARDER_ELIMIT
 * (out of descriptors).  Any thread. */
int pq_source_open_fd(pq_source *src, int fd, const char *name, pq_error *err);
void pq_source_close_file(pq_source *src);

/* A source over len bytes at data, which the caller keeps alive. */
void pq_source_init_memory(pq_source *src, const void *data, size_t len, const char *name);

/* ------------------------------------------------------------------------ */
/* Options                                                                   */

typedef struct pq_options {
  /* Ceiling on decoded bytes (decompressed pages plus output buffers) per
   * column chunk.  Default 2 GiB. */
  uint64_t max_chunk_decoded_bytes;
  /* Ceiling on the serialized footer.  Default 64 MiB. */
  uint32_t max_footer_bytes;
  /* Verify page CRCs when the writer stored them.  Default on. */
  int verify_crc;
} pq_options;

void pq_options_init(pq_options *opts);

/* ------------------------------------------------------------------------ */
/* Metadata                                                                  */

typedef enum pq_physical {
  PQ_BOOLEAN = 0,
  PQ_INT32 = 1,
  PQ_INT64 = 2,
  PQ_INT96 = 3,
  PQ_FLOAT = 4,
  PQ_DOUBLE = 5,
  PQ_BYTE_ARRAY = 6,
  PQ_FIXED_LEN_BYTE_ARRAY = 7,
  PQ_PHYSICAL_NONE = -1 /* a group */
} pq_physical_t;

typedef enum pq_repetition { PQ_REQUIRED = 0, PQ_OPTIONAL = 1, PQ_REPEATED = 2 } pq_repetition_t;

/* Codec numbers as in parquet.thrift's CompressionCodec. */
typedef enum pq_codec {
  PQ_UNCOMPRESSED = 0,
  PQ_SNAPPY = 1,
  PQ_GZIP = 2,
  PQ_LZO = 3,
  PQ_BROTLI = 4,
  PQ_LZ4 = 5,
  PQ_ZSTD = 6,
  PQ_LZ4_RAW = 7
} pq_codec_t;

/* Encoding numbers as in parquet.thrift's Encoding. */
typedef enum pq_encoding {
  PQ_ENC_PLAIN = 0,
  PQ_ENC_PLAIN_DICTIONARY = 2,
  PQ_ENC_RLE = 3,
  PQ_ENC_BIT_PACKED = 4,
  PQ_ENC_DELTA_BINARY_PACKED = 5,
  PQ_ENC_DELTA_LENGTH_BYTE_ARRAY = 6,
  PQ_ENC_DELTA_BYTE_ARRAY = 7,
  PQ_ENC_RLE_DICTIONARY = 8,
  PQ_ENC_BYTE_STREAM_SPLIT = 9
} pq_encoding_t;

/*
 * Logical types, numbered as the fields of parquet.thrift's LogicalType
 * union.  Legacy ConvertedType annotations are mapped onto these, so a file
 * that has only converted types reads the same as one with both.
 */
typedef enum pq_logical_kind {
  PQ_LT_NONE = 0,
  PQ_LT_STRING = 1,
  PQ_LT_MAP = 2,
  PQ_LT_LIST = 3,
  PQ_LT_ENUM = 4,
  PQ_LT_DECIMAL = 5,
  PQ_LT_DATE = 6,
  PQ_LT_TIME = 7,
  PQ_LT_TIMESTAMP = 8,
  PQ_LT_INTEGER = 10,
  PQ_LT_UNKNOWN = 11, /* "NullType": always null */
  PQ_LT_JSON = 12,
  PQ_LT_BSON = 13,
  PQ_LT_UUID = 14,
  PQ_LT_FLOAT16 = 15,
  PQ_LT_INTERVAL = 100,     /* legacy ConvertedType INTERVAL only */
  PQ_LT_MAP_KEY_VALUE = 101 /* legacy ConvertedType MAP_KEY_VALUE only */
} pq_logical_kind_t;

typedef struct pq_logical {
  pq_logical_kind_t kind;
  int32_t precision, scale; /* DECIMAL */
  larder_time_unit_t unit;  /* TIME, TIMESTAMP */
  int utc;                  /* TIME, TIMESTAMP: isAdjustedToUTC */
  int bit_width, is_signed; /* INTEGER */
} pq_logical_t;

/* One node of the Parquet schema tree (a SchemaElement). */
typedef struct pq_schema_node {
  char *name;
  pq_physical_t physical; /* PQ_PHYSICAL_NONE for groups */
  int32_t type_length;    /* FIXED_LEN_BYTE_ARRAY */
  pq_repetition_t repetition;
  int converted; /* ConvertedType number, -1 when absent */
  pq_logical_t logical;
  int32_t field_id; /* -1 when absent */
  int num_children;
  struct pq_schema_node *children;
  struct pq_schema_node *parent;
  int16_t def_level, rep_level; /* counting this node */
  int leaf_index;               /* index among leaves, -1 for groups */
  char *path;                   /* dotted path from the root's children */
} pq_schema_node_t;

/* The serving schema: Arrow-like fields derived from the Parquet tree. */
typedef struct pq_field {
  char *name;
  larder_type_t type;
  int nullable;
  int32_t byte_width;       /* FIXED_BINARY; 16/32 for DECIMAL128/256 */
  int32_t precision, scale; /* DECIMAL* */
  larder_time_unit_t unit;  /* TIME32/TIME64/TIMESTAMP */
  int utc;                  /* TIMESTAMP: adjusted to UTC */
  int num_children;
  struct pq_field *children;
  /* Where the field came from, for display and for the decoder. */
  const pq_schema_node_t *node; /* the Parquet node carrying the value */
  int from_int96;               /* TIMESTAMP decoded from legacy INT96 */
  /* Dremel parameters (see pq_assemble.c). */
  int16_t def_level;          /* present (non-null) when def >= this */
  int16_t slot_def, slot_rep; /* a slot exists when def >= slot_def and
                                 rep <= slot_rep */
  int16_t elem_def, elem_rep; /* LIST/MAP: an element exists when
                                 def >= elem_def and rep <= elem_rep */
  int first_leaf;             /* index of the first leaf below (or self) */
  int num_leaves;             /* leaves below (1 for a leaf) */
} pq_field_t;

typedef struct pq_kv {
  char *key;
  char *value; /* NULL when absent */
} pq_kv_t;

typedef struct pq_column_chunk {
  pq_codec_t codec;
  uint32_t encodings; /* bit (1 << pq_encoding_t) */
  int64_t num_values;
  int64_t total_compressed_size;
  int64_t total_uncompressed_size;
  int64_t data_page_offset;
  int64_t dictionary_page_offset; /* -1 when absent */
  /* The byte range that holds the chunk's pages, checked against the file. */
  uint64_t range_offset, range_length;
  /* Statistics (ColumnMetaData.statistics), as the writer recorded them and
   * unchecked: at most the first PQ_STAT_BYTES bytes of the minimum and the
   * maximum (stat_min/stat_max NULL when absent), and the null count (-1
   * when absent).  stat_legacy: they came from the deprecated min/max
   * fields, which writers ordered as signed bytes whatever the type.  A cut
   * maximum is below the true one, so only the minimum stays a bound. */
  const uint8_t *stat_min, *stat_max;
  uint16_t stat_min_len, stat_max_len;
  uint8_t has_stats, stat_legacy, stat_max_cut;
  int64_t stat_null_count;
} pq_column_chunk_t;

/* Bytes of a minimum or maximum kept from the statistics. */
#define PQ_STAT_BYTES 32

typedef struct pq_row_group {
  int64_t num_rows;
  int64_t total_byte_size;       /* uncompressed, as the writer reported */
  int64_t total_compressed_size; /* sum of the chunks' ranges */
  int64_t first_row;             /* rows in earlier row groups */
  pq_column_chunk_t *columns;    /* one per leaf */
} pq_row_group_t;

typedef struct pq_file_meta {
  int32_t version;
  int64_t num_rows;
  char *created_by; /* NULL when absent */
  int num_kv;
  pq_kv_t *kv;
  pq_schema_node_t *root; /* the message node */
  int num_leaves;
  pq_schema_node_t **leaves; /* in column order */
  int num_row_groups;
  pq_row_group_t *row_groups;
  pq_field_t *schema; /* serving schema: a STRUCT root */
  uint64_t file_size;
  uint32_t footer_length; /* serialized FileMetaData bytes */
} pq_file_meta_t;

/* ------------------------------------------------------------------------ */
/* Opening files                                                             */

typedef struct pq_file pq_file;

/* Bytes at the end of every Parquet file: footer length and "PAR1". */
#define PQ_TAIL_SIZE 8

/*
 * Parses the last PQ_TAIL_SIZE bytes of an object of file_size bytes and
 * returns, in *footer_length, how many bytes before the tail hold the
 * FileMetaData.  Remote readers use it to plan their footer request.
 * Returns 0, LARDER_ECORRUPT (no magic, length out of range) or
 * LARDER_EUNSUPPORTED (encrypted footer).  Any thread.
 */
int pq_footer_length(const uint8_t tail[PQ_TAIL_SIZE], uint64_t file_size, const pq_options *opts,
                     uint32_t *footer_length, const char *name, pq_error *err);

/*
 * Parses a FileMetaData of len bytes (the footer without its tail) of an
 * object of file_size bytes, and builds the schema.  On success *out is a new
 * pq_file the caller closes.  Any thread.
 */
int pq_file_parse(const uint8_t *footer, size_t len, uint64_t file_size, const pq_options *opts,
                  const char *name, pq_file **out, pq_error *err);

/* Reads the tail and footer through src, then does what pq_file_parse does. */
int pq_file_open(const pq_source *src, const pq_options *opts, pq_file **out, pq_error *err);

void pq_file_close(pq_file *file);

const pq_file_meta_t *pq_file_meta(const pq_file *file);
const char *pq_file_name(const pq_file *file);
/* The bytes the parsed footer takes in memory (its structs and strings,
 * and the blocks they were taken from).  Any thread. */
uint64_t pq_file_memory(const pq_file *file);

/* Static display names: "INT64", "SNAPPY", "RLE_DICTIONARY", "REQUIRED". */
const char *pq_physical_name(int physical);
const char *pq_codec_name(int codec);
const char *pq_encoding_name(int encoding);
const char *pq_repetition_name(int repetition);
/* Writes a logical type such as "TIMESTAMP(MICROS,true)" or "" into buf. */
void pq_logical_format(const pq_logical_t *lt, char *buf, size_t size);

/* ------------------------------------------------------------------------ */
/* Projection                                                                */

typedef struct pq_projection pq_projection;

/*
 * Selects columns by dotted path ("a", "b.c"); n == 0 selects every column.
 * A path naming a group selects everything below it; a path into a struct
 * keeps the struct with only the named children.  Returns 0, or
 * LARDER_ENOENT naming the path that matches nothing.  Any thread.
 */
int pq_projection_create(const pq_file *file, const char *const *columns, size_t n,
                         pq_projection **out, pq_error *err);
void pq_projection_free(pq_projection *proj);

/* The projected serving schema: a STRUCT whose children are the columns. */
const pq_field_t *pq_projection_schema(const pq_projection *proj);

/* Bytes per value of f's served array when its values are fixed-width: 1,
 * 2, 4 or 8 for the numbers, dates and times, 16 or 32 for a decimal, the
 * byte width of a FIXED_BINARY.  0 for the others: BOOL (its values are
 * bits), the types with offsets, structs and NULL.  The decoder, the
 * serving layout and the cache all size values by it.  Any thread. */
size_t pq_field_value_width(const pq_field_t *f);

/* Number of Parquet leaf columns the projection reads, and whether a leaf
 * (by its index in pq_file_meta_t.leaves) is among them. */
int pq_projection_num_leaves(const pq_projection *proj);
int pq_projection_has_leaf(const pq_projection *proj, int leaf_index);

typedef struct pq_range {
  uint64_t offset, length;
} pq_range_t;

/*
 * Fills *ranges (allocated; the caller frees it) with the byte ranges the
 * projection reads in row group rg, or in every row group when rg < 0,
 * sorted by offset: one per column chunk, with overlapping ranges merged
 * (touching ones are not, so that a caller can share chunks between
 * projections).  These are exactly the bytes pq_reader_next will ask its
 * source for, and no read crosses from one range into another.  Returns the
 * number of ranges or a negative code.  Any thread.
 */
int pq_projection_ranges(const pq_file *file, const pq_projection *proj, int rg,
                         pq_range_t **ranges, pq_error *err);

/* ------------------------------------------------------------------------ */
/* Reading                                                                   */

typedef struct pq_buf {
  uint8_t *data;
  size_t len, cap;
} pq_buf_t;

typedef struct pq_array {
  const pq_field_t *field;
  int64_t length;
  int64_t null_count;
  pq_buf_t validity, offsets, values;
  int num_children;
  struct pq_array *children;
} pq_array_t;

typedef struct pq_batch {
  const pq_field_t *schema; /* the projection's STRUCT root */
  int64_t num_rows;
  int num_columns;
  pq_array_t *columns;
} pq_batch_t;

/* A batch with no buffers.  Reuse it across pq_reader_next calls to keep the
 * buffers' capacity; free it with pq_batch_free. */
void pq_batch_init(pq_batch_t *batch);
void pq_batch_free(pq_batch_t *batch);

/* Total bytes in a batch's buffers (lengths, not capacities). */
uint64_t pq_batch_bytes(const pq_batch_t *batch);

typedef struct pq_reader pq_reader;

/*
 * Opens a reader over row group rg of file for the projected columns.  src
 * must be the source the file was opened from (or one with the same bytes)
 * and outlive the reader.  Returns 0 or a negative code.  Any thread; the
 * reader then belongs to that thread.
 */
int pq_reader_open(const pq_file *file, const pq_source *src, const pq_projection *proj, int rg,
                   const pq_options *opts, pq_reader **out, pq_error *err);

/*
 * Decodes the next min(max_rows, rows left) rows of the row group into out,
 * replacing what it held.  Returns the number of rows decoded (0 at the end
 * of the row group) or a negative code, after which the reader can only be
 * closed.  Memory in use is bounded by the pages of the current position and
 * the decoded rows, not by the row group.
 */
int64_t pq_reader_next(pq_reader *reader, int64_t max_rows, pq_batch_t *out, pq_error *err);

/*
 * Moves the reader to the start of row group rg of the same file, keeping
 * its buffers, so that a thread walking a file's row groups allocates once.
 * Returns 0 or a negative code.  Also clears a reader's failed state.
 */
int pq_reader_set_row_group(pq_reader *reader, int rg, pq_error *err);

/* Skips rows without building arrays (pages are still decoded). */
int64_t pq_reader_skip(pq_reader *reader, int64_t rows, pq_error *err);

void pq_reader_close(pq_reader *reader);

/* ------------------------------------------------------------------------ */
/* JSON Lines rendering, for larderctl cat                                   */

typedef struct pq_strbuf {
  char *data;
  size_t len, cap;
} pq_strbuf_t;

void pq_strbuf_free(pq_strbuf_t *sb);

/* Appending to a string buffer, which stays NUL-terminated: n bytes of s, a
 * C string, or printf-style text.  Each returns 0, LARDER_ENOMEM (the buffer
 * is unchanged), or LARDER_EINVAL for a format vsnprintf rejects.  Shared
 * by the CLI, the inspector and the daemon's admin replies. */
int pq_strbuf_append(pq_strbuf_t *sb, const char *s, size_t n);
int pq_strbuf_puts(pq_strbuf_t *sb, const char *s);
int pq_strbuf_printf(pq_strbuf_t *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/*
 * Appends row `row` of batch as one JSON object (no newline), keys in schema
 * order, in larderctl cat's format (see daemon/parquet/README.md).  Returns 0 or LARDER_ENOMEM.
 */
int pq_json_append_row(pq_strbuf_t *sb, const pq_batch_t *batch, int64_t row);

/* Appends s (n bytes) as a JSON string literal; invalid UTF-8 becomes
 * U+FFFD.  Returns 0 or LARDER_ENOMEM. */
int pq_json_append_string(pq_strbuf_t *sb, const uint8_t *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* LARDER_PARQUET_H */
