/*
 * ctl.h: internals of larderctl, shared by its command files (prefix ctl_).
 *
 * Conventions: each command returns the process exit status: 0 on success,
 * 1 when the operation failed (message on stderr), 2 for usage errors.
 * larderctl is single-threaded.
 */
#ifndef LARDER_CTL_H
#define LARDER_CTL_H

#include <stdint.h>

#include "../daemon/parquet.h"

int ctl_sb_puts(pq_strbuf_t *sb, const char *s);
int ctl_sb_printf(pq_strbuf_t *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Local Parquet tools (ctl_parquet.c). */
void ctl_inspect_json(pq_strbuf_t *sb, const pq_file *f);
void ctl_inspect_human(pq_strbuf_t *sb, const pq_file *f);
int ctl_cmd_inspect_local(const char *path, int json);
int ctl_cat_local(const char *path, const char *columns, int64_t offset, int64_t limit,
                  const pq_options *opts);

#endif /* LARDER_CTL_H */
