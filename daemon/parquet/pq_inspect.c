/*
 * pq_inspect.c: the description of a Parquet file that `larderctl inspect`
 * prints, as JSON or text (prefix pq_inspect_).  Shared by larderctl (local
 * files) and larderd (remote URLs, whose footers only the daemon fetches).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/parquet.h"
#include "parquet/pq_inspect.h"

/* ------------------------------------------------------------------------ */
/* inspect                                                                   */

static void json_str(pq_strbuf_t *sb, const char *s) {
  if (s == NULL) {
    pq_strbuf_puts(sb, "null");
    return;
  }
  pq_json_append_string(sb, (const uint8_t *)s, strlen(s));
}

static const char *unit_short(larder_time_unit_t u) {
  static const char *const names[] = {"s", "ms", "us", "ns"};
  return names[u & 3];
}

static void json_field(pq_strbuf_t *sb, const pq_field_t *f) {
  pq_strbuf_puts(sb, "{\"name\":");
  json_str(sb, f->name);
  pq_strbuf_printf(sb, ",\"type\":\"%s\",\"nullable\":%s", larder_type_name(f->type),
                   f->nullable ? "true" : "false");
  if (f->type == LARDER_TYPE_TIME32 || f->type == LARDER_TYPE_TIME64 ||
      f->type == LARDER_TYPE_TIMESTAMP)
    pq_strbuf_printf(sb, ",\"unit\":\"%s\"", unit_short(f->unit));
  if (f->type == LARDER_TYPE_TIMESTAMP)
    pq_strbuf_printf(sb, ",\"utc\":%s", f->utc ? "true" : "false");
  if (f->from_int96) pq_strbuf_puts(sb, ",\"int96\":true");
  if (f->type == LARDER_TYPE_DECIMAL128 || f->type == LARDER_TYPE_DECIMAL256)
    pq_strbuf_printf(sb, ",\"precision\":%d,\"scale\":%d", f->precision, f->scale);
  if (f->type == LARDER_TYPE_FIXED_BINARY)
    pq_strbuf_printf(sb, ",\"byte_width\":%d", f->byte_width);
  if (f->node && f->num_children == 0) {
    char lt[64];
    pq_logical_format(&f->node->logical, lt, sizeof(lt));
    if (lt[0]) {
      pq_strbuf_puts(sb, ",\"logical\":");
      json_str(sb, lt);
    }
  }
  if (f->num_children) {
    pq_strbuf_puts(sb, ",\"children\":[");
    for (int i = 0; i < f->num_children; i++) {
      if (i) pq_strbuf_puts(sb, ",");
      json_field(sb, &f->children[i]);
    }
    pq_strbuf_puts(sb, "]");
  }
  pq_strbuf_puts(sb, "}");
}

static const char *converted_name(int c) {
  static const char *const names[] = {"UTF8",
                                      "MAP",
                                      "MAP_KEY_VALUE",
                                      "LIST",
                                      "ENUM",
                                      "DECIMAL",
                                      "DATE",
                                      "TIME_MILLIS",
                                      "TIME_MICROS",
                                      "TIMESTAMP_MILLIS",
                                      "TIMESTAMP_MICROS",
                                      "UINT_8",
                                      "UINT_16",
                                      "UINT_32",
                                      "UINT_64",
                                      "INT_8",
                                      "INT_16",
                                      "INT_32",
                                      "INT_64",
                                      "JSON",
                                      "BSON",
                                      "INTERVAL"};
  if (c >= 0 && c < 22) return names[c];
  return NULL;
}

static void json_node(pq_strbuf_t *sb, const pq_schema_node_t *n) {
  pq_strbuf_puts(sb, "{\"name\":");
  json_str(sb, n->name);
  pq_strbuf_printf(sb, ",\"repetition\":\"%s\",\"physical\":", pq_repetition_name(n->repetition));
  if (n->physical == PQ_PHYSICAL_NONE) pq_strbuf_puts(sb, "null");
  else pq_strbuf_printf(sb, "\"%s\"", pq_physical_name(n->physical));
  if (n->physical == PQ_FIXED_LEN_BYTE_ARRAY)
    pq_strbuf_printf(sb, ",\"type_length\":%d", n->type_length);
  char lt[64];
  pq_logical_format(&n->logical, lt, sizeof(lt));
  pq_strbuf_puts(sb, ",\"logical\":");
  json_str(sb, lt[0] ? lt : NULL);
  pq_strbuf_puts(sb, ",\"converted\":");
  json_str(sb, converted_name(n->converted));
  if (n->field_id >= 0) pq_strbuf_printf(sb, ",\"field_id\":%d", n->field_id);
  if (n->physical == PQ_PHYSICAL_NONE) {
    pq_strbuf_puts(sb, ",\"children\":[");
    for (int i = 0; i < n->num_children; i++) {
      if (i) pq_strbuf_puts(sb, ",");
      json_node(sb, &n->children[i]);
    }
    pq_strbuf_puts(sb, "]");
  }
  pq_strbuf_puts(sb, "}");
}

static void encodings_list(uint32_t mask, char *buf, size_t size, int json) {
  size_t n = 0;
  buf[0] = '\0';
  for (int e = 0; e < 32 && n < size; e++) {
    if (!(mask & (1u << e))) continue;
    n += (size_t)snprintf(buf + n, size - n, json ? "%s\"%s\"" : "%s%s",
                          n ? (json ? "," : " ") : "", pq_encoding_name(e));
  }
}

void pq_inspect_json(pq_strbuf_t *sb, const pq_file *f) {
  const pq_file_meta_t *m = pq_file_meta(f);
  pq_strbuf_puts(sb, "{\"file\":");
  json_str(sb, pq_file_name(f));
  pq_strbuf_printf(sb, ",\"size\":%" PRIu64 ",\"version\":%d,\"created_by\":", m->file_size,
                   m->version);
  json_str(sb, m->created_by);
  pq_strbuf_printf(sb, ",\"num_rows\":%" PRId64 ",\"key_value_metadata\":[", m->num_rows);
  for (int i = 0; i < m->num_kv; i++) {
    pq_strbuf_puts(sb, i ? ",{\"key\":" : "{\"key\":");
    json_str(sb, m->kv[i].key);
    pq_strbuf_puts(sb, ",\"value\":");
    json_str(sb, m->kv[i].value);
    pq_strbuf_puts(sb, "}");
  }
  pq_strbuf_puts(sb, "],\"schema\":[");
  for (int i = 0; i < m->root->num_children; i++) {
    if (i) pq_strbuf_puts(sb, ",");
    json_node(sb, &m->root->children[i]);
  }
  pq_strbuf_puts(sb, "],\"fields\":[");
  for (int i = 0; i < m->schema->num_children; i++) {
    if (i) pq_strbuf_puts(sb, ",");
    json_field(sb, &m->schema->children[i]);
  }
  pq_strbuf_puts(sb, "],\"row_groups\":[");
  for (int g = 0; g < m->num_row_groups; g++) {
    const pq_row_group_t *rg = &m->row_groups[g];
    pq_strbuf_printf(sb,
                     "%s{\"index\":%d,\"num_rows\":%" PRId64 ",\"total_byte_size\":%" PRId64
                     ",\"compressed_size\":%" PRId64 ",\"columns\":[",
                     g ? "," : "", g, rg->num_rows, rg->total_byte_size, rg->total_compressed_size);
    for (int c = 0; c < m->num_leaves; c++) {
      const pq_column_chunk_t *cc = &rg->columns[c];
      char enc[512];
      encodings_list(cc->encodings, enc, sizeof(enc), 1);
      pq_strbuf_puts(sb, c ? ",{\"path\":" : "{\"path\":");
      json_str(sb, m->leaves[c]->path);
      pq_strbuf_printf(sb,
                       ",\"physical\":\"%s\",\"codec\":\"%s\",\"encodings\":[%s],"
                       "\"compressed_size\":%" PRId64 ",\"uncompressed_size\":%" PRId64
                       ",\"num_values\":%" PRId64 ",\"offset\":%" PRIu64 "}",
                       pq_physical_name(m->leaves[c]->physical), pq_codec_name(cc->codec), enc,
                       cc->total_compressed_size, cc->total_uncompressed_size, cc->num_values,
                       cc->range_offset);
    }
    pq_strbuf_puts(sb, "]}");
  }
  pq_strbuf_puts(sb, "]}");
}

static void human_node(pq_strbuf_t *sb, const pq_schema_node_t *n, int depth) {
  char lt[64];
  pq_logical_format(&n->logical, lt, sizeof(lt));
  pq_strbuf_printf(sb, "%*s%s %s %s", depth * 2 + 2, "", pq_repetition_name(n->repetition),
                   n->physical == PQ_PHYSICAL_NONE ? "group" : pq_physical_name(n->physical),
                   n->name);
  if (n->physical == PQ_FIXED_LEN_BYTE_ARRAY) pq_strbuf_printf(sb, " (length %d)", n->type_length);
  if (lt[0]) pq_strbuf_printf(sb, " (%s)", lt);
  pq_strbuf_puts(sb, "\n");
  for (int i = 0; i < n->num_children; i++) human_node(sb, &n->children[i], depth + 1);
}

static void human_field(pq_strbuf_t *sb, const pq_field_t *f, int depth) {
  pq_strbuf_printf(sb, "%*s%s: %s", depth * 2 + 2, "", f->name, larder_type_name(f->type));
  if (f->type == LARDER_TYPE_TIMESTAMP || f->type == LARDER_TYPE_TIME32 ||
      f->type == LARDER_TYPE_TIME64)
    pq_strbuf_printf(sb, "[%s%s]", unit_short(f->unit),
                     f->type == LARDER_TYPE_TIMESTAMP && f->utc ? ", UTC" : "");
  if (f->type == LARDER_TYPE_DECIMAL128 || f->type == LARDER_TYPE_DECIMAL256)
    pq_strbuf_printf(sb, "(%d,%d)", f->precision, f->scale);
  if (f->type == LARDER_TYPE_FIXED_BINARY) pq_strbuf_printf(sb, "[%d]", f->byte_width);
  pq_strbuf_puts(sb, f->nullable ? "\n" : " not null\n");
  for (int i = 0; i < f->num_children; i++) human_field(sb, &f->children[i], depth + 1);
}

static void human_bytes(char *buf, size_t size, double v) {
  const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    u++;
  }
  snprintf(buf, size, u ? "%.1f %s" : "%.0f %s", v, units[u]);
}

void pq_inspect_human(pq_strbuf_t *sb, const pq_file *f) {
  const pq_file_meta_t *m = pq_file_meta(f);
  char sz[32];
  human_bytes(sz, sizeof(sz), (double)m->file_size);
  pq_strbuf_printf(sb, "file:        %s (%s)\n", pq_file_name(f), sz);
  pq_strbuf_printf(sb, "created by:  %s\n", m->created_by ? m->created_by : "(unknown)");
  pq_strbuf_printf(sb, "rows:        %" PRId64 " in %d row group%s\n", m->num_rows,
                   m->num_row_groups, m->num_row_groups == 1 ? "" : "s");
  pq_strbuf_printf(sb, "version:     %d\n", m->version);
  if (m->num_kv) {
    pq_strbuf_puts(sb, "metadata:\n");
    for (int i = 0; i < m->num_kv; i++) {
      const char *v = m->kv[i].value ? m->kv[i].value : "";
      size_t len = strlen(v);
      pq_strbuf_printf(sb, "  %s = %.*s%s\n", m->kv[i].key, (int)(len > 72 ? 72 : len), v,
                       len > 72 ? "..." : "");
    }
  }
  pq_strbuf_puts(sb, "schema (Parquet):\n");
  for (int i = 0; i < m->root->num_children; i++) human_node(sb, &m->root->children[i], 0);
  pq_strbuf_puts(sb, "schema (served as):\n");
  for (int i = 0; i < m->schema->num_children; i++) human_field(sb, &m->schema->children[i], 0);
  for (int g = 0; g < m->num_row_groups; g++) {
    const pq_row_group_t *rg = &m->row_groups[g];
    char a[32], b[32];
    human_bytes(a, sizeof(a), (double)rg->total_byte_size);
    human_bytes(b, sizeof(b), (double)rg->total_compressed_size);
    pq_strbuf_printf(sb, "row group %d: %" PRId64 " rows, %s uncompressed, %s compressed\n", g,
                     rg->num_rows, a, b);
    pq_strbuf_printf(sb, "  %-32s %-8s %-12s %12s %12s  %s\n", "column", "type", "codec",
                     "compressed", "uncompressed", "encodings");
    for (int c = 0; c < m->num_leaves; c++) {
      const pq_column_chunk_t *cc = &rg->columns[c];
      char enc[512];
      encodings_list(cc->encodings, enc, sizeof(enc), 0);
      human_bytes(a, sizeof(a), (double)cc->total_compressed_size);
      human_bytes(b, sizeof(b), (double)cc->total_uncompressed_size);
      pq_strbuf_printf(sb, "  %-32s %-8s %-12s %12s %12s  %s\n", m->leaves[c]->path,
                       m->leaves[c]->physical == PQ_FIXED_LEN_BYTE_ARRAY ? "FLBA"
                       : m->leaves[c]->physical == PQ_BYTE_ARRAY
                           ? "BINARY"
                           : pq_physical_name(m->leaves[c]->physical),
                       pq_codec_name(cc->codec), a, b, enc);
    }
  }
}
