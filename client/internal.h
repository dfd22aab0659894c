/*
 * internal.h: what liblarder's files share (prefix llib_), never
 * installed: the structs behind larder.h's handles and the functions one
 * file of the library calls in another.
 *
 *   larder.c  the connection and its streams: the protocol, the descriptor
 *             ring's reading side, releases (llib_batch_release,
 *             llib_ring_snapshot, llib_ring_take)
 *   batch.c   schemas, batches and arrays: a stream's plan, building and
 *             checking a batch's arrays against the arena, the accessors
 *             (llib_field_*, llib_plan_stream, llib_build_arrays,
 *             llib_batch_make, ...)
 *   export.c  the Arrow C Data and Device interfaces and DLPack
 *   cuda.c    the CUDA driver and the stream's device region (lcuda.h)
 *
 * Conventions
 * -----------
 * - Symbols: the functions declared here are hidden (not in liblarder.so's
 *   dynamic symbol table: its exports are larder.h's, lcuda.h's and
 *   wire.h's); their prefix llib_ keeps them apart from larderd's, which
 *   links liblarder.a.
 * - Ownership: a stream owns its schema, plan, arena and ring mappings; a
 *   batch holds one reference to its stream (refs) and owns its nodes;
 *   its arrays point into the stream's arena (or, for CUDA streams, the
 *   device region that mirrors it), never into memory of their own.
 * - Threading: frames and descriptors are read by the one thread that
 *   calls larder_stream_next (or open or close) for the client: "the
 *   reading thread".  Batches may be released on any thread.  Each
 *   struct's fields say which lock guards them.
 * - Untrusted input: everything read from the socket, the arena and the
 *   ring was written by another process.  A descriptor is checked against
 *   the arena before any array is built from it (llib_build_arrays), the
 *   ring's layout is copied and checked once at open (llib_ring_snapshot),
 *   and a count read from the ring is checked against the window before
 *   it is used (llib_ring_take).  tests/fuzz/fuzz-ring.c drives these.
 * - Errors: negative larder_errno_t codes, as in larder.h; functions that
 *   have the client at hand also set its message (c->err).
 */
#ifndef LARDER_INTERNAL_H
#define LARDER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "larder.h"
#include "lcuda.h"
#include "ring.h"
#include "wire.h"

typedef struct field {
  char *name;
  larder_type_t type;
  int nullable;
  int32_t byte_width, precision, scale;
  larder_time_unit_t unit;
  int utc;
  int num_children;
  struct field *children;
} field_t;

struct larder_array {
  const field_t *field;
  int64_t length, null_count;
  const uint8_t *validity;
  const uint8_t *offsets; /* int32, or int64 for the LARGE_* types */
  const void *values;
  uint64_t values_size;
  int num_children;
  int memory_kind; /* LARDER_MEMORY_CUDA: the buffer pointers are device
                       pointers (cuda_rebase_arrays) */
  larder_array_t *children;
};

typedef struct queued {
  struct queued *next;
  Larder__Frame *frame; /* or */
  wire_batch_t *batch;  /* a Batch frame, decoded by wire_decode_batch */
} queued_t;

/* A node of a stream's array tree, in pre-order (the order of a batch's
 * descriptors), with what building and checking its array needs, worked
 * out once at open (plan_node).  A batch's arrays are then built in one
 * flat loop (llib_build_arrays), with no type switch per node: the
 * recursion and switches it replaces took 800 to 1,100 cycles for the 16
 * arrays of the benchmark's batches with warm caches, the loop about 420
 * (development VM). */
typedef struct node_plan {
  const field_t *field;
  int slot;     /* its array in a batch's nodes */
  int children; /* the slot of its first child */
  int num_children;
  int bad_width;         /* a FIXED_BINARY of negative width: no batch is valid */
  uint64_t value_width;  /* bytes per value, 0 when values are not fixed-width */
  uint64_t value_align;  /* the values' alignment: a number's width up to 8,
                            else 1 */
  uint64_t offset_width; /* 4 or 8 for the types with offsets, else 0 */
  int bitmap_values;     /* BOOL: its values are bits */
  int validity_checked;  /* not the NULL type, whose slots are all null */
  /* Its offsets index its child's slots (LIST, LARGE_LIST, MAP) rather
   * than bytes of its values: the checks need not read the field. */
  int offsets_index_child;
} node_plan_t;

struct larder_stream {
  larder_client_t *client;
  uint32_t id;
  larder_stream_t *next;
  field_t schema;
  int num_nodes;
  /* num_nodes nodes in pre-order, and the indexes of those whose checks
   * read a child or the arena (structs, and the types with offsets). */
  node_plan_t *plan;
  int *deep;
  int num_deep;
  uint8_t *arena;
  uint64_t arena_size;
  uint64_t batches_per_epoch, num_samples;
  uint32_t partitions, partitions_first, partitions_last;
  char note[512];
  queued_t *q_head, *q_tail;
  int ended; /* EndOfStream received */
  int error; /* the error that ended the stream */
  /* The error was found here (a malformed batch, out of memory), not
   * sent by the daemon: the daemon still has the stream, and close tells
   * it, and no later batch is taken. */
  int failed_here;
  int closed; /* larder_stream_close called */
  int refs;   /* 1 for the stream + one per live batch */
  uint64_t pos_epoch, pos_batch;
  uint64_t wait_ns, compute_ns, last_return_ns;
  int last_timed_out;                   /* the last call returned LARDER_ETIMEDOUT */
  uint64_t report_wait, report_compute; /* not yet sent with a release */
  pthread_mutex_t lock;                 /* refs and the report counters */
  /* Under the client's send_lock: releases of this stream in c->held, and
   * how many it may hold (half its window). */
  int held_releases, hold_max;
  uint64_t held_gen;     /* c->flushes when counted */
  larder_batch_t *spare; /* a released batch (and its arrays)
                                           to reuse, under lock */
  /* The descriptor ring (ring.h), when the daemon offered one: batches
   * come from it rather than from Batch frames, releases go to it. */
  ring_header_t *ring;
  uint64_t ring_size;
  /* Where the ring's entries lie, and the layout values of a descriptor,
   * checked once at open: the header is writable shared memory, and a
   * value re-read from it on each take could have changed since (a slots
   * of 0 divided by zero). */
  ring_layout_t ring_layout;
  uint32_t ring_num_layout;
  uint64_t ring_consumed; /* descriptors taken (reading thread) */
  uint64_t ring_released; /* entries written, under lock */
  uint64_t ring_woken_at; /* the wake_at last answered, under lock */
  uint64_t ring_told;     /* ring_released when that Wake went */
  /* Under lock: the reading thread sleeps on the socket, or returned
   * LARDER_ETIMEDOUT and its caller waits on larder_stream_fd.  A release
   * made then tells the daemon at once when it waits for one (wake_at):
   * nothing else would, as the reader has checked wake_at already. */
  int ring_reader_asleep;
  /* Under the client's send_lock (written by the owning thread only,
   * which may read it unlocked): this stream's last larder_stream_next
   * returned LARDER_ETIMEDOUT, so its caller may wait on its descriptor,
   * and releases go at once, as for a reader waiting in pump.  The flag
   * is per stream, not per client: a call for another stream must not
   * clear it while the caller still waits on this one, or this one's
   * releases would be held, the daemon's window fill, and the caller's
   * poll never wake.  Tested by client_frames_two_streams_wait. */
  int caller_waits;
  /* The descriptors a reader that runs dry sleeps for, chosen by
   * ring_pace_sleep_batches after each call from the reader's pace (both
   * under lock), read by the reading thread. */
  uint32_t ring_wake_batches;
  uint32_t window;
  ring_pace_t pace;
  ring_sleeps_t ring_sleeps; /* what its sleeps asked (reading thread) */
  /* larder_stream_fd: an epoll descriptor holding the client's socket and
   * `efd`, an eventfd that the reading thread signals when a call for
   * another stream (or open, close) reads something for this one: a Wake
   * frame, or frames it queues.  The socket no longer shows those, so the
   * eventfd does until larder_stream_next runs for this stream.
   * `signalled` (reading thread only) says the eventfd holds a count, so
   * that next reads it only then: no system call on the hot path. */
  int efd, epfd;
  int signalled;
  /* CUDA streams (client/cuda.c): the daemon's device region, which
   * mirrors the arena byte for byte, and its device; NULL and -1 for host
   * streams. */
  int cuda_device;
  lcuda_map_t *cuda;
  larder_client_t *cuda_client; /* set by a close with batches held */
  void *cuda_stream;            /* the CUstream releases fence on (NULL:
                                    the legacy default stream; lcuda.h) */
};

struct larder_batch {
  larder_stream_t *stream;
  uint64_t seq, epoch, index;
  int64_t rows;
  uint64_t bytes;
  int num_columns;
  larder_array_t *nodes;
  larder_array_t *columns; /* the root's children: nodes[0 .. num_columns) */
  int exported;            /* larder_batch_export moved it to an ArrowArray */
  /* The batch's holders: its owner (the caller of larder_stream_next, or
   * the export that took it over) and each tensor of larder_batch_dlpack.
   * The last to let go releases it (llib_batch_unref). */
  atomic_int refs;
};

struct larder_client {
  /* The owner's reference (larder_client_close drops it) and one per
   * CUDA stream closed with batches held, whose last release still sends
   * on this connection (stream_free): the last reference frees it. */
  atomic_int refs;
  int fd;
  pthread_mutex_t send_lock;
  uint8_t *rbuf;
  size_t rlen, rcap;
  int fds[8];
  int num_fds;
  /* The first fds_claimed of fds came with `reply` (OpenStreamReply); the
   * rest came with frames not routed yet. */
  int fds_claimed;
  uint32_t next_request_id;
  larder_stream_t *streams;
  Larder__Frame *reply; /* the answer a request waits for */
  uint32_t waiting_request;
  /* The connection failed (the error, or LARDER_ECLOSED).  Written by the
   * reading thread; atomic because releases on other threads read it. */
  atomic_int broken;
  pid_t pid;         /* the process that connected (fork: see close) */
  unsigned fork_gen; /* fork_generation when it connected */
  char err[1024];
  /* Under send_lock: Release frames not sent yet.  They go out together
   * when a stream holds half its window of them, before the reading thread
   * waits for the daemon, or ahead of any other frame; the daemon then
   * sends the batches that replace them in one write too, and a trainer
   * that keeps up reads several batches per system call. */
  uint8_t *held;
  size_t held_len, held_cap;
  uint64_t flushes;
  int reader_waiting; /* a thread waits in pump: send releases at once */
  /* Under send_lock: a send failed, so the daemon missed what it carried
   * (a release, a Wake).  The connection is not marked broken for it: what
   * the daemon sent before it went (an error, the end of a stream) may
   * still be read. */
  int send_failed;
};

/* Hooks of batch.c for the exports of export.c: marks b exported (its
 * ownership moves to the export; LARDER_EINVAL when it was already), and
 * releases an exported batch when its last consumer lets go.  Any thread.
 * (Exported from liblarder.so, as they always were.) */
int larder_internal_batch_take(larder_batch_t *b);
void larder_internal_batch_release_taken(larder_batch_t *b);

#pragma GCC visibility push(hidden)

/* ------------------------------------------------------------------------ */
/* larder.c: streams                                                         */

/*
 * Releases b (see larder_batch_release): writes its release entry in the
 * ring, or holds or sends its Release frame, unless the stream is closed,
 * the connection broken or this a forked child; then drops b's reference
 * to its stream.  Its struct becomes the stream's spare when recycle is
 * set and there is none, else it is freed.  Any thread.
 */
void llib_batch_release(larder_batch_t *b, int recycle);
/* Drops one of b's refs; the last releases it (llib_batch_release, with
 * recycle).  Any thread. */
void llib_batch_unref(larder_batch_t *b, int recycle);

/*
 * Copies where the entries of the ring h (size bytes mapped) lie into
 * s->ring_layout, once, and checks the copy against size and the
 * num_layout values a descriptor of s must carry.  Takes and releases use
 * only this copy, never the shared header, which the other side may
 * rewrite after the open (slots 0 would divide by zero).  Returns 1 when
 * the ring is usable: every descriptor slot and release entry then lies
 * within the size bytes at h.  The thread that opens.
 */
int llib_ring_snapshot(larder_stream_t *s, ring_header_t *h, uint64_t size, uint32_t num_layout);

/*
 * Takes the next descriptor from s's ring (s->ring, checked by
 * llib_ring_snapshot) into *view, whose layout then points into the ring
 * slot: s->ring_num_layout values, none checked yet.  Returns 1 when it
 * did, 0 when the ring is empty, or LARDER_EPROTO when the daemon
 * published more than the window.  The reading thread.
 */
int llib_ring_take(larder_stream_t *s, wire_batch_t *view);

/* ------------------------------------------------------------------------ */
/* batch.c: schemas, plans, batches                                          */

/* Copies the schema src (depth levels deep already) into dst, which the
 * caller frees with llib_field_free whatever this returns.  Returns 0,
 * LARDER_ENOMEM, or LARDER_EPROTO for a type liblarder does not know or a
 * tree over 64 levels deep. */
int llib_field_copy(field_t *dst, const Larder__Field *src, int depth);
void llib_field_free(field_t *f);
/* The fields in f's tree, f included. */
int llib_field_count(const field_t *f);
/* Bytes per value of a fixed-width type as Arrow lays it out, 0 for the
 * other types (BOOL's values are bits), or -1 for a FIXED_BINARY of
 * negative width. */
int64_t llib_value_width(const field_t *f);
/* Bytes per offset of a type with offsets (4 or 8), else 0. */
uint64_t llib_offset_width(larder_type_t type);

/* Plans s's nodes (s->schema and s->num_nodes set): s->plan, s->deep.
 * Returns 0 or LARDER_ENOMEM.  The thread that opens. */
int llib_plan_stream(larder_stream_t *s);

/*
 * Builds the arrays of a batch into nodes (s->num_nodes of them) from its
 * descriptor b, whose n_layout the caller checked against s->num_nodes,
 * and sets *bytes to the size of its buffers.  Returns 0, or
 * LARDER_EPROTO when a buffer lies outside the arena, is too small for its
 * array or holds numbers not aligned to their width.  After 0, every
 * buffer an array's type and length call for lies inside s->arena.  The
 * reading thread.
 */
int llib_build_arrays(const larder_stream_t *s, const wire_batch_t *b, larder_array_t *nodes,
                      uint64_t *bytes);

/*
 * Makes a batch of s from its descriptor b: checks b's layout count, then
 * its arrays (llib_build_arrays), and on a CUDA stream turns their
 * buffers into device pointers.  Reuses *spare when there is one (*spare
 * is NULL afterwards, whatever the result).  Returns 0 with *out set (a
 * batch the caller counts in s->refs), LARDER_ENOMEM or LARDER_EPROTO
 * (nothing is left allocated).  The reading thread.
 */
int llib_batch_make(larder_stream_t *s, const wire_batch_t *b, larder_batch_t **spare,
                    larder_batch_t **out);

#pragma GCC visibility pop

#endif /* LARDER_INTERNAL_H */
