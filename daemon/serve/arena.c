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

#include "larder.h"
#include "serve/arena.h"
#include "serve/layout.h"

#ifndef F_SEAL_FUTURE_WRITE
#define F_SEAL_FUTURE_WRITE 0x0010
#endif

/*
 * Live regions are kept sorted by offset and a new batch goes into the
 * first free gap that fits.  A ring that reclaimed space only in allocation
 * order would let a client keeping one old batch (well within its window)
 * block the reuse of everything allocated after it: once the ring came
 * round to that batch, the stream would stall for good.  Tested by
 * daemon_arena_small and daemon_robust_chaos.
 *
 * First fit from the start, not next fit (measured: bench-serve): going
 * round the whole arena touches every page of it, so each new stream pays
 * a page fault and a zeroed page for every 4 KiB of its 256 MiB arena in
 * its first epoch (a trainer computing 220 us a batch stalls 20-40% in an
 * epoch whose units are all in memory), and every stream's arena ends up
 * resident.  First fit reuses the same few megabytes (the batches in
 * flight), which stay hot in the caches.
 */
typedef struct region {
  uint64_t offset, len;
} region;

struct arena {
  int fd;
  uint8_t *base;
  uint64_t size;
  pthread_mutex_t lock;
  region *regs; /* live regions, sorted by offset */
  size_t cap, count;
  uint64_t used;
};

int arena_memfd_create(uint64_t *size, const char *name, int *fd, uint8_t **base) {
  long page = sysconf(_SC_PAGESIZE);
  *size = (*size + (uint64_t)page - 1) & ~(uint64_t)(page - 1);
  *fd = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (*fd < 0 || ftruncate(*fd, (off_t)*size) != 0) {
    int rc = errno == ENOMEM || errno == ENOSPC   ? LARDER_ENOMEM
             : errno == EMFILE || errno == ENFILE ? LARDER_ELIMIT
                                                  : LARDER_EIO;
    if (*fd >= 0) close(*fd);
    *fd = -1;
    return rc;
  }
  void *m = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (m == MAP_FAILED) {
    close(*fd);
    *fd = -1;
    return LARDER_ENOMEM;
  }
  /* A peer that could shrink the file would make our accesses fault. */
  if (fcntl(*fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    munmap(m, *size);
    close(*fd);
    *fd = -1;
    return LARDER_EIO;
  }
  *base = m;
  return 0;
}

int arena_create(uint64_t size, const char *name, arena_t **out) {
  arena_t *a = calloc(1, sizeof(*a));
  if (a == NULL) return LARDER_ENOMEM;
  int rc = arena_memfd_create(&size, name, &a->fd, &a->base);
  if (rc) {
    free(a);
    return rc;
  }
  /* Seal after mapping: our mapping stays writable, later ones cannot be. */
  if (fcntl(a->fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE | F_SEAL_SEAL) != 0) {
    /* Older kernels lack F_SEAL_FUTURE_WRITE; the size seals are what keep
     * the daemon safe, and they are in place. */
    (void)fcntl(a->fd, F_ADD_SEALS, F_SEAL_SEAL);
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
  free(a->regs);
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

/* Gap g lies between regions g - 1 and g (gap 0 before the first, gap
 * count after the last). */
static uint64_t gap_start(const arena_t *a, size_t g) {
  return g ? a->regs[g - 1].offset + a->regs[g - 1].len : 0;
}
static uint64_t gap_end(const arena_t *a, size_t g) {
  return g < a->count ? a->regs[g].offset : a->size;
}

/* Inserts a region of len bytes (aligned) in the first gap that holds it.
 * Returns its offset or LARDER_EAGAIN.  The caller holds the lock and has
 * room in regs for one more. */
static int64_t place_locked(arena_t *a, uint64_t len) {
  size_t n = a->count;
  for (size_t g = 0; g <= n; g++) {
    uint64_t start = gap_start(a, g), end = gap_end(a, g);
    if (end < start || end - start < len) continue;
    memmove(&a->regs[g + 1], &a->regs[g], (n - g) * sizeof(region));
    a->regs[g].offset = start;
    a->regs[g].len = len;
    a->count++;
    a->used += len;
    return (int64_t)start;
  }
  return LARDER_EAGAIN;
}

static int release_locked(arena_t *a, uint64_t offset) {
  size_t lo = 0, hi = a->count;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (a->regs[mid].offset < offset) lo = mid + 1;
    else hi = mid;
  }
  if (lo >= a->count || a->regs[lo].offset != offset) return LARDER_EINVAL;
  a->used -= a->regs[lo].len;
  memmove(&a->regs[lo], &a->regs[lo + 1], (a->count - lo - 1) * sizeof(region));
  a->count--;
  return 0;
}

int64_t arena_alloc(arena_t *a, uint64_t len) {
  len = (len + LAYOUT_ALIGN - 1) & ~(uint64_t)(LAYOUT_ALIGN - 1);
  if (len == 0) len = LAYOUT_ALIGN;
  if (len > a->size) return LARDER_ELIMIT;
  pthread_mutex_lock(&a->lock);
  if (a->count == a->cap) {
    size_t cap = a->cap ? a->cap * 2 : 16;
    region *r = realloc(a->regs, cap * sizeof(*r));
    if (r == NULL) {
      pthread_mutex_unlock(&a->lock);
      return LARDER_ENOMEM;
    }
    a->regs = r;
    a->cap = cap;
  }
  int64_t rc = place_locked(a, len);
  pthread_mutex_unlock(&a->lock);
  return rc;
}

int arena_alloc_parts(arena_t *a, const uint64_t *lens, size_t n, int64_t *offs) {
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    uint64_t len = (lens[i] + LAYOUT_ALIGN - 1) & ~(uint64_t)(LAYOUT_ALIGN - 1);
    total += len ? len : LAYOUT_ALIGN;
    offs[i] = -1;
  }
  if (total > a->size) return LARDER_ELIMIT;
  pthread_mutex_lock(&a->lock);
  int rc = 0;
  if (a->cap - a->count < n) {
    size_t cap = a->cap ? a->cap : 16;
    while (cap - a->count < n) cap *= 2;
    region *r = realloc(a->regs, cap * sizeof(*r));
    if (r == NULL) rc = LARDER_ENOMEM;
    else {
      a->regs = r;
      a->cap = cap;
    }
  }
  /* Largest first: first fit decreasing leaves the small parts the gaps
   * the large ones could not use. */
  for (size_t placed = 0; rc == 0 && placed < n; placed++) {
    size_t pick = n;
    for (size_t i = 0; i < n; i++)
      if (offs[i] < 0 && (pick == n || lens[i] > lens[pick])) pick = i;
    uint64_t len = (lens[pick] + LAYOUT_ALIGN - 1) & ~(uint64_t)(LAYOUT_ALIGN - 1);
    int64_t off = place_locked(a, len ? len : LAYOUT_ALIGN);
    if (off < 0) rc = (int)off;
    else offs[pick] = off;
  }
  if (rc) {
    for (size_t i = 0; i < n; i++) {
      if (offs[i] >= 0) (void)release_locked(a, (uint64_t)offs[i]);
      offs[i] = -1;
    }
  }
  pthread_mutex_unlock(&a->lock);
  return rc;
}

int arena_release(arena_t *a, uint64_t offset) {
  pthread_mutex_lock(&a->lock);
  int rc = release_locked(a, offset);
  pthread_mutex_unlock(&a->lock);
  return rc;
}
