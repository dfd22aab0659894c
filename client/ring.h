/*
 * ring.h: a stream's descriptor ring (prefix ring_), shared by larderd and
 * liblarder.
 *
 * A trainer that keeps up with the daemon should make no system call per
 * batch.  With frames it made two every few steps (a recvmsg for the Batch
 * frames, a send for the Release frames) and woke the daemon's loop: 2.2 to
 * 2.5 us of a step spent in larder_stream_next, 1% of a 230 us step.  The
 * ring carries the same information through shared memory instead.
 *
 * Conventions
 * -----------
 * - One ring per stream: a memfd the daemon creates, sizes, fills in the
 *   header of, and seals against shrinking and growing before it passes it
 *   with OpenStreamReply (after the arena's descriptor).  Both sides map it
 *   read-write, so neither can make the other fault by truncating it.
 * - Layout: ring_header_t (three cache lines), then `slots` release entries
 *   (ring_release_t), then `slots` descriptors of slot_bytes each
 *   (ring_desc_t).  slots is the stream's window.
 * - The daemon writes the header's first two lines and the descriptors; the
 *   client writes the third line and the release entries.  Each side treats
 *   what the other writes as untrusted: the daemon checks every release
 *   against the batches it sent (a bad one fails that stream), the client
 *   every descriptor against its arena, as it checks Batch frames.
 * - Counters only grow.  Descriptor n lies in slot n % slots, release n in
 *   entry n % slots.  The window keeps both from being overwritten unread:
 *   the daemon publishes descriptor n only once fewer than `slots` batches
 *   are unreleased, so the client has read descriptor n - slots; the client
 *   releases only batches it received, so fewer than `slots` of its entries
 *   are unread.
 * - Wakeups.  A side that is about to sleep on the socket says so in the
 *   ring, then looks again; the other side publishes, then looks whether
 *   the first sleeps.  Both use sequentially consistent operations, so at
 *   least one of them sees the other's write: a wakeup is never lost.
 *   - The client sets `wake_client_at` (and `consumed`) before it waits
 *     for a batch.  The daemon sends a Wake frame once `published` reaches
 *     it, or sooner when it has published something the client has not
 *     taken and nothing more is on its way (no batch of the stream being
 *     assembled, or the window full).  How many it asks for is
 *     ring_pace_sleep_batches: the next one, unless the trainer has lately
 *     spent most of its time waiting on the daemon, when a quarter window:
 *     that halves the wakeups of a trainer the daemon cannot keep up with,
 *     each of which also preempts a worker on a small host, and costs it
 *     nothing, as its batches come no faster either way.  The daemon
 *     answers each value once, so the client never asks a smaller value
 *     than before, and asks a larger one once it has taken descriptors
 *     since (ring_sleep_target).  It writes `consumed` before
 *     `wake_client_at`, the latter with release; the daemon reads
 *     `wake_client_at` with acquire, then `consumed`.
 *   - The daemon sets `wake_at` while its window is full (or its arena):
 *     nothing more can go out until the client releases.  The client,
 *     after a release, sends a Wake frame once `released` reaches it, and
 *     before it sleeps when wake_at is set and it holds releases the daemon
 *     has not been told of.  Otherwise the daemon reads the releases when
 *     it next works on the stream, and a trainer that keeps up makes no
 *     system call for them.
 * - The functions are pure layout arithmetic; any thread.  The daemon
 *   finds entries through its own ring_layout_t, never through the shared
 *   header (see ring_layout_t).
 */
#ifndef LARDER_RING_H
#define LARDER_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define RING_MAGIC 0x31474e49524c444cull /* "LDLRING1" */

/* Shared memory between processes needs lock-free atomics. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2, "64-bit atomics must be lock-free");

typedef struct ring_header {
  /* Written by the daemon before it passes the ring; fixed afterwards. */
  uint64_t magic;
  uint32_t slots;      /* entries of each kind: the stream's window */
  uint32_t slot_bytes; /* bytes of one descriptor */
  uint32_t num_layout; /* layout values in each descriptor */
  uint32_t reserved0;
  uint64_t releases_offset; /* from the start of the ring */
  uint64_t descs_offset;
  uint8_t pad0[64 - 40];
  /* Written by the daemon. */
  _Atomic uint64_t published; /* descriptors written */
  _Atomic uint64_t wake_at;   /* 0, or: send a Wake once `released` reaches it */
  uint8_t pad1[64 - 16];
  /* Written by the client. */
  _Atomic uint64_t released;       /* release entries written */
  _Atomic uint64_t wake_client_at; /* 0, or: asleep on the socket until
                                      `published` reaches this */
  _Atomic uint64_t consumed;       /* descriptors taken, as of that sleep */
  uint8_t pad2[64 - 24];
} ring_header_t;

/* One batch, as a Batch frame describes it. */
typedef struct ring_desc {
  uint64_t seq, epoch, index, num_rows, arena_offset, arena_length;
  uint64_t layout[]; /* num_layout values: ARRAY_NUM_FIELDS per array */
} ring_desc_t;

/* One release, as a Release frame describes it. */
typedef struct ring_release {
  uint64_t seq, wait_ns, compute_ns, reserved;
} ring_release_t;

/* Bytes of a descriptor slot for num_layout layout values, rounded to a
 * cache line so that slots do not share one. */
static inline uint64_t ring_slot_bytes(uint32_t num_layout) {
  return (sizeof(ring_desc_t) + (uint64_t)num_layout * sizeof(uint64_t) + 63) & ~(uint64_t)63;
}

/* Bytes of a whole ring (before rounding to pages). */
static inline uint64_t ring_bytes(uint32_t slots, uint32_t num_layout) {
  return sizeof(ring_header_t) + (uint64_t)slots * sizeof(ring_release_t) +
         (uint64_t)slots * ring_slot_bytes(num_layout);
}

/* Fills in the fixed part of a zeroed ring. */
static inline void ring_init(ring_header_t *h, uint32_t slots, uint32_t num_layout) {
  h->magic = RING_MAGIC;
  h->slots = slots;
  h->slot_bytes = (uint32_t)ring_slot_bytes(num_layout);
  h->num_layout = num_layout;
  h->releases_offset = sizeof(ring_header_t);
  h->descs_offset = sizeof(ring_header_t) + (uint64_t)slots * sizeof(ring_release_t);
  /* A client that has taken nothing yet may already wait on the socket
   * (an event loop polls it right after opening): the first descriptor
   * comes with a Wake. */
  atomic_store_explicit(&h->wake_client_at, 1, memory_order_relaxed);
}

/* The client's recent pace, from which it chooses how many descriptors to
 * sleep for: decaying sums, a thirty-second off per call of
 * larder_stream_next, of the time spent in the call and of the whole time
 * since the previous call began (the trainer's compute plus the call).
 * About the last 32 calls count, so that one wait no longer than 32 of the
 * trainer's steps does not change its pace. */
typedef struct ring_pace {
  uint64_t recent_wait, recent_total;
} ring_pace_t;

/* Adds one call that took wait_ns and followed compute_ns of the
 * trainer's own time. */
static inline void ring_pace_add(ring_pace_t *p, uint64_t wait_ns, uint64_t compute_ns) {
  p->recent_wait = p->recent_wait - p->recent_wait / 32 + wait_ns;
  p->recent_total = p->recent_total - p->recent_total / 32 + wait_ns + compute_ns;
}

/*
 * The descriptors a reader that runs dry sleeps for (wake_client_at -
 * consumed) in a stream whose window is `window`: a quarter window (at
 * least 1) when the trainer spent more than half its recent time waiting,
 * else 1.  A trainer the daemon cannot keep up with gets its batches no
 * later for sleeping until several are out, and is woken a quarter as
 * often (its batches came 18-22% sooner per batch on 2 cores, bench-serve).  A
 * trainer that keeps up runs dry only when the daemon falls behind for a
 * moment, and wants the next batch the moment it is out: sleeping for 8
 * of a window of 32 would make each such moment a wait of eight
 * assemblies, 0.8-1.1 ms every 30-35 batches in some epochs (15% stall).
 */
static inline uint32_t ring_pace_sleep_batches(const ring_pace_t *p, uint32_t window) {
  uint32_t quarter = window >= 8 ? window / 4 : 1;
  return p->recent_wait > p->recent_total / 2 ? quarter : 1;
}

/* A reader's sleeps: the wake_client_at it last asked for (0 before the
 * first) and the descriptors it had taken then. */
typedef struct ring_sleeps {
  uint64_t last_at, last_consumed;
} ring_sleeps_t;

/*
 * The wake_client_at for a reader that has taken `consumed` descriptors
 * and sleeps for n more.  The daemon answers each value once, and may
 * answer early, with fewer out, so a value asked before must not be asked
 * again once the reader has taken descriptors since: it may have been
 * answered by those.  (Asked again with nothing taken since, it is safe:
 * an answered value means descriptors are out, which the reader sees
 * before it sleeps.)  Values never go down, and stay within n_max (a
 * quarter window) of `consumed`.  So a reader that sleeps for two, is
 * woken early by one, takes it and sleeps for one asks for the next value,
 * not the same one again, which would be woken only by liblarder's
 * one-second safety net.  Tested by daemon_ring_wakeups (under UBSan).
 */
static inline uint64_t ring_sleep_target(ring_sleeps_t *s, uint64_t consumed, uint32_t n) {
  uint64_t at = consumed + n;
  if (at < s->last_at) at = s->last_at;
  if (at == s->last_at && consumed != s->last_consumed) at++;
  s->last_at = at;
  s->last_consumed = consumed;
  return at;
}

/* Checks a header the other side wrote against the size mapped and the
 * layout expected.  Returns 1 when it is usable. */
static inline int ring_valid(const ring_header_t *h, uint64_t size, uint32_t num_layout) {
  return size >= sizeof(ring_header_t) && h->magic == RING_MAGIC && h->slots > 0 &&
         h->num_layout == num_layout && h->slot_bytes == ring_slot_bytes(num_layout) &&
         h->releases_offset == sizeof(ring_header_t) &&
         h->descs_offset == sizeof(ring_header_t) + (uint64_t)h->slots * sizeof(ring_release_t) &&
         ring_bytes(h->slots, num_layout) <= size;
}

/* Where a ring's entries lie, copied from its header once.  The daemon
 * works from its own copy, made when it creates the ring, and never reads
 * the layout back: the client maps the header writable, and a client that
 * rewrote `slots` or an offset would otherwise make the daemon divide by
 * zero or write outside the ring.  Tested by daemon_robust_bad_ring. */
typedef struct ring_layout {
  uint8_t *base;
  uint64_t slots, slot_bytes, releases_offset, descs_offset;
} ring_layout_t;

static inline void ring_layout_init(ring_layout_t *l, ring_header_t *h) {
  l->base = (uint8_t *)h;
  l->slots = h->slots;
  l->slot_bytes = h->slot_bytes;
  l->releases_offset = h->releases_offset;
  l->descs_offset = h->descs_offset;
}

static inline ring_desc_t *ring_layout_desc(const ring_layout_t *l, uint64_t n) {
  return (ring_desc_t *)(void *)(l->base + l->descs_offset + (n % l->slots) * l->slot_bytes);
}

static inline ring_release_t *ring_layout_release(const ring_layout_t *l, uint64_t n) {
  return (ring_release_t *)(void *)(l->base + l->releases_offset +
                                    (n % l->slots) * sizeof(ring_release_t));
}

/* The same from the header itself, for tests that read a ring they set up
 * (both sides work from a ring_layout_t: each maps the header writable by
 * the other). */
static inline ring_desc_t *ring_desc(ring_header_t *h, uint64_t n) {
  return (ring_desc_t *)(void *)((uint8_t *)h + h->descs_offset + (n % h->slots) * h->slot_bytes);
}

static inline ring_release_t *ring_release_entry(ring_header_t *h, uint64_t n) {
  return (ring_release_t *)(void *)((uint8_t *)h + h->releases_offset +
                                    (n % h->slots) * sizeof(ring_release_t));
}

#endif /* LARDER_RING_H */
