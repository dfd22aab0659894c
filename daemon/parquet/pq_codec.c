/*
 * pq_codec.c: page decompression for every Parquet codec but LZO.
 *
 * Conventions
 * -----------
 * - One entry point, pq_decompress, dispatches on the codec number to a
 *   static decoder per codec.  Each decoder writes into exactly the dst_len
 *   bytes it is given and fails with LARDER_ECORRUPT unless the input
 *   decodes to exactly that many bytes.
 * - Hostile input is the normal case: no decoder reads outside
 *   [src, src + src_len), writes outside [dst, dst + dst_len), or allocates
 *   in proportion to a size the input claims.  Streaming decoders are given
 *   a one-byte spill buffer once dst is full, so a stream that wants to say
 *   more than the page header declared (a decompression bomb) is caught the
 *   moment it produces one byte too many.
 * - Library state that is costly to build (the zstd context, the zlib stream
 *   and its window, the LZ4 frame context) lives in pq_codec_ctx, is made on
 *   first use, and is reset rather than rebuilt on later calls, so the hot
 *   codecs (snappy, zstd, LZ4) never allocate per page.  Brotli has no reset
 *   in the library versions we target, so it builds its state per call.
 * - Failures carry a short reason in `why` that starts with the codec's
 *   name, such as "gzip: stream ends after 812 of 1024 bytes".
 */
#define ZLIB_CONST

#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <brotli/decode.h>
#include <lz4.h>
#include <lz4frame.h>
#include <snappy-c.h>
#include <zlib.h>
#include <zstd.h>
#include <zstd_errors.h>

#include "parquet/pq_internal.h"

struct pq_codec_ctx {
  ZSTD_DCtx *zstd; /* NULL until the first zstd page */
  LZ4F_dctx *lz4f; /* NULL until the first LZ4 frame */
  z_stream zlib;   /* valid when zlib_ready */
  bool zlib_ready;
};

/* The LZ4 frame format's magic numbers, little-endian at the start of a
 * frame; skippable frames use any of sixteen consecutive values. */
#define LZ4_FRAME_MAGIC 0x184D2204u
#define LZ4_SKIPPABLE_MAGIC 0x184D2A50u
#define LZ4_SKIPPABLE_MASK 0xFFFFFFF0u

/* Each block of the Hadoop LZ4 framing starts with two big-endian 32-bit
 * lengths: decompressed, then compressed. */
#define HADOOP_HEADER_SIZE 8

/* Formats a reason into why (when the caller gave room for one) and returns
 * code, so that every failure is a single return statement. */
__attribute__((format(printf, 4, 5))) static int fail(char *why, size_t why_len, int code,
                                                      const char *fmt, ...) {
  if (why != NULL && why_len > 0) {
    va_list ap;
    va_start(ap, fmt);
    /* The C11 Annex K functions this check prefers do not exist in glibc;
     * vsnprintf is bounded by why_len. */
    /* NOLINTNEXTLINE(clang-analyzer-security.insecureAPI.DeprecatedOrUnsafeBufferHandling) */
    (void)vsnprintf(why, why_len, fmt, ap);
    va_end(ap);
  }
  return code;
}

static uint32_t load_be32(const uint8_t *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

static uint32_t load_le32(const uint8_t *p) {
  return (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | (uint32_t)p[0];
}

static bool all_zero(const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != 0) return false;
  return true;
}

/* ------------------------------------------------------------------------ */
/* Contexts                                                                  */

pq_codec_ctx *pq_codec_ctx_new(void) {
  /* Every library context starts out NULL and is made on first use, so a
   * reader whose columns use one codec pays for that codec alone. */
  return calloc(1, sizeof(pq_codec_ctx));
}

void pq_codec_ctx_free(pq_codec_ctx *ctx) {
  if (ctx == NULL) return;
  ZSTD_freeDCtx(ctx->zstd);
  if (ctx->lz4f != NULL) (void)LZ4F_freeDecompressionContext(ctx->lz4f);
  if (ctx->zlib_ready) (void)inflateEnd(&ctx->zlib);
  free(ctx);
}

/* ------------------------------------------------------------------------ */
/* UNCOMPRESSED and SNAPPY                                                   */

static int copy_uncompressed(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                             char *why, size_t why_len) {
  if (src_len != dst_len)
    return fail(why, why_len, LARDER_ECORRUPT,
                "uncompressed: page holds %zu bytes, header says %zu", src_len, dst_len);
  /* The lengths were checked equal just above (Annex K's memcpy_s, which
   * clang-tidy asks for, does not exist in glibc). */
  /* NOLINTNEXTLINE(clang-analyzer-security.insecureAPI.DeprecatedOrUnsafeBufferHandling) */
  memcpy(dst, src, dst_len);
  return 0;
}

static int snappy_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                         char *why, size_t why_len) {
  /* The stream opens with its own length; checking it first turns a
   * mismatch into a precise message and spares decoding a doomed page. */
  size_t claimed = 0;
  if (snappy_uncompressed_length((const char *)src, src_len, &claimed) != SNAPPY_OK)
    return fail(why, why_len, LARDER_ECORRUPT, "snappy: malformed length prefix");
  if (claimed != dst_len)
    return fail(why, why_len, LARDER_ECORRUPT, "snappy: stream says %zu bytes, header says %zu",
                claimed, dst_len);
  size_t out_len = dst_len;
  if (snappy_uncompress((const char *)src, src_len, (char *)dst, &out_len) != SNAPPY_OK)
    return fail(why, why_len, LARDER_ECORRUPT, "snappy: malformed or truncated stream");
  /* Snappy fills exactly the length it announced or fails, so this holds
   * already; it is checked because the contract depends on it. */
  if (out_len != dst_len)
    return fail(why, why_len, LARDER_ECORRUPT, "snappy: output is %zu bytes, header says %zu",
                out_len, dst_len);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* GZIP                                                                      */

static int gzip_decode(pq_codec_ctx *ctx, const uint8_t *src, size_t src_len, uint8_t *dst,
                       size_t dst_len, char *why, size_t why_len) {
  z_stream *zs = &ctx->zlib;
  if (!ctx->zlib_ready) {
    *zs = (z_stream){0};
    /* 15 + 32: the largest window, with a gzip or zlib header detected from
     * the first bytes, since writers have used both under this codec. */
    int rc = inflateInit2(zs, 15 + 32);
    if (rc == Z_MEM_ERROR) return fail(why, why_len, LARDER_ENOMEM, "gzip: out of memory");
    if (rc != Z_OK)
      return fail(why, why_len, LARDER_EUNSUPPORTED, "gzip: zlib %s refuses to start (error %d)",
                  zlibVersion(), rc);
    ctx->zlib_ready = true;
  } else if (inflateReset(zs) != Z_OK) {
    return fail(why, why_len, LARDER_ECORRUPT, "gzip: cannot reset zlib");
  }

  size_t in_pos = 0, out_pos = 0;
  uint8_t spill = 0;
  for (;;) {
    /* zlib counts in uInt, so sizes beyond 4 GiB go in slices. */
    size_t in_avail = src_len - in_pos;
    if (in_avail > UINT_MAX) in_avail = UINT_MAX;
    bool spilling = out_pos == dst_len;
    size_t out_avail = spilling ? 1 : dst_len - out_pos;
    if (out_avail > UINT_MAX) out_avail = UINT_MAX;
    zs->next_in = src + in_pos;
    zs->avail_in = (uInt)in_avail;
    zs->next_out = spilling ? &spill : dst + out_pos;
    zs->avail_out = (uInt)out_avail;

    int rc = inflate(zs, Z_NO_FLUSH);
    size_t consumed = in_avail - zs->avail_in;
    size_t produced = out_avail - zs->avail_out;
    in_pos += consumed;
    if (spilling && produced > 0)
      return fail(why, why_len, LARDER_ECORRUPT, "gzip: stream holds more than %zu bytes", dst_len);
    if (!spilling) out_pos += produced;

    if (rc == Z_STREAM_END) {
      /* A member ended.  What follows is either nothing, zero padding that
       * some writers add, or another member: gzip allows concatenation and
       * Hadoop's codec writes it. */
      if (all_zero(src + in_pos, src_len - in_pos)) break;
      if (inflateReset(zs) != Z_OK)
        return fail(why, why_len, LARDER_ECORRUPT, "gzip: cannot reset zlib");
      continue;
    }
    if (rc == Z_OK) continue; /* zlib says Z_OK only after some progress */
    if (rc == Z_BUF_ERROR && in_pos == src_len)
      return fail(why, why_len, LARDER_ECORRUPT,
                  "gzip: input ends inside the stream after %zu of %zu bytes", out_pos, dst_len);
    if (rc == Z_MEM_ERROR) return fail(why, why_len, LARDER_ENOMEM, "gzip: out of memory");
    if (rc == Z_NEED_DICT)
      return fail(why, why_len, LARDER_ECORRUPT, "gzip: stream needs a preset dictionary");
    return fail(why, why_len, LARDER_ECORRUPT, "gzip: %s at input byte %zu",
                zs->msg != NULL ? zs->msg : "malformed stream", in_pos);
  }
  if (out_pos != dst_len)
    return fail(why, why_len, LARDER_ECORRUPT, "gzip: stream ends after %zu of %zu bytes", out_pos,
                dst_len);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* BROTLI                                                                    */

static int brotli_decode(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len,
                         char *why, size_t why_len) {
  BrotliDecoderState *st = BrotliDecoderCreateInstance(NULL, NULL, NULL);
  if (st == NULL) return fail(why, why_len, LARDER_ENOMEM, "brotli: out of memory");
  size_t avail_in = src_len, avail_out = dst_len;
  const uint8_t *next_in = src;
  uint8_t *next_out = dst;
  /* One call with the whole input and the bounded output: the decoder stops
   * either at the end of the stream or when it wants more room than the
   * page header allowed, and the latter is the error. */
  BrotliDecoderResult res =
      BrotliDecoderDecompressStream(st, &avail_in, &next_in, &avail_out, &next_out, NULL);
  BrotliDecoderErrorCode code = BrotliDecoderGetErrorCode(st);
  BrotliDecoderDestroyInstance(st);

  size_t produced = dst_len - avail_out;
  switch (res) {
    case BROTLI_DECODER_RESULT_SUCCESS:
      /* Zero padding after the stream is tolerated, as it is for gzip;
       * anything else there means the page is not what the writer made. */
      if (!all_zero(next_in, avail_in))
        return fail(why, why_len, LARDER_ECORRUPT,
                    "brotli: %zu stray bytes after the end of the stream", avail_in);
      if (produced != dst_len)
        return fail(why, why_len, LARDER_ECORRUPT, "brotli: stream ends after %zu of %zu bytes",
                    produced, dst_len);
      return 0;
    case BROTLI_DECODER_RESULT_NEEDS_MORE_OUTPUT:
      return fail(why, why_len, LARDER_ECORRUPT, "brotli: stream holds more than %zu bytes",
                  dst_len);
    case BROTLI_DECODER_RESULT_NEEDS_MORE_INPUT:
      return fail(why, why_len, LARDER_ECORRUPT,
                  "brotli: input ends inside the stream after %zu of %zu "
                  "bytes",
                  produced, dst_len);
    default: break;
  }
  if (code <= BROTLI_DECODER_ERROR_ALLOC_CONTEXT_MODES &&
      code >= BROTLI_DECODER_ERROR_ALLOC_BLOCK_TYPE_TREES)
    return fail(why, why_len, LARDER_ENOMEM, "brotli: out of memory");
  return fail(why, why_len, LARDER_ECORRUPT, "brotli: malformed stream (%s)",
              BrotliDecoderErrorString(code));
}

/* ------------------------------------------------------------------------ */
/* ZSTD                                                                      */

static int zstd_decode(pq_codec_ctx *ctx, const uint8_t *src, size_t src_len, uint8_t *dst,
                       size_t dst_len, char *why, size_t why_len) {
  if (ctx->zstd == NULL) {
    ctx->zstd = ZSTD_createDCtx();
    if (ctx->zstd == NULL) return fail(why, why_len, LARDER_ENOMEM, "zstd: out of memory");
  }
  /* The one-shot call decodes every frame in src straight into dst, using
   * dst as the window, so nothing is allocated whatever window the frame
   * header asks for, and a frame that declares more content than dst holds
   * is refused before any work. */
  size_t n = ZSTD_decompressDCtx(ctx->zstd, dst, dst_len, src, src_len);
  if (ZSTD_isError(n)) {
    ZSTD_ErrorCode code = ZSTD_getErrorCode(n);
    if (code == ZSTD_error_dstSize_tooSmall)
      return fail(why, why_len, LARDER_ECORRUPT, "zstd: stream holds more than %zu bytes", dst_len);
    if (code == ZSTD_error_memory_allocation)
      return fail(why, why_len, LARDER_ENOMEM, "zstd: out of memory");
    return fail(why, why_len, LARDER_ECORRUPT, "zstd: %s", ZSTD_getErrorName(n));
  }
  if (n != dst_len)
    return fail(why, why_len, LARDER_ECORRUPT, "zstd: stream ends after %zu of %zu bytes", n,
                dst_len);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* LZ4_RAW and LZ4                                                           */

/* Runs LZ4_decompress_safe on one bare block with room for exactly dst_len
 * bytes.  Returns the decoded length, or a negative number when the block is
 * malformed, would overflow dst, or exceeds what the block format (which
 * counts in int) can describe. */
static int lz4_block_run(const uint8_t *src, size_t src_len, uint8_t *dst, size_t dst_len) {
  if (src_len > LZ4_MAX_INPUT_SIZE || dst_len > INT_MAX) return INT_MIN;
  return LZ4_decompress_safe((const char *)src, (char *)dst, (int)src_len, (int)dst_len);
}

/* Decodes one bare block into exactly dst_len bytes; prefix starts the
 * reason.  The library cannot tell a truncated block from one that would
 * overflow dst, so both read as a malformed block. */
static int lz4_block_decode(const char *prefix, const uint8_t *src, size_t src_len, uint8_t *dst,
                            size_t dst_len, char *why, size_t why_len) {
  int n = lz4_block_run(src, src_len, dst, dst_len);
  if (n >= 0 && (size_t)n == dst_len) return 0;
  if (n == INT_MIN)
    return fail(why, why_len, LARDER_ECORRUPT,
                "%s: %zu bytes decoding to %zu exceed the block format's "
                "limits",
                prefix, src_len, dst_len);
  if (n < 0)
    return fail(why, why_len, LARDER_ECORRUPT,
                "%s: malformed block (error at input byte %d of %zu)", prefix, -(n + 1), src_len);
  return fail(why, why_len, LARDER_ECORRUPT, "%s: block ends after %d of %zu bytes", prefix, n,
              dst_len);
}

/*
 * Returns whether src parses as the Hadoop framing: block headers that tile
 * src exactly and whose decompressed lengths add up to dst_len.  Only the
 * headers are read, so a miss costs little before the other layouts are
 * tried.
 */
static bool lz4_hadoop_framed(const uint8_t *src, size_t src_len, size_t dst_len) {
  size_t pos = 0, total = 0;
  if (src_len < HADOOP_HEADER_SIZE) return false;
  while (pos < src_len) {
    if (src_len - pos < HADOOP_HEADER_SIZE) return false;
    uint32_t decoded = load_be32(src + pos);
    uint32_t compressed = load_be32(src + pos + 4);
    pos += HADOOP_HEADER_SIZE;
    if (compressed > src_len - pos || decoded > dst_len - total) return false;
    pos += compressed;
    total += decoded;
  }
  return total == dst_len;
}

/* Decodes a framing that lz4_hadoop_framed accepted, block by block, each
 * into exactly the length its header gives. */
static int lz4_hadoop_decode(const uint8_t *src, size_t src_len, uint8_t *dst, char *why,
                             size_t why_len) {
  size_t pos = 0, out = 0;
  for (size_t block = 0; pos < src_len; block++) {
    uint32_t decoded = load_be32(src + pos);
    uint32_t compressed = load_be32(src + pos + 4);
    pos += HADOOP_HEADER_SIZE;
    /* An empty block is legal framing, but LZ4 itself needs one byte to
     * say "nothing". */
    if (decoded == 0 && compressed == 0) continue;
    int n = lz4_block_run(src + pos, compressed, dst + out, decoded);
    if (n < 0 || (uint32_t)n != decoded)
      return fail(why, why_len, LARDER_ECORRUPT,
                  "lz4: Hadoop block %zu (%" PRIu32 " bytes declaring %" PRIu32
                  ") is malformed or decodes to another length",
                  block, compressed, decoded);
    pos += compressed;
    out += decoded;
  }
  return 0;
}

static int lz4_frame_decode(pq_codec_ctx *ctx, const uint8_t *src, size_t src_len, uint8_t *dst,
                            size_t dst_len, char *why, size_t why_len) {
  if (ctx->lz4f == NULL) {
    if (LZ4F_isError(LZ4F_createDecompressionContext(&ctx->lz4f, LZ4F_VERSION))) {
      ctx->lz4f = NULL;
      return fail(why, why_len, LARDER_ENOMEM, "lz4: out of memory");
    }
  } else {
    /* A previous call may have stopped mid-frame or on an error. */
    LZ4F_resetDecompressionContext(ctx->lz4f);
  }

  size_t in_pos = 0, out_pos = 0, hint = 1;
  uint8_t spill = 0;
  while (in_pos < src_len) {
    bool spilling = out_pos == dst_len;
    size_t out_avail = spilling ? 1 : dst_len - out_pos;
    size_t in_avail = src_len - in_pos;
    hint = LZ4F_decompress(ctx->lz4f, spilling ? &spill : dst + out_pos, &out_avail, src + in_pos,
                           &in_avail, NULL);
    if (LZ4F_isError(hint))
      return fail(why, why_len, LARDER_ECORRUPT, "lz4: frame: %s", LZ4F_getErrorName(hint));
    if (spilling && out_avail > 0)
      return fail(why, why_len, LARDER_ECORRUPT, "lz4: frame holds more than %zu bytes", dst_len);
    if (!spilling) out_pos += out_avail;
    in_pos += in_avail;
    /* LZ4F always consumes or produces something while it has input and
     * room; this guard keeps a library surprise from looping forever. */
    if (in_avail == 0 && out_avail == 0) break;
    /* After a complete frame (hint 0) the context starts over on its own,
     * so further frames in src decode in the same loop. */
  }
  if (hint != 0)
    return fail(why, why_len, LARDER_ECORRUPT,
                "lz4: input ends inside the frame after %zu of %zu bytes", out_pos, dst_len);
  if (out_pos != dst_len)
    return fail(why, why_len, LARDER_ECORRUPT, "lz4: frame ends after %zu of %zu bytes", out_pos,
                dst_len);
  return 0;
}

/*
 * The legacy LZ4 codec was written three ways over the years: with Hadoop's
 * framing (parquet-mr, Arrow since 1.0), as an LZ4 frame, and as a bare
 * block (older parquet-cpp).  They are tried in that order.  A failed try
 * may leave bytes in dst, which is harmless because the next try rewrites
 * all of it or fails too.  When every try fails, the reason reported is the
 * one from the layout the input most resembles.
 */
static int lz4_hadoop_or_frame_decode(pq_codec_ctx *ctx, const uint8_t *src, size_t src_len,
                                      uint8_t *dst, size_t dst_len, char *why, size_t why_len) {
  /* The reason of the most plausible layout; see above. */
  char first_why[192];
  first_why[0] = '\0';
  bool framed = lz4_hadoop_framed(src, src_len, dst_len);
  if (framed) {
    if (lz4_hadoop_decode(src, src_len, dst, first_why, sizeof(first_why)) == 0) return 0;
  }

  bool frame_magic = false;
  if (src_len >= 4) {
    uint32_t magic = load_le32(src);
    frame_magic = magic == LZ4_FRAME_MAGIC || (magic & LZ4_SKIPPABLE_MASK) == LZ4_SKIPPABLE_MAGIC;
  }
  if (frame_magic) {
    /* The frame's reason matters only when the framing did not parse. */
    char frame_why[192];
    char *reason = framed ? frame_why : first_why;
    int rc = lz4_frame_decode(ctx, src, src_len, dst, dst_len, reason, sizeof(frame_why));
    if (rc == 0) return 0;
    if (rc == LARDER_ENOMEM) return fail(why, why_len, rc, "lz4: out of memory");
  }

  if (framed || frame_magic) {
    int n = lz4_block_run(src, src_len, dst, dst_len);
    if (n >= 0 && (size_t)n == dst_len) return 0;
    return fail(why, why_len, LARDER_ECORRUPT, "%s", first_why);
  }
  return lz4_block_decode("lz4: neither Hadoop framing nor an LZ4 frame; as a bare block", src,
                          src_len, dst, dst_len, why, why_len);
}

/* ------------------------------------------------------------------------ */
/* Dispatch                                                                  */

int pq_decompress(pq_codec_ctx *ctx, int codec, const uint8_t *src, size_t src_len, uint8_t *dst,
                  size_t dst_len, char *why, size_t why_len) {
  /* Libraries differ on whether a NULL pointer with a zero length is
   * acceptable, so empty buffers are given a real address. */
  static const uint8_t no_input[1];
  uint8_t no_output[1];
  if (ctx == NULL || (src == NULL && src_len > 0) || (dst == NULL && dst_len > 0))
    return fail(why, why_len, LARDER_EINVAL, "decompress: missing context or buffer");
  if (src_len == 0) src = no_input;
  if (dst_len == 0) dst = no_output;

  if (codec == PQ_LZO)
    return fail(why, why_len, LARDER_EUNSUPPORTED, "lzo: the LZO codec (3) is not supported");
  if (codec < PQ_UNCOMPRESSED || codec > PQ_LZ4_RAW)
    return fail(why, why_len, LARDER_EUNSUPPORTED, "codec %d is unknown and not supported", codec);
  /* Data page v2 may leave the compressed section out entirely when the
   * levels fill the page, so no input means no output for every codec. */
  if (src_len == 0 && dst_len == 0) return 0;

  switch ((pq_codec_t)codec) {
    case PQ_UNCOMPRESSED: return copy_uncompressed(src, src_len, dst, dst_len, why, why_len);
    case PQ_SNAPPY: return snappy_decode(src, src_len, dst, dst_len, why, why_len);
    case PQ_GZIP: return gzip_decode(ctx, src, src_len, dst, dst_len, why, why_len);
    case PQ_BROTLI: return brotli_decode(src, src_len, dst, dst_len, why, why_len);
    case PQ_ZSTD: return zstd_decode(ctx, src, src_len, dst, dst_len, why, why_len);
    case PQ_LZ4_RAW: return lz4_block_decode("lz4_raw", src, src_len, dst, dst_len, why, why_len);
    case PQ_LZ4: return lz4_hadoop_or_frame_decode(ctx, src, src_len, dst, dst_len, why, why_len);
    case PQ_LZO:
    default: break;
  }
  return fail(why, why_len, LARDER_EUNSUPPORTED, "codec %d is unknown and not supported", codec);
}

int pq_decompress_check(int codec, const uint8_t *src, size_t src_len, size_t dst_len, char *why,
                        size_t why_len) {
  uint64_t bound = UINT64_MAX;
  switch (codec) {
    case PQ_UNCOMPRESSED: bound = src_len; break;
    case PQ_SNAPPY: {
      size_t claimed = 0;
      if (snappy_uncompressed_length((const char *)src, src_len, &claimed) != SNAPPY_OK ||
          claimed != dst_len) {
        snprintf(why, why_len, "snappy: stream says %zu bytes, header says %zu", claimed, dst_len);
        return LARDER_ECORRUPT;
      }
      return 0;
    }
    case PQ_GZIP:
      /* Deflate expands by at most 1032:1; a gzip header adds a little. */
      bound = (uint64_t)src_len * 1032 + 4096;
      break;
    case PQ_LZ4:
    case PQ_LZ4_RAW: bound = (uint64_t)src_len * 255 + 4096; break;
    case PQ_ZSTD: {
      unsigned long long n = ZSTD_getFrameContentSize(src, src_len);
      if (n != ZSTD_CONTENTSIZE_UNKNOWN && n != ZSTD_CONTENTSIZE_ERROR && n > dst_len) {
        snprintf(why, why_len, "zstd: frame holds %llu bytes, header says %zu", n, dst_len);
        return LARDER_ECORRUPT;
      }
      /* A first frame that states its size and is much smaller than the page
       * claims can only be followed by more frames in the remaining bytes;
       * each frame expands at most by zstd's block limit. */
      if (n != ZSTD_CONTENTSIZE_UNKNOWN && n != ZSTD_CONTENTSIZE_ERROR && n < dst_len &&
          (uint64_t)src_len * 32768 + n < dst_len) {
        snprintf(why, why_len, "zstd: %zu bytes cannot hold %zu", src_len, dst_len);
        return LARDER_ECORRUPT;
      }
      return 0;
    }
    default: return 0;
  }
  if (dst_len > bound) {
    snprintf(why, why_len, "%s: %zu compressed bytes cannot hold the %zu the header claims",
             pq_codec_name(codec), src_len, dst_len);
    return LARDER_ECORRUPT;
  }
  return 0;
}
