/*
 * arena.c: memfd arenas and their ring allocator.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../client/larder.h"
#include "arena.h"
#include "layout.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

typedef struct region {
  uint64_t offset, end; /* end includes any gap skipped before a wrap */
  uint64_t len;
  int released;
} region;

struct arena {
  int fd;
  uint8_t *base;
  uint64_t size;
  pthread_mutex_t lock;
  region *ring; /* live regions in allocation order */
  size_t cap, head, count;
  uint64_t tail; /* where the next allocation goes */
  uint64_t used;
};

int arena_create(uint64_t size, const char *name, arena_t **out) {
  long page = sysconf(_SC_PAGESIZE);
  size = (size + (uint64_t)page - 1) & ~(uint64_t)(page - 1);
  arena_t *a = calloc(1, sizeof(*a));
  if (a == NULL) return LARDER_ENOMEM;
  a->fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (a->fd < 0 || ftruncate(a->fd, (off_t)size) != 0) {
    int rc = errno == ENOMEM || errno == ENOSPC ? LARDER_ENOMEM : LARDER_EIO;
    if (a->fd >= 0) close(a->fd);
    free(a);
    return rc;
  }
  a->base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
  if (a->base == MAP_FAILED) {
    close(a->fd);
    free(a);
    return LARDER_ENOMEM;
  }
  /* Seal after mapping: our mapping stays writable, later ones cannot be. */
  if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0 ||
      fcntl(a->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) != 0) {
    /* Older kernels lack F_SEAL_FUTURE_WRITE; the size seals are what keep
     * the daemon safe, and they were added first. */
  }
  a->size = size;
  pthread_mutex_init(&a->lock, NULL);
  *out = a;
  return 0;
}

void arena_destroy(arena_t *a) {
  if (a == NULL) return;
  munmap(a->base, a->size);
  close(a->fd);
  pthread_mutex_destroy(&a->lock);
  free(a->ring);
  free(a);
}

int arena_fd(const arena_t *a) { return a->fd; }
uint8_t *arena_base(const arena_t *a) { return a->base; }
uint64_t arena_size(const arena_t *a) { return a->size; }

uint64_t arena_used(arena_t *a) {
  pthread_mutex_lock(&a->lock);
  uint64_t u = a->used;
  pthread_mutex_unlock(&a->lock);
  return u;
}

static region *ring_at(arena_t *a, size_t i) { return &a->ring[(a->head + i) % a->cap]; }

int64_t arena_alloc(arena_t *a, uint64_t len) {
  len = (len + LAYOUT_ALIGN - 1) & ~(uint64_t)(LAYOUT_ALIGN - 1);
  if (len == 0) len = LAYOUT_ALIGN;
  if (len > a->size) return LARDER_ELIMIT;
  pthread_mutex_lock(&a->lock);
  int64_t rc = LARDER_EAGAIN;
  if (a->count == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 16;
    region *r = malloc(cap * sizeof(*r));
    if (r == NULL) {
      pthread_mutex_unlock(&a->lock);
      return LARDER_ENOMEM;
    }
    for (size_t i = 0; i < a->count; i++) r[i] = *ring_at(a, i);
    free(a->ring);
    a->ring = r;
    a->cap = cap;
    a->head = 0;
  }
  uint64_t start;
  if (a->count == 0) {
    a->tail = 0;
    start = 0;
  } else {
    uint64_t head_off = ring_at(a, 0)->offset;
    if (a->tail > head_off) {
      /* Free space: [tail, size) and then [0, head_off). */
      if (a->size - a->tail >= len) start = a->tail;
      else if (head_off >= len) {
        /* Wrap: the skipped end joins the last region. */
        ring_at(a, a->count - 1)->end = a->size;
        start = 0;
      } else goto out;
    } else {
      if (head_off - a->tail >= len) start = a->tail;
      else goto out;
    }
  }
  region *r = ring_at(a, a->count++);
  r->offset = start;
  r->end = start + len;
  r->len = len;
  r->released = 0;
  a->tail = start + len;
  a->used += len;
  rc = (int64_t)start;
out:
  pthread_mutex_unlock(&a->lock);
  return rc;
}

int arena_release(arena_t *a, uint64_t offset) {
  pthread_mutex_lock(&a->lock);
  int rc = LARDER_EINVAL;
  for (size_t i = 0; i < a->count; i++) {
    region *r = ring_at(a, i);
    if (r->offset == offset && !r->released) {
      r->released = 1;
      rc = 0;
      break;
    }
  }
  while (a->count > 0 && ring_at(a, 0)->released) {
    a->used -= ring_at(a, 0)->len;
    a->head = (a->head + 1) % a->cap;
    a->count--;
  }
  if (a->count == 0) {
    a->used = 0;
    a->tail = 0;
  }
  pthread_mutex_unlock(&a->lock);
  return rc;
}
