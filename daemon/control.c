/* The control socket: a Unix stream socket, mode 0660, speaking the JSON
 * lines of proto.h. Every connection's peer is checked with SO_PEERCRED
 * and SO_PEERGROUPS (root, our own user, or a member of our group or of
 * --socket-group, primary or supplementary); a bad, oversized or slow
 * client is dropped, never the daemon. Each request line must arrive
 * within CTL_LINE_MS of the connection or of the previous line (bytes
 * trickled in do not extend it), and one process or user holds only a
 * few of the slots: past the user's share (or all of them), the newcomer
 * takes the oldest slot of the process holding the most, so a flood of
 * clients from one user (even spotd's own) cannot lock out `spotctl
 * status`; one process past its own share is refused. A refused or
 * dropped client gets one JSON line saying why, and the log says so at
 * most once per CTL_LOG_EVERY_MS, with the count of those not told. Each
 * connection embeds two handles (the pipe and the deadline timer) and is
 * freed in the last close callback. A socket another spotd still listens
 * on is never taken over; only a stale one is replaced. */
#include <errno.h>
#include <grp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "control.h"
#include "engine.h"
#include "hist.h"
#include "core/log.h"
#include "spot-config.h"
#include "spotd.h"
#include "status.h"
#include "upload.h"
#include "core/util.h"

#define CTL_LINE_MS 10000    /* each request line due within this */
#define CTL_CONNS_MAX 32     /* clients at once */
#define CTL_CONNS_PER_PID 4  /* from one process */
#define CTL_CONNS_PER_UID 24 /* from one user: others keep a few slots */
#define CTL_GROUPS_MAX 4096  /* supplementary groups looked at per peer */
#define CTL_WRITE_CAP (256 * 1024)
#define CTL_LOG_EVERY_MS 10000 /* one refusal line per this, at most */

struct ctl_conn {
  struct spotd *d;
  struct ctl_conn *next;
  uv_pipe_t pipe;
  uv_timer_t idle; /* the request line's deadline; never extended by bytes */
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

static void idle_cb(uv_timer_t *t);

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

/* The metrics text, as one JSON string ({"text": ...}). */
static void
control_metrics(struct ctl_conn *c, uint64_t id, struct spot_buf *out)
{
  struct spot_buf text;
  json_t *res;

  spot_buf_init(&text, SPOT_PROTO_MAX_LINE / 2);
  if (spotd_metrics_text(c->d, &text) < 0) {
    spot_proto_encode_error(out, id, "metrics are not available");
  } else {
    res = json_pack("{s:s}", "text", spot_buf_str(&text));
    if (res == NULL)
      spot_proto_encode_error(out, id, "out of memory");
    else
      spot_proto_encode_ok(out, id, res);
    json_decref(res);
  }
  spot_buf_fini(&text);
}

/* One function per command, in a table indexed by the command. Each writes
 * its answer into out and returns 0, or 1 when it answers later (then out
 * is not sent). */
typedef int (*cmd_fn)(struct ctl_conn *c, const struct spot_proto_msg *m,
                      struct spot_buf *out);

static void
send_json(struct spot_buf *out, uint64_t id, json_t *res)
{
  if (res == NULL)
    spot_proto_encode_error(out, id, "out of memory");
  else
    spot_proto_encode_ok(out, id, res);
  json_decref(res);
}

static int
cmd_hello(struct ctl_conn *c, const struct spot_proto_msg *m,
          struct spot_buf *out)
{
  send_json(out, m->id,
            json_pack("{s:s, s:i, s:s, s:I}", "version", SPOT_VERSION, "proto",
                      SPOT_PROTO_VERSION, "job", c->d->cfg->job, "pid",
                      (json_int_t)getpid()));
  return 0;
}

static int
cmd_status(struct ctl_conn *c, const struct spot_proto_msg *m,
           struct spot_buf *out)
{
  send_json(out, m->id, spotd_status_json(c->d));
  return 0;
}

static int
cmd_checkpoint(struct ctl_conn *c, const struct spot_proto_msg *m,
               struct spot_buf *out)
{
  struct spotd *d = c->d;

  if (d->eng.state != SPOTD_RUNNING) {
    spot_proto_encode_error(out, m->id, "cannot checkpoint now: %s",
                            spotd_state_name(d->eng.state));
    return 0;
  }
  if (m->u.checkpoint.final) {
    log_notice("control: final checkpoint requested by pid=%d uid=%d: the "
               "job is preempted",
               (int)c->pid, (int)c->uid);
    send_json(out, m->id, json_pack("{s:b,s:b}", "requested", 1, "final", 1));
    spotd_operator_final(d);
    return 0;
  }
  log_info("control: checkpoint requested by pid=%d uid=%d", (int)c->pid,
           (int)c->uid);
  spotd_request_checkpoint(d, "spotctl checkpoint");
  if (m->u.checkpoint.wait) {
    c->waiting = true;
    c->wait_id = m->id;
    uv_timer_stop(&c->idle); /* a wait may take long */
    return 1;
  }
  send_json(out, m->id, json_pack("{s:b}", "requested", 1));
  return 0;
}

/* DIR must be a direct subfolder of SPOTD_CKPT_DIR (or a bare name). */
static int
cmd_done(struct ctl_conn *c, const struct spot_proto_msg *m,
         struct spot_buf *out)
{
  struct spotd *d = c->d;
  const char *dir = m->u.done.dir;
  const char *name = strrchr(dir, '/');
  char ckpt_prefix[4200];
  size_t plen;
  int r;

  snprintf(ckpt_prefix, sizeof(ckpt_prefix), "%s/", d->ckpt_dir);
  plen = strlen(ckpt_prefix);
  if (name == NULL) {
    name = dir;
  } else if (strncmp(dir, ckpt_prefix, plen) == 0 &&
             strchr(dir + plen, '/') == NULL) {
    name = dir + plen;
  } else {
    spot_proto_encode_error(out, m->id, "%s is not a folder directly under %s",
                            dir, d->ckpt_dir);
    return 0;
  }
  r = spotd_checkpoint_complete(d, name);
  if (r < 0)
    spot_proto_encode_error(out, m->id, "%s: %s", dir,
                            r == -ENOENT     ? "no such checkpoint folder"
                            : r == -EALREADY ? "already handled"
                                             : "not a valid checkpoint "
                                               "folder name");
  else
    send_json(out, m->id, json_pack("{s:s}", "name", name));
  return 0;
}

static int
cmd_step(struct ctl_conn *c, const struct spot_proto_msg *m,
         struct spot_buf *out)
{
  hist_step(c->d, m->u.step.step);
  status_step(c->d, m->u.step.step);
  spot_proto_encode_ok(out, m->id, NULL);
  return 0;
}

static int
cmd_metrics(struct ctl_conn *c, const struct spot_proto_msg *m,
            struct spot_buf *out)
{
  control_metrics(c, m->id, out);
  return 0;
}

static const cmd_fn commands[SPOT_PROTO_CMD_LAST] = {
    [SPOT_PROTO_CMD_HELLO] = cmd_hello,
    [SPOT_PROTO_CMD_STATUS] = cmd_status,
    [SPOT_PROTO_CMD_CHECKPOINT] = cmd_checkpoint,
    [SPOT_PROTO_CMD_DONE] = cmd_done,
    [SPOT_PROTO_CMD_STEP] = cmd_step,
    [SPOT_PROTO_CMD_METRICS] = cmd_metrics,
};

static int
msg_cb(const struct spot_proto_msg *m, void *data)
{
  struct ctl_conn *c = data;
  struct spot_buf out;

  spot_buf_init(&out, SPOT_PROTO_MAX_LINE + 1);
  /* A whole line arrived: the next one has CTL_LINE_MS again. */
  uv_timer_start(&c->idle, idle_cb, CTL_LINE_MS, 0);
  if (m->args_error != NULL)
    spot_proto_encode_error(&out, m->id, "%s", m->args_error);
  else if ((unsigned)m->cmd >= SPOT_PROTO_CMD_LAST || commands[m->cmd] == NULL)
    spot_proto_encode_error(&out, m->id, "unknown command '%s'",
                            m->cmd_name != NULL ? m->cmd_name : "");
  else if (commands[m->cmd](c, m, &out) != 0) {
    spot_buf_fini(&out); /* answered later */
    return 0;
  }
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
  conn_drop(t->data, "no complete request line in time");
}

static bool
gid_allowed(struct spotd *d, gid_t gid)
{
  return gid == getegid() || (d->ctl_has_gid && gid == d->ctl_gid);
}

/* Root, our user, or a member (primary or supplementary) of our group or
 * of --socket-group. SO_PEERGROUPS gives the groups the peer had when it
 * connected, as SO_PEERCRED does for uid and gid: no /proc race. */
static bool
peer_allowed(struct spotd *d, int fd, const struct ucred *cred)
{
  gid_t groups[CTL_GROUPS_MAX];
  socklen_t len = sizeof(groups);

  if (cred->uid == 0 || cred->uid == geteuid() || gid_allowed(d, cred->gid))
    return true;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups, &len) < 0) {
    log_debug("control: SO_PEERGROUPS of pid=%d: %s", (int)cred->pid,
              strerror(errno));
    return false;
  }
  for (size_t i = 0; i < len / sizeof(gid_t); i++)
    if (gid_allowed(d, groups[i]))
      return true;
  return false;
}

/* Why a new client from pid/uid may not have a slot, or NULL. *by_pid
 * says whether its own process holds its share (then nothing makes room
 * for it). */
static const char *
over_limit(struct spotd *d, const struct ctl_conn *me, char *why, size_t n,
           bool *by_pid)
{
  unsigned same_pid = 0, same_uid = 0;

  *by_pid = false;
  for (const struct ctl_conn *c = d->conns; c != NULL; c = c->next) {
    if (c == me)
      continue;
    same_pid += c->pid == me->pid;
    same_uid += c->uid == me->uid;
  }
  if (same_pid >= CTL_CONNS_PER_PID) {
    *by_pid = true;
    snprintf(why, n, "too many connections from pid %d (%d at once)",
             (int)me->pid, CTL_CONNS_PER_PID);
  } else if (d->nconns > CTL_CONNS_MAX) {
    snprintf(why, n, "too many clients (%d at once)", CTL_CONNS_MAX);
  } else if (same_uid >= CTL_CONNS_PER_UID) {
    snprintf(why, n, "too many connections from uid %d (%d at once)",
             (int)me->uid, CTL_CONNS_PER_UID);
  } else {
    return NULL;
  }
  return why;
}

/* The slot a newcomer over its user's share (or over all slots) takes:
 * the oldest connection of the process that holds the most of them (of
 * the newcomer's uid, or of anyone when all slots are taken), never one
 * waiting for a commit. NULL when there is none. The list is newest
 * first. */
static struct ctl_conn *
make_room(struct spotd *d, const struct ctl_conn *me, bool any_uid)
{
  struct ctl_conn *pick = NULL;
  unsigned most = 0;

  for (struct ctl_conn *c = d->conns; c != NULL; c = c->next) {
    unsigned held = 0;

    if (c == me || c->closing || c->waiting || (!any_uid && c->uid != me->uid))
      continue;
    for (const struct ctl_conn *o = d->conns; o != NULL; o = o->next)
      held += o != me && !o->closing && o->pid == c->pid;
    if (held >= most) { /* later in the list: older */
      most = held;
      pick = c;
    }
  }
  return pick;
}

/* A refused or dropped client, in the log at most once per
 * CTL_LOG_EVERY_MS: a flood must not fill the journal. */
static void say_refused(struct spotd *d, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
say_refused(struct spotd *d, const char *fmt, ...)
{
  uint64_t now = uv_now(d->loop);
  va_list ap;

  if (d->ctl_said_ms != 0 && now - d->ctl_said_ms < CTL_LOG_EVERY_MS) {
    d->ctl_unsaid++;
    return;
  }
  if (d->ctl_unsaid > 0)
    log_warn("control: %u more clients refused or dropped in the last "
             "%.0f s (not logged one by one)",
             d->ctl_unsaid, (double)(now - d->ctl_said_ms) / 1000.0);
  d->ctl_unsaid = 0;
  d->ctl_said_ms = now != 0 ? now : 1;
  va_start(ap, fmt);
  spot_logv(SPOT_LOG_WARNING, fmt, ap);
  va_end(ap);
}

/* Tells the client why in one JSON line, then drops it. */
static void
refuse(struct ctl_conn *c, const char *why)
{
  struct spot_buf out;

  spot_buf_init(&out, 1024);
  spot_proto_encode_error(&out, 0, "%s", why);
  conn_send(c, &out);
  spot_buf_fini(&out);
  conn_drop(c, NULL);
}

static void
connection_cb(uv_stream_t *server, int status)
{
  struct spotd *d = server->data;
  struct ctl_conn *c;
  struct ucred cred;
  socklen_t len = sizeof(cred);
  uv_os_fd_t fd;
  char why[128], vwhy[192];
  bool by_pid;

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
  if (!peer_allowed(d, fd, &cred)) {
    say_refused(d,
                "control: refused pid=%d uid=%d gid=%d (not root, our user "
                "or group)",
                (int)cred.pid, (int)cred.uid, (int)cred.gid);
    snprintf(why, sizeof(why),
             "permission denied: uid %d may not control this spotd",
             (int)cred.uid);
    refuse(c, why);
    return;
  }
  if (over_limit(d, c, why, sizeof(why), &by_pid) != NULL) {
    struct ctl_conn *old =
        by_pid ? NULL : make_room(d, c, d->nconns > CTL_CONNS_MAX);

    if (old == NULL) {
      say_refused(d, "control: refused pid=%d uid=%d: %s", (int)cred.pid,
                  (int)cred.uid, why);
      refuse(c, why);
      return;
    }
    say_refused(d,
                "control: dropped the oldest client of pid=%d uid=%d for "
                "pid=%d: %s",
                (int)old->pid, (int)old->uid, (int)cred.pid, why);
    snprintf(vwhy, sizeof(vwhy), "dropped for a newer client: %s", why);
    refuse(old, vwhy);
  }
  uv_timer_start(&c->idle, idle_cb, CTL_LINE_MS, 0);
  uv_read_start((uv_stream_t *)&c->pipe, alloc_cb, read_cb);
}

/* Whether a process listens on the socket at path: 1 (its pid in *pid, 0
 * if unknown), 0 when nobody does (a stale socket), or a negative errno
 * when we cannot tell. Blocking, but at start only, on a local socket: a
 * listener accepts or refuses at once. */
static int
socket_in_use(const char *path, pid_t *pid)
{
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  struct ucred cred;
  socklen_t len = sizeof(cred);
  int fd, r;

  *pid = 0;
  if (strlen(path) >= sizeof(sa.sun_path))
    return -ENAMETOOLONG;
  memcpy(sa.sun_path, path, strlen(path) + 1);
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return -errno;
  r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
  if (r == 0 || errno == EAGAIN) {
    /* The listener's credentials, as of its listen(). */
    if (r == 0 && getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
      *pid = cred.pid;
    r = 1;
  } else if (errno == ECONNREFUSED || errno == ENOENT) {
    r = 0;
  } else {
    r = -errno;
  }
  close(fd);
  return r;
}

/* A stale socket of a dead spotd is replaced; a live one, or anything
 * else, is not: two spotd with one --socket would take each other's
 * clients and remove each other's socket. */
static int
clear_stale_socket(const char *path)
{
  struct stat st;
  pid_t pid;
  int r;

  if (lstat(path, &st) < 0)
    return 0;
  if (!S_ISSOCK(st.st_mode)) {
    log_err("control socket %s exists and is not a socket", path);
    return -EEXIST;
  }
  r = socket_in_use(path, &pid);
  if (r > 0) {
    if (pid > 0)
      log_err("control socket %s is in use by a running spotd (pid %d): "
              "stop it, or give this one another --socket",
              path, (int)pid);
    else
      log_err("control socket %s is in use by a running process: stop "
              "it, or give this spotd another --socket",
              path);
    return -EADDRINUSE;
  }
  if (r < 0) {
    log_err("control socket %s exists and cannot be checked (%s): not "
            "replacing it",
            path, strerror(-r));
    return r;
  }
  log_info("control socket %s: replacing a stale socket", path);
  if (unlink(path) < 0 && errno != ENOENT)
    return log_err_errno(-errno, "control socket %s: unlink", path);
  return 0;
}

/* --socket-group, resolved once: no getgrnam on the loop per client. */
static void
resolve_group(struct spotd *d)
{
  struct group *g;

  d->ctl_has_gid = false;
  if (d->cfg->socket_group == NULL)
    return;
  errno = 0;
  g = getgrnam(d->cfg->socket_group);
  if (g == NULL) {
    log_warn("socket-group %s: %s: only root, our user and group may use "
             "the control socket",
             d->cfg->socket_group,
             errno != 0 ? strerror(errno) : "no such group");
    return;
  }
  d->ctl_gid = g->gr_gid;
  d->ctl_has_gid = true;
}

int
control_start(struct spotd *d)
{
  const char *path = d->cfg->socket;
  struct stat st;
  mode_t old;
  int r;

  resolve_group(d);
  r = clear_stale_socket(path);
  if (r < 0)
    return r;
  r = uv_pipe_init(d->loop, &d->ctl, 0);
  if (r < 0)
    return r;
  d->ctl_open = true;
  d->ctl.data = d;
  old = umask(0117); /* born 0660: no window with wider access */
  r = uv_pipe_bind(&d->ctl, path);
  umask(old);
  if (r < 0) {
    log_err("control socket %s: %s", path, uv_strerror(r));
    return r;
  }
  d->ctl_bound = true;
  if (lstat(path, &st) == 0) {
    d->ctl_dev = st.st_dev;
    d->ctl_ino = st.st_ino;
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
    uv_timer_start(&c->idle, idle_cb, CTL_LINE_MS, 0);
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
    struct stat st;

    uv_close((uv_handle_t *)&d->ctl, NULL);
    /* Only our own socket file: never one that replaced it. */
    if (d->ctl_bound && lstat(d->cfg->socket, &st) == 0 &&
        st.st_dev == d->ctl_dev && st.st_ino == d->ctl_ino)
      unlink(d->cfg->socket);
  }
}
