/*
 * pq_thrift.c: a bounded reader for Thrift's compact protocol, enough to
 * parse Parquet's FileMetaData and PageHeader.
 *
 * Every read is checked against the end of the input, nesting is limited,
 * and list sizes are bounded by the bytes that remain, so hostile input can
 * neither run past its buffer nor make the caller allocate more than a
 * small multiple of the input's size.  Unknown fields are skipped, as
 * Thrift requires, so files from newer writers still parse.
 */
#include <stdio.h>
#include <string.h>

#include "parquet/pq_internal.h"

/* Deep enough for any real Parquet metadata (whose structs nest a few
 * levels), shallow enough that recursion in pq_thrift_skip stays cheap. */
#define PQ_THRIFT_MAX_DEPTH 64

void pq_thrift_init(pq_thrift_t *t, const uint8_t *p, size_t len) {
  memset(t, 0, sizeof(*t));
  t->p = p;
  t->end = p + len;
}

void pq_thrift_fail(pq_thrift_t *t, const char *why) {
  if (t->failed) return;
  t->failed = 1;
  snprintf(t->why, sizeof(t->why), "%s", why);
  /* Park the cursor at the end so that every later read fails fast. */
  t->p = t->end;
}

static void fail_truncated(pq_thrift_t *t) {
  if (t->failed) return;
  pq_thrift_fail(t, "metadata ends in the middle of a value");
  t->truncated = 1;
}

static uint64_t read_varint(pq_thrift_t *t) {
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (t->p >= t->end) {
      fail_truncated(t);
      return 0;
    }
    uint8_t b = *t->p++;
    if (shift == 63 && (b & 0x7e) != 0) {
      pq_thrift_fail(t, "varint overflows 64 bits");
      return 0;
    }
    v |= (uint64_t)(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return v;
  }
  pq_thrift_fail(t, "varint longer than 10 bytes");
  return 0;
}

static int64_t zigzag(uint64_t v) { return (int64_t)(v >> 1) ^ -(int64_t)(v & 1); }

void pq_thrift_struct_begin(pq_thrift_t *t, int16_t *last_id) {
  *last_id = 0;
  if (++t->depth > PQ_THRIFT_MAX_DEPTH) pq_thrift_fail(t, "nesting too deep");
}

void pq_thrift_struct_end(pq_thrift_t *t) { t->depth--; }

int pq_thrift_field(pq_thrift_t *t, int16_t *last_id, int16_t *id, int *type) {
  if (t->failed) return 0;
  if (t->p >= t->end) {
    fail_truncated(t);
    return 0;
  }
  uint8_t b = *t->p++;
  *type = b & 0x0f;
  if (*type == PQ_TT_STOP) return 0;
  int delta = b >> 4;
  if (delta != 0) {
    *id = (int16_t)(*last_id + delta);
  } else {
    int64_t v = zigzag(read_varint(t));
    if (v < INT16_MIN || v > INT16_MAX) {
      pq_thrift_fail(t, "field id out of range");
      return 0;
    }
    *id = (int16_t)v;
  }
  if (*type > PQ_TT_STRUCT) {
    pq_thrift_fail(t, "unknown field type");
    return 0;
  }
  *last_id = *id;
  return !t->failed;
}

int64_t pq_thrift_int(pq_thrift_t *t, int type) {
  switch (type) {
    case PQ_TT_BYTE:
      if (t->p >= t->end) {
        fail_truncated(t);
        return 0;
      }
      return (int8_t)*t->p++;
    case PQ_TT_I16:
    case PQ_TT_I32:
    case PQ_TT_I64: return zigzag(read_varint(t));
    default:
      pq_thrift_skip(t, type);
      pq_thrift_fail(t, "expected an integer field");
      return 0;
  }
}

int pq_thrift_bool(int type) { return type == PQ_TT_TRUE; }

const uint8_t *pq_thrift_binary(pq_thrift_t *t, int type, size_t *len) {
  *len = 0;
  if (type != PQ_TT_BINARY) {
    pq_thrift_skip(t, type);
    pq_thrift_fail(t, "expected a binary field");
    return NULL;
  }
  uint64_t n = read_varint(t);
  if (t->failed) return NULL;
  if (n > (uint64_t)(t->end - t->p)) {
    fail_truncated(t);
    return NULL;
  }
  const uint8_t *p = t->p;
  t->p += n;
  *len = (size_t)n;
  return p;
}

int64_t pq_thrift_list(pq_thrift_t *t, int type, int *elem_type) {
  *elem_type = PQ_TT_STOP;
  if (type != PQ_TT_LIST && type != PQ_TT_SET) {
    pq_thrift_skip(t, type);
    pq_thrift_fail(t, "expected a list field");
    return 0;
  }
  if (t->p >= t->end) {
    fail_truncated(t);
    return 0;
  }
  uint8_t b = *t->p++;
  uint64_t n = b >> 4;
  *elem_type = b & 0x0f;
  if (n == 15) n = read_varint(t);
  if (t->failed) return 0;
  /* Booleans in lists take one byte each, like every other element type, so
   * the bytes left bound the element count. */
  if (n > (uint64_t)(t->end - t->p)) {
    fail_truncated(t);
    return 0;
  }
  if (n > 0 && (*elem_type == PQ_TT_STOP || *elem_type > PQ_TT_STRUCT)) {
    pq_thrift_fail(t, "unknown list element type");
    return 0;
  }
  return (int64_t)n;
}

int pq_thrift_list_bool(pq_thrift_t *t) {
  if (t->p >= t->end) {
    fail_truncated(t);
    return 0;
  }
  return *t->p++ == 1;
}

void pq_thrift_skip(pq_thrift_t *t, int type) {
  if (t->failed) return;
  switch (type) {
    case PQ_TT_TRUE:
    case PQ_TT_FALSE: return;
    case PQ_TT_BYTE:
      if (t->p >= t->end) fail_truncated(t);
      else t->p++;
      return;
    case PQ_TT_I16:
    case PQ_TT_I32:
    case PQ_TT_I64: (void)read_varint(t); return;
    case PQ_TT_DOUBLE:
      if (t->end - t->p < 8) fail_truncated(t);
      else t->p += 8;
      return;
    case PQ_TT_BINARY: {
      size_t len;
      (void)pq_thrift_binary(t, type, &len);
      return;
    }
    case PQ_TT_LIST:
    case PQ_TT_SET: {
      int et;
      int64_t n = pq_thrift_list(t, type, &et);
      if (++t->depth > PQ_THRIFT_MAX_DEPTH) pq_thrift_fail(t, "nesting too deep");
      for (int64_t i = 0; i < n && !t->failed; i++) {
        if (et == PQ_TT_TRUE || et == PQ_TT_FALSE) (void)pq_thrift_list_bool(t);
        else pq_thrift_skip(t, et);
      }
      t->depth--;
      return;
    }
    case PQ_TT_MAP: {
      uint64_t n = read_varint(t);
      if (t->failed || n == 0) return;
      if (n > (uint64_t)(t->end - t->p)) {
        fail_truncated(t);
        return;
      }
      if (t->p >= t->end) {
        fail_truncated(t);
        return;
      }
      uint8_t kv = *t->p++;
      int kt = kv >> 4, vt = kv & 0x0f;
      if (++t->depth > PQ_THRIFT_MAX_DEPTH) pq_thrift_fail(t, "nesting too deep");
      for (uint64_t i = 0; i < n && !t->failed; i++) {
        if (kt == PQ_TT_TRUE || kt == PQ_TT_FALSE) (void)pq_thrift_list_bool(t);
        else pq_thrift_skip(t, kt);
        if (vt == PQ_TT_TRUE || vt == PQ_TT_FALSE) (void)pq_thrift_list_bool(t);
        else pq_thrift_skip(t, vt);
      }
      t->depth--;
      return;
    }
    case PQ_TT_STRUCT: {
      int16_t last, id;
      int ft;
      pq_thrift_struct_begin(t, &last);
      while (pq_thrift_field(t, &last, &id, &ft)) pq_thrift_skip(t, ft);
      pq_thrift_struct_end(t);
      return;
    }
    default: pq_thrift_fail(t, "unknown field type"); return;
  }
}
