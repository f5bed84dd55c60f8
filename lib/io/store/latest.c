/* LATEST only moves forward. See latest.h.
 *
 *   LEASE  (with a lease owner) GET ROOT/LEASE: still ours at our epoch?
 *   READ   GET ROOT/LATEST: its name, ETag, order and step; the check
 *          before a manifest (spot_latest_fence) ends here
 *   WRITE  PUT ROOT/LATEST If-Match (If-None-Match when absent); on 412
 *          back to READ (ours after all, the other If-Match form, or
 *          someone moved it: judge again)
 *   DONE   the callback, then the op is freed (it owns no handle) */
#include "io/store/latest.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "core/fsm.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/util.h"

enum latest_state {
  LT_LEASE,
  LT_READ,
  LT_WRITE,
  LT_DONE,
  LT_STATE_LAST,
};

static const char *const state_names[LT_STATE_LAST] = {
    [LT_LEASE] = "lease",
    [LT_READ] = "read",
    [LT_WRITE] = "write",
    [LT_DONE] = "done",
};

struct spot_latest_op {
  struct spot_s3 *s3;
  enum latest_state state;
  char *bucket, *lease_key, *latest_key, *name, *owner;
  struct spot_latest_order order;
  bool ordered;           /* order is not 0.0: compared, and written */
  bool fence_only;        /* spot_latest_fence(): the lease read alone */
  uint64_t max_cur_epoch; /* refuse when LATEST's epoch is past it (0: no) */
  char damaged[SPOT_CKPT_NAME_MAX + 1]; /* no step rule against it */
  int64_t step; /* the trainer's step of ours, -1 unknown */
  spot_latest_cb cb;
  void *data;
  struct spot_s3_op *s3op;
  struct spot_buf body;
  /* LATEST as last read */
  bool exists;
  char cur_name[SPOT_CKPT_NAME_MAX + 1];
  char cur_etag[160]; /* bare */
  struct spot_latest_order cur_order;
  int64_t cur_step; /* its step, -1 unknown */
  unsigned retries; /* of every request */
  /* the last PUT */
  char sent_etag[160]; /* the If-Match target, bare ("" for a create) */
  bool form_flipped, moved;
  unsigned rounds;
  char msg[512];
};

static void s3_cb(const struct spot_s3_result *res, void *data);

static const struct spot_fsm latest_fsm = {
    "latest", state_names, LT_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

#define set_state(op, s) set_state_at((op), (s), __FILE__, __LINE__)
static void
set_state_at(struct spot_latest_op *op, enum latest_state s, const char *file,
             int line)
{
  if (spot_fsm_move_detail(&latest_fsm, op->state, s, file, line,
                           "key=%s name=%s", op->latest_key, op->name) > 0)
    op->state = s;
}

static void
op_free(struct spot_latest_op *op)
{
  spot_buf_fini(&op->body);
  free(op->bucket);
  free(op->lease_key);
  free(op->latest_key);
  free(op->name);
  free(op->owner);
  free(op);
}

static void
finish(struct spot_latest_op *op, int err)
{
  struct spot_latest_result res;

  set_state(op, LT_DONE);
  memset(&res, 0, sizeof(res));
  res.err = err;
  res.message = err < 0 ? op->msg : "";
  res.moved = op->moved;
  res.name = op->exists ? op->cur_name : "";
  res.order = op->cur_order;
  res.step = op->exists ? op->cur_step : -1;
  res.rounds = op->rounds;
  res.retries = op->retries;
  if (err < 0 && err != -ECANCELED)
    log_info("latest: %s", op->msg);
  op->cb(&res, op->data);
  op_free(op);
}

static int
start_get(struct spot_latest_op *op, enum latest_state s, const char *key)
{
  spot_buf_reset(&op->body);
  set_state(op, s);
  return spot_s3_get(op->s3, op->bucket, key, 0, 0, NULL, &op->body, s3_cb, op,
                     &op->s3op);
}

static int
start_put(struct spot_latest_op *op)
{
  struct spot_s3_put_opts o;
  char etag[170], order[48], step[24];
  int r = 0;

  memset(&o, 0, sizeof(o));
  spot_lease_doc_order_format(op->order, order, sizeof(order));
  snprintf(step, sizeof(step), "%" PRId64, op->step);
  if (op->ordered) {
    o.meta_name = SPOT_LATEST_ORDER_META;
    o.meta_value = order;
  }
  if (op->step >= 0) {
    o.meta2_name = SPOT_LATEST_STEP_META;
    o.meta2_value = step;
  }
  if (!op->exists) {
    o.flags = SPOT_S3_IF_NONE_MATCH;
    op->sent_etag[0] = '\0';
  } else {
    spot_strlcpy(op->sent_etag, op->cur_etag, sizeof(op->sent_etag));
    if (spot_s3_if_match_unquoted(op->s3))
      spot_strlcpy(etag, op->cur_etag, sizeof(etag));
    else
      r = spot_lease_doc_etag_quoted(op->cur_etag, etag, sizeof(etag));
    o.if_match = etag;
  }
  op->rounds++;
  set_state(op, LT_WRITE);
  if (r == 0)
    r = spot_s3_put_ex(op->s3, op->bucket, op->latest_key, op->name,
                       strlen(op->name), &o, s3_cb, op, &op->s3op);
  return r;
}

/* The lease read: is it still ours, at our epoch? */
static int
check_lease(struct spot_latest_op *op, const struct spot_s3_result *res)
{
  struct spot_lease_doc d;
  char err[200];

  if (res->err == -ENOENT) {
    snprintf(op->msg, sizeof(op->msg), "no lease: %s is not held",
             op->lease_key);
    return -ESTALE;
  }
  if (spot_lease_doc_parse(spot_buf_str(&op->body), op->body.len, &d, err,
                           sizeof(err)) < 0) {
    snprintf(op->msg, sizeof(op->msg), "%s: %s", op->lease_key, err);
    return -ESTALE;
  }
  if (strcmp(d.owner, op->owner) != 0 || d.epoch != op->order.epoch ||
      d.released || spot_now_wall_ms() > d.expires_ms) {
    snprintf(op->msg, sizeof(op->msg),
             "%s %s: writer %s at epoch %" PRIu64
             " is fenced (lease: %s, epoch %" PRIu64 ", %s)",
             op->fence_only ? "not committing" : "not moving LATEST to",
             op->name, op->owner, op->order.epoch, d.owner, d.epoch,
             d.released                          ? "released"
             : spot_now_wall_ms() > d.expires_ms ? "expired"
                                                 : "held");
    return -ESTALE;
  }
  return 0;
}

/* The step of what LATEST names: its spotd-step header, else what its
 * name states, else -1. */
static int64_t
latest_step(const char *meta, const char *name)
{
  char v[32], *end;
  long long n;

  if (spot_s3_meta_get(meta, SPOT_LATEST_STEP_META, v, sizeof(v)) == 0) {
    errno = 0;
    n = strtoll(v, &end, 10);
    if (errno == 0 && end != v && *end == '\0' && n >= 0 &&
        n <= ((long long)1 << 53))
      return n;
  }
  return spot_ckpt_name_step(name);
}

/* The LATEST read: remember it; 0 to write, 1 when done, < 0 refused. */
static int
take_latest(struct spot_latest_op *op, const struct spot_s3_result *res)
{
  char v[64];
  size_t n = op->body.len;
  int c;

  op->exists = res->err == 0;
  op->cur_name[0] = '\0';
  op->cur_order.epoch = op->cur_order.seq = 0;
  op->cur_step = -1;
  if (!op->exists)
    return 0;
  if (n > SPOT_CKPT_NAME_MAX)
    n = SPOT_CKPT_NAME_MAX;
  memcpy(op->cur_name, spot_buf_str(&op->body), n);
  op->cur_name[n] = '\0';
  while (n > 0 && (op->cur_name[n - 1] == '\n' || op->cur_name[n - 1] == ' '))
    op->cur_name[--n] = '\0';
  if (spot_lease_doc_etag_bare(res->etag, op->cur_etag, sizeof(op->cur_etag)) <
      0)
    op->cur_etag[0] = '\0';
  if (spot_s3_meta_get(res->meta, SPOT_LATEST_ORDER_META, v, sizeof(v)) == 0 &&
      spot_lease_doc_order_parse(v, &op->cur_order) < 0)
    log_warn("latest: ignoring a bad %s \"%s\" on %s", SPOT_LATEST_ORDER_META,
             v, op->latest_key);
  op->cur_step = latest_step(res->meta, op->cur_name);
  c = spot_lease_doc_order_cmp(op->order, op->cur_order);
  if ((c == 0 || !op->ordered) && strcmp(op->cur_name, op->name) == 0) {
    if (op->rounds > 0)
      op->moved = true; /* our PUT landed; its answer was lost or a 412 */
    return 1;
  }
  if (op->ordered && c <= 0) {
    snprintf(op->msg, sizeof(op->msg),
             "not moving LATEST backwards: it names %s (order %" PRIu64
             ".%" PRIu64 "), ours %s is %" PRIu64 ".%" PRIu64,
             op->cur_name, op->cur_order.epoch, op->cur_order.seq, op->name,
             op->order.epoch, op->order.seq);
    return -ESTALE;
  }
  if (op->max_cur_epoch > 0 && op->cur_order.epoch > op->max_cur_epoch) {
    snprintf(op->msg, sizeof(op->msg),
             "not moving LATEST to %s: it moved on since %s was written (it "
             "names %s at epoch %" PRIu64 ", %s was written at epoch %" PRIu64
             ")",
             op->name, op->name, op->cur_name, op->cur_order.epoch, op->name,
             op->max_cur_epoch);
    return -ESTALE;
  }
  if (op->step >= 0 && op->cur_step > op->step &&
      strcmp(op->cur_name, op->damaged) != 0) {
    snprintf(op->msg, sizeof(op->msg),
             "not moving LATEST back in training: it names %s (step %" PRId64
             "), ours %s is step %" PRId64,
             op->cur_name, op->cur_step, op->name, op->step);
    return -ESTALE;
  }
  return 0;
}

/* After a READ: maybe the other If-Match form, else write again. */
static int
next_write(struct spot_latest_op *op)
{
  if (op->rounds > 0 && op->exists && op->sent_etag[0] != '\0' &&
      spot_lease_doc_etag_same(op->sent_etag, op->cur_etag)) {
    if (op->form_flipped) {
      snprintf(op->msg, sizeof(op->msg),
               "the server refuses If-Match on LATEST's own ETag in both "
               "forms");
      return -EPROTO;
    }
    op->form_flipped = true;
    spot_s3_set_if_match_unquoted(op->s3, !spot_s3_if_match_unquoted(op->s3));
    log_info("latest: If-Match refused on an unchanged ETag: sending it %s",
             spot_s3_if_match_unquoted(op->s3) ? "unquoted" : "quoted");
  }
  if (op->rounds >= SPOT_LATEST_ROUNDS_MAX) {
    snprintf(op->msg, sizeof(op->msg),
             "LATEST kept moving: gave up after "
             "%u attempts",
             op->rounds);
    return -EAGAIN;
  }
  return start_put(op);
}

static void
s3_cb(const struct spot_s3_result *res, void *data)
{
  struct spot_latest_op *op = data;
  char line[512];
  int r;

  op->s3op = NULL;
  op->retries += res->retries;
  if (res->err == -ECANCELED) {
    snprintf(op->msg, sizeof(op->msg), "cancelled");
    finish(op, -ECANCELED);
    return;
  }
  if (res->err < 0 && !(res->err == -ENOENT && op->state != LT_WRITE) &&
      !((res->err == -EEXIST || res->err == -ENOENT) &&
        op->state == LT_WRITE)) {
    snprintf(op->msg, sizeof(op->msg), "%s",
             spot_s3_strerror(res, line, sizeof(line)));
    finish(op, res->err);
    return;
  }
  switch (op->state) {
  case LT_LEASE:
    r = check_lease(op, res);
    if (r == 0)
      r = start_get(op, LT_READ, op->latest_key);
    break;
  case LT_READ:
    r = take_latest(op, res);
    if (r == 0 && op->fence_only)
      r = 1; /* the update would be taken: nothing to write now */
    else if (r == 0)
      r = next_write(op);
    break;
  case LT_WRITE:
    if (res->err == 0) {
      op->moved = true;
      op->exists = true;
      spot_strlcpy(op->cur_name, op->name, sizeof(op->cur_name));
      op->cur_order = op->order;
      r = 1;
      break;
    }
    r = start_get(op, LT_READ, op->latest_key); /* 412: read again */
    break;
  case LT_DONE:
  case LT_STATE_LAST:
  default:
    r = -EINVAL;
    break;
  }
  if (r < 0 && op->msg[0] == '\0')
    snprintf(op->msg, sizeof(op->msg), "updating LATEST: %s", strerror(-r));
  if (r != 0)
    finish(op, r > 0 ? 0 : r);
}

static char *
join(const char *root, const char *leaf)
{
  char *s = NULL;

  if (asprintf(&s, "%s%s%s", root, root[0] != '\0' ? "/" : "", leaf) < 0)
    return NULL;
  return s;
}

int
spot_latest_update(struct spot_s3 *s3, const char *bucket, const char *root,
                   const char *name, struct spot_latest_order order,
                   int64_t step, const char *lease_owner, spot_latest_cb cb,
                   void *data, struct spot_latest_op **out)
{
  struct spot_latest_op *op;
  int r;

  if (s3 == NULL || bucket == NULL || root == NULL || cb == NULL ||
      !spot_ckpt_name_valid(name) ||
      (lease_owner != NULL && !spot_lease_doc_owner_valid(lease_owner)))
    return -EINVAL;
  op = calloc(1, sizeof(*op));
  if (op == NULL)
    return -ENOMEM;
  op->s3 = s3;
  op->order = order;
  op->ordered = order.epoch > 0 || order.seq > 0;
  op->step = step >= 0 ? step : spot_ckpt_name_step(name);
  op->cb = cb;
  op->data = data;
  spot_buf_init(&op->body, SPOT_LEASE_JSON_MAX);
  op->bucket = strdup(bucket);
  op->name = strdup(name);
  op->latest_key = join(root, SPOT_LATEST_KEY);
  op->lease_key = join(root, SPOT_LEASE_KEY);
  op->owner = lease_owner != NULL ? strdup(lease_owner) : NULL;
  if (op->bucket == NULL || op->name == NULL || op->latest_key == NULL ||
      op->lease_key == NULL || (lease_owner != NULL && op->owner == NULL)) {
    op_free(op);
    return -ENOMEM;
  }
  op->state = lease_owner != NULL ? LT_LEASE : LT_READ; /* initial state */
  r = start_get(op, op->state,
                lease_owner != NULL ? op->lease_key : op->latest_key);
  if (r < 0) {
    op_free(op);
    return r;
  }
  if (out != NULL)
    *out = op;
  return 0;
}

void
spot_latest_cancel(struct spot_latest_op *op)
{
  if (op == NULL || op->state == LT_DONE)
    return;
  spot_s3_cancel(op->s3op); /* s3_cb finishes with -ECANCELED */
}

void
spot_latest_set_max_epoch(struct spot_latest_op *op, uint64_t epoch)
{
  if (op != NULL)
    op->max_cur_epoch = epoch;
}

int
spot_latest_fence(struct spot_s3 *s3, const char *bucket, const char *root,
                  const char *name, struct spot_latest_order order,
                  int64_t step, const char *lease_owner, spot_latest_cb cb,
                  void *data, struct spot_latest_op **out)
{
  struct spot_latest_op *op = NULL;
  int r;

  r = spot_latest_update(s3, bucket, root, name, order, step, lease_owner, cb,
                         data, &op);
  if (r == 0)
    op->fence_only = true; /* before its lease read is answered */
  if (out != NULL)
    *out = op;
  return r;
}

void
spot_latest_set_damaged(struct spot_latest_op *op, const char *name)
{
  if (op != NULL && name != NULL)
    spot_strlcpy(op->damaged, name, sizeof(op->damaged));
}
