/*
 * export.c: liblarder's exports of a batch without copying: the Arrow C
 * Data Interface (larder_batch_export), its Device variant
 * (larder_batch_export_device) and DLPack (larder_batch_export_dlpack).
 * See larder.h for the contracts and internal.h for the structs.
 *
 * Invariants:
 * - An export owns its batch: a batch is exported once (batch->exported),
 *   and the last release of the export's structs (or the last DLPack
 *   deleter) releases it, from any thread, without recycling its struct.
 * - Every struct of an Arrow export holds one reference to what the
 *   export shares, so a child moved out by the consumer outlives its
 *   parent's release, as the C Data Interface requires.
 * - Buffers are the batch's own pointers: host pointers into the arena, or
 *   device pointers for CUDA streams (the daemon synchronized the copy
 *   before it published the batch, so no sync event is needed).
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ------------------------------------------------------------------------ */
/* Arrow C Data Interface export                                             */

/* What an export's structs share.  Every struct of the tree (the root and
 * each child) holds one reference, dropped by its own release, so that a
 * child the consumer moved out stays valid after its parent is released,
 * as the C Data Interface requires; the last one frees everything (and
 * releases the batch).  Releases may come from any thread. */
typedef struct export_schema {
  atomic_int refs;
  struct ArrowSchema *nodes; /* all schema structs, root first */
  struct ArrowSchema **child_ptrs;
  char *strings;
} export_schema_t;

typedef struct export_array {
  atomic_int refs;
  larder_batch_t *batch;
  struct ArrowArray *nodes;
  struct ArrowArray **child_ptrs;
  const void **buffers;
} export_array_t;

static int schema_nodes(const field_t *f) {
  int n = 1;
  for (int i = 0; i < f->num_children; i++) n += schema_nodes(&f->children[i]);
  return n;
}

static void format_of(const field_t *f, char *buf, size_t size) {
  static const char units[] = {'s', 'm', 'u', 'n'};
  switch (f->type) {
    case LARDER_TYPE_NULL: snprintf(buf, size, "n"); break;
    case LARDER_TYPE_BOOL: snprintf(buf, size, "b"); break;
    case LARDER_TYPE_INT8: snprintf(buf, size, "c"); break;
    case LARDER_TYPE_INT16: snprintf(buf, size, "s"); break;
    case LARDER_TYPE_INT32: snprintf(buf, size, "i"); break;
    case LARDER_TYPE_INT64: snprintf(buf, size, "l"); break;
    case LARDER_TYPE_UINT8: snprintf(buf, size, "C"); break;
    case LARDER_TYPE_UINT16: snprintf(buf, size, "S"); break;
    case LARDER_TYPE_UINT32: snprintf(buf, size, "I"); break;
    case LARDER_TYPE_UINT64: snprintf(buf, size, "L"); break;
    case LARDER_TYPE_FLOAT16: snprintf(buf, size, "e"); break;
    case LARDER_TYPE_FLOAT32: snprintf(buf, size, "f"); break;
    case LARDER_TYPE_FLOAT64: snprintf(buf, size, "g"); break;
    case LARDER_TYPE_DATE32: snprintf(buf, size, "tdD"); break;
    case LARDER_TYPE_TIME32:
      snprintf(buf, size, "tt%c", f->unit == LARDER_UNIT_SECOND ? 's' : 'm');
      break;
    case LARDER_TYPE_TIME64:
      snprintf(buf, size, "tt%c", f->unit == LARDER_UNIT_NANO ? 'n' : 'u');
      break;
    case LARDER_TYPE_TIMESTAMP:
      snprintf(buf, size, "ts%c:%s", units[f->unit & 3], f->utc ? "UTC" : "");
      break;
    case LARDER_TYPE_DECIMAL128: snprintf(buf, size, "d:%d,%d", f->precision, f->scale); break;
    case LARDER_TYPE_DECIMAL256: snprintf(buf, size, "d:%d,%d,256", f->precision, f->scale); break;
    case LARDER_TYPE_BINARY: snprintf(buf, size, "z"); break;
    case LARDER_TYPE_STRING: snprintf(buf, size, "u"); break;
    case LARDER_TYPE_LARGE_BINARY: snprintf(buf, size, "Z"); break;
    case LARDER_TYPE_LARGE_STRING: snprintf(buf, size, "U"); break;
    case LARDER_TYPE_FIXED_BINARY: snprintf(buf, size, "w:%d", f->byte_width); break;
    case LARDER_TYPE_LIST: snprintf(buf, size, "+l"); break;
    case LARDER_TYPE_LARGE_LIST: snprintf(buf, size, "+L"); break;
    case LARDER_TYPE_STRUCT: snprintf(buf, size, "+s"); break;
    case LARDER_TYPE_MAP: snprintf(buf, size, "+m"); break;
    default: snprintf(buf, size, "n"); break;
  }
}

/* Releases s and the children still in it (a moved child's slot has a
 * NULL release), each dropping its reference. */
static void release_schema(struct ArrowSchema *s) {
  if (s->release == NULL) return;
  export_schema_t *x = s->private_data;
  for (int64_t i = 0; i < s->n_children; i++)
    if (s->children[i]->release) s->children[i]->release(s->children[i]);
  s->release = NULL;
  if (atomic_fetch_sub_explicit(&x->refs, 1, memory_order_acq_rel) != 1) return;
  free(x->child_ptrs);
  free(x->strings);
  free(x->nodes);
  free(x);
}

typedef struct schema_builder {
  export_schema_t *owner;
  struct ArrowSchema *nodes;
  struct ArrowSchema **ptrs;
  char *strings;
  size_t spos;
  int next, pnext;
} schema_builder;

static char *put_str(schema_builder *b, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = b->strings + b->spos;
  memcpy(p, s, n);
  b->spos += n;
  return p;
}

static void fill_schema(schema_builder *b, struct ArrowSchema *out, const field_t *f,
                        const char *name) {
  char fmt[64];
  format_of(f, fmt, sizeof(fmt));
  out->format = put_str(b, fmt);
  out->name = put_str(b, name);
  out->metadata = NULL;
  out->flags = f->nullable ? ARROW_FLAG_NULLABLE : 0;
  out->n_children = f->num_children;
  out->dictionary = NULL;
  out->release = release_schema;
  out->private_data = b->owner;
  out->children = f->num_children ? b->ptrs + b->pnext : NULL;
  int base = b->pnext;
  b->pnext += f->num_children;
  for (int i = 0; i < f->num_children; i++) {
    struct ArrowSchema *c = &b->nodes[b->next++];
    b->ptrs[base + i] = c;
    fill_schema(b, c, &f->children[i], f->children[i].name);
  }
  /* A map's entries and key export as non-nullable even where the
   * Parquet key column is OPTIONAL (written so by some tools): Arrow's
   * format forbids nullable entries and keys, and importers refuse them.
   * Their values are checked to hold no null (map_keys_have_nulls), so the
   * flags may say so.  Tested by client_fake_map_keys. */
  if (f->type == LARDER_TYPE_MAP && f->num_children == 1) {
    struct ArrowSchema *entries = b->ptrs[base];
    entries->flags &= ~(int64_t)ARROW_FLAG_NULLABLE;
    if (entries->n_children >= 1) entries->children[0]->flags &= ~(int64_t)ARROW_FLAG_NULLABLE;
  }
}

/* Whether a map in a's tree holds a null entry or key, which an Arrow map
 * cannot: Parquet allows an OPTIONAL key column. */
static int map_keys_have_nulls(const larder_array_t *a) {
  if (a->field->type == LARDER_TYPE_MAP && a->num_children == 1) {
    const larder_array_t *entries = &a->children[0];
    if (entries->null_count > 0) return 1;
    if (entries->num_children >= 1 && entries->children[0].null_count > 0) return 1;
  }
  for (int i = 0; i < a->num_children; i++)
    if (map_keys_have_nulls(&a->children[i])) return 1;
  return 0;
}

static size_t strings_size(const field_t *f) {
  size_t n = strlen(f->name) + 1 + 64;
  for (int i = 0; i < f->num_children; i++) n += strings_size(&f->children[i]);
  return n;
}

static int export_schema(const larder_stream_t *s, struct ArrowSchema *out) {
  int n = schema_nodes(&s->schema);
  export_schema_t *x = calloc(1, sizeof(*x));
  schema_builder b = {0};
  b.nodes = calloc((size_t)n, sizeof(struct ArrowSchema));
  b.ptrs = calloc((size_t)n, sizeof(struct ArrowSchema *));
  b.strings = malloc(strings_size(&s->schema) + 8);
  if (x == NULL || b.nodes == NULL || b.ptrs == NULL || b.strings == NULL) {
    free(x);
    free(b.nodes);
    free(b.ptrs);
    free(b.strings);
    return LARDER_ENOMEM;
  }
  b.next = 1;
  b.owner = x;
  fill_schema(&b, &b.nodes[0], &s->schema, "");
  *out = b.nodes[0];
  /* Children point at b.nodes; the root is the caller's struct. */
  atomic_init(&x->refs, n);
  x->nodes = b.nodes;
  x->child_ptrs = b.ptrs;
  x->strings = b.strings;
  return 0;
}

/* Releases a and the children still in it, as release_schema does. */
static void release_array(struct ArrowArray *a) {
  if (a->release == NULL) return;
  export_array_t *x = a->private_data;
  for (int64_t i = 0; i < a->n_children; i++)
    if (a->children[i]->release) a->children[i]->release(a->children[i]);
  a->release = NULL;
  if (atomic_fetch_sub_explicit(&x->refs, 1, memory_order_acq_rel) != 1) return;
  llib_batch_unref(x->batch, 0);
  free(x->nodes);
  free(x->child_ptrs);
  free(x->buffers);
  free(x);
}

static int buffer_count(const field_t *f) {
  switch (f->type) {
    case LARDER_TYPE_NULL: return 0;
    case LARDER_TYPE_STRUCT: return 1;
    case LARDER_TYPE_BINARY:
    case LARDER_TYPE_STRING:
    case LARDER_TYPE_LARGE_BINARY:
    case LARDER_TYPE_LARGE_STRING: return 3;
    default: return 2;
  }
}

typedef struct array_builder {
  export_array_t *owner;
  struct ArrowArray *nodes;
  struct ArrowArray **ptrs;
  const void **bufs;
  int next, pnext, bnext;
} array_builder;

static void fill_array(array_builder *b, struct ArrowArray *out, const larder_array_t *a) {
  const field_t *f = a->field;
  out->length = a->length;
  out->null_count = a->null_count;
  out->offset = 0;
  out->n_buffers = buffer_count(f);
  out->buffers = b->bufs + b->bnext;
  b->bnext += (int)out->n_buffers;
  if (out->n_buffers > 0) out->buffers[0] = a->null_count ? a->validity : NULL;
  /* A list's second buffer is its offsets (a LARGE_LIST's too), not its
   * absent values.  Tested by client_fake_large_types. */
  if (out->n_buffers == 2)
    out->buffers[1] = llib_offset_width(f->type) ? (const void *)a->offsets : a->values;
  if (out->n_buffers == 3) {
    out->buffers[1] = a->offsets;
    out->buffers[2] = a->values;
  }
  out->n_children = a->num_children;
  out->children = a->num_children ? b->ptrs + b->pnext : NULL;
  out->dictionary = NULL;
  out->release = release_array;
  out->private_data = b->owner;
  int base = b->pnext;
  b->pnext += a->num_children;
  for (int i = 0; i < a->num_children; i++) {
    struct ArrowArray *c = &b->nodes[b->next++];
    b->ptrs[base + i] = c;
    fill_array(b, c, &a->children[i]);
  }
}

int larder_batch_export(larder_batch_t *batch, struct ArrowSchema *schema,
                        struct ArrowArray *array) {
  /* The batch belongs to the first array: a second export is refused, as
   * each array's release would release the batch, the second one whichever
   * live batch had reused its struct.  Tested by client_export_then_release. */
  if (batch->exported) return LARDER_EINVAL;
  for (int i = 0; i < batch->num_columns; i++)
    if (map_keys_have_nulls(&batch->columns[i])) return LARDER_EUNSUPPORTED;
  larder_stream_t *s = batch->stream;
  int rc = export_schema(s, schema);
  if (rc) return rc;
  int n = s->num_nodes + 1;
  export_array_t *x = calloc(1, sizeof(*x));
  array_builder b = {0};
  b.nodes = calloc((size_t)n, sizeof(struct ArrowArray));
  b.ptrs = calloc((size_t)n, sizeof(struct ArrowArray *));
  b.bufs = calloc((size_t)n * 3 + 1, sizeof(void *));
  if (x == NULL || b.nodes == NULL || b.ptrs == NULL || b.bufs == NULL) {
    free(x);
    free(b.nodes);
    free(b.ptrs);
    free(b.bufs);
    schema->release(schema);
    return LARDER_ENOMEM;
  }
  /* The root: a struct array without nulls whose children are the
   * columns. */
  struct ArrowArray *root = array;
  root->length = batch->rows;
  root->null_count = 0;
  root->offset = 0;
  root->n_buffers = 1;
  root->buffers = b.bufs;
  b.bufs[0] = NULL;
  b.bnext = 1;
  root->n_children = batch->num_columns;
  root->children = b.ptrs;
  b.pnext = batch->num_columns;
  b.next = 0;
  b.owner = x;
  for (int i = 0; i < batch->num_columns; i++) {
    struct ArrowArray *c = &b.nodes[b.next++];
    b.ptrs[i] = c;
    fill_array(&b, c, &batch->columns[i]);
  }
  root->dictionary = NULL;
  atomic_init(&x->refs, b.next + 1);
  x->batch = batch;
  batch->exported = 1;
  x->nodes = b.nodes;
  x->child_ptrs = b.ptrs;
  x->buffers = b.bufs;
  root->private_data = x;
  root->release = release_array;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Arrow C Device Data Interface                                             */

int larder_batch_export_device(larder_batch_t *batch, struct ArrowSchema *schema,
                               struct ArrowDeviceArray *array) {
  int cuda = larder_batch_memory_kind(batch) == LARDER_MEMORY_CUDA;
  int64_t device = larder_batch_device(batch);
  /* On an error the caller's structs are left as they were (a second
   * export must not clobber the first). */
  int rc = larder_batch_export(batch, schema, &array->array);
  if (rc) return rc;
  memset(array->reserved, 0, sizeof(array->reserved));
  array->device_type = cuda ? ARROW_DEVICE_CUDA : ARROW_DEVICE_CPU;
  array->device_id = cuda ? device : -1;
  /* The daemon synchronized the copy before it published the batch. */
  array->sync_event = NULL;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* DLPack                                                                    */

/* What the tensors of one export share: the batch, released by the last
 * deleter. */
typedef struct dlpack_export {
  atomic_int refs;
  larder_batch_t *batch;
} dlpack_export_t;

typedef struct dlpack_tensor {
  DLManagedTensor t; /* first: the consumer's pointer is this struct's */
  int64_t shape[2];
  dlpack_export_t *x;
} dlpack_tensor_t;

static void dlpack_delete(DLManagedTensor *self) {
  if (self == NULL) return;
  dlpack_tensor_t *dt = (dlpack_tensor_t *)self;
  dlpack_export_t *x = dt->x;
  free(dt);
  if (atomic_fetch_sub_explicit(&x->refs, 1, memory_order_acq_rel) != 1) return;
  larder_internal_batch_release_taken(x->batch);
  free(x);
}

/* DLPack's type of a's values, or 0 when it has none (not fixed-width). */
static int dlpack_type(const larder_array_t *a, DLDataType *t, int *ndim) {
  *ndim = 1;
  t->lanes = 1;
  switch (larder_array_type(a)) {
    case LARDER_TYPE_INT8: *t = (DLDataType){kDLInt, 8, 1}; return 1;
    case LARDER_TYPE_INT16: *t = (DLDataType){kDLInt, 16, 1}; return 1;
    case LARDER_TYPE_INT32:
    case LARDER_TYPE_DATE32:
    case LARDER_TYPE_TIME32: *t = (DLDataType){kDLInt, 32, 1}; return 1;
    case LARDER_TYPE_INT64:
    case LARDER_TYPE_TIME64:
    case LARDER_TYPE_TIMESTAMP: *t = (DLDataType){kDLInt, 64, 1}; return 1;
    case LARDER_TYPE_UINT8: *t = (DLDataType){kDLUInt, 8, 1}; return 1;
    case LARDER_TYPE_UINT16: *t = (DLDataType){kDLUInt, 16, 1}; return 1;
    case LARDER_TYPE_UINT32: *t = (DLDataType){kDLUInt, 32, 1}; return 1;
    case LARDER_TYPE_UINT64: *t = (DLDataType){kDLUInt, 64, 1}; return 1;
    case LARDER_TYPE_FLOAT16: *t = (DLDataType){kDLFloat, 16, 1}; return 1;
    case LARDER_TYPE_FLOAT32: *t = (DLDataType){kDLFloat, 32, 1}; return 1;
    case LARDER_TYPE_FLOAT64: *t = (DLDataType){kDLFloat, 64, 1}; return 1;
    case LARDER_TYPE_FIXED_BINARY:
      if (larder_array_byte_width(a) <= 0) return 0;
      *t = (DLDataType){kDLUInt, 8, 1};
      *ndim = 2;
      return 1;
    default: return 0;
  }
}

int larder_batch_export_dlpack(larder_batch_t *batch, DLManagedTensor **tensors, int n) {
  if (batch == NULL || tensors == NULL || n < 0 || n > larder_batch_num_columns(batch))
    return LARDER_EINVAL;
  int cuda = larder_batch_memory_kind(batch) == LARDER_MEMORY_CUDA;
  DLDevice dev = {cuda ? kDLCUDA : kDLCPU, cuda ? (int32_t)larder_batch_device(batch) : 0};
  int made = 0;
  for (int i = 0; i < n; i++) {
    DLDataType t;
    int ndim;
    tensors[i] = NULL;
    if (dlpack_type(larder_batch_column(batch, i), &t, &ndim)) made++;
  }
  if (made == 0) return LARDER_EUNSUPPORTED;
  dlpack_export_t *x = calloc(1, sizeof(*x));
  if (x == NULL) return LARDER_ENOMEM;
  for (int i = 0; i < n; i++) {
    const larder_array_t *a = larder_batch_column(batch, i);
    DLDataType t;
    int ndim;
    if (!dlpack_type(a, &t, &ndim)) continue;
    dlpack_tensor_t *dt = calloc(1, sizeof(*dt));
    if (dt == NULL) {
      for (int k = 0; k < i; k++) {
        free(tensors[k]);
        tensors[k] = NULL;
      }
      free(x);
      return LARDER_ENOMEM;
    }
    dt->x = x;
    dt->shape[0] = larder_array_length(a);
    dt->shape[1] = ndim == 2 ? larder_array_byte_width(a) : 1;
    /* DLPack's data is not const; the consumer owns the tensor. */
    dt->t.dl_tensor.data = (void *)larder_array_values(a);
    dt->t.dl_tensor.device = dev;
    dt->t.dl_tensor.ndim = ndim;
    dt->t.dl_tensor.dtype = t;
    dt->t.dl_tensor.shape = dt->shape;
    dt->t.dl_tensor.strides = NULL; /* compact, row-major */
    dt->t.dl_tensor.byte_offset = 0;
    dt->t.manager_ctx = x;
    dt->t.deleter = dlpack_delete;
    tensors[i] = &dt->t;
  }
  int rc = larder_internal_batch_take(batch);
  if (rc) {
    for (int i = 0; i < n; i++) {
      free(tensors[i]);
      tensors[i] = NULL;
    }
    free(x);
    return rc;
  }
  x->batch = batch;
  atomic_init(&x->refs, made);
  return made;
}

/* ------------------------------------------------------------------------ */
/* DLPack, one buffer at a time                                              */

typedef struct dlpack_one {
  DLManagedTensor t; /* first: the consumer's pointer is this struct's */
  int64_t shape[2];
  larder_batch_t *batch;
} dlpack_one_t;

static void dlpack_one_delete(DLManagedTensor *self) {
  if (self == NULL) return;
  dlpack_one_t *d = (dlpack_one_t *)self;
  larder_batch_t *b = d->batch;
  free(d);
  llib_batch_unref(b, 0);
}

int larder_batch_dlpack(larder_batch_t *batch, const void *data, DLDataType dtype, int ndim,
                        const int64_t *shape, DLManagedTensor **out) {
  if (out) *out = NULL;
  if (batch == NULL || out == NULL || shape == NULL || ndim < 1 || ndim > 2 || batch->exported ||
      dtype.lanes != 1 || dtype.bits == 0 || dtype.bits % 8 != 0)
    return LARDER_EINVAL;
  uint64_t bytes = dtype.bits / 8;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] < 0 || (shape[i] > 0 && bytes > UINT64_MAX / (uint64_t)shape[i]))
      return LARDER_EINVAL;
    bytes *= (uint64_t)shape[i];
  }
  /* Only the batch's own memory: its stream's arena, or the device region
   * that mirrors it. */
  const larder_stream_t *s = batch->stream;
  int cuda = s->cuda != NULL;
  uintptr_t base = cuda ? (uintptr_t)lcuda_map_base(s->cuda) : (uintptr_t)s->arena;
  uintptr_t p = (uintptr_t)data;
  if (bytes > 0 &&
      (data == NULL || p < base || p - base > s->arena_size || bytes > s->arena_size - (p - base)))
    return LARDER_EINVAL;
  dlpack_one_t *d = calloc(1, sizeof(*d));
  if (d == NULL) return LARDER_ENOMEM;
  for (int i = 0; i < ndim; i++) d->shape[i] = shape[i];
  d->batch = batch;
  /* DLPack's data is not const; the memory stays read-only. */
  d->t.dl_tensor.data = (void *)data;
  d->t.dl_tensor.device = (DLDevice){cuda ? kDLCUDA : kDLCPU, cuda ? (int32_t)s->cuda_device : 0};
  d->t.dl_tensor.ndim = ndim;
  d->t.dl_tensor.dtype = dtype;
  d->t.dl_tensor.shape = d->shape;
  d->t.dl_tensor.strides = NULL; /* compact, row-major */
  d->t.dl_tensor.byte_offset = 0;
  d->t.manager_ctx = batch;
  d->t.deleter = dlpack_one_delete;
  atomic_fetch_add_explicit(&batch->refs, 1, memory_order_relaxed);
  *out = &d->t;
  return 0;
}
