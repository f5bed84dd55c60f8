/* The job history in the store: a fire-and-forget writer (one PUT at a
 * time from a bounded queue, pruning now and then), a reader (list + GET
 * each event), and the atomic metrics file. */
#include "io/store/history_store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"
#include "io/store/store_internal.h"

#define DELETE_BATCH 1000
#define READ_PARALLEL 8

/* ---- writer ------------------------------------------------------------ */

enum hist_state {
  H_IDLE,         /* nothing in flight */
  H_PUT,          /* the queue's head is being written */
  H_PRUNE_LIST,   /* listing ROOT/history/ */
  H_PRUNE_DELETE, /* deleting the oldest events */
  H_SUPERSEDE,    /* deleting a progress event a newer one replaced */
  H_CLOSING,      /* the timer handle is closing; freed in its callback */
  H_STATE_LAST,
};

static const char *const hist_state_names[H_STATE_LAST] = {
    [H_IDLE] = "idle",
    [H_PUT] = "put",
    [H_PRUNE_LIST] = "prune-list",
    [H_PRUNE_DELETE] = "prune-delete",
    [H_SUPERSEDE] = "supersede",
    [H_CLOSING] = "closing",
};

struct queued {
  char *key;
  char *body;
  size_t len;
  bool progress; /* a PROGRESS event: replaces this writer's previous */
};

struct keylist {
  char **keys;
  size_t n, alloc;
  char *token;
};

struct spot_history {
  uv_loop_t *loop;
  struct spot__store_cfg cfg;
  enum hist_state state;
  char owner[SPOT_HIST_OWNER_MAX + 1];
  uint64_t seq;
  unsigned queue_max, keep, since_prune;
  bool replace_progress;
  struct queued *q;
  size_t qlen;
  struct spot_s3_op *s3op;
  struct keylist prune;
  size_t del_next;
  /* Only the newest PROGRESS event of a writer matters: once a new one
   * is written the one before the previous is deleted, so they never
   * crowd the events kept (keep) out of the history, and a reader that
   * listed the previous one (written a report ago, 100 ms) still finds
   * one of the two. */
  char *progress_key;  /* the newest written */
  char *progress_prev; /* the one before it */
  char *stale;         /* the one before that, to delete */
  spot_history_report_cb report;
  void *data;
  /* close(): draining until the queue is empty or the timer fires */
  bool draining, expired;
  uv_timer_t timer;
  spot_history_close_cb close_cb;
  void *close_data;
};

static void advance(struct spot_history *h);

static const struct spot_fsm hist_fsm = {
    "history:", hist_state_names, H_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

#define set_state(h, st) set_state_at((h), (st), __FILE__, __LINE__)
static void
set_state_at(struct spot_history *h, enum hist_state st, const char *file,
             int line)
{
  if (spot_fsm_move_detail(&hist_fsm, h->state, st, file, line,
                           "owner=%s queue=%zu", h->owner, h->qlen) > 0)
    h->state = st;
}

static void
keylist_fini(struct keylist *k)
{
  for (size_t i = 0; i < k->n; i++)
    free(k->keys[i]);
  free(k->keys);
  free(k->token);
  memset(k, 0, sizeof(*k));
}

/* Appends the keys of one list page; -E2BIG beyond the cap. */
static int
keylist_add(struct keylist *k, const struct spot_s3_result *res)
{
  for (size_t i = 0; i < res->n_objects; i++) {
    if (k->n == SPOT_HISTORY_LIST_MAX)
      return -E2BIG;
    if (k->n == k->alloc) {
      size_t na = k->alloc ? k->alloc * 2 : 64;
      char **nk = realloc(k->keys, na * sizeof(*nk));
      if (nk == NULL)
        return -ENOMEM;
      k->keys = nk;
      k->alloc = na;
    }
    k->keys[k->n] = strdup(res->objects[i].key);
    if (k->keys[k->n] == NULL)
      return -ENOMEM;
    k->n++;
  }
  free(k->token);
  k->token = res->next_token != NULL ? strdup(res->next_token) : NULL;
  return res->next_token != NULL && k->token == NULL ? -ENOMEM : 0;
}

static void
report(struct spot_history *h, int err, const char *key, const char *msg)
{
  if (err < 0 && err != -ECANCELED)
    log_warn("history: event not written (the job history misses it): %s", msg);
  if (h->report != NULL)
    h->report(err, key, msg, h->data);
}

static void
queue_pop(struct spot_history *h, int err, const char *msg)
{
  struct queued e = h->q[0];

  h->qlen--;
  memmove(h->q, h->q + 1, h->qlen * sizeof(*h->q));
  report(h, err, e.key, msg);
  free(e.key);
  free(e.body);
}

static void
timer_close_cb(uv_handle_t *handle)
{
  struct spot_history *h =
      spot_container_of(handle, struct spot_history, timer);
  spot_history_close_cb cb = h->close_cb;
  void *data = h->close_data;

  keylist_fini(&h->prune);
  free(h->progress_key);
  free(h->progress_prev);
  free(h->stale);
  free(h->q);
  spot__store_cfg_fini(&h->cfg);
  free(h);
  if (cb != NULL)
    cb(data);
}

static void
put_cb(const struct spot_s3_result *res, void *data)
{
  struct spot_history *h = data;
  char msg[512] = "";

  h->s3op = NULL;
  if (res->err < 0) {
    spot__store_s3_msg(msg, sizeof(msg), "writing a history event", res);
  } else {
    /* A progress event replaces its predecessor: no growth to prune. */
    if (!h->q[0].progress)
      h->since_prune++;
    if (h->q[0].progress) {
      char *k = strdup(h->q[0].key);
      if (k != NULL) {
        free(h->stale); /* (none: advance() deletes it before a PUT) */
        h->stale = h->progress_prev;
        h->progress_prev = h->progress_key;
        h->progress_key = k;
      }
    }
  }
  queue_pop(h, res->err, msg);
  set_state(h, H_IDLE);
  advance(h);
}

static void
prune_end(struct spot_history *h, const char *what,
          const struct spot_s3_result *res)
{
  char msg[512] = "";

  if (res != NULL && res->err < 0 && res->err != -ECANCELED) {
    spot__store_s3_msg(msg, sizeof(msg), what, res);
    log_warn("history: pruning old events: %s", msg);
  }
  keylist_fini(&h->prune);
  h->since_prune = 0;
  set_state(h, H_IDLE);
  advance(h);
}

static void
delete_cb(const struct spot_s3_result *res, void *data)
{
  struct spot_history *h = data;
  size_t total = h->prune.n - h->keep;
  int r;

  h->s3op = NULL;
  if (res->err < 0 || h->del_next >= total || h->expired) {
    prune_end(h, "deleting old events", res);
    return;
  }
  r = spot_s3_delete_objects(
      h->cfg.c.s3, h->cfg.bucket,
      (const char *const *)(h->prune.keys + h->del_next),
      total - h->del_next > DELETE_BATCH ? DELETE_BATCH : total - h->del_next,
      delete_cb, h, &h->s3op);
  h->del_next += DELETE_BATCH;
  if (r < 0)
    prune_end(h, "deleting old events", NULL);
}

static int start_list(struct spot_history *h);

static void
supersede_cb(const struct spot_s3_result *res, void *data)
{
  struct spot_history *h = data;
  char msg[512];

  h->s3op = NULL;
  if (res->err < 0 && res->err != -ECANCELED) {
    /* An extra progress event in the store: harmless, pruned later. */
    spot__store_s3_msg(msg, sizeof(msg), "deleting a replaced progress event",
                       res);
    log_warn("history: %s", msg);
  }
  free(h->stale);
  h->stale = NULL;
  set_state(h, H_IDLE);
  advance(h);
}

static void
list_cb(const struct spot_s3_result *res, void *data)
{
  struct spot_history *h = data;
  struct spot_s3_result none;
  int r;

  h->s3op = NULL;
  r = res->err < 0 ? res->err : keylist_add(&h->prune, res);
  if (r < 0 || h->expired) {
    prune_end(h, "listing events", res);
    return;
  }
  if (h->prune.token != NULL) {
    if (start_list(h) < 0)
      prune_end(h, "listing events", NULL);
    return;
  }
  if (h->prune.n <= h->keep) {
    prune_end(h, "", NULL);
    return;
  }
  /* Keys sort by time: the oldest come first. */
  log_info("history: pruning %zu old events of %zu", h->prune.n - h->keep,
           h->prune.n);
  set_state(h, H_PRUNE_DELETE);
  h->del_next = 0;
  memset(&none, 0, sizeof(none));
  delete_cb(&none, h);
}

static int
start_list(struct spot_history *h)
{
  char *key = spot__store_key(&h->cfg.c, NULL, "history/");
  int r;

  if (key == NULL)
    return -ENOMEM;
  r = spot_s3_list(h->cfg.c.s3, h->cfg.bucket, key, NULL, h->prune.token, 0,
                   list_cb, h, &h->s3op);
  free(key);
  return r;
}

static void
begin_close(struct spot_history *h)
{
  set_state(h, H_CLOSING);
  uv_timer_stop(&h->timer);
  uv_close((uv_handle_t *)&h->timer, timer_close_cb);
}

/* The one place that starts work: called whenever nothing is in flight. */
static void
advance(struct spot_history *h)
{
  int r;

  while (h->state == H_IDLE) {
    if (h->expired) {
      while (h->qlen > 0)
        queue_pop(h, -ECANCELED, "cancelled: spotd is exiting");
      begin_close(h);
    } else if (h->stale != NULL) {
      const char *const keys[] = {h->stale};
      set_state(h, H_SUPERSEDE);
      if (spot_s3_delete_objects(h->cfg.c.s3, h->cfg.bucket, keys, 1,
                                 supersede_cb, h, &h->s3op) < 0) {
        free(h->stale);
        h->stale = NULL;
        set_state(h, H_IDLE);
      }
    } else if (h->qlen > 0) {
      set_state(h, H_PUT);
      r = spot_s3_put(h->cfg.c.s3, h->cfg.bucket, h->q[0].key, h->q[0].body,
                      h->q[0].len, 0, put_cb, h, &h->s3op);
      if (r < 0) {
        char msg[256];
        snprintf(msg, sizeof(msg), "writing a history event: %s", strerror(-r));
        queue_pop(h, r, msg);
        set_state(h, H_IDLE);
      }
    } else if (h->since_prune >= SPOT_HISTORY_PRUNE_EVERY) {
      /* Also while draining: the close deadline bounds it. */
      set_state(h, H_PRUNE_LIST);
      if (start_list(h) < 0) {
        h->since_prune = 0;
        set_state(h, H_IDLE);
      }
    } else if (h->draining) {
      begin_close(h);
    } else {
      return;
    }
  }
}

void
spot_history_default_owner(char *buf, size_t size)
{
  char host[256] = "node";
  char raw[SPOT_HIST_OWNER_MAX + 1];
  size_t n;

  if (gethostname(host, sizeof(host)) < 0 || host[0] == '\0')
    spot_strlcpy(host, "node", sizeof(host));
  host[sizeof(host) - 1] = '\0';
  host[40] = '\0'; /* room for -pid-xxxx */
  snprintf(raw, sizeof(raw), "%s-%ld-%04x", host, (long)getpid(),
           (unsigned)(spot_random_u32() & 0xffff));
  for (n = 0; raw[n] != '\0'; n++) {
    char c = raw[n];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
          (c >= '0' && c <= '9') || c == '.' || c == '-'))
      raw[n] = '_';
  }
  spot_strlcpy(buf, raw, size);
}

int
spot_history_key(const struct spot_store_config *cfg,
                 const struct spot_hist_event *ev, struct spot_buf *out)
{
  char rel[SPOT_HIST_OWNER_MAX + 64];

  if (!spot_hist_owner_valid(ev->owner) || ev->time_ms < 0)
    return -EINVAL;
  snprintf(rel, sizeof(rel), "history/%013" PRId64 "-%s-%06" PRIu64 ".json",
           ev->time_ms, ev->owner, ev->seq);
  return spot_store_key(cfg, NULL, rel, out);
}

int
spot_history_new(uv_loop_t *loop, const struct spot_store_config *cfg,
                 const struct spot_history_options *opt,
                 spot_history_report_cb report_cb, void *data,
                 struct spot_history **out)
{
  struct spot_history *h;
  int r;

  if (loop == NULL || cfg == NULL || cfg->s3 == NULL || cfg->job == NULL ||
      (opt != NULL && opt->owner != NULL && !spot_hist_owner_valid(opt->owner)))
    return -EINVAL;
  h = calloc(1, sizeof(*h));
  if (h == NULL)
    return -ENOMEM;
  r = spot__store_cfg_copy(&h->cfg, cfg);
  if (r < 0) {
    free(h);
    return r;
  }
  h->queue_max = opt != NULL && opt->queue_max > 0 ? opt->queue_max
                                                   : SPOT_HISTORY_QUEUE_DEFAULT;
  h->keep =
      opt != NULL && opt->keep > 0 ? opt->keep : SPOT_HISTORY_KEEP_DEFAULT;
  h->replace_progress = opt != NULL && opt->replace_progress;
  h->q = calloc(h->queue_max, sizeof(*h->q));
  r = h->q == NULL ? -ENOMEM : uv_timer_init(loop, &h->timer);
  if (r < 0) {
    free(h->q);
    spot__store_cfg_fini(&h->cfg);
    free(h);
    return r;
  }
  if (opt != NULL && opt->owner != NULL)
    spot_strlcpy(h->owner, opt->owner, sizeof(h->owner));
  else
    spot_history_default_owner(h->owner, sizeof(h->owner));
  h->loop = loop;
  h->report = report_cb;
  h->data = data;
  h->state = H_IDLE; /* initial state */
  *out = h;
  return 0;
}

const char *
spot_history_owner(const struct spot_history *h)
{
  return h->owner;
}

int
spot_history_event_init(struct spot_history *h, struct spot_hist_event *ev,
                        enum spot_hist_type type)
{
  return spot_hist_event_init(ev, type, spot_now_wall_ms(), h->owner, h->seq++);
}

int
spot_history_emit(struct spot_history *h, const struct spot_hist_event *ev)
{
  struct queued e;
  struct spot_buf key;
  int r;

  if (h->draining)
    return -ESHUTDOWN;
  memset(&e, 0, sizeof(e));
  r = spot_hist_encode(ev, &e.body);
  if (r < 0)
    return r;
  e.len = strlen(e.body);
  e.progress = h->replace_progress && ev->type == SPOT_HIST_PROGRESS;
  spot_buf_init(&key, 4096);
  r = spot_history_key(&h->cfg.c, ev, &key);
  if (r < 0) {
    free(e.body);
    spot_buf_fini(&key);
    return r;
  }
  e.key = spot_buf_steal(&key);
  spot_buf_fini(&key);
  if (e.key == NULL) {
    free(e.body);
    return -ENOMEM;
  }
  /* A newer progress event replaces one still waiting in the queue: one
   * waits at most, however often the trainer reports. */
  for (size_t i = h->state == H_PUT ? 1 : 0; e.progress && i < h->qlen; i++)
    if (h->q[i].progress) {
      free(h->q[i].key);
      free(h->q[i].body);
      h->q[i] = e;
      return 0;
    }
  if (h->qlen == h->queue_max) {
    /* Drop the oldest event that is not being written. */
    size_t i = h->state == H_PUT ? 1 : 0;
    struct queued old = h->q[i];
    memmove(h->q + i, h->q + i + 1, (h->qlen - i - 1) * sizeof(*h->q));
    h->qlen--;
    log_warn("history: queue full (%u events), dropped %s", h->queue_max,
             old.key);
    if (h->report != NULL)
      h->report(-ECANCELED, old.key, "dropped: history queue full", h->data);
    free(old.key);
    free(old.body);
  }
  h->q[h->qlen++] = e;
  advance(h);
  return 0;
}

static void
drain_timer_cb(uv_timer_t *t)
{
  struct spot_history *h = spot_container_of(t, struct spot_history, timer);

  log_warn("history: %zu events not written before exit", h->qlen);
  h->expired = true;
  if (h->s3op != NULL)
    spot_s3_cancel(h->s3op); /* its callback advances */
  else
    advance(h);
}

int
spot_history_close(struct spot_history *h, uint64_t drain_ms,
                   spot_history_close_cb cb, void *data)
{
  int r;

  if (h->draining)
    return -EALREADY;
  h->draining = true;
  h->close_cb = cb;
  h->close_data = data;
  if (drain_ms == 0) {
    h->expired = true;
    if (h->s3op != NULL)
      spot_s3_cancel(h->s3op);
    else
      advance(h);
    return 0;
  }
  r = uv_timer_start(&h->timer, drain_timer_cb, drain_ms, 0);
  if (r < 0)
    h->expired = true;
  if (h->state == H_IDLE)
    advance(h);
  return 0;
}

/* ---- reader ------------------------------------------------------------ */

enum read_state {
  R_LIST,
  R_GET,
  R_DONE,
  R_STATE_LAST,
};

static const char *const read_state_names[R_STATE_LAST] = {
    [R_LIST] = "list",
    [R_GET] = "get",
    [R_DONE] = "done",
};

struct rget {
  struct spot_history_read *op;
  struct spot_buf body;
  struct spot_s3_op *s3op;
};

struct spot_history_read {
  struct spot__store_cfg cfg;
  enum read_state state;
  spot_history_read_cb cb;
  void *data;
  int err;
  char msg[768];
  struct keylist keys;
  size_t first, next; /* keys[first..] are read; next to start */
  struct spot_hist_event *events;
  size_t n;
  unsigned skipped;
  struct rget gets[READ_PARALLEL];
  struct spot_s3_op *s3op;
  unsigned active;
};

static void read_advance(struct spot_history_read *op);

static const struct spot_fsm read_fsm = {
    "history read", read_state_names, R_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

#define read_set_state(op, st) read_set_state_at((op), (st), __FILE__, __LINE__)
static void
read_set_state_at(struct spot_history_read *op, enum read_state st,
                  const char *file, int line)
{
  if (spot_fsm_move_detail(&read_fsm, op->state, st, file, line, "s3://%s/%s",
                           op->cfg.bucket, op->cfg.job) > 0)
    op->state = st;
}

static void
read_finish(struct spot_history_read *op)
{
  struct spot_history_read_result res;

  read_set_state(op, R_DONE);
  memset(&res, 0, sizeof(res));
  if (op->err < 0 && op->msg[0] == '\0')
    snprintf(op->msg, sizeof(op->msg), "%s", strerror(-op->err));
  res.err = op->err;
  res.message = op->err < 0 ? op->msg : "";
  if (op->err == 0) {
    spot_hist_sort(op->events, op->n);
    res.events = op->events;
    res.n = op->n;
    res.skipped = op->skipped;
    res.truncated = op->first;
  }
  op->cb(&res, op->data);
  for (size_t i = 0; i < READ_PARALLEL; i++)
    spot_buf_fini(&op->gets[i].body);
  keylist_fini(&op->keys);
  free(op->events);
  spot__store_cfg_fini(&op->cfg);
  free(op);
}

static void read_list_cb(const struct spot_s3_result *res, void *data);

static int
read_list(struct spot_history_read *op)
{
  char *key = spot__store_key(&op->cfg.c, NULL, "history/");
  int r;

  if (key == NULL)
    return -ENOMEM;
  r = spot_s3_list(op->cfg.c.s3, op->cfg.bucket, key, NULL, op->keys.token, 0,
                   read_list_cb, op, &op->s3op);
  free(key);
  return r;
}

static void
read_fail(struct spot_history_read *op, int err, const char *what,
          const struct spot_s3_result *res)
{
  if (op->err < 0)
    return;
  op->err = err;
  if (res != NULL)
    spot__store_s3_msg(op->msg, sizeof(op->msg), what, res);
  else
    snprintf(op->msg, sizeof(op->msg), "%s: %s", what, strerror(-err));
}

static void
read_list_cb(const struct spot_s3_result *res, void *data)
{
  struct spot_history_read *op = data;
  int r;

  op->s3op = NULL;
  op->active--;
  if (res->err < 0) {
    read_fail(op, res->err, "listing the job history", res);
  } else {
    r = keylist_add(&op->keys, res);
    if (r == -E2BIG) {
      /* Keep what fits: the reader returns the newest READ_MAX anyway. */
      free(op->keys.token);
      op->keys.token = NULL;
    } else if (r < 0) {
      read_fail(op, r, "listing the job history", NULL);
    }
  }
  if (op->err == 0 && op->keys.token == NULL) {
    if (op->keys.n > SPOT_HISTORY_READ_MAX)
      op->first = op->keys.n - SPOT_HISTORY_READ_MAX;
    op->next = op->first;
    op->events = calloc(op->keys.n - op->first + 1, sizeof(*op->events));
    if (op->events == NULL)
      read_fail(op, -ENOMEM, "reading the job history", NULL);
    read_set_state(op, R_GET);
  }
  read_advance(op);
}

static void
read_get_cb(const struct spot_s3_result *res, void *data)
{
  struct rget *g = data;
  struct spot_history_read *op = g->op;
  char err[256];

  g->s3op = NULL;
  op->active--;
  if (res->err == 0) {
    if (spot_hist_parse(spot_buf_str(&g->body), g->body.len, &op->events[op->n],
                        err, sizeof(err)) == 0)
      op->n++;
    else
      op->skipped++;
  } else if (res->err == -E2BIG || res->err == -EMSGSIZE) {
    op->skipped++; /* too big to be an event */
  } else if (res->err == -ENOENT) {
    /* Pruned, or a progress event replaced, since the listing: gone, not
     * invalid. */
  } else {
    read_fail(op, res->err, "reading a history event", res);
  }
  spot_buf_fini(&g->body);
  read_advance(op);
}

static void
read_advance(struct spot_history_read *op)
{
  int r = 0;

  if (op->state == R_DONE)
    return;
  if (op->err < 0) {
    if (op->active == 0)
      read_finish(op);
    return;
  }
  if (op->state == R_LIST) {
    if (op->active == 0) {
      r = read_list(op);
      if (r == 0)
        op->active++;
    }
  } else {
    for (size_t i = 0; i < READ_PARALLEL && op->next < op->keys.n; i++) {
      struct rget *g = &op->gets[i];
      if (g->s3op != NULL)
        continue;
      g->op = op;
      spot_buf_init(&g->body, SPOT_HIST_EVENT_MAX);
      r = spot_s3_get(op->cfg.c.s3, op->cfg.bucket, op->keys.keys[op->next], 0,
                      0, NULL, &g->body, read_get_cb, g, &g->s3op);
      if (r < 0)
        break;
      op->next++;
      op->active++;
    }
  }
  if (r < 0)
    read_fail(op, r, "reading the job history", NULL);
  if (op->active == 0 && (op->err < 0 || op->state == R_GET))
    read_finish(op);
}

int
spot_history_read(uv_loop_t *loop, const struct spot_store_config *cfg,
                  spot_history_read_cb cb, void *data,
                  struct spot_history_read **out)
{
  struct spot_history_read *op;
  int r;

  if (loop == NULL || cfg == NULL || cfg->s3 == NULL || cb == NULL)
    return -EINVAL;
  op = calloc(1, sizeof(*op));
  if (op == NULL)
    return -ENOMEM;
  r = spot__store_cfg_copy(&op->cfg, cfg);
  if (r < 0) {
    free(op);
    return r;
  }
  op->cb = cb;
  op->data = data;
  op->state = R_LIST; /* initial state */
  r = read_list(op);
  if (r < 0) {
    spot__store_cfg_fini(&op->cfg);
    free(op);
    return r;
  }
  op->active++;
  if (out != NULL)
    *out = op;
  return 0;
}

void
spot_history_read_cancel(struct spot_history_read *op)
{
  struct spot_s3_op *ops[READ_PARALLEL + 1];
  size_t n = 0;

  if (op == NULL || op->state == R_DONE)
    return;
  read_fail(op, -ECANCELED, "cancelled", NULL);
  if (op->s3op != NULL)
    ops[n++] = op->s3op;
  for (size_t i = 0; i < READ_PARALLEL; i++)
    if (op->gets[i].s3op != NULL)
      ops[n++] = op->gets[i].s3op;
  /* The callbacks come from the loop; the last one finishes and frees
   * op. */
  for (size_t i = 0; i < n; i++)
    spot_s3_cancel(ops[i]);
}

/* ---- metrics file ------------------------------------------------------ */

static int
write_all(int fd, const char *p, size_t n)
{
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return -errno;
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

int
spot_metrics_write_file(const char *path, const char *text)
{
  char tmp[4096], dir[4096];
  const char *slash;
  int fd, r, dfd;

  if (path == NULL || text == NULL ||
      (size_t)snprintf(tmp, sizeof(tmp), "%s.tmp-" SPOT_MKTEMP_SUFFIX, path) >=
          sizeof(tmp))
    return -EINVAL;
  fd = mkstemp(tmp);
  if (fd < 0)
    return -errno;
  r = write_all(fd, text, strlen(text));
  if (r == 0 && fchmod(fd, 0644) < 0)
    r = -errno;
  if (r == 0 && fsync(fd) < 0)
    r = -errno;
  if (close(fd) < 0 && r == 0)
    r = -errno;
  if (r == 0 && rename(tmp, path) < 0)
    r = -errno;
  if (r < 0) {
    (void)unlink(tmp);
    return r;
  }
  /* The rename itself is durable once the folder is synced. */
  slash = strrchr(path, '/');
  if (slash == NULL)
    spot_strlcpy(dir, ".", sizeof(dir));
  else
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash == path ? 1 : slash - path),
             path);
  dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)fsync(dfd);
    close(dfd);
  }
  return 0;
}
