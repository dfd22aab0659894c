/*
 * config.c: defaults, the INI file and command-line overrides.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "larder.h"
#include "acl.h"
#include "config.h"
#include "log.h"

enum { T_STR, T_SIZE, T_U64, T_BOOL, T_LEVEL, T_AUTO };

/* Pointers first, then the ints: no padding inside the entries. */
typedef struct key_info {
  const char *name;
  const char *def;
  const char *doc;
  size_t offset;
  int type;
  int live;
} key_info;

static const key_info keys[] = {
#define CONFIG_INFO_(name, type, def, live, doc) \
  {#name, def, doc, offsetof(config_t, name), T_##type, live},
    CONFIG_KEYS(CONFIG_INFO_)
#undef CONFIG_INFO_
};
#define NUM_KEYS (sizeof(keys) / sizeof(keys[0]))

static const key_info *find_key(const char *name) {
  for (size_t i = 0; i < NUM_KEYS; i++) {
    if (strcmp(keys[i].name, name) == 0) return &keys[i];
    /* Accept dashes for underscores, as command-line flags are written. */
    const char *a = keys[i].name, *b = name;
    while (*a && (*a == *b || (*a == '_' && *b == '-'))) a++, b++;
    if (*a == '\0' && *b == '\0') return &keys[i];
  }
  return NULL;
}

static int parse_size(const char *s, uint64_t *out) {
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s) return -1;
  while (*end == ' ') end++;
  uint64_t mul = 1;
  switch (*end) {
    case 'k':
    case 'K':
      mul = 1ull << 10;
      end++;
      break;
    case 'm':
    case 'M':
      mul = 1ull << 20;
      end++;
      break;
    case 'g':
    case 'G':
      mul = 1ull << 30;
      end++;
      break;
    case 't':
    case 'T':
      mul = 1ull << 40;
      end++;
      break;
    default: break;
  }
  if (*end == 'i' || *end == 'I') end++;
  if (*end == 'b' || *end == 'B') end++;
  if (*end != '\0') return -1;
  if (mul > 1 && v > UINT64_MAX / mul) return -1;
  *out = v * mul;
  return 0;
}

/* Numbers with a documented range. */
static const struct {
  const char *name;
  uint64_t min, max;
} bounds[] = {
    {"workers", 0, 4096},
    {"unit_rows", 1, 65536},
    {"socket_mode", 0, 07777},
};

static int set_value(config_t *cfg, const key_info *k, const char *value, char *err,
                     size_t errlen) {
  char *field = (char *)cfg + k->offset;
  switch (k->type) {
    case T_STR: {
      char *copy = strdup(value);
      if (copy == NULL) return LARDER_ENOMEM;
      char **slot = (char **)(void *)field;
      free(*slot);
      *slot = copy;
      return 0;
    }
    case T_SIZE:
    case T_U64: {
      uint64_t v;
      int rc;
      /* strtoull takes "-1" as 2^64 - 1, so a negative value is refused
       * here: workers=-1 would start a daemon with no workers, whose
       * streams never get a batch.  Tested by config_rejects_out_of_range. */
      const char *p = value;
      while (*p == ' ' || *p == '\t') p++;
      if (*p == '-') {
        snprintf(err, errlen, "%s: '%s' is negative", k->name, value);
        return LARDER_EINVAL;
      }
      if (k->type == T_SIZE) {
        rc = parse_size(value, &v);
      } else {
        char *end;
        errno = 0;
        v = strtoull(value, &end, value[0] == '0' && value[1] ? 8 : 10);
        rc = errno || end == value || *end ? -1 : 0;
      }
      if (rc) {
        snprintf(err, errlen, "%s: '%s' is not a %s", k->name, value,
                 k->type == T_SIZE ? "size (such as 64G)" : "number");
        return LARDER_EINVAL;
      }
      for (size_t i = 0; i < sizeof(bounds) / sizeof(bounds[0]); i++)
        if (strcmp(bounds[i].name, k->name) == 0 && (v < bounds[i].min || v > bounds[i].max)) {
          snprintf(err, errlen, "%s: %s is outside %llu .. %llu", k->name, value,
                   (unsigned long long)bounds[i].min, (unsigned long long)bounds[i].max);
          return LARDER_EINVAL;
        }
      memcpy(field, &v, sizeof(v));
      return 0;
    }
    case T_AUTO:
    case T_BOOL: {
      int v;
      if (k->type == T_AUTO && !strcasecmp(value, "auto")) v = CONFIG_AUTO;
      else if (!strcasecmp(value, "true") || !strcasecmp(value, "yes") || !strcmp(value, "1") ||
               !strcasecmp(value, "on"))
        v = 1;
      else if (!strcasecmp(value, "false") || !strcasecmp(value, "no") || !strcmp(value, "0") ||
               !strcasecmp(value, "off"))
        v = 0;
      else {
        snprintf(err, errlen, "%s: '%s' is not true or false%s", k->name, value,
                 k->type == T_AUTO ? " (or auto)" : "");
        return LARDER_EINVAL;
      }
      memcpy(field, &v, sizeof(v));
      return 0;
    }
    case T_LEVEL: {
      int v = log_level_parse(value);
      if (v < 0) {
        snprintf(err, errlen, "%s: '%s' is not debug, info, notice, warning or err", k->name,
                 value);
        return LARDER_EINVAL;
      }
      memcpy(field, &v, sizeof(v));
      return 0;
    }
  }
  return LARDER_EINVAL;
}

int config_defaults(config_t *cfg) {
  memset(cfg, 0, sizeof(*cfg));
  char err[256];
  for (size_t i = 0; i < NUM_KEYS; i++) {
    int rc = set_value(cfg, &keys[i], keys[i].def, err, sizeof(err));
    if (rc) return rc;
  }
  return 0;
}

/* Appends one allow line (the only key that may repeat). */
static int add_allow(config_t *cfg, const char *value, char *err, size_t errlen) {
  int rc = acl_rule_check(value, err, errlen);
  if (rc) return rc;
  char **v = realloc(cfg->allow, (cfg->num_allow + 1) * sizeof(char *));
  if (v == NULL) return LARDER_ENOMEM;
  cfg->allow = v;
  if ((v[cfg->num_allow] = strdup(value)) == NULL) return LARDER_ENOMEM;
  cfg->num_allow++;
  return 0;
}

int config_is_secret(const char *key) {
  return strcmp(key, "s3_secret_key") == 0 || strcmp(key, "s3_session_token") == 0 ||
         strcmp(key, "s3_access_key") == 0;
}

/* Whether an unknown key may be shown in an error: text that could be a key
 * (lowercase letters, digits, '_' and '-', at most 40 of them), not a secret
 * pasted where a key should be. */
static int key_like(const char *name) {
  size_t n = 0;
  for (; name[n]; n++) {
    char ch = name[n];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-')) return 0;
  }
  return n > 0 && n <= 40;
}

/* The largest secret file read: far beyond any credential, and small
 * enough that a path to a device or a log by mistake fails at once. */
#define SECRET_FILE_MAX (1u << 20)

/* Reads the secret in the file at path (for key) into *out (malloc'd),
 * without the spaces and line ends around it.  A FIFO or a device is
 * refused rather than waited on (the loop thread reads it at reload).
 * Returns 0, or LARDER_EIO / LARDER_EINVAL / LARDER_ENOMEM with a message
 * naming key and path, never the content. */
static int read_secret_file(const char *key, const char *path, char **out, char *err,
                            size_t errlen) {
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    snprintf(err, errlen, "%s: cannot read %s: %s", key, path, strerror(errno));
    return LARDER_EIO;
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "%s: %s is not a regular file", key, path);
    close(fd);
    return LARDER_EINVAL;
  }
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  int rc = buf ? 0 : LARDER_ENOMEM;
  while (rc == 0) {
    if (n + 1 == cap) {
      if (cap >= SECRET_FILE_MAX) {
        snprintf(err, errlen, "%s: %s holds %u bytes or more: not a secret", key, path,
                 SECRET_FILE_MAX - 1);
        rc = LARDER_EINVAL;
        break;
      }
      char *more = malloc(cap * 2);
      if (more == NULL) {
        rc = LARDER_ENOMEM;
        break;
      }
      memcpy(more, buf, n);
      explicit_bzero(buf, cap);
      free(buf);
      buf = more;
      cap *= 2;
    }
    ssize_t got = read(fd, buf + n, cap - 1 - n);
    if (got == 0) break;
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      snprintf(err, errlen, "%s: cannot read %s: %s", key, path, strerror(errno));
      rc = LARDER_EIO;
      break;
    }
    n += (size_t)got;
  }
  close(fd);
  if (rc == LARDER_ENOMEM) snprintf(err, errlen, "%s: out of memory reading %s", key, path);
  if (rc == 0) {
    buf[n] = '\0';
    size_t a = 0;
    while (a < n && (buf[a] == ' ' || buf[a] == '\t' || buf[a] == '\r' || buf[a] == '\n')) a++;
    while (n > a &&
           (buf[n - 1] == ' ' || buf[n - 1] == '\t' || buf[n - 1] == '\r' || buf[n - 1] == '\n'))
      n--;
    memmove(buf, buf + a, n - a);
    n -= a;
    buf[n] = '\0';
    if (n == 0) {
      snprintf(err, errlen, "%s: %s is empty", key, path);
      rc = LARDER_EINVAL;
    }
    for (size_t i = 0; rc == 0 && i < n; i++) {
      unsigned char ch = (unsigned char)buf[i];
      if (ch < 0x20 || ch == 0x7f) {
        snprintf(err, errlen,
                 "%s: %s holds %s at byte %zu: a secret file holds one line, the secret", key, path,
                 ch == '\n' ? "more than one line" : "a control character", i + 1);
        rc = LARDER_EINVAL;
      }
    }
  }
  if (rc) {
    if (buf) explicit_bzero(buf, cap);
    free(buf);
    return rc;
  }
  *out = buf;
  return 0;
}

/* The key that pairs with k: s3_secret_key_file's is s3_secret_key and the
 * other way round; NULL for keys that have no file. */
static const key_info *secret_pair(const key_info *k) {
  static const char suffix[] = "_file";
  size_t n = strlen(k->name), s = sizeof(suffix) - 1;
  char name[64];
  if (n > s && strcmp(k->name + n - s, suffix) == 0) {
    snprintf(name, sizeof(name), "%.*s", (int)(n - s), k->name);
    return config_is_secret(name) ? find_key(name) : NULL;
  }
  if (!config_is_secret(k->name)) return NULL;
  snprintf(name, sizeof(name), "%s%s", k->name, suffix);
  return find_key(name);
}

static const char *str_field(const config_t *cfg, const key_info *k) {
  const char *v = *(char *const *)(const void *)((const char *)cfg + k->offset);
  return v ? v : "";
}

/* Sets a *_file key (kf) to path and its secret (ks) to the file's content;
 * an empty path forgets the file and the secret read from it. */
static int set_secret_file(config_t *cfg, const key_info *kf, const key_info *ks, const char *path,
                           char *err, size_t errlen) {
  const char *secret = "";
  char *content = NULL;
  if (*path) {
    int rc = read_secret_file(kf->name, path, &content, err, errlen);
    if (rc) return rc;
    secret = content;
  } else if (*str_field(cfg, kf) == '\0') {
    return 0; /* no file before either: the secret stays as it is */
  }
  int rc = set_value(cfg, ks, secret, err, errlen);
  if (rc == 0) rc = set_value(cfg, kf, path, err, errlen);
  if (content) {
    explicit_bzero(content, strlen(content));
    free(content);
  }
  return rc;
}

int config_set(config_t *cfg, const char *key, const char *value, char *err, size_t errlen) {
  if (strcmp(key, "allow") == 0) return add_allow(cfg, value, err, errlen);
  const key_info *k = find_key(key);
  if (k == NULL) {
    if (key_like(key)) snprintf(err, errlen, "unknown setting '%s'", key);
    else
      snprintf(err, errlen,
               "unknown setting (not shown: it is not lowercase letters, digits and '_', and "
               "may be a secret on a line of its own)");
    return LARDER_EINVAL;
  }
  const key_info *pair = secret_pair(k);
  if (pair && !config_is_secret(k->name)) return set_secret_file(cfg, k, pair, value, err, errlen);
  int rc = set_value(cfg, k, value, err, errlen);
  /* A secret set itself no longer comes from its file. */
  if (rc == 0 && pair) rc = set_value(cfg, pair, "", err, errlen);
  return rc;
}

/* The file is split into lines here, not by inih: inih's line buffer is
 * fixed when the library is built (200 bytes in Debian's), and its errors
 * give a line number without a reason.  The syntax is inih's, less
 * continuation lines: "[section]" lines (ignored), "key = value" or
 * "key : value" lines, comments from ';' or '#' at the start of a line or
 * ';' after a space, blank lines, CR LF or LF line ends, and a UTF-8 byte
 * order mark at the start of the file. */

/* What is wrong with the bytes of a line (len of them, without its line
 * end), or NULL when nothing is: NUL and control characters other than the
 * tab.  *col gets the 1-based column of the first bad byte. */
static const char *line_junk(const char *s, size_t len, size_t *col, unsigned *byte) {
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)s[i];
    if (ch == '\t' || (ch >= 0x20 && ch != 0x7f)) continue;
    *col = i + 1;
    *byte = ch;
    if (ch == '\0') return "a NUL byte (is this a binary file?)";
    if (ch == '\r') return "a carriage return inside the line";
    return "a control character";
  }
  return NULL;
}

/* The first of chars in s, or the start of an inline comment (';' after a
 * space or tab), or the end of s. */
static char *find_sep(char *s, const char *chars) {
  int was_space = 0;
  for (; *s; s++) {
    if (chars && strchr(chars, *s)) return s;
    if (*s == ';' && was_space) return s;
    was_space = *s == ' ' || *s == '\t';
  }
  return s;
}

static char *strip(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
  return s;
}

/* Applies one line (NUL-terminated, len bytes before its line end, which
 * is already cut off).  Returns 0 or a code with "path:lineno: why" in err. */
static int apply_line(config_t *cfg, char *line, size_t len, const char *path, size_t lineno,
                      char *err, size_t errlen) {
  size_t col = 0;
  unsigned byte = 0;
  const char *junk = line_junk(line, len, &col, &byte);
  if (junk) {
    if (byte == 0 || byte == '\r')
      snprintf(err, errlen, "%s:%zu: %s at column %zu", path, lineno, junk, col);
    else snprintf(err, errlen, "%s:%zu: %s (0x%02x) at column %zu", path, lineno, junk, byte, col);
    return LARDER_EINVAL;
  }
  char *s = strip(line);
  if (*s == '\0' || *s == ';' || *s == '#') return 0;
  if (*s == '[') {
    if (*find_sep(s + 1, "]") != ']') {
      snprintf(err, errlen, "%s:%zu: a section header without its closing ']'", path, lineno);
      return LARDER_EINVAL;
    }
    return 0; /* keys may sit in any section */
  }
  char *sep = find_sep(s, "=:");
  if (*sep != '=' && *sep != ':') {
    snprintf(err, errlen,
             "%s:%zu: not a setting: no '=' (a setting is 'key = value'; a comment starts "
             "with '#')",
             path, lineno);
    return LARDER_EINVAL;
  }
  char sepch = *sep;
  *sep = '\0';
  char *key = strip(s);
  char *value = sep + 1;
  *find_sep(value, NULL) = '\0';
  value = strip(value);
  if (*key == '\0') {
    snprintf(err, errlen, "%s:%zu: no key before the '%c'", path, lineno, sepch);
    return LARDER_EINVAL;
  }
  char why[512];
  int rc = config_set(cfg, key, value, why, sizeof(why));
  if (rc) snprintf(err, errlen, "%s:%zu: %s", path, lineno, why);
  return rc;
}

int config_load_file(config_t *cfg, const char *path, int missing_ok, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (f == NULL) {
    if (errno == ENOENT && missing_ok) return 0;
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return LARDER_EIO;
  }
  char *line = NULL;
  size_t cap = 0, lineno = 0;
  ssize_t got;
  int rc = 0;
  errno = 0;
  while (rc == 0 && (got = getline(&line, &cap, f)) >= 0) {
    size_t len = (size_t)got;
    lineno++;
    if (len && line[len - 1] == '\n') line[--len] = '\0';
    if (len && line[len - 1] == '\r') line[--len] = '\0';
    char *start = line;
    if (lineno == 1 && len >= 3 && memcmp(line, "\xEF\xBB\xBF", 3) == 0) {
      start += 3;
      len -= 3;
    }
    rc = apply_line(cfg, start, len, path, lineno, err, errlen);
    errno = 0;
  }
  if (rc == 0 && (ferror(f) || errno == ENOMEM)) {
    int e = errno ? errno : EIO;
    snprintf(err, errlen, "%s:%zu: %s", path, lineno + 1, strerror(e));
    rc = e == ENOMEM ? LARDER_ENOMEM : LARDER_EIO;
  }
  /* A secret's line stays in no buffer. */
  if (line) explicit_bzero(line, cap);
  free(line);
  fclose(f);
  if (rc) return rc;
  char *copy = strdup(path);
  if (copy == NULL) return LARDER_ENOMEM;
  free(cfg->path);
  cfg->path = copy;
  return 0;
}

static int same_allow(const config_t *a, const config_t *b) {
  if (a->num_allow != b->num_allow) return 0;
  for (size_t i = 0; i < a->num_allow; i++)
    if (strcmp(a->allow[i], b->allow[i]) != 0) return 0;
  return 1;
}

static void list_add(char *buf, size_t len, size_t *used, const char *name) {
  if (buf == NULL || *used + strlen(name) + 3 >= len) return;
  *used += (size_t)snprintf(buf + *used, len - *used, "%s%s", *used ? ", " : "", name);
}

void config_apply_live(config_t *cur, const config_t *next, char *restart, size_t restart_len) {
  config_apply_live_report(cur, next, restart, restart_len, NULL, 0);
}

void config_apply_live_report(config_t *cur, const config_t *next, char *restart,
                              size_t restart_len, char *changed, size_t changed_len) {
  size_t used = 0, cused = 0;
  restart[0] = '\0';
  if (changed) changed[0] = '\0';
  if (!same_allow(cur, next)) {
    /* The allowlist is live: copy it whole, or keep the old one. */
    char **v = next->num_allow ? calloc(next->num_allow, sizeof(char *)) : NULL;
    size_t k = 0;
    if (v || next->num_allow == 0) {
      for (; k < next->num_allow; k++)
        if ((v[k] = strdup(next->allow[k])) == NULL) break;
    }
    if ((v || next->num_allow == 0) && k == next->num_allow) {
      for (size_t i = 0; i < cur->num_allow; i++) free(cur->allow[i]);
      free(cur->allow);
      cur->allow = v;
      cur->num_allow = k;
      list_add(changed, changed_len, &cused, "allow");
    } else if (v) {
      for (size_t i = 0; i < k; i++) free(v[i]);
      free(v);
    }
  }
  for (size_t i = 0; i < NUM_KEYS; i++) {
    const key_info *k = &keys[i];
    const char *a = (const char *)cur + k->offset, *b = (const char *)next + k->offset;
    int same;
    if (k->type == T_STR) {
      const char *sa = *(char *const *)(const void *)a, *sb = *(char *const *)(const void *)b;
      same = (sa == NULL && sb == NULL) || (sa && sb && strcmp(sa, sb) == 0);
    } else if (k->type == T_SIZE || k->type == T_U64) {
      same = memcmp(a, b, sizeof(uint64_t)) == 0;
    } else {
      same = memcmp(a, b, sizeof(int)) == 0;
    }
    if (same) continue;
    if (k->live) list_add(changed, changed_len, &cused, k->name);
    if (k->live) {
      if (k->type == T_STR) {
        char **slot = (char **)(void *)((char *)cur + k->offset);
        const char *sb = *(char *const *)(const void *)b;
        char *copy = sb ? strdup(sb) : NULL;
        if (sb && copy == NULL) continue;
        free(*slot);
        *slot = copy;
      } else {
        memcpy((char *)cur + k->offset, b, k->type == T_SIZE || k->type == T_U64 ? 8 : sizeof(int));
      }
    } else if (used + strlen(k->name) + 2 < restart_len) {
      used +=
          (size_t)snprintf(restart + used, restart_len - used, "%s%s", used ? ", " : "", k->name);
    }
  }
}

void config_free(config_t *cfg) {
  for (size_t i = 0; i < NUM_KEYS; i++) {
    if (keys[i].type != T_STR) continue;
    char **slot = (char **)(void *)((char *)cfg + keys[i].offset);
    free(*slot);
    *slot = NULL;
  }
  free(cfg->path);
  cfg->path = NULL;
  for (size_t i = 0; i < cfg->num_allow; i++) free(cfg->allow[i]);
  free(cfg->allow);
  cfg->allow = NULL;
  cfg->num_allow = 0;
}

void config_each(const config_t *cfg,
                 void (*fn)(const char *key, const char *value, int live, void *arg), void *arg) {
  static const char *const levels[] = {"emerg",   "alert",  "crit", "err",
                                       "warning", "notice", "info", "debug"};
  for (size_t i = 0; i < NUM_KEYS; i++) {
    const key_info *k = &keys[i];
    const char *field = (const char *)cfg + k->offset;
    char buf[64];
    const char *v = buf;
    switch (k->type) {
      case T_STR:
        v = *(char *const *)(const void *)field;
        if (v == NULL) v = "";
        if (config_is_secret(k->name) && *v) v = "(set)";
        break;
      case T_SIZE:
      case T_U64: {
        uint64_t n;
        memcpy(&n, field, sizeof(n));
        if (strcmp(k->name, "socket_mode") == 0) {
          snprintf(buf, sizeof(buf), "0%llo", (unsigned long long)n);
        } else if (n == 0 && (strcmp(k->name, "workers") == 0 ||
                              strcmp(k->name, "cache_flush_threads") == 0)) {
          v = "auto"; /* chosen at startup from the cores (the key's doc) */
        } else if (k->type == T_SIZE && n > 0) {
          /* As a size is written: the largest unit that divides it. */
          static const char units[] = "KMGTP";
          int u = -1;
          while (u < 4 && n % ((uint64_t)1024 << (10 * (u + 1))) == 0 &&
                 n >= ((uint64_t)1024 << (10 * (u + 1))))
            u++;
          if (u < 0) snprintf(buf, sizeof(buf), "%llu", (unsigned long long)n);
          else
            snprintf(buf, sizeof(buf), "%llu%c", (unsigned long long)(n >> (10 * (u + 1))),
                     units[u]);
        } else {
          snprintf(buf, sizeof(buf), "%llu", (unsigned long long)n);
        }
        break;
      }
      case T_AUTO:
      case T_BOOL: {
        int b;
        memcpy(&b, field, sizeof(b));
        v = b == CONFIG_AUTO ? "auto" : b ? "true" : "false";
        break;
      }
      case T_LEVEL: {
        int l;
        memcpy(&l, field, sizeof(l));
        v = l >= 0 && l < 8 ? levels[l] : "?";
        break;
      }
      default: v = "";
    }
    fn(k->name, v, k->live, arg);
  }
  for (size_t i = 0; i < cfg->num_allow; i++) fn("allow", cfg->allow[i], 1, arg);
}

void config_print_reference(FILE *out) {
  fputs(
      "# larderd configuration.  Every key is optional; the values shown are the\n"
      "# defaults.  Sizes take K, M, G, T suffixes.  Keys marked [live] change\n"
      "# on SIGHUP; the others need a restart.  Any key can also be given on the\n"
      "# command line as --key=value.\n\n[larderd]\n",
      out);
  for (size_t i = 0; i < NUM_KEYS; i++) {
    fprintf(out, "\n# %s%s\n%s = %s\n", keys[i].doc, keys[i].live ? " [live]" : "", keys[i].name,
            keys[i].def);
  }
  fputs(
      "\n# The allowlist of remote sources: one `allow` line per URL prefix (the key\n"
      "# may repeat; on the command line, one --allow=... flag per rule), each\n"
      "# optionally limited to owners: uid=N, user=NAME, gid=N, group=NAME\n"
      "# (alternatives), checked against the client's SO_PEERCRED credentials and\n"
      "# supplementary groups.  Stream opens, prefetch, inspect and cat of a URL\n"
      "# outside it fail with \"not allowed: URL is outside the configured sources\".\n"
      "# With no allow line every URL is allowed: anyone who can reach the socket\n"
      "# can then make the daemon fetch with its S3 credentials, so production\n"
      "# configurations should list their sources. [live]\n"
      "# allow = s3://training-data/imagenet/\n"
      "# allow = s3://team-a/ uid=1000 group=trainers\n"
      "# allow = https://datasets.example.com/public/\n",
      out);
}

int config_systemd_credentials(config_t *cfg, char *err, size_t errlen) {
  const char *dir = getenv("CREDENTIALS_DIRECTORY");
  if (dir == NULL || *dir == '\0') return 0;
  static const char *const names[] = {"s3_access_key", "s3_secret_key", "s3_session_token"};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
    char file_key[64], path[4096];
    snprintf(file_key, sizeof(file_key), "%s_file", names[i]);
    const key_info *k = find_key(names[i]), *kf = find_key(file_key);
    if (k == NULL || kf == NULL || *str_field(cfg, k) || *str_field(cfg, kf)) continue;
    snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
    if (access(path, F_OK) != 0) continue;
    int rc = config_set(cfg, file_key, path, err, errlen);
    if (rc) return rc;
  }
  return 0;
}
