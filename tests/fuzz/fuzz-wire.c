/*
 * fuzz-wire.c: libFuzzer target over the bytes a peer sends on the socket.
 *
 * The input is what a connection's read buffer could hold: any number of
 * length-prefixed frames, possibly cut short.  It is split the way larderd
 * and liblarder split it (wire_frame_ready under WIRE_MAX_FRAME), and each
 * frame is decoded both ways a frame is decoded: by protobuf-c under the
 * daemon's allocation budget (wire_decode) and by the trainer's hand-written
 * Batch decoder (wire_decode_batch).  What wire.h promises is checked:
 *
 * - wire_frame_ready returns 0 (more bytes), LARDER_EPROTO, or a size that
 *   covers the header and lies within the buffer;
 * - a frame the fast decoder accepts is a Batch that protobuf-c decodes
 *   too, with the same stream, sequence, epoch, index, rows, arena range and
 *   layout;
 * - re-encoding a decoded frame and decoding it again is safe, and gives a
 *   frame of the same message kind when it decodes (protobuf-c keeps
 *   unknown fields as they came, a field number 0 among them, and refuses
 *   some of them once re-encoded: not larder's to promise).
 *
 * A broken promise aborts, which libFuzzer reports as a crash.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire.h"

#define FUZZ_CHECK(cond)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "%s:%d: broken promise: %s\n", __FILE__, __LINE__, #cond); \
      abort();                                                                   \
    }                                                                            \
  } while (0)

static void check_batch(const wire_batch_t *fast, const Larder__Frame *f) {
  /* The fast path takes host-memory Batches alone; protobuf-c must agree. */
  FUZZ_CHECK(f != NULL);
  FUZZ_CHECK(f->msg_case == LARDER__FRAME__MSG_BATCH);
  const Larder__Batch *b = f->batch;
  FUZZ_CHECK(b != NULL);
  FUZZ_CHECK(b->stream_id == fast->stream_id);
  FUZZ_CHECK(b->seq == fast->seq);
  FUZZ_CHECK(b->epoch == fast->epoch);
  FUZZ_CHECK(b->index == fast->index);
  FUZZ_CHECK(b->num_rows == fast->num_rows);
  FUZZ_CHECK(b->arena_offset == fast->arena_offset);
  FUZZ_CHECK(b->arena_length == fast->arena_length);
  FUZZ_CHECK(b->n_layout == fast->n_layout);
  for (size_t i = 0; i < fast->n_layout; i++) FUZZ_CHECK(b->layout[i] == fast->layout[i]);
}

static void one_frame(const uint8_t *buf, size_t len) {
  int too_costly = 0;
  Larder__Frame *f = wire_decode(buf, len, WIRE_DECODE_BUDGET(len), &too_costly);
  wire_batch_t *fast = wire_decode_batch(buf, len);
  if (fast) {
    /* A frame over the budget is refused by the daemon alone; the client
     * decodes without one. */
    Larder__Frame *g = f ? f : wire_decode(buf, len, 0, NULL);
    check_batch(fast, g);
    if (g != f) wire_free(g);
    free(fast);
  }
  if (f) {
    size_t n = 0;
    uint8_t *again = wire_encode(f, &n);
    if (again) {
      FUZZ_CHECK(n >= WIRE_HEADER);
      Larder__Frame *h = wire_decode(again, n, 0, NULL);
      FUZZ_CHECK(h == NULL || h->msg_case == f->msg_case);
      wire_free(h);
      free(again);
    }
    wire_free(f);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t off = 0;
  while (off < size) {
    int64_t n = wire_frame_ready(data + off, size - off, WIRE_MAX_FRAME);
    FUZZ_CHECK(n == 0 || n == LARDER_EPROTO || (n >= WIRE_HEADER && (size_t)n <= size - off));
    if (n <= 0) break;
    one_frame(data + off, (size_t)n);
    off += (size_t)n;
  }
  return 0;
}
