/*
 * remote.c: listing S3 prefixes and reading remote footers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "larder.h"
#include "htab.h"
#include "log.h"
#include "parquet/parquet.h"
#include "fetch/remote.h"
#include "fetch/version.h"
#include "util.h"

int remote_is_url(const char *s) { return strstr(s, "://") != NULL; }

/* URLs already warned about (hashes; the oldest forgotten first): the
 * warning about an object without validators comes once per object, not
 * once per stream. */
#define UNVALIDATED_SLOTS 4096
static uint64_t unvalidated[UNVALIDATED_SLOTS];
static unsigned unvalidated_next;

static void warn_unvalidated(const char *url) {
  uint64_t h = util_hash64(url, strlen(url), 0x76616cull) | 1;
  for (unsigned i = 0; i < UNVALIDATED_SLOTS; i++)
    if (unvalidated[i] == h) return;
  unvalidated[unvalidated_next++ % UNVALIDATED_SLOTS] = h;
  char where[600];
  fetch_redact(url, where, sizeof(where));
  log_warn(
      "%s has neither an ETag nor a Last-Modified header: if it is replaced by an object of "
      "the same size, larderd cannot tell, and may serve cached data of the old version or "
      "a mix of both",
      where);
}

typedef struct resolve_ctx {
  fetch_t *f;
  remote_footers_t *fc;
  remote_cb cb;
  void *arg;
  uint32_t guess, max_footer;
  remote_object_t *objs;
  size_t n, cap;
  int pending; /* listings and footer reads outstanding */
  int status;
  char message[1024];
  int done;
} resolve_ctx_t;

typedef struct fentry fentry_t;

typedef struct footer_req {
  resolve_ctx_t *rc;
  size_t index; /* in rc->objs */
  fentry_t *e;  /* its URL's entry in the footer set, or NULL */
} footer_req_t;

/* ------------------------------------------------------------------------ */
/* The footer set                                                            */

/* A resolution waiting for another's read of the same URL. */
typedef struct waiter {
  struct waiter *next;
  resolve_ctx_t *rc;
  size_t index;
} waiter_t;

struct fentry {
  htab_node_t node;      /* by the URL's hash */
  fentry_t *prev, *next; /* recency, most recent first (entries with a footer) */
  char *url;
  uint64_t size;
  char etag[128];
  char last_modified[64];
  uint8_t *footer; /* NULL until a read gave one */
  uint32_t footer_len;
  int reading;       /* a read of it is under way */
  waiter_t *waiters; /* resolutions taking that read's result */
};

struct remote_footers {
  htab_t by_url;
  fentry_t *head, *tail;
  uint64_t bytes, limit;
  stats_global_t *stats;
  remote_footers_persist_cb persist; /* remote_footers_set_persist */
  void *persist_arg;
};

/*
 * A kept footer as remote_footers_persist_cb hands it out and
 * remote_footers_load takes it back (little-endian): u32 magic "RFTR",
 * u32 footer length, u64 size, u16 ETag length, u16 Last-Modified length,
 * then the ETag, the Last-Modified and the footer bytes.
 */
#define REC_MAGIC 0x52544652u
#define REC_HDR 20

static void rec_u16(uint8_t *p, uint16_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static void rec_u32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void rec_u64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint64_t rec_get(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* Hands e's footer to the persist callback (or its absence, to delete). */
static void fentry_persist(remote_footers_t *fc, const fentry_t *e) {
  if (fc->persist == NULL) return;
  if (e->footer == NULL) {
    fc->persist(fc->persist_arg, e->url, NULL, 0);
    return;
  }
  size_t el = strlen(e->etag), ll = strlen(e->last_modified);
  size_t n = REC_HDR + el + ll + e->footer_len;
  uint8_t *r = malloc(n);
  if (r == NULL) return; /* not kept across a restart: fetched again then */
  rec_u32(r, REC_MAGIC);
  rec_u32(r + 4, e->footer_len);
  rec_u64(r + 8, e->size);
  rec_u16(r + 16, (uint16_t)el);
  rec_u16(r + 18, (uint16_t)ll);
  memcpy(r + REC_HDR, e->etag, el);
  memcpy(r + REC_HDR + el, e->last_modified, ll);
  memcpy(r + REC_HDR + el + ll, e->footer, e->footer_len);
  fc->persist(fc->persist_arg, e->url, r, n);
  free(r);
}

void remote_footers_set_persist(remote_footers_t *fc, remote_footers_persist_cb cb, void *arg) {
  fc->persist = cb;
  fc->persist_arg = arg;
}

int remote_footers_create(uint64_t limit, stats_global_t *stats, remote_footers_t **out) {
  *out = calloc(1, sizeof(**out));
  if (*out == NULL) return LARDER_ENOMEM;
  (*out)->limit = limit;
  (*out)->stats = stats;
  return 0;
}

static void fentry_unlink_lru(remote_footers_t *fc, fentry_t *e) {
  if (e->prev) e->prev->next = e->next;
  else if (fc->head == e) fc->head = e->next;
  if (e->next) e->next->prev = e->prev;
  else if (fc->tail == e) fc->tail = e->prev;
  e->prev = e->next = NULL;
}

static void fentry_drop_footer(remote_footers_t *fc, fentry_t *e) {
  if (e->footer == NULL) return;
  fentry_unlink_lru(fc, e);
  fc->bytes -= e->footer_len;
  if (fc->stats) STATS_SUB(fc->stats, remote_footer_bytes, e->footer_len);
  free(e->footer);
  e->footer = NULL;
  e->footer_len = 0;
}

static void fentry_free(remote_footers_t *fc, fentry_t *e) {
  fentry_drop_footer(fc, e);
  htab_remove(&fc->by_url, &e->node);
  free(e->url);
  free(e);
}

void remote_footers_free(remote_footers_t *fc) {
  if (fc == NULL) return;
  for (size_t b = 0; fc->by_url.buckets && b <= fc->by_url.mask; b++)
    while (fc->by_url.buckets[b])
      fentry_free(fc, HTAB_ENTRY(fc->by_url.buckets[b], fentry_t, node));
  htab_free(&fc->by_url);
  free(fc);
}

static uint64_t url_hash(const char *url) { return util_hash64(url, strlen(url), 0x666f6f74ull); }

static fentry_t *fentry_find(remote_footers_t *fc, const char *url) {
  uint64_t h = url_hash(url);
  for (htab_node_t *n = htab_chain(&fc->by_url, h); n; n = n->next) {
    if (n->hash != h) continue;
    fentry_t *e = HTAB_ENTRY(n, fentry_t, node);
    if (strcmp(e->url, url) == 0) return e;
  }
  return NULL;
}

static fentry_t *fentry_add(remote_footers_t *fc, const char *url) {
  fentry_t *e = calloc(1, sizeof(*e));
  if (e) e->url = strdup(url);
  if (e == NULL || e->url == NULL || htab_insert(&fc->by_url, &e->node, url_hash(url)) != 0) {
    if (e) free(e->url);
    free(e);
    return NULL;
  }
  return e;
}

/* Keeps o's footer and validators in e (most recent), then lets the least
 * recent footers go until the set is within its limit.  An entry being
 * read keeps its place in the table, footer or not.  With persist, what
 * is kept and what goes are handed to the persist callback. */
static int fentry_keep_as(remote_footers_t *fc, fentry_t *e, const remote_object_t *o,
                          int persist) {
  int had = e->footer != NULL;
  /* A revalidation keeps the same footer: nothing to store again. */
  int same = had && o->footer && e->footer_len == o->footer_len && e->size == o->size &&
             strcmp(e->etag, o->etag) == 0 && strcmp(e->last_modified, o->last_modified) == 0 &&
             memcmp(e->footer, o->footer, e->footer_len) == 0;
  fentry_drop_footer(fc, e);
  e->size = o->size;
  snprintf(e->etag, sizeof(e->etag), "%s", o->etag);
  snprintf(e->last_modified, sizeof(e->last_modified), "%s", o->last_modified);
  if (o->footer && o->footer_len && o->footer_len <= fc->limit &&
      (o->etag[0] || o->last_modified[0])) {
    e->footer = malloc(o->footer_len);
    if (e->footer) {
      memcpy(e->footer, o->footer, o->footer_len);
      e->footer_len = o->footer_len;
      fc->bytes += o->footer_len;
      if (fc->stats) STATS_ADD(fc->stats, remote_footer_bytes, o->footer_len);
      e->next = fc->head;
      if (fc->head) fc->head->prev = e;
      fc->head = e;
      if (fc->tail == NULL) fc->tail = e;
    }
  }
  if (persist && !same && (had || e->footer)) fentry_persist(fc, e);
  /* e is the most recent, and its footer alone fits: the loop below ends
   * before it. */
  int kept = e->footer != NULL;
  while (fc->bytes > fc->limit && fc->tail) {
    fentry_t *old = fc->tail;
    if (old->reading) {
      fentry_drop_footer(fc, old);
      if (persist) fentry_persist(fc, old);
    } else {
      fentry_drop_footer(fc, old);
      if (persist) fentry_persist(fc, old);
      fentry_free(fc, old);
    }
  }
  return kept;
}

static void fentry_keep(remote_footers_t *fc, fentry_t *e, const remote_object_t *o) {
  fentry_keep_as(fc, e, o, 1);
}

int remote_footers_load(remote_footers_t *fc, const char *url, const void *rec, size_t len) {
  const uint8_t *r = rec;
  if (len < REC_HDR || rec_get(r, 4) != REC_MAGIC) return LARDER_ECORRUPT;
  uint64_t fl = rec_get(r + 4, 4), el = rec_get(r + 16, 2), ll = rec_get(r + 18, 2);
  remote_object_t o;
  memset(&o, 0, sizeof(o));
  if (REC_HDR + el + ll + fl != len || el >= sizeof(o.etag) || ll >= sizeof(o.last_modified) ||
      fl == 0)
    return LARDER_ECORRUPT;
  if (fentry_find(fc, url)) return 0;
  /* The set's bound holds for what it loads too: past it, the rest are
   * fetched again when used. */
  if (fc->bytes + fl > fc->limit) return LARDER_ELIMIT;
  o.size = rec_get(r + 8, 8);
  memcpy(o.etag, r + REC_HDR, el);
  memcpy(o.last_modified, r + REC_HDR + el, ll);
  o.footer = malloc(fl);
  fentry_t *e = o.footer ? fentry_add(fc, url) : NULL;
  if (e == NULL) {
    free(o.footer);
    return LARDER_ENOMEM;
  }
  memcpy(o.footer, r + REC_HDR + el + ll, fl);
  o.footer_len = (uint32_t)fl;
  int kept = fentry_keep_as(fc, e, &o, 0);
  free(o.footer);
  if (!kept) {
    fentry_free(fc, e); /* no validators, or out of memory */
    return LARDER_ECORRUPT;
  }
  return 0;
}

/* Gives o the footer and validators that e holds.  Returns 0 or
 * LARDER_ENOMEM. */
static int fentry_give(remote_footers_t *fc, fentry_t *e, remote_object_t *o) {
  uint8_t *copy = malloc(e->footer_len ? e->footer_len : 1);
  if (copy == NULL) return LARDER_ENOMEM;
  memcpy(copy, e->footer, e->footer_len);
  free(o->footer);
  o->footer = copy;
  o->footer_len = e->footer_len;
  o->size = e->size;
  snprintf(o->etag, sizeof(o->etag), "%s", e->etag);
  snprintf(o->last_modified, sizeof(o->last_modified), "%s", e->last_modified);
  if (e->footer && fc->head != e) {
    fentry_unlink_lru(fc, e);
    e->next = fc->head;
    if (fc->head) fc->head->prev = e;
    fc->head = e;
    if (fc->tail == NULL) fc->tail = e;
  }
  return 0;
}

static void maybe_finish(resolve_ctx_t *rc) {
  if (rc->pending > 0 || rc->done) return;
  rc->done = 1;
  if (rc->status) {
    rc->cb(rc->status, rc->message, NULL, 0, rc->arg);
    remote_objects_free(rc->objs, rc->n);
  } else {
    /* Sorted, without duplicates: part of the dataset's identity. */
    for (size_t i = 1; i < rc->n; i++) {
      remote_object_t key = rc->objs[i];
      size_t j = i;
      while (j > 0 && strcmp(rc->objs[j - 1].url, key.url) > 0) {
        rc->objs[j] = rc->objs[j - 1];
        j--;
      }
      rc->objs[j] = key;
    }
    size_t m = 0;
    for (size_t i = 0; i < rc->n; i++) {
      if (m && strcmp(rc->objs[m - 1].url, rc->objs[i].url) == 0) {
        free(rc->objs[i].url);
        free(rc->objs[i].footer);
        continue;
      }
      rc->objs[m++] = rc->objs[i];
    }
    rc->cb(0, NULL, rc->objs, m, rc->arg);
  }
  free(rc);
}

static void fail(resolve_ctx_t *rc, int status, const char *msg) {
  if (rc->status == 0) {
    rc->status = status;
    snprintf(rc->message, sizeof(rc->message), "%.1000s", msg);
  }
}

static int add_object(resolve_ctx_t *rc, const char *url, uint64_t size, const char *etag) {
  if (rc->n == rc->cap) {
    size_t cap = rc->cap ? rc->cap * 2 : 16;
    remote_object_t *o = realloc(rc->objs, cap * sizeof(*o));
    if (o == NULL) return -1;
    rc->objs = o;
    rc->cap = cap;
  }
  remote_object_t *o = &rc->objs[rc->n];
  memset(o, 0, sizeof(*o));
  o->url = strdup(url);
  if (o->url == NULL) return -1;
  o->size = size;
  if (etag) snprintf(o->etag, sizeof(o->etag), "%s", etag);
  return (int)rc->n++;
}

/* The end of fr's read, whatever came of it (status 0: rc->objs[index]
 * has its footer): the footer set keeps what it read, and every resolution
 * that waited on the read takes the same footer, or the same failure. */
static void footer_done(footer_req_t *fr, int status, const char *msg) {
  resolve_ctx_t *rc = fr->rc;
  remote_object_t *o = &rc->objs[fr->index];
  if (status) fail(rc, status, msg);
  fentry_t *e = fr->e;
  if (e) {
    remote_footers_t *fc = rc->fc;
    if (status == 0) fentry_keep(fc, e, o);
    e->reading = 0;
    waiter_t *w = e->waiters;
    e->waiters = NULL;
    while (w) {
      waiter_t *next = w->next;
      remote_object_t *wo = &w->rc->objs[w->index];
      if (status) {
        fail(w->rc, status, msg);
      } else {
        uint8_t *copy = malloc(o->footer_len ? o->footer_len : 1);
        if (copy == NULL) {
          fail(w->rc, LARDER_ENOMEM, "out of memory");
        } else {
          memcpy(copy, o->footer, o->footer_len);
          free(wo->footer);
          wo->footer = copy;
          wo->footer_len = o->footer_len;
          wo->size = o->size;
          snprintf(wo->etag, sizeof(wo->etag), "%s", o->etag);
          snprintf(wo->last_modified, sizeof(wo->last_modified), "%s", o->last_modified);
          if (fc->stats) STATS_ADD(fc->stats, remote_footers_shared, 1);
        }
      }
      w->rc->pending--;
      maybe_finish(w->rc);
      free(w);
      w = next;
    }
    if (e->footer == NULL) fentry_free(fc, e);
  }
  free(fr);
  rc->pending--;
  maybe_finish(rc);
}

static void on_footer_rest(fetch_req_t *req, const fetch_result_t *res, void *arg) {
  footer_req_t *fr = arg;
  resolve_ctx_t *rc = fr->rc;
  remote_object_t *o = &rc->objs[fr->index];
  int status = res->status;
  char m[1300];
  if (status) {
    snprintf(m, sizeof(m), "%s", res->message);
  } else if (res->length != o->footer_len) {
    char where[600];
    fetch_redact(o->url, where, sizeof(where));
    snprintf(m, sizeof(m), "%s: short footer read", where);
    status = LARDER_EREMOTE;
  } else {
    o->footer = fetch_req_steal(req, &(uint64_t){0});
  }
  fetch_req_free(req);
  footer_done(fr, status, m);
}

static void on_footer(fetch_req_t *req, const fetch_result_t *res, void *arg) {
  footer_req_t *fr = arg;
  resolve_ctx_t *rc = fr->rc;
  remote_object_t *o = &rc->objs[fr->index];
  char msg[1024], where[600];
  int status = 0;
  msg[0] = '\0';
  /* Messages name the object without credentials or query.  Tested by
   * remote_faults_wrong_bytes. */
  fetch_redact(o->url, where, sizeof(where));
  if (res->status) {
    status = res->status;
    snprintf(msg, sizeof(msg), "%s", res->message);
    goto done;
  }
  if (res->not_modified && fr->e && fr->e->footer) {
    /* The footer kept is still the object's. */
    status = fentry_give(rc->fc, fr->e, o);
    if (status) snprintf(msg, sizeof(msg), "out of memory");
    else if (rc->fc->stats) STATS_ADD(rc->fc->stats, remote_footers_revalidated, 1);
    goto done;
  }
  if (res->not_modified) {
    status = LARDER_EREMOTE;
    snprintf(msg, sizeof(msg), "%s: HTTP 304 to a footer read whose footer is no longer kept",
             where);
    goto done;
  }
  if (res->etag[0]) snprintf(o->etag, sizeof(o->etag), "%s", res->etag);
  snprintf(o->last_modified, sizeof(o->last_modified), "%s", res->last_modified);
  if (res->object_size) o->size = res->object_size;
  if (o->etag[0] == '\0' && o->last_modified[0] == '\0') warn_unvalidated(o->url);
  if (o->size < 12 || res->length < 8) {
    snprintf(msg, sizeof(msg), "%s: not a Parquet file: %llu bytes is too short", where,
             (unsigned long long)o->size);
    status = LARDER_ECORRUPT;
    goto done;
  }
  pq_options po;
  pq_options_init(&po);
  po.max_footer_bytes = rc->max_footer;
  uint32_t flen = 0;
  pq_error perr = {0, ""};
  int prc = pq_footer_length(res->data + res->length - 8, o->size, &po, &flen, where, &perr);
  if (prc) {
    status = prc;
    snprintf(msg, sizeof(msg), "%s", perr.msg);
    goto done;
  }
  o->footer_len = flen;
  if ((uint64_t)flen + 8 <= res->length) {
    o->footer = malloc(flen ? flen : 1);
    if (o->footer == NULL) {
      status = LARDER_ENOMEM;
      snprintf(msg, sizeof(msg), "out of memory");
      goto done;
    }
    memcpy(o->footer, res->data + res->length - 8 - flen, flen);
  } else {
    /* The footer is bigger than the first guess: one more, exact read,
     * which ends this read in its place. */
    fetch_range_t r = {o->size - 8 - flen, flen, 0};
    if (fetch_get(rc->f, o->url, &r, on_footer_rest, fr) != NULL) {
      fetch_req_free(req);
      return;
    }
    status = LARDER_ENOMEM;
    snprintf(msg, sizeof(msg), "out of memory");
  }
done:
  fetch_req_free(req);
  footer_done(fr, status, msg);
}

static void read_footer(resolve_ctx_t *rc, size_t index) {
  remote_object_t *o = &rc->objs[index];
  remote_footers_t *fc = rc->fc;
  fentry_t *e = fc ? fentry_find(fc, o->url) : NULL;
  /* A listing named this very version: the footer kept is its footer. */
  if (e && e->footer && !e->reading && o->etag[0] && e->etag[0] &&
      version_same(o->size, o->etag, NULL, e->size, e->etag, NULL)) {
    if (fentry_give(fc, e, o) != 0) fail(rc, LARDER_ENOMEM, "out of memory");
    else if (fc->stats) STATS_ADD(fc->stats, remote_footers_listed, 1);
    return;
  }
  /* Another stream reads it now: take that read's result. */
  if (e && e->reading) {
    waiter_t *w = malloc(sizeof(*w));
    if (w == NULL) {
      fail(rc, LARDER_ENOMEM, "out of memory");
      return;
    }
    w->rc = rc;
    w->index = index;
    w->next = e->waiters;
    e->waiters = w;
    rc->pending++;
    return;
  }
  footer_req_t *fr = malloc(sizeof(*fr));
  if (fr == NULL) {
    fail(rc, LARDER_ENOMEM, "out of memory");
    return;
  }
  if (fc && e == NULL) e = fentry_add(fc, o->url);
  if (e) e->reading = 1;
  fr->rc = rc;
  fr->index = index;
  fr->e = e;
  /* fresh: the footer read is how a new stream sees the object's current
   * version, so it goes to the server even when the object is kept whole;
   * otherwise, for a server that ignores Range, the object would be kept
   * whole and never asked for again, and every new stream would read the
   * old version while it stayed in memory.  Tested by
   * remote_hostile_no_range_change.  With a footer kept it asks whether
   * that version is still current, and a 304 costs no bytes. */
  fetch_range_t r = {0, 0, rc->guess, 1, 0};
  if (e && e->footer) {
    r.revalidate_etag = e->etag;
    r.revalidate_last_modified = e->last_modified;
  }
  rc->pending++;
  if (fetch_get(rc->f, o->url, &r, on_footer, fr) == NULL) {
    /* Nobody waits on it yet; the caller finishes rc. */
    fail(rc, LARDER_ENOMEM, "out of memory");
    if (e) {
      e->reading = 0;
      if (e->footer == NULL) fentry_free(fc, e);
    }
    free(fr);
    rc->pending--;
  }
}

typedef struct list_req {
  resolve_ctx_t *rc;
  char source[1200]; /* s3://bucket/ and a key of up to 1024 bytes */
} list_req_t;

static void on_list(int status, const char *message, fetch_object_t *objects, size_t count,
                    void *arg) {
  list_req_t *lr = arg;
  resolve_ctx_t *rc = lr->rc;
  if (status) {
    fail(rc, status, message ? message : "listing failed");
  } else if (count == 0) {
    char m[1300];
    snprintf(m, sizeof(m), "%s: no objects match", lr->source);
    fail(rc, LARDER_ENOENT, m);
  } else {
    for (size_t i = 0; i < count; i++) {
      int k = add_object(rc, objects[i].url, objects[i].size, objects[i].etag);
      if (k < 0) {
        fail(rc, LARDER_ENOMEM, "out of memory");
        break;
      }
    }
  }
  /* Footers are read once every listing is in (objs may move while it
   * grows); the last listing starts them. */
  for (size_t i = 0; i < count; i++) free(objects[i].url);
  free(objects);
  free(lr);
  rc->pending--;
  if (rc->pending == 0 && rc->status == 0)
    for (size_t i = 0; i < rc->n; i++) read_footer(rc, i);
  maybe_finish(rc);
}

int remote_resolve(fetch_t *f, remote_footers_t *footers, const char *const *sources, size_t n,
                   uint32_t footer_guess, uint32_t max_footer, remote_cb cb, void *arg) {
  resolve_ctx_t *rc = calloc(1, sizeof(*rc));
  if (rc == NULL) return LARDER_ENOMEM;
  rc->f = f;
  rc->fc = footers;
  rc->cb = cb;
  rc->arg = arg;
  rc->guess = footer_guess < 64 ? 64 : footer_guess;
  rc->max_footer = max_footer;
  int listings = 0;
  /* The pending count holds the resolution open while listings start. */
  rc->pending = 1;
  for (size_t i = 0; i < n; i++) {
    const char *s = sources[i];
    if (!remote_is_url(s)) continue;
    if (strncmp(s, "s3://", 5) != 0 && strncmp(s, "http://", 7) != 0 &&
        strncmp(s, "https://", 8) != 0) {
      char m[1100], where[600];
      fetch_redact(s, where, sizeof(where));
      snprintf(m, sizeof(m), "%s: unsupported URL scheme (use http://, https:// or s3://)", where);
      fail(rc, LARDER_EUNSUPPORTED, m);
      continue;
    }
    /* Wildcards are only for s3:// sources, which can be listed; an
     * http(s) URL is taken literally, so that a presigned or SAS URL's
     * query string ("?") and an IPv6 literal host ("[::1]") are not
     * mistaken for a glob.  Tested by remote_hostile_query_url. */
    int s3 = strncmp(s, "s3://", 5) == 0;
    const char *glob = s3 ? strpbrk(s, "*?[") : NULL;
    size_t len = strlen(s);
    if (s3 && (glob || s[len - 1] == '/')) {
      list_req_t *lr = calloc(1, sizeof(*lr));
      if (lr == NULL) {
        fail(rc, LARDER_ENOMEM, "out of memory");
        continue;
      }
      lr->rc = rc;
      snprintf(lr->source, sizeof(lr->source), "%s", s);
      /* List from the part before the first wildcard; match the key. */
      char prefix[1200];
      size_t plen = glob ? (size_t)(glob - s) : len;
      snprintf(prefix, sizeof(prefix), "%.*s", (int)plen, s);
      const char *bucket_end = strchr(s + 5, '/');
      const char *pattern = glob && bucket_end ? bucket_end + 1 : NULL;
      rc->pending++;
      listings++;
      if (fetch_list(f, prefix, pattern, on_list, lr) != 0) {
        rc->pending--;
        listings--;
        free(lr);
        fail(rc, LARDER_ENOMEM, "out of memory");
      }
    } else if (add_object(rc, s, 0, NULL) < 0) {
      fail(rc, LARDER_ENOMEM, "out of memory");
    }
  }
  rc->pending--;
  if (listings == 0 && rc->status == 0)
    for (size_t i = 0; i < rc->n; i++) read_footer(rc, i);
  maybe_finish(rc);
  return 0;
}

void remote_objects_free(remote_object_t *objs, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(objs[i].url);
    free(objs[i].footer);
  }
  free(objs);
}
