/*
 * strbuf.c: a growing byte buffer (see strbuf.h).
 */
#include "strbuf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "larder.h"

void strbuf_init(strbuf_t *b, size_t max) {
  memset(b, 0, sizeof(*b));
  b->max = max;
}

/* Makes room for extra more bytes and the terminating '\0'.  Returns 0 or
 * the error, which it makes sticky. */
static int reserve(strbuf_t *b, size_t extra) {
  if (b->error) return b->error;
  if (extra > SIZE_MAX / 2 - b->len) return b->error = LARDER_ENOMEM;
  size_t need = b->len + extra;
  if (b->max && need > b->max) return b->error = LARDER_ELIMIT;
  if (need + 1 <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < need + 1) cap *= 2;
  char *p = realloc(b->data, cap);
  if (p == NULL) return b->error = LARDER_ENOMEM;
  b->data = p;
  b->cap = cap;
  return 0;
}

int strbuf_append(strbuf_t *b, const void *p, size_t n) {
  int rc = reserve(b, n);
  if (rc) return rc;
  if (n) memcpy(b->data + b->len, p, n);
  b->len += n;
  b->data[b->len] = '\0';
  return 0;
}

int strbuf_puts(strbuf_t *b, const char *s) { return strbuf_append(b, s, strlen(s)); }

int strbuf_printf(strbuf_t *b, const char *fmt, ...) {
  if (b->error) return b->error;
  char small[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(small, sizeof(small), fmt, ap);
  va_end(ap);
  if (n < 0) return LARDER_EINVAL;
  if ((size_t)n < sizeof(small)) return strbuf_append(b, small, (size_t)n);
  int rc = reserve(b, (size_t)n);
  if (rc) return rc;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
  return 0;
}

void strbuf_reset(strbuf_t *b) {
  b->len = 0;
  b->error = 0;
  if (b->data) b->data[0] = '\0';
}

char *strbuf_take(strbuf_t *b, size_t *len) {
  char *data = b->data;
  if (len) *len = b->len;
  size_t max = b->max;
  strbuf_init(b, max);
  return data;
}

void strbuf_free(strbuf_t *b) { free(strbuf_take(b, NULL)); }
