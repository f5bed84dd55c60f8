/* Push, the multi-node commit (nranks > 1, docs/slurm.md):
 *
 *   MARKER        PUT ranks/rank-K.json, this rank's partial manifest,
 *                 with If-None-Match: * instead of committing
 *   MARKER_CHECK  a retried PUT said 412: read it back, ours or not
 *   WAIT          (rank 0) list ranks/ every 500 ms until every rank's
 *                 marker is there, at most rank_wait_ms
 *   SLEEP         between two polls of WAIT or COMMIT_WAIT
 *   READ          (rank 0) GET the markers and merge them into one
 *                 manifest
 *   MERGED        (rank 0) the merged manifest is committed by the push
 *                 (PUSH_COMMIT), then LATEST and retention
 *   COMMIT_WAIT   (rank > 0) GET 1 byte of MANIFEST.json every 500 ms
 *                 until rank 0 committed, at most rank_wait_ms
 *   COMMITTED     (rank > 0) done; LATEST and retention are rank 0's
 *   FAILED        the push reports the error */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"
#include "io/store/store_push.h"

#define RANK_POLL_MS 500
#define RANK_WAIT_DEFAULT_MS 60000

static const char *const ranks_state_names[] = {
    "idle", "marker", "marker-check", "wait",      "sleep",
    "read", "merged", "commit-wait",  "committed", "failed",
};
_Static_assert(SPOT_ARRAY_SIZE(ranks_state_names) == RANKS_STATE_LAST,
               "ranks_state_names");

static void step(struct push_op *op);

static const struct spot_fsm ranks_fsm = {
    "push ranks", ranks_state_names, RANKS_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

#define set_state(op, s) set_state_at((op), (s), __FILE__, __LINE__)
static void
set_state_at(struct push_op *op, enum ranks_state s, const char *file, int line)
{
  if (spot_fsm_move_detail(&ranks_fsm, op->ranks.state, s, file, line,
                           "name=%s", op->b.name) > 0)
    op->ranks.state = s;
}

/* Failed (op->b.err set) or cancelled: the push reports it. */
static void
stop(struct push_op *op)
{
  set_state(op, RANKS_FAILED);
  spot__push_advance(op);
}

int
spot__ranks_init(struct push_op *op)
{
  struct spot_store_config *c = &op->b.cfg.c;

  if (c->nranks == 0)
    c->nranks = 1;
  if (c->rank_wait_ms == 0)
    c->rank_wait_ms = RANK_WAIT_DEFAULT_MS;
  if (c->rank >= c->nranks || c->nranks > 1024)
    return -EINVAL;
  if (c->nranks == 1)
    return 0;
  op->ranks.seen = calloc(c->nranks, sizeof(*op->ranks.seen));
  if (op->ranks.seen == NULL)
    return -ENOMEM;
  /* Cannot fail once a timer of the same loop initialised. */
  (void)uv_timer_init(op->b.loop, &op->ranks.wait_timer);
  op->b.handles++;
  return 0;
}

void
spot__ranks_fini(struct push_op *op)
{
  free(op->ranks.seen);
  free(op->ranks.token);
  spot_manifest_free(op->ranks.merged);
}

static void
wait_close_cb(uv_handle_t *h)
{
  struct push_op *op = spot_container_of(h, struct push_op, ranks.wait_timer);

  spot__store_handle_closed(&op->b);
}

void
spot__ranks_close(struct push_op *op)
{
  if (op->b.cfg.c.nranks <= 1)
    return;
  uv_timer_stop(&op->ranks.wait_timer);
  uv_close((uv_handle_t *)&op->ranks.wait_timer, wait_close_cb);
}

/* "ROOT/checkpoints/NAME/ranks/rank-K.json", malloc'd. */
static char *
marker_key(const struct push_op *op, unsigned rank)
{
  char rel[64];

  snprintf(rel, sizeof(rel), "ranks/rank-%u.json", rank);
  return spot__store_key(&op->b.cfg.c, op->b.name, rel);
}

static void
wait_timer_cb(uv_timer_t *t)
{
  struct push_op *op = spot_container_of(t, struct push_op, ranks.wait_timer);

  if (op->b.err < 0) {
    stop(op);
    return;
  }
  set_state(op, op->ranks.poll);
  step(op);
}

void
spot__ranks_cancel(struct push_op *op)
{
  /* Between two polls nothing is in flight: stop from the loop. */
  if (op->ranks.state == RANKS_SLEEP)
    uv_timer_start(&op->ranks.wait_timer, wait_timer_cb, 0, 0);
}

/* Not there yet: poll again in RANK_POLL_MS, or give up. */
static void
wait_more(struct push_op *op)
{
  struct ranks *rk = &op->ranks;
  uint64_t waited = spot_now_mono_ms() - rk->wait_start_ms;
  uint64_t limit = op->b.cfg.c.rank_wait_ms;
  char missing[256] = "";
  size_t len = 0;

  if (waited < limit) {
    rk->poll = rk->state;
    set_state(op, RANKS_SLEEP);
    uv_timer_start(&rk->wait_timer, wait_timer_cb, RANK_POLL_MS, 0);
    return;
  }
  if (rk->state == RANKS_COMMIT_WAIT) {
    spot__store_fail_msg(&op->b, -ETIMEDOUT,
                         "rank 0 did not commit %s within %" PRIu64 " s",
                         op->b.name, limit / 1000);
    stop(op);
    return;
  }
  for (unsigned k = 0; k < op->b.cfg.c.nranks && len + 16 < sizeof(missing);
       k++)
    if (!rk->seen[k])
      len += (size_t)snprintf(missing + len, sizeof(missing) - len, "%s%u",
                              len > 0 ? "," : "", k);
  spot__store_fail_msg(&op->b, -ETIMEDOUT,
                       "rank(s) %s did not write their part of %s within "
                       "%" PRIu64 " s; nothing committed",
                       missing, op->b.name, limit / 1000);
  stop(op);
}

/* Adds rank's partial manifest (in op->body) to the merged one. */
/* pack_base: the merged index of this rank's first pack. */
static int
merge_file(struct push_op *op, unsigned rank,
           const struct spot_manifest_file *f, size_t pack_base)
{
  size_t idx;
  int r =
      f->link != NULL ? spot_manifest_add_link(op->ranks.merged, f->path,
                                               f->link, f->mtime_ns, &idx)
      : f->pack != 0
          ? spot_manifest_add_packed(
                op->ranks.merged, f->path, pack_base + f->pack - 1, f->pack_off,
                f->size, f->mode, f->mtime_ns, f->filter, &idx)
          : spot_manifest_add_file(op->ranks.merged, f->path, f->key, f->size,
                                   f->mode, f->mtime_ns, f->filter, &idx);

  for (size_t j = 0; r == 0 && j < f->nframes; j++)
    r = spot_manifest_set_frame(op->ranks.merged, idx, j, f->frames[j].raw_len,
                                f->frames[j].comp_len, f->frames[j].crc32c);
  if (r < 0)
    spot__store_fail_msg(&op->b, r, "merging rank %u's part of %s: %s", rank,
                         op->b.name, strerror(-r));
  return r;
}

static int
merge_marker(struct push_op *op, unsigned rank)
{
  struct spot_manifest *m = NULL;
  char err[256], prefix[32];
  size_t plen, pack_base;
  int r;

  r = spot_manifest_parse(spot_buf_str(&op->body), op->body.len, &m, err,
                          sizeof(err));
  if (r < 0) {
    spot__store_fail_msg(&op->b, -EBADMSG,
                         "rank %u's part of %s is unreadable: %s", rank,
                         op->b.name, err);
    return -EBADMSG;
  }
  plen = (size_t)snprintf(prefix, sizeof(prefix), "rank-%u/", rank);
  r = 0;
  if (strcmp(m->name, op->b.name) != 0 || strcmp(m->job, op->b.cfg.job) != 0) {
    spot__store_fail_msg(&op->b, -EBADMSG,
                         "rank %u's part of %s names another checkpoint", rank,
                         op->b.name);
    r = -EBADMSG;
  }
  /* its packs, under its rank-K/ folder like its files */
  pack_base = op->ranks.merged->npacks;
  for (size_t i = 0; r == 0 && i < m->npacks; i++) {
    if (strncmp(m->packs[i].key, prefix, plen) != 0) {
      spot__store_fail_msg(&op->b, -EBADMSG,
                           "rank %u's part of %s holds pack %s, outside %s",
                           rank, op->b.name, m->packs[i].key, prefix);
      r = -EBADMSG;
      break;
    }
    r = spot_manifest_add_pack(op->ranks.merged, m->packs[i].key,
                               m->packs[i].stored, NULL);
    if (r < 0)
      spot__store_fail_msg(&op->b, r, "merging rank %u's part of %s: %s", rank,
                           op->b.name, strerror(-r));
  }
  for (size_t i = 0; r == 0 && i < m->nfiles; i++) {
    const struct spot_manifest_file *f = &m->files[i];

    if (strncmp(f->path, prefix, plen) != 0 ||
        (f->key != NULL && strncmp(f->key, prefix, plen) != 0)) {
      spot__store_fail_msg(&op->b, -EBADMSG,
                           "rank %u's part of %s holds %s, outside %s", rank,
                           op->b.name, f->path, prefix);
      r = -EBADMSG;
      break;
    }
    r = merge_file(op, rank, f, pack_base);
  }
  spot_manifest_free(m);
  return r;
}

/* WAIT: a page of ranks/ listed. */
static void
got_markers(struct push_op *op, const struct spot_s3_result *res)
{
  struct ranks *rk = &op->ranks;

  for (size_t i = 0; i < res->n_objects; i++) {
    const char *b = strrchr(res->objects[i].key, '/');
    unsigned k;
    char tail;

    if (b != NULL && sscanf(b, "/rank-%u.jso%c", &k, &tail) == 2 &&
        tail == 'n' && k < op->b.cfg.c.nranks)
      rk->seen[k] = true;
  }
  free(rk->token);
  rk->token = NULL;
  if (res->next_token != NULL) {
    rk->token = strdup(res->next_token);
    if (rk->token == NULL) {
      spot__store_fail(&op->b, -ENOMEM);
      stop(op);
      return;
    }
    step(op); /* next page */
    return;
  }
  for (unsigned k = 0; k < op->b.cfg.c.nranks; k++)
    if (!rk->seen[k]) {
      wait_more(op);
      return;
    }
  log_info("push name=%s: all %u ranks wrote their part", op->b.name,
           op->b.cfg.c.nranks);
  if (spot_manifest_new(op->b.name, op->b.cfg.job, spot_now_wall_ms(),
                        &rk->merged) < 0) {
    spot__store_fail(&op->b, -ENOMEM);
    stop(op);
    return;
  }
  rk->merged->epoch = op->b.cfg.c.lease_epoch;
  rk->merged->step = spot__push_step(op);
  rk->idx = 0;
  set_state(op, RANKS_READ);
  step(op);
}

static void
rank_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;
  char what[64];

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (spot__store_cancelled(&op->b)) {
    stop(op);
    return;
  }
  if (res->err < 0 &&
      !(res->err == -ENOENT && op->ranks.state == RANKS_COMMIT_WAIT)) {
    if (op->ranks.state == RANKS_READ)
      snprintf(what, sizeof(what), "reading rank %u's marker", op->ranks.idx);
    else
      snprintf(what, sizeof(what), "%s",
               op->ranks.state == RANKS_WAIT ? "listing the rank markers"
                                             : "checking for rank 0's commit");
    spot__store_fail_s3(&op->b, what, res);
    stop(op);
    return;
  }
  switch (op->ranks.state) {
  case RANKS_WAIT:
    got_markers(op, res);
    return;
  case RANKS_READ:
    if (merge_marker(op, op->ranks.idx) < 0) {
      stop(op);
      return;
    }
    op->ranks.idx++;
    step(op);
    return;
  case RANKS_COMMIT_WAIT:
    if (res->err == -ENOENT) {
      wait_more(op);
      return;
    }
    op->commit_ms = spot_now_mono_ms() - op->b.start_ms;
    log_info("push name=%s: rank 0 committed the checkpoint", op->b.name);
    set_state(op, RANKS_COMMITTED);
    spot__push_advance(op);
    return;
  default:
    stop(op);
    return;
  }
}

/* READ is complete: the merged manifest becomes the push's, committed. */
static void
commit_merged(struct push_op *op)
{
  struct ranks *rk = &op->ranks;
  char err[256];
  int r;

  rk->own_stored = op->manifest->total_stored;
  spot_manifest_free(op->manifest);
  op->manifest = rk->merged;
  rk->merged = NULL;
  free(op->manifest_json);
  op->manifest_json = NULL;
  set_state(op, RANKS_MERGED);
  r = spot_manifest_to_json(op->manifest, &op->manifest_json, err, sizeof(err));
  if (r < 0) {
    spot__store_fail_msg(&op->b, r, "building the merged manifest: %s", err);
    stop(op);
    return;
  }
  spot__push_commit(op);
}

/* One request of WAIT, READ or COMMIT_WAIT. */
static void
step(struct push_op *op)
{
  struct ranks *rk = &op->ranks;
  const struct spot__store_cfg *cfg = &op->b.cfg;
  char *key = NULL;
  int r = -ENOMEM;

  spot_buf_reset(&op->body);
  if (rk->state == RANKS_WAIT) {
    if (rk->token == NULL)
      memset(rk->seen, 0, cfg->c.nranks * sizeof(*rk->seen));
    key = spot__store_key(&cfg->c, op->b.name, "ranks/");
    if (key != NULL)
      r = spot_s3_list(cfg->c.s3, cfg->bucket, key, NULL, rk->token, 0, rank_cb,
                       op, &op->s3op);
  } else if (rk->state == RANKS_READ && rk->idx >= cfg->c.nranks) {
    commit_merged(op);
    return;
  } else if (rk->state == RANKS_READ) {
    key = marker_key(op, rk->idx);
    if (key != NULL)
      r = spot_s3_get(cfg->c.s3, cfg->bucket, key, 0, 0, NULL, &op->body,
                      rank_cb, op, &op->s3op);
  } else if (rk->state == RANKS_COMMIT_WAIT) {
    key = spot__store_key(&cfg->c, op->b.name, SPOT_MANIFEST_NAME);
    if (key != NULL)
      r = spot_s3_get(cfg->c.s3, cfg->bucket, key, 0, 1, NULL, &op->body,
                      rank_cb, op, &op->s3op);
  }
  free(key);
  if (r < 0) {
    spot__store_fail_msg(&op->b, r, "waiting for the other ranks: %s",
                         strerror(-r));
    stop(op);
    return;
  }
  op->b.active_s3++;
}

static void
marker_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;
  bool check = op->ranks.state == RANKS_MARKER_CHECK;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (!check && res->err == -EEXIST && res->retries > 0 &&
      !spot__store_cancelled(&op->b)) {
    set_state(op, RANKS_MARKER_CHECK);
    if (spot__push_read_back(op, marker_key(op, op->b.cfg.c.rank), marker_cb))
      return;
  }
  if (check ? !(res->err == 0 && spot__push_body_is_ours(op))
            : res->err == -EEXIST)
    spot__store_fail_msg(
        &op->b, -EEXIST,
        "rank %u's part of checkpoint %s is already in the store",
        op->b.cfg.c.rank, op->b.name);
  else if (!check && res->err < 0)
    spot__store_fail_s3(&op->b, "writing this rank's marker", res);
  if (op->b.err < 0) {
    stop(op);
    return;
  }
  log_info("push name=%s: rank %u of %u wrote its part", op->b.name,
           op->b.cfg.c.rank, op->b.cfg.c.nranks);
  op->ranks.wait_start_ms = spot_now_mono_ms();
  set_state(op, op->b.cfg.c.rank == 0 ? RANKS_WAIT : RANKS_COMMIT_WAIT);
  step(op);
}

void
spot__ranks_start(struct push_op *op)
{
  char *key;
  int r = -ENOMEM;

  spot__push_set_state(op, PUSH_RANKS);
  set_state(op, RANKS_MARKER);
  spot__store_progress(&op->b, SPOT_STORE_PHASE_COMMIT);
  key = marker_key(op, op->b.cfg.c.rank);
  if (key != NULL)
    r = spot_s3_put(op->b.cfg.c.s3, op->b.cfg.bucket, key, op->manifest_json,
                    strlen(op->manifest_json), SPOT_S3_IF_NONE_MATCH, marker_cb,
                    op, &op->s3op);
  free(key);
  if (r < 0) {
    spot__store_fail_msg(&op->b, r, "writing this rank's marker: %s",
                         strerror(-r));
    stop(op);
    return;
  }
  op->b.active_s3++;
}
