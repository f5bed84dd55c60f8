/* The job lease on S3 conditional writes. See lease.h for the contract and
 * lease_doc.h for the object.
 *
 *   IDLE -acquire-> READING -> WRITING -> HELD <-> RENEWING
 *                     ^   |       |        |  \-> LOST (lost_cb)
 *                     |   v       v        v
 *                   WAITING  CONFIRMING  RELEASING -> IDLE
 *
 * READING    GET the lease, judge it (lease_doc.c)
 * WRITING    conditional PUT of ours: If-None-Match: * (absent) or
 *            If-Match: ETAG (released, expired)
 * CONFIRMING a conditional PUT failed: GET again to tell our own write
 *            (a lost response), the other If-Match form and a real
 *            conflict apart
 * WAITING    another writer holds it: the poll timer reads it again
 * HELD       the renew timer renews it (RENEWING) every renew_ms
 * RELEASING  conditional PUT of "released"
 *
 * Only set_state() changes state. Two timers with one purpose each: poll
 * (waiting) and renew (held). At most one S3 op is in flight. */
#include "io/lease.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"

#define BODY_CAP SPOT_LEASE_JSON_MAX
#define RETRY_MS 1000 /* a failed renewal is tried again this soon */

enum lease_state {
  LS_IDLE,
  LS_READING,
  LS_WRITING,
  LS_CONFIRMING,
  LS_WAITING,
  LS_HELD,
  LS_RENEWING,
  LS_RELEASING,
  LS_LOST,
  LS_CLOSING,
  LS_STATE_LAST,
};

static const char *const state_names[LS_STATE_LAST] = {
    [LS_IDLE] = "idle",         [LS_READING] = "reading",
    [LS_WRITING] = "writing",   [LS_CONFIRMING] = "confirming",
    [LS_WAITING] = "waiting",   [LS_HELD] = "held",
    [LS_RENEWING] = "renewing", [LS_RELEASING] = "releasing",
    [LS_LOST] = "lost",         [LS_CLOSING] = "closing",
};

enum user_op {
  U_NONE,
  U_ACQUIRE,
  U_RELEASE,
  U_SHOW,
  U_ADOPT,
};

enum write_kind {
  W_ACQUIRE,
  W_RENEW,
  W_RELEASE,
};

/* The conditional write in flight (or being confirmed). */
struct pending {
  enum write_kind kind;
  struct spot_lease_doc doc;
  char *body;
  bool create;           /* If-None-Match: * */
  char etag[160];        /* If-Match target, bare */
  bool form_flipped;     /* the other If-Match form was tried */
  bool etag_learned;     /* the ETag our last PUT did not return */
  uint64_t sent_mono_ms; /* first send: the lease counts from here */
  int64_t sent_s3_ms;    /* S3's clock at the first send, as we knew it */
  int64_t sent_skew_ms;  /* the skew that estimate took */
};

struct spot_lease {
  uv_loop_t *loop;
  struct spot_s3 *s3;
  char *bucket, *key, *owner;
  uint64_t ttl_ms, renew_ms, poll_ms, wait_timeout_ms;
  int64_t grace_ms;
  bool no_wait;
  enum lease_state state;

  /* the user operation */
  enum user_op uop;
  spot_lease_cb cb, wait_cb;
  void *data;
  uint64_t wait_start_ms;
  bool waited;
  bool release_pending; /* release asked while renewing */

  spot_lease_cb lost_cb;
  void *lost_data;
  spot_lease_deadline_cb deadline_cb;
  void *deadline_data;

  /* what we know of the object */
  bool cur_exists;
  struct spot_lease_doc cur;
  char cur_etag[160];                       /* bare */
  char our_nonce[SPOT_LEASE_NONCE_MAX + 1]; /* of our last write, or "" */
  uint64_t deadline_ms;                     /* held: monotonic */
  uint64_t epoch;                           /* held or held last */
  char last_holder[SPOT_LEASE_OWNER_MAX + 1];
  uint64_t last_holder_epoch;

  struct pending w;
  uint64_t acq_epoch; /* the epoch an acquire will write, before the floor */
  /* this node's clock against S3's Date, from the last answer */
  int64_t skew_ms;
  bool skew_known, skew_warned;
  bool freeing;
  /* S3 requests given up on (cancelled, s3op cleared) whose -ECANCELED
   * callbacks are still due from the loop; l is freed after them. */
  unsigned abandoned;
  struct spot_s3_op *s3op;
  struct spot_buf body; /* GET */
  char msg[512];
  uv_timer_t poll_timer, renew_timer;
  /* Fires at deadline_ms whatever is in flight: a renewal stuck in S3
   * retries (up to minutes) must not keep a lease the next holder may
   * already have taken. */
  uv_timer_t deadline_timer;
  unsigned pending_closes;
};

static void read_cb(const struct spot_s3_result *res, void *data);
static void write_cb(const struct spot_s3_result *res, void *data);
static void confirm_cb(const struct spot_s3_result *res, void *data);
static void judge_and_act(struct spot_lease *l);
static void arm_deadline(struct spot_lease *l);

/* Now on S3's clock as far as we know it: our wall clock less the skew
 * the last answer showed. The holder writes every expiry on it, so a node
 * whose clock steps after it took the lease still writes expiries the
 * others read right. (A taker judges on its own clock, which it may use
 * only while within the grace of S3's: judge_and_act().) */
static int64_t
s3_now_ms(const struct spot_lease *l)
{
  return spot_now_wall_ms() - (l->skew_known ? l->skew_ms : 0);
}

static const struct spot_fsm lease_fsm = {"lease", state_names, LS_STATE_LAST,
                                          NULL,    0,           SPOT_LOG_DEBUG};

#define set_state(l, s) set_state_at((l), (s), __FILE__, __LINE__)
static void
set_state_at(struct spot_lease *l, enum lease_state s, const char *file,
             int line)
{
  if (spot_fsm_move_detail(&lease_fsm, l->state, s, file, line,
                           "key=%s owner=%s", l->key, l->owner) > 0)
    l->state = s;
}

const char *
spot_lease_state_name(const struct spot_lease *l)
{
  return l != NULL ? state_names[l->state] : "none";
}

bool
spot_lease_held(const struct spot_lease *l)
{
  return l != NULL && (l->state == LS_HELD || l->state == LS_RENEWING) &&
         spot_now_mono_ms() < l->deadline_ms;
}

uint64_t
spot_lease_epoch(const struct spot_lease *l)
{
  return l != NULL ? l->epoch : 0;
}

static void
fill_info(const struct spot_lease *l, int err, struct spot_lease_info *info)
{
  memset(info, 0, sizeof(*info));
  info->err = err;
  info->message = err < 0 ? l->msg : "";
  info->exists = l->cur_exists;
  info->owner = l->cur_exists ? l->cur.owner : "";
  info->epoch = l->cur_exists ? l->cur.epoch : 0;
  info->released = l->cur_exists && l->cur.released;
  info->expires_ms = l->cur_exists ? l->cur.expires_ms : 0;
  info->verdict =
      spot_lease_doc_judge(l->cur_exists ? &l->cur : NULL, l->owner,
                           l->our_nonce, spot_now_wall_ms(), l->grace_ms);
  if (l->waited)
    info->waited_ms = spot_now_mono_ms() - l->wait_start_ms;
}

/* Ends the user operation: its callback runs once. */
static void
finish_user(struct spot_lease *l, int err)
{
  struct spot_lease_info info;
  spot_lease_cb cb = l->cb;
  void *data = l->data;

  if (l->uop == U_NONE)
    return;
  if (err < 0 && err != -ECANCELED && l->msg[0] == '\0')
    snprintf(l->msg, sizeof(l->msg), "lease s3://%s/%s: %s", l->bucket, l->key,
             strerror(-err));
  if (err == -ECANCELED && l->msg[0] == '\0')
    snprintf(l->msg, sizeof(l->msg), "cancelled");
  fill_info(l, err, &info);
  l->uop = U_NONE;
  l->cb = l->wait_cb = NULL;
  l->release_pending = false;
  cb(&info, data);
}

static void
lose(struct spot_lease *l, int err, const char *why)
{
  struct spot_lease_info info;

  uv_timer_stop(&l->renew_timer);
  uv_timer_stop(&l->deadline_timer);
  set_state(l, LS_LOST);
  l->our_nonce[0] = '\0';
  snprintf(l->msg, sizeof(l->msg),
           "lease s3://%s/%s epoch %" PRIu64 " lost: %s", l->bucket, l->key,
           l->epoch, why);
  log_warn("%s", l->msg);
  if (l->uop == U_RELEASE) /* a release that found it lost */
    finish_user(l, -ESTALE);
  if (l->lost_cb != NULL) {
    fill_info(l, err, &info);
    l->lost_cb(&info, l->lost_data);
  }
}

static void
make_nonce(char *out, size_t size)
{
  snprintf(out, size, "%08" PRIx32 "%08" PRIx32, spot_random_u32(),
           spot_random_u32());
}

static int
start_get(struct spot_lease *l, enum lease_state s, spot_s3_cb cb)
{
  int r;

  spot_buf_reset(&l->body);
  set_state(l, s);
  r = spot_s3_get(l->s3, l->bucket, l->key, 0, 0, NULL, &l->body, cb, l,
                  &l->s3op);
  if (r < 0)
    snprintf(l->msg, sizeof(l->msg), "reading the lease s3://%s/%s: %s",
             l->bucket, l->key, strerror(-r));
  return r;
}

/* (Re)sends l->w in the If-Match form this server wants. */
static int
send_write(struct spot_lease *l)
{
  struct spot_s3_put_opts o;
  char etag[170];
  int r = 0;

  memset(&o, 0, sizeof(o));
  if (l->w.create) {
    o.flags = SPOT_S3_IF_NONE_MATCH;
  } else {
    if (spot_s3_if_match_unquoted(l->s3))
      spot_strlcpy(etag, l->w.etag, sizeof(etag));
    else
      r = spot_lease_doc_etag_quoted(l->w.etag, etag, sizeof(etag));
    o.if_match = etag;
  }
  if (r == 0)
    r = spot_s3_put_ex(l->s3, l->bucket, l->key, l->w.body, strlen(l->w.body),
                       &o, write_cb, l, &l->s3op);
  if (r < 0)
    snprintf(l->msg, sizeof(l->msg), "writing the lease s3://%s/%s: %s",
             l->bucket, l->key, strerror(-r));
  return r;
}

/* Writes doc: our new lease (acquire, renew) or its release. */
static int
start_write(struct spot_lease *l, enum write_kind kind, uint64_t epoch,
            bool released)
{
  static const enum lease_state states[] = {
      [W_ACQUIRE] = LS_WRITING,
      [W_RENEW] = LS_RENEWING,
      [W_RELEASE] = LS_RELEASING,
  };
  int64_t now = s3_now_ms(l);
  int r;

  free(l->w.body);
  memset(&l->w, 0, sizeof(l->w));
  l->w.kind = kind;
  spot_strlcpy(l->w.doc.owner, l->owner, sizeof(l->w.doc.owner));
  l->w.doc.epoch = epoch;
  l->w.doc.released = released;
  l->w.doc.ttl_ms = (int64_t)l->ttl_ms;
  l->w.doc.expires_ms = released ? now : now + (int64_t)l->ttl_ms;
  make_nonce(l->w.doc.nonce, sizeof(l->w.doc.nonce));
  l->w.create = !l->cur_exists;
  spot_strlcpy(l->w.etag, l->cur_etag, sizeof(l->w.etag));
  l->w.sent_mono_ms = spot_now_mono_ms();
  l->w.sent_s3_ms = now;
  l->w.sent_skew_ms = l->skew_known ? l->skew_ms : 0;
  r = spot_lease_doc_encode(&l->w.doc, &l->w.body);
  if (r < 0) {
    snprintf(l->msg, sizeof(l->msg), "encoding the lease: %s", strerror(-r));
    return r;
  }
  set_state(l, states[kind]);
  return send_write(l);
}

/* Parses a GET result into cur. 0, or -EBADMSG with l->msg set. */
static int
take_read(struct spot_lease *l, const struct spot_s3_result *res)
{
  char err[200];
  int r;

  if (res->err == -ENOENT) {
    l->cur_exists = false;
    l->cur_etag[0] = '\0';
    return 0;
  }
  r = spot_lease_doc_parse(spot_buf_str(&l->body), l->body.len, &l->cur, err,
                           sizeof(err));
  if (r < 0) {
    snprintf(l->msg, sizeof(l->msg),
             "s3://%s/%s is not a spotd lease: %s (reset it with: "
             "spotctl lease s3://%s/%.*s --reset)",
             l->bucket, l->key, err, l->bucket,
             (int)(strlen(l->key) > strlen(SPOT_LEASE_KEY)
                       ? strlen(l->key) - strlen(SPOT_LEASE_KEY) - 1
                       : strlen(l->key)),
             l->key);
    return r;
  }
  l->cur_exists = true;
  if (spot_lease_doc_etag_bare(res->etag, l->cur_etag, sizeof(l->cur_etag)) < 0)
    l->cur_etag[0] = '\0';
  return 0;
}

static void
maybe_free(struct spot_lease *l)
{
  if (!l->freeing || l->pending_closes > 0 || l->abandoned > 0)
    return;
  free(l->w.body);
  spot_buf_fini(&l->body);
  free(l->bucket);
  free(l->key);
  free(l->owner);
  free(l);
}

/* Gives up on the request in flight: cancelling only queues its callback,
 * which must then neither touch the state (a new request may be in s3op
 * by then) nor find l freed. */
static void
abandon(struct spot_lease *l)
{
  struct spot_s3_op *op = l->s3op;

  if (op == NULL)
    return;
  l->s3op = NULL;
  l->abandoned++;
  spot_s3_cancel(op);
}

/* The start of every S3 callback: true for an abandoned request's (l may
 * be gone after it: return at once). */
static bool
abandoned_cb(struct spot_lease *l, const struct spot_s3_result *res)
{
  if (res->err != -ECANCELED || l->abandoned == 0)
    return false;
  l->abandoned--;
  maybe_free(l);
  return true;
}

/* The local deadline: the last confirmed write's send time + ttl. Not
 * renewed by then, whatever is in flight, the lease is lost here: the
 * request is cancelled and lost_cb runs at once, so the holder stops
 * before a taker (who waits until expires_ms + grace on its own clock)
 * may start. */
static void
deadline_timer_cb(uv_timer_t *t)
{
  struct spot_lease *l =
      spot_container_of(t, struct spot_lease, deadline_timer);

  if (l->state != LS_HELD && l->state != LS_RENEWING &&
      l->state != LS_CONFIRMING && l->state != LS_RELEASING)
    return;
  if (l->state == LS_CONFIRMING && l->w.kind == W_ACQUIRE)
    return;
  if (spot_now_mono_ms() < l->deadline_ms) { /* renewed meanwhile */
    arm_deadline(l);
    return;
  }
  abandon(l);
  lose(l, -ETIMEDOUT,
       "not renewed before its local deadline (a renewal request was still "
       "in flight)");
}

static void
arm_deadline(struct spot_lease *l)
{
  uint64_t now = spot_now_mono_ms();

  uv_timer_start(&l->deadline_timer, deadline_timer_cb,
                 l->deadline_ms > now ? l->deadline_ms - now : 0, 0);
}

static void
renew_timer_cb(uv_timer_t *t)
{
  struct spot_lease *l = spot_container_of(t, struct spot_lease, renew_timer);
  int r;

  if (l->state != LS_HELD)
    return;
  if (spot_now_mono_ms() >= l->deadline_ms) {
    lose(l, -ETIMEDOUT, "not renewed before it lapsed");
    return;
  }
  r = start_write(l, W_RENEW, l->epoch, false);
  if (r < 0) {
    set_state(l, LS_HELD);
    uv_timer_start(&l->renew_timer, renew_timer_cb, RETRY_MS, 0);
  }
}

static void
fail_user(struct spot_lease *l, int err)
{
  set_state(l, LS_IDLE);
  finish_user(l, err);
}

static void
poll_timer_cb(uv_timer_t *t)
{
  struct spot_lease *l = spot_container_of(t, struct spot_lease, poll_timer);
  int r;

  if (l->state != LS_WAITING)
    return;
  r = start_get(l, LS_READING, read_cb);
  if (r < 0)
    fail_user(l, r);
}

/* Another writer holds it: refuse, give up, or poll again. */
static void
wait_for_holder(struct spot_lease *l)
{
  struct spot_lease_info info;
  char until[32] = "?";
  int64_t left;
  uint64_t next;

  if (l->no_wait) {
    spot_rfc3339_format(l->cur.expires_ms, until, sizeof(until));
    snprintf(l->msg, sizeof(l->msg),
             "job lease held by %s (epoch %" PRIu64 ") until %s", l->cur.owner,
             l->cur.epoch, until);
    fail_user(l, -EBUSY);
    return;
  }
  if (!l->waited) {
    l->waited = true;
    l->wait_start_ms = spot_now_mono_ms();
  }
  if (l->wait_timeout_ms > 0 &&
      spot_now_mono_ms() - l->wait_start_ms >= l->wait_timeout_ms) {
    snprintf(l->msg, sizeof(l->msg),
             "gave up waiting for the job lease held by %s (epoch %" PRIu64 ")",
             l->cur.owner, l->cur.epoch);
    fail_user(l, -ETIMEDOUT);
    return;
  }
  set_state(l, LS_WAITING);
  if (strcmp(l->last_holder, l->cur.owner) != 0 ||
      l->last_holder_epoch != l->cur.epoch) {
    spot_strlcpy(l->last_holder, l->cur.owner, sizeof(l->last_holder));
    l->last_holder_epoch = l->cur.epoch;
    spot_rfc3339_format(l->cur.expires_ms, until, sizeof(until));
    log_info("lease: waiting: s3://%s/%s held by %s (epoch %" PRIu64
             ") until %s",
             l->bucket, l->key, l->cur.owner, l->cur.epoch, until);
    if (l->wait_cb != NULL) {
      fill_info(l, 0, &info);
      l->wait_cb(&info, l->data);
    }
  }
  left = spot_lease_doc_wait_ms(&l->cur, spot_now_wall_ms(), l->grace_ms);
  next = left < (int64_t)l->poll_ms ? (uint64_t)left : l->poll_ms;
  uv_timer_start(&l->poll_timer, poll_timer_cb, next, 0);
}

/* This node's clock against S3's, from every answer on the lease (each
 * renewal included): a warning past 1 s, once until it comes back. */
static void
note_skew(struct spot_lease *l, const struct spot_s3_result *res)
{
  int64_t sk = spot_s3_clock_skew_ms(res);

  if (res->date_ms <= 0)
    return;
  l->skew_ms = sk;
  l->skew_known = true;
  if (llabs(sk) <= 1000) {
    l->skew_warned = false;
    return;
  }
  if (!l->skew_warned)
    log_warn("clock: this node's clock is %.1f s %s S3's (lease s3://%s/%s); "
             "a lease allows %.1f s: fix the clock (NTP, chrony)",
             (double)llabs(sk) / 1000.0, sk > 0 ? "ahead of" : "behind",
             l->bucket, l->key, (double)l->grace_ms / 1000.0);
  l->skew_warned = true;
}

/* The start of a GET's callback: the request is over. True when the
 * answer ends the user's operation: cancelled (whoever cancelled
 * finishes), or an error other than a missing object (failed, the
 * message starting with what). */
static bool
get_failed(struct spot_lease *l, const struct spot_s3_result *res,
           const char *what)
{
  char line[512];

  if (abandoned_cb(l, res))
    return true;
  l->s3op = NULL;
  note_skew(l, res);
  if (res->err == -ECANCELED)
    return true;
  if (res->err < 0 && res->err != -ENOENT) {
    snprintf(l->msg, sizeof(l->msg), "%s%s", what,
             spot_s3_strerror(res, line, sizeof(line)));
    fail_user(l, res->err);
    return true;
  }
  return false;
}

/* The fencing state LATEST carries: a new epoch is always past the epoch
 * of LATEST's order, so a lease object deleted or recreated (an operator's
 * reset, `spotctl lease --reset`) continues the epochs instead of starting
 * again at 1, below every commit LATEST would then refuse as backwards. */
static void
floor_cb(const struct spot_s3_result *res, void *data)
{
  struct spot_lease *l = data;
  struct spot_latest_order o = {0, 0};
  char v[64];
  uint64_t epoch;
  int r;

  if (get_failed(l, res, "reading LATEST's order: "))
    return;
  epoch = l->acq_epoch;
  if (res->err == 0 &&
      spot_s3_meta_get(res->meta, SPOT_LATEST_ORDER_META, v, sizeof(v)) == 0 &&
      spot_lease_doc_order_parse(v, &o) == 0 && o.epoch >= epoch) {
    if (o.epoch == UINT64_MAX) {
      snprintf(l->msg, sizeof(l->msg), "lease epoch overflow");
      fail_user(l, -EOVERFLOW);
      return;
    }
    log_info("lease: s3://%s/%s would start at epoch %" PRIu64
             ", LATEST's commit is at epoch %" PRIu64 ": taking epoch %" PRIu64,
             l->bucket, l->key, epoch, o.epoch, o.epoch + 1);
    epoch = o.epoch + 1;
  }
  r = start_write(l, W_ACQUIRE, epoch, false);
  if (r < 0)
    fail_user(l, r);
}

static int
start_floor(struct spot_lease *l)
{
  size_t n = strlen(l->key), leaf = strlen(SPOT_LEASE_KEY);
  char *latest;
  int r;

  /* ROOT/LEASE -> ROOT/LATEST */
  if (n < leaf || strcmp(l->key + n - leaf, SPOT_LEASE_KEY) != 0)
    return start_write(l, W_ACQUIRE, l->acq_epoch, false);
  if (asprintf(&latest, "%.*sLATEST", (int)(n - leaf), l->key) < 0)
    return -ENOMEM;
  set_state(l, LS_READING);
  spot_buf_reset(&l->body);
  r = spot_s3_get(l->s3, l->bucket, latest, 0, 0, NULL, &l->body, floor_cb, l,
                  &l->s3op);
  free(latest);
  if (r < 0)
    snprintf(l->msg, sizeof(l->msg), "reading LATEST's order: %s",
             strerror(-r));
  return r;
}

/* The first line of a small /proc file, without its newline; "" when it
 * cannot be read. */
static void
read_line(const char *path, char *buf, size_t size)
{
  FILE *f = fopen(path, "re");

  buf[0] = '\0';
  if (f == NULL)
    return;
  if (fgets(buf, (int)size, f) == NULL)
    buf[0] = '\0';
  fclose(f);
  buf[strcspn(buf, "\n")] = '\0';
}

static void
local_identity(struct spot_lease_owner *o)
{
  struct stat st;

  memset(o, 0, sizeof(*o));
  read_line("/proc/sys/kernel/random/boot_id", o->boot, sizeof(o->boot));
  if (stat("/proc/self/ns/pid", &st) == 0)
    o->pidns = (uint64_t)st.st_ino;
  if (gethostname(o->host, sizeof(o->host) - 1) < 0)
    o->host[0] = '\0';
  o->host[sizeof(o->host) - 1] = '\0';
  o->pid = (long)getpid();
}

int
spot_lease_local_owner(const char *instance, char *out, size_t size)
{
  struct spot_lease_owner o;

  local_identity(&o);
  return spot_lease_owner_format(instance, &o, out, size);
}

/* The lock file of an owner id: a name from a hash of the id, in a
 * directory every process of this machine shares. */
static void
lock_path(const char *owner, char *out, size_t size)
{
  struct stat st;
  uint64_t h = 14695981039346656037ULL; /* FNV-1a */
  const char *dir = "/dev/shm";

  for (const unsigned char *p = (const unsigned char *)owner; *p != '\0'; p++)
    h = (h ^ *p) * 1099511628211ULL;
  if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || access(dir, W_OK) < 0)
    dir = "/tmp";
  snprintf(out, size, "%s/spotd-lease-%016" PRIx64 ".lock", dir, h);
}

/* This process's own lock (spot_lease_lock_hold), once held. */
static int own_lock_fd = -1;
static char own_lock_file[128];

int
spot_lease_lock_hold(const char *owner)
{
  char path[128];
  int fd;

  if (own_lock_fd >= 0)
    return own_lock_fd;
  lock_path(owner, path, sizeof(path));
  fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    return -errno;
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno;

    close(fd);
    return e == EWOULDBLOCK ? -EBUSY : -e;
  }
  own_lock_fd = fd;
  spot_strlcpy(own_lock_file, path, sizeof(own_lock_file));
  return fd;
}

void
spot_lease_lock_drop(void)
{
  if (own_lock_fd < 0)
    return;
  (void)unlink(own_lock_file);
  close(own_lock_fd);
  own_lock_fd = -1;
  own_lock_file[0] = '\0';
}

bool
spot_lease_holder_gone(const char *owner, char *why, size_t size)
{
  struct spot_lease_owner them, us;
  char path[128];
  int fd;

  if (why != NULL && size > 0)
    why[0] = '\0';
  if (spot_lease_owner_parse(owner, &them) < 0)
    return false;
  local_identity(&us);
  /* Another machine, container or boot: its processes are not ours to
   * see. Without a boot id or pid namespace nothing can be told. */
  if (us.boot[0] == '\0' || us.pidns == 0 || strcmp(them.boot, us.boot) != 0 ||
      them.pidns != us.pidns || strcmp(them.host, us.host) != 0)
    return false;
  /* The holder holds its lock from before its first lease write until it
   * and its trainer's guard are gone: the kernel drops it then, never
   * before. Free (or ours: a process before us had our pid and its lock
   * file) is the proof; no lock file, or one held, proves nothing. */
  lock_path(owner, path, sizeof(path));
  if (own_lock_fd >= 0 && strcmp(path, own_lock_file) == 0) {
    if (why != NULL)
      snprintf(why, size, "pid %ld is this process now, and its lock is ours",
               them.pid);
    return true;
  }
  fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return false;
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    close(fd);
    return false;
  }
  close(fd); /* the lock goes with it */
  if (why != NULL)
    snprintf(why, size, "pid %ld and its guard hold its lock no more",
             them.pid);
  return true;
}

/* After a read in an acquire: take it, or wait for its holder. */
static void
judge_and_act(struct spot_lease *l)
{
  char why[96];
  enum spot_lease_verdict v;
  uint64_t epoch;
  int r;

  v = spot_lease_doc_judge(l->cur_exists ? &l->cur : NULL, l->owner,
                           l->our_nonce, spot_now_wall_ms(), l->grace_ms);
  if (v == SPOT_LEASE_THEIRS &&
      spot_lease_holder_gone(l->cur.owner, why, sizeof(why))) {
    log_info("lease: s3://%s/%s of %s (epoch %" PRIu64 ") is held by a "
             "process of this machine that is gone (%s): taking it over",
             l->bucket, l->key, l->cur.owner, l->cur.epoch, why);
    v = SPOT_LEASE_DEAD;
  }
  if (v == SPOT_LEASE_THEIRS) {
    wait_for_holder(l);
    return;
  }
  if (l->skew_known && llabs(l->skew_ms) > l->grace_ms) {
    /* Expiry times are wall-clock times: a node this far off would take
     * over a healthy holder (ahead) or write a lease others see expired
     * early (behind). */
    snprintf(l->msg, sizeof(l->msg),
             "refusing to take the job lease: this node's clock is %.1f s "
             "%s S3's, more than the lease grace of %.1f s (fix the clock: "
             "NTP, chrony)",
             (double)llabs(l->skew_ms) / 1000.0,
             l->skew_ms > 0 ? "ahead of" : "behind",
             (double)l->grace_ms / 1000.0);
    fail_user(l, -ERANGE);
    return;
  }
  epoch = spot_lease_doc_next_epoch(l->cur_exists ? &l->cur : NULL, v);
  if (epoch == 0) {
    snprintf(l->msg, sizeof(l->msg), "lease epoch overflow");
    fail_user(l, -EOVERFLOW);
    return;
  }
  if (v == SPOT_LEASE_EXPIRED)
    log_info("lease: s3://%s/%s of %s (epoch %" PRIu64 ") expired: taking "
             "it over",
             l->bucket, l->key, l->cur.owner, l->cur.epoch);
  l->acq_epoch = epoch;
  r = start_floor(l);
  if (r < 0)
    fail_user(l, r);
}

static void
adopt(struct spot_lease *l)
{
  int64_t left;

  if (!l->cur_exists || l->cur.released ||
      strcmp(l->cur.owner, l->owner) != 0) {
    snprintf(l->msg, sizeof(l->msg), "s3://%s/%s is not held by %s (%s)",
             l->bucket, l->key, l->owner,
             !l->cur_exists    ? "no lease"
             : l->cur.released ? "released"
                               : l->cur.owner);
    fail_user(l, -ESTALE);
    return;
  }
  left = l->cur.expires_ms - s3_now_ms(l);
  spot_strlcpy(l->our_nonce, l->cur.nonce, sizeof(l->our_nonce));
  l->epoch = l->cur.epoch;
  l->deadline_ms = spot_now_mono_ms() + (left > 0 ? (uint64_t)left : 0);
  set_state(l, LS_HELD);
  uv_timer_start(&l->renew_timer, renew_timer_cb, l->renew_ms, 0);
  arm_deadline(l);
  if (l->deadline_cb != NULL)
    l->deadline_cb(l->deadline_ms, l->deadline_data);
  finish_user(l, 0);
}

static void
read_cb(const struct spot_s3_result *res, void *data)
{
  struct spot_lease *l = data;
  int r;

  if (get_failed(l, res, ""))
    return;
  r = take_read(l, res);
  if (r < 0) {
    fail_user(l, r);
    return;
  }
  if (l->uop == U_SHOW) {
    fail_user(l, 0);
    return;
  }
  if (l->uop == U_ADOPT) {
    adopt(l);
    return;
  }
  judge_and_act(l);
}

/* Stops renewing and writes "released"; on failure the lease stays held
 * (and renewing) and the release callback runs with the error. */
static void
start_release(struct spot_lease *l)
{
  int r;

  l->release_pending = false;
  uv_timer_stop(&l->renew_timer);
  r = start_write(l, W_RELEASE, l->epoch, true);
  if (r < 0) {
    set_state(l, LS_HELD);
    uv_timer_start(&l->renew_timer, renew_timer_cb, RETRY_MS, 0);
    finish_user(l, r);
  }
}

/* A conditional write succeeded (or was found to have landed). */
static void
write_landed(struct spot_lease *l, const char *etag)
{
  char until[32] = "?";

  l->cur = l->w.doc;
  l->cur_exists = true;
  if (spot_lease_doc_etag_bare(etag, l->cur_etag, sizeof(l->cur_etag)) < 0)
    l->cur_etag[0] = '\0';
  spot_strlcpy(l->our_nonce, l->w.doc.nonce, sizeof(l->our_nonce));
  if (l->w.kind == W_RELEASE) {
    log_info("lease: released s3://%s/%s (epoch %" PRIu64 ")", l->bucket,
             l->key, l->epoch);
    l->our_nonce[0] = '\0';
    fail_user(l, 0);
    return;
  }
  l->deadline_ms = l->w.sent_mono_ms + l->ttl_ms;
  {
    /* The expiry we wrote, on S3's clock as this answer shows it: a clock
     * stepped back since the last answer wrote one that is earlier. The
     * lease counts only until then (at once: given up). */
    int64_t sent_s3 = l->w.sent_s3_ms, left;

    if (l->skew_known)
      sent_s3 = l->w.sent_s3_ms + (l->w.sent_skew_ms - l->skew_ms);
    left = l->w.doc.expires_ms - sent_s3;
    if (left < (int64_t)l->ttl_ms)
      l->deadline_ms = l->w.sent_mono_ms + (left > 0 ? (uint64_t)left : 0);
  }
  l->epoch = l->w.doc.epoch;
  if (l->w.kind == W_RENEW && spot_now_mono_ms() >= l->deadline_ms) {
    lose(l, -ETIMEDOUT,
         "the expiry it wrote is already past on S3's clock (this node's "
         "clock stepped back)");
    return;
  }
  set_state(l, LS_HELD);
  uv_timer_start(&l->renew_timer, renew_timer_cb, l->renew_ms, 0);
  arm_deadline(l);
  if (l->deadline_cb != NULL)
    l->deadline_cb(l->deadline_ms, l->deadline_data);
  if (l->w.kind == W_ACQUIRE) {
    spot_rfc3339_format(l->cur.expires_ms, until, sizeof(until));
    log_info("lease: acquired s3://%s/%s epoch %" PRIu64 " until %s", l->bucket,
             l->key, l->epoch, until);
    finish_user(l, 0);
  }
  if (l->release_pending)
    start_release(l);
}

/* A write failed for another reason than its condition. */
static void
write_failed(struct spot_lease *l, const struct spot_s3_result *res)
{
  char line[512];

  spot_s3_strerror(res, line, sizeof(line));
  switch (l->w.kind) {
  case W_ACQUIRE:
    snprintf(l->msg, sizeof(l->msg), "%s", line);
    fail_user(l, res->err);
    break;
  case W_RENEW:
    log_warn("lease: renewing failed: %s", line);
    set_state(l, LS_HELD);
    uv_timer_start(&l->renew_timer, renew_timer_cb, RETRY_MS, 0);
    if (l->release_pending)
      start_release(l);
    break;
  case W_RELEASE:
    snprintf(l->msg, sizeof(l->msg), "%s", line);
    set_state(l, LS_HELD);
    uv_timer_start(&l->renew_timer, renew_timer_cb, RETRY_MS, 0);
    finish_user(l, res->err);
    break;
  }
}

static void
write_cb(const struct spot_s3_result *res, void *data)
{
  struct spot_lease *l = data;
  int r;

  if (abandoned_cb(l, res))
    return;
  l->s3op = NULL;
  note_skew(l, res);
  if (res->err == -ECANCELED)
    return;
  if (res->err == 0) {
    write_landed(l, res->etag);
    return;
  }
  if (res->err != -EEXIST && res->err != -ENOENT) {
    write_failed(l, res);
    return;
  }
  /* 412 (or AWS's 404 for If-Match on no object): confirm */
  r = start_get(l, LS_CONFIRMING, confirm_cb);
  if (r < 0)
    write_failed(l, res);
}

/* Sends l->w again, from CONFIRMING. */
static void
resend(struct spot_lease *l, const struct spot_s3_result *res)
{
  static const enum lease_state states[] = {
      [W_ACQUIRE] = LS_WRITING,
      [W_RENEW] = LS_RENEWING,
      [W_RELEASE] = LS_RELEASING,
  };

  set_state(l, states[l->w.kind]);
  if (send_write(l) < 0)
    write_failed(l, res);
}

/* The read after a failed condition: ours after all, the other If-Match
 * form, or a real conflict. */
static void
confirm_cb(const struct spot_s3_result *res, void *data)
{
  struct spot_lease *l = data;
  bool same_etag;
  int r;

  if (abandoned_cb(l, res))
    return;
  l->s3op = NULL;
  note_skew(l, res);
  if (res->err == -ECANCELED)
    return;
  if (res->err < 0 && res->err != -ENOENT) {
    write_failed(l, res);
    return;
  }
  r = take_read(l, res);
  if (r < 0) {
    if (l->w.kind == W_ACQUIRE)
      fail_user(l, r);
    else
      lose(l, -ESTALE, "the lease object is no longer a lease");
    return;
  }
  if (l->cur_exists && strcmp(l->cur.nonce, l->w.doc.nonce) == 0 &&
      strcmp(l->cur.owner, l->w.doc.owner) == 0) {
    write_landed(l, res->etag); /* a retried PUT whose first try landed */
    return;
  }
  if (l->cur_exists && !l->w.create && l->w.etag[0] == '\0' &&
      l->our_nonce[0] != '\0' && strcmp(l->cur.nonce, l->our_nonce) == 0 &&
      !l->w.etag_learned) {
    /* our last PUT's answer had no ETag: still ours, now we know it */
    spot_strlcpy(l->w.etag, l->cur_etag, sizeof(l->w.etag));
    l->w.etag_learned = true;
    resend(l, res);
    return;
  }
  same_etag = l->cur_exists && !l->w.create &&
              spot_lease_doc_etag_same(l->cur_etag, l->w.etag);
  if (same_etag && !l->w.form_flipped) {
    bool bare = !spot_s3_if_match_unquoted(l->s3);

    log_info("lease: the server refused If-Match on an unchanged ETag: "
             "sending it %s",
             bare ? "unquoted (Ceph RGW)" : "quoted");
    spot_s3_set_if_match_unquoted(l->s3, bare);
    l->w.form_flipped = true;
    resend(l, res);
    return;
  }
  if (l->w.kind == W_ACQUIRE) {
    judge_and_act(l); /* someone else moved first: judge what is there */
    return;
  }
  lose(l, -ESTALE,
       l->cur_exists ? "another writer holds it" : "the lease object is gone");
}

int
spot_lease_new(uv_loop_t *loop, const struct spot_lease_config *cfg,
               spot_lease_cb lost_cb, void *lost_data, struct spot_lease **out)
{
  struct spot_lease *l;

  if (loop == NULL || cfg == NULL || cfg->s3 == NULL || cfg->bucket == NULL ||
      cfg->key == NULL || cfg->key[0] == '\0' ||
      !spot_lease_doc_owner_valid(cfg->owner) ||
      cfg->ttl_ms > (uint64_t)SPOT_LEASE_TTL_MAX_MS ||
      (cfg->renew_ms > 0 && cfg->ttl_ms > 0 && cfg->renew_ms >= cfg->ttl_ms))
    return -EINVAL;
  l = calloc(1, sizeof(*l));
  if (l == NULL)
    return -ENOMEM;
  l->loop = loop;
  l->s3 = cfg->s3;
  l->bucket = strdup(cfg->bucket);
  l->key = strdup(cfg->key);
  l->owner = strdup(cfg->owner);
  if (l->bucket == NULL || l->key == NULL || l->owner == NULL) {
    free(l->bucket);
    free(l->key);
    free(l->owner);
    free(l);
    return -ENOMEM;
  }
  l->ttl_ms = cfg->ttl_ms > 0 ? cfg->ttl_ms : SPOT_LEASE_TTL_DEFAULT_MS;
  l->renew_ms = cfg->renew_ms > 0 ? cfg->renew_ms : l->ttl_ms / 3;
  if (l->renew_ms == 0)
    l->renew_ms = 1;
  l->poll_ms = cfg->poll_ms > 0 ? cfg->poll_ms : SPOT_LEASE_POLL_DEFAULT_MS;
  l->grace_ms = cfg->grace_ms < 0    ? 0
                : cfg->grace_ms == 0 ? SPOT_LEASE_GRACE_DEFAULT_MS
                                     : cfg->grace_ms;
  l->no_wait = cfg->no_wait;
  l->wait_timeout_ms = cfg->wait_timeout_ms;
  l->lost_cb = lost_cb;
  l->lost_data = lost_data;
  l->state = LS_IDLE; /* initial state */
  spot_buf_init(&l->body, BODY_CAP);
  uv_timer_init(loop, &l->poll_timer);
  uv_timer_init(loop, &l->renew_timer);
  uv_timer_init(loop, &l->deadline_timer);
  *out = l;
  return 0;
}

void
spot_lease_on_deadline(struct spot_lease *l, spot_lease_deadline_cb cb,
                       void *data)
{
  l->deadline_cb = cb;
  l->deadline_data = data;
}

static int
begin_user(struct spot_lease *l, enum user_op op, spot_lease_cb wait_cb,
           spot_lease_cb cb, void *data)
{
  if (cb == NULL)
    return -EINVAL;
  if (l->uop != U_NONE || l->state == LS_CLOSING)
    return -EBUSY;
  l->uop = op;
  l->cb = cb;
  l->wait_cb = wait_cb;
  l->data = data;
  l->msg[0] = '\0';
  l->waited = false;
  l->last_holder[0] = '\0';
  l->last_holder_epoch = 0;
  return 0;
}

int
spot_lease_acquire(struct spot_lease *l, spot_lease_cb wait_cb,
                   spot_lease_cb cb, void *data)
{
  int r;

  if (l == NULL)
    return -EINVAL;
  if (l->state != LS_IDLE && l->state != LS_LOST)
    return l->state == LS_HELD || l->state == LS_RENEWING ? -EALREADY : -EBUSY;
  r = begin_user(l, U_ACQUIRE, wait_cb, cb, data);
  if (r < 0)
    return r;
  l->our_nonce[0] = '\0';
  r = start_get(l, LS_READING, read_cb);
  if (r < 0) {
    set_state(l, LS_IDLE);
    l->uop = U_NONE;
  }
  return r;
}

static int
read_only_op(struct spot_lease *l, enum user_op uop, spot_lease_cb cb,
             void *data)
{
  int r;

  if (l == NULL)
    return -EINVAL;
  if (l->state != LS_IDLE && l->state != LS_LOST)
    return -EBUSY;
  r = begin_user(l, uop, NULL, cb, data);
  if (r < 0)
    return r;
  r = start_get(l, LS_READING, read_cb);
  if (r < 0) {
    set_state(l, LS_IDLE);
    l->uop = U_NONE;
  }
  return r;
}

int
spot_lease_show(struct spot_lease *l, spot_lease_cb cb, void *data)
{
  return read_only_op(l, U_SHOW, cb, data);
}

int
spot_lease_adopt(struct spot_lease *l, spot_lease_cb cb, void *data)
{
  return read_only_op(l, U_ADOPT, cb, data);
}

int
spot_lease_release(struct spot_lease *l, spot_lease_cb cb, void *data)
{
  bool renewing;
  int r;

  if (l == NULL)
    return -EINVAL;
  /* A renewal in flight, or being confirmed (Ceph's first 412 on the
   * quoted If-Match form): the release follows it. */
  renewing = l->state == LS_RENEWING ||
             (l->state == LS_CONFIRMING && l->w.kind == W_RENEW);
  if (l->state != LS_HELD && !renewing)
    return -ENOTCONN;
  r = begin_user(l, U_RELEASE, NULL, cb, data);
  if (r < 0)
    return r;
  if (renewing) {
    l->release_pending = true; /* write_landed() or lose() goes on */
    return 0;
  }
  uv_timer_stop(&l->renew_timer);
  r = start_write(l, W_RELEASE, l->epoch, true);
  if (r < 0) {
    set_state(l, LS_HELD);
    uv_timer_start(&l->renew_timer, renew_timer_cb, RETRY_MS, 0);
    l->uop = U_NONE;
  }
  return r;
}

void
spot_lease_cancel(struct spot_lease *l)
{
  if (l == NULL || l->uop == U_NONE)
    return;
  switch (l->state) {
  case LS_READING:
  case LS_WRITING:
  case LS_CONFIRMING:
  case LS_RELEASING:
    /* the request's callback comes later and does nothing; we finish
     * here. A cancelled acquiring write may still land: that lease then
     * just expires. */
    abandon(l);
    set_state(l, LS_IDLE);
    break;
  case LS_WAITING:
    uv_timer_stop(&l->poll_timer);
    set_state(l, LS_IDLE);
    break;
  case LS_RENEWING: /* a pending release: the renewal goes on */
  case LS_IDLE:
  case LS_HELD:
  case LS_LOST:
  case LS_CLOSING:
  case LS_STATE_LAST:
    break;
  }
  l->msg[0] = '\0';
  finish_user(l, -ECANCELED);
}

static void
close_cb(uv_handle_t *h)
{
  struct spot_lease *l = h->data;

  l->pending_closes--;
  maybe_free(l);
}

void
spot_lease_free(struct spot_lease *l)
{
  if (l == NULL || l->freeing)
    return;
  l->freeing = true; /* a callback run by the cancel may free again */
  spot_lease_cancel(l);
  set_state(l, LS_CLOSING);
  abandon(l); /* a renewal */
  uv_timer_stop(&l->poll_timer);
  uv_timer_stop(&l->renew_timer);
  uv_timer_stop(&l->deadline_timer);
  l->poll_timer.data = l;
  l->renew_timer.data = l;
  l->deadline_timer.data = l;
  l->pending_closes = 3;
  uv_close((uv_handle_t *)&l->poll_timer, close_cb);
  uv_close((uv_handle_t *)&l->renew_timer, close_cb);
  uv_close((uv_handle_t *)&l->deadline_timer, close_cb);
}
