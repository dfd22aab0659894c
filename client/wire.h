/*
 * wire.h: framing of larder's protocol (prefix wire_), shared by liblarder,
 * larderctl and larderd.
 *
 * Conventions
 * -----------
 * - A frame is a 4-byte little-endian length and a protobuf-c encoded
 *   Larder__Frame (proto/larder.proto).  Frames longer than the caller's
 *   maximum are rejected before anything is allocated for them.
 * - protobuf-c reports failures as NULL; that becomes LARDER_EPROTO here.
 * - Functions are reentrant; buffers belong to the caller.
 */
#ifndef LARDER_WIRE_H
#define LARDER_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "larder.h"
#include "larder.pb-c.h"

#define WIRE_PROTOCOL_VERSION 2
#define WIRE_MAX_FRAME (16u << 20)
#define WIRE_HEADER 4

/* Encodes frame with its length prefix into a malloc'd buffer of *len
 * bytes.  Returns it, or NULL when out of memory. */
uint8_t *wire_encode(const Larder__Frame *frame, size_t *len);

/*
 * Looks at the bytes buffered so far.  Returns the size of the first
 * complete frame (header included) when one is there, 0 when more bytes are
 * needed, or LARDER_EPROTO when the header announces more than max bytes.
 */
int64_t wire_frame_ready(const uint8_t *buf, size_t len, uint32_t max);

/*
 * Decodes the frame of `len` bytes (header included) at buf.  Returns a
 * frame the caller frees with wire_free, or NULL for malformed bytes or out
 * of memory.  With a budget (0: none), decoding may allocate at most that
 * many bytes, counting malloc's overhead, and past it returns NULL with
 * *too_costly set (too_costly may be NULL).  The daemon decodes clients'
 * frames with WIRE_DECODE_BUDGET: a frame of millions of empty strings,
 * two bytes each on the wire, would otherwise take 36 times its length in
 * memory (protobuf-c's 32-byte record of each field while it parses, the
 * pointer, and malloc's least block).  A short string costs about 72
 * bytes, so the fixed 4 MiB covers some 58,000 of them (column names of a
 * wide projection) beside the 8 bytes a byte of longer ones.  Clients
 * decode the daemon's frames without a budget: a schema of many short
 * column names takes more than 8 times its bytes, legitimately.
 */
#define WIRE_DECODE_BUDGET(len) (8 * (uint64_t)(len) + (4u << 20))
Larder__Frame *wire_decode(const uint8_t *buf, size_t len, uint64_t budget, int *too_costly);
void wire_free(Larder__Frame *frame);

/* A Batch frame, as the trainer's hot path reads it. */
typedef struct wire_batch {
  uint32_t stream_id;
  uint64_t seq, epoch, index, num_rows, arena_offset, arena_length;
  size_t n_layout;
  const uint64_t *layout; /* n_layout values (ArrayField order) */
} wire_batch_t;

/*
 * Decodes the frame of `len` bytes (header included) at buf when it is a
 * host-memory Batch in the form protobuf-c writes (each field once, in any
 * order, the layout packed), without protobuf-c: a trainer decodes one per
 * step, and protobuf-c's generic unpack and free cost it about a
 * microsecond.  Returns a malloc'd wire_batch_t whose layout lies in the
 * same block (the caller frees it with free), or NULL for anything else
 * (another message, another form, malformed or truncated bytes, out of
 * memory): wire_decode then decodes it, or reports it malformed.
 */
wire_batch_t *wire_decode_batch(const uint8_t *buf, size_t len);

/* Descriptors one frame may carry (an arena, a ring and a CUDA region). */
#define WIRE_MAX_FDS 3

/*
 * Sends len bytes with the num_fds descriptors of fds (at most WIRE_MAX_FDS)
 * attached as SCM_RIGHTS on a Unix socket.  Returns the bytes sent
 * (possibly fewer than len; the descriptors went with the first of them) or
 * a negative errno-style code (-EAGAIN ...).  Any thread.
 */
int64_t wire_sendmsg(int sock, const void *buf, size_t len, const int *fds, int num_fds);

/*
 * Receives up to cap bytes; with dontwait set, returns -EAGAIN at once when
 * nothing is there.  Any descriptors that arrive are appended to fds (up to
 * max_fds; extras are closed) and *num_fds is updated.  Returns the bytes
 * read, 0 at end of stream, or a negative errno-style code.
 */
int64_t wire_recvmsg(int sock, void *buf, size_t cap, int *fds, int max_fds, int *num_fds,
                     int dontwait);

#endif /* LARDER_WIRE_H */
