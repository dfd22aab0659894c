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
#include <sys/mman.h>
#include <unistd.h>

#include "serve/layout.h"

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
    /* The analyzer does not see the bytes of an int32_t array initialized
     * element by element (hash_field's params) as initialized. */
    /* NOLINTNEXTLINE(clang-analyzer-core.uninitialized.Assign) */
    h ^= b[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

static uint64_t hash_field(uint64_t h, const pq_field_t *f) {
  h = fnv(h, f->name, strlen(f->name) + 1);
  int32_t params[8] = {(int32_t)f->type, f->nullable,      f->byte_width, f->precision,
                       f->scale,         (int32_t)f->unit, f->utc,        f->num_children};
  h = fnv(h, params, sizeof(params));
  for (int i = 0; i < f->num_children; i++) h = hash_field(h, &f->children[i]);
  return h;
}

uint64_t layout_field_hash(const pq_field_t *field) {
  return hash_field(0xcbf29ce484222325ull, field);
}

/* Bytes per slot of a fixed-width type, 0 for the others; BOOL is special
 * (bits) and reported as 0 too. */
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

static uint64_t put_buffer(uint8_t *blob, uint64_t *pos, const pq_buf_t *b, uint64_t *off,
                           uint64_t *len) {
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
  size_t w = pq_field_value_width(f);
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

int layout_view(const uint8_t *blob, size_t size, const pq_field_t *field, layout_view_t *view,
                char *why, size_t why_len) {
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
  checker c = {blob, size, (const layout_node_t *)(const void *)(blob + sizeof(*h)),
               n,    why,  why_len};
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
  uint64_t off = which == 0   ? nd->validity_offset
                 : which == 1 ? nd->offsets_offset
                              : nd->values_offset;
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
    else dst[d >> 3] &= (uint8_t) ~(1u << (d & 7));
  }
}

static void set_bits(uint8_t *dst, int64_t off, int64_t count) {
  for (int64_t i = 0; i < count; i++) dst[(off + i) >> 3] |= (uint8_t)(1u << ((off + i) & 7));
}

typedef struct gather_ctx {
  layout_scratch_t **scratch;
  int fill;      /* 0: size pass, 1: fill pass */
  uint8_t *base; /* fill: the arena */
  uint8_t *dst;  /* fill: where the next buffer goes */
  uint64_t size; /* size pass: bytes needed */
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

/*
 * The common case, a leaf column whose spans are single rows (a shuffled
 * batch's top-level columns): one tight loop per buffer instead of the
 * general span machinery.  Returns 1 when it handled the node.
 */
#define GATHER_AHEAD 16

static int gather_singletons(gather_ctx *g, const pq_field_t *f, int me, const span_t *spans,
                             size_t ns) {
  size_t w = pq_field_value_width(f);
  int var = is_var(f);
  if (f->num_children || (!w && !var && f->type != LARDER_TYPE_BOOL)) return 0;
  for (size_t s = 0; s < ns; s++)
    if (spans[s].count != 1) return 0;
  layout_node_t nd;
  memset(&nd, 0, sizeof(nd));
  int64_t len = (int64_t)ns, nulls = 0;
  for (size_t s = 0; s < ns; s++) {
    if (!g->fill && s + GATHER_AHEAD < ns) {
      /* The sizing pass is the first to touch each sample's row: start the
       * fetches of the buffers both passes will read. */
      const span_t *a = &spans[s + GATHER_AHEAD];
      const layout_node_t *an = &a->view->nodes[me];
      if (an->null_count) __builtin_prefetch(a->view->base + an->validity_offset + (a->start >> 3));
      if (var) __builtin_prefetch(a->view->base + an->offsets_offset + (size_t)a->start * 4);
      else if (w) __builtin_prefetch(a->view->base + an->values_offset + (size_t)a->start * w);
    }
    const layout_node_t *src = &spans[s].view->nodes[me];
    if (src->null_count) {
      const uint8_t *bits = spans[s].view->base + src->validity_offset;
      int64_t r = spans[s].start;
      nulls += !((bits[r >> 3] >> (r & 7)) & 1);
    }
  }
  nd.length = len;
  nd.null_count = nulls;
  if (nulls) {
    uint8_t *v = take(g, (uint64_t)(len + 7) / 8, &nd.validity_offset);
    nd.validity_length = (uint64_t)(len + 7) / 8;
    if (v) {
      memset(v, 0, (size_t)nd.validity_length);
      for (size_t s = 0; s < ns; s++) {
        const layout_node_t *src = &spans[s].view->nodes[me];
        int bit = 1;
        if (src->null_count) {
          const uint8_t *bits = spans[s].view->base + src->validity_offset;
          int64_t r = spans[s].start;
          bit = (bits[r >> 3] >> (r & 7)) & 1;
        }
        v[s >> 3] |= (uint8_t)(bit << (s & 7));
      }
    }
  }
  if (f->type == LARDER_TYPE_BOOL) {
    uint8_t *v = take(g, (uint64_t)(len + 7) / 8, &nd.values_offset);
    nd.values_length = (uint64_t)(len + 7) / 8;
    if (v) {
      memset(v, 0, (size_t)nd.values_length);
      for (size_t s = 0; s < ns; s++) {
        const uint8_t *src = spans[s].view->base + spans[s].view->nodes[me].values_offset;
        int64_t r = spans[s].start;
        v[s >> 3] |= (uint8_t)(((src[r >> 3] >> (r & 7)) & 1) << (s & 7));
      }
    }
  } else if (w) {
    uint8_t *v = take(g, (uint64_t)len * w, &nd.values_offset);
    nd.values_length = (uint64_t)len * w;
    if (v) {
/* Shuffled rows are random reads across a window of units, so the loop is
 * bound by memory latency: prefetching a few samples ahead keeps several
 * misses in flight. */
#define GATHER_W(T)                                                                    \
  for (size_t s = 0; s < ns; s++) {                                                    \
    if (s + GATHER_AHEAD < ns) {                                                       \
      const span_t *a = &spans[s + GATHER_AHEAD];                                      \
      __builtin_prefetch(a->view->base + a->view->nodes[me].values_offset +            \
                         (size_t)a->start * sizeof(T));                                \
    }                                                                                  \
    const uint8_t *src = spans[s].view->base + spans[s].view->nodes[me].values_offset; \
    T x;                                                                               \
    memcpy(&x, src + (size_t)spans[s].start * sizeof(T), sizeof(T));                   \
    memcpy(v + s * sizeof(T), &x, sizeof(T));                                          \
  }
      if (w == 4) {
        GATHER_W(uint32_t)
      } else if (w == 8) {
        GATHER_W(uint64_t)
      } else if (w == 2) {
        GATHER_W(uint16_t)
      } else if (w == 1) {
        GATHER_W(uint8_t)
      } else {
        for (size_t s = 0; s < ns; s++) {
          const uint8_t *src = spans[s].view->base + spans[s].view->nodes[me].values_offset;
          memcpy(v + s * w, src + (size_t)spans[s].start * w, w);
        }
      }
#undef GATHER_W
    }
  } else {
    uint64_t total = 0;
    for (size_t s = 0; s < ns; s++) {
      const layout_node_t *src = &spans[s].view->nodes[me];
      const int32_t *off =
          (const int32_t *)(const void *)(spans[s].view->base + src->offsets_offset);
      total += (uint64_t)(off[spans[s].start + 1] - off[spans[s].start]);
    }
    if (total > INT32_MAX) return LARDER_ELIMIT;
    int32_t *o = (int32_t *)(void *)take(g, (uint64_t)(len + 1) * 4, &nd.offsets_offset);
    nd.offsets_length = (uint64_t)(len + 1) * 4;
    uint8_t *v = take(g, total, &nd.values_offset);
    nd.values_length = total;
    if (o) {
      int32_t cur = 0;
      o[0] = 0;
      for (size_t s = 0; s < ns; s++) {
        if (s + GATHER_AHEAD / 2 < ns) {
          /* The sizing pass brought the offsets in; fetch the values they
           * point at, first and last line. */
          const span_t *p = &spans[s + GATHER_AHEAD / 2];
          const layout_node_t *pn = &p->view->nodes[me];
          const int32_t *po = (const int32_t *)(const void *)(p->view->base + pn->offsets_offset);
          const uint8_t *pv = p->view->base + pn->values_offset;
          __builtin_prefetch(pv + po[p->start]);
          __builtin_prefetch(pv + po[p->start + 1] - 1);
        }
        const layout_node_t *src = &spans[s].view->nodes[me];
        const uint8_t *base = spans[s].view->base;
        const int32_t *off = (const int32_t *)(const void *)(base + src->offsets_offset);
        int32_t a = off[spans[s].start], b = off[spans[s].start + 1];
        if (b > a) memcpy(v + cur, base + src->values_offset + a, (size_t)(b - a));
        cur += b - a;
        o[s + 1] = cur;
      }
    }
  }
  if (g->fill) g->nodes[me] = nd;
  return 1;
}

/* The length and null count of node me over the spans, into nd.  Offsets
 * of shuffled samples are random reads: this pass starts the misses of the
 * coming spans, so that the copies after it find them in cache. */
static void gather_count(const pq_field_t *f, int me, const span_t *spans, size_t ns,
                         layout_node_t *nd) {
  int64_t len = 0, nulls = 0;
  int has_offsets = is_var(f) || is_list(f);
  for (size_t s = 0; s < ns; s++) {
    if (has_offsets && s + GATHER_AHEAD < ns) {
      const span_t *a = &spans[s + GATHER_AHEAD];
      const int32_t *ao = (const int32_t *)(const void *)node_buf(a->view, me, 1);
      __builtin_prefetch(ao + a->start);
      __builtin_prefetch(ao + a->start + a->count);
    }
    len += spans[s].count;
    nulls += count_nulls(spans[s].view, me, spans[s].start, spans[s].count);
  }
  nd->length = len;
  nd->null_count = f->type == LARDER_TYPE_NULL ? len : nulls;
}

/* The validity bitmap of node me, when it has nulls (all clear for a NULL
 * column). */
static void gather_validity(gather_ctx *g, const pq_field_t *f, int me, const span_t *spans,
                            size_t ns, layout_node_t *nd) {
  int64_t len = nd->length;
  uint8_t *v = take(g, (uint64_t)(len + 7) / 8, &nd->validity_offset);
  nd->validity_length = (uint64_t)(len + 7) / 8;
  if (v == NULL) return;
  memset(v, 0, (size_t)nd->validity_length);
  int64_t pos = 0;
  if (f->type == LARDER_TYPE_NULL) return;
  for (size_t s = 0; s < ns; s++) {
    const span_t *sp = &spans[s];
    const layout_node_t *src = &sp->view->nodes[me];
    if (src->null_count == 0) set_bits(v, pos, sp->count);
    else copy_bits(v, pos, node_buf(sp->view, me, 0), sp->start, sp->count);
    pos += sp->count;
  }
}

/* The values of a BOOL node: bits. */
static void gather_bools(gather_ctx *g, int me, const span_t *spans, size_t ns, layout_node_t *nd) {
  int64_t len = nd->length;
  uint8_t *v = take(g, (uint64_t)(len + 7) / 8, &nd->values_offset);
  nd->values_length = (uint64_t)(len + 7) / 8;
  if (v == NULL) return;
  memset(v, 0, (size_t)nd->values_length);
  int64_t pos = 0;
  for (size_t s = 0; s < ns; s++) {
    copy_bits(v, pos, node_buf(spans[s].view, me, 2), spans[s].start, spans[s].count);
    pos += spans[s].count;
  }
}

/* The values of a node of fixed width w bytes (4 and 8 have copies of
 * their own, which the compiler makes into moves). */
static void gather_fixed(gather_ctx *g, int me, const span_t *spans, size_t ns, size_t w,
                         layout_node_t *nd) {
  int64_t len = nd->length;
  uint8_t *v = take(g, (uint64_t)len * w, &nd->values_offset);
  nd->values_length = (uint64_t)len * w;
  if (v == NULL) return;
  uint8_t *o = v;
  /* Each span is a random read (a list's elements, say): prefetch the
   * first and last line of the span GATHER_AHEAD ahead. */
#define GATHER_SPAN_PREFETCH(s)                                         \
  if ((s) + GATHER_AHEAD < ns) {                                        \
    const span_t *a = &spans[(s) + GATHER_AHEAD];                       \
    const uint8_t *p = node_buf(a->view, me, 2) + (size_t)a->start * w; \
    __builtin_prefetch(p);                                              \
    __builtin_prefetch(p + (size_t)a->count * w - 1);                   \
  }
  if (w == 4) {
    for (size_t s = 0; s < ns; s++) {
      GATHER_SPAN_PREFETCH(s)
      const uint8_t *src = node_buf(spans[s].view, me, 2) + (size_t)spans[s].start * 4;
      if (spans[s].count == 1) memcpy(o, src, 4);
      else memcpy(o, src, (size_t)spans[s].count * 4);
      o += (size_t)spans[s].count * 4;
    }
  } else if (w == 8) {
    for (size_t s = 0; s < ns; s++) {
      GATHER_SPAN_PREFETCH(s)
      const uint8_t *src = node_buf(spans[s].view, me, 2) + (size_t)spans[s].start * 8;
      if (spans[s].count == 1) memcpy(o, src, 8);
      else memcpy(o, src, (size_t)spans[s].count * 8);
      o += (size_t)spans[s].count * 8;
    }
  } else {
    for (size_t s = 0; s < ns; s++) {
      GATHER_SPAN_PREFETCH(s)
      memcpy(o, node_buf(spans[s].view, me, 2) + (size_t)spans[s].start * w,
             (size_t)spans[s].count * w);
      o += (size_t)spans[s].count * w;
    }
  }
#undef GATHER_SPAN_PREFETCH
}

/* The offsets of a variable-width or LIST node, rebased to start at 0, and
 * in *total the bytes (or child rows) they span.  Returns 0, or
 * LARDER_ELIMIT when that passes INT32_MAX (the batch cannot hold it). */
static int gather_offsets(gather_ctx *g, int me, const span_t *spans, size_t ns, layout_node_t *nd,
                          uint64_t *total) {
  int64_t len = nd->length;
  *total = 0;
  for (size_t s = 0; s < ns; s++) {
    const int32_t *off = (const int32_t *)(const void *)node_buf(spans[s].view, me, 1);
    *total += (uint64_t)(off[spans[s].start + spans[s].count] - off[spans[s].start]);
  }
  if (*total > INT32_MAX) return LARDER_ELIMIT;
  int32_t *o = (int32_t *)(void *)take(g, (uint64_t)(len + 1) * 4, &nd->offsets_offset);
  nd->offsets_length = (uint64_t)(len + 1) * 4;
  if (o == NULL) return 0;
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
  return 0;
}

/* The bytes of a variable-width node (total of them, gather_offsets). */
static void gather_bytes(gather_ctx *g, int me, const span_t *spans, size_t ns, uint64_t total,
                         layout_node_t *nd) {
  uint8_t *v = take(g, total, &nd->values_offset);
  nd->values_length = total;
  if (v == NULL) return;
  for (size_t s = 0; s < ns; s++) {
    if (s + GATHER_AHEAD < ns) {
      const span_t *p = &spans[s + GATHER_AHEAD];
      const int32_t *po = (const int32_t *)(const void *)node_buf(p->view, me, 1);
      const uint8_t *pv = node_buf(p->view, me, 2);
      __builtin_prefetch(pv + po[p->start]);
      __builtin_prefetch(pv + po[p->start + p->count] - 1);
    }
    const int32_t *off = (const int32_t *)(const void *)node_buf(spans[s].view, me, 1);
    int32_t a = off[spans[s].start], b = off[spans[s].start + spans[s].count];
    memcpy(v, node_buf(spans[s].view, me, 2) + a, (size_t)(b - a));
    v += b - a;
  }
}

static int gather_node(gather_ctx *g, const pq_field_t *f, int *k, size_t first, size_t ns);

/* A LIST node's elements: one child span per source span (pushed on the
 * scratch stack, above the spans at first), gathered as node *k on.  nd
 * (the list's own node) is written first, as gather_node would.  Returns
 * 0 or a negative code. */
static int gather_list_elements(gather_ctx *g, const pq_field_t *f, int *k, int me, size_t first,
                                size_t ns, const layout_node_t *nd) {
  size_t mark = (*g->scratch)->len;
  if (scratch_push(g->scratch, ns ? ns : 1) == NULL) return LARDER_ENOMEM;
  const span_t *spans = (*g->scratch)->spans + first; /* the push may have moved them */
  span_t *child = (*g->scratch)->spans + mark;
  size_t nc = 0;
  for (size_t s = 0; s < ns; s++) {
    const int32_t *off = (const int32_t *)(const void *)node_buf(spans[s].view, me, 1);
    int32_t a = off[spans[s].start], b = off[spans[s].start + spans[s].count];
    if (b > a) child[nc++] = (span_t){spans[s].view, a, b - a};
  }
  if (g->fill) g->nodes[me] = *nd;
  int rc = gather_node(g, &f->children[0], k, mark, nc);
  (*g->scratch)->len = mark;
  return rc;
}

/* Gathers field f's node (number *k, then its children's) from the spans
 * at first (ns of them) in the scratch stack: sizes only, or fills the
 * batch when g->fill.  Spans are passed as a position in the scratch
 * stack, not a pointer: a list level pushes its children's spans, which
 * may move the stack.  Returns 0 or a negative code. */
static int gather_node(gather_ctx *g, const pq_field_t *f, int *k, size_t first, size_t ns) {
  const span_t *spans = (*g->scratch)->spans + first;
  int me = (*k)++;
  int fast = gather_singletons(g, f, me, spans, ns);
  if (fast) return fast < 0 ? fast : 0;
  layout_node_t nd;
  memset(&nd, 0, sizeof(nd));
  gather_count(f, me, spans, ns, &nd);
  if (nd.null_count > 0) gather_validity(g, f, me, spans, ns, &nd);
  size_t w = pq_field_value_width(f);
  if (f->type == LARDER_TYPE_BOOL) {
    gather_bools(g, me, spans, ns, &nd);
  } else if (w) {
    gather_fixed(g, me, spans, ns, w, &nd);
  } else if (is_var(f) || is_list(f)) {
    /* Offsets, then either the bytes or the child's rows. */
    uint64_t total;
    int rc = gather_offsets(g, me, spans, ns, &nd, &total);
    if (rc) return rc;
    if (!is_var(f)) return gather_list_elements(g, f, k, me, first, ns, &nd);
    gather_bytes(g, me, spans, ns, total, &nd);
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
                  layout_scratch_t **scratch, uint8_t *base, uint8_t *dst, layout_node_t *nodes) {
  if (*scratch) (*scratch)->len = 0;
  size_t ns;
  if (top_spans(scratch, picks, n, &ns) == NULL) return LARDER_ENOMEM;
  gather_ctx g = {scratch, 1, base, dst, 0, nodes};
  int k = 0;
  return gather_node(&g, field, &k, 0, ns);
}

/* ------------------------------------------------------------------------ */
/* Row blocks                                                                */

/* The element width of a LIST of fixed-width values that a row block can
 * inline, or 0. */
static uint32_t inline_list_width(const pq_field_t *f) {
  if (f->type != LARDER_TYPE_LIST || f->num_children != 1) return 0;
  const pq_field_t *e = &f->children[0];
  if (e->num_children || e->type == LARDER_TYPE_BOOL) return 0;
  return (uint32_t)pq_field_value_width(e);
}

/* The slot kind of a top-level column, or -1 when it stays out of the row
 * block. */
static int slot_kind(const pq_field_t *f) {
  size_t w = pq_field_value_width(f);
  if (w > 0 && w <= 16) return LAYOUT_SLOT_FIXED;
  if (f->type == LARDER_TYPE_BOOL) return LAYOUT_SLOT_BOOL;
  if (is_var(f)) return LAYOUT_SLOT_VAR;
  if (inline_list_width(f)) return LAYOUT_SLOT_LIST;
  return -1;
}

int layout_rowplan_make(const pq_field_t *schema, layout_rowplan_t **out) {
  *out = NULL;
  int nc = schema->num_children;
  layout_rowplan_t *p = calloc(1, sizeof(*p));
  if (p == NULL) return LARDER_ENOMEM;
  p->packed = calloc((size_t)(nc ? nc : 1), sizeof(*p->packed));
  p->slot_of = calloc((size_t)(nc ? nc : 1), sizeof(int));
  if (p->packed == NULL || p->slot_of == NULL) {
    layout_rowplan_free(p);
    return LARDER_ENOMEM;
  }
  int nullable = 0;
  for (int c = 0; c < nc; c++) {
    const pq_field_t *f = &schema->children[c];
    int kind = slot_kind(f);
    p->slot_of[c] = -1;
    /* inline_lists has a bit per slot. */
    if (kind < 0 || (kind == LAYOUT_SLOT_LIST && p->num_packed >= 64)) continue;
    int k = p->num_packed++;
    p->slot_of[c] = k;
    p->packed[k].column = c;
    p->packed[k].kind = kind;
    p->packed[k].width = kind == LAYOUT_SLOT_FIXED  ? (uint32_t)pq_field_value_width(f)
                         : kind == LAYOUT_SLOT_BOOL ? 1
                                                    : 12;
    p->packed[k].elem_width = kind == LAYOUT_SLOT_LIST ? inline_list_width(f) : 0;
    p->packed[k].nullbit = f->nullable ? nullable++ : -1;
    p->has_inline |= kind == LAYOUT_SLOT_VAR || kind == LAYOUT_SLOT_LIST;
  }
  if (p->num_packed == 0) {
    layout_rowplan_free(p);
    return 0;
  }
  /* The null mask first, then the slots in column order. */
  p->null_bytes = (uint32_t)(nullable + 7) / 8;
  uint32_t off = p->null_bytes;
  for (int k = 0; k < p->num_packed; k++) {
    p->packed[k].offset = off;
    off += p->packed[k].width;
  }
  p->stride = off;
  *out = p;
  return 0;
}

void layout_rowplan_free(layout_rowplan_t *plan) {
  if (plan == NULL) return;
  free(plan->packed);
  free(plan->slot_of);
  free(plan);
}

/*
 * A row block is read at random, a row per sample, across every unit in
 * memory (hundreds of MiB).  In 4 KiB pages nearly every sample misses the
 * TLB as well as the caches, and the page walk (two-dimensional in a
 * virtual machine) costs about as much as the miss itself.  So a block of
 * ROWS_HUGE_MIN bytes or more gets a mapping of its own, aligned to 2 MiB
 * and marked for transparent huge pages (which the kernel grants where THP
 * is enabled for madvise or always): its whole 2 MiB pieces, and its last
 * piece too when rounding it up to a whole huge page wastes at most an
 * eighth of the block; otherwise the tail stays in small pages.  A block
 * with no huge page to gain (under 2 MiB, not rounded up) comes from
 * malloc.  The mapped bytes count towards the unit's memory.  Should mmap
 * fail (no address space, or vm.max_map_count reached), the block comes
 * from malloc too.
 */
#define ROWS_HUGE 2097152ull
#define ROWS_HUGE_MIN (1ull << 20)

static uint8_t *rows_alloc(uint64_t bytes, uint64_t *mapped) {
  *mapped = 0;
  uint64_t whole = bytes & ~(ROWS_HUGE - 1), tail = bytes - whole;
  uint64_t huge_len = tail && ROWS_HUGE - tail <= bytes / 8 ? whole + ROWS_HUGE : whole;
  if (bytes >= ROWS_HUGE_MIN && huge_len > 0) {
    long page = sysconf(_SC_PAGESIZE);
    uint64_t pg = page > 0 ? (uint64_t)page : 4096;
    uint64_t len = huge_len > bytes ? huge_len : (bytes + pg - 1) / pg * pg;
    uint8_t *p =
        mmap(NULL, len + ROWS_HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
      /* Keep [a, a + len) of the mapping, a on a 2 MiB boundary. */
      uint8_t *a = p + ((ROWS_HUGE - (uintptr_t)p % ROWS_HUGE) % ROWS_HUGE);
      if (a > p) munmap(p, (size_t)(a - p));
      munmap(a + len, (size_t)(p + ROWS_HUGE - a));
      /* Without THP in the kernel this fails, and the block is in small
       * pages: slower, but correct. */
      (void)madvise(a, huge_len, MADV_HUGEPAGE);
      *mapped = len;
      return a;
    }
  }
  return calloc((size_t)(bytes ? bytes : 1), 1);
}

void layout_rows_free(layout_rows_t *r) {
  if (r->mapped) munmap(r->data, r->mapped);
  else free(r->data);
  free(r->start);
  memset(r, 0, sizeof(*r));
}

/* Where a packed column's buffers lie in its view. */
typedef struct slot_src {
  const uint8_t *bits; /* validity, or NULL */
  const uint8_t *vals; /* values (for a LIST: the elements') */
  const int32_t *offs; /* VAR and LIST */
  int64_t length;
  int inline_list; /* LIST: inlined in this unit */
} slot_src_t;

/* The bytes row r keeps inline for slot k. */
static uint64_t inline_bytes(const layout_rowplan_t *plan, const slot_src_t *src, int k,
                             int64_t r) {
  if (r >= src[k].length) return 0;
  if (plan->packed[k].kind == LAYOUT_SLOT_VAR) {
    uint64_t len = (uint64_t)(src[k].offs[r + 1] - src[k].offs[r]);
    return len <= LAYOUT_INLINE_MAX ? len : 0;
  }
  if (plan->packed[k].kind == LAYOUT_SLOT_LIST && src[k].inline_list)
    return (uint64_t)(src[k].offs[r + 1] - src[k].offs[r]) * plan->packed[k].elem_width;
  return 0;
}

int layout_rows_build(const layout_rowplan_t *plan, const layout_view_t *views, int64_t rows,
                      layout_rows_t *out) {
  memset(out, 0, sizeof(*out));
  int np = plan->num_packed;
  slot_src_t *src = calloc((size_t)(np ? np : 1), sizeof(*src));
  if (src == NULL) return LARDER_ENOMEM;
  for (int k = 0; k < np; k++) {
    const layout_view_t *v = &views[plan->packed[k].column];
    const layout_node_t *nd = &v->nodes[0];
    src[k].bits = nd->null_count ? v->base + nd->validity_offset : NULL;
    src[k].length = nd->length < rows ? nd->length : rows;
    int kind = plan->packed[k].kind;
    if (kind == LAYOUT_SLOT_VAR || kind == LAYOUT_SLOT_LIST)
      src[k].offs = (const int32_t *)(const void *)(v->base + nd->offsets_offset);
    if (kind == LAYOUT_SLOT_LIST) {
      /* Elements with nulls would need a bitmap per row, and long lists
       * gain nothing from a second copy: those stay in the blob. */
      const layout_node_t *el = &v->nodes[1];
      src[k].vals = v->base + el->values_offset;
      src[k].inline_list =
          el->null_count == 0 && (uint64_t)el->length * plan->packed[k].elem_width <=
                                     (uint64_t)(rows ? rows : 1) * LAYOUT_INLINE_MAX;
      if (src[k].inline_list) out->inline_lists |= 1ull << k;
    } else {
      src[k].vals = v->base + nd->values_offset;
    }
  }
  /* Rows of about the same size (the common case: the same fields, values
   * of similar length) get one stride, the longest row's, so that finding
   * a row costs no lookup; rows that vary more are packed, with an index of
   * their starts. */
  uint64_t total = 0, longest = plan->stride;
  out->stride = plan->stride;
  if (plan->has_inline) {
    out->start = malloc((size_t)(rows + 1) * sizeof(uint64_t));
    if (out->start == NULL) goto nomem;
    for (int64_t r = 0; r < rows; r++) {
      uint64_t size = plan->stride;
      for (int k = 0; k < np; k++) size += inline_bytes(plan, src, k, r);
      size = (size + 7) & ~(uint64_t)7; /* rows start 8-byte aligned */
      out->start[r] = total;
      total += size;
      if (size > longest) longest = size;
    }
    out->start[rows] = total;
    if (longest <= UINT32_MAX && longest * (uint64_t)rows <= total + total / 4) {
      free(out->start);
      out->start = NULL;
      out->stride = (uint32_t)longest;
    }
  }
  if (out->start == NULL) total = (uint64_t)rows * out->stride;
  out->data = rows_alloc(total, &out->mapped);
  if (out->data == NULL) goto nomem;
  out->bytes = (out->mapped ? out->mapped : total) +
               (out->start ? (uint64_t)(rows + 1) * sizeof(uint64_t) : 0);
  for (int64_t r = 0; r < rows; r++) {
    uint8_t *row = out->data + (out->start ? out->start[r] : (uint64_t)r * out->stride);
    uint64_t pos = plan->stride;
    for (int k = 0; k < np; k++) {
      const slot_src_t *sk = &src[k];
      if (r >= sk->length) continue;
      uint32_t off = plan->packed[k].offset;
      switch (plan->packed[k].kind) {
        case LAYOUT_SLOT_BOOL: row[off] = (sk->vals[r >> 3] >> (r & 7)) & 1; break;
        case LAYOUT_SLOT_FIXED:
          memcpy(row + off, sk->vals + (size_t)r * plan->packed[k].width, plan->packed[k].width);
          break;
        case LAYOUT_SLOT_VAR: {
          const uint8_t *ptr = sk->vals + sk->offs[r];
          uint32_t len = (uint32_t)(sk->offs[r + 1] - sk->offs[r]);
          if (len <= LAYOUT_INLINE_MAX) {
            memcpy(row + pos, ptr, len);
            ptr = row + pos;
            pos += len;
          }
          memcpy(row + off, &ptr, 8);
          memcpy(row + off + 8, &len, 4);
          break;
        }
        default: /* LAYOUT_SLOT_LIST */
          if (sk->inline_list) {
            uint32_t count = (uint32_t)(sk->offs[r + 1] - sk->offs[r]);
            uint64_t bytes = (uint64_t)count * plan->packed[k].elem_width;
            const uint8_t *ptr = row + pos;
            memcpy(row + pos, sk->vals + (size_t)sk->offs[r] * plan->packed[k].elem_width,
                   (size_t)bytes);
            pos += bytes;
            memcpy(row + off, &ptr, 8);
            memcpy(row + off + 8, &count, 4);
          }
          break;
      }
      if (plan->packed[k].nullbit >= 0 && sk->bits && !((sk->bits[r >> 3] >> (r & 7)) & 1)) {
        int b = plan->packed[k].nullbit;
        row[b >> 3] |= (uint8_t)(1u << (b & 7));
      }
    }
  }
  free(src);
  return 0;
nomem:
  free(src);
  layout_rows_free(out);
  return LARDER_ENOMEM;
}

void layout_rows_count_nulls(const layout_rowplan_t *plan, const uint8_t *tmp, int64_t n,
                             int64_t *nulls_by_bit) {
  uint32_t nbytes = plan->null_bytes, stride = plan->stride;
  memset(nulls_by_bit, 0, (size_t)nbytes * 8 * sizeof(int64_t));
  for (int64_t s = 0; s < n; s++) {
    const uint8_t *mask = tmp + (size_t)s * stride;
    for (uint32_t j = 0; j < nbytes; j++) {
      /* Nulls are rare in training data: most masks are all zero. */
      for (unsigned m = mask[j]; m; m &= m - 1) nulls_by_bit[j * 8 + (unsigned)__builtin_ctz(m)]++;
    }
  }
}

int layout_rows_num_nodes(const layout_rowplan_t *plan, int p) {
  return plan->packed[p].kind == LAYOUT_SLOT_LIST ? 2 : 1;
}

/* The validity bitmap of n samples from null bit nb of their rows in tmp,
 * into p8 (padded to LAYOUT_ALIGN); returns the bytes taken. */
static uint64_t rows_validity(const uint8_t *tmp, uint32_t stride, int nb, int64_t n, uint8_t *p8,
                              uint8_t *base, layout_node_t *node) {
  uint64_t vl = (uint64_t)(n + 7) / 8;
  memset(p8, 0, align_up(vl));
  for (int64_t s = 0; s < n; s++)
    if (!((tmp[(size_t)s * stride + (nb >> 3)] >> (nb & 7)) & 1))
      p8[s >> 3] |= (uint8_t)(1u << (s & 7));
  node->validity_offset = (uint64_t)(p8 - base);
  node->validity_length = vl;
  return align_up(vl);
}

/* Samples ahead of the copy whose values layout_rows_values prefetches,
 * and the most bytes of one value it prefetches (a longer value streams in
 * behind its first lines). */
#define VALUE_AHEAD 16
#define VALUE_PREFETCH_MAX 1024

/* Offsets, and room for the bytes (or elements of elem bytes) the rows'
 * slots point at, for a VAR or LIST slot: node[0] gets the offsets, and
 * values for VAR; a LIST's elements go to node[1].  *values: where the
 * values go. */
static int64_t rows_var_column(const layout_rowplan_t *plan, int p, const uint8_t *tmp, int64_t n,
                               int64_t nulls, int size_only, uint8_t *base, uint8_t *dst,
                               layout_node_t *node, uint8_t **values) {
  uint32_t off = plan->packed[p].offset, stride = plan->stride;
  int is_list = plan->packed[p].kind == LAYOUT_SLOT_LIST;
  uint64_t elem = is_list ? plan->packed[p].elem_width : 1;
  uint64_t total = 0;
  for (int64_t s = 0; s < n; s++) {
    uint32_t len;
    memcpy(&len, tmp + (size_t)s * stride + off + 8, 4);
    total += len;
  }
  if (total > INT32_MAX) return LARDER_ELIMIT;
  uint64_t size = (nulls ? align_up((uint64_t)(n + 7) / 8) : 0) + align_up((uint64_t)(n + 1) * 4) +
                  align_up(total * elem);
  if (size_only) return (int64_t)size;
  memset(node, 0, sizeof(*node) * (is_list ? 2 : 1));
  node->length = n;
  node->null_count = nulls;
  uint8_t *p8 = dst;
  if (nulls) p8 += rows_validity(tmp, stride, plan->packed[p].nullbit, n, p8, base, node);
  int32_t *o = (int32_t *)(void *)p8;
  node->offsets_offset = (uint64_t)(p8 - base);
  node->offsets_length = (uint64_t)(n + 1) * 4;
  p8 += align_up((uint64_t)(n + 1) * 4);
  layout_node_t *vnode = node;
  if (is_list) {
    vnode = node + 1;
    vnode->length = (int64_t)total;
  }
  /* An empty buffer has offset 0, as layout_gather leaves it. */
  vnode->values_offset = total ? (uint64_t)(p8 - base) : 0;
  vnode->values_length = total * elem;
  /* The values themselves are layout_rows_values's, a sample at a time
   * over every such column. */
  int32_t cur = 0;
  o[0] = 0;
  for (int64_t s = 0; s < n; s++) {
    uint32_t len;
    memcpy(&len, tmp + (size_t)s * stride + off + 8, 4);
    cur += (int32_t)len;
    o[s + 1] = cur;
  }
  *values = p8;
  memset((uint8_t *)o + (n + 1) * 4, 0, align_up((uint64_t)(n + 1) * 4) - (uint64_t)(n + 1) * 4);
  memset(p8 + total * elem, 0, align_up(total * elem) - total * elem);
  return (int64_t)size;
}

int64_t layout_rows_column(const layout_rowplan_t *plan, int p, const uint8_t *tmp, int64_t n,
                           const int64_t *nulls_by_bit, int size_only, uint8_t *base, uint8_t *dst,
                           layout_node_t *node, uint8_t **values) {
  uint32_t w = plan->packed[p].width, off = plan->packed[p].offset, stride = plan->stride;
  int nb = plan->packed[p].nullbit;
  int is_bool = plan->packed[p].kind == LAYOUT_SLOT_BOOL;
  int64_t nulls = nb >= 0 ? nulls_by_bit[nb] : 0;
  if (plan->packed[p].kind == LAYOUT_SLOT_VAR || plan->packed[p].kind == LAYOUT_SLOT_LIST)
    return rows_var_column(plan, p, tmp, n, nulls, size_only, base, dst, node, values);
  /* BOOL is packed as one byte per row; its Arrow form is a bitmap. */
  uint64_t vbytes = is_bool ? (uint64_t)(n + 7) / 8 : (uint64_t)n * w;
  uint64_t size = (nulls ? align_up((uint64_t)(n + 7) / 8) : 0) + align_up(vbytes);
  if (size_only) return (int64_t)size;
  memset(node, 0, sizeof(*node));
  node->length = n;
  node->null_count = nulls;
  uint8_t *p8 = dst;
  if (nulls) p8 += rows_validity(tmp, stride, nb, n, p8, base, node);
  node->values_offset = (uint64_t)(p8 - base);
  node->values_length = vbytes;
  const uint8_t *src = tmp + off;
  if (is_bool) {
    memset(p8, 0, (size_t)vbytes);
    for (int64_t s = 0; s < n; s++)
      if (src[(size_t)s * stride]) p8[s >> 3] |= (uint8_t)(1u << (s & 7));
  } else switch (w) {
      case 4:
        for (int64_t s = 0; s < n; s++) memcpy(p8 + (size_t)s * 4, src + (size_t)s * stride, 4);
        break;
      case 8:
        for (int64_t s = 0; s < n; s++) memcpy(p8 + (size_t)s * 8, src + (size_t)s * stride, 8);
        break;
      default:
        for (int64_t s = 0; s < n; s++) memcpy(p8 + (size_t)s * w, src + (size_t)s * stride, w);
        break;
    }
  memset(p8 + vbytes, 0, align_up(vbytes) - vbytes);
  return (int64_t)size;
}

/* The value slot p of a row in tmp points at, and in *bytes its size. */
static inline const uint8_t *slot_value(const layout_rowplan_t *plan, int p, const uint8_t *row,
                                        uint64_t *bytes) {
  const uint8_t *ptr;
  uint32_t len;
  memcpy(&ptr, row + plan->packed[p].offset, 8);
  memcpy(&len, row + plan->packed[p].offset + 8, 4);
  *bytes =
      plan->packed[p].kind == LAYOUT_SLOT_LIST ? (uint64_t)len * plan->packed[p].elem_width : len;
  return ptr;
}

void layout_rows_values(const layout_rowplan_t *plan, const int *slots, uint8_t **cursor, int ns,
                        const uint8_t *tmp, int64_t n) {
  uint32_t stride = plan->stride;
  for (int64_t s = 0; s < n; s++) {
    const uint8_t *row = tmp + (size_t)s * stride;
    if (s + VALUE_AHEAD < n) {
      /* The sample's inline values lie together after its fixed part, in
       * lines that nothing fetched yet. */
      const uint8_t *ahead = row + (size_t)VALUE_AHEAD * stride;
      for (int j = 0; j < ns; j++) {
        uint64_t bytes;
        const uint8_t *ptr = slot_value(plan, slots[j], ahead, &bytes);
        if (bytes > VALUE_PREFETCH_MAX) bytes = VALUE_PREFETCH_MAX;
        for (uint64_t at = 0; at < bytes; at += 64) __builtin_prefetch(ptr + at);
        if (bytes) __builtin_prefetch(ptr + bytes - 1);
      }
    }
    for (int j = 0; j < ns; j++) {
      uint64_t bytes;
      const uint8_t *ptr = slot_value(plan, slots[j], row, &bytes);
      if (bytes) memcpy(cursor[j], ptr, (size_t)bytes);
      cursor[j] += bytes;
    }
  }
}
