/*
 * fuzz-ring.c: libFuzzer target over what the two sides of a stream's
 * descriptor ring (client/ring.h) read from each other.
 *
 * The client side (most of the input) runs liblarder's own code on a
 * stream made without a daemon: a schema (llib_field_copy,
 * llib_plan_stream), an arena of up to 64 KiB, and a ring whose header
 * the input may corrupt before the open (llib_ring_snapshot) and rewrite
 * after it.  Then a sequence of steps: the "daemon" publishes descriptors
 * with any contents and counts, rewrites the header or the arena, and the
 * client takes descriptors (llib_ring_take), builds batches from them
 * (llib_batch_make, which checks each against the arena), hands them to a
 * consumer (the accessors, larder_batch_describe, larder_batch_export,
 * larder_batch_export_dlpack) and releases them into the ring
 * (llib_batch_release).  What is promised is checked:
 *
 * - llib_ring_snapshot accepts exactly the headers ring_valid accepts with
 *   at most LARDER_MAX_WINDOW slots, and then every descriptor slot and
 *   release entry lies inside the ring;
 * - llib_ring_take refuses (LARDER_EPROTO) exactly the published counts
 *   more than a window ahead, and takes descriptors in order;
 * - a batch made has every buffer its arrays' types and lengths call for
 *   inside the arena: validity bitmaps, offsets (the first and last in
 *   order and within the values or the child), fixed-width values (a
 *   number's aligned to its width, up to 8 bytes) and bits, struct
 *   children no shorter than their parent, columns no shorter than the
 *   batch (which exports as a struct); the consumers
 *   read every such byte (the arena is an exact-size allocation, so ASan
 *   reports a read past it);
 * - releases are written at the client's own layout, whatever the header
 *   says now, and `released` counts them.
 *
 * The daemon side reads releases through ring.h's inline functions and its
 * own ring_layout_t (daemon/serve/stream.c, ring_drain); the checks of
 * each entry against the batches sent (release_one) are static there and
 * not driven here.  The last part of the input scribbles over a ring the
 * "daemon" made and checks that what ring.h gives the daemon stays inside
 * it, and that ring_sleep_target keeps its promises.
 *
 * Input: see struct reader and the read_* functions; seeds (well-formed
 * streams of several schemas) are written by LLVMFuzzerInitialize when
 * LARDER_FUZZ_SEED_DIR is set.  A broken promise aborts, which libFuzzer
 * reports as a crash.
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define FUZZ_CHECK(cond)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: broken promise: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                   \
    }                                                                            \
  } while (0)

#define MAX_NODES 32
#define MAX_DEPTH 5
#define MAX_SLOTS 8
#define MAX_HELD 16
#define MAX_STEPS 256

/* ------------------------------------------------------------------------ */
/* Reading the input                                                         */

typedef struct reader {
  const uint8_t *p;
  size_t left;
} reader_t;

static uint8_t read_u8(reader_t *r) {
  if (r->left == 0) return 0;
  r->left--;
  return *r->p++;
}

static uint64_t read_le(reader_t *r, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; i++) v |= (uint64_t)read_u8(r) << (8 * i);
  return v;
}

/* A value of a descriptor: small ones in a byte, arena-sized ones in
 * three, any in nine, and ones near the top of the range in two (to reach
 * the wrap-arounds of offset + length). */
static uint64_t read_value(reader_t *r) {
  uint8_t b = read_u8(r);
  if (b < 0xC0) return b;
  if (b < 0xFE) return read_le(r, 2);
  if (b == 0xFE) return read_le(r, 8);
  return UINT64_MAX - read_u8(r);
}

/* ------------------------------------------------------------------------ */
/* The schema                                                                */

typedef struct schema_in {
  Larder__Field nodes[MAX_NODES];
  Larder__Field *kids[MAX_NODES];
  int used, kids_used;
} schema_in_t;

static int is_container(uint32_t type) {
  return type == LARDER_TYPE_STRUCT || type == LARDER_TYPE_LIST || type == LARDER_TYPE_LARGE_LIST ||
         type == LARDER_TYPE_MAP;
}

/* One node in pre-order: type (mod LARDER_TYPE_COUNT_ + 1: the last is
 * unknown), attributes (bit 0 nullable, 1-2 unit, 3 utc, 4-5 children, 6
 * children even for a type without), byte width (minus 128). */
static Larder__Field *read_node(reader_t *r, schema_in_t *in, int depth) {
  if (in->used == MAX_NODES) return NULL;
  Larder__Field *f = &in->nodes[in->used++];
  larder__field__init(f);
  f->name = (char *)"f";
  f->type = read_u8(r) % (LARDER_TYPE_COUNT_ + 1);
  uint8_t attrs = read_u8(r);
  f->nullable = attrs & 1;
  f->unit = (attrs >> 1) & 3;
  f->utc = (attrs >> 3) & 1;
  f->byte_width = (int32_t)read_u8(r) - 128;
  f->precision = 10;
  f->scale = 2;
  size_t kids =
      (is_container(f->type) || (attrs & 0x40)) && depth < MAX_DEPTH ? (attrs >> 4) & 3 : 0;
  if (kids > (size_t)(MAX_NODES - in->kids_used)) kids = (size_t)(MAX_NODES - in->kids_used);
  f->children = in->kids + in->kids_used;
  in->kids_used += (int)kids;
  for (size_t i = 0; i < kids; i++) {
    Larder__Field *c = read_node(r, in, depth + 1);
    if (c == NULL) break;
    f->children[f->n_children++] = c;
  }
  return f;
}

/* The root: a struct of 1 to 4 columns. */
static Larder__Field *read_schema(reader_t *r, schema_in_t *in) {
  Larder__Field *root = &in->nodes[in->used++];
  larder__field__init(root);
  root->name = (char *)"";
  root->type = LARDER_TYPE_STRUCT;
  size_t cols = 1 + read_u8(r) % 4;
  root->children = in->kids;
  in->kids_used = (int)cols;
  for (size_t i = 0; i < cols; i++) {
    Larder__Field *c = read_node(r, in, 1);
    if (c == NULL) break;
    root->children[root->n_children++] = c;
  }
  return root;
}

/* ------------------------------------------------------------------------ */
/* Consuming a batch: every byte its arrays claim                            */

static uint8_t sink;

static void read_bytes(const uint8_t *arena, uint64_t arena_size, const void *p, uint64_t n) {
  if (n == 0) return;
  FUZZ_CHECK(p != NULL);
  const uint8_t *b = p;
  FUZZ_CHECK(b >= arena && (uint64_t)(b - arena) <= arena_size &&
             n <= arena_size - (uint64_t)(b - arena));
  uint8_t x = 0;
  for (uint64_t i = 0; i < n; i++) x ^= b[i];
  sink ^= x;
}

static void check_array(const larder_batch_t *b, const larder_array_t *a) {
  const larder_stream_t *s = b->stream;
  int64_t len = larder_array_length(a), nulls = larder_array_null_count(a);
  FUZZ_CHECK(len >= 0 && nulls >= 0 && nulls <= len);
  larder_type_t type = larder_array_type(a);
  uint64_t bitmap = ((uint64_t)len + 7) / 8;
  const uint8_t *validity = larder_array_validity(a);
  if (nulls > 0 && type != LARDER_TYPE_NULL) {
    FUZZ_CHECK(validity != NULL);
    read_bytes(s->arena, s->arena_size, validity, bitmap);
  }
  uint64_t values_size = larder_array_values_size(a);
  read_bytes(s->arena, s->arena_size, larder_array_values(a), values_size);
  int64_t width = llib_value_width(a->field);
  if (width > 0) FUZZ_CHECK((uint64_t)len * (uint64_t)width <= values_size);
  if (width > 0 && values_size > 0 && type != LARDER_TYPE_FIXED_BINARY) {
    uint64_t align = width < 8 ? (uint64_t)width : 8;
    FUZZ_CHECK(((uintptr_t)larder_array_values(a) - (uintptr_t)s->arena) % align == 0);
  }
  if (type == LARDER_TYPE_BOOL) FUZZ_CHECK(bitmap <= values_size);
  uint64_t ow = llib_offset_width(type);
  if (ow) {
    const void *offsets = ow == 4 ? (const void *)larder_array_offsets(a)
                                  : (const void *)larder_array_large_offsets(a);
    read_bytes(s->arena, s->arena_size, offsets, ((uint64_t)len + 1) * ow);
    int64_t first = ow == 4 ? larder_array_offsets(a)[0] : larder_array_large_offsets(a)[0];
    int64_t last = ow == 4 ? larder_array_offsets(a)[len] : larder_array_large_offsets(a)[len];
    FUZZ_CHECK(first >= 0 && first <= last);
    if (type == LARDER_TYPE_LIST || type == LARDER_TYPE_LARGE_LIST || type == LARDER_TYPE_MAP) {
      FUZZ_CHECK(larder_array_num_children(a) == 1);
      FUZZ_CHECK(last <= larder_array_length(larder_array_child(a, 0)));
    } else {
      FUZZ_CHECK((uint64_t)last <= values_size);
    }
  }
  for (int i = 0; i < larder_array_num_children(a); i++) {
    const larder_array_t *c = larder_array_child(a, i);
    FUZZ_CHECK(c != NULL);
    if (type == LARDER_TYPE_STRUCT) FUZZ_CHECK(larder_array_length(c) >= len);
    check_array(b, c);
  }
  (void)larder_array_name(a);
}

static void check_batch(const larder_batch_t *b) {
  const larder_stream_t *s = b->stream;
  FUZZ_CHECK(larder_batch_num_columns(b) == s->schema.num_children);
  /* The batch is a struct of its columns (as exported). */
  FUZZ_CHECK(larder_batch_num_rows(b) >= 0);
  for (int i = 0; i < larder_batch_num_columns(b); i++)
    FUZZ_CHECK(larder_array_length(larder_batch_column(b, i)) >= larder_batch_num_rows(b));
  for (int i = 0; i < larder_batch_num_columns(b); i++) check_array(b, larder_batch_column(b, i));
  FUZZ_CHECK(larder_batch_column(b, larder_batch_num_columns(b)) == NULL);
}

static void describe(const larder_batch_t *b) {
  larder_array_info_t arrays[MAX_NODES];
  larder_batch_info_t info;
  int n = larder_batch_describe(b, &info, arrays, MAX_NODES);
  FUZZ_CHECK(n == b->stream->num_nodes && info.num_arrays == n);
  for (int i = 0; i < n && i < MAX_NODES; i++) {
    FUZZ_CHECK(arrays[i].parent >= -1 && arrays[i].parent < n);
    FUZZ_CHECK(arrays[i].num_children == 0 ||
               (arrays[i].first_child > i && arrays[i].first_child + arrays[i].num_children <= n));
  }
}

/* Walks an exported array against the batch's own arrays. */
static void check_exported(const struct ArrowArray *x, const struct ArrowSchema *sc) {
  FUZZ_CHECK(x->release != NULL && sc->release != NULL);
  FUZZ_CHECK(x->n_children == sc->n_children);
  FUZZ_CHECK(x->offset == 0 && x->length >= 0);
  for (int64_t i = 0; i < x->n_children; i++)
    if (sc->format[0] == '+' && sc->format[1] == 's')
      FUZZ_CHECK(x->children[i]->length >= x->length);
  FUZZ_CHECK(sc->format != NULL && sc->name != NULL);
  for (int64_t i = 0; i < x->n_children; i++) check_exported(x->children[i], sc->children[i]);
}

/* Hands b (checked when it was made) to the consumer chosen by how (see
 * the flags), which releases it in the end. */
static void consume(larder_batch_t *b, int how) {
  switch (how) {
    case 1:
      describe(b);
      larder_batch_release(b);
      return;
    case 2: {
      struct ArrowSchema sc;
      struct ArrowArray arr;
      if (larder_batch_export(b, &sc, &arr) != 0) {
        larder_batch_release(b);
        return;
      }
      check_exported(&arr, &sc);
      /* A moved-out child outlives its parent. */
      struct ArrowArray child;
      int moved = arr.n_children > 0;
      if (moved) {
        child = *arr.children[0];
        arr.children[0]->release = NULL;
      }
      larder_batch_release(b); /* ignored: the export owns it */
      sc.release(&sc);
      arr.release(&arr);
      if (moved) child.release(&child);
      return;
    }
    case 3: {
      DLManagedTensor *t[4];
      int n = larder_batch_num_columns(b) < 4 ? larder_batch_num_columns(b) : 4;
      int made = larder_batch_export_dlpack(b, t, n);
      if (made <= 0) {
        larder_batch_release(b);
        return;
      }
      for (int i = 0; i < n; i++)
        if (t[i]) t[i]->deleter(t[i]);
      return;
    }
    default: larder_batch_release(b); return;
  }
}

/* ------------------------------------------------------------------------ */
/* The client side                                                           */

typedef struct world {
  larder_client_t *client;
  larder_stream_t *s;
  uint8_t *arena;
  uint64_t arena_size;
  ring_header_t *ring;
  uint64_t ring_size;
  uint32_t num_layout;
  uint64_t published; /* what the "daemon" published */
  larder_batch_t *held[MAX_HELD];
  int num_held;
  int how;
} world_t;

/* A ring header field, chosen by which, set to v (before or after the
 * open). */
static void rewrite_header(ring_header_t *h, uint8_t which, uint64_t v) {
  switch (which % 10) {
    case 0: h->magic = v; break;
    case 1: h->slots = (uint32_t)v; break;
    case 2: h->slot_bytes = (uint32_t)v; break;
    case 3: h->num_layout = (uint32_t)v; break;
    case 4: h->releases_offset = v; break;
    case 5: h->descs_offset = v; break;
    case 6: atomic_store(&h->wake_at, v); break;
    case 7: atomic_store(&h->released, v); break;
    case 8: atomic_store(&h->wake_client_at, v); break;
    default: h->slots = (uint32_t)(v % (MAX_SLOTS + 1)); break;
  }
}

/* Writes descriptor n at the place the daemon's layout puts it. */
static void publish_one(reader_t *r, world_t *w, const ring_layout_t *l) {
  ring_desc_t *d = ring_layout_desc(l, w->published);
  d->seq = w->published;
  d->epoch = read_u8(r);
  d->index = read_u8(r);
  d->num_rows = read_value(r);
  d->arena_offset = read_value(r);
  d->arena_length = read_value(r);
  for (uint32_t i = 0; i < w->num_layout; i++) d->layout[i] = read_value(r);
  w->published++;
}

/* Takes one descriptor and, when it makes a batch, holds it.  Returns 0
 * when the stream can go on. */
static int take(world_t *w) {
  larder_stream_t *s = w->s;
  uint64_t consumed = s->ring_consumed;
  uint64_t published = atomic_load(&w->ring->published);
  wire_batch_t view;
  int rc = llib_ring_take(s, &view);
  if (published == consumed) {
    FUZZ_CHECK(rc == 0);
    return 0;
  }
  if (published - consumed > s->ring_layout.slots) {
    FUZZ_CHECK(rc == LARDER_EPROTO && s->ring_consumed == consumed);
    return -1;
  }
  FUZZ_CHECK(rc == 1 && s->ring_consumed == consumed + 1);
  FUZZ_CHECK(view.n_layout == w->num_layout);
  const uint8_t *lp = (const uint8_t *)view.layout;
  FUZZ_CHECK(lp >= (const uint8_t *)w->ring && lp + (size_t)w->num_layout * sizeof(uint64_t) <=
                                                   (const uint8_t *)w->ring + w->ring_size);
  larder_batch_t *spare = NULL, *b = NULL;
  pthread_mutex_lock(&s->lock);
  spare = s->spare;
  s->spare = NULL;
  pthread_mutex_unlock(&s->lock);
  rc = llib_batch_make(s, &view, &spare, &b);
  FUZZ_CHECK(spare == NULL);
  if (rc) {
    FUZZ_CHECK(rc == LARDER_EPROTO && b == NULL);
    return -1; /* the stream fails here for good */
  }
  FUZZ_CHECK(b->seq == view.seq && b->stream == s);
  /* Now: the daemon may rewrite the arena later (a region it should not
   * touch while the batch is held, but the client cannot stop it), and
   * the values the checks read then are no longer the ones checked. */
  check_batch(b);
  pthread_mutex_lock(&s->lock);
  s->refs++;
  pthread_mutex_unlock(&s->lock);
  if (w->num_held == MAX_HELD) {
    consume(w->held[0], w->how);
    memmove(w->held, w->held + 1, (MAX_HELD - 1) * sizeof(larder_batch_t *));
    w->num_held--;
  }
  w->held[w->num_held++] = b;
  return 0;
}

static void release_oldest(world_t *w) {
  if (w->num_held == 0) return;
  larder_stream_t *s = w->s;
  uint64_t before = s->ring_released;
  consume(w->held[0], w->how);
  memmove(w->held, w->held + 1, (size_t)(w->num_held - 1) * sizeof(larder_batch_t *));
  w->num_held--;
  if (w->client) {
    /* A release (DLPack's waits for its last tensor, which is gone too). */
    FUZZ_CHECK(s->ring_released == before + 1);
    FUZZ_CHECK(atomic_load(&w->ring->released) == s->ring_released);
    const ring_release_t *e = ring_layout_release(&s->ring_layout, before);
    FUZZ_CHECK((const uint8_t *)e >= (const uint8_t *)w->ring &&
               (const uint8_t *)(e + 1) <= (const uint8_t *)w->ring + w->ring_size);
  }
}

/* Checks what a snapshot the client accepted promises. */
static void check_snapshot(const world_t *w) {
  const ring_layout_t *l = &w->s->ring_layout;
  FUZZ_CHECK(l->slots > 0 && l->slots <= LARDER_MAX_WINDOW);
  FUZZ_CHECK(l->slot_bytes >= sizeof(ring_desc_t) + (uint64_t)w->num_layout * sizeof(uint64_t));
  for (uint64_t n = 0; n < l->slots; n++) {
    const uint8_t *d = (const uint8_t *)ring_layout_desc(l, n);
    const uint8_t *e = (const uint8_t *)ring_layout_release(l, n);
    const uint8_t *lo = (const uint8_t *)w->ring, *hi = lo + w->ring_size;
    FUZZ_CHECK(d >= lo && d + l->slot_bytes <= hi);
    FUZZ_CHECK(e >= lo && e + sizeof(ring_release_t) <= hi);
  }
}

static void client_side(reader_t *r) {
  uint8_t flags = read_u8(r);
  world_t w;
  memset(&w, 0, sizeof(w));
  w.how = flags & 3;
  schema_in_t in;
  memset(&in, 0, sizeof(in));
  Larder__Field *root = read_schema(r, &in);
  w.arena_size = read_le(r, 2);
  uint32_t slots = 1 + read_u8(r) % MAX_SLOTS;

  larder_stream_t *s = calloc(1, sizeof(*s));
  FUZZ_CHECK(s != NULL);
  w.s = s;
  pthread_mutex_init(&s->lock, NULL);
  s->refs = 1;
  s->id = 1;
  s->efd = s->epfd = -1;
  s->cuda_device = -1;
  s->window = slots;
  s->hold_max = 1;
  int rc = llib_field_copy(&s->schema, root, 0);
  if (rc == 0) {
    s->num_nodes = llib_field_count(&s->schema) - 1;
    rc = llib_plan_stream(s);
    FUZZ_CHECK(rc == 0);
  } else {
    FUZZ_CHECK(rc == LARDER_EPROTO); /* an unknown type */
  }
  w.num_layout = (uint32_t)s->num_nodes * LARDER__ARRAY_FIELD__ARRAY_NUM_FIELDS;
  /* The arena, exactly its size, so that ASan sees a read past it. */
  w.arena = calloc(1, w.arena_size ? w.arena_size : 1);
  FUZZ_CHECK(w.arena != NULL);
  s->arena = w.arena;
  s->arena_size = w.arena_size;
  /* The ring, as the daemon makes it, then perhaps spoilt. */
  uint64_t size = ring_bytes(slots, w.num_layout);
  w.ring = calloc(1, size);
  FUZZ_CHECK(w.ring != NULL);
  ring_init(w.ring, slots, w.num_layout);
  ring_layout_t daemon_layout;
  ring_layout_init(&daemon_layout, w.ring);
  w.ring_size = size;
  if (flags & 8) {
    uint8_t which = read_u8(r);
    rewrite_header(w.ring, which, read_value(r));
    w.ring_size -= read_u8(r) % 65 * (flags & 16 ? 1 : 0);
  }
  if (flags & 4) {
    w.client = calloc(1, sizeof(*w.client));
    FUZZ_CHECK(w.client != NULL);
    pthread_mutex_init(&w.client->send_lock, NULL);
    w.client->fd = -1; /* a Wake's send fails, as to a daemon gone */
    s->client = w.client;
  }
  if (rc == 0) {
    int ok = llib_ring_snapshot(s, w.ring, w.ring_size, w.num_layout);
    int valid = ring_valid(w.ring, w.ring_size, w.num_layout) && w.ring->slots <= LARDER_MAX_WINDOW;
    FUZZ_CHECK(ok == valid);
    if (ok) {
      s->ring = w.ring;
      s->ring_size = w.ring_size;
      check_snapshot(&w);
      /* The daemon publishes by its own layout; the client found the same. */
      FUZZ_CHECK(s->ring_layout.slots == daemon_layout.slots &&
                 s->ring_layout.descs_offset == daemon_layout.descs_offset);
    }
  }
  for (int step = 0; s->ring && step < MAX_STEPS && r->left > 0; step++) {
    uint8_t op = read_u8(r);
    if (op % 5 == 0) {
      /* Publish up to a window and two past what the client took. */
      int k = read_u8(r) % (int)(slots + 3);
      for (int i = 0; i < k; i++) publish_one(r, &w, &daemon_layout);
      atomic_store(&w.ring->published, w.published);
    } else if (op % 5 == 1) {
      if (take(&w)) break;
    } else if (op % 5 == 2) {
      release_oldest(&w);
    } else if (op % 5 == 3) {
      /* The daemon rewrites its header: the client works from its copy. */
      uint8_t which = read_u8(r);
      rewrite_header(w.ring, which, read_value(r));
      if (which % 10 == 7) atomic_store(&w.ring->released, s->ring_released);
      if (which % 10 == 6 || which % 10 == 8) continue;
      /* A published count that went back or jumped ahead. */
      if (which % 10 == 9) atomic_store(&w.ring->published, w.published + read_u8(r) % 3 * slots);
    } else {
      /* Writes into the arena. */
      uint64_t at = read_le(r, 2);
      size_t n = read_u8(r);
      for (size_t i = 0; i < n; i++) {
        uint8_t v = read_u8(r);
        if (at + i < w.arena_size) w.arena[at + i] = v;
      }
    }
  }
  while (w.num_held > 0) release_oldest(&w);
  /* The stream's own reference is the last. */
  FUZZ_CHECK(s->refs == 1);
  if (s->spare) {
    free(s->spare->nodes);
    free(s->spare);
  }
  llib_field_free(&s->schema);
  free(s->plan);
  free(s->deep);
  pthread_mutex_destroy(&s->lock);
  free(s);
  if (w.client) {
    free(w.client->held);
    pthread_mutex_destroy(&w.client->send_lock);
    free(w.client);
  }
  free(w.ring);
  free(w.arena);
}

/* ------------------------------------------------------------------------ */
/* The daemon side: ring.h's functions over a ring the client scribbled on   */

static void daemon_side(reader_t *r) {
  uint32_t slots = 1 + read_u8(r) % MAX_SLOTS, num_layout = read_u8(r) % 64;
  uint64_t size = ring_bytes(slots, num_layout);
  ring_header_t *h = calloc(1, size);
  FUZZ_CHECK(h != NULL);
  ring_init(h, slots, num_layout);
  FUZZ_CHECK(ring_valid(h, size, num_layout));
  ring_layout_t l;
  ring_layout_init(&l, h);
  /* The client writes anything anywhere, the header included. */
  int writes = read_u8(r) % 16;
  for (int i = 0; i < writes; i++) {
    uint64_t at = read_le(r, 2) % size & ~(uint64_t)7;
    uint64_t v = read_value(r);
    if (at + 8 <= size) memcpy((uint8_t *)h + at, &v, 8);
  }
  /* ring_drain: `released` is untrusted; at most a window is read (the
   * daemon refuses more than the batches it sent), each entry found by
   * the daemon's own layout. */
  uint64_t released = atomic_load(&h->released);
  uint64_t n = released < slots ? released : slots;
  for (uint64_t k = 0; k < n; k++) {
    const ring_release_t *e = ring_layout_release(&l, released - n + k);
    FUZZ_CHECK((const uint8_t *)e >= (const uint8_t *)h &&
               (const uint8_t *)(e + 1) <= (const uint8_t *)h + size);
    sink ^= (uint8_t)(e->seq ^ e->wait_ns ^ e->compute_ns);
  }
  for (uint64_t k = 0; k < slots; k++) {
    const uint8_t *d = (const uint8_t *)ring_layout_desc(&l, k);
    FUZZ_CHECK(d >= (const uint8_t *)h && d + l.slot_bytes <= (const uint8_t *)h + size);
  }
  /* A header that still passes ring_valid places its entries inside. */
  if (ring_valid(h, size, num_layout))
    for (uint64_t k = 0; k < h->slots; k++)
      FUZZ_CHECK((const uint8_t *)ring_desc(h, k) + h->slot_bytes <= (const uint8_t *)h + size);
  free(h);
  /* The client's sleeps: never a value asked before once it has taken
   * descriptors since, never lower, never below what it waits for. */
  ring_sleeps_t sl = {0, 0};
  uint64_t consumed = 0, last = 0;
  for (int i = 0; i < 8 && r->left > 0; i++) {
    consumed += read_u8(r) % 4;
    uint32_t want = 1 + read_u8(r) % 8;
    uint64_t before_consumed = sl.last_consumed;
    uint64_t at = ring_sleep_target(&sl, consumed, want);
    FUZZ_CHECK(at >= last && at >= consumed + want);
    if (i > 0 && consumed != before_consumed) FUZZ_CHECK(at > last);
    last = at;
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader_t r = {data, size};
  if (size > 0 && data[0] == 0xDA) {
    r.p++;
    r.left--;
    daemon_side(&r);
  } else {
    client_side(&r);
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Seeds                                                                     */

typedef struct out {
  uint8_t buf[8192];
  size_t len;
} out_t;

static void put_u8(out_t *o, uint64_t v) {
  if (o->len < sizeof(o->buf)) o->buf[o->len++] = (uint8_t)v;
}
static void put_le(out_t *o, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; i++) put_u8(o, v >> (8 * i));
}
/* As read_value reads it. */
static void put_value(out_t *o, uint64_t v) {
  if (v < 0xC0) {
    put_u8(o, v);
  } else if (v < 65536) {
    put_u8(o, 0xC0);
    put_le(o, v, 2);
  } else {
    put_u8(o, 0xFE);
    put_le(o, v, 8);
  }
}

/* A seed's columns: each a type and, for lists, an int32 child. */
typedef struct seed_col {
  uint8_t type;
  uint8_t width; /* FIXED_BINARY */
} seed_col_t;

/* Writes the schema, then the arena's contents and descriptors of
 * `batches` well-formed batches of `rows` rows (no nulls), buffers laid
 * out one after another, each batch taken and released in turn. */
static void seed(const char *dir, const char *name, const seed_col_t *cols, int ncols,
                 uint8_t flags, int batches) {
  out_t o = {.len = 0};
  const uint64_t rows = 5;
  put_u8(&o, flags);
  put_u8(&o, (uint8_t)(ncols - 1));
  int nodes = 0;
  for (int i = 0; i < ncols; i++) {
    int list = cols[i].type == LARDER_TYPE_LIST || cols[i].type == LARDER_TYPE_LARGE_LIST;
    put_u8(&o, cols[i].type);
    put_u8(&o, list ? 0x10 : 0x01); /* a list's one child; else nullable */
    put_u8(&o, cols[i].width + 128u);
    nodes++;
    if (list) {
      put_u8(&o, LARDER_TYPE_INT32);
      put_u8(&o, 0);
      put_u8(&o, 128);
      nodes++;
    }
  }
  put_le(&o, 4096, 2); /* the arena */
  put_u8(&o, 3);       /* 4 slots */
  /* The arena: offsets 0, 1, ..., rows as int32 at 0 and as int64 at 64;
   * the rest zeros. */
  put_u8(&o, 4);
  put_le(&o, 0, 2);
  put_u8(&o, (rows + 1) * 4);
  for (uint64_t i = 0; i <= rows; i++) put_le(&o, i, 4);
  put_u8(&o, 4);
  put_le(&o, 64, 2);
  put_u8(&o, (rows + 1) * 8);
  for (uint64_t i = 0; i <= rows; i++) put_le(&o, i, 8);
  for (int b = 0; b < batches; b++) {
    put_u8(&o, 0); /* publish one */
    put_u8(&o, 1);
    put_u8(&o, 0);
    put_u8(&o, (uint8_t)b);
    put_value(&o, rows);
    put_value(&o, 0);
    put_value(&o, 4096);
    uint64_t at = 1024;
    for (int i = 0; i < ncols; i++) {
      uint8_t t = cols[i].type;
      int list = t == LARDER_TYPE_LIST || t == LARDER_TYPE_LARGE_LIST;
      uint64_t ow = t == LARDER_TYPE_LARGE_STRING || t == LARDER_TYPE_LARGE_BINARY ||
                            t == LARDER_TYPE_LARGE_LIST
                        ? 8
                    : t == LARDER_TYPE_STRING || t == LARDER_TYPE_BINARY || t == LARDER_TYPE_LIST
                        ? 4
                        : 0;
      uint64_t vw = t == LARDER_TYPE_BOOL           ? 1
                    : t == LARDER_TYPE_FIXED_BINARY ? cols[i].width * rows
                    : ow && !list                   ? rows
                    : t == LARDER_TYPE_NULL         ? 0
                                                    : 8 * rows;
      /* length, null count, validity (off, len), offsets, values */
      put_value(&o, rows);
      put_value(&o, 0);
      put_value(&o, 0);
      put_value(&o, 0);
      put_value(&o, ow == 8 ? 64 : 0);
      put_value(&o, ow ? (rows + 1) * ow : 0);
      put_value(&o, list ? 0 : at);
      put_value(&o, list ? 0 : vw);
      at += 256;
      if (list) {
        put_value(&o, rows);
        put_value(&o, 0);
        put_value(&o, 0);
        put_value(&o, 0);
        put_value(&o, 0);
        put_value(&o, 0);
        put_value(&o, at);
        put_value(&o, 4 * rows);
        at += 256;
      }
    }
    put_u8(&o, 1); /* take */
    put_u8(&o, 2); /* release */
  }
  (void)nodes;
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (f == NULL) return;
  fwrite(o.buf, 1, o.len, f);
  fclose(f);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  const char *dir = getenv("LARDER_FUZZ_SEED_DIR");
  if (dir == NULL || *dir == '\0') return 0;
  static const seed_col_t std[] = {
      {LARDER_TYPE_INT64, 0}, {LARDER_TYPE_STRING, 0}, {LARDER_TYPE_LIST, 0}};
  static const seed_col_t large[] = {{LARDER_TYPE_LARGE_STRING, 0}, {LARDER_TYPE_LARGE_LIST, 0}};
  static const seed_col_t fixed[] = {{LARDER_TYPE_BOOL, 0},
                                     {LARDER_TYPE_FIXED_BINARY, 16},
                                     {LARDER_TYPE_FLOAT64, 0},
                                     {LARDER_TYPE_NULL, 0}};
  for (uint8_t how = 0; how < 4; how++) {
    char name[64];
    snprintf(name, sizeof(name), "std-%u", how);
    seed(dir, name, std, 3, how | 4, 3);
    snprintf(name, sizeof(name), "large-%u", how);
    seed(dir, name, large, 2, how | 4, 3);
    snprintf(name, sizeof(name), "fixed-%u", how);
    seed(dir, name, fixed, 4, how | 4, 3);
  }
  seed(dir, "std-noclient", std, 3, 1, 6);
  /* The daemon side: a ring of 4 slots and 24 layout values, two
   * releases written. */
  out_t o = {.len = 0};
  put_u8(&o, 0xDA);
  put_u8(&o, 3);
  put_u8(&o, 24);
  put_u8(&o, 1);
  put_le(&o, offsetof(ring_header_t, released), 2);
  put_value(&o, 2);
  for (int i = 0; i < 8; i++) {
    put_u8(&o, (uint8_t)i);
    put_u8(&o, (uint8_t)(i * 3));
  }
  char path[4096];
  snprintf(path, sizeof(path), "%s/daemon-side", dir);
  FILE *f = fopen(path, "wb");
  if (f) {
    fwrite(o.buf, 1, o.len, f);
    fclose(f);
  }
  fprintf(stderr, "fuzz-ring: seeds written to %s\n", dir);
  exit(0);
}
