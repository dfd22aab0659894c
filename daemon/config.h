/*
 * config.h: larderd's configuration (prefix config_).
 *
 * Conventions
 * -----------
 * - Every key is declared once, in CONFIG_KEYS below: its name, type,
 *   default, whether a SIGHUP can change it live, and its documentation.
 *   The parser, `larderd --help-config`, the example config
 *   (config/larderd.conf.example, checked against this list by the tests)
 *   and the reload logic all come from that list.
 * - Sources, lowest precedence first: defaults, the file, then command-line
 *   `--key=value` flags.
 * - The file is INI (config.c reads it; keys may sit in any section): lines
 *   "key = value" (or "key : value"), "[section]", and comments from ';' or
 *   '#' at the start of a line or ';' after a space.  Lines and values may
 *   be of any length, as long as a flag's.  Leading spaces are ignored (a
 *   line never continues the one before).
 * - Sizes accept K, M, G and T suffixes (powers of 1024); durations are
 *   seconds.
 * - Secrets may come from files: setting s3_secret_key_file (likewise
 *   s3_access_key_file, s3_session_token_file) reads the file at once into
 *   s3_secret_key and records its path; setting s3_secret_key itself
 *   forgets the path, so of the two the one set last wins.  A reload
 *   applies the file and the flags again, so it reads the files again.  A
 *   secret file that cannot be read, is not a regular file, is empty or
 *   holds more than one line is an error naming the key and the path; a
 *   secret's value is never shown (config_each shows "(set)").
 * - `allow` is the one key that may repeat: each line adds a rule to the
 *   allowlist (acl.h documents the syntax); on the command line, every
 *   --allow=... flag adds one.
 * - Errors: config_load_file returns a negative code and a message naming
 *   the file, the line and what is wrong with it (a NUL or control byte and
 *   its column, no '=', an unknown key, a bad value), never the line's text
 *   beyond a key name, since it may be a secret.  Only the loop thread
 *   touches a config_t.
 */
#ifndef LARDER_CONFIG_H
#define LARDER_CONFIG_H

/* The value of an AUTO key set to "auto". */
#define CONFIG_AUTO (-1)

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* XX(name, type, default, live, doc): type is STR, SIZE, U64, BOOL, LEVEL or
 * AUTO (a BOOL that may also be "auto": CONFIG_AUTO). */
#define CONFIG_KEYS(XX)                                                                          \
  XX(socket, STR, "/run/larder/larderd.sock", 0,                                                 \
     "Unix socket the daemon listens on (ignored under systemd socket "                          \
     "activation)")                                                                              \
  XX(socket_mode, U64, "0660", 0, "permissions of the socket (octal)")                           \
  XX(cache_dir, STR, "/var/cache/larder", 0, "directory of the RocksDB cache of decoded data")   \
  XX(cache_capacity, SIZE, "64G", 1,                                                             \
     "bytes of decoded data the cache keeps (exceeded by at most one unit)")                     \
  XX(stage_capacity, SIZE, "64G", 1,                                                             \
     "compressed bytes of remote row groups that the cache does not keep, "                      \
     "staged as fetched in cache_dir/stage so that each is fetched once and "                    \
     "its units decode from the disk, not once per unit when the shuffle "                       \
     "spreads them over the epoch; beside cache_capacity, within the disk "                      \
     "reserve the cache keeps, the cache's priorities (0: off)")                                 \
  XX(cache_idle_evict, U64, "604800", 1,                                                         \
     "seconds after which an unread cache entry is evicted first")                               \
  XX(cache_flush_threads, U64, "0", 0,                                                           \
     "RocksDB memtables written to disk at once; the cache keeps this many "                     \
     "plus 2 memtables of 64 MiB in memory, and a cold epoch on many cores "                     \
     "fills the cache no faster than they flush (0 = workers / 4, at least 2 "                   \
     "and at most 8; at most 64)")                                                               \
  XX(workers, U64, "0", 0,                                                                       \
     "worker threads for decoding, cache I/O and batch assembly (0 = the cores larderd may run " \
     "on, by its CPU affinity)")                                                                 \
  XX(worker_nice, U64, "10", 0,                                                                  \
     "niceness the workers add to the daemon's (at most 19), so that when "                      \
     "cores are short the loop that hands out batches, and the trainers, run "                   \
     "first; while trainers wait on the workers they run at the daemon's "                       \
     "niceness, where the system allows (0 = always the same priority)")                         \
  XX(loop_slice_us, U64, "100", 0,                                                               \
     "time slice in microseconds that the loop thread, which hands out the "                     \
     "batches, asks of the kernel's scheduler (EEVDF, Linux 6.12 and later; "                    \
     "older kernels ignore it): a short slice lets it run the moment a "                         \
     "release or a finished batch wakes it, where it would wait out a "                          \
     "worker's slice, milliseconds on a busy host (0 = the kernel's default; "                   \
     "the kernel holds it to 100-100000)")                                                       \
  XX(memory_limit, SIZE, "8G", 1,                                                                \
     "bytes of decoded units held in memory for shuffling, all streams; a "                      \
     "stream whose window would pass it beside the open windows is refused "                     \
     "(LARDER_ELIMIT), but the first window always opens, up to "                                \
     "shuffle_window_bytes even when that is larger")                                            \
  XX(footer_memory, SIZE, "1G", 1,                                                               \
     "bytes of parsed Parquet footers held for the files that open streams "                     \
     "read, each file's once however many streams read it; an open that "                        \
     "would pass it fails")                                                                      \
  XX(unit_rows, U64, "4096", 0, "rows per shuffle unit at most (cut from row groups; <= 65536)") \
  XX(unit_bytes, SIZE, "4M", 0,                                                                  \
     "decoded bytes per shuffle unit at most, of whole rows (every column, "                     \
     "projected or not), estimated from the footer")                                             \
  XX(shuffle_window_bytes, SIZE, "512M", 0,                                                      \
     "decoded bytes whose rows are shuffled together, by default")                               \
  XX(shuffle_row_groups, AUTO, "auto", 0,                                                        \
     "keep each row group's units together in the shuffle: a cold remote "                       \
     "epoch then streams at the network's rate, but each window mixes fewer "                    \
     "places (no good for files sorted by label); auto: together unless the "                    \
     "footers' statistics show the rows sorted or grouped by a column (the "                     \
     "stream's open note and larderctl clients say which)")                                      \
  XX(partitions, U64, "1", 1,                                                                    \
     "node partitions of each dataset, for streams that do not choose: the "                     \
     "ranks of each node (local_world_size) read, fetch and cache only "                         \
     "their node's share (1: none)")                                                             \
  XX(prefetch_batches, U64, "8", 1,                                                              \
     "batches prepared ahead of each stream, beyond those its client holds; "                    \
     "at least the stream's window")                                                             \
  XX(arena_bytes, SIZE, "256M", 1,                                                               \
     "shared-memory arena per stream, unless the client asks otherwise")                         \
  XX(max_arena_bytes, SIZE, "2G", 1, "largest arena a client may ask for")                       \
  XX(shm_ring, BOOL, "true", 1,                                                                  \
     "deliver batches and take releases through a shared-memory ring per "                       \
     "stream, for the clients that ask (liblarder does): no system call per "                    \
     "batch while both sides keep up; false sends frames")                                       \
  XX(cuda_fd_handles, BOOL, "false", 1,                                                          \
     "export a CUDA stream's device memory as a VMM allocation whose file "                      \
     "descriptor goes to the trainer over the socket, a capability only it "                     \
     "holds, for trainers whose liblarder can map one; false exports legacy "                    \
     "CUDA IPC handles (a 64-byte token that opens the memory for any "                          \
     "process, of any user, that presents it)")                                                  \
  XX(max_streams_per_client, U64, "64", 1,                                                       \
     "streams one connection may open, counting its closed CUDA streams whose "                  \
     "device memory it still maps")                                                              \
  XX(max_clients, U64, "1024", 1, "connections at once")                                         \
  XX(max_frame, SIZE, "16M", 0, "largest protocol frame accepted")                               \
  XX(frame_timeout, U64, "30", 1,                                                                \
     "seconds a client may take to send the rest of a frame it has begun; "                      \
     "then its connection is closed, and the memory the frame held freed")                       \
  XX(hello_timeout, U64, "5", 1,                                                                 \
     "seconds a new connection may take to complete its handshake; then it "                     \
     "is closed, giving back its place in max_clients and "                                      \
     "max_clients_per_uid (0: no limit)")                                                        \
  XX(verify_crc, BOOL, "true", 1, "verify Parquet page CRCs when present")                       \
  XX(cache_verify_blocks, BOOL, "true", 0,                                                       \
     "check RocksDB's own block and blob checksums on every cache read, "                        \
     "beside larder's own: off is faster (Debian's RocksDB computes them in "                    \
     "software), but a damaged table block on the cache disk then aborts "                       \
     "the daemon")                                                                               \
  XX(max_chunk_decoded_bytes, SIZE, "2G", 1,                                                     \
     "ceiling on decoded bytes per Parquet column chunk (bomb guard): what "                     \
     "one load of a unit decodes, not the rows it skips to reach the unit; a "                   \
     "unit past it fails its stream with an error that names unit_rows")                         \
  XX(fetch_inflight_per_host, U64, "16", 1,                                                      \
     "remote requests in flight to one host (at most: see fetch_inflight_auto)")                 \
  XX(fetch_inflight_bytes, SIZE, "512M", 1,                                                      \
     "bytes of remote ranges in flight, all hosts (the read-ahead bound)")                       \
  XX(fetch_retries, U64, "8", 1,                                                                 \
     "retries of a remote request (5xx, 429, resets, stalls) before giving up")                  \
  XX(fetch_retry_base_ms, U64, "100", 1,                                                         \
     "first retry delay in ms; it doubles each retry, with jitter")                              \
  XX(fetch_connect_timeout, U64, "10", 1, "seconds to connect to a remote")                      \
  XX(fetch_low_speed_bytes, U64, "1024", 1, "a transfer slower than this many bytes/s ...")      \
  XX(fetch_low_speed_time, U64, "30", 1, "... for this many seconds is a stall, retried")        \
  XX(fetch_whole_bytes, SIZE, "1G", 0,                                                           \
     "objects of servers that ignore Range, kept whole in memory (LRU); "                        \
     "also the most any whole-object answer may bring (a larger object "                         \
     "behind such a server fails its stream)")                                                   \
  XX(fetch_merge_gap, SIZE, "1M", 1,                                                             \
     "column chunks closer than this are read with one range request (at "                       \
     "most: see fetch_merge_gap_auto)")                                                          \
  XX(fetch_merge_gap_auto, BOOL, "true", 1,                                                      \
     "merge two chunks only when the bytes between them take less time than "                    \
     "a request's round trip: the gap is the host's measured wait for a first "                  \
     "byte times one request's measured rate, up to fetch_merge_gap; false: "                    \
     "every gap below fetch_merge_gap")                                                          \
  XX(fetch_inflight_auto, BOOL, "true", 1,                                                       \
     "size each host's concurrency from its measured link, up to "                               \
     "fetch_inflight_per_host: as many requests as keep the link busy and no "                   \
     "more, so that read-ahead does not slow the range needed next; false: "                     \
     "always fetch_inflight_per_host")                                                           \
  XX(fetch_part_bytes, SIZE, "4M", 1,                                                            \
     "longest single range request; longer ranges are fetched in parts")                         \
  XX(remote_footer_memory, SIZE, "64M", 0,                                                       \
     "bytes of remote objects' raw footers kept for the streams that open "                      \
     "them later (revalidated with a conditional request, or by a listing's "                    \
     "ETag; 0: keep none)")                                                                      \
  XX(footer_guess, SIZE, "64K", 1,                                                               \
     "bytes read from the end of a remote object to find its footer")                            \
  XX(revalidate, U64, "0", 1,                                                                    \
     "seconds between checks that remote objects are unchanged, at epoch "                       \
     "starts (0: shards are immutable, never re-checked)")                                       \
  XX(tls_verify, BOOL, "true", 0, "verify TLS certificates of https:// sources")                 \
  XX(ca_file, STR, "", 0, "CA bundle for TLS (empty: the system's)")                             \
  XX(s3_region, STR, "us-east-1", 0, "S3 region (SigV4 signing)")                                \
  XX(s3_endpoint, STR, "", 0, "S3-compatible endpoint such as http://minio:9000 (empty: AWS)")   \
  XX(s3_path_style, BOOL, "false", 0,                                                            \
     "address buckets in the path (MinIO, Ceph) instead of the host name")                       \
  XX(s3_list_max_keys, U64, "1000", 0,                                                           \
     "keys per ListObjectsV2 page when listing s3:// prefixes (1 to 1000)")                      \
  XX(s3_profile, STR, "", 1,                                                                     \
     "profile in ~/.aws/credentials and ~/.aws/config (empty: $AWS_PROFILE "                     \
     "or default); the credentials, from wherever they come, are looked up "                     \
     "again on SIGHUP")                                                                          \
  XX(s3_access_key, STR, "", 1, "S3 access key (empty: $AWS_ACCESS_KEY_ID or the profile)")      \
  XX(s3_secret_key, STR, "", 1, "S3 secret key (never logged)")                                  \
  XX(s3_session_token, STR, "", 1,                                                               \
     "S3 session token (never logged); a reload puts a new one in force for "                    \
     "the next request")                                                                         \
  XX(s3_access_key_file, STR, "", 1,                                                             \
     "file holding s3_access_key, read at start and again at every reload "                      \
     "(the spaces and line end around it are dropped; of s3_access_key and "                     \
     "s3_access_key_file, the one set last wins; empty: none)")                                  \
  XX(s3_secret_key_file, STR, "", 1,                                                             \
     "file holding s3_secret_key, so that the secret need not sit in this "                      \
     "file: read at start and again at every reload, like s3_access_key_file")                   \
  XX(s3_session_token_file, STR, "", 1,                                                          \
     "file holding s3_session_token, read at start and again at every "                          \
     "reload, like s3_access_key_file: to rotate a token, rewrite the file "                     \
     "and send SIGHUP (larderctl reload)")                                                       \
  XX(s3_sts_endpoint, STR, "", 0,                                                                \
     "STS endpoint for web identity credentials ($AWS_WEB_IDENTITY_TOKEN_FILE "                  \
     "and $AWS_ROLE_ARN; empty: $AWS_ENDPOINT_URL_STS, else the region's)")                      \
  XX(s3_credentials_refresh_margin, U64, "300", 0,                                               \
     "seconds before temporary S3 credentials (web identity, "                                   \
     "credential_process, container, instance role) expire that they are "                       \
     "fetched again; at half their lifetime when that comes sooner")                             \
  XX(log_level, LEVEL, "info", 1, "debug, info, notice, warning or err")                         \
  XX(log_file, STR, "", 0,                                                                       \
     "append the log to this file instead of stderr (reopened on SIGHUP, for "                   \
     "logrotate; empty: stderr)")                                                                \
  XX(daemonize, BOOL, "false", 0,                                                                \
     "detach from the terminal (double fork, setsid, working directory /) "                      \
     "once the socket listens; without log_file the log goes to /dev/null")                      \
  XX(pid_file, STR, "", 0,                                                                       \
     "write the daemon's pid to this file once it listens, remove it at exit "                   \
     "(empty: none)")                                                                            \
  XX(local_roots, STR, "", 1,                                                                    \
     "directories local sources must lie in, separated by ':' or ','; "                          \
     "symlinks and .. are resolved first (empty: anywhere; production "                          \
     "configs should set it)")                                                                   \
  XX(admin_group, STR, "", 1,                                                                    \
     "group (name or gid) whose members may run larderctl evict, prefetch, "                     \
     "verify, reload and config, besides root (empty: root only)")                               \
  XX(max_arena_bytes_per_client, SIZE, "8G", 1,                                                  \
     "shared-memory bytes (arenas and descriptor rings) of all the streams "                     \
     "of one connection, with the CUDA regions kept for its trainer")                            \
  XX(max_arena_bytes_per_uid, SIZE, "32G", 1,                                                    \
     "shared-memory bytes (arenas and descriptor rings) of all the streams "                     \
     "of one user's connections together, with the CUDA regions kept for "                       \
     "them (0: no limit)")                                                                       \
  XX(max_pending_per_client, U64, "16", 1,                                                       \
     "stream opens and admin jobs (prefetch, cat, ...) one connection may "                      \
     "have in progress at once")                                                                 \
  XX(max_clients_per_uid, U64, "256", 1, "connections one user may hold at once (0: no limit)")  \
  XX(metrics_listen, STR, "", 0,                                                                 \
     "serve Prometheus metrics over HTTP on this address, such as "                              \
     "127.0.0.1:9464 or [::1]:9464, at /metrics (empty: off)")                                   \
  XX(metrics_textfile, STR, "", 1,                                                               \
     "write Prometheus metrics to this file for node_exporter's textfile "                       \
     "collector, such as /var/lib/prometheus/node-exporter/larder.prom "                         \
     "(empty: off)")                                                                             \
  XX(metrics_interval, U64, "15", 1, "seconds between writes of metrics_textfile")

typedef struct config {
#define CONFIG_FIELD_STR char *
#define CONFIG_FIELD_SIZE uint64_t
#define CONFIG_FIELD_U64 uint64_t
#define CONFIG_FIELD_BOOL int
#define CONFIG_FIELD_AUTO int /* 0, 1 or CONFIG_AUTO */
#define CONFIG_FIELD_LEVEL int
#define CONFIG_DECLARE_(name, type, def, live, doc) CONFIG_FIELD_##type name;
  CONFIG_KEYS(CONFIG_DECLARE_)
#undef CONFIG_DECLARE_
  char *path; /* the file it came from, or NULL */
  /* The allowlist: one "allow = PREFIX [uid=..] [gid=..]" line each, in
   * order (repeatable, so not in CONFIG_KEYS; acl.h parses them).  None:
   * every URL is allowed. */
  char **allow;
  size_t num_allow;
} config_t;

/* Fills cfg with the defaults.  Returns 0 or LARDER_ENOMEM. */
int config_defaults(config_t *cfg);

/* Applies the file at path (missing_ok: a missing file is not an error),
 * its settings in order, reading the secret files it names; cfg->path
 * becomes a copy of path.  Returns 0, or LARDER_EINVAL (a line it refuses),
 * LARDER_EIO (it, or a secret file it names, cannot be read) or
 * LARDER_ENOMEM, with "path:line: why" in err (just "path: why" when the
 * file does not open); cfg then holds the settings before that line. */
int config_load_file(config_t *cfg, const char *path, int missing_ok, char *err, size_t errlen);

/* Applies one "key=value" setting (a command-line flag without its "--");
 * a *_file key reads its file now.  Returns 0, or LARDER_EINVAL (a bad
 * value, a secret file that is empty or of several lines), LARDER_EIO (a
 * secret file that cannot be read) or LARDER_ENOMEM, with a message that
 * names the key (and the file), never a secret. */
int config_set(config_t *cfg, const char *key, const char *value, char *err, size_t errlen);

/* Copies the live keys of next into cur and lists (comma-separated, into
 * restart) the keys that changed but need a restart; with changed != NULL,
 * also the live keys that changed (secrets by name only).  The allowlist
 * is live. */
void config_apply_live(config_t *cur, const config_t *next, char *restart, size_t restart_len);
void config_apply_live_report(config_t *cur, const config_t *next, char *restart,
                              size_t restart_len, char *changed, size_t changed_len);

/* Calls fn for every key with its current value as text (secret keys that
 * are set show as "(set)"), then once per allow line (key "allow"). */
void config_each(const config_t *cfg,
                 void (*fn)(const char *key, const char *value, int live, void *arg), void *arg);

/* Whether a key holds a secret that is never logged or shown. */
int config_is_secret(const char *key);

void config_free(config_t *cfg);

/* Writes every key with its default and documentation (the example file). */
void config_print_reference(FILE *out);

/*
 * Secrets handed over by systemd (LoadCredential=s3_secret_key:PATH and the
 * like, read from $CREDENTIALS_DIRECTORY): each of s3_access_key,
 * s3_secret_key and s3_session_token that neither the configuration nor a
 * flag sets, nor its *_file, comes from the credential file of its name
 * when there is one, as if its *_file named it (read again at reload).
 * Returns 0, or the code of a credential file that cannot be read, with a
 * message naming the key and the path.
 */
int config_systemd_credentials(config_t *cfg, char *err, size_t errlen);

#endif /* LARDER_CONFIG_H */
