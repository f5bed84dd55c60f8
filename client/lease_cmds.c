/* spotctl lease: the job lease (lib/lease.h) and LATEST's forward-only
 * update (lib/latest.h) from the command line, for operators and tests.
 * One libuv loop, the S3 client, and a short chain of steps:
 *
 *   show             read the lease, print it
 *   acquire          wait (or not) for it, print it; then optionally hold
 *                    it (renewing) for --hold SEC or until SIGINT/SIGTERM,
 *                    move LATEST (--set-latest), and release it
 *   release          take it as --owner (spot_lease_adopt) and release
 *   set-latest       with --epoch and no acquire: move LATEST as the
 *                    holder of that epoch (fenced by the lease)
 *
 * Output lines are "WORD key=value ..." so scripts can read them. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "core/log.h"
#include "core/s3url.h"
#include "core/util.h"
#include "io/aws.h"
#include "io/http.h"
#include "io/lease.h"
#include "io/s3.h"
#include "io/store/latest.h"
#include "spotctl.h"

enum {
  EXIT_BUSY = 3,  /* --no-wait and another holder */
  EXIT_STALE = 4, /* the lease was lost, or LATEST refused */
};

enum step {
  ST_START,
  ST_ACQUIRED,
  ST_HOLDING,
  ST_LATEST,
  ST_RELEASE,
  ST_DONE,
};

struct lctl {
  struct spotctl_s3 conn;
  struct spot_lease *lease;
  char *bucket, *prefix, *job, *root, *key;

  /* options */
  const char *owner, *latest_name;
  uint64_t seq, epoch;
  bool have_seq, have_epoch;
  bool show, release, hold_forever, reset;
  int64_t grace_ms;
  struct spot_s3_op *s3op; /* --reset's requests */
  struct spot_buf body;
  int64_t hold_ms; /* < 0: do not hold */

  enum step step;
  int exit_code;
  uv_timer_t hold_timer;
  uv_signal_t sigint, sigterm;
  bool handles;
};

static void next(struct lctl *c);

static const char lease_usage[] =
    "Usage: spotctl lease s3://BUCKET/[PREFIX/]JOB [OPTIONS]\n\n"
    "Takes the job lease (JOB/LEASE): the one writer that may run the job's\n"
    "trainer and commit. Waits while another owner holds it, takes it over\n"
    "once it is released or expired (its epoch then grows by one), prints\n"
    "\"acquired ... epoch=N\" and exits, leaving it held until its TTL ends,\n"
    "unless --hold or --release says otherwise.\n\n"
    "  --owner ID         who takes it (default: spotctl@HOST:PID)\n"
    "  --ttl SEC          lease lifetime (default 30)\n"
    "  --wait             wait while another owner holds it (default)\n"
    "  --no-wait          fail at once (exit 3) if another owner holds it\n"
    "  --timeout SEC      stop waiting after SEC (default: never)\n"
    "  --poll SEC         how often a waiter reads the lease (default 1)\n"
    "  --grace SEC        clock skew allowed before an expired lease is\n"
    "                     taken over (default 2)\n"
    "  --hold SEC         keep it (renewing) SEC seconds, 0 = until SIGINT\n"
    "                     or SIGTERM, then release it; exit 4 if it is lost\n"
    "  --release          release it: after acquiring (and holding), or\n"
    "                     alone to release a lease held under --owner\n"
    "  --show             print who holds it and until when, change nothing\n"
    "  --reset            delete a lease object that is damaged, released or\n"
    "                     expired (never one held), so that the next holder\n"
    "                     creates it again; its epoch then continues past\n"
    "                     the epoch of LATEST's commit, so fencing holds\n"
    "  --set-latest NAME  move LATEST to checkpoint NAME with order\n"
    "                     EPOCH.SEQ, only forward (exit 4 if refused)\n"
    "  --seq N            the commit's sequence number (with --set-latest)\n"
    "  --epoch N          with --set-latest: act as the holder of epoch N\n"
    "                     instead of acquiring (tests, repairs)\n"
    "  --endpoint URL, --region REGION, --profile NAME   as for push\n"
    "  -h, --help         this help\n"
    "Exit status: 0 done, 1 failure, 2 usage, 3 held by another (--no-wait),\n"
    "4 lease lost or LATEST refused.\n";

enum {
  OPT_OWNER = 256,
  OPT_TTL,
  OPT_WAIT,
  OPT_NO_WAIT,
  OPT_TIMEOUT,
  OPT_POLL,
  OPT_GRACE,
  OPT_HOLD,
  OPT_RELEASE,
  OPT_SHOW,
  OPT_RESET,
  OPT_SET_LATEST,
  OPT_SEQ,
  OPT_EPOCH,
  OPT_ENDPOINT,
  OPT_REGION,
  OPT_PROFILE,
};

static const struct option lease_opts[] = {
    {"help", no_argument, NULL, 'h'},
    {"owner", required_argument, NULL, OPT_OWNER},
    {"ttl", required_argument, NULL, OPT_TTL},
    {"wait", no_argument, NULL, OPT_WAIT},
    {"no-wait", no_argument, NULL, OPT_NO_WAIT},
    {"timeout", required_argument, NULL, OPT_TIMEOUT},
    {"poll", required_argument, NULL, OPT_POLL},
    {"grace", required_argument, NULL, OPT_GRACE},
    {"hold", required_argument, NULL, OPT_HOLD},
    {"release", no_argument, NULL, OPT_RELEASE},
    {"show", no_argument, NULL, OPT_SHOW},
    {"reset", no_argument, NULL, OPT_RESET},
    {"set-latest", required_argument, NULL, OPT_SET_LATEST},
    {"seq", required_argument, NULL, OPT_SEQ},
    {"epoch", required_argument, NULL, OPT_EPOCH},
    {"endpoint", required_argument, NULL, OPT_ENDPOINT},
    {"region", required_argument, NULL, OPT_REGION},
    {"profile", required_argument, NULL, OPT_PROFILE},
    {NULL, 0, NULL, 0},
};

/* "1.5" seconds -> 1500 ms, within [0, max_s]. */
static int
parse_secs(const char *opt, const char *v, double max_s, int64_t *ms)
{
  char *end = NULL;
  double d;

  errno = 0;
  d = strtod(v, &end);
  if (errno != 0 || end == v || *end != '\0' || !isfinite(d) || d < 0 ||
      d > max_s)
    return spotctl_usage("%s: expected seconds from 0 to %.0f, got '%s'", opt,
                         max_s, v);
  *ms = (int64_t)(d * 1000.0 + 0.5);
  return 0;
}

static int
parse_count(const char *opt, const char *v, uint64_t *out)
{
  int64_t n;

  if (spot_parse_int64(v, 0, (int64_t)SPOT_LEASE_EPOCH_MAX, &n) < 0)
    return spotctl_usage("%s: expected a whole number, got '%s'", opt, v);
  *out = (uint64_t)n;
  return 0;
}

struct lease_args {
  struct spot_lease_config lc;
  const char *endpoint, *region, *profile;
  int64_t ttl, timeout, poll, grace;
  bool owner_given;
};

/* One option into c or a. 0 to go on, else an exit status. */
static int
take_opt(struct lctl *c, struct lease_args *a, int opt)
{
  switch (opt) {
  case OPT_OWNER:
    c->owner = optarg;
    return 0;
  case OPT_TTL:
    return parse_secs("--ttl", optarg, 86400, &a->ttl);
  case OPT_WAIT:
    a->lc.no_wait = false;
    return 0;
  case OPT_NO_WAIT:
    a->lc.no_wait = true;
    return 0;
  case OPT_TIMEOUT:
    return parse_secs("--timeout", optarg, 86400 * 7, &a->timeout);
  case OPT_POLL:
    return parse_secs("--poll", optarg, 3600, &a->poll);
  case OPT_GRACE:
    return parse_secs("--grace", optarg, 3600, &a->grace);
  case OPT_HOLD:
    return parse_secs("--hold", optarg, 86400 * 7, &c->hold_ms);
  case OPT_RELEASE:
    c->release = true;
    return 0;
  case OPT_SHOW:
    c->show = true;
    return 0;
  case OPT_RESET:
    c->reset = true;
    return 0;
  case OPT_SET_LATEST:
    c->latest_name = optarg;
    return 0;
  case OPT_SEQ:
    c->have_seq = true;
    return parse_count("--seq", optarg, &c->seq);
  case OPT_EPOCH:
    c->have_epoch = true;
    return parse_count("--epoch", optarg, &c->epoch);
  case OPT_ENDPOINT:
    a->endpoint = optarg;
    return 0;
  case OPT_REGION:
    a->region = optarg;
    return 0;
  case OPT_PROFILE:
    a->profile = optarg;
    return 0;
  default:
    return spotctl_usage("lease: unknown option");
  }
}

/* -1 to go on, else an exit status. */
static int
parse_args(int argc, char **argv, struct lctl *c, struct lease_args *a)
{
  int opt, r;

  optind = 1;
  opterr = 0;
  c->hold_ms = -1;
  while ((opt = getopt_long(argc, argv, "h", lease_opts, NULL)) != -1) {
    if (opt == 'h') {
      fputs(lease_usage, stdout);
      return SPOTCTL_EXIT_OK;
    }
    if (opt == '?')
      return spotctl_usage("lease: unknown or incomplete option '%s'",
                           argv[optind - 1]);
    r = take_opt(c, a, opt);
    if (r != 0)
      return r;
  }
  if (argc - optind != 1)
    return spotctl_usage("lease: expected s3://BUCKET/[PREFIX/]JOB");
  if (c->latest_name != NULL && !c->have_seq)
    return spotctl_usage("lease: --set-latest needs --seq");
  if (c->have_epoch && (c->latest_name == NULL || c->epoch == 0))
    return spotctl_usage("lease: --epoch N (N >= 1) goes with --set-latest");
  if (c->show && (c->release || c->latest_name != NULL || c->hold_ms >= 0))
    return spotctl_usage("lease: --show changes nothing: use it alone");
  if (a->ttl > 0 && a->ttl < 1000)
    return spotctl_usage("lease: --ttl: at least 1 second");
  if (c->hold_ms == 0)
    c->hold_forever = true;
  return -1;
}

static int
open_s3(struct lctl *c, const char *url, const struct lease_args *a)
{
  struct spotctl_s3_options so;
  char err[256];

  if (spot_s3_url_parse_job(url, &c->bucket, &c->prefix, &c->job, err,
                            sizeof(err)) < 0)
    return spotctl_usage("%s", err);
  if (asprintf(&c->root, "%s%s%s", c->prefix, c->prefix[0] ? "/" : "", c->job) <
          0 ||
      asprintf(&c->key, "%s/%s", c->root, SPOT_LEASE_KEY) < 0)
    return spotctl_fail("out of memory");
  memset(&so, 0, sizeof(so));
  so.endpoint = a->endpoint;
  so.region = a->region;
  so.profile = a->profile;
  return spotctl_s3_open(&c->conn, &so);
}

static void
print_lease(const char *word, const struct spot_lease_info *i)
{
  char until[32] = "?";

  spot_rfc3339_format(i->expires_ms, until, sizeof(until));
  printf("%s owner=%s epoch=%" PRIu64 " state=%s expires=%s "
         "expires_ms=%" PRId64 " waited_ms=%" PRIu64 " at_ms=%" PRId64 "\n",
         word, spotctl_esc(i->owner), i->epoch,
         i->released ? "released" : "held", until, i->expires_ms, i->waited_ms,
         spot_now_wall_ms());
  fflush(stdout);
}

static void
stop(struct lctl *c, int code)
{
  if (c->step == ST_DONE)
    return;
  c->exit_code = code;
  c->step = ST_DONE;
  if (c->handles) {
    uv_timer_stop(&c->hold_timer);
    uv_signal_stop(&c->sigint);
    uv_signal_stop(&c->sigterm);
  }
}

static void
show_cb(const struct spot_lease_info *i, void *data)
{
  struct lctl *c = data;
  int64_t left = i->expires_ms - spot_now_wall_ms();

  if (i->err < 0) {
    stop(c, spotctl_fail("lease: %s", i->message));
    return;
  }
  if (!i->exists)
    printf("none: no lease for this job\n");
  else
    print_lease(i->released ? "released" : left > 0 ? "held" : "expired", i);
  stop(c, SPOTCTL_EXIT_OK);
}

static void
wait_cb(const struct spot_lease_info *i, void *data)
{
  print_lease("waiting", i);
}

static void
acquire_cb(const struct spot_lease_info *i, void *data)
{
  struct lctl *c = data;

  if (i->err == -EBUSY) {
    print_lease("busy", i);
    stop(c, EXIT_BUSY);
    fprintf(stderr, "spotctl: lease: %s\n", spotctl_esc(i->message));
    return;
  }
  if (i->err < 0) {
    stop(c, spotctl_fail("lease: %s", i->message));
    return;
  }
  print_lease("acquired", i);
  c->step = ST_ACQUIRED;
  next(c);
}

static void
adopt_cb(const struct spot_lease_info *i, void *data)
{
  struct lctl *c = data;

  if (i->err < 0) {
    stop(c, i->err == -ESTALE ? (fprintf(stderr, "spotctl: lease: %s\n",
                                         spotctl_esc(i->message)),
                                 EXIT_STALE)
                              : spotctl_fail("lease: %s", i->message));
    return;
  }
  c->step = ST_RELEASE;
  next(c);
}

static void
lost_cb(const struct spot_lease_info *i, void *data)
{
  struct lctl *c = data;

  printf("lost owner=%s epoch=%" PRIu64 " at_ms=%" PRId64 "\n", c->owner,
         spot_lease_epoch(c->lease), spot_now_wall_ms());
  fflush(stdout);
  fprintf(stderr, "spotctl: lease: %s\n", spotctl_esc(i->message));
  stop(c, EXIT_STALE);
}

static void
release_cb(const struct spot_lease_info *i, void *data)
{
  struct lctl *c = data;

  if (i->err < 0) {
    fprintf(stderr, "spotctl: lease: %s\n", spotctl_esc(i->message));
    stop(c, i->err == -ESTALE ? EXIT_STALE : SPOTCTL_EXIT_FAIL);
    return;
  }
  print_lease("released", i);
  stop(c, SPOTCTL_EXIT_OK);
}

static void
latest_cb(const struct spot_latest_result *res, void *data)
{
  struct lctl *c = data;

  if (res->err < 0) {
    printf("refused latest=%s order=%" PRIu64 ".%" PRIu64 "\n",
           spotctl_esc(res->name), res->order.epoch, res->order.seq);
    fflush(stdout);
    fprintf(stderr, "spotctl: lease: %s\n", spotctl_esc(res->message));
    stop(c, res->err == -ESTALE ? EXIT_STALE : SPOTCTL_EXIT_FAIL);
    return;
  }
  printf("latest name=%s order=%" PRIu64 ".%" PRIu64 " moved=%d rounds=%u "
         "at_ms=%" PRId64 "\n",
         spotctl_esc(res->name), res->order.epoch, res->order.seq,
         res->moved ? 1 : 0, res->rounds, spot_now_wall_ms());
  fflush(stdout);
  if (c->lease == NULL || !spot_lease_held(c->lease)) {
    stop(c, SPOTCTL_EXIT_OK);
    return;
  }
  c->step = ST_RELEASE;
  next(c);
}

static void
hold_done(struct lctl *c)
{
  if (c->step != ST_HOLDING)
    return;
  uv_timer_stop(&c->hold_timer);
  c->step = ST_LATEST;
  next(c);
}

static void
hold_timer_cb(uv_timer_t *t)
{
  hold_done(spot_container_of(t, struct lctl, hold_timer));
}

static void
signal_cb(uv_signal_t *s, int signum)
{
  struct lctl *c = s->data;

  if (c->step == ST_HOLDING) {
    hold_done(c);
    return;
  }
  stop(c, 128 + signum);
  spot_lease_cancel(c->lease); /* a wait: acquire_cb's -ECANCELED */
}

/* Moves LATEST (as the lease holder, or as --epoch). */
static void
set_latest(struct lctl *c)
{
  struct spot_latest_order o;
  int r;

  if (c->lease != NULL && !spot_lease_held(c->lease)) {
    fprintf(stderr, "spotctl: lease: not moving LATEST: the lease is no "
                    "longer held\n");
    stop(c, EXIT_STALE);
    return;
  }
  o.epoch = c->lease != NULL ? spot_lease_epoch(c->lease) : c->epoch;
  o.seq = c->seq;
  r = spot_latest_update(c->conn.s3, c->bucket, c->root, c->latest_name, o, -1,
                         c->owner, latest_cb, c, NULL);
  if (r < 0)
    stop(c, spotctl_fail("lease: --set-latest %s: %s", c->latest_name,
                         strerror(-r)));
}

static void
next(struct lctl *c)
{
  int r;

  switch (c->step) {
  case ST_ACQUIRED:
    if (c->hold_ms >= 0) {
      c->step = ST_HOLDING;
      if (!c->hold_forever)
        uv_timer_start(&c->hold_timer, hold_timer_cb, (uint64_t)c->hold_ms, 0);
      return;
    }
    c->step = ST_LATEST;
    next(c);
    return;
  case ST_LATEST:
    if (c->latest_name != NULL) {
      set_latest(c);
      return;
    }
    c->step = ST_RELEASE;
    next(c);
    return;
  case ST_RELEASE:
    if (!c->release && c->hold_ms < 0) {
      stop(c, SPOTCTL_EXIT_OK); /* left held until it expires */
      return;
    }
    r = spot_lease_release(c->lease, release_cb, c);
    if (r < 0)
      stop(c, r == -ENOTCONN
                  ? (fprintf(stderr, "spotctl: lease: not held any more\n"),
                     EXIT_STALE)
                  : spotctl_fail("lease: release: %s", strerror(-r)));
    return;
  case ST_START:
  case ST_HOLDING:
  case ST_DONE:
    return;
  }
}

/* Picks the first step. 0, or an exit status. */
/* --reset: read the lease; refuse one that is held; delete the rest. */
static void
reset_del_cb(const struct spot_s3_result *res, void *data)
{
  struct lctl *c = data;
  char line[512];

  c->s3op = NULL;
  if (res->err < 0 && res->err != -ENOENT) {
    stop(c, spotctl_fail("lease: --reset: deleting %s: %s", c->key,
                         spot_s3_strerror(res, line, sizeof(line))));
    return;
  }
  printf("reset key=%s at_ms=%" PRId64 "\n", c->key, spot_now_wall_ms());
  fflush(stdout);
  fprintf(stderr,
          "spotctl: lease: s3://%s/%s deleted; the next holder creates it "
          "at an epoch past LATEST's commit\n",
          c->bucket, c->key);
  stop(c, SPOTCTL_EXIT_OK);
}

static void
reset_get_cb(const struct spot_s3_result *res, void *data)
{
  struct lctl *c = data;
  const char *keys[1] = {c->key};
  struct spot_lease_doc d;
  char err[200], line[512], until[32] = "?";
  int r;

  c->s3op = NULL;
  if (res->err == -ENOENT) {
    printf("none: no lease for this job\n");
    stop(c, SPOTCTL_EXIT_OK);
    return;
  }
  if (res->err < 0) {
    stop(c, spotctl_fail("lease: --reset: reading %s: %s", c->key,
                         spot_s3_strerror(res, line, sizeof(line))));
    return;
  }
  if (spot_lease_doc_parse(spot_buf_str(&c->body), c->body.len, &d, err,
                           sizeof(err)) == 0 &&
      spot_lease_doc_judge(&d, "", "", spot_now_wall_ms(), c->grace_ms) ==
          SPOT_LEASE_THEIRS) {
    spot_rfc3339_format(d.expires_ms, until, sizeof(until));
    fprintf(stderr,
            "spotctl: lease: not resetting: held by %s (epoch %" PRIu64
            ") until %s; release it or let it expire\n",
            spotctl_esc(d.owner), d.epoch, until);
    stop(c, EXIT_BUSY);
    return;
  }
  r = spot_s3_delete_objects(c->conn.s3, c->bucket, keys, 1, reset_del_cb, c,
                             &c->s3op);
  if (r < 0)
    stop(c, spotctl_fail("lease: --reset: %s", strerror(-r)));
}

static int
start_reset(struct lctl *c)
{
  int r;

  spot_buf_init(&c->body, SPOT_LEASE_JSON_MAX);
  r = spot_s3_get(c->conn.s3, c->bucket, c->key, 0, 0, NULL, &c->body,
                  reset_get_cb, c, &c->s3op);
  if (r < 0)
    return spotctl_fail("lease: --reset: %s", strerror(-r));
  return 0;
}

static int
start(struct lctl *c, struct lease_args *a)
{
  int r;

  if (c->reset) {
    c->grace_ms = a->grace > 0 ? a->grace : SPOT_LEASE_GRACE_DEFAULT_MS;
    return start_reset(c);
  }

  if (c->have_epoch) { /* LATEST alone, as holder of --epoch */
    c->step = ST_LATEST;
    next(c);
    return 0;
  }
  a->lc.s3 = c->conn.s3;
  a->lc.bucket = c->bucket;
  a->lc.key = c->key;
  a->lc.owner = c->owner;
  a->lc.ttl_ms = (uint64_t)a->ttl;
  a->lc.poll_ms = (uint64_t)a->poll;
  a->lc.grace_ms = a->grace;
  a->lc.wait_timeout_ms = (uint64_t)a->timeout;
  r = spot_lease_new(&c->conn.loop, &a->lc, lost_cb, c, &c->lease);
  if (r < 0)
    return spotctl_fail("lease: %s", strerror(-r));
  if (c->show)
    r = spot_lease_show(c->lease, show_cb, c);
  else if (c->release && c->hold_ms < 0 && c->latest_name == NULL &&
           a->owner_given)
    r = spot_lease_adopt(c->lease, adopt_cb, c);
  else
    r = spot_lease_acquire(c->lease, wait_cb, acquire_cb, c);
  if (r < 0)
    return spotctl_fail("lease: %s", strerror(-r));
  return 0;
}

static void
close_all(struct lctl *c)
{
  spot_lease_free(c->lease);
  if (c->handles) {
    uv_close((uv_handle_t *)&c->hold_timer, NULL);
    uv_close((uv_handle_t *)&c->sigint, NULL);
    uv_close((uv_handle_t *)&c->sigterm, NULL);
  }
  spotctl_s3_close(&c->conn);
  spot_buf_fini(&c->body);
  free(c->bucket);
  free(c->prefix);
  free(c->job);
  free(c->root);
  free(c->key);
}

int
spotctl_cmd_lease(int argc, char **argv)
{
  static char default_owner[300];
  struct lease_args a;
  struct lctl c;
  char host[256] = "localhost";
  int r;

  memset(&c, 0, sizeof(c));
  memset(&a, 0, sizeof(a));
  r = parse_args(argc, argv, &c, &a);
  if (r >= 0)
    return r;
  a.owner_given = c.owner != NULL;
  if (c.owner == NULL) {
    gethostname(host, sizeof(host) - 1);
    snprintf(default_owner, sizeof(default_owner), "spotctl@%s:%ld", host,
             (long)getpid());
    c.owner = default_owner;
  }
  if (!spot_lease_doc_owner_valid(c.owner))
    return spotctl_usage("lease: --owner: 1 to %d printable characters",
                         SPOT_LEASE_OWNER_MAX);
  r = open_s3(&c, argv[optind], &a);
  if (r == 0) {
    uv_timer_init(&c.conn.loop, &c.hold_timer);
    uv_signal_init(&c.conn.loop, &c.sigint);
    uv_signal_init(&c.conn.loop, &c.sigterm);
    c.sigint.data = c.sigterm.data = &c;
    c.handles = true;
    uv_signal_start(&c.sigint, signal_cb, SIGINT);
    uv_signal_start(&c.sigterm, signal_cb, SIGTERM);
    r = start(&c, &a);
    while (r == 0 && c.step != ST_DONE &&
           uv_run(&c.conn.loop, UV_RUN_ONCE) != 0)
      ;
    if (r == 0)
      r = c.exit_code;
  }
  close_all(&c);
  return r;
}
