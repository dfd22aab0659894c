/*
 * strbuf.h: a growing byte buffer for text and frames (prefix strbuf_),
 * after curl's dynbuf.
 *
 * Conventions
 * -----------
 * - Ownership: the strbuf_t is the caller's (on the stack or in a
 *   structure); the memory it points to is the buffer's until strbuf_take
 *   hands it over or strbuf_free releases it.  A zeroed strbuf_t
 *   (`strbuf_t b = {0}`) is an empty buffer with no size limit, the same
 *   as strbuf_init(&b, 0).
 * - Contents: data is NULL while nothing has been stored; after an append
 *   data[len] is always '\0' (not counted in len), so text can be read as
 *   a C string.  Appended bytes may include '\0'.
 * - Errors: appends return 0, LARDER_ENOMEM (no memory) or LARDER_ELIMIT
 *   (the contents would pass max).  An append that fails appends nothing,
 *   and its error sticks: every later append returns it at once, so text
 *   can be built with unchecked appends and b.error checked once at the
 *   end.  What was appended before the error stays.  strbuf_reset clears
 *   the error.
 * - Threading: none inside; one thread at a time per buffer.
 */
#ifndef LARDER_STRBUF_H
#define LARDER_STRBUF_H

#include <stddef.h>

typedef struct strbuf {
  char *data; /* the contents, NUL-terminated; NULL while never stored to */
  size_t len; /* bytes stored */
  size_t cap; /* bytes allocated */
  size_t max; /* the most bytes it may hold (0: no limit) */
  int error;  /* the first failed append's error, or 0 */
} strbuf_t;

/* An empty buffer holding at most max bytes (0: no limit). */
void strbuf_init(strbuf_t *b, size_t max);

/* Appends n bytes of p.  Returns 0 or the (sticky) error. */
int strbuf_append(strbuf_t *b, const void *p, size_t n);
/* Appends the C string s.  Returns as strbuf_append. */
int strbuf_puts(strbuf_t *b, const char *s);
/* Appends printf's output.  Returns as strbuf_append, or LARDER_EINVAL
 * when the format fails to convert (nothing appended, no sticky error). */
int strbuf_printf(strbuf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Empties the buffer and clears its error, keeping its memory and max. */
void strbuf_reset(strbuf_t *b);

/* Hands the contents over: returns data (NULL when never stored to), which
 * the caller frees, with its length in *len when len is not NULL; the
 * buffer is then empty, with no memory and no error, and keeps its max. */
char *strbuf_take(strbuf_t *b, size_t *len);

/* Frees the contents; the buffer is empty (as strbuf_take leaves it). */
void strbuf_free(strbuf_t *b);

#endif /* LARDER_STRBUF_H */
