/*
 * pq_meta.c: the Parquet footer.  Parses the Thrift FileMetaData into the
 * pq_file_meta_t tree, checks it against the file's real size, and parses
 * page headers for the column reader.
 *
 * The footer is untrusted: every count is bounded by the bytes that carry
 * it, every offset is checked against the file, and all memory comes from
 * one arena whose limit is a fixed multiple of the footer's size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/pq_internal.h"

/* Schemas deeper than this are rejected.  Real schemas nest a handful of
 * levels; the limit keeps recursion and level arithmetic small. */
#define PQ_MAX_SCHEMA_DEPTH 100

/* The arena may hold this many times the footer's bytes.  Parsed structs are
 * a few times larger than their Thrift encoding, never 32 times. */
#define PQ_ARENA_FACTOR 32
#define PQ_ARENA_MIN (16u << 20)

/* The fewest bytes a data page can take: its header alone, in Thrift's
 * compact encoding, holds the page type, both sizes (a field header and a
 * varint each) and the page's own header struct with its value count, and
 * the structs' stop bytes: at least 11 bytes; 8 leaves room for any
 * writer's quirks. */
#define PQ_MIN_PAGE_BYTES 8

typedef struct flat_element {
  const uint8_t *name;
  size_t name_len;
  int physical;
  int32_t type_length;
  int repetition; /* -1 when absent */
  int32_t num_children;
  int converted;
  int32_t scale, precision, field_id;
  int has_num_children;
  pq_logical_t logical;
} flat_element;

typedef struct meta_parser {
  pq_thrift_t t;
  pq_arena_t *arena;
  pq_file_meta_t *meta;
  flat_element *elements;
  int64_t num_elements;
  int oom;
  int unsupported;
  char why[200];
} meta_parser;

static void *arena_alloc(meta_parser *mp, size_t size) {
  void *p = pq_arena_alloc(mp->arena, size);
  if (p == NULL && !mp->oom) {
    mp->oom = 1;
    pq_thrift_fail(&mp->t, "metadata needs more memory than its size allows");
  }
  return p;
}

static void fail_unsupported(meta_parser *mp, const char *why) {
  if (!mp->unsupported) {
    mp->unsupported = 1;
    snprintf(mp->why, sizeof(mp->why), "%s", why);
  }
  pq_thrift_fail(&mp->t, why);
}

static int32_t read_i32(pq_thrift_t *t, int type) {
  int64_t v = pq_thrift_int(t, type);
  if (v < INT32_MIN || v > INT32_MAX) {
    pq_thrift_fail(t, "32-bit field out of range");
    return 0;
  }
  return (int32_t)v;
}

static larder_time_unit_t parse_time_unit(pq_thrift_t *t) {
  int16_t last, id;
  int type;
  larder_time_unit_t unit = LARDER_UNIT_MILLI;
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    if (id == 1) unit = LARDER_UNIT_MILLI;
    else if (id == 2) unit = LARDER_UNIT_MICRO;
    else if (id == 3) unit = LARDER_UNIT_NANO;
    pq_thrift_skip(t, type);
  }
  pq_thrift_struct_end(t);
  return unit;
}

/* Parses the LogicalType union.  An unknown member leaves kind NONE, so the
 * column falls back to its physical type. */
static void parse_logical(pq_thrift_t *t, pq_logical_t *lt) {
  int16_t last, id;
  int type;
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    if (type != PQ_TT_STRUCT) {
      pq_thrift_skip(t, type);
      continue;
    }
    int16_t l2, id2;
    int t2;
    switch (id) {
      case PQ_LT_STRING:
      case PQ_LT_MAP:
      case PQ_LT_LIST:
      case PQ_LT_ENUM:
      case PQ_LT_DATE:
      case PQ_LT_UNKNOWN:
      case PQ_LT_JSON:
      case PQ_LT_BSON:
      case PQ_LT_UUID:
      case PQ_LT_FLOAT16:
        lt->kind = (pq_logical_kind_t)id;
        pq_thrift_skip(t, type);
        break;
      case PQ_LT_DECIMAL:
        lt->kind = PQ_LT_DECIMAL;
        pq_thrift_struct_begin(t, &l2);
        while (pq_thrift_field(t, &l2, &id2, &t2)) {
          if (id2 == 1) lt->scale = read_i32(t, t2);
          else if (id2 == 2) lt->precision = read_i32(t, t2);
          else pq_thrift_skip(t, t2);
        }
        pq_thrift_struct_end(t);
        break;
      case PQ_LT_TIME:
      case PQ_LT_TIMESTAMP:
        lt->kind = (pq_logical_kind_t)id;
        pq_thrift_struct_begin(t, &l2);
        while (pq_thrift_field(t, &l2, &id2, &t2)) {
          if (id2 == 1) lt->utc = pq_thrift_bool(t2);
          else if (id2 == 2 && t2 == PQ_TT_STRUCT) lt->unit = parse_time_unit(t);
          else pq_thrift_skip(t, t2);
        }
        pq_thrift_struct_end(t);
        break;
      case PQ_LT_INTEGER:
        lt->kind = PQ_LT_INTEGER;
        pq_thrift_struct_begin(t, &l2);
        while (pq_thrift_field(t, &l2, &id2, &t2)) {
          if (id2 == 1) lt->bit_width = (int)pq_thrift_int(t, t2);
          else if (id2 == 2) lt->is_signed = pq_thrift_bool(t2);
          else pq_thrift_skip(t, t2);
        }
        pq_thrift_struct_end(t);
        break;
      default:
        /* VARIANT, GEOMETRY and newer kinds read as their physical type. */
        pq_thrift_skip(t, type);
        break;
    }
  }
  pq_thrift_struct_end(t);
}

static void parse_schema_element(meta_parser *mp, flat_element *e) {
  pq_thrift_t *t = &mp->t;
  int16_t last, id;
  int type;
  e->physical = PQ_PHYSICAL_NONE;
  e->repetition = -1;
  e->converted = -1;
  e->field_id = -1;
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    switch (id) {
      case 1: e->physical = read_i32(t, type); break;
      case 2: e->type_length = read_i32(t, type); break;
      case 3: e->repetition = read_i32(t, type); break;
      case 4: e->name = pq_thrift_binary(t, type, &e->name_len); break;
      case 5:
        e->num_children = read_i32(t, type);
        e->has_num_children = 1;
        break;
      case 6: e->converted = read_i32(t, type); break;
      case 7: e->scale = read_i32(t, type); break;
      case 8: e->precision = read_i32(t, type); break;
      case 9: e->field_id = read_i32(t, type); break;
      case 10:
        if (type == PQ_TT_STRUCT) parse_logical(t, &e->logical);
        else pq_thrift_skip(t, type);
        break;
      default: pq_thrift_skip(t, type); break;
    }
  }
  pq_thrift_struct_end(t);
}

static void parse_kv_list(meta_parser *mp, int type, int *count, pq_kv_t **out) {
  pq_thrift_t *t = &mp->t;
  int et;
  int64_t n = pq_thrift_list(t, type, &et);
  if (n > 0 && et != PQ_TT_STRUCT) {
    pq_thrift_fail(t, "key-value metadata is not a list of structs");
    return;
  }
  pq_kv_t *kv = n ? arena_alloc(mp, (size_t)n * sizeof(*kv)) : NULL;
  if (n && kv == NULL) return;
  for (int64_t i = 0; i < n && !t->failed; i++) {
    int16_t last, id;
    int ft;
    pq_thrift_struct_begin(t, &last);
    while (pq_thrift_field(t, &last, &id, &ft)) {
      size_t len;
      const uint8_t *s;
      if (id == 1 || id == 2) {
        s = pq_thrift_binary(t, ft, &len);
        if (s == NULL) break;
        char *copy = pq_arena_strndup(mp->arena, (const char *)s, len);
        if (copy == NULL) {
          (void)arena_alloc(mp, SIZE_MAX / 2); /* records the failure */
          break;
        }
        if (id == 1) kv[i].key = copy;
        else kv[i].value = copy;
      } else {
        pq_thrift_skip(t, ft);
      }
    }
    pq_thrift_struct_end(t);
    if (kv[i].key == NULL && !t->failed) kv[i].key = "";
  }
  *count = (int)n;
  *out = kv;
}

/* A copy of at most PQ_STAT_BYTES bytes of a statistics value in the arena;
 * sets *cut when the value was longer. */
static const uint8_t *stat_copy(meta_parser *mp, const uint8_t *s, size_t len, uint16_t *out_len,
                                uint8_t *cut) {
  if (len > PQ_STAT_BYTES) {
    len = PQ_STAT_BYTES;
    if (cut) *cut = 1;
  }
  uint8_t *copy = arena_alloc(mp, len ? len : 1);
  if (copy == NULL) return NULL;
  memcpy(copy, s, len);
  *out_len = (uint16_t)len;
  return copy;
}

/* Statistics: min_value/max_value (6/5) win over the deprecated min/max
 * (2/1), whichever order the writer put them in. */
static void parse_statistics(meta_parser *mp, pq_column_chunk_t *cc) {
  pq_thrift_t *t = &mp->t;
  int16_t last, id;
  int type;
  const uint8_t *v[7] = {0};
  size_t len[7] = {0};
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    if (id == 1 || id == 2 || id == 5 || id == 6) {
      v[id] = pq_thrift_binary(t, type, &len[id]);
    } else if (id == 3) {
      cc->stat_null_count = pq_thrift_int(t, type);
    } else {
      pq_thrift_skip(t, type);
    }
  }
  pq_thrift_struct_end(t);
  if (t->failed) return;
  int modern = v[5] != NULL || v[6] != NULL;
  const uint8_t *mn = modern ? v[6] : v[2], *mx = modern ? v[5] : v[1];
  size_t mnl = modern ? len[6] : len[2], mxl = modern ? len[5] : len[1];
  cc->has_stats = 1;
  cc->stat_legacy = !modern && (mn != NULL || mx != NULL);
  if (mn) cc->stat_min = stat_copy(mp, mn, mnl, &cc->stat_min_len, NULL);
  if (mx) cc->stat_max = stat_copy(mp, mx, mxl, &cc->stat_max_len, &cc->stat_max_cut);
}

static void parse_column_meta(meta_parser *mp, pq_column_chunk_t *cc, int *physical) {
  pq_thrift_t *t = &mp->t;
  int16_t last, id;
  int type;
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    switch (id) {
      case 1: *physical = read_i32(t, type); break;
      case 2: {
        int et;
        int64_t n = pq_thrift_list(t, type, &et);
        for (int64_t i = 0; i < n && !t->failed; i++) {
          int64_t e = pq_thrift_int(t, et);
          if (e >= 0 && e < 32) cc->encodings |= 1u << e;
        }
        break;
      }
      case 4: cc->codec = (pq_codec_t)read_i32(t, type); break;
      case 5: cc->num_values = pq_thrift_int(t, type); break;
      case 6: cc->total_uncompressed_size = pq_thrift_int(t, type); break;
      case 7: cc->total_compressed_size = pq_thrift_int(t, type); break;
      case 9: cc->data_page_offset = pq_thrift_int(t, type); break;
      case 11: cc->dictionary_page_offset = pq_thrift_int(t, type); break;
      case 12:
        if (type == PQ_TT_STRUCT) parse_statistics(mp, cc);
        else pq_thrift_skip(t, type);
        break;
      default: pq_thrift_skip(t, type); break;
    }
  }
  pq_thrift_struct_end(t);
}

static void parse_column_chunk(meta_parser *mp, pq_column_chunk_t *cc, int *physical,
                               int *has_meta) {
  pq_thrift_t *t = &mp->t;
  int16_t last, id;
  int type;
  cc->dictionary_page_offset = -1;
  cc->stat_null_count = -1;
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    switch (id) {
      case 1: fail_unsupported(mp, "column chunks stored in other files"); break;
      case 3:
        if (type == PQ_TT_STRUCT) {
          parse_column_meta(mp, cc, physical);
          *has_meta = 1;
        } else {
          pq_thrift_skip(t, type);
        }
        break;
      case 8:
      case 9: fail_unsupported(mp, "encrypted columns"); break;
      default: pq_thrift_skip(t, type); break;
    }
  }
  pq_thrift_struct_end(t);
}

typedef struct rg_parse {
  pq_column_chunk_t *columns;
  int *physical;
  int *has_meta;
  int64_t num_columns;
  int has_num_rows;
} rg_parse;

static void parse_row_group(meta_parser *mp, pq_row_group_t *rg, rg_parse *rp) {
  pq_thrift_t *t = &mp->t;
  int16_t last, id;
  int type;
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    switch (id) {
      case 1: {
        int et;
        int64_t n = pq_thrift_list(t, type, &et);
        if (n > 0 && et != PQ_TT_STRUCT) {
          pq_thrift_fail(t, "row group columns are not structs");
          break;
        }
        rp->num_columns = n;
        rp->columns = n ? arena_alloc(mp, (size_t)n * sizeof(*rp->columns)) : NULL;
        rp->physical = n ? arena_alloc(mp, (size_t)n * sizeof(int)) : NULL;
        rp->has_meta = n ? arena_alloc(mp, (size_t)n * sizeof(int)) : NULL;
        if (n && (!rp->columns || !rp->physical || !rp->has_meta)) break;
        for (int64_t i = 0; i < n && !t->failed; i++) {
          rp->physical[i] = -1;
          parse_column_chunk(mp, &rp->columns[i], &rp->physical[i], &rp->has_meta[i]);
        }
        break;
      }
      case 2: rg->total_byte_size = pq_thrift_int(t, type); break;
      case 3:
        rg->num_rows = pq_thrift_int(t, type);
        rp->has_num_rows = 1;
        break;
      default: pq_thrift_skip(t, type); break;
    }
  }
  pq_thrift_struct_end(t);
}

/* ------------------------------------------------------------------------ */
/* The schema tree                                                           */

/* Maps a legacy ConvertedType onto the LogicalType it implies, following
 * LogicalTypes.md's backward-compatibility rules. */
static void logical_from_converted(const flat_element *e, pq_logical_t *lt) {
  memset(lt, 0, sizeof(*lt));
  switch (e->converted) {
    case 0: lt->kind = PQ_LT_STRING; break;
    case 1: lt->kind = PQ_LT_MAP; break;
    case 2: lt->kind = PQ_LT_MAP_KEY_VALUE; break;
    case 3: lt->kind = PQ_LT_LIST; break;
    case 4: lt->kind = PQ_LT_ENUM; break;
    case 5:
      lt->kind = PQ_LT_DECIMAL;
      lt->precision = e->precision;
      lt->scale = e->scale;
      break;
    case 6: lt->kind = PQ_LT_DATE; break;
    case 7:
    case 8:
      lt->kind = PQ_LT_TIME;
      lt->unit = e->converted == 7 ? LARDER_UNIT_MILLI : LARDER_UNIT_MICRO;
      lt->utc = 1;
      break;
    case 9:
    case 10:
      lt->kind = PQ_LT_TIMESTAMP;
      lt->unit = e->converted == 9 ? LARDER_UNIT_MILLI : LARDER_UNIT_MICRO;
      lt->utc = 1;
      break;
    case 11:
    case 12:
    case 13:
    case 14:
      lt->kind = PQ_LT_INTEGER;
      lt->bit_width = 8 << (e->converted - 11);
      lt->is_signed = 0;
      break;
    case 15:
    case 16:
    case 17:
    case 18:
      lt->kind = PQ_LT_INTEGER;
      lt->bit_width = 8 << (e->converted - 15);
      lt->is_signed = 1;
      break;
    case 19: lt->kind = PQ_LT_JSON; break;
    case 20: lt->kind = PQ_LT_BSON; break;
    case 21: lt->kind = PQ_LT_INTERVAL; break;
    default: lt->kind = PQ_LT_NONE; break;
  }
}

typedef struct tree_builder {
  meta_parser *mp;
  int64_t next; /* next flat element to consume */
  int num_leaves;
  char why[200];
} tree_builder;

static int build_node(tree_builder *tb, pq_schema_node_t *node, pq_schema_node_t *parent,
                      int depth) {
  meta_parser *mp = tb->mp;
  if (tb->next >= mp->num_elements) {
    snprintf(tb->why, sizeof(tb->why),
             "schema ends early: a group claims more children than exist");
    return -1;
  }
  if (depth > PQ_MAX_SCHEMA_DEPTH) {
    snprintf(tb->why, sizeof(tb->why), "schema nests deeper than %d levels", PQ_MAX_SCHEMA_DEPTH);
    return -1;
  }
  const flat_element *e = &mp->elements[tb->next++];
  node->parent = parent;
  node->name = pq_arena_strndup(mp->arena, e->name ? (const char *)e->name : "", e->name_len);
  if (node->name == NULL) return -2;
  node->repetition = parent == NULL      ? PQ_REQUIRED
                     : e->repetition < 0 ? PQ_OPTIONAL
                                         : (pq_repetition_t)e->repetition;
  if (parent != NULL && (e->repetition < -1 || e->repetition > 2)) {
    snprintf(tb->why, sizeof(tb->why), "field '%s' has repetition %d", node->name, e->repetition);
    return -1;
  }
  if (parent != NULL && e->repetition < 0) {
    snprintf(tb->why, sizeof(tb->why), "field '%s' has no repetition", node->name);
    return -1;
  }
  node->converted = e->converted;
  node->field_id = e->field_id;
  node->type_length = e->type_length;
  if (e->logical.kind != PQ_LT_NONE) {
    node->logical = e->logical;
    if (node->logical.kind == PQ_LT_DECIMAL && node->logical.precision == 0) {
      node->logical.precision = e->precision;
      node->logical.scale = e->scale;
    }
  } else {
    logical_from_converted(e, &node->logical);
  }
  int16_t pdef = parent ? parent->def_level : 0;
  int16_t prep = parent ? parent->rep_level : 0;
  node->def_level = (int16_t)(pdef + (node->repetition != PQ_REQUIRED));
  node->rep_level = (int16_t)(prep + (node->repetition == PQ_REPEATED));
  /* A node is a group when it declares children; the root always is. */
  int is_group = parent == NULL || (e->has_num_children && e->num_children > 0) ||
                 (e->has_num_children && e->physical == PQ_PHYSICAL_NONE);
  if (!is_group) {
    if (e->physical < PQ_BOOLEAN || e->physical > PQ_FIXED_LEN_BYTE_ARRAY) {
      snprintf(tb->why, sizeof(tb->why), "column '%s' has unknown physical type %d", node->name,
               e->physical);
      return -1;
    }
    if (e->physical == PQ_FIXED_LEN_BYTE_ARRAY &&
        (e->type_length <= 0 || e->type_length > (1 << 24))) {
      snprintf(tb->why, sizeof(tb->why), "column '%s' has fixed length %d", node->name,
               e->type_length);
      return -1;
    }
    node->physical = (pq_physical_t)e->physical;
    node->leaf_index = tb->num_leaves++;
    node->num_children = 0;
    return 0;
  }
  node->physical = PQ_PHYSICAL_NONE;
  node->leaf_index = -1;
  int32_t n = e->num_children;
  if (n < 0 || n > mp->num_elements - tb->next) {
    snprintf(tb->why, sizeof(tb->why), "group '%s' claims %d children but the schema has %lld left",
             node->name, n, (long long)(mp->num_elements - tb->next));
    return -1;
  }
  node->num_children = n;
  node->children = n ? pq_arena_alloc(mp->arena, (size_t)n * sizeof(*node)) : NULL;
  if (n && node->children == NULL) return -2;
  for (int32_t i = 0; i < n; i++) {
    int rc = build_node(tb, &node->children[i], node, depth + 1);
    if (rc) return rc;
  }
  return 0;
}

static int collect_leaves(pq_arena_t *arena, pq_schema_node_t *node, pq_schema_node_t **leaves,
                          const char *prefix) {
  for (int i = 0; i < node->num_children; i++) {
    pq_schema_node_t *c = &node->children[i];
    size_t plen = prefix ? strlen(prefix) : 0;
    size_t nlen = strlen(c->name);
    c->path = pq_arena_alloc(arena, plen + nlen + 2);
    if (c->path == NULL) return -2;
    if (plen) {
      memcpy(c->path, prefix, plen);
      c->path[plen] = '.';
      memcpy(c->path + plen + 1, c->name, nlen + 1);
    } else {
      memcpy(c->path, c->name, nlen + 1);
    }
    if (c->leaf_index >= 0) leaves[c->leaf_index] = c;
    else if (collect_leaves(arena, c, leaves, c->path)) return -2;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */

static void parse_file_meta(meta_parser *mp, int64_t *num_rg, rg_parse **rps) {
  pq_thrift_t *t = &mp->t;
  pq_file_meta_t *meta = mp->meta;
  int16_t last, id;
  int type;
  int seen_schema = 0, seen_rg = 0;
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    switch (id) {
      case 1: meta->version = read_i32(t, type); break;
      case 2: {
        int et;
        int64_t n = pq_thrift_list(t, type, &et);
        if (n > 0 && et != PQ_TT_STRUCT) {
          pq_thrift_fail(t, "schema is not a list of structs");
          break;
        }
        mp->elements = n ? arena_alloc(mp, (size_t)n * sizeof(flat_element)) : NULL;
        if (n && mp->elements == NULL) break;
        mp->num_elements = n;
        for (int64_t i = 0; i < n && !t->failed; i++) parse_schema_element(mp, &mp->elements[i]);
        seen_schema = 1;
        break;
      }
      case 3: meta->num_rows = pq_thrift_int(t, type); break;
      case 4: {
        int et;
        int64_t n = pq_thrift_list(t, type, &et);
        if (n > 0 && et != PQ_TT_STRUCT) {
          pq_thrift_fail(t, "row groups are not structs");
          break;
        }
        meta->row_groups = n ? arena_alloc(mp, (size_t)n * sizeof(pq_row_group_t)) : NULL;
        *rps = n ? arena_alloc(mp, (size_t)n * sizeof(rg_parse)) : NULL;
        if (n && (meta->row_groups == NULL || *rps == NULL)) break;
        *num_rg = n;
        for (int64_t i = 0; i < n && !t->failed; i++)
          parse_row_group(mp, &meta->row_groups[i], &(*rps)[i]);
        seen_rg = 1;
        break;
      }
      case 5: parse_kv_list(mp, type, &meta->num_kv, &meta->kv); break;
      case 6: {
        size_t len;
        const uint8_t *s = pq_thrift_binary(t, type, &len);
        if (s) meta->created_by = pq_arena_strndup(mp->arena, (const char *)s, len);
        break;
      }
      case 8: fail_unsupported(mp, "encrypted files"); break;
      default: pq_thrift_skip(t, type); break;
    }
  }
  pq_thrift_struct_end(t);
  if (!t->failed && !seen_schema) pq_thrift_fail(t, "FileMetaData has no schema");
  if (!t->failed && !seen_rg) *num_rg = 0;
}

int pq_footer_length(const uint8_t tail[PQ_TAIL_SIZE], uint64_t file_size, const pq_options *opts,
                     uint32_t *footer_length, const char *name, pq_error *err) {
  pq_options defaults;
  if (opts == NULL) {
    pq_options_init(&defaults);
    opts = &defaults;
  }
  if (file_size < 12)
    return pq_error_set(err, LARDER_ECORRUPT, "%s: not a Parquet file: %llu bytes is too short",
                        name, (unsigned long long)file_size);
  if (memcmp(tail + 4, "PARE", 4) == 0)
    return pq_error_set(err, LARDER_EUNSUPPORTED, "%s: encrypted footers are not supported", name);
  if (memcmp(tail + 4, "PAR1", 4) != 0)
    return pq_error_set(err, LARDER_ECORRUPT, "%s: not a Parquet file: no PAR1 magic at the end",
                        name);
  uint32_t len = (uint32_t)tail[0] | (uint32_t)tail[1] << 8 | (uint32_t)tail[2] << 16 |
                 (uint32_t)tail[3] << 24;
  if ((uint64_t)len + 12 > file_size)
    return pq_error_set(err, LARDER_ECORRUPT, "%s: footer length %u exceeds the file size %llu",
                        name, len, (unsigned long long)file_size);
  if (len > opts->max_footer_bytes)
    return pq_error_set(err, LARDER_ELIMIT, "%s: footer of %u bytes exceeds the limit of %u", name,
                        len, opts->max_footer_bytes);
  if (len == 0) return pq_error_set(err, LARDER_ECORRUPT, "%s: empty footer", name);
  *footer_length = len;
  return 0;
}

/* Checks a column chunk's byte range against the file and computes it.
 * Some writers record dictionary_page_offset as 0 when there is no
 * dictionary, put the dictionary at data_page_offset, or (for chunks with no
 * data pages) leave data_page_offset 0: the range starts at the dictionary
 * when it really comes first or is the only valid offset. */
static int chunk_range(pq_column_chunk_t *cc, uint64_t data_end, char *why, size_t why_len) {
  int64_t start = cc->data_page_offset;
  int64_t dict = cc->dictionary_page_offset;
  if (dict >= 4 && (dict < start || start < 4)) start = dict;
  if (start < 4 || (uint64_t)start >= data_end) {
    snprintf(why, why_len, "column chunk starts at offset %lld, outside the data",
             (long long)start);
    return -1;
  }
  if (cc->total_compressed_size <= 0 ||
      (uint64_t)cc->total_compressed_size > data_end - (uint64_t)start) {
    snprintf(why, why_len, "column chunk at offset %lld claims %lld bytes, past the data",
             (long long)start, (long long)cc->total_compressed_size);
    return -1;
  }
  if (cc->num_values < 0 || cc->total_uncompressed_size < 0) {
    snprintf(why, why_len, "column chunk has negative sizes");
    return -1;
  }
  /* A page holds at most INT32_MAX values (its header's count is an i32)
   * and takes at least PQ_MIN_PAGE_BYTES of the chunk, so a count beyond
   * what the chunk's bytes could hold is a lie about the file: the reader
   * says so here, naming the chunk, before anyone plans units (or buffers)
   * for 2^62 values. */
  uint64_t pages_max =
      ((uint64_t)cc->total_compressed_size + PQ_MIN_PAGE_BYTES - 1) / PQ_MIN_PAGE_BYTES;
  uint64_t pages_needed = ((uint64_t)cc->num_values + INT32_MAX - 1) / INT32_MAX;
  if (pages_needed > pages_max) {
    snprintf(why, why_len,
             "column chunk claims %lld values in %lld bytes, more than its pages could hold",
             (long long)cc->num_values, (long long)cc->total_compressed_size);
    return -1;
  }
  cc->range_offset = (uint64_t)start;
  cc->range_length = (uint64_t)cc->total_compressed_size;
  return 0;
}

int pq_file_parse(const uint8_t *footer, size_t len, uint64_t file_size, const pq_options *opts,
                  const char *name, pq_file **out, pq_error *err) {
  pq_options defaults;
  if (opts == NULL) {
    pq_options_init(&defaults);
    opts = &defaults;
  }
  *out = NULL;
  pq_file *f = calloc(1, sizeof(*f));
  if (f == NULL) return pq_error_set(err, LARDER_ENOMEM, "%s: out of memory", name);
  snprintf(f->name, sizeof(f->name), "%s", name);
  f->opts = *opts;
  f->arena.limit = PQ_ARENA_MIN + (size_t)len * PQ_ARENA_FACTOR;
  /* Blocks sized to the footer: the parse takes a few times its Thrift
   * bytes, and a dataset of many small files would otherwise hold a 64 KiB
   * block per file for a parse of a few KiB (20,000 such files took 1.3 GB
   * of heap, which glibc kept after they were freed). */
  f->arena.block_bytes = len * 4 < 4096 ? 4096 : len * 4 > 65536 ? 65536 : len * 4;
  f->meta.file_size = file_size;
  f->meta.footer_length = (uint32_t)len;

  meta_parser mp;
  memset(&mp, 0, sizeof(mp));
  mp.arena = &f->arena;
  mp.meta = &f->meta;
  pq_thrift_init(&mp.t, footer, len);
  int64_t num_rg = 0;
  rg_parse *rps = NULL;
  parse_file_meta(&mp, &num_rg, &rps);
  int rc;
  if (mp.t.failed) {
    if (mp.oom) rc = pq_error_set(err, LARDER_ELIMIT, "%s: footer: %s", name, mp.t.why);
    else if (mp.unsupported)
      rc = pq_error_set(err, LARDER_EUNSUPPORTED, "%s: footer: %s are not supported", name, mp.why);
    else rc = pq_error_set(err, LARDER_ECORRUPT, "%s: footer: %s", name, mp.t.why);
    goto fail;
  }
  if (mp.num_elements < 1) {
    rc = pq_error_set(err, LARDER_ECORRUPT, "%s: footer: empty schema", name);
    goto fail;
  }
  f->meta.root = pq_arena_alloc(&f->arena, sizeof(pq_schema_node_t));
  if (f->meta.root == NULL) {
    rc = pq_error_set(err, LARDER_ELIMIT, "%s: footer: too large", name);
    goto fail;
  }
  tree_builder tb;
  memset(&tb, 0, sizeof(tb));
  tb.mp = &mp;
  int brc = build_node(&tb, f->meta.root, NULL, 0);
  if (brc == -2) {
    rc = pq_error_set(err, LARDER_ELIMIT, "%s: footer: schema too large", name);
    goto fail;
  }
  if (brc) {
    rc = pq_error_set(err, LARDER_ECORRUPT, "%s: schema: %s", name, tb.why);
    goto fail;
  }
  if (tb.next != mp.num_elements) {
    rc = pq_error_set(err, LARDER_ECORRUPT, "%s: schema: %lld elements after the tree ends", name,
                      (long long)(mp.num_elements - tb.next));
    goto fail;
  }
  f->meta.num_leaves = tb.num_leaves;
  f->meta.leaves =
      pq_arena_alloc(&f->arena, (size_t)(tb.num_leaves + 1) * sizeof(pq_schema_node_t *));
  if (f->meta.leaves == NULL || collect_leaves(&f->arena, f->meta.root, f->meta.leaves, NULL)) {
    rc = pq_error_set(err, LARDER_ELIMIT, "%s: footer: schema too large", name);
    goto fail;
  }
  if (f->meta.num_rows < 0) {
    rc = pq_error_set(err, LARDER_ECORRUPT, "%s: footer: negative row count", name);
    goto fail;
  }
  if (num_rg > INT32_MAX) {
    rc = pq_error_set(err, LARDER_ECORRUPT, "%s: footer: too many row groups", name);
    goto fail;
  }
  f->meta.num_row_groups = (int)num_rg;
  uint64_t data_end = file_size - PQ_TAIL_SIZE - len;
  int64_t first_row = 0;
  for (int64_t i = 0; i < num_rg; i++) {
    pq_row_group_t *rg = &f->meta.row_groups[i];
    rg_parse *rp = &rps[i];
    if (!rp->has_num_rows || rg->num_rows < 0) {
      rc = pq_error_set(err, LARDER_ECORRUPT, "%s: row group %lld: missing or negative row count",
                        name, (long long)i);
      goto fail;
    }
    if (rp->num_columns != tb.num_leaves) {
      rc = pq_error_set(err, LARDER_ECORRUPT,
                        "%s: row group %lld has %lld column chunks, the schema %d "
                        "columns",
                        name, (long long)i, (long long)rp->num_columns, tb.num_leaves);
      goto fail;
    }
    rg->columns = rp->columns;
    rg->first_row = first_row;
    if (__builtin_add_overflow(first_row, rg->num_rows, &first_row)) {
      rc = pq_error_set(err, LARDER_ECORRUPT, "%s: row counts overflow", name);
      goto fail;
    }
    rg->total_compressed_size = 0;
    for (int c = 0; c < tb.num_leaves; c++) {
      pq_column_chunk_t *cc = &rg->columns[c];
      const pq_schema_node_t *leaf = f->meta.leaves[c];
      char why[160];
      if (!rp->has_meta[c]) {
        rc = pq_error_set(err, LARDER_ECORRUPT,
                          "%s: column '%s', row group %lld: no column metadata", name, leaf->path,
                          (long long)i);
        goto fail;
      }
      if (rp->physical[c] != (int)leaf->physical) {
        rc = pq_error_set(err, LARDER_ECORRUPT,
                          "%s: column '%s', row group %lld: chunk type %s does "
                          "not match the schema's %s",
                          name, leaf->path, (long long)i, pq_physical_name(rp->physical[c]),
                          pq_physical_name(leaf->physical));
        goto fail;
      }
      if (chunk_range(cc, data_end, why, sizeof(why))) {
        rc = pq_error_set(err, LARDER_ECORRUPT, "%s: column '%s', row group %lld: %s", name,
                          leaf->path, (long long)i, why);
        goto fail;
      }
      rg->total_compressed_size += (int64_t)cc->range_length;
    }
  }
  if (first_row != f->meta.num_rows) {
    /* Some writers leave num_rows stale; the row groups are authoritative,
     * since they are what the reader walks. */
    f->meta.num_rows = first_row;
  }
  rc = pq_schema_build(f, err);
  if (rc) goto fail;
  *out = f;
  return 0;
fail:
  pq_arena_free(&f->arena);
  free(f);
  return rc;
}

int pq_file_open(const pq_source *src, const pq_options *opts, pq_file **out, pq_error *err) {
  pq_options defaults;
  if (opts == NULL) {
    pq_options_init(&defaults);
    opts = &defaults;
  }
  *out = NULL;
  uint8_t tail[PQ_TAIL_SIZE];
  if (src->size < 12)
    return pq_error_set(err, LARDER_ECORRUPT, "%s: not a Parquet file: %llu bytes is too short",
                        src->name, (unsigned long long)src->size);
  int rc = src->read(src, src->size - PQ_TAIL_SIZE, PQ_TAIL_SIZE, tail);
  if (rc)
    return pq_error_set(err, rc, "%s: cannot read the footer: %s", src->name, larder_strerror(rc));
  uint32_t flen = 0;
  rc = pq_footer_length(tail, src->size, opts, &flen, src->name, err);
  if (rc) return rc;
  uint8_t *footer = malloc((size_t)flen + 1);
  if (footer == NULL) return pq_error_set(err, LARDER_ENOMEM, "%s: out of memory", src->name);
  rc = src->read(src, src->size - PQ_TAIL_SIZE - flen, flen, footer);
  if (rc) {
    free(footer);
    return pq_error_set(err, rc, "%s: cannot read the footer: %s", src->name, larder_strerror(rc));
  }
  rc = pq_file_parse(footer, flen, src->size, opts, src->name, out, err);
  free(footer);
  return rc;
}

void pq_file_close(pq_file *file) {
  if (file == NULL) return;
  pq_arena_free(&file->arena);
  free(file);
}

const pq_file_meta_t *pq_file_meta(const pq_file *file) { return &file->meta; }
const char *pq_file_name(const pq_file *file) { return file->name; }
uint64_t pq_file_memory(const pq_file *file) { return sizeof(*file) + file->arena.reserved; }

/* ------------------------------------------------------------------------ */
/* Page headers                                                              */

static void parse_data_header(pq_thrift_t *t, pq_page_header_t *h) {
  int16_t last, id;
  int type;
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    switch (id) {
      case 1: h->num_values = read_i32(t, type); break;
      case 2: h->encoding = read_i32(t, type); break;
      case 3: h->def_encoding = read_i32(t, type); break;
      case 4: h->rep_encoding = read_i32(t, type); break;
      default: pq_thrift_skip(t, type); break;
    }
  }
  pq_thrift_struct_end(t);
}

static void parse_dict_header(pq_thrift_t *t, pq_page_header_t *h) {
  int16_t last, id;
  int type;
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    switch (id) {
      case 1: h->num_values = read_i32(t, type); break;
      case 2: h->encoding = read_i32(t, type); break;
      default: pq_thrift_skip(t, type); break;
    }
  }
  pq_thrift_struct_end(t);
}

static void parse_v2_header(pq_thrift_t *t, pq_page_header_t *h) {
  int16_t last, id;
  int type;
  pq_thrift_struct_begin(t, &last);
  while (pq_thrift_field(t, &last, &id, &type)) {
    switch (id) {
      case 1: h->num_values = read_i32(t, type); break;
      case 2: h->num_nulls = read_i32(t, type); break;
      case 3: h->num_rows = read_i32(t, type); break;
      case 4: h->encoding = read_i32(t, type); break;
      case 5: h->def_length = read_i32(t, type); break;
      case 6: h->rep_length = read_i32(t, type); break;
      case 7: h->is_compressed = pq_thrift_bool(type); break;
      default: pq_thrift_skip(t, type); break;
    }
  }
  pq_thrift_struct_end(t);
}

int64_t pq_page_header_parse(const uint8_t *p, size_t len, pq_page_header_t *h, char *why,
                             size_t why_len) {
  memset(h, 0, sizeof(*h));
  h->type = -1;
  h->is_compressed = 1;
  h->uncompressed_size = -1;
  h->compressed_size = -1;
  pq_thrift_t t;
  pq_thrift_init(&t, p, len);
  int16_t last, id;
  int type;
  pq_thrift_struct_begin(&t, &last);
  while (pq_thrift_field(&t, &last, &id, &type)) {
    switch (id) {
      case 1: h->type = read_i32(&t, type); break;
      case 2: h->uncompressed_size = read_i32(&t, type); break;
      case 3: h->compressed_size = read_i32(&t, type); break;
      case 4:
        h->crc = (uint32_t)read_i32(&t, type);
        h->has_crc = 1;
        break;
      case 5:
        if (type == PQ_TT_STRUCT) {
          parse_data_header(&t, h);
          h->has_v1 = 1;
        } else {
          pq_thrift_skip(&t, type);
        }
        break;
      case 7:
        if (type == PQ_TT_STRUCT) {
          parse_dict_header(&t, h);
          h->has_dict = 1;
        } else {
          pq_thrift_skip(&t, type);
        }
        break;
      case 8:
        if (type == PQ_TT_STRUCT) {
          parse_v2_header(&t, h);
          h->has_v2 = 1;
        } else {
          pq_thrift_skip(&t, type);
        }
        break;
      default: pq_thrift_skip(&t, type); break;
    }
  }
  pq_thrift_struct_end(&t);
  if (t.failed) {
    if (t.truncated) return 0;
    snprintf(why, why_len, "page header: %s", t.why);
    return LARDER_ECORRUPT;
  }
  if (h->type < 0 || h->uncompressed_size < 0 || h->compressed_size < 0) {
    snprintf(why, why_len, "page header lacks its type or sizes");
    return LARDER_ECORRUPT;
  }
  return (int64_t)(t.p - p);
}
