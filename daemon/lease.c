/* The job lease around the engine (lib/io/lease.h), one operation (struct
 * job_lease, enum job_lease_state):
 *
 *   NONE       not taken yet (or never: --nranks > 1 on a rank other than
 *              0 -> SKIPPED)
 *   ACQUIRING  reading ROOT/LEASE; WAITING while another node holds it
 *              (status and a log line name the holder and its expiry), or
 *              FAILED at once with --no-lease-wait
 *   HELD       renewing every ttl / 3 while spotd runs; every commit
 *              carries its epoch (store.h lease_owner/lease_epoch)
 *   RELEASING  after the final commit, once the trainer is gone: a waiting
 *              node proceeds at its next poll -> RELEASED
 *   LOST       a renewal found another writer, or could not renew by the
 *              local deadline (a timer independent of the request in
 *              flight, lib/io/lease.c): uploads stop, LATEST never moves,
 *              the trainer's processes are frozen at once (SIGSTOP: it
 *              takes no further step, whatever it does with signals), then
 *              killed (SIGKILL: nothing it would save could be committed),
 *              and spotd exits SPOTD_EXIT_LEASE_LOST
 *
 * Taken after the store check and before the journal resume and the
 * restore (startup.c), so a node never restores while another runs the
 * job's trainer. */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "core/fsm.h"
#include "hist.h"
#include "joblease.h"
#include "core/log.h"
#include "startup.h"
#include "spotd.h"
#include "core/util.h"

static const char *const names[] = {
    [JOB_LEASE_NONE] = "none",           [JOB_LEASE_SKIPPED] = "skipped",
    [JOB_LEASE_ACQUIRING] = "acquiring", [JOB_LEASE_WAITING] = "waiting",
    [JOB_LEASE_HELD] = "held",           [JOB_LEASE_RELEASING] = "releasing",
    [JOB_LEASE_RELEASED] = "released",   [JOB_LEASE_LOST] = "lost",
    [JOB_LEASE_FAILED] = "failed",
};
_Static_assert(SPOT_ARRAY_SIZE(names) == JOB_LEASE_STATE_LAST, "names");

static const struct spot_fsm job_lease_fsm = {
    "lease", names, JOB_LEASE_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

const char *
job_lease_state_name(enum job_lease_state s)
{
  return spot_fsm_name(&job_lease_fsm, (unsigned)s);
}

#define set_state(d, s) set_state_at((d), (s), __FILE__, __LINE__)
static void
set_state_at(struct spotd *d, enum job_lease_state s, const char *file,
             int line)
{
  if (spot_fsm_move(&job_lease_fsm, d->jl.state, s, file, line) <= 0)
    return;
  d->jl.state = s;
  /* The job history records what another node would want to know, and
   * the wait for the lease (a phase of its own, not the restore). */
  if (s == JOB_LEASE_HELD || s == JOB_LEASE_RELEASED || s == JOB_LEASE_LOST ||
      s == JOB_LEASE_WAITING || s == JOB_LEASE_FAILED)
    hist_lease(d, job_lease_state_name(s),
               d->jl.lease != NULL ? (int64_t)spot_lease_epoch(d->jl.lease)
                                   : 0);
}

/* instance id / boot id / pid namespace / host:pid: unique per process,
 * readable, and tells a holder on this machine that is gone. */
static void
make_owner(struct spotd *d)
{
  if (spot_lease_local_owner(d->jl.instance_id, d->jl.owner,
                             sizeof(d->jl.owner)) < 0)
    snprintf(d->jl.owner, sizeof(d->jl.owner), "spotd:%ld", (long)getpid());
}

static void
holder_from(struct spotd *d, const struct spot_lease_info *i)
{
  spot_strlcpy(d->jl.holder, i->owner != NULL ? i->owner : "",
               sizeof(d->jl.holder));
  d->jl.holder_epoch = i->epoch;
  d->jl.holder_expires_ms = i->expires_ms;
}

static void
lost_cb(const struct spot_lease_info *i, void *data)
{
  struct spotd *d = data;

  if (d->closing)
    return;
  set_state(d, JOB_LEASE_LOST);
  spotd_warn(d,
             "the job lease (epoch %" PRIu64 ") is lost: %s; stopping the "
             "trainer, no further commit",
             spot_lease_epoch(d->jl.lease),
             i->message && i->message[0] ? i->message : strerror(-i->err));
  spotd_lease_lost(d);
}

static void
wait_cb(const struct spot_lease_info *i, void *data)
{
  struct spotd *d = data;
  char until[32] = "";

  if (d->closing)
    return;
  set_state(d, JOB_LEASE_WAITING);
  holder_from(d, i);
  spot_rfc3339_format(i->expires_ms, until, sizeof(until));
  log_notice("waiting for the job lease of %s: held by %s (epoch %" PRIu64
             ") until %s unless renewed or released",
             d->cfg->job, i->owner, i->epoch, until);
  spotd_notify(d, "STATUS=waiting for the job lease held by %s", i->owner);
}

static void
acquired_cb(const struct spot_lease_info *i, void *data)
{
  struct spotd *d = data;
  char until[32] = "";

  if (d->closing)
    return;
  if (i->err < 0) {
    /* Held elsewhere (at once, or past the wait): a refused start. */
    hist_refused(d, i->err == -EBUSY || i->err == -ETIMEDOUT ? "lease-held"
                                                             : "lease");
    set_state(d, JOB_LEASE_FAILED);
    if (i->err == -EBUSY) {
      spot_rfc3339_format(i->expires_ms, until, sizeof(until));
      log_err("job %s is running elsewhere: its lease is held by %s (epoch "
              "%" PRIu64 ") until %s (--no-lease-wait)",
              d->cfg->job, i->owner, i->epoch, until);
    } else {
      log_err("job lease: %s",
              i->message && i->message[0] ? i->message : strerror(-i->err));
    }
    /* Held elsewhere, waited past --lease-wait, or the store refused the
     * lease: not spotd's own failure. */
    spotd_fail(d, SPOTD_EXIT_UNAVAILABLE);
    return;
  }
  set_state(d, JOB_LEASE_HELD);
  holder_from(d, i);
  d->store.lease_owner = d->jl.owner;
  d->store.lease_epoch = i->epoch;
  log_info("took the job lease of %s: owner=%s epoch=%" PRIu64
           " (waited %.1f s)",
           d->cfg->job, d->jl.owner, i->epoch, (double)i->waited_ms / 1000.0);
  restore_leased(d);
}

/* Each lease write's local deadline goes to the trainer's guard, which
 * stops the trainer itself once it passes: spotd's loop may be stopped
 * then. */
static void
deadline_cb(uint64_t deadline_mono_ms, void *data)
{
  struct spotd *d = data;

  spot_child_set_deadline(&d->trainer, deadline_mono_ms);
}

/* 0: acquiring (restore_leased() follows); 1: no lease for this node. */
int
lease_begin(struct spotd *d)
{
  struct spot_lease_config lc;
  uint64_t wait_ms = 0;
  char key[1200];
  int r;

  if (d->cfg->nranks > 1 && d->cfg->rank != 0) {
    set_state(d, JOB_LEASE_SKIPPED);
    return 1;
  }
  make_owner(d);
  /* Before any lease write under our owner id: another spotd of this
   * machine proves us gone only by this lock, which the kernel drops once
   * we and the trainer's guard are both gone. */
  r = spot_lease_lock_hold(d->jl.owner);
  if (r < 0)
    log_warn("job lease: cannot hold the lock that proves this spotd gone "
             "(%s): a spotd of this machine taking over waits for the "
             "lease's expiry",
             strerror(-r));
  else
    d->jl.lock_fd = r;
  snprintf(key, sizeof(key), "%s%s%s/%s", d->cfg->prefix,
           d->cfg->prefix[0] ? "/" : "", d->cfg->job, SPOT_LEASE_KEY);
  if (spot_config_lease_wait(d->cfg, &wait_ms) < 0)
    wait_ms = 0;
  memset(&lc, 0, sizeof(lc));
  lc.s3 = d->s3;
  lc.bucket = d->cfg->bucket;
  lc.key = key;
  lc.owner = d->jl.owner;
  lc.ttl_ms = d->cfg->lease_ttl_ms;
  lc.no_wait = d->cfg->no_lease_wait;
  lc.wait_timeout_ms = wait_ms;
  r = spot_lease_new(d->loop, &lc, lost_cb, d, &d->jl.lease);
  if (r == 0)
    spot_lease_on_deadline(d->jl.lease, deadline_cb, d);
  if (r == 0)
    r = spot_lease_acquire(d->jl.lease, wait_cb, acquired_cb, d);
  if (r < 0) {
    log_err_errno(r, "job lease");
    hist_refused(d, "lease");
    set_state(d, JOB_LEASE_FAILED);
    spotd_fail(d, SPOTD_EXIT_ERROR);
    return 0;
  }
  set_state(d, JOB_LEASE_ACQUIRING);
  return 0;
}

bool
lease_may_commit(const struct spotd *d)
{
  if (d->jl.state == JOB_LEASE_SKIPPED)
    return true;
  return d->jl.state == JOB_LEASE_HELD && spot_lease_held(d->jl.lease);
}

uint64_t
lease_next_seq(struct spotd *d)
{
  return ++d->jl.seq;
}

static void
released_cb(const struct spot_lease_info *i, void *data)
{
  struct spotd *d = data;

  if (i->err == -ECANCELED)
    return;
  if (i->err < 0)
    log_warn("releasing the job lease: %s (it expires in %.0f s)",
             i->message && i->message[0] ? i->message : strerror(-i->err),
             (double)d->cfg->lease_ttl_ms / 1000.0);
  else
    log_info("released the job lease of %s (epoch %" PRIu64 ")", d->cfg->job,
             i->epoch);
  set_state(d, JOB_LEASE_RELEASED);
  spotd_advance(d);
}

/* At the end (trainer gone, uploads idle): true while the release runs
 * (spotd_advance() follows its end). */
bool
lease_release(struct spotd *d)
{
  if (d->jl.state == JOB_LEASE_RELEASING)
    return true;
  if (d->jl.state != JOB_LEASE_HELD || d->jl.lease == NULL)
    return false;
  if (spot_lease_release(d->jl.lease, released_cb, d) < 0) {
    log_warn("cannot release the job lease now (%s): it expires in %.0f s",
             spot_lease_state_name(d->jl.lease),
             (double)d->cfg->lease_ttl_ms / 1000.0);
    set_state(d, JOB_LEASE_RELEASED);
    return false;
  }
  set_state(d, JOB_LEASE_RELEASING);
  return true;
}

static void
close_released_cb(const struct spot_lease_info *i, void *data)
{
  if (i->err == 0)
    log_info("released the job lease (epoch %" PRIu64 ") at exit", i->epoch);
  spot_lease_free(data);
}

/* Closing. A lease still held (an exit that did not pass through the
 * release above: a second signal, an error) is released on the way out,
 * so the next node need not wait for it to expire; the loop runs until
 * that request ends, then the lease is freed. A lost lease is not ours
 * to release. */
void
lease_close(struct spotd *d)
{
  struct spot_lease *l = d->jl.lease;

  d->jl.lease = NULL;
  if (d->jl.lock_fd > 0) {
    spot_lease_lock_drop();
    d->jl.lock_fd = 0;
  }
  if (l == NULL)
    return;
  if (d->jl.state == JOB_LEASE_HELD && spot_lease_held(l) &&
      spot_lease_release(l, close_released_cb, l) == 0) {
    set_state(d, JOB_LEASE_RELEASING);
    return;
  }
  spot_lease_free(l);
}

/* The "lease" member of the status object. */
void
lease_status(struct spotd *d, json_t *st)
{
  char until[32] = "";
  json_t *o;

  if (d->jl.state == JOB_LEASE_NONE)
    return;
  o = json_object();
  if (o == NULL)
    return;
  json_object_set_new(o, "state",
                      json_string(job_lease_state_name(d->jl.state)));
  if (d->jl.holder[0] != '\0') {
    json_object_set_new(o, "holder", json_string(d->jl.holder));
    json_object_set_new(o, "epoch",
                        json_integer((json_int_t)d->jl.holder_epoch));
    if (d->jl.holder_expires_ms > 0 &&
        spot_rfc3339_format(d->jl.holder_expires_ms, until, sizeof(until)) == 0)
      json_object_set_new(o, "expires", json_string(until));
  }
  if (d->jl.owner[0] != '\0')
    json_object_set_new(o, "owner", json_string(d->jl.owner));
  json_object_set_new(st, "lease", o);
}
