/*
 * shuffle.h: the order in which samples reach the trainers (prefix shuffle_).
 *
 * Conventions
 * -----------
 * - Pure: everything here is a function of its arguments.  No clock, no
 *   thread count, no cache state and no global state enter the order, so
 *   the same dataset, seed, epoch and settings give the same batches on any
 *   machine, in any run, cold or warm, before or after a restart.
 * - Threading: a shuffle_plan_t may be shared by threads: its parameters
 *   are immutable, and the window permutations its cursors share (each
 *   window's is made once, by the first cursor that needs it, and lives
 *   while a cursor holds it) are under a lock.  A shuffle_epoch_t is a
 *   cursor owned by one thread at a time; close every cursor before
 *   freeing its plan.
 * - Errors: negative larder_errno_t (LARDER_EINVAL, LARDER_ENOMEM).
 * - Ownership: *_create / *_open allocate; *_free / *_close release.
 *
 * The algorithm
 * -------------
 * Inputs: the dataset as a list of units in dataset order (files sorted by
 * name, row groups in file order, each row group cut into units of at most
 * unit_rows rows; see dataset.h), and the row count of each unit.  A sample
 * is (unit, row within unit); N is the total number of rows.
 *
 * 1. Random numbers come from SplitMix64 streams keyed by
 *    (seed, epoch, purpose, index), so each step has its own independent,
 *    reproducible stream.  Bounded draws use Lemire's multiply-shift with
 *    rejection, so they are unbiased.
 * 2. Unit order: for epoch e, the units are permuted with Fisher-Yates using
 *    stream (seed, e, UNITS, 0).  A blocked plan permutes blocks of
 *    consecutive units instead (the daemon's blocks are row groups when
 *    shuffle_row_groups is on), each block's units staying together in an
 *    order of their own.
 * 3. Windows: the permuted units are taken window_units at a time.  Within a
 *    window, all rows of its units are permuted together with Fisher-Yates
 *    using stream (seed, e, WINDOW, w).  The epoch's order is the
 *    concatenation of the windows' row orders: a permutation of all N samples.
 *    Rows are therefore mixed across units drawn from the whole dataset, and
 *    only one window's units need to be in memory at a time.
 * 4. Batches: with G = world_size * batch_size, global batch k is positions
 *    [k*G, (k+1)*G) of the epoch's order, and rank r receives positions
 *    [k*G + r*batch_size, k*G + (r+1)*batch_size).  Nothing but G decides
 *    which samples form global batch k, so a job may resume with a different
 *    world_size and the same global batch.
 * 5. The end of an epoch: with drop_last there are floor(N / G) batches and
 *    the last N mod G positions are dropped; otherwise there are ceil(N / G)
 *    batches and positions past N wrap around to the start of the epoch's
 *    order (padding by repeating samples).  Every rank gets the same number
 *    of batches.
 * 6. Without shuffle, the order is the dataset order, and steps 2-3 are
 *    skipped.
 *
 * Every rank computes its slice from the same global order, so the ranks of
 * one epoch together see every sample exactly once (minus the dropped tail,
 * plus the padding).
 *
 * Node partitions (partitions = P > 1)
 * ------------------------------------
 * For jobs over many nodes, each node fetching and caching 1/N of the data:
 * 7. The row groups (the groups a plan is made with; the atoms, so that no
 *    row group is read on two nodes) are split into P partitions of nearly
 *    equal rows by the seed alone, the same in every epoch
 *    (shuffle_partition_assign).
 * 8. Each partition p has an order of its own, made by steps 1-6 over its
 *    units with the seed derived from (seed, p), windows of
 *    max(1, window_units / P) units (so that the windows a global batch
 *    draws on together hold window_units units, as with one partition) and
 *    a batch of S = G / P samples (G must be a multiple of P).
 * 9. Global batch k is the concatenation, partition after partition, of
 *    positions [k*S, (k+1)*S) of each partition's order; rank r receives
 *    positions [r*batch_size, (r+1)*batch_size) of it, as in step 4.  So
 *    global batch k mixes the whole dataset, is the same for any world size
 *    with the same G, and the ranks r of node n = r / local_world_size of N
 *    nodes, when N divides P, read partitions [n*P/N, (n+1)*P/N) alone
 *    (shuffle_node_partitions).  When N does not divide P, a node's ranks
 *    straddle a partition that a neighbour reads too.
 * 10. Batches per epoch: with drop_last, floor(min_p N_p / S), the larger
 *    partitions' tails dropped; else ceil(max_p N_p / S), the smaller
 *    partitions padded by wrapping around their own order (repeating their
 *    own samples, as in step 5).
 */
#ifndef LARDER_SHUFFLE_H
#define LARDER_SHUFFLE_H

#include <stdint.h>

typedef struct shuffle_params {
  uint64_t seed;
  int shuffle;               /* 0: dataset order */
  uint32_t window_units;     /* units mixed together; >= 1 */
  uint32_t batch_size;       /* samples per rank per batch; >= 1 */
  uint32_t world_size;       /* >= 1 */
  uint32_t rank;             /* < world_size */
  int drop_last;             /* else the last batch is padded */
  uint32_t partitions;       /* P, node partitions (below); 0 or 1: none */
  uint32_t local_world_size; /* ranks per node, for the partitions a node
                                reads; 0: world_size (one node) */
} shuffle_params_t;

typedef struct shuffle_sample {
  uint32_t unit; /* index in dataset order */
  uint32_t row;  /* row within the unit */
} shuffle_sample_t;

typedef struct shuffle_plan shuffle_plan_t;

/*
 * Makes a plan over num_units units of unit_rows[i] rows each (copied).
 * Returns 0, LARDER_EINVAL for impossible parameters (no rows, batch_size or
 * world_size 0, rank >= world_size, window_units 0, a unit over UINT32_MAX
 * rows), or LARDER_ENOMEM.  Any thread.
 */
int shuffle_plan_create(const uint64_t *unit_rows, uint32_t num_units,
                        const shuffle_params_t *params, shuffle_plan_t **out);
void shuffle_plan_free(shuffle_plan_t *plan);

/*
 * Like shuffle_plan_create, with the units grouped into num_blocks blocks of
 * consecutive units: block b is the next block_units[b] units in dataset
 * order (each count >= 1, summing to num_units; else LARDER_EINVAL).  An
 * epoch's unit order then permutes the blocks and keeps each block's units
 * together (in a random order of their own), and the windows are cut from
 * that order as usual.  With shuffle_row_groups (on, or auto choosing it:
 * clustered.h) the daemon makes each row group a block: a remote row group
 * is fetched whole, so keeping its units
 * in one window lets a cold epoch consume data in the order it arrives (a
 * window needs about its own bytes of fetches, not window_units whole row
 * groups), at the price of mixing fewer distinct places per window
 * (bench/label-mix.c measures how many fewer).  Without shuffle the blocks
 * change nothing.  Any thread.
 */
int shuffle_plan_create_blocked(const uint64_t *unit_rows, uint32_t num_units,
                                const uint32_t *block_units, uint32_t num_blocks,
                                const shuffle_params_t *params, shuffle_plan_t **out);

/*
 * The node partitions of a dataset: assigns each of num_groups groups of
 * consecutive units (group_units[g] units each, summing to num_units; NULL:
 * every unit a group) to one of `partitions` partitions, writing each
 * unit's partition to unit_part[num_units].  The groups are permuted by
 * Fisher-Yates with stream (seed, 0, PARTITION, 0) and cut, in that order,
 * into P runs at the rows closest to p * N / P: each partition holds N / P
 * rows give or take a group.  A function of the rows, the groups, P and the
 * seed alone.  Returns 0, LARDER_EINVAL (a partition would be empty: fewer
 * groups with rows than P), or LARDER_ENOMEM.  Any thread.
 */
int shuffle_partition_assign(const uint64_t *unit_rows, uint32_t num_units,
                             const uint32_t *group_units, uint32_t num_groups, uint32_t partitions,
                             uint64_t seed, uint32_t *unit_part);

/* The partitions [*first, *last) that node `node` of `nodes` reads when
 * nodes divides partitions, or that it touches when it does not (its ranks'
 * part of each global batch, step 9).  Any thread. */
void shuffle_node_partitions(uint32_t partitions, uint32_t nodes, uint32_t node, uint32_t *first,
                             uint32_t *last);

/*
 * A plan with params->partitions = P > 1 (steps 7-10): groups as in
 * shuffle_partition_assign (the row groups: NULL, every unit alone), and
 * block_order whether each partition's order keeps a group's units
 * together (shuffle_plan_create_blocked) or mixes them singly.  Returns 0;
 * LARDER_EINVAL for what shuffle_plan_create refuses, a global batch that
 * is not a multiple of P, or a partition that would be empty; or
 * LARDER_ENOMEM.  shuffle_plan_create and _blocked hand plans with P > 1
 * here (their blocks, if any, as the groups, in block order).  Any thread.
 */
int shuffle_plan_create_partitioned(const uint64_t *unit_rows, uint32_t num_units,
                                    const uint32_t *group_units, uint32_t num_groups,
                                    int block_order, const shuffle_params_t *params,
                                    shuffle_plan_t **out);

/* Total samples N, and the batches every rank gets per epoch. */
uint64_t shuffle_num_samples(const shuffle_plan_t *plan);
uint64_t shuffle_batches_per_epoch(const shuffle_plan_t *plan);
const shuffle_params_t *shuffle_params(const shuffle_plan_t *plan);

typedef struct shuffle_epoch shuffle_epoch_t;

/* A cursor over one epoch of a plan.  Keeps the epoch's unit order, the
 * row orders of the two windows it last used, and at most one order being
 * made (shuffle_epoch_prepare).
 * Returns 0 or LARDER_ENOMEM. */
int shuffle_epoch_open(const shuffle_plan_t *plan, uint64_t epoch, shuffle_epoch_t **out);
void shuffle_epoch_close(shuffle_epoch_t *ep);

/*
 * Fills out[0 .. batch_size) with the samples of this rank's batch `batch`
 * of the epoch, in the order the trainer receives them.  Returns the count
 * (batch_size), or LARDER_EINVAL when batch >= batches per epoch.
 */
int shuffle_epoch_batch(shuffle_epoch_t *ep, uint64_t batch, shuffle_sample_t *out);

/*
 * Makes progress on the row order of the window that holds the start of
 * batch `batch`, the order shuffle_epoch_batch would otherwise make in one
 * go when it first needs it (a Fisher-Yates shuffle of the window's rows:
 * milliseconds for a large window).  Each call does about `budget` swaps;
 * the slices make the same order as one whole run.  Once made, the order is
 * shared with the plan's other cursors and kept by this one (as one of the
 * two it keeps).  Returns 1 when the order is made, 0 when more calls are
 * needed, or a negative code.  A pin task calls it a slice at a time, so
 * that a worker never spends milliseconds away from batch assembly.
 */
int shuffle_epoch_prepare(shuffle_epoch_t *ep, uint64_t batch, uint64_t budget);

/*
 * The units that batches [first, last) of this rank read, in the order in
 * which they are first needed, without duplicates: the prefetch order.
 * Writes up to max indices into units and returns how many it wrote (the
 * count is exact when it is below max), or a negative code.
 */
int shuffle_epoch_units(shuffle_epoch_t *ep, uint64_t first, uint64_t last, uint32_t *units,
                        uint32_t max);

/*
 * The units of the windows that batches [first, last) draw from, for every
 * rank (with partitions, every rank of this rank's node), window after window: a superset of what shuffle_epoch_units
 * returns for them (all of it once a window is drawn on by a few batches,
 * as rows are mixed across the whole window), found from the unit order
 * alone, without the windows' row permutations, in time proportional to
 * the units.  For prefetch pins.  Same returns as shuffle_epoch_units.
 */
int shuffle_epoch_window_units(shuffle_epoch_t *ep, uint64_t first, uint64_t last, uint32_t *units,
                               uint32_t max);

#endif /* LARDER_SHUFFLE_H */
