/*
 * admin.c: the administrative requests larderctl sends (status, stats,
 * clients).  Replies are JSON when asked, else human-readable text.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "log.h"
#include "server.h"
#include "util.h"

typedef struct sbuf {
  char *p;
  size_t len, cap;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(sbuf *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? b->cap - b->len : 0, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (b->p && b->len + (size_t)n < b->cap) {
      b->len += (size_t)n;
      return;
    }
    size_t cap = b->cap ? b->cap * 2 : 4096;
    while (cap < b->len + (size_t)n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (p == NULL) return;
    b->p = p;
    b->cap = cap;
  }
}

static void reply(conn_t *c, uint32_t request_id, int code, const char *text) {
  Larder__AdminReply r = LARDER__ADMIN_REPLY__INIT;
  r.request_id = request_id;
  r.code = code;
  r.text = (char *)(text ? text : "");
  Larder__Frame f = LARDER__FRAME__INIT;
  f.msg_case = LARDER__FRAME__MSG_ADMIN_REPLY;
  f.admin_reply = &r;
  conn_send(c, &f, -1);
}

static void stats_json(server_t *srv, sbuf *b) {
  sb_printf(b, "{\"version\":\"%s\",\"uptime_s\":%.3f", LARDERD_VERSION,
            (double)(util_now_ns() - srv->started_ns) / 1e9);
#define ADMIN_STAT_(name, kind, help) \
  sb_printf(b, ",\"%s\":%" PRIu64, #name, STATS_GET(&srv->stats, name));
  STATS_GLOBAL(ADMIN_STAT_)
#undef ADMIN_STAT_
  if (srv->store) {
    store_stats_t st;
    store_stats_get(srv->store, &st);
    sb_printf(b,
              ",\"cache\":{\"capacity_bytes\":%" PRIu64 ",\"used_bytes\":%" PRIu64
              ",\"entries\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64
              ",\"evictions\":%" PRIu64 ",\"admission_disabled\":%s",
              st.capacity_bytes, st.used_bytes, st.entries, st.hits, st.misses, st.evictions,
              st.admission_disabled ? "true" : "false");
    /* The rest of store_stats_t, for the integration tests and monitoring. */
    sb_printf(b,
              ",\"reserved_bytes\":%" PRIu64 ",\"objects\":%" PRIu64 ",\"hit_bytes\":%" PRIu64
              ",\"puts\":%" PRIu64 ",\"put_bytes\":%" PRIu64 ",\"evicted_bytes\":%" PRIu64
              ",\"rejected\":%" PRIu64 ",\"checksum_failures\":%" PRIu64
              ",\"write_errors\":%" PRIu64 "}",
              st.reserved_bytes, st.objects, st.hit_bytes, st.puts, st.put_bytes,
              st.evicted_bytes, st.rejected, st.checksum_failures, st.write_errors);
  }
  /* Per stream: what it delivered and the stall its trainer reported
   * (wait_ns: blocked in larder_stream_next; compute_ns: between calls). */
  sb_printf(b, ",\"per_stream\":[");
  int first = 1;
  for (conn_t *c = srv->conns; c; c = c->next) {
    for (stream_t *s = c->streams; s; s = stream_next_in_conn(s)) {
      const stats_stream_t *ss = stream_stats(s);
      sb_printf(b, "%s{\"client\":%" PRIu64 ",\"pid\":%d,\"stream\":%u", first ? "" : ",",
                c->id, (int)c->pid, stream_id(s));
#define ADMIN_STREAM_STAT_(name, kind, help) \
  sb_printf(b, ",\"%s\":%" PRIu64, #name, STATS_GET(ss, name));
      STATS_STREAM(ADMIN_STREAM_STAT_)
#undef ADMIN_STREAM_STAT_
      sb_printf(b, "}");
      first = 0;
    }
  }
  sb_printf(b, "]}");
}

void admin_handle(conn_t *c, const Larder__AdminRequest *req) {
  server_t *srv = c->srv;
  sbuf b = {0};
  const char *cmd = req->command ? req->command : "";
  if (strcmp(cmd, "status") == 0 || strcmp(cmd, "stats") == 0) {
    stats_json(srv, &b);
    reply(c, req->request_id, 0, b.p);
  } else {
    reply(c, req->request_id, LARDER_EUNSUPPORTED, "unknown admin command");
  }
  free(b.p);
}
