/* Push, retention after a commit: keep the newest `keep` committed
 * checkpoints, abort multipart uploads older than stale_upload_age_ms.
 *
 *   LIST           list checkpoints/ (page by page)
 *   READ           GET each manifest (404: not committed, kept)
 *   DEL_MANIFEST   delete the oldest beyond `keep`'s manifest first, so a
 *                  half-deleted checkpoint is never seen as committed
 *   DEL_LIST       list a page of what is left of it
 *   DEL_PAGE       delete that page, then DEL_LIST again until empty
 *   UPLOADS_LIST   list multipart uploads under checkpoints/
 *   UPLOADS_ABORT  abort the stale ones
 *   DONE
 *
 * Best effort: the checkpoint is already committed, so trouble here
 * becomes the push's warning, never an error. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsm.h"
#include "log.h"
#include "store_push.h"
#include "util.h"

static const char *const retain_state_names[] = {
    "list",     "read",         "del-manifest",  "del-list",
    "del-page", "uploads-list", "uploads-abort", "done",
};
_Static_assert(SPOT_ARRAY_SIZE(retain_state_names) == RETAIN_STATE_LAST,
               "retain_state_names");

static void step(struct push_op *op);

static const struct spot_fsm retain_fsm = {
    "push retain", retain_state_names, RETAIN_STATE_LAST, NULL, 0,
    SPOT_LOG_DEBUG};

#define set_state(op, s) set_state_at((op), (s), __FILE__, __LINE__)
static void
set_state_at(struct push_op *op, enum retain_state s, const char *file,
             int line)
{
  if (spot_fsm_move_detail(&retain_fsm, op->retain.state, s, file, line,
                           "name=%s", op->b.name) > 0)
    op->retain.state = s;
}

static void
warn(struct push_op *op, const char *what, const struct spot_s3_result *res)
{
  char tmp[512];

  if (op->warning[0] == '\0')
    snprintf(op->warning, sizeof(op->warning), "retention: %s: %s", what,
             res != NULL ? spot_s3_strerror(res, tmp, sizeof(tmp)) : "failed");
}

static void
free_del_keys(struct retain *rt)
{
  for (size_t i = 0; i < rt->ndel_keys; i++)
    free(rt->del_keys[i]);
  free(rt->del_keys);
  rt->del_keys = NULL;
  rt->ndel_keys = 0;
}

void
spot__retain_fini(struct push_op *op)
{
  struct retain *rt = &op->retain;

  for (size_t i = 0; i < rt->nnames; i++)
    free(rt->names[i]);
  free(rt->names);
  free(rt->token);
  for (size_t i = 0; i < rt->nentries; i++)
    free(rt->entries[i].name);
  free(rt->entries);
  free_del_keys(rt);
  for (size_t i = 0; i < rt->nuploads; i++) {
    free((char *)rt->uploads[i].key);
    free((char *)rt->uploads[i].upload_id);
    free((char *)rt->uploads[i].initiated);
  }
  free(rt->uploads);
}

static int
add_name(struct retain *rt, char *name)
{
  if (rt->nnames == rt->names_alloc) {
    size_t n = rt->names_alloc ? rt->names_alloc * 2 : 16;
    char **nn = realloc(rt->names, n * sizeof(*nn));
    if (nn == NULL)
      return -ENOMEM;
    rt->names = nn;
    rt->names_alloc = n;
  }
  rt->names[rt->nnames++] = name;
  return 0;
}

static void
got_list(struct push_op *op, const struct spot_s3_result *res)
{
  struct retain *rt = &op->retain;

  for (size_t i = 0; i < res->n_common_prefixes; i++) {
    char *name = NULL;
    int r = spot__store_prefix_name(res->common_prefixes[i], &name);

    if (r == -EINVAL)
      continue;
    if (r < 0 || add_name(rt, name) < 0) {
      free(name);
      warn(op, "listing checkpoints", NULL);
      return;
    }
  }
  free(rt->token);
  rt->token = NULL;
  if (res->next_token != NULL) {
    rt->token = strdup(res->next_token);
    if (rt->token != NULL)
      return; /* next page */
  }
  rt->read_idx = 0;
  set_state(op, RETAIN_READ);
}

static void
got_manifest(struct push_op *op, const struct spot_s3_result *res)
{
  struct retain *rt = &op->retain;
  struct spot_manifest *m = NULL;
  char err[256];

  /* 404: not committed (a leftover or a push in progress): kept. */
  if (res->err == 0 &&
      spot_manifest_parse(spot_buf_str(&op->body), op->body.len, &m, err,
                          sizeof(err)) == 0) {
    struct retain_entry *e = &rt->entries[rt->nentries];
    e->name = strdup(rt->names[rt->read_idx]);
    e->created_ms = m->created_ms;
    e->step = m->step >= 0 ? m->step : spot_ckpt_name_step(m->name);
    if (e->name != NULL)
      rt->nentries++;
    spot_manifest_free(m);
  }
  rt->read_idx++;
}

/* DEL_LIST: the page to delete next, or the next checkpoint. */
static void
got_del_list(struct push_op *op, const struct spot_s3_result *res)
{
  struct retain *rt = &op->retain;

  free_del_keys(rt);
  if (res->n_objects == 0) {
    rt->del_idx++;
    set_state(op, RETAIN_DEL_MANIFEST);
    return;
  }
  rt->del_keys = calloc(res->n_objects, sizeof(char *));
  if (rt->del_keys == NULL) {
    warn(op, "deleting an old checkpoint", NULL);
    set_state(op, RETAIN_UPLOADS_LIST);
    return;
  }
  for (size_t i = 0; i < res->n_objects; i++) {
    rt->del_keys[i] = strdup(res->objects[i].key);
    if (rt->del_keys[i] == NULL)
      break;
    rt->ndel_keys++;
  }
  set_state(op, RETAIN_DEL_PAGE);
}

static void
got_uploads(struct push_op *op, const struct spot_s3_result *res)
{
  struct retain *rt = &op->retain;
  int64_t now = spot_now_wall_ms();

  rt->uploads = calloc(res->n_uploads + 1, sizeof(*rt->uploads));
  if (rt->uploads == NULL) {
    set_state(op, RETAIN_DONE);
    return;
  }
  for (size_t i = 0; i < res->n_uploads; i++) {
    const struct spot_s3_upload_info *u = &res->uploads[i];
    struct spot_s3_upload_info *d = &rt->uploads[rt->nuploads];
    int64_t init;

    if (spot_rfc3339_parse(u->initiated, &init) < 0 ||
        now - init < (int64_t)op->b.cfg.c.stale_upload_age_ms)
      continue;
    d->key = strdup(u->key);
    d->upload_id = strdup(u->upload_id);
    d->initiated = strdup(u->initiated);
    rt->nuploads++;
    if (d->key == NULL || d->upload_id == NULL || d->initiated == NULL)
      break;
  }
  rt->upload_idx = 0;
  set_state(op, RETAIN_UPLOADS_ABORT);
}

static void
retain_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;
  struct retain *rt = &op->retain;
  bool failed = res->err < 0 || res->n_failed_keys > 0;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (spot__store_cancelled(&op->b)) {
    set_state(op, RETAIN_DONE);
    spot__push_advance(op);
    return;
  }
  switch (rt->state) {
  case RETAIN_LIST:
    if (res->err < 0) {
      warn(op, "listing checkpoints", res);
      set_state(op, RETAIN_UPLOADS_LIST);
    } else {
      got_list(op, res);
    }
    break;
  case RETAIN_READ:
    got_manifest(op, res);
    break;
  case RETAIN_DEL_MANIFEST:
  case RETAIN_DEL_LIST:
  case RETAIN_DEL_PAGE:
    if (failed) {
      warn(op, "deleting an old checkpoint", res);
      set_state(op, RETAIN_UPLOADS_LIST);
    } else if (rt->state == RETAIN_DEL_MANIFEST) {
      op->deleted++;
      set_state(op, RETAIN_DEL_LIST);
    } else if (rt->state == RETAIN_DEL_LIST) {
      got_del_list(op, res);
    } else {
      free_del_keys(rt);
      set_state(op, RETAIN_DEL_LIST); /* list again until nothing is left */
    }
    break;
  case RETAIN_UPLOADS_LIST:
    if (res->err < 0) {
      warn(op, "listing multipart uploads", res);
      set_state(op, RETAIN_DONE);
    } else {
      got_uploads(op, res);
    }
    break;
  case RETAIN_UPLOADS_ABORT:
    if (res->err == 0 || res->err == -ENOENT)
      op->aborted++;
    rt->upload_idx++;
    break;
  default:
    break;
  }
  step(op);
}

/* Newest first: by the trainer's step when every checkpoint has a known
 * one, else by when each was committed. */
static int
cmp_entries(const void *a, const void *b, void *data)
{
  const struct retain_entry *x = a, *y = b;
  const bool *by_step = data;

  if (*by_step && x->step != y->step)
    return x->step > y->step ? -1 : 1;
  if (x->created_ms != y->created_ms)
    return x->created_ms > y->created_ms ? -1 : 1;
  return strcmp(y->name, x->name);
}

/* READ: the next manifest; 1 when all are read (then DEL_MANIFEST). */
static int
read_next(struct push_op *op)
{
  struct retain *rt = &op->retain;
  char *key;
  int r;

  if (rt->entries == NULL)
    rt->entries = calloc(rt->nnames + 1, sizeof(*rt->entries));
  if (rt->entries == NULL)
    return -ENOMEM;
  if (rt->read_idx >= rt->nnames) {
    bool by_step = true;

    for (size_t i = 0; i < rt->nentries; i++)
      if (rt->entries[i].step < 0)
        by_step = false;
    if (rt->nentries > 1)
      qsort_r(rt->entries, rt->nentries, sizeof(*rt->entries), cmp_entries,
              &by_step);
    rt->del_idx = op->b.cfg.c.keep;
    set_state(op, RETAIN_DEL_MANIFEST);
    return 1;
  }
  spot_buf_fini(&op->body);
  spot_buf_init(&op->body, SPOT__STORE_MANIFEST_CAP);
  key = spot__store_key(&op->b.cfg.c, rt->names[rt->read_idx],
                        SPOT_MANIFEST_NAME);
  if (key == NULL)
    return -ENOMEM;
  r = spot_s3_get(op->b.cfg.c.s3, op->b.cfg.bucket, key, 0, 0, NULL, &op->body,
                  retain_cb, op, &op->s3op);
  free(key);
  return r;
}

/* DEL_MANIFEST: the oldest beyond keep, never the one just pushed; 1
 * when none is left (then UPLOADS_LIST). */
static int
delete_manifest(struct push_op *op)
{
  struct retain *rt = &op->retain;

  while (rt->del_idx < rt->nentries &&
         (rt->entries[rt->del_idx].name == NULL ||
          strcmp(rt->entries[rt->del_idx].name, op->b.name) == 0))
    rt->del_idx++;
  if (rt->del_idx >= rt->nentries) {
    set_state(op, RETAIN_UPLOADS_LIST);
    return 1;
  }
  free_del_keys(rt);
  rt->del_keys = calloc(1, sizeof(char *));
  if (rt->del_keys == NULL)
    return -ENOMEM;
  rt->del_keys[0] = spot__store_key(&op->b.cfg.c, rt->entries[rt->del_idx].name,
                                    SPOT_MANIFEST_NAME);
  if (rt->del_keys[0] == NULL)
    return -ENOMEM;
  rt->ndel_keys = 1;
  return spot_s3_delete_objects(op->b.cfg.c.s3, op->b.cfg.bucket,
                                (const char *const *)rt->del_keys, 1, retain_cb,
                                op, &op->s3op);
}

/* UPLOADS_ABORT: the next stale upload; 1 when none is left. */
static int
abort_next(struct push_op *op)
{
  struct retain *rt = &op->retain;

  while (rt->upload_idx < rt->nuploads &&
         (rt->uploads[rt->upload_idx].key == NULL ||
          rt->uploads[rt->upload_idx].upload_id == NULL))
    rt->upload_idx++;
  if (rt->upload_idx >= rt->nuploads) {
    set_state(op, RETAIN_DONE);
    return 1;
  }
  return spot_s3_mpu_abort(
      op->b.cfg.c.s3, op->b.cfg.bucket, rt->uploads[rt->upload_idx].key,
      rt->uploads[rt->upload_idx].upload_id, retain_cb, op, &op->s3op);
}

/* The list requests: checkpoints, a deleted one's objects, uploads. */
static int
list(struct push_op *op)
{
  struct retain *rt = &op->retain;
  const struct spot__store_cfg *cfg = &op->b.cfg;
  char *key;
  int r;

  if (rt->state == RETAIN_DEL_LIST)
    key = spot__store_key(&cfg->c, rt->entries[rt->del_idx].name, "");
  else
    key = spot__store_key(&cfg->c, NULL, "checkpoints/");
  if (key == NULL)
    return -ENOMEM;
  if (rt->state == RETAIN_LIST)
    r = spot_s3_list(cfg->c.s3, cfg->bucket, key, "/", rt->token, 0, retain_cb,
                     op, &op->s3op);
  else if (rt->state == RETAIN_DEL_LIST)
    r = spot_s3_list(cfg->c.s3, cfg->bucket, key, NULL, NULL, 1000, retain_cb,
                     op, &op->s3op);
  else
    r = spot_s3_list_uploads(cfg->c.s3, cfg->bucket, key, retain_cb, op,
                             &op->s3op);
  free(key);
  return r;
}

/* Issues the next request, or hands back to the push when DONE. */
static void
step(struct push_op *op)
{
  struct retain *rt = &op->retain;
  int r = 1;

  while (r == 1 && rt->state != RETAIN_DONE) {
    switch (rt->state) {
    case RETAIN_READ:
      r = read_next(op);
      break;
    case RETAIN_DEL_MANIFEST:
      r = delete_manifest(op);
      break;
    case RETAIN_DEL_PAGE:
      r = spot_s3_delete_objects(op->b.cfg.c.s3, op->b.cfg.bucket,
                                 (const char *const *)rt->del_keys,
                                 rt->ndel_keys, retain_cb, op, &op->s3op);
      break;
    case RETAIN_UPLOADS_ABORT:
      r = abort_next(op);
      break;
    default:
      r = list(op);
      break;
    }
  }
  if (r == 0) {
    op->b.active_s3++;
    return;
  }
  if (r < 0 && op->warning[0] == '\0')
    snprintf(op->warning, sizeof(op->warning), "retention stopped: %s",
             strerror(-r));
  set_state(op, RETAIN_DONE);
  spot__push_advance(op);
}

void
spot__retain_start(struct push_op *op)
{
  spot__push_set_state(op, PUSH_RETAIN);
  spot__store_progress(&op->b, SPOT_STORE_PHASE_RETAIN);
  set_state(op, op->b.cfg.c.keep == 0 ? RETAIN_UPLOADS_LIST : RETAIN_LIST);
  step(op);
}
