/*
 * stage.c: the staging area of fetched row groups (stage.h).
 *
 * Entries live in a hash table by (object, row group) and on one list in
 * the order they were made; eviction walks the list for the worst victim.
 * The list holds at most capacity / (one row group's fetched bytes)
 * entries, row groups being megabytes, so a walk per new entry is cheap
 * beside the write it precedes.
 */
#include "cache/stage.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "larder.h"
#include "cache/crc32c.h"
#include "htab.h"
#include "util.h"

enum { ENTRY_WRITING = 0, ENTRY_READY = 1 };

struct stage_entry {
  htab_node_t hnode; /* in stage_t.table while not evicted */
  stage_entry_t *prev, *next;
  uint64_t object_id;
  uint32_t rg;
  uint64_t priority;
  uint64_t used_ns; /* made or last mapped */
  int state;
  int evicted; /* evicted while being written: stage_commit deletes it */
  int num_ranges;
  stage_range_t *ranges;
  uint64_t *file_off; /* per range: where its bytes start in the file */
  uint32_t *crc;      /* per range: CRC32C of its bytes (stage_write) */
  uint64_t bytes;
  char name[64];
};

struct stage {
  int dirfd;
  uint64_t capacity, used;
  uint64_t idle_ns;
  uint64_t seq;
  htab_t table;
  stage_entry_t *head, *tail;
  stage_stats_t st;
};

static uint64_t key_hash(uint64_t object_id, uint32_t rg) {
  uint64_t k[2] = {object_id, rg};
  return util_hash64(k, sizeof(k), 0x7374616765ull);
}

static stage_entry_t *find(const stage_t *s, uint64_t object_id, uint32_t rg) {
  uint64_t h = key_hash(object_id, rg);
  for (htab_node_t *n = htab_chain(&s->table, h); n; n = n->next) {
    stage_entry_t *e = HTAB_ENTRY(n, stage_entry_t, hnode);
    if (n->hash == h && e->object_id == object_id && e->rg == rg) return e;
  }
  return NULL;
}

static void entry_free(stage_entry_t *e) {
  free(e->ranges);
  free(e->file_off);
  free(e->crc);
  free(e);
}

/* Takes e out of the table and the list and counts its bytes out. */
static void detach(stage_t *s, stage_entry_t *e) {
  htab_remove(&s->table, &e->hnode);
  if (e->prev) e->prev->next = e->next;
  else s->head = e->next;
  if (e->next) e->next->prev = e->prev;
  else s->tail = e->prev;
  e->prev = e->next = NULL;
  s->used -= e->bytes;
}

/* Evicts e: a visible entry's file is deleted now; one being written is
 * deleted by stage_commit, which frees it then. */
static void evict(stage_t *s, stage_entry_t *e) {
  detach(s, e);
  s->st.evicted++;
  if (e->state == ENTRY_READY) {
    s->st.entries--;
    unlinkat(s->dirfd, e->name, 0);
    entry_free(e);
  } else {
    e->evicted = 1;
  }
}

/* Deletes every file of the directory (an earlier run's entries). */
static void wipe(int dirfd) {
  int fd = util_dup_cloexec(dirfd);
  DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
  if (d == NULL) {
    if (fd >= 0) close(fd);
    return;
  }
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    if (de->d_name[0] != '.') unlinkat(dirfd, de->d_name, 0);
  closedir(d);
}

int stage_open(const char *dir, uint64_t capacity, uint32_t idle_s, stage_t **out) {
  *out = NULL;
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) return errno == ENOSPC ? LARDER_ENOSPC : LARDER_EIO;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno == EACCES ? LARDER_EACCES : LARDER_EIO;
  stage_t *s = calloc(1, sizeof(*s));
  if (s == NULL) {
    close(fd);
    return LARDER_ENOMEM;
  }
  s->dirfd = fd;
  s->capacity = capacity;
  s->idle_ns = (uint64_t)(idle_s ? idle_s : 604800) * 1000000000ull;
  wipe(fd);
  *out = s;
  return 0;
}

void stage_close(stage_t *s) {
  if (s == NULL) return;
  while (s->head) {
    stage_entry_t *e = s->head;
    s->head = e->next;
    entry_free(e);
  }
  htab_free(&s->table);
  close(s->dirfd);
  free(s);
}

/* The entry to evict first for one of `priority`: one idle past idle_ns,
 * else the worst priority worse than `priority`; NULL when none. */
static stage_entry_t *victim(const stage_t *s, uint64_t priority, uint64_t now) {
  stage_entry_t *worst = NULL;
  for (stage_entry_t *e = s->head; e; e = e->next) {
    if (e->state != ENTRY_READY) continue;
    if (now - e->used_ns > s->idle_ns) return e;
    if (e->priority > priority && (worst == NULL || e->priority > worst->priority)) worst = e;
  }
  return worst;
}

void stage_set_capacity(stage_t *s, uint64_t capacity) {
  s->capacity = capacity;
  uint64_t now = util_now_ns();
  while (s->used > s->capacity) {
    stage_entry_t *v = victim(s, 0, now);
    if (v == NULL) break; /* only entries being written: they finish */
    evict(s, v);
  }
}

stage_entry_t *stage_reserve(stage_t *s, uint64_t object_id, uint32_t rg, uint64_t priority,
                             const stage_range_t *ranges, int n) {
  uint64_t bytes = 0;
  for (int i = 0; i < n; i++) bytes += ranges[i].length;
  if (n <= 0 || bytes == 0 || bytes > s->capacity || find(s, object_id, rg)) {
    if (n > 0 && bytes > s->capacity) s->st.refused++;
    return NULL;
  }
  uint64_t now = util_now_ns();
  /* Evict only when the room can be made: count first, evict after. */
  if (s->used + bytes > s->capacity) {
    uint64_t freeable = 0;
    for (stage_entry_t *e = s->head; e; e = e->next)
      if (e->state == ENTRY_READY && (now - e->used_ns > s->idle_ns || e->priority > priority))
        freeable += e->bytes;
    if (s->used - freeable + bytes > s->capacity) {
      s->st.refused++;
      return NULL;
    }
    while (s->used + bytes > s->capacity) {
      stage_entry_t *v = victim(s, priority, now);
      if (v == NULL) break;
      evict(s, v);
    }
  }
  stage_entry_t *e = calloc(1, sizeof(*e));
  if (e == NULL) return NULL;
  e->ranges = malloc((size_t)n * sizeof(*e->ranges));
  e->file_off = malloc((size_t)n * sizeof(*e->file_off));
  e->crc = calloc((size_t)n, sizeof(*e->crc));
  if (e->ranges == NULL || e->file_off == NULL || e->crc == NULL ||
      htab_insert(&s->table, &e->hnode, key_hash(object_id, rg)) != 0) {
    entry_free(e);
    return NULL;
  }
  memcpy(e->ranges, ranges, (size_t)n * sizeof(*ranges));
  uint64_t off = 0;
  for (int i = 0; i < n; i++) {
    e->file_off[i] = off;
    off += ranges[i].length;
  }
  e->num_ranges = n;
  e->bytes = bytes;
  e->object_id = object_id;
  e->rg = rg;
  e->priority = priority;
  e->used_ns = now;
  e->state = ENTRY_WRITING;
  snprintf(e->name, sizeof(e->name), "%016llx-%u-%llu.rg", (unsigned long long)object_id, rg,
           (unsigned long long)++s->seq);
  e->prev = s->tail;
  if (s->tail) s->tail->next = e;
  else s->head = e;
  s->tail = e;
  s->used += bytes;
  return e;
}

int stage_write(const stage_t *s, stage_entry_t *e, const uint8_t *const *data,
                int (*room_check)(void *arg, uint64_t bytes), void *room_arg) {
  if (room_check && !room_check(room_arg, e->bytes)) return LARDER_ENOSPC;
  int fd = openat(s->dirfd, e->name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return errno == ENOSPC ? LARDER_ENOSPC : LARDER_EIO;
  int rc = 0;
  for (int i = 0; i < e->num_ranges && rc == 0; i++) {
    e->crc[i] = cache_crc32c(0, data[i], (size_t)e->ranges[i].length);
    uint64_t done = 0;
    while (done < e->ranges[i].length) {
      ssize_t w = pwrite(fd, data[i] + done, (size_t)(e->ranges[i].length - done),
                         (off_t)(e->file_off[i] + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        rc = w < 0 && errno == ENOSPC ? LARDER_ENOSPC : LARDER_EIO;
        break;
      }
      done += (uint64_t)w;
    }
  }
  close(fd);
  if (rc) unlinkat(s->dirfd, e->name, 0);
  return rc;
}

void stage_commit(stage_t *s, stage_entry_t *e, int rc) {
  if (e->evicted) {
    unlinkat(s->dirfd, e->name, 0);
    entry_free(e);
    return;
  }
  if (rc) {
    s->st.failed++;
    detach(s, e);
    unlinkat(s->dirfd, e->name, 0);
    entry_free(e);
    return;
  }
  e->state = ENTRY_READY;
  s->st.entries++;
  s->st.written++;
}

int stage_lookup(stage_t *s, uint64_t object_id, uint32_t rg, const stage_range_t *ranges, int n,
                 stage_piece_t **pieces, int *npieces) {
  *pieces = NULL;
  *npieces = 0;
  stage_entry_t *e = find(s, object_id, rg);
  if (e == NULL || e->state != ENTRY_READY) return LARDER_EINVAL;
  stage_piece_t *p = malloc((size_t)(n > 0 ? n : 1) * sizeof(*p));
  if (p == NULL) return LARDER_ENOMEM;
  /* Each range asked for lies within one of the entry's (both sorted). */
  int k = 0, np = 0;
  for (int i = 0; i < n; i++) {
    while (k < e->num_ranges && e->ranges[k].offset + e->ranges[k].length <= ranges[i].offset) k++;
    if (k == e->num_ranges || ranges[i].offset < e->ranges[k].offset ||
        ranges[i].offset + ranges[i].length > e->ranges[k].offset + e->ranges[k].length) {
      free(p);
      return LARDER_EINVAL;
    }
    if (np > 0 && p[np - 1].offset == e->ranges[k].offset) continue;
    p[np++] = (stage_piece_t){e->ranges[k].offset, e->ranges[k].length, e->file_off[k], e->crc[k]};
  }
  int fd = openat(s->dirfd, e->name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    free(p);
    /* A file gone or unreadable: the entry is of no use. */
    evict(s, e);
    return LARDER_EIO;
  }
  e->used_ns = util_now_ns();
  s->st.hits++;
  *pieces = p;
  *npieces = np;
  return fd;
}

void stage_drop(stage_t *s, uint64_t object_id, uint32_t rg) {
  stage_entry_t *e = find(s, object_id, rg);
  if (e && e->state == ENTRY_READY) evict(s, e);
}

int stage_contains(const stage_t *s, uint64_t object_id, uint32_t rg) {
  const stage_entry_t *e = find(s, object_id, rg);
  return e && e->state == ENTRY_READY;
}

void stage_stats_get(const stage_t *s, stage_stats_t *out) {
  *out = s->st;
  out->bytes = s->used;
}
