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
  uint32_t n = (uint32_t)buf[0] | (uint32_t)buf[1] << 8 | (uint32_t)buf[2] << 16 |
               (uint32_t)buf[3] << 24;
  if (n > max) return LARDER_EPROTO;
  if (len - WIRE_HEADER < n) return 0;
  return (int64_t)n + WIRE_HEADER;
}

Larder__Frame *wire_decode(const uint8_t *buf, size_t len) {
  if (len < WIRE_HEADER) return NULL;
  return larder__frame__unpack(NULL, len - WIRE_HEADER, buf + WIRE_HEADER);
}

void wire_free(Larder__Frame *frame) {
  if (frame) larder__frame__free_unpacked(frame, NULL);
}

int64_t wire_sendmsg(int sock, const void *buf, size_t len, int fd_to_pass) {
  /* iov_base is not const, but sendmsg only reads it. */
  struct iovec iov = {(void *)buf, len};
  struct msghdr msg;
  memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } ctl;
  if (fd_to_pass >= 0) {
    memset(&ctl, 0, sizeof(ctl));
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd_to_pass, sizeof(int));
  }
  for (;;) {
    ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    return -errno;
  }
}

int64_t wire_recvmsg(int sock, void *buf, size_t cap, int *fds, int max_fds,
                     int *num_fds, int dontwait) {
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
