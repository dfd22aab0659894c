/*
 * bench-decode: the larder side of `make bench-decode`.
 *
 *   bench-decode [--runs N] [--batch-rows N] FILE...
 *
 * For each Parquet file, decodes every column on this one thread, the way the
 * daemon serves a file: pq_source_open_file, pq_file_open, a projection of
 * all columns (pq_projection_create with n == 0), then for each row group a
 * pq_reader that fills one reused pq_batch with pq_reader_next, batch_rows
 * (default 65536) rows at a time.  One run is all of that, from opening the
 * file to closing it, so that it does what one DuckDB query does (read the
 * footer, then every page).  One untimed warm-up run (page cache warm), then
 * N timed runs (default 11, or $BENCH_RUNS); the median is reported.
 *
 * Prints one JSON object per file per line:
 *   engine, file, file_bytes, rows, row_groups, decoded_bytes, batch_rows,
 *   runs, times_s, median_s, min_s, mb_per_s, rows_per_s, and the memory
 *   figures below.
 * decoded_bytes, the numerator of MB/s (MB = 1e6 bytes), is the sum of
 * total_uncompressed_size over every column chunk of the file, as
 * duckdb-scan.mjs takes it from DuckDB's parquet_metadata().  rows/s is the
 * file's row count / median_s.
 *
 * Memory, measured during the warm-up run only, so that the timed runs are
 * the decoding thread alone with no extra system calls:
 *   peak_rss_delta_bytes   VmHWM after the run (reset before it through
 *                          /proc/self/clear_refs) less VmRSS before it: the
 *                          exact peak of every resident page, including the
 *                          file's pages when the source maps the file; null
 *                          where that reset is not allowed.
 *   peak_anon_delta_bytes  the largest RssAnon (heap and other anonymous
 *                          memory: what the decoder allocated) less RssAnon
 *                          before the run.  Linux keeps no peak of it, so it
 *                          is sampled: after each pq_reader_next, and every
 *                          0.5 ms by a sampler thread that runs during the
 *                          warm-up only.
 *   peak_file_delta_bytes  the same for RssFile: pages of mapped files.
 *   max_batch_bytes        the largest pq_batch_bytes of one batch.
 *   max_rg_decoded_bytes   the largest row group's decoded size: the sum of
 *                          pq_batch_bytes over its batches.
 *   max_rg_meta_bytes      the largest row group's total_byte_size, as the
 *                          writer recorded it.
 * The requirement is that memory while decoding stays within a small
 * multiple of one row group's decoded size: peak_anon_delta_bytes /
 * max_rg_decoded_bytes is that multiple for the decoder's own memory, and
 * peak_rss_delta_bytes / max_rg_decoded_bytes the same with mapped file
 * pages (reclaimable page cache) counted as well.  Each file is benchmarked in a
 * child process of its own, so that what malloc kept from one file does not
 * hide the next file's peak, and the warm-up is the first decode there.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "parquet/parquet.h"
#include "bench-util.h"

#define DEFAULT_RUNS 11
#define DEFAULT_BATCH_ROWS 65536

typedef struct mem_stats {
  int64_t peak_rss_delta;  /* -1 when unknown */
  int64_t peak_anon_delta; /* -1 when unknown */
  int64_t peak_file_delta; /* -1 when unknown */
  uint64_t max_batch_bytes;
  uint64_t max_rg_decoded_bytes;
} mem_stats;

/* A "Field:   N kB" line of /proc/self/status, in bytes; -1 when absent. */
static int64_t proc_status_bytes(const char *field) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  size_t flen = strlen(field);
  int64_t out = -1;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, field, flen) == 0 && line[flen] == ':') {
      long long kb = 0;
      if (sscanf(line + flen + 1, "%lld", &kb) == 1) out = (int64_t)kb * 1024;
      break;
    }
  }
  fclose(f);
  return out;
}

/* RssAnon and RssFile in one read of /proc/self/status; -1 when absent. */
static void proc_rss_parts(int64_t *anon, int64_t *file) {
  *anon = *file = -1;
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return;
  char line[256];
  long long kb;
  while (fgets(line, sizeof line, f)) {
    if (sscanf(line, "RssAnon: %lld", &kb) == 1) *anon = (int64_t)kb * 1024;
    else if (sscanf(line, "RssFile: %lld", &kb) == 1) *file = (int64_t)kb * 1024;
  }
  fclose(f);
}

/* Peaks of RssAnon and RssFile, sampled by the decoding thread between
 * batches and by a sampler thread in between. */
typedef struct rss_sampler {
  pthread_t thread;
  int running;
  atomic_int stop;
  atomic_llong anon_peak, file_peak;
  int64_t anon_before, file_before;
} rss_sampler;

static void atomic_max(atomic_llong *peak, int64_t v) {
  long long cur = atomic_load(peak);
  while (v > cur && !atomic_compare_exchange_weak(peak, &cur, v)) {}
}

static void sampler_sample(rss_sampler *s) {
  int64_t anon, file;
  proc_rss_parts(&anon, &file);
  atomic_max(&s->anon_peak, anon);
  atomic_max(&s->file_peak, file);
}

static void *sampler_main(void *arg) {
  rss_sampler *s = arg;
  const struct timespec pause = {0, 500 * 1000};
  while (!atomic_load(&s->stop)) {
    sampler_sample(s);
    nanosleep(&pause, NULL);
  }
  return NULL;
}

static void sampler_start(rss_sampler *s) {
  proc_rss_parts(&s->anon_before, &s->file_before);
  atomic_init(&s->stop, 0);
  atomic_init(&s->anon_peak, s->anon_before);
  atomic_init(&s->file_peak, s->file_before);
  s->running = pthread_create(&s->thread, NULL, sampler_main, s) == 0;
}

static void sampler_stop(rss_sampler *s, mem_stats *mem) {
  if (s->running) {
    atomic_store(&s->stop, 1);
    pthread_join(s->thread, NULL);
    s->running = 0;
  }
  sampler_sample(s);
  int64_t anon = atomic_load(&s->anon_peak), file = atomic_load(&s->file_peak);
  mem->peak_anon_delta = s->anon_before >= 0 && anon >= 0 ? anon - s->anon_before : -1;
  mem->peak_file_delta = s->file_before >= 0 && file >= 0 ? file - s->file_before : -1;
}

/* Resets VmHWM to the current RSS (Linux 4.0+).  Returns 0 on success. */
static int reset_peak_rss(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return -1;
  int ok = fputs("5", f) >= 0;
  if (fclose(f) != 0) ok = 0;
  return ok ? 0 : -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median_of(const double *v, int n) {
  double *s = malloc((size_t)n * sizeof *s);
  if (!s) return v[0];
  memcpy(s, v, (size_t)n * sizeof *s);
  qsort(s, (size_t)n, sizeof *s, cmp_double);
  double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
  free(s);
  return m;
}

static void json_string(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
    else if (*p < 0x20) fprintf(out, "\\u%04x", *p);
    else fputc(*p, out);
  }
  fputc('"', out);
}

static void json_opt_int(FILE *out, const char *key, int64_t v) {
  if (v < 0) fprintf(out, ",\"%s\":null", key);
  else fprintf(out, ",\"%s\":%" PRId64, key, v);
}

/*
 * One run: open, decode every row group in batches of batch_rows, close.
 * When mem is not NULL, also gathers the memory figures.  Returns 0 or a
 * negative code with err filled; *rows_out is the number of rows decoded.
 */
static int decode_file(const char *path, const pq_options *opts, int64_t batch_rows,
                       int64_t *rows_out, mem_stats *mem, rss_sampler *sampler, pq_error *err) {
  pq_source src;
  pq_file *file = NULL;
  pq_projection *proj = NULL;
  pq_reader *reader = NULL;
  pq_batch_t batch;
  int64_t rows = 0;
  int rc;

  pq_batch_init(&batch);

  rc = pq_source_open_file(&src, path, err);
  if (rc < 0) {
    pq_batch_free(&batch);
    return rc;
  }
  rc = pq_file_open(&src, opts, &file, err);
  if (rc < 0) goto done;
  rc = pq_projection_create(file, NULL, 0, &proj, err);
  if (rc < 0) goto done;

  const pq_file_meta_t *meta = pq_file_meta(file);
  for (int rg = 0; rg < meta->num_row_groups; rg++) {
    /* One reader walks every row group, keeping its buffers, as a decode
     * worker in the daemon does. */
    if (reader == NULL) rc = pq_reader_open(file, &src, proj, rg, opts, &reader, err);
    else rc = pq_reader_set_row_group(reader, rg, err);
    if (rc < 0) goto done;
    uint64_t rg_bytes = 0;
    for (;;) {
      int64_t n = pq_reader_next(reader, batch_rows, &batch, err);
      if (n < 0) {
        rc = (int)n;
        goto done;
      }
      if (n == 0) break;
      rows += n;
      if (mem) {
        uint64_t b = pq_batch_bytes(&batch);
        rg_bytes += b;
        if (b > mem->max_batch_bytes) mem->max_batch_bytes = b;
        if (sampler) sampler_sample(sampler);
      }
    }
    if (mem && rg_bytes > mem->max_rg_decoded_bytes) mem->max_rg_decoded_bytes = rg_bytes;
    if (rows != meta->row_groups[rg].first_row + meta->row_groups[rg].num_rows) {
      rc =
          pq_error_set(err, LARDER_ECORRUPT,
                       "%s: row group %d: decoded %" PRId64 " rows in all, expected %" PRId64, path,
                       rg, rows, meta->row_groups[rg].first_row + meta->row_groups[rg].num_rows);
      goto done;
    }
  }
  rc = 0;

done:
  if (reader) pq_reader_close(reader);
  pq_batch_free(&batch);
  if (proj) pq_projection_free(proj);
  if (file) pq_file_close(file);
  pq_source_close_file(&src);
  *rows_out = rows;
  return rc;
}

/* Reads the metadata once, outside the timed runs. */
static int file_facts(const char *path, const pq_options *opts, int64_t *num_rows, int *row_groups,
                      uint64_t *decoded_bytes, uint64_t *max_rg_meta_bytes, pq_error *err) {
  pq_source src;
  pq_file *file = NULL;
  int rc = pq_source_open_file(&src, path, err);
  if (rc < 0) return rc;
  rc = pq_file_open(&src, opts, &file, err);
  if (rc < 0) {
    pq_source_close_file(&src);
    return rc;
  }
  const pq_file_meta_t *meta = pq_file_meta(file);
  uint64_t total = 0, max_rg = 0;
  for (int rg = 0; rg < meta->num_row_groups; rg++) {
    const pq_row_group_t *g = &meta->row_groups[rg];
    for (int c = 0; c < meta->num_leaves; c++)
      total += (uint64_t)g->columns[c].total_uncompressed_size;
    if ((uint64_t)g->total_byte_size > max_rg) max_rg = (uint64_t)g->total_byte_size;
  }
  *num_rows = meta->num_rows;
  *row_groups = meta->num_row_groups;
  *decoded_bytes = total;
  *max_rg_meta_bytes = max_rg;
  pq_file_close(file);
  pq_source_close_file(&src);
  return 0;
}

static int bench_file(const char *path, const pq_options *opts, int runs, int64_t batch_rows) {
  pq_error err = {0};
  int64_t num_rows = 0, rows = 0;
  int row_groups = 0;
  uint64_t decoded_bytes = 0, max_rg_meta_bytes = 0;
  struct stat st;

  if (stat(path, &st) != 0) {
    fprintf(stderr, "bench-decode: %s: %s\n", path, strerror(errno));
    return -1;
  }
  int rc = file_facts(path, opts, &num_rows, &row_groups, &decoded_bytes, &max_rg_meta_bytes, &err);
  if (rc < 0) goto fail;

  /* Warm-up, with the memory measurement. */
  mem_stats mem = {-1, -1, -1, 0, 0};
  rss_sampler sampler;
  int can_reset = reset_peak_rss() == 0;
  int64_t rss_before = proc_status_bytes("VmRSS");
  sampler_start(&sampler);
  rc = decode_file(path, opts, batch_rows, &rows, &mem, &sampler, &err);
  int64_t hwm = proc_status_bytes("VmHWM");
  sampler_stop(&sampler, &mem);
  if (rc < 0) goto fail;
  if (can_reset && rss_before >= 0 && hwm >= 0) mem.peak_rss_delta = hwm - rss_before;
  if (rows != num_rows) {
    fprintf(stderr, "bench-decode: %s: decoded %" PRId64 " rows, the footer says %" PRId64 "\n",
            path, rows, num_rows);
    return -1;
  }

  double *times = calloc((size_t)runs, sizeof *times);
  if (!times) {
    fprintf(stderr, "bench-decode: out of memory\n");
    return -1;
  }
  for (int i = 0; i < runs; i++) {
    double t0 = bench_now_s();
    rc = decode_file(path, opts, batch_rows, &rows, NULL, NULL, &err);
    times[i] = bench_now_s() - t0;
    if (rc < 0) {
      free(times);
      goto fail;
    }
  }
  double med = median_of(times, runs), min = times[0];
  for (int i = 1; i < runs; i++)
    if (times[i] < min) min = times[i];

  FILE *out = stdout;
  fputs("{\"engine\":\"larder\",\"threads\":1,\"file\":", out);
  json_string(out, path);
  fprintf(out,
          ",\"file_bytes\":%lld,\"rows\":%" PRId64
          ",\"row_groups\":%d"
          ",\"decoded_bytes\":%" PRIu64 ",\"batch_rows\":%" PRId64 ",\"runs\":%d,\"times_s\":[",
          (long long)st.st_size, num_rows, row_groups, decoded_bytes, batch_rows, runs);
  for (int i = 0; i < runs; i++) fprintf(out, "%s%.6f", i ? "," : "", times[i]);
  fprintf(out,
          "],\"median_s\":%.6f,\"min_s\":%.6f,\"mb_per_s\":%.1f"
          ",\"rows_per_s\":%.0f",
          med, min, (double)decoded_bytes / 1e6 / med, (double)num_rows / med);
  json_opt_int(out, "peak_rss_delta_bytes", mem.peak_rss_delta);
  json_opt_int(out, "peak_anon_delta_bytes", mem.peak_anon_delta);
  json_opt_int(out, "peak_file_delta_bytes", mem.peak_file_delta);
  fprintf(out,
          ",\"max_batch_bytes\":%" PRIu64 ",\"max_rg_decoded_bytes\":%" PRIu64
          ",\"max_rg_meta_bytes\":%" PRIu64 "}\n",
          mem.max_batch_bytes, mem.max_rg_decoded_bytes, max_rg_meta_bytes);
  fflush(out);
  free(times);
  return 0;

fail:
  fprintf(stderr, "bench-decode: %s: %s (%s)\n", path, err.msg[0] ? err.msg : larder_strerror(rc),
          larder_err_name(rc));
  return -1;
}

static void usage(void) {
  fprintf(stderr, "usage: bench-decode [--runs N] [--batch-rows N] FILE...\n");
  exit(2);
}

static long long parse_positive(const char *s) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || end == s || *end || v <= 0) usage();
  return v;
}

int main(int argc, char **argv) {
  int runs = DEFAULT_RUNS;
  int64_t batch_rows = DEFAULT_BATCH_ROWS;
  const char *env = getenv("BENCH_RUNS");
  if (env && *env) runs = (int)parse_positive(env);

  int i = 1;
  for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
    if (strcmp(argv[i], "--") == 0) {
      i++;
      break;
    } else if (strcmp(argv[i], "--runs") == 0 && i + 1 < argc) {
      runs = (int)parse_positive(argv[++i]);
    } else if (strcmp(argv[i], "--batch-rows") == 0 && i + 1 < argc) {
      batch_rows = parse_positive(argv[++i]);
    } else {
      usage();
    }
  }
  if (i >= argc) usage();

  pq_options opts;
  pq_options_init(&opts);

  int status = 0;
  for (; i < argc; i++) {
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) {
      perror("bench-decode: fork");
      return 1;
    }
    if (pid == 0) {
      int rc = bench_file(argv[i], &opts, runs, batch_rows);
      fflush(NULL);
      _exit(rc == 0 ? 0 : 1);
    }
    int wstatus;
    while (waitpid(pid, &wstatus, 0) < 0) {
      if (errno != EINTR) {
        perror("bench-decode: waitpid");
        return 1;
      }
    }
    if (!WIFEXITED(wstatus) || WEXITSTATUS(wstatus) != 0) {
      if (WIFSIGNALED(wstatus))
        fprintf(stderr, "bench-decode: %s: killed by signal %d\n", argv[i], WTERMSIG(wstatus));
      status = 1;
    }
  }
  return status;
}
