/*
 * test-wire.c: unit tests for the protocol's framing (client/wire.c).
 *
 * Conventions
 * -----------
 * - protobuf-c is the reference: wire_decode_batch, the trainer's fast path
 *   for Batch frames, must agree with it on every frame it accepts, and
 *   must leave to it (return NULL) every frame it does not, malformed ones
 *   included.  Frames are made by protobuf-c's packer, then cut and
 *   mutated.
 * - The generator is a fixed-seed xorshift, so a failure repeats.
 */
#include <stdlib.h>
#include <string.h>

#include "daemon-harness.h"
#include "ring.h"
#include "task.h"
#include "wire.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

/* A value of a random width: small, offset-sized or any 64-bit value. */
static uint64_t rnd_value(void) {
  switch (rnd() % 4) {
    case 0: return 0;
    case 1: return rnd() % 200;
    case 2: return rnd() % (1ull << 34);
    default: return rnd();
  }
}

/* Packs a random Batch frame (header included) with protobuf-c. */
static uint8_t *random_batch_frame(size_t *len, Larder__Batch *b, uint64_t *layout, size_t max) {
  *b = (Larder__Batch)LARDER__BATCH__INIT;
  b->stream_id = (uint32_t)rnd_value();
  b->seq = rnd_value();
  b->epoch = rnd_value();
  b->index = rnd_value();
  b->num_rows = rnd_value();
  b->arena_offset = rnd_value();
  b->arena_length = rnd_value();
  b->n_layout = (size_t)(rnd() % (max + 1));
  for (size_t i = 0; i < b->n_layout; i++) layout[i] = rnd_value();
  b->layout = layout;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_BATCH;
  f.batch = b;
  return wire_encode(&f, len);
}

/* Asserts that the fast path and protobuf-c agree on buf. */
static int agree(const uint8_t *buf, size_t len, int expect_fast) {
  wire_batch_t *fast = wire_decode_batch(buf, len);
  Larder__Frame *ref = wire_decode(buf, len, 0, NULL);
  if (expect_fast) ASSERT_NOT_NULL(fast);
  if (fast != NULL) {
    ASSERT_NOT_NULL(ref);
    ASSERT_EQ(ref->msg_case, LARDER__FRAME__MSG_BATCH);
    const Larder__Batch *b = ref->batch;
    ASSERT_EQ(b->memory_kind, LARDER__MEMORY_KIND__MEMORY_HOST);
    ASSERT_UINT_EQ(fast->stream_id, b->stream_id);
    ASSERT_UINT_EQ(fast->seq, b->seq);
    ASSERT_UINT_EQ(fast->epoch, b->epoch);
    ASSERT_UINT_EQ(fast->index, b->index);
    ASSERT_UINT_EQ(fast->num_rows, b->num_rows);
    ASSERT_UINT_EQ(fast->arena_offset, b->arena_offset);
    ASSERT_UINT_EQ(fast->arena_length, b->arena_length);
    ASSERT_UINT_EQ(fast->n_layout, b->n_layout);
    if (b->n_layout) ASSERT_MEM_EQ(fast->layout, b->layout, b->n_layout * sizeof(uint64_t));
  }
  free(fast);
  wire_free(ref);
  return 0;
}

/* Every random frame is decoded whole (the fast path must take it), then
 * cut short (the length prefix still claims the whole frame, as a frame
 * that arrived in part would) and with a few bytes changed anywhere after
 * the header: the fast path must decline those or agree with protobuf-c. */
TEST_IMPL(wire_batch_fast_path) {
  uint64_t layout[300];
  Larder__Batch b;
  for (int i = 0; i < 20000; i++) {
    size_t len;
    uint8_t *buf = random_batch_frame(&len, &b, layout, i % 2 ? 300 : 40);
    ASSERT_NOT_NULL(buf);
    ASSERT_OK(agree(buf, len, 1));
    size_t cut = WIRE_HEADER + (size_t)(rnd() % (len - WIRE_HEADER + 1));
    ASSERT_OK(agree(buf, cut, 0));
    for (int k = 0; k < 1 + (int)(rnd() % 3); k++)
      buf[WIRE_HEADER + rnd() % (len - WIRE_HEADER)] = (uint8_t)rnd();
    ASSERT_OK(agree(buf, len, 0));
    free(buf);
  }
  return 0;
}

/* Frames the fast path leaves to protobuf-c, which reads them fine. */
TEST_IMPL(wire_batch_fast_path_declines) {
  uint64_t layout[3] = {1, 2, 3};
  size_t len;
  /* Another message. */
  Larder__EndOfStream eos = LARDER__END_OF_STREAM__INIT;
  eos.stream_id = 7;
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_END_OF_STREAM;
  f.end_of_stream = &eos;
  uint8_t *buf = wire_encode(&f, &len);
  ASSERT_NOT_NULL(buf);
  ASSERT_NULL(wire_decode_batch(buf, len));
  free(buf);
  /* GPU memory, and a CUDA IPC handle. */
  Larder__Batch b = LARDER__BATCH__INIT;
  b.stream_id = 1;
  b.n_layout = 3;
  b.layout = layout;
  b.memory_kind = LARDER__MEMORY_KIND__MEMORY_CUDA;
  f = (Larder__Frame)LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_BATCH;
  f.batch = &b;
  buf = wire_encode(&f, &len);
  ASSERT_NOT_NULL(buf);
  ASSERT_NULL(wire_decode_batch(buf, len));
  free(buf);
  b.memory_kind = LARDER__MEMORY_KIND__MEMORY_HOST;
  uint8_t handle[64] = {1};
  b.cuda_ipc_handle.data = handle;
  b.cuda_ipc_handle.len = sizeof(handle);
  buf = wire_encode(&f, &len);
  ASSERT_NOT_NULL(buf);
  ASSERT_NULL(wire_decode_batch(buf, len));
  Larder__Frame *ref = wire_decode(buf, len, 0, NULL);
  ASSERT_NOT_NULL(ref);
  wire_free(ref);
  free(buf);
  /* The layout unpacked (field 11 as three varints), which protobuf
   * parsers must accept; and a field given twice. */
  static const uint8_t unpacked[] = {0, 0, 0, 0, 0x2a, 8, 0x08, 1, 0x58, 1, 0x58, 2, 0x58, 3};
  uint8_t frame[sizeof(unpacked)];
  memcpy(frame, unpacked, sizeof(frame));
  frame[0] = (uint8_t)(sizeof(frame) - WIRE_HEADER);
  ASSERT_NULL(wire_decode_batch(frame, sizeof(frame)));
  ref = wire_decode(frame, sizeof(frame), 0, NULL);
  ASSERT_NOT_NULL(ref);
  ASSERT_UINT_EQ(ref->batch->n_layout, 3);
  wire_free(ref);
  static const uint8_t twice[] = {0, 0, 0, 0, 0x2a, 4, 0x10, 1, 0x10, 2};
  memcpy(frame, twice, sizeof(twice));
  frame[0] = (uint8_t)(sizeof(twice) - WIRE_HEADER);
  ASSERT_NULL(wire_decode_batch(frame, sizeof(twice)));
  return 0;
}

/* An OpenStream frame of n sources, each `len` bytes of 'x'. */
static uint8_t *open_frame(size_t n, size_t len, size_t *frame_len) {
  char *one = malloc(len + 1);
  ASSERT_NOT_NULL(one);
  memset(one, 'x', len);
  one[len] = '\0';
  char **srcs = malloc(n * sizeof(char *));
  ASSERT_NOT_NULL(srcs);
  for (size_t i = 0; i < n; i++) srcs[i] = one;
  uint8_t *buf = dh_open_frame(1, srcs, n, 64, frame_len);
  free(srcs);
  free(one);
  return buf;
}

/* Decoding with WIRE_DECODE_BUDGET stops there: a frame of 200,000 empty,
 * one- or two-byte strings (2 to 4 bytes each on the wire, about 72 to
 * decode) is refused as too costly, not malformed; a few thousand short
 * names, frames of paths, and the densest legitimate field (a packed
 * layout of one-byte values, 8 times its bytes), decode. */
TEST_IMPL(wire_decode_budget) {
  for (size_t len = 0; len < 3; len++) {
    size_t n, flen;
    uint8_t *buf = open_frame(200000, len, &flen);
    int too_costly = 0;
    ASSERT_NULL(wire_decode(buf, flen, WIRE_DECODE_BUDGET(flen), &too_costly));
    ASSERT_EQ(too_costly, 1);
    free(buf);
    /* A few such strings are nothing: the budget's slack covers them. */
    n = 100;
    buf = open_frame(n, len, &flen);
    Larder__Frame *f = wire_decode(buf, flen, WIRE_DECODE_BUDGET(flen), &too_costly);
    ASSERT_NOT_NULL(f);
    ASSERT_EQ(too_costly, 0);
    ASSERT_UINT_EQ(f->open_stream->n_sources, n);
    wire_free(f);
    free(buf);
  }
  size_t flen;
  /* A wide projection's short names: 5,000 of 5 bytes (72 bytes each to
   * decode, more than 8 times their 7 on the wire). */
  uint8_t *buf = open_frame(5000, 5, &flen);
  int too_costly = 1;
  Larder__Frame *f = wire_decode(buf, flen, WIRE_DECODE_BUDGET(flen), &too_costly);
  ASSERT_NOT_NULL(f);
  ASSERT_EQ(too_costly, 0);
  ASSERT_UINT_EQ(f->open_stream->n_sources, 5000);
  wire_free(f);
  free(buf);
  buf = open_frame(100000, 60, &flen);
  too_costly = 1;
  f = wire_decode(buf, flen, WIRE_DECODE_BUDGET(flen), &too_costly);
  ASSERT_NOT_NULL(f);
  ASSERT_EQ(too_costly, 0);
  ASSERT_UINT_EQ(f->open_stream->n_sources, 100000);
  ASSERT_EQ(strlen(f->open_stream->sources[99999]), 60);
  wire_free(f);
  free(buf);
  /* A Batch whose layout is a million zeros. */
  size_t n = 1u << 20;
  uint64_t *layout = calloc(n, sizeof(uint64_t));
  ASSERT_NOT_NULL(layout);
  Larder__Batch b = LARDER__BATCH__INIT;
  b.n_layout = n;
  b.layout = layout;
  Larder__Frame bf = LARDER__FRAME__INIT;
  bf.msg_case = LARDER__FRAME__MSG_BATCH;
  bf.batch = &b;
  buf = wire_encode(&bf, &flen);
  ASSERT_NOT_NULL(buf);
  f = wire_decode(buf, flen, WIRE_DECODE_BUDGET(flen), &too_costly);
  ASSERT_NOT_NULL(f);
  ASSERT_UINT_EQ(f->batch->n_layout, n);
  wire_free(f);
  free(buf);
  free(layout);
  /* Without a budget, the same frame of empty strings decodes. */
  buf = open_frame(200000, 0, &flen);
  f = wire_decode(buf, flen, 0, &too_costly);
  ASSERT_NOT_NULL(f);
  ASSERT_UINT_EQ(f->open_stream->n_sources, 200000);
  wire_free(f);
  free(buf);
  /* Malformed bytes are not "too costly". */
  static const uint8_t garbage[] = {4, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
  too_costly = 1;
  ASSERT_NULL(
      wire_decode(garbage, sizeof(garbage), WIRE_DECODE_BUDGET(sizeof(garbage)), &too_costly));
  ASSERT_EQ(too_costly, 0);
  return 0;
}

/*
 * How many descriptors a reader that runs dry sleeps for (ring.h): one
 * while the trainer keeps up, whatever its window, even right after a
 * single long wait; a quarter window once it waits on the daemon most of
 * the time, as a trainer faster than the daemon does, whether each of its
 * calls waits or one in a quarter window waits for the lot; and one again
 * soon after it slows down.
 */
TEST_IMPL(ring_pace_sleep_policy) {
  ring_pace_t p = {0, 0};
  /* Nothing known yet: the first batch wakes the reader. */
  ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 32), 1);
  /* A trainer that computes 100 us a step and finds its batch ready. */
  for (int i = 0; i < 100; i++) ring_pace_add(&p, 500, 100000);
  ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 32), 1);
  /* The daemon falls behind once for 3 ms: still one. */
  ring_pace_add(&p, 3000000, 100000);
  ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 32), 1);
  ring_pace_add(&p, 500, 100000);
  ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 32), 1);
  /* The trainer outruns the daemon: 70 us waits for 5 us steps... */
  int calls = 0;
  while (ring_pace_sleep_batches(&p, 32) == 1) {
    ring_pace_add(&p, 70000, 5000);
    ASSERT_LT(++calls, 40);
  }
  ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 32), 8);
  /* ...and stays there when it then gets 8 batches per wakeup: one call
   * waits for eight assemblies, seven find their batch ready. */
  for (int round = 0; round < 20; round++) {
    ring_pace_add(&p, 8 * 70000, 5000);
    ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 32), 8);
    for (int i = 0; i < 7; i++) {
      ring_pace_add(&p, 400, 5000);
      ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 32), 8);
    }
  }
  /* Small windows: a quarter of 4 is 1, of 8 is 2, of 1024 is 256. */
  ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 4), 1);
  ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 8), 2);
  ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 1024), 256);
  /* The trainer slows to 2 ms steps: back to one within a few calls. */
  calls = 0;
  while (ring_pace_sleep_batches(&p, 32) != 1) {
    ring_pace_add(&p, 500, 2000000);
    ASSERT_LT(++calls, 16);
  }
  /* What a sleep asks for.  A reader that slept for two (at 12), was woken
   * early by one, took it and sleeps for one asks for 13, not 12 again,
   * which the daemon may have answered (asking for 12, such a reader would
   * wait for the one-second safety net).  Sleeping again with nothing
   * taken, it may ask the same; it never asks less than before, nor more
   * than the largest n (a quarter window) past what it has taken. */
  ring_sleeps_t sl = {0, 0};
  ASSERT_UINT_EQ(ring_sleep_target(&sl, 0, 1), 1);
  ASSERT_UINT_EQ(ring_sleep_target(&sl, 0, 1), 1);
  ASSERT_UINT_EQ(ring_sleep_target(&sl, 10, 2), 12);
  ASSERT_UINT_EQ(ring_sleep_target(&sl, 11, 1), 13);
  for (int i = 0; i < 100; i++) ASSERT_UINT_EQ(ring_sleep_target(&sl, 11, 1), 13);
  ASSERT_UINT_EQ(ring_sleep_target(&sl, 12, 1), 14);
  ASSERT_UINT_EQ(ring_sleep_target(&sl, 20, 8), 28);
  ASSERT_UINT_EQ(ring_sleep_target(&sl, 21, 1), 29);
  ASSERT_UINT_EQ(ring_sleep_target(&sl, 29, 1), 30);
  /* Hours of waiting do not overflow the sums. */
  for (int i = 0; i < 1000; i++) ring_pace_add(&p, 3600ull * 1000000000ull, 0);
  ASSERT_UINT_EQ(ring_pace_sleep_batches(&p, 32), 8);
  return 0;
}
