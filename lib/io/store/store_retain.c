/* Push, retention after a commit: keep the newest `keep` committed
 * checkpoints, abort multipart uploads older than stale_upload_age_ms.
 *
 *   LIST           list checkpoints/ (page by page)
 *   READ           GET each manifest (404: not committed, kept)
 *   READ_TOMB      after a 404: GET NAME/RETIRED (404: a push in
 *                  progress or a leftover, kept; 200: a retired
 *                  checkpoint whose objects are left to collect)
 *   TOMB_PUT       PUT NAME/RETIRED for the oldest beyond `keep`
 *   DEL_MANIFEST   delete its manifest first, so a half-deleted
 *                  checkpoint is never seen as committed
 *   DEL_LIST       list a page of what is left of it
 *   DEL_PAGE       delete that page but the objects a kept checkpoint
 *                  references (manifest.h "References"), then DEL_LIST
 *                  again; when only referenced objects and RETIRED are
 *                  left, they stay, and RETIRED says so to later runs,
 *                  which delete each once no kept manifest references it
 *                  (then RETIRED last)
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

#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"
#include "io/store/store_push.h"

static const char *const retain_state_names[] = {
    "list",     "read",     "read-retired", "retire",        "del-manifest",
    "del-list", "del-page", "uploads-list", "uploads-abort", "done",
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
  for (size_t i = 0; i < rt->nentries; i++) {
    free(rt->entries[i].name);
    for (size_t j = 0; j < rt->entries[i].nrefs; j++)
      free(rt->entries[i].refs[j]);
    free(rt->entries[i].refs);
  }
  free(rt->entries);
  for (size_t i = 0; i < rt->nkept_refs; i++)
    free(rt->kept_refs[i]);
  free(rt->kept_refs);
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
    e->nrefs = 0;
    e->refs = m->nrefs > 0 ? calloc(m->nrefs, sizeof(char *)) : NULL;
    for (size_t i = 0; e->refs != NULL && i < m->nrefs; i++) {
      e->refs[i] =
          spot__store_key(&op->b.cfg.c, m->refs[i].name, m->refs[i].key);
      if (e->refs[i] == NULL)
        break;
      e->nrefs++;
    }
    if (e->name != NULL && e->nrefs == m->nrefs) {
      rt->nentries++;
    } else {
      /* kept, and what it references unknown: delete nothing */
      warn(op, "reading a manifest", NULL);
      rt->nentries = 0;
      rt->read_idx = rt->nnames;
      free(e->name);
      for (size_t i = 0; i < e->nrefs; i++)
        free(e->refs[i]);
      free(e->refs);
      memset(e, 0, sizeof(*e));
      spot_manifest_free(m);
      return;
    }
    spot_manifest_free(m);
  } else if (res->err == -ENOENT) {
    rt->read_tomb = true; /* is it a retired one? */
    return;
  } else if (res->err < 0 || m == NULL) {
    /* unreadable: it may reference anything, so delete nothing */
    warn(op, "reading a manifest", res->err < 0 ? res : NULL);
    rt->nentries = 0;
    rt->read_idx = rt->nnames;
    return;
  }
  rt->read_idx++;
}

/* READ_TOMB: NAME/RETIRED exists: a retired checkpoint to collect. */
static void
got_tomb(struct push_op *op, const struct spot_s3_result *res)
{
  struct retain *rt = &op->retain;

  rt->read_tomb = false;
  if (res->err == 0) {
    struct retain_entry *e = &rt->entries[rt->nentries];

    e->name = strdup(rt->names[rt->read_idx]);
    e->created_ms = -1; /* sorts after every committed one */
    e->step = -1;
    e->retired = true;
    if (e->name != NULL)
      rt->nentries++;
  }
  rt->read_idx++;
}

static int
cmp_str(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Whether del_idx stays: among the newest keep, or the one just pushed. */
static bool
entry_kept(const struct push_op *op, size_t i)
{
  const struct retain_entry *e = &op->retain.entries[i];

  return e->name == NULL || strcmp(e->name, op->b.name) == 0 ||
         (!e->retired && i < op->b.cfg.c.keep);
}

/* The sorted set of objects the kept checkpoints reference. */
static int
collect_kept_refs(struct push_op *op)
{
  struct retain *rt = &op->retain;
  size_t n = 0;

  for (size_t i = 0; i < rt->nentries; i++)
    if (entry_kept(op, i))
      n += rt->entries[i].nrefs;
  if (n == 0)
    return 0;
  rt->kept_refs = calloc(n, sizeof(char *));
  if (rt->kept_refs == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < rt->nentries; i++) {
    struct retain_entry *e = &rt->entries[i];

    if (!entry_kept(op, i))
      continue;
    for (size_t j = 0; j < e->nrefs; j++) {
      rt->kept_refs[rt->nkept_refs] = strdup(e->refs[j]);
      if (rt->kept_refs[rt->nkept_refs] == NULL)
        return -ENOMEM;
      rt->nkept_refs++;
    }
  }
  qsort(rt->kept_refs, rt->nkept_refs, sizeof(char *), cmp_str);
  return 0;
}

static bool
referenced(const struct retain *rt, const char *key)
{
  return rt->nkept_refs > 0 && bsearch(&key, rt->kept_refs, rt->nkept_refs,
                                       sizeof(char *), cmp_str) != NULL;
}

/* Whether key is NAME/RETIRED of the checkpoint being deleted. */
static bool
is_tomb(const struct push_op *op, const char *key)
{
  const char *name = op->retain.entries[op->retain.del_idx].name;
  size_t kl = strlen(key), tl = strlen(SPOT__STORE_RETIRED);

  return kl > tl + strlen(name) + 1 && key[kl - tl - 1] == '/' &&
         strcmp(key + kl - tl, SPOT__STORE_RETIRED) == 0 &&
         strncmp(key + kl - tl - 1 - strlen(name), name, strlen(name)) == 0 &&
         key[kl - tl - 2 - strlen(name)] == '/';
}

/* DEL_LIST: the page to delete next, or the next checkpoint. */
static void
got_del_list(struct push_op *op, const struct spot_s3_result *res)
{
  struct retain *rt = &op->retain;

  size_t tomb = res->n_objects, kept = 0;

  free_del_keys(rt);
  if (res->n_objects == 0) {
    rt->del_idx++;
    set_state(op, RETAIN_DEL_MANIFEST);
    return;
  }
  rt->del_keys = calloc(res->n_objects + 1, sizeof(char *));
  if (rt->del_keys == NULL) {
    warn(op, "deleting an old checkpoint", NULL);
    set_state(op, RETAIN_UPLOADS_LIST);
    return;
  }
  for (size_t i = 0; i < res->n_objects; i++) {
    const char *key = res->objects[i].key;

    if (is_tomb(op, key)) {
      tomb = i; /* deleted last, once nothing else is left */
      continue;
    }
    if (referenced(rt, key)) {
      kept++;
      continue;
    }
    rt->del_keys[rt->ndel_keys] = strdup(key);
    if (rt->del_keys[rt->ndel_keys] == NULL)
      break;
    rt->ndel_keys++;
  }
  if (rt->ndel_keys == 0 && kept == 0 && tomb < res->n_objects)
    rt->del_keys[rt->ndel_keys] = strdup(res->objects[tomb].key);
  if (rt->del_keys[rt->ndel_keys] != NULL)
    rt->ndel_keys++;
  if (rt->ndel_keys == 0) {
    /* what is left is referenced by kept checkpoints: stays, RETIRED too */
    log_info("push name=%s retention: %s keeps %zu objects that kept "
             "checkpoints reference",
             op->b.name, rt->entries[rt->del_idx].name, kept);
    rt->del_idx++;
    set_state(op, RETAIN_DEL_MANIFEST);
    return;
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
  case RETAIN_READ_TOMB:
    got_tomb(op, res);
    set_state(op, RETAIN_READ);
    break;
  case RETAIN_TOMB_PUT:
    if (failed) {
      warn(op, "retiring an old checkpoint", res);
      set_state(op, RETAIN_UPLOADS_LIST);
    } else {
      set_state(op, RETAIN_DEL_MANIFEST);
    }
    break;
  case RETAIN_DEL_MANIFEST:
  case RETAIN_DEL_LIST:
  case RETAIN_DEL_PAGE:
    if (failed) {
      warn(op, "deleting an old checkpoint", res);
      set_state(op, RETAIN_UPLOADS_LIST);
    } else if (rt->state == RETAIN_DEL_MANIFEST) {
      if (!rt->entries[rt->del_idx].retired)
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

  if (x->retired != y->retired)
    return x->retired ? 1 : -1;
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
  if (rt->read_tomb) {
    set_state(op, RETAIN_READ_TOMB);
    spot_buf_fini(&op->body);
    spot_buf_init(&op->body, 64);
    key = spot__store_key(&op->b.cfg.c, rt->names[rt->read_idx],
                          SPOT__STORE_RETIRED);
    if (key == NULL)
      return -ENOMEM;
    r = spot_s3_get(op->b.cfg.c.s3, op->b.cfg.bucket, key, 0, 0, NULL,
                    &op->body, retain_cb, op, &op->s3op);
    free(key);
    return r;
  }
  if (rt->read_idx >= rt->nnames) {
    bool by_step = true;

    for (size_t i = 0; i < rt->nentries; i++)
      if (rt->entries[i].step < 0 && !rt->entries[i].retired)
        by_step = false;
    if (rt->nentries > 1)
      qsort_r(rt->entries, rt->nentries, sizeof(*rt->entries), cmp_entries,
              &by_step);
    r = collect_kept_refs(op);
    if (r < 0)
      return r;
    rt->del_idx = 0;
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

  while (rt->del_idx < rt->nentries && entry_kept(op, rt->del_idx))
    rt->del_idx++;
  if (rt->del_idx >= rt->nentries) {
    set_state(op, RETAIN_UPLOADS_LIST);
    return 1;
  }
  if (!rt->entries[rt->del_idx].retired && rt->state == RETAIN_DEL_MANIFEST &&
      !rt->tomb_done) {
    /* RETIRED first: what outlives the manifest is found again */
    char *key = spot__store_key(&op->b.cfg.c, rt->entries[rt->del_idx].name,
                                SPOT__STORE_RETIRED);
    int r;

    if (key == NULL)
      return -ENOMEM;
    rt->tomb_done = true;
    set_state(op, RETAIN_TOMB_PUT);
    r = spot_s3_put(op->b.cfg.c.s3, op->b.cfg.bucket, key, "retired\n", 8, 0,
                    retain_cb, op, &op->s3op);
    free(key);
    return r;
  }
  rt->tomb_done = false;
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
