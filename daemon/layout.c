/*
 * layout.c: column blobs (the cached form of decoded columns) and the batch
 * gather that copies sampled rows from them into a stream's arena.
 *
 * Gathering works on spans: (view, first row, row count) runs of source
 * rows.  A batch's top-level columns start with one span of one row per
 * sample; a list turns each span into the span of its elements, so nested
 * columns are copied a run at a time.  The same traversal runs twice, once
 * to size the output exactly and once to fill it, so the batch occupies
 * exactly the bytes it needs in the arena.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"

static uint64_t align_up(uint64_t v) {
  return (v + LAYOUT_ALIGN - 1) & ~(uint64_t)(LAYOUT_ALIGN - 1);
}

int layout_num_nodes(const pq_field_t *field) {
  int n = 1;
  for (int i = 0; i < field->num_children; i++) n += layout_num_nodes(&field->children[i]);
  return n;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++) {
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static uint64_t hash_field(uint64_t h, const pq_field_t *f) {
  h = fnv(h, f->name, strlen(f->name) + 1);
  int32_t params[8] = {(int32_t)f->type, f->nullable, f->byte_width, f->precision,
                       f->scale, (int32_t)f->unit, f->utc, f->num_children};
  h = fnv(h, params, sizeof(params));
  for (int i = 0; i < f->num_children; i++) h = hash_field(h, &f->children[i]);
  return h;
}

uint64_t layout_field_hash(const pq_field_t *field) {
  return hash_field(0xcbf29ce484222325ull, field);
}

/* Bytes per slot of a fixed-width type, 0 for the others; BOOL is special
 * (bits) and reported as 0 too. */
static size_t fixed_width(const pq_field_t *f) {
  switch (f->type) {
    case LARDER_TYPE_INT8: case LARDER_TYPE_UINT8: return 1;
    case LARDER_TYPE_INT16: case LARDER_TYPE_UINT16: case LARDER_TYPE_FLOAT16: return 2;
    case LARDER_TYPE_INT32: case LARDER_TYPE_UINT32: case LARDER_TYPE_FLOAT32:
    case LARDER_TYPE_DATE32: case LARDER_TYPE_TIME32: return 4;
    case LARDER_TYPE_INT64: case LARDER_TYPE_UINT64: case LARDER_TYPE_FLOAT64:
    case LARDER_TYPE_TIME64: case LARDER_TYPE_TIMESTAMP: return 8;
    case LARDER_TYPE_DECIMAL128: case LARDER_TYPE_DECIMAL256:
    case LARDER_TYPE_FIXED_BINARY: return (size_t)f->byte_width;
    default: return 0;
  }
}

static int is_var(const pq_field_t *f) {
  return f->type == LARDER_TYPE_BINARY || f->type == LARDER_TYPE_STRING;
}

static int is_list(const pq_field_t *f) {
  return f->type == LARDER_TYPE_LIST || f->type == LARDER_TYPE_MAP;
}

/* ------------------------------------------------------------------------ */
/* Serialization                                                             */

static uint64_t blob_buffers(const pq_array_t *a) {
  uint64_t n = align_up(a->validity.len) + align_up(a->offsets.len) + align_up(a->values.len);
  for (int i = 0; i < a->num_children; i++) n += blob_buffers(&a->children[i]);
  return n;
}

static int count_arrays(const pq_array_t *a) {
  int n = 1;
  for (int i = 0; i < a->num_children; i++) n += count_arrays(&a->children[i]);
  return n;
}

static uint64_t put_buffer(uint8_t *blob, uint64_t *pos, const pq_buf_t *b,
                           uint64_t *off, uint64_t *len) {
  *len = b->len;
  *off = b->len ? *pos : 0;
  if (b->len) {
    memcpy(blob + *pos, b->data, b->len);
    memset(blob + *pos + b->len, 0, align_up(b->len) - b->len);
    *pos += align_up(b->len);
  }
  return *pos;
}

static void put_array(uint8_t *blob, layout_node_t *nodes, int *k, uint64_t *pos,
                      const pq_array_t *a) {
  layout_node_t *nd = &nodes[(*k)++];
  nd->length = a->length;
  nd->null_count = a->null_count;
  put_buffer(blob, pos, &a->validity, &nd->validity_offset, &nd->validity_length);
  put_buffer(blob, pos, &a->offsets, &nd->offsets_offset, &nd->offsets_length);
  put_buffer(blob, pos, &a->values, &nd->values_offset, &nd->values_length);
  if (a->null_count == 0) nd->validity_length = nd->validity_offset = 0;
  for (int i = 0; i < a->num_children; i++) put_array(blob, nodes, k, pos, &a->children[i]);
}

int layout_serialize(const pq_array_t *array, uint8_t **out, size_t *size) {
  int n = count_arrays(array);
  uint64_t head = align_up(sizeof(layout_blob_header_t) + (uint64_t)n * sizeof(layout_node_t));
  uint64_t total = head + blob_buffers(array);
  uint8_t *blob = malloc(total);
  if (blob == NULL) return LARDER_ENOMEM;
  memset(blob, 0, head);
  layout_blob_header_t *h = (layout_blob_header_t *)(void *)blob;
  h->magic = LAYOUT_MAGIC;
  h->version = LAYOUT_VERSION;
  h->num_nodes = (uint16_t)n;
  h->num_rows = (uint64_t)array->length;
  h->field_hash = layout_field_hash(array->field);
  h->total_size = total;
  layout_node_t *nodes = (layout_node_t *)(void *)(blob + sizeof(*h));
  int k = 0;
  uint64_t pos = head;
  put_array(blob, nodes, &k, &pos, array);
  *out = blob;
  *size = (size_t)total;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */

typedef struct checker {
  const uint8_t *base;
  size_t size;
  const layout_node_t *nodes;
  int num_nodes;
  char *why;
  size_t why_len;
} checker;

static int bad(checker *c, const char *what, int node) {
  snprintf(c->why, c->why_len, "column blob node %d: %s", node, what);
  return LARDER_ECORRUPT;
}

static int in_blob(const checker *c, uint64_t off, uint64_t len) {
  return len == 0 || (off <= c->size && len <= c->size - off);
}

static int check_offsets(checker *c, int k, const layout_node_t *nd, uint64_t limit) {
  if (nd->offsets_length < ((uint64_t)nd->length + 1) * 4) return bad(c, "offsets too short", k);
  const int32_t *off = (const int32_t *)(const void *)(c->base + nd->offsets_offset);
  if (off[0] < 0) return bad(c, "negative offset", k);
  for (int64_t i = 0; i < nd->length; i++)
    if (off[i + 1] < off[i]) return bad(c, "offsets decrease", k);
  if ((uint64_t)off[nd->length] > limit) return bad(c, "offsets past the values", k);
  return 0;
}

static int check_node(checker *c, const pq_field_t *f, int *k, int64_t expect_len) {
  int me = (*k)++;
  if (me >= c->num_nodes) return bad(c, "more fields than nodes", me);
  const layout_node_t *nd = &c->nodes[me];
  if (nd->length < 0 || (expect_len >= 0 && nd->length < expect_len))
    return bad(c, "length disagrees with its parent", me);
  if (nd->null_count < 0 || nd->null_count > nd->length) return bad(c, "bad null count", me);
  if (!in_blob(c, nd->validity_offset, nd->validity_length) ||
      !in_blob(c, nd->offsets_offset, nd->offsets_length) ||
      !in_blob(c, nd->values_offset, nd->values_length))
    return bad(c, "buffer outside the blob", me);
  if ((nd->offsets_length && nd->offsets_offset % 4) ||
      (nd->values_length && nd->values_offset % 8))
    return bad(c, "misaligned buffer", me);
  uint64_t len = (uint64_t)nd->length;
  if (nd->null_count > 0 && nd->validity_length < (len + 7) / 8)
    return bad(c, "validity too short", me);
  size_t w = fixed_width(f);
  int rc = 0;
  if (f->type == LARDER_TYPE_BOOL) {
    if (nd->values_length < (len + 7) / 8) return bad(c, "values too short", me);
  } else if (w) {
    if (nd->values_length < len * w) return bad(c, "values too short", me);
  } else if (is_var(f)) {
    rc = check_offsets(c, me, nd, nd->values_length);
  } else if (is_list(f)) {
    if (f->num_children != 1) return bad(c, "list without one child", me);
    if (nd->offsets_length < (len + 1) * 4) return bad(c, "offsets too short", me);
    const layout_node_t *child = *k < c->num_nodes ? &c->nodes[*k] : NULL;
    if (child == NULL) return bad(c, "missing child", me);
    rc = check_offsets(c, me, nd, (uint64_t)(child->length < 0 ? 0 : child->length));
    if (rc) return rc;
    return check_node(c, &f->children[0], k, -1);
  } else if (f->type == LARDER_TYPE_STRUCT) {
    for (int i = 0; i < f->num_children; i++) {
      rc = check_node(c, &f->children[i], k, nd->length);
      if (rc) return rc;
    }
  }
  return rc;
}

int layout_view(const uint8_t *blob, size_t size, const pq_field_t *field,
                layout_view_t *view, char *why, size_t why_len) {
  const layout_blob_header_t *h = (const layout_blob_header_t *)(const void *)blob;
  if (size < sizeof(*h) || h->magic != LAYOUT_MAGIC || h->version != LAYOUT_VERSION) {
    snprintf(why, why_len, "not a column blob");
    return LARDER_ECORRUPT;
  }
  int n = layout_num_nodes(field);
  if (h->num_nodes != n || h->total_size != size || h->field_hash != layout_field_hash(field) ||
      sizeof(*h) + (uint64_t)n * sizeof(layout_node_t) > size) {
    snprintf(why, why_len, "column blob does not match its column");
    return LARDER_ECORRUPT;
  }
  checker c = {blob, size, (const layout_node_t *)(const void *)(blob + sizeof(*h)), n, why,
               why_len};
  int k = 0;
  int rc = check_node(&c, field, &k, -1);
  if (rc) return rc;
  if (c.nodes[0].length != (int64_t)h->num_rows) {
    snprintf(why, why_len, "column blob row count disagrees");
    return LARDER_ECORRUPT;
  }
  view->base = blob;
  view->size = size;
  view->field = field;
  view->num_nodes = n;
  view->nodes = c.nodes;
  view->num_rows = c.nodes[0].length;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Gather                                                                    */

typedef struct span {
  const layout_view_t *view;
  int64_t start, count;
} span_t;

struct layout_scratch {
  span_t *spans; /* a stack of span arrays, one per list level */
  size_t len, cap;
};

void layout_scratch_free(layout_scratch_t *s) {
  if (s == NULL) return;
  free(s->spans);
  free(s);
}

static span_t *scratch_push(layout_scratch_t **sp, size_t n) {
  layout_scratch_t *s = *sp;
  if (s == NULL) {
    s = calloc(1, sizeof(*s));
    if (s == NULL) return NULL;
    *sp = s;
  }
  if (s->len + n > s->cap) {
    size_t cap = s->cap ? s->cap : 1024;
    while (cap < s->len + n) cap *= 2;
    span_t *p = realloc(s->spans, cap * sizeof(*p));
    if (p == NULL) return NULL;
    s->spans = p;
    s->cap = cap;
  }
  span_t *r = s->spans + s->len;
  s->len += n;
  return r;
}

static inline const uint8_t *node_buf(const layout_view_t *v, int k, int which) {
  const layout_node_t *nd = &v->nodes[k];
  uint64_t off = which == 0 ? nd->validity_offset : which == 1 ? nd->offsets_offset : nd->values_offset;
  return v->base + off;
}

static int64_t count_nulls(const layout_view_t *v, int k, int64_t start, int64_t count) {
  const layout_node_t *nd = &v->nodes[k];
  if (nd->null_count == 0) return 0;
  const uint8_t *bits = v->base + nd->validity_offset;
  int64_t valid = 0;
  int64_t i = start, end = start + count;
  for (; i < end && (i & 7); i++) valid += (bits[i >> 3] >> (i & 7)) & 1;
  for (; i + 64 <= end; i += 64) {
    uint64_t w;
    memcpy(&w, bits + (i >> 3), 8);
    valid += __builtin_popcountll(w);
  }
  for (; i < end; i++) valid += (bits[i >> 3] >> (i & 7)) & 1;
  return count - valid;
}

/* Copies count bits from src at src_off to dst at dst_off. */
static void copy_bits(uint8_t *dst, int64_t dst_off, const uint8_t *src, int64_t src_off,
                      int64_t count) {
  if (((dst_off | src_off) & 7) == 0) {
    int64_t bytes = count >> 3;
    memcpy(dst + (dst_off >> 3), src + (src_off >> 3), (size_t)bytes);
    dst_off += bytes * 8;
    src_off += bytes * 8;
    count -= bytes * 8;
  }
  for (int64_t i = 0; i < count; i++) {
    int bit = (src[(src_off + i) >> 3] >> ((src_off + i) & 7)) & 1;
    int64_t d = dst_off + i;
    if (bit) dst[d >> 3] |= (uint8_t)(1u << (d & 7));
    else dst[d >> 3] &= (uint8_t)~(1u << (d & 7));
  }
}

static void set_bits(uint8_t *dst, int64_t off, int64_t count) {
  for (int64_t i = 0; i < count; i++) dst[(off + i) >> 3] |= (uint8_t)(1u << ((off + i) & 7));
}

typedef struct gather_ctx {
  layout_scratch_t **scratch;
  int fill;        /* 0: size pass, 1: fill pass */
  uint8_t *base;   /* fill: the arena */
  uint8_t *dst;    /* fill: where the next buffer goes */
  uint64_t size;   /* size pass: bytes needed */
  layout_node_t *nodes;
} gather_ctx;

/* Reserves an aligned buffer of len bytes; returns where it goes (fill
 * pass) and records its arena offset. */
static uint8_t *take(gather_ctx *g, uint64_t len, uint64_t *off) {
  if (len == 0) {
    *off = 0;
    return NULL;
  }
  uint64_t a = align_up(len);
  if (!g->fill) {
    g->size += a;
    *off = 0;
    return NULL;
  }
  uint8_t *p = g->dst;
  *off = (uint64_t)(p - g->base);
  g->dst += a;
  memset(p + len, 0, a - len);
  return p;
}

/* Spans are passed as a position in the scratch stack, not a pointer: a
 * list level pushes its children's spans, which may move the stack. */
static int gather_node(gather_ctx *g, const pq_field_t *f, int *k, size_t first, size_t ns) {
  const span_t *spans = (*g->scratch)->spans + first;
  int me = (*k)++;
  layout_node_t nd;
  memset(&nd, 0, sizeof(nd));
  int64_t len = 0, nulls = 0;
  for (size_t s = 0; s < ns; s++) {
    len += spans[s].count;
    nulls += count_nulls(spans[s].view, me, spans[s].start, spans[s].count);
  }
  nd.length = len;
  nd.null_count = f->type == LARDER_TYPE_NULL ? len : nulls;
  if (nd.null_count > 0) {
    uint8_t *v = take(g, (uint64_t)(len + 7) / 8, &nd.validity_offset);
    nd.validity_length = (uint64_t)(len + 7) / 8;
    if (v) {
      memset(v, 0, (size_t)nd.validity_length);
      int64_t pos = 0;
      if (f->type != LARDER_TYPE_NULL) {
        for (size_t s = 0; s < ns; s++) {
          const span_t *sp = &spans[s];
          const layout_node_t *src = &sp->view->nodes[me];
          if (src->null_count == 0) set_bits(v, pos, sp->count);
          else copy_bits(v, pos, node_buf(sp->view, me, 0), sp->start, sp->count);
          pos += sp->count;
        }
      }
    }
  }
  size_t w = fixed_width(f);
  if (f->type == LARDER_TYPE_BOOL) {
    uint8_t *v = take(g, (uint64_t)(len + 7) / 8, &nd.values_offset);
    nd.values_length = (uint64_t)(len + 7) / 8;
    if (v) {
      memset(v, 0, (size_t)nd.values_length);
      int64_t pos = 0;
      for (size_t s = 0; s < ns; s++) {
        copy_bits(v, pos, node_buf(spans[s].view, me, 2), spans[s].start, spans[s].count);
        pos += spans[s].count;
      }
    }
  } else if (w) {
    uint8_t *v = take(g, (uint64_t)len * w, &nd.values_offset);
    nd.values_length = (uint64_t)len * w;
    if (v) {
      uint8_t *o = v;
      if (w == 4) {
        for (size_t s = 0; s < ns; s++) {
          const uint8_t *src = node_buf(spans[s].view, me, 2) + (size_t)spans[s].start * 4;
          if (spans[s].count == 1) memcpy(o, src, 4);
          else memcpy(o, src, (size_t)spans[s].count * 4);
          o += (size_t)spans[s].count * 4;
        }
      } else if (w == 8) {
        for (size_t s = 0; s < ns; s++) {
          const uint8_t *src = node_buf(spans[s].view, me, 2) + (size_t)spans[s].start * 8;
          if (spans[s].count == 1) memcpy(o, src, 8);
          else memcpy(o, src, (size_t)spans[s].count * 8);
          o += (size_t)spans[s].count * 8;
        }
      } else {
        for (size_t s = 0; s < ns; s++) {
          memcpy(o, node_buf(spans[s].view, me, 2) + (size_t)spans[s].start * w,
                 (size_t)spans[s].count * w);
          o += (size_t)spans[s].count * w;
        }
      }
    }
  } else if (is_var(f) || is_list(f)) {
    /* Offsets, then either the bytes or the child's rows. */
    uint64_t total = 0;
    for (size_t s = 0; s < ns; s++) {
      const int32_t *off = (const int32_t *)(const void *)node_buf(spans[s].view, me, 1);
      total += (uint64_t)(off[spans[s].start + spans[s].count] - off[spans[s].start]);
    }
    if (total > INT32_MAX) return LARDER_ELIMIT;
    int32_t *o = (int32_t *)(void *)take(g, (uint64_t)(len + 1) * 4, &nd.offsets_offset);
    nd.offsets_length = (uint64_t)(len + 1) * 4;
    if (o) {
      int32_t cur = 0;
      int64_t pos = 0;
      o[0] = 0;
      for (size_t s = 0; s < ns; s++) {
        const int32_t *off = (const int32_t *)(const void *)node_buf(spans[s].view, me, 1);
        int32_t base_off = off[spans[s].start];
        for (int64_t i = 0; i < spans[s].count; i++)
          o[++pos] = cur + (off[spans[s].start + i + 1] - base_off);
        cur = o[pos];
      }
    }
    if (is_var(f)) {
      uint8_t *v = take(g, total, &nd.values_offset);
      nd.values_length = total;
      if (v) {
        for (size_t s = 0; s < ns; s++) {
          const int32_t *off = (const int32_t *)(const void *)node_buf(spans[s].view, me, 1);
          int32_t a = off[spans[s].start], b = off[spans[s].start + spans[s].count];
          memcpy(v, node_buf(spans[s].view, me, 2) + a, (size_t)(b - a));
          v += b - a;
        }
      }
    } else {
      /* The elements: one span per source span. */
      size_t mark = (*g->scratch)->len;
      if (scratch_push(g->scratch, ns ? ns : 1) == NULL) return LARDER_ENOMEM;
      spans = (*g->scratch)->spans + first; /* the push may have moved them */
      span_t *child = (*g->scratch)->spans + mark;
      size_t nc = 0;
      for (size_t s = 0; s < ns; s++) {
        const int32_t *off = (const int32_t *)(const void *)node_buf(spans[s].view, me, 1);
        int32_t a = off[spans[s].start], b = off[spans[s].start + spans[s].count];
        if (b > a) child[nc++] = (span_t){spans[s].view, a, b - a};
      }
      if (g->fill) g->nodes[me] = nd;
      int rc = gather_node(g, &f->children[0], k, mark, nc);
      (*g->scratch)->len = mark;
      return rc;
    }
  } else if (f->type == LARDER_TYPE_STRUCT) {
    if (g->fill) g->nodes[me] = nd;
    for (int i = 0; i < f->num_children; i++) {
      int rc = gather_node(g, &f->children[i], k, first, ns);
      if (rc) return rc;
    }
    return 0;
  }
  if (g->fill) g->nodes[me] = nd;
  return 0;
}

/* Builds the top-level spans (one per pick) in scratch.  Consecutive picks
 * of consecutive rows of the same view merge into one span. */
static span_t *top_spans(layout_scratch_t **scratch, const layout_pick_t *picks, int64_t n,
                         size_t *ns) {
  span_t *s = scratch_push(scratch, (size_t)(n ? n : 1));
  if (s == NULL) return NULL;
  size_t k = 0;
  for (int64_t i = 0; i < n; i++) {
    if (k && s[k - 1].view == picks[i].view && s[k - 1].start + s[k - 1].count == picks[i].row) {
      s[k - 1].count++;
    } else {
      s[k++] = (span_t){picks[i].view, picks[i].row, 1};
    }
  }
  *ns = k;
  return s;
}

int64_t layout_gather_size(const pq_field_t *field, const layout_pick_t *picks, int64_t n,
                           layout_scratch_t **scratch) {
  if (*scratch) (*scratch)->len = 0;
  size_t ns;
  if (top_spans(scratch, picks, n, &ns) == NULL) return LARDER_ENOMEM;
  gather_ctx g = {scratch, 0, NULL, NULL, 0, NULL};
  int k = 0;
  int rc = gather_node(&g, field, &k, 0, ns);
  if (rc) return rc;
  return (int64_t)g.size;
}

int layout_gather(const pq_field_t *field, const layout_pick_t *picks, int64_t n,
                  layout_scratch_t **scratch, uint8_t *base, uint8_t *dst,
                  layout_node_t *nodes) {
  if (*scratch) (*scratch)->len = 0;
  size_t ns;
  if (top_spans(scratch, picks, n, &ns) == NULL) return LARDER_ENOMEM;
  gather_ctx g = {scratch, 1, base, dst, 0, nodes};
  int k = 0;
  return gather_node(&g, field, &k, 0, ns);
}
