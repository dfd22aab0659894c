/*
 * pq_encoding.c: the integer encodings under Parquet's other encodings: bit
 * unpacking, the RLE / bit-packing hybrid, and DELTA_BINARY_PACKED.
 *
 * These are the decoder's innermost loops.  Unpacking reads 64-bit words
 * while at least eight bytes of input remain and switches to a byte-wise
 * tail near the end, so it never reads past its input; each bit width gets
 * its own copy of the loop (the width is a compile-time constant inside
 * unpack_w), which lets the compiler turn shifts and masks into constants.
 * Everything assumes a little-endian host.
 */
#include <stdio.h>
#include <string.h>

#include "parquet/pq_internal.h"

static inline uint64_t load64(const uint8_t *p) {
  uint64_t v;
  memcpy(&v, p, 8);
  return v;
}

/* Reads w bits at bit offset `bit` one byte at a time; bytes at or past
 * in_len read as zero. */
static uint64_t slow_bits(const uint8_t *in, size_t in_len, uint64_t bit, int w) {
  uint64_t v = 0;
  int got = 0;
  uint64_t byte = bit >> 3;
  int shift = (int)(bit & 7);
  while (got < w) {
    uint64_t b = byte < in_len ? in[byte] : 0;
    b >>= shift;
    v |= got < 64 ? b << got : 0;
    got += 8 - shift;
    shift = 0;
    byte++;
  }
  return w == 64 ? v : v & ((1ull << w) - 1);
}

/*
 * Unpacks in groups of eight values, which always start on a byte boundary
 * (eight values of w bits take exactly w bytes).  Inside a group every bit
 * offset is a compile-time constant once w is, so each value costs one load,
 * one shift and one mask.  Values before the first group boundary and after
 * the last group that can be read with whole 64-bit loads go through
 * slow_bits.
 */
#define DEFINE_UNPACK(NAME, OUT_T)                                                           \
  static inline __attribute__((always_inline)) void NAME##_w(                                \
      const uint8_t *in, size_t in_len, const int w, uint64_t start, OUT_T *out, size_t n) { \
    const uint64_t mask = w >= 64 ? ~0ull : ((1ull << w) - 1);                               \
    size_t i = 0;                                                                            \
    for (; i < n && ((start + i) & 7); i++)                                                  \
      out[i] = (OUT_T)slow_bits(in, in_len, (start + i) * (uint64_t)w, w);                   \
    uint64_t group = (start + i) >> 3;                                                       \
    /* A group reads up to byte (7w)/8 + 8 (+1 past 56 bits) of its start. */                \
    const uint64_t reach = (uint64_t)((7 * w) / 8 + 8 + (w > 56));                           \
    uint64_t first_byte = group * (uint64_t)w;                                               \
    size_t groups = (n - i) / 8;                                                             \
    size_t safe = 0;                                                                         \
    if (in_len >= reach && first_byte <= in_len - reach)                                     \
      safe = (size_t)((in_len - reach - first_byte) / (uint64_t)w + 1);                      \
    if (safe > groups) safe = groups;                                                        \
    const uint8_t *gp = in + first_byte;                                                     \
    for (size_t g = 0; g < safe; g++, gp += w, i += 8) {                                     \
      _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) {                                  \
        const int b = k * w;                                                                 \
        uint64_t v = load64(gp + b / 8) >> (b % 8);                                          \
        if (w > 56 && (b % 8)) v |= (uint64_t)gp[b / 8 + 8] << (64 - b % 8);                 \
        out[i + (size_t)k] = (OUT_T)(v & mask);                                              \
      }                                                                                      \
    }                                                                                        \
    for (; i < n; i++) out[i] = (OUT_T)slow_bits(in, in_len, (start + i) * (uint64_t)w, w);  \
  }

DEFINE_UNPACK(unpack16, uint16_t)
DEFINE_UNPACK(unpack32, uint32_t)
DEFINE_UNPACK(unpack64, uint64_t)

#define CASE16(W) \
  case W: unpack16_w(in, in_len, W, start, out, n); return;

/* Levels are at most 16 bits wide; unpacking straight into uint16 saves a
 * pass over every repetition and definition level. */
static void unpack16(const uint8_t *in, size_t in_len, int bit_width, uint64_t start, uint16_t *out,
                     size_t n) {
  /* clang-format off */
  switch (bit_width) {
    case 0: memset(out, 0, n * sizeof(*out)); return;
    CASE16(1) CASE16(2) CASE16(3) CASE16(4) CASE16(5) CASE16(6) CASE16(7)
    CASE16(8) CASE16(9) CASE16(10) CASE16(11) CASE16(12) CASE16(13)
    CASE16(14) CASE16(15) CASE16(16)
    default: memset(out, 0, n * sizeof(*out)); return;
  }
  /* clang-format on */
}

#define CASE32(W)                             \
  case W:                                     \
    unpack32_w(in, in_len, W, start, out, n); \
    return;
#define CASE64(W) \
  case W: unpack64_w(in, in_len, W, start, out, n); return;

void pq_unpack32(const uint8_t *in, size_t in_len, int bit_width, uint64_t start, uint32_t *out,
                 size_t n) {
  /* clang-format off */
  switch (bit_width) {
    case 0: memset(out, 0, n * sizeof(*out)); return;
    CASE32(1) CASE32(2) CASE32(3) CASE32(4) CASE32(5) CASE32(6) CASE32(7)
    CASE32(8) CASE32(9) CASE32(10) CASE32(11) CASE32(12) CASE32(13)
    CASE32(14) CASE32(15) CASE32(16) CASE32(17) CASE32(18) CASE32(19)
    CASE32(20) CASE32(21) CASE32(22) CASE32(23) CASE32(24) CASE32(25)
    CASE32(26) CASE32(27) CASE32(28) CASE32(29) CASE32(30) CASE32(31)
    CASE32(32)
    default: memset(out, 0, n * sizeof(*out)); return;
  }
  /* clang-format on */
}

void pq_unpack64(const uint8_t *in, size_t in_len, int bit_width, uint64_t start, uint64_t *out,
                 size_t n) {
  /* clang-format off */
  switch (bit_width) {
    case 0: memset(out, 0, n * sizeof(*out)); return;
    CASE64(1) CASE64(2) CASE64(3) CASE64(4) CASE64(5) CASE64(6) CASE64(7)
    CASE64(8) CASE64(9) CASE64(10) CASE64(11) CASE64(12) CASE64(13)
    CASE64(14) CASE64(15) CASE64(16) CASE64(17) CASE64(18) CASE64(19)
    CASE64(20) CASE64(21) CASE64(22) CASE64(23) CASE64(24) CASE64(25)
    CASE64(26) CASE64(27) CASE64(28) CASE64(29) CASE64(30) CASE64(31)
    CASE64(32) CASE64(33) CASE64(34) CASE64(35) CASE64(36) CASE64(37)
    CASE64(38) CASE64(39) CASE64(40) CASE64(41) CASE64(42) CASE64(43)
    CASE64(44) CASE64(45) CASE64(46) CASE64(47) CASE64(48) CASE64(49)
    CASE64(50) CASE64(51) CASE64(52) CASE64(53) CASE64(54) CASE64(55)
    CASE64(56) CASE64(57) CASE64(58) CASE64(59) CASE64(60) CASE64(61)
    CASE64(62) CASE64(63) CASE64(64)
    default: memset(out, 0, n * sizeof(*out)); return;
  }
  /* clang-format on */
}

/* ------------------------------------------------------------------------ */
/* RLE / bit-packing hybrid                                                  */

void pq_rle_init(pq_rle_t *r, const uint8_t *p, size_t len, int bit_width) {
  memset(r, 0, sizeof(*r));
  r->p = p;
  r->end = p + len;
  r->bit_width = bit_width;
  if (bit_width < 0 || bit_width > 32) r->failed = 1;
}

static int read_uvarint32(const uint8_t **pp, const uint8_t *end, uint32_t *out) {
  const uint8_t *p = *pp;
  uint64_t v = 0;
  for (int shift = 0; shift < 35; shift += 7) {
    if (p >= end) return -1;
    uint8_t b = *p++;
    v |= (uint64_t)(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      if (v > UINT32_MAX) return -1;
      *out = (uint32_t)v;
      *pp = p;
      return 0;
    }
  }
  return -1;
}

/* Starts the next run.  Returns 1 when a run started, 0 at the end of the
 * data, or LARDER_ECORRUPT. */
static int rle_next_run(pq_rle_t *r) {
  if (r->failed) return LARDER_ECORRUPT;
  if (r->p >= r->end) return 0;
  uint32_t header;
  if (read_uvarint32(&r->p, r->end, &header)) {
    r->failed = 1;
    return LARDER_ECORRUPT;
  }
  int w = r->bit_width;
  if (header & 1) {
    uint64_t groups = header >> 1;
    uint64_t bytes = groups * (uint64_t)w;
    size_t avail = (size_t)(r->end - r->p);
    uint64_t count = groups * 8;
    if (bytes > avail) {
      /* A final run cut short: decode the values that are really there. */
      bytes = avail;
      count = w ? (avail * 8) / (uint64_t)w : count;
    }
    r->bp = r->p;
    r->bp_len = (size_t)bytes;
    r->bp_pos = 0;
    r->bp_left = (uint32_t)(count > UINT32_MAX ? UINT32_MAX : count);
    r->p += bytes;
  } else {
    int vb = (w + 7) / 8;
    if (r->end - r->p < vb) {
      r->failed = 1;
      return LARDER_ECORRUPT;
    }
    uint32_t v = 0;
    for (int i = 0; i < vb; i++) v |= (uint32_t)r->p[i] << (8 * i);
    r->p += vb;
    /* A run's value takes whole bytes, so it can exceed the bit width;
     * levels rely on the width bounding their values. */
    if (w < 32 && (v >> w) != 0) {
      r->failed = 1;
      r->over_width = 1;
      r->bad_value = v;
      return LARDER_ECORRUPT;
    }
    r->rle_value = v;
    r->rle_left = header >> 1;
  }
  return 1;
}

bool pq_rle_starts_with_run(const uint8_t *p, size_t len, int bit_width, int64_t n,
                            uint32_t value) {
  const uint8_t *end = p + len;
  uint32_t header;
  if (bit_width < 0 || bit_width > 32 || read_uvarint32(&p, end, &header) || (header & 1))
    return false;
  int vb = (bit_width + 7) / 8;
  if (end - p < vb) return false;
  uint32_t v = 0;
  for (int i = 0; i < vb; i++) v |= (uint32_t)p[i] << (8 * i);
  return v == value && (int64_t)(header >> 1) >= n && (bit_width == 32 || (v >> bit_width) == 0);
}

int64_t pq_rle_get32(pq_rle_t *r, uint32_t *out, int64_t n) {
  int64_t done = 0;
  while (done < n) {
    if (r->rle_left) {
      int64_t m = n - done < r->rle_left ? n - done : r->rle_left;
      uint32_t v = r->rle_value;
      for (int64_t i = 0; i < m; i++) out[done + i] = v;
      done += m;
      r->rle_left -= (uint32_t)m;
    } else if (r->bp_left) {
      int64_t m = n - done < r->bp_left ? n - done : r->bp_left;
      pq_unpack32(r->bp, r->bp_len, r->bit_width, r->bp_pos, out + done, (size_t)m);
      done += m;
      r->bp_pos += (uint32_t)m;
      r->bp_left -= (uint32_t)m;
    } else {
      int rc = rle_next_run(r);
      if (rc < 0) return rc;
      if (rc == 0) break;
    }
  }
  return done;
}

int64_t pq_rle_get16(pq_rle_t *r, uint16_t *out, int64_t n) {
  int64_t done = 0;
  if (r->bit_width > 16) return LARDER_ECORRUPT;
  while (done < n) {
    if (r->rle_left) {
      int64_t m = n - done < r->rle_left ? n - done : r->rle_left;
      uint16_t v = (uint16_t)r->rle_value;
      for (int64_t i = 0; i < m; i++) out[done + i] = v;
      done += m;
      r->rle_left -= (uint32_t)m;
    } else if (r->bp_left) {
      int64_t m = n - done < r->bp_left ? n - done : r->bp_left;
      unpack16(r->bp, r->bp_len, r->bit_width, r->bp_pos, out + done, (size_t)m);
      done += m;
      r->bp_pos += (uint32_t)m;
      r->bp_left -= (uint32_t)m;
    } else if (r->p + 2 <= r->end && r->p[0] < 0x80 && !(r->p[0] & 1) && r->bit_width <= 8) {
      /* Short RLE runs of narrow levels dominate list columns: parse their
       * one-byte header and one-byte value here instead of in
       * rle_next_run. */
      uint32_t v = r->bit_width ? r->p[1] : 0;
      if (v >> r->bit_width) {
        r->failed = 1;
        r->over_width = 1;
        r->bad_value = v;
        return LARDER_ECORRUPT;
      }
      r->rle_left = r->p[0] >> 1;
      r->rle_value = v;
      r->p += r->bit_width ? 2 : 1;
    } else {
      int rc = rle_next_run(r);
      if (rc < 0) return rc;
      if (rc == 0) break;
    }
  }
  return done;
}

/* ------------------------------------------------------------------------ */
/* DELTA_BINARY_PACKED                                                       */

static int read_uvarint64(const uint8_t **pp, const uint8_t *end, uint64_t *out) {
  const uint8_t *p = *pp;
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (p >= end) return -1;
    uint8_t b = *p++;
    if (shift == 63 && (b & 0x7e)) return -1;
    v |= (uint64_t)(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      *pp = p;
      return 0;
    }
  }
  return -1;
}

static uint64_t unzigzag(uint64_t v) { return (v >> 1) ^ (0 - (v & 1)); }

int pq_delta_init(pq_delta_t *d, const uint8_t *p, size_t len, int width_bits, char *why,
                  size_t why_len) {
  d->p = p;
  d->end = p + len;
  d->width_bits = width_bits;
  d->produced = 0;
  d->in_block = 0;
  d->buf_pos = d->buf_len = 0;
  d->mini_index = 0;
  uint64_t first;
  if (read_uvarint64(&d->p, d->end, &d->block_size) ||
      read_uvarint64(&d->p, d->end, &d->mini_count) || read_uvarint64(&d->p, d->end, &d->total) ||
      read_uvarint64(&d->p, d->end, &first)) {
    snprintf(why, why_len, "DELTA_BINARY_PACKED: truncated header");
    return LARDER_ECORRUPT;
  }
  if (d->block_size == 0 || d->block_size % 128 != 0 || d->mini_count == 0 ||
      d->block_size % d->mini_count != 0 || (d->block_size / d->mini_count) % 32 != 0 ||
      d->block_size / d->mini_count > PQ_DELTA_MAX_MINI || d->mini_count > 4096) {
    snprintf(why, why_len,
             "DELTA_BINARY_PACKED: bad block layout (%llu values in %llu "
             "miniblocks)",
             (unsigned long long)d->block_size, (unsigned long long)d->mini_count);
    return LARDER_ECORRUPT;
  }
  d->mini_size = d->block_size / d->mini_count;
  d->last = unzigzag(first);
  return 0;
}

/* Loads the next miniblock's deltas into buf.  Returns 0 or -1. */
static int delta_load_mini(pq_delta_t *d) {
  if (!d->in_block || d->mini_index == d->mini_count) {
    uint64_t md;
    if (read_uvarint64(&d->p, d->end, &md)) return -1;
    d->min_delta = unzigzag(md);
    if ((uint64_t)(d->end - d->p) < d->mini_count) return -1;
    d->widths = d->p;
    d->p += d->mini_count;
    d->mini_index = 0;
    d->in_block = 1;
  }
  /* Widths up to 64 bits are accepted for INT32 too: some writers (DuckDB)
   * compute deltas in 64 bits, and the values wrap modulo 2^32 anyway. */
  int w = d->widths[d->mini_index++];
  if (w > 64) return -1;
  uint64_t left = d->total - d->produced; /* deltas still to hand out */
  uint64_t count = left < d->mini_size ? left : d->mini_size;
  uint64_t full = d->mini_size * (uint64_t)w / 8;
  uint64_t need = (count * (uint64_t)w + 7) / 8;
  size_t avail = (size_t)(d->end - d->p);
  if (need > avail) return -1;
  pq_unpack64(d->p, avail < full ? avail : (size_t)full, w, 0, d->buf, (size_t)count);
  /* The last miniblock is normally padded to full size; accept writers
   * that stop at the last value. */
  d->p += full <= avail ? full : avail;
  d->buf_pos = 0;
  d->buf_len = count;
  return 0;
}

#define DEFINE_DELTA_GET(NAME, OUT_T, MASK)                                       \
  int64_t NAME(pq_delta_t *d, OUT_T *out, int64_t n) {                            \
    int64_t done = 0;                                                             \
    if (n > 0 && d->produced == 0 && d->total > 0) {                              \
      out[done++] = (OUT_T)(d->last & (MASK));                                    \
      d->produced = 1;                                                            \
    }                                                                             \
    while (done < n && d->produced < d->total) {                                  \
      if (d->buf_pos == d->buf_len && delta_load_mini(d)) return LARDER_ECORRUPT; \
      uint64_t m = d->buf_len - d->buf_pos;                                       \
      if ((uint64_t)(n - done) < m) m = (uint64_t)(n - done);                     \
      uint64_t last = d->last, md = d->min_delta;                                 \
      const uint64_t *b = d->buf + d->buf_pos;                                    \
      for (uint64_t i = 0; i < m; i++) {                                          \
        last += md + b[i];                                                        \
        out[done + (int64_t)i] = (OUT_T)(last & (MASK));                          \
      }                                                                           \
      d->last = last;                                                             \
      d->buf_pos += m;                                                            \
      d->produced += m;                                                           \
      done += (int64_t)m;                                                         \
    }                                                                             \
    return done;                                                                  \
  }

DEFINE_DELTA_GET(pq_delta_get32, int32_t, 0xffffffffull)
DEFINE_DELTA_GET(pq_delta_get64, int64_t, ~0ull)

const uint8_t *pq_delta_end(pq_delta_t *d) {
  if (d->produced < d->total) return NULL;
  return d->p;
}
