/*
 * arena.h: a stream's shared-memory arena (prefix arena_).
 *
 * Conventions
 * -----------
 * - The arena is a memfd of fixed size, mapped read-write here and sent to
 *   the client, which maps it read-only.  It is sealed against resizing and
 *   against new writable mappings (F_SEAL_FUTURE_WRITE), so a client can
 *   neither shrink it under the daemon (which would turn our writes into
 *   SIGBUS) nor write into it.
 * - Batches are allocated first fit, each LAYOUT_ALIGN-aligned: in the
 *   lowest free gap that fits, so only the pages of the batches in flight
 *   are ever touched.  A region is reused once its batch was released;
 *   releases may come in any order, and a batch the client keeps blocks
 *   only its own region.
 * - Threading: arena_alloc and arena_release take the arena's mutex, so the
 *   loop and worker threads may call them; create and destroy are the
 *   loop's.
 * - Errors: negative larder_errno_t.
 */
#ifndef LARDER_ARENA_H
#define LARDER_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct arena arena_t;

/* Creates a memfd of *size bytes (rounded up to pages, which *size then
 * says), maps it read-write at *base and seals its size, so that a peer it
 * is passed to cannot make our accesses fault.  Returns 0, LARDER_ENOMEM or
 * LARDER_EIO; on failure *fd is -1.  The caller owns both (munmap, close).
 * Any thread.  Stream rings (client/ring.h) use it as it is. */
int arena_memfd_create(uint64_t *size, const char *name, int *fd, uint8_t **base);

/* Creates an arena of size bytes (rounded up to pages), sealed so that the
 * clients' mappings of it can only be read-only.  Returns 0, LARDER_ENOMEM
 * or LARDER_EIO. */
int arena_create(uint64_t size, const char *name, arena_t **out);
void arena_destroy(arena_t *a);

int arena_fd(const arena_t *a);
uint8_t *arena_base(const arena_t *a);
uint64_t arena_size(const arena_t *a);
/* Bytes currently allocated (not yet released). */
uint64_t arena_used(arena_t *a);

/* Reserves len bytes and returns their offset, LARDER_EAGAIN when there is
 * no room until something is released, or LARDER_ELIMIT when len can never
 * fit. */
int64_t arena_alloc(arena_t *a, uint64_t len);

/* Reserves n regions of lens[i] bytes each (each aligned, placed first
 * fit, the largest first) and sets offs[i], all or none: for a batch that
 * no single gap holds, placed column by column (a batch's buffers need not
 * be contiguous).  Returns 0, LARDER_EAGAIN when they do not all fit now
 * (offs[i] are then -1), LARDER_ELIMIT when their total can never fit, or
 * LARDER_ENOMEM.  Each region is released on its own. */
int arena_alloc_parts(arena_t *a, const uint64_t *lens, size_t n, int64_t *offs);

/* Releases the region that starts at offset.  Returns 0 or LARDER_EINVAL
 * for an offset that is not a live allocation. */
int arena_release(arena_t *a, uint64_t offset);

#endif /* LARDER_ARENA_H */
