/*
 * metrics.h: Prometheus metrics (prefix metrics_).
 *
 * Two ways out, both optional and independent:
 * - metrics_listen = HOST:PORT serves GET /metrics over HTTP/1.1 (text
 *   exposition format 0.0.4; one request per connection; HEAD works; any
 *   other path is 404) from the daemon's loop.
 * - metrics_textfile = PATH writes the same text every metrics_interval
 *   seconds for node_exporter's textfile collector (to PATH.tmp, then
 *   renamed, so the collector never reads half a file); on a clean exit a
 *   last copy says larder_up 0.
 *
 * The names come from the same single definition as `larderctl stats`
 * (stats.h's X-macros): each STATS_GLOBAL entry is larder_<name>, with
 * _total for counters; each STATS_STREAM entry is larder_stream_<name>_total,
 * labelled per stream.  Durations keep the daemon's unit (nanoseconds, in
 * the _ns names).
 *
 * Metric names
 * ------------
 *   larder_up                        gauge    1 while the daemon serves (0 in
 *                                             the last textfile at exit)
 *   larder_build_info{version}       gauge    always 1
 *   larder_uptime_seconds            gauge    seconds since the daemon started
 *   larder_start_time_seconds        gauge    unix time the daemon started
 *
 *   From STATS_GLOBAL (stats.h):
 *   larder_clients                   gauge    connected clients
 *   larder_streams                   gauge    open streams
 *   larder_streams_opened_total      counter  streams opened
 *   larder_stream_errors_total       counter  streams ended by an error
 *   larder_protocol_errors_total     counter  connections closed for protocol errors
 *   larder_batches_total             counter  batches delivered
 *   larder_batch_rows_total          counter  rows delivered
 *   larder_batch_bytes_total         counter  batch bytes delivered through shared memory
 *   larder_units_decoded_total       counter  units decoded from Parquet
 *   larder_units_from_cache_total    counter  units read from the cache
 *   larder_unit_errors_total         counter  units that failed to load
 *   larder_unit_shared_total         counter  unit loads shared by several streams
 *   larder_unit_loads_cancelled_total counter unit loads dropped before they started,
 *                                             no stream wanting them any more
 *   larder_cache_hit_bytes_total     counter  bytes served from the cache
 *   larder_cache_miss_bytes_total    counter  bytes decoded because the cache lacked them
 *   larder_memory_bytes              gauge    decoded unit bytes held in memory
 *   larder_footer_bytes              gauge    bytes of parsed Parquet footers held for
 *                                             open streams (within footer_memory)
 *   larder_footer_files              gauge    parsed footers held: one per version of a
 *                                             file, shared by every stream that reads it
 *   larder_footers_parsed_total      counter  Parquet footers parsed
 *   larder_footers_shared_total      counter  footers a stream took from another's parse
 *   larder_fetch_bytes_total         counter  bytes fetched from remote sources
 *   larder_fetch_requests_total      counter  remote requests completed
 *   larder_fetch_retries_total       counter  remote requests retried
 *   larder_fetch_errors_total        counter  remote requests that failed for good
 *   larder_fetch_inflight            gauge    remote requests in flight
 *   larder_fetch_ns_total            counter  time spent fetching (summed over requests)
 *   larder_credentials_refreshes_total
 *                                    counter  S3 credentials resolved again by the refresher
 *                                             (expiry, reload)
 *   larder_credentials_refresh_errors_total
 *                                    counter  S3 credential refreshes that failed (retried
 *                                             with backoff)
 *   larder_credentials_expires_in_s  gauge    seconds until the S3 credentials in force
 *                                             expire (0: they do not)
 *   larder_decode_ns_total           counter  time spent decoding Parquet
 *   larder_cache_read_ns_total       counter  time spent reading the cache
 *   larder_assemble_ns_total         counter  time spent assembling batches
 *   larder_workers_boosted           gauge    1 while trainers wait and the workers run at
 *                                             the daemon's priority (else worker_nice nicer)
 *   larder_worker_boosts_total       counter  times trainers waiting raised the workers' priority
 *   larder_ring_streams_total        counter  streams opened with a descriptor ring
 *   larder_ring_wakes_sent_total     counter  Wake frames sent to clients asleep on a ring
 *   larder_ring_wakes_received_total counter  Wake frames from clients: releases written
 *                                             in a ring
 *     (Wakes per batch delivered is the system calls a ring saves: near 0
 *     while trainers keep up, about 1 while they wait on the daemon.)
 *
 *   The cache (store.h's store_stats_t):
 *   larder_cache_capacity_bytes      gauge    bytes of decoded data the cache keeps at most
 *   larder_cache_used_bytes          gauge    bytes cached
 *   larder_cache_reserved_bytes      gauge    bytes reserved for units being written
 *   larder_cache_entries             gauge    cached values (one per column of a unit)
 *   larder_cache_objects             gauge    files and objects with cached values
 *   larder_cache_admission_disabled  gauge    1 while the disk is full and nothing is admitted
 *   larder_cache_lookup_hits_total   counter  cache lookups that hit
 *   larder_cache_lookup_misses_total counter  cache lookups that missed
 *   larder_cache_lookup_hit_bytes_total counter bytes read by lookups that hit
 *   larder_cache_puts_total          counter  values written
 *   larder_cache_put_bytes_total     counter  bytes written
 *   larder_cache_evictions_total     counter  values evicted
 *   larder_cache_evicted_bytes_total counter  bytes evicted
 *   larder_cache_rejected_total      counter  units refused admission (priority)
 *   larder_cache_checksum_failures_total counter corrupt values found and dropped
 *   larder_cache_write_errors_total  counter  failed cache writes
 *
 *   Per open stream, labelled client (connection id), stream (id within
 *   it), pid, uid, rank, world_size and dataset (its first source as the
 *   client named it, a URL without credentials or query string, and
 *   " (+N more)" when it has several), from STATS_STREAM:
 *   larder_stream_batches_total          counter  batches delivered
 *   larder_stream_rows_total             counter  rows delivered
 *   larder_stream_bytes_total            counter  batch bytes delivered
 *   larder_stream_wait_ns_total          counter  time the trainer blocked waiting for batches
 *   larder_stream_compute_ns_total       counter  time the trainer spent between batches
 *   larder_stream_fetch_ns_total         counter  fetch time of the units it read
 *   larder_stream_decode_ns_total        counter  decode time of the units it read
 *   larder_stream_cache_read_ns_total    counter  cache read time of the units it read
 *   larder_stream_assemble_ns_total      counter  time assembling its batches
 *   larder_stream_cache_hit_bytes_total  counter  unit bytes it read from the cache
 *   larder_stream_cache_miss_bytes_total counter  unit bytes decoded for it
 *   The stall fraction of a stream is
 *   rate(larder_stream_wait_ns_total) / (rate(larder_stream_wait_ns_total) +
 *   rate(larder_stream_compute_ns_total)).
 *
 * Everything runs on the loop thread.
 */
#ifndef LARDER_METRICS_H
#define LARDER_METRICS_H

#include <stdio.h>

typedef struct server server_t;

/* Starts what the configuration enables.  Returns 0 or a negative code
 * with a message (an address that cannot be bound). */
int metrics_start(server_t *srv, char *err, size_t errlen);
/* Closes the endpoint and writes the last textfile; idempotent. */
void metrics_stop(server_t *srv);
/* metrics_textfile or metrics_interval changed (SIGHUP). */
void metrics_config_changed(server_t *srv);
/* Writes the exposition text to out; up is larder_up's value. */
void metrics_render(server_t *srv, FILE *out, int up);
/* Where metrics go, for `larderctl status` ("" when off). */
const char *metrics_endpoint(server_t *srv);

#endif /* LARDER_METRICS_H */
