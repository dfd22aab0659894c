/*
 * acl.c: the allowlist of URL prefixes, the admin check and local roots.
 */
#include <ctype.h>
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "larder.h"
#include "acl.h"

#define ACL_MAX_OWNERS 32
#define ACL_URL_MAX 4096

typedef struct acl_rule {
  char *prefix; /* canonical form */
  size_t len;
  int host_only; /* the prefix ends at the authority: match at a boundary */
  uid_t uids[ACL_MAX_OWNERS];
  int num_uids;
  gid_t gids[ACL_MAX_OWNERS];
  int num_gids;
} acl_rule_t;

struct acl {
  acl_rule_t *rules;
  size_t num_rules;
  int has_admin_group;
  gid_t admin_gid;
};

/* ------------------------------------------------------------------------ */
/* URLs                                                                      */

/* Whether a path segment [s, s + n) is "." or ".." once percent-decoded. */
static int dot_segment(const char *s, size_t n) {
  int dots = 0;
  for (size_t i = 0; i < n;) {
    if (s[i] == '.') {
      dots++;
      i++;
    } else if (s[i] == '%' && n - i >= 3 && s[i + 1] == '2' &&
               (s[i + 2] == 'e' || s[i + 2] == 'E')) {
      dots++;
      i += 3;
    } else {
      return 0;
    }
  }
  return dots == 1 || dots == 2;
}

/*
 * Writes the canonical form of url into out: scheme lower-cased, the
 * authority of http(s) URLs lower-cased (S3 bucket names are kept as they
 * are).  Refuses what a prefix comparison cannot judge: control characters
 * and spaces, backslashes and '%' in the authority, and "." or ".." path
 * segments (curl squashes them, which would leave the prefix).  *auth_end
 * is the length of "scheme://authority" in out.
 */
static int canon_url(const char *url, char *out, size_t outlen, size_t *auth_end, char *why,
                     size_t whylen) {
  size_t n = strlen(url);
  if (n + 1 > outlen) {
    snprintf(why, whylen, "URL too long");
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)url[i];
    if (ch <= 0x20 || ch == 0x7f) {
      snprintf(why, whylen, "URL has spaces or control characters");
      return -1;
    }
  }
  const char *sep = strstr(url, "://");
  if (sep == NULL || sep == url) {
    snprintf(why, whylen, "not a URL (scheme://...)");
    return -1;
  }
  size_t slen = (size_t)(sep - url);
  for (size_t i = 0; i < slen; i++) {
    if (!isalnum((unsigned char)url[i]) && url[i] != '+' && url[i] != '-' && url[i] != '.') {
      snprintf(why, whylen, "bad URL scheme");
      return -1;
    }
    out[i] = (char)tolower((unsigned char)url[i]);
  }
  /* out is terminated below, when the rest of the URL is copied with its
   * NUL. */
  /* NOLINTNEXTLINE(bugprone-not-null-terminated-result) */
  memcpy(out + slen, "://", 3);
  int is_s3 = slen == 2 && strncasecmp(url, "s3", 2) == 0;
  const char *a = sep + 3;
  size_t alen = strcspn(a, "/?#");
  for (size_t i = 0; i < alen; i++) {
    if (a[i] == '\\' || a[i] == '%') {
      snprintf(why, whylen, "URL has '%c' in its host", a[i]);
      return -1;
    }
    out[slen + 3 + i] = is_s3 ? a[i] : (char)tolower((unsigned char)a[i]);
  }
  *auth_end = slen + 3 + alen;
  const char *p = a + alen;
  memcpy(out + *auth_end, p, strlen(p) + 1);
  /* Path segments, up to the query or fragment. */
  size_t plen = strcspn(p, "?#");
  /* An encoded slash or backslash is no segment boundary here, but HTTP
   * servers decode it before they resolve dot segments, so ".." + "%2f"
   * would climb out of an allowed prefix: both are refused.  A NUL ends a
   * path on some servers.  (S3 keys are opaque: no server resolves them,
   * and they are escaped again when sent.)  Tested by acl_rules. */
  for (size_t i = 0; i + 2 < plen && !is_s3; i++) {
    if (p[i] != '%') continue;
    char x = p[i + 1], y = (char)tolower((unsigned char)p[i + 2]);
    if ((x == '2' && y == 'f') || (x == '5' && y == 'c') || (x == '0' && y == '0')) {
      snprintf(why, whylen, "URL has an encoded slash, backslash or NUL in its path");
      return -1;
    }
  }
  for (size_t i = 0; i < plen;) {
    if (p[i] == '\\') {
      snprintf(why, whylen, "URL has a backslash in its path");
      return -1;
    }
    if (p[i] != '/') {
      i++;
      continue;
    }
    size_t s = i + 1, e = s;
    while (e < plen && p[e] != '/' && p[e] != '\\') e++;
    if (e > s && dot_segment(p + s, e - s)) {
      snprintf(why, whylen, "URL has a \".\" or \"..\" path segment");
      return -1;
    }
    i = e;
  }
  return 0;
}

/* ------------------------------------------------------------------------ */
/* Rules                                                                     */

static int parse_id(const char *s, unsigned long *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || end == s || *end || v > 0xfffffffeul) return -1;
  *out = v;
  return 0;
}

/* Resolves a group given by name or number; 0 or -1. */
static int resolve_group(const char *s, gid_t *out) {
  unsigned long v;
  if (parse_id(s, &v) == 0) {
    *out = (gid_t)v;
    return 0;
  }
  struct group gr, *res = NULL;
  char buf[16384];
  if (getgrnam_r(s, &gr, buf, sizeof(buf), &res) != 0 || res == NULL) return -1;
  *out = res->gr_gid;
  return 0;
}

static int resolve_user(const char *s, uid_t *out) {
  unsigned long v;
  if (parse_id(s, &v) == 0) {
    *out = (uid_t)v;
    return 0;
  }
  struct passwd pw, *res = NULL;
  char buf[16384];
  if (getpwnam_r(s, &pw, buf, sizeof(buf), &res) != 0 || res == NULL) return -1;
  *out = res->pw_uid;
  return 0;
}

static int parse_rule(const char *line, acl_rule_t *r, char *err, size_t errlen) {
  memset(r, 0, sizeof(*r));
  char *copy = strdup(line);
  if (copy == NULL) {
    snprintf(err, errlen, "out of memory");
    return LARDER_ENOMEM;
  }
  int rc = 0;
  char *save = NULL;
  char *tok = strtok_r(copy, " \t", &save);
  if (tok == NULL) {
    snprintf(err, errlen, "allow: empty rule (expected: allow = PREFIX [uid=N] [gid=N])");
    free(copy);
    return LARDER_EINVAL;
  }
  char canon[ACL_URL_MAX], why[128];
  size_t auth_end = 0;
  if (canon_url(tok, canon, sizeof(canon), &auth_end, why, sizeof(why)) != 0) {
    snprintf(err, errlen,
             "allow: '%s' is not a URL prefix (%s); local paths are confined with local_roots", tok,
             why);
    free(copy);
    return LARDER_EINVAL;
  }
  if (strncmp(canon, "s3://", 5) != 0 && strncmp(canon, "http://", 7) != 0 &&
      strncmp(canon, "https://", 8) != 0) {
    snprintf(err, errlen, "allow: '%s': only http://, https:// and s3:// prefixes", tok);
    free(copy);
    return LARDER_EINVAL;
  }
  if (canon[auth_end - 1] == '/' && canon[auth_end] == '\0') {
    snprintf(err, errlen, "allow: '%s' names no host or bucket", tok);
    free(copy);
    return LARDER_EINVAL;
  }
  r->prefix = strdup(canon);
  if (r->prefix == NULL) {
    free(copy);
    snprintf(err, errlen, "out of memory");
    return LARDER_ENOMEM;
  }
  r->len = strlen(canon);
  r->host_only = canon[auth_end] == '\0';
  while (rc == 0 && (tok = strtok_r(NULL, " \t", &save)) != NULL) {
    char *eq = strchr(tok, '=');
    if (eq == NULL) {
      snprintf(err, errlen, "allow: '%s' is not uid=, user=, gid= or group=", tok);
      rc = LARDER_EINVAL;
      break;
    }
    *eq = '\0';
    const char *k = tok, *v = eq + 1;
    if (strcmp(k, "uid") == 0 || strcmp(k, "user") == 0) {
      uid_t u;
      if (r->num_uids == ACL_MAX_OWNERS || resolve_user(v, &u) != 0) {
        snprintf(err, errlen, "allow: unknown user '%s'", v);
        rc = LARDER_EINVAL;
        break;
      }
      r->uids[r->num_uids++] = u;
    } else if (strcmp(k, "gid") == 0 || strcmp(k, "group") == 0) {
      gid_t g;
      if (r->num_gids == ACL_MAX_OWNERS || resolve_group(v, &g) != 0) {
        snprintf(err, errlen, "allow: unknown group '%s'", v);
        rc = LARDER_EINVAL;
        break;
      }
      r->gids[r->num_gids++] = g;
    } else {
      snprintf(err, errlen, "allow: '%s=' is not uid=, user=, gid= or group=", k);
      rc = LARDER_EINVAL;
      break;
    }
  }
  free(copy);
  if (rc) {
    free(r->prefix);
    r->prefix = NULL;
  }
  return rc;
}

int acl_rule_check(const char *line, char *err, size_t errlen) {
  acl_rule_t r;
  int rc = parse_rule(line, &r, err, errlen);
  if (rc == 0) free(r.prefix);
  return rc;
}

int acl_create(const char *const *allow, size_t n, const char *admin_group, acl_t **out, char *err,
               size_t errlen) {
  *out = NULL;
  acl_t *a = calloc(1, sizeof(*a));
  if (a == NULL || (n && (a->rules = calloc(n, sizeof(acl_rule_t))) == NULL)) {
    free(a);
    snprintf(err, errlen, "out of memory");
    return LARDER_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) {
    int rc = parse_rule(allow[i], &a->rules[i], err, errlen);
    if (rc) {
      acl_free(a);
      return rc;
    }
    a->num_rules++;
  }
  if (admin_group && *admin_group) {
    if (resolve_group(admin_group, &a->admin_gid) != 0) {
      snprintf(err, errlen, "admin_group: unknown group '%s'", admin_group);
      acl_free(a);
      return LARDER_EINVAL;
    }
    a->has_admin_group = 1;
  }
  *out = a;
  return 0;
}

void acl_free(acl_t *a) {
  if (a == NULL) return;
  for (size_t i = 0; i < a->num_rules; i++) free(a->rules[i].prefix);
  free(a->rules);
  free(a);
}

size_t acl_num_rules(const acl_t *a) { return a ? a->num_rules : 0; }

static int in_group(const acl_peer_t *p, gid_t g) {
  if (p->gid == g) return 1;
  for (int i = 0; i < p->num_groups; i++)
    if (p->groups[i] == g) return 1;
  return 0;
}

static int owner_matches(const acl_rule_t *r, const acl_peer_t *p) {
  if (r->num_uids == 0 && r->num_gids == 0) return 1;
  for (int i = 0; i < r->num_uids; i++)
    if (r->uids[i] == p->uid) return 1;
  for (int i = 0; i < r->num_gids; i++)
    if (in_group(p, r->gids[i])) return 1;
  return 0;
}

int acl_check_url(const acl_t *a, const acl_peer_t *peer, const char *url, char *err,
                  size_t errlen) {
  if (a == NULL || a->num_rules == 0) return 0;
  char canon[ACL_URL_MAX], why[128];
  size_t auth_end;
  if (canon_url(url, canon, sizeof(canon), &auth_end, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "not allowed: %.2000s: %s", url, why);
    return LARDER_EACCES;
  }
  for (size_t i = 0; i < a->num_rules; i++) {
    const acl_rule_t *r = &a->rules[i];
    if (strncmp(canon, r->prefix, r->len) != 0) continue;
    if (r->host_only) {
      char next = canon[r->len];
      if (next != '\0' && next != '/' && next != '?' && next != '#') continue;
    }
    if (owner_matches(r, peer)) return 0;
  }
  snprintf(err, errlen, "not allowed: %.2000s is outside the configured sources", url);
  return LARDER_EACCES;
}

int acl_is_admin(const acl_t *a, const acl_peer_t *peer) {
  if (peer->uid == 0 || peer->uid == geteuid()) return 1;
  return a && a->has_admin_group && in_group(peer, a->admin_gid);
}

char **acl_split_roots(const char *spec, int *oom) {
  *oom = 0;
  if (spec == NULL) return NULL;
  size_t count = 0, len = strlen(spec);
  int in = 0;
  for (size_t i = 0; i < len; i++) {
    int sep = spec[i] == ':' || spec[i] == ',' || spec[i] == ' ' || spec[i] == '\t';
    if (!sep && !in) count++;
    in = !sep;
  }
  if (count == 0) return NULL;
  char **v = malloc((count + 1) * sizeof(char *) + len + 1);
  if (v == NULL) {
    *oom = 1;
    return NULL;
  }
  char *copy = (char *)(v + count + 1);
  memcpy(copy, spec, len + 1);
  size_t k = 0;
  char *save = NULL;
  for (char *t = strtok_r(copy, ":, \t", &save); t; t = strtok_r(NULL, ":, \t", &save)) v[k++] = t;
  v[k] = NULL;
  return v;
}

int acl_peer_copy(acl_peer_t *dst, const acl_peer_t *src) {
  *dst = *src;
  dst->groups = NULL;
  dst->num_groups = 0;
  if (src->groups == NULL || src->num_groups <= 0) return 0;
  gid_t *g = malloc((size_t)src->num_groups * sizeof(gid_t));
  if (g == NULL) return LARDER_ENOMEM;
  memcpy(g, src->groups, (size_t)src->num_groups * sizeof(gid_t));
  dst->groups = g;
  dst->num_groups = src->num_groups;
  return 0;
}

void acl_peer_clear(acl_peer_t *p) {
  free((void *)p->groups);
  p->groups = NULL;
  p->num_groups = 0;
}
