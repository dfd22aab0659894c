/*
 * example-trainer.c: a trainer's data loop against larderd, printing
 * throughput and the stall fraction (the share of time the trainer waited
 * for data instead of computing) per epoch.
 *
 *   example-trainer [OPTIONS] SOURCE...     (--help lists them)
 *
 * --compute-ms simulates the model's step per batch, so that the stall
 * fraction means what it means on a GPU: 0% when data is always ready, 100%
 * when the trainer does nothing but wait.  Like a trainer waiting on its
 * GPU, it sleeps through the step and leaves the CPU free.
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "larder.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void step(double seconds) {
  struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  nanosleep(&ts, NULL);
}

/* Touches every byte of the batch once, as a real trainer's copy to the GPU
 * would, and folds it into a checksum. */
static uint64_t touch(const larder_array_t *a) {
  uint64_t h = 0;
  const uint8_t *v = larder_array_values(a);
  uint64_t n = larder_array_values_size(a);
  for (uint64_t i = 0; i + 8 <= n; i += 64) {
    uint64_t x;
    memcpy(&x, v + i, 8);
    h += x;
  }
  for (int i = 0; i < larder_array_num_children(a); i++) h += touch(larder_array_child(a, i));
  return h;
}

static const char usage_text[] =
    "usage: example-trainer [OPTIONS] SOURCE...\n"
    "Reads a dataset from larderd as one rank of a trainer, printing each epoch's\n"
    "throughput and stall (the share of time spent waiting for data).\n"
    "\n"
    "  --socket PATH            larderd's socket (default: $LARDER_SOCKET, else the\n"
    "                           daemon's default)\n"
    "  --batch-size N           rows per batch on this rank (default 256)\n"
    "  --epochs N               stop at epoch N, counted from 0 (default 1; 0: never)\n"
    "  --compute-ms X           sleep X ms per batch, as a model's step would (default 0)\n"
    "  --columns a,b.c          read these columns only (default: all)\n"
    "  --seed N                 shuffle seed (default 0)\n"
    "  --no-shuffle             dataset order\n"
    "  --rank R                 this rank (default: $RANK, else 0)\n"
    "  --world-size W           ranks in the job (default: $WORLD_SIZE, else 1)\n"
    "  --local-world-size L     ranks per node (default: $LOCAL_WORLD_SIZE, else W)\n"
    "  --partitions P           node partitions (default: the daemon's, 1)\n"
    "  --unit-rows N            rows per shuffle unit (default: the daemon's)\n"
    "  --window N               batches the trainer may hold (default 32)\n"
    "  --help                   this text\n";

/* Parses a whole decimal number in [min, max] for option name, or exits
 * with a usage error: "--batch-size abc" must not become 0. */
static long long number(const char *name, const char *v, long long min, long long max) {
  char *end;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (errno || end == v || *end != '\0' || x < min || x > max) {
    fprintf(stderr, "example-trainer: --%s %s: a whole number from %lld to %lld\n%s", name, v, min,
            max, usage_text);
    exit(2);
  }
  return x;
}

/* The flags, then the training loop: an example reads best top to bottom. */
int main(int argc, char **argv) {
  const char *socket = NULL, *columns = NULL;
  larder_stream_options_t o;
  larder_stream_options_init(&o);
  o.epochs = 1;
  double compute_ms = 0;
  enum {
    O_BATCH = 256,
    O_EPOCHS,
    O_COMPUTE,
    O_COLUMNS,
    O_SEED,
    O_NOSHUF,
    O_RANK,
    O_WORLD,
    O_LOCAL,
    O_PARTS,
    O_UNIT,
    O_WINDOW,
    O_SOCKET,
    O_HELP
  };
  static const struct option longopts[] = {{"socket", required_argument, NULL, O_SOCKET},
                                           {"batch-size", required_argument, NULL, O_BATCH},
                                           {"epochs", required_argument, NULL, O_EPOCHS},
                                           {"compute-ms", required_argument, NULL, O_COMPUTE},
                                           {"columns", required_argument, NULL, O_COLUMNS},
                                           {"seed", required_argument, NULL, O_SEED},
                                           {"no-shuffle", no_argument, NULL, O_NOSHUF},
                                           {"rank", required_argument, NULL, O_RANK},
                                           {"world-size", required_argument, NULL, O_WORLD},
                                           {"local-world-size", required_argument, NULL, O_LOCAL},
                                           {"partitions", required_argument, NULL, O_PARTS},
                                           {"unit-rows", required_argument, NULL, O_UNIT},
                                           {"window", required_argument, NULL, O_WINDOW},
                                           {"help", no_argument, NULL, O_HELP},
                                           {NULL, 0, NULL, 0}};
  int opt;
  while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
    switch (opt) {
      case O_SOCKET: socket = optarg; break;
      case O_BATCH: o.batch_size = (uint32_t)number("batch-size", optarg, 1, 1 << 20); break;
      case O_EPOCHS: o.epochs = (uint64_t)number("epochs", optarg, 0, INT64_MAX); break;
      case O_COMPUTE: {
        char *end;
        errno = 0;
        compute_ms = strtod(optarg, &end);
        if (errno || end == optarg || *end || compute_ms < 0) {
          fprintf(stderr, "example-trainer: --compute-ms %s: a number of milliseconds\n%s", optarg,
                  usage_text);
          return 2;
        }
        break;
      }
      case O_COLUMNS: columns = optarg; break;
      case O_SEED: o.seed = (uint64_t)number("seed", optarg, 0, INT64_MAX); break;
      case O_NOSHUF: o.shuffle = 0; break;
      case O_RANK: o.rank = (int32_t)number("rank", optarg, 0, (1 << 24) - 1); break;
      case O_WORLD: o.world_size = (int32_t)number("world-size", optarg, 1, 1 << 24); break;
      case O_LOCAL:
        o.local_world_size = (int32_t)number("local-world-size", optarg, 1, 1 << 24);
        break;
      case O_PARTS: o.partitions = (uint32_t)number("partitions", optarg, 1, 1 << 16); break;
      case O_UNIT: o.unit_rows = (uint32_t)number("unit-rows", optarg, 64, 65536); break;
      case O_WINDOW: o.window = (uint32_t)number("window", optarg, 1, 1024); break;
      case O_HELP: fputs(usage_text, stdout); return 0;
      default: fputs(usage_text, stderr); return 2;
    }
  }
  const char **sources = (const char **)argv + optind;
  size_t ns = (size_t)(argc - optind);
  if (ns == 0) {
    fprintf(stderr, "example-trainer: no source given\n%s", usage_text);
    return 2;
  }
  char *colbuf = NULL;
  const char *cols[64];
  size_t nc = 0;
  if (columns) {
    colbuf = strdup(columns);
    for (char *t = strtok(colbuf, ","); t && nc < 64; t = strtok(NULL, ",")) cols[nc++] = t;
    o.columns = cols;
    o.num_columns = nc;
  }
  o.sources = sources;
  o.num_sources = ns;
  larder_client_t *c;
  int rc = larder_client_connect(socket, &c);
  if (rc) {
    fprintf(stderr, "example-trainer: %s\n", larder_connect_error());
    free(colbuf);
    return 1;
  }
  larder_stream_t *s;
  rc = larder_stream_open(c, &o, &s);
  if (rc) {
    fprintf(stderr, "example-trainer: %s\n", larder_client_last_error(c));
    larder_client_close(c);
    free(colbuf);
    return 1;
  }
  printf("stream: %llu samples, %llu batches of %u per epoch\n",
         (unsigned long long)larder_stream_num_samples(s),
         (unsigned long long)larder_stream_batches_per_epoch(s), o.batch_size);
  uint32_t parts, pfirst, plast;
  larder_stream_partitions(s, &parts, &pfirst, &plast);
  if (parts > 1) printf("partitions: %u to %u of %u\n", pfirst, plast - 1, parts);
  if (larder_stream_note(s)[0]) printf("note: %s\n", larder_stream_note(s));
  uint64_t epoch = 0, batches = 0, rows = 0, bytes = 0, sum = 0;
  uint64_t w0 = 0, c0 = 0;
  double t0 = now_s();
  int status = 0;
  for (;;) {
    larder_batch_t *b;
    rc = larder_stream_next(s, -1, &b);
    int end_of_epoch = rc == LARDER_EEOF || (rc == 0 && larder_batch_epoch(b) != epoch);
    if (end_of_epoch && batches > 0) {
      uint64_t w, cp;
      larder_stream_stall(s, &w, &cp);
      double secs = now_s() - t0;
      double stall = (double)(w - w0) / (double)((w - w0) + (cp - c0) + 1);
      printf(
          "epoch %llu: %llu batches, %llu rows in %.2f s: %.0f rows/s, %.1f MB/s, "
          "stall %.2f%%\n",
          (unsigned long long)epoch, (unsigned long long)batches, (unsigned long long)rows, secs,
          (double)rows / secs, (double)bytes / secs / 1e6, 100.0 * stall);
      fflush(stdout);
      w0 = w;
      c0 = cp;
      t0 = now_s();
      batches = rows = bytes = 0;
    }
    if (rc == LARDER_EEOF) break;
    if (rc) {
      fprintf(stderr, "example-trainer: %s\n", larder_client_last_error(c));
      status = 1;
      break;
    }
    epoch = larder_batch_epoch(b);
    for (int i = 0; i < larder_batch_num_columns(b); i++) sum += touch(larder_batch_column(b, i));
    batches++;
    rows += (uint64_t)larder_batch_num_rows(b);
    bytes += larder_batch_bytes(b);
    larder_batch_release(b);
    if (compute_ms > 0) step(compute_ms / 1000.0);
  }
  printf("checksum %016llx\n", (unsigned long long)sum);
  larder_stream_close(s);
  larder_client_close(c);
  free(colbuf);
  return status;
}
