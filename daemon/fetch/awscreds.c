/*
 * awscreds.c: the AWS credential chain and its refresher (awscreds.h).
 */
#include "fetch/awscreds.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <expat.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "larder.h"
#include "log.h"

/* A credential answer (JSON, XML) is a few KiB; anything past this is not
 * one, and is refused rather than buffered. */
#define BODY_MAX ((size_t)64 << 10)

/* What one walk of the chain shares: the options, and the flag that
 * aborts it (the refresher stopping). */
typedef struct walk {
  const awscreds_options_t *o;
  const volatile int *stop;
  char *err;
  size_t errlen;
} walk_t;

/* The refresher sets the flag under its lock; a walk reads it without one,
 * atomically, between steps and from libcurl's progress callback. */
static int stopped(const volatile int *stop) {
  return stop && __atomic_load_n(stop, __ATOMIC_RELAXED);
}

static void free_secret(char *s) {
  if (s == NULL) return;
  explicit_bzero(s, strlen(s));
  free(s);
}

void awscreds_value_clear(awscreds_value_t *v) {
  free_secret(v->access_key);
  free_secret(v->secret_key);
  free_secret(v->session_token);
  v->access_key = v->secret_key = v->session_token = NULL;
  v->expiration = 0;
  v->source[0] = '\0';
}

static const char *env(const char *name) {
  const char *s = getenv(name);
  return s && *s ? s : NULL;
}

static char *dup_trim_n(const char *s, size_t n) {
  while (n && isspace((unsigned char)*s)) {
    s++;
    n--;
  }
  while (n && isspace((unsigned char)s[n - 1])) n--;
  char *d = malloc(n + 1);
  if (d) {
    memcpy(d, s, n);
    d[n] = '\0';
  }
  return d;
}

/* Takes the three strings into v (NULL or "" token: none); 0 or ENOMEM. */
static int set_value(awscreds_value_t *v, const char *source, const char *ak, const char *sk,
                     const char *tok, int64_t expiration) {
  awscreds_value_clear(v);
  v->access_key = strdup(ak);
  v->secret_key = strdup(sk);
  if (tok && *tok) v->session_token = strdup(tok);
  if (v->access_key == NULL || v->secret_key == NULL || (tok && *tok && !v->session_token)) {
    awscreds_value_clear(v);
    return LARDER_ENOMEM;
  }
  v->expiration = expiration;
  snprintf(v->source, sizeof(v->source), "%s", source);
  return 0;
}

int64_t awscreds_parse_time(const char *s) {
  if (s == NULL) return 0;
  struct tm tm;
  memset(&tm, 0, sizeof(tm));
  int n = 0;
  if (sscanf(s, "%4d-%2d-%2dT%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
             &tm.tm_min, &tm.tm_sec, &n) != 6)
    return 0;
  const char *p = s + n;
  if (*p == '.')
    for (p++; isdigit((unsigned char)*p); p++) {}
  int64_t offset = 0;
  if (*p == '+' || *p == '-') {
    int hh = 0, mm = 0, m = 0;
    if (sscanf(p + 1, "%2d:%2d%n", &hh, &mm, &m) != 2 || p[1 + m] != '\0') return 0;
    offset = (*p == '+' ? 1 : -1) * (int64_t)(hh * 3600 + mm * 60);
  } else if (!((*p == 'Z' || *p == 'z') && p[1] == '\0') && *p != '\0') {
    return 0;
  }
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  time_t t = timegm(&tm);
  if (t == (time_t)-1) return 0;
  return (int64_t)t - offset;
}

/* The whole file at path, spaces around it dropped, or NULL. */
static char *read_trimmed(const char *path, size_t max) {
  FILE *f = fopen(path, "r");
  if (f == NULL) return NULL;
  char *buf = malloc(max + 1);
  size_t n = buf ? fread(buf, 1, max + 1, f) : 0;
  fclose(f);
  if (buf == NULL || n > max) {
    if (buf) explicit_bzero(buf, max + 1);
    free(buf);
    return NULL;
  }
  char *s = dup_trim_n(buf, n);
  explicit_bzero(buf, max + 1);
  free(buf);
  return s;
}

/* ------------------------------------------------------------------------ */
/* A tiny JSON reader: the top-level object's string and number members    */

typedef struct jfield {
  const char *name;
  char *value; /* malloc'd (a number as its text), NULL when absent */
} jfield_t;

static const char *json_ws(const char *p) {
  while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
  return p;
}

/* Reads a JSON string at p ('"'); returns the end or NULL.  out (may be
 * NULL: skip) gets the decoded text (\u escapes beyond ASCII as '?'). */
static const char *json_string(const char *p, char **out) {
  if (*p != '"') return NULL;
  size_t cap = 0, n = 0;
  char *s = NULL;
  for (p++;; p++) {
    char c = *p;
    if (c == '\0') break;
    if (c == '"') {
      if (out) {
        if (s == NULL && (s = malloc(1)) == NULL) return NULL;
        s[n] = '\0';
        *out = s;
      }
      return p + 1;
    }
    if (c == '\\') {
      c = *++p;
      switch (c) {
        case 'n': c = '\n'; break;
        case 't': c = '\t'; break;
        case 'r': c = '\r'; break;
        case 'b': c = '\b'; break;
        case 'f': c = '\f'; break;
        case 'u': {
          unsigned v = 0;
          for (int i = 1; i <= 4; i++) {
            char h = p[i];
            if (!isxdigit((unsigned char)h)) goto bad;
            v = v * 16 + (unsigned)(isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
          }
          p += 4;
          c = v < 0x80 ? (char)v : '?';
          break;
        }
        case '"':
        case '\\':
        case '/': break;
        default: goto bad;
      }
    }
    if (out) {
      if (n + 2 > cap) {
        size_t nc = cap ? cap * 2 : 64;
        char *t = malloc(nc);
        if (t == NULL) goto bad;
        if (s) {
          memcpy(t, s, n);
          explicit_bzero(s, cap);
          free(s);
        }
        s = t;
        cap = nc;
      }
      s[n++] = c;
    }
  }
bad:
  if (s) explicit_bzero(s, cap);
  free(s);
  return NULL;
}

/* Skips any JSON value at p; returns its end or NULL. */
static const char *json_skip(const char *p, int depth) {
  p = json_ws(p);
  if (depth > 32) return NULL;
  if (*p == '"') return json_string(p, NULL);
  if (*p == '{' || *p == '[') {
    char close = *p == '{' ? '}' : ']';
    p = json_ws(p + 1);
    if (*p == close) return p + 1;
    for (;;) {
      if (close == '}') {
        p = json_string(json_ws(p), NULL);
        if (p == NULL || *(p = json_ws(p)) != ':') return NULL;
        p++;
      }
      p = json_skip(p, depth + 1);
      if (p == NULL) return NULL;
      p = json_ws(p);
      if (*p == ',') {
        p++;
        continue;
      }
      return *p == close ? p + 1 : NULL;
    }
  }
  const char *s = p;
  while (*p && (isalnum((unsigned char)*p) || *p == '-' || *p == '+' || *p == '.')) p++;
  return p > s ? p : NULL;
}

/* Fills the fields found among text's top-level members.  0, or
 * LARDER_ECORRUPT when text is not one JSON object. */
static int json_fields(const char *text, jfield_t *f, size_t nf) {
  const char *p = json_ws(text);
  if (*p++ != '{') return LARDER_ECORRUPT;
  p = json_ws(p);
  if (*p == '}') return 0;
  for (;;) {
    char *name = NULL;
    p = json_string(json_ws(p), &name);
    if (p == NULL) return LARDER_ECORRUPT;
    p = json_ws(p);
    if (*p++ != ':') {
      free(name);
      return LARDER_ECORRUPT;
    }
    p = json_ws(p);
    jfield_t *hit = NULL;
    for (size_t i = 0; i < nf; i++)
      if (strcmp(f[i].name, name) == 0 && f[i].value == NULL) hit = &f[i];
    free(name);
    if (hit && *p == '"') {
      p = json_string(p, &hit->value);
    } else {
      const char *s = p;
      p = json_skip(p, 0);
      if (p && hit && *s != '{' && *s != '[') hit->value = dup_trim_n(s, (size_t)(p - s));
    }
    if (p == NULL) return LARDER_ECORRUPT;
    p = json_ws(p);
    if (*p == ',') {
      p++;
      continue;
    }
    return *p == '}' ? 0 : LARDER_ECORRUPT;
  }
}

static void jfields_free(jfield_t *f, size_t nf) {
  for (size_t i = 0; i < nf; i++) {
    free_secret(f[i].value);
    f[i].value = NULL;
  }
}

/* Credentials from a JSON document (credential_process, the container and
 * IMDS endpoints): token_name is "SessionToken" or "Token". */
static int value_from_json(const char *json, const char *source, const char *token_name,
                           awscreds_value_t *out, char *err, size_t errlen) {
  jfield_t f[] = {{"AccessKeyId", NULL}, {"SecretAccessKey", NULL}, {token_name, NULL},
                  {"Expiration", NULL},  {"Version", NULL},         {"Code", NULL}};
  size_t nf = sizeof(f) / sizeof(f[0]);
  int rc = json_fields(json, f, nf);
  if (rc != 0) {
    snprintf(err, errlen, "%s: the answer is not a JSON object", source);
  } else if (strcmp(source, "process") == 0 &&
             (f[4].value == NULL || strcmp(f[4].value, "1") != 0)) {
    snprintf(err, errlen, "process: the credential_process output is not Version 1");
    rc = LARDER_ECORRUPT;
  } else if (f[5].value && strcmp(f[5].value, "Success") != 0) {
    snprintf(err, errlen, "%s: the endpoint answered Code %.64s", source, f[5].value);
    rc = LARDER_EREMOTE;
  } else if (f[0].value == NULL || f[1].value == NULL || !*f[0].value || !*f[1].value) {
    snprintf(err, errlen, "%s: the answer lacks AccessKeyId or SecretAccessKey", source);
    rc = LARDER_ECORRUPT;
  } else {
    int64_t exp = 0;
    if (f[3].value && (exp = awscreds_parse_time(f[3].value)) == 0) {
      snprintf(err, errlen, "%s: unreadable Expiration", source);
      rc = LARDER_ECORRUPT;
    } else {
      rc = set_value(out, source, f[0].value, f[1].value, f[2].value, exp);
      if (rc) snprintf(err, errlen, "%s: out of memory", source);
    }
  }
  jfields_free(f, nf);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* HTTP: one blocking libcurl request with a timeout                        */

typedef struct body {
  char *data;
  size_t len, cap;
  int over;
  int connected; /* the connection was made (a timeout came after) */
} body_t;

static size_t on_body(char *p, size_t size, size_t n, void *arg) {
  body_t *b = arg;
  size_t len = size * n;
  if (b->len + len > BODY_MAX) {
    b->over = 1;
    return 0;
  }
  if (b->len + len + 1 > b->cap) {
    size_t nc = b->cap ? b->cap : 4096;
    while (nc < b->len + len + 1) nc *= 2;
    char *t = malloc(nc);
    if (t == NULL) return 0;
    if (b->data) {
      memcpy(t, b->data, b->len);
      explicit_bzero(b->data, b->cap);
      free(b->data);
    }
    b->data = t;
    b->cap = nc;
  }
  memcpy(b->data + b->len, p, len);
  b->len += len;
  b->data[b->len] = '\0';
  return len;
}

static void body_free(body_t *b) {
  if (b->data) explicit_bzero(b->data, b->cap);
  free(b->data);
  memset(b, 0, sizeof(*b));
}

static int on_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
  (void)a;
  (void)b;
  (void)c;
  (void)d;
  return stopped(arg) ? 1 : 0;
}

/* The URL without its query, for messages. */
static void redact(const char *url, char *buf, size_t size) {
  size_t n = strcspn(url, "?#");
  snprintf(buf, size, "%.*s", (int)(n > 200 ? 200 : n), url);
}

/*
 * method url with headers (may be NULL) and body (NULL: none).  Returns
 * the HTTP status (the body in *b, NUL-terminated when not empty), or a
 * negative code with err filled.  connect_s bounds the connection, total_s
 * the whole exchange.
 */
/* One request of a credential source; with sign, SigV4-signed for STS in
 * region with those keys (the caller adds the session token's header).
 * Returns the HTTP status, or a negative code with w->err filled. */
static int http(const walk_t *w, const char *source, const char *method, const char *url,
                struct curl_slist *headers, const char *body, const awscreds_value_t *sign,
                const char *region, long connect_s, long total_s, body_t *b) {
  memset(b, 0, sizeof(*b));
  CURL *e = curl_easy_init();
  if (e == NULL) {
    snprintf(w->err, w->errlen, "%s: cannot start libcurl", source);
    return LARDER_ENOMEM;
  }
  curl_easy_setopt(e, CURLOPT_URL, url);
  if (sign) {
    char sigv4[128];
    snprintf(sigv4, sizeof(sigv4), "aws:amz:%s:sts", region && *region ? region : "us-east-1");
    curl_easy_setopt(e, CURLOPT_AWS_SIGV4, sigv4);
    curl_easy_setopt(e, CURLOPT_USERNAME, sign->access_key);
    curl_easy_setopt(e, CURLOPT_PASSWORD, sign->secret_key);
  }
  curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
  if (body) curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
  if (headers) curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT, connect_s);
  curl_easy_setopt(e, CURLOPT_TIMEOUT, total_s);
  curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(e, CURLOPT_WRITEDATA, b);
  curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
  curl_easy_setopt(e, CURLOPT_XFERINFODATA, (void *)w->stop);
  curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(e, CURLOPT_FOLLOWLOCATION, 0L);
  CURLcode cc = curl_easy_perform(e);
  long status = 0;
  curl_off_t connect_us = 0;
  curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_getinfo(e, CURLINFO_CONNECT_TIME_T, &connect_us);
  curl_easy_cleanup(e);
  char where[256];
  redact(url, where, sizeof(where));
  if (cc != CURLE_OK) {
    snprintf(w->err, w->errlen, "%s: %s %s: %s", source, method, where,
             b->over ? "answer too long" : curl_easy_strerror(cc));
    body_free(b);
    b->connected = connect_us > 0;
    return cc == CURLE_OPERATION_TIMEDOUT ? LARDER_ETIMEDOUT : LARDER_EREMOTE;
  }
  b->connected = 1;
  if (b->data == NULL && (b->data = calloc(1, 1)) != NULL) b->cap = 1;
  if (b->data == NULL) {
    snprintf(w->err, w->errlen, "%s: out of memory", source);
    return LARDER_ENOMEM;
  }
  return (int)status;
}

static int timeout_s(const walk_t *w) { return w->o->timeout_s ? (int)w->o->timeout_s : 10; }

/* ------------------------------------------------------------------------ */
/* web_identity: STS AssumeRoleWithWebIdentity                              */

typedef struct sts_parse {
  char path[4][32]; /* the innermost elements, by depth (capped) */
  int depth;
  int field;     /* which of text[] the current element fills, or -1 */
  char *text[6]; /* AccessKeyId, SecretAccessKey, SessionToken,
                       Expiration, Code, Message */
  size_t len[6];
  int over;
} sts_parse_t;

static const char *const sts_names[6] = {
    "AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration", "Code", "Message"};

static void XMLCALL sts_start(void *arg, const XML_Char *name, const XML_Char **attrs) {
  (void)attrs;
  sts_parse_t *p = arg;
  const char *local = strrchr(name, ':'); /* a namespace separator, if any */
  local = local ? local + 1 : name;
  const char *parent = p->depth > 0 && p->depth <= 4 ? p->path[p->depth - 1] : "";
  if (p->depth < 4) snprintf(p->path[p->depth], sizeof(p->path[0]), "%s", local);
  p->depth++;
  p->field = -1;
  for (int i = 0; i < 6; i++) {
    if (strcmp(local, sts_names[i]) != 0) continue;
    if (i < 4 && strcmp(parent, "Credentials") != 0) continue;
    if (i >= 4 && strcmp(parent, "Error") != 0) continue;
    p->field = i;
  }
}

static void XMLCALL sts_end(void *arg, const XML_Char *name) {
  (void)name;
  sts_parse_t *p = arg;
  p->depth--;
  p->field = -1;
}

static void XMLCALL sts_text(void *arg, const XML_Char *s, int len) {
  sts_parse_t *p = arg;
  if (p->field < 0 || len <= 0) return;
  size_t old = p->len[p->field], n = old + (size_t)len;
  if (n > 16384) {
    p->over = 1;
    return;
  }
  char *t = malloc(n + 1);
  if (t == NULL) {
    p->over = 1;
    return;
  }
  if (old) memcpy(t, p->text[p->field], old);
  memcpy(t + old, s, (size_t)len);
  t[n] = '\0';
  free_secret(p->text[p->field]);
  p->text[p->field] = t;
  p->len[p->field] = n;
}

/* Percent-encodes s for a form body (RFC 3986 unreserved kept). */
static char *form_encode(const char *s) {
  size_t n = strlen(s);
  char *o = malloc(n * 3 + 1), *q = o;
  if (o == NULL) return NULL;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (isalnum(*p) || *p == '-' || *p == '_' || *p == '.' || *p == '~') {
      *q++ = (char)*p;
    } else {
      static const char hex[] = "0123456789ABCDEF";
      *q++ = '%';
      *q++ = hex[*p >> 4];
      *q++ = hex[*p & 15];
    }
  }
  *q = '\0';
  return o;
}

/* The region STS requests are signed for, and the default endpoint's. */
static const char *sts_region(const walk_t *w) {
  return w->o->region && *w->o->region ? w->o->region : "us-east-1";
}

/*
 * POSTs the form body (Action=...) to STS (the sts_endpoint option,
 * $AWS_ENDPOINT_URL_STS, else the region's endpoint), signed with sign's
 * keys when sign is not NULL (AssumeRole; AssumeRoleWithWebIdentity is
 * not signed), and sets *out from the Credentials of the answer, as
 * source.  Returns 0, or a negative code with w->err naming source, the
 * endpoint and STS's error code and message.
 */
static int sts_call(const walk_t *w, const char *source, const char *body,
                    const awscreds_value_t *sign, awscreds_value_t *out) {
  const char *endpoint =
      w->o->sts_endpoint && *w->o->sts_endpoint ? w->o->sts_endpoint : env("AWS_ENDPOINT_URL_STS");
  char url[512];
  if (endpoint) snprintf(url, sizeof(url), "%s", endpoint);
  else snprintf(url, sizeof(url), "https://sts.%s.amazonaws.com/", sts_region(w));
  /* The headers; a signed request's session token goes in one too. */
  char *tokh = NULL;
  if (sign && sign->session_token && *sign->session_token) {
    size_t n = strlen(sign->session_token) + 32;
    if ((tokh = malloc(n)) != NULL)
      snprintf(tokh, n, "X-Amz-Security-Token: %s", sign->session_token);
  }
  const char *lines[3] = {"Content-Type: application/x-www-form-urlencoded",
                          "Accept: application/xml", tokh};
  int nlines = tokh ? 3 : 2;
  struct curl_slist *hl = NULL;
  int ok = !(sign && sign->session_token && *sign->session_token && tokh == NULL);
  for (int i = 0; ok && i < nlines; i++) {
    struct curl_slist *n = curl_slist_append(hl, lines[i]);
    if (n == NULL) ok = 0;
    else hl = n;
  }
  body_t b;
  memset(&b, 0, sizeof(b));
  int status = LARDER_ENOMEM;
  if (ok) status = http(w, source, "POST", url, hl, body, sign, sts_region(w), 5, timeout_s(w), &b);
  else snprintf(w->err, w->errlen, "%s: out of memory", source);
  /* The token's header line: wiped before it is freed. */
  for (struct curl_slist *l = hl; l; l = l->next)
    if (tokh && l->data && strncmp(l->data, "X-Amz-Security-Token:", 21) == 0)
      explicit_bzero(l->data, strlen(l->data));
  curl_slist_free_all(hl);
  free_secret(tokh);
  if (status < 0) {
    body_free(&b); /* http() left nothing; said for the analyzer */
    return status;
  }
  sts_parse_t p;
  memset(&p, 0, sizeof(p));
  p.field = -1;
  XML_Parser xp = XML_ParserCreate(NULL);
  int parsed = 0;
  if (xp) {
    XML_SetUserData(xp, &p);
    XML_SetElementHandler(xp, sts_start, sts_end);
    XML_SetCharacterDataHandler(xp, sts_text);
    parsed = XML_Parse(xp, b.data, (int)b.len, 1) == XML_STATUS_OK && !p.over;
    XML_ParserFree(xp);
  }
  body_free(&b);
  char where[256];
  redact(url, where, sizeof(where));
  int rc;
  if (status != 200) {
    snprintf(w->err, w->errlen, "%s: STS %s answered HTTP %d%s%.64s%s%.200s", source, where, status,
             parsed && p.text[4] ? " " : "", parsed && p.text[4] ? p.text[4] : "",
             parsed && p.text[5] ? ": " : "", parsed && p.text[5] ? p.text[5] : "");
    rc = status == 429 || status >= 500 ? LARDER_EREMOTE : LARDER_EACCES;
  } else if (!parsed || p.text[0] == NULL || p.text[1] == NULL || p.text[2] == NULL) {
    snprintf(w->err, w->errlen, "%s: STS %s: the answer holds no credentials", source, where);
    rc = LARDER_ECORRUPT;
  } else {
    int64_t exp = p.text[3] ? awscreds_parse_time(p.text[3]) : 0;
    rc = set_value(out, source, p.text[0], p.text[1], p.text[2], exp);
    if (rc) snprintf(w->err, w->errlen, "%s: out of memory", source);
  }
  for (int i = 0; i < 6; i++) free_secret(p.text[i]);
  return rc;
}

/* The session name of an assumed role: name (from the environment or the
 * profile) when set, else larderd-<pid>. */
static void session_name(const char *name, char *buf, size_t size) {
  if (name && *name) snprintf(buf, size, "%s", name);
  else snprintf(buf, size, "larderd-%ld", (long)getpid());
}

/* AssumeRoleWithWebIdentity with the token in token_file for role. */
static int web_identity_with(const walk_t *w, const char *source, const char *token_file,
                             const char *role, const char *session_opt, awscreds_value_t *out) {
  char *token = read_trimmed(token_file, 16384);
  if (token == NULL || *token == '\0') {
    free_secret(token);
    snprintf(w->err, w->errlen, "%s: cannot read the token file %.200s", source, token_file);
    return LARDER_EIO;
  }
  char session[64];
  session_name(session_opt, session, sizeof(session));
  char *etok = form_encode(token), *erole = form_encode(role), *esess = form_encode(session);
  free_secret(token);
  char *body = NULL;
  if (etok && erole && esess) {
    size_t n = strlen(etok) + strlen(erole) + strlen(esess) + 160;
    if ((body = malloc(n)) != NULL)
      snprintf(body, n,
               "Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=%s"
               "&RoleSessionName=%s&WebIdentityToken=%s",
               erole, esess, etok);
  }
  free_secret(etok);
  free(erole);
  free(esess);
  if (body == NULL) {
    snprintf(w->err, w->errlen, "%s: out of memory", source);
    return LARDER_ENOMEM;
  }
  int rc = sts_call(w, source, body, NULL, out);
  free_secret(body);
  return rc;
}

static int web_identity(const walk_t *w, awscreds_value_t *out) {
  const char *token_file = env("AWS_WEB_IDENTITY_TOKEN_FILE"), *role = env("AWS_ROLE_ARN");
  if (token_file == NULL || role == NULL) return LARDER_ENOENT;
  return web_identity_with(w, "web_identity", token_file, role, env("AWS_ROLE_SESSION_NAME"), out);
}

/* ------------------------------------------------------------------------ */
/* profile: the shared credentials and config files                         */

enum {
  P_AK,
  P_SK,
  P_TOK,
  P_PROCESS,
  P_ROLE,
  P_SOURCE_PROFILE,
  P_CREDENTIAL_SOURCE,
  P_EXTERNAL_ID,
  P_SESSION_NAME,
  P_DURATION,
  P_WEB_TOKEN_FILE,
  P_MFA,
  P_N
};
static const char *const profile_keys[P_N] = {
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token",       "credential_process",
    "role_arn",          "source_profile",        "credential_source",       "external_id",
    "role_session_name", "duration_seconds",      "web_identity_token_file", "mfa_serial"};

/*
 * Reads the section named section of the INI file at path: for each key of
 * profile_keys not yet in vals, its value.  Lines may be of any length (a
 * session token's is).  Comments start with '#' or ';' at the line's start;
 * "key = value" with spaces around either.  Returns 1 when the section was
 * found, 0 when not (or no file).
 */
static int ini_section(const char *path, const char *section, char **vals) {
  FILE *fp = fopen(path, "r");
  if (fp == NULL) return 0;
  char *line = NULL;
  size_t cap = 0;
  int in = 0, found = 0;
  while (getline(&line, &cap, fp) >= 0) {
    char *p = line;
    while (isspace((unsigned char)*p)) p++;
    if (*p == '#' || *p == ';' || *p == '\0') continue;
    if (*p == '[') {
      char *e = strchr(p, ']');
      char *name = e ? dup_trim_n(p + 1, (size_t)(e - p - 1)) : NULL;
      in = name && strcmp(name, section) == 0;
      found |= in;
      free(name);
      continue;
    }
    if (!in) continue;
    char *eq = strchr(p, '=');
    if (eq == NULL) continue;
    char *key = dup_trim_n(p, (size_t)(eq - p));
    if (key == NULL) continue;
    for (int i = 0; i < P_N; i++) {
      if (vals[i] == NULL && strcasecmp(key, profile_keys[i]) == 0)
        vals[i] = dup_trim_n(eq + 1, strlen(eq + 1));
    }
    free(key);
  }
  if (line) explicit_bzero(line, cap);
  free(line);
  fclose(fp);
  return found;
}

static int64_t mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Runs cmd with /bin/sh -c, its stdout (at most BODY_MAX) into *out; the
 * child is killed past the timeout or when the walk stops.  Returns 0 or a
 * negative code with err filled. */
static int run_process(const walk_t *w, const char *cmd, char **out) {
  int fds[2];
  *out = NULL;
  if (pipe2(fds, O_CLOEXEC) != 0) {
    snprintf(w->err, w->errlen, "process: pipe: %s", strerror(errno));
    return LARDER_EIO;
  }
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    snprintf(w->err, w->errlen, "process: fork: %s", strerror(errno));
    return LARDER_EIO;
  }
  if (pid == 0) {
    /* A group of its own, so that a timeout kills what the shell started
     * too. */
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) dup2(devnull, STDIN_FILENO);
    execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
    _exit(127);
  }
  setpgid(pid, pid); /* as the child does: whichever runs first */
  close(fds[1]);
  body_t b;
  memset(&b, 0, sizeof(b));
  int rc = 0;
  int64_t deadline = mono_ms() + (int64_t)timeout_s(w) * 1000;
  for (;;) {
    if (stopped(w->stop)) {
      rc = LARDER_ESHUTDOWN;
      snprintf(w->err, w->errlen, "process: stopped");
      break;
    }
    int64_t left = deadline - mono_ms();
    if (left <= 0) {
      rc = LARDER_ETIMEDOUT;
      snprintf(w->err, w->errlen, "process: credential_process took over %d s", timeout_s(w));
      break;
    }
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    int pr = poll(&pfd, 1, left < 200 ? (int)left : 200);
    if (pr < 0 && errno == EINTR) continue;
    if (pr <= 0) continue;
    char buf[4096];
    ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (on_body(buf, 1, (size_t)n, &b) != (size_t)n) {
      rc = LARDER_ELIMIT;
      snprintf(w->err, w->errlen, "process: credential_process wrote too much");
      explicit_bzero(buf, sizeof(buf));
      break;
    }
    explicit_bzero(buf, sizeof(buf));
  }
  close(fds[0]);
  if (rc) {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
  }
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
  if (rc == 0 && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
    rc = LARDER_EIO;
    snprintf(w->err, w->errlen, "process: credential_process exited with status %d",
             WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
  }
  if (rc == 0 && b.data == NULL) {
    rc = LARDER_ECORRUPT;
    snprintf(w->err, w->errlen, "process: credential_process wrote nothing");
  }
  if (rc) body_free(&b);
  else *out = b.data;
  return rc;
}

/* Sources a role profile may name as its credential_source. */
static int container(const walk_t *w, awscreds_value_t *out);
static int imds(const walk_t *w, awscreds_value_t *out);
static int env_source(const walk_t *w, awscreds_value_t *out);

/* How many profiles a role chain may pass through (a source_profile that
 * names a role profile, and so on), as a loop's bound. */
#define PROFILE_CHAIN_MAX 8

/* Reads profile name's keys into vals (P_N entries, NULL where absent):
 * the credentials file first, then the config file's "[profile name]"
 * ("[default]" for the default). */
static void profile_read(const char *name, char **vals) {
  const char *home = env("HOME");
  char cpath[1024], fpath[1024], section[300];
  const char *cred = env("AWS_SHARED_CREDENTIALS_FILE"), *conf = env("AWS_CONFIG_FILE");
  if (cred == NULL && home) {
    snprintf(cpath, sizeof(cpath), "%s/.aws/credentials", home);
    cred = cpath;
  }
  if (conf == NULL && home) {
    snprintf(fpath, sizeof(fpath), "%s/.aws/config", home);
    conf = fpath;
  }
  if (cred) ini_section(cred, name, vals);
  if (conf) {
    /* The config file names profiles "[profile x]", the default "[default]"
     * (and, as the CLI accepts, "[profile default]"). */
    snprintf(section, sizeof(section), "profile %s", name);
    if (!ini_section(conf, section, vals) && strcmp(name, "default") == 0)
      ini_section(conf, "default", vals);
  }
}

static int profile_named(const walk_t *w, const char *name, int depth, awscreds_value_t *out);

/*
 * AssumeRole of the role profile `name` (vals: its keys), signed with the
 * source credentials src: RoleArn, RoleSessionName (role_session_name, else
 * larderd-<pid>), ExternalId and DurationSeconds when the profile sets
 * them.  Returns 0 with *out from STS (source "assume_role"), or a code
 * with w->err.
 */
static int assume_role(const walk_t *w, const char *name, char **vals, const awscreds_value_t *src,
                       awscreds_value_t *out) {
  const char *dur = vals[P_DURATION];
  if (dur && *dur) {
    char *end;
    long d = strtol(dur, &end, 10);
    if (*end != '\0' || d < 900 || d > 43200) {
      snprintf(w->err, w->errlen,
               "profile %.100s: duration_seconds = %.40s is not a number of seconds from 900 to "
               "43200",
               name, dur);
      return LARDER_EINVAL;
    }
  }
  char session[64];
  session_name(vals[P_SESSION_NAME], session, sizeof(session));
  char *erole = form_encode(vals[P_ROLE]), *esess = form_encode(session);
  char *eext =
      vals[P_EXTERNAL_ID] && *vals[P_EXTERNAL_ID] ? form_encode(vals[P_EXTERNAL_ID]) : NULL;
  char *body = NULL;
  if (erole && esess && (eext || !(vals[P_EXTERNAL_ID] && *vals[P_EXTERNAL_ID]))) {
    size_t n = strlen(erole) + strlen(esess) + (eext ? strlen(eext) : 0) + 200;
    if ((body = malloc(n)) != NULL)
      snprintf(body, n,
               "Action=AssumeRole&Version=2011-06-15&RoleArn=%s&RoleSessionName=%s%s%s%s%s", erole,
               esess, eext ? "&ExternalId=" : "", eext ? eext : "",
               dur && *dur ? "&DurationSeconds=" : "", dur && *dur ? dur : "");
  }
  free(erole);
  free(esess);
  free_secret(eext);
  if (body == NULL) {
    snprintf(w->err, w->errlen, "assume_role: out of memory");
    return LARDER_ENOMEM;
  }
  int rc = sts_call(w, "assume_role", body, src, out);
  free(body);
  return rc;
}

/*
 * The credentials of the role profile `name`: its source credentials
 * (source_profile, which may be itself when it holds keys, or another role
 * profile; credential_source Environment, Ec2InstanceMetadata or
 * EcsContainer; or web_identity_token_file, which assumes the role itself),
 * then AssumeRole with them.  MFA profiles are refused: a daemon has
 * nobody to type the code.
 */
static int profile_role(const walk_t *w, const char *name, char **vals, int depth,
                        awscreds_value_t *out) {
  if (vals[P_MFA] && *vals[P_MFA]) {
    snprintf(w->err, w->errlen,
             "profile %.100s: role_arn with mfa_serial needs a code typed by a person, which "
             "larderd cannot do; give it credentials another way (credential_process, a "
             "profile without MFA)",
             name);
    return LARDER_EINVAL;
  }
  const char *sp = vals[P_SOURCE_PROFILE], *cs = vals[P_CREDENTIAL_SOURCE];
  const char *wt = vals[P_WEB_TOKEN_FILE];
  awscreds_value_t src;
  memset(&src, 0, sizeof(src));
  int rc;
  if (sp && *sp) {
    if (strcmp(sp, name) == 0) {
      /* Itself: the keys beside its role_arn. */
      if (vals[P_AK] && vals[P_SK] && *vals[P_AK] && *vals[P_SK]) {
        rc = set_value(&src, "profile", vals[P_AK], vals[P_SK], vals[P_TOK], 0);
        if (rc) snprintf(w->err, w->errlen, "profile: out of memory");
      } else {
        snprintf(w->err, w->errlen,
                 "profile %.100s: source_profile names itself, but it holds no keys", name);
        rc = LARDER_EINVAL;
      }
    } else if (depth + 1 >= PROFILE_CHAIN_MAX) {
      snprintf(w->err, w->errlen,
               "profile %.100s: its role chain passes %d profiles (source_profile loops?)", name,
               PROFILE_CHAIN_MAX);
      rc = LARDER_EINVAL;
    } else {
      rc = profile_named(w, sp, depth + 1, &src);
      if (rc == LARDER_ENOENT) {
        snprintf(w->err, w->errlen,
                 "profile %.100s: its source_profile %.100s has no credentials (no such "
                 "profile, or no keys in it)",
                 name, sp);
        rc = LARDER_EINVAL;
      }
    }
  } else if (cs && *cs) {
    if (strcasecmp(cs, "Environment") == 0) rc = env_source(w, &src);
    else if (strcasecmp(cs, "Ec2InstanceMetadata") == 0) rc = imds(w, &src);
    else if (strcasecmp(cs, "EcsContainer") == 0) rc = container(w, &src);
    else {
      snprintf(w->err, w->errlen,
               "profile %.100s: credential_source = %.60s is not Environment, "
               "Ec2InstanceMetadata or EcsContainer",
               name, cs);
      return LARDER_EINVAL;
    }
    if (rc == LARDER_ENOENT) {
      snprintf(w->err, w->errlen, "profile %.100s: its credential_source %.60s has no credentials",
               name, cs);
      rc = LARDER_EINVAL;
    }
  } else if (wt && *wt) {
    return web_identity_with(w, "web_identity", wt, vals[P_ROLE], vals[P_SESSION_NAME], out);
  } else {
    snprintf(w->err, w->errlen,
             "profile %.100s: role_arn needs source_profile, credential_source or "
             "web_identity_token_file",
             name);
    return LARDER_EINVAL;
  }
  if (rc == 0) rc = assume_role(w, name, vals, &src, out);
  awscreds_value_clear(&src);
  return rc;
}

/* The credentials of profile `name`, depth profiles down a role chain:
 * LARDER_ENOENT when it has none (no such profile, or no keys). */
static int profile_named(const walk_t *w, const char *name, int depth, awscreds_value_t *out) {
  char *vals[P_N];
  for (int i = 0; i < P_N; i++) vals[i] = NULL;
  profile_read(name, vals);
  int rc = LARDER_ENOENT;
  if (vals[P_ROLE] && *vals[P_ROLE]) {
    rc = profile_role(w, name, vals, depth, out);
  } else if (vals[P_AK] && vals[P_SK] && *vals[P_AK] && *vals[P_SK]) {
    rc = set_value(out, "profile", vals[P_AK], vals[P_SK], vals[P_TOK], 0);
    if (rc) snprintf(w->err, w->errlen, "profile: out of memory");
  } else if (vals[P_PROCESS] && *vals[P_PROCESS]) {
    char *json = NULL;
    rc = run_process(w, vals[P_PROCESS], &json);
    if (rc == 0) rc = value_from_json(json, "process", "SessionToken", out, w->err, w->errlen);
    free_secret(json);
  }
  for (int i = 0; i < P_N; i++) free_secret(vals[i]);
  return rc;
}

static int profile(const walk_t *w, awscreds_value_t *out) {
  const char *name = w->o->profile && *w->o->profile ? w->o->profile : env("AWS_PROFILE");
  if (name == NULL) name = "default";
  return profile_named(w, name, 0, out);
}

/* ------------------------------------------------------------------------ */
/* container and imds                                                       */

/* Whether an http:// URL's host is one the SDKs let the container provider
 * use without TLS: loopback, or the ECS / EKS link-local agents. */
static int container_host_ok(const char *url) {
  if (strncasecmp(url, "https://", 8) == 0) return 1;
  if (strncasecmp(url, "http://", 7) != 0) return 0;
  const char *h = url + 7;
  static const char *const ok[] = {
      "127.",           "localhost:",      "localhost/",      "[::1]",         "169.254.170.2:",
      "169.254.170.2/", "169.254.170.23:", "169.254.170.23/", "[fd00:ec2::23]"};
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
    if (strncasecmp(h, ok[i], strlen(ok[i])) == 0) return 1;
  return strcasecmp(h, "localhost") == 0 || strcmp(h, "169.254.170.2") == 0 ||
         strcmp(h, "169.254.170.23") == 0;
}

static int container(const walk_t *w, awscreds_value_t *out) {
  const char *full = env("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  const char *rel = env("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  if (full == NULL && rel == NULL) return LARDER_ENOENT;
  char url[1024];
  if (rel) snprintf(url, sizeof(url), "http://169.254.170.2%s%s", *rel == '/' ? "" : "/", rel);
  else snprintf(url, sizeof(url), "%s", full);
  if (!container_host_ok(url)) {
    char where[256];
    redact(url, where, sizeof(where));
    snprintf(w->err, w->errlen,
             "container: %s is neither https nor a loopback or container-agent address", where);
    return LARDER_EINVAL;
  }
  char *auth = NULL;
  const char *auth_file = env("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  if (auth_file) {
    if ((auth = read_trimmed(auth_file, 16384)) == NULL) {
      snprintf(w->err, w->errlen, "container: cannot read %.200s", auth_file);
      return LARDER_EIO;
    }
  } else if (env("AWS_CONTAINER_AUTHORIZATION_TOKEN")) {
    auth = strdup(env("AWS_CONTAINER_AUTHORIZATION_TOKEN"));
  }
  struct curl_slist *h = NULL;
  if (auth && *auth) {
    size_t n = strlen(auth) + 32;
    char *line = malloc(n);
    if (line) {
      snprintf(line, n, "Authorization: %s", auth);
      h = curl_slist_append(NULL, line);
      free_secret(line);
    }
  }
  free_secret(auth);
  body_t b;
  int status = http(w, "container", "GET", url, h, NULL, NULL, NULL, 2, timeout_s(w), &b);
  curl_slist_free_all(h);
  if (status < 0) {
    body_free(&b); /* http() left nothing; said for the analyzer */
    return status;
  }
  int rc;
  if (status != 200) {
    char where[256];
    redact(url, where, sizeof(where));
    snprintf(w->err, w->errlen, "container: %s answered HTTP %d", where, status);
    rc = LARDER_EREMOTE;
  } else {
    rc = value_from_json(b.data, "container", "Token", out, w->err, w->errlen);
  }
  body_free(&b);
  return rc;
}

static int imds_disabled(void) {
  const char *d = env("AWS_EC2_METADATA_DISABLED");
  return d && strcasecmp(d, "true") == 0;
}

/* Whether a token PUT that got no token (status: the HTTP status, or the
 * negative code of a failed exchange; b: its outcome) lets IMDSv1 stand
 * in, as botocore's fetcher does (awscreds.h). */
static int imds_v1_allowed(int status, const body_t *b) {
  const char *d = env("AWS_EC2_METADATA_V1_DISABLED");
  if (d && strcasecmp(d, "true") == 0) return 0;
  if (status == 403 || status == 404 || status == 405 || status >= 500) return 1;
  /* Connected, then nothing in time: the answer was lost past the hop
   * limit (a GET's answer is not), or the service is slow. */
  return status == LARDER_ETIMEDOUT && b->connected;
}

static int imds(const walk_t *w, awscreds_value_t *out) {
  if (imds_disabled()) return LARDER_ENOENT;
  const char *base = env("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (base == NULL) base = "http://169.254.169.254";
  size_t bl = strlen(base);
  while (bl && base[bl - 1] == '/') bl--;
  char url[1024], hdr[256];
  /* IMDSv2: a session token first (PUT), then the role and its
   * credentials with it.  The link-local service answers at once or not
   * at all: a short connect timeout keeps a host off EC2 from waiting. */
  snprintf(url, sizeof(url), "%.*s/latest/api/token", (int)bl, base);
  struct curl_slist *h = curl_slist_append(NULL, "X-aws-ec2-metadata-token-ttl-seconds: 21600");
  body_t b;
  int status = http(w, "imds", "PUT", url, h, NULL, NULL, NULL, 1, 3, &b);
  curl_slist_free_all(h);
  h = NULL;
  int v1 = 0;
  if (status == 200 && b.len > 0 && b.len <= 200) {
    snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %.*s", (int)strcspn(b.data, "\r\n"),
             b.data);
    h = curl_slist_append(NULL, hdr);
    explicit_bzero(hdr, sizeof(hdr));
  } else if (imds_v1_allowed(status, &b)) {
    v1 = 1;
    if (status >= 0) log_info("imds: the token request answered HTTP %d; trying IMDSv1", status);
    else log_info("imds: the token request had no answer in time; trying IMDSv1");
  }
  if (status >= 0) body_free(&b);
  /* No token and no IMDSv1: no instance metadata service here (a host off
   * EC2).  The source does not apply, as on a host without it: nothing is
   * retried every minute for ever. */
  if (h == NULL && !v1) return LARDER_ENOENT;
  snprintf(url, sizeof(url), "%.*s/latest/meta-data/iam/security-credentials/", (int)bl, base);
  status = http(w, "imds", "GET", url, h, NULL, NULL, NULL, 1, 3, &b);
  int rc = 0;
  char role[256] = "";
  if (status == 200) {
    snprintf(role, sizeof(role), "%.*s", (int)strcspn(b.data, "\r\n"), b.data);
  } else if (status == 404) {
    rc = LARDER_ENOENT; /* an instance without a role */
  } else if (v1) {
    /* IMDSv1 refused too (an instance that requires IMDSv2, its token out
     * of reach): no instance credentials to be had here. */
    if (status >= 0) snprintf(w->err, w->errlen, "imds: IMDSv1 answered HTTP %d", status);
    rc = LARDER_ENOENT;
  } else if (status >= 0) {
    snprintf(w->err, w->errlen, "imds: %s answered HTTP %d (no instance role?)", url, status);
    rc = LARDER_EREMOTE;
  } else {
    rc = status;
  }
  if (status >= 0) body_free(&b);
  if (rc == 0 && (role[0] == '\0' || strchr(role, '/') || strchr(role, '?'))) {
    snprintf(w->err, w->errlen, "imds: no instance role");
    rc = LARDER_ENOENT;
  }
  if (rc == 0) {
    snprintf(url, sizeof(url), "%.*s/latest/meta-data/iam/security-credentials/%s", (int)bl, base,
             role);
    status = http(w, "imds", "GET", url, h, NULL, NULL, NULL, 1, 3, &b);
    if (status == 200) {
      rc = value_from_json(b.data, "imds", "Token", out, w->err, w->errlen);
    } else if (status >= 0) {
      snprintf(w->err, w->errlen, "imds: the credentials of role %s answered HTTP %d", role,
               status);
      rc = LARDER_EREMOTE;
    } else {
      rc = status;
    }
    if (status >= 0) body_free(&b);
  }
  curl_slist_free_all(h);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The chain                                                                */

static int env_source(const walk_t *w, awscreds_value_t *out) {
  const char *ak = env("AWS_ACCESS_KEY_ID"), *sk = env("AWS_SECRET_ACCESS_KEY");
  if (ak == NULL || sk == NULL) return LARDER_ENOENT;
  int rc = set_value(out, "env", ak, sk, env("AWS_SESSION_TOKEN"), 0);
  if (rc) snprintf(w->err, w->errlen, "env: out of memory");
  return rc;
}

static void init_curl(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

static int walk(const walk_t *w, awscreds_value_t *out) {
  /* libcurl's global state, once, before any request of ours. */
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, init_curl);
  int (*const sources[])(const walk_t *, awscreds_value_t *) = {env_source, web_identity, profile,
                                                                container, imds};
  memset(out, 0, sizeof(*out));
  for (size_t i = 0; i < sizeof(sources) / sizeof(sources[0]); i++) {
    if (stopped(w->stop)) {
      snprintf(w->err, w->errlen, "stopped");
      return LARDER_ESHUTDOWN;
    }
    int rc = sources[i](w, out);
    /* A source that applies but fails ends the walk: falling through to a
     * later one (another identity) would hide the misconfiguration. */
    if (rc != LARDER_ENOENT) return rc;
  }
  snprintf(w->err, w->errlen,
           "no S3 credentials: none in the environment, no web identity, no profile, no "
           "container endpoint%s",
           imds_disabled() ? " (instance metadata disabled)" : ", no instance role");
  return LARDER_ENOENT;
}

int awscreds_resolve(const awscreds_options_t *o, awscreds_value_t *out, char *err, size_t errlen) {
  char scratch[8];
  walk_t w = {o, NULL, err ? err : scratch, err ? errlen : sizeof(scratch)};
  w.err[0] = '\0';
  return walk(&w, out);
}

/* ------------------------------------------------------------------------ */
/* The refresher                                                            */

/* A done callback of awscreds_refused, waiting for a walk that begins
 * after walk number `after`. */
typedef struct refused_waiter {
  struct refused_waiter *next;
  awscreds_refused_cb done;
  void *arg;
  uint64_t after;
} refused_waiter_t;

struct awscreds {
  uv_async_t async;
  uv_loop_t *loop;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cond;
  volatile int stop; /* set under mu; read unlocked to abort a request */
  int kick;          /* awscreds_refresh_now: resolve at once */
  int have_new;      /* fresh holds a value for the loop thread */
  awscreds_value_t fresh;
  uint64_t walks_begun;      /* walks started, numbered from 1 (under mu) */
  uint64_t walk_ended;       /* the number of the last walk that ended (under mu) */
  int ended_status;          /* and its outcome (under mu) */
  refused_waiter_t *waiters; /* awscreds_refused's (the loop thread's) */
  /* The value in force, as the thread schedules it (the thread's alone). */
  int64_t expiration; /* 0: never expires */
  int have;           /* a value is in force */
  /* For awscreds_describe (under mu). */
  char source[16];
  int64_t shown_expiration;
  awscreds_options_t o;
  char *profile, *region, *sts_endpoint;
  stats_global_t *stats;
  awscreds_cb cb;
  void *arg;
};

/* When a value obtained at now, expiring at exp, is due for refresh. */
static int64_t refresh_at(const awscreds_t *a, int64_t now, int64_t exp) {
  int64_t margin = a->o.refresh_margin_s ? a->o.refresh_margin_s : 300;
  int64_t life = exp - now;
  if (life <= 0) return now;
  if (life / 2 < margin) return now + life / 2;
  return exp - margin;
}

static void *refresher(void *arg) {
  awscreds_t *a = arg;
  int64_t next = 0, backoff = 0;
  pthread_mutex_lock(&a->mu);
  /* next: when the value in force is due (-1: never, until kicked). */
  if (a->have && a->expiration) next = refresh_at(a, (int64_t)time(NULL), a->expiration);
  else next = -1;
  for (;;) {
    while (!a->stop && !a->kick) {
      if (next < 0) {
        pthread_cond_wait(&a->cond, &a->mu);
        continue;
      }
      struct timespec ts = {.tv_sec = (time_t)next, .tv_nsec = 0};
      if ((int64_t)time(NULL) >= next) break;
      pthread_cond_timedwait(&a->cond, &a->mu, &ts);
    }
    if (a->stop) break;
    a->kick = 0;
    uint64_t seq = ++a->walks_begun;
    pthread_mutex_unlock(&a->mu);

    awscreds_value_t v;
    char err[512];
    walk_t w = {&a->o, &a->stop, err, sizeof(err)};
    err[0] = '\0';
    int rc = walk(&w, &v);
    int64_t now = (int64_t)time(NULL);

    pthread_mutex_lock(&a->mu);
    if (a->stop) {
      if (rc == 0) awscreds_value_clear(&v);
      break;
    }
    a->walk_ended = seq;
    a->ended_status = rc;
    /* Every walk's end reaches the loop: awscreds_refused's callers wait
     * for failures too. */
    uv_async_send(&a->async);
    if (rc == 0) {
      if (a->stats) STATS_ADD(a->stats, credentials_refreshes, 1);
      backoff = 0;
      a->have = 1;
      a->expiration = v.expiration;
      next = v.expiration ? refresh_at(a, now, v.expiration) : -1;
      awscreds_value_clear(&a->fresh);
      a->fresh = v;
      a->have_new = 1;
      snprintf(a->source, sizeof(a->source), "%s", v.source);
      a->shown_expiration = v.expiration;
      log_info("S3 credentials refreshed from %s%s", v.source,
               v.expiration ? "" : " (they do not expire)");
      if (v.expiration)
        log_info("S3 credentials from %s expire in %lld s; next refresh in %lld s", v.source,
                 (long long)(v.expiration - now), (long long)(next - now));
      uv_async_send(&a->async);
    } else if (rc == LARDER_ENOENT) {
      /* No source applies: nothing to retry until something changes
       * (a reload kicks the walk again). */
      next = -1;
      log_info("S3 credentials: %s", err);
    } else {
      if (a->stats) STATS_ADD(a->stats, credentials_refresh_errors, 1);
      backoff = backoff ? (backoff * 2 > 60 ? 60 : backoff * 2) : 1;
      next = now + backoff;
      /* While the value in force has more than 15 s left, a backoff never
       * carries the next try past that point: one more try before expiry. */
      if (a->have && a->expiration && next > a->expiration - 15 && now < a->expiration - 15)
        next = a->expiration - 15 > now ? a->expiration - 15 : now + 1;
      log_warn("S3 credentials: refresh failed (%s); %s; retrying in %lld s", err,
               a->have && (a->expiration == 0 || a->expiration > now)
                   ? "the current ones stay in force"
                   : "none in force",
               (long long)(next - now));
    }
  }
  pthread_mutex_unlock(&a->mu);
  return NULL;
}

static void on_async(uv_async_t *h) {
  awscreds_t *a = h->data;
  awscreds_value_t v;
  memset(&v, 0, sizeof(v));
  int got = 0;
  pthread_mutex_lock(&a->mu);
  if (a->have_new && !a->stop) {
    v = a->fresh;
    memset(&a->fresh, 0, sizeof(a->fresh));
    a->have_new = 0;
    got = 1;
  }
  uint64_t ended = a->walk_ended;
  int status = a->ended_status;
  int stop = a->stop;
  pthread_mutex_unlock(&a->mu);
  if (got) {
    if (a->cb) a->cb(&v, a->arg);
    awscreds_value_clear(&v);
  }
  if (stop) return;
  /* The waiters whose walk has ended, taken off first: a callback may ask
   * again (awscreds_refused adds to the list). */
  refused_waiter_t *due = NULL, **pp = &a->waiters;
  while (*pp) {
    refused_waiter_t *x = *pp;
    if (x->after < ended) {
      *pp = x->next;
      x->next = due;
      due = x;
    } else {
      pp = &x->next;
    }
  }
  while (due) {
    refused_waiter_t *x = due;
    due = x->next;
    x->done(status, x->arg);
    free(x);
  }
}

static void free_refresher(awscreds_t *a) {
  while (a->waiters) {
    refused_waiter_t *x = a->waiters;
    a->waiters = x->next;
    free(x);
  }
  awscreds_value_clear(&a->fresh);
  pthread_mutex_destroy(&a->mu);
  pthread_cond_destroy(&a->cond);
  free(a->profile);
  free(a->region);
  free(a->sts_endpoint);
  free(a);
}

static void on_async_close(uv_handle_t *h) { free_refresher(h->data); }

static char *dup_opt(const char *s, int *ok) {
  if (s == NULL) return NULL;
  char *d = strdup(s);
  if (d == NULL) *ok = 0;
  return d;
}

int awscreds_start(uv_loop_t *loop, const awscreds_options_t *o, const awscreds_value_t *initial,
                   int resolve_now, stats_global_t *stats, awscreds_cb cb, void *arg,
                   awscreds_t **out) {
  *out = NULL;
  awscreds_t *a = calloc(1, sizeof(*a));
  if (a == NULL) return LARDER_ENOMEM;
  int ok = 1;
  a->o = *o;
  a->o.profile = a->profile = dup_opt(o->profile, &ok);
  a->o.region = a->region = dup_opt(o->region, &ok);
  a->o.sts_endpoint = a->sts_endpoint = dup_opt(o->sts_endpoint, &ok);
  a->stats = stats;
  a->kick = resolve_now;
  a->cb = cb;
  a->arg = arg;
  if (initial && initial->access_key) {
    a->have = 1;
    a->expiration = initial->expiration;
    snprintf(a->source, sizeof(a->source), "%s", initial->source);
    a->shown_expiration = initial->expiration;
  }
  pthread_mutex_init(&a->mu, NULL);
  pthread_cond_init(&a->cond, NULL);
  if (!ok || uv_async_init(loop, &a->async, on_async) != 0) {
    free_refresher(a);
    return ok ? LARDER_EIO : LARDER_ENOMEM;
  }
  a->async.data = a;
  a->loop = loop;
  if (pthread_create(&a->thread, NULL, refresher, a) != 0) {
    uv_close((uv_handle_t *)&a->async, on_async_close);
    return LARDER_EIO;
  }
  *out = a;
  return 0;
}

void awscreds_refresh_now(awscreds_t *a) {
  pthread_mutex_lock(&a->mu);
  a->kick = 1;
  pthread_cond_signal(&a->cond);
  pthread_mutex_unlock(&a->mu);
}

void awscreds_describe(awscreds_t *a, char *source, size_t size, int64_t *expiration) {
  pthread_mutex_lock(&a->mu);
  snprintf(source, size, "%s", a->source);
  *expiration = a->shown_expiration;
  pthread_mutex_unlock(&a->mu);
}

void awscreds_stop(awscreds_t *a) {
  if (a == NULL) return;
  pthread_mutex_lock(&a->mu);
  __atomic_store_n(&a->stop, 1, __ATOMIC_RELAXED);
  pthread_cond_signal(&a->cond);
  pthread_mutex_unlock(&a->mu);
  pthread_join(a->thread, NULL);
  uv_close((uv_handle_t *)&a->async, on_async_close);
}

int awscreds_refused(awscreds_t *a, awscreds_refused_cb done, void *arg) {
  if (a == NULL) return LARDER_ENOENT;
  refused_waiter_t *x = calloc(1, sizeof(*x));
  if (x == NULL) return LARDER_ENOMEM;
  x->done = done;
  x->arg = arg;
  pthread_mutex_lock(&a->mu);
  /* A walk running now may have begun before the refusal: the next one
   * counts, and the kick makes sure there is one. */
  x->after = a->walks_begun;
  a->kick = 1;
  pthread_cond_signal(&a->cond);
  pthread_mutex_unlock(&a->mu);
  x->next = a->waiters;
  a->waiters = x;
  return 0;
}

void awscreds_refused_cancel(awscreds_t *a, void *arg) {
  if (a == NULL) return;
  for (refused_waiter_t **pp = &a->waiters; *pp;) {
    refused_waiter_t *x = *pp;
    if (x->arg == arg) {
      *pp = x->next;
      free(x);
    } else {
      pp = &x->next;
    }
  }
}
