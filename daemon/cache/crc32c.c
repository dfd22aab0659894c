/*
 * crc32c.c: CRC32C (Castagnoli), the checksum of every cached value (see
 * crc32c.h).
 *
 * Two implementations: slicing-by-8 tables in software, and the SSE4.2
 * instruction on three interleaved streams, chosen once at run time.  The
 * tables are built on first use (pthread_once), so every function may be
 * called from any thread.
 */
#include "cache/crc32c.h"

#include <pthread.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <nmmintrin.h>
#define CRC32C_HAVE_X86 1
#else
#define CRC32C_HAVE_X86 0
#endif

/* Test hooks, defined here and declared by tests/test-store.c only. */
uint32_t store_test_crc32c_sw(uint32_t crc, const void *data, size_t len);
uint32_t store_test_crc32c_hw(uint32_t crc, const void *data, size_t len);
int store_test_crc32c_hw_available(void);

#define CRC32C_POLY 0x82f63b78u /* reflected Castagnoli polynomial */
#define CRC_LONG 8192
#define CRC_SHORT 256

static uint32_t crc_table[8][256];      /* slicing-by-8 */
static uint32_t crc_long_shift[4][256]; /* advance over CRC_LONG zero bytes */
static uint32_t crc_short_shift[4][256];
static int crc_have_hw;
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static uint32_t gf2_times(const uint32_t *mat, uint32_t vec) {
  uint32_t sum = 0;
  while (vec) {
    if (vec & 1) sum ^= *mat;
    vec >>= 1;
    mat++;
  }
  return sum;
}

static void gf2_square(uint32_t *square, const uint32_t *mat) {
  for (int n = 0; n < 32; n++) square[n] = gf2_times(mat, mat[n]);
}

/* The operator that advances a raw CRC register over len zero bytes (len a
 * power of two), as a 32x32 GF(2) matrix. */
static void crc_zeros_op(uint32_t *even, size_t len) {
  uint32_t odd[32];
  uint32_t row = 1;
  odd[0] = CRC32C_POLY; /* one zero bit */
  for (int n = 1; n < 32; n++) {
    odd[n] = row;
    row <<= 1;
  }
  gf2_square(even, odd); /* two zero bits */
  gf2_square(odd, even); /* four zero bits */
  /* Each square doubles the length: the first gives one byte. */
  for (;;) {
    gf2_square(even, odd);
    len >>= 1;
    if (len == 0) return;
    gf2_square(odd, even);
    len >>= 1;
    if (len == 0) break;
  }
  memcpy(even, odd, sizeof(odd));
}

static void crc_zeros_table(uint32_t zeros[4][256], size_t len) {
  uint32_t op[32];
  crc_zeros_op(op, len);
  for (uint32_t n = 0; n < 256; n++) {
    zeros[0][n] = gf2_times(op, n);
    zeros[1][n] = gf2_times(op, n << 8);
    zeros[2][n] = gf2_times(op, n << 16);
    zeros[3][n] = gf2_times(op, n << 24);
  }
}

static uint32_t crc_shift(uint32_t zeros[4][256], uint32_t crc) {
  return zeros[0][crc & 0xff] ^ zeros[1][(crc >> 8) & 0xff] ^ zeros[2][(crc >> 16) & 0xff] ^
         zeros[3][crc >> 24];
}

static void crc_init(void) {
  for (uint32_t n = 0; n < 256; n++) {
    uint32_t c = n;
    for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
    crc_table[0][n] = c;
  }
  for (uint32_t n = 0; n < 256; n++)
    for (int k = 1; k < 8; k++)
      crc_table[k][n] = (crc_table[k - 1][n] >> 8) ^ crc_table[0][crc_table[k - 1][n] & 0xff];
  crc_zeros_table(crc_long_shift, CRC_LONG);
  crc_zeros_table(crc_short_shift, CRC_SHORT);
#if CRC32C_HAVE_X86
  __builtin_cpu_init();
  crc_have_hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
#endif
}

static uint32_t crc32c_sw(uint32_t crc, const void *data, size_t len) {
  const uint8_t *p = data;
  uint32_t c = ~crc;
  while (len && ((uintptr_t)p & 7)) {
    c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    len--;
  }
  while (len >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    w = __builtin_bswap64(w);
#endif
    w ^= c;
    c = crc_table[7][w & 0xff] ^ crc_table[6][(w >> 8) & 0xff] ^ crc_table[5][(w >> 16) & 0xff] ^
        crc_table[4][(w >> 24) & 0xff] ^ crc_table[3][(w >> 32) & 0xff] ^
        crc_table[2][(w >> 40) & 0xff] ^ crc_table[1][(w >> 48) & 0xff] ^ crc_table[0][w >> 56];
    p += 8;
    len -= 8;
  }
  while (len--) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
  return ~c;
}

#if CRC32C_HAVE_X86
static inline uint64_t load64(const uint8_t *p) {
  uint64_t w;
  memcpy(&w, p, 8);
  return w;
}

/* Three independent streams hide the instruction's 3-cycle latency; their
 * registers are joined by advancing the earlier ones over the later blocks'
 * length with the zeros tables (CRC is linear over GF(2)). */
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(uint32_t crc, const void *data,
                                                            size_t len) {
  const uint8_t *p = data;
  uint64_t c0 = (uint32_t)~crc;
  while (len && ((uintptr_t)p & 7)) {
    c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    len--;
  }
  while (len >= 3 * CRC_LONG) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t *end = p + CRC_LONG;
    do {
      c0 = _mm_crc32_u64(c0, load64(p));
      c1 = _mm_crc32_u64(c1, load64(p + CRC_LONG));
      c2 = _mm_crc32_u64(c2, load64(p + 2 * CRC_LONG));
      p += 8;
    } while (p < end);
    c0 = crc_shift(crc_long_shift, (uint32_t)c0) ^ (uint32_t)c1;
    c0 = crc_shift(crc_long_shift, (uint32_t)c0) ^ (uint32_t)c2;
    p += 2 * CRC_LONG;
    len -= 3 * CRC_LONG;
  }
  while (len >= 3 * CRC_SHORT) {
    uint64_t c1 = 0, c2 = 0;
    const uint8_t *end = p + CRC_SHORT;
    do {
      c0 = _mm_crc32_u64(c0, load64(p));
      c1 = _mm_crc32_u64(c1, load64(p + CRC_SHORT));
      c2 = _mm_crc32_u64(c2, load64(p + 2 * CRC_SHORT));
      p += 8;
    } while (p < end);
    c0 = crc_shift(crc_short_shift, (uint32_t)c0) ^ (uint32_t)c1;
    c0 = crc_shift(crc_short_shift, (uint32_t)c0) ^ (uint32_t)c2;
    p += 2 * CRC_SHORT;
    len -= 3 * CRC_SHORT;
  }
  while (len >= 8) {
    c0 = _mm_crc32_u64(c0, load64(p));
    p += 8;
    len -= 8;
  }
  while (len) {
    c0 = _mm_crc32_u8((uint32_t)c0, *p++);
    len--;
  }
  return ~(uint32_t)c0;
}
#endif

uint32_t cache_crc32c(uint32_t crc, const void *data, size_t len) {
  pthread_once(&crc_once, crc_init);
#if CRC32C_HAVE_X86
  if (crc_have_hw) return crc32c_hw(crc, data, len);
#endif
  return crc32c_sw(crc, data, len);
}

uint32_t store_test_crc32c_sw(uint32_t crc, const void *data, size_t len) {
  pthread_once(&crc_once, crc_init);
  return crc32c_sw(crc, data, len);
}

uint32_t store_test_crc32c_hw(uint32_t crc, const void *data, size_t len) {
  pthread_once(&crc_once, crc_init);
#if CRC32C_HAVE_X86
  if (crc_have_hw) return crc32c_hw(crc, data, len);
#endif
  return crc32c_sw(crc, data, len);
}

int store_test_crc32c_hw_available(void) {
  pthread_once(&crc_once, crc_init);
  return crc_have_hw;
}
