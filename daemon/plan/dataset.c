/*
 * dataset.c: resolving sources into files, reading their footers, and
 * cutting row groups into units.
 */
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cred.h"
#include "plan/dataset.h"
#include "serve/layout.h"
#include "util.h"

typedef struct strlist {
  char **v;
  size_t n, cap;
} strlist;

static int strlist_add(strlist *l, const char *s) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? l->cap * 2 : 16;
    char **v = realloc(l->v, cap * sizeof(char *));
    if (v == NULL) return LARDER_ENOMEM;
    l->v = v;
    l->cap = cap;
  }
  l->v[l->n] = strdup(s);
  if (l->v[l->n] == NULL) return LARDER_ENOMEM;
  l->n++;
  return 0;
}

static void strlist_free(strlist *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
}

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Sorts l and drops repeats. */
static void strlist_sort_unique(strlist *l) {
  /* With no entries l->v is NULL, which qsort must not be given. */
  if (l->n < 2) return;
  qsort(l->v, l->n, sizeof(char *), cmp_str);
  size_t m = 0;
  for (size_t i = 0; i < l->n; i++) {
    if (m && strcmp(l->v[m - 1], l->v[i]) == 0) {
      free(l->v[i]);
      continue;
    }
    l->v[m++] = l->v[i];
  }
  l->n = m;
}

static int has_glob(const char *s) { return strpbrk(s, "*?[") != NULL; }

/* Writes into out (size bytes) a glob pattern that matches path alone:
 * its wildcards and backslashes escaped.  Returns 0, or -1 when it does not
 * fit. */
static int glob_escape(const char *path, char *out, size_t size) {
  size_t n = 0;
  for (const char *p = path; *p; p++) {
    if (n + 3 > size) return -1;
    if (strchr("*?[]\\", *p)) out[n++] = '\\';
    out[n++] = *p;
  }
  out[n] = '\0';
  return 0;
}

/* Checks that path (already resolved) lies inside one of the roots. */
static int inside_roots(const char *path, const char *const *roots) {
  if (roots == NULL) return 1;
  for (size_t i = 0; roots[i]; i++) {
    char root[PATH_MAX];
    if (realpath(roots[i], root) == NULL) continue;
    size_t n = strlen(root);
    if (strncmp(path, root, n) == 0 &&
        (path[n] == '/' || path[n] == '\0' || (n == 1 && root[0] == '/')))
      return 1;
  }
  return 0;
}

/* larder ACL: whether the directory a pattern starts from (the part
 * before its first wildcard) lies inside the roots, so that glob never
 * walks (and errors never name) what lies outside them.  A directory that
 * does not resolve is left to glob, which then finds nothing. */
static int glob_base_inside(const char *src, const char *const *roots) {
  if (roots == NULL) return 1;
  char dir[PATH_MAX], real[PATH_MAX];
  size_t n = strcspn(src, "*?[");
  if (n >= sizeof(dir)) return 0;
  memcpy(dir, src, n);
  dir[n] = '\0';
  char *slash = strrchr(dir, '/');
  if (slash == NULL) snprintf(dir, sizeof(dir), ".");
  else if (slash == dir) dir[1] = '\0';
  else *slash = '\0';
  if (realpath(dir, real) == NULL) return 1;
  return inside_roots(real, roots);
}

/* Whether path, made absolute and stripped of "." and ".." by its text
 * alone, lies inside the roots: for a path that does not resolve. */
static int lexically_inside(const char *path, const char *const *roots) {
  char abs[PATH_MAX], out[PATH_MAX];
  if (path[0] == '/') {
    snprintf(abs, sizeof(abs), "%s", path);
  } else {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) == NULL) return 0;
    if ((size_t)snprintf(abs, sizeof(abs), "%s/%s", cwd, path) >= sizeof(abs)) return 0;
  }
  size_t n = 0;
  out[0] = '\0';
  for (char *save = NULL, *t = strtok_r(abs, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
    if (strcmp(t, ".") == 0) continue;
    if (strcmp(t, "..") == 0) {
      while (n > 0 && out[n - 1] != '/') n--;
      if (n > 0) n--;
      out[n] = '\0';
      continue;
    }
    size_t len = strlen(t);
    if (n + 1 + len >= sizeof(out)) return 0;
    out[n++] = '/';
    memcpy(out + n, t, len + 1);
    n += len;
  }
  if (n == 0) snprintf(out, sizeof(out), "/");
  return inside_roots(out, roots);
}

/* The first directory glob(3) could not read, for glob_files' message. */
static __thread int glob_errno;
static __thread char glob_errpath[256];

static int on_glob_error(const char *path, int e) {
  if (glob_errno == 0) {
    glob_errno = e;
    snprintf(glob_errpath, sizeof(glob_errpath), "%s", path);
  }
  return 1; /* stop: a listing that skipped a directory would be wrong */
}

/* Adds the paths matching pat to found.  Returns 0, LARDER_ENOENT when
 * nothing matches (err is the caller's to fill), or another code with err
 * set when a directory could not be read.  GLOB_ERR stops at a directory
 * glob cannot open: skipping it, a daemon out of descriptors would say a
 * dataset's directory had no Parquet files.  Tested by
 * daemon_robust_out_of_fds. */
static int glob_files(const char *pat, strlist *found, char *err, size_t errlen) {
  glob_t g;
  glob_errno = 0;
  int grc = glob(pat, GLOB_NOSORT | GLOB_ERR, on_glob_error, &g);
  int rc = 0;
  if (grc == GLOB_NOMATCH) {
    rc = LARDER_ENOENT;
  } else if (grc != 0) {
    int e = glob_errno ? glob_errno : EIO;
    snprintf(err, errlen, "%s: cannot list %s: %s", pat, glob_errno ? glob_errpath : "it",
             strerror(e));
    rc = e == EMFILE || e == ENFILE ? LARDER_ELIMIT : e == EACCES ? LARDER_EACCES : LARDER_EIO;
  } else {
    for (size_t i = 0; i < g.gl_pathc && rc == 0; i++) rc = strlist_add(found, g.gl_pathv[i]);
  }
  if (grc == 0 || grc == GLOB_ABORTED) globfree(&g);
  return rc;
}

/* larder ACL: the one answer about anything outside the roots, which
 * names the source and nothing it led to. */
static int refuse_outside(const char *src, char *err, size_t errlen) {
  snprintf(err, errlen, "not allowed: %s is outside the configured sources", src);
  return LARDER_EACCES;
}

/* larder ACL: whether a path (no pattern) lies inside the roots.  A path
 * that does not resolve is judged by its text; one inside gets the plain
 * error of whatever reads it. */
static int path_allowed(const char *src, const dataset_options_t *opts) {
  if (opts->allowed_roots == NULL) return 1;
  char real[PATH_MAX];
  if (realpath(src, real) != NULL) return inside_roots(real, opts->allowed_roots);
  return lexically_inside(src, opts->allowed_roots);
}

/* Opens the file at rel below the directory rootfd for reading, never
 * leaving that directory and following no symbolic link on the way (rel is
 * a resolved path: it has none that it needs).  Returns the descriptor,
 * or -1 with errno set (EXDEV or ELOOP: the path left the directory, or
 * met a link, as it would when a directory on the way was swapped for a
 * link after it was resolved). */
static int open_beneath(int rootfd, const char *rel) {
  struct open_how how;
  memset(&how, 0, sizeof(how));
  how.flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
#if defined(__SANITIZE_THREAD__)
  /* ThreadSanitizer does not see a descriptor that a raw syscall returns:
   * it keeps the history of the last descriptor of that number (often a
   * client's socket the loop polled, then closed), reports this worker's
   * close of its own file as a race with that, and halts the daemon.  Its
   * builds take the walk below, whose calls it sees. */
  (void)how;
  long fd = -1;
  errno = ENOSYS;
#else
  long fd = syscall(SYS_openat2, rootfd, rel, &how, sizeof(how));
#endif
  if (fd >= 0 || errno != ENOSYS) return (int)fd;
  /* Kernels before 5.6: one component at a time from the root, each
   * opened relative to the last and none followed if it is a link. */
  char buf[PATH_MAX];
  if (snprintf(buf, sizeof(buf), "%s", rel) >= (int)sizeof(buf)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  int dir = util_dup_cloexec(rootfd);
  char *save = NULL;
  for (char *c = strtok_r(buf, "/", &save); c && dir >= 0;) {
    char *next = strtok_r(NULL, "/", &save);
    if (strcmp(c, ".") == 0 || strcmp(c, "..") == 0) {
      close(dir);
      errno = EXDEV;
      return -1;
    }
    int flags = next ? O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC
                     : O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW;
    int fd2 = openat(dir, c, flags);
    int e = errno;
    close(dir);
    errno = e;
    dir = fd2;
    c = next;
  }
  return dir;
}

/*
 * Opens the local file at real (a resolved path) for reading, as the
 * calling thread's credentials allow: below the root that holds it when
 * roots are set, so that a directory swapped for a link between the
 * resolution and the open cannot lead outside.  Sets *fd to a regular
 * file's descriptor.  Returns 0, LARDER_EACCES ("not allowed", or the
 * kernel's refusal),
 * LARDER_ENOENT, LARDER_ELIMIT (out of descriptors) or LARDER_EIO, with a
 * message in err.
 */
static int open_local(const char *real, const char *const *roots, int *fd, char *err,
                      size_t errlen) {
  *fd = -1;
  int e = EXDEV;
  if (roots == NULL) {
    *fd = open(real, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    e = errno;
  }
  for (size_t i = 0; roots && roots[i] && *fd < 0; i++) {
    char root[PATH_MAX];
    if (realpath(roots[i], root) == NULL) continue;
    size_t n = strlen(root);
    if (n == 1) n = 0; /* the root "/" */
    if (strncmp(real, root, n) != 0 || real[n] != '/') continue;
    int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (rootfd < 0) {
      e = errno;
      continue;
    }
    *fd = open_beneath(rootfd, real + n + 1);
    e = errno;
    close(rootfd);
  }
  if (*fd >= 0) {
    struct stat st;
    if (fstat(*fd, &st) == 0 && S_ISREG(st.st_mode)) return 0;
    close(*fd);
    *fd = -1;
    snprintf(err, errlen, "%s: not a regular file", real);
    return LARDER_EIO;
  }
  if (e == EXDEV || e == ELOOP) return refuse_outside(real, err, errlen);
  snprintf(err, errlen, "%s: %s", real, strerror(e));
  return e == ENOENT                  ? LARDER_ENOENT
         : e == EACCES || e == EPERM  ? LARDER_EACCES
         : e == EMFILE || e == ENFILE ? LARDER_ELIMIT
                                      : LARDER_EIO;
}

/* Expands one local source into the resolved paths of its files. */
static int expand_local(const char *src, const dataset_options_t *opts, strlist *out, char *err,
                        size_t errlen) {
  strlist found = {0};
  int rc = 0;
  /* larder ACL: a pattern may not climb out of its base with "..", and
   * what lies outside the roots answers "not allowed" whether it exists or
   * not, so that errors do not tell a client what exists there: "no such
   * file", "not allowed" and "no .parquet files" would tell a missing file,
   * a file and a directory apart outside the roots. */
  if (opts->allowed_roots &&
      ((has_glob(src) && (strstr(src, "/../") || strncmp(src, "../", 3) == 0 ||
                          (strlen(src) >= 3 && strcmp(src + strlen(src) - 3, "/..") == 0))) ||
       (has_glob(src) && !glob_base_inside(src, opts->allowed_roots))))
    return refuse_outside(src, err, errlen);
  if (!has_glob(src) && !path_allowed(src, opts)) return refuse_outside(src, err, errlen);
  /* As in a shell, a pattern that matches nothing names itself: a file
   * or directory whose name holds '[', '*' or '?' can be a source as it
   * is, without escaping each character.  It is then judged as a path,
   * before anything is read through it. */
  int pattern = has_glob(src);
  if (pattern) {
    rc = glob_files(src, &found, err, errlen);
    struct stat st;
    if (rc == LARDER_ENOENT && stat(src, &st) == 0) {
      if (!path_allowed(src, opts)) return refuse_outside(src, err, errlen);
      pattern = 0;
      rc = 0;
    } else if (rc == LARDER_ENOENT) {
      snprintf(err, errlen, "%s: no file matches", src);
    }
    if (rc) {
      strlist_free(&found);
      return rc;
    }
  }
  if (!pattern) {
    struct stat st;
    if (stat(src, &st) != 0) {
      int e = errno;
      /* A trainer's /tmp is not the daemon's when systemd gives the
       * daemon a private one: say so rather than leave "no such file"
       * for a file the trainer can see. */
      int tmp = e == ENOENT && strncmp(src, "/tmp/", 5) == 0 && util_private_tmp();
      snprintf(err, errlen, "%s: %s%s", src, strerror(e),
               tmp ? " (larderd runs with a private /tmp, PrivateTmp=yes in larderd.service, "
                     "so it does not see the trainers' /tmp: put datasets elsewhere)"
                   : "");
      return e == ENOENT ? LARDER_ENOENT : e == EACCES ? LARDER_EACCES : LARDER_EIO;
    }
    if (S_ISDIR(st.st_mode)) {
      /* A directory means its Parquet files (not recursive).  Its name
       * is escaped in the pattern, where it must match only itself. */
      char pat[PATH_MAX];
      if (glob_escape(src, pat, sizeof(pat) - sizeof("/*.parquet")) != 0) {
        snprintf(err, errlen, "%.200s...: path too long", src);
        return LARDER_EINVAL;
      }
      strcat(pat, "/*.parquet");
      rc = glob_files(pat, &found, err, errlen);
      if (rc == LARDER_ENOENT) snprintf(err, errlen, "%s: directory has no .parquet files", src);
    } else {
      rc = strlist_add(&found, src);
    }
  }
  for (size_t i = 0; i < found.n && rc == 0; i++) {
    char real[PATH_MAX];
    if (realpath(found.v[i], real) == NULL) {
      snprintf(err, errlen, "%s: %s", found.v[i], strerror(errno));
      rc = LARDER_ENOENT;
      break;
    }
    if (!inside_roots(real, opts->allowed_roots)) {
      rc = refuse_outside(src, err, errlen);
      break;
    }
    struct stat st;
    if (stat(real, &st) != 0 || !S_ISREG(st.st_mode)) {
      /* Globs may match directories; skip anything that is not a file. */
      if (pattern) continue;
      snprintf(err, errlen, "%s: not a regular file", found.v[i]);
      rc = LARDER_EIO;
      break;
    }
    rc = strlist_add(out, real);
  }
  strlist_free(&found);
  return rc;
}

static const remote_object_t *find_remote(const dataset_options_t *opts, const char *url) {
  for (size_t i = 0; i < opts->num_remote; i++)
    if (strcmp(opts->remote[i].url, url) == 0) return &opts->remote[i];
  return NULL;
}

/* What a parse of one file's footer needs (footers_parse_cb's arg): the
 * file (path and name set), its remote object if it is one, the options. */
typedef struct parse_args {
  const dataset_file_t *file;
  int fd; /* local files: the descriptor opened at resolution */
  const remote_object_t *remote;
  const pq_options *opts;
} parse_args_t;

/* Parses a local file's footer and hashes it (dataset_footer_hash). */
static int local_parse(void *arg, pq_file **out, uint64_t *hash, char *err, size_t errlen) {
  const parse_args_t *a = arg;
  const char *path = a->file->path;
  pq_source src;
  pq_error perr = {0, ""};
  int rc = pq_source_open_fd(&src, a->fd, path, &perr);
  if (rc == 0) {
    rc = pq_file_open(&src, a->opts, out, &perr);
    if (rc == 0) {
      rc = dataset_footer_hash(&src, pq_file_meta(*out)->footer_length, hash);
      if (rc) {
        snprintf(perr.msg, sizeof(perr.msg), "%s: cannot read its footer again", path);
        pq_file_close(*out);
        *out = NULL;
      }
    }
    pq_source_close_file(&src);
  }
  if (rc) snprintf(err, errlen, "%s", perr.msg);
  return rc;
}

/* Parses the footer that a remote object's resolution fetched. */
static int remote_parse(void *arg, pq_file **out, uint64_t *hash, char *err, size_t errlen) {
  const parse_args_t *a = arg;
  pq_error perr = {0, ""};
  *hash = 0;
  int rc = pq_file_parse(a->remote->footer, a->remote->footer_len, a->remote->size, a->opts,
                         a->file->name, out, &perr);
  if (rc) snprintf(err, errlen, "%s", perr.msg);
  return rc;
}

/*
 * Gives f its parsed footer, path and identity set, through the footer
 * table when opts names one (shared with every other dataset that reads
 * this version of the file) and by parsing it itself otherwise, then its
 * projection.  Returns 0 or a negative code with a message in err.
 */
static int take_footer(dataset_file_t *f, footers_parse_cb parse, const remote_object_t *remote,
                       const char *const *columns, size_t ncols, const dataset_options_t *opts,
                       char *err, size_t errlen) {
  parse_args_t a = {f, f->fd, remote, &opts->pq};
  uint64_t hash = 0;
  int rc;
  if (opts->footers) {
    /* The table's key tells inodes apart, so that the descriptor an entry
     * keeps is of the very file this dataset opened. */
    char key[sizeof(f->identity) + 32];
    snprintf(key, sizeof(key), "%s;dev=%llu", f->identity, (unsigned long long)f->dev);
    rc = footers_acquire(opts->footers, f->path, key, &opts->pq, f->fd, opts->footer_limit, parse,
                         &a, &f->footer, err, errlen);
    if (rc == 0) {
      f->pq = footers_file(f->footer);
      hash = footers_hash(f->footer);
      /* The entry holds the file open for every dataset that shares it. */
      if (f->fd >= 0) close(f->fd);
      f->fd = -1;
    }
  } else {
    rc = parse(&a, &f->owned_pq, &hash, err, errlen);
    f->pq = f->owned_pq;
  }
  if (rc) return rc;
  if (!remote) f->footer_hash = hash;
  pq_error perr = {0, ""};
  rc = pq_projection_create(f->pq, columns, ncols, &f->proj, &perr);
  if (rc) snprintf(err, errlen, "%s", perr.msg);
  return rc;
}

static int open_remote(dataset_file_t *f, const remote_object_t *o, const char *const *columns,
                       size_t ncols, const dataset_options_t *opts, char *err, size_t errlen) {
  f->remote = 1;
  f->size = o->size;
  snprintf(f->etag, sizeof(f->etag), "%s", o->etag);
  snprintf(f->last_modified, sizeof(f->last_modified), "%s", o->last_modified);
  snprintf(f->identity, sizeof(f->identity), "size=%llu;etag=%s", (unsigned long long)o->size,
           o->etag[0] ? o->etag : o->last_modified);
  f->object_id =
      util_hash64(f->path, strlen(f->path), util_hash64(f->identity, strlen(f->identity), 0));
  return take_footer(f, remote_parse, o, columns, ncols, opts, err, errlen);
}

static int open_file(dataset_file_t *f, const char *path, int fd, const char *const *columns,
                     size_t ncols, const dataset_options_t *opts, char *err, size_t errlen) {
  memset(f, 0, sizeof(*f));
  f->fd = fd;
  f->path = strdup(path);
  if (f->path == NULL) return LARDER_ENOMEM;
  /* Messages name remote files by their redacted URL, never as given:
   * user:password@ and a presigned query would otherwise reach them
   * (decode errors, through the footer's name).  Tested by
   * remote_faults_wrong_bytes. */
  if (remote_is_url(path)) {
    char buf[2048];
    fetch_redact(path, buf, sizeof(buf));
    f->name = strdup(buf);
  } else {
    f->name = strdup(path);
  }
  if (f->name == NULL) return LARDER_ENOMEM;
  const remote_object_t *ro = remote_is_url(path) ? find_remote(opts, path) : NULL;
  if (ro) return open_remote(f, ro, columns, ncols, opts, err, errlen);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) {
    snprintf(err, errlen, "%s: %s", path, strerror(fd < 0 ? EBADF : errno));
    return LARDER_EIO;
  }
  f->dev = (uint64_t)st.st_dev;
  f->size = (uint64_t)st.st_size;
  f->mtime_ns = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
  f->ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
  f->ino = (uint64_t)st.st_ino;
  /* Size and mtime alone miss a file replaced by one of the same size with
   * its mtime kept (cp -p, rsync -t, tar, touch -r).  Every write sets the
   * ctime, which user space cannot set back, and a replacement by rename
   * has a new inode, so both go into the identity, and such a replacement
   * is not served from the old file's cache entries.  Tested by
   * daemon_cache_changed_file. */
  snprintf(f->identity, sizeof(f->identity), "size=%llu;mtime=%lld;ino=%llu;ctime=%lld",
           (unsigned long long)f->size, (long long)f->mtime_ns, (unsigned long long)f->ino,
           (long long)f->ctime_ns);
  f->object_id = util_hash64(path, strlen(path), util_hash64(f->identity, strlen(f->identity), 0));
  return take_footer(f, local_parse, NULL, columns, ncols, opts, err, errlen);
}

int dataset_footer_hash(const pq_source *src, uint32_t footer_length, uint64_t *out) {
  uint64_t len = (uint64_t)footer_length + PQ_TAIL_SIZE;
  if (len > src->size) return LARDER_EIO;
  uint8_t *buf = malloc(len);
  if (buf == NULL) return LARDER_ENOMEM;
  int rc = src->read(src, src->size - len, len, buf);
  if (rc == 0) *out = util_hash64(buf, len, 0x666f6f746572ull);
  free(buf);
  return rc;
}

/* The units a row group of row_bytes decoded bytes (every column) is cut
 * into: ceil(rows / n), n = min(unit_rows, unit_bytes / bytes per row), at
 * least 64 rows each. */
static uint64_t units_in_row_group(const pq_row_group_t *rg, uint64_t row_bytes,
                                   const dataset_options_t *opts) {
  if (rg->num_rows <= 0) return 0;
  uint64_t rows = (uint64_t)rg->num_rows;
  uint64_t per_row = row_bytes / rows + 1;
  uint64_t max_rows = opts->unit_bytes / per_row;
  if (max_rows > opts->unit_rows) max_rows = opts->unit_rows;
  if (max_rows < 64) max_rows = 64;
  return rows / max_rows + (rows % max_rows != 0);
}

static void cut_units(dataset_t *ds, uint32_t fi, const dataset_options_t *opts,
                      dataset_unit_t **units, size_t *n, size_t *cap, int *oom) {
  dataset_file_t *f = &ds->files[fi];
  const pq_file_meta_t *m = pq_file_meta(f->pq);
  f->first_unit = (uint32_t)*n;
  for (int g = 0; g < m->num_row_groups; g++) {
    const pq_row_group_t *rg = &m->row_groups[g];
    if (rg->num_rows <= 0) continue;
    /* The cut uses the width of whole rows, every column's, not the
     * projection's: cache keys name a unit's rows, so two jobs projecting
     * different columns share the columns they have in common only if they
     * cut the same units, and the order then depends on the dataset and
     * the settings alone, not on the projection.  Cut by the projection's
     * width, with unit_bytes setting the size, jobs of different widths
     * would share nothing and each decode everything.  The memory estimate
     * (est_bytes) stays the projection's.  Tested by
     * daemon_cache_shared_columns. */
    uint64_t bytes = 0, row_bytes = 0;
    for (int c = 0; c < m->num_leaves; c++) {
      uint64_t cb = (uint64_t)(rg->columns[c].total_uncompressed_size > 0
                                   ? rg->columns[c].total_uncompressed_size
                                   : 0);
      row_bytes += cb;
      if (pq_projection_has_leaf(f->proj, c)) bytes += cb;
    }
    uint64_t rows = (uint64_t)rg->num_rows;
    uint64_t k = units_in_row_group(rg, row_bytes, opts);
    for (uint64_t i = 0; i < k; i++) {
      uint64_t a = i * rows / k, b = (i + 1) * rows / k;
      if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 256;
        dataset_unit_t *u = realloc(*units, nc * sizeof(*u));
        if (u == NULL) {
          *oom = 1;
          return;
        }
        *units = u;
        *cap = nc;
      }
      dataset_unit_t *u = &(*units)[(*n)++];
      u->file = fi;
      u->rg = (uint32_t)g;
      u->row_start = a;
      u->rows = (uint32_t)(b - a);
      u->est_bytes = bytes * (b - a) / rows;
      /* Every unit of a row group shares its priority, so the cache keeps or
       * drops row groups whole: a row group that is not cached costs one
       * fetch per epoch, never one per unit. */
      uint64_t ident[2] = {f->object_id, (uint64_t)g};
      u->priority = util_hash64(ident, sizeof(ident), 0x9e3779b97f4a7c15ull);
      ds->total_rows += b - a;
      ds->est_bytes += u->est_bytes;
    }
  }
  f->num_units = (uint32_t)(*n - f->first_unit);
}

/* Appends f's type to buf (of size bytes, holding *len), with its
 * children's for nested types, such as list<struct<a: int64, b: string>>;
 * what does not fit is cut. */
static void describe_field(const pq_field_t *f, char *buf, size_t size, size_t *len) {
  if (*len >= size) return;
  *len += (size_t)snprintf(buf + *len, size - *len, "%s", larder_type_name(f->type));
  for (int i = 0; i < f->num_children && *len < size; i++) {
    *len += (size_t)snprintf(buf + *len, size - *len, "%s", i ? ", " : "<");
    if (f->type == LARDER_TYPE_STRUCT && *len < size)
      *len += (size_t)snprintf(buf + *len, size - *len, "%s: ", f->children[i].name);
    describe_field(&f->children[i], buf, size, len);
    if (i == f->num_children - 1 && *len < size)
      *len += (size_t)snprintf(buf + *len, size - *len, ">");
  }
}

/* Says how the projected schema of file `name` differs from that of the
 * dataset's first file (`first_name`, whose columns hash to hash[]), into
 * why; returns 0 when they agree. */
static int schema_difference(const pq_field_t *first, const char *first_name, const uint64_t *hash,
                             const pq_field_t *other, const char *name, char *why, size_t size) {
  int n1 = first->num_children, n2 = other->num_children, c = 0;
  while (c < n1 && c < n2 && layout_field_hash(&other->children[c]) == hash[c]) c++;
  if (c == n1 && c == n2) return 0;
  if (c == n1) {
    snprintf(why, size, "%s has a column '%s' that %s lacks", name, other->children[c].name,
             first_name);
  } else if (c == n2) {
    snprintf(why, size, "%s lacks the column '%s' of %s", name, first->children[c].name,
             first_name);
  } else if (strcmp(first->children[c].name, other->children[c].name) != 0) {
    snprintf(why, size, "column %d is '%s' in %s but '%s' in %s", c + 1, other->children[c].name,
             name, first->children[c].name, first_name);
  } else {
    char a[160], b[160];
    size_t la = 0, lb = 0;
    describe_field(&first->children[c], a, sizeof(a), &la);
    describe_field(&other->children[c], b, sizeof(b), &lb);
    snprintf(why, size, "column '%s' is %s in %s but %s in %s", first->children[c].name, b, name,
             strcmp(a, b) == 0 ? "differs in its type parameters from that" : a, first_name);
  }
  return 1;
}

int dataset_source_absolute(const char *src, char *err, size_t errlen) {
  /* An empty source is dataset_open's to refuse, with its own message. */
  if (src == NULL || src[0] == '\0' || src[0] == '/' || remote_is_url(src)) return 0;
  snprintf(err, errlen,
           "source '%.200s' is a relative path, which the daemon cannot resolve as the client "
           "would (its working directory is not the client's): give an absolute path",
           src);
  return LARDER_EINVAL;
}

/* The files that sources name, sorted and without duplicates (the order is
 * part of the dataset's identity), into *files: local sources expanded as
 * the client (opts->peer), remote ones as resolved beforehand on the loop
 * (opts->remote).  Returns 0, or a code with a message in err (*files is
 * then empty). */
static int list_files(const char *const *sources, size_t n, const dataset_options_t *opts,
                      strlist *files, char *err, size_t errlen) {
  int rc = 0;
  /* Local sources are resolved, and later each file opened, as the
   * client: what it cannot open, the daemon does not read for it. */
  cred_saved_t saved;
  int local = 0;
  for (size_t i = 0; i < n; i++) local |= sources[i] && !remote_is_url(sources[i]);
  if (local) rc = cred_enter(opts->peer, &saved, err, errlen);
  if (rc) return rc;
  for (size_t i = 0; i < n && rc == 0; i++) {
    if (sources[i] == NULL || sources[i][0] == '\0') {
      snprintf(err, errlen, "empty source");
      rc = LARDER_EINVAL;
    } else if (remote_is_url(sources[i])) {
      /* Resolved beforehand on the loop; added below. */
    } else {
      rc = expand_local(sources[i], opts, files, err, errlen);
    }
  }
  if (local) cred_leave(&saved);
  if (rc) {
    strlist_free(files);
    return rc;
  }
  for (size_t i = 0; i < opts->num_remote && rc == 0; i++)
    rc = strlist_add(files, opts->remote[i].url);
  if (rc) {
    strlist_free(files);
    return rc;
  }
  strlist_sort_unique(files);
  if (files->n == 0) {
    strlist_free(files);
    snprintf(err, errlen, "the sources name no files");
    return LARDER_ENOENT;
  }
  return 0;
}

/* Opens ds's files (the paths in files) with their footers and the
 * projection of columns.  Returns 0, or a code with a message in err (the
 * files opened so far stay in ds, for dataset_free). */
static int open_files(dataset_t *ds, const strlist *files, const char *const *columns, size_t ncols,
                      const dataset_options_t *opts, char *err, size_t errlen) {
  int rc = 0;
  cred_saved_t saved;
  ds->files = calloc(files->n, sizeof(dataset_file_t));
  if (ds->files == NULL) return LARDER_ENOMEM;
  ds->num_files = (uint32_t)files->n;
  for (size_t i = 0; i < files->n; i++) ds->files[i].fd = -1;
  for (size_t i = 0; i < files->n && rc == 0; i++) {
    /* Each file is opened as the client, then read through that
     * descriptor alone, never by its path again.  One at a time: a file
     * whose footer another dataset holds gives its descriptor back at once,
     * so that an open of N files shared with other streams takes one more
     * descriptor, not N. */
    int fd = -1;
    if (!remote_is_url(files->v[i])) {
      rc = cred_enter(opts->peer, &saved, err, errlen);
      if (rc) break;
      rc = open_local(files->v[i], opts->allowed_roots, &fd, err, errlen);
      cred_leave(&saved);
      if (rc) break;
    }
    rc = open_file(&ds->files[i], files->v[i], fd, columns, ncols, opts, err, errlen);
  }
  return rc;
}

/* Sets ds's schema (the first file's projection) and column hashes, and
 * checks that every file serves the same columns with the same types.
 * Returns 0, or a code with a message in err. */
static int check_schemas(dataset_t *ds, char *err, size_t errlen) {
  ds->schema = pq_projection_schema(ds->files[0].proj);
  ds->num_columns = ds->schema->num_children;
  ds->column_hash = calloc((size_t)ds->num_columns + 1, sizeof(uint64_t));
  if (ds->column_hash == NULL) return LARDER_ENOMEM;
  for (int c = 0; c < ds->num_columns; c++)
    ds->column_hash[c] = layout_field_hash(&ds->schema->children[c]);
  for (uint32_t i = 1; i < ds->num_files; i++) {
    if (schema_difference(ds->schema, ds->files[0].name, ds->column_hash,
                          pq_projection_schema(ds->files[i].proj), ds->files[i].name, err,
                          errlen)) {
      size_t len = strlen(err);
      snprintf(err + len, errlen - len, "; a dataset's files must share the projected schema");
      return LARDER_EINVAL;
    }
  }
  return 0;
}

/* Checks the footers' row counts before anything is planned or allocated
 * from them.  Returns 0, or LARDER_ECORRUPT / LARDER_ELIMIT with a message
 * in err. */
static int check_row_counts(const dataset_t *ds, const dataset_options_t *opts, char *err,
                            size_t errlen) {
  /* Every row has at least one value (a null, or a level) in every column
   * the stream reads, and the units they make stay countable, so that a
   * footer claiming 2^30 rows in a few bytes never plans a billion-row
   * window.  A row group that no unit size could cut into few enough units
   * is named as the footer's lie it is, not as a setting to raise. */
  uint64_t units = 0;
  const uint64_t max_rows = DATASET_MAX_UNITS * 65536;
  for (uint32_t i = 0; i < ds->num_files; i++) {
    const pq_file_meta_t *fm = pq_file_meta(ds->files[i].pq);
    for (int g = 0; g < fm->num_row_groups; g++) {
      const pq_row_group_t *rg = &fm->row_groups[g];
      uint64_t row_bytes = 0;
      for (int c = 0; c < fm->num_leaves; c++) {
        if (rg->columns[c].total_uncompressed_size > 0)
          row_bytes += (uint64_t)rg->columns[c].total_uncompressed_size;
        if (!pq_projection_has_leaf(ds->files[i].proj, c)) continue;
        if (rg->columns[c].num_values >= rg->num_rows) continue;
        snprintf(err, errlen,
                 "%s: row group %d claims %lld rows, but column '%s' holds %lld values",
                 ds->files[i].name, g, (long long)rg->num_rows, fm->leaves[c]->path,
                 (long long)rg->columns[c].num_values);
        return LARDER_ECORRUPT;
      }
      if ((uint64_t)rg->num_rows > max_rows) {
        snprintf(err, errlen,
                 "%s: row group %d claims %lld rows, more than any dataset may hold (%llu); its "
                 "footer is likely corrupt",
                 ds->files[i].name, g, (long long)rg->num_rows, (unsigned long long)max_rows);
        return LARDER_ECORRUPT;
      }
      units += units_in_row_group(rg, row_bytes, opts);
    }
  }
  if (units > DATASET_MAX_UNITS) {
    snprintf(err, errlen,
             "the dataset has %llu units (of at most %u rows and %llu bytes), more than %llu: "
             "raise unit_rows or unit_bytes",
             (unsigned long long)units, (unsigned)opts->unit_rows,
             (unsigned long long)opts->unit_bytes, (unsigned long long)DATASET_MAX_UNITS);
    return LARDER_ELIMIT;
  }
  return 0;
}

/* Cuts ds's files into units, numbers their row groups, and makes the
 * dataset's row plan.  Returns 0, or a code with a message in err (a
 * dataset without rows is refused). */
static int cut_dataset(dataset_t *ds, const dataset_options_t *opts, char *err, size_t errlen) {
  size_t nu = 0, cap = 0;
  int oom = 0;
  for (uint32_t i = 0; i < ds->num_files && !oom; i++)
    cut_units(ds, i, opts, &ds->units, &nu, &cap, &oom);
  if (oom || nu > UINT32_MAX) return LARDER_ENOMEM;
  ds->num_units = (uint32_t)nu;
  for (uint32_t i = 0; i < ds->num_files; i++) {
    ds->files[i].first_rg = ds->num_rgs;
    ds->num_rgs += (uint32_t)pq_file_meta(ds->files[i].pq)->num_row_groups;
  }
  ds->rg_busy = calloc((size_t)ds->num_rgs + 1, sizeof(int));
  if (ds->rg_busy == NULL) return LARDER_ENOMEM;
  ds->decoded_ahead = calloc((size_t)ds->num_units + 1, 1);
  if (ds->decoded_ahead == NULL) return LARDER_ENOMEM;
  ds->resident_priority = ds->stage_priority = UINT64_MAX;
  if (layout_rowplan_make(ds->schema, &ds->rowplan) != 0) return LARDER_ENOMEM;
  if (ds->total_rows == 0) {
    snprintf(err, errlen, "the dataset has no rows: its %u file%s hold%s none", ds->num_files,
             ds->num_files == 1 ? "" : "s", ds->num_files == 1 ? "s" : "");
    return LARDER_EINVAL;
  }
  return 0;
}

/* The dataset's key: a hash of the unit settings, its files' identities
 * and its columns.  Datasets with equal keys cut the same units. */
static uint64_t dataset_key(const dataset_t *ds, const dataset_options_t *opts) {
  uint64_t h = util_hash64(&opts->unit_rows, sizeof(opts->unit_rows), 0);
  h = util_hash64(&opts->unit_bytes, sizeof(opts->unit_bytes), h);
  for (uint32_t i = 0; i < ds->num_files; i++) {
    h = util_hash64(&ds->files[i].object_id, 8, h);
  }
  for (int c = 0; c < ds->num_columns; c++) h = util_hash64(&ds->column_hash[c], 8, h);
  return h;
}

/* ds->order, from its footers' statistics (clustered.h). */
static int judge_order(dataset_t *ds) {
  if (ds->num_files == 0) return clustered_check(NULL, NULL, 0, &ds->order);
  const pq_file **files =
      calloc(ds->num_files, sizeof(pq_file *)); /* NOLINT(bugprone-sizeof-expression) */
  const pq_projection **projs =
      calloc(ds->num_files, sizeof(pq_projection *)); /* NOLINT(bugprone-sizeof-expression) */
  int rc = LARDER_ENOMEM;
  if (files && projs) {
    for (uint32_t i = 0; i < ds->num_files; i++) {
      files[i] = ds->files[i].pq;
      projs[i] = ds->files[i].proj;
    }
    rc = clustered_check(files, projs, ds->num_files, &ds->order);
  }
  free(files);
  free(projs);
  return rc;
}

int dataset_open(const char *const *sources, size_t n, const char *const *columns, size_t ncols,
                 const dataset_options_t *opts, dataset_t **out, char *err, size_t errlen) {
  *out = NULL;
  if (n == 0) {
    snprintf(err, errlen, "no sources given");
    return LARDER_EINVAL;
  }
  strlist files = {0};
  int rc = list_files(sources, n, opts, &files, err, errlen);
  if (rc) return rc;
  dataset_t *ds = calloc(1, sizeof(*ds));
  if (ds == NULL) {
    strlist_free(&files);
    return LARDER_ENOMEM;
  }
  ds->refs = 1;
  ds->footers = opts->footers;
  rc = open_files(ds, &files, columns, ncols, opts, err, errlen);
  if (rc == 0) rc = check_schemas(ds, err, errlen);
  if (rc == 0) rc = check_row_counts(ds, opts, err, errlen);
  if (rc == 0) rc = cut_dataset(ds, opts, err, errlen);
  if (rc == 0) rc = judge_order(ds);
  strlist_free(&files);
  if (rc) {
    dataset_free(ds);
    return rc;
  }
  ds->key = dataset_key(ds, opts);
  *out = ds;
  return 0;
}

void dataset_free(dataset_t *ds) {
  if (ds == NULL) return;
  for (uint32_t i = 0; i < ds->num_files; i++) {
    pq_projection_free(ds->files[i].proj);
    if (ds->files[i].footer) footers_release(ds->footers, ds->files[i].footer);
    pq_file_close(ds->files[i].owned_pq);
    if (ds->files[i].fd >= 0) close(ds->files[i].fd);
    free(ds->files[i].path);
    free(ds->files[i].name);
  }
  free(ds->files);
  free(ds->units);
  free(ds->column_hash);
  layout_rowplan_free(ds->rowplan);
  free(ds->rg_busy);
  free(ds->decoded_ahead);
  free(ds);
}

int dataset_file_fd(const dataset_file_t *f) { return f->footer ? footers_fd(f->footer) : f->fd; }

void dataset_column_key(const dataset_t *ds, uint32_t u, int c, store_key_t *key) {
  const dataset_unit_t *unit = &ds->units[u];
  const dataset_file_t *f = &ds->files[unit->file];
  /* key->bytes is only written: the caller's key need not be initialized. */
  /* cppcheck-suppress ctuuninitvar */
  uint8_t *p = key->bytes;
  p[0] = 'u';
  p[1] = 1; /* key format version */
  memcpy(p + 2, &f->object_id, 8);
  memcpy(p + 10, &unit->rg, 4);
  memcpy(p + 14, &unit->row_start, 8);
  memcpy(p + 22, &unit->rows, 4);
  memcpy(p + 26, &ds->column_hash[c], 8);
  key->len = 34;
}

int dataset_shuffle_plan(const dataset_t *ds, const shuffle_params_t *params, int row_group_blocks,
                         shuffle_plan_t **out) {
  if (row_group_blocks < 0) row_group_blocks = ds->order.together;
  /* Partitions are made of whole row groups whatever the order within
   * them, so that no row group is fetched by two nodes. */
  int groups = row_group_blocks || params->partitions > 1;
  uint64_t *rows = malloc((size_t)ds->num_units * sizeof(*rows));
  uint32_t *blocks = groups ? malloc((size_t)ds->num_units * sizeof(*blocks)) : NULL;
  if (rows == NULL || (groups && blocks == NULL)) {
    free(rows);
    free(blocks);
    return LARDER_ENOMEM;
  }
  uint32_t nb = 0;
  for (uint32_t i = 0; i < ds->num_units; i++) {
    const dataset_unit_t *u = &ds->units[i];
    rows[i] = u->rows;
    if (blocks == NULL) continue;
    if (i > 0 && u->file == u[-1].file && u->rg == u[-1].rg) blocks[nb - 1]++;
    else blocks[nb++] = 1;
  }
  int rc = params->partitions > 1
               ? shuffle_plan_create_partitioned(rows, ds->num_units, blocks, nb, row_group_blocks,
                                                 params, out)
               : shuffle_plan_create_blocked(rows, ds->num_units, blocks, nb, params, out);
  free(rows);
  free(blocks);
  return rc;
}

uint64_t dataset_window_rows(const dataset_t *ds, uint64_t units) {
  if (ds->num_units == 0) return 0;
  if (units > ds->num_units) units = ds->num_units;
  /* total_rows < 2^63 and units <= num_units: no overflow in 128 bits. */
  return (uint64_t)((unsigned __int128)ds->total_rows * units / ds->num_units);
}

uint32_t dataset_window_units(const dataset_t *ds, uint64_t window_bytes) {
  uint64_t avg = ds->num_units ? ds->est_bytes / ds->num_units : 1;
  if (avg == 0) avg = 1;
  uint64_t w = window_bytes / avg;
  if (w < 1) w = 1;
  if (w > ds->num_units) w = ds->num_units;
  if (w > 1u << 20) w = 1u << 20;
  /* The window is capped in rows too: rows whose estimate is next to
   * nothing (a footer claiming 2^30 rows in a few bytes) would make the
   * whole dataset one window, and its permutation gigabytes.  Tested by
   * daemon_robust_huge_row_count. */
  uint64_t rows_per_unit = ds->num_units ? ds->total_rows / ds->num_units + 1 : 1;
  if (w > DATASET_MAX_WINDOW_ROWS / rows_per_unit) w = DATASET_MAX_WINDOW_ROWS / rows_per_unit;
  if (w < 1) w = 1;
  return (uint32_t)w;
}

void dataset_register_objects(store_t *store, const dataset_t *ds) {
  if (store == NULL) return;
  for (uint32_t i = 0; i < ds->num_files; i++) {
    const dataset_file_t *f = &ds->files[i];
    char name[1024];
    if (f->remote) fetch_redact(f->path, name, sizeof(name));
    else snprintf(name, sizeof(name), "%s", f->path);
    store_object_t o = {f->object_id, name, f->identity};
    store_object_put(store, &o);
  }
}

char *dataset_sources_label(char *const *sources, size_t n) {
  /* The first source, and how many more: a job may name thousands of
   * shards, and the label ends up in every metric series of the stream. */
  char red[1024] = "";
  if (n > 0) {
    if (remote_is_url(sources[0])) fetch_redact(sources[0], red, sizeof(red));
    else snprintf(red, sizeof(red), "%s", sources[0]);
  }
  if (n <= 1) return strdup(red);
  char *out = NULL;
  if (asprintf(&out, "%s (+%zu more)", red, n - 1) < 0) return NULL;
  return out;
}
