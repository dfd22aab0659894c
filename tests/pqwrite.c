/*
 * pqwrite.c: the tests' Parquet writer (see pqwrite.h).
 *
 * Written for clarity, not speed: bit packing goes bit by bit, and the
 * DELTA_BINARY_PACKED encoder follows the format description literally, so
 * that it can serve as the reference the reader's fast paths are checked
 * against.
 */
#include "pqwrite.h"

#include <lz4.h>
#include <snappy-c.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

static void pqw_die(const char *what) {
  fprintf(stderr, "pqwrite: %s\n", what);
  abort();
}

static void *pqw_xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (p == NULL) pqw_die("out of memory");
  return p;
}

static void *pqw_xcalloc(size_t n, size_t size) {
  void *p = calloc(n ? n : 1, size ? size : 1);
  if (p == NULL) pqw_die("out of memory");
  return p;
}

/* ------------------------------------------------------------------------ */
/* Buffers                                                                   */

void pqw_reserve(pqw_buf *b, size_t extra) {
  if (b->len + extra <= b->cap) return;
  size_t cap = b->cap ? b->cap : 256;
  while (cap < b->len + extra) cap *= 2;
  uint8_t *p = realloc(b->data, cap);
  if (p == NULL) pqw_die("out of memory");
  b->data = p;
  b->cap = cap;
}

void pqw_put(pqw_buf *b, const void *p, size_t n) {
  if (n == 0) return;
  pqw_reserve(b, n);
  memcpy(b->data + b->len, p, n);
  b->len += n;
}

void pqw_u8(pqw_buf *b, uint8_t v) { pqw_put(b, &v, 1); }

void pqw_le16(pqw_buf *b, uint16_t v) {
  uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
  pqw_put(b, x, 2);
}

void pqw_le32(pqw_buf *b, uint32_t v) {
  uint8_t x[4];
  for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
  pqw_put(b, x, 4);
}

void pqw_le64(pqw_buf *b, uint64_t v) {
  uint8_t x[8];
  for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
  pqw_put(b, x, 8);
}

void pqw_uvarint(pqw_buf *b, uint64_t v) {
  while (v >= 0x80) {
    pqw_u8(b, (uint8_t)(v | 0x80));
    v >>= 7;
  }
  pqw_u8(b, (uint8_t)v);
}

void pqw_zigzag(pqw_buf *b, int64_t v) {
  uint64_t u = ((uint64_t)v << 1) ^ (v < 0 ? UINT64_MAX : 0);
  pqw_uvarint(b, u);
}

void pqw_buf_free(pqw_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
}

uint8_t *pqw_buf_take(pqw_buf *b, size_t *len) {
  uint8_t *p = b->data ? b->data : pqw_xmalloc(1);
  *len = b->len;
  b->data = NULL;
  b->len = b->cap = 0;
  return p;
}

/* ------------------------------------------------------------------------ */
/* Thrift compact protocol                                                   */

void pqw_t_init(pqw_thrift *t, pqw_buf *out) {
  memset(t, 0, sizeof(*t));
  t->out = out;
}

void pqw_t_field(pqw_thrift *t, int16_t id, int type) {
  int delta = (int)id - (int)t->last[t->depth];
  if (delta > 0 && delta <= 15) {
    pqw_u8(t->out, (uint8_t)(delta << 4 | type));
  } else {
    pqw_u8(t->out, (uint8_t)type);
    pqw_zigzag(t->out, id);
  }
  t->last[t->depth] = id;
}

void pqw_t_i32(pqw_thrift *t, int16_t id, int32_t v) {
  pqw_t_field(t, id, PQ_TT_I32);
  pqw_zigzag(t->out, v);
}

void pqw_t_i64(pqw_thrift *t, int16_t id, int64_t v) {
  pqw_t_field(t, id, PQ_TT_I64);
  pqw_zigzag(t->out, v);
}

void pqw_t_i16(pqw_thrift *t, int16_t id, int16_t v) {
  pqw_t_field(t, id, PQ_TT_I16);
  pqw_zigzag(t->out, v);
}

void pqw_t_byte(pqw_thrift *t, int16_t id, int8_t v) {
  pqw_t_field(t, id, PQ_TT_BYTE);
  pqw_u8(t->out, (uint8_t)v);
}

void pqw_t_bool(pqw_thrift *t, int16_t id, int v) {
  pqw_t_field(t, id, v ? PQ_TT_TRUE : PQ_TT_FALSE);
}

void pqw_t_double(pqw_thrift *t, int16_t id, double v) {
  pqw_t_field(t, id, PQ_TT_DOUBLE);
  pqw_t_val_double(t, v);
}

void pqw_t_binary(pqw_thrift *t, int16_t id, const void *p, size_t n) {
  pqw_t_field(t, id, PQ_TT_BINARY);
  pqw_t_val_binary(t, p, n);
}

void pqw_t_string(pqw_thrift *t, int16_t id, const char *s) { pqw_t_binary(t, id, s, strlen(s)); }

void pqw_t_push(pqw_thrift *t) {
  if (t->depth + 1 >= PQW_THRIFT_MAX_DEPTH) pqw_die("thrift nesting too deep");
  t->depth++;
  t->last[t->depth] = 0;
}

void pqw_t_struct_begin(pqw_thrift *t, int16_t id) {
  pqw_t_field(t, id, PQ_TT_STRUCT);
  pqw_t_push(t);
}

void pqw_t_struct_end(pqw_thrift *t) {
  pqw_u8(t->out, PQ_TT_STOP);
  if (t->depth > 0) t->depth--;
}

static void pqw_t_list_header(pqw_thrift *t, int elem_type, uint64_t n) {
  if (n < 15) {
    pqw_u8(t->out, (uint8_t)(n << 4 | (uint64_t)elem_type));
  } else {
    pqw_u8(t->out, (uint8_t)(0xf0 | elem_type));
    pqw_uvarint(t->out, n);
  }
}

void pqw_t_list_begin(pqw_thrift *t, int16_t id, int elem_type, uint64_t n) {
  pqw_t_field(t, id, PQ_TT_LIST);
  pqw_t_list_header(t, elem_type, n);
}

void pqw_t_set_begin(pqw_thrift *t, int16_t id, int elem_type, uint64_t n) {
  pqw_t_field(t, id, PQ_TT_SET);
  pqw_t_list_header(t, elem_type, n);
}

void pqw_t_map_begin(pqw_thrift *t, int16_t id, int key_type, int val_type, uint64_t n) {
  pqw_t_field(t, id, PQ_TT_MAP);
  pqw_uvarint(t->out, n);
  if (n > 0) pqw_u8(t->out, (uint8_t)(key_type << 4 | val_type));
}

void pqw_t_val_int(pqw_thrift *t, int64_t v) { pqw_zigzag(t->out, v); }

void pqw_t_val_binary(pqw_thrift *t, const void *p, size_t n) {
  pqw_uvarint(t->out, n);
  pqw_put(t->out, p, n);
}

void pqw_t_val_bool(pqw_thrift *t, int v) { pqw_u8(t->out, v ? 1 : 2); }

void pqw_t_val_byte(pqw_thrift *t, int8_t v) { pqw_u8(t->out, (uint8_t)v); }

void pqw_t_val_double(pqw_thrift *t, double v) {
  uint64_t u;
  memcpy(&u, &v, 8);
  pqw_le64(t->out, u);
}

/* ------------------------------------------------------------------------ */
/* Page headers                                                              */

void pqw_page_init(pqw_page *h, int type) {
  memset(h, 0, sizeof(*h));
  h->type = type;
  h->uncompressed_size = PQW_AUTO;
  h->compressed_size = PQW_AUTO;
  h->crc = PQW_OMIT;
  h->encoding = PQ_ENC_PLAIN;
  h->def_encoding = PQ_ENC_RLE;
  h->rep_encoding = PQ_ENC_RLE;
  h->is_compressed = -1;
}

/* Writes a zero value of a Thrift type (for unknown extra fields). */
static void pqw_t_zero_value(pqw_thrift *t, int type) {
  switch (type) {
    case PQ_TT_BYTE: pqw_u8(t->out, 0); break;
    case PQ_TT_I16:
    case PQ_TT_I32:
    case PQ_TT_I64: pqw_u8(t->out, 0); break;
    case PQ_TT_DOUBLE: pqw_le64(t->out, 0); break;
    case PQ_TT_BINARY: pqw_u8(t->out, 0); break;
    case PQ_TT_LIST:
    case PQ_TT_SET: pqw_u8(t->out, PQ_TT_I32); break;
    case PQ_TT_MAP: pqw_u8(t->out, 0); break;
    case PQ_TT_STRUCT: pqw_u8(t->out, PQ_TT_STOP); break;
    default: break; /* booleans carry their value in the type */
  }
}

void pqw_page_header(pqw_buf *out, const pqw_page *h, const uint8_t *body, size_t body_len,
                     size_t raw_len) {
  pqw_thrift t;
  pqw_t_init(&t, out);
  pqw_t_push(&t);
  if (h->type != PQW_OMIT) pqw_t_i32(&t, 1, h->type);
  if (h->uncompressed_size != PQW_OMIT)
    pqw_t_i32(&t, 2, h->uncompressed_size == PQW_AUTO ? (int32_t)raw_len : h->uncompressed_size);
  if (h->compressed_size != PQW_OMIT)
    pqw_t_i32(&t, 3, h->compressed_size == PQW_AUTO ? (int32_t)body_len : h->compressed_size);
  if (h->crc != PQW_OMIT)
    pqw_t_i32(&t, 4, h->crc == PQW_AUTO ? (int32_t)pqw_crc32(body, body_len) : h->crc);
  int kind = h->type == PQ_PAGE_DATA         ? 5
             : h->type == PQ_PAGE_INDEX      ? 6
             : h->type == PQ_PAGE_DICTIONARY ? 7
             : h->type == PQ_PAGE_DATA_V2    ? 8
                                             : 0;
  if (kind && !h->omit_sub) {
    pqw_t_struct_begin(&t, h->sub_id ? h->sub_id : (int16_t)kind);
    switch (kind) {
      case 5:
        pqw_t_i32(&t, 1, h->num_values);
        pqw_t_i32(&t, 2, h->encoding);
        if (h->def_encoding != PQW_OMIT) pqw_t_i32(&t, 3, h->def_encoding);
        if (h->rep_encoding != PQW_OMIT) pqw_t_i32(&t, 4, h->rep_encoding);
        break;
      case 7:
        pqw_t_i32(&t, 1, h->num_values);
        pqw_t_i32(&t, 2, h->encoding);
        break;
      case 8:
        pqw_t_i32(&t, 1, h->num_values);
        pqw_t_i32(&t, 2, h->num_nulls);
        pqw_t_i32(&t, 3, h->num_rows);
        pqw_t_i32(&t, 4, h->encoding);
        pqw_t_i32(&t, 5, h->def_length);
        pqw_t_i32(&t, 6, h->rep_length);
        if (h->is_compressed >= 0) pqw_t_bool(&t, 7, h->is_compressed);
        break;
      default: break;
    }
    pqw_t_struct_end(&t);
  }
  if (h->extra_id) {
    if (h->extra_type == PQ_TT_TRUE || h->extra_type == PQ_TT_FALSE) {
      pqw_t_field(&t, h->extra_id, h->extra_type);
    } else {
      pqw_t_field(&t, h->extra_id, h->extra_type);
      pqw_t_zero_value(&t, h->extra_type);
    }
  }
  pqw_t_struct_end(&t);
}

/* ------------------------------------------------------------------------ */
/* Encoders                                                                  */

int pqw_bit_width(uint64_t max) {
  int w = 0;
  while (max) {
    w++;
    max >>= 1;
  }
  return w;
}

void pqw_bitpack(pqw_buf *out, const uint64_t *v, size_t n, int w) {
  size_t bytes = (n * (size_t)w + 7) / 8;
  pqw_reserve(out, bytes);
  uint8_t *o = out->data + out->len;
  memset(o, 0, bytes);
  for (size_t i = 0; i < n; i++)
    for (int b = 0; b < w; b++)
      if ((v[i] >> b) & 1) {
        size_t bit = i * (size_t)w + (size_t)b;
        o[bit >> 3] |= (uint8_t)(1u << (bit & 7));
      }
  out->len += bytes;
}

void pqw_rle(pqw_buf *out, const uint32_t *v, size_t n, int w, int mode) {
  size_t vb = ((size_t)w + 7) / 8;
  size_t i = 0;
  while (i < n) {
    size_t run = 1;
    while (i + run < n && v[i + run] == v[i]) run++;
    if (mode == PQW_RLE_RUNS_ONLY || (mode == PQW_RLE_AUTO && run >= 8)) {
      pqw_uvarint(out, (uint64_t)run << 1);
      for (size_t k = 0; k < vb; k++) pqw_u8(out, (uint8_t)(v[i] >> (8 * k)));
      i += run;
      continue;
    }
    size_t start = i, groups = 0;
    for (;;) {
      groups++;
      i += 8;
      if (i >= n) break;
      if (mode == PQW_RLE_AUTO) {
        size_t r = 1;
        while (i + r < n && v[i + r] == v[i] && r < 8) r++;
        if (r >= 8) break;
      }
    }
    if (i > n) i = n;
    pqw_uvarint(out, (uint64_t)groups << 1 | 1);
    uint64_t *tmp = pqw_xcalloc(groups * 8, sizeof(uint64_t));
    for (size_t k = start; k < i; k++) tmp[k - start] = v[k];
    pqw_bitpack(out, tmp, groups * 8, w);
    free(tmp);
  }
}

static void pqw_levels_enc(pqw_buf *out, const uint16_t *lv, size_t n, int max_level, int prefix) {
  uint32_t *v = pqw_xmalloc(n * sizeof(uint32_t));
  for (size_t i = 0; i < n; i++) v[i] = lv[i];
  pqw_buf tmp = {0};
  pqw_rle(&tmp, v, n, pqw_bit_width((uint64_t)max_level), PQW_RLE_AUTO);
  if (prefix) pqw_le32(out, (uint32_t)tmp.len);
  pqw_put(out, tmp.data, tmp.len);
  pqw_buf_free(&tmp);
  free(v);
}

void pqw_levels_v1(pqw_buf *out, const uint16_t *lv, size_t n, int max_level) {
  pqw_levels_enc(out, lv, n, max_level, 1);
}

void pqw_levels_v2(pqw_buf *out, const uint16_t *lv, size_t n, int max_level) {
  pqw_levels_enc(out, lv, n, max_level, 0);
}

void pqw_delta(pqw_buf *out, const int64_t *v, size_t n, int block_size, int mini_count, int bits) {
  uint64_t mask = bits == 64 ? UINT64_MAX : 0xffffffffu;
  pqw_uvarint(out, (uint64_t)block_size);
  pqw_uvarint(out, (uint64_t)mini_count);
  pqw_uvarint(out, n);
  int64_t first = n ? v[0] : 0;
  if (bits == 32) first = (int32_t)(uint32_t)(uint64_t)first;
  pqw_zigzag(out, first);
  if (n <= 1) return;
  size_t mini = (size_t)(block_size / mini_count);
  size_t nd = n - 1;
  int64_t *d = pqw_xmalloc((size_t)block_size * sizeof(int64_t));
  uint64_t *adj = pqw_xcalloc((size_t)block_size, sizeof(uint64_t));
  for (size_t b0 = 0; b0 < nd; b0 += (size_t)block_size) {
    size_t cnt = nd - b0 < (size_t)block_size ? nd - b0 : (size_t)block_size;
    int64_t min = 0;
    for (size_t j = 0; j < cnt; j++) {
      uint64_t diff = ((uint64_t)v[b0 + j + 1] - (uint64_t)v[b0 + j]) & mask;
      d[j] = bits == 32 ? (int64_t)(int32_t)(uint32_t)diff : (int64_t)diff;
      if (j == 0 || d[j] < min) min = d[j];
    }
    pqw_zigzag(out, min);
    memset(adj, 0, (size_t)block_size * sizeof(uint64_t));
    for (size_t j = 0; j < cnt; j++) adj[j] = ((uint64_t)d[j] - (uint64_t)min) & mask;
    int widths[4096];
    for (int m = 0; m < mini_count; m++) {
      uint64_t mx = 0;
      for (size_t j = (size_t)m * mini; j < (size_t)(m + 1) * mini && j < cnt; j++)
        mx = adj[j] > mx ? adj[j] : mx;
      widths[m] = pqw_bit_width(mx);
      pqw_u8(out, (uint8_t)widths[m]);
    }
    for (int m = 0; m < mini_count; m++) {
      if ((size_t)m * mini >= cnt) break; /* miniblocks with no values */
      pqw_bitpack(out, adj + (size_t)m * mini, mini, widths[m]);
    }
  }
  free(d);
  free(adj);
}

void pqw_compress(int codec, const uint8_t *in, size_t n, pqw_buf *out) {
  switch (codec) {
    case PQ_UNCOMPRESSED: pqw_put(out, in, n); return;
    case PQ_SNAPPY: {
      size_t cap = snappy_max_compressed_length(n);
      pqw_reserve(out, cap);
      size_t len = cap;
      if (snappy_compress((const char *)in, n, (char *)out->data + out->len, &len) != SNAPPY_OK)
        pqw_die("snappy_compress failed");
      out->len += len;
      return;
    }
    case PQ_ZSTD: {
      size_t cap = ZSTD_compressBound(n);
      pqw_reserve(out, cap);
      size_t len = ZSTD_compress(out->data + out->len, cap, in, n, 3);
      if (ZSTD_isError(len)) pqw_die("ZSTD_compress failed");
      out->len += len;
      return;
    }
    case PQ_GZIP: {
      z_stream zs;
      memset(&zs, 0, sizeof(zs));
      if (deflateInit2(&zs, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
        pqw_die("deflateInit2 failed");
      size_t cap = deflateBound(&zs, (uLong)n) + 32;
      pqw_reserve(out, cap);
      zs.next_in = (Bytef *)(uintptr_t)in;
      zs.avail_in = (uInt)n;
      zs.next_out = out->data + out->len;
      zs.avail_out = (uInt)cap;
      if (deflate(&zs, Z_FINISH) != Z_STREAM_END) pqw_die("deflate failed");
      out->len += cap - zs.avail_out;
      deflateEnd(&zs);
      return;
    }
    case PQ_LZ4_RAW: {
      int cap = LZ4_compressBound((int)n);
      pqw_reserve(out, (size_t)cap);
      int len = LZ4_compress_default((const char *)in, (char *)out->data + out->len, (int)n, cap);
      if (len <= 0 && n > 0) pqw_die("LZ4_compress_default failed");
      out->len += (size_t)(len > 0 ? len : 0);
      return;
    }
    default: pqw_die("codec not supported by the test writer");
  }
}

uint32_t pqw_crc32(const uint8_t *p, size_t n) {
  return (uint32_t)crc32(0L, n ? p : (const uint8_t *)"", (uInt)n);
}

/* ------------------------------------------------------------------------ */
/* Column chunks                                                             */

void pqw_chunk_init(pqw_chunk *c, int physical, int codec) {
  memset(c, 0, sizeof(*c));
  c->physical = physical;
  c->codec = codec;
}

void pqw_chunk_free(pqw_chunk *c) { pqw_buf_free(&c->bytes); }

void pqw_chunk_page(pqw_chunk *c, const pqw_page *h, const void *body, size_t body_len,
                    size_t raw_len) {
  size_t start = c->bytes.len;
  if (c->num_pages < 64) c->page_off[c->num_pages] = start;
  pqw_page_header(&c->bytes, h, body, body_len, raw_len);
  size_t hlen = c->bytes.len - start;
  pqw_put(&c->bytes, body, body_len);
  c->num_pages++;
  c->uncompressed_size += (int64_t)(hlen + raw_len);
  if (h->type == PQ_PAGE_DICTIONARY && start == 0) c->dict_len = c->bytes.len;
  if (h->type == PQ_PAGE_DATA || h->type == PQ_PAGE_DATA_V2) {
    if (h->num_values > 0) c->num_values += h->num_values;
    if (h->encoding >= 0 && h->encoding < 32) c->encodings |= 1u << h->encoding;
    c->encodings |= 1u << PQ_ENC_RLE;
  } else if (h->type == PQ_PAGE_DICTIONARY) {
    if (h->encoding >= 0 && h->encoding < 32) c->encodings |= 1u << h->encoding;
  }
}

void pqw_chunk_page_raw(pqw_chunk *c, const pqw_page *h, const void *raw, size_t raw_len,
                        size_t levels_len) {
  pqw_buf body = {0};
  const uint8_t *r = raw;
  if (h->type == PQ_PAGE_DATA_V2) {
    pqw_put(&body, r, levels_len);
    if (h->is_compressed == 0) pqw_put(&body, r + levels_len, raw_len - levels_len);
    else pqw_compress(c->codec, r + levels_len, raw_len - levels_len, &body);
  } else {
    pqw_compress(c->codec, r, raw_len, &body);
  }
  pqw_chunk_page(c, h, body.data, body.len, raw_len);
  pqw_buf_free(&body);
}

/* Width in bytes of a fixed-width physical value (BOOLEAN: one byte in
 * pqw_values). */
static size_t pqw_width(const pqw_values *v) {
  switch (v->physical) {
    case PQ_BOOLEAN: return 1;
    case PQ_INT32:
    case PQ_FLOAT: return 4;
    case PQ_INT64:
    case PQ_DOUBLE: return 8;
    case PQ_INT96: return 12;
    case PQ_FIXED_LEN_BYTE_ARRAY: return (size_t)v->type_length;
    default: return 0;
  }
}

static const uint8_t *pqw_value(const pqw_values *v, int64_t i, size_t *len) {
  if (v->physical == PQ_BYTE_ARRAY) {
    const char *s = v->bytes[i];
    *len = v->lens ? (size_t)v->lens[i] : strlen(s);
    return (const uint8_t *)s;
  }
  *len = pqw_width(v);
  return (const uint8_t *)v->fixed + (size_t)i * *len;
}

static int64_t pqw_value_int(const pqw_values *v, int64_t i) {
  if (v->physical == PQ_INT32) {
    int32_t x;
    memcpy(&x, (const uint8_t *)v->fixed + 4 * (size_t)i, 4);
    return x;
  }
  int64_t x;
  memcpy(&x, (const uint8_t *)v->fixed + 8 * (size_t)i, 8);
  return x;
}

/* PLAIN encoding of values [from, from + n). */
static void pqw_plain(pqw_buf *out, const pqw_values *v, int64_t from, int64_t n) {
  if (v->physical == PQ_BOOLEAN) {
    const uint8_t *b = v->fixed;
    size_t bytes = ((size_t)n + 7) / 8;
    pqw_reserve(out, bytes);
    memset(out->data + out->len, 0, bytes);
    for (int64_t i = 0; i < n; i++)
      if (b[from + i]) out->data[out->len + (size_t)i / 8] |= (uint8_t)(1u << (i % 8));
    out->len += bytes;
    return;
  }
  for (int64_t i = from; i < from + n; i++) {
    size_t len;
    const uint8_t *p = pqw_value(v, i, &len);
    if (v->physical == PQ_BYTE_ARRAY) pqw_le32(out, (uint32_t)len);
    pqw_put(out, p, len);
  }
}

/* A dictionary over all values: the distinct values in order of first
 * appearance, and each value's index. */
typedef struct pqw_dict {
  int64_t count;
  int64_t *first;  /* value index of each entry */
  uint32_t *index; /* entry of each value */
} pqw_dict;

static uint64_t pqw_hash(const uint8_t *p, size_t n) {
  uint64_t h = 1469598103934665603ull ^ n;
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

static void pqw_dict_build(pqw_dict *d, const pqw_values *v) {
  int64_t n = v->count;
  size_t cap = 16;
  while (cap < (size_t)n * 2 + 2) cap *= 2;
  int64_t *table = pqw_xmalloc(cap * sizeof(int64_t));
  for (size_t i = 0; i < cap; i++) table[i] = -1;
  d->first = pqw_xmalloc((size_t)(n + 1) * sizeof(int64_t));
  d->index = pqw_xmalloc((size_t)(n + 1) * sizeof(uint32_t));
  d->count = 0;
  for (int64_t i = 0; i < n; i++) {
    size_t len;
    const uint8_t *p = pqw_value(v, i, &len);
    size_t h = (size_t)pqw_hash(p, len) & (cap - 1);
    for (;;) {
      int64_t e = table[h];
      if (e < 0) {
        table[h] = d->count;
        d->first[d->count] = i;
        d->index[i] = (uint32_t)d->count++;
        break;
      }
      size_t elen;
      const uint8_t *ep = pqw_value(v, d->first[e], &elen);
      if (elen == len && memcmp(ep, p, len) == 0) {
        d->index[i] = (uint32_t)e;
        break;
      }
      h = (h + 1) & (cap - 1);
    }
  }
  free(table);
}

/* Encodes values [from, from + n) of one page in encoding `enc`. */
static void pqw_encode_values(pqw_buf *out, const pqw_values *v, int64_t from, int64_t n, int enc,
                              const pqw_dict *dict, const pqw_chunk_opts *o) {
  int block = o->delta_block ? o->delta_block : 128;
  int mini = o->delta_mini ? o->delta_mini : 4;
  switch (enc) {
    case PQ_ENC_PLAIN: pqw_plain(out, v, from, n); return;
    case PQ_ENC_RLE_DICTIONARY:
    case PQ_ENC_PLAIN_DICTIONARY: {
      int bw = pqw_bit_width(dict->count > 0 ? (uint64_t)(dict->count - 1) : 0);
      pqw_u8(out, (uint8_t)bw);
      pqw_rle(out, dict->index + from, (size_t)n, bw, PQW_RLE_AUTO);
      return;
    }
    case PQ_ENC_DELTA_BINARY_PACKED: {
      int64_t *x = pqw_xcalloc((size_t)(n + 1), sizeof(int64_t));
      for (int64_t i = 0; i < n; i++) x[i] = pqw_value_int(v, from + i);
      pqw_delta(out, x, (size_t)n, block, mini, v->physical == PQ_INT32 ? 32 : 64);
      free(x);
      return;
    }
    case PQ_ENC_DELTA_LENGTH_BYTE_ARRAY: {
      int64_t *x = pqw_xcalloc((size_t)(n + 1), sizeof(int64_t));
      for (int64_t i = 0; i < n; i++) {
        size_t len;
        (void)pqw_value(v, from + i, &len);
        x[i] = (int64_t)len;
      }
      pqw_delta(out, x, (size_t)n, block, mini, 32);
      for (int64_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *p = pqw_value(v, from + i, &len);
        pqw_put(out, p, len);
      }
      free(x);
      return;
    }
    case PQ_ENC_DELTA_BYTE_ARRAY: {
      int64_t *pre = pqw_xcalloc((size_t)(n + 1), sizeof(int64_t));
      int64_t *suf = pqw_xcalloc((size_t)(n + 1), sizeof(int64_t));
      const uint8_t *prev = NULL;
      size_t prev_len = 0;
      for (int64_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *p = pqw_value(v, from + i, &len);
        size_t k = 0;
        while (prev && k < len && k < prev_len && p[k] == prev[k]) k++;
        pre[i] = (int64_t)k;
        suf[i] = (int64_t)(len - k);
        prev = p;
        prev_len = len;
      }
      pqw_delta(out, pre, (size_t)n, block, mini, 32);
      pqw_delta(out, suf, (size_t)n, block, mini, 32);
      for (int64_t i = 0; i < n; i++) {
        size_t len;
        const uint8_t *p = pqw_value(v, from + i, &len);
        pqw_put(out, p + pre[i], (size_t)suf[i]);
      }
      free(pre);
      free(suf);
      return;
    }
    case PQ_ENC_BYTE_STREAM_SPLIT: {
      size_t w = pqw_width(v);
      for (size_t b = 0; b < w; b++)
        for (int64_t i = 0; i < n; i++) {
          size_t len;
          const uint8_t *p = pqw_value(v, from + i, &len);
          pqw_u8(out, p[b]);
        }
      return;
    }
    case PQ_ENC_RLE: { /* booleans */
      uint32_t *x = pqw_xmalloc((size_t)(n + 1) * sizeof(uint32_t));
      for (int64_t i = 0; i < n; i++) x[i] = ((const uint8_t *)v->fixed)[from + i] ? 1 : 0;
      pqw_buf tmp = {0};
      pqw_rle(&tmp, x, (size_t)n, 1, PQW_RLE_AUTO);
      pqw_le32(out, (uint32_t)tmp.len);
      pqw_put(out, tmp.data, tmp.len);
      pqw_buf_free(&tmp);
      free(x);
      return;
    }
    default: pqw_die("encoding not supported by the test writer");
  }
}

void pqw_chunk_build(pqw_chunk *c, const pqw_values *v, const pqw_levels *lv,
                     const pqw_chunk_opts *o) {
  pqw_chunk_opts defaults;
  if (o == NULL) {
    memset(&defaults, 0, sizeof(defaults));
    o = &defaults;
  }
  pqw_chunk_init(c, v->physical, o->codec);
  pqw_levels flat = {v->count, NULL, NULL, 0, 0};
  if (lv == NULL) lv = &flat;
  int enc = o->encoding;
  int is_dict = enc == PQ_ENC_RLE_DICTIONARY || enc == PQ_ENC_PLAIN_DICTIONARY;
  pqw_dict dict = {0, NULL, NULL};
  if (is_dict) {
    pqw_dict_build(&dict, v);
    pqw_buf raw = {0};
    for (int64_t e = 0; e < dict.count; e++) {
      if (v->physical == PQ_BOOLEAN) pqw_die("no dictionaries of booleans");
      pqw_plain(&raw, v, dict.first[e], 1);
    }
    pqw_page h;
    pqw_page_init(&h, PQ_PAGE_DICTIONARY);
    h.num_values = (int32_t)dict.count;
    h.encoding = enc == PQ_ENC_PLAIN_DICTIONARY ? PQ_ENC_PLAIN_DICTIONARY : PQ_ENC_PLAIN;
    if (o->crc) h.crc = PQW_AUTO;
    pqw_chunk_page_raw(c, &h, raw.data, raw.len, 0);
    pqw_buf_free(&raw);
  }
  int64_t n = lv->n;
  int64_t a = 0, va = 0;
  do {
    int64_t b = o->page_entries > 0 && a + o->page_entries < n ? a + o->page_entries : n;
    if (o->v2 && lv->max_rep > 0)
      while (b < n && lv->rep[b] != 0) b++;
    int64_t vals = 0, rows = 0;
    for (int64_t i = a; i < b; i++) {
      vals += lv->max_def == 0 || lv->def[i] == lv->max_def;
      rows += lv->max_rep == 0 || lv->rep[i] == 0;
    }
    pqw_buf raw = {0};
    size_t levels_len = 0;
    if (o->v2) {
      size_t s0 = raw.len;
      if (lv->max_rep) pqw_levels_v2(&raw, lv->rep + a, (size_t)(b - a), lv->max_rep);
      size_t rep_len = raw.len - s0;
      if (lv->max_def) pqw_levels_v2(&raw, lv->def + a, (size_t)(b - a), lv->max_def);
      levels_len = raw.len;
      pqw_encode_values(&raw, v, va, vals, enc, &dict, o);
      pqw_page h;
      pqw_page_init(&h, PQ_PAGE_DATA_V2);
      h.num_values = (int32_t)(b - a);
      h.num_nulls = (int32_t)(b - a - vals);
      h.num_rows = (int32_t)rows;
      h.encoding = is_dict ? PQ_ENC_RLE_DICTIONARY : enc;
      h.rep_length = (int32_t)rep_len;
      h.def_length = (int32_t)(levels_len - rep_len);
      if (o->crc) h.crc = PQW_AUTO;
      pqw_chunk_page_raw(c, &h, raw.data, raw.len, levels_len);
    } else {
      if (lv->max_rep) pqw_levels_v1(&raw, lv->rep + a, (size_t)(b - a), lv->max_rep);
      if (lv->max_def) pqw_levels_v1(&raw, lv->def + a, (size_t)(b - a), lv->max_def);
      pqw_encode_values(&raw, v, va, vals, enc, &dict, o);
      pqw_page h;
      pqw_page_init(&h, PQ_PAGE_DATA);
      h.num_values = (int32_t)(b - a);
      h.encoding = enc == PQ_ENC_RLE_DICTIONARY ? PQ_ENC_RLE_DICTIONARY : enc;
      if (o->crc) h.crc = PQW_AUTO;
      pqw_chunk_page_raw(c, &h, raw.data, raw.len, 0);
    }
    pqw_buf_free(&raw);
    a = b;
    va += vals;
  } while (a < n);
  free(dict.first);
  free(dict.index);
}

/* ------------------------------------------------------------------------ */
/* Files                                                                     */

static pqw_schema pqw_schema_blank(void) {
  pqw_schema s;
  memset(&s, 0, sizeof(s));
  s.type = -1;
  s.repetition = -1;
  s.num_children = -1;
  s.converted = -1;
  s.field_id = -1;
  return s;
}

pqw_schema pqw_root(int num_children) {
  pqw_schema s = pqw_schema_blank();
  s.name = "schema";
  s.num_children = num_children;
  return s;
}

pqw_schema pqw_group(const char *name, int repetition, int num_children) {
  pqw_schema s = pqw_schema_blank();
  s.name = name;
  s.repetition = repetition;
  s.num_children = num_children;
  return s;
}

pqw_schema pqw_leaf(const char *name, int physical, int repetition) {
  pqw_schema s = pqw_schema_blank();
  s.name = name;
  s.type = physical;
  s.repetition = repetition;
  return s;
}

void pqw_file_init(pqw_file *f, const pqw_schema *schema, int n) {
  memset(f, 0, sizeof(*f));
  f->num_schema = n;
  f->schema = pqw_xmalloc((size_t)n * sizeof(pqw_schema));
  memcpy(f->schema, schema, (size_t)n * sizeof(pqw_schema));
  f->num_rows = -1;
  f->version = 1;
  f->created_by = "larder pqwrite";
  pqw_put(&f->out, "PAR1", 4);
  /* Leaves and their dotted paths, walking the flat list with an explicit
   * stack (schemas may be very deep) and tolerating lies. */
  int *rem = pqw_xmalloc((size_t)(n + 1) * sizeof(int));
  size_t *plen = pqw_xmalloc((size_t)(n + 1) * sizeof(size_t));
  char path[1024];
  int depth = 0;
  rem[0] = n > 0 && schema[0].num_children > 0 ? schema[0].num_children : n - 1;
  plen[0] = 0;
  for (int i = 1; i < n; i++) {
    while (depth > 0 && rem[depth] == 0) depth--;
    if (rem[depth] > 0) rem[depth]--;
    const pqw_schema *e = &schema[i];
    const char *name = e->name ? e->name : "";
    size_t l = plen[depth];
    size_t nl = strlen(name);
    if (l + nl + 2 < sizeof(path)) {
      if (l) path[l++] = '.';
      memcpy(path + l, name, nl);
      l += nl;
    }
    path[l] = '\0';
    int group = e->num_children > 0 || (e->type == -1 && e->num_children >= 0);
    if (group) {
      depth++;
      rem[depth] = e->num_children;
      plen[depth] = l;
    } else if (f->num_leaves < 256) {
      f->leaf_type[f->num_leaves] = e->type;
      size_t pl = l < sizeof(f->leaf_path[0]) - 1 ? l : sizeof(f->leaf_path[0]) - 1;
      memcpy(f->leaf_path[f->num_leaves], path, pl);
      f->leaf_path[f->num_leaves][pl] = '\0';
      f->num_leaves++;
    }
  }
  free(rem);
  free(plen);
}

int pqw_file_add_row_group(pqw_file *f, int64_t num_rows, pqw_chunk *chunks, int n) {
  pqw_rowgroup *rgs = realloc(f->rg, (size_t)(f->num_rg + 1) * sizeof(*rgs));
  if (rgs == NULL) pqw_die("out of memory");
  f->rg = rgs;
  pqw_rowgroup *rg = &f->rg[f->num_rg];
  memset(rg, 0, sizeof(*rg));
  rg->num_rows = num_rows;
  rg->num_columns = n;
  rg->cols = pqw_xcalloc((size_t)n, sizeof(pqw_colmeta));
  for (int i = 0; i < n; i++) {
    pqw_chunk *c = &chunks[i];
    pqw_colmeta *m = &rg->cols[i];
    int64_t start = (int64_t)f->out.len;
    pqw_put(&f->out, c->bytes.data, c->bytes.len);
    m->type = c->physical;
    m->encodings = c->encodings;
    if (i < f->num_leaves) snprintf(m->path, sizeof(m->path), "%s", f->leaf_path[i]);
    else snprintf(m->path, sizeof(m->path), "col%d", i);
    m->codec = c->codec;
    m->num_values = c->num_values;
    m->total_uncompressed_size = c->uncompressed_size;
    m->total_compressed_size = (int64_t)c->bytes.len;
    m->data_page_offset = start + (int64_t)c->dict_len;
    m->dictionary_page_offset = c->dict_len ? start : -1;
    m->file_offset = start + (int64_t)c->bytes.len;
    rg->total_byte_size += c->uncompressed_size;
  }
  return f->num_rg++;
}

static void pqw_write_logical(pqw_thrift *t, const pqw_schema *s) {
  pqw_t_struct_begin(t, 10);
  pqw_t_struct_begin(t, (int16_t)s->logical);
  switch (s->logical) {
    case PQ_LT_DECIMAL:
      pqw_t_i32(t, 1, s->lt_scale);
      pqw_t_i32(t, 2, s->lt_precision);
      break;
    case PQ_LT_TIME:
    case PQ_LT_TIMESTAMP:
      pqw_t_bool(t, 1, s->lt_utc);
      pqw_t_struct_begin(t, 2);
      pqw_t_struct_begin(t, (int16_t)(s->lt_unit ? s->lt_unit : 1));
      pqw_t_struct_end(t);
      pqw_t_struct_end(t);
      break;
    case PQ_LT_INTEGER:
      pqw_t_byte(t, 1, (int8_t)s->lt_bits);
      pqw_t_bool(t, 2, s->lt_signed);
      break;
    default: break;
  }
  pqw_t_struct_end(t);
  pqw_t_struct_end(t);
}

void pqw_file_meta(pqw_buf *out, const pqw_file *f) {
  pqw_thrift t;
  pqw_t_init(&t, out);
  pqw_t_push(&t);
  pqw_t_i32(&t, 1, f->version);
  pqw_t_list_begin(&t, 2, PQ_TT_STRUCT, (uint64_t)f->num_schema);
  for (int i = 0; i < f->num_schema; i++) {
    const pqw_schema *s = &f->schema[i];
    pqw_t_push(&t);
    if (s->type != -1) pqw_t_i32(&t, 1, s->type);
    if (s->type_length) pqw_t_i32(&t, 2, s->type_length);
    if (s->repetition != -1) pqw_t_i32(&t, 3, s->repetition);
    if (s->name) pqw_t_string(&t, 4, s->name);
    if (s->num_children != -1) pqw_t_i32(&t, 5, s->num_children);
    if (s->converted != -1) pqw_t_i32(&t, 6, s->converted);
    if (s->precision > 0) {
      pqw_t_i32(&t, 7, s->scale);
      pqw_t_i32(&t, 8, s->precision);
    }
    if (s->field_id != -1) pqw_t_i32(&t, 9, s->field_id);
    if (s->logical) pqw_write_logical(&t, s);
    pqw_t_struct_end(&t);
  }
  int64_t rows = f->num_rows;
  if (rows < 0) {
    rows = 0;
    for (int g = 0; g < f->num_rg; g++) rows += f->rg[g].num_rows;
  }
  pqw_t_i64(&t, 3, rows);
  pqw_t_list_begin(&t, 4, PQ_TT_STRUCT, (uint64_t)f->num_rg);
  for (int g = 0; g < f->num_rg; g++) {
    const pqw_rowgroup *rg = &f->rg[g];
    pqw_t_push(&t);
    pqw_t_list_begin(&t, 1, PQ_TT_STRUCT, (uint64_t)rg->num_columns);
    for (int c = 0; c < rg->num_columns; c++) {
      const pqw_colmeta *m = &rg->cols[c];
      pqw_t_push(&t);
      pqw_t_i64(&t, 2, m->file_offset);
      if (!m->omit_meta) {
        pqw_t_struct_begin(&t, 3);
        pqw_t_i32(&t, 1, m->type);
        int ne = __builtin_popcount(m->encodings);
        pqw_t_list_begin(&t, 2, PQ_TT_I32, (uint64_t)ne);
        for (int e = 0; e < 32; e++)
          if (m->encodings & (1u << e)) pqw_t_val_int(&t, e);
        /* path_in_schema: the dotted path, split. */
        int parts = 1;
        for (const char *p = m->path; *p; p++) parts += *p == '.';
        pqw_t_list_begin(&t, 3, PQ_TT_BINARY, (uint64_t)parts);
        const char *s = m->path;
        for (;;) {
          const char *dot = strchr(s, '.');
          size_t l = dot ? (size_t)(dot - s) : strlen(s);
          pqw_t_val_binary(&t, s, l);
          if (!dot) break;
          s = dot + 1;
        }
        pqw_t_i32(&t, 4, m->codec);
        pqw_t_i64(&t, 5, m->num_values);
        pqw_t_i64(&t, 6, m->total_uncompressed_size);
        pqw_t_i64(&t, 7, m->total_compressed_size);
        pqw_t_i64(&t, 9, m->data_page_offset);
        if (m->dictionary_page_offset >= 0) pqw_t_i64(&t, 11, m->dictionary_page_offset);
        if (m->stat_fields) {
          pqw_t_struct_begin(&t, 12);
          if ((m->stat_fields & PQW_STAT_LEGACY) && m->stat_max)
            pqw_t_binary(&t, 1, m->stat_max, m->stat_max_len);
          if ((m->stat_fields & PQW_STAT_LEGACY) && m->stat_min)
            pqw_t_binary(&t, 2, m->stat_min, m->stat_min_len);
          pqw_t_i64(&t, 3, m->stat_null_count);
          if ((m->stat_fields & PQW_STAT_VALUES) && m->stat_max)
            pqw_t_binary(&t, 5, m->stat_max, m->stat_max_len);
          if ((m->stat_fields & PQW_STAT_VALUES) && m->stat_min)
            pqw_t_binary(&t, 6, m->stat_min, m->stat_min_len);
          pqw_t_struct_end(&t);
        }
        pqw_t_struct_end(&t);
      }
      pqw_t_struct_end(&t);
    }
    pqw_t_i64(&t, 2, rg->total_byte_size);
    if (!rg->omit_num_rows) pqw_t_i64(&t, 3, rg->num_rows);
    pqw_t_struct_end(&t);
  }
  if (f->num_kv > 0) {
    pqw_t_list_begin(&t, 5, PQ_TT_STRUCT, (uint64_t)f->num_kv);
    for (int i = 0; i < f->num_kv; i++) {
      pqw_t_push(&t);
      pqw_t_string(&t, 1, f->kv[i][0]);
      if (f->kv[i][1]) pqw_t_string(&t, 2, f->kv[i][1]);
      pqw_t_struct_end(&t);
    }
  }
  if (f->created_by) pqw_t_string(&t, 6, f->created_by);
  pqw_t_struct_end(&t);
}

void pqw_tail(pqw_buf *file, size_t meta_start) {
  pqw_le32(file, (uint32_t)(file->len - meta_start));
  pqw_put(file, "PAR1", 4);
}

void pqw_file_free(pqw_file *f) {
  pqw_buf_free(&f->out);
  for (int g = 0; g < f->num_rg; g++) free(f->rg[g].cols);
  free(f->rg);
  free(f->schema);
  memset(f, 0, sizeof(*f));
}

uint8_t *pqw_file_finish(pqw_file *f, size_t *len) {
  size_t meta_start = f->out.len;
  pqw_file_meta(&f->out, f);
  pqw_tail(&f->out, meta_start);
  uint8_t *p = pqw_buf_take(&f->out, len);
  pqw_file_free(f);
  return p;
}
