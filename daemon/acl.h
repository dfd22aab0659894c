/*
 * acl.h: who may make the daemon do what (prefix acl_).
 *
 * Anyone who can reach the socket could otherwise make the daemon fetch
 * with its own S3 credentials (a confused deputy).  Three checks stand in
 * the way, all against the peer's credentials from SO_PEERCRED (uid, gid)
 * and SO_PEERGROUPS (supplementary groups), never against anything the
 * client says:
 *
 * - The allowlist: remote URLs (streams, prefetch, inspect, cat) must start
 *   with one of the configured prefixes, each optionally limited to owners:
 *
 *       allow = s3://training-data/imagenet/
 *       allow = s3://team-a/ uid=1000 uid=1001
 *       allow = https://datasets.example.com/public/ group=trainers gid=2000
 *
 *   A line's owners (uid=N, user=NAME, gid=N, group=NAME) are alternatives:
 *   a peer matches when its uid is one of the uids or its primary or a
 *   supplementary group is one of the groups; a line without owners admits
 *   everyone.  Scheme and host compare case-insensitively (not S3 bucket
 *   names); a prefix that ends at the host (https://host) only matches at
 *   a "/" boundary, so it never admits https://host.evil.com.  URLs with "."
 *   or ".." path segments (also percent-encoded) are refused outright:
 *   curl would squash them and fetch outside the prefix.  With no allow
 *   line at all every URL is allowed (today's behaviour); production
 *   configurations should list their sources.
 * - Admin commands (evict, prefetch, verify, reload, config): root, the
 *   daemon's own user, or members of admin_group.
 * - Local paths: confined to local_roots (dataset.c resolves symlinks and
 *   ".." with realpath before checking, then opens each file below its
 *   root without following links); acl_split_roots parses the key.  They
 *   are opened with the peer's own credentials (cred.h), so that a client
 *   reads only what it could open itself.
 *
 * Names (user=, group=) are resolved when the configuration is loaded.
 * Everything here runs on the loop thread; an acl_t is immutable once
 * built and replaced whole on reload.
 */
#ifndef LARDER_ACL_H
#define LARDER_ACL_H

#include <stddef.h>
#include <sys/types.h>

typedef struct acl acl_t;

typedef struct acl_peer {
  uid_t uid;
  gid_t gid;
  const gid_t *groups; /* supplementary groups (SO_PEERGROUPS), may be NULL */
  int num_groups;
} acl_peer_t;

/* Copies src into *dst with a copy of its groups, for work that outlives
 * the connection's own (an open on a worker).  Returns 0 or LARDER_ENOMEM
 * (*dst then has no groups).  Free with acl_peer_clear.  Any thread. */
int acl_peer_copy(acl_peer_t *dst, const acl_peer_t *src);
/* Frees the groups of a peer made by acl_peer_copy. */
void acl_peer_clear(acl_peer_t *p);

/* Builds the rules from the allow lines and the admin group ("" or NULL:
 * none).  Returns 0 or LARDER_EINVAL / LARDER_ENOMEM with a message. */
int acl_create(const char *const *allow, size_t n, const char *admin_group, acl_t **out, char *err,
               size_t errlen);
void acl_free(acl_t *a);

/* Checks the syntax of one allow line (for config.c); 0 or LARDER_EINVAL. */
int acl_rule_check(const char *line, char *err, size_t errlen);

/* The number of allow rules (0: the allowlist is off). */
size_t acl_num_rules(const acl_t *a);

/* 0 when peer may have the daemon fetch url, else LARDER_EACCES with
 * "not allowed: URL is outside the configured sources" (or why the URL
 * cannot be checked) in err.  A NULL acl allows everything. */
int acl_check_url(const acl_t *a, const acl_peer_t *peer, const char *url, char *err,
                  size_t errlen);

/* Whether peer may run admin commands. */
int acl_is_admin(const acl_t *a, const acl_peer_t *peer);

/* Splits a local_roots value ("/data:/scratch" or "/data,/scratch") into a
 * NULL-terminated array in one allocation (free() it); NULL when the value
 * is empty (anywhere) or memory runs out (*oom set). */
char **acl_split_roots(const char *spec, int *oom);

#endif /* LARDER_ACL_H */
