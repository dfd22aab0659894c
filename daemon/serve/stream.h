/*
 * stream.h: one stream of batches, from OpenStream to its end (prefix
 * stream_).
 *
 * Conventions
 * -----------
 * - Threading: the loop thread's.  Planning, pinning and batch assembly run
 *   on workers as tasks of the stream, whose done callbacks publish their
 *   results on the loop.
 * - Ownership: a stream belongs to its connection (conn_t.streams); it is
 *   freed once it is closed (by its client, its connection, an error or the
 *   shutdown) and no task of its is in flight.  A stream_t pointer is not
 *   used after stream_close or stream_fail.
 * - Errors: negative larder_errno_t.  A stream's failure is sent to its
 *   client as an Error frame and ends only that stream.
 */
#ifndef LARDER_STREAM_H
#define LARDER_STREAM_H

#include <stdint.h>

#include "plan/dataset.h"
#include "stats.h"
#include "wire.h"

typedef struct server server_t;
typedef struct conn conn_t;
typedef struct stream stream_t;

/* The most batches a stream's client may hold (OpenStream.window). */
#define STREAM_MAX_WINDOW 1024u
/* The most rows a batch may have (OpenStream.batch_size). */
#define STREAM_MAX_BATCH (1u << 20)
/* The most node partitions a stream may ask for (OpenStream.partitions). */
#define STREAM_MAX_PARTITIONS 65536u

/* Opens a stream for conn from an OpenStream request: resolves the dataset
 * on a worker, then replies (OpenStreamReply with the arena, or Error). */
void stream_open(conn_t *c, const Larder__OpenStream *req);
void stream_release(stream_t *s, const Larder__Release *rel);
/* A Wake frame came: the client wrote releases in the stream's ring. */
void stream_wake(stream_t *s);
/* Ends a stream: the client asked, or its connection went away. */
void stream_close(stream_t *s);
/* Frees a CUDA region on a worker of server srv (cuda_set_closer's fn:
 * the parks' regions). */
typedef struct cuda_region cuda_region_t;
void stream_close_region(void *srv, cuda_region_t *r);
/* The client's CloseStream: closes its stream, or frees what the daemon
 * kept of a stream ended before (a CUDA region, cuda.h). */
void stream_client_close(conn_t *c, const Larder__CloseStream *cs);
/* Ends a stream with an error sent to its client. */
void stream_fail(stream_t *s, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
uint32_t stream_id(const stream_t *s);
/* Lets every stream's read-ahead go on (a fetch finished: the server
 * registers it with units_init).  Loop thread. */
void stream_read_ahead_all(server_t *srv);
/* The stream of connection c with this id, or NULL. */
stream_t *stream_find(conn_t *c, uint32_t id);
/* For the admin stats: the stream's counters, and the next stream of its
 * connection (NULL at the end). */
const stats_stream_t *stream_stats(const stream_t *s);
stream_t *stream_next_in_conn(const stream_t *s);

/* For the admin commands and metrics: what a stream reads. */
typedef struct stream_info {
  uint32_t id;
  uint32_t rank, world_size;
  const char *dataset; /* dataset_sources_label of its sources */
  uint64_t num_files, num_units, total_rows;
  uint64_t batches_per_epoch, epochs;
  uint64_t arena_bytes;
  uint32_t window;                /* batches its client may hold */
  uint32_t partitions;            /* P (1: none) */
  uint32_t part_first, part_last; /* its node's partitions */
  uint64_t opened_ns;
  const dataset_t *ds;    /* its files; NULL while the open resolves */
  const char *job;        /* as the trainer named it ("" when none) */
  int metrics_group;      /* metrics_group's number (0: none) */
  int shuffle;            /* its order is shuffled */
  int rg_together;        /* ... with row groups kept together */
  int rg_auto;            /* ... as shuffle_row_groups = auto chose */
  const char *order_note; /* auto: why ("" otherwise) */
} stream_info_t;
void stream_info(const stream_t *s, stream_info_t *out);

#endif /* LARDER_STREAM_H */
