/*
 * stats.h: the daemon's counters, defined once (prefix stats_).
 *
 * STATS_GLOBAL and STATS_STREAM are X-macro lists: XX(name, kind, help)
 * with kind
 *   COUNTER  only grows;
 *   GAUGE    goes up and down;
 *   SECONDS  a counter of nanoseconds (name ends in _ns);
 *   STAGE    a counter of nanoseconds spent in one stage of a unit's or a
 *            batch's way (name <stage>_ns).
 * The daemon's struct, the stats reply that larderctl prints (the raw
 * counters, nanoseconds included), and the Prometheus names are all
 * generated from them, so the three can never disagree.  Prometheus takes
 * base units (metrics.h): COUNTER is larder_<name>_total, GAUGE
 * larder_<name>, SECONDS larder_<name less _ns>_seconds_total and STAGE one
 * series of larder_stage_seconds_total{stage="<name less _ns>"}; the
 * STATS_STREAM entries likewise with larder_stream_ in front.
 *
 * Counters are updated with relaxed atomic adds from any thread; readers
 * see each value whole but not a consistent snapshot across values.
 */
#ifndef LARDER_STATS_H
#define LARDER_STATS_H

#include <stdint.h>

#define STATS_GLOBAL(XX)                                                                     \
  XX(clients, GAUGE, "connected clients")                                                    \
  XX(streams, GAUGE, "open streams")                                                         \
  XX(streams_opened, COUNTER, "streams opened")                                              \
  XX(stream_errors, COUNTER, "streams ended by an error")                                    \
  XX(protocol_errors, COUNTER, "connections closed for protocol errors")                     \
  XX(batches, COUNTER, "batches delivered")                                                  \
  XX(batch_rows, COUNTER, "rows delivered")                                                  \
  XX(batch_bytes, COUNTER, "batch bytes delivered through shared memory")                    \
  XX(units_decoded, COUNTER, "units decoded from Parquet")                                   \
  XX(units_from_cache, COUNTER, "units read from the cache")                                 \
  XX(unit_errors, COUNTER, "units that failed to load")                                      \
  XX(unit_shared, COUNTER, "unit loads shared by several streams")                           \
  XX(unit_loads_cancelled, COUNTER,                                                          \
     "unit loads dropped before they started, "                                              \
     "no stream wanting them any more")                                                      \
  XX(cache_hit_bytes, COUNTER, "bytes served from the cache")                                \
  XX(cache_miss_bytes, COUNTER, "bytes decoded because the cache lacked them")               \
  XX(cache_readback_bytes, COUNTER,                                                          \
     "unit bytes read back from the cache after "                                            \
     "being decoded moments before with the unit "                                           \
     "a stream asked for (its row group's others): "                                         \
     "decode work, not hits")                                                                \
  XX(prefetch_loaded_bytes, COUNTER,                                                         \
     "unit bytes loaded for larderctl prefetch "                                             \
     "alone (not the trainers' hits or misses)")                                             \
  XX(memory_bytes, GAUGE, "decoded unit bytes held in memory")                               \
  XX(footer_bytes, GAUGE,                                                                    \
     "bytes of parsed Parquet footers held for open "                                        \
     "streams (within footer_memory)")                                                       \
  XX(footer_files, GAUGE,                                                                    \
     "parsed footers held: one per version of a file, "                                      \
     "shared by every stream that reads it")                                                 \
  XX(footers_parsed, COUNTER, "Parquet footers parsed")                                      \
  XX(footers_shared, COUNTER, "footers a stream took from another's parse")                  \
  XX(remote_footer_bytes, GAUGE,                                                             \
     "bytes of remote footers kept for later "                                               \
     "streams (within remote_footer_memory)")                                                \
  XX(remote_footers_listed, COUNTER,                                                         \
     "remote footers taken from those kept, "                                                \
     "a listing naming the same version")                                                    \
  XX(remote_footers_revalidated, COUNTER,                                                    \
     "remote footers taken from those "                                                      \
     "kept after a 304 (no bytes)")                                                          \
  XX(remote_footers_shared, COUNTER,                                                         \
     "remote footer reads a stream took from "                                               \
     "another stream's read of the same URL")                                                \
  XX(remote_footers_stored, COUNTER,                                                         \
     "remote footers written to the cache, "                                                 \
     "for the next run")                                                                     \
  XX(remote_footers_loaded, COUNTER,                                                         \
     "remote footers an earlier run left in "                                                \
     "the cache, taken at start")                                                            \
  XX(fetch_bytes, COUNTER, "bytes fetched from remote sources")                              \
  XX(fetch_requests, COUNTER, "remote requests completed")                                   \
  XX(fetch_retries, COUNTER, "remote requests retried")                                      \
  XX(fetch_errors, COUNTER, "remote requests that failed for good")                          \
  XX(fetch_inflight, GAUGE, "remote requests in flight")                                     \
  XX(fetch_host_concurrency, GAUGE,                                                          \
     "requests allowed at once to the host last measured (fetch_inflight_auto)")             \
  XX(fetch_merge_gap_bytes, GAUGE,                                                           \
     "the gap last allowed between column chunks read "                                      \
     "with one request (fetch_merge_gap_auto)")                                              \
  XX(stage_bytes, GAUGE, "bytes of fetched row groups in the staging area (stage_capacity)") \
  XX(stage_reads, COUNTER, "row groups read from the staging area instead of fetched again") \
  XX(stage_writes, COUNTER, "row groups written to the staging area")                        \
  XX(fetch_chunks_shared, COUNTER,                                                           \
     "column chunks a row group's buffer took from "                                         \
     "another projection's requests, not fetched again")                                     \
  XX(fetch_ns, STAGE, "time spent fetching (summed over requests)")                          \
  XX(credentials_refreshes, COUNTER,                                                         \
     "S3 credentials resolved again by the "                                                 \
     "refresher (expiry, reload)")                                                           \
  XX(credentials_refresh_errors, COUNTER,                                                    \
     "S3 credential refreshes that "                                                         \
     "failed (retried with backoff)")                                                        \
  XX(credentials_expiry_seconds, GAUGE,                                                      \
     "seconds until the S3 credentials in "                                                  \
     "force expire (0: they do not)")                                                        \
  XX(decode_ns, STAGE, "time spent decoding Parquet")                                        \
  XX(cache_read_ns, STAGE, "time spent reading the cache")                                   \
  XX(assemble_ns, STAGE, "time spent assembling batches")                                    \
  XX(workers_boosted, GAUGE,                                                                 \
     "1 while trainers wait and the workers run at "                                         \
     "the daemon's priority (else worker_nice nicer)")                                       \
  XX(worker_boosts, COUNTER,                                                                 \
     "times trainers waiting raised the workers' "                                           \
     "priority")                                                                             \
  XX(ring_streams, COUNTER, "streams opened with a descriptor ring")                         \
  XX(ring_wakes_sent, COUNTER, "Wake frames sent to clients asleep on a ring")               \
  XX(ring_wakes_received, COUNTER,                                                           \
     "Wake frames from clients: releases "                                                   \
     "written in a ring")                                                                    \
  XX(cuda_device_bytes, GAUGE,                                                               \
     "GPU memory held for CUDA streams (the device "                                         \
     "regions that mirror their arenas), all GPUs")                                          \
  XX(cuda_copies, COUNTER, "batches (or batch parts) copied to a GPU for CUDA streams")      \
  XX(cuda_copy_bytes, COUNTER, "bytes copied to GPUs for CUDA streams")                      \
  XX(cuda_copy_ns, SECONDS,                                                                  \
     "time workers spent copying batches to GPUs, "                                          \
     "from the copy's start until it completed")

#define STATS_STREAM(XX)                                               \
  XX(batches, COUNTER, "batches delivered")                            \
  XX(rows, COUNTER, "rows delivered")                                  \
  XX(bytes, COUNTER, "batch bytes delivered")                          \
  XX(wait_ns, SECONDS, "time the trainer blocked waiting for batches") \
  XX(compute_ns, SECONDS, "time the trainer spent between batches")    \
  XX(fetch_ns, STAGE, "fetch time of the units it read")               \
  XX(decode_ns, STAGE, "decode time of the units it read")             \
  XX(cache_read_ns, STAGE, "cache read time of the units it read")     \
  XX(assemble_ns, STAGE, "time assembling its batches")                \
  XX(cache_hit_bytes, COUNTER, "unit bytes it read from the cache")    \
  XX(cache_miss_bytes, COUNTER, "unit bytes decoded for it")           \
  XX(cache_readback_bytes, COUNTER,                                    \
     "unit bytes decoded with another unit of it "                     \
     "and read back from the cache")

typedef struct stats_global {
#define STATS_FIELD_(name, kind, help) uint64_t name;
  STATS_GLOBAL(STATS_FIELD_)
} stats_global_t;

typedef struct stats_stream {
  STATS_STREAM(STATS_FIELD_)
#undef STATS_FIELD_
} stats_stream_t;

#define STATS_ADD(s, field, v) __atomic_add_fetch(&(s)->field, (uint64_t)(v), __ATOMIC_RELAXED)
#define STATS_SUB(s, field, v) __atomic_sub_fetch(&(s)->field, (uint64_t)(v), __ATOMIC_RELAXED)
#define STATS_SET(s, field, v) __atomic_store_n(&(s)->field, (uint64_t)(v), __ATOMIC_RELAXED)
#define STATS_GET(s, field) __atomic_load_n(&(s)->field, __ATOMIC_RELAXED)

#endif /* LARDER_STATS_H */
