/* List: the checkpoints of a job, committed ones first (newest first),
 * then uncommitted leftovers. LATEST -> list NAME/ prefixes -> GET each
 * manifest, a few at a time. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "manifest.h"
#include "store_internal.h"
#include "util.h"

#define LIST_PARALLEL 8
#define LIST_NAMES_MAX 100000

enum list_state {
  L_LATEST,
  L_NAMES,
  L_MANIFESTS,
  L_DONE,
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
  struct spot__store_hdr hdr;
  uv_loop_t *loop;
  struct spot__store_cfg cfg;
  enum list_state state;
  spot_store_list_cb cb;
  void *data;
  int err;
  char msg[768];
  bool cancelled;
  char latest[SPOT__STORE_LATEST_CAP + 1];
  struct spot_buf body;
  struct spot_s3_op *s3op;
  char *token;
  struct lentry *entries;
  size_t n, alloc, next;
  struct lget gets[LIST_PARALLEL];
  unsigned active;
  uv_idle_t idle; /* defers the final callback out of cancel() */
};

static void advance(struct list_op *op);

static void
op_free(struct list_op *op)
{
  for (size_t i = 0; i < op->n; i++) {
    free(op->entries[i].name);
    free(op->entries[i].problem);
  }
  free(op->entries);
  for (size_t i = 0; i < LIST_PARALLEL; i++)
    spot_buf_fini(&op->gets[i].body);
  spot_buf_fini(&op->body);
  free(op->token);
  spot__store_cfg_fini(&op->cfg);
  free(op);
}

static void
idle_close_cb(uv_handle_t *h)
{
  op_free(spot_container_of(h, struct list_op, idle));
}

static int
cmp_entries(const void *a, const void *b)
{
  const struct lentry *x = a, *y = b;

  if (x->e.committed != y->e.committed)
    return x->e.committed ? -1 : 1;
  if (x->e.created_ms != y->e.created_ms)
    return x->e.created_ms > y->e.created_ms ? -1 : 1;
  return strcmp(x->name, y->name);
}

static void
finish(struct list_op *op)
{
  struct spot_store_list_result res;
  struct spot_store_entry *arr = NULL;

  op->state = L_DONE;
  memset(&res, 0, sizeof(res));
  if (op->err == 0 && op->n > 0) {
    qsort(op->entries, op->n, sizeof(*op->entries), cmp_entries);
    arr = calloc(op->n, sizeof(*arr));
    if (arr == NULL) {
      op->err = -ENOMEM;
    } else {
      for (size_t i = 0; i < op->n; i++) {
        arr[i] = op->entries[i].e;
        arr[i].name = op->entries[i].name;
        arr[i].problem = op->entries[i].problem;
        arr[i].latest = strcmp(op->entries[i].name, op->latest) == 0;
      }
    }
  }
  if (op->err < 0 && op->msg[0] == '\0')
    snprintf(op->msg, sizeof(op->msg), "%s", strerror(-op->err));
  res.err = op->err;
  res.message = op->err < 0 ? op->msg : "";
  res.latest = op->latest;
  res.entries = op->err == 0 ? arr : NULL;
  res.n = op->err == 0 ? op->n : 0;
  op->cb(&res, op->data);
  free(arr);
  uv_close((uv_handle_t *)&op->idle, idle_close_cb);
}

static void
seq_cb(const struct spot_s3_result *res, void *data)
{
  struct list_op *op = data;

  op->active--;
  op->s3op = NULL;
  if (op->state == L_LATEST) {
    if (res->err == 0) {
      size_t n = op->body.len;
      memcpy(op->latest, spot_buf_str(&op->body), n);
      op->latest[n] = '\0';
      while (n > 0 && (op->latest[n - 1] == '\n' || op->latest[n - 1] == ' '))
        op->latest[--n] = '\0';
    } else if (res->err != -ENOENT) {
      spot__store_s3_msg(op->msg, sizeof(op->msg), "reading LATEST", res);
      op->err = res->err;
    }
    op->state = L_NAMES;
  } else if (res->err < 0) {
    spot__store_s3_msg(op->msg, sizeof(op->msg), "listing checkpoints", res);
    op->err = res->err;
  } else {
    for (size_t i = 0; i < res->n_common_prefixes; i++) {
      struct lentry *e;
      char *name = NULL;
      int r = spot__store_prefix_name(res->common_prefixes[i], &name);

      if (r == -EINVAL)
        continue;
      if (r < 0) {
        op->err = r;
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
          op->err = -ENOMEM;
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
      op->state = L_MANIFESTS;
  }
  advance(op);
}

static void
get_cb(const struct spot_s3_result *res, void *data)
{
  struct lget *g = data;
  struct list_op *op = g->op;
  struct lentry *e = &op->entries[g->idx];

  op->active--;
  g->s3op = NULL;
  if (res->err == 0) {
    struct spot_manifest *m = NULL;
    char err[256];

    if (spot_manifest_parse(spot_buf_str(&g->body), g->body.len, &m, err,
                            sizeof(err)) == 0 &&
        strcmp(m->name, e->name) == 0) {
      e->e.committed = true;
      e->e.created_ms = m->created_ms;
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
  } else if (res->err != -ENOENT && op->err == 0) {
    spot__store_s3_msg(op->msg, sizeof(op->msg), "reading a manifest", res);
    op->err = res->err;
  }
  spot_buf_fini(&g->body);
  advance(op);
}

static void
advance(struct list_op *op)
{
  int r = 0;
  char *key;

  if (op->state == L_DONE)
    return;
  if (op->err < 0 || op->cancelled) {
    if (op->err == 0)
      op->err = -ECANCELED;
    if (op->active == 0)
      finish(op);
    return;
  }
  if (op->active > 0 && op->state != L_MANIFESTS)
    return;
  switch (op->state) {
  case L_LATEST:
    return;
  case L_NAMES:
    key = spot__store_key(&op->cfg.c, NULL, "checkpoints/");
    if (key == NULL) {
      op->err = -ENOMEM;
      break;
    }
    r = spot_s3_list(op->cfg.c.s3, op->cfg.bucket, key, "/", op->token, 0,
                     seq_cb, op, &op->s3op);
    free(key);
    if (r == 0)
      op->active++;
    break;
  case L_MANIFESTS:
    for (size_t i = 0; i < LIST_PARALLEL && op->next < op->n; i++) {
      struct lget *g = &op->gets[i];
      if (g->s3op != NULL || g->body.cap != 0)
        continue;
      key = spot__store_key(&op->cfg.c, op->entries[op->next].name,
                            SPOT_MANIFEST_NAME);
      if (key == NULL) {
        op->err = -ENOMEM;
        break;
      }
      g->op = op;
      g->idx = op->next++;
      spot_buf_init(&g->body, SPOT__STORE_MANIFEST_CAP);
      r = spot_s3_get(op->cfg.c.s3, op->cfg.bucket, key, 0, 0, NULL, &g->body,
                      get_cb, g, &g->s3op);
      free(key);
      if (r < 0) {
        spot_buf_fini(&g->body);
        g->body.cap = 0;
        break;
      }
      op->active++;
    }
    if (op->active == 0 && op->next >= op->n)
      finish(op);
    break;
  default:
    break;
  }
  if (r < 0 && op->err == 0) {
    op->err = r;
    snprintf(op->msg, sizeof(op->msg), "%s", strerror(-r));
  }
  if (op->err < 0 && op->active == 0 && op->state != L_DONE)
    finish(op);
}

void
spot__store_list_cancel(struct spot_store_op *sop)
{
  struct list_op *op = (struct list_op *)(void *)sop;

  if (op->state == L_DONE || op->cancelled)
    return;
  op->cancelled = true;
  if (op->s3op != NULL)
    spot_s3_cancel(op->s3op);
  for (size_t i = 0; i < LIST_PARALLEL; i++)
    if (op->gets[i].s3op != NULL)
      spot_s3_cancel(op->gets[i].s3op);
}

int
spot_store_list(uv_loop_t *loop, const struct spot_store_config *cfg,
                spot_store_list_cb cb, void *data, struct spot_store_op **out)
{
  struct list_op *op;
  char *key;
  int r;

  if (loop == NULL || cfg == NULL || cb == NULL)
    return -EINVAL;
  op = calloc(1, sizeof(*op));
  if (op == NULL)
    return -ENOMEM;
  op->hdr.kind = SPOT__STORE_LIST;
  op->loop = loop;
  r = spot__store_cfg_copy(&op->cfg, cfg);
  if (r < 0) {
    free(op);
    return r;
  }
  op->cb = cb;
  op->data = data;
  spot_buf_init(&op->body, SPOT__STORE_LATEST_CAP);
  r = uv_idle_init(loop, &op->idle);
  if (r < 0) {
    op_free(op);
    return r;
  }
  key = spot__store_key(&op->cfg.c, NULL, "LATEST");
  r = key == NULL ? -ENOMEM
                  : spot_s3_get(op->cfg.c.s3, op->cfg.bucket, key, 0, 0, NULL,
                                &op->body, seq_cb, op, &op->s3op);
  free(key);
  if (r < 0) {
    uv_close((uv_handle_t *)&op->idle, idle_close_cb);
    return r;
  }
  op->active++;
  if (out != NULL)
    *out = (struct spot_store_op *)(void *)op;
  return 0;
}

void
spot_store_cancel(struct spot_store_op *op)
{
  const struct spot__store_hdr *h = (const struct spot__store_hdr *)(void *)op;

  if (op == NULL)
    return;
  switch (h->kind) {
  case SPOT__STORE_PUSH:
    spot__store_push_cancel(op);
    break;
  case SPOT__STORE_RESTORE:
    spot__store_restore_cancel(op);
    break;
  case SPOT__STORE_LIST:
    spot__store_list_cancel(op);
    break;
  }
}
