/* spotctl status / checkpoint / done: the thin client of a running spotd.
 * Blocking Unix socket, one request line, one answer line (proto.h). It
 * never starts a daemon. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "core/proto.h"
#include "core/util.h"
#include "spotctl.h"

struct ctl_opts {
  const char *socket;
  bool json, wait, final;
  int64_t timeout_ms; /* -1 = none */
};

/* SPOTD_SOCKET (inside the trainer), else spotd's own default
 * (spot_default_socket: $RUNTIME_DIRECTORY/spotd.sock, else ./spotd.sock);
 * outside a service with no ./spotd.sock, the service's socket. */
static const char *
default_socket(void)
{
  const char *s = getenv("SPOTD_SOCKET");
  static char *def;

  if (s != NULL && s[0] != '\0')
    return s;
  if (def == NULL && spot_default_socket(&def) < 0)
    return SPOT_SOCKET_FALLBACK;
  if (getenv(SPOT_SOCKET_ENV) == NULL && access(def, F_OK) != 0 &&
      access("/run/spotd/spotd.sock", F_OK) == 0)
    return "/run/spotd/spotd.sock";
  return def;
}

static int
parse(int argc, char **argv, struct ctl_opts *o, const char *usage,
      bool allow_wait)
{
  static const struct option opts[] = {
      {"socket", required_argument, NULL, 's'},
      {"json", no_argument, NULL, 'j'},
      {"wait", no_argument, NULL, 'w'},
      {"final", no_argument, NULL, 'f'},
      {"timeout", required_argument, NULL, 't'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0},
  };
  int c;

  memset(o, 0, sizeof(*o));
  o->timeout_ms = -1;
  optind = 1;
  opterr = 0;
  while ((c = getopt_long(argc, argv, "hs:", opts, NULL)) != -1) {
    switch (c) {
    case 's':
      o->socket = optarg;
      break;
    case 'j':
      o->json = true;
      break;
    case 'w':
      if (!allow_wait)
        return spotctl_usage("%s: unknown option '--wait'", argv[0]);
      o->wait = true;
      break;
    case 'f':
      if (!allow_wait)
        return spotctl_usage("%s: unknown option '--final'", argv[0]);
      o->final = true;
      break;
    case 't': {
      int64_t secs;
      if (spot_parse_int64(optarg, 1, 86400, &secs) < 0)
        return spotctl_usage("--timeout: expected seconds (1-86400), got "
                             "'%s'",
                             optarg);
      o->timeout_ms = secs * 1000;
      break;
    }
    case 'h':
      fputs(usage, stdout);
      printf("  --socket PATH      spotd's control socket (default: "
             "$SPOTD_SOCKET,\n"
             "                     $RUNTIME_DIRECTORY/spotd.sock, "
             "/run/spotd/spotd.sock,\n"
             "                     ./spotd.sock)\n"
             "  -h, --help         this help\n");
      return SPOTCTL_EXIT_OK;
    default:
      return spotctl_bad_option(argv[0], argv);
    }
  }
  if (o->socket == NULL)
    o->socket = default_socket();
  return -1;
}

/* Sends one request and reads one answer. Returns 0 with *root and *msg set,
 * or an exit status after printing the error. */
static int
call(const struct ctl_opts *o, const struct spot_buf *req, json_t **root,
     struct spot_proto_msg *msg)
{
  struct sockaddr_un sa;
  struct spot_buf line;
  char err[256];
  size_t off = 0;
  int fd, r, write_err = 0;

  memset(&sa, 0, sizeof(sa));
  sa.sun_family = AF_UNIX;
  if (spot_strlcpy(sa.sun_path, o->socket, sizeof(sa.sun_path)) >=
      sizeof(sa.sun_path))
    return spotctl_usage("socket path too long: %s", o->socket);
  fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return spotctl_fail("socket: %s", strerror(errno));
  if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    int e = errno;
    close(fd);
    return spotctl_fail("cannot reach spotd at %s: %s%s", o->socket,
                        strerror(e),
                        e == ENOENT || e == ECONNREFUSED
                            ? " (is spotd running? --socket or $SPOTD_SOCKET "
                              "name another)"
                            : "");
  }
  while (off < req->len) {
    ssize_t w = send(fd, req->data + off, req->len - off, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      /* spotd may have answered (e.g. "permission denied") and closed
       * before our request went out: read that answer below. */
      if (errno == EPIPE || errno == ECONNRESET) {
        write_err = errno;
        break;
      }
      r = spotctl_fail("writing to spotd: %s", strerror(errno));
      close(fd);
      return r;
    }
    off += (size_t)w;
  }
  spot_buf_init(&line, SPOT_PROTO_MAX_LINE + 1);
  for (;;) {
    char buf[4096];
    struct pollfd p = {.fd = fd, .events = POLLIN};
    const char *nl;
    ssize_t n;

    r = poll(&p, 1, o->timeout_ms < 0 ? -1 : (int)o->timeout_ms);
    if (r < 0 && errno == EINTR)
      continue;
    if (r == 0) {
      r = spotctl_fail("no answer from spotd within the timeout");
      break;
    }
    n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (write_err != 0)
        r = spotctl_fail("writing to spotd: %s", strerror(write_err));
      else
        r = spotctl_fail("spotd closed the connection without an answer");
      break;
    }
    if (spot_buf_append(&line, buf, (size_t)n) < 0) {
      r = spotctl_fail("answer from spotd too long");
      break;
    }
    nl = memchr(line.data, '\n', line.len);
    if (nl == NULL)
      continue;
    r = spot_proto_decode(line.data, (size_t)(nl - line.data),
                          SPOT_PROTO_RESPONSE, root, msg, err, sizeof(err));
    if (r < 0)
      r = spotctl_fail("bad answer from spotd: %s", err);
    break;
  }
  spot_buf_fini(&line);
  close(fd);
  return r;
}

static const char *
jstr(json_t *o, const char *k)
{
  const char *s = json_string_value(json_object_get(o, k));
  return s != NULL ? s : "";
}

/* Strings spotd passes on from the metadata service and the store are
 * escaped before they reach a terminal. */
#define E(s) spot_escape((s), esc, sizeof(esc))

static void
print_status(const struct spot_proto_status *st)
{
  char a[32], b[32];
  char esc[SPOT_ESCAPE_SIZE(512)];

  printf("state:        %s\n", spotctl_esc(st->state));
  printf("job:          %s  (%s)\n", spotctl_esc(st->job),
         spotctl_esc(st->store));
  printf("provider:     %s\n", spotctl_esc(st->provider));
  if (st->has_notice) {
    printf("notice:       %s", spotctl_esc(st->notice.kind));
    if (st->notice.deadline != NULL)
      printf(", deadline %s", spotctl_esc(st->notice.deadline));
    if (st->notice.seconds_left >= 0)
      printf(" (%" PRId64 " s left)", st->notice.seconds_left);
    printf("\n");
  } else {
    printf("notice:       none\n");
  }
  if (st->has_trainer)
    printf("trainer:      pid %" PRId64 ", up %" PRId64 " s, restart %" PRId64
           "\n",
           st->trainer.pid, st->trainer.uptime_s, st->trainer.restart_count);
  else
    printf("trainer:      not running\n");
  if (st->has_trainer && st->trainer.step >= 0) {
    printf("progress:     step %" PRId64, st->trainer.step);
    if (st->trainer.steps_per_s >= 0)
      printf(", %.2f steps/s", st->trainer.steps_per_s);
    if (st->trainer.steps_at_risk >= 0) {
      printf(", %" PRId64 " steps at risk", st->trainer.steps_at_risk);
      if (st->trainer.steps_per_s > 0)
        printf(" (about %.0f s of training)",
               (double)st->trainer.steps_at_risk / st->trainer.steps_per_s);
    }
    printf("\n");
  }
  if (st->has_last_commit)
    printf("last commit:  %s at %s (committed %" PRId64 " s ago)\n",
           E(st->last_commit.name), spotctl_esc(st->last_commit.time),
           st->last_commit.age_s);
  else
    printf("last commit:  none (all work since start is at risk)\n");
  if (st->has_upload) {
    printf("upload:       %s %s / %s at %.0f MB/s", E(st->upload.name),
           spot_fmt_bytes(st->upload.bytes_done, a, sizeof(a)),
           spot_fmt_bytes(st->upload.bytes_total, b, sizeof(b)),
           st->upload.rate / 1e6);
    if (st->upload.eta_s >= 0)
      printf(", ETA %" PRId64 " s", st->upload.eta_s);
    printf("\n");
  }
  for (size_t i = 0; i < st->n_relaunch; i++)
    printf("relaunch:     %s %s: %s (status %d)\n",
           spotctl_esc(st->relaunch[i].time), E(st->relaunch[i].reason),
           st->relaunch[i].ok ? "ok" : "FAILED", st->relaunch[i].exit_status);
  for (size_t i = 0; i < st->n_warnings; i++)
    printf("warning:      %s\n", E(st->warnings[i]));
}

/* The optional "lease", "restored" and "restarts" members (lib spotd's
 * status). */
static void
print_lease(json_t *res)
{
  char esc[SPOT_ESCAPE_SIZE(512)];
  json_t *l = json_object_get(res, "lease");
  const char *state = json_string_value(json_object_get(l, "state"));
  const char *holder = json_string_value(json_object_get(l, "holder"));
  const char *until = json_string_value(json_object_get(l, "expires"));
  const char *restored = json_string_value(json_object_get(res, "restored"));
  json_t *rs = json_object_get(res, "restarts");

  if (restored != NULL)
    printf("restored:     %s\n", E(restored));
  if (json_is_object(rs)) {
    json_t *ls = json_object_get(rs, "last_status");
    json_t *sg = json_object_get(rs, "last_signal");

    printf("restarts:     %" PRId64 " of %" PRId64 " used",
           (int64_t)json_integer_value(json_object_get(rs, "used")),
           (int64_t)json_integer_value(json_object_get(rs, "max")));
    if (json_is_integer(sg))
      printf(" (last failure: signal %" PRId64 ")",
             (int64_t)json_integer_value(sg));
    else if (json_is_integer(ls))
      printf(" (last failure: status %" PRId64 ")",
             (int64_t)json_integer_value(ls));
    printf("\n");
  }
  if (state == NULL)
    return;
  if (strcmp(state, "waiting") == 0 && holder != NULL)
    printf("lease:        waiting: held by %s until %s\n", E(holder),
           until != NULL ? spotctl_esc(until) : "?");
  else
    printf("lease:        %s (epoch %" PRId64 ")\n", spotctl_esc(state),
           (int64_t)json_integer_value(json_object_get(l, "epoch")));
}

#undef E

/* parse() for a command that takes no operands. */
static int
parse_no_args(int argc, char **argv, struct ctl_opts *o, const char *usage,
              bool allow_wait)
{
  int r = parse(argc, argv, o, usage, allow_wait);

  if (r < 0 && optind < argc)
    return spotctl_usage("%s: unexpected argument '%s'", argv[0], argv[optind]);
  return r;
}

/* call(), then req is freed. Returns 0 with *root and msg->result set when
 * spotd answered ok, or an exit status after printing the error (the
 * transport's or spotd's). */
static int
request(const struct ctl_opts *o, struct spot_buf *req, json_t **root,
        struct spot_proto_msg *msg)
{
  char esc[SPOT_ESCAPE_SIZE(1024)];
  int r = call(o, req, root, msg);

  spot_buf_fini(req);
  if (r != 0)
    return r;
  if (!msg->ok) {
    r = spotctl_fail("%s", spot_escape(msg->error, esc, sizeof(esc)));
    json_decref(*root);
    *root = NULL;
  }
  return r;
}

/* A command with no arguments but the common ones: parses them, sends cmd
 * and waits for the answer. -1 with *root and msg set, else the exit
 * status (printed). */
static int
simple_request(int argc, char **argv, const char *usage,
               enum spot_proto_cmd cmd, struct ctl_opts *o, json_t **root,
               struct spot_proto_msg *msg)
{
  struct spot_buf req;
  int r;

  memset(msg, 0, sizeof(*msg));
  r = parse_no_args(argc, argv, o, usage, false);
  if (r >= 0)
    return r;
  if (o->timeout_ms < 0)
    o->timeout_ms = 10000;
  spot_buf_init(&req, 4096);
  spot_proto_encode_request(&req, 1, cmd, NULL);
  r = request(o, &req, root, msg);
  return r != 0 ? r : -1;
}

static const char status_usage[] =
    "Usage: spotctl status [--json]\n\n"
    "Shows what a running spotd is doing: state, notice and time left, the\n"
    "trainer, the last committed checkpoint (the work at risk), the upload\n"
    "in progress, relaunch attempts and warnings.\n\n"
    "  --json             the status object (proto.h) for scripts\n";

int
spotctl_cmd_status(int argc, char **argv)
{
  struct ctl_opts o;
  struct spot_proto_msg msg;
  json_t *root = NULL;
  int r;

  r = simple_request(argc, argv, status_usage, SPOT_PROTO_CMD_STATUS, &o, &root,
                     &msg);
  if (r >= 0)
    return r;
  r = 0;
  if (o.json) {
    char *s = json_dumps(msg.result, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (s != NULL)
      printf("%s\n", s);
    free(s);
  } else {
    struct spot_proto_status st;
    char err[256];

    if (spot_proto_status_from_json(msg.result, &st, err, sizeof(err)) < 0)
      r = spotctl_fail("bad status from spotd: %s", err);
    else
      print_status(&st);
    if (r == 0)
      print_lease(msg.result);
  }
  json_decref(root);
  return r;
}

static const char checkpoint_usage[] =
    "Usage: spotctl checkpoint [--wait] [--timeout SEC] | --final\n\n"
    "Asks spotd to have the trainer checkpoint now. With --wait, returns\n"
    "once that checkpoint is committed in the store (exit 1 if it fails,\n"
    "or when no checkpoint completes within spotd's --ckpt-timeout).\n"
    "With --final, preempts the job as a notice would: the final\n"
    "checkpoint (on every rank of a multi-node job), then spotd exits 75.\n\n"
    "  --wait             wait for the commit\n"
    "  --final            the job's final checkpoint, then exit 75\n"
    "  --timeout SEC      give up waiting after SEC seconds\n";

int
spotctl_cmd_checkpoint(int argc, char **argv)
{
  struct ctl_opts o;
  struct spot_buf req;
  struct spot_proto_msg msg;
  json_t *root = NULL;
  int r;

  memset(&msg, 0, sizeof(msg));
  r = parse_no_args(argc, argv, &o, checkpoint_usage, true);
  if (r >= 0)
    return r;
  if (o.final && o.wait)
    return spotctl_usage("checkpoint: --final ends spotd: no --wait");
  if (!o.wait && o.timeout_ms < 0)
    o.timeout_ms = 10000;
  spot_buf_init(&req, 4096);
  if (o.final)
    spot_proto_encode_checkpoint_final(&req, 1);
  else
    spot_proto_encode_checkpoint(&req, 1, o.wait);
  r = request(&o, &req, &root, &msg);
  if (r != 0)
    return r;
  if (o.wait)
    printf("committed %s\n", spotctl_esc(jstr(msg.result, "name")));
  else if (o.final)
    printf("final checkpoint requested: spotd exits once it is committed\n");
  else
    printf("checkpoint requested\n");
  json_decref(root);
  return r;
}

static const char done_usage[] =
    "Usage: spotctl done DIR\n\n"
    "Tells spotd that DIR, a folder directly under SPOTD_CKPT_DIR, is a\n"
    "complete checkpoint (the same as creating DIR/SPOTD_COMPLETE).\n";

int
spotctl_cmd_done(int argc, char **argv)
{
  struct ctl_opts o;
  struct spot_buf req;
  struct spot_proto_msg msg;
  json_t *root = NULL;
  char *abs;
  int r;

  memset(&msg, 0, sizeof(msg));
  r = parse(argc, argv, &o, done_usage, false);
  if (r >= 0)
    return r;
  if (argc - optind != 1)
    return spotctl_usage("done: expected one folder");
  abs = realpath(argv[optind], NULL);
  if (abs == NULL)
    return spotctl_fail("%s: %s", argv[optind], strerror(errno));
  if (o.timeout_ms < 0)
    o.timeout_ms = 10000;
  spot_buf_init(&req, SPOT_PROTO_MAX_LINE + 1);
  r = spot_proto_encode_done(&req, 1, abs);
  free(abs);
  if (r < 0) {
    spot_buf_fini(&req);
    return spotctl_fail("done: %s", strerror(-r));
  }
  r = request(&o, &req, &root, &msg);
  if (r != 0)
    return r;
  printf("checkpoint %s handed to spotd\n",
         spotctl_esc(jstr(msg.result, "name")));
  json_decref(root);
  return r;
}

static const char metrics_usage[] =
    "Usage: spotctl metrics\n\n"
    "Prints the running spotd's metrics in the Prometheus text format\n"
    "(checkpoints by reason and outcome, save and upload durations, bytes\n"
    "uploaded, last commit time, work at risk, notices, relaunches, ...).\n"
    "spotd's --metrics-file writes the same text for node_exporter.\n";

int
spotctl_cmd_metrics(int argc, char **argv)
{
  struct ctl_opts o;
  struct spot_proto_msg msg;
  json_t *root = NULL;
  int r;

  r = simple_request(argc, argv, metrics_usage, SPOT_PROTO_CMD_METRICS, &o,
                     &root, &msg);
  if (r >= 0)
    return r;
  fputs(jstr(msg.result, "text"), stdout);
  json_decref(root);
  return 0;
}
