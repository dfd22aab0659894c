/*
 * pq_internal.h: interfaces shared by the files of the Parquet module.
 *
 * Conventions
 * -----------
 * - Nothing here is for use outside daemon/pq_*.c and their unit tests.
 * - Low-level decoders report a failure as a negative larder_errno_t and a
 *   short reason in a caller-supplied buffer (`why`), without file or column
 *   names: the page decoder adds those once, at its boundary.
 * - Decoders never read past the end they are given and never write more
 *   than the output size they are given.
 */
#ifndef LARDER_PQ_INTERNAL_H
#define LARDER_PQ_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "parquet/parquet.h"

/* ------------------------------------------------------------------------ */
/* Decompression (pq_codec.c)                                                */

/* Reusable decompression state (zstd context, zlib stream, ...).  One per
 * thread; a pq_reader owns one. */
typedef struct pq_codec_ctx pq_codec_ctx;

/* Returns a new context, or NULL when out of memory.  Any thread. */
pq_codec_ctx *pq_codec_ctx_new(void);
void pq_codec_ctx_free(pq_codec_ctx *ctx);

/*
 * Decompresses src_len bytes of src, compressed with codec (a pq_codec_t),
 * into exactly dst_len bytes at dst: the page header's declared
 * uncompressed size, which the caller has already checked against its
 * ceiling.  Never writes past dst + dst_len, whatever the input claims.
 *
 * Returns 0; LARDER_ECORRUPT when the input is malformed or does not
 * decompress to exactly dst_len bytes; LARDER_EUNSUPPORTED for LZO or an
 * unknown codec; LARDER_ENOMEM.  On failure `why` (why_len bytes) holds a
 * short reason such as "snappy: output is 812 bytes, header says 1024".
 *
 * GZIP accepts concatenated members.  LZ4 accepts the Hadoop framing
 * (big-endian decompressed and compressed lengths before each block), the
 * LZ4 frame format, and a bare LZ4 block, tried in that order.  The thread
 * that owns ctx calls it.
 */
int pq_decompress(pq_codec_ctx *ctx, int codec, const uint8_t *src, size_t src_len, uint8_t *dst,
                  size_t dst_len, char *why, size_t why_len);

/*
 * Checks, before anything is allocated, that src_len compressed bytes can
 * plausibly hold dst_len bytes: the size the stream itself states (snappy,
 * zstd frames) or the codec's largest possible expansion (deflate 1032:1,
 * LZ4 255:1).  A page that lies about its size then costs nothing.  Brotli
 * and zstd without a stated size have no such bound; the chunk ceiling is
 * their limit.  Returns 0 or LARDER_ECORRUPT with a reason.  Any thread.
 */
int pq_decompress_check(int codec, const uint8_t *src, size_t src_len, size_t dst_len, char *why,
                        size_t why_len);

/* ------------------------------------------------------------------------ */
/* Buffers and arenas (pq_util.c)                                            */

/* Slack every pq_buf keeps after its capacity, so that word-at-a-time
 * decoders may write (never read uninitialised) a little past the end. */
#define PQ_BUF_SLACK 64

/* Makes room for at least cap bytes (plus slack), keeping the contents.
 * Returns 0 or LARDER_ENOMEM. */
int pq_buf_reserve(pq_buf_t *b, size_t cap);
void pq_buf_free(pq_buf_t *b);

/* A bump allocator for metadata that lives as long as its pq_file; `limit`
 * bounds what a hostile footer can make us allocate. */
typedef struct pq_arena {
  struct pq_arena_block *head;
  size_t used, limit;
  /* The size of a new block (0 = 64 KiB), unless one allocation needs more;
   * and the bytes of every block, headers included, taken so far. */
  size_t block_bytes, reserved;
} pq_arena_t;

/* Returns zeroed, 16-byte aligned memory, or NULL past the limit or when
 * out of memory. */
void *pq_arena_alloc(pq_arena_t *arena, size_t size);
/* Returns a NUL-terminated copy of len bytes of s, or NULL. */
char *pq_arena_strndup(pq_arena_t *arena, const char *s, size_t len);
void pq_arena_free(pq_arena_t *arena);

/* Checked size arithmetic: return false on overflow. */
static inline bool pq_mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_mul_overflow(a, b, out);
}
static inline bool pq_add_ok(uint64_t a, uint64_t b, uint64_t *out) {
  return !__builtin_add_overflow(a, b, out);
}

/* Catching SIGBUS from mapped sources.  PQ_GUARD_BEGIN runs the code after
 * it normally; if a guarded access faults, control comes back to it a second
 * time with the expression true, and the caller fails cleanly.  The handler
 * is process-wide and installed on first use; a SIGBUS outside a guard goes
 * to the previous handler or the default action. */
#include <setjmp.h>
typedef struct pq_guard {
  sigjmp_buf env;
  struct pq_guard *prev;
} pq_guard_t;
void pq_guard_push(pq_guard_t *g);
void pq_guard_pop(pq_guard_t *g);
#define PQ_GUARD_FAULTED(g) (pq_guard_push(g), sigsetjmp((g)->env, 1) != 0)

/* ------------------------------------------------------------------------ */
/* Thrift compact protocol (pq_thrift.c)                                     */

enum {
  PQ_TT_STOP = 0,
  PQ_TT_TRUE = 1,
  PQ_TT_FALSE = 2,
  PQ_TT_BYTE = 3,
  PQ_TT_I16 = 4,
  PQ_TT_I32 = 5,
  PQ_TT_I64 = 6,
  PQ_TT_DOUBLE = 7,
  PQ_TT_BINARY = 8,
  PQ_TT_LIST = 9,
  PQ_TT_SET = 10,
  PQ_TT_MAP = 11,
  PQ_TT_STRUCT = 12
};

/* A cursor over compact-protocol bytes.  The first error sticks: once
 * `failed` is set every read returns zero values, so parsers check once at
 * the end of a struct instead of after every field. */
typedef struct pq_thrift {
  const uint8_t *p, *end;
  int depth;
  int failed;
  int truncated; /* the failure was running out of input */
  char why[160];
} pq_thrift_t;

void pq_thrift_init(pq_thrift_t *t, const uint8_t *p, size_t len);
void pq_thrift_fail(pq_thrift_t *t, const char *why);
/* Struct traversal: call pq_thrift_struct_begin, then pq_thrift_field until
 * it returns 0 (STOP or failure), then pq_thrift_struct_end. */
void pq_thrift_struct_begin(pq_thrift_t *t, int16_t *last_id);
int pq_thrift_field(pq_thrift_t *t, int16_t *last_id, int16_t *id, int *type);
void pq_thrift_struct_end(pq_thrift_t *t);
int64_t pq_thrift_int(pq_thrift_t *t, int type); /* i8/i16/i32/i64 */
int pq_thrift_bool(int type);                    /* from a field type */
/* Returns a pointer into the input and its length. */
const uint8_t *pq_thrift_binary(pq_thrift_t *t, int type, size_t *len);
/* Reads a list header; returns the element count, bounded by the bytes
 * left (each element takes at least one byte). */
int64_t pq_thrift_list(pq_thrift_t *t, int type, int *elem_type);
int pq_thrift_list_bool(pq_thrift_t *t); /* one boolean list element */
void pq_thrift_skip(pq_thrift_t *t, int type);

/* ------------------------------------------------------------------------ */
/* Page headers (pq_meta.c)                                                  */

enum { PQ_PAGE_DATA = 0, PQ_PAGE_INDEX = 1, PQ_PAGE_DICTIONARY = 2, PQ_PAGE_DATA_V2 = 3 };

typedef struct pq_page_header {
  int type;
  int32_t uncompressed_size, compressed_size;
  int has_crc;
  uint32_t crc;
  int32_t num_values; /* data v1/v2 and dictionary pages */
  int32_t encoding;
  int32_t def_encoding, rep_encoding; /* v1 */
  int32_t num_nulls, num_rows;        /* v2 */
  int32_t def_length, rep_length;     /* v2 */
  int is_compressed;                  /* v2, default true */
  int has_v1, has_dict, has_v2;       /* which sub-headers were present */
} pq_page_header_t;

/* Parses a PageHeader from at most len bytes.  Returns the header's length
 * in bytes, 0 when len bytes do not hold the whole header (read more and
 * retry), or LARDER_ECORRUPT with a reason in why. */
int64_t pq_page_header_parse(const uint8_t *p, size_t len, pq_page_header_t *h, char *why,
                             size_t why_len);

/* ------------------------------------------------------------------------ */
/* Encodings (pq_encoding.c)                                                 */

/* Unpacks n values of bit_width bits (0..32), LSB first, starting at value
 * index `start` of the packed data at in, which holds in_len bytes.  Values
 * past the end of the input decode as zero; callers check lengths first. */
void pq_unpack32(const uint8_t *in, size_t in_len, int bit_width, uint64_t start, uint32_t *out,
                 size_t n);
/* The same for 0..64 bits into 64-bit values. */
void pq_unpack64(const uint8_t *in, size_t in_len, int bit_width, uint64_t start, uint64_t *out,
                 size_t n);

/* The RLE / bit-packing hybrid (levels, dictionary indices, booleans). */
typedef struct pq_rle {
  const uint8_t *p, *end;
  int bit_width;
  uint32_t rle_left; /* values left in the current RLE run */
  uint32_t rle_value;
  uint32_t bp_left;  /* values left in the current bit-packed run */
  const uint8_t *bp; /* the current bit-packed run's bytes */
  size_t bp_len;
  uint32_t bp_pos; /* values of the run already consumed */
  int failed;
  int over_width; /* failed because a run's value exceeded the width */
  uint32_t bad_value;
} pq_rle_t;

void pq_rle_init(pq_rle_t *r, const uint8_t *p, size_t len, int bit_width);
/* Decode up to n values.  Return how many were decoded (fewer than n only
 * when the data ends) or LARDER_ECORRUPT for a malformed run header. */
int64_t pq_rle_get32(pq_rle_t *r, uint32_t *out, int64_t n);
int64_t pq_rle_get16(pq_rle_t *r, uint16_t *out, int64_t n);
/* True when the first run of the data is an RLE run of at least n copies of
 * value: the whole of n levels is that value, without decoding them. */
bool pq_rle_starts_with_run(const uint8_t *p, size_t len, int bit_width, int64_t n, uint32_t value);

/* DELTA_BINARY_PACKED. */
#define PQ_DELTA_MAX_MINI 8192
typedef struct pq_delta {
  const uint8_t *p, *end;
  uint64_t block_size, mini_count, mini_size;
  uint64_t total;        /* values the header declares */
  uint64_t produced;     /* values handed out so far */
  uint64_t last;         /* the previous value, with wrap-around */
  const uint8_t *widths; /* bit widths of the current block's miniblocks */
  uint64_t min_delta;
  uint64_t mini_index; /* next miniblock of the current block */
  uint64_t buf_pos, buf_len;
  int in_block;
  int width_bits; /* 32 or 64: the physical type */
  uint64_t buf[PQ_DELTA_MAX_MINI];
} pq_delta_t;

/* Parses the header.  Returns 0 or LARDER_ECORRUPT with why filled. */
int pq_delta_init(pq_delta_t *d, const uint8_t *p, size_t len, int width_bits, char *why,
                  size_t why_len);
/* Decode up to n values into 32- or 64-bit outputs.  Return the count
 * (fewer only at the end of the declared values) or LARDER_ECORRUPT. */
int64_t pq_delta_get32(pq_delta_t *d, int32_t *out, int64_t n);
int64_t pq_delta_get64(pq_delta_t *d, int64_t *out, int64_t n);
/* After every declared value was decoded: the first byte past the
 * encoding, or NULL when the data is malformed. */
const uint8_t *pq_delta_end(pq_delta_t *d);

/* ------------------------------------------------------------------------ */
/* Column chunk reader (pq_column.c)                                         */

/* Reads one column chunk of one row group, page by page, handing out whole
 * records: their definition and repetition levels and their non-null values
 * in dense form, in the leaf's physical layout (BOOLEAN one byte per value,
 * INT96 twelve bytes, BYTE_ARRAY as int32 offsets plus bytes). */
typedef struct pq_leaf pq_leaf;

int pq_leaf_open(const struct pq_file *file, const pq_source *src, const pq_options *opts,
                 pq_codec_ctx *codec, int rg, int leaf_index, pq_leaf **out, pq_error *err);
void pq_leaf_close(pq_leaf *leaf);
/* Points the reader at the same column in row group rg, keeping buffers. */
int pq_leaf_reset(pq_leaf *leaf, int rg, pq_error *err);

/* Reads up to `rows` records.  Their levels replace the leaf's level
 * buffers (pq_leaf_levels) and their dense values are appended to
 * values/offsets, which the caller has emptied.  Returns the records read,
 * fewer than `rows` only at the end of the chunk, or a negative code. */
int64_t pq_leaf_read(pq_leaf *leaf, int64_t rows, pq_buf_t *values, pq_buf_t *offsets,
                     pq_error *err);

/* Steps over up to `rows` records without producing them, skipping whole
 * pages unread where their headers give their row counts.  Returns the
 * records skipped (fewer only at the end of the chunk) or a negative code. */
int64_t pq_leaf_skip(pq_leaf *leaf, int64_t rows, pq_error *err);

/* The levels of the last pq_leaf_read: *n entries; def is NULL when the
 * column has no definition levels or every entry's level is the maximum
 * (no nulls anywhere on its path), rep when it has no repetition levels.
 * *num_values is the count of dense values appended. */
void pq_leaf_levels(const pq_leaf *leaf, const uint16_t **def, const uint16_t **rep, int64_t *n,
                    int64_t *num_values);
const pq_schema_node_t *pq_leaf_node(const pq_leaf *leaf);
/* Formats "<file>: column '<path>', row group <n>" for error messages. */
void pq_leaf_where(const pq_leaf *leaf, char *buf, size_t size);

/* ------------------------------------------------------------------------ */
/* Files and schemas (pq_meta.c, pq_schema.c)                                */

struct pq_file {
  pq_file_meta_t meta;
  pq_arena_t arena; /* owns everything meta points at */
  pq_options opts;
  char name[256];
};

/* Derives the serving schema (meta.schema) from the Parquet tree.  Returns 0
 * or a negative code with err filled. */
int pq_schema_build(struct pq_file *f, pq_error *err);

#endif /* LARDER_PQ_INTERNAL_H */
