/* The checkpoint request as the trainer's processes see it (enum
 * req_state: IDLE -> PENDING -> IDLE).
 *
 * Two channels, so that every process of the job learns of a request
 * whatever its session, process group or threads:
 *
 *  - The request file (README "How a request reaches the trainer"):
 *    4096 bytes next to the control socket, mapped by spotd and by the
 *    Python helper of every process that imports it (SPOTD_REQUEST_FILE).
 *    spotd counts requests in `seq` and sets `served` to it when the
 *    request is over; a process has a request to take when seq > served
 *    and it has not taken seq yet. Reading it is a load from shared memory
 *    (no system call), a request made before a process could look is
 *    still there when it does, and a mapping survives fork (and exec maps
 *    it again). The helper counts its imports in `attached` and its polls
 *    in `polls`: spotd reads polls as "the trainer has made a step since
 *    it started". It maps the file for good at its first poll, so a
 *    process that imports the helper for other things and takes the
 *    signal itself still gets the signal.
 *
 *  - The checkpoint signal, for trainers without the helper: sent to each
 *    process of the trainer's tree (child.c: every session, orphans
 *    included) that catches it (SigCgt) or ignores it (harmless; and a
 *    sigwait loop on the signal spotd starts ignored shows so while it
 *    waits). Never to one at the default action, which would die of it,
 *    never to one the helper serves (it has polled: it maps the request
 *    file), and again, while the request is pending, to a process that
 *    starts catching it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "log.h"
#include "request.h"
#include "spotd.h"
#include "util.h"

#define REQ_FILE_SIZE 4096
#define REQ_MAGIC "SPOTDREQ"
#define REQ_VERSION 1
/* u64 slots of the file */
#define REQ_SLOT_SEQ 2
#define REQ_SLOT_SERVED 3
#define REQ_SLOT_POLLS 4
#define REQ_SLOT_ATTACHED 5
/* While a request is pending, the tree is looked at this often for
 * processes that started catching the signal. */
#define REQ_RESEND_MS 250

static const char *const req_names[] = {"idle", "pending"};
_Static_assert(SPOT_ARRAY_SIZE(req_names) == REQ_STATE_LAST, "req_names");

/* legal[from] is the set of states it may move to: one request at a
 * time, begun and then ended. */
#define B(s) (1u << (s))
static const unsigned req_legal[REQ_STATE_LAST] = {
    [REQ_IDLE] = B(REQ_PENDING),
    [REQ_PENDING] = B(REQ_IDLE),
};

const char *
req_state_name(enum req_state s)
{
  return (unsigned)s < REQ_STATE_LAST ? req_names[s] : "?";
}

/* The only way the request's state changes. A move is logged at debug
 * level only: one happens at every periodic checkpoint. */
static bool
req_set_state(struct spotd *d, enum req_state s)
{
  if (d->req.state == s)
    return true;
  if ((unsigned)s >= REQ_STATE_LAST || (req_legal[d->req.state] & B(s)) == 0) {
    log_err("internal: checkpoint request %s -> %s refused",
            req_state_name(d->req.state), req_state_name(s));
    return false;
  }
  log_debug("checkpoint request %s -> %s seq=%llu",
            req_state_name(d->req.state), req_state_name(s),
            (unsigned long long)d->req.seq);
  d->req.state = s;
  return true;
}

bool
request_pending(const struct spotd *d)
{
  return d->req.state == REQ_PENDING;
}

static void
slot_store(struct spotd *d, int slot, uint64_t v)
{
  if (d->req.map != NULL)
    __atomic_store_n(&d->req.map[slot], v, __ATOMIC_SEQ_CST);
}

static uint64_t
slot_load(const struct spotd *d, int slot)
{
  return d->req.map != NULL
             ? __atomic_load_n(&d->req.map[slot], __ATOMIC_SEQ_CST)
             : 0;
}

int
request_open(struct spotd *d)
{
  struct ckpt_req *q = &d->req;
  char abs[PATH_MAX], tmp[PATH_MAX + 8];
  void *m;
  int fd;

  q->fd = -1;
  if (spot_abs_path(d->cfg->socket, abs, sizeof(abs)) < 0 ||
      (size_t)snprintf(tmp, sizeof(tmp), "%s.req", abs) >= sizeof(q->path)) {
    spotd_warn(d,
               "no checkpoint request file next to %s (path too long): "
               "only the signal asks the trainer",
               d->cfg->socket);
    return 0;
  }
  spot_strlcpy(q->path, tmp, sizeof(q->path));
  (void)unlink(q->path); /* a previous spotd's, or a file in the way */
  fd = open(q->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0 || ftruncate(fd, REQ_FILE_SIZE) < 0) {
    spotd_warn(d,
               "cannot create the checkpoint request file %s: %s; only "
               "the signal asks the trainer",
               q->path, strerror(errno));
    if (fd >= 0) {
      close(fd);
      (void)unlink(q->path);
    }
    q->path[0] = '\0';
    return 0;
  }
  m = mmap(NULL, REQ_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    spotd_warn(d, "cannot map %s: %s; only the signal asks the trainer",
               q->path, strerror(errno));
    close(fd);
    (void)unlink(q->path);
    q->path[0] = '\0';
    return 0;
  }
  q->fd = fd;
  q->map = m;
  memcpy((void *)q->map, REQ_MAGIC, 8);
  ((volatile uint32_t *)q->map)[2] = REQ_VERSION;
  /* What /proc/PID/maps shows for a process that maps it. */
  if (realpath(q->path, abs) == NULL ||
      spot_strlcpy(q->maps_path, abs, sizeof(q->maps_path)) >=
          sizeof(q->maps_path))
    spot_strlcpy(q->maps_path, q->path, sizeof(q->maps_path));
  return uv_timer_init(d->loop, &q->resend);
}

void
request_close(struct spotd *d)
{
  struct ckpt_req *q = &d->req;

  if (q->resend.loop != NULL && !uv_is_closing((uv_handle_t *)&q->resend)) {
    uv_timer_stop(&q->resend);
    uv_close((uv_handle_t *)&q->resend, NULL);
  }
}

void
request_fini(struct spotd *d)
{
  struct ckpt_req *q = &d->req;

  struct stat a, b;

  if (q->map == NULL)
    return;
  munmap((void *)q->map, REQ_FILE_SIZE);
  q->map = NULL;
  /* Only our own file: another spotd may have taken the name since. */
  if (fstat(q->fd, &a) == 0 && lstat(q->path, &b) == 0 &&
      a.st_dev == b.st_dev && a.st_ino == b.st_ino)
    (void)unlink(q->path);
  close(q->fd);
  q->fd = -1;
}

void
request_trainer_starts(struct spotd *d)
{
  d->req.seq = 0;
  slot_store(d, REQ_SLOT_SEQ, 0);
  slot_store(d, REQ_SLOT_SERVED, 0);
  slot_store(d, REQ_SLOT_POLLS, 0);
  slot_store(d, REQ_SLOT_ATTACHED, 0);
}

const char *
request_file(const struct spotd *d)
{
  return d->req.map != NULL ? d->req.path : NULL;
}

/* Whether p already got the signal for this request in the state it is
 * in now (one that ignored it then and catches it now gets it again). */
static bool
was_sent(const struct ckpt_req *q, const struct spot_proc *p, int state)
{
  for (size_t i = 0; i < q->nsent; i++)
    if (q->sent[i].p.pid == p->pid && q->sent[i].p.start == p->start)
      return q->sent[i].state >= state;
  return false;
}

static void
note_sent(struct ckpt_req *q, const struct spot_proc *p, int state)
{
  for (size_t i = 0; i < q->nsent; i++)
    if (q->sent[i].p.pid == p->pid && q->sent[i].p.start == p->start) {
      q->sent[i].state = state;
      return;
    }
  if (q->nsent < SPOT_ARRAY_SIZE(q->sent)) {
    q->sent[q->nsent].p = *p;
    q->sent[q->nsent++].state = state;
  }
}

/* The processes of the trainer's tree and the request: those the helper
 * serves (they map the request file: counted in look->served, when
 * count_served, which reads every process's maps), those that catch the
 * signal (look->caught) and those that ignore it (look->ignored: sending
 * it to them is harmless, and a sigwait loop on the signal spotd started
 * ignored shows as ignoring it while it waits). With send, the signal
 * goes to the catchers and ignorers the helper does not serve that the
 * target allows, once per request each (again to one that ignored it and
 * now catches it); look->sent counts them. Never to a process at the
 * default action. */
struct look {
  unsigned served, caught, ignored, sent;
};

static int
tree_look(struct spotd *d, bool send, bool count_served, struct look *lk)
{
  struct ckpt_req *q = &d->req;
  struct spot_proc *v;
  size_t n;
  int sig = d->cfg->signal, r;

  memset(lk, 0, sizeof(*lk));
  r = spot_child_tree(&d->trainer, &v, &n);
  if (r < 0)
    return r;
  for (size_t i = 0; i < n; i++) {
    const struct spot_proc *p = &v[i];
    int st = spot_proc_sigstate(p, sig);
    bool takes = st == SPOT_PROC_SIG_CAUGHT || st == SPOT_PROC_SIG_IGNORED;

    if ((takes || count_served) && q->map != NULL &&
        spot_proc_maps_file(p, q->maps_path) == 1) {
      lk->served++;
      continue;
    }
    if (!takes || (d->cfg->signal_target == SPOT_CONFIG_TARGET_LEADER &&
                   !spot_child_is_leader(&d->trainer, p)))
      continue;
    if (st == SPOT_PROC_SIG_CAUGHT)
      lk->caught++;
    else
      lk->ignored++;
    if (!send || was_sent(q, p, st) || spot_proc_kill(p, sig) < 0)
      continue;
    lk->sent++;
    log_debug("checkpoint signal sent to pid=%d (%s)", (int)p->pid,
              st == SPOT_PROC_SIG_CAUGHT ? "catches it" : "ignores it");
    note_sent(q, p, st);
  }
  free(v);
  return 0;
}

static void
resend_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, req.resend);
  struct look lk;

  if (d->closing || d->req.state != REQ_PENDING)
    return;
  if (tree_look(d, true, false, &lk) == 0 && lk.sent > 0)
    log_info("checkpoint signal sent to %u more process%s (new, or "
             "catching it now)",
             lk.sent, lk.sent == 1 ? "" : "es");
}

void
request_begin(struct spotd *d, unsigned *helpers, unsigned *caught,
              unsigned *sent)
{
  struct ckpt_req *q = &d->req;
  struct look lk;

  q->seq++;
  q->nsent = 0;
  slot_store(d, REQ_SLOT_SEQ, q->seq);
  req_set_state(d, REQ_PENDING);
  if (tree_look(d, true, true, &lk) < 0)
    memset(&lk, 0, sizeof(lk));
  *helpers = lk.served;
  *caught = lk.caught;
  *sent = lk.sent;
  if (q->resend.loop != NULL)
    uv_timer_start(&q->resend, resend_cb, REQ_RESEND_MS, REQ_RESEND_MS);
}

void
request_end(struct spotd *d)
{
  struct ckpt_req *q = &d->req;

  if (q->state != REQ_PENDING)
    return;
  slot_store(d, REQ_SLOT_SERVED, q->seq);
  if (q->resend.loop != NULL)
    uv_timer_stop(&q->resend);
  req_set_state(d, REQ_IDLE);
}

bool
request_no_step(struct spotd *d)
{
  struct look lk;

  if (d->req.map == NULL || slot_load(d, REQ_SLOT_ATTACHED) == 0 ||
      slot_load(d, REQ_SLOT_POLLS) != 0)
    return false;
  /* No process the helper does not serve may catch the signal: such a
   * process may have stepped without polling. */
  return tree_look(d, false, false, &lk) == 0 && lk.caught == 0;
}
