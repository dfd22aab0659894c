/*
 * pq_inspect.h: `larderctl inspect`'s description of a Parquet file
 * (prefix pq_inspect_), for larderctl (local files) and larderd (remote
 * URLs).  Both append to sb; any thread.
 */
#ifndef LARDER_PQ_INSPECT_H
#define LARDER_PQ_INSPECT_H

#include "parquet/parquet.h"

/* One JSON object: file, size, version, created_by, num_rows,
 * key_value_metadata, schema (the Parquet tree), fields (the schema as
 * served) and row_groups (with their column chunks).  No newline. */
void pq_inspect_json(pq_strbuf_t *sb, const pq_file *f);
/* The same as text for people, one line per item. */
void pq_inspect_human(pq_strbuf_t *sb, const pq_file *f);

#endif /* LARDER_PQ_INSPECT_H */
