/*
 * test-daemon-order.c: the order of batches, end to end against the real
 * daemon: a pure function of the dataset and the settings (runs, worker
 * counts, cold and warm caches, restarts), exactly once per epoch with
 * equal steps across ranks, elastic across world sizes, and resumable.
 */
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "plan/dataset.h"
#include "plan/shuffle.h"
#include "daemon-harness.h"

#define ARENA (8u << 20)

static void std_opts(larder_stream_options_t *o, uint32_t batch_size, uint64_t epochs) {
  dh_std_opts(o, dh_std_source(), 1, batch_size, 1234, epochs, ARENA);
}

/*
 * The ids that batches of epochs [0, epochs) of this rank must hold,
 * computed in-process from dataset.c's units and shuffle.c's order: the
 * daemon must serve exactly that.  Returns bpe * epochs * batch_size ids.
 */
static int64_t *oracle_ids(const dh_spec *spec, const larder_stream_options_t *o,
                           uint64_t *bpe_out) {
  dataset_options_t dopts;
  memset(&dopts, 0, sizeof(dopts));
  dopts.unit_rows = o->unit_rows ? o->unit_rows : 4096;
  if (dopts.unit_rows < 64) dopts.unit_rows = 64;
  dopts.unit_bytes = 4u << 20; /* the daemon's default unit_bytes */
  pq_options_init(&dopts.pq);
  dataset_t *ds = NULL;
  char err[600];
  int rc = dataset_open(o->sources, o->num_sources, o->columns, o->columns ? o->num_columns : 0,
                        &dopts, &ds, err, sizeof(err));
  if (rc) ASSERT_FAIL_("dataset_open: %s", err);
  shuffle_params_t p;
  memset(&p, 0, sizeof(p));
  p.seed = o->seed;
  p.shuffle = o->shuffle;
  p.window_units = o->shuffle_window ? o->shuffle_window : dataset_window_units(ds, 512u << 20);
  p.batch_size = o->batch_size;
  p.world_size = (uint32_t)(o->world_size > 0 ? o->world_size : 1);
  p.rank = (uint32_t)(o->rank > 0 ? o->rank : 0);
  p.drop_last = o->drop_last;
  shuffle_plan_t *plan;
  /* The daemon's default: units shuffled singly (shuffle_row_groups off). */
  ASSERT_OK(dataset_shuffle_plan(ds, &p, 0, &plan));
  uint64_t bpe = shuffle_batches_per_epoch(plan);
  int64_t *ids = malloc((size_t)(bpe * o->epochs * o->batch_size + 1) * 8);
  shuffle_sample_t *smp = malloc(o->batch_size * sizeof(shuffle_sample_t));
  ASSERT(ids && smp);
  size_t k = 0;
  for (uint64_t e = 0; e < o->epochs; e++) {
    shuffle_epoch_t *ep;
    ASSERT_OK(shuffle_epoch_open(plan, e, &ep));
    for (uint64_t b = 0; b < bpe; b++) {
      ASSERT_EQ(shuffle_epoch_batch(ep, b, smp), (int64_t)o->batch_size);
      for (uint32_t i = 0; i < o->batch_size; i++) {
        const dataset_unit_t *u = &ds->units[smp[i].unit];
        ids[k++] = dh_spec_id(spec, (int)u->file, (int)u->rg, (int64_t)u->row_start + smp[i].row);
      }
    }
    shuffle_epoch_close(ep);
  }
  shuffle_plan_free(plan);
  dataset_free(ds);
  *bpe_out = bpe;
  return ids;
}

static void expect_oracle(const dh_run *r, const int64_t *ids, uint64_t bpe, uint64_t epochs,
                          uint32_t batch_size) {
  ASSERT_EQ(r->rc, 0);
  ASSERT_EQ(r->batches_per_epoch, bpe);
  ASSERT_EQ(r->n, bpe * epochs);
  for (size_t i = 0; i < r->n; i++) {
    ASSERT_EQ(r->b[i].epoch, i / bpe);
    ASSERT_EQ(r->b[i].index, i % bpe);
    ASSERT_EQ(r->b[i].rows, batch_size);
    for (uint32_t j = 0; j < batch_size; j++)
      if (r->b[i].ids[j] != ids[i * batch_size + j])
        ASSERT_FAIL_("batch %zu row %u: id %" PRId64 ", the shuffle says %" PRId64, i, j,
                     r->b[i].ids[j], ids[i * batch_size + j]);
  }
}

/* ------------------------------------------------------------------------ */

/* One epoch through the daemon, every value of every row checked, and the
 * order exactly the one shuffle.c computes over dataset.c's units. */
TEST_IMPL(daemon_smoke) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  larder_stream_options_t o;
  std_opts(&o, 64, 2);
  dh_run r = {0};
  r.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &r));
  ASSERT_EQ(r.num_samples, DH_STD_ROWS);
  uint64_t bpe;
  int64_t *ids = oracle_ids(&dh_std_spec, &o, &bpe);
  ASSERT_EQ(bpe, (DH_STD_ROWS + 63) / 64);
  expect_oracle(&r, ids, bpe, 2, 64);
  free(ids);
  char *json = dh_admin(&d, "stats");
  ASSERT_NOT_NULL(json);
  ASSERT_EQ(dh_json_u64(json, "batches"), 2 * bpe);
  ASSERT_EQ(dh_json_u64(json, "batch_rows"), 2 * bpe * 64);
  ASSERT_EQ(dh_json_u64(json, "stream_errors"), 0);
  ASSERT_EQ(dh_json_u64(json, "unit_errors"), 0);
  ASSERT(dh_json_u64(json, "units_decoded") > 0);
  free(json);
  dh_run_free(&r);
  dh_stop(&d);
  return 0;
}

/*
 * The order is a pure function: identical batches, byte for byte, across
 * daemon runs, worker counts (1, 2, 3, 4), cold and warm caches (memory
 * and disk), a tiny memory pool that forces reloads, a cache too small to
 * hold the dataset, restarts, and two identical streams side by side.
 */
TEST_IMPL(daemon_order_pure) {
  larder_stream_options_t o;
  std_opts(&o, 64, 2);
  uint64_t bpe;
  int64_t *ids = oracle_ids(&dh_std_spec, &o, &bpe);

  dh_daemon d;
  static const char *const f1[] = {"--workers=1", NULL};
  dh_init(&d, "d", f1);
  dh_start(&d);
  dh_run cold = {0}, warm = {0}, restarted = {0};
  cold.check_rows = 1;
  ASSERT_OK(dh_collect(d.socket, &o, 0, &cold));
  expect_oracle(&cold, ids, bpe, 2, 64);
  ASSERT_OK(dh_collect(d.socket, &o, 0, &warm));
  dh_expect_same(&cold, &warm);
  dh_stop(&d);
  dh_flag(&d, "--workers=2");
  dh_start(&d);
  ASSERT_OK(dh_collect(d.socket, &o, 0, &restarted));
  dh_expect_same(&cold, &restarted);
  /* The restarted daemon read everything from its disk cache. */
  ASSERT_EQ(dh_stat(&d, "units_decoded"), 0);
  ASSERT(dh_stat(&d, "units_from_cache") > 0);
  /* liblarder asked for a descriptor ring, and got one. */
  ASSERT_EQ(dh_stat(&d, "ring_streams"), 1);
  dh_stop(&d);

  /* Cold caches with other worker counts and memory settings. */
  static const char *const variants[][4] = {
      {"--workers=2", NULL},
      {"--workers=3", "--memory_limit=1", NULL},
      {"--workers=4", "--memory_limit=64K", "--cache_capacity=200K", NULL},
      {"--workers=2", "--prefetch_batches=1", NULL},
      /* Batch and Release frames instead of the ring. */
      {"--workers=2", "--shm_ring=false", NULL},
  };
  for (size_t v = 0; v < sizeof(variants) / sizeof(variants[0]); v++) {
    char name[32];
    snprintf(name, sizeof(name), "v%zu", v);
    dh_daemon dv;
    dh_init(&dv, name, variants[v]);
    dh_start(&dv);
    dh_run r = {0};
    ASSERT_OK(dh_collect(dv.socket, &o, 0, &r));
    dh_expect_same(&cold, &r);
    dh_run_free(&r);
    if (v == 2) {
      /* Twice more, now partly from the cache, partly decoded. */
      for (int k = 0; k < 2; k++) {
        dh_run r2 = {0};
        ASSERT_OK(dh_collect(dv.socket, &o, 0, &r2));
        dh_expect_same(&cold, &r2);
        dh_run_free(&r2);
      }
      ASSERT(dh_stat(&dv, "units_from_cache") > 0);
    }
    if (v == 4) ASSERT_EQ(dh_stat(&dv, "ring_streams"), 0);
    /* Two identical streams at once share unit loads and still agree. */
    if (v == 0) {
      larder_stream_options_t two[2] = {o, o};
      dh_run rr[2] = {{0}, {0}};
      dh_collect_many(dv.socket, two, 2, rr);
      dh_expect_same(&cold, &rr[0]);
      dh_expect_same(&cold, &rr[1]);
      dh_run_free(&rr[0]);
      dh_run_free(&rr[1]);
    }
    dh_stop(&dv);
  }
  free(ids);
  dh_run_free(&cold);
  dh_run_free(&warm);
  dh_run_free(&restarted);
  return 0;
}

/* The same on files DuckDB wrote (zstd, lists of floats, blobs, nulls). */
TEST_IMPL(daemon_order_duckdb) {
  char dir[1024];
  if (dh_demo_dataset(12000, 3, dir, sizeof(dir)) != 0) {
    fprintf(stderr, "node or @duckdb/node-api is missing\n");
    return TEST_SKIP;
  }
  const char *src[1] = {dir};
  larder_stream_options_t o;
  dh_opts(&o, src, 100, 77, 2);
  o.unit_rows = 256;
  o.shuffle_window = 6;
  o.arena_bytes = 16u << 20;
  dh_daemon d;
  static const char *const f1[] = {"--workers=1", NULL};
  dh_init(&d, "d", f1);
  dh_start(&d);
  dh_run a = {0}, b = {0}, c = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &a));
  ASSERT_EQ(a.num_samples, 12000);
  ASSERT_EQ(a.n, 2 * 120);
  dh_stop(&d);
  dh_flag(&d, "--workers=3");
  dh_start(&d);
  ASSERT_OK(dh_collect(d.socket, &o, 0, &b));
  dh_expect_same(&a, &b);
  dh_stop(&d);
  dh_daemon d2;
  static const char *const f2[] = {"--workers=2", "--memory_limit=1", NULL};
  dh_init(&d2, "d2", f2);
  dh_start(&d2);
  ASSERT_OK(dh_collect(d2.socket, &o, 0, &c));
  dh_expect_same(&a, &c);
  dh_stop(&d2);
  /* Every epoch holds each id exactly once (12000 = 120 * 100: no padding). */
  uint8_t *seen = calloc(12000, 1);
  for (uint64_t e = 0; e < 2; e++) {
    memset(seen, 0, 12000);
    for (size_t i = e * 120; i < (e + 1) * 120; i++)
      for (int64_t j = 0; j < a.b[i].rows; j++) {
        int64_t id = a.b[i].ids[j];
        ASSERT(id >= 0 && id < 12000);
        ASSERT_EQ(seen[id], 0);
        seen[id] = 1;
      }
  }
  free(seen);
  dh_run_free(&a);
  dh_run_free(&b);
  dh_run_free(&c);
  return 0;
}

/* ------------------------------------------------------------------------ */

/* The epoch's global order from the ranks' batches: position
 * k*G + r*bs + j is rank r's batch k, row j. */
static int64_t *global_order(const dh_run *runs, int ws, uint32_t bs, uint64_t epoch,
                             uint64_t bpe) {
  uint64_t g = (uint64_t)ws * bs;
  int64_t *order = malloc((size_t)(bpe * g) * 8);
  ASSERT_NOT_NULL(order);
  for (int r = 0; r < ws; r++) {
    for (uint64_t k = 0; k < bpe; k++) {
      const dh_batch *b = &runs[r].b[epoch * bpe + k];
      ASSERT_EQ(b->epoch, epoch);
      ASSERT_EQ(b->index, k);
      ASSERT_EQ(b->rows, bs);
      memcpy(order + k * g + (uint64_t)r * bs, b->ids, bs * 8);
    }
  }
  return order;
}

/*
 * Exactly once, equal steps: world sizes 1, 2, 3 and 8, each rank its own
 * client and stream, all at once; per epoch the ranks together cover every
 * row exactly once, then (drop_last = 0) the padding repeats the epoch's
 * first positions, or (drop_last = 1) the remainder is dropped with no
 * duplicate.  Every epoch has a new order, and the epoch's order does not
 * depend on the world size.
 */
TEST_IMPL(daemon_exactly_once) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  const uint32_t bs = 64;
  const uint64_t epochs = 2;
  const int64_t n = DH_STD_ROWS;
  static const int sizes[] = {1, 2, 3, 8};
  int64_t *first_order[2] = {NULL, NULL}; /* ws = 1's first n positions */
  uint8_t *seen = malloc((size_t)n);
  for (int drop = 0; drop <= 1; drop++) {
    for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
      int ws = sizes[si];
      uint64_t g = (uint64_t)ws * bs;
      larder_stream_options_t opts[8];
      dh_run runs[8];
      memset(runs, 0, sizeof(runs));
      for (int r = 0; r < ws; r++) {
        std_opts(&opts[r], bs, epochs);
        opts[r].rank = r;
        opts[r].world_size = ws;
        opts[r].drop_last = drop;
        runs[r].check_rows = r == 0;
      }
      dh_collect_many(d.socket, opts, ws, runs);
      uint64_t bpe = drop ? (uint64_t)n / g : ((uint64_t)n + g - 1) / g;
      for (int r = 0; r < ws; r++) {
        if (runs[r].rc) ASSERT_FAIL_("rank %d of %d: %s", r, ws, runs[r].err);
        ASSERT_EQ(runs[r].batches_per_epoch, bpe);
        /* Equal steps: every rank the same number of batches. */
        ASSERT_EQ(runs[r].n, bpe * epochs);
      }
      int64_t *orders[2];
      for (uint64_t e = 0; e < epochs; e++) {
        int64_t *order = global_order(runs, ws, bs, e, bpe);
        orders[e] = order;
        memset(seen, 0, (size_t)n);
        uint64_t covered = drop ? bpe * g : (uint64_t)n;
        for (uint64_t p = 0; p < covered; p++) {
          int64_t id = order[p];
          ASSERT(id >= 0 && id < n);
          if (seen[id])
            ASSERT_FAIL_("ws %d drop %d epoch %" PRIu64 ": id %" PRId64 " twice", ws, drop, e, id);
          seen[id] = 1;
        }
        if (!drop) {
          for (int64_t id = 0; id < n; id++)
            if (!seen[id])
              ASSERT_FAIL_("ws %d epoch %" PRIu64 ": id %" PRId64 " missing", ws, e, id);
          /* Padding: the positions past n repeat the epoch's first ones. */
          for (uint64_t p = (uint64_t)n; p < bpe * g; p++)
            ASSERT_EQ(order[p], order[p - (uint64_t)n]);
        } else {
          ASSERT_EQ(covered, (uint64_t)n - (uint64_t)n % g);
        }
        /* The epoch's order is the same whatever the world size. */
        uint64_t common = covered < (uint64_t)n ? covered : (uint64_t)n;
        if (ws == 1 && !drop) {
          first_order[e] = malloc((size_t)n * 8);
          memcpy(first_order[e], order, (size_t)n * 8);
        } else {
          for (uint64_t p = 0; p < common; p++) ASSERT_EQ(order[p], first_order[e][p]);
        }
      }
      /* A new order each epoch. */
      size_t same = 0;
      for (uint64_t p = 0; p < bpe * g && p < (uint64_t)n; p++)
        same += orders[0][p] == orders[1][p];
      ASSERT_LT(same, (size_t)n / 20);
      free(orders[0]);
      free(orders[1]);
      for (int r = 0; r < ws; r++) dh_run_free(&runs[r]);
    }
  }
  free(first_order[0]);
  free(first_order[1]);
  free(seen);
  dh_stop(&d);
  return 0;
}

/*
 * Elastic: with a fixed global batch of 48, global batch k holds the same
 * samples in the same order for world sizes 1, 2, 3 and 4 (rank r gets the
 * r-th slice), each rank a stream of its own, concurrently.
 */
TEST_IMPL(daemon_elastic) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  const uint32_t g = 48;
  const uint64_t epochs = 2;
  int64_t *ref = NULL;
  uint64_t ref_bpe = 0;
  for (int ws = 1; ws <= 4; ws++) {
    uint32_t bs = g / (uint32_t)ws;
    larder_stream_options_t opts[4];
    dh_run runs[4];
    memset(runs, 0, sizeof(runs));
    for (int r = 0; r < ws; r++) {
      std_opts(&opts[r], bs, epochs);
      opts[r].rank = r;
      opts[r].world_size = ws;
    }
    dh_collect_many(d.socket, opts, ws, runs);
    uint64_t bpe = runs[0].batches_per_epoch;
    ASSERT_EQ(bpe, (DH_STD_ROWS + g - 1) / g);
    for (int r = 0; r < ws; r++) {
      if (runs[r].rc) ASSERT_FAIL_("rank %d of %d: %s", r, ws, runs[r].err);
      ASSERT_EQ(runs[r].n, bpe * epochs);
    }
    /* The global batches, in order, for both epochs. */
    int64_t *all = malloc((size_t)(bpe * epochs * g) * 8);
    for (uint64_t e = 0; e < epochs; e++) {
      int64_t *order = global_order(runs, ws, bs, e, bpe);
      memcpy(all + e * bpe * g, order, (size_t)(bpe * g) * 8);
      free(order);
    }
    if (ws == 1) {
      ref = all;
      ref_bpe = bpe;
    } else {
      ASSERT_EQ(bpe, ref_bpe);
      for (uint64_t p = 0; p < bpe * epochs * g; p++)
        if (all[p] != ref[p])
          ASSERT_FAIL_("world size %d: global batch %" PRIu64 " position %" PRIu64 " holds %" PRId64
                       ", world size 1 has %" PRId64,
                       ws, p / g, p % g, all[p], ref[p]);
      free(all);
    }
    for (int r = 0; r < ws; r++) dh_run_free(&runs[r]);
  }
  /* And the oracle agrees with world size 1. */
  larder_stream_options_t o;
  std_opts(&o, g, epochs);
  uint64_t bpe;
  int64_t *ids = oracle_ids(&dh_std_spec, &o, &bpe);
  ASSERT_EQ(bpe, ref_bpe);
  ASSERT_MEM_EQ(ids, ref, (size_t)(bpe * epochs * g) * 8);
  free(ids);
  free(ref);
  dh_stop(&d);
  return 0;
}

/*
 * Resume: a stream opened at (epoch e, batch b) yields exactly the batches
 * an uninterrupted run yields from there; larder_stream_position gives a
 * position that resumes exactly, at any point, also across a daemon
 * restart, for every rank.
 */
TEST_IMPL(daemon_resume) {
  dh_daemon d;
  dh_init(&d, "d", NULL);
  dh_start(&d);
  const uint64_t epochs = 3;
  larder_stream_options_t o;
  std_opts(&o, 64, epochs);
  dh_run full = {0};
  ASSERT_OK(dh_collect(d.socket, &o, 0, &full));
  uint64_t bpe = full.batches_per_epoch;
  ASSERT_EQ(full.n, bpe * epochs);

  /* Explicit positions, including the last batch of an epoch and a batch
   * index past the epoch's end (it carries into the next epoch). */
  static const uint64_t points[][2] = {{0, 0},   {0, 1},   {0, 77},  {1, 0},
                                       {1, 148}, {2, 100}, {2, 148}, {0, 150}};
  for (size_t i = 0; i < sizeof(points) / sizeof(points[0]); i++) {
    larder_stream_options_t ro = o;
    ro.start_epoch = points[i][0];
    ro.start_batch = points[i][1];
    uint64_t from = points[i][0] * bpe + points[i][1];
    dh_run part = {0};
    ASSERT_OK(dh_collect(d.socket, &ro, 0, &part));
    ASSERT_EQ(part.n, full.n - from);
    for (size_t k = 0; k < part.n; k++) {
      const dh_batch *x = &part.b[k], *y = &full.b[from + k];
      if (x->epoch != y->epoch || x->index != y->index || x->hash != y->hash)
        ASSERT_FAIL_("resumed at (%" PRIu64 ",%" PRIu64 "): batch %zu differs", points[i][0],
                     points[i][1], k);
    }
    dh_run_free(&part);
  }

  /* Interrupted runs: read k batches, take the position, close, resume
   * there (after a restart for some), and compare the concatenation. */
  static const uint64_t cuts[] = {0, 1, 5, 148, 149, 300, 446};
  for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
    larder_client_t *c;
    ASSERT_OK(larder_client_connect(d.socket, &c));
    larder_stream_t *s;
    ASSERT_OK(larder_stream_open(c, &o, &s));
    uint64_t pe, pb;
    larder_stream_position(s, &pe, &pb);
    ASSERT_EQ(pe, 0);
    ASSERT_EQ(pb, 0);
    for (uint64_t k = 0; k < cuts[i]; k++) {
      larder_batch_t *b;
      ASSERT_OK(larder_stream_next(s, 60000 * dh_slow(), &b));
      ASSERT_EQ(dh_batch_hash(b), full.b[k].hash);
      larder_batch_release(b);
      larder_stream_position(s, &pe, &pb);
      ASSERT_EQ(pe * bpe + pb, k + 1);
    }
    larder_stream_close(s);
    larder_client_close(c);
    if (i % 3 == 2) {
      dh_stop(&d);
      dh_start(&d);
    }
    larder_stream_options_t ro = o;
    ro.start_epoch = pe;
    ro.start_batch = pb;
    dh_run rest = {0};
    if (dh_collect(d.socket, &ro, 0, &rest)) {
      dh_print_log(&d);
      int st = 0;
      pid_t w = waitpid(d.pid, &st, WNOHANG);
      ASSERT_FAIL_("resume at cut %" PRIu64 ": %s (daemon: waitpid %d status 0x%x)", cuts[i],
                   rest.err, (int)w, st);
    }
    ASSERT_EQ(rest.n + cuts[i], full.n);
    for (size_t k = 0; k < rest.n; k++) ASSERT_EQ(rest.b[k].hash, full.b[cuts[i] + k].hash);
    dh_run_free(&rest);
  }

  /* Rank 1 of 3 resumes too. */
  larder_stream_options_t r1 = o;
  r1.rank = 1;
  r1.world_size = 3;
  r1.epochs = 2;
  dh_run r1full = {0}, r1part = {0};
  ASSERT_OK(dh_collect(d.socket, &r1, 0, &r1full));
  r1.start_epoch = 1;
  r1.start_batch = 7;
  ASSERT_OK(dh_collect(d.socket, &r1, 0, &r1part));
  uint64_t bpe3 = r1full.batches_per_epoch;
  ASSERT_EQ(r1part.n, r1full.n - (bpe3 + 7));
  for (size_t k = 0; k < r1part.n; k++) ASSERT_EQ(r1part.b[k].hash, r1full.b[bpe3 + 7 + k].hash);
  dh_run_free(&r1full);
  dh_run_free(&r1part);
  dh_run_free(&full);
  dh_stop(&d);
  return 0;
}
