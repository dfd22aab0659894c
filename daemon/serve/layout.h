/*
 * layout.h: the serving layout on disk and in shared memory (prefix
 * layout_).
 *
 * Conventions
 * -----------
 * - A "column blob" holds one column of one unit: the pq_array_t tree the
 *   decoder produced, flattened into one allocation so that it can be cached
 *   as a single RocksDB value and read back without parsing:
 *
 *     layout_blob_header_t                      (64 bytes)
 *     layout_node_t[num_nodes]                  (64 bytes each, pre-order)
 *     buffers, each starting on a 64-byte boundary
 *
 *   Node offsets are relative to the start of the blob.  The blob carries no
 *   types: the field tree it was made from travels separately (the cache key
 *   includes a hash of it), so one blob format serves every type.
 * - A batch in a stream's arena uses the same node record for each array,
 *   with offsets relative to the arena; the Batch message carries them.
 * - layout_view validates a blob against its field tree before anything
 *   reads it (bounds, lengths, offsets monotonic and within their values),
 *   so gathering from a view never reads outside the blob.
 * - Threading: pure functions over caller-owned memory; any thread.
 * - Errors: negative larder_errno_t (LARDER_ECORRUPT for a blob that does
 *   not match its fields, LARDER_ENOMEM, LARDER_ELIMIT).
 */
#ifndef LARDER_LAYOUT_H
#define LARDER_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "parquet/parquet.h"

#define LAYOUT_ALIGN 64
#define LAYOUT_MAGIC 0x43445241u /* "ARDC" little-endian */
#define LAYOUT_VERSION 1

typedef struct layout_blob_header {
  uint32_t magic;
  uint16_t version;
  uint16_t num_nodes;
  uint64_t num_rows;   /* length of the root array */
  uint64_t field_hash; /* layout_field_hash of the field tree */
  uint64_t total_size; /* the whole blob, header included */
  uint8_t reserved[32];
} layout_blob_header_t;

typedef struct layout_node {
  int64_t length;
  int64_t null_count;
  uint64_t validity_offset, validity_length;
  uint64_t offsets_offset, offsets_length;
  uint64_t values_offset, values_length;
} layout_node_t;

/* Number of array nodes in the field's tree (pre-order). */
int layout_num_nodes(const pq_field_t *field);

/* A 64-bit hash of the field tree: names, types and type parameters.  Two
 * projections of the same column that keep the same children hash alike. */
uint64_t layout_field_hash(const pq_field_t *field);

/*
 * Serializes array (which was decoded for field) into a new blob of *size
 * bytes, allocated with malloc; the caller frees it.  Returns 0 or
 * LARDER_ENOMEM.
 */
int layout_serialize(const pq_array_t *array, uint8_t **blob, size_t *size);

/* A validated, read-only view of a blob. */
typedef struct layout_view {
  const uint8_t *base;
  size_t size;
  const pq_field_t *field;
  int num_nodes;
  const layout_node_t *nodes; /* pre-order, node 0 = the column */
  int64_t num_rows;
} layout_view_t;

/* Checks blob (size bytes) against field and fills view.  Returns 0 or
 * LARDER_ECORRUPT with a reason in why. */
int layout_view(const uint8_t *blob, size_t size, const pq_field_t *field, layout_view_t *view,
                char *why, size_t why_len);

/* ------------------------------------------------------------------------ */
/* Gathering rows into a batch                                               */

/* One sample: a row of a unit's column. */
typedef struct layout_pick {
  const layout_view_t *view;
  int64_t row;
} layout_pick_t;

/*
 * The exact bytes a batch of n picks needs for one column, with each buffer
 * aligned to LAYOUT_ALIGN.  Returns the size or a negative code.  scratch is
 * reusable memory the caller keeps between calls (free with
 * layout_scratch_free).
 */
typedef struct layout_scratch layout_scratch_t;
void layout_scratch_free(layout_scratch_t *s);

int64_t layout_gather_size(const pq_field_t *field, const layout_pick_t *picks, int64_t n,
                           layout_scratch_t **scratch);

/*
 * Writes the column's arrays for the picks into dst (which has room for the
 * size layout_gather_size returned; the same scratch must be passed, with no
 * call in between), and fills nodes[0 .. layout_num_nodes(field)) with
 * their records, offsets relative to base (dst's position in its arena is
 * dst - base).  Returns 0 or a negative code.
 */
int layout_gather(const pq_field_t *field, const layout_pick_t *picks, int64_t n,
                  layout_scratch_t **scratch, uint8_t *base, uint8_t *dst, layout_node_t *nodes);

/* ------------------------------------------------------------------------ */
/* Row blocks: the small fixed-width columns of a unit, row by row           */

/*
 * Gathering a shuffled batch reads one row from each column of a random
 * unit: for a dozen columns that is a dozen or more cache misses per sample
 * (a variable-length value costs two: its offset, then its bytes), each to
 * fetch a few bytes.  A row block keeps a unit's rows one after another,
 * each in one piece:
 *
 *   fixed part (stride bytes): a bitmask of the nulls, then one slot per
 *     packed column: the value of a fixed-width column (up to 16 bytes, and
 *     BOOL as a byte), a pointer and a length for BINARY and STRING, and a
 *     pointer and an element count for a LIST of fixed-width values;
 *   inline part: the bytes of the row's variable-length values, each up to
 *     LAYOUT_INLINE_MAX bytes, which the pointers point at.
 *
 * So a sample costs one run of consecutive cache lines, which the hardware
 * and a prefetch a few rows ahead fetch together (a batch reads the fixed
 * parts first, then the inline parts: layout_rows_values).  A longer value stays
 * where it is in its column blob, and its slot points there: copying it is
 * streaming, and a second copy would only cost memory.  A LIST column whose
 * elements hold nulls or are long on average in a unit is not inlined in
 * that unit (its rows say so in inline_lists), and batches that draw from
 * it gather that column from its blob.  Row blocks are built once per unit
 * load, from the unit's column blobs (which stay: the cache and the gather
 * of other columns read them), count towards the unit's memory, and live
 * only in memory (they hold pointers).
 */
#define LAYOUT_INLINE_MAX 1024

enum { LAYOUT_SLOT_FIXED, LAYOUT_SLOT_BOOL, LAYOUT_SLOT_VAR, LAYOUT_SLOT_LIST };

typedef struct layout_rowplan {
  int num_packed;
  uint32_t stride;     /* bytes of each row's fixed part */
  uint32_t null_bytes; /* bytes of null bitmask at the start of each row */
  int has_inline;      /* some slot is VAR or LIST: rows vary in size */
  struct {
    int column;          /* index among the schema's top-level columns */
    int kind;            /* LAYOUT_SLOT_* */
    uint32_t offset;     /* of the slot in the row */
    uint32_t width;      /* of the slot: the value's bytes (FIXED), 1 (BOOL),
                          12 (VAR: pointer, length; LIST: pointer,
                          element count) */
    uint32_t elem_width; /* LIST: bytes per element */
    int nullbit;         /* bit in the mask, -1 when not nullable */
  } * packed;
  int *slot_of; /* per top-level column: its index in packed, or -1 */
} layout_rowplan_t;

/* Plans the row block for a schema (a STRUCT of columns).  Returns 0 or
 * LARDER_ENOMEM; *out is NULL when no column qualifies. */
int layout_rowplan_make(const pq_field_t *schema, layout_rowplan_t **out);
void layout_rowplan_free(layout_rowplan_t *plan);

/* A unit's row block. */
typedef struct layout_rows {
  uint8_t *data;         /* the rows, one after another */
  uint64_t *start;       /* rows + 1 offsets of the rows in data, or NULL
                             when every row takes stride bytes */
  uint32_t stride;       /* bytes per row when start is NULL: the plan's
                             stride, or the longest row's size */
  uint64_t bytes;        /* memory held (data and start) */
  uint64_t mapped;       /* data's own mapping's length, or 0 (malloc) */
  uint64_t inline_lists; /* bit p: LIST slot p is inlined in every row */
} layout_rows_t;

/* Builds the row block of a unit of `rows` rows from its column views
 * (views[c] for every top-level column), which must outlive it.  Returns 0
 * or LARDER_ENOMEM; free with layout_rows_free. */
int layout_rows_build(const layout_rowplan_t *plan, const layout_view_t *views, int64_t rows,
                      layout_rows_t *out);
void layout_rows_free(layout_rows_t *r);

/* Row `row` of a row block: its first byte, and in *len its size. */
static inline const uint8_t *layout_rows_row(const layout_rows_t *r, int64_t row, size_t *len) {
  if (r->start == NULL) {
    *len = r->stride;
    return r->data + (size_t)row * r->stride;
  }
  *len = (size_t)(r->start[row + 1] - r->start[row]);
  return r->data + r->start[row];
}

/*
 * Counts the nulls of every nullable packed column of n samples in tmp in
 * one pass over the rows: nulls_by_bit[b] for null bit b (plan->null_bytes
 * * 8 entries, zeroed here).  A pass per column would read tmp once per
 * column, twice per batch.
 */
void layout_rows_count_nulls(const layout_rowplan_t *plan, const uint8_t *tmp, int64_t n,
                             int64_t *nulls_by_bit);

/* Arrays (nodes) that packed column plan->packed[p] makes in a batch. */
int layout_rows_num_nodes(const layout_rowplan_t *plan, int p);

/*
 * Writes the packed column plan->packed[p] of n samples, whose rows' fixed
 * parts were first copied one after another into tmp (n * stride bytes),
 * into the arena: validity (when any is null), offsets and values, with
 * node records as layout_gather does (layout_rows_num_nodes of them).
 * nulls_by_bit:
 * from layout_rows_count_nulls.  size_only: just return the bytes it needs.
 * Returns the size, or LARDER_ELIMIT past 2 GiB of values or elements.
 * A LIST slot requires every sample's unit to inline it (inline_lists).
 * A VAR or LIST slot's values are left to layout_rows_values: *values is
 * set to where they go (the other kinds ignore values; size_only too).
 */
int64_t layout_rows_column(const layout_rowplan_t *plan, int p, const uint8_t *tmp, int64_t n,
                           const int64_t *nulls_by_bit, int size_only, uint8_t *base, uint8_t *dst,
                           layout_node_t *node, uint8_t **values);

/*
 * Copies the values of the VAR and LIST slots slots[0 .. ns) of the n
 * samples in tmp, a sample at a time: cursor[j] starts where
 * layout_rows_column left slot j's values, and ends past them.  The slots'
 * pointers must still be valid (their units held).  Any thread.
 *
 * A sample's inline values lie together after its fixed part, so, taken a
 * sample at a time, each row's inline part is read once, in one run of
 * lines, a few samples behind its prefetch.  (The gather reads only the
 * fixed parts: fetched with them, the inline parts of a whole batch, MiBs,
 * had left the cache by the time a pass per column read them.)
 */
void layout_rows_values(const layout_rowplan_t *plan, const int *slots, uint8_t **cursor, int ns,
                        const uint8_t *tmp, int64_t n);

#endif /* LARDER_LAYOUT_H */
