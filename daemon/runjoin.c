/* The run id of a multi-node job outside Slurm (no --run-id, no
 * SLURM_JOB_ID), agreed through the store so that every rank of one start
 * of the job names the same run, in any start order and across any number
 * of restarts, and a rank restarted alone joins the run its peers are in.
 *
 * A run is a generation G. Under ROOT/runs/G/ (G zero-padded, so the keys
 * sort by run) each rank K writes only its own objects:
 *
 *   rank-K   K joined run G
 *   left-K   K's spotd left run G (it exited: a crash, a stop, the end)
 *   over     K ended run G as a preemption (exit 75 or 76): the notice
 *            reached every rank, the run is over for the job
 *
 * At start a rank lists ROOT/runs/ and looks at the newest run N that has
 * any object:
 *
 *   no run yet                          join run 1
 *   N is over                           join N + 1 (a new start of the job)
 *   N lacks rank-K                      join N (a peer opened it)
 *   a peer of N has not left it         join N (this rank restarted alone:
 *                                       its peers still run N)
 *   every peer of N left it             join N + 1 (a new start)
 *
 * So the ranks of one start of the job land in one run: the first one up
 * opens N + 1 once N is over or left by all, the others find it open, or
 * open it themselves with the same number when they list before the first
 * one's marker is visible; a rank that comes back while its peers still
 * run rejoins their run (and deletes its left-K there first, so it counts
 * as present again). A rank that joined a run its peers then leave follows
 * them at its own next start: the newest run is theirs, without its
 * marker. A spotd killed without a chance to write left-K (SIGKILL) counts
 * as still present: a start after every rank was killed that way rejoins
 * the run, in agreement. No object has two writers, so no conditional write
 * is needed. Once joined, a rank deletes its objects of the run before
 * (and the "over" of it), which keeps a handful of objects per rank and
 * never empties the newest run.
 *
 * The run names the job-wide notice (notices/RUN) and the relaunch claim,
 * so a restarted job never acts on the notice of the run before it; its
 * number less one is SPOTD_RESTART_COUNT on every rank. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsm.h"
#include "core/log.h"
#include "restarts.h"
#include "startup.h"
#include "runjoin.h"
#include "spotd.h"
#include "core/util.h"

#define RUNS_DIR "runs/"

static const char *const state_names[] = {
    [RUNJOIN_IDLE] = "idle",         [RUNJOIN_LISTING] = "listing",
    [RUNJOIN_CLEARING] = "clearing", [RUNJOIN_PUTTING] = "putting",
    [RUNJOIN_JOINED] = "joined",     [RUNJOIN_LEAVING] = "leaving",
    [RUNJOIN_LEFT_RUN] = "left",     [RUNJOIN_FAILED] = "failed",
};
_Static_assert(SPOT_ARRAY_SIZE(state_names) == RUNJOIN_STATE_LAST,
               "state_names");

static const struct spot_fsm runjoin_fsm = {
    "run join:", state_names, RUNJOIN_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

#define set_state(d, s) set_state_at((d), (s), __FILE__, __LINE__)
static void
set_state_at(struct spotd *d, enum runjoin_state s, const char *file, int line)
{
  if (spot_fsm_move(&runjoin_fsm, d->run.state, s, file, line) > 0)
    d->run.state = s;
}

/* Whether this spotd agrees its run id through the store. */
bool
runjoin_needed(const struct spotd *d)
{
  const char *job = getenv("SLURM_JOB_ID");

  return d->store.nranks > 1 && d->cfg->run_id == NULL &&
         (job == NULL || job[0] == '\0') && d->s3 != NULL && !d->run.joined;
}

static int
parse_rank(const char *s, unsigned *rank)
{
  char *end;
  unsigned long k;

  if (s[0] < '0' || s[0] > '9')
    return -1;
  errno = 0;
  k = strtoul(s, &end, 10);
  if (errno != 0 || *end != '\0' || k > UINT32_MAX)
    return -1;
  *rank = (unsigned)k;
  return 0;
}

/* "0000000012/rank-3" (after the runs prefix) -> run 12, rank 3, a
 * RUNJOIN_RANK; "…/left-3", "…/over" likewise (rank 0 for "over"); -1
 * when the key is none of them. */
int
runjoin_parse_key(const char *rel, uint64_t *run, unsigned *rank,
                  enum runjoin_mark *mark)
{
  char *end;
  unsigned long long g;
  unsigned k = 0;
  enum runjoin_mark m;

  if (rel[0] < '0' || rel[0] > '9')
    return -1;
  errno = 0;
  g = strtoull(rel, &end, 10);
  if (errno != 0 || end == rel || g == 0 || *end != '/')
    return -1;
  end++;
  if (strncmp(end, "rank-", 5) == 0 && parse_rank(end + 5, &k) == 0)
    m = RUNJOIN_RANK;
  else if (strncmp(end, "left-", 5) == 0 && parse_rank(end + 5, &k) == 0)
    m = RUNJOIN_LEFT;
  else if (strcmp(end, "over") == 0)
    m = RUNJOIN_OVER;
  else
    return -1;
  *run = g;
  *rank = k;
  *mark = m;
  return 0;
}

void
runjoin_decide_init(struct runjoin_scan *s)
{
  memset(s, 0, sizeof(*s));
}

/* One object seen by the LIST. */
void
runjoin_decide_add(struct runjoin_scan *s, uint64_t run, enum runjoin_mark mark,
                   unsigned rank, unsigned mine)
{
  if (run < s->newest)
    return;
  if (run > s->newest) {
    runjoin_decide_init(s);
    s->newest = run;
  }
  switch (mark) {
  case RUNJOIN_RANK:
    if (rank == mine)
      s->mine_in_newest = true;
    else
      s->peers++;
    break;
  case RUNJOIN_LEFT:
    if (rank == mine)
      s->mine_left = true;
    else
      s->peers_left++;
    break;
  case RUNJOIN_OVER:
    s->over = true;
    break;
  default:
    break;
  }
}

uint64_t
runjoin_decide(const struct runjoin_scan *s)
{
  if (s->newest == 0)
    return 1;
  if (s->over)
    return s->newest + 1;
  if (!s->mine_in_newest || s->peers > s->peers_left)
    return s->newest;
  return s->newest + 1;
}

static void list_page(struct spotd *d, const char *token);

static char *
mark_key(struct spotd *d, uint64_t run, const char *what, bool ranked)
{
  char rel[96];

  if (ranked)
    snprintf(rel, sizeof(rel), RUNS_DIR "%010" PRIu64 "/%s-%u", run, what,
             d->store.rank);
  else
    snprintf(rel, sizeof(rel), RUNS_DIR "%010" PRIu64 "/%s", run, what);
  return spot_store_key_dup(&d->store, NULL, rel);
}

static void
finish(struct spotd *d, int err)
{
  struct run_join *j = &d->run;

  free(j->prefix);
  j->prefix = NULL;
  j->op = NULL;
  set_state(d, err < 0 ? RUNJOIN_FAILED : RUNJOIN_JOINED);
  restore_joined(d, err);
}

static void
delete_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;

  d->run.del_op = NULL;
  if (res->err < 0 && res->err != -ECANCELED && !d->closing)
    log_info("run %s: the markers of the run before stay (%s)", d->fan.run,
             res->message[0] ? res->message : strerror(-res->err));
}

/* Best effort: our objects of the run before this one, and its "over". */
static void
delete_previous(struct spotd *d)
{
  struct run_join *j = &d->run;
  char *keys[3];
  size_t n = 0;

  if (j->run < 2)
    return;
  keys[n++] = mark_key(d, j->run - 1, "rank", true);
  keys[n++] = mark_key(d, j->run - 1, "left", true);
  keys[n++] = mark_key(d, j->run - 1, "over", false);
  if (keys[0] != NULL && keys[1] != NULL && keys[2] != NULL &&
      spot_s3_delete_objects(d->s3, d->store.bucket, (const char **)keys, n,
                             delete_cb, d, &j->del_op) < 0)
    j->del_op = NULL;
  for (size_t i = 0; i < n; i++)
    free(keys[i]);
}

static void
put_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  struct run_join *j = &d->run;
  const struct runjoin_scan *s = &j->scan;

  j->op = NULL;
  if (d->closing || res->err == -ECANCELED) {
    finish(d, -ECANCELED);
    return;
  }
  if (res->err < 0) {
    log_err("multi-node: cannot join run %" PRIu64 " of job %s: %s", j->run,
            d->cfg->job, res->message[0] ? res->message : strerror(-res->err));
    finish(d, res->err);
    return;
  }
  j->joined = true;
  snprintf(d->fan.run, sizeof(d->fan.run), "r%" PRIu64, j->run);
  /* every rank of the run gets the same count */
  restarts_set_count(d, (int64_t)(j->run - 1), false);
  log_info("multi-node: rank %u joined run %s of job %s (%s)", d->store.rank,
           d->fan.run, d->cfg->job,
           j->run == 1 && s->newest == 0 ? "its first run"
           : j->run != s->newest         ? "a new start of the job"
           : s->mine_in_newest           ? "its peers still run it"
                                         : "a peer opened it");
  delete_previous(d);
  finish(d, 0);
}

static void
put_rank(struct spotd *d)
{
  struct run_join *j = &d->run;
  char *key = mark_key(d, j->run, "rank", true);
  int r = -ENOMEM;

  set_state(d, RUNJOIN_PUTTING);
  snprintf(j->body, sizeof(j->body), "rank=%u\nat_ms=%lld\n", d->store.rank,
           (long long)spot_now_wall_ms());
  if (key != NULL)
    r = spot_s3_put(d->s3, d->store.bucket, key, j->body, strlen(j->body), 0,
                    put_cb, d, &j->op);
  free(key);
  if (r < 0) {
    j->op = NULL;
    log_err("multi-node: cannot join a run of job %s: %s", d->cfg->job,
            strerror(-r));
    finish(d, r);
  }
}

static void
clear_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  struct run_join *j = &d->run;

  j->op = NULL;
  if (d->closing || res->err == -ECANCELED) {
    finish(d, -ECANCELED);
    return;
  }
  if (res->err < 0 || res->n_failed_keys > 0) {
    /* Its peers would count this rank as gone from the run. */
    log_err("multi-node: cannot rejoin run %" PRIu64 " of job %s: %s", j->run,
            d->cfg->job, res->message[0] ? res->message : strerror(-res->err));
    finish(d, res->err < 0 ? res->err : -EIO);
    return;
  }
  put_rank(d);
}

/* Rejoining the run we left: our left-K goes first, so that no peer sees
 * us gone once we are back. */
static void
join(struct spotd *d)
{
  struct run_join *j = &d->run;
  char *key;
  int r = -ENOMEM;

  j->run = runjoin_decide(&j->scan);
  if (j->run != j->scan.newest || !j->scan.mine_left) {
    put_rank(d);
    return;
  }
  set_state(d, RUNJOIN_CLEARING);
  key = mark_key(d, j->run, "left", true);
  if (key != NULL)
    r = spot_s3_delete_objects(d->s3, d->store.bucket, (const char **)&key, 1,
                               clear_cb, d, &j->op);
  free(key);
  if (r < 0) {
    j->op = NULL;
    log_err("multi-node: cannot rejoin a run of job %s: %s", d->cfg->job,
            strerror(-r));
    finish(d, r);
  }
}

static void
list_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  struct run_join *j = &d->run;
  size_t plen = strlen(j->prefix);
  enum runjoin_mark mark;
  uint64_t run;
  unsigned rank;

  j->op = NULL;
  if (d->closing || res->err == -ECANCELED) {
    finish(d, -ECANCELED);
    return;
  }
  if (res->err < 0) {
    log_err("multi-node: cannot list the runs of job %s: %s", d->cfg->job,
            res->message[0] ? res->message : strerror(-res->err));
    finish(d, res->err);
    return;
  }
  for (size_t i = 0; i < res->n_objects; i++) {
    const char *k = res->objects[i].key;

    if (strncmp(k, j->prefix, plen) == 0 &&
        runjoin_parse_key(k + plen, &run, &rank, &mark) == 0)
      runjoin_decide_add(&j->scan, run, mark, rank, d->store.rank);
  }
  if (res->next_token != NULL && ++j->pages < 1000) {
    list_page(d, res->next_token);
    return;
  }
  join(d);
}

static void
list_page(struct spotd *d, const char *token)
{
  struct run_join *j = &d->run;
  int r = spot_s3_list(d->s3, d->store.bucket, j->prefix, NULL, token, 0,
                       list_cb, d, &j->op);

  if (r < 0) {
    j->op = NULL;
    log_err("multi-node: cannot list the runs of job %s: %s", d->cfg->job,
            strerror(-r));
    finish(d, r);
  }
}

void
runjoin_start(struct spotd *d)
{
  struct run_join *j = &d->run;

  runjoin_decide_init(&j->scan);
  j->pages = 0;
  set_state(d, RUNJOIN_LISTING);
  j->prefix = spot_store_key_dup(&d->store, NULL, RUNS_DIR);
  if (j->prefix == NULL) {
    finish(d, -ENOMEM);
    return;
  }
  list_page(d, NULL);
}

static void
leave_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;

  d->run.op = NULL;
  set_state(d, RUNJOIN_LEFT_RUN);
  if (res->err < 0)
    log_warn("multi-node: cannot mark that rank %u left run %s: %s (the "
             "next start of this rank rejoins it while a peer has not "
             "left it)",
             d->store.rank, d->fan.run,
             res->message[0] ? res->message : strerror(-res->err));
}

/* Closing, once the exit status is known: a preemption (75, 76) ends the
 * run for every rank ("over"); any other exit only says this rank left
 * it, so that its next start opens a new run once every rank has left. */
static void
leave(struct spotd *d)
{
  struct run_join *j = &d->run;
  bool over = d->eng.exit_code == SPOTD_EXIT_PREEMPTED ||
              d->eng.exit_code == SPOTD_EXIT_NOTHING_SAVED;
  char *key = mark_key(d, j->run, over ? "over" : "left", !over);
  int r = -ENOMEM;

  set_state(d, RUNJOIN_LEAVING);
  snprintf(j->body, sizeof(j->body), "rank=%u\nstatus=%d\nat_ms=%lld\n",
           d->store.rank, d->eng.exit_code, (long long)spot_now_wall_ms());
  if (key != NULL)
    r = spot_s3_put(d->s3, d->store.bucket, key, j->body, strlen(j->body), 0,
                    leave_cb, d, &j->op);
  free(key);
  if (r < 0) {
    j->op = NULL;
    set_state(d, RUNJOIN_LEFT_RUN);
    log_warn("multi-node: cannot mark that rank %u left run %s: %s",
             d->store.rank, d->fan.run, strerror(-r));
    return;
  }
  log_info("multi-node: rank %u leaves run %s (%s)", d->store.rank, d->fan.run,
           over ? "over for the job" : "its peers may go on");
}

void
runjoin_close(struct spotd *d)
{
  struct run_join *j = &d->run;

  if (j->op != NULL)
    spot_s3_cancel(j->op); /* its callback finishes */
  if (j->del_op != NULL)
    spot_s3_cancel(j->del_op);
  if (j->state == RUNJOIN_JOINED && d->s3 != NULL)
    leave(d);
}
