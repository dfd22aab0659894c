/*
 * wire.c: frame encoding and decoding, and descriptor passing.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "wire.h"

uint8_t *wire_encode(const Larder__Frame *frame, size_t *len) {
  size_t n = larder__frame__get_packed_size(frame);
  uint8_t *buf = malloc(n + WIRE_HEADER);
  if (buf == NULL) return NULL;
  buf[0] = (uint8_t)n;
  buf[1] = (uint8_t)(n >> 8);
  buf[2] = (uint8_t)(n >> 16);
  buf[3] = (uint8_t)(n >> 24);
  larder__frame__pack(frame, buf + WIRE_HEADER);
  *len = n + WIRE_HEADER;
  return buf;
}

int64_t wire_frame_ready(const uint8_t *buf, size_t len, uint32_t max) {
  if (len < WIRE_HEADER) return 0;
  uint32_t n =
      (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 | (uint32_t)buf[3] << 24;
  if (n > max) return LARDER_EPROTO;
  if (len - WIRE_HEADER < n) return 0;
  return (int64_t)n + WIRE_HEADER;
}

/* An allocator for one unpack that refuses to go past its budget.  Its
 * blocks come from malloc, so wire_free releases them with protobuf-c's
 * default allocator. */
typedef struct decode_budget {
  uint64_t left;
  int exceeded;
} decode_budget_t;

static void *budget_alloc(void *data, size_t size) {
  decode_budget_t *b = data;
  /* What glibc takes for it: a header, 16-byte granules, 32 at least. */
  uint64_t cost = ((uint64_t)size + 8 + 15) & ~(uint64_t)15;
  if (cost < 32) cost = 32;
  if (cost > b->left) {
    b->exceeded = 1;
    return NULL;
  }
  b->left -= cost;
  return malloc(size);
}

static void budget_free(void *data, void *p) {
  (void)data;
  free(p);
}

Larder__Frame *wire_decode(const uint8_t *buf, size_t len, uint64_t budget, int *too_costly) {
  if (too_costly) *too_costly = 0;
  if (len < WIRE_HEADER) return NULL;
  if (budget == 0) return larder__frame__unpack(NULL, len - WIRE_HEADER, buf + WIRE_HEADER);
  decode_budget_t left = {budget, 0};
  ProtobufCAllocator alloc = {budget_alloc, budget_free, &left};
  Larder__Frame *f = larder__frame__unpack(&alloc, len - WIRE_HEADER, buf + WIRE_HEADER);
  if (f == NULL && too_costly) *too_costly = left.exceeded;
  return f;
}

void wire_free(Larder__Frame *frame) {
  if (frame) larder__frame__free_unpacked(frame, NULL);
}

/* Reads a base-128 varint.  Returns 0, or -1 when it runs past end or is
 * longer than a uint64_t (protobuf-c would drop the excess bits: leave such
 * a frame to it). */
static int get_varint(const uint8_t **p, const uint8_t *end, uint64_t *v) {
  uint64_t r = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (*p >= end) return -1;
    uint8_t b = *(*p)++;
    if (shift == 63 && b > 1) return -1;
    r |= (uint64_t)(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      *v = r;
      return 0;
    }
  }
  return -1;
}

/* Protobuf wire types. */
enum { WT_VARINT = 0, WT_LEN = 2 };

wire_batch_t *wire_decode_batch(const uint8_t *buf, size_t len) {
  if (len < WIRE_HEADER + 2) return NULL;
  const uint8_t *p = buf + WIRE_HEADER, *end = buf + len;
  uint64_t tag, n;
  /* The frame holds exactly one field: its batch. */
  if (get_varint(&p, end, &tag) || tag != ((uint64_t)LARDER__FRAME__MSG_BATCH << 3 | WT_LEN))
    return NULL;
  if (get_varint(&p, end, &n) || n != (uint64_t)(end - p)) return NULL;
  uint64_t vals[8] = {0}; /* fields 1-7 by number */
  unsigned seen = 0;
  const uint8_t *lay = NULL, *lay_end = NULL;
  size_t n_layout = 0;
  while (p < end) {
    if (get_varint(&p, end, &tag)) return NULL;
    uint64_t field = tag >> 3, type = tag & 7;
    if (field >= 32 || (seen & (1u << field))) return NULL;
    seen |= 1u << field;
    if (field >= 1 && field <= 7 && type == WT_VARINT) {
      if (get_varint(&p, end, &vals[field])) return NULL;
    } else if (field == 9 && type == WT_VARINT) {
      uint64_t kind;
      if (get_varint(&p, end, &kind) || kind != LARDER__MEMORY_KIND__MEMORY_HOST) return NULL;
    } else if (field == 11 && type == WT_LEN) {
      if (get_varint(&p, end, &n) || n > (uint64_t)(end - p)) return NULL;
      lay = p;
      lay_end = p + n;
      /* One value ends at each byte below 0x80. */
      for (const uint8_t *q = lay; q < lay_end; q++) n_layout += *q < 0x80;
      if (n > 0 && lay_end[-1] >= 0x80) return NULL;
      p = lay_end;
    } else {
      return NULL;
    }
  }
  if (vals[1] > UINT32_MAX) return NULL;
  wire_batch_t *b = malloc(sizeof(*b) + n_layout * sizeof(uint64_t));
  if (b == NULL) return NULL;
  uint64_t *out = (uint64_t *)(b + 1);
  for (size_t i = 0; i < n_layout; i++)
    if (get_varint(&lay, lay_end, &out[i])) {
      free(b);
      return NULL;
    }
  b->stream_id = (uint32_t)vals[1];
  b->seq = vals[2];
  b->epoch = vals[3];
  b->index = vals[4];
  b->num_rows = vals[5];
  b->arena_offset = vals[6];
  b->arena_length = vals[7];
  b->n_layout = n_layout;
  b->layout = out;
  return b;
}

int64_t wire_sendmsg(int sock, const void *buf, size_t len, const int *fds, int num_fds) {
  /* iov_base is not const, but sendmsg only reads it. */
  struct iovec iov = {(void *)buf, len};
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * WIRE_MAX_FDS)];
  } ctl;
  if (num_fds > WIRE_MAX_FDS) return -EINVAL;
  if (num_fds > 0) {
    memset(&ctl, 0, sizeof(ctl));
    msg.msg_control = ctl.buf;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)num_fds);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)num_fds);
    memcpy(CMSG_DATA(c), fds, sizeof(int) * (size_t)num_fds);
  }
  for (;;) {
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    return -errno;
  }
}

int64_t wire_recvmsg(int sock, void *buf, size_t cap, int *fds, int max_fds, int *num_fds,
                     int dontwait) {
  struct iovec iov = {buf, cap};
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int) * 8)];
  } ctl;
  msg.msg_control = ctl.buf;
  msg.msg_controllen = sizeof(ctl.buf);
  ssize_t n;
  for (;;) {
    n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | (dontwait ? MSG_DONTWAIT : 0));
    if (n >= 0) break;
    if (errno == EINTR) continue;
    return -errno;
  }
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; i++) {
      int fd;
      memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (*num_fds < max_fds) fds[(*num_fds)++] = fd;
      else close(fd);
    }
  }
  return n;
}
