/*
 * footers.c: the table of parsed footers shared by datasets (footers.h).
 *
 * A chained hash table under one mutex.  An entry is inserted before its
 * parse, marked as parsing, so that the ranks of a job opening the same
 * dataset at once (torchrun starts them together) wait for one parse of
 * each file instead of making one each; the parse itself runs unlocked.
 */
#include "plan/footers.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "larder.h"
#include "util.h"

/* glibc returns the freed heap of many small parses only on malloc_trim. */
#define FOOTERS_TRIM_BYTES (64ull << 20)

struct footer {
  struct footer *next; /* in its bucket */
  uint64_t key;        /* hash of path, identity and options */
  char *path;
  char *identity;
  pq_options opts;
  pq_file *pq; /* NULL while parsing */
  uint64_t footer_hash;
  uint64_t bytes; /* counted in footers.bytes once parsed */
  int fd;         /* local files: a descriptor of this version, or -1 */
  int refs;
  int parsing;
};

struct footers {
  pthread_mutex_t lock;
  pthread_cond_t parsed; /* broadcast when a parse ends, well or not */
  footer_t **buckets;
  size_t num_buckets, count;
  uint64_t bytes, freed_since_trim;
  stats_global_t *stats;
};

int footers_create(stats_global_t *stats, footers_t **out) {
  *out = NULL;
  footers_t *f = calloc(1, sizeof(*f));
  if (f == NULL) return LARDER_ENOMEM;
  f->num_buckets = 1024;
  f->buckets = calloc(f->num_buckets, sizeof(footer_t *));
  if (f->buckets == NULL) {
    free(f);
    return LARDER_ENOMEM;
  }
  pthread_mutex_init(&f->lock, NULL);
  pthread_cond_init(&f->parsed, NULL);
  f->stats = stats;
  *out = f;
  return 0;
}

static void entry_free(footer_t *e) {
  if (e->fd >= 0) close(e->fd);
  pq_file_close(e->pq);
  free(e->path);
  free(e->identity);
  free(e);
}

void footers_destroy(footers_t *f) {
  if (f == NULL) return;
  for (size_t b = 0; b < f->num_buckets; b++) {
    footer_t *e = f->buckets[b];
    while (e) {
      footer_t *next = e->next;
      entry_free(e);
      e = next;
    }
  }
  free(f->buckets);
  pthread_cond_destroy(&f->parsed);
  pthread_mutex_destroy(&f->lock);
  free(f);
}

static uint64_t entry_key(const char *path, const char *identity, const pq_options *o) {
  uint64_t h = util_hash64(path, strlen(path), 0x666f6f7465727321ull);
  h = util_hash64(identity, strlen(identity), h);
  uint64_t opts[3] = {o->max_chunk_decoded_bytes, o->max_footer_bytes, (uint64_t)o->verify_crc};
  return util_hash64(opts, sizeof(opts), h);
}

static int same_options(const pq_options *a, const pq_options *b) {
  return a->max_chunk_decoded_bytes == b->max_chunk_decoded_bytes &&
         a->max_footer_bytes == b->max_footer_bytes && a->verify_crc == b->verify_crc;
}

/* The entry for the key, or NULL.  Under the lock. */
static footer_t *find(const footers_t *f, uint64_t key, const char *path, const char *identity,
                      const pq_options *opts) {
  for (footer_t *e = f->buckets[key % f->num_buckets]; e; e = e->next)
    if (e->key == key && strcmp(e->path, path) == 0 && strcmp(e->identity, identity) == 0 &&
        same_options(&e->opts, opts))
      return e;
  return NULL;
}

/* Doubles the buckets once the entries outnumber them; a failed allocation
 * leaves the chains longer, not wrong.  Under the lock. */
static void grow(footers_t *f) {
  if (f->count <= f->num_buckets) return;
  size_t n = f->num_buckets * 2;
  footer_t **nb = calloc(n, sizeof(footer_t *));
  if (nb == NULL) return;
  for (size_t b = 0; b < f->num_buckets; b++) {
    footer_t *e = f->buckets[b];
    while (e) {
      footer_t *next = e->next;
      e->next = nb[e->key % n];
      nb[e->key % n] = e;
      e = next;
    }
  }
  free(f->buckets);
  f->buckets = nb;
  f->num_buckets = n;
}

/* Takes e out of its chain.  Under the lock. */
static void unlink_entry(footers_t *f, footer_t *e) {
  footer_t **pp = &f->buckets[e->key % f->num_buckets];
  while (*pp && *pp != e) pp = &(*pp)->next;
  if (*pp) *pp = e->next;
  f->count--;
}

int footers_acquire(footers_t *f, const char *path, const char *identity, const pq_options *opts,
                    int fd, uint64_t limit, footers_parse_cb parse, void *arg, footer_t **out,
                    char *err, size_t errlen) {
  *out = NULL;
  uint64_t key = entry_key(path, identity, opts);
  pthread_mutex_lock(&f->lock);
  footer_t *e;
  while ((e = find(f, key, path, identity, opts)) != NULL && e->parsing)
    pthread_cond_wait(&f->parsed, &f->lock);
  if (e) {
    e->refs++;
    pthread_mutex_unlock(&f->lock);
    if (f->stats) STATS_ADD(f->stats, footers_shared, 1);
    *out = e;
    return 0;
  }
  e = calloc(1, sizeof(*e));
  char *p = strdup(path), *id = strdup(identity);
  int own = fd >= 0 ? util_dup_cloexec(fd) : -1;
  if (e == NULL || p == NULL || id == NULL || (fd >= 0 && own < 0)) {
    int e_no = errno;
    pthread_mutex_unlock(&f->lock);
    free(e);
    free(p);
    free(id);
    if (own >= 0) close(own);
    if (e && p && id) {
      snprintf(err, errlen, "%s: %s", path, strerror(e_no));
      return e_no == EMFILE || e_no == ENFILE ? LARDER_ELIMIT : LARDER_EIO;
    }
    return LARDER_ENOMEM;
  }
  e->fd = own;
  e->key = key;
  e->path = p;
  e->identity = id;
  e->opts = *opts;
  e->refs = 1;
  e->parsing = 1;
  e->next = f->buckets[key % f->num_buckets];
  f->buckets[key % f->num_buckets] = e;
  f->count++;
  grow(f);
  pthread_mutex_unlock(&f->lock);

  pq_file *pq = NULL;
  uint64_t hash = 0;
  int rc = parse(arg, &pq, &hash, err, errlen);
  uint64_t bytes = 0;
  if (rc == 0) bytes = pq_file_memory(pq) + sizeof(*e) + strlen(path) + strlen(identity) + 2;

  pthread_mutex_lock(&f->lock);
  if (rc == 0 && limit && f->bytes + bytes > limit) {
    char held[32], more[32], cap[32];
    util_human_bytes(held, sizeof(held), (double)f->bytes);
    util_human_bytes(more, sizeof(more), (double)bytes);
    util_human_bytes(cap, sizeof(cap), (double)limit);
    snprintf(err, errlen,
             "%s: the parsed footers of the files that open streams read take %s, and this "
             "file's %s more would pass footer_memory (%s): raise footer_memory, or read "
             "fewer files at once",
             path, held, more, cap);
    rc = LARDER_ELIMIT;
  }
  if (rc) {
    /* The waiters look again, find nothing, and parse for themselves: a
     * file that failed here may be fixed by the time they read it. */
    unlink_entry(f, e);
    pthread_cond_broadcast(&f->parsed);
    pthread_mutex_unlock(&f->lock);
    pq_file_close(pq);
    e->pq = NULL;
    entry_free(e);
    return rc;
  }
  e->pq = pq;
  e->footer_hash = hash;
  e->bytes = bytes;
  e->parsing = 0;
  f->bytes += bytes;
  pthread_cond_broadcast(&f->parsed);
  pthread_mutex_unlock(&f->lock);
  if (f->stats) {
    STATS_ADD(f->stats, footers_parsed, 1);
    STATS_ADD(f->stats, footer_files, 1);
    STATS_ADD(f->stats, footer_bytes, bytes);
  }
  *out = e;
  return 0;
}

void footers_release(footers_t *f, footer_t *e) {
  if (e == NULL) return;
  pthread_mutex_lock(&f->lock);
  int last = --e->refs == 0;
  if (last) {
    unlink_entry(f, e);
    f->bytes -= e->bytes;
    f->freed_since_trim += e->bytes;
  }
  pthread_mutex_unlock(&f->lock);
  if (!last) return;
  if (f->stats) {
    STATS_SUB(f->stats, footer_files, 1);
    STATS_SUB(f->stats, footer_bytes, e->bytes);
  }
  entry_free(e);
}

const pq_file *footers_file(const footer_t *e) { return e->pq; }
uint64_t footers_hash(const footer_t *e) { return e->footer_hash; }
int footers_fd(const footer_t *e) { return e->fd; }

int footers_trim_due(footers_t *f) {
  pthread_mutex_lock(&f->lock);
  int due = f->freed_since_trim >= FOOTERS_TRIM_BYTES;
  if (due) f->freed_since_trim = 0;
  pthread_mutex_unlock(&f->lock);
  return due;
}
