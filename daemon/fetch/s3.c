/*
 * s3.c: the S3 protocol: URLs, SigV4 signing, error codes and
 * ListObjectsV2 (see s3.h).  The transfers that carry it are fetch.c's.
 */
#include "fetch/s3.h"

#include <expat.h>
#include <fnmatch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "larder.h"

/* ------------------------------------------------------------------------ */
/* URLs and errors                                                           */

/* s3://bucket/key on the configured endpoint.  The caller has checked the
 * scheme. */
char *s3_http_url(const fetch_options_t *opts, const char *url, const char *query) {
  const char *bucket = url + 5;
  const char *slash = strchr(bucket, '/');
  size_t blen = slash ? (size_t)(slash - bucket) : strlen(bucket);
  const char *key = slash ? slash + 1 : "";
  /* Keys are sent as written: S3 keys of training shards are plain path
   * characters; escape anything else. */
  char *ekey = curl_easy_escape(NULL, key, 0);
  if (ekey == NULL) return NULL;
  /* curl_easy_escape escapes '/', which S3 keys use as a separator. */
  size_t el = strlen(ekey);
  char *k2 = malloc(el + 1);
  if (k2 == NULL) {
    curl_free(ekey);
    return NULL;
  }
  size_t j = 0;
  for (size_t i = 0; i < el; i++) {
    if (ekey[i] == '%' && i + 2 < el && ekey[i + 1] == '2' &&
        (ekey[i + 2] == 'F' || ekey[i + 2] == 'f')) {
      k2[j++] = '/';
      i += 2;
    } else {
      k2[j++] = ekey[i];
    }
  }
  k2[j] = '\0';
  curl_free(ekey);
  const char *ep = opts->s3_endpoint;
  size_t n = strlen(k2) + blen + 256 + (ep ? strlen(ep) : 0) + (query ? strlen(query) : 0);
  char *out = malloc(n);
  if (out) {
    if (ep && opts->s3_path_style) {
      snprintf(out, n, "%s/%.*s/%s%s%s", ep, (int)blen, bucket, k2, query ? "?" : "",
               query ? query : "");
    } else if (ep) {
      /* Virtual-hosted on a custom endpoint: the bucket joins the host. */
      const char *hs = strstr(ep, "://");
      const char *host = hs ? hs + 3 : ep;
      snprintf(out, n, "%.*s%.*s.%s/%s%s%s", (int)(host - ep), ep, (int)blen, bucket, host, k2,
               query ? "?" : "", query ? query : "");
    } else if (opts->s3_path_style) {
      snprintf(out, n, "https://s3.%s.amazonaws.com/%.*s/%s%s%s", opts->s3_region, (int)blen,
               bucket, k2, query ? "?" : "", query ? query : "");
    } else {
      snprintf(out, n, "https://%.*s.s3.%s.amazonaws.com/%s%s%s", (int)blen, bucket,
               opts->s3_region, k2, query ? "?" : "", query ? query : "");
    }
  }
  free(k2);
  return out;
}

void s3_error_code(const uint8_t *body, uint64_t len, char *code, size_t size) {
  code[0] = '\0';
  if (body == NULL || len == 0) return;
  const char *b = (const char *)body;
  size_t n = len < 4096 ? (size_t)len : 4096;
  const char *open = memmem(b, n, "<Code>", 6);
  if (open == NULL) return;
  open += 6;
  const char *close = memmem(open, n - (size_t)(open - b), "</Code>", 7);
  if (close == NULL) return;
  snprintf(code, size, "%.*s", (int)(close - open), open);
}

/* ------------------------------------------------------------------------ */
/* Signing                                                                   */

/* Frees a secret string after overwriting it. */
static void free_secret(char *s) {
  if (s == NULL) return;
  explicit_bzero(s, strlen(s));
  free(s);
}

void s3_signer_init(s3_signer_t *s, const char *region) {
  memset(s, 0, sizeof(*s));
  snprintf(s->aws_sigv4, sizeof(s->aws_sigv4), "aws:amz:%s:s3",
           region && *region ? region : "us-east-1");
}

int s3_signer_set(s3_signer_t *s, const char *access_key, const char *secret_key,
                  const char *session_token) {
  const char *in[3] = {access_key, secret_key, session_token};
  char *cred[3] = {NULL, NULL, NULL}, *userpwd = NULL;
  int ok = 1;
  for (int i = 0; i < 3; i++)
    if (in[i] && (cred[i] = strdup(in[i])) == NULL) ok = 0;
  if (ok && access_key && secret_key) {
    size_t a = strlen(access_key), b = strlen(secret_key);
    if ((userpwd = malloc(a + b + 2)) == NULL) {
      ok = 0;
    } else {
      memcpy(userpwd, access_key, a);
      userpwd[a] = ':';
      memcpy(userpwd + a + 1, secret_key, b + 1);
    }
  }
  if (!ok) {
    for (int i = 0; i < 3; i++) free_secret(cred[i]);
    return LARDER_ENOMEM;
  }
  for (int i = 0; i < 3; i++) {
    free_secret(s->cred[i]);
    s->cred[i] = cred[i];
  }
  free_secret(s->userpwd);
  s->userpwd = userpwd;
  return 0;
}

void s3_signer_free(s3_signer_t *s) {
  for (int i = 0; i < 3; i++) {
    free_secret(s->cred[i]);
    s->cred[i] = NULL;
  }
  free_secret(s->userpwd);
  s->userpwd = NULL;
}

int s3_sign(const s3_signer_t *s, CURL *e, struct curl_slist **headers, const char *url, char *msg,
            size_t msglen) {
  const char *session_token = s->cred[2];
  if (s->cred[0] == NULL || s->cred[1] == NULL) {
    snprintf(msg, msglen,
             "%s: no S3 credentials (set the daemon's s3_access_key, AWS_ACCESS_KEY_ID and "
             "AWS_SECRET_ACCESS_KEY, a web identity, a profile in ~/.aws/credentials, or "
             "run with a container or instance role)",
             url);
    return LARDER_EACCES;
  }
  curl_easy_setopt(e, CURLOPT_AWS_SIGV4, s->aws_sigv4);
  curl_easy_setopt(e, CURLOPT_USERPWD, s->userpwd);
  if (session_token && *session_token) {
    static const char name[] = "x-amz-security-token: ";
    size_t n = strlen(session_token);
    char *tok = malloc(sizeof(name) + n);
    if (tok == NULL) return LARDER_ENOMEM;
    memcpy(tok, name, sizeof(name) - 1);
    memcpy(tok + sizeof(name) - 1, session_token, n + 1);
    struct curl_slist *h = curl_slist_append(*headers, tok);
    explicit_bzero(tok, sizeof(name) + n);
    free(tok);
    if (h == NULL) return LARDER_ENOMEM;
    *headers = h;
  }
  /* S3 wants the payload hash in a header; a GET has an empty body. */
  *headers = curl_slist_append(
      *headers,
      "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  return 0;
}

/* ------------------------------------------------------------------------ */
/* ListObjectsV2                                                             */

struct s3_listing {
  char *bucket;
  char *prefix;
  char *pattern;
  fetch_object_t *objs;
  size_t n, cap;
  char token[1024];
  int pages;
  int empty_pages;     /* truncated pages in a row with no key */
  char last_key[1100]; /* the greatest key listed so far */
};

int s3_listing_create(const char *s3_prefix, const char *pattern, s3_listing_t **out) {
  *out = NULL;
  if (strncmp(s3_prefix, "s3://", 5) != 0) return LARDER_EINVAL;
  s3_listing_t *ls = calloc(1, sizeof(*ls));
  if (ls == NULL) return LARDER_ENOMEM;
  const char *b = s3_prefix + 5;
  const char *slash = strchr(b, '/');
  ls->bucket = slash ? strndup(b, (size_t)(slash - b)) : strdup(b);
  ls->prefix = strdup(slash ? slash + 1 : "");
  ls->pattern = pattern ? strdup(pattern) : NULL;
  if (ls->bucket == NULL || ls->prefix == NULL || (pattern && ls->pattern == NULL)) {
    s3_listing_free(ls);
    return LARDER_ENOMEM;
  }
  *out = ls;
  return 0;
}

void s3_listing_free(s3_listing_t *ls) {
  if (ls == NULL) return;
  for (size_t i = 0; i < ls->n; i++) free(ls->objs[i].url);
  free(ls->objs);
  free(ls->bucket);
  free(ls->prefix);
  free(ls->pattern);
  free(ls);
}

void s3_listing_next_page(s3_listing_t *ls, uint32_t max_keys, char *query, size_t qsize,
                          char *bucket_url, size_t bsize) {
  ls->pages++;
  char *ep = curl_easy_escape(NULL, ls->prefix, 0);
  char *et = ls->token[0] ? curl_easy_escape(NULL, ls->token, 0) : NULL;
  /* Parameters in sorted order: libcurl 7.88 signs the query as written,
   * and S3 verifies it sorted. */
  if (max_keys == 0 || max_keys > 1000) max_keys = 1000;
  snprintf(query, qsize, "%s%s%slist-type=2&max-keys=%u&prefix=%s", et ? "continuation-token=" : "",
           et ? et : "", et ? "&" : "", max_keys, ep ? ep : "");
  curl_free(ep);
  curl_free(et);
  snprintf(bucket_url, bsize, "s3://%s/", ls->bucket);
}

char *s3_listing_name(const s3_listing_t *ls) {
  /* Messages name what is listed (s3://bucket/prefix), not the bucket. */
  size_t ul = strlen(ls->bucket) + strlen(ls->prefix) + 8;
  char *name = malloc(ul);
  if (name) snprintf(name, ul, "s3://%s/%s", ls->bucket, ls->prefix);
  return name;
}

/* One page of a ListObjectsV2 answer, as libexpat parses it (every entity
 * and character reference decoded, any key length). */
typedef struct list_entry {
  char *key;
  uint64_t size;
  char etag[160];
} list_entry_t;

typedef struct list_parse {
  list_entry_t *v;
  size_t n, cap;
  int contents; /* <Contents> elements seen */
  int truncated;
  char token[1024];
  int depth;         /* element depth: 1 is ListBucketResult */
  int in_contents;   /* the depth of the <Contents> we are in, or 0 */
  const char *field; /* the leaf being read: "Key", "Size", ... or NULL */
  char *text;        /* its characters so far */
  size_t len, tcap;
  int oom;
} list_parse_t;

static void XMLCALL lp_start(void *data, const XML_Char *name, const XML_Char **attrs) {
  (void)attrs;
  list_parse_t *lp = data;
  lp->depth++;
  lp->field = NULL;
  lp->len = 0;
  if (lp->depth == 2 && strcmp(name, "Contents") == 0) {
    lp->in_contents = lp->depth;
    lp->contents++;
    if (lp->n == lp->cap) {
      size_t cap = lp->cap ? lp->cap * 2 : 64;
      list_entry_t *v = realloc(lp->v, cap * sizeof(*v));
      if (v == NULL) {
        lp->oom = 1;
        return;
      }
      lp->v = v;
      lp->cap = cap;
    }
    memset(&lp->v[lp->n++], 0, sizeof(list_entry_t));
  } else if (lp->in_contents && lp->depth == lp->in_contents + 1 &&
             (strcmp(name, "Key") == 0 || strcmp(name, "Size") == 0 || strcmp(name, "ETag") == 0)) {
    lp->field = strcmp(name, "Key") == 0 ? "Key" : strcmp(name, "Size") == 0 ? "Size" : "ETag";
  } else if (lp->depth == 2 &&
             (strcmp(name, "IsTruncated") == 0 || strcmp(name, "NextContinuationToken") == 0)) {
    lp->field = name[0] == 'I' ? "IsTruncated" : "NextContinuationToken";
  }
}

static void XMLCALL lp_text(void *data, const XML_Char *s, int n) {
  list_parse_t *lp = data;
  if (lp->field == NULL || n <= 0) return;
  if (lp->len + (size_t)n + 1 > lp->tcap) {
    size_t cap = lp->tcap ? lp->tcap : 256;
    while (cap < lp->len + (size_t)n + 1) cap *= 2;
    char *t = realloc(lp->text, cap);
    if (t == NULL) {
      lp->oom = 1;
      return;
    }
    lp->text = t;
    lp->tcap = cap;
  }
  memcpy(lp->text + lp->len, s, (size_t)n);
  lp->len += (size_t)n;
  lp->text[lp->len] = '\0';
}

static void XMLCALL lp_end(void *data, const XML_Char *name) {
  (void)name;
  list_parse_t *lp = data;
  if (lp->field) {
    const char *t = lp->len ? lp->text : "";
    list_entry_t *e = lp->in_contents && lp->n ? &lp->v[lp->n - 1] : NULL;
    if (strcmp(lp->field, "Key") == 0 && e) {
      free(e->key);
      e->key = strdup(t);
      if (e->key == NULL) lp->oom = 1;
    } else if (strcmp(lp->field, "Size") == 0 && e) {
      e->size = strtoull(t, NULL, 10);
    } else if (strcmp(lp->field, "ETag") == 0 && e) {
      snprintf(e->etag, sizeof(e->etag), "%s", t);
    } else if (strcmp(lp->field, "IsTruncated") == 0) {
      lp->truncated = strcmp(t, "true") == 0;
    } else if (strcmp(lp->field, "NextContinuationToken") == 0) {
      snprintf(lp->token, sizeof(lp->token), "%s", t);
    }
    lp->field = NULL;
  }
  if (lp->in_contents == lp->depth) lp->in_contents = 0;
  lp->depth--;
}

static void list_parse_free(list_parse_t *lp) {
  for (size_t i = 0; i < lp->n; i++) free(lp->v[i].key);
  free(lp->v);
  free(lp->text);
}

/* Parses a ListObjectsV2 page (len bytes at data) into lp.  Returns 0, or
 * LARDER_ECORRUPT (not XML) / LARDER_ENOMEM with a message in err. */
static int list_parse(const char *data, size_t len, list_parse_t *lp, char *err, size_t errlen) {
  memset(lp, 0, sizeof(*lp));
  XML_Parser x = XML_ParserCreate(NULL);
  if (x == NULL) return LARDER_ENOMEM;
  XML_SetUserData(x, lp);
  XML_SetElementHandler(x, lp_start, lp_end);
  XML_SetCharacterDataHandler(x, lp_text);
  int ok = XML_Parse(x, data ? data : "", (int)len, 1) == XML_STATUS_OK;
  if (!ok)
    snprintf(err, errlen, "the listing is not well-formed XML (%s at line %lu)",
             XML_ErrorString(XML_GetErrorCode(x)), (unsigned long)XML_GetCurrentLineNumber(x));
  XML_ParserFree(x);
  if (lp->oom) {
    snprintf(err, errlen, "out of memory reading a listing");
    return LARDER_ENOMEM;
  }
  return ok ? 0 : LARDER_ECORRUPT;
}

static int cmp_obj(const void *a, const void *b) {
  return strcmp(((const fetch_object_t *)a)->url, ((const fetch_object_t *)b)->url);
}

/* Adds the keys of a parsed page that the listing keeps.  Returns 0, or
 * LARDER_EREMOTE with msg set when a key does not come after the last one.
 * A key that finds no memory ends the page's keys (the listing goes on). */
static int take_keys(s3_listing_t *ls, const list_parse_t *lp, const char *where, char *msg,
                     size_t msglen) {
  for (size_t i = 0; i < lp->n; i++) {
    const char *key = lp->v[i].key ? lp->v[i].key : "";
    /* S3 lists keys in ascending order, across pages too: a key that does
     * not come after the last one means the endpoint went back (a repeated
     * continuation token), which would list forever. */
    if (key[0] && ls->last_key[0] && strcmp(key, ls->last_key) <= 0) {
      snprintf(msg, msglen,
               "%s: the listing does not progress (page %d lists key '%.200s' again or out of "
               "order): the endpoint's continuation token is broken",
               where, ls->pages, key);
      return LARDER_EREMOTE;
    }
    if (key[0]) snprintf(ls->last_key, sizeof(ls->last_key), "%s", key);
    if (ls->pattern && fnmatch(ls->pattern, key, FNM_PATHNAME) != 0) continue;
    if (key[0] == '\0' || key[strlen(key) - 1] == '/') continue;
    /* A prefix means its Parquet objects, as a local directory means its
     * *.parquet files: markers such as _SUCCESS, which every Spark or Hive
     * job writes beside its shards, are not part of it.  A glob matches
     * what it says. */
    size_t kl = strlen(key);
    if (ls->pattern == NULL && (kl < 8 || strcmp(key + kl - 8, ".parquet") != 0)) continue;
    if (ls->n == ls->cap) {
      size_t cap = ls->cap ? ls->cap * 2 : 64;
      fetch_object_t *o = realloc(ls->objs, cap * sizeof(*o));
      if (o == NULL) break;
      ls->objs = o;
      ls->cap = cap;
    }
    fetch_object_t *o = &ls->objs[ls->n];
    size_t ul = strlen(ls->bucket) + strlen(key) + 8;
    o->url = malloc(ul);
    if (o->url == NULL) break;
    snprintf(o->url, ul, "s3://%s/%s", ls->bucket, key);
    o->size = lp->v[i].size;
    snprintf(o->etag, sizeof(o->etag), "%.127s", lp->v[i].etag);
    ls->n++;
  }
  return 0;
}

int s3_listing_page(s3_listing_t *ls, const char *data, size_t len, const char *where, char *msg,
                    size_t msglen) {
  list_parse_t lp;
  char perr[300];
  int prc = list_parse(data, len, &lp, perr, sizeof(perr));
  if (prc) {
    snprintf(msg, msglen, "%s: %s", where, perr);
    list_parse_free(&lp);
    return prc;
  }
  int rc = take_keys(ls, &lp, where, msg, msglen);
  if (rc) {
    list_parse_free(&lp);
    return rc;
  }
  char prev_token[sizeof(ls->token)];
  snprintf(prev_token, sizeof(prev_token), "%s", ls->token);
  snprintf(ls->token, sizeof(ls->token), "%s", lp.token);
  int more = lp.truncated && ls->token[0];
  ls->empty_pages = more && lp.contents == 0 ? ls->empty_pages + 1 : 0;
  list_parse_free(&lp);
  /* An endpoint that gives the same continuation token again (or only
   * empty pages) is not followed: it would be followed for 100,000 pages,
   * after the client had gone and after SIGTERM.  Tested by
   * remote_hostile_listing_loop. */
  if (more && (strcmp(prev_token, ls->token) == 0 || ls->empty_pages > 100)) {
    snprintf(msg, msglen,
             "%s: the listing does not progress (page %d %s): the endpoint's continuation token "
             "is broken",
             where, ls->pages,
             ls->empty_pages > 100 ? "follows 100 pages in a row without a key"
                                   : "gives the same continuation token as the page before");
    return LARDER_EREMOTE;
  }
  if (more && ls->pages >= 100000) {
    snprintf(msg, msglen, "s3://%.200s/%.1000s: the listing has more than 100,000 pages",
             ls->bucket, ls->prefix);
    return LARDER_ELIMIT;
  }
  return more ? 1 : 0;
}

fetch_object_t *s3_listing_take(s3_listing_t *ls, size_t *count) {
  /* An empty listing has no array, and qsort must not be given NULL even
   * for no elements.  Tested by remote_s3_errors (under UBSan). */
  if (ls->n > 1) qsort(ls->objs, ls->n, sizeof(*ls->objs), cmp_obj);
  fetch_object_t *objs = ls->objs;
  *count = ls->n;
  ls->objs = NULL;
  ls->n = ls->cap = 0;
  return objs;
}
