/*
 * batch.c: liblarder's schemas, batches and arrays: a stream's schema as
 * the daemon described it (field_t), its plan (node_plan_t), the arrays of
 * each batch built from its descriptor and checked against the arena, and
 * the batch and array accessors of larder.h.  How batches arrive and are
 * released is larder.c's; their exports are export.c's.  See internal.h.
 *
 * Invariants:
 * - A batch's arrays are built only from a descriptor whose every buffer
 *   lies inside the stream's arena and is large enough for its array's
 *   type and length (llib_build_arrays): a descriptor is untrusted input
 *   from another process.  Offsets in between the first and the last are
 *   not read, so a consumer that trusts them to grow checks them itself.
 * - A batch's nodes are in slot order (llib_plan_stream): the columns
 *   first, each array's children contiguous.
 * - Nothing here takes a lock or does a system call: building runs on the
 *   reading thread, the accessors on any thread that holds the batch.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------------------ */
/* Schemas and plans                                                         */

/* See internal.h. */
int llib_field_copy(field_t *dst, const Larder__Field *src, int depth) {
  memset(dst, 0, sizeof(*dst));
  if (depth > 64) return LARDER_EPROTO;
  dst->name = strdup(src->name ? src->name : "");
  dst->type = (larder_type_t)src->type;
  dst->nullable = src->nullable;
  dst->byte_width = src->byte_width;
  dst->precision = src->precision;
  dst->scale = src->scale;
  dst->unit = (larder_time_unit_t)(src->unit & 3);
  dst->utc = src->utc;
  if (dst->name == NULL || src->type >= LARDER_TYPE_COUNT_) return LARDER_EPROTO;
  if (src->n_children) {
    dst->children = calloc(src->n_children, sizeof(field_t));
    if (dst->children == NULL) return LARDER_ENOMEM;
    dst->num_children = (int)src->n_children;
    for (size_t i = 0; i < src->n_children; i++) {
      int rc = llib_field_copy(&dst->children[i], src->children[i], depth + 1);
      if (rc) return rc;
    }
  }
  return 0;
}

void llib_field_free(field_t *f) {
  for (int i = 0; i < f->num_children; i++) llib_field_free(&f->children[i]);
  free(f->children);
  free(f->name);
}

int llib_field_count(const field_t *f) {
  int n = 1;
  for (int i = 0; i < f->num_children; i++) n += llib_field_count(&f->children[i]);
  return n;
}

/* Bytes per value of a fixed-width type (as Arrow lays it out: a decimal
 * takes 16 or 32 bytes whatever its precision), 0 for the other types
 * (BOOL's values are bits), or -1 for a FIXED_BINARY of negative width.
 * The daemon's table is pq_field_value_width; this library does not link
 * the decoder, and a schema read off the socket may hold what no daemon
 * sends, such as a negative width. */
int64_t llib_value_width(const field_t *f) {
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
    case LARDER_TYPE_DECIMAL128: return 16;
    case LARDER_TYPE_DECIMAL256: return 32;
    case LARDER_TYPE_FIXED_BINARY: return f->byte_width < 0 ? -1 : f->byte_width;
    default: return 0;
  }
}

/* Bytes per offset of a type with offsets, else 0. */
uint64_t llib_offset_width(larder_type_t type) {
  switch (type) {
    case LARDER_TYPE_BINARY:
    case LARDER_TYPE_STRING:
    case LARDER_TYPE_LIST:
    case LARDER_TYPE_MAP: return 4;
    case LARDER_TYPE_LARGE_BINARY:
    case LARDER_TYPE_LARGE_STRING:
    case LARDER_TYPE_LARGE_LIST: return 8;
    default: return 0;
  }
}

/* Plans node f, the k-th in pre-order, whose array takes `slot`; its
 * children take the next free slots (from *slot_next), contiguously, so
 * they can be indexed.  The thread that opens. */
static void plan_node(larder_stream_t *s, int *k, int *slot_next, const field_t *f, int slot) {
  node_plan_t *p = &s->plan[(*k)++];
  int64_t width = llib_value_width(f);
  p->field = f;
  p->slot = slot;
  p->num_children = f->num_children;
  p->bad_width = width < 0;
  p->value_width = width > 0 ? (uint64_t)width : 0;
  /* Numbers are read whole, up to 8 bytes at a time; FIXED_BINARY's are bytes. */
  p->value_align = f->type == LARDER_TYPE_FIXED_BINARY || p->value_width == 0 ? 1
                   : p->value_width < 8                                       ? p->value_width
                                                                              : 8;
  p->offset_width = llib_offset_width(f->type);
  p->bitmap_values = f->type == LARDER_TYPE_BOOL;
  p->validity_checked = f->type != LARDER_TYPE_NULL;
  p->offsets_index_child = f->type == LARDER_TYPE_LIST || f->type == LARDER_TYPE_LARGE_LIST ||
                           f->type == LARDER_TYPE_MAP;
  if (f->type == LARDER_TYPE_STRUCT || p->offset_width) s->deep[s->num_deep++] = (int)(p - s->plan);
  p->children = *slot_next;
  *slot_next += f->num_children;
  for (int i = 0; i < f->num_children; i++)
    plan_node(s, k, slot_next, &f->children[i], p->children + i);
}

/* See internal.h. */
int llib_plan_stream(larder_stream_t *s) {
  s->plan = calloc((size_t)s->num_nodes + 1, sizeof(*s->plan));
  s->deep = calloc((size_t)s->num_nodes + 1, sizeof(*s->deep));
  if (s->plan == NULL || s->deep == NULL) return LARDER_ENOMEM;
  /* The columns take the first slots, so they index directly. */
  int k = 0, slot_next = s->schema.num_children;
  for (int i = 0; i < s->schema.num_children; i++)
    plan_node(s, &k, &slot_next, &s->schema.children[i], i);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Building a batch                                                          */

/* The offset at i of array a, whose offsets (checked to be there) are
 * `width` bytes each. */
static int64_t offset_at(const larder_array_t *a, uint64_t width, int64_t i) {
  if (width == 8) return ((const int64_t *)(const void *)a->offsets)[i];
  return ((const int32_t *)(const void *)a->offsets)[i];
}

/*
 * Builds the arrays of a batch into nodes from its descriptors b (whose
 * count the caller checked against s->num_nodes), and sets *bytes to the
 * size of its buffers.  Returns 0, or LARDER_EPROTO when a buffer lies
 * outside the arena, is too small for its array or holds numbers not
 * aligned to their width, or a column is shorter than the batch.
 *
 * A batch's buffers must not only lie inside the arena, aligned for their
 * values, but be large enough for the array's type and length: a
 * descriptor with a length of a million and an 8-byte values buffer would
 * otherwise pass, and reading
 * the array would fault (or read other batches' bytes).  Tested by
 * client_fake_bad_buffers.  Each array's buffers are checked against its
 * type and length, and its last offset against its values or its child,
 * in constant time: the offsets in between are not read, so a consumer
 * that trusts them to grow must check them itself.  The first loop's
 * checks are accumulated without branches, as a batch is almost never
 * bad; the reads of children and offsets wait until every buffer is known
 * to lie inside the arena.  The reading thread.
 */
int llib_build_arrays(const larder_stream_t *s, const wire_batch_t *b, larder_array_t *nodes,
                      uint64_t *bytes) {
  uint64_t size = s->arena_size, total = 0;
  int bad = 0;
  for (int k = 0; k < s->num_nodes; k++) {
    const node_plan_t *p = &s->plan[k];
    const uint64_t *d = b->layout + (size_t)k * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS;
    uint64_t vo = d[LARDER__ARRAY_FIELD__ARRAY_VALIDITY_OFFSET];
    uint64_t vl = d[LARDER__ARRAY_FIELD__ARRAY_VALIDITY_LENGTH];
    uint64_t oo = d[LARDER__ARRAY_FIELD__ARRAY_OFFSETS_OFFSET];
    uint64_t ol = d[LARDER__ARRAY_FIELD__ARRAY_OFFSETS_LENGTH];
    uint64_t xo = d[LARDER__ARRAY_FIELD__ARRAY_VALUES_OFFSET];
    uint64_t xl = d[LARDER__ARRAY_FIELD__ARRAY_VALUES_LENGTH];
    int64_t length = (int64_t)d[LARDER__ARRAY_FIELD__ARRAY_LENGTH];
    int64_t nulls = (int64_t)d[LARDER__ARRAY_FIELD__ARRAY_NULL_COUNT];
    /* Unsigned subtraction wraps where the offset is past the end, which
     * the comparison beside it catches. */
    bad |= (vl != 0) & ((vo > size) | (vl > size - vo));
    bad |= (ol != 0) & ((oo > size) | (ol > size - oo));
    bad |= (xl != 0) & ((xo > size) | (xl > size - xo));
    bad |= (length < 0) | (nulls < 0) | (nulls > length) | p->bad_width;
    uint64_t len = (uint64_t)length, bitmap = len / 8 + (len % 8 != 0), need;
    /* The validity bitmap is read only when there are nulls, but one that
     * is there must be whole too.  A NULL array has none: all its slots
     * are. */
    bad |= p->validity_checked & ((nulls > 0) | (vl > 0)) & (vl < bitmap);
    bad |= __builtin_mul_overflow(len, p->value_width, &need) | (need > xl);
    bad |= p->bitmap_values & (xl < bitmap);
    /* Values at an address their type cannot be read from: a kernel's
     * load of them is a misaligned-address fault, which ends the trainer's
     * CUDA context, not just this batch.  The daemon aligns every buffer
     * to 64 bytes, and the arena (or device region) starts on a page. */
    bad |= (xl != 0) & ((xo & (p->value_align - 1)) != 0);
    /* The second loop reads the first and last offset of each array that
     * has them, in the arena, which the daemon wrote from another core: a
     * trainer coming back from its step finds none of those lines in its
     * caches.  Start the loads now, so they overlap each other and the
     * rest of this loop, instead of missing one after another there (a
     * ready call took 1.32-1.37 us with the benchmark's three such arrays,
     * 1.19-1.20 us with this; 2-core VM).  Only within the arena: the
     * offsets are checked below, and a pointer past it is undefined. */
    if (ol != 0 && oo < size && ol <= size - oo) {
      __builtin_prefetch(s->arena + oo);
      __builtin_prefetch(s->arena + oo + ol - 1);
    }
    larder_array_t *a = &nodes[p->slot];
    a->field = p->field;
    a->length = length;
    a->null_count = nulls;
    /* Pointers are formed only within the arena (or one past its end),
     * even for a descriptor about to be refused: an offset past the end,
     * which makes the batch bad above, is clamped to it, as adding it
     * could wrap around the address space, which is undefined.  Tested
     * by fuzz-ring (tests/fuzz/regress/fuzz-ring/arena-offset-wraps). */
    a->validity = vl ? s->arena + (vo <= size ? vo : size) : NULL;
    a->offsets = ol ? s->arena + (oo <= size ? oo : size) : NULL;
    a->values = xl ? s->arena + (xo <= size ? xo : size) : NULL;
    a->values_size = xl;
    a->num_children = p->num_children;
    a->children = p->num_children ? nodes + p->children : NULL;
    total += vl + ol + xl;
  }
  if (bad) return LARDER_EPROTO;
  /* The batch is a struct of its columns, as larder_batch_export hands it
   * over: each column has a slot for each of its rows, or a consumer of
   * the export would read past a column's buffers.  Tested by fuzz-ring
   * (tests/fuzz/regress/fuzz-ring/batch-rows-beyond-columns). */
  int64_t rows = (int64_t)b->num_rows;
  if (rows < 0) return LARDER_EPROTO;
  for (int i = 0; i < s->schema.num_children; i++)
    if (nodes[i].length < rows) return LARDER_EPROTO;
  for (int i = 0; i < s->num_deep; i++) {
    const node_plan_t *p = &s->plan[s->deep[i]];
    const larder_array_t *a = &nodes[p->slot];
    if (p->offset_width == 0) {
      /* A struct: each child has a slot for each of its rows. */
      for (int j = 0; j < a->num_children; j++)
        if (a->children[j].length < a->length) return LARDER_EPROTO;
      continue;
    }
    /* Offsets: length + 1 of them, aligned, the first not negative nor
     * past the last, the last within the values (or the child's slots). */
    const uint64_t *d = b->layout + (size_t)s->deep[i] * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS;
    uint64_t ow = p->offset_width, ol = d[LARDER__ARRAY_FIELD__ARRAY_OFFSETS_LENGTH], need;
    if (a->offsets == NULL || __builtin_mul_overflow((uint64_t)a->length + 1, ow, &need) ||
        need > ol || ((uintptr_t)a->offsets & (ow - 1)) != 0)
      return LARDER_EPROTO;
    int64_t first = offset_at(a, ow, 0), last = offset_at(a, ow, a->length);
    uint64_t limit = a->values_size;
    if (p->offsets_index_child) {
      if (a->num_children != 1) return LARDER_EPROTO;
      limit = (uint64_t)a->children[0].length;
    }
    if (first < 0 || first > last || (uint64_t)last > limit) return LARDER_EPROTO;
  }
  *bytes = total;
  return 0;
}

/* CUDA streams: turns the host pointers of a batch's arrays, checked by
 * llib_build_arrays against the host mapping of the arena, into device
 * pointers at the same offsets of the daemon's device region. */
static const void *cuda_rebase(const void *p, uintptr_t host, uintptr_t dev) {
  /* A device address is no host object: it can only be made from an
   * integer. */
  // NOLINTNEXTLINE(performance-no-int-to-ptr)
  return p ? (const void *)(dev + ((uintptr_t)p - host)) : NULL;
}

static void cuda_rebase_arrays(const larder_stream_t *s, larder_array_t *nodes) {
  uintptr_t host = (uintptr_t)s->arena, dev = (uintptr_t)lcuda_map_base(s->cuda);
  for (int k = 0; k < s->num_nodes; k++) {
    larder_array_t *a = &nodes[k];
    a->validity = cuda_rebase(a->validity, host, dev);
    a->offsets = cuda_rebase(a->offsets, host, dev);
    a->values = cuda_rebase(a->values, host, dev);
    a->memory_kind = LARDER_MEMORY_CUDA;
  }
}

/* See internal.h.  Such a batch has consumed its descriptor: the caller
 * fails the stream on an error. */
int llib_batch_make(larder_stream_t *s, const wire_batch_t *b, larder_batch_t **spare,
                    larder_batch_t **out) {
  larder_batch_t *batch = *spare;
  *spare = NULL;
  *out = NULL;
  larder_array_t *nodes;
  if (batch) {
    nodes = batch->nodes;
    memset(batch, 0, sizeof(*batch));
  } else {
    batch = calloc(1, sizeof(*batch));
    nodes = calloc((size_t)s->num_nodes + 1, sizeof(larder_array_t));
  }
  if (batch == NULL || nodes == NULL) {
    free(batch);
    free(nodes);
    return LARDER_ENOMEM;
  }
  batch->stream = s;
  atomic_init(&batch->refs, 1);
  batch->seq = b->seq;
  batch->epoch = b->epoch;
  batch->index = b->index;
  batch->rows = (int64_t)b->num_rows;
  batch->nodes = nodes;
  batch->num_columns = s->schema.num_children;
  int rc = b->n_layout == (size_t)s->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS
               ? llib_build_arrays(s, b, nodes, &batch->bytes)
               : LARDER_EPROTO;
  batch->columns = nodes;
  if (rc) {
    free(nodes);
    free(batch);
    return rc;
  }
  if (s->cuda) cuda_rebase_arrays(s, nodes);
  *out = batch;
  return 0;
}
/* ------------------------------------------------------------------------ */
/* Batches                                                                   */

int64_t larder_batch_num_rows(const larder_batch_t *b) { return b->rows; }
uint64_t larder_batch_epoch(const larder_batch_t *b) { return b->epoch; }
uint64_t larder_batch_index(const larder_batch_t *b) { return b->index; }
int larder_batch_num_columns(const larder_batch_t *b) { return b->num_columns; }
uint64_t larder_batch_bytes(const larder_batch_t *b) { return b->bytes; }
int larder_batch_memory_kind(const larder_batch_t *b) {
  return b->stream->cuda ? LARDER_MEMORY_CUDA : LARDER_MEMORY_HOST;
}
int larder_batch_device(const larder_batch_t *b) { return b->stream->cuda_device; }

const larder_array_t *larder_batch_column(const larder_batch_t *b, int i) {
  return i >= 0 && i < b->num_columns ? &b->columns[i] : NULL;
}

const larder_array_t *larder_batch_column_by_name(const larder_batch_t *b, const char *name) {
  for (int i = 0; i < b->num_columns; i++)
    if (strcmp(b->columns[i].field->name, name) == 0) return &b->columns[i];
  return NULL;
}
/* A direct release of an exported batch is ignored, and the array's
 * release does not recycle the struct, so a direct release after it is a
 * use of freed memory that ASan reports rather than the silent release of
 * another batch.  A batch released both directly and through its exported
 * ArrowArray (an easy slip, as the export moves the batch's ownership)
 * would otherwise be released twice, and as the first release may
 * recycle its struct for the next batch, the second would release that
 * live batch instead, whose region the daemon would then reuse under the
 * trainer.  Tested by client_export_then_release. */
void larder_batch_release(larder_batch_t *b) {
  if (b == NULL || b->exported) return;
  llib_batch_unref(b, 1);
}

/* The struct is recycled only by the owner's release when it is the last:
 * a tensor's deleter may run on any thread after the owner moved on. */
void llib_batch_unref(larder_batch_t *b, int recycle) {
  if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
    llib_batch_release(b, recycle);
}

const char *larder_array_name(const larder_array_t *a) { return a->field->name; }
larder_type_t larder_array_type(const larder_array_t *a) { return a->field->type; }
int larder_array_nullable(const larder_array_t *a) { return a->field->nullable; }
int32_t larder_array_byte_width(const larder_array_t *a) { return a->field->byte_width; }
int32_t larder_array_precision(const larder_array_t *a) { return a->field->precision; }
int32_t larder_array_scale(const larder_array_t *a) { return a->field->scale; }
larder_time_unit_t larder_array_unit(const larder_array_t *a) { return a->field->unit; }
int larder_array_utc(const larder_array_t *a) { return a->field->utc; }
int64_t larder_array_length(const larder_array_t *a) { return a->length; }
int64_t larder_array_null_count(const larder_array_t *a) { return a->null_count; }
const uint8_t *larder_array_validity(const larder_array_t *a) {
  return a->null_count ? a->validity : NULL;
}
const int32_t *larder_array_offsets(const larder_array_t *a) {
  return llib_offset_width(a->field->type) == 4 ? (const int32_t *)(const void *)a->offsets : NULL;
}
const int64_t *larder_array_large_offsets(const larder_array_t *a) {
  return llib_offset_width(a->field->type) == 8 ? (const int64_t *)(const void *)a->offsets : NULL;
}
const void *larder_array_values(const larder_array_t *a) { return a->values; }
uint64_t larder_array_values_size(const larder_array_t *a) { return a->values_size; }
int larder_array_num_children(const larder_array_t *a) { return a->num_children; }
const larder_array_t *larder_array_child(const larder_array_t *a, int i) {
  return i >= 0 && i < a->num_children ? &a->children[i] : NULL;
}
int larder_array_memory_kind(const larder_array_t *a) { return a->memory_kind; }

/* Hooks for the exports of export.c (internal.h). */
int larder_internal_batch_take(larder_batch_t *b) {
  if (b->exported) return LARDER_EINVAL;
  b->exported = 1;
  return 0;
}
void larder_internal_batch_release_taken(larder_batch_t *b) { llib_batch_unref(b, 0); }

/* The batch's nodes are in slot order already (llib_plan_stream): the columns
 * first, each array's children contiguous, so an entry's index is its
 * slot and its children's indexes follow from the pointer. */
int larder_batch_describe(const larder_batch_t *b, larder_batch_info_t *info,
                          larder_array_info_t *arrays, int max_arrays) {
  if (b == NULL || max_arrays < 0 || (max_arrays > 0 && arrays == NULL)) return LARDER_EINVAL;
  const larder_stream_t *s = b->stream;
  int n = s->num_nodes;
  if (info) {
    info->num_rows = b->rows;
    info->epoch = b->epoch;
    info->index = b->index;
    info->bytes = b->bytes;
    info->num_columns = b->num_columns;
    info->num_arrays = n;
    info->arena = s->arena;
    info->arena_size = s->arena_size;
  }
  int fill = max_arrays < n ? max_arrays : n;
  for (int i = 0; i < fill; i++) {
    const larder_array_t *a = &b->nodes[i];
    larder_array_info_t *o = &arrays[i];
    int64_t width = llib_value_width(a->field);
    o->type = a->field->type;
    o->byte_width = width > 0 ? width : 0;
    o->offset_width = (int64_t)llib_offset_width(a->field->type);
    o->num_children = a->num_children;
    o->first_child = a->num_children ? (int64_t)(a->children - b->nodes) : -1;
    o->parent = -1;
    o->length = a->length;
    o->null_count = a->null_count;
    o->validity = a->null_count ? a->validity : NULL;
    o->offsets = o->offset_width ? a->offsets : NULL;
    o->values = a->values;
    o->values_size = a->values_size;
  }
  /* Parents: a second pass, as a child's slot comes after its parent's. */
  for (int i = 0; i < fill; i++)
    for (int64_t j = 0; j < arrays[i].num_children; j++) {
      int64_t c = arrays[i].first_child + j;
      if (c < fill) arrays[c].parent = i;
    }
  return n;
}
