/*
 * pq_json.c: renders decoded rows as JSON objects, in the format of
 * `larderctl cat` (daemon/parquet/README.md, "larderctl inspect and cat"): exact integers and decimals,
 * shortest round-trip floats, ISO-8601 dates and times, base64 for binary,
 * and arrays / objects for lists, structs and maps.
 *
 * This is the format people read to check their data and that the tests
 * compare against independent readers, so it favours exactness over speed.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/pq_internal.h"

void pq_strbuf_free(pq_strbuf_t *sb) {
  free(sb->data);
  sb->data = NULL;
  sb->len = sb->cap = 0;
}

static int sb_reserve(pq_strbuf_t *sb, size_t extra) {
  if (sb->len + extra + 1 <= sb->cap) return 0;
  size_t cap = sb->cap ? sb->cap : 256;
  while (cap < sb->len + extra + 1) cap *= 2;
  char *p = realloc(sb->data, cap);
  if (p == NULL) return LARDER_ENOMEM;
  sb->data = p;
  sb->cap = cap;
  return 0;
}

int pq_strbuf_append(pq_strbuf_t *sb, const char *s, size_t n) {
  if (sb_reserve(sb, n)) return LARDER_ENOMEM;
  memcpy(sb->data + sb->len, s, n);
  sb->len += n;
  sb->data[sb->len] = '\0';
  return 0;
}

int pq_strbuf_puts(pq_strbuf_t *sb, const char *s) { return pq_strbuf_append(sb, s, strlen(s)); }

int pq_strbuf_printf(pq_strbuf_t *sb, const char *fmt, ...) {
  char buf[128];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  if (n < 0) return LARDER_EINVAL;
  if ((size_t)n < sizeof(buf)) return pq_strbuf_append(sb, buf, (size_t)n);
  if (sb_reserve(sb, (size_t)n)) return LARDER_ENOMEM;
  va_start(ap, fmt);
  vsnprintf(sb->data + sb->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  sb->len += (size_t)n;
  return 0;
}

/* JSON string escaping; invalid UTF-8 becomes U+FFFD so the output is
 * always valid JSON text. */
int pq_json_append_string(pq_strbuf_t *sb, const uint8_t *s, size_t n) {
  if (sb_reserve(sb, n + 2)) return LARDER_ENOMEM;
  sb->data[sb->len++] = '"';
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      size_t j = i;
      while (j < n && s[j] >= 0x20 && s[j] < 0x80 && s[j] != '"' && s[j] != '\\') j++;
      if (pq_strbuf_append(sb, (const char *)s + i, j - i)) return LARDER_ENOMEM;
      i = j;
      continue;
    }
    if (c < 0x80) {
      int rc;
      switch (c) {
        case '"': rc = pq_strbuf_puts(sb, "\\\""); break;
        case '\\': rc = pq_strbuf_puts(sb, "\\\\"); break;
        case '\n': rc = pq_strbuf_puts(sb, "\\n"); break;
        case '\r': rc = pq_strbuf_puts(sb, "\\r"); break;
        case '\t': rc = pq_strbuf_puts(sb, "\\t"); break;
        case '\b': rc = pq_strbuf_puts(sb, "\\b"); break;
        case '\f': rc = pq_strbuf_puts(sb, "\\f"); break;
        default: rc = pq_strbuf_printf(sb, "\\u%04x", c); break;
      }
      if (rc) return rc;
      i++;
      continue;
    }
    /* Validate one UTF-8 sequence. */
    size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
    int ok = len > 0 && c < 0xf5 && c != 0xc0 && c != 0xc1 && i + len <= n;
    for (size_t k = 1; ok && k < len; k++) ok = (s[i + k] & 0xc0) == 0x80;
    if (ok && len == 3) {
      uint32_t cp = ((uint32_t)(c & 0x0f) << 12) | ((uint32_t)(s[i + 1] & 0x3f) << 6);
      ok = cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff);
    }
    if (ok && len == 4) {
      uint32_t cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[i + 1] & 0x3f) << 12);
      ok = cp >= 0x10000 && cp <= 0x10ffff;
    }
    if (ok) {
      if (pq_strbuf_append(sb, (const char *)s + i, len)) return LARDER_ENOMEM;
      i += len;
    } else {
      if (pq_strbuf_puts(sb, "\xef\xbf\xbd")) return LARDER_ENOMEM;
      i++;
    }
  }
  return pq_strbuf_append(sb, "\"", 1);
}

static int put_base64(pq_strbuf_t *sb, const uint8_t *s, size_t n) {
  static const char tbl[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  if (sb_reserve(sb, (n + 2) / 3 * 4 + 2)) return LARDER_ENOMEM;
  char *o = sb->data + sb->len;
  *o++ = '"';
  size_t i = 0;
  for (; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
    *o++ = tbl[v >> 18];
    *o++ = tbl[(v >> 12) & 63];
    *o++ = tbl[(v >> 6) & 63];
    *o++ = tbl[v & 63];
  }
  if (i < n) {
    uint32_t v = (uint32_t)s[i] << 16 | (i + 1 < n ? (uint32_t)s[i + 1] << 8 : 0);
    *o++ = tbl[v >> 18];
    *o++ = tbl[(v >> 12) & 63];
    *o++ = i + 1 < n ? tbl[(v >> 6) & 63] : '=';
    *o++ = '=';
  }
  *o++ = '"';
  sb->len = (size_t)(o - sb->data);
  sb->data[sb->len] = '\0';
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Numbers                                                                   */

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {
      /* Subnormal: normalise the mantissa. */
      int e = -1;
      do {
        e++;
        mant <<= 1;
      } while ((mant & 0x400) == 0);
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (mant & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Rounds a double to the nearest half (ties to even) and back, to test
 * whether a printed value round-trips through FLOAT16. */
static double round_to_half(double v) {
  if (v == 0 || isnan(v) || isinf(v)) return v;
  double a = fabs(v);
  if (a >= 65520.0) return v > 0 ? INFINITY : -INFINITY;
  int e;
  frexp(a, &e);               /* a = m * 2^e, 0.5 <= m < 1 */
  int exp2 = e - 1;           /* a = 1.x * 2^exp2 */
  if (exp2 < -14) exp2 = -14; /* subnormals share the smallest exponent */
  double quantum = ldexp(1.0, exp2 - 10);
  double r = nearbyint(a / quantum) * quantum;
  return v < 0 ? -r : r;
}

static int put_special(pq_strbuf_t *sb, double v) {
  if (isnan(v)) return pq_strbuf_puts(sb, "\"NaN\"");
  return pq_strbuf_puts(sb, v > 0 ? "\"Infinity\"" : "\"-Infinity\"");
}

/* Prints the shortest decimal that reads back as the same value of the
 * given kind (8: double, 4: float, 2: half).  Round-tripping is monotonic
 * in the number of digits, so a binary search finds the shortest. */
static int put_float(pq_strbuf_t *sb, double v, int kind) {
  if (isnan(v) || isinf(v)) return put_special(sb, v);
  int lo = 1, hi = kind == 8 ? 17 : kind == 4 ? 9 : 5;
  char buf[64];
  while (lo < hi) {
    int mid = (lo + hi) / 2;
    if (snprintf(buf, sizeof(buf), "%.*g", mid, v) >= (int)sizeof(buf)) return LARDER_EINVAL;
    int ok;
    if (kind == 8) ok = strtod(buf, NULL) == v;
    else if (kind == 4) ok = strtof(buf, NULL) == (float)v;
    else ok = round_to_half(strtod(buf, NULL)) == v;
    if (ok) hi = mid;
    else lo = mid + 1;
  }
  if (snprintf(buf, sizeof(buf), "%.*g", lo, v) >= (int)sizeof(buf)) return LARDER_EINVAL;
  /* %g writes large whole numbers in exponent form ("1e+02"); below 1e21
   * print the same shortest digits in plain notation, padded with zeros
   * ("100"), as JavaScript does.  The text reads back as the same value. */
  const char *e = strchr(buf, 'e');
  if (e != NULL && e[1] == '+') {
    int exp10 = atoi(e + 2);
    char digits[40];
    int nd = 0;
    for (const char *p = buf; p < e && nd < 39; p++)
      if (*p >= '0' && *p <= '9') digits[nd++] = *p;
    if (exp10 < 21 && exp10 >= nd - 1) {
      char plain[64];
      int n = 0;
      if (buf[0] == '-') plain[n++] = '-';
      for (int i = 0; i < nd; i++) plain[n++] = digits[i];
      for (int i = nd - 1; i < exp10; i++) plain[n++] = '0';
      plain[n] = '\0';
      return pq_strbuf_puts(sb, plain);
    }
  }
  return pq_strbuf_puts(sb, buf);
}

/* Prints a little-endian two's complement integer of w bytes, scaled by
 * 10^-scale, exactly. */
static int put_decimal(pq_strbuf_t *sb, const uint8_t *le, size_t w, int scale) {
  uint32_t limbs[8] = {0};
  size_t nl = w / 4;
  for (size_t i = 0; i < nl; i++) memcpy(&limbs[i], le + 4 * i, 4);
  int neg = (le[w - 1] & 0x80) != 0;
  if (neg) {
    /* Negate: invert and add one. */
    uint64_t carry = 1;
    for (size_t i = 0; i < nl; i++) {
      uint64_t v = (uint64_t)(uint32_t)~limbs[i] + carry;
      limbs[i] = (uint32_t)v;
      carry = v >> 32;
    }
  }
  char digits[100];
  int nd = 0;
  for (;;) {
    int zero = 1;
    uint64_t rem = 0;
    for (size_t i = nl; i-- > 0;) {
      uint64_t cur = rem << 32 | limbs[i];
      limbs[i] = (uint32_t)(cur / 10);
      rem = cur % 10;
      if (limbs[i]) zero = 0;
    }
    digits[nd++] = (char)('0' + rem);
    if (zero) break;
  }
  while (nd <= scale) digits[nd++] = '0';
  char out[110];
  int o = 0;
  out[o++] = '"';
  if (neg) out[o++] = '-';
  for (int i = nd - 1; i >= 0; i--) {
    out[o++] = digits[i];
    if (i == scale && scale > 0) out[o++] = '.';
  }
  out[o++] = '"';
  return pq_strbuf_append(sb, out, (size_t)o);
}

/* ------------------------------------------------------------------------ */
/* Dates and times                                                           */

/* Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's
 * civil_from_days). */
static void civil_from_days(int64_t z, int64_t *y, unsigned *m, unsigned *d) {
  z += 719468;
  int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  unsigned doe = (unsigned)(z - era * 146097);
  unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  int64_t yy = (int64_t)yoe + era * 400;
  unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  unsigned mp = (5 * doy + 2) / 153;
  *d = doy - (153 * mp + 2) / 5 + 1;
  *m = mp < 10 ? mp + 3 : mp - 9;
  *y = yy + (*m <= 2);
}

static int put_date_part(char *buf, size_t size, int64_t days) {
  int64_t y;
  unsigned m, d;
  civil_from_days(days, &y, &m, &d);
  if (y >= 0 && y <= 9999) return snprintf(buf, size, "%04lld-%02u-%02u", (long long)y, m, d);
  /* ISO 8601's expanded years: a sign and at least four digits, so 74 BC
   * is "-0073-01-11", not "-73-01-11", which no reader of these dates
   * parses.  Tested by parquet_unit_json_temporal. */
  return snprintf(buf, size, "%+05lld-%02u-%02u", (long long)y, m, d);
}

static const int64_t unit_per_sec[] = {1, 1000, 1000000, 1000000000};
static const int unit_digits[] = {0, 3, 6, 9};

/* Splits v into whole units of per and a non-negative remainder, without
 * the overflow of v - q * per near INT64_MIN. */
static void split_floor(int64_t v, int64_t per, int64_t *q, int64_t *r) {
  *q = v / per;
  *r = v % per;
  if (*r < 0) {
    *r += per;
    (*q)--;
  }
}

static int put_timestamp(pq_strbuf_t *sb, int64_t v, larder_time_unit_t unit, int utc) {
  int64_t per = unit_per_sec[unit];
  int64_t secs, frac;
  split_floor(v, per, &secs, &frac);
  int64_t days, sod;
  split_floor(secs, 86400, &days, &sod);
  char buf[80];
  int n = 0;
  buf[n++] = '"';
  n += put_date_part(buf + n, sizeof(buf) - (size_t)n, days);
  n += snprintf(buf + n, sizeof(buf) - (size_t)n, "T%02d:%02d:%02d", (int)(sod / 3600),
                (int)(sod / 60 % 60), (int)(sod % 60));
  if (unit_digits[unit])
    n += snprintf(buf + n, sizeof(buf) - (size_t)n, ".%0*lld", unit_digits[unit], (long long)frac);
  if (utc) buf[n++] = 'Z';
  buf[n++] = '"';
  return pq_strbuf_append(sb, buf, (size_t)n);
}

static int put_time(pq_strbuf_t *sb, int64_t v, larder_time_unit_t unit) {
  int64_t per = unit_per_sec[unit];
  int64_t secs, frac;
  split_floor(v, per, &secs, &frac);
  char buf[64];
  int n = snprintf(buf, sizeof(buf), "\"%02lld:%02d:%02d", (long long)(secs / 3600),
                   (int)(secs / 60 % 60), (int)(secs % 60));
  if (unit_digits[unit])
    n += snprintf(buf + n, sizeof(buf) - (size_t)n, ".%0*lld", unit_digits[unit], (long long)frac);
  buf[n++] = '"';
  return pq_strbuf_append(sb, buf, (size_t)n);
}

/* ------------------------------------------------------------------------ */

static int put_value(pq_strbuf_t *sb, const pq_array_t *a, int64_t i);

static int is_null(const pq_array_t *a, int64_t i) {
  if (a->field->type == LARDER_TYPE_NULL) return 1;
  if (a->null_count == 0 || a->validity.len == 0) return 0;
  return !((a->validity.data[i >> 3] >> (i & 7)) & 1);
}

static int put_value(pq_strbuf_t *sb, const pq_array_t *a, int64_t i) {
  const pq_field_t *f = a->field;
  if (is_null(a, i)) return pq_strbuf_puts(sb, "null");
  const uint8_t *v = a->values.data;
  const int32_t *off = (const int32_t *)(const void *)a->offsets.data;
  switch (f->type) {
    case LARDER_TYPE_NULL: return pq_strbuf_puts(sb, "null");
    case LARDER_TYPE_BOOL: return pq_strbuf_puts(sb, (v[i >> 3] >> (i & 7)) & 1 ? "true" : "false");
    case LARDER_TYPE_INT8: return pq_strbuf_printf(sb, "%d", (int8_t)v[i]);
    case LARDER_TYPE_UINT8: return pq_strbuf_printf(sb, "%u", v[i]);
    case LARDER_TYPE_INT16: {
      int16_t x;
      memcpy(&x, v + 2 * i, 2);
      return pq_strbuf_printf(sb, "%d", x);
    }
    case LARDER_TYPE_UINT16: {
      uint16_t x;
      memcpy(&x, v + 2 * i, 2);
      return pq_strbuf_printf(sb, "%u", x);
    }
    case LARDER_TYPE_INT32: {
      int32_t x;
      memcpy(&x, v + 4 * i, 4);
      return pq_strbuf_printf(sb, "%d", x);
    }
    case LARDER_TYPE_UINT32: {
      uint32_t x;
      memcpy(&x, v + 4 * i, 4);
      return pq_strbuf_printf(sb, "%u", x);
    }
    case LARDER_TYPE_INT64: {
      int64_t x;
      memcpy(&x, v + 8 * i, 8);
      return pq_strbuf_printf(sb, "%lld", (long long)x);
    }
    case LARDER_TYPE_UINT64: {
      uint64_t x;
      memcpy(&x, v + 8 * i, 8);
      return pq_strbuf_printf(sb, "%llu", (unsigned long long)x);
    }
    case LARDER_TYPE_FLOAT16: {
      uint16_t h;
      memcpy(&h, v + 2 * i, 2);
      return put_float(sb, half_to_float(h), 2);
    }
    case LARDER_TYPE_FLOAT32: {
      float x;
      memcpy(&x, v + 4 * i, 4);
      return put_float(sb, x, 4);
    }
    case LARDER_TYPE_FLOAT64: {
      double x;
      memcpy(&x, v + 8 * i, 8);
      return put_float(sb, x, 8);
    }
    case LARDER_TYPE_DATE32: {
      int32_t x;
      memcpy(&x, v + 4 * i, 4);
      char buf[48];
      buf[0] = '"';
      int n = put_date_part(buf + 1, sizeof(buf) - 2, x) + 1;
      buf[n++] = '"';
      return pq_strbuf_append(sb, buf, (size_t)n);
    }
    case LARDER_TYPE_TIME32: {
      int32_t x;
      memcpy(&x, v + 4 * i, 4);
      return put_time(sb, x, f->unit);
    }
    case LARDER_TYPE_TIME64: {
      int64_t x;
      memcpy(&x, v + 8 * i, 8);
      return put_time(sb, x, f->unit);
    }
    case LARDER_TYPE_TIMESTAMP: {
      int64_t x;
      memcpy(&x, v + 8 * i, 8);
      return put_timestamp(sb, x, f->unit, f->utc);
    }
    case LARDER_TYPE_DECIMAL128:
    case LARDER_TYPE_DECIMAL256: {
      size_t w = (size_t)f->byte_width;
      return put_decimal(sb, v + (size_t)i * w, w, f->scale);
    }
    case LARDER_TYPE_STRING:
      return pq_json_append_string(sb, v + off[i], (size_t)(off[i + 1] - off[i]));
    case LARDER_TYPE_BINARY: return put_base64(sb, v + off[i], (size_t)(off[i + 1] - off[i]));
    case LARDER_TYPE_FIXED_BINARY:
      return put_base64(sb, v + (size_t)i * (size_t)f->byte_width, (size_t)f->byte_width);
    case LARDER_TYPE_STRUCT: {
      if (pq_strbuf_append(sb, "{", 1)) return LARDER_ENOMEM;
      for (int c = 0; c < a->num_children; c++) {
        if (c && pq_strbuf_append(sb, ",", 1)) return LARDER_ENOMEM;
        const char *name = a->children[c].field->name;
        if (pq_json_append_string(sb, (const uint8_t *)name, strlen(name)) ||
            pq_strbuf_append(sb, ":", 1) || put_value(sb, &a->children[c], i))
          return LARDER_ENOMEM;
      }
      return pq_strbuf_append(sb, "}", 1);
    }
    case LARDER_TYPE_LIST: {
      if (pq_strbuf_append(sb, "[", 1)) return LARDER_ENOMEM;
      for (int32_t k = off[i]; k < off[i + 1]; k++) {
        if (k > off[i] && pq_strbuf_append(sb, ",", 1)) return LARDER_ENOMEM;
        if (put_value(sb, &a->children[0], k)) return LARDER_ENOMEM;
      }
      return pq_strbuf_append(sb, "]", 1);
    }
    case LARDER_TYPE_MAP: {
      const pq_array_t *e = &a->children[0];
      if (pq_strbuf_append(sb, "[", 1)) return LARDER_ENOMEM;
      for (int32_t k = off[i]; k < off[i + 1]; k++) {
        if (k > off[i] && pq_strbuf_append(sb, ",", 1)) return LARDER_ENOMEM;
        if (pq_strbuf_puts(sb, "{\"key\":") || put_value(sb, &e->children[0], k) ||
            pq_strbuf_puts(sb, ",\"value\":") || put_value(sb, &e->children[1], k) ||
            pq_strbuf_append(sb, "}", 1))
          return LARDER_ENOMEM;
      }
      return pq_strbuf_append(sb, "]", 1);
    }
    default: return pq_strbuf_puts(sb, "null");
  }
}

int pq_json_append_row(pq_strbuf_t *sb, const pq_batch_t *batch, int64_t row) {
  if (pq_strbuf_append(sb, "{", 1)) return LARDER_ENOMEM;
  for (int c = 0; c < batch->num_columns; c++) {
    if (c && pq_strbuf_append(sb, ",", 1)) return LARDER_ENOMEM;
    const char *name = batch->columns[c].field->name;
    if (pq_json_append_string(sb, (const uint8_t *)name, strlen(name)) ||
        pq_strbuf_append(sb, ":", 1) || put_value(sb, &batch->columns[c], row))
      return LARDER_ENOMEM;
  }
  return pq_strbuf_append(sb, "}", 1);
}
