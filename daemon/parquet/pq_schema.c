/*
 * pq_schema.c: derives the serving schema (Arrow-like pq_field_t trees) from
 * the Parquet schema tree, and resolves column projections.
 *
 * The derivation follows LogicalTypes.md, including its backward
 * compatibility rules for lists and maps written by older tools: two-level
 * lists, repeated fields without a LIST annotation, lists whose repeated
 * group is itself the element ("array", "<name>_tuple", several fields),
 * and maps annotated only with MAP_KEY_VALUE.  Each field also records the
 * Dremel thresholds that the assembler needs (see pq_assemble.c):
 *   def_level  a slot's value is present when its definition level >= this;
 *   slot_def/slot_rep  an entry opens a slot of this field when
 *              def >= slot_def and rep <= slot_rep (set by the parent);
 *   elem_def/elem_rep  LIST and MAP: an entry opens an element when
 *              def >= elem_def and rep <= elem_rep.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/pq_internal.h"

typedef struct schema_builder {
  pq_arena_t *arena;
  int failed;
} schema_builder;

static void *sb_alloc(schema_builder *sb, size_t size) {
  void *p = pq_arena_alloc(sb->arena, size);
  if (p == NULL) sb->failed = 1;
  return p;
}

static int is_group(const pq_schema_node_t *n) { return n->physical == PQ_PHYSICAL_NONE; }

static void make_field(schema_builder *sb, const pq_schema_node_t *n, pq_field_t *out, int consumed,
                       int16_t slot_def, int16_t slot_rep);

/* Sets a primitive field's type from its physical and logical types.  A
 * logical type that does not fit the physical type is ignored, so the
 * column still reads as its physical type. */
static void primitive_type(const pq_schema_node_t *n, pq_field_t *f) {
  const pq_logical_t *lt = &n->logical;
  f->type = LARDER_TYPE_NULL;
  if (lt->kind == PQ_LT_UNKNOWN) return; /* NullType: always null */
  if (lt->kind == PQ_LT_DECIMAL) {
    int32_t p = lt->precision, s = lt->scale;
    int max_bytes = n->physical == PQ_INT32                  ? 4
                    : n->physical == PQ_INT64                ? 8
                    : n->physical == PQ_FIXED_LEN_BYTE_ARRAY ? n->type_length
                    : n->physical == PQ_BYTE_ARRAY           ? 32
                                                             : 0;
    if (max_bytes > 0 && max_bytes <= 32 && p >= 1 && p <= 76 && s >= 0 && s <= p) {
      f->precision = p;
      f->scale = s;
      if (p <= 38 && max_bytes <= 16) {
        f->type = LARDER_TYPE_DECIMAL128;
        f->byte_width = 16;
      } else {
        f->type = LARDER_TYPE_DECIMAL256;
        f->byte_width = 32;
      }
      return;
    }
  }
  switch (n->physical) {
    case PQ_BOOLEAN: f->type = LARDER_TYPE_BOOL; return;
    case PQ_INT32:
      f->type = LARDER_TYPE_INT32;
      if (lt->kind == PQ_LT_INTEGER) {
        if (lt->bit_width == 8) f->type = lt->is_signed ? LARDER_TYPE_INT8 : LARDER_TYPE_UINT8;
        else if (lt->bit_width == 16)
          f->type = lt->is_signed ? LARDER_TYPE_INT16 : LARDER_TYPE_UINT16;
        else if (lt->bit_width == 32 && !lt->is_signed) f->type = LARDER_TYPE_UINT32;
      } else if (lt->kind == PQ_LT_DATE) {
        f->type = LARDER_TYPE_DATE32;
      } else if (lt->kind == PQ_LT_TIME && lt->unit == LARDER_UNIT_MILLI) {
        f->type = LARDER_TYPE_TIME32;
        f->unit = LARDER_UNIT_MILLI;
        f->utc = lt->utc;
      }
      return;
    case PQ_INT64:
      f->type = LARDER_TYPE_INT64;
      if (lt->kind == PQ_LT_INTEGER && lt->bit_width == 64 && !lt->is_signed) {
        f->type = LARDER_TYPE_UINT64;
      } else if (lt->kind == PQ_LT_TIME && lt->unit != LARDER_UNIT_MILLI) {
        f->type = LARDER_TYPE_TIME64;
        f->unit = lt->unit;
        f->utc = lt->utc;
      } else if (lt->kind == PQ_LT_TIMESTAMP) {
        f->type = LARDER_TYPE_TIMESTAMP;
        f->unit = lt->unit;
        f->utc = lt->utc;
      }
      return;
    case PQ_INT96:
      f->type = LARDER_TYPE_TIMESTAMP;
      f->unit = LARDER_UNIT_NANO;
      f->from_int96 = 1;
      return;
    case PQ_FLOAT: f->type = LARDER_TYPE_FLOAT32; return;
    case PQ_DOUBLE: f->type = LARDER_TYPE_FLOAT64; return;
    case PQ_BYTE_ARRAY:
      f->type = (lt->kind == PQ_LT_STRING || lt->kind == PQ_LT_ENUM || lt->kind == PQ_LT_JSON)
                    ? LARDER_TYPE_STRING
                    : LARDER_TYPE_BINARY;
      return;
    case PQ_FIXED_LEN_BYTE_ARRAY:
      if (lt->kind == PQ_LT_FLOAT16 && n->type_length == 2) {
        f->type = LARDER_TYPE_FLOAT16;
        f->byte_width = 2;
      } else {
        f->type = LARDER_TYPE_FIXED_BINARY;
        f->byte_width = n->type_length;
      }
      return;
    default: return;
  }
}

static void make_struct(schema_builder *sb, const pq_schema_node_t *n, pq_field_t *out) {
  out->type = LARDER_TYPE_STRUCT;
  out->num_children = n->num_children;
  out->children =
      n->num_children ? sb_alloc(sb, (size_t)n->num_children * sizeof(pq_field_t)) : NULL;
  if (n->num_children && out->children == NULL) return;
  for (int i = 0; i < n->num_children; i++)
    make_field(sb, &n->children[i], &out->children[i], 0, out->slot_def, out->slot_rep);
}

static int valid_list(const pq_schema_node_t *n) {
  return is_group(n) && n->num_children == 1 && n->children[0].repetition == PQ_REPEATED;
}

static void make_list(schema_builder *sb, const pq_schema_node_t *n, pq_field_t *out) {
  const pq_schema_node_t *r = &n->children[0];
  out->type = LARDER_TYPE_LIST;
  out->elem_def = r->def_level;
  out->elem_rep = r->rep_level;
  out->num_children = 1;
  out->children = sb_alloc(sb, sizeof(pq_field_t));
  if (out->children == NULL) return;
  size_t nlen = strlen(n->name);
  int tuple = strlen(r->name) == nlen + 6 && strncmp(r->name, n->name, nlen) == 0 &&
              strcmp(r->name + nlen, "_tuple") == 0;
  if (!is_group(r) || r->num_children != 1 || strcmp(r->name, "array") == 0 || tuple) {
    /* The repeated field itself is the element. */
    make_field(sb, r, &out->children[0], 1, out->elem_def, out->elem_rep);
  } else {
    make_field(sb, &r->children[0], &out->children[0], 0, out->elem_def, out->elem_rep);
  }
}

static void make_map(schema_builder *sb, const pq_schema_node_t *n, pq_field_t *out) {
  const pq_schema_node_t *kv = &n->children[0];
  out->elem_def = kv->def_level;
  out->elem_rep = kv->rep_level;
  if (!is_group(kv) || kv->num_children != 2) {
    /* A map without values (or a malformed one) reads as the list of its
     * entries: of the keys alone when there is only a key. */
    out->type = LARDER_TYPE_LIST;
    out->num_children = 1;
    out->children = sb_alloc(sb, sizeof(pq_field_t));
    if (out->children == NULL) return;
    if (is_group(kv) && kv->num_children == 1)
      make_field(sb, &kv->children[0], &out->children[0], 0, out->elem_def, out->elem_rep);
    else make_field(sb, kv, &out->children[0], 1, out->elem_def, out->elem_rep);
    return;
  }
  out->type = LARDER_TYPE_MAP;
  out->num_children = 1;
  pq_field_t *entries = sb_alloc(sb, sizeof(pq_field_t));
  out->children = entries;
  if (entries == NULL) return;
  entries->name = "entries";
  entries->type = LARDER_TYPE_STRUCT;
  entries->node = kv;
  entries->def_level = kv->def_level;
  entries->slot_def = out->elem_def;
  entries->slot_rep = out->elem_rep;
  entries->num_children = 2;
  entries->children = sb_alloc(sb, 2 * sizeof(pq_field_t));
  if (entries->children == NULL) return;
  for (int i = 0; i < 2; i++) {
    make_field(sb, &kv->children[i], &entries->children[i], 0, out->elem_def, out->elem_rep);
    entries->children[i].name = i == 0 ? "key" : "value";
  }
}

static void make_field(schema_builder *sb, const pq_schema_node_t *n, pq_field_t *out, int consumed,
                       int16_t slot_def, int16_t slot_rep) {
  memset(out, 0, sizeof(*out));
  out->name = n->name;
  out->node = n;
  out->slot_def = slot_def;
  out->slot_rep = slot_rep;
  if (n->repetition == PQ_REPEATED && !consumed) {
    /* A repeated field outside a LIST annotation is a required list of
     * required elements. */
    out->type = LARDER_TYPE_LIST;
    out->nullable = 0;
    out->def_level = (int16_t)(n->def_level - 1);
    out->elem_def = n->def_level;
    out->elem_rep = n->rep_level;
    out->num_children = 1;
    out->children = sb_alloc(sb, sizeof(pq_field_t));
    if (out->children == NULL) return;
    make_field(sb, n, &out->children[0], 1, out->elem_def, out->elem_rep);
    return;
  }
  out->nullable = !consumed && n->repetition == PQ_OPTIONAL;
  out->def_level = n->def_level;
  if (!is_group(n)) {
    primitive_type(n, out);
    return;
  }
  pq_logical_kind_t k = n->logical.kind;
  if (k == PQ_LT_LIST && valid_list(n)) {
    make_list(sb, n, out);
  } else if ((k == PQ_LT_MAP || k == PQ_LT_MAP_KEY_VALUE) && valid_list(n)) {
    make_map(sb, n, out);
  } else {
    make_struct(sb, n, out);
  }
}

/* Numbers leaves in schema order and records, for each field, the first
 * leaf below it and how many there are. */
static void number_leaves(pq_field_t *f) {
  if (f->num_children == 0) {
    f->first_leaf = f->node->leaf_index;
    f->num_leaves = f->node->leaf_index >= 0 ? 1 : 0;
    if (f->node->leaf_index < 0) {
      /* An empty group: a struct with no fields.  It has no leaf to carry
       * its levels, so it is always null. */
      f->first_leaf = -1;
    }
    return;
  }
  f->first_leaf = -1;
  f->num_leaves = 0;
  for (int i = 0; i < f->num_children; i++) {
    number_leaves(&f->children[i]);
    if (f->first_leaf < 0) f->first_leaf = f->children[i].first_leaf;
    f->num_leaves += f->children[i].num_leaves;
  }
}

int pq_schema_build(struct pq_file *f, pq_error *err) {
  schema_builder sb = {&f->arena, 0};
  pq_field_t *root = sb_alloc(&sb, sizeof(pq_field_t));
  if (root == NULL) return pq_error_set(err, LARDER_ELIMIT, "%s: schema too large", f->name);
  root->name = f->meta.root->name;
  root->node = f->meta.root;
  make_struct(&sb, f->meta.root, root);
  if (sb.failed) return pq_error_set(err, LARDER_ELIMIT, "%s: schema too large", f->name);
  number_leaves(root);
  f->meta.schema = root;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Projection                                                                */

struct pq_projection {
  const pq_file *file;
  pq_arena_t arena;
  pq_field_t *root;
  uint8_t *leaf_selected;
  int num_selected;
};

enum { SEL_NONE = 0, SEL_PART = 1, SEL_ALL = 2 };

typedef struct sel_node {
  int state;
  struct sel_node *children;
} sel_node;

static sel_node *sel_children(pq_arena_t *arena, sel_node *s, int n) {
  if (s->children == NULL && n > 0)
    s->children = pq_arena_alloc(arena, (size_t)n * sizeof(sel_node));
  return s->children;
}

/* Marks the field named by path below f (whose selection state is s).
 * Returns 0, -1 when nothing matches, -2 when out of memory. */
static int select_path(pq_arena_t *arena, const pq_field_t *f, sel_node *s, const char *path) {
  if (s->state == SEL_ALL) return 0;
  if (*path == '\0') {
    s->state = SEL_ALL;
    return 0;
  }
  if (f->num_children == 0) return -1;
  /* Inside a map everything is selected together: a map needs its keys and
   * values both. */
  if (f->type == LARDER_TYPE_MAP) {
    s->state = SEL_ALL;
    return 0;
  }
  sel_node *kids = sel_children(arena, s, f->num_children);
  if (kids == NULL) return -2;
  /* Match the longest child name that is a prefix of the path at a dot
   * boundary, so that names containing dots still resolve. */
  int best = -1;
  size_t best_len = 0;
  for (int i = 0; i < f->num_children; i++) {
    const char *name = f->children[i].name;
    size_t len = strlen(name);
    if (strncmp(path, name, len) == 0 && (path[len] == '\0' || path[len] == '.') &&
        (best < 0 || len > best_len)) {
      best = i;
      best_len = len;
    }
  }
  if (best >= 0) {
    const char *rest = path + best_len;
    if (*rest == '.') rest++;
    int rc = select_path(arena, &f->children[best], &kids[best], rest);
    if (rc == 0 && s->state == SEL_NONE) s->state = SEL_PART;
    return rc;
  }
  /* Lists are transparent: "a.b" reaches field b of a list of structs a. */
  if (f->type == LARDER_TYPE_LIST || f->type == LARDER_TYPE_LARGE_LIST) {
    int rc = select_path(arena, &f->children[0], &kids[0], path);
    if (rc == 0 && s->state == SEL_NONE) s->state = SEL_PART;
    return rc;
  }
  return -1;
}

static int copy_selected(pq_projection *proj, const pq_field_t *f, const sel_node *s,
                         pq_field_t *out) {
  *out = *f;
  if (f->num_children == 0 || s->state == SEL_ALL) {
    /* Whole subtrees are shared with the file's schema. */
    return 0;
  }
  int n = 0;
  for (int i = 0; i < f->num_children; i++)
    if (s->children && s->children[i].state != SEL_NONE) n++;
  out->num_children = n;
  out->children = pq_arena_alloc(&proj->arena, (size_t)(n ? n : 1) * sizeof(pq_field_t));
  if (out->children == NULL) return -2;
  int j = 0;
  out->first_leaf = -1;
  out->num_leaves = 0;
  for (int i = 0; i < f->num_children; i++) {
    if (s->children == NULL || s->children[i].state == SEL_NONE) continue;
    pq_field_t *c = &out->children[j++];
    if (copy_selected(proj, &f->children[i], &s->children[i], c)) return -2;
    /* The first projected leaf carries this node's levels. */
    if (out->first_leaf < 0) out->first_leaf = c->first_leaf;
    out->num_leaves += c->num_leaves;
  }
  return 0;
}

static void mark_leaves(pq_projection *proj, const pq_field_t *f) {
  if (f->num_children == 0) {
    if (f->node->leaf_index >= 0 && !proj->leaf_selected[f->node->leaf_index]) {
      proj->leaf_selected[f->node->leaf_index] = 1;
      proj->num_selected++;
    }
    return;
  }
  for (int i = 0; i < f->num_children; i++) mark_leaves(proj, &f->children[i]);
}

/* The edit distance between a and b (insertions, deletions, substitutions),
 * or a large number for names of 64 bytes or more. */
static size_t edit_distance(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  if (n >= 64 || m >= 64) return SIZE_MAX;
  size_t row[65];
  for (size_t j = 0; j <= m; j++) row[j] = j;
  for (size_t i = 1; i <= n; i++) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= m; j++) {
      size_t up = row[j];
      size_t best = diag + (a[i - 1] != b[j - 1]);
      if (up + 1 < best) best = up + 1;
      if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
      row[j] = best;
      diag = up;
    }
  }
  return row[m];
}

/* The nearest dotted path to want among the descendants of f (the fields
 * of structs, by name), into best and dist. */
static void nearest_path(const pq_field_t *f, const char *prefix, const char *want, char *best,
                         size_t best_size, size_t *dist) {
  for (int i = 0; i < f->num_children; i++) {
    const pq_field_t *c = &f->children[i];
    char path[256];
    snprintf(path, sizeof(path), "%s%s%s", prefix, *prefix ? "." : "", c->name ? c->name : "");
    size_t d = edit_distance(path, want);
    if (d < *dist) {
      *dist = d;
      snprintf(best, best_size, "%s", path);
    }
    if (c->type == LARDER_TYPE_STRUCT) nearest_path(c, path, want, best, best_size, dist);
  }
}

/* For an unknown column want: " (did you mean 'x'?); the columns are a, b, ..."
 * into hint, the suggestion only when it is close (a third of the name's
 * letters, at least 2). */
static void column_hint(const pq_field_t *schema, const char *want, char *hint, size_t size) {
  char best[256] = "";
  size_t dist = SIZE_MAX, used = 0;
  nearest_path(schema, "", want, best, sizeof(best), &dist);
  size_t len = strlen(want), near = len / 3 > 2 ? len / 3 : 2;
  hint[0] = '\0';
  if (best[0] && dist <= near) used += (size_t)snprintf(hint, size, " (did you mean '%s'?)", best);
  if (used < size) used += (size_t)snprintf(hint + used, size - used, "; the columns are");
  for (int i = 0; i < schema->num_children && used < size; i++) {
    const char *name = schema->children[i].name ? schema->children[i].name : "";
    if (used + strlen(name) + 8 >= size) {
      snprintf(hint + used, size - used, " ...");
      break;
    }
    used += (size_t)snprintf(hint + used, size - used, "%s %s", i ? "," : "", name);
  }
}

int pq_projection_create(const pq_file *file, const char *const *columns, size_t n,
                         pq_projection **out, pq_error *err) {
  *out = NULL;
  pq_projection *proj = calloc(1, sizeof(*proj));
  if (proj == NULL) return pq_error_set(err, LARDER_ENOMEM, "out of memory");
  proj->file = file;
  proj->arena.limit = SIZE_MAX / 4;
  const pq_file_meta_t *meta = &file->meta;
  /* A projection takes a few hundred bytes a leaf.  A stream holds one per
   * file, so a dataset of many small files must not hold a 64 KiB block
   * for each (20,000 files and 4 streams took about 600 MB). */
  size_t want = 1024 + (size_t)meta->num_leaves * 256;
  proj->arena.block_bytes = want > 65536 ? 65536 : want;
  proj->leaf_selected = pq_arena_alloc(&proj->arena, (size_t)meta->num_leaves + 1);
  proj->root = pq_arena_alloc(&proj->arena, sizeof(pq_field_t));
  int rc = 0;
  if (proj->leaf_selected == NULL || proj->root == NULL) {
    rc = pq_error_set(err, LARDER_ENOMEM, "out of memory");
    goto fail;
  }
  if (n == 0) {
    *proj->root = *meta->schema;
  } else {
    sel_node top = {SEL_PART, NULL};
    for (size_t i = 0; i < n; i++) {
      int r = select_path(&proj->arena, meta->schema, &top, columns[i]);
      if (r == -2) {
        rc = pq_error_set(err, LARDER_ENOMEM, "out of memory");
        goto fail;
      }
      if (r != 0 || columns[i][0] == '\0') {
        char hint[400];
        column_hint(meta->schema, columns[i], hint, sizeof(hint));
        rc = pq_error_set(err, LARDER_ENOENT, "%s: no column named '%s'%s", file->name, columns[i],
                          hint);
        goto fail;
      }
    }
    if (copy_selected(proj, meta->schema, &top, proj->root)) {
      rc = pq_error_set(err, LARDER_ENOMEM, "out of memory");
      goto fail;
    }
  }
  /* Copied nodes got their leaf numbers in copy_selected; shared subtrees
   * keep the file schema's, which nothing writes to after pq_file_open. */
  mark_leaves(proj, proj->root);
  *out = proj;
  return 0;
fail:
  pq_projection_free(proj);
  return rc;
}

void pq_projection_free(pq_projection *proj) {
  if (proj == NULL) return;
  pq_arena_free(&proj->arena);
  free(proj);
}

const pq_field_t *pq_projection_schema(const pq_projection *proj) { return proj->root; }

int pq_projection_num_leaves(const pq_projection *proj) { return proj->num_selected; }

int pq_projection_has_leaf(const pq_projection *proj, int leaf_index) {
  if (leaf_index < 0 || leaf_index >= proj->file->meta.num_leaves) return 0;
  return proj->leaf_selected[leaf_index];
}

static int cmp_range(const void *a, const void *b) {
  const pq_range_t *x = a, *y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int pq_projection_ranges(const pq_file *file, const pq_projection *proj, int rg,
                         pq_range_t **ranges, pq_error *err) {
  const pq_file_meta_t *meta = &file->meta;
  *ranges = NULL;
  if (rg >= meta->num_row_groups)
    return pq_error_set(err, LARDER_EINVAL, "%s: no row group %d", file->name, rg);
  int first = rg < 0 ? 0 : rg, last = rg < 0 ? meta->num_row_groups - 1 : rg;
  size_t cap = (size_t)(last - first + 1) * (size_t)(proj->num_selected ? proj->num_selected : 1);
  pq_range_t *r = malloc(cap * sizeof(*r));
  if (r == NULL) return pq_error_set(err, LARDER_ENOMEM, "out of memory");
  size_t n = 0;
  for (int g = first; g <= last; g++) {
    for (int c = 0; c < meta->num_leaves; c++) {
      if (!proj->leaf_selected[c]) continue;
      const pq_column_chunk_t *cc = &meta->row_groups[g].columns[c];
      r[n].offset = cc->range_offset;
      r[n].length = cc->range_length;
      n++;
    }
  }
  qsort(r, n, sizeof(*r), cmp_range);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (m > 0 && r[i].offset < r[m - 1].offset + r[m - 1].length) {
      uint64_t end = r[i].offset + r[i].length;
      if (end > r[m - 1].offset + r[m - 1].length) r[m - 1].length = end - r[m - 1].offset;
    } else {
      r[m++] = r[i];
    }
  }
  *ranges = r;
  return (int)m;
}

size_t pq_field_value_width(const pq_field_t *f) {
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
    /* primitive_type sets 16 and 32, and a FIXED_BINARY's width comes from
     * a type_length the footer parser keeps within 1 .. 2^24. */
    case LARDER_TYPE_DECIMAL128:
    case LARDER_TYPE_DECIMAL256:
    case LARDER_TYPE_FIXED_BINARY: return (size_t)f->byte_width;
    default: return 0;
  }
}
