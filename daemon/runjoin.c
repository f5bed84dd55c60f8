/* The run id of a multi-node job outside Slurm (no --run-id, no
 * SLURM_JOB_ID), agreed through the store so that every rank of one start
 * of the job names the same run, in any start order and across any number
 * of restarts.
 *
 * A run is a generation G. Each rank that joins run G creates
 * ROOT/runs/G/rank-K (G zero-padded, so the keys sort by run). At start a
 * rank lists ROOT/runs/ and finds the newest run N that has any marker:
 *
 *   no run yet           join run 1
 *   N lacks rank-K       join N (a peer started this run before us)
 *   N has rank-K         we already took part in N: this is a new start
 *                        of the job, join N + 1
 *
 * Every rank starts once per start of the job, so all of them land in the
 * same run: the first one to come up opens N + 1, the others find it
 * open, or open it themselves with the same number when they list before
 * the first one's marker is visible. Each marker is written only by its
 * own rank, so no conditional write is needed. Once joined, a rank
 * deletes its marker of the run before, which keeps a handful of objects
 * per rank and never empties the newest run.
 *
 * The run names the job-wide notice (notices/RUN) and the relaunch claim,
 * so a restarted job never acts on the notice of the run before it; its
 * number less one is SPOTD_RESTART_COUNT on every rank. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "runjoin.h"
#include "spotd.h"
#include "store_internal.h"
#include "util.h"

#define RUNS_DIR "runs/"

/* Whether this spotd agrees its run id through the store. */
bool
runjoin_needed(const struct spotd *d)
{
  const char *job = getenv("SLURM_JOB_ID");

  return d->store.nranks > 1 && d->cfg->run_id == NULL &&
         (job == NULL || job[0] == '\0') && d->s3 != NULL && !d->run.joined;
}

/* "…/runs/0000000012/rank-3" after the runs prefix -> run 12, rank 3;
 * -1 when the key is not a marker. */
int
runjoin_parse_key(const char *rel, uint64_t *run, unsigned *rank)
{
  char *end;
  unsigned long long g;
  unsigned long k;

  if (rel[0] < '0' || rel[0] > '9')
    return -1;
  errno = 0;
  g = strtoull(rel, &end, 10);
  if (errno != 0 || end == rel || g == 0 || strncmp(end, "/rank-", 6) != 0)
    return -1;
  rel = end + 6;
  if (rel[0] < '0' || rel[0] > '9')
    return -1;
  k = strtoul(rel, &end, 10);
  if (errno != 0 || *end != '\0' || k > UINT32_MAX)
    return -1;
  *run = g;
  *rank = (unsigned)k;
  return 0;
}

void
runjoin_decide_init(struct runjoin_scan *s)
{
  memset(s, 0, sizeof(*s));
}

/* One marker seen by the LIST. */
void
runjoin_decide_add(struct runjoin_scan *s, uint64_t run, unsigned rank,
                   unsigned mine)
{
  if (run > s->newest) {
    s->newest = run;
    s->mine_in_newest = false;
  }
  if (run == s->newest && rank == mine)
    s->mine_in_newest = true;
}

uint64_t
runjoin_decide(const struct runjoin_scan *s)
{
  if (s->newest == 0)
    return 1;
  return s->mine_in_newest ? s->newest + 1 : s->newest;
}

static void list_page(struct spotd *d, const char *token);

static void
finish(struct spotd *d, int err)
{
  struct run_join *j = &d->run;

  free(j->prefix);
  j->prefix = NULL;
  j->op = NULL;
  restore_joined(d, err);
}

static void
delete_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;

  d->run.del_op = NULL;
  if (res->err < 0 && res->err != -ECANCELED && !d->closing)
    log_info("run %s: the marker of the run before stays (%s)", d->fan.run,
             res->message[0] ? res->message : strerror(-res->err));
}

/* Best effort: our marker of the run before this one. */
static void
delete_previous(struct spotd *d)
{
  struct run_join *j = &d->run;
  const char *keys[1];
  char rel[64], *key;

  if (j->run < 2)
    return;
  snprintf(rel, sizeof(rel), RUNS_DIR "%010" PRIu64 "/rank-%u", j->run - 1,
           d->store.rank);
  key = spot__store_key(&d->store, NULL, rel);
  if (key == NULL)
    return;
  keys[0] = key;
  if (spot_s3_delete_objects(d->s3, d->store.bucket, keys, 1, delete_cb, d,
                             &j->del_op) < 0)
    j->del_op = NULL;
  free(key);
}

static void
put_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  struct run_join *j = &d->run;

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
  d->restarts.count = (int64_t)(j->run - 1);
  d->restarts.fetched = false;
  log_info("multi-node: rank %u joined run %s of job %s (%s)", d->store.rank,
           d->fan.run, d->cfg->job,
           j->run == 1                ? "its first run"
           : j->scan.newest == j->run ? "a peer opened it"
                                      : "a new start of the job");
  delete_previous(d);
  finish(d, 0);
}

static void
join(struct spotd *d)
{
  struct run_join *j = &d->run;
  char rel[64], *key;
  int r = -ENOMEM;

  j->run = runjoin_decide(&j->scan);
  snprintf(j->body, sizeof(j->body), "rank=%u\nat_ms=%lld\n", d->store.rank,
           (long long)spot_now_wall_ms());
  snprintf(rel, sizeof(rel), RUNS_DIR "%010" PRIu64 "/rank-%u", j->run,
           d->store.rank);
  key = spot__store_key(&d->store, NULL, rel);
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
list_cb(const struct spot_s3_result *res, void *data)
{
  struct spotd *d = data;
  struct run_join *j = &d->run;
  size_t plen = strlen(j->prefix);
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
        runjoin_parse_key(k + plen, &run, &rank) == 0)
      runjoin_decide_add(&j->scan, run, rank, d->store.rank);
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
  j->prefix = spot__store_key(&d->store, NULL, RUNS_DIR);
  if (j->prefix == NULL) {
    finish(d, -ENOMEM);
    return;
  }
  list_page(d, NULL);
}

void
runjoin_close(struct spotd *d)
{
  struct run_join *j = &d->run;

  if (j->op != NULL)
    spot_s3_cancel(j->op); /* its callback finishes */
  if (j->del_op != NULL)
    spot_s3_cancel(j->del_op);
}
