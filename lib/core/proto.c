/* Control protocol codec: line splitting, decoding and encoding. No I/O. */
#include "core/proto.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

static const char *const cmd_names[SPOT_PROTO_CMD_LAST] = {
    [SPOT_PROTO_CMD_HELLO] = "hello",
    [SPOT_PROTO_CMD_STATUS] = "status",
    [SPOT_PROTO_CMD_CHECKPOINT] = "checkpoint",
    [SPOT_PROTO_CMD_DONE] = "done",
    [SPOT_PROTO_CMD_STEP] = "step",
    [SPOT_PROTO_CMD_METRICS] = "metrics",
};

const char *
spot_proto_cmd_name(int cmd)
{
  if (cmd < 0 || cmd >= SPOT_PROTO_CMD_LAST)
    return NULL;
  return cmd_names[cmd];
}

enum spot_proto_cmd
spot_proto_cmd_from_name(const char *name)
{
  for (int i = 0; i < SPOT_PROTO_CMD_LAST; i++)
    if (strcmp(cmd_names[i], name) == 0)
      return (enum spot_proto_cmd)i;
  return SPOT_PROTO_CMD_LAST;
}

static int __attribute__((format(printf, 4, 5)))
fail(int r, char *err, size_t errlen, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  spot_vset_err(err, errlen, fmt, ap);
  va_end(ap);
  return r;
}

/* ---- decoding -------------------------------------------------------- */

static bool
get_id(json_t *v, uint64_t *out)
{
  json_int_t n;

  if (!json_is_integer(v))
    return false;
  n = json_integer_value(v);
  if (n < 0 || (uint64_t)n >= SPOT_PROTO_MAX_ID)
    return false;
  *out = (uint64_t)n;
  return true;
}

/* Typed args of the known commands. Sets msg->args_error on a mismatch. */
static void
decode_args(struct spot_proto_msg *msg)
{
  json_t *v;

  switch (msg->cmd) {
  case SPOT_PROTO_CMD_CHECKPOINT:
    v = json_object_get(msg->args, "wait");
    if (v != NULL && !json_is_boolean(v))
      msg->args_error = "checkpoint: 'wait' must be true or false";
    else
      msg->u.checkpoint.wait = v != NULL && json_is_true(v);
    v = json_object_get(msg->args, "final");
    if (v != NULL && !json_is_boolean(v))
      msg->args_error = "checkpoint: 'final' must be true or false";
    else
      msg->u.checkpoint.final = v != NULL && json_is_true(v);
    if (msg->u.checkpoint.final && msg->u.checkpoint.wait)
      msg->args_error = "checkpoint: 'final' ends spotd: no 'wait'";
    break;
  case SPOT_PROTO_CMD_DONE:
    v = json_object_get(msg->args, "dir");
    if (!json_is_string(v) || json_string_length(v) == 0 ||
        strlen(json_string_value(v)) != json_string_length(v))
      msg->args_error = "done: 'dir' must be a non-empty string";
    else
      msg->u.done.dir = json_string_value(v);
    break;
  case SPOT_PROTO_CMD_STEP:
    v = json_object_get(msg->args, "step");
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        (uint64_t)json_integer_value(v) >= SPOT_PROTO_MAX_ID)
      msg->args_error = "step: 'step' must be an integer in [0, 2^53)";
    else
      msg->u.step.step = (int64_t)json_integer_value(v);
    break;
  default:
    break;
  }
}

int
spot_proto_decode(const char *line, size_t len, enum spot_proto_kind expect,
                  json_t **rootp, struct spot_proto_msg *msg, char *err,
                  size_t errlen)
{
  json_error_t jerr;
  json_t *root, *v, *empty;
  int r = -EBADMSG;

  memset(msg, 0, sizeof(*msg));
  root = json_loadb(line, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL)
    return fail(-EBADMSG, err, errlen, "invalid JSON at column %d: %s",
                jerr.column, jerr.text);
  if (!json_is_object(root)) {
    fail(-EBADMSG, err, errlen, "a message must be a JSON object");
    goto bad;
  }
  v = json_object_get(root, "v");
  if (!json_is_integer(v)) {
    fail(-EBADMSG, err, errlen, "missing or non-integer 'v' (version)");
    goto bad;
  }
  if (!get_id(json_object_get(root, "id"), &msg->id)) {
    fail(-EBADMSG, err, errlen, "missing or bad 'id' (integer in [0, 2^53))");
    goto bad;
  }
  if (json_integer_value(v) != SPOT_PROTO_VERSION) {
    r = fail(-EPROTONOSUPPORT, err, errlen,
             "unsupported protocol version %" JSON_INTEGER_FORMAT
             " (this side speaks %d)",
             json_integer_value(v), SPOT_PROTO_VERSION);
    goto bad;
  }
  msg->kind = expect;
  if (expect == SPOT_PROTO_REQUEST) {
    v = json_object_get(root, "cmd");
    if (!json_is_string(v) || json_string_length(v) == 0 ||
        strlen(json_string_value(v)) != json_string_length(v)) {
      fail(-EBADMSG, err, errlen, "missing or bad 'cmd' (a string)");
      goto bad;
    }
    msg->cmd_name = json_string_value(v);
    msg->cmd = spot_proto_cmd_from_name(msg->cmd_name);
    v = json_object_get(root, "args");
    if (v == NULL || json_is_null(v)) {
      /* Owned by root from now on, so it lives exactly as long. */
      empty = json_object();
      if (empty == NULL || json_object_set_new(root, "args", empty) < 0) {
        r = fail(-ENOMEM, err, errlen, "out of memory");
        goto bad;
      }
      v = empty;
    } else if (!json_is_object(v)) {
      fail(-EBADMSG, err, errlen, "'args' must be an object");
      goto bad;
    }
    msg->args = v;
    decode_args(msg);
  } else {
    v = json_object_get(root, "ok");
    if (!json_is_boolean(v)) {
      fail(-EBADMSG, err, errlen, "missing or bad 'ok' (a boolean)");
      goto bad;
    }
    msg->ok = json_is_true(v);
    if (msg->ok) {
      v = json_object_get(root, "result");
      if (v == NULL || json_is_null(v)) {
        empty = json_object();
        if (empty == NULL || json_object_set_new(root, "result", empty) < 0) {
          r = fail(-ENOMEM, err, errlen, "out of memory");
          goto bad;
        }
        v = empty;
      } else if (!json_is_object(v)) {
        fail(-EBADMSG, err, errlen, "'result' must be an object");
        goto bad;
      }
      msg->result = v;
    } else {
      v = json_object_get(root, "error");
      if (!json_is_string(v)) {
        fail(-EBADMSG, err, errlen, "missing or bad 'error' (a string)");
        goto bad;
      }
      msg->error = json_string_value(v);
    }
  }
  *rootp = root;
  return 0;

bad:
  json_decref(root);
  return r;
}

/* ---- the reader ------------------------------------------------------ */

void
spot_proto_reader_init(struct spot_proto_reader *r, enum spot_proto_kind expect)
{
  memset(r, 0, sizeof(*r));
  r->expect = expect;
  r->err_id = -1;
  spot_buf_init(&r->line, SPOT_PROTO_MAX_LINE);
}

void
spot_proto_reader_fini(struct spot_proto_reader *r)
{
  spot_buf_fini(&r->line);
}

const char *
spot_proto_reader_error(const struct spot_proto_reader *r)
{
  return r->err != 0 ? r->errmsg : "";
}

bool
spot_proto_reader_pending(const struct spot_proto_reader *r)
{
  return r->line.len > 0;
}

static int
stop(struct spot_proto_reader *r, int err)
{
  r->err = err;
  spot_buf_reset(&r->line);
  return err;
}

/* Best effort: the id of a message that failed to decode, for an error
 * answer before the drop. */
static int64_t
salvage_id(const char *line, size_t len)
{
  json_t *root = json_loadb(line, len, 0, NULL);
  uint64_t id;
  int64_t out = -1;

  if (root != NULL && get_id(json_object_get(root, "id"), &id))
    out = (int64_t)id;
  json_decref(root);
  return out;
}

static int
process_line(struct spot_proto_reader *r, const char *line, size_t len,
             spot_proto_msg_cb cb, void *cbdata)
{
  struct spot_proto_msg msg;
  json_t *root = NULL;
  int ret;

  if (len > 0 && line[len - 1] == '\r')
    len--;
  if (len == 0)
    return 0;
  ret = spot_proto_decode(line, len, r->expect, &root, &msg, r->errmsg,
                          sizeof(r->errmsg));
  if (ret < 0) {
    if (ret == -EPROTONOSUPPORT || ret == -EBADMSG)
      r->err_id = salvage_id(line, len);
    return stop(r, ret);
  }
  ret = cb(&msg, cbdata);
  json_decref(root);
  if (ret < 0) {
    snprintf(r->errmsg, sizeof(r->errmsg), "stopped by the receiver: %s",
             strerror(-ret));
    return stop(r, ret);
  }
  return 0;
}

int
spot_proto_feed(struct spot_proto_reader *r, const char *data, size_t len,
                spot_proto_msg_cb cb, void *cbdata)
{
  int ret;

  if (r->err != 0)
    return r->err;
  while (len > 0) {
    const char *nl = memchr(data, '\n', len);
    size_t n = nl != NULL ? (size_t)(nl - data) : len;

    if (r->line.len + n > SPOT_PROTO_MAX_LINE) {
      snprintf(r->errmsg, sizeof(r->errmsg), "message longer than %d bytes",
               SPOT_PROTO_MAX_LINE);
      return stop(r, -EMSGSIZE);
    }
    if (nl == NULL) {
      ret = spot_buf_append(&r->line, data, n);
      if (ret < 0) {
        snprintf(r->errmsg, sizeof(r->errmsg), "out of memory");
        return stop(r, ret);
      }
      return 0;
    }
    if (r->line.len == 0) {
      ret = process_line(r, data, n, cb, cbdata);
    } else {
      ret = spot_buf_append(&r->line, data, n);
      if (ret < 0) {
        snprintf(r->errmsg, sizeof(r->errmsg), "out of memory");
        return stop(r, ret);
      }
      ret = process_line(r, r->line.data, r->line.len, cb, cbdata);
      if (ret == 0)
        spot_buf_reset(&r->line);
    }
    if (ret < 0)
      return ret;
    data = nl + 1;
    len -= n + 1;
  }
  return 0;
}

/* ---- encoding -------------------------------------------------------- */

/* Takes a reference to obj (a message root) and appends it as a line. */
static int
emit(struct spot_buf *out, json_t *obj)
{
  char *s;
  size_t n;
  int r;

  if (obj == NULL)
    return -ENOMEM;
  s = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(obj);
  if (s == NULL)
    return -ENOMEM;
  n = strlen(s);
  if (n > SPOT_PROTO_MAX_LINE) {
    free(s);
    return -EMSGSIZE;
  }
  /* json_dumps escapes control characters, so s holds no newline. Check
   * the room first so that a line is appended whole or not at all. */
  if (out->len > out->cap || out->cap - out->len < n + 1) {
    free(s);
    return -E2BIG;
  }
  r = spot_buf_append(out, s, n);
  if (r == 0) {
    r = spot_buf_append(out, "\n", 1);
    if (r < 0) {
      out->len -= n;
      out->data[out->len] = '\0';
    }
  }
  free(s);
  return r;
}

static json_t *
header(uint64_t id)
{
  return json_pack("{s:i, s:I}", "v", SPOT_PROTO_VERSION, "id", (json_int_t)id);
}

int
spot_proto_encode_request(struct spot_buf *out, uint64_t id,
                          enum spot_proto_cmd cmd, json_t *args)
{
  json_t *o;

  if (id >= SPOT_PROTO_MAX_ID || spot_proto_cmd_name((int)cmd) == NULL ||
      (args != NULL && !json_is_object(args)))
    return -EINVAL;
  o = header(id);
  if (o == NULL)
    return -ENOMEM;
  if (json_object_set_new(o, "cmd", json_string(cmd_names[cmd])) < 0 ||
      (args != NULL && json_object_size(args) > 0 &&
       json_object_set(o, "args", args) < 0)) {
    json_decref(o);
    return -ENOMEM;
  }
  return emit(out, o);
}

/* checkpoint {"KEY":value} */
static int
encode_checkpoint(struct spot_buf *out, uint64_t id, const char *key,
                  bool value)
{
  json_t *args = json_pack("{s:b}", key, value);
  int r;

  if (args == NULL)
    return -ENOMEM;
  r = spot_proto_encode_request(out, id, SPOT_PROTO_CMD_CHECKPOINT, args);
  json_decref(args);
  return r;
}

int
spot_proto_encode_checkpoint_final(struct spot_buf *out, uint64_t id)
{
  return encode_checkpoint(out, id, "final", true);
}

int
spot_proto_encode_checkpoint(struct spot_buf *out, uint64_t id, bool wait)
{
  return encode_checkpoint(out, id, "wait", wait);
}

int
spot_proto_encode_done(struct spot_buf *out, uint64_t id, const char *dir)
{
  json_t *args;
  int r;

  if (dir == NULL || *dir == '\0')
    return -EINVAL;
  args = json_pack("{s:s}", "dir", dir);
  if (args == NULL)
    return -EINVAL; /* not UTF-8 */
  r = spot_proto_encode_request(out, id, SPOT_PROTO_CMD_DONE, args);
  json_decref(args);
  return r;
}

int
spot_proto_encode_step(struct spot_buf *out, uint64_t id, int64_t step)
{
  json_t *args;
  int r;

  if (step < 0 || (uint64_t)step >= SPOT_PROTO_MAX_ID)
    return -EINVAL;
  args = json_pack("{s:I}", "step", (json_int_t)step);
  if (args == NULL)
    return -ENOMEM;
  r = spot_proto_encode_request(out, id, SPOT_PROTO_CMD_STEP, args);
  json_decref(args);
  return r;
}

int
spot_proto_encode_ok(struct spot_buf *out, uint64_t id, json_t *result)
{
  json_t *o;

  if (id >= SPOT_PROTO_MAX_ID || (result != NULL && !json_is_object(result)))
    return -EINVAL;
  o = header(id);
  if (o == NULL)
    return -ENOMEM;
  if (json_object_set_new(o, "ok", json_true()) < 0 ||
      (result != NULL && json_object_size(result) > 0 &&
       json_object_set(o, "result", result) < 0)) {
    json_decref(o);
    return -ENOMEM;
  }
  return emit(out, o);
}

int
spot_proto_encode_error(struct spot_buf *out, uint64_t id, const char *fmt, ...)
{
  char msg[1024];
  json_t *o, *s;
  va_list ap;

  if (id >= SPOT_PROTO_MAX_ID)
    return -EINVAL;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  /* Messages may quote what a client sent: keep only valid UTF-8. */
  s = json_string(msg);
  if (s == NULL)
    s = json_string("(error message was not valid UTF-8)");
  o = header(id);
  if (o == NULL || s == NULL) {
    json_decref(o);
    json_decref(s);
    return -ENOMEM;
  }
  if (json_object_set_new(o, "ok", json_false()) < 0 ||
      json_object_set_new(o, "error", s) < 0) {
    json_decref(o);
    return -ENOMEM;
  }
  return emit(out, o);
}

/* ---- status ---------------------------------------------------------- */

static json_t *
str_or_null(const char *s)
{
  json_t *v = s != NULL ? json_string(s) : NULL;

  return v != NULL ? v : json_null();
}

static json_t *
int_or_null(int64_t n)
{
  return n >= 0 ? json_integer(n) : json_null();
}

/* json_object_set_new that remembers a failure. */
static void
put(json_t *o, const char *key, json_t *v, bool *okp)
{
  if (v == NULL || json_object_set_new(o, key, v) < 0)
    *okp = false;
}

json_t *
spot_proto_status_to_json(const struct spot_proto_status *st)
{
  json_t *o = json_object(), *sub, *arr;
  bool ok = o != NULL;

  if (!ok)
    return NULL;
  put(o, "state", str_or_null(st->state), &ok);
  put(o, "job", str_or_null(st->job), &ok);
  put(o, "store", str_or_null(st->store), &ok);
  put(o, "provider", str_or_null(st->provider), &ok);
  if (st->has_notice) {
    sub = json_object();
    if (sub != NULL) {
      put(sub, "kind", str_or_null(st->notice.kind), &ok);
      put(sub, "deadline", str_or_null(st->notice.deadline), &ok);
      put(sub, "seconds_left", int_or_null(st->notice.seconds_left), &ok);
    }
    put(o, "notice", sub, &ok);
  } else {
    put(o, "notice", json_null(), &ok);
  }
  if (st->has_trainer) {
    sub = json_object();
    if (sub != NULL) {
      put(sub, "pid", json_integer(st->trainer.pid), &ok);
      put(sub, "uptime_s", json_integer(st->trainer.uptime_s), &ok);
      put(sub, "restart_count", json_integer(st->trainer.restart_count), &ok);
      put(sub, "step", int_or_null(st->trainer.step), &ok);
      put(sub, "steps_per_s",
          st->trainer.steps_per_s >= 0 ? json_real(st->trainer.steps_per_s)
                                       : json_null(),
          &ok);
      put(sub, "steps_at_risk", int_or_null(st->trainer.steps_at_risk), &ok);
    }
    put(o, "trainer", sub, &ok);
  } else {
    put(o, "trainer", json_null(), &ok);
  }
  if (st->has_last_commit) {
    sub = json_object();
    if (sub != NULL) {
      put(sub, "name", str_or_null(st->last_commit.name), &ok);
      put(sub, "time", str_or_null(st->last_commit.time), &ok);
      put(sub, "age_s", json_integer(st->last_commit.age_s), &ok);
    }
    put(o, "last_commit", sub, &ok);
  } else {
    put(o, "last_commit", json_null(), &ok);
  }
  if (st->has_upload) {
    sub = json_object();
    if (sub != NULL) {
      put(sub, "name", str_or_null(st->upload.name), &ok);
      put(sub, "bytes_done", json_integer((json_int_t)st->upload.bytes_done),
          &ok);
      put(sub, "bytes_total", json_integer((json_int_t)st->upload.bytes_total),
          &ok);
      put(sub, "rate", json_real(st->upload.rate), &ok);
      put(sub, "eta_s", int_or_null(st->upload.eta_s), &ok);
    }
    put(o, "upload", sub, &ok);
  } else {
    put(o, "upload", json_null(), &ok);
  }
  arr = json_array();
  for (size_t i = 0;
       arr != NULL && i < st->n_warnings && i < SPOT_PROTO_MAX_WARNINGS; i++)
    if (st->warnings[i] != NULL &&
        json_array_append_new(arr, str_or_null(st->warnings[i])) < 0)
      ok = false;
  put(o, "warnings", arr, &ok);
  arr = json_array();
  for (size_t i = 0;
       arr != NULL && i < st->n_relaunch && i < SPOT_PROTO_MAX_RELAUNCH; i++) {
    const struct spot_proto_relaunch *rl = &st->relaunch[i];
    sub = json_object();
    if (sub != NULL) {
      put(sub, "time", str_or_null(rl->time), &ok);
      put(sub, "reason", str_or_null(rl->reason), &ok);
      put(sub, "exit_status", json_integer(rl->exit_status), &ok);
      put(sub, "ok", json_boolean(rl->ok), &ok);
    }
    if (sub == NULL || json_array_append_new(arr, sub) < 0)
      ok = false;
  }
  put(o, "relaunch", arr, &ok);
  if (!ok) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* Field readers for from_json: absent and null are "not there". */
static int
opt_str(json_t *o, const char *key, const char **out, char *err, size_t errlen)
{
  json_t *v = json_object_get(o, key);

  *out = NULL;
  if (v == NULL || json_is_null(v))
    return 0;
  if (!json_is_string(v))
    return fail(-EBADMSG, err, errlen, "status: '%s' must be a string", key);
  *out = json_string_value(v);
  return 0;
}

static int
opt_int(json_t *o, const char *key, int64_t *out, int64_t dflt, char *err,
        size_t errlen)
{
  json_t *v = json_object_get(o, key);

  *out = dflt;
  if (v == NULL || json_is_null(v))
    return 0;
  if (!json_is_integer(v))
    return fail(-EBADMSG, err, errlen, "status: '%s' must be an integer", key);
  *out = json_integer_value(v);
  return 0;
}

static int
opt_obj(json_t *o, const char *key, json_t **out, char *err, size_t errlen)
{
  json_t *v = json_object_get(o, key);

  *out = NULL;
  if (v == NULL || json_is_null(v))
    return 0;
  if (!json_is_object(v))
    return fail(-EBADMSG, err, errlen, "status: '%s' must be an object", key);
  *out = v;
  return 0;
}

int
spot_proto_status_from_json(json_t *obj, struct spot_proto_status *st,
                            char *err, size_t errlen)
{
  json_t *sub, *arr, *v;
  int64_t n = 0;
  size_t i;
  int r = 0;

  memset(st, 0, sizeof(*st));
  if (!json_is_object(obj))
    return fail(-EBADMSG, err, errlen, "status: not an object");
  r = opt_str(obj, "state", &st->state, err, errlen);
  if (r == 0 && st->state == NULL)
    r = fail(-EBADMSG, err, errlen, "status: 'state' missing");
  if (r == 0)
    r = opt_str(obj, "job", &st->job, err, errlen);
  if (r == 0)
    r = opt_str(obj, "store", &st->store, err, errlen);
  if (r == 0)
    r = opt_str(obj, "provider", &st->provider, err, errlen);
  if (r == 0)
    r = opt_obj(obj, "notice", &sub, err, errlen);
  if (r == 0 && sub != NULL) {
    st->has_notice = true;
    r = opt_str(sub, "kind", &st->notice.kind, err, errlen);
    if (r == 0)
      r = opt_str(sub, "deadline", &st->notice.deadline, err, errlen);
    if (r == 0)
      r = opt_int(sub, "seconds_left", &st->notice.seconds_left, -1, err,
                  errlen);
  }
  if (r == 0)
    r = opt_obj(obj, "trainer", &sub, err, errlen);
  if (r == 0 && sub != NULL) {
    st->has_trainer = true;
    r = opt_int(sub, "pid", &st->trainer.pid, 0, err, errlen);
    if (r == 0)
      r = opt_int(sub, "uptime_s", &st->trainer.uptime_s, 0, err, errlen);
    if (r == 0)
      r = opt_int(sub, "restart_count", &st->trainer.restart_count, 0, err,
                  errlen);
    if (r == 0)
      r = opt_int(sub, "step", &st->trainer.step, -1, err, errlen);
    if (r == 0)
      r = opt_int(sub, "steps_at_risk", &st->trainer.steps_at_risk, -1, err,
                  errlen);
    st->trainer.steps_per_s = -1;
    if (r == 0) {
      v = json_object_get(sub, "steps_per_s");
      if (v != NULL && !json_is_null(v) && !json_is_number(v))
        r = fail(-EBADMSG, err, errlen,
                 "status: 'steps_per_s' must be a number");
      else if (v != NULL && !json_is_null(v))
        st->trainer.steps_per_s = json_number_value(v);
    }
  }
  if (r == 0)
    r = opt_obj(obj, "last_commit", &sub, err, errlen);
  if (r == 0 && sub != NULL) {
    st->has_last_commit = true;
    r = opt_str(sub, "name", &st->last_commit.name, err, errlen);
    if (r == 0)
      r = opt_str(sub, "time", &st->last_commit.time, err, errlen);
    if (r == 0)
      r = opt_int(sub, "age_s", &st->last_commit.age_s, 0, err, errlen);
  }
  if (r == 0)
    r = opt_obj(obj, "upload", &sub, err, errlen);
  if (r == 0 && sub != NULL) {
    st->has_upload = true;
    r = opt_str(sub, "name", &st->upload.name, err, errlen);
    if (r == 0)
      r = opt_int(sub, "bytes_done", &n, 0, err, errlen);
    if (r == 0)
      st->upload.bytes_done = n > 0 ? (uint64_t)n : 0;
    if (r == 0)
      r = opt_int(sub, "bytes_total", &n, 0, err, errlen);
    if (r == 0)
      st->upload.bytes_total = n > 0 ? (uint64_t)n : 0;
    if (r == 0) {
      v = json_object_get(sub, "rate");
      if (v != NULL && !json_is_null(v) && !json_is_number(v))
        r = fail(-EBADMSG, err, errlen, "status: 'rate' must be a number");
      else if (v != NULL && !json_is_null(v))
        st->upload.rate = json_number_value(v);
    }
    if (r == 0)
      r = opt_int(sub, "eta_s", &st->upload.eta_s, -1, err, errlen);
  }
  if (r < 0)
    return r;
  arr = json_object_get(obj, "warnings");
  if (arr != NULL && !json_is_null(arr)) {
    if (!json_is_array(arr))
      return fail(-EBADMSG, err, errlen, "status: 'warnings' must be an array");
    json_array_foreach(arr, i, v)
    {
      if (!json_is_string(v))
        return fail(-EBADMSG, err, errlen,
                    "status: 'warnings' must hold strings");
      if (st->n_warnings < SPOT_PROTO_MAX_WARNINGS)
        st->warnings[st->n_warnings++] = json_string_value(v);
    }
  }
  arr = json_object_get(obj, "relaunch");
  if (arr != NULL && !json_is_null(arr)) {
    if (!json_is_array(arr))
      return fail(-EBADMSG, err, errlen, "status: 'relaunch' must be an array");
    json_array_foreach(arr, i, v)
    {
      struct spot_proto_relaunch rl = {0};
      json_t *b;
      if (!json_is_object(v))
        return fail(-EBADMSG, err, errlen,
                    "status: 'relaunch' must hold objects");
      r = opt_str(v, "time", &rl.time, err, errlen);
      if (r == 0)
        r = opt_str(v, "reason", &rl.reason, err, errlen);
      if (r == 0)
        r = opt_int(v, "exit_status", &n, 0, err, errlen);
      if (r < 0)
        return r;
      rl.exit_status = (int)n;
      b = json_object_get(v, "ok");
      if (b != NULL && !json_is_boolean(b))
        return fail(-EBADMSG, err, errlen,
                    "status: relaunch 'ok' must be a boolean");
      rl.ok = b != NULL && json_is_true(b);
      if (st->n_relaunch < SPOT_PROTO_MAX_RELAUNCH)
        st->relaunch[st->n_relaunch++] = rl;
    }
  }
  return 0;
}
