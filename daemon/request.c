/* The checkpoint request as the trainer's processes see it (enum
 * req_state: IDLE -> PENDING -> IDLE).
 *
 * Two channels, so that every process of the job learns of a request
 * whatever its session, process group or threads:
 *
 *  - The request file (README "Trainer contract"): 4096 bytes next to the
 *    control socket, mapped by spotd and by the Python helper of every
 *    process that imports it (SPOTD_REQUEST_FILE). spotd counts requests
 *    in `seq` and sets `served` to it when the request is over; a process
 *    has a request to take when seq > served and it has not taken seq
 *    yet. Reading it is a load from shared memory (no system call), a
 *    request made before a process could look is still there when it
 *    does, and a mapping survives fork (and exec maps it again). The
 *    helper counts its imports in `attached` and its polls in `polls`:
 *    spotd reads polls as "the trainer has made a step since it
 *    started". It maps the file for good at its first poll, so a process
 *    that imports the helper for other things and takes the signal itself
 *    still gets the signal.
 *
 *  - The checkpoint signal, for trainers without the helper: sent to each
 *    process of the trainer's tree (child.c: every session, orphans
 *    included) that takes it: catches it (SigCgt), or blocks it without
 *    ignoring it (a sigwait or signalfd loop). Never to one that would die
 *    of it or ignores it, never to one the helper serves (it has polled:
 *    it maps the request file), and again, while the request is pending,
 *    to a process that starts taking it. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
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

static void
req_set_state(struct spotd *d, enum req_state s)
{
  if (d->req.state == s)
    return;
  log_debug("checkpoint request %s -> %s seq=%llu", req_names[d->req.state],
            req_names[s], (unsigned long long)d->req.seq);
  d->req.state = s;
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

static bool
was_sent(const struct ckpt_req *q, const struct spot_proc *p)
{
  for (size_t i = 0; i < q->nsent; i++)
    if (q->sent[i].pid == p->pid && q->sent[i].start == p->start)
      return true;
  return false;
}

/* The processes of the tree that get the signal: they catch it, the
 * helper does not serve them, the target allows them, and (send) they did
 * not get it for this request yet. Sends it when send, else only counts.
 * In *served, how many processes map the request file (the helper serves
 * them), counted only when served is not NULL (it reads every process's
 * maps, not only the catchers'). */
static int
tree_look(struct spotd *d, bool send, unsigned *served)
{
  struct ckpt_req *q = &d->req;
  struct spot_proc *v;
  size_t n;
  int sig = d->cfg->signal, r, count = 0;

  r = spot_child_tree(&d->trainer, &v, &n);
  if (r < 0)
    return r;
  if (served != NULL)
    *served = 0;
  for (size_t i = 0; i < n; i++) {
    const struct spot_proc *p = &v[i];
    bool catches = spot_proc_takes(p, sig) == 1;

    if ((catches || served != NULL) && q->map != NULL &&
        spot_proc_maps_file(p, q->maps_path) == 1) {
      if (served != NULL)
        (*served)++;
      continue;
    }
    if (!catches || (send && was_sent(q, p)))
      continue;
    if (d->cfg->signal_target == SPOT_CONFIG_TARGET_LEADER &&
        !spot_child_is_leader(&d->trainer, p))
      continue;
    if (!send) {
      count++;
      continue;
    }
    if (spot_proc_kill(p, sig) < 0)
      continue;
    count++;
    log_debug("checkpoint signal sent to pid=%d", (int)p->pid);
    if (q->nsent < SPOT_ARRAY_SIZE(q->sent))
      q->sent[q->nsent++] = *p;
  }
  free(v);
  return count;
}

static void
resend_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, req.resend);
  int n;

  if (d->closing || d->req.state != REQ_PENDING)
    return;
  n = tree_look(d, true, NULL);
  if (n > 0)
    log_info("checkpoint signal sent to %d more process%s that now catch%s "
             "it",
             n, n == 1 ? "" : "es", n == 1 ? "es" : "");
}

int
request_begin(struct spotd *d, unsigned *helpers)
{
  struct ckpt_req *q = &d->req;
  int n;

  q->seq++;
  q->nsent = 0;
  slot_store(d, REQ_SLOT_SEQ, q->seq);
  req_set_state(d, REQ_PENDING);
  n = tree_look(d, true, helpers);
  if (q->resend.loop != NULL)
    uv_timer_start(&q->resend, resend_cb, REQ_RESEND_MS, REQ_RESEND_MS);
  return n < 0 ? 0 : n;
}

void
request_end(struct spotd *d)
{
  struct ckpt_req *q = &d->req;

  d->ckpt_requested = false;
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
  if (d->req.map == NULL || slot_load(d, REQ_SLOT_ATTACHED) == 0 ||
      slot_load(d, REQ_SLOT_POLLS) != 0)
    return false;
  /* No process the helper does not serve may take the signal: such a
   * process may have stepped without polling. */
  return tree_look(d, false, NULL) == 0;
}
