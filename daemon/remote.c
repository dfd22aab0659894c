/*
 * remote.c: listing S3 prefixes and reading remote footers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../client/larder.h"
#include "log.h"
#include "parquet.h"
#include "remote.h"
#include "util.h"

int remote_is_url(const char *s) { return strstr(s, "://") != NULL; }

/* The opaque part of an ETag: W/"x" and "x" name the same version (a
 * server or proxy may weaken an ETag, e.g. when it compresses). */
static const char *etag_opaque(const char *e) {
  return e[0] == 'W' && e[1] == '/' ? e + 2 : e;
}

int remote_same_version(uint64_t size_a, const char *etag_a, const char *lm_a, uint64_t size_b,
                        const char *etag_b, const char *lm_b) {
  if (size_a && size_b && size_a != size_b) return 0;
  if (etag_a && etag_a[0] && etag_b && etag_b[0])
    return strcmp(etag_opaque(etag_a), etag_opaque(etag_b)) == 0;
  /* Bug fix (tests: remote_hostile_no_etag): without an ETag only the size
   * was compared, so an object replaced by one of the same size on a server
   * that sends Last-Modified alone was decoded as a mix of both versions. */
  if (lm_a && lm_a[0] && lm_b && lm_b[0]) return strcmp(lm_a, lm_b) == 0;
  return 1;
}

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
  log_warn("%s has neither an ETag nor a Last-Modified header: if it is replaced by an object of "
           "the same size, larderd cannot tell, and may serve cached data of the old version or "
           "a mix of both",
           where);
}

typedef struct resolve_ctx {
  fetch_t *f;
  remote_cb cb;
  void *arg;
  uint32_t guess, max_footer;
  remote_object_t *objs;
  size_t n, cap;
  int pending;     /* listings and footer reads outstanding */
  int status;
  char message[1024];
  int done;
} resolve_ctx_t;

typedef struct footer_req {
  resolve_ctx_t *rc;
  size_t index;    /* in rc->objs */
} footer_req_t;

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

static void on_footer_rest(fetch_req_t *req, const fetch_result_t *res, void *arg) {
  footer_req_t *fr = arg;
  resolve_ctx_t *rc = fr->rc;
  remote_object_t *o = &rc->objs[fr->index];
  if (res->status) {
    fail(rc, res->status, res->message);
  } else if (res->length != o->footer_len) {
    char m[700];
    char where[600];
    fetch_redact(o->url, where, sizeof(where));
    snprintf(m, sizeof(m), "%s: short footer read", where);
    fail(rc, LARDER_EREMOTE, m);
  } else {
    o->footer = fetch_req_steal(req, &(uint64_t){0});
  }
  fetch_req_free(req);
  free(fr);
  rc->pending--;
  maybe_finish(rc);
}

static void on_footer(fetch_req_t *req, const fetch_result_t *res, void *arg) {
  footer_req_t *fr = arg;
  resolve_ctx_t *rc = fr->rc;
  remote_object_t *o = &rc->objs[fr->index];
  char msg[1024], where[600];
  /* Messages name the object without credentials or query (bug fix, tests:
   * remote_faults_wrong_bytes). */
  fetch_redact(o->url, where, sizeof(where));
  if (res->status) {
    fail(rc, res->status, res->message);
    goto done;
  }
  if (res->etag[0]) snprintf(o->etag, sizeof(o->etag), "%s", res->etag);
  snprintf(o->last_modified, sizeof(o->last_modified), "%s", res->last_modified);
  if (res->object_size) o->size = res->object_size;
  if (o->etag[0] == '\0' && o->last_modified[0] == '\0') warn_unvalidated(o->url);
  if (o->size < 12 || res->length < 8) {
    snprintf(msg, sizeof(msg), "%s: not a Parquet file: %llu bytes is too short", where,
             (unsigned long long)o->size);
    fail(rc, LARDER_ECORRUPT, msg);
    goto done;
  }
  pq_options po;
  pq_options_init(&po);
  po.max_footer_bytes = rc->max_footer;
  uint32_t flen = 0;
  pq_error perr = {0, ""};
  int prc = pq_footer_length(res->data + res->length - 8, o->size, &po, &flen, where, &perr);
  if (prc) {
    fail(rc, prc, perr.msg);
    goto done;
  }
  o->footer_len = flen;
  if ((uint64_t)flen + 8 <= res->length) {
    o->footer = malloc(flen ? flen : 1);
    if (o->footer == NULL) {
      fail(rc, LARDER_ENOMEM, "out of memory");
      goto done;
    }
    memcpy(o->footer, res->data + res->length - 8 - flen, flen);
  } else {
    /* The footer is bigger than the first guess: one more, exact read. */
    footer_req_t *more = malloc(sizeof(*more));
    fetch_range_t r = {o->size - 8 - flen, flen, 0};
    if (more == NULL) {
      fail(rc, LARDER_ENOMEM, "out of memory");
      goto done;
    }
    *more = *fr;
    rc->pending++;
    if (fetch_get(rc->f, o->url, &r, on_footer_rest, more) == NULL) {
      free(more);
      rc->pending--;
      fail(rc, LARDER_ENOMEM, "out of memory");
    }
  }
done:
  fetch_req_free(req);
  free(fr);
  rc->pending--;
  maybe_finish(rc);
}

static void read_footer(resolve_ctx_t *rc, size_t index) {
  footer_req_t *fr = malloc(sizeof(*fr));
  if (fr == NULL) {
    fail(rc, LARDER_ENOMEM, "out of memory");
    return;
  }
  fr->rc = rc;
  fr->index = index;
  /* fresh: the footer read is how a new stream sees the object's current
   * version, so it goes to the server even when the object is kept whole
   * (bug fix, tests: remote_hostile_no_range_change: a server that ignores
   * Range had its object kept whole and never asked again, and every new
   * stream read the old version while it stayed in memory). */
  fetch_range_t r = {0, 0, rc->guess, 1, 0};
  rc->pending++;
  if (fetch_get(rc->f, rc->objs[index].url, &r, on_footer, fr) == NULL) {
    rc->pending--;
    free(fr);
    fail(rc, LARDER_ENOMEM, "out of memory");
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

int remote_resolve(fetch_t *f, const char *const *sources, size_t n, uint32_t footer_guess,
                   uint32_t max_footer, remote_cb cb, void *arg) {
  resolve_ctx_t *rc = calloc(1, sizeof(*rc));
  if (rc == NULL) return LARDER_ENOMEM;
  rc->f = f;
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
    /* Bug fix (tests: remote_hostile_query_url): wildcards are only for
     * s3:// sources, which can be listed; an http(s) URL is taken
     * literally, so that a presigned or SAS URL's query string ("?") and an
     * IPv6 literal host ("[::1]") are not mistaken for a glob. */
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
