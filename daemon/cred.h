/*
 * cred.h: reading local files as the client that asked for them (prefix
 * cred_).
 *
 * The daemon may be able to read more than its clients can (it may run as
 * root, or as a user with access to every dataset).  Everything it opens
 * on a client's behalf is opened under that client's credentials, so that
 * the kernel, not larder, decides what the client may read: owner, group
 * and other bits, POSIX ACLs, search permission on every directory on the
 * way, and the LSMs.
 *
 * Conventions
 * -----------
 * - Threads: credentials are switched on the calling thread alone, never
 *   the whole process.  Linux keeps the filesystem uid and gid and the
 *   supplementary groups per thread; the raw setfsuid, setfsgid and
 *   setgroups system calls change only the caller's (glibc's wrappers of
 *   setgroups would change every thread's).  A cred_enter must be paired
 *   with a cred_leave on the same thread before the thread does anything
 *   else, and nothing between them may block on another thread that could
 *   need the daemon's own credentials, nor create a thread (a new thread
 *   inherits its creator's credentials).
 * - Privileges: switching to another user needs CAP_SETUID and CAP_SETGID
 *   (root, or the unit's AmbientCapabilities).  Without them, a client of
 *   the daemon's own uid or of uid 0 is served with the daemon's own
 *   credentials (it can read everything the daemon can), and any other is
 *   refused local files with a message that says what the daemon lacks.
 * - Errors: negative larder_errno_t with a message in the caller's buffer.
 */
#ifndef LARDER_CRED_H
#define LARDER_CRED_H

#include <stddef.h>
#include <sys/types.h>

#include "acl.h"

/* What cred_enter changed, for cred_leave. */
typedef struct cred_saved {
  int switched; /* 0: the thread kept the daemon's own credentials */
} cred_saved_t;

/*
 * Makes the calling thread's file access that of peer (its uid, its gid
 * and supplementary groups as SO_PEERCRED and SO_PEERGROUPS gave them).
 * A NULL peer, or a peer the daemon may act for without a switch (uid 0,
 * or the daemon's own uid when it cannot switch), leaves the thread as it
 * is.  Returns 0 (then call cred_leave), or LARDER_EACCES with the reason
 * in err when the daemon cannot act as that user (the thread is left as it
 * was, and no cred_leave is due).
 */
int cred_enter(const acl_peer_t *peer, cred_saved_t *saved, char *err, size_t errlen);

/* Gives the calling thread back the daemon's own credentials.  Aborts the
 * daemon if they cannot be restored: a worker left acting as a client
 * would read with the wrong rights for every later task. */
void cred_leave(cred_saved_t *saved);

/* Reads the process's own credentials and capabilities, which every
 * cred_leave returns to.  The first cred_enter does it if nothing has;
 * call it again after the process changes its own identity, while it has
 * one thread. */
void cred_init(void);

/* Whether the daemon can act as users other than its own (CAP_SETUID and
 * CAP_SETGID); for the log at startup.  Any thread. */
int cred_can_switch(void);

#endif /* LARDER_CRED_H */
