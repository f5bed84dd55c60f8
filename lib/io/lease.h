/* The job lease (docs/design.md "The job lease"): which node may run a
 * job's trainer and commit. One object, ROOT/LEASE (lease_doc.h), written
 * only with S3 conditional PUTs: If-None-Match: * to create it, If-Match
 * on its ETag to take it over (epoch + 1), renew it (same epoch) or
 * release it (same epoch, state "released").
 *
 * Life of a struct spot_lease (one per job and process):
 *
 *   spot_lease_acquire()  reads the lease; absent, released or expired ->
 *                         write ours; held by a process of this machine
 *                         proved gone (spot_lease_holder_gone) -> take
 *                         it over at once; held by another -> wait (poll until
 *                         it is released or expires; wait_cb tells who
 *                         holds it, until when) or, with no_wait, fail at
 *                         once with -EBUSY. Once held, the lease renews
 *                         itself every renew_ms.
 *   spot_lease_held()     true while held and the local deadline (the
 *                         time the last successful write was SENT + ttl,
 *                         on the monotonic clock) has not passed: check
 *                         it before every commit.
 *   lost_cb               runs once if a renewal finds another writer's
 *                         lease (-ESTALE) or cannot renew before the local
 *                         deadline (-ETIMEDOUT): stop uploading, never
 *                         move LATEST.
 *   spot_lease_release()  writes "released" (after a final commit), so a
 *                         waiting node proceeds at its next poll.
 *   spot_lease_free()     cancels whatever is in flight, never releases.
 *
 * Safety assumes clocks agree within grace_ms: a taker waits until
 * expires_ms + grace_ms on its wall clock, the holder stops trusting its
 * lease at (send time of its last write) + ttl on its monotonic clock.
 *
 * Ceph 16 RGW compares PUT If-Match with the bare ETag, AWS with the
 * quoted one (measured against both). We send the quoted form (standard) and,
 * on a 412, GET the object: if its ETag is still the one we named, the 412
 * was the form, not a conflict, so we send the bare form once and
 * remember it for this S3 client (spot_s3_set_if_match_unquoted). A server
 * that honours the quoted form never answers 412 while the ETag matches
 * (every lease write has a fresh nonce, so no two bodies share an ETag),
 * so AWS never sees the bare form, which a server might ignore. Either form
 * is a conditional write: the server still decides.
 *
 * Callbacks: a function taking one returns 0 and runs it exactly once from
 * the loop, or returns < 0 and never runs it. The info is borrowed for the
 * duration of the callback. One user operation (acquire, release, show)
 * at a time: another returns -EBUSY. */
#ifndef SPOT_LEASE_H
#define SPOT_LEASE_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "core/lease_doc.h"
#include "io/s3.h"

#define SPOT_LEASE_TTL_DEFAULT_MS 30000
#define SPOT_LEASE_POLL_DEFAULT_MS 1000
#define SPOT_LEASE_GRACE_DEFAULT_MS 2000

/* This process's owner id (lease_doc.h: boot id, pid namespace, host
 * name, pid), with INSTANCE/ in front unless instance is NULL or "".
 * 0 or -E2BIG. */
int spot_lease_local_owner(const char *instance, char *out, size_t size);
/* Holds this process's lock: a file named by its owner id (a hash of it,
 * in /dev/shm, else /tmp) locked with flock(). Take it before the first
 * lease write under that id and keep it for the process's life; the fd
 * (close-on-exec) is handed to the trainer's guard, which keeps it until
 * the trainer's tree is gone, so the kernel drops the lock only once
 * the holder and its tree are both gone. The fd (the same on every
 * call), or negative errno (-EBUSY: a process of the tree of an earlier
 * process with this owner id holds it). */
int spot_lease_lock_hold(const char *owner);
/* At the end: the lock file removed, our descriptor closed (a guard that
 * still holds it keeps the lock, on a file nobody can open any more: a
 * taker then waits for the expiry). */
void spot_lease_lock_drop(void);
/* Whether the holder named by owner is proved gone: a process of this
 * machine (same boot id, pid namespace and host name) whose lock
 * (spot_lease_lock_hold) is free, or is ours (a process before us had our
 * pid). False for an owner of another machine or of another form, with
 * no lock file, or whose lock is held: then only its expiry tells. Never
 * guessed from /proc. why (may be NULL) says which. */
bool spot_lease_holder_gone(const char *owner, char *why, size_t size);
struct spot_lease_config {
  struct spot_s3 *s3;
  const char *bucket;
  const char *key;          /* "PREFIX/JOB/LEASE" */
  const char *owner;        /* spot_lease_doc_owner_valid() */
  uint64_t ttl_ms;          /* 0 = SPOT_LEASE_TTL_DEFAULT_MS */
  uint64_t renew_ms;        /* 0 = ttl / 3 */
  uint64_t poll_ms;         /* waiting: 0 = SPOT_LEASE_POLL_DEFAULT_MS */
  int64_t grace_ms;         /* clock skew allowance: < 0 = 0, 0 = default */
  bool no_wait;             /* acquire: -EBUSY at once when another holds it */
  uint64_t wait_timeout_ms; /* acquire: 0 = wait forever */
};

struct spot_lease_info {
  int err;             /* 0 or negative errno (see each function) */
  const char *message; /* one line for users when err < 0, else "" */
  bool exists;         /* a lease object was read or written */
  const char *owner;   /* its holder ("" when none) */
  uint64_t epoch;
  bool released;
  int64_t expires_ms;              /* wall clock */
  enum spot_lease_verdict verdict; /* as judged at the last read */
  uint64_t waited_ms;              /* acquire: time spent waiting */
};

struct spot_lease;
typedef void (*spot_lease_cb)(const struct spot_lease_info *info, void *data);
/* The local deadline (monotonic ms, spot_now_mono_ms()) of the lease just
 * taken or renewed. */
typedef void (*spot_lease_deadline_cb)(uint64_t deadline_mono_ms, void *data);

/* Copies cfg's strings. lost_cb (may be NULL) runs at most once per
 * acquisition, when a held lease is lost. 0, -EINVAL or -ENOMEM. */
int spot_lease_new(uv_loop_t *loop, const struct spot_lease_config *cfg,
                   spot_lease_cb lost_cb, void *lost_data,
                   struct spot_lease **out);
/* cb (may be NULL) runs after every write that takes or renews the lease
 * with its new local deadline: the holder hands it to what enforces it
 * outside the loop (the trainer's guard, child.h). */
void spot_lease_on_deadline(struct spot_lease *l, spot_lease_deadline_cb cb,
                            void *data);
/* Cancels the operation in flight (its callback runs with -ECANCELED),
 * stops renewing, closes the timers and frees once they are closed. Does
 * not release: a lease dropped this way expires after its ttl. Safe on
 * NULL. */
void spot_lease_free(struct spot_lease *l);

/* cb: 0 (held: info names us and our epoch), -EBUSY (no_wait, info names
 * the holder), -ETIMEDOUT (wait_timeout_ms), -EBADMSG (the lease object
 * is not a lease), -ECANCELED, or an S3 error. wait_cb (may be NULL) runs
 * when waiting starts and each time the holder or its expiry changes. */
int spot_lease_acquire(struct spot_lease *l, spot_lease_cb wait_cb,
                       spot_lease_cb cb, void *data);
/* Writes the lease as released. cb: 0, -ESTALE (another writer holds it:
 * we had lost it), -ECANCELED or an S3 error. -ENOTCONN (no callback)
 * when the lease is not held. */
int spot_lease_release(struct spot_lease *l, spot_lease_cb cb, void *data);
/* Takes the lease as it stands when it is held under our owner id (an
 * operator releasing the lease of a holder that is gone: `spotctl lease
 * --release --owner ID`). The epoch does not change; the local deadline
 * is the lease's expiry. cb: 0 (held, renewing), -ESTALE (absent,
 * released or another owner's), -ECANCELED or an S3 error. Never for the
 * engine: two processes with one owner id would share an epoch. */
int spot_lease_adopt(struct spot_lease *l, spot_lease_cb cb, void *data);
/* Reads the lease without writing. cb: 0 (info.exists tells whether
 * there is one), -EBADMSG, -ECANCELED or an S3 error. */
int spot_lease_show(struct spot_lease *l, spot_lease_cb cb, void *data);
/* Cancels the user operation in flight, in any state. Its callback runs
 * with -ECANCELED before this returns: unlike s3.h and store.h, the lease
 * finishes its user operation here (its own S3 request, cancelled, ends
 * later from the loop and changes nothing). A held lease stays held and
 * keeps renewing. */
void spot_lease_cancel(struct spot_lease *l);

/* Held, and the local deadline not passed (monotonic clock). */
bool spot_lease_held(const struct spot_lease *l);
/* The epoch of the lease we hold or held last (0: never held). */
uint64_t spot_lease_epoch(const struct spot_lease *l);
/* The state by name, for status output: "idle", "reading", "waiting",
 * "held", "renewing", "releasing", "lost", ... */
const char *spot_lease_state_name(const struct spot_lease *l);

#endif
