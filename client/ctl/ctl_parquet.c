/*
 * ctl_parquet.c: `larderctl inspect` and `larderctl cat` on local files.
 * Both read the file directly with the Parquet module, without a daemon
 * (URLs go through the daemon: ctl_daemon.c).  The description inspect
 * prints is pq_inspect.c's, which the daemon shares.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parquet/parquet.h"
#include "parquet/pq_inspect.h"
#include "ctl.h"

int ctl_cmd_inspect_local(const char *path, int json) {
  pq_source src;
  pq_error err = {0, ""};
  if (pq_source_open_file(&src, path, &err)) {
    fprintf(stderr, "larderctl: %s\n", err.msg);
    return 1;
  }
  pq_file *f;
  if (pq_file_open(&src, NULL, &f, &err)) {
    fprintf(stderr, "larderctl: %s\n", err.msg);
    pq_source_close_file(&src);
    return 1;
  }
  pq_strbuf_t sb = {0};
  if (json) {
    pq_inspect_json(&sb, f);
    pq_strbuf_puts(&sb, "\n");
  } else {
    pq_inspect_human(&sb, f);
  }
  fwrite(sb.data, 1, sb.len, stdout);
  pq_strbuf_free(&sb);
  pq_file_close(f);
  pq_source_close_file(&src);
  return 0;
}

/* ------------------------------------------------------------------------ */
/* cat                                                                       */

/* Splits "a,b.c" into a NULL-terminated array of strings (one allocation). */
static char **split_columns(const char *spec, size_t *n) {
  size_t count = 1;
  for (const char *p = spec; *p; p++) count += *p == ',';
  size_t len = strlen(spec);
  char **out = malloc((count + 1) * sizeof(char *) + len + 1);
  if (out == NULL) return NULL;
  char *copy = (char *)(out + count + 1);
  memcpy(copy, spec, len + 1);
  size_t k = 0;
  for (char *tok = strtok(copy, ","); tok; tok = strtok(NULL, ",")) out[k++] = tok;
  out[k] = NULL;
  *n = k;
  return out;
}

int ctl_cat_local(const char *path, const char *columns, int64_t offset, int64_t limit,
                  const pq_options *opts) {
  pq_source src;
  pq_error err = {0, ""};
  int status = 1;
  pq_file *f = NULL;
  pq_projection *proj = NULL;
  char **cols = NULL;
  size_t ncols = 0;
  pq_batch_t batch;
  pq_batch_init(&batch);
  pq_strbuf_t sb = {0};
  if (pq_source_open_file(&src, path, &err)) {
    fprintf(stderr, "larderctl: %s\n", err.msg);
    return 1;
  }
  if (pq_file_open(&src, opts, &f, &err)) goto fail;
  if (columns && *columns) {
    cols = split_columns(columns, &ncols);
    if (cols == NULL) {
      pq_error_set(&err, LARDER_ENOMEM, "out of memory");
      goto fail;
    }
  }
  if (pq_projection_create(f, (const char *const *)cols, ncols, &proj, &err)) goto fail;
  const pq_file_meta_t *m = pq_file_meta(f);
  int64_t skip = offset, left = limit < 0 ? INT64_MAX : limit;
  for (int g = 0; g < m->num_row_groups && left > 0; g++) {
    if (skip >= m->row_groups[g].num_rows) {
      skip -= m->row_groups[g].num_rows;
      continue;
    }
    pq_reader *r;
    if (pq_reader_open(f, &src, proj, g, opts, &r, &err)) goto fail;
    if (skip > 0) {
      int64_t s = pq_reader_skip(r, skip, &err);
      if (s < 0) {
        pq_reader_close(r);
        goto fail;
      }
      skip = 0;
    }
    for (;;) {
      int64_t want = left < 4096 ? left : 4096;
      int64_t got = pq_reader_next(r, want, &batch, &err);
      if (got < 0) {
        pq_reader_close(r);
        goto fail;
      }
      if (got == 0) break;
      for (int64_t i = 0; i < got; i++) {
        sb.len = 0;
        if (pq_json_append_row(&sb, &batch, i) || pq_strbuf_puts(&sb, "\n")) {
          pq_reader_close(r);
          pq_error_set(&err, LARDER_ENOMEM, "out of memory");
          goto fail;
        }
        if (fwrite(sb.data, 1, sb.len, stdout) != sb.len) {
          pq_reader_close(r);
          pq_error_set(&err, LARDER_EIO, "cannot write to stdout: %s", strerror(errno));
          goto fail;
        }
      }
      left -= got;
      if (left == 0) break;
    }
    pq_reader_close(r);
  }
  status = 0;
fail:
  if (status) fprintf(stderr, "larderctl: %s\n", err.msg);
  fflush(stdout);
  pq_strbuf_free(&sb);
  pq_batch_free(&batch);
  pq_projection_free(proj);
  free(cols);
  pq_file_close(f);
  pq_source_close_file(&src);
  return status;
}
