/* List: the checkpoints of a job, committed ones first (newest first),
 * then uncommitted leftovers. LATEST -> list NAME/ prefixes -> GET each
 * manifest, a few at a time. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fsm.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/util.h"
#include "io/store/store_internal.h"

#define LIST_PARALLEL 8
#define LIST_NAMES_MAX 100000

enum list_state {
  L_LATEST,
  L_NAMES,
  L_MANIFESTS,
  L_DONE,
};

static const char *const list_state_names[] = {
    "latest",
    "names",
    "manifests",
    "done",
};

struct lentry {
  struct spot_store_entry e;
  char *name;
  char *problem;
};

struct lget {
  struct list_op *op;
  size_t idx;
  struct spot_buf body;
  struct spot_s3_op *s3op;
};

struct list_op {
  struct spot__store_op b; /* first: the op handle is its address */
  enum list_state state;
  spot_store_list_cb cb;
  char latest[SPOT__STORE_LATEST_CAP + 1];
  struct spot_buf body;
  struct spot_s3_op *s3op;
  char *token;
  struct lentry *entries;
  size_t n, alloc, next;
  struct lget gets[LIST_PARALLEL];
};

static void advance(struct list_op *op);

static const struct spot_fsm list_fsm = {
    "list", list_state_names, SPOT_ARRAY_SIZE(list_state_names), NULL,
    0,      SPOT_LOG_DEBUG};

#define set_state(op, s) set_state_at((op), (s), __FILE__, __LINE__)
static void
set_state_at(struct list_op *op, enum list_state s, const char *file, int line)
{
  if (spot_fsm_move_detail(&list_fsm, op->state, s, file, line, "name=%s",
                           op->b.name != NULL ? op->b.name : "?") > 0)
    op->state = s;
}

static void
op_free(struct spot__store_op *b)
{
  struct list_op *op = (struct list_op *)(void *)b;

  for (size_t i = 0; i < op->n; i++) {
    free(op->entries[i].name);
    free(op->entries[i].problem);
  }
  free(op->entries);
  for (size_t i = 0; i < LIST_PARALLEL; i++)
    spot_buf_fini(&op->gets[i].body);
  spot_buf_fini(&op->body);
  free(op->token);
}

/* Newest first: by the trainer's step when every committed checkpoint
 * has a known one (every one is checked in finish()), else by when each was
 * committed: a commit refused by LATEST's order is never the newest by step. */
static int
cmp_entries(const void *a, const void *b, void *data)
{
  const struct lentry *x = a, *y = b;
  const bool *by_step = data;

  if (x->e.committed != y->e.committed)
    return x->e.committed ? -1 : 1;
  if (*by_step && x->e.committed && x->e.step != y->e.step)
    return x->e.step > y->e.step ? -1 : 1;
  if (x->e.created_ms != y->e.created_ms)
    return x->e.created_ms > y->e.created_ms ? -1 : 1;
  return strcmp(x->name, y->name);
}

static void
finish(struct list_op *op)
{
  struct spot_store_list_result res;
  struct spot_store_entry *arr = NULL;

  set_state(op, L_DONE);
  op->b.life = SPOT__STORE_FINISHED;
  memset(&res, 0, sizeof(res));
  if (op->b.err == 0 && op->n > 0) {
    bool by_step = true;

    for (size_t i = 0; i < op->n; i++)
      if (op->entries[i].e.committed && op->entries[i].e.step < 0)
        by_step = false;
    qsort_r(op->entries, op->n, sizeof(*op->entries), cmp_entries, &by_step);
    arr = calloc(op->n, sizeof(*arr));
    if (arr == NULL) {
      op->b.err = -ENOMEM;
    } else {
      for (size_t i = 0; i < op->n; i++) {
        arr[i] = op->entries[i].e;
        arr[i].name = op->entries[i].name;
        arr[i].problem = op->entries[i].problem;
        arr[i].latest = strcmp(op->entries[i].name, op->latest) == 0;
      }
    }
  }
  if (op->b.err < 0 && op->b.msg[0] == '\0')
    snprintf(op->b.msg, sizeof(op->b.msg), "%s", strerror(-op->b.err));
  res.err = op->b.err;
  res.message = op->b.err < 0 ? op->b.msg : "";
  res.latest = op->latest;
  res.entries = op->b.err == 0 ? arr : NULL;
  res.n = op->b.err == 0 ? op->n : 0;
  op->cb(&res, op->b.data);
  free(arr);
  spot__store_close(&op->b);
}

static void
seq_cb(const struct spot_s3_result *res, void *data)
{
  struct list_op *op = data;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (op->state == L_LATEST) {
    if (res->err == 0) {
      size_t n = op->body.len;
      memcpy(op->latest, spot_buf_str(&op->body), n);
      op->latest[n] = '\0';
      while (n > 0 && (op->latest[n - 1] == '\n' || op->latest[n - 1] == ' '))
        op->latest[--n] = '\0';
      if (!spot_ckpt_name_valid(op->latest))
        op->latest[0] = '\0'; /* names nothing a list would show */
    } else if (res->err != -ENOENT) {
      spot__store_fail_s3(&op->b, "reading LATEST", res);
    }
    set_state(op, L_NAMES);
  } else if (res->err < 0) {
    spot__store_fail_s3(&op->b, "listing checkpoints", res);
  } else {
    for (size_t i = 0; i < res->n_common_prefixes; i++) {
      struct lentry *e;
      char *name = NULL;
      int r = spot__store_prefix_name(res->common_prefixes[i], &name);

      if (r == -EINVAL)
        continue;
      if (r < 0) {
        spot__store_fail(&op->b, r);
        break;
      }
      if (op->n >= LIST_NAMES_MAX) {
        free(name);
        break;
      }
      if (op->n == op->alloc) {
        size_t na = op->alloc ? op->alloc * 2 : 16;
        struct lentry *ne = realloc(op->entries, na * sizeof(*ne));
        if (ne == NULL) {
          free(name);
          spot__store_fail(&op->b, -ENOMEM);
          break;
        }
        op->entries = ne;
        op->alloc = na;
      }
      e = &op->entries[op->n];
      memset(e, 0, sizeof(*e));
      e->name = name;
      op->n++;
    }
    free(op->token);
    op->token = res->next_token != NULL ? strdup(res->next_token) : NULL;
    if (op->token == NULL)
      set_state(op, L_MANIFESTS);
  }
  advance(op);
}

static void
get_cb(const struct spot_s3_result *res, void *data)
{
  struct lget *g = data;
  struct list_op *op = g->op;
  struct lentry *e = &op->entries[g->idx];

  spot__store_s3_done(&op->b, &g->s3op, res);
  if (res->err == 0) {
    struct spot_manifest *m = NULL;
    char err[256];

    if (spot_manifest_parse(spot_buf_str(&g->body), g->body.len, &m, err,
                            sizeof(err)) == 0 &&
        strcmp(m->name, e->name) == 0) {
      e->e.committed = true;
      e->e.created_ms = m->created_ms;
      e->e.step = m->step >= 0 ? m->step : spot_ckpt_name_step(m->name);
      e->e.files = m->nfiles;
      e->e.raw_bytes = m->total_raw;
      e->e.stored_bytes = m->total_stored;
    } else {
      char p[400];
      snprintf(p, sizeof(p), "invalid manifest: %s",
               m != NULL ? "names another checkpoint" : err);
      e->problem = strdup(p);
    }
    spot_manifest_free(m);
  } else if (res->err != -ENOENT) {
    spot__store_fail_s3(&op->b, "reading a manifest", res);
  }
  spot_buf_fini(&g->body);
  advance(op);
}

static int
list_names(struct list_op *op)
{
  char *key = spot__store_key(&op->b.cfg.c, NULL, "checkpoints/");
  int r;

  if (key == NULL)
    return -ENOMEM;
  r = spot_s3_list(op->b.cfg.c.s3, op->b.cfg.bucket, key, "/", op->token, 0,
                   seq_cb, op, &op->s3op);
  free(key);
  if (r == 0)
    op->b.active_s3++;
  return r;
}

/* Keeps up to LIST_PARALLEL manifest GETs in flight. */
static int
get_manifests(struct list_op *op)
{
  for (size_t i = 0; i < LIST_PARALLEL && op->next < op->n; i++) {
    struct lget *g = &op->gets[i];
    char *key;
    int r;

    if (g->s3op != NULL || g->body.cap != 0)
      continue;
    key = spot__store_key(&op->b.cfg.c, op->entries[op->next].name,
                          SPOT_MANIFEST_NAME);
    if (key == NULL)
      return -ENOMEM;
    g->op = op;
    g->idx = op->next++;
    spot_buf_init(&g->body, SPOT__STORE_MANIFEST_CAP);
    r = spot_s3_get(op->b.cfg.c.s3, op->b.cfg.bucket, key, 0, 0, NULL, &g->body,
                    get_cb, g, &g->s3op);
    free(key);
    if (r < 0) {
      spot_buf_fini(&g->body);
      g->body.cap = 0;
      return r;
    }
    op->b.active_s3++;
  }
  return 0;
}

static void
advance(struct list_op *op)
{
  int r = 0;

  if (op->state == L_DONE)
    return;
  if (op->b.err == 0 && (op->b.active_s3 == 0 || op->state == L_MANIFESTS)) {
    if (op->state == L_NAMES)
      r = list_names(op);
    else if (op->state == L_MANIFESTS)
      r = get_manifests(op);
    if (r < 0)
      spot__store_fail_msg(&op->b, r, "%s", strerror(-r));
  }
  if (op->b.active_s3 > 0)
    return;
  if (op->b.err < 0 || (op->state == L_MANIFESTS && op->next >= op->n))
    finish(op);
}

static void
advance_cb(struct spot__store_op *b)
{
  advance((struct list_op *)(void *)b);
}

static void
cancel(struct spot__store_op *b)
{
  struct list_op *op = (struct list_op *)(void *)b;

  if (op->s3op != NULL)
    spot_s3_cancel(op->s3op);
  for (size_t i = 0; i < LIST_PARALLEL; i++)
    if (op->gets[i].s3op != NULL)
      spot_s3_cancel(op->gets[i].s3op);
}

static const struct spot__store_kind list_kind = {
    .name = "list",
    .advance = advance_cb,
    .cancel = cancel,
    .free = op_free,
};

int
spot_store_list(uv_loop_t *loop, const struct spot_store_config *cfg,
                spot_store_list_cb cb, void *data, struct spot_store_op **out)
{
  struct spot__store_op *b;
  struct list_op *op;
  char *key;
  int r;

  if (loop == NULL || cfg == NULL || cb == NULL)
    return -EINVAL;
  r = spot__store_op_new(sizeof(*op), &list_kind, loop, cfg, NULL, NULL, data,
                         &b);
  if (r < 0)
    return r;
  op = (struct list_op *)(void *)b;
  op->cb = cb;
  spot_buf_init(&op->body, SPOT__STORE_LATEST_CAP);
  key = spot__store_key(&op->b.cfg.c, NULL, "LATEST");
  r = key == NULL ? -ENOMEM
                  : spot_s3_get(op->b.cfg.c.s3, op->b.cfg.bucket, key, 0, 0,
                                NULL, &op->body, seq_cb, op, &op->s3op);
  free(key);
  if (r < 0) {
    spot__store_close(&op->b);
    return r;
  }
  op->b.active_s3++;
  if (out != NULL)
    *out = (struct spot_store_op *)(void *)op;
  return 0;
}
