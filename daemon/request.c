/* The checkpoint request as the trainer's processes see it (enum
 * req_state: IDLE -> PENDING -> IDLE).
 *
 * Two channels, so that every process of the job learns of a request
 * whatever its session, process group or threads:
 *
 *  - The request file (README "How a request reaches the trainer"; its
 *    layout in reqfile.h): 4096 bytes next to the control socket, read by
 *    the Python helper of every process that imports it
 *    (SPOTD_REQUEST_FILE). spotd writes a request's id in `seq` and sets
 *    `served` to it when the request is over; a process has a request to
 *    take when seq > served and it did not take that seq last. A request
 *    made before a process could look is still there when it does. The
 *    helper counts its imports in `attached` and marks `polls` at its
 *    first poll: spotd reads polls as "the trainer has made a step since
 *    it started". With each request spotd also writes `deadline`: when
 *    the checkpoint must be complete (request_set_deadline(); 0 none).
 *    The helper maps the file (never reading through the
 *    mapping) at its first poll, so a process that imports it for other
 *    things and takes the signal itself still gets the signal.
 *
 *    Anything may be written into the file by a process of the trainer's
 *    user: spotd never reads or writes it through a mapping (a truncated
 *    file kills the process that touches its mapping, SIGBUS), never
 *    reads its own counters back (its seq lives here), writes seq and
 *    served together at every request and, while one is pending, puts
 *    the file back as it should be (size, header, seq, served) every
 *    resend tick, with one warning. A process is known to be served by
 *    the device and inode of the file in its /proc/PID/maps, not the
 *    path: a file renamed over the path is not spotd's.
 *
 *  - The checkpoint signal, for trainers without the helper: sent to each
 *    process of the trainer's tree (child.c: every session, orphans
 *    included) that catches it (SigCgt) or ignores it (harmless; and a
 *    sigwait loop on the signal spotd starts ignored shows so while it
 *    waits). Never to one at the default action, which would die of it,
 *    never to one the helper serves (it maps the request file), and
 *    again, while the request is pending, to a process that starts
 *    catching it.
 *
 *    A catcher gets it only once it has been seen catching it on scans
 *    at least REQ_STEADY_MS apart (the same process: pid and start
 *    time). A child between fork() and exec() shows its parent's handler
 *    and exec() puts it back to the default action: signalled in that
 *    window it would die of it (a trainer whose handler runs
 *    subprocess.run() in a loop lost 17 of 21,351 children so). No child
 *    stays between fork and exec that long; what is left is a process
 *    that caught the signal for REQ_STEADY_MS and then execs (or resets
 *    it) in the microseconds between spotd's last look and the delivery.
 *    A process that ignores it gets it at once: exec() keeps SIG_IGN. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/reqfile.h"

#include "driver.h"
#include "engine.h"
#include "hist.h"
#include "core/fsm.h"
#include "core/log.h"
#include "request.h"
#include "spotd.h"
#include "core/util.h"

/* While a request is pending, the tree is looked at this often for
 * processes that started catching the signal. */
#define REQ_RESEND_MS 250
/* A catcher seen catching the signal for this long is no child between
 * fork() and exec() (one resend tick, less the timer's slack). */
#define REQ_STEADY_MS 200

static const char *const req_names[] = {"idle", "pending"};
_Static_assert(SPOT_ARRAY_SIZE(req_names) == REQ_STATE_LAST, "req_names");

/* legal[from] is the set of states it may move to: one request at a
 * time, begun and then ended. */
#define B(s) SPOT_FSM_BIT(s)
static const uint32_t req_legal[REQ_STATE_LAST] = {
    [REQ_IDLE] = B(REQ_PENDING),
    [REQ_PENDING] = B(REQ_IDLE),
};
static const struct spot_fsm req_fsm = {
    "checkpoint request", req_names, REQ_STATE_LAST, req_legal, 0,
    SPOT_LOG_DEBUG};

const char *
req_state_name(enum req_state s)
{
  return spot_fsm_name(&req_fsm, (unsigned)s);
}

/* The only way the request's state changes. A move is logged at debug
 * level only: one happens at every periodic checkpoint. */
#define req_set_state(d, s) req_set_state_at((d), (s), __FILE__, __LINE__)
static bool
req_set_state_at(struct spotd *d, enum req_state s, const char *file, int line)
{
  int r = spot_fsm_move_detail(&req_fsm, d->req.state, s, file, line,
                               "seq=%llu", (unsigned long long)d->req.seq);

  if (r > 0)
    d->req.state = s;
  return r >= 0;
}

bool
request_pending(const struct spotd *d)
{
  return d->req.state == REQ_PENDING;
}

/* A u64 of the file at off, 0 or negative errno. */
static int
slot_store(struct spotd *d, off_t off, uint64_t v)
{
  if (d->req.fd < 0)
    return 0;
  return pwrite(d->req.fd, &v, sizeof(v), off) == (ssize_t)sizeof(v) ? 0 : -EIO;
}

/* The u64 at off; 0 when there is none (no file, or cut short). */
static uint64_t
slot_load(const struct spotd *d, off_t off)
{
  uint64_t v = 0;

  if (d->req.fd < 0 || pread(d->req.fd, &v, sizeof(v), off) != sizeof(v))
    return 0;
  return v;
}

/* seq and served as spotd has them: served is seq once the request is
 * over. */
static void
counters(const struct ckpt_req *q, uint64_t v[2])
{
  v[0] = q->seq;
  v[1] = q->state == REQ_PENDING && q->seq > 0 ? q->seq - 1 : q->seq;
}

/* seq and served as spotd has them, in one write. */
static void
store_counters(struct spotd *d)
{
  struct ckpt_req *q = &d->req;
  uint64_t v[2];

  counters(q, v);
  if (q->fd >= 0 &&
      pwrite(q->fd, v, sizeof(v), SPOT_REQ_OFF_SEQ) != (ssize_t)sizeof(v))
    log_debug("writing the request file: %s", strerror(errno));
}

/* The header; 0 or negative errno. */
static int
store_header(int fd)
{
  char h[16] = SPOT_REQ_MAGIC;
  uint32_t version = SPOT_REQ_VERSION;

  memcpy(h + SPOT_REQ_OFF_VERSION, &version, sizeof(version));
  return pwrite(fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) ? 0 : -EIO;
}

/* Puts the file back as spotd wrote it when someone else changed its
 * size, header, seq, served or deadline (the trainer's slots are
 * theirs); warns
 * once. */
static void
repair(struct spotd *d)
{
  struct ckpt_req *q = &d->req;
  char h[32], want[32] = SPOT_REQ_MAGIC;
  uint32_t version = SPOT_REQ_VERSION;
  uint64_t v[2];
  struct stat st;

  if (q->fd < 0 || fstat(q->fd, &st) < 0)
    return;
  counters(q, v);
  memcpy(want + SPOT_REQ_OFF_VERSION, &version, sizeof(version));
  memcpy(want + SPOT_REQ_OFF_SEQ, v, sizeof(v));
  if (st.st_size == SPOT_REQ_FILE_SIZE &&
      pread(q->fd, h, sizeof(h), 0) == (ssize_t)sizeof(h) &&
      memcmp(h, want, 12) == 0 &&
      memcmp(h + SPOT_REQ_OFF_SEQ, want + SPOT_REQ_OFF_SEQ, 16) == 0 &&
      slot_load(d, SPOT_REQ_OFF_DEADLINE) == (uint64_t)q->deadline_ms)
    return;
  if (!q->tampered)
    spotd_warn(d,
               "the checkpoint request file %s was changed by another "
               "process (now %lld bytes); spotd writes it back",
               q->path, (long long)st.st_size);
  q->tampered = true;
  if (st.st_size != SPOT_REQ_FILE_SIZE &&
      ftruncate(q->fd, SPOT_REQ_FILE_SIZE) < 0)
    log_debug("restoring the request file's size: %s", strerror(errno));
  (void)store_header(q->fd);
  store_counters(d);
  (void)slot_store(d, SPOT_REQ_OFF_DEADLINE, (uint64_t)q->deadline_ms);
}

/* Whether the path still names spotd's file (not one renamed over it). */
static bool
path_is_ours(const struct ckpt_req *q)
{
  struct stat a, b;

  return fstat(q->fd, &a) == 0 && lstat(q->path, &b) == 0 &&
         a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

int
request_open(struct spotd *d)
{
  struct ckpt_req *q = &d->req;
  char abs[PATH_MAX], tmp[PATH_MAX + 8];
  struct stat st;
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
  fd = open(q->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
            SPOT_REQ_FILE_MODE);
  if (fd < 0 || ftruncate(fd, SPOT_REQ_FILE_SIZE) < 0 ||
      fchmod(fd, SPOT_REQ_FILE_MODE) < 0 || store_header(fd) < 0 ||
      fstat(fd, &st) < 0) {
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
  /* Mapped only to learn how /proc/PID/maps names the file; never read
   * or written through (a truncation would kill spotd). */
  m = mmap(NULL, SPOT_REQ_FILE_SIZE, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED ||
      spot_proc_self_map_id(m, q->map_id, sizeof(q->map_id)) < 0) {
    spotd_warn(d, "cannot map %s: %s; only the signal asks the trainer",
               q->path, strerror(errno));
    if (m != MAP_FAILED)
      munmap(m, SPOT_REQ_FILE_SIZE);
    close(fd);
    (void)unlink(q->path);
    q->path[0] = '\0';
    return 0;
  }
  q->fd = fd;
  q->map = m;
  snprintf(q->env_id, sizeof(q->env_id), "%llu:%llu",
           (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
  return uv_timer_init(d->loop, &q->resend);
}

void
request_close(struct spotd *d)
{
  struct ckpt_req *q = &d->req;

  if (q->timeout.loop != NULL && !uv_is_closing((uv_handle_t *)&q->timeout)) {
    uv_timer_stop(&q->timeout);
    uv_close((uv_handle_t *)&q->timeout, NULL);
  }
  if (q->resend.loop != NULL && !uv_is_closing((uv_handle_t *)&q->resend)) {
    uv_timer_stop(&q->resend);
    uv_close((uv_handle_t *)&q->resend, NULL);
  }
}

void
request_fini(struct spotd *d)
{
  struct ckpt_req *q = &d->req;

  free(q->procs); /* kept by the scans, with or without the file */
  q->procs = NULL;
  q->nprocs = 0;
  if (q->map == NULL)
    return;
  munmap(q->map, SPOT_REQ_FILE_SIZE);
  q->map = NULL;
  /* Only our own file: another spotd may have taken the name since. */
  if (path_is_ours(q))
    (void)unlink(q->path);
  close(q->fd);
  q->fd = -1;
}

void
request_trainer_starts(struct spotd *d)
{
  d->req.seq = 0;
  d->req.nprocs = 0; /* another tree */
  store_counters(d);
  (void)slot_store(d, SPOT_REQ_OFF_DEADLINE, (uint64_t)d->req.deadline_ms);
  (void)slot_store(d, SPOT_REQ_OFF_POLLS, 0);
  (void)slot_store(d, SPOT_REQ_OFF_ATTACHED, 0);
}

const char *
request_file(const struct spotd *d)
{
  return d->req.map != NULL ? d->req.path : NULL;
}

const char *
request_file_id(const struct spotd *d)
{
  return d->req.map != NULL ? d->req.env_id : NULL;
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
  unsigned unsteady; /* catchers not seen catching for REQ_STEADY_MS */
};

/* What spotd remembers of a process between scans, keyed by pid and
 * start time; the request it got the signal for is its generation, so a
 * new request needs no reset and the table has no cap but the tree's. */
struct req_proc {
  pid_t pid;
  int sent_sig; /* enum spot_proc_sig when it got the signal */
  uint64_t start;
  uint64_t since_ms; /* seen catching without a break since (catching) */
  uint64_t sent_seq; /* the request it got the signal for; 0 none */
  bool catching;
};

static int
proc_cmp(const void *a, const void *b)
{
  pid_t x = ((const struct req_proc *)a)->pid;
  pid_t y = ((const struct req_proc *)b)->pid;

  return (x > y) - (x < y);
}

/* p's entry of the last scan (sorted by pid), or NULL. */
static const struct req_proc *
proc_find(const struct ckpt_req *q, const struct spot_proc *p)
{
  struct req_proc key;
  const struct req_proc *e;

  if (q->nprocs == 0)
    return NULL;
  memset(&key, 0, sizeof(key));
  key.pid = p->pid;
  e = bsearch(&key, q->procs, q->nprocs, sizeof(key), proc_cmp);
  return e != NULL && e->start == p->start ? e : NULL;
}

/* One process of the scan: counts it in lk and signals it when due; e is
 * its entry, carried over from the last scan. */
static void
look_one(struct spotd *d, const struct spot_proc *p, struct req_proc *e,
         bool send, bool count_served, uint64_t now, struct look *lk)
{
  struct ckpt_req *q = &d->req;
  int st = spot_proc_sigstate(p, d->cfg->signal);
  bool takes = st == SPOT_PROC_SIG_CAUGHT || st == SPOT_PROC_SIG_IGNORED;

  if (st == SPOT_PROC_SIG_CAUGHT) {
    if (!e->catching)
      e->since_ms = now;
    e->catching = true;
  } else {
    e->catching = false;
  }
  if ((takes || count_served) && q->map != NULL &&
      spot_proc_maps_id(p, q->map_id) == 1) {
    lk->served++;
    return;
  }
  if (!takes || (d->cfg->signal_target == SPOT_CONFIG_TARGET_LEADER &&
                 !spot_child_is_leader(&d->trainer, p)))
    return;
  if (st == SPOT_PROC_SIG_CAUGHT)
    lk->caught++;
  else
    lk->ignored++;
  if (st == SPOT_PROC_SIG_CAUGHT && now - e->since_ms < REQ_STEADY_MS) {
    lk->unsteady++;
    return; /* maybe a child between fork and exec: next scan */
  }
  /* once per request; again to one that ignored it and now catches it */
  if (!send || (e->sent_seq == q->seq && e->sent_sig >= st) ||
      spot_proc_kill(p, d->cfg->signal) < 0)
    return;
  lk->sent++;
  log_debug("checkpoint signal sent to pid=%d (%s)", (int)p->pid,
            st == SPOT_PROC_SIG_CAUGHT ? "catches it" : "ignores it");
  e->sent_seq = q->seq;
  e->sent_sig = st;
}

static int
tree_look(struct spotd *d, bool send, bool count_served, struct look *lk)
{
  struct ckpt_req *q = &d->req;
  struct req_proc *next;
  size_t nnext = 0;
  uint64_t now = spot_now_mono_ms();
  struct spot_proc *v;
  size_t n;
  int r;

  memset(lk, 0, sizeof(*lk));
  r = spot_child_tree(&d->trainer, &v, &n);
  if (r < 0)
    return r;
  next = calloc(n > 0 ? n : 1, sizeof(*next));
  if (next == NULL) {
    free(v);
    return -ENOMEM; /* nothing sent: the next tick looks again */
  }
  for (size_t i = 0; i < n; i++) {
    const struct req_proc *old = proc_find(q, &v[i]);
    struct req_proc e;

    memset(&e, 0, sizeof(e));
    if (old != NULL)
      e = *old;
    e.pid = v[i].pid;
    e.start = v[i].start;
    look_one(d, &v[i], &e, send, count_served, now, lk);
    /* kept while it catches (its steadiness) or got this request */
    if (e.catching || (e.sent_seq != 0 && e.sent_seq == q->seq))
      next[nnext++] = e;
  }
  free(v);
  qsort(next, nnext, sizeof(*next), proc_cmp);
  free(q->procs);
  q->procs = next;
  q->nprocs = nnext;
  return 0;
}

static void
resend_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, req.resend);
  struct look lk;

  if (d->closing || d->req.state != REQ_PENDING)
    return;
  repair(d);
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

  repair(d); /* as it was left: anything else was written by another */
  q->seq++;
  req_set_state(d, REQ_PENDING);
  (void)slot_store(d, SPOT_REQ_OFF_DEADLINE, (uint64_t)q->deadline_ms);
  store_counters(d);
  if (q->map != NULL && !path_is_ours(q))
    spotd_warn(d,
               "%s is no longer spotd's checkpoint request file (replaced or "
               "removed): a process that starts now takes the signal",
               q->path);
  if (tree_look(d, true, true, &lk) < 0)
    memset(&lk, 0, sizeof(lk));
  *helpers = lk.served;
  *caught = lk.caught;
  *sent = lk.sent;
  if (lk.unsteady > 0)
    log_info("checkpoint signal: %u process%s began catching it since the "
             "last look: sent in %d ms if %s still catch%s it (a child "
             "between fork and exec would die of it)",
             lk.unsteady, lk.unsteady == 1 ? "" : "es", REQ_RESEND_MS,
             lk.unsteady == 1 ? "it" : "they", lk.unsteady == 1 ? "es" : "");
  if (q->resend.loop != NULL)
    uv_timer_start(&q->resend, resend_cb, REQ_RESEND_MS, REQ_RESEND_MS);
}

void
request_set_deadline(struct spotd *d, int64_t wall_ms)
{
  d->req.deadline_ms = wall_ms > 0 ? wall_ms : 0;
  (void)slot_store(d, SPOT_REQ_OFF_DEADLINE, (uint64_t)d->req.deadline_ms);
}

/* The request is over (served, dropped): back to REQ_IDLE, its timers
 * stopped. The one place a request ends. */
static void
request_end(struct spotd *d)
{
  struct ckpt_req *q = &d->req;

  if (q->state != REQ_PENDING)
    return;
  req_set_state(d, REQ_IDLE);
  store_counters(d);
  if (q->resend.loop != NULL)
    uv_timer_stop(&q->resend);
  if (q->timeout.loop != NULL)
    uv_timer_stop(&q->timeout);
}

void
request_completed(struct spotd *d)
{
  if (!request_pending(d))
    return;
  d->req.last_save_ms = spot_now_mono_ms() - d->req.signal_mono;
  request_end(d);
}

void
request_drop(struct spotd *d)
{
  request_end(d);
}

static void
timeout_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, req.timeout);

  if (!d->closing && request_pending(d))
    spotd_request_timed_out(d); /* the driver decides: drop it or wait */
}

void
request_handles_init(struct spotd *d)
{
  uv_timer_init(d->loop, &d->req.timeout);
}

void
spotd_request_checkpoint(struct spotd *d, const char *why)
{
  unsigned helpers, caught, sent;
  char sig[16];

  if (!spot_child_running(&d->trainer) || d->closing)
    return;
  if (request_pending(d)) {
    log_info("checkpoint requested (%s): one is already in progress", why);
    return;
  }
  request_begin(d, &helpers, &caught, &sent);
  d->req.signal_mono = spot_now_mono_ms();
  hist_requested(d, why);
  log_info("checkpoint requested (%s): request %llu; %u process%s of the "
           "trainer read%s it; SIG%s sent to %u (%u catch%s it) (%s)",
           why, (unsigned long long)d->req.seq, helpers,
           helpers == 1 ? "" : "es", helpers == 1 ? "s" : "",
           spot_config_signal_name(d->cfg->signal, sig, sizeof(sig)), sent,
           caught, caught == 1 ? "es" : "",
           spot_config_signal_target_name(d->cfg->signal_target));
  if (caught == 0 && helpers == 0)
    log_info("no process of the trainer catches the signal or reads the "
             "request file yet: the request waits in the file, and the "
             "signal goes to a process once it catches it");
  if (d->cfg->ckpt_timeout_ms > 0 && d->req.timeout.loop != NULL)
    uv_timer_start(&d->req.timeout, timeout_cb, d->cfg->ckpt_timeout_ms, 0);
}

bool
request_no_step(struct spotd *d)
{
  struct look lk;

  if (d->req.map == NULL || slot_load(d, SPOT_REQ_OFF_ATTACHED) == 0 ||
      slot_load(d, SPOT_REQ_OFF_POLLS) != 0)
    return false;
  /* No process the helper does not serve may catch the signal: such a
   * process may have stepped without polling. */
  return tree_look(d, false, false, &lk) == 0 && lk.caught == 0;
}
