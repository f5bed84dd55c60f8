/* The control socket: a Unix stream socket, mode 0660, speaking the JSON
 * lines of proto.h. Every connection's peer is checked with SO_PEERCRED
 * (root, our own user, or our group); a bad, oversized or slow client is
 * dropped, never the daemon. Each connection embeds two handles (the pipe
 * and an idle timer) and is freed in the last close callback. */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "log.h"
#include "spot-config.h"
#include "spotd.h"
#include "util.h"

#define CTL_IDLE_MS 30000 /* a client silent this long is dropped */
#define CTL_CONNS_MAX 32
#define CTL_WRITE_CAP (256 * 1024)

struct ctl_conn {
  struct spotd *d;
  struct ctl_conn *next;
  uv_pipe_t pipe;
  uv_timer_t idle;
  struct spot_proto_reader rd;
  unsigned closes;
  bool closing;
  bool waiting; /* checkpoint --wait pending */
  uint64_t wait_id;
  pid_t pid;
  uid_t uid;
};

struct ctl_write {
  uv_write_t req;
  struct ctl_conn *c;
  size_t len;
  char data[]; /* the request and its buffer are one allocation */
};

static void
conn_closed_cb(uv_handle_t *h)
{
  struct ctl_conn *c = h->data;

  if (--c->closes > 0)
    return;
  spot_proto_reader_fini(&c->rd);
  free(c);
}

static void
conn_drop(struct ctl_conn *c, const char *why)
{
  struct spotd *d = c->d;
  struct ctl_conn **pp;

  if (c->closing)
    return;
  c->closing = true;
  if (why != NULL)
    log_info("control: dropping client pid=%d: %s", (int)c->pid, why);
  for (pp = &d->conns; *pp != NULL; pp = &(*pp)->next)
    if (*pp == c) {
      *pp = c->next;
      break;
    }
  d->nconns--;
  c->closes = 2;
  uv_close((uv_handle_t *)&c->pipe, conn_closed_cb);
  uv_close((uv_handle_t *)&c->idle, conn_closed_cb);
}

static void
write_cb(uv_write_t *req, int status)
{
  struct ctl_write *w = spot_container_of(req, struct ctl_write, req);

  if (status < 0 && status != UV_ECANCELED)
    conn_drop(w->c, "write failed");
  free(w);
}

static void
conn_send(struct ctl_conn *c, const struct spot_buf *b)
{
  struct ctl_write *w;
  uv_buf_t buf;

  if (c->closing || b->len == 0)
    return;
  if (uv_stream_get_write_queue_size((uv_stream_t *)&c->pipe) > CTL_WRITE_CAP) {
    conn_drop(c, "not reading its answers");
    return;
  }
  w = malloc(sizeof(*w) + b->len);
  if (w == NULL) {
    conn_drop(c, "out of memory");
    return;
  }
  w->c = c;
  w->len = b->len;
  memcpy(w->data, b->data, b->len);
  buf = uv_buf_init(w->data, (unsigned)w->len);
  if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &buf, 1, write_cb) < 0) {
    free(w);
    conn_drop(c, "write failed");
  }
}

static int
msg_cb(const struct spot_proto_msg *m, void *data)
{
  struct ctl_conn *c = data;
  struct spotd *d = c->d;
  struct spot_buf out;
  json_t *res;
  int r;

  spot_buf_init(&out, SPOT_PROTO_MAX_LINE + 1);
  if (m->args_error != NULL) {
    spot_proto_encode_error(&out, m->id, "%s", m->args_error);
    goto send;
  }
  switch (m->cmd) {
  case SPOT_PROTO_CMD_HELLO:
    res = json_pack("{s:s, s:i, s:s, s:I}", "version", SPOT_VERSION, "proto",
                    SPOT_PROTO_VERSION, "job", d->cfg->job, "pid",
                    (json_int_t)getpid());
    spot_proto_encode_ok(&out, m->id, res);
    json_decref(res);
    break;
  case SPOT_PROTO_CMD_STATUS:
    res = spotd_status_json(d);
    if (res == NULL)
      spot_proto_encode_error(&out, m->id, "out of memory");
    else
      spot_proto_encode_ok(&out, m->id, res);
    json_decref(res);
    break;
  case SPOT_PROTO_CMD_CHECKPOINT:
    if (d->state != SPOTD_RUNNING) {
      spot_proto_encode_error(&out, m->id, "cannot checkpoint now: %s",
                              spotd_state_name(d->state));
      break;
    }
    log_info("control: checkpoint requested by pid=%d uid=%d", (int)c->pid,
             (int)c->uid);
    spotd_request_checkpoint(d, "spotctl checkpoint");
    if (m->u.checkpoint.wait) {
      c->waiting = true;
      c->wait_id = m->id;
      uv_timer_stop(&c->idle); /* a wait may take long */
      spot_buf_fini(&out);
      return 0;
    }
    res = json_pack("{s:b}", "requested", 1);
    spot_proto_encode_ok(&out, m->id, res);
    json_decref(res);
    break;
  case SPOT_PROTO_CMD_DONE: {
    const char *dir = m->u.done.dir;
    const char *name = strrchr(dir, '/');
    char ckpt_prefix[4200];
    size_t plen;

    /* DIR must be a direct subfolder of SPOTD_CKPT_DIR (or a bare name). */
    snprintf(ckpt_prefix, sizeof(ckpt_prefix), "%s/", d->ckpt_dir);
    plen = strlen(ckpt_prefix);
    if (name == NULL)
      name = dir;
    else if (strncmp(dir, ckpt_prefix, plen) == 0 &&
             strchr(dir + plen, '/') == NULL)
      name = dir + plen;
    else {
      spot_proto_encode_error(&out, m->id,
                              "%s is not a folder directly under %s", dir,
                              d->ckpt_dir);
      break;
    }
    r = spotd_checkpoint_complete(d, name);
    if (r < 0) {
      spot_proto_encode_error(&out, m->id, "%s: %s", dir,
                              r == -ENOENT ? "no such checkpoint folder"
                              : r == -EALREADY
                                  ? "already handled"
                                  : "not a valid checkpoint folder name");
      break;
    }
    res = json_pack("{s:s}", "name", name);
    spot_proto_encode_ok(&out, m->id, res);
    json_decref(res);
    break;
  }
  default:
    spot_proto_encode_error(&out, m->id, "unknown command '%s'",
                            m->cmd_name != NULL ? m->cmd_name : "");
    break;
  }
send:
  conn_send(c, &out);
  spot_buf_fini(&out);
  return 0;
}

static void
alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
  static char slab[16384]; /* one loop thread: reads never overlap */

  (void)h;
  (void)suggested;
  *buf = uv_buf_init(slab, sizeof(slab));
}

static void
read_cb(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
  struct ctl_conn *c = s->data;
  int r;

  if (n < 0) {
    conn_drop(c, n == UV_EOF ? NULL : uv_strerror((int)n));
    return;
  }
  if (n == 0)
    return;
  if (!c->waiting)
    uv_timer_again(&c->idle);
  r = spot_proto_feed(&c->rd, buf->base, (size_t)n, msg_cb, c);
  if (r < 0) {
    struct spot_buf out;

    spot_buf_init(&out, 4096);
    spot_proto_encode_error(
        &out, c->rd.err_id >= 0 ? (uint64_t)c->rd.err_id : 0,
        "protocol error: %s", spot_proto_reader_error(&c->rd));
    conn_send(c, &out);
    spot_buf_fini(&out);
    conn_drop(c, spot_proto_reader_error(&c->rd));
  }
}

static void
idle_cb(uv_timer_t *t)
{
  conn_drop(t->data, "idle too long");
}

static bool
peer_allowed(struct spotd *d, uid_t uid, gid_t gid)
{
  if (uid == 0 || uid == geteuid() || gid == getegid())
    return true;
  if (d->cfg->socket_group != NULL) {
    struct group *g = getgrnam(d->cfg->socket_group);
    if (g != NULL && g->gr_gid == gid)
      return true;
  }
  return false;
}

static void
connection_cb(uv_stream_t *server, int status)
{
  struct spotd *d = server->data;
  struct ctl_conn *c;
  struct ucred cred;
  socklen_t len = sizeof(cred);
  uv_os_fd_t fd;

  if (status < 0) {
    log_warn("control: accept: %s", uv_strerror(status));
    return;
  }
  c = calloc(1, sizeof(*c));
  if (c == NULL)
    return;
  c->d = d;
  uv_pipe_init(d->loop, &c->pipe, 0);
  uv_timer_init(d->loop, &c->idle);
  c->pipe.data = c;
  c->idle.data = c;
  spot_proto_reader_init(&c->rd, SPOT_PROTO_REQUEST);
  c->next = d->conns;
  d->conns = c;
  d->nconns++;
  if (uv_accept(server, (uv_stream_t *)&c->pipe) < 0) {
    conn_drop(c, "accept failed");
    return;
  }
  if (uv_fileno((uv_handle_t *)&c->pipe, &fd) < 0 ||
      getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
    conn_drop(c, "no peer credentials");
    return;
  }
  c->pid = cred.pid;
  c->uid = cred.uid;
  if (!peer_allowed(d, cred.uid, cred.gid)) {
    struct spot_buf out;

    log_warn("control: refused pid=%d uid=%d gid=%d (not root, our user or "
             "group)",
             (int)cred.pid, (int)cred.uid, (int)cred.gid);
    spot_buf_init(&out, 1024);
    spot_proto_encode_error(&out, 0,
                            "permission denied: uid %d may not "
                            "control this spotd",
                            (int)cred.uid);
    conn_send(c, &out);
    spot_buf_fini(&out);
    conn_drop(c, NULL);
    return;
  }
  if (d->nconns > CTL_CONNS_MAX) {
    conn_drop(c, "too many clients");
    return;
  }
  uv_timer_start(&c->idle, idle_cb, CTL_IDLE_MS, CTL_IDLE_MS);
  uv_read_start((uv_stream_t *)&c->pipe, alloc_cb, read_cb);
}

int
control_start(struct spotd *d)
{
  const char *path = d->cfg->socket;
  struct stat st;
  mode_t old;
  int r;

  r = uv_pipe_init(d->loop, &d->ctl, 0);
  if (r < 0)
    return r;
  d->ctl_open = true;
  d->ctl.data = d;
  /* A stale socket of a dead spotd is replaced; anything else is not. */
  if (lstat(path, &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      log_err("control socket %s exists and is not a socket", path);
      return -EEXIST;
    }
    unlink(path);
  }
  old = umask(0117); /* born 0660: no window with wider access */
  r = uv_pipe_bind(&d->ctl, path);
  umask(old);
  if (r < 0) {
    log_err("control socket %s: %s", path, uv_strerror(r));
    return r;
  }
  chmod(path, 0660);
  r = uv_listen((uv_stream_t *)&d->ctl, 8, connection_cb);
  if (r < 0) {
    log_err("control socket %s: listen: %s", path, uv_strerror(r));
    return r;
  }
  log_info("control socket %s", path);
  return 0;
}

void
control_commit_event(struct spotd *d, const char *name, int err,
                     const char *msg)
{
  for (struct ctl_conn *c = d->conns; c != NULL; c = c->next) {
    struct spot_buf out;
    json_t *res;

    if (!c->waiting)
      continue;
    c->waiting = false;
    spot_buf_init(&out, 8192);
    if (err < 0) {
      spot_proto_encode_error(&out, c->wait_id, "checkpoint failed: %s", msg);
    } else {
      res = json_pack("{s:s, s:b}", "name", name, "committed", 1);
      spot_proto_encode_ok(&out, c->wait_id, res);
      json_decref(res);
    }
    conn_send(c, &out);
    spot_buf_fini(&out);
    uv_timer_again(&c->idle);
  }
}

void
control_close(struct spotd *d)
{
  while (d->conns != NULL) {
    if (d->conns->waiting)
      control_commit_event(d, "", -ECANCELED, "spotd is exiting");
    conn_drop(d->conns, NULL);
  }
  if (d->ctl_open && !uv_is_closing((uv_handle_t *)&d->ctl)) {
    uv_close((uv_handle_t *)&d->ctl, NULL);
    unlink(d->cfg->socket);
  }
}
