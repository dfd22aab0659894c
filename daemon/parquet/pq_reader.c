/*
 * pq_reader.c: reads rows of a row group into Arrow-like arrays.  Each leaf
 * column is read by its pq_leaf; this file turns their levels and dense
 * values into validity bitmaps, offsets and child arrays (Dremel assembly),
 * and converts physical values into the serving types.
 *
 * Assembly of one field uses the levels of the first leaf below it.  With
 * the thresholds that pq_schema.c stored on the field:
 *   an entry j opens a slot of the field   when def[j] >= slot_def and
 *                                               rep[j] <= slot_rep;
 *   the slot's value is present (non-null)  when def[j] >= def_level;
 *   for LIST and MAP, j opens an element    when def[j] >= elem_def and
 *                                               rep[j] <= elem_rep,
 * and a list's offsets count the elements opened since its slot opened.
 * All leaves below a struct must agree on its slots; a file where they do
 * not is rejected rather than misread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/pq_internal.h"

struct pq_reader {
  const struct pq_file *file;
  const pq_source *src;
  const pq_projection *proj;
  pq_options opts;
  int rg;
  pq_codec_ctx *codec;
  pq_leaf **leaves; /* by leaf index; NULL when not projected */
  int num_leaves;
  int64_t rows_left;
  int failed;
  /* The column being read, for the message of a fault (a file truncated
   * under the mapping): volatile, as the guard's siglongjmp lands after
   * stores the compiler could otherwise keep in registers. */
  const char *volatile at;
};

static void where_field(const pq_reader *r, const pq_field_t *f, char *buf, size_t size) {
  snprintf(buf, size, "%s: column '%s', row group %d", r->file->name,
           f->node && f->node->path ? f->node->path : f->name, r->rg);
}

static int field_fail(const pq_reader *r, const pq_field_t *f, pq_error *err, int code,
                      const char *what) {
  char where[300];
  where_field(r, f, where, sizeof(where));
  return pq_error_set(err, code, "%s: %s", where, what);
}

/* Returns 0 when every leaf-less group is outside the projection. */
static int check_fields(const pq_field_t *f) {
  if (f->num_children == 0) return f->node->leaf_index >= 0 ? 0 : -1;
  for (int i = 0; i < f->num_children; i++)
    if (check_fields(&f->children[i])) return -1;
  return 0;
}

int pq_reader_open(const pq_file *file, const pq_source *src, const pq_projection *proj, int rg,
                   const pq_options *opts, pq_reader **out, pq_error *err) {
  *out = NULL;
  const pq_file_meta_t *meta = &file->meta;
  if (rg < 0 || rg >= meta->num_row_groups)
    return pq_error_set(err, LARDER_EINVAL, "%s: no row group %d", file->name, rg);
  const pq_field_t *root = pq_projection_schema(proj);
  for (int i = 0; i < root->num_children; i++)
    if (check_fields(&root->children[i]))
      return pq_error_set(err, LARDER_EUNSUPPORTED,
                          "%s: column '%s' contains a group with no columns", file->name,
                          root->children[i].name);
  pq_reader *r = calloc(1, sizeof(*r));
  if (r == NULL)
    return pq_error_set(err, LARDER_ENOMEM, "%s: row group %d: out of memory", file->name, rg);
  r->file = file;
  r->src = src;
  r->proj = proj;
  if (opts) r->opts = *opts;
  else pq_options_init(&r->opts);
  r->rg = rg;
  r->rows_left = meta->row_groups[rg].num_rows;
  r->num_leaves = meta->num_leaves;
  r->codec = pq_codec_ctx_new();
  r->leaves = calloc((size_t)meta->num_leaves + 1, sizeof(pq_leaf *));
  int rc = 0;
  if (r->codec == NULL || r->leaves == NULL) {
    rc = pq_error_set(err, LARDER_ENOMEM, "%s: row group %d: out of memory", file->name, rg);
    goto fail;
  }
  for (int i = 0; i < meta->num_leaves; i++) {
    if (!pq_projection_has_leaf(proj, i)) continue;
    rc = pq_leaf_open(file, src, &r->opts, r->codec, rg, i, &r->leaves[i], err);
    if (rc) goto fail;
  }
  *out = r;
  return 0;
fail:
  pq_reader_close(r);
  return rc;
}

void pq_reader_close(pq_reader *r) {
  if (r == NULL) return;
  if (r->leaves)
    for (int i = 0; i < r->num_leaves; i++) pq_leaf_close(r->leaves[i]);
  free(r->leaves);
  pq_codec_ctx_free(r->codec);
  free(r);
}

/* ------------------------------------------------------------------------ */
/* Batches                                                                   */

static void array_free(pq_array_t *a) {
  pq_buf_free(&a->validity);
  pq_buf_free(&a->offsets);
  pq_buf_free(&a->values);
  for (int i = 0; a->children != NULL && i < a->num_children; i++) array_free(&a->children[i]);
  free(a->children);
  memset(a, 0, sizeof(*a));
}

static int array_init(pq_array_t *a, const pq_field_t *f) {
  memset(a, 0, sizeof(*a));
  a->field = f;
  if (f->num_children == 0) return 0;
  a->children = calloc((size_t)f->num_children, sizeof(pq_array_t));
  if (a->children == NULL) return LARDER_ENOMEM;
  a->num_children = f->num_children;
  for (int i = 0; i < f->num_children; i++)
    if (array_init(&a->children[i], &f->children[i])) return LARDER_ENOMEM;
  return 0;
}

void pq_batch_init(pq_batch_t *b) { memset(b, 0, sizeof(*b)); }

void pq_batch_free(pq_batch_t *b) {
  for (int i = 0; b->columns != NULL && i < b->num_columns; i++) array_free(&b->columns[i]);
  free(b->columns);
  memset(b, 0, sizeof(*b));
}

static int batch_shape(pq_batch_t *b, const pq_field_t *root) {
  if (root == NULL) return LARDER_EINVAL;
  if (b->schema == root && b->columns != NULL) return 0;
  pq_batch_free(b);
  b->columns = calloc((size_t)(root->num_children ? root->num_children : 1), sizeof(pq_array_t));
  if (b->columns == NULL) return LARDER_ENOMEM;
  b->num_columns = root->num_children;
  b->schema = root;
  for (int i = 0; i < root->num_children; i++)
    if (array_init(&b->columns[i], &root->children[i])) return LARDER_ENOMEM;
  return 0;
}

static uint64_t array_bytes(const pq_array_t *a) {
  uint64_t n = a->validity.len + a->offsets.len + a->values.len;
  for (int i = 0; i < a->num_children; i++) n += array_bytes(&a->children[i]);
  return n;
}

uint64_t pq_batch_bytes(const pq_batch_t *b) {
  uint64_t n = 0;
  for (int i = 0; i < b->num_columns; i++) n += array_bytes(&b->columns[i]);
  return n;
}

/* ------------------------------------------------------------------------ */
/* Value conversion                                                          */

/* Bytes per slot of a fixed-width serving type while it is decoded, 0 for
 * variable width: BOOL takes a byte a value until assemble_leaf packs the
 * bits. */
static size_t type_width(const pq_field_t *f) {
  return f->type == LARDER_TYPE_BOOL ? 1 : pq_field_value_width(f);
}

/* Writes a big-endian two's complement integer of len bytes as a
 * little-endian one of w bytes.  Returns -1 when it does not fit. */
static int be_to_le(const uint8_t *in, size_t len, uint8_t *out, size_t w) {
  uint8_t sign = len && (in[0] & 0x80) ? 0xff : 0x00;
  /* Leading bytes that only repeat the sign may be dropped. */
  while (len > w) {
    if (in[0] != sign) return -1;
    in++;
    len--;
  }
  if (len && ((in[0] & 0x80) ? 0xff : 0x00) != sign) return -1;
  for (size_t i = 0; i < len; i++) out[i] = in[len - 1 - i];
  memset(out + len, sign, w - len);
  return 0;
}

/* Converts n dense physical values in a (values, offsets) into the field's
 * serving representation, still dense. */
static int convert_dense(pq_reader *r, const pq_field_t *f, pq_array_t *a, int64_t n,
                         pq_error *err) {
  pq_physical_t phys = f->node->physical;
  size_t w = type_width(f);
  switch (f->type) {
    case LARDER_TYPE_INT8:
    case LARDER_TYPE_UINT8:
    case LARDER_TYPE_INT16:
    case LARDER_TYPE_UINT16:
      if (phys == PQ_INT32) {
        const int32_t *in = (const int32_t *)(void *)a->values.data;
        if (w == 1) {
          uint8_t *o = a->values.data;
          for (int64_t i = 0; i < n; i++) o[i] = (uint8_t)in[i];
        } else {
          uint16_t *o = (uint16_t *)(void *)a->values.data;
          for (int64_t i = 0; i < n; i++) o[i] = (uint16_t)in[i];
        }
        a->values.len = (size_t)n * w;
      }
      return 0;
    case LARDER_TYPE_TIMESTAMP:
      if (phys == PQ_INT96) {
        /* INT96: nanoseconds of the day, then the Julian day number. */
        const uint8_t *in = a->values.data;
        int64_t *o = (int64_t *)(void *)a->values.data;
        for (int64_t i = 0; i < n; i++) {
          uint64_t nanos;
          uint32_t jd;
          memcpy(&nanos, in + 12 * i, 8);
          memcpy(&jd, in + 12 * i + 8, 4);
          uint64_t v = ((uint64_t)(int64_t)((int64_t)jd - 2440588)) * 86400000000000ull + nanos;
          o[i] = (int64_t)v;
        }
        a->values.len = (size_t)n * 8;
      }
      return 0;
    case LARDER_TYPE_DECIMAL128:
    case LARDER_TYPE_DECIMAL256: {
      if (phys == PQ_INT32 || phys == PQ_INT64) {
        size_t in_w = phys == PQ_INT32 ? 4 : 8;
        if (pq_buf_reserve(&a->values, (size_t)n * w)) goto oom;
        uint8_t *d = a->values.data;
        for (int64_t i = n - 1; i >= 0; i--) {
          int64_t v;
          if (in_w == 4) {
            int32_t v32;
            memcpy(&v32, d + (size_t)i * 4, 4);
            v = v32;
          } else {
            memcpy(&v, d + (size_t)i * 8, 8);
          }
          uint8_t *o = d + (size_t)i * w;
          memcpy(o, &v, 8);
          memset(o + 8, v < 0 ? 0xff : 0, w - 8);
        }
        a->values.len = (size_t)n * w;
        return 0;
      }
      pq_buf_t conv = {0};
      if (pq_buf_reserve(&conv, (size_t)n * w + 1)) goto oom;
      for (int64_t i = 0; i < n; i++) {
        const uint8_t *in;
        size_t len;
        if (phys == PQ_BYTE_ARRAY) {
          const int32_t *off = (const int32_t *)(void *)a->offsets.data;
          in = a->values.data + off[i];
          len = (size_t)(off[i + 1] - off[i]);
        } else {
          len = (size_t)f->node->type_length;
          in = a->values.data + (size_t)i * len;
        }
        if (be_to_le(in, len, conv.data + (size_t)i * w, w)) {
          pq_buf_free(&conv);
          return field_fail(r, f, err, LARDER_ECORRUPT,
                            "decimal value wider than its precision allows");
        }
      }
      pq_buf_free(&a->values);
      a->values = conv;
      a->values.len = (size_t)n * w;
      a->offsets.len = 0;
      return 0;
    }
    default: return 0;
  }
oom:
  return field_fail(r, f, err, LARDER_ENOMEM, "out of memory");
}

/* ------------------------------------------------------------------------ */
/* Assembly                                                                  */

typedef struct levels {
  const uint16_t *def, *rep;
  int64_t n, num_values;
  int16_t max_rep; /* of the leaf the levels come from */
} levels;

static void leaf_levels_of(pq_reader *r, const pq_field_t *f, levels *lv) {
  pq_leaf *L = r->leaves[f->first_leaf];
  pq_leaf_levels(L, &lv->def, &lv->rep, &lv->n, &lv->num_values);
  lv->max_rep = pq_leaf_node(L)->rep_level;
}

static inline int is_slot(const levels *lv, int64_t j, int16_t sdef, int16_t srep) {
  return (lv->rep == NULL || lv->rep[j] <= srep) && (lv->def == NULL || lv->def[j] >= sdef);
}

/* Builds a's validity over the field's slots and returns the slot count, or
 * -1 when out of memory.  *nulls receives the null count. */
static int64_t build_validity(const pq_field_t *f, const levels *lv, pq_array_t *a, int64_t rows,
                              int64_t *nulls) {
  int64_t slots = 0, null_count = 0;
  int simple = lv->rep == NULL && f->slot_def == 0;
  if (lv->def == NULL) {
    /* Every definition level is the maximum: nothing on the path is null,
     * and the repetition levels alone say which entries open slots. */
    a->validity.len = 0;
    *nulls = 0;
    int16_t srep = f->slot_rep;
    if (lv->rep == NULL || srep >= lv->max_rep) return lv->n;
    if (srep == 0 && f->slot_def == 0) return rows; /* a top-level field */
    for (int64_t j = 0; j < lv->n; j++) slots += lv->rep[j] <= srep;
    return slots;
  }
  if (pq_buf_reserve(&a->validity, (size_t)(lv->n + 7) / 8 + 8)) return -1;
  uint8_t *bits = a->validity.data;
  const uint16_t *def = lv->def;
  int16_t dl = f->def_level;
  if (simple) {
    int64_t n = lv->n;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
      uint8_t b = 0;
      for (int k = 0; k < 8; k++) b |= (uint8_t)((def[j + k] >= dl) << k);
      bits[j >> 3] = b;
      null_count += 8 - __builtin_popcount(b);
    }
    if (j < n) {
      uint8_t b = 0;
      for (int k = 0; j + k < n; k++) {
        int v = def[j + k] >= dl;
        b |= (uint8_t)(v << k);
        null_count += !v;
      }
      bits[j >> 3] = b;
    }
    slots = n;
  } else {
    memset(bits, 0, (size_t)(lv->n + 7) / 8);
    for (int64_t j = 0; j < lv->n; j++) {
      if (!is_slot(lv, j, f->slot_def, f->slot_rep)) continue;
      if (def[j] >= dl) bits[slots >> 3] |= (uint8_t)(1u << (slots & 7));
      else null_count++;
      slots++;
    }
  }
  a->validity.len = null_count ? (size_t)(slots + 7) / 8 : 0;
  *nulls = null_count;
  return slots;
}

static inline int bit_get(const uint8_t *bits, int64_t i) { return (bits[i >> 3] >> (i & 7)) & 1; }

/* Spreads v dense fixed-width values over `slots` slots, per validity. */
static void spread_fixed(pq_array_t *a, size_t w, int64_t slots, int64_t v) {
  uint8_t *d = a->values.data;
  const uint8_t *bits = a->validity.data;
  for (int64_t s = slots - 1; s >= 0; s--) {
    if (bit_get(bits, s)) {
      v--;
      if (v != s) memmove(d + (size_t)s * w, d + (size_t)v * w, w);
    } else {
      memset(d + (size_t)s * w, 0, w);
    }
  }
}

static void spread_offsets(pq_array_t *a, int64_t slots, int64_t v) {
  int32_t *o = (int32_t *)(void *)a->offsets.data;
  const uint8_t *bits = a->validity.data;
  o[slots] = o[v];
  for (int64_t s = slots - 1; s >= 0; s--) {
    if (bit_get(bits, s)) {
      v--;
      o[s] = o[v];
    } else {
      o[s] = o[s + 1];
    }
  }
}

static int assemble(pq_reader *r, const pq_field_t *f, pq_array_t *a, int64_t rows, pq_error *err);

static int assemble_leaf(pq_reader *r, const pq_field_t *f, pq_array_t *a, int64_t rows,
                         pq_error *err) {
  pq_leaf *L = r->leaves[f->node->leaf_index];
  a->values.len = 0;
  a->offsets.len = 0;
  int64_t got = pq_leaf_read(L, rows, &a->values, &a->offsets, err);
  if (got < 0) return (int)got;
  if (got != rows) {
    char what[200];
    snprintf(what, sizeof(what),
             "the row group declares more rows than the column holds (%lld of "
             "%lld in this batch)",
             (long long)got, (long long)rows);
    return field_fail(r, f, err, LARDER_ECORRUPT, what);
  }
  levels lv;
  leaf_levels_of(r, f, &lv);
  int64_t nulls;
  int64_t slots = build_validity(f, &lv, a, rows, &nulls);
  if (slots < 0) return field_fail(r, f, err, LARDER_ENOMEM, "out of memory");
  a->length = slots;
  a->null_count = nulls;
  if (f->type == LARDER_TYPE_NULL) {
    /* NullType columns carry no values; every slot is null. */
    a->values.len = a->offsets.len = 0;
    if (pq_buf_reserve(&a->validity, (size_t)(slots + 7) / 8)) goto oom;
    memset(a->validity.data, 0, (size_t)(slots + 7) / 8);
    a->validity.len = (size_t)(slots + 7) / 8;
    a->null_count = slots;
    return 0;
  }
  if (slots - nulls != lv.num_values)
    return field_fail(r, f, err, LARDER_ECORRUPT,
                      "definition levels disagree with the number of values");
  int rc = convert_dense(r, f, a, lv.num_values, err);
  if (rc) return rc;
  size_t w = type_width(f);
  if (w == 0) {
    /* Variable width: offsets (an empty column has a single zero). */
    if (pq_buf_reserve(&a->offsets, ((size_t)slots + 1) * 4)) goto oom;
    if (lv.num_values == 0) {
      memset(a->offsets.data, 0, 4);
    }
    if (nulls) spread_offsets(a, slots, lv.num_values);
    a->offsets.len = ((size_t)slots + 1) * 4;
  } else {
    if (pq_buf_reserve(&a->values, (size_t)slots * w)) goto oom;
    if (nulls) spread_fixed(a, w, slots, lv.num_values);
    a->values.len = (size_t)slots * w;
    if (f->type == LARDER_TYPE_BOOL) {
      /* Pack the one-byte booleans into a bitmap, in place. */
      uint8_t *d = a->values.data;
      int64_t nb = (slots + 7) / 8;
      for (int64_t b = 0; b < nb; b++) {
        uint8_t v = 0;
        for (int k = 0; k < 8 && b * 8 + k < slots; k++) v |= (uint8_t)((d[b * 8 + k] & 1) << k);
        d[b] = v;
      }
      a->values.len = (size_t)nb;
    }
  }
  return 0;
oom:
  return field_fail(r, f, err, LARDER_ENOMEM, "out of memory");
}

static int assemble(pq_reader *r, const pq_field_t *f, pq_array_t *a, int64_t rows, pq_error *err) {
  if (f->num_children == 0) return assemble_leaf(r, f, a, rows, err);
  for (int i = 0; i < f->num_children; i++) {
    int rc = assemble(r, &f->children[i], &a->children[i], rows, err);
    if (rc) return rc;
  }
  levels lv;
  leaf_levels_of(r, f, &lv);
  int64_t nulls;
  int64_t slots = build_validity(f, &lv, a, rows, &nulls);
  if (slots < 0) return field_fail(r, f, err, LARDER_ENOMEM, "out of memory");
  a->length = slots;
  a->null_count = nulls;
  if (f->type == LARDER_TYPE_STRUCT) {
    for (int i = 0; i < f->num_children; i++)
      if (a->children[i].length != slots)
        return field_fail(r, f, err, LARDER_ECORRUPT,
                          "the struct's columns disagree on its number of values");
    return 0;
  }
  /* LIST or MAP: offsets count the elements each slot opens. */
  if (pq_buf_reserve(&a->offsets, ((size_t)slots + 1) * 4))
    return field_fail(r, f, err, LARDER_ENOMEM, "out of memory");
  int32_t *off = (int32_t *)(void *)a->offsets.data;
  int64_t k = 0, count = 0;
  if (lv.n > INT32_MAX)
    return field_fail(r, f, err, LARDER_ELIMIT, "more than 2^31 list elements in one batch");
  if (lv.def == NULL && f->elem_rep >= lv.max_rep) {
    /* No nulls or empty lists on the path and no deeper lists: every entry
     * is an element, so a slot's offset is its entry's index. */
    const uint16_t *rep = lv.rep;
    int16_t srep = f->slot_rep;
    for (int64_t j = 0; j < lv.n; j++)
      if (rep[j] <= srep) off[k++] = (int32_t)j;
    count = lv.n;
  } else {
    for (int64_t j = 0; j < lv.n; j++) {
      if (is_slot(&lv, j, f->slot_def, f->slot_rep)) off[k++] = (int32_t)count;
      if (is_slot(&lv, j, f->elem_def, f->elem_rep)) count++;
    }
  }
  if (k != slots)
    return field_fail(r, f, err, LARDER_ECORRUPT, "the list's levels are inconsistent");
  off[k] = (int32_t)count;
  a->offsets.len = ((size_t)slots + 1) * 4;
  if (a->children[0].length != count)
    return field_fail(r, f, err, LARDER_ECORRUPT, "the list's levels disagree with its elements");
  return 0;
}

int64_t pq_reader_next(pq_reader *r, int64_t max_rows, pq_batch_t *out, pq_error *err) {
  if (r->failed)
    return pq_error_set(err, LARDER_EINVAL, "%s: row group %d: reader used after an error",
                        r->file->name, r->rg);
  int64_t rows = max_rows < r->rows_left ? max_rows : r->rows_left;
  const pq_field_t *root = pq_projection_schema(r->proj);
  if (batch_shape(out, root))
    return pq_error_set(err, LARDER_ENOMEM, "%s: row group %d: out of memory", r->file->name,
                        r->rg);
  out->num_rows = 0;
  if (rows <= 0) {
    for (int i = 0; i < out->num_columns; i++) out->columns[i].length = 0;
    return 0;
  }
  pq_guard_t guard;
  if (r->src->may_fault && PQ_GUARD_FAULTED(&guard)) {
    r->failed = 1;
    return pq_error_set(err, LARDER_EIO,
                        "%s: column '%s', row group %d: the file was truncated or changed "
                        "while being read",
                        r->file->name, r->at ? r->at : "?", r->rg);
  }
  for (int i = 0; i < root->num_children; i++) {
    r->at = root->children[i].name;
    int rc = assemble(r, &root->children[i], &out->columns[i], rows, err);
    if (rc) {
      r->failed = 1;
      if (r->src->may_fault) pq_guard_pop(&guard);
      return rc;
    }
  }
  if (r->src->may_fault) pq_guard_pop(&guard);
  out->num_rows = rows;
  r->rows_left -= rows;
  return rows;
}

int pq_reader_set_row_group(pq_reader *r, int rg, pq_error *err) {
  const pq_file_meta_t *meta = &r->file->meta;
  if (rg < 0 || rg >= meta->num_row_groups)
    return pq_error_set(err, LARDER_EINVAL, "%s: no row group %d", r->file->name, rg);
  r->rg = rg;
  r->rows_left = meta->row_groups[rg].num_rows;
  r->failed = 0;
  for (int i = 0; i < r->num_leaves; i++) {
    if (r->leaves[i] == NULL) continue;
    int rc = pq_leaf_reset(r->leaves[i], rg, err);
    if (rc) {
      r->failed = 1;
      return rc;
    }
  }
  return 0;
}

static int64_t skip_guarded(pq_reader *r, const int64_t rows, pq_error *err);

int64_t pq_reader_skip(pq_reader *r, int64_t rows, pq_error *err) {
  if (r->failed)
    return pq_error_set(err, LARDER_EINVAL, "%s: row group %d: reader used after an error",
                        r->file->name, r->rg);
  if (rows > r->rows_left) rows = r->rows_left;
  if (rows <= 0) return 0;
  return skip_guarded(r, rows, err);
}

/* Separate from pq_reader_skip so that nothing the guard's sigsetjmp saves
 * is modified after it. */
static int64_t skip_guarded(pq_reader *r, const int64_t rows, pq_error *err) {
  pq_guard_t guard;
  if (r->src->may_fault && PQ_GUARD_FAULTED(&guard)) {
    r->failed = 1;
    return pq_error_set(err, LARDER_EIO,
                        "%s: column '%s', row group %d: the file was truncated or changed "
                        "while being read",
                        r->file->name, r->at ? r->at : "?", r->rg);
  }
  /* Each column skips on its own: whole pages where it can, the rest by
   * decoding and dropping. */
  for (int i = 0; i < r->num_leaves; i++) {
    if (r->leaves[i] == NULL) continue;
    r->at = r->file->meta.leaves[i]->path;
    int64_t n = pq_leaf_skip(r->leaves[i], rows, err);
    if (n != rows) {
      r->failed = 1;
      if (r->src->may_fault) pq_guard_pop(&guard);
      if (n >= 0)
        return pq_error_set(err, LARDER_ECORRUPT,
                            "%s: column '%s', row group %d: fewer rows than the row group "
                            "declares",
                            r->file->name, r->file->meta.leaves[i]->path, r->rg);
      return n;
    }
  }
  if (r->src->may_fault) pq_guard_pop(&guard);
  r->rows_left -= rows;
  return rows;
}
