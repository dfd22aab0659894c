/*
 * cred.c: per-thread filesystem credentials (cred.h).
 *
 * The daemon's own credentials are read once; every cred_leave returns to
 * them.  The switch itself is three raw system calls, in an order that
 * never leaves the thread with more access than either party: groups and
 * gid first while the fsuid is still the daemon's (setgroups needs
 * CAP_SETGID, which a non-root fsuid does not drop), the fsuid last; and
 * back in the opposite order.
 */
#include <errno.h>
#include <linux/capability.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cred.h"
#include "larder.h"
#include "log.h"

static struct {
  uid_t uid;
  gid_t gid;
  gid_t *groups;
  int ngroups;
  int can_switch;
} self;
static pthread_once_t self_once = PTHREAD_ONCE_INIT;

static void self_init(void) {
  free(self.groups);
  memset(&self, 0, sizeof(self));
  self.uid = geteuid();
  self.gid = getegid();
  int n = getgroups(0, NULL);
  if (n > 0) {
    self.groups = calloc((size_t)n, sizeof(gid_t));
    if (self.groups) self.ngroups = getgroups(n, self.groups);
    if (self.ngroups < 0) self.ngroups = 0;
  }
  struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
  struct __user_cap_data_struct data[2];
  memset(data, 0, sizeof(data));
  if (syscall(SYS_capget, &hdr, data) == 0) {
    uint32_t eff = data[0].effective;
    self.can_switch = (eff & (1u << CAP_SETUID)) && (eff & (1u << CAP_SETGID));
  }
}

void cred_init(void) { self_init(); }

int cred_can_switch(void) {
  pthread_once(&self_once, self_init);
  return self.can_switch;
}

static long set_fsuid(uid_t u) { return syscall(SYS_setfsuid, u); }
static long set_fsgid(gid_t g) { return syscall(SYS_setfsgid, g); }
/* setfsuid and setfsgid report no errors: asking with an invalid id (-1)
 * changes nothing and returns the current one. */
static uid_t get_fsuid(void) { return (uid_t)syscall(SYS_setfsuid, (uid_t)-1); }
static gid_t get_fsgid(void) { return (gid_t)syscall(SYS_setfsgid, (gid_t)-1); }

static int restore(void) {
  set_fsuid(self.uid);
  set_fsgid(self.gid);
  long rc = syscall(SYS_setgroups, (size_t)self.ngroups, self.groups);
  return rc == 0 && get_fsuid() == self.uid && get_fsgid() == self.gid ? 0 : -1;
}

static int same_groups(const acl_peer_t *p) {
  if (p->num_groups != self.ngroups) return 0;
  for (int i = 0; i < p->num_groups; i++)
    if (p->groups[i] != self.groups[i]) return 0;
  return 1;
}

int cred_enter(const acl_peer_t *peer, cred_saved_t *saved, char *err, size_t errlen) {
  saved->switched = 0;
  if (peer == NULL) return 0;
  pthread_once(&self_once, self_init);
  /* Root reads everything the daemon can: its own access is a subset. */
  if (peer->uid == 0) return 0;
  if (peer->uid == self.uid && peer->gid == self.gid && same_groups(peer)) return 0;
  if (!self.can_switch) {
    if (peer->uid == self.uid) return 0;
    snprintf(err, errlen,
             "not allowed: larderd (uid %u) cannot read local files as uid %u: it lacks "
             "CAP_SETUID and CAP_SETGID (run it as root, or grant them with the unit's "
             "AmbientCapabilities=); remote sources are not affected",
             (unsigned)self.uid, (unsigned)peer->uid);
    return LARDER_EACCES;
  }
  int grouped =
      syscall(SYS_setgroups, (size_t)(peer->groups ? peer->num_groups : 0), peer->groups) == 0;
  int e = errno, ok = 0;
  if (grouped) {
    set_fsgid(peer->gid);
    set_fsuid(peer->uid);
    ok = get_fsgid() == peer->gid && get_fsuid() == peer->uid;
    e = EPERM;
  }
  if (!ok) {
    /* A refused setgroups changed nothing; anything later is undone. */
    if (grouped && restore() != 0) {
      log_err("cannot restore the daemon's own credentials on a worker: %s", strerror(errno));
      abort();
    }
    snprintf(err, errlen, "not allowed: larderd cannot act as uid %u gid %u: %s",
             (unsigned)peer->uid, (unsigned)peer->gid, strerror(e));
    return LARDER_EACCES;
  }
  saved->switched = 1;
  return 0;
}

void cred_leave(cred_saved_t *saved) {
  if (!saved->switched) return;
  saved->switched = 0;
  if (restore() != 0) {
    log_err("cannot restore the daemon's own credentials on a worker: %s", strerror(errno));
    abort();
  }
}
