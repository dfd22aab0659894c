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
 * (stats.h's X-macros), in Prometheus's base units: durations are seconds
 * (float), counters end in _total, and no series carries a pid, a client or
 * a stream id, so that the series a daemon exports stay few however many
 * trainers come and go.
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
 *   larder_cache_readback_bytes_total counter unit bytes decoded ahead with another
 *                                             unit of their row group and read back
 *                                             from the cache: decode work, not hits
 *     (the cache's byte hit ratio is hit / (hit + miss); the cache's own
 *     count of the bytes its lookups returned is not exported a second time)
 *   larder_prefetch_loaded_bytes_total counter unit bytes loaded for larderctl prefetch
 *                                             alone (not the trainers' hits or misses)
 *   larder_memory_bytes              gauge    decoded unit bytes held in memory
 *   larder_footer_bytes              gauge    bytes of parsed Parquet footers held for
 *                                             open streams (within footer_memory)
 *   larder_footer_files              gauge    parsed footers held: one per version of a
 *                                             file, shared by every stream that reads it
 *   larder_footers_parsed_total      counter  Parquet footers parsed
 *   larder_footers_shared_total      counter  footers a stream took from another's parse
 *   larder_remote_footer_bytes       gauge    bytes of remote footers kept for later
 *                                             streams (within remote_footer_memory)
 *   larder_remote_footers_listed_total counter remote footers taken from those kept, a
 *                                             listing naming the same version
 *   larder_remote_footers_revalidated_total counter remote footers taken from those
 *                                             kept after a 304 (no bytes)
 *   larder_remote_footers_shared_total counter remote footer reads a stream took from
 *                                             another stream's read of the same URL
 *   larder_remote_footers_stored_total counter remote footers written to the cache, for
 *                                             the next run
 *   larder_remote_footers_loaded_total counter remote footers an earlier run left in the
 *                                             cache, taken at start
 *   larder_fetch_bytes_total         counter  bytes fetched from remote sources
 *   larder_fetch_requests_total      counter  remote requests completed
 *   larder_fetch_retries_total       counter  remote requests retried
 *   larder_fetch_errors_total        counter  remote requests that failed for good
 *   larder_fetch_inflight            gauge    remote requests in flight
 *   larder_fetch_host_concurrency    gauge    requests allowed at once to the host last
 *                                             measured (fetch_inflight_auto)
 *   larder_fetch_merge_gap_bytes     gauge    the gap last allowed between column chunks
 *                                             read with one request
 *                                             (fetch_merge_gap_auto)
 *   larder_stage_bytes               gauge    bytes of fetched row groups in the staging
 *                                             area (stage_capacity)
 *   larder_stage_reads_total         counter  row groups read from the staging area
 *                                             instead of fetched again
 *   larder_stage_writes_total        counter  row groups written to the staging area
 *   larder_fetch_chunks_shared_total counter  column chunks a row group's buffer took
 *                                             from another projection's requests, not
 *                                             fetched again
 *   larder_stage_seconds_total{stage} counter seconds spent in each stage, summed over
 *                                             the workers: stage="fetch" (over
 *                                             requests), "decode", "cache_read",
 *                                             "assemble"
 *   larder_credentials_refreshes_total
 *                                    counter  S3 credentials resolved again by the refresher
 *                                             (expiry, reload)
 *   larder_credentials_refresh_errors_total
 *                                    counter  S3 credential refreshes that failed (retried
 *                                             with backoff)
 *   larder_credentials_expiry_seconds gauge    seconds until the S3 credentials in force
 *                                             expire (0: they do not)
 *   larder_workers_boosted           gauge    1 while trainers wait and the workers run at
 *                                             the daemon's priority (else worker_nice nicer)
 *   larder_worker_boosts_total       counter  times trainers waiting raised the workers' priority
 *   larder_ring_streams_total        counter  streams opened with a descriptor ring
 *   larder_ring_wakes_sent_total     counter  Wake frames sent to clients asleep on a ring
 *   larder_ring_wakes_received_total counter  Wake frames from clients: releases written
 *                                             in a ring
 *     (Wakes per batch delivered is the system calls a ring saves: near 0
 *     while trainers keep up, about 1 while they wait on the daemon.)
 *   larder_cuda_device_bytes         gauge    GPU memory held for CUDA streams (the device
 *                                             regions that mirror their arenas), all GPUs
 *   larder_cuda_copies_total         counter  batches (or batch parts) copied to a GPU for
 *                                             CUDA streams
 *   larder_cuda_copy_bytes_total     counter  bytes copied to GPUs for CUDA streams
 *   larder_cuda_copy_seconds_total   counter  time workers spent copying batches to GPUs,
 *                                             from the copy's start until it completed
 *     (Bytes over seconds is the rate a worker sees; seconds over copies
 *     the worker time a batch's copy takes beside its assembly.)
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
 *   larder_cache_puts_total          counter  values written
 *   larder_cache_put_bytes_total     counter  bytes written
 *   larder_cache_evictions_total     counter  values evicted
 *   larder_cache_evicted_bytes_total counter  bytes evicted
 *   larder_cache_rejected_total      counter  units refused admission (priority)
 *   larder_cache_checksum_failures_total counter corrupt values found and dropped
 *   larder_cache_write_errors_total  counter  failed cache writes
 *
 *   Remote requests, as a histogram (any thread records them):
 *   larder_fetch_request_duration_seconds histogram  each remote request that
 *                                             succeeded, retries included
 *
 *   Per workload: the streams are grouped by job (the job the trainer named:
 *   larder_stream_options_t.job, else $LARDER_JOB, else "") and dataset (a
 *   short name of the stream's first source: its last path component
 *   without glob characters, URLs without credentials or query, at most 64
 *   bytes).  A group's counters sum its streams, open and closed, so they
 *   only grow.  At most METRICS_MAX_JOBS groups: the streams of any
 *   further (job, dataset) count in job="other",dataset="other".
 *   larder_job_streams{job,dataset}  gauge    open streams of the group
 *   From STATS_STREAM:
 *   larder_stream_batches_total{job,dataset}          counter  batches delivered
 *   larder_stream_rows_total{job,dataset}             counter  rows delivered
 *   larder_stream_bytes_total{job,dataset}            counter  batch bytes delivered
 *   larder_stream_wait_seconds_total{job,dataset}     counter  time the trainers blocked
 *                                                              waiting for batches
 *   larder_stream_compute_seconds_total{job,dataset}  counter  time the trainers spent
 *                                                              between batches
 *   larder_stream_stage_seconds_total{job,dataset,stage} counter  fetch, decode,
 *                                                              cache_read and assemble
 *                                                              time of the units and
 *                                                              batches the streams read
 *   larder_stream_cache_hit_bytes_total{job,dataset}  counter  unit bytes read from the cache
 *   larder_stream_cache_miss_bytes_total{job,dataset} counter  unit bytes decoded for them
 *   larder_stream_cache_readback_bytes_total{job,dataset} counter  unit bytes decoded ahead
 *                                             for them and read back from the cache
 *   Histograms:
 *   larder_batch_wait_seconds{job,dataset}         histogram  the trainer's wait for each
 *                                                  batch (as liblarder reports it in the
 *                                                  batch's release)
 *   larder_stream_first_batch_seconds{job,dataset} histogram  from a stream's open
 *                                                  request to its first batch sent
 *   The stall fraction of a job is
 *   rate(larder_stream_wait_seconds_total) / (rate(larder_stream_wait_seconds_total) +
 *   rate(larder_stream_compute_seconds_total)).
 *
 * Every histogram has the buckets METRICS_BUCKETS (seconds), as _bucket{le},
 * _sum and _count; they are counted with relaxed atomic adds, so a scrape
 * may see a sample in _count a moment before its _sum.
 *
 * Rendering, the endpoint and the groups run on the loop thread; the
 * observe functions may be called from any thread.  The groups and the
 * fetch histogram are the process's (one daemon per process).
 */
#ifndef LARDER_METRICS_H
#define LARDER_METRICS_H

#include <stdint.h>
#include <stdio.h>

#include "stats.h"

typedef struct server server_t;

/* Label sets of the per-workload series: at most this many (job, dataset)
 * pairs, and then job="other",dataset="other". */
#define METRICS_MAX_JOBS 64
/* The longest job name a stream may give (bytes of printable ASCII), and
 * the longest dataset label. */
#define METRICS_MAX_LABEL 64
/* Histogram bucket upper bounds, in seconds (+Inf follows). */
#define METRICS_BUCKETS \
  0.0001, 0.0005, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10

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

/* Whether job is a job name a stream may give: at most METRICS_MAX_LABEL
 * bytes of printable ASCII ("" is the default job). */
int metrics_job_valid(const char *job);
/* The group of a stream that opened with this job and first source, made
 * on first use: a number > 0, which the stream keeps and passes to the
 * functions below (0 means none: they ignore it).  Counts the stream as
 * open in the group.  Loop thread. */
int metrics_group(const char *job, const char *first_source);
/* The stream has closed: its counters so far move into the group's
 * totals.  Loop thread. */
void metrics_group_stream_closed(int group, const stats_stream_t *st);
/* Histogram samples, in nanoseconds.  Any thread. */
void metrics_observe_wait(int group, uint64_t ns);
void metrics_observe_first_batch(int group, uint64_t ns);
void metrics_observe_fetch(uint64_t ns);

#endif /* LARDER_METRICS_H */
