/*
 * clustered.c: whether a dataset's rows are grouped by a column's value
 * (clustered.h).
 */
#include "plan/clustered.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "larder.h"

/* How a column's statistics compare (parquet.thrift's ColumnOrder:
 * TypeDefinedOrder). */
typedef enum order_kind {
  K_UNKNOWN = 0, /* no usable order: INT96, FLOAT16, INTERVAL, ... */
  K_BOOL,
  K_I32,
  K_U32,
  K_I64,
  K_U64,
  K_F32,
  K_F64,
  K_BYTES,  /* unsigned lexicographic */
  K_DECIMAL /* big-endian two's complement */
} order_kind_t;

static order_kind_t leaf_order(const pq_schema_node_t *n, int legacy) {
  int unsigned_int = n->logical.kind == PQ_LT_INTEGER && !n->logical.is_signed;
  switch (n->physical) {
    case PQ_BOOLEAN: return K_BOOL;
    /* The deprecated min/max were written in signed order: right for
     * signed integers and floats only. */
    case PQ_INT32: return unsigned_int ? (legacy ? K_UNKNOWN : K_U32) : K_I32;
    case PQ_INT64: return unsigned_int ? (legacy ? K_UNKNOWN : K_U64) : K_I64;
    case PQ_FLOAT: return K_F32;
    case PQ_DOUBLE: return K_F64;
    case PQ_BYTE_ARRAY:
    case PQ_FIXED_LEN_BYTE_ARRAY:
      if (legacy || n->logical.kind == PQ_LT_INTERVAL || n->logical.kind == PQ_LT_FLOAT16)
        return K_UNKNOWN;
      return n->logical.kind == PQ_LT_DECIMAL ? K_DECIMAL : K_BYTES;
    default: return K_UNKNOWN;
  }
}

static size_t kind_width(order_kind_t k) {
  switch (k) {
    case K_BOOL: return 1;
    case K_I32:
    case K_U32:
    case K_F32: return 4;
    case K_I64:
    case K_U64:
    case K_F64: return 8;
    default: return 0; /* any length */
  }
}

typedef struct value {
  const uint8_t *p;
  uint16_t len;
} value_t;

typedef struct interval {
  value_t lo, hi;
} interval_t;

static int cmp_num(double a, double b) { return a < b ? -1 : a > b; }

static int cmp_decimal(const value_t *a, const value_t *b) {
  int na = a->len && (a->p[0] & 0x80), nb = b->len && (b->p[0] & 0x80);
  if (na != nb) return na ? -1 : 1;
  /* Same sign: sign-extend the shorter to the longer, then compare as
   * unsigned bytes. */
  size_t n = a->len > b->len ? a->len : b->len;
  uint8_t ext = na ? 0xff : 0x00;
  for (size_t i = 0; i < n; i++) {
    size_t ia = i + a->len, ib = i + b->len; /* index + len - n, shifted */
    uint8_t x = ia < n ? ext : a->p[ia - n];
    uint8_t y = ib < n ? ext : b->p[ib - n];
    if (x != y) return x < y ? -1 : 1;
  }
  return 0;
}

static int cmp_value(order_kind_t k, const value_t *a, const value_t *b) {
  switch (k) {
    case K_BOOL: return cmp_num(a->p[0] != 0, b->p[0] != 0);
    case K_I32: {
      int32_t x, y;
      memcpy(&x, a->p, 4);
      memcpy(&y, b->p, 4);
      return x < y ? -1 : x > y;
    }
    case K_U32: {
      uint32_t x, y;
      memcpy(&x, a->p, 4);
      memcpy(&y, b->p, 4);
      return x < y ? -1 : x > y;
    }
    case K_I64: {
      int64_t x, y;
      memcpy(&x, a->p, 8);
      memcpy(&y, b->p, 8);
      return x < y ? -1 : x > y;
    }
    case K_U64: {
      uint64_t x, y;
      memcpy(&x, a->p, 8);
      memcpy(&y, b->p, 8);
      return x < y ? -1 : x > y;
    }
    case K_F32: {
      float x, y;
      memcpy(&x, a->p, 4);
      memcpy(&y, b->p, 4);
      return cmp_num(x, y);
    }
    case K_F64: {
      double x, y;
      memcpy(&x, a->p, 8);
      memcpy(&y, b->p, 8);
      return cmp_num(x, y);
    }
    case K_DECIMAL: return cmp_decimal(a, b);
    default: {
      size_t n = a->len < b->len ? a->len : b->len;
      int c = n ? memcmp(a->p, b->p, n) : 0;
      return c ? (c < 0 ? -1 : 1) : (a->len > b->len) - (a->len < b->len);
    }
  }
}

static int is_nan(order_kind_t k, const value_t *v) {
  if (k == K_F32) {
    float x;
    memcpy(&x, v->p, 4);
    return isnan(x);
  }
  if (k == K_F64) {
    double x;
    memcpy(&x, v->p, 8);
    return isnan(x);
  }
  return 0;
}

static int by_lo(const void *a, const void *b, void *ctx) {
  const interval_t *x = a, *y = b;
  return cmp_value(*(const order_kind_t *)ctx, &x->lo, &y->lo);
}

/* What one column's row groups say. */
typedef enum column_state { C_UNKNOWN, C_SPREAD, C_CLUSTERED, C_NO_PAIRS } column_state_t;

/* The row groups with rows, over all files: the i-th is (file, group). */
typedef struct rg_ref {
  uint32_t file, group;
} rg_ref_t;

/*
 * Collects the intervals of leaf `leaf` of the sampled row groups and
 * measures their overlap.  *why names the reason for C_UNKNOWN.
 */
static column_state_t examine(const pq_file *const *files, const rg_ref_t *rgs, size_t nrgs,
                              int leaf, interval_t *iv, double *overlap, const char **why) {
  const pq_file_meta_t *m0 = pq_file_meta(files[0]);
  const pq_schema_node_t *node = m0->leaves[leaf];
  order_kind_t kind = K_UNKNOWN;
  size_t n = 0;
  *why = "has no statistics in some row group";
  for (size_t i = 0; i < nrgs; i++) {
    const pq_file_meta_t *m = pq_file_meta(files[rgs[i].file]);
    if (m->num_leaves != m0->num_leaves || strcmp(m->leaves[leaf]->path, node->path) != 0 ||
        m->leaves[leaf]->physical != node->physical) {
      *why = "differs between files";
      return C_UNKNOWN;
    }
    const pq_column_chunk_t *cc = &m->row_groups[rgs[i].group].columns[leaf];
    if (!cc->has_stats) return C_UNKNOWN;
    if (cc->stat_min == NULL || cc->stat_max == NULL) {
      if (cc->stat_null_count >= 0 && cc->stat_null_count >= cc->num_values) continue; /* nulls */
      return C_UNKNOWN;
    }
    order_kind_t k = leaf_order(node, cc->stat_legacy);
    if (k == K_UNKNOWN || (n > 0 && k != kind)) {
      *why = "has statistics without a defined order";
      return C_UNKNOWN;
    }
    kind = k;
    size_t w = kind_width(k);
    if (w && (cc->stat_min_len != w || cc->stat_max_len != w)) {
      *why = "has malformed statistics";
      return C_UNKNOWN;
    }
    interval_t *v = &iv[n];
    v->lo = (value_t){cc->stat_min, cc->stat_min_len};
    v->hi = (value_t){cc->stat_max, cc->stat_max_len};
    if (is_nan(k, &v->lo) || is_nan(k, &v->hi) || cmp_value(k, &v->lo, &v->hi) > 0) {
      *why = "has malformed statistics";
      return C_UNKNOWN;
    }
    n++;
  }
  if (n < 2) return C_NO_PAIRS;
  qsort_r(iv, n, sizeof(*iv), by_lo, &kind);
  /* Intervals i < j (by minimum) overlap when lo_j <= hi_i: for each i,
   * the ones after it up to the last whose minimum is <= hi_i. */
  double pairs = 0;
  for (size_t i = 0; i + 1 < n; i++) {
    size_t a = i + 1, b = n; /* first index in [i+1, n) with lo > hi_i */
    while (a < b) {
      size_t mid = a + (b - a) / 2;
      if (cmp_value(kind, &iv[mid].lo, &iv[i].hi) <= 0) a = mid + 1;
      else b = mid;
    }
    pairs += (double)(a - i - 1);
  }
  *overlap = pairs / ((double)n * (double)(n - 1) / 2);
  return *overlap < CLUSTERED_OVERLAP ? C_CLUSTERED : C_SPREAD;
}

int clustered_check(const pq_file *const *files, const pq_projection *const *projs, size_t nfiles,
                    clustered_verdict_t *out) {
  memset(out, 0, sizeof(*out));
  out->together = 1;
  if (nfiles == 0) return 0;
  /* The row groups with rows, then an even sample of them. */
  size_t total = 0;
  for (size_t f = 0; f < nfiles; f++) {
    const pq_file_meta_t *m = pq_file_meta(files[f]);
    for (int g = 0; g < m->num_row_groups; g++) total += m->row_groups[g].num_rows > 0;
  }
  if (total < 2) return 0; /* one block: the two orders are the same, nothing to say */
  size_t nrgs = total < CLUSTERED_MAX_ROW_GROUPS ? total : CLUSTERED_MAX_ROW_GROUPS;
  rg_ref_t *rgs = malloc(nrgs * sizeof(*rgs));
  interval_t *iv = malloc(nrgs * sizeof(*iv));
  const pq_file_meta_t *m0 = pq_file_meta(files[0]);
  int nleaves = m0->num_leaves;
  int *order = malloc((size_t)(nleaves ? nleaves : 1) * sizeof(int));
  if (rgs == NULL || iv == NULL || order == NULL) {
    free(rgs);
    free(iv);
    free(order);
    return LARDER_ENOMEM;
  }
  size_t idx = 0, k = 0;
  for (size_t f = 0; f < nfiles && k < nrgs; f++) {
    const pq_file_meta_t *m = pq_file_meta(files[f]);
    for (int g = 0; g < m->num_row_groups && k < nrgs; g++) {
      if (m->row_groups[g].num_rows <= 0) continue;
      /* Row group idx is the k-th sample when idx == floor(k * total / nrgs). */
      if (idx == (size_t)((double)k * (double)total / (double)nrgs)) {
        rgs[k].file = (uint32_t)f;
        rgs[k].group = (uint32_t)g;
        k++;
      }
      idx++;
    }
  }
  nrgs = k;
  /* Projected leaves first, so that the cap leaves out unread columns. */
  int nord = 0;
  for (int pass = 0; pass < 2; pass++)
    for (int l = 0; l < nleaves; l++)
      if ((pq_projection_has_leaf(projs[0], l) != 0) == (pass == 0)) order[nord++] = l;
  int examined = 0, spread = 0;
  const char *unknown_path = NULL, *unknown_why = NULL;
  for (int i = 0; i < nord; i++) {
    int l = order[i];
    int projected = pq_projection_has_leaf(projs[0], l);
    if (examined >= CLUSTERED_MAX_LEAVES) {
      if (projected && unknown_path == NULL) {
        unknown_path = m0->leaves[l]->path;
        unknown_why = "lies past the columns examined";
      }
      continue;
    }
    examined++;
    double overlap = 1;
    const char *why;
    column_state_t st = examine(files, rgs, nrgs, l, iv, &overlap, &why);
    if (st == C_CLUSTERED) {
      snprintf(out->note, sizeof(out->note),
               "units mixed singly in the shuffle (shuffle_row_groups = auto): the rows are "
               "sorted or grouped by column '%.64s' (%.0f%% of pairs of row groups overlap in "
               "it); shuffle_row_groups = true streams a cold remote epoch faster if that "
               "order does not matter",
               m0->leaves[l]->path, overlap * 100);
      out->together = 0;
      break;
    }
    if (st == C_SPREAD) spread++;
    if (st == C_UNKNOWN && projected && unknown_path == NULL) {
      unknown_path = m0->leaves[l]->path;
      unknown_why = why;
    }
  }
  if (out->together && unknown_path) {
    snprintf(out->note, sizeof(out->note),
             "units mixed singly in the shuffle (shuffle_row_groups = auto): column '%.64s' "
             "%s, so larder cannot tell whether the rows are sorted by it",
             unknown_path, unknown_why);
    out->together = 0;
  } else if (out->together) {
    snprintf(out->note, sizeof(out->note),
             "row groups kept together in the shuffle (shuffle_row_groups = auto): no column "
             "is sorted or grouped across the row groups (%d columns' statistics over %zu row "
             "groups), so a cold remote epoch streams; shuffle_row_groups = false mixes units "
             "singly",
             spread, nrgs);
  }
  free(rgs);
  free(iv);
  free(order);
  return 0;
}
