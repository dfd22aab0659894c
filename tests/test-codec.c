/*
 * test-codec.c: unit tests for pq_decompress (daemon/parquet/pq_codec.c).
 *
 * Conventions
 * -----------
 * - Every compressed input is made in the test by the codec's own library,
 *   except the Hadoop LZ4 framing, which is built by hand around real LZ4
 *   blocks as parquet-mr writes it.
 * - Every decode goes through decode_guarded, which places the input and the
 *   output each flush against an inaccessible page, so a read past the input
 *   or a write past the output kills the test even inside the (uninstrumented)
 *   compression libraries, where AddressSanitizer cannot see.
 * - Failures must be LARDER_ECORRUPT with a reason that starts with the
 *   codec's name; nothing may crash.
 */
#include <limits.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <unistd.h>

#include <brotli/encode.h>
#include <lz4.h>
#include <lz4frame.h>
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>

#include "parquet/pq_internal.h"
#include "task.h"

typedef struct blob {
  uint8_t *data;
  size_t len;
} blob;

/* The codecs that really compress, with the name their reasons start with. */
static const struct {
  int codec;
  const char *name;
} kCodecs[] = {
    {PQ_SNAPPY, "snappy"}, {PQ_GZIP, "gzip"},       {PQ_BROTLI, "brotli"},
    {PQ_ZSTD, "zstd"},     {PQ_LZ4_RAW, "lz4_raw"}, {PQ_LZ4, "lz4"},
};
#define NUM_CODECS (sizeof(kCodecs) / sizeof(kCodecs[0]))

/* ------------------------------------------------------------------------ */
/* Data and compressors                                                      */

static uint32_t lcg(uint32_t *state) {
  *state = *state * 1664525u + 1013904223u;
  return *state >> 8;
}

/* Text-like bytes that compress about as well as a column of strings. */
static uint8_t *make_text(size_t n, uint32_t seed) {
  static const char *const words[] = {"larder",    "parquet", "column", "page", "dictionary", "0",
                                      "17",        "gpu",     "batch",  "null", "true",       "42",
                                      "row group", ",",       "\n",     "x"};
  uint8_t *p = malloc(n > 0 ? n : 1);
  ASSERT_NOT_NULL(p);
  size_t i = 0;
  while (i < n) {
    const char *w = words[lcg(&seed) % 16];
    for (size_t k = 0; w[k] != '\0' && i < n; k++) p[i++] = (uint8_t)w[k];
    if (i < n) p[i++] = ' ';
  }
  return p;
}

static uint8_t *make_random(size_t n, uint32_t seed) {
  uint8_t *p = malloc(n > 0 ? n : 1);
  ASSERT_NOT_NULL(p);
  for (size_t i = 0; i < n; i++) p[i] = (uint8_t)lcg(&seed);
  return p;
}

static blob comp_snappy(const uint8_t *in, size_t n) {
  blob b;
  size_t cap = snappy_max_compressed_length(n);
  b.data = malloc(cap);
  ASSERT_NOT_NULL(b.data);
  b.len = cap;
  ASSERT_EQ(snappy_compress((const char *)in, n, (char *)b.data, &b.len), SNAPPY_OK);
  return b;
}

/* A gzip member (window bits 31) at the given level. */
static blob comp_gzip(const uint8_t *in, size_t n, int level) {
  z_stream zs;
  memset(&zs, 0, sizeof(zs));
  ASSERT_EQ(deflateInit2(&zs, level, Z_DEFLATED, 31, 8, Z_DEFAULT_STRATEGY), Z_OK);
  blob b;
  size_t cap = deflateBound(&zs, (uLong)n) + 32;
  b.data = malloc(cap);
  ASSERT_NOT_NULL(b.data);
  zs.next_in = (Bytef *)(uintptr_t)in;
  zs.avail_in = (uInt)n;
  zs.next_out = b.data;
  zs.avail_out = (uInt)cap;
  ASSERT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  b.len = cap - zs.avail_out;
  deflateEnd(&zs);
  return b;
}

/* A zlib stream, as some writers produced under the GZIP codec. */
static blob comp_zlib(const uint8_t *in, size_t n) {
  blob b;
  uLongf cap = compressBound((uLong)n);
  b.data = malloc(cap);
  ASSERT_NOT_NULL(b.data);
  ASSERT_EQ(compress2(b.data, &cap, in, (uLong)n, 6), Z_OK);
  b.len = cap;
  return b;
}

static blob comp_brotli(const uint8_t *in, size_t n, int quality) {
  blob b;
  size_t cap = BrotliEncoderMaxCompressedSize(n);
  if (cap == 0) cap = n + 1024;
  b.data = malloc(cap);
  ASSERT_NOT_NULL(b.data);
  b.len = cap;
  ASSERT(BrotliEncoderCompress(quality, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_GENERIC, n, in, &b.len,
                               b.data));
  return b;
}

static blob comp_zstd(const uint8_t *in, size_t n) {
  blob b;
  size_t cap = ZSTD_compressBound(n);
  b.data = malloc(cap);
  ASSERT_NOT_NULL(b.data);
  b.len = ZSTD_compress(b.data, cap, in, n, 3);
  ASSERT(!ZSTD_isError(b.len));
  return b;
}

static blob comp_lz4_block(const uint8_t *in, size_t n) {
  blob b;
  int cap = LZ4_compressBound((int)n);
  b.data = malloc((size_t)cap);
  ASSERT_NOT_NULL(b.data);
  int len = LZ4_compress_default((const char *)in, (char *)b.data, (int)n, cap);
  ASSERT_GT(len, 0);
  b.len = (size_t)len;
  return b;
}

static blob comp_lz4_frame(const uint8_t *in, size_t n) {
  LZ4F_preferences_t prefs;
  memset(&prefs, 0, sizeof(prefs));
  prefs.frameInfo.contentChecksumFlag = LZ4F_contentChecksumEnabled;
  prefs.frameInfo.blockSizeID = LZ4F_max64KB;
  blob b;
  size_t cap = LZ4F_compressFrameBound(n, &prefs);
  b.data = malloc(cap);
  ASSERT_NOT_NULL(b.data);
  b.len = LZ4F_compressFrame(b.data, cap, in, n, &prefs);
  ASSERT(!LZ4F_isError(b.len));
  return b;
}

static void put_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

/* Hadoop's LZ4 framing: each block_size slice of the input becomes
 * [decompressed length][compressed length][LZ4 block], lengths big-endian. */
static blob comp_lz4_hadoop(const uint8_t *in, size_t n, size_t block_size) {
  size_t blocks = n == 0 ? 1 : (n + block_size - 1) / block_size;
  size_t cap = blocks * 8 + (size_t)LZ4_compressBound((int)n) + blocks * 16;
  blob b;
  b.data = malloc(cap);
  ASSERT_NOT_NULL(b.data);
  b.len = 0;
  size_t pos = 0;
  do {
    size_t take = n - pos < block_size ? n - pos : block_size;
    blob blk = comp_lz4_block(in + pos, take);
    ASSERT_LE(b.len + 8 + blk.len, cap);
    put_be32(b.data + b.len, (uint32_t)take);
    put_be32(b.data + b.len + 4, (uint32_t)blk.len);
    memcpy(b.data + b.len + 8, blk.data, blk.len);
    b.len += 8 + blk.len;
    free(blk.data);
    pos += take;
  } while (pos < n);
  return b;
}

/* Compresses with codec as a typical writer would (LZ4 with Hadoop framing
 * in 64 KiB blocks). */
static blob compress_with(int codec, const uint8_t *in, size_t n) {
  switch (codec) {
    case PQ_SNAPPY: return comp_snappy(in, n);
    case PQ_GZIP: return comp_gzip(in, n, 6);
    case PQ_BROTLI: return comp_brotli(in, n, 5);
    case PQ_ZSTD: return comp_zstd(in, n);
    case PQ_LZ4_RAW: return comp_lz4_block(in, n);
    case PQ_LZ4: return comp_lz4_hadoop(in, n, 65536);
    default: {
      blob b;
      b.data = malloc(n > 0 ? n : 1);
      ASSERT_NOT_NULL(b.data);
      if (n > 0) memcpy(b.data, in, n);
      b.len = n;
      return b;
    }
  }
}

static blob concat(blob a, blob b) {
  blob c;
  c.len = a.len + b.len;
  c.data = malloc(c.len > 0 ? c.len : 1);
  ASSERT_NOT_NULL(c.data);
  memcpy(c.data, a.data, a.len);
  memcpy(c.data + a.len, b.data, b.len);
  return c;
}

/* ------------------------------------------------------------------------ */
/* Guarded decoding                                                          */

typedef struct guarded {
  uint8_t *base; /* the mapping */
  size_t map_len;
  uint8_t *p; /* len usable bytes that end where the guard page begins */
} guarded;

static guarded guarded_alloc(size_t len) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t body = (len + page - 1) / page * page;
  guarded g;
  g.map_len = body + page;
  g.base = mmap(NULL, g.map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT(g.base != MAP_FAILED);
  ASSERT_OK(mprotect(g.base + body, page, PROT_NONE));
  g.p = g.base + body - len;
  return g;
}

static void guarded_free(guarded g) { munmap(g.base, g.map_len); }

/*
 * Decodes src into a fresh dst_len-byte buffer.  Both buffers end at a
 * guard page, and the bytes of dst's page before dst hold a canary.  When
 * out is not NULL it receives a malloc'd copy of dst on success.
 */
static int decode_guarded(pq_codec_ctx *ctx, int codec, const uint8_t *src, size_t src_len,
                          size_t dst_len, uint8_t **out, char *why, size_t why_len) {
  guarded in = guarded_alloc(src_len);
  guarded dst = guarded_alloc(dst_len);
  if (src_len > 0) memcpy(in.p, src, src_len);
  memset(dst.base, 0xA5, (size_t)(dst.p - dst.base));
  if (why != NULL && why_len > 0) why[0] = '\0';
  int rc = pq_decompress(ctx, codec, src_len > 0 ? in.p : NULL, src_len, dst_len > 0 ? dst.p : NULL,
                         dst_len, why, why_len);
  for (uint8_t *c = dst.base; c < dst.p; c++) ASSERT_EQ(*c, 0xA5);
  if (rc == 0 && out != NULL) {
    *out = malloc(dst_len > 0 ? dst_len : 1);
    ASSERT_NOT_NULL(*out);
    if (dst_len > 0) memcpy(*out, dst.p, dst_len);
  }
  guarded_free(in);
  guarded_free(dst);
  return rc;
}

/* Asserts that src decodes with codec to exactly want. */
static void expect_roundtrip(pq_codec_ctx *ctx, int codec, const uint8_t *src, size_t src_len,
                             const uint8_t *want, size_t want_len) {
  char why[256];
  uint8_t *got = NULL;
  int rc = decode_guarded(ctx, codec, src, src_len, want_len, &got, why, sizeof(why));
  if (rc != 0) ASSERT_FAIL_("codec %d: rc %d (%s)", codec, rc, why);
  if (want_len > 0) ASSERT_MEM_EQ(got, want, want_len);
  free(got);
}

/* Asserts that decoding fails with LARDER_ECORRUPT and a reason that starts
 * with prefix. */
static void expect_corrupt(pq_codec_ctx *ctx, int codec, const uint8_t *src, size_t src_len,
                           size_t dst_len, const char *prefix) {
  char why[256];
  int rc = decode_guarded(ctx, codec, src, src_len, dst_len, NULL, why, sizeof(why));
  if (rc != LARDER_ECORRUPT)
    ASSERT_FAIL_("codec %d, %zu -> %zu bytes: rc %d, want ECORRUPT (%s)", codec, src_len, dst_len,
                 rc, why);
  if (strncmp(why, prefix, strlen(prefix)) != 0 || why[strlen(prefix)] != ':')
    ASSERT_FAIL_("reason \"%s\" does not start with \"%s:\"", why, prefix);
}

static pq_codec_ctx *new_ctx(void) {
  pq_codec_ctx *ctx = pq_codec_ctx_new();
  ASSERT_NOT_NULL(ctx);
  return ctx;
}

/* ------------------------------------------------------------------------ */
/* Round trips                                                               */

TEST_IMPL(codec_uncompressed) {
  pq_codec_ctx *ctx = new_ctx();
  uint8_t *data = make_text(5000, 1);
  expect_roundtrip(ctx, PQ_UNCOMPRESSED, data, 5000, data, 5000);
  expect_corrupt(ctx, PQ_UNCOMPRESSED, data, 5000, 5001, "uncompressed");
  expect_corrupt(ctx, PQ_UNCOMPRESSED, data, 5000, 4999, "uncompressed");
  expect_corrupt(ctx, PQ_UNCOMPRESSED, data, 0, 10, "uncompressed");
  free(data);
  pq_codec_ctx_free(ctx);
  return 0;
}

/* Round-trips several sizes, from one byte to several LZ4 frame blocks, of
 * text and of incompressible bytes. */
static void roundtrip_sizes(int codec) {
  static const size_t sizes[] = {1, 7, 100, 4096, 65536, 65537, 300000};
  pq_codec_ctx *ctx = new_ctx();
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    for (int kind = 0; kind < 2; kind++) {
      size_t n = sizes[i];
      uint8_t *data = kind == 0 ? make_text(n, (uint32_t)i + 1) : make_random(n, (uint32_t)i + 7);
      blob c = compress_with(codec, data, n);
      expect_roundtrip(ctx, codec, c.data, c.len, data, n);
      free(c.data);
      free(data);
    }
  }
  pq_codec_ctx_free(ctx);
}

TEST_IMPL(codec_snappy) {
  roundtrip_sizes(PQ_SNAPPY);
  return 0;
}

TEST_IMPL(codec_gzip) {
  roundtrip_sizes(PQ_GZIP);
  pq_codec_ctx *ctx = new_ctx();
  uint8_t *data = make_text(100000, 3);
  /* Every level, and the zlib header that auto-detection also accepts. */
  for (int level = 0; level <= 9; level += 3) {
    blob c = comp_gzip(data, 100000, level);
    expect_roundtrip(ctx, PQ_GZIP, c.data, c.len, data, 100000);
    free(c.data);
  }
  blob z = comp_zlib(data, 100000);
  expect_roundtrip(ctx, PQ_GZIP, z.data, z.len, data, 100000);
  free(z.data);

  /* A whole stream shorter than the header's size, in the documented words. */
  blob c = comp_gzip(data, 812, 6);
  char why[256];
  ASSERT_EQ(decode_guarded(ctx, PQ_GZIP, c.data, c.len, 1024, NULL, why, sizeof(why)),
            LARDER_ECORRUPT);
  ASSERT_STR_EQ(why, "gzip: stream ends after 812 of 1024 bytes");
  /* A cut stream says so instead. */
  ASSERT_EQ(decode_guarded(ctx, PQ_GZIP, c.data, c.len - 10, 812, NULL, why, sizeof(why)),
            LARDER_ECORRUPT);
  ASSERT_STR_CONTAINS(why, "gzip: input ends inside the stream");
  free(c.data);
  free(data);
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_gzip_concat) {
  pq_codec_ctx *ctx = new_ctx();
  uint8_t *data = make_text(90000, 4);
  blob a = comp_gzip(data, 30000, 6);
  blob b = comp_gzip(data + 30000, 50000, 1);
  blob c = comp_gzip(data + 80000, 10000, 9);
  blob ab = concat(a, b);
  blob abc = concat(ab, c);
  expect_roundtrip(ctx, PQ_GZIP, abc.data, abc.len, data, 90000);

  /* Zero padding after the last member is skipped. */
  blob pad = {calloc(1, 37), 37};
  ASSERT_NOT_NULL(pad.data);
  blob padded = concat(abc, pad);
  expect_roundtrip(ctx, PQ_GZIP, padded.data, padded.len, data, 90000);

  /* Two members that together exceed the declared size, and members whose
   * sum falls short, are both errors. */
  expect_corrupt(ctx, PQ_GZIP, abc.data, abc.len, 89999, "gzip");
  expect_corrupt(ctx, PQ_GZIP, ab.data, ab.len, 90000, "gzip");
  /* A member followed by non-zero bytes that are no member is corrupt. */
  padded.data[abc.len + 5] = 0x42;
  expect_corrupt(ctx, PQ_GZIP, padded.data, padded.len, 90000, "gzip");
  /* A member cut inside the second member. */
  expect_corrupt(ctx, PQ_GZIP, abc.data, a.len + 20, 90000, "gzip");

  free(a.data);
  free(b.data);
  free(c.data);
  free(ab.data);
  free(abc.data);
  free(pad.data);
  free(padded.data);
  free(data);
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_brotli) {
  roundtrip_sizes(PQ_BROTLI);
  pq_codec_ctx *ctx = new_ctx();
  uint8_t *data = make_text(200000, 5);
  for (int q = 0; q <= 11; q += 11) {
    blob c = comp_brotli(data, 200000, q);
    expect_roundtrip(ctx, PQ_BROTLI, c.data, c.len, data, 200000);
    free(c.data);
  }
  free(data);
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_zstd) {
  roundtrip_sizes(PQ_ZSTD);
  /* Two frames back to back decode as one page. */
  pq_codec_ctx *ctx = new_ctx();
  uint8_t *data = make_text(150000, 6);
  blob a = comp_zstd(data, 100000);
  blob b = comp_zstd(data + 100000, 50000);
  blob ab = concat(a, b);
  expect_roundtrip(ctx, PQ_ZSTD, ab.data, ab.len, data, 150000);
  expect_corrupt(ctx, PQ_ZSTD, ab.data, ab.len, 149999, "zstd");
  expect_corrupt(ctx, PQ_ZSTD, ab.data, ab.len, 150001, "zstd");
  /* Garbage where a frame should start. */
  char why[256];
  ASSERT_EQ(decode_guarded(ctx, PQ_ZSTD, (const uint8_t *)"not zstd at all", 15, 100, NULL, why,
                           sizeof(why)),
            LARDER_ECORRUPT);
  ASSERT_STR_EQ(why, "zstd: Unknown frame descriptor");
  free(a.data);
  free(b.data);
  free(ab.data);
  free(data);
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_lz4_raw) {
  roundtrip_sizes(PQ_LZ4_RAW);
  return 0;
}

TEST_IMPL(codec_lz4_hadoop) {
  roundtrip_sizes(PQ_LZ4);
  pq_codec_ctx *ctx = new_ctx();
  uint8_t *data = make_text(100000, 8);

  /* Two blocks built by hand: 60000 bytes, then 40000. */
  blob b1 = comp_lz4_block(data, 60000);
  blob b2 = comp_lz4_block(data + 60000, 40000);
  size_t len = 16 + b1.len + b2.len;
  uint8_t *framed = malloc(len);
  ASSERT_NOT_NULL(framed);
  put_be32(framed, 60000);
  put_be32(framed + 4, (uint32_t)b1.len);
  memcpy(framed + 8, b1.data, b1.len);
  put_be32(framed + 8 + b1.len, 40000);
  put_be32(framed + 12 + b1.len, (uint32_t)b2.len);
  memcpy(framed + 16 + b1.len, b2.data, b2.len);
  expect_roundtrip(ctx, PQ_LZ4, framed, len, data, 100000);

  /* Truncated anywhere, or declared a different total, it fails. */
  expect_corrupt(ctx, PQ_LZ4, framed, len - 1, 100000, "lz4");
  expect_corrupt(ctx, PQ_LZ4, framed, 8 + b1.len + 4, 100000, "lz4");
  expect_corrupt(ctx, PQ_LZ4, framed, len, 100001, "lz4");
  expect_corrupt(ctx, PQ_LZ4, framed, len, 99999, "lz4");

  /* A block header that claims one byte more than its block holds, with a
   * page total to match, parses as framing and then fails in that block. */
  put_be32(framed + 8 + b1.len, 40001);
  char why[256];
  ASSERT_EQ(decode_guarded(ctx, PQ_LZ4, framed, len, 100001, NULL, why, sizeof(why)),
            LARDER_ECORRUPT);
  ASSERT_STR_CONTAINS(why, "lz4: Hadoop block 1");
  /* The same header with the right page total no longer tiles, so every
   * layout is tried and every one fails. */
  expect_corrupt(ctx, PQ_LZ4, framed, len, 100000, "lz4");

  free(b1.data);
  free(b2.data);
  free(framed);
  free(data);
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_lz4_frame) {
  pq_codec_ctx *ctx = new_ctx();
  static const size_t sizes[] = {1, 1000, 65536, 300000};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    uint8_t *data = make_text(sizes[i], (uint32_t)i + 20);
    blob c = comp_lz4_frame(data, sizes[i]);
    expect_roundtrip(ctx, PQ_LZ4, c.data, c.len, data, sizes[i]);
    expect_corrupt(ctx, PQ_LZ4, c.data, c.len, sizes[i] + 1, "lz4");
    expect_corrupt(ctx, PQ_LZ4, c.data, c.len, sizes[i] - 1, "lz4");
    free(c.data);
    free(data);
  }
  /* Two frames back to back. */
  uint8_t *data = make_text(120000, 9);
  blob a = comp_lz4_frame(data, 70000);
  blob b = comp_lz4_frame(data + 70000, 50000);
  blob ab = concat(a, b);
  expect_roundtrip(ctx, PQ_LZ4, ab.data, ab.len, data, 120000);
  expect_corrupt(ctx, PQ_LZ4, ab.data, ab.len - 3, 120000, "lz4");
  free(a.data);
  free(b.data);
  free(ab.data);
  free(data);
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_lz4_bare_block) {
  /* Old parquet-cpp wrote codec LZ4 as a bare block. */
  pq_codec_ctx *ctx = new_ctx();
  static const size_t sizes[] = {1, 20, 5000, 200000};
  for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
    uint8_t *data = make_text(sizes[i], (uint32_t)i + 30);
    blob c = comp_lz4_block(data, sizes[i]);
    expect_roundtrip(ctx, PQ_LZ4, c.data, c.len, data, sizes[i]);
    free(c.data);
    free(data);
  }
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_empty) {
  pq_codec_ctx *ctx = new_ctx();
  /* No input at all is an empty page for every codec... */
  expect_roundtrip(ctx, PQ_UNCOMPRESSED, NULL, 0, NULL, 0);
  for (size_t i = 0; i < NUM_CODECS; i++) expect_roundtrip(ctx, kCodecs[i].codec, NULL, 0, NULL, 0);
  /* ...and so is each library's own encoding of nothing. */
  uint8_t none = 0;
  for (size_t i = 0; i < NUM_CODECS; i++) {
    blob c = compress_with(kCodecs[i].codec, &none, 0);
    expect_roundtrip(ctx, kCodecs[i].codec, c.data, c.len, NULL, 0);
    free(c.data);
  }
  blob z = comp_zlib(&none, 0);
  expect_roundtrip(ctx, PQ_GZIP, z.data, z.len, NULL, 0);
  free(z.data);
  blob f = comp_lz4_frame(&none, 0);
  expect_roundtrip(ctx, PQ_LZ4, f.data, f.len, NULL, 0);
  free(f.data);
  blob bare = comp_lz4_block(&none, 0);
  expect_roundtrip(ctx, PQ_LZ4, bare.data, bare.len, NULL, 0);
  free(bare.data);
  /* But something that decodes to bytes does not fit an empty page. */
  for (size_t i = 0; i < NUM_CODECS; i++) {
    uint8_t *data = make_text(100, 40);
    blob c = compress_with(kCodecs[i].codec, data, 100);
    expect_corrupt(ctx, kCodecs[i].codec, c.data, c.len, 0, kCodecs[i].name);
    free(c.data);
    free(data);
  }
  /* And no input cannot make a non-empty page. */
  for (size_t i = 0; i < NUM_CODECS; i++)
    expect_corrupt(ctx, kCodecs[i].codec, NULL, 0, 10, kCodecs[i].name);
  pq_codec_ctx_free(ctx);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Hostile input                                                             */

TEST_IMPL(codec_truncated) {
  pq_codec_ctx *ctx = new_ctx();
  const size_t n = 150000;
  uint8_t *data = make_text(n, 50);
  for (size_t i = 0; i < NUM_CODECS; i++) {
    blob c = compress_with(kCodecs[i].codec, data, n);
    size_t cuts[] = {1,         2,         4,         7,         8,         9,        12,
                     c.len / 4, c.len / 2, c.len - 9, c.len - 4, c.len - 2, c.len - 1};
    for (size_t k = 0; k < sizeof(cuts) / sizeof(cuts[0]); k++)
      expect_corrupt(ctx, kCodecs[i].codec, c.data, cuts[k], n, kCodecs[i].name);
    free(c.data);
  }
  /* The same through the other LZ4 layouts and the zlib header. */
  blob f = comp_lz4_frame(data, n);
  blob z = comp_zlib(data, n);
  for (size_t cut = 1; cut < f.len; cut += f.len / 13 + 1)
    expect_corrupt(ctx, PQ_LZ4, f.data, cut, n, "lz4");
  for (size_t cut = 1; cut < z.len; cut += z.len / 13 + 1)
    expect_corrupt(ctx, PQ_GZIP, z.data, cut, n, "gzip");
  free(f.data);
  free(z.data);
  free(data);
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_bomb) {
  /* 64 MiB of zeros against a 4 KiB page: every codec must stop at the
   * page's end and report the excess. */
  const size_t big = (size_t)64 << 20;
  uint8_t *zeros = calloc(1, big);
  ASSERT_NOT_NULL(zeros);
  pq_codec_ctx *ctx = new_ctx();
  for (size_t i = 0; i < NUM_CODECS; i++) {
    blob c = kCodecs[i].codec == PQ_BROTLI ? comp_brotli(zeros, big, 1)
             : kCodecs[i].codec == PQ_GZIP ? comp_gzip(zeros, big, 1)
                                           : compress_with(kCodecs[i].codec, zeros, big);
    expect_corrupt(ctx, kCodecs[i].codec, c.data, c.len, 4096, kCodecs[i].name);
    free(c.data);
  }
  blob f = comp_lz4_frame(zeros, big);
  expect_corrupt(ctx, PQ_LZ4, f.data, f.len, 4096, "lz4");
  free(f.data);
  /* A Hadoop block header that lies: it declares 4096 bytes, but its block
   * holds 64 KiB of zeros. */
  blob z64 = comp_lz4_block(zeros, 65536);
  uint8_t *liar = malloc(8 + z64.len);
  ASSERT_NOT_NULL(liar);
  put_be32(liar, 4096);
  put_be32(liar + 4, (uint32_t)z64.len);
  memcpy(liar + 8, z64.data, z64.len);
  expect_corrupt(ctx, PQ_LZ4, liar, 8 + z64.len, 4096, "lz4");
  free(liar);
  free(z64.data);
  /* Gzip members that each fit but together overflow. */
  blob m = comp_gzip(zeros, 3000, 9);
  blob mm = concat(m, m);
  expect_corrupt(ctx, PQ_GZIP, mm.data, mm.len, 4096, "gzip");
  free(m.data);
  free(mm.data);
  free(zeros);
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_size_mismatch) {
  pq_codec_ctx *ctx = new_ctx();
  const size_t n = 70000;
  uint8_t *data = make_text(n, 60);
  for (size_t i = 0; i < NUM_CODECS; i++) {
    blob c = compress_with(kCodecs[i].codec, data, n);
    const size_t declared[] = {n + 1, n + 1000, 2 * n, n - 1, n / 2, 1};
    for (size_t k = 0; k < sizeof(declared) / sizeof(declared[0]); k++)
      expect_corrupt(ctx, kCodecs[i].codec, c.data, c.len, declared[k], kCodecs[i].name);
    /* The right size still works after all those failures. */
    expect_roundtrip(ctx, kCodecs[i].codec, c.data, c.len, data, n);
    free(c.data);
  }
  free(data);
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_garbage) {
  /* Random bytes and bit-flipped streams may decode to something (not every
   * format has a checksum) but must never crash, overrun, or report anything
   * but success or LARDER_ECORRUPT. */
  pq_codec_ctx *ctx = new_ctx();
  const size_t n = 20000;
  uint8_t *data = make_text(n, 70);
  uint32_t seed = 12345;
  for (size_t i = 0; i < NUM_CODECS; i++) {
    int codec = kCodecs[i].codec;
    for (int round = 0; round < 20; round++) {
      size_t len = 1 + lcg(&seed) % 3000;
      uint8_t *junk = make_random(len, lcg(&seed));
      char why[256];
      int rc = decode_guarded(ctx, codec, junk, len, lcg(&seed) % 50000, NULL, why, sizeof(why));
      ASSERT(rc == 0 || rc == LARDER_ECORRUPT);
      free(junk);
    }
    blob c = compress_with(codec, data, n);
    for (int round = 0; round < 200; round++) {
      uint8_t *bent = malloc(c.len);
      ASSERT_NOT_NULL(bent);
      memcpy(bent, c.data, c.len);
      int flips = 1 + (int)(lcg(&seed) % 4);
      for (int k = 0; k < flips; k++) bent[lcg(&seed) % c.len] ^= (uint8_t)(1u << (lcg(&seed) % 8));
      char why[256];
      int rc = decode_guarded(ctx, codec, bent, c.len, n, NULL, why, sizeof(why));
      ASSERT(rc == 0 || rc == LARDER_ECORRUPT);
      free(bent);
    }
    free(c.data);
  }
  free(data);
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_unsupported) {
  pq_codec_ctx *ctx = new_ctx();
  uint8_t src[16] = {0};
  uint8_t dst[16];
  char why[128];
  ASSERT_EQ(pq_decompress(ctx, PQ_LZO, src, sizeof(src), dst, sizeof(dst), why, sizeof(why)),
            LARDER_EUNSUPPORTED);
  ASSERT_STR_CONTAINS(why, "LZO");
  /* Even an empty LZO page names the codec rather than passing. */
  ASSERT_EQ(pq_decompress(ctx, PQ_LZO, NULL, 0, NULL, 0, why, sizeof(why)), LARDER_EUNSUPPORTED);
  const int unknown[] = {8, 99, -1, INT_MAX, INT_MIN};
  for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
    char num[32];
    snprintf(num, sizeof(num), "codec %d", unknown[i]);
    ASSERT_EQ(pq_decompress(ctx, unknown[i], src, sizeof(src), dst, sizeof(dst), why, sizeof(why)),
              LARDER_EUNSUPPORTED);
    ASSERT_STR_CONTAINS(why, num);
  }
  pq_codec_ctx_free(ctx);
  return 0;
}

TEST_IMPL(codec_ctx_reuse) {
  /* One context serves every codec in turn, and an error (including one
   * that leaves zlib or LZ4F mid-stream) does not poison the next page. */
  pq_codec_ctx *ctx = new_ctx();
  const size_t n = 50000;
  uint8_t *data = make_text(n, 80);
  blob c[NUM_CODECS];
  for (size_t i = 0; i < NUM_CODECS; i++) c[i] = compress_with(kCodecs[i].codec, data, n);
  blob f = comp_lz4_frame(data, n);
  for (int round = 0; round < 5; round++) {
    for (size_t i = 0; i < NUM_CODECS; i++) {
      expect_corrupt(ctx, kCodecs[i].codec, c[i].data, c[i].len / 2, n, kCodecs[i].name);
      expect_roundtrip(ctx, kCodecs[i].codec, c[i].data, c[i].len, data, n);
    }
    expect_corrupt(ctx, PQ_LZ4, f.data, f.len / 2, n, "lz4");
    expect_roundtrip(ctx, PQ_LZ4, f.data, f.len, data, n);
  }
  for (size_t i = 0; i < NUM_CODECS; i++) free(c[i].data);
  free(f.data);
  free(data);
  pq_codec_ctx_free(ctx);
  pq_codec_ctx_free(NULL);
  return 0;
}

TEST_IMPL(codec_why_buffer) {
  /* The reason is cut to why_len, and no buffer at all is fine. */
  pq_codec_ctx *ctx = new_ctx();
  uint8_t src[4] = {1, 2, 3, 4};
  uint8_t dst[8];
  char why[8];
  memset(why, 'Z', sizeof(why));
  ASSERT_EQ(pq_decompress(ctx, PQ_ZSTD, src, 4, dst, 8, why, 5), LARDER_ECORRUPT);
  ASSERT_STR_EQ(why, "zstd");
  ASSERT_EQ(why[5], 'Z');
  ASSERT_EQ(pq_decompress(ctx, PQ_ZSTD, src, 4, dst, 8, NULL, 0), LARDER_ECORRUPT);
  ASSERT_EQ(pq_decompress(ctx, PQ_SNAPPY, src, 4, dst, 8, why, 0), LARDER_ECORRUPT);
  ASSERT_EQ(why[5], 'Z');
  /* Missing buffers or context are the caller's mistake. */
  ASSERT_EQ(pq_decompress(NULL, PQ_ZSTD, src, 4, dst, 8, NULL, 0), LARDER_EINVAL);
  ASSERT_EQ(pq_decompress(ctx, PQ_ZSTD, NULL, 4, dst, 8, NULL, 0), LARDER_EINVAL);
  ASSERT_EQ(pq_decompress(ctx, PQ_ZSTD, src, 4, NULL, 8, NULL, 0), LARDER_EINVAL);
  pq_codec_ctx_free(ctx);
  return 0;
}
