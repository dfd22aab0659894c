/*
 * clustered.h: whether a dataset's rows are grouped by a column's value,
 * as its footers' statistics tell (prefix clustered_).
 *
 * Conventions
 * -----------
 * - Pure: a function of the footers (and which columns are projected)
 *   alone, so the verdict, and the batch order that follows from it, is the
 *   same on every machine, cold or warm, in every run.
 * - Threading: no state; any thread.  The work is bounded (at most
 *   CLUSTERED_MAX_ROW_GROUPS row groups and CLUSTERED_MAX_LEAVES columns are
 *   examined), a few milliseconds at the most.
 * - Errors: LARDER_ENOMEM only; a column whose statistics are missing,
 *   malformed or of a type without a defined order is "unknown", never an
 *   error.
 *
 * Why
 * ---
 * `shuffle_row_groups = auto` keeps each row group's units together in the
 * shuffle (a cold remote epoch then streams: a window needs about its own
 * bytes of fetches) unless that would mix the data worse than shuffling
 * units singly.  It does when the rows are sorted or grouped by something:
 * the row groups then hold narrow, disjoint parts of some column's range,
 * and a window of whole row groups holds few labels, few dates, few
 * classes.  Rows in no particular order give every row group nearly the
 * column's whole range, and any two row groups' [min, max] overlap.
 *
 * The measure, per column: the fraction of pairs of row groups whose
 * [min, max] intervals overlap, counted in O(R log R) by sorting the
 * intervals by their minimum.  Random rows give 1.0 for any column with
 * more than a handful of rows per row group; a sorted column gives about
 * 2 / R, a sorted binary label about 0.5.  Below CLUSTERED_OVERLAP the
 * column is clustered.
 */
#ifndef LARDER_CLUSTERED_H
#define LARDER_CLUSTERED_H

#include <stddef.h>

#include "parquet/parquet.h"

/* A column whose pairs of row groups overlap less often than this is
 * clustered. */
#define CLUSTERED_OVERLAP 0.9
/* Row groups examined per column, taken evenly from the dataset's. */
#define CLUSTERED_MAX_ROW_GROUPS 4096
/* Columns examined (projected ones first); the rest are unknown. */
#define CLUSTERED_MAX_LEAVES 512

typedef struct clustered_verdict {
  int together;   /* 1: row groups may stay together in the shuffle */
  char note[320]; /* why, in a sentence for the trainer and larderctl */
} clustered_verdict_t;

/*
 * Decides for the rows of nfiles files (files[i] with projection projs[i];
 * all of one schema, as a dataset's are) whether keeping row groups together
 * in the shuffle mixes them as well as shuffling units singly:
 *   - no: some column (projected or not) is clustered (above), or a
 *     projected column has no usable statistics in some row group that
 *     holds values (a label without statistics could be sorted unseen);
 *   - yes: otherwise, including the case of fewer than two row groups.
 * Writes the verdict and a sentence that names the column that decided
 * (none with fewer than two row groups: the orders are then the same).
 * Returns 0 or LARDER_ENOMEM.  Any thread.
 */
int clustered_check(const pq_file *const *files, const pq_projection *const *projs, size_t nfiles,
                    clustered_verdict_t *out);

#endif /* LARDER_CLUSTERED_H */
