/* Multi-node jobs (nranks > 1): the job is preempted as one, through the
 * store only (no port, any scheduler; docs/slurm.md "Multi-node jobs").
 *
 *   fan-out       the rank whose metadata shows a notice PUTs
 *                 ROOT/notices/RUN (If-None-Match: *: the first notice of
 *                 the run stays) holding its reason, deadline and rank.
 *                 Every rank GETs that object every min(poll interval,
 *                 1 s) while its trainer runs (enum fanout_state) and,
 *                 once it is there, drains as for its own notice, with
 *                 the same reason and deadline.
 *   relaunch once before its relaunch step a rank PUTs
 *                 ROOT/relaunched/RUN/REASON with If-None-Match: *; only
 *                 the rank whose PUT created it runs the step, the others
 *                 say so. Ranks > 0 PUT later (a quarter of the time left,
 *                 at most 30 s; 2 s without a deadline): rank 0, which
 *                 moves LATEST after the commit, normally wins.
 *   peer loss     a trainer that fails while running is checked against
 *                 the job's notice first: a peer's preemption ends this
 *                 rank like its own (exit 75 once a checkpoint of the job
 *                 is committed), not as a failed trainer.
 *
 * RUN names this run of the job (--run-id, else SLURM_JOB_ID and
 * SLURM_RESTART_COUNT, else the run the ranks agreed through the store,
 * runjoin.c), so a requeued run never sees the notice of the run before
 * it. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "fanout.h"
#include "core/fsm.h"
#include "core/log.h"
#include "spotd.h"
#include "core/util.h"

#define FANOUT_POLL_MAX_MS 1000
/* Ranks > 0 leave the relaunch to rank 0 this long: a quarter of the time
 * left before the deadline (at most CLAIM_DELAY_MAX_MS), else
 * CLAIM_DELAY_MS. */
#define CLAIM_DELAY_MS 2000
#define CLAIM_DELAY_MAX_MS 30000

static const char *const names[] = {
    "idle", "waiting", "polling", "seen", "closed",
};
_Static_assert(SPOT_ARRAY_SIZE(names) == FANOUT_STATE_LAST, "names");

static const struct spot_fsm fanout_fsm = {"fan-out", names, FANOUT_STATE_LAST,
                                           NULL,      0,     SPOT_LOG_DEBUG};

#define set_state(d, s) set_state_at((d), (s), __FILE__, __LINE__)
static void
set_state_at(struct spotd *d, enum fanout_state s, const char *file, int line)
{
  if (spot_fsm_move(&fanout_fsm, d->fan.state, s, file, line) > 0)
    d->fan.state = s;
}

/* Whether this spotd shares its notices with other ranks. */
static bool
enabled(const struct spotd *d)
{
  return d->store.nranks > 1 && d->s3 != NULL && !d->closing;
}

static bool
run_id_valid(const char *s)
{
  size_t n = strlen(s);

  if (n == 0 || n > 64 || s[0] == '.')
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
          (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '-' ||
          s[i] == '_'))
      return false;
  return true;
}

/* This run's id, computed once. */
const char *
fanout_run_id(struct spotd *d)
{
  struct fanout *f = &d->fan;
  const char *job = getenv("SLURM_JOB_ID"), *rc = getenv("SLURM_RESTART_COUNT");

  if (f->run[0] != '\0')
    return f->run;
  if (d->cfg->run_id != NULL)
    spot_strlcpy(f->run, d->cfg->run_id, sizeof(f->run));
  else if (job != NULL && job[0] != '\0')
    snprintf(f->run, sizeof(f->run), "%s.%s", job,
             rc != NULL && rc[0] != '\0' ? rc : "0");
  else /* runjoin.c sets it before launch; a store error fails the start */
    snprintf(f->run, sizeof(f->run), "r%lld", (long long)d->restarts.count);
  if (!run_id_valid(f->run)) {
    spotd_warn(d, "run id '%.64s' is not 1-64 of [A-Za-z0-9._-]: using r0",
               f->run);
    spot_strlcpy(f->run, "r0", sizeof(f->run));
  }
  return f->run;
}

static char *
notice_key(struct spotd *d)
{
  char rel[96];

  snprintf(rel, sizeof(rel), "notices/%s", fanout_run_id(d));
  return spot_store_key_dup(&d->store, NULL, rel);
}

/* -------------------------------------------------------- publishing */

static void
publish_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;

  d->fan.put_op = NULL;
  if (d->closing || res->err == -ECANCELED)
    return;
  if (res->err == 0)
    log_info("job-wide notice published for run %s (rank %u)", d->fan.run,
             d->store.rank);
  else if (res->err == -EEXIST)
    log_info("job-wide notice of run %s already published by another rank",
             d->fan.run);
  else
    spotd_warn(d, "cannot publish the notice to the other ranks: %s",
               res->message[0] ? res->message : strerror(-res->err));
}

static void
publish(struct spotd *d)
{
  struct fanout *f = &d->fan;
  char *key;
  int r = -ENOMEM;

  if (!enabled(d) || f->published || !f->pending)
    return;
  f->published = true;
  snprintf(f->put_body, sizeof(f->put_body),
           "reason=%s\ndeadline_ms=%lld\nrank=%u\nat_ms=%lld\n",
           f->notice.reason, (long long)f->notice.deadline_wall_ms,
           d->store.rank, (long long)f->notice_wall_ms);
  key = notice_key(d);
  if (key != NULL)
    r = spot_s3_put(d->s3, d->store.bucket, key, f->put_body,
                    strlen(f->put_body), SPOT_S3_IF_NONE_MATCH, publish_cb, d,
                    &f->put_op);
  free(key);
  if (r < 0)
    spotd_warn(d, "cannot publish the notice to the other ranks: %s",
               strerror(-r));
}

void
fanout_publish(struct spotd *d, const struct spot_notice *n)
{
  struct fanout *f = &d->fan;

  if (d->store.nranks <= 1 || f->pending || n->kind == SPOT_NOTICE_REBALANCE)
    return;
  f->notice = *n;
  f->pending = true;
  f->notice_wall_ms = spot_now_wall_ms();
  publish(d); /* else at fanout_start(), once the store is there */
}

/* ----------------------------------------------------------- polling */

/* "reason=R\ndeadline_ms=N\nrank=K\nat_ms=T\n" -> n; -EBADMSG when it
 * is not. */
static int
parse_notice(const char *s, struct spot_notice *n, unsigned *rank,
             int64_t *at_ms)
{
  char reason[SPOT_NOTICE_REASON_MAX];
  long long deadline, at;
  unsigned k;

  if (sscanf(s, "reason=%31[a-z0-9-]\ndeadline_ms=%lld\nrank=%u\nat_ms=%lld",
             reason, &deadline, &k, &at) != 4 ||
      deadline < 0 || at < 0)
    return -EBADMSG;
  *at_ms = at;
  memset(n, 0, sizeof(*n));
  n->provider = SPOT_PROVIDER_NONE;
  n->kind = SPOT_NOTICE_TERMINATE;
  n->deadline_wall_ms = deadline;
  if (deadline > 0)
    spot_notice_set_mono(n, spot_now_mono_ms(), spot_now_wall_ms());
  spot_strlcpy(n->reason, reason, sizeof(n->reason));
  snprintf(n->id, sizeof(n->id), "rank-%u", k);
  *rank = k;
  return 0;
}

static void poll_cb(uv_timer_t *t);

static void
get_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  struct fanout *f = &d->fan;
  struct spot_notice n;
  unsigned rank = 0;
  int64_t at = 0;
  bool exit_check = f->exit_check;

  f->get_op = NULL;
  if (d->closing || res->err == -ECANCELED) {
    set_state(d, FANOUT_CLOSED);
    return;
  }
  f->exit_check = false;
  if (res->err == 0 &&
      parse_notice(spot_buf_str(&f->body), &n, &rank, &at) < 0) {
    spotd_warn(d, "the job-wide notice of run %s is unreadable: ignored",
               f->run);
  } else if (res->err == 0) {
    set_state(d, FANOUT_SEEN);
    uv_timer_stop(&f->timer);
    log_notice("job-wide notice from rank %u: %s, seen %.3f s after that "
               "rank's notice%s",
               rank, n.reason, (double)(spot_now_wall_ms() - at) / 1000.0,
               exit_check ? " (the trainer died: a peer went away)" : "");
    if (exit_check)
      f->peer_lost = true;
    f->peer_notice_wall_ms = at;
    spotd_job_notice(d, &n);
    return;
  } else if (res->err != -ENOENT && !f->warned) {
    f->warned = true;
    spotd_warn(d, "cannot read the job-wide notice: %s",
               res->message[0] ? res->message : strerror(-res->err));
  }
  set_state(d, FANOUT_WAITING);
  if (exit_check) {
    f->exit_checked = true;
    spotd_trainer_exited(d);
  }
}

/* One GET of the job-wide notice; 0 when it is in flight. */
static int
poll_once(struct spotd *d)
{
  struct fanout *f = &d->fan;
  char *key;
  int r = -ENOMEM;

  if (f->get_op != NULL)
    return 0;
  if (!enabled(d))
    return -ECANCELED;
  spot_buf_reset(&f->body);
  key = notice_key(d);
  if (key != NULL)
    r = spot_s3_get(d->s3, d->store.bucket, key, 0, 0, NULL, &f->body, get_cb,
                    d, &f->get_op);
  free(key);
  if (r < 0) {
    f->get_op = NULL;
    return r;
  }
  set_state(d, FANOUT_POLLING);
  return 0;
}

static void
poll_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, fan.timer);

  if (d->closing || d->eng.state != SPOTD_RUNNING)
    return;
  (void)poll_once(d);
}

void
fanout_start(struct spotd *d)
{
  struct fanout *f = &d->fan;
  uint64_t every = d->cfg->poll_interval_ms;

  if (!enabled(d))
    return;
  if (every == 0 || every > FANOUT_POLL_MAX_MS)
    every = FANOUT_POLL_MAX_MS;
  log_info("multi-node: rank %u of %u, run %s: job-wide notices every %" PRIu64
           " ms",
           d->store.rank, d->store.nranks, fanout_run_id(d), every);
  publish(d);
  set_state(d, FANOUT_WAITING);
  uv_timer_start(&f->timer, poll_cb, every, every);
}

bool
fanout_exit_check(struct spotd *d)
{
  struct fanout *f = &d->fan;

  if (!enabled(d) || f->exit_checked || f->state == FANOUT_SEEN || f->pending)
    return false;
  log_info("the trainer failed: checking for a peer's notice first");
  f->exit_check = true;
  if (poll_once(d) < 0) {
    f->exit_check = false;
    f->exit_checked = true;
    return false;
  }
  return true; /* get_cb() goes on */
}

/* ----------------------------------------------------- relaunch once */

static void claim_cb(const struct spot_s3_result *res, void *data);

static char *
claim_key(struct spotd *d)
{
  char rel[512];

  /* Per (run, reason), not per checkpoint: a rank whose trainer died on
   * the lost peer may not know the job's newest commit yet, and the
   * marker must be one for the whole job. */
  snprintf(rel, sizeof(rel), "relaunched/%s/%s", fanout_run_id(d),
           d->eng.reason[0] ? d->eng.reason : "none");
  return spot_store_key_dup(&d->store, NULL, rel);
}

/* The relaunch claim: asked once, then won or lost. */
static const char *const claim_names[] = {
    "none", "waiting", "asking", "reading", "won", "lost",
};
_Static_assert(SPOT_ARRAY_SIZE(claim_names) == FANOUT_CLAIM_LOST + 1,
               "claim_names");
#define CB(s) SPOT_FSM_BIT(s)
static const uint32_t claim_legal[] = {
    [FANOUT_CLAIM_NONE] = CB(FANOUT_CLAIM_WAITING) | CB(FANOUT_CLAIM_ASKING),
    [FANOUT_CLAIM_WAITING] = CB(FANOUT_CLAIM_ASKING) | CB(FANOUT_CLAIM_WON),
    [FANOUT_CLAIM_ASKING] =
        CB(FANOUT_CLAIM_READING) | CB(FANOUT_CLAIM_WON) | CB(FANOUT_CLAIM_LOST),
    [FANOUT_CLAIM_READING] = CB(FANOUT_CLAIM_WON) | CB(FANOUT_CLAIM_LOST),
    [FANOUT_CLAIM_WON] = 0,
    [FANOUT_CLAIM_LOST] = 0,
};
static const struct spot_fsm claim_fsm = {
    "relaunch claim", claim_names, FANOUT_CLAIM_LOST + 1,
    claim_legal,      0,           SPOT_LOG_DEBUG};

#define claim_set_state(d, s) claim_set_state_at((d), (s), __FILE__, __LINE__)
static void
claim_set_state_at(struct spotd *d, enum fanout_claim s, const char *file,
                   int line)
{
  if (spot_fsm_move(&claim_fsm, d->fan.claim_state, s, file, line) > 0)
    d->fan.claim_state = s;
}

static void
claimed(struct spotd *d, bool run_it)
{
  claim_set_state(d, run_it ? FANOUT_CLAIM_WON : FANOUT_CLAIM_LOST);
  spotd_relaunch_claimed(d, run_it);
}

static void
claim_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  struct fanout *f = &d->fan;
  bool reading = f->claim_state == FANOUT_CLAIM_READING;
  char *key;

  f->claim_op = NULL;
  if (d->closing || res->err == -ECANCELED)
    return;
  if (!reading && res->err == -EEXIST && res->retries > 0) {
    /* A retried PUT said 412: maybe our first attempt created it. */
    claim_set_state(d, FANOUT_CLAIM_READING);
    spot_buf_reset(&f->claim_body);
    key = claim_key(d);
    if (key != NULL &&
        spot_s3_get(d->s3, d->store.bucket, key, 0, 0, NULL, &f->claim_body,
                    claim_cb, d, &f->claim_op) == 0) {
      free(key);
      return;
    }
    free(key);
  }
  if (reading && res->err == 0 &&
      strcmp(spot_buf_str(&f->claim_body), f->claim_mine) == 0) {
    claimed(d, true);
  } else if (res->err == 0 && !reading) {
    log_info("relaunch: this rank (%u) runs the job's relaunch step",
             d->store.rank);
    claimed(d, true);
  } else if (res->err == -EEXIST || reading) {
    log_notice("relaunch: another rank already ran the job's relaunch step "
               "for checkpoint %s (%s): not running it again",
               d->last_commit[0] ? d->last_commit : "none", d->eng.reason);
    claimed(d, false);
  } else {
    spotd_warn(d,
               "relaunch: cannot write the job-wide relaunch marker (%s): "
               "running the step anyway",
               res->message[0] ? res->message : strerror(-res->err));
    claimed(d, true);
  }
}

/* PUT the marker; 0 when it is in flight (claim_cb() follows). */
static int
claim_put(struct spotd *d)
{
  struct fanout *f = &d->fan;
  char *key;
  int r = -ENOMEM;

  snprintf(f->claim_mine, sizeof(f->claim_mine), "rank=%u\npid=%ld\n",
           d->store.rank, (long)getpid());
  key = claim_key(d);
  if (key != NULL)
    r = spot_s3_put(d->s3, d->store.bucket, key, f->claim_mine,
                    strlen(f->claim_mine), SPOT_S3_IF_NONE_MATCH, claim_cb, d,
                    &f->claim_op);
  free(key);
  if (r < 0) {
    f->claim_op = NULL;
    return r;
  }
  claim_set_state(d, FANOUT_CLAIM_ASKING);
  return 0;
}

static void
claim_timer_cb(uv_timer_t *t)
{
  struct spotd *d = spot_container_of(t, struct spotd, fan.claim_timer);

  if (d->closing || d->fan.claim_state != FANOUT_CLAIM_WAITING)
    return;
  if (claim_put(d) < 0)
    claimed(d, true); /* cannot ask: run the step */
}

int
fanout_claim_relaunch(struct spotd *d)
{
  struct fanout *f = &d->fan;
  uint64_t delay = CLAIM_DELAY_MS, left = spotd_ms_left(d);

  if (!enabled(d) || f->claim_state != FANOUT_CLAIM_NONE)
    return 1;
  if (d->store.rank == 0)
    return claim_put(d) < 0 ? 1 : 0;
  /* Rank 0 moves LATEST after the commit the others wait for: let it
   * relaunch first, so a requeue does not stop it mid-way; claim after a
   * delay in case rank 0 is gone. */
  if (left != UINT64_MAX)
    delay = left / 4 < CLAIM_DELAY_MAX_MS ? left / 4 : CLAIM_DELAY_MAX_MS;
  claim_set_state(d, FANOUT_CLAIM_WAITING);
  log_info("relaunch: rank %u leaves the relaunch step to rank 0 for %.1f s",
           d->store.rank, (double)delay / 1000.0);
  uv_timer_start(&f->claim_timer, claim_timer_cb, delay, 0);
  return 0;
}

/* ------------------------------------------------------------- close */

void
fanout_init(struct spotd *d)
{
  uv_timer_init(d->loop, &d->fan.timer);
  uv_timer_init(d->loop, &d->fan.claim_timer);
  spot_buf_init(&d->fan.body, 1024);
  spot_buf_init(&d->fan.claim_body, 1024);
}

void
fanout_close(struct spotd *d)
{
  struct fanout *f = &d->fan;

  set_state(d, FANOUT_CLOSED);
  if (f->get_op != NULL)
    spot_s3_cancel(f->get_op);
  if (f->put_op != NULL)
    spot_s3_cancel(f->put_op);
  if (f->claim_op != NULL)
    spot_s3_cancel(f->claim_op);
  if (f->timer.loop != NULL && !uv_is_closing((uv_handle_t *)&f->timer)) {
    uv_timer_stop(&f->timer);
    uv_close((uv_handle_t *)&f->timer, NULL);
  }
  if (f->claim_timer.loop != NULL &&
      !uv_is_closing((uv_handle_t *)&f->claim_timer)) {
    uv_timer_stop(&f->claim_timer);
    uv_close((uv_handle_t *)&f->claim_timer, NULL);
  }
}

void
fanout_fini(struct spotd *d)
{
  spot_buf_fini(&d->fan.body);
  spot_buf_fini(&d->fan.claim_body);
}
