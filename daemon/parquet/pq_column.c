/*
 * pq_column.c: the column chunk reader.  Walks one leaf column's pages in a
 * row group, decompresses them, decodes levels and values, and hands out
 * whole records at a time so that nested columns can be cut at any row.
 *
 * Memory: the reader keeps one page (compressed and decompressed), the
 * current page's levels, the dictionary, and what the caller asked for.
 * Every allocation that the file's contents decide is charged first against
 * pq_options.max_chunk_decoded_bytes, so a bomb fails before it allocates.
 *
 * Errors: every failure is reported as "<file>: column '<path>', row group
 * <n>: <what>", built here once from the short reasons the lower layers
 * give.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "parquet/pq_internal.h"

/* The first read of a page covers its header and, for small pages, the
 * whole page; later pages are read with the same read-ahead. */
#define PQ_READAHEAD (1u << 20)
/* Page headers larger than this (statistics of huge values) are refused. */
#define PQ_MAX_PAGE_HEADER (16u << 20)
/* Dictionary indices are decoded in blocks of this many values. */
#define PQ_INDEX_BLOCK 1024

struct pq_leaf {
  const struct pq_file *file;
  const pq_source *src;
  const pq_options *opts;
  pq_codec_ctx *codec;
  const pq_schema_node_t *node;
  const pq_column_chunk_t *cc;
  int rg;
  pq_physical_t phys;
  int width; /* bytes per dense value for fixed-width physical types */
  uint16_t max_def, max_rep;

  /* The chunk's bytes. */
  uint64_t pos, end;
  uint64_t advised; /* how far will_read was called */
  pq_buf_t io;
  uint64_t io_off;
  pq_buf_t page;
  uint64_t charged;

  /* The dictionary, decoded to the dense layout. */
  int has_dict;
  int64_t dict_count;
  pq_buf_t dict_values, dict_offsets;

  /* The current data page. */
  int in_page;
  int first_page_seen;
  int64_t page_n, page_pos;
  pq_buf_t defs, reps; /* uint16 levels of the whole page */
  int page_all_def;    /* every definition level of the page is max_def */
  int64_t page_values, page_vpos;
  int encoding;
  const uint8_t *vp, *vend;
  pq_rle_t rle;
  pq_delta_t *delta;
  pq_buf_t lens, prefix;
  int64_t lens_pos;
  uint64_t bss_stride;
  pq_buf_t prev;                      /* DELTA_BYTE_ARRAY: the previous value */
  pq_buf_t skip_values, skip_offsets; /* where skipped values go */

  /* Levels of the last read.  While every entry read so far has the maximum
   * definition level, out_def stays unwritten (out_def_virtual): most
   * columns have no nulls, and their levels need no work at all. */
  pq_buf_t out_def, out_rep;
  int out_def_virtual;
  int64_t out_n, out_values;
  int64_t entries_seen; /* level entries consumed in the chunk */
};

static int leaf_fail(const pq_leaf *L, pq_error *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

void pq_leaf_where(const pq_leaf *L, char *buf, size_t size) {
  snprintf(buf, size, "%s: column '%s', row group %d", L->file->name, L->node->path, L->rg);
}

static int leaf_fail(const pq_leaf *L, pq_error *err, int code, const char *fmt, ...) {
  char what[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  char where[300];
  pq_leaf_where(L, where, sizeof(where));
  return pq_error_set(err, code, "%s: %s", where, what);
}

/* Charges n bytes against the chunk's ceiling before they are allocated.
 * page_values >= 0: n is what one page needs as a whole (its levels, its
 * values, its decompressed body), for a header that claims page_values
 * values; such a page over the ceiling by itself sets err->whole_page, as
 * no smaller read could decode it.  -1: n is what one read needs. */
static int charge_page(pq_leaf *L, uint64_t n, int64_t page_values, pq_error *err) {
  uint64_t max = L->opts->max_chunk_decoded_bytes;
  if (page_values >= 0 && n > max) {
    int rc = leaf_fail(L, err, LARDER_ELIMIT,
                       "a page of %lld values needs %llu decoded bytes, more than the "
                       "ceiling of %llu bytes per column chunk (max_chunk_decoded_bytes)",
                       (long long)page_values, (unsigned long long)n, (unsigned long long)max);
    if (err) err->whole_page = 1;
    return rc;
  }
  if (n > max || L->charged > max - n)
    return leaf_fail(L, err, LARDER_ELIMIT,
                     "decoded size exceeds the ceiling of %llu bytes per "
                     "column chunk (max_chunk_decoded_bytes)",
                     (unsigned long long)max);
  L->charged += n;
  return 0;
}

static int charge(pq_leaf *L, uint64_t n, pq_error *err) { return charge_page(L, n, -1, err); }

static int physical_width(pq_physical_t phys, int32_t type_length) {
  switch (phys) {
    case PQ_BOOLEAN: return 1;
    case PQ_INT32:
    case PQ_FLOAT: return 4;
    case PQ_INT64:
    case PQ_DOUBLE: return 8;
    case PQ_INT96: return 12;
    case PQ_FIXED_LEN_BYTE_ARRAY: return type_length;
    default: return 0;
  }
}

static int bit_width_of(uint32_t max) {
  int w = 0;
  while (max) {
    w++;
    max >>= 1;
  }
  return w;
}

int pq_leaf_open(const struct pq_file *file, const pq_source *src, const pq_options *opts,
                 pq_codec_ctx *codec, int rg, int leaf_index, pq_leaf **out, pq_error *err) {
  pq_leaf *L = calloc(1, sizeof(*L));
  if (L == NULL)
    return pq_error_set(err, LARDER_ENOMEM, "%s: column '%s', row group %d: out of memory",
                        file->name, file->meta.leaves[leaf_index]->path, rg);
  L->file = file;
  L->src = src;
  L->opts = opts;
  L->codec = codec;
  L->rg = rg;
  L->node = file->meta.leaves[leaf_index];
  L->cc = &file->meta.row_groups[rg].columns[leaf_index];
  L->phys = L->node->physical;
  L->width = physical_width(L->phys, L->node->type_length);
  L->max_def = (uint16_t)L->node->def_level;
  L->max_rep = (uint16_t)L->node->rep_level;
  L->pos = L->cc->range_offset;
  L->end = L->cc->range_offset + L->cc->range_length;
  L->advised = 0;
  if (L->end > src->size) {
    int rc =
        leaf_fail(L, err, LARDER_ECORRUPT, "chunk ends at byte %llu, past the object's %llu bytes",
                  (unsigned long long)L->end, (unsigned long long)src->size);
    free(L);
    return rc;
  }
  *out = L;
  return 0;
}

int pq_leaf_reset(pq_leaf *L, int rg, pq_error *err) {
  int leaf_index = L->node->leaf_index;
  L->rg = rg;
  L->cc = &L->file->meta.row_groups[rg].columns[leaf_index];
  L->pos = L->cc->range_offset;
  L->end = L->cc->range_offset + L->cc->range_length;
  L->advised = 0;
  L->io.len = 0;
  L->io_off = 0;
  L->charged = 0;
  L->has_dict = 0;
  L->dict_count = 0;
  L->in_page = 0;
  L->first_page_seen = 0;
  L->page_n = L->page_pos = 0;
  L->page_values = L->page_vpos = 0;
  L->entries_seen = 0;
  L->out_n = L->out_values = 0;
  if (L->end > L->src->size)
    return leaf_fail(L, err, LARDER_ECORRUPT,
                     "chunk ends at byte %llu, past the object's %llu bytes",
                     (unsigned long long)L->end, (unsigned long long)L->src->size);
  return 0;
}

void pq_leaf_close(pq_leaf *L) {
  if (L == NULL) return;
  pq_buf_free(&L->io);
  pq_buf_free(&L->page);
  pq_buf_free(&L->dict_values);
  pq_buf_free(&L->dict_offsets);
  pq_buf_free(&L->defs);
  pq_buf_free(&L->reps);
  pq_buf_free(&L->lens);
  pq_buf_free(&L->prefix);
  pq_buf_free(&L->prev);
  pq_buf_free(&L->skip_values);
  pq_buf_free(&L->skip_offsets);
  pq_buf_free(&L->out_def);
  pq_buf_free(&L->out_rep);
  free(L->delta);
  free(L);
}

const pq_schema_node_t *pq_leaf_node(const pq_leaf *L) { return L->node; }

void pq_leaf_levels(const pq_leaf *L, const uint16_t **def, const uint16_t **rep, int64_t *n,
                    int64_t *num_values) {
  *def = L->max_def && !L->out_def_virtual ? (const uint16_t *)L->out_def.data : NULL;
  *rep = L->max_rep ? (const uint16_t *)L->out_rep.data : NULL;
  *n = L->out_n;
  *num_values = L->out_values;
}

/* ------------------------------------------------------------------------ */
/* Bytes of the chunk                                                        */

/* Returns a pointer to [off, off + len) of the chunk, valid until the next
 * call, reading `ahead` bytes beyond it when it must read anyway. */
static const uint8_t *chunk_bytes(pq_leaf *L, uint64_t off, size_t len, size_t ahead,
                                  pq_error *err) {
  if (off < L->cc->range_offset || off > L->end || len > L->end - off) {
    leaf_fail(L, err, LARDER_ECORRUPT, "page at byte %llu runs past the end of the column chunk",
              (unsigned long long)off);
    return NULL;
  }
  if (L->src->map) {
    if (L->src->will_read && off + len > L->advised) {
      /* Populate a few MiB ahead at a time: one system call instead of a
       * page fault per page, without committing to the whole chunk. */
      uint64_t from = off > L->advised ? off : L->advised;
      uint64_t to = off + len + (4u << 20);
      if (to > L->end) to = L->end;
      if (to > from) L->src->will_read(L->src, from, to - from);
      L->advised = to;
    }
    const uint8_t *p = L->src->map(L->src, off, len);
    if (p) return p;
  }
  if (off >= L->io_off && off + len <= L->io_off + L->io.len) return L->io.data + (off - L->io_off);
  size_t want = len;
  uint64_t room = L->end - off;
  if (want < ahead) want = ahead;
  if (want > room) want = (size_t)room;
  if (pq_buf_reserve(&L->io, want)) {
    leaf_fail(L, err, LARDER_ENOMEM, "out of memory reading %zu bytes", want);
    return NULL;
  }
  int rc = L->src->read(L->src, off, want, L->io.data);
  if (rc) {
    leaf_fail(L, err, rc, "cannot read %zu bytes at offset %llu: %s", want, (unsigned long long)off,
              larder_strerror(rc));
    L->io.len = 0;
    return NULL;
  }
  L->io_off = off;
  L->io.len = want;
  return L->io.data;
}

/* ------------------------------------------------------------------------ */
/* PLAIN values shared by dictionaries and data pages                        */

/* Decodes n PLAIN values from [*pp, end) and appends them to values (and
 * offsets, for BYTE_ARRAY).  Returns 0 or a negative code with why set. */
static int plain_decode(pq_leaf *L, const uint8_t **pp, const uint8_t *end, int64_t n,
                        pq_buf_t *values, pq_buf_t *offsets, uint64_t *bool_bit, char *why,
                        size_t why_len) {
  const uint8_t *p = *pp;
  size_t avail = (size_t)(end - p);
  if (L->phys == PQ_BOOLEAN) {
    uint64_t bit = bool_bit ? *bool_bit : 0;
    if (bit + (uint64_t)n > (uint64_t)avail * 8) {
      snprintf(why, why_len, "PLAIN: %lld booleans need more than %zu bytes", (long long)n, avail);
      return LARDER_ECORRUPT;
    }
    if (pq_buf_reserve(values, values->len + (size_t)n)) return LARDER_ENOMEM;
    uint8_t *o = values->data + values->len;
    for (int64_t i = 0; i < n; i++, bit++) o[i] = (p[bit >> 3] >> (bit & 7)) & 1;
    values->len += (size_t)n;
    if (bool_bit) *bool_bit = bit;
    else *pp = p + (bit + 7) / 8;
    return 0;
  }
  if (L->phys == PQ_BYTE_ARRAY) {
    if (pq_buf_reserve(offsets, offsets->len + ((size_t)n + 1) * 4)) return LARDER_ENOMEM;
    /* The page's bytes bound the values' bytes, so one reservation is
     * enough for the whole call. */
    if (pq_buf_reserve(values, values->len + avail)) return LARDER_ENOMEM;
    int32_t *off = (int32_t *)(void *)offsets->data;
    size_t k = offsets->len / 4;
    if (k == 0) {
      off[0] = 0;
      k = 1;
    }
    uint8_t *o = values->data;
    size_t vlen = values->len;
    for (int64_t i = 0; i < n; i++) {
      if (end - p < 4) goto short_ba;
      uint32_t len;
      memcpy(&len, p, 4);
      p += 4;
      if (len > (size_t)(end - p)) goto short_ba;
      memcpy(o + vlen, p, len);
      p += len;
      vlen += len;
      if (vlen > INT32_MAX) {
        snprintf(why, why_len, "more than 2 GiB of values in one read of a column");
        return LARDER_ELIMIT;
      }
      off[k++] = (int32_t)vlen;
    }
    values->len = vlen;
    offsets->len = k * 4;
    *pp = p;
    return 0;
  short_ba:
    snprintf(why, why_len, "PLAIN: byte array value runs past the page");
    return LARDER_ECORRUPT;
  }
  uint64_t bytes;
  if (!pq_mul_ok((uint64_t)n, (uint64_t)L->width, &bytes) || bytes > avail) {
    snprintf(why, why_len, "PLAIN: %lld values of %d bytes need more than %zu bytes", (long long)n,
             L->width, avail);
    return LARDER_ECORRUPT;
  }
  if (pq_buf_reserve(values, values->len + (size_t)bytes)) return LARDER_ENOMEM;
  memcpy(values->data + values->len, p, (size_t)bytes);
  values->len += (size_t)bytes;
  *pp = p + bytes;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Pages                                                                     */

/* Decompresses a page whose header claims page_values values. */
static int decompress_into(pq_leaf *L, const uint8_t *src, size_t src_len, size_t dst_len,
                           int64_t page_values, pq_buf_t *dst, pq_error *err) {
  char why[200] = "";
  /* The ceiling first: its message names the setting to change. */
  int rc = charge_page(L, dst_len, page_values, err);
  if (rc) return rc;
  rc = pq_decompress_check(L->cc->codec, src, src_len, dst_len, why, sizeof(why));
  if (rc) return leaf_fail(L, err, rc, "cannot decompress page: %s", why);
  if (pq_buf_reserve(dst, dst_len ? dst_len : 1))
    return leaf_fail(L, err, LARDER_ENOMEM, "out of memory for a %zu-byte page", dst_len);
  rc = pq_decompress(L->codec, L->cc->codec, src, src_len, dst->data, dst_len, why, sizeof(why));
  if (rc) return leaf_fail(L, err, rc, "cannot decompress page: %s", why);
  dst->len = dst_len;
  return 0;
}

static int load_dictionary(pq_leaf *L, const pq_page_header_t *h, const uint8_t *body,
                           pq_error *err) {
  if (L->has_dict) return leaf_fail(L, err, LARDER_ECORRUPT, "second dictionary page");
  if (L->first_page_seen)
    return leaf_fail(L, err, LARDER_ECORRUPT, "dictionary page after data pages");
  if (!h->has_dict || h->num_values < 0)
    return leaf_fail(L, err, LARDER_ECORRUPT, "dictionary page header declares %d values",
                     h->num_values);
  if (h->encoding != PQ_ENC_PLAIN && h->encoding != PQ_ENC_PLAIN_DICTIONARY)
    return leaf_fail(L, err, LARDER_EUNSUPPORTED, "dictionary encoded as %s",
                     pq_encoding_name(h->encoding));
  const uint8_t *data = body;
  size_t len = (size_t)h->compressed_size;
  if (L->cc->codec != PQ_UNCOMPRESSED) {
    int rc =
        decompress_into(L, body, len, (size_t)h->uncompressed_size, h->num_values, &L->page, err);
    if (rc) return rc;
    data = L->page.data;
    len = L->page.len;
  }
  /* The dictionary's dense size is at most its page's size plus four bytes
   * of offset per value, and each value takes at least one page byte or
   * (BYTE_ARRAY) four. */
  uint64_t per = L->phys == PQ_BYTE_ARRAY ? 4 : (uint64_t)(L->width ? L->width : 1);
  if (L->phys == PQ_BOOLEAN) per = 0;
  if (per && (uint64_t)h->num_values > len / per)
    return leaf_fail(L, err, LARDER_ECORRUPT, "dictionary declares %d values but holds %zu bytes",
                     h->num_values, len);
  int rc = charge_page(L, len + (uint64_t)h->num_values * 4 + 4, h->num_values, err);
  if (rc) return rc;
  L->dict_values.len = 0;
  L->dict_offsets.len = 0;
  char why[200] = "";
  const uint8_t *p = data;
  rc = plain_decode(L, &p, data + len, h->num_values, &L->dict_values, &L->dict_offsets, NULL, why,
                    sizeof(why));
  if (rc == LARDER_ENOMEM) return leaf_fail(L, err, rc, "out of memory for the dictionary");
  if (rc) return leaf_fail(L, err, rc, "dictionary: %s", why);
  if (L->phys == PQ_BYTE_ARRAY && L->dict_offsets.len == 0) {
    if (pq_buf_reserve(&L->dict_offsets, 4))
      return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
    memset(L->dict_offsets.data, 0, 4);
    L->dict_offsets.len = 4;
  }
  L->dict_count = h->num_values;
  L->has_dict = 1;
  return 0;
}

/* Decodes num levels at [*pp, end) in `encoding` (v1 pages), or in the
 * length-less RLE form (v2 pages, rle_len >= 0). */
static int decode_levels(pq_leaf *L, int encoding, const uint8_t **pp, const uint8_t *end,
                         int64_t rle_len, int64_t num, uint16_t max, pq_buf_t *out, int *all_max,
                         const char *kind, pq_error *err) {
  const uint8_t *p = *pp;
  int bw = bit_width_of(max);
  if (all_max) *all_max = 0;
  if (pq_buf_reserve(out, (size_t)num * 2 + 2))
    return leaf_fail(L, err, LARDER_ENOMEM, "out of memory for %s levels", kind);
  uint16_t *lv = (uint16_t *)(void *)out->data;
  if (rle_len >= 0 || encoding == PQ_ENC_RLE) {
    size_t len;
    if (rle_len >= 0) {
      len = (size_t)rle_len;
    } else {
      if (end - p < 4)
        return leaf_fail(L, err, LARDER_ECORRUPT, "%s levels: truncated length", kind);
      uint32_t l32;
      memcpy(&l32, p, 4);
      p += 4;
      len = l32;
    }
    if (len > (size_t)(end - p))
      return leaf_fail(L, err, LARDER_ECORRUPT, "%s levels: %zu bytes declared, %zu in the page",
                       kind, len, (size_t)(end - p));
    if (all_max && pq_rle_starts_with_run(p, len, bw, num, max)) {
      /* One run of the maximum level covers the page: nothing to decode. */
      *all_max = 1;
      out->len = 0;
      *pp = p + len;
      return 0;
    }
    pq_rle_t r;
    pq_rle_init(&r, p, len, bw);
    int64_t got = pq_rle_get16(&r, lv, num);
    if (got < 0 && r.over_width)
      return leaf_fail(L, err, LARDER_ECORRUPT, "%s level %u exceeds the maximum %u", kind,
                       r.bad_value, max);
    if (got < 0) return leaf_fail(L, err, LARDER_ECORRUPT, "%s levels: malformed run", kind);
    if (got < num)
      return leaf_fail(L, err, LARDER_ECORRUPT,
                       "%s levels: page has %lld values but only %lld levels", kind, (long long)num,
                       (long long)got);
    p += len;
  } else if (encoding == PQ_ENC_BIT_PACKED) {
    /* The deprecated BIT_PACKED form packs from the most significant bit. */
    uint64_t bits = (uint64_t)num * (uint64_t)bw;
    uint64_t bytes = (bits + 7) / 8;
    if (bytes > (uint64_t)(end - p))
      return leaf_fail(L, err, LARDER_ECORRUPT, "%s levels: bit-packed levels run past the page",
                       kind);
    for (int64_t i = 0; i < num; i++) {
      uint32_t v = 0;
      uint64_t b = (uint64_t)i * (uint64_t)bw;
      for (int k = 0; k < bw; k++, b++) v = (v << 1) | ((p[b >> 3] >> (7 - (b & 7))) & 1);
      lv[i] = (uint16_t)v;
    }
    p += bytes;
  } else {
    return leaf_fail(L, err, LARDER_EUNSUPPORTED, "%s levels encoded as %s", kind,
                     pq_encoding_name(encoding));
  }
  /* Levels can exceed the maximum only when it is not all ones in its bit
   * width; otherwise the bit width itself bounds them. */
  uint16_t m = 0;
  if (max != (1u << bw) - 1)
    for (int64_t i = 0; i < num; i++) m = lv[i] > m ? lv[i] : m;
  if (m > max)
    return leaf_fail(L, err, LARDER_ECORRUPT, "%s level %u exceeds the maximum %u", kind, m, max);
  out->len = (size_t)num * 2;
  *pp = p;
  return 0;
}

/* Prepares the value decoder for the page's values at [p, end). */
static int init_values(pq_leaf *L, const uint8_t *p, const uint8_t *end, pq_error *err) {
  char why[200] = "";
  L->vp = p;
  L->vend = end;
  L->lens_pos = 0;
  int enc = L->encoding;
  int64_t n = L->page_values;
  switch (enc) {
    case PQ_ENC_PLAIN: return 0;
    case PQ_ENC_PLAIN_DICTIONARY:
    case PQ_ENC_RLE_DICTIONARY: {
      if (!L->has_dict)
        return leaf_fail(L, err, LARDER_ECORRUPT, "dictionary-encoded page but no dictionary");
      if (n == 0) return 0;
      if (p >= end) return leaf_fail(L, err, LARDER_ECORRUPT, "dictionary indices missing");
      int bw = p[0];
      if (bw > 32) return leaf_fail(L, err, LARDER_ECORRUPT, "dictionary index width %d", bw);
      pq_rle_init(&L->rle, p + 1, (size_t)(end - p - 1), bw);
      return 0;
    }
    case PQ_ENC_RLE: {
      if (L->phys != PQ_BOOLEAN)
        return leaf_fail(L, err, LARDER_EUNSUPPORTED, "RLE values of type %s",
                         pq_physical_name(L->phys));
      if (end - p < 4) return leaf_fail(L, err, LARDER_ECORRUPT, "RLE booleans: truncated length");
      uint32_t len;
      memcpy(&len, p, 4);
      if (len > (size_t)(end - p - 4))
        return leaf_fail(L, err, LARDER_ECORRUPT, "RLE booleans: length past the page");
      pq_rle_init(&L->rle, p + 4, len, 1);
      return 0;
    }
    case PQ_ENC_DELTA_BINARY_PACKED:
      if (L->phys != PQ_INT32 && L->phys != PQ_INT64)
        return leaf_fail(L, err, LARDER_ECORRUPT, "DELTA_BINARY_PACKED values of type %s",
                         pq_physical_name(L->phys));
      if (L->delta == NULL && (L->delta = malloc(sizeof(*L->delta))) == NULL)
        return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
      if (pq_delta_init(L->delta, p, (size_t)(end - p), L->phys == PQ_INT32 ? 32 : 64, why,
                        sizeof(why)))
        return leaf_fail(L, err, LARDER_ECORRUPT, "%s", why);
      if (L->delta->total < (uint64_t)n)
        return leaf_fail(L, err, LARDER_ECORRUPT,
                         "DELTA_BINARY_PACKED holds %llu values, the page needs %lld",
                         (unsigned long long)L->delta->total, (long long)n);
      return 0;
    case PQ_ENC_DELTA_LENGTH_BYTE_ARRAY:
    case PQ_ENC_DELTA_BYTE_ARRAY: {
      if (L->phys != PQ_BYTE_ARRAY &&
          !(enc == PQ_ENC_DELTA_BYTE_ARRAY && L->phys == PQ_FIXED_LEN_BYTE_ARRAY))
        return leaf_fail(L, err, LARDER_ECORRUPT, "%s values of type %s", pq_encoding_name(enc),
                         pq_physical_name(L->phys));
      if (L->delta == NULL && (L->delta = malloc(sizeof(*L->delta))) == NULL)
        return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
      /* Each list of lengths is decoded whole: its count is bounded by the
       * page's value count, already charged. */
      pq_buf_t *lists[2] = {&L->prefix, &L->lens};
      int first = enc == PQ_ENC_DELTA_BYTE_ARRAY ? 0 : 1;
      const uint8_t *q = p;
      uint64_t count = 0;
      for (int k = first; k < 2; k++) {
        if (pq_delta_init(L->delta, q, (size_t)(end - q), 32, why, sizeof(why)))
          return leaf_fail(L, err, LARDER_ECORRUPT, "%s: %s", pq_encoding_name(enc), why);
        uint64_t total = L->delta->total;
        if (total > (uint64_t)L->page_n || total < (uint64_t)n ||
            (k == 1 && first == 0 && total != count))
          return leaf_fail(L, err, LARDER_ECORRUPT, "%s: %llu lengths for %lld values",
                           pq_encoding_name(enc), (unsigned long long)total, (long long)n);
        count = total;
        if (pq_buf_reserve(lists[k], (size_t)total * 4 + 4))
          return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
        int64_t got = pq_delta_get32(L->delta, (int32_t *)(void *)lists[k]->data, (int64_t)total);
        if (got != (int64_t)total || (q = pq_delta_end(L->delta)) == NULL)
          return leaf_fail(L, err, LARDER_ECORRUPT, "%s: malformed lengths", pq_encoding_name(enc));
        const int32_t *v = (const int32_t *)(void *)lists[k]->data;
        for (uint64_t i = 0; i < total; i++)
          if (v[i] < 0)
            return leaf_fail(L, err, LARDER_ECORRUPT, "%s: negative length", pq_encoding_name(enc));
        lists[k]->len = (size_t)total * 4;
      }
      L->vp = q;
      L->prev.len = 0;
      return 0;
    }
    case PQ_ENC_BYTE_STREAM_SPLIT: {
      if (L->phys == PQ_BOOLEAN || L->phys == PQ_BYTE_ARRAY || L->phys == PQ_INT96)
        return leaf_fail(L, err, LARDER_ECORRUPT, "BYTE_STREAM_SPLIT values of type %s",
                         pq_physical_name(L->phys));
      size_t len = (size_t)(end - p);
      if (len % (size_t)L->width != 0 || len / (size_t)L->width < (uint64_t)n)
        return leaf_fail(L, err, LARDER_ECORRUPT,
                         "BYTE_STREAM_SPLIT: %zu bytes for %lld values of %d bytes", len,
                         (long long)n, L->width);
      L->bss_stride = len / (size_t)L->width;
      return 0;
    }
    default:
      return leaf_fail(L, err, LARDER_EUNSUPPORTED, "values encoded as %s (%d)",
                       pq_encoding_name(enc), enc);
  }
}

/* Loads the next data page.  Returns 1 when one is ready, 0 at the end of
 * the chunk, or a negative code. */
/* With skip_rows > 0, whole data pages whose row count is known from their
 * header (v2 pages; v1 pages of flat columns) and that fit within the rows
 * still to skip are stepped over without being read or decompressed; the
 * rows they held are added to *skipped. */
static int next_page(pq_leaf *L, int64_t skip_rows, int64_t *skipped, pq_error *err) {
  for (;;) {
    if (L->pos >= L->end) return 0;
    /* Read the header, widening the window while it is cut short. */
    size_t window = L->end - L->pos < 65536 ? (size_t)(L->end - L->pos) : 65536;
    pq_page_header_t h;
    int64_t hlen;
    char why[200] = "";
    for (;;) {
      const uint8_t *hp = chunk_bytes(L, L->pos, window, PQ_READAHEAD, err);
      if (hp == NULL) return err ? err->code : LARDER_EIO;
      hlen = pq_page_header_parse(hp, window, &h, why, sizeof(why));
      if (hlen < 0) return leaf_fail(L, err, LARDER_ECORRUPT, "%s", why);
      if (hlen > 0) break;
      if (window >= L->end - L->pos || window >= PQ_MAX_PAGE_HEADER)
        return leaf_fail(L, err, LARDER_ECORRUPT, "page header at byte %llu is cut short",
                         (unsigned long long)L->pos);
      window *= 4;
      if (window > L->end - L->pos) window = (size_t)(L->end - L->pos);
    }
    uint64_t body_off = L->pos + (uint64_t)hlen;
    if ((uint64_t)h.compressed_size > L->end - body_off)
      return leaf_fail(L, err, LARDER_ECORRUPT,
                       "page of %d bytes at byte %llu runs past the column chunk",
                       h.compressed_size, (unsigned long long)L->pos);
    if (skip_rows > *skipped && h.num_values >= 0) {
      int64_t page_rows = -1;
      if (h.type == PQ_PAGE_DATA_V2 && h.has_v2 && h.num_rows >= 0) page_rows = h.num_rows;
      else if (h.type == PQ_PAGE_DATA && h.has_v1 && L->max_rep == 0) page_rows = h.num_values;
      if (page_rows >= 0 && page_rows <= skip_rows - *skipped) {
        L->pos = body_off + (uint64_t)h.compressed_size;
        L->first_page_seen = 1;
        L->entries_seen += h.num_values;
        *skipped += page_rows;
        continue;
      }
    }
    const uint8_t *body = chunk_bytes(L, body_off, (size_t)h.compressed_size, PQ_READAHEAD, err);
    if (body == NULL) return err ? err->code : LARDER_EIO;
    L->pos = body_off + (uint64_t)h.compressed_size;
    if (h.has_crc && L->opts->verify_crc &&
        (h.type == PQ_PAGE_DATA || h.type == PQ_PAGE_DATA_V2 || h.type == PQ_PAGE_DICTIONARY)) {
      uint32_t crc = (uint32_t)crc32(0L, body, (uInt)h.compressed_size);
      if (crc != h.crc)
        return leaf_fail(L, err, LARDER_ECHECKSUM,
                         "page CRC mismatch at byte %llu (stored %08x, computed "
                         "%08x)",
                         (unsigned long long)(body_off - (uint64_t)hlen), h.crc, crc);
    }
    if (h.type == PQ_PAGE_DICTIONARY) {
      int rc = load_dictionary(L, &h, body, err);
      if (rc) return rc;
      continue;
    }
    if (h.type != PQ_PAGE_DATA && h.type != PQ_PAGE_DATA_V2) continue;
    int v2 = h.type == PQ_PAGE_DATA_V2;
    if ((v2 && !h.has_v2) || (!v2 && !h.has_v1) || h.num_values < 0)
      return leaf_fail(L, err, LARDER_ECORRUPT, "data page header is missing or negative");
    L->first_page_seen = 1;
    int64_t num = h.num_values;
    uint64_t level_bytes = (uint64_t)num * 2 * ((L->max_def > 0) + (L->max_rep > 0));
    int rc = charge_page(L, level_bytes, num, err);
    if (rc) return rc;

    const uint8_t *p, *end;
    L->page_all_def = L->max_def == 0;
    if (!v2) {
      if (L->cc->codec == PQ_UNCOMPRESSED) {
        p = body;
        end = body + h.compressed_size;
      } else {
        rc = decompress_into(L, body, (size_t)h.compressed_size, (size_t)h.uncompressed_size, num,
                             &L->page, err);
        if (rc) return rc;
        p = L->page.data;
        end = p + L->page.len;
      }
      if (L->max_rep) {
        rc = decode_levels(L, h.rep_encoding, &p, end, -1, num, L->max_rep, &L->reps, NULL,
                           "repetition", err);
        if (rc) return rc;
      }
      if (L->max_def) {
        rc = decode_levels(L, h.def_encoding, &p, end, -1, num, L->max_def, &L->defs,
                           &L->page_all_def, "definition", err);
        if (rc) return rc;
      }
    } else {
      if (h.rep_length < 0 || h.def_length < 0 ||
          (int64_t)h.rep_length + h.def_length > h.compressed_size ||
          (int64_t)h.rep_length + h.def_length > h.uncompressed_size)
        return leaf_fail(L, err, LARDER_ECORRUPT, "v2 page level lengths %d + %d exceed the page",
                         h.rep_length, h.def_length);
      p = body;
      const uint8_t *lend = body + h.rep_length + h.def_length;
      if (L->max_rep) {
        rc = decode_levels(L, PQ_ENC_RLE, &p, lend, h.rep_length, num, L->max_rep, &L->reps, NULL,
                           "repetition", err);
        if (rc) return rc;
      } else {
        p += h.rep_length;
      }
      if (L->max_def) {
        rc = decode_levels(L, PQ_ENC_RLE, &p, lend, h.def_length, num, L->max_def, &L->defs,
                           &L->page_all_def, "definition", err);
        if (rc) return rc;
      }
      p = lend;
      size_t vlen = (size_t)(h.compressed_size - h.rep_length - h.def_length);
      size_t ulen = (size_t)(h.uncompressed_size - h.rep_length - h.def_length);
      if (h.is_compressed && L->cc->codec != PQ_UNCOMPRESSED && !(vlen == 0 && ulen == 0)) {
        rc = decompress_into(L, p, vlen, ulen, num, &L->page, err);
        if (rc) return rc;
        p = L->page.data;
        end = p + L->page.len;
      } else {
        end = p + vlen;
      }
    }
    int64_t values = num;
    if (L->max_def && !L->page_all_def) {
      const uint16_t *d = (const uint16_t *)(void *)L->defs.data;
      int64_t c = 0;
      for (int64_t i = 0; i < num; i++) c += d[i] == L->max_def;
      values = c;
    }
    uint64_t vbytes =
        L->phys == PQ_BYTE_ARRAY ? (uint64_t)values * 4 : (uint64_t)values * (uint64_t)L->width;
    rc = charge_page(L, vbytes, num, err);
    if (rc) return rc;
    L->page_n = num;
    L->page_pos = 0;
    L->page_values = values;
    L->page_vpos = 0;
    L->encoding = h.encoding;
    rc = init_values(L, p, end, err);
    if (rc) return rc;
    L->in_page = 1;
    return 1;
  }
}

/* ------------------------------------------------------------------------ */
/* Values                                                                    */

/* Appends dictionary entries idx[0..n) to the dense output. */
/* Fails unless every one of the n indices is in the page's dictionary. */
static int dict_check(pq_leaf *L, const uint32_t *idx, int64_t n, pq_error *err) {
  uint32_t max = 0;
  for (int64_t i = 0; i < n; i++) max = idx[i] > max ? idx[i] : max;
  if (n > 0 && (int64_t)max >= L->dict_count)
    return leaf_fail(L, err, LARDER_ECORRUPT,
                     "dictionary index %u out of range (dictionary has %lld entries)", max,
                     (long long)L->dict_count);
  return 0;
}

static int dict_gather(pq_leaf *L, const uint32_t *idx, int64_t n, pq_buf_t *values,
                       pq_buf_t *offsets, pq_error *err) {
  int crc = dict_check(L, idx, n, err);
  if (crc) return crc;
  if (L->phys == PQ_BYTE_ARRAY) {
    const int32_t *doff = (const int32_t *)(void *)L->dict_offsets.data;
    const uint8_t *dv = L->dict_values.data;
    uint64_t bytes = 0;
    for (int64_t i = 0; i < n; i++) bytes += (uint64_t)(doff[idx[i] + 1] - doff[idx[i]]);
    if (values->len + bytes > INT32_MAX)
      return leaf_fail(L, err, LARDER_ELIMIT, "more than 2 GiB of values in one read of a column");
    int rc = charge(L, bytes, err);
    if (rc) return rc;
    if (pq_buf_reserve(values, values->len + (size_t)bytes) ||
        pq_buf_reserve(offsets, offsets->len + ((size_t)n + 1) * 4))
      return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
    int32_t *off = (int32_t *)(void *)offsets->data;
    size_t k = offsets->len / 4;
    if (k == 0) off[k++] = 0;
    uint8_t *o = values->data;
    size_t vlen = values->len;
    for (int64_t i = 0; i < n; i++) {
      int32_t a = doff[idx[i]], len = doff[idx[i] + 1] - a;
      memcpy(o + vlen, dv + a, (size_t)len);
      vlen += (size_t)len;
      off[k++] = (int32_t)vlen;
    }
    values->len = vlen;
    offsets->len = k * 4;
    return 0;
  }
  size_t w = (size_t)L->width;
  if (pq_buf_reserve(values, values->len + (size_t)n * w))
    return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
  uint8_t *o = values->data + values->len;
  const uint8_t *dv = L->dict_values.data;
  if (w == 4) {
    const uint32_t *d = (const uint32_t *)(const void *)dv;
    uint32_t *o4 = (uint32_t *)(void *)o;
    for (int64_t i = 0; i < n; i++) o4[i] = d[idx[i]];
  } else if (w == 8) {
    const uint64_t *d = (const uint64_t *)(const void *)dv;
    uint64_t *o8 = (uint64_t *)(void *)o;
    for (int64_t i = 0; i < n; i++) o8[i] = d[idx[i]];
  } else {
    for (int64_t i = 0; i < n; i++) memcpy(o + (size_t)i * w, dv + (size_t)idx[i] * w, w);
  }
  values->len += (size_t)n * w;
  return 0;
}

/*
 * BYTE_STREAM_SPLIT for 4- and 8-byte values: byte k of value i sits at
 * stream k, position i.  Interleaving sixteen values at a time with SSE2
 * unpacks (baseline on x86-64) is several times faster than a byte loop.
 */
static void bss_decode(const uint8_t *base, size_t stride, size_t w, uint8_t *o, int64_t n) {
  int64_t i = 0;
#if defined(__SSE2__)
  if (w == 4) {
    const uint8_t *s0 = base, *s1 = base + stride, *s2 = base + 2 * stride, *s3 = base + 3 * stride;
    for (; i + 16 <= n; i += 16) {
      __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(s0 + i));
      __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s1 + i));
      __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s2 + i));
      __m128i d = _mm_loadu_si128((const __m128i *)(const void *)(s3 + i));
      __m128i ab_lo = _mm_unpacklo_epi8(a, b), ab_hi = _mm_unpackhi_epi8(a, b);
      __m128i cd_lo = _mm_unpacklo_epi8(c, d), cd_hi = _mm_unpackhi_epi8(c, d);
      uint8_t *q = o + 4 * i;
      _mm_storeu_si128((__m128i *)(void *)q, _mm_unpacklo_epi16(ab_lo, cd_lo));
      _mm_storeu_si128((__m128i *)(void *)(q + 16), _mm_unpackhi_epi16(ab_lo, cd_lo));
      _mm_storeu_si128((__m128i *)(void *)(q + 32), _mm_unpacklo_epi16(ab_hi, cd_hi));
      _mm_storeu_si128((__m128i *)(void *)(q + 48), _mm_unpackhi_epi16(ab_hi, cd_hi));
    }
  } else {
    const uint8_t *s[8];
    for (int k = 0; k < 8; k++) s[k] = base + (size_t)k * stride;
    for (; i + 16 <= n; i += 16) {
      __m128i v[8];
      for (int k = 0; k < 8; k++) v[k] = _mm_loadu_si128((const __m128i *)(const void *)(s[k] + i));
      __m128i p01l = _mm_unpacklo_epi8(v[0], v[1]), p01h = _mm_unpackhi_epi8(v[0], v[1]);
      __m128i p23l = _mm_unpacklo_epi8(v[2], v[3]), p23h = _mm_unpackhi_epi8(v[2], v[3]);
      __m128i p45l = _mm_unpacklo_epi8(v[4], v[5]), p45h = _mm_unpackhi_epi8(v[4], v[5]);
      __m128i p67l = _mm_unpacklo_epi8(v[6], v[7]), p67h = _mm_unpackhi_epi8(v[6], v[7]);
      /* q[j] holds bytes 0-3 (lo) or 4-7 (hi) of values 4j .. 4j+3. */
      __m128i lo[4] = {_mm_unpacklo_epi16(p01l, p23l), _mm_unpackhi_epi16(p01l, p23l),
                       _mm_unpacklo_epi16(p01h, p23h), _mm_unpackhi_epi16(p01h, p23h)};
      __m128i hi[4] = {_mm_unpacklo_epi16(p45l, p67l), _mm_unpackhi_epi16(p45l, p67l),
                       _mm_unpacklo_epi16(p45h, p67h), _mm_unpackhi_epi16(p45h, p67h)};
      uint8_t *q = o + 8 * i;
      for (int j = 0; j < 4; j++) {
        _mm_storeu_si128((__m128i *)(void *)(q + 32 * j), _mm_unpacklo_epi32(lo[j], hi[j]));
        _mm_storeu_si128((__m128i *)(void *)(q + 32 * j + 16), _mm_unpackhi_epi32(lo[j], hi[j]));
      }
    }
  }
#endif
  for (; i < n; i++)
    for (size_t b = 0; b < w; b++) o[(size_t)i * w + b] = base[b * stride + (size_t)i];
}

/* Decodes the page's next n values onto values/offsets (one switch over
 * the encodings, each case short: split up, every piece would take the
 * same six arguments).  skipping: the
 * values are dropped, so a dictionary-encoded page only checks its indices
 * and gathers nothing, and nothing is charged to max_chunk_decoded_bytes:
 * otherwise a unit that starts deep in a row group of large dictionary
 * values (one 3 MB string repeated 800 times: 2.8 KB on disk, 2.4 GB
 * decoded) would fail at the ceiling, or take that much scratch memory,
 * for rows it does not keep. */
static int decode_values(pq_leaf *L, int64_t n, pq_buf_t *values, pq_buf_t *offsets, int skipping,
                         pq_error *err) {
  if (n == 0) return 0;
  if (n > L->page_values - L->page_vpos)
    return leaf_fail(L, err, LARDER_ECORRUPT, "page has fewer values than its levels");
  char why[200] = "";
  int rc = 0;
  switch (L->encoding) {
    case PQ_ENC_PLAIN: {
      if (L->phys == PQ_BOOLEAN) {
        /* Booleans are bit-packed: the cursor is the value index, and vp
         * stays at the page's first value byte. */
        uint64_t bit = (uint64_t)L->page_vpos;
        const uint8_t *start = L->vp;
        rc = plain_decode(L, &start, L->vend, n, values, offsets, &bit, why, sizeof(why));
      } else {
        rc = plain_decode(L, &L->vp, L->vend, n, values, offsets, NULL, why, sizeof(why));
      }
      if (rc == LARDER_ENOMEM) return leaf_fail(L, err, rc, "out of memory");
      if (rc) return leaf_fail(L, err, rc, "%s", why);
      break;
    }
    case PQ_ENC_PLAIN_DICTIONARY:
    case PQ_ENC_RLE_DICTIONARY: {
      uint32_t idx[PQ_INDEX_BLOCK];
      for (int64_t done = 0; done < n;) {
        int64_t m = n - done < PQ_INDEX_BLOCK ? n - done : PQ_INDEX_BLOCK;
        int64_t got = pq_rle_get32(&L->rle, idx, m);
        if (got != m)
          return leaf_fail(
              L, err, LARDER_ECORRUPT, "dictionary indices end after %lld of %lld values",
              (long long)L->page_vpos + (long long)done + (long long)(got > 0 ? got : 0),
              (long long)L->page_values);
        rc = skipping ? dict_check(L, idx, m, err) : dict_gather(L, idx, m, values, offsets, err);
        if (rc) return rc;
        done += m;
      }
      break;
    }
    case PQ_ENC_RLE: {
      uint32_t tmp[PQ_INDEX_BLOCK];
      if (pq_buf_reserve(values, values->len + (size_t)n))
        return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
      for (int64_t done = 0; done < n;) {
        int64_t m = n - done < PQ_INDEX_BLOCK ? n - done : PQ_INDEX_BLOCK;
        if (pq_rle_get32(&L->rle, tmp, m) != m)
          return leaf_fail(L, err, LARDER_ECORRUPT, "RLE booleans end early");
        for (int64_t i = 0; i < m; i++)
          values->data[values->len + (size_t)i] = (uint8_t)(tmp[i] & 1);
        values->len += (size_t)m;
        done += m;
      }
      break;
    }
    case PQ_ENC_DELTA_BINARY_PACKED: {
      size_t w = L->phys == PQ_INT32 ? 4 : 8;
      if (pq_buf_reserve(values, values->len + (size_t)n * w))
        return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
      void *o = values->data + values->len;
      int64_t got = w == 4 ? pq_delta_get32(L->delta, o, n) : pq_delta_get64(L->delta, o, n);
      if (got != n)
        return leaf_fail(L, err, LARDER_ECORRUPT, "DELTA_BINARY_PACKED data is malformed or short");
      values->len += (size_t)n * w;
      break;
    }
    case PQ_ENC_DELTA_LENGTH_BYTE_ARRAY: {
      const int32_t *lens = (const int32_t *)(void *)L->lens.data + L->lens_pos;
      uint64_t bytes = 0;
      for (int64_t i = 0; i < n; i++) bytes += (uint64_t)lens[i];
      if (bytes > (uint64_t)(L->vend - L->vp))
        return leaf_fail(L, err, LARDER_ECORRUPT,
                         "DELTA_LENGTH_BYTE_ARRAY lengths exceed the page");
      if (values->len + bytes > INT32_MAX)
        return leaf_fail(L, err, LARDER_ELIMIT,
                         "more than 2 GiB of values in one read of a column");
      if (pq_buf_reserve(values, values->len + (size_t)bytes) ||
          pq_buf_reserve(offsets, offsets->len + ((size_t)n + 1) * 4))
        return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
      int32_t *off = (int32_t *)(void *)offsets->data;
      size_t k = offsets->len / 4;
      if (k == 0) off[k++] = 0;
      memcpy(values->data + values->len, L->vp, (size_t)bytes);
      int32_t cur = (int32_t)values->len;
      for (int64_t i = 0; i < n; i++) {
        cur += lens[i];
        off[k++] = cur;
      }
      L->vp += bytes;
      values->len += (size_t)bytes;
      offsets->len = k * 4;
      L->lens_pos += n;
      break;
    }
    case PQ_ENC_DELTA_BYTE_ARRAY: {
      const int32_t *pre = (const int32_t *)(void *)L->prefix.data + L->lens_pos;
      const int32_t *suf = (const int32_t *)(void *)L->lens.data + L->lens_pos;
      int fixed = L->phys == PQ_FIXED_LEN_BYTE_ARRAY;
      if (!fixed && pq_buf_reserve(offsets, offsets->len + ((size_t)n + 1) * 4))
        return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
      int32_t *off = (int32_t *)(void *)offsets->data;
      size_t k = offsets->len / 4;
      if (!fixed && k == 0) off[k++] = 0;
      for (int64_t i = 0; i < n; i++) {
        size_t plen = (size_t)pre[i], slen = (size_t)suf[i];
        if (plen > L->prev.len)
          return leaf_fail(L, err, LARDER_ECORRUPT,
                           "DELTA_BYTE_ARRAY prefix %zu longer than the previous value", plen);
        if (slen > (size_t)(L->vend - L->vp))
          return leaf_fail(L, err, LARDER_ECORRUPT, "DELTA_BYTE_ARRAY suffix runs past the page");
        size_t len = plen + slen;
        if (fixed && len != (size_t)L->width)
          return leaf_fail(L, err, LARDER_ECORRUPT,
                           "DELTA_BYTE_ARRAY value of %zu bytes in a %d-byte column", len,
                           L->width);
        rc = charge(L, len, err);
        if (rc) return rc;
        if (values->len + len > INT32_MAX)
          return leaf_fail(L, err, LARDER_ELIMIT,
                           "more than 2 GiB of values in one read of a column");
        if (pq_buf_reserve(values, values->len + len) || pq_buf_reserve(&L->prev, len))
          return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
        uint8_t *o = values->data + values->len;
        memcpy(o, L->prev.data, plen);
        memcpy(o + plen, L->vp, slen);
        memcpy(L->prev.data, o, len);
        L->prev.len = len;
        L->vp += slen;
        values->len += len;
        if (!fixed) off[k++] = (int32_t)values->len;
      }
      if (!fixed) offsets->len = k * 4;
      L->lens_pos += n;
      break;
    }
    case PQ_ENC_BYTE_STREAM_SPLIT: {
      size_t w = (size_t)L->width;
      if (pq_buf_reserve(values, values->len + (size_t)n * w))
        return leaf_fail(L, err, LARDER_ENOMEM, "out of memory");
      uint8_t *o = values->data + values->len;
      const uint8_t *base = L->vp + L->page_vpos;
      size_t stride = (size_t)L->bss_stride;
      if (w == 4 || w == 8) {
        bss_decode(base, stride, w, o, n);
      } else {
        for (size_t b = 0; b < w; b++) {
          const uint8_t *s = base + b * stride;
          for (int64_t i = 0; i < n; i++) o[(size_t)i * w + b] = s[i];
        }
      }
      values->len += (size_t)n * w;
      break;
    }
    default: return leaf_fail(L, err, LARDER_EUNSUPPORTED, "values encoded as %d", L->encoding);
  }
  L->page_vpos += n;
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Records                                                                   */

static int append_levels(pq_leaf *L, int64_t from, int64_t count, pq_error *err) {
  size_t need = ((size_t)L->out_n + (size_t)count) * 2;
  if (L->max_def && (!L->page_all_def || !L->out_def_virtual)) {
    if (pq_buf_reserve(&L->out_def, need))
      return leaf_fail(L, err, LARDER_ENOMEM, "out of memory for levels");
    uint16_t *d = (uint16_t *)(void *)L->out_def.data;
    if (L->out_def_virtual) {
      /* The first page with real levels: write out the maximum level for
       * the entries that were only counted so far. */
      for (int64_t i = 0; i < L->out_n; i++) d[i] = L->max_def;
      L->out_def_virtual = 0;
    }
    if (L->page_all_def) {
      for (int64_t i = 0; i < count; i++) d[L->out_n + i] = L->max_def;
    } else {
      memcpy(d + L->out_n, L->defs.data + (size_t)from * 2, (size_t)count * 2);
    }
  }
  if (L->max_rep) {
    if (pq_buf_reserve(&L->out_rep, need))
      return leaf_fail(L, err, LARDER_ENOMEM, "out of memory for levels");
    memcpy(L->out_rep.data + (size_t)L->out_n * 2, L->reps.data + (size_t)from * 2,
           (size_t)count * 2);
  }
  L->out_n += count;
  return 0;
}

/* Consumes up to `rows` records: reading them (levels kept, values appended
 * to values/offsets) or, with skipping, stepping over them (values decoded
 * into scratch and dropped, whole pages skipped unread where possible). */
static int64_t leaf_consume(pq_leaf *L, int64_t rows, pq_buf_t *values, pq_buf_t *offsets,
                            int skipping, pq_error *err) {
  int64_t records = 0;
  for (;;) {
    if (L->max_rep == 0 && records == rows) break;
    if (!L->in_page || L->page_pos == L->page_n) {
      L->in_page = 0;
      int64_t skipped = 0;
      int rc = next_page(L, skipping ? rows - records : 0, &skipped, err);
      records += skipped;
      if (rc < 0) return rc;
      if (rc == 0) break;
      if (L->max_rep == 0 && records == rows) {
        /* The skip ended exactly at this page's start; keep it for later. */
        L->page_pos = 0;
        break;
      }
      if (L->page_n == 0) continue;
    }
    int64_t avail = L->page_n - L->page_pos;
    int64_t take;
    int done = 0;
    if (L->max_rep == 0) {
      take = rows - records < avail ? rows - records : avail;
      records += take;
    } else {
      const uint16_t *rep = (const uint16_t *)(void *)L->reps.data;
      int64_t i = L->page_pos;
      if (L->entries_seen == 0 && rep[i] != 0)
        return leaf_fail(L, err, LARDER_ECORRUPT, "repetition levels start with %u instead of 0",
                         rep[i]);
      /* Count the records that start in the rest of the page with a loop the
       * compiler vectorises; only the page where the batch ends needs the
       * entry-by-entry search for its cut. */
      int64_t starts = 0;
      for (int64_t j = i; j < L->page_n; j++) starts += rep[j] == 0;
      if (records + starts <= rows) {
        records += starts;
        i = L->page_n;
      }
      for (; i < L->page_n; i++) {
        if (rep[i] == 0) {
          if (records == rows) {
            done = 1;
            break;
          }
          records++;
        }
      }
      take = i - L->page_pos;
    }
    if (take > 0) {
      int64_t nn = take;
      if (L->max_def && !L->page_all_def) {
        const uint16_t *d = (const uint16_t *)(void *)L->defs.data + L->page_pos;
        int64_t c = 0;
        for (int64_t i = 0; i < take; i++) c += d[i] == L->max_def;
        nn = c;
      }
      if (skipping) {
        values->len = 0;
        offsets->len = 0;
      } else if (L->max_def || L->max_rep) {
        int rc = append_levels(L, L->page_pos, take, err);
        if (rc) return rc;
      } else {
        L->out_n += take;
      }
      int rc = decode_values(L, nn, values, offsets, skipping, err);
      if (rc) return rc;
      if (!skipping) L->out_values += nn;
      L->page_pos += take;
      L->entries_seen += take;
    }
    if (done) break;
  }
  return records;
}

int64_t pq_leaf_read(pq_leaf *L, int64_t rows, pq_buf_t *values, pq_buf_t *offsets, pq_error *err) {
  L->out_n = 0;
  L->out_values = 0;
  L->out_def_virtual = 1;
  return leaf_consume(L, rows, values, offsets, 0, err);
}

int64_t pq_leaf_skip(pq_leaf *L, int64_t rows, pq_error *err) {
  int64_t n = leaf_consume(L, rows, &L->skip_values, &L->skip_offsets, 1, err);
  L->skip_values.len = L->skip_offsets.len = 0;
  return n;
}
