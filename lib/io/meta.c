/* The metadata poller. Each request the poller repeats is one struct op
 * with an explicit state, one uv timer (the wait before the next request,
 * or the deadline of the request in flight) and one easy handle. Only
 * set_state() changes an op's state, and it logs the transition.
 *
 *   IDLE --timer--> FETCHING --ok--> IDLE (next tick, drift-corrected)
 *                      |  \--fail--> BACKOFF --timer--> FETCHING
 *   (AWS) WAIT_TOKEN --token ready--> FETCHING
 *   any --spot_meta_close()--> CLOSING (request cancelled, timer closed)
 *
 * Parsers live in meta_aws.c, meta_gcp.c and meta_azure.c (no I/O); this
 * file only moves bytes and decides when to ask again. */
#include "io/meta.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/buf.h"
#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"

#define DEFAULT_BASE "http://169.254.169.254"
#define AZURE_API "api-version=2020-07-01"
/* Retries back off from 200 ms to max(2 s, 2 poll intervals), no more:
 * a notice gives 30-120 s, so a longer pause would risk missing it. */
#define BACKOFF_BASE_MS 200
#define BACKOFF_MIN_CAP_MS 2000
#define URL_MAX 1024
#define ETAG_MAX 128
#define TOKEN_MAX 512
#define MAX_NOTICES 8

enum op_kind {
  OP_PROBE_AWS,
  OP_PROBE_GCP,
  OP_PROBE_AZURE,
  OP_AWS_TOKEN,
  OP_AWS_SPOT,
  OP_AWS_REBALANCE,
  OP_AWS_MAINTENANCE,
  OP_AWS_LIFECYCLE,
  OP_GCP_PREEMPTED,
  OP_GCP_MAINTENANCE,
  OP_AZURE_NAME,
  OP_AZURE_EVENTS,
  OP_AZURE_ACK,
  OP_KIND_LAST,
};

static const char *const op_names[OP_KIND_LAST] = {
    [OP_PROBE_AWS] = "probe-aws",
    [OP_PROBE_GCP] = "probe-gcp",
    [OP_PROBE_AZURE] = "probe-azure",
    [OP_AWS_TOKEN] = "aws api/token",
    [OP_AWS_SPOT] = "aws spot/instance-action",
    [OP_AWS_REBALANCE] = "aws events/recommendations/rebalance",
    [OP_AWS_MAINTENANCE] = "aws events/maintenance/scheduled",
    [OP_AWS_LIFECYCLE] = "aws autoscaling/target-lifecycle-state",
    [OP_GCP_PREEMPTED] = "gcp instance/preempted",
    [OP_GCP_MAINTENANCE] = "gcp instance/maintenance-event",
    [OP_AZURE_NAME] = "azure instance/compute/name",
    [OP_AZURE_EVENTS] = "azure scheduledevents",
    [OP_AZURE_ACK] = "azure scheduledevents ack",
};

static const char *const op_paths[OP_KIND_LAST] = {
    [OP_PROBE_AWS] = "/latest/api/token",
    [OP_PROBE_GCP] = "/computeMetadata/v1/instance/id",
    [OP_PROBE_AZURE] = "/metadata/instance/compute/name?"
                       "api-version=2021-02-01&format=text",
    [OP_AWS_TOKEN] = "/latest/api/token",
    [OP_AWS_SPOT] = "/latest/meta-data/spot/instance-action",
    [OP_AWS_REBALANCE] = "/latest/meta-data/events/recommendations/rebalance",
    [OP_AWS_MAINTENANCE] = "/latest/meta-data/events/maintenance/scheduled",
    [OP_AWS_LIFECYCLE] = "/latest/meta-data/autoscaling/target-lifecycle-state",
    [OP_GCP_PREEMPTED] = "/computeMetadata/v1/instance/preempted",
    [OP_GCP_MAINTENANCE] = "/computeMetadata/v1/instance/maintenance-event",
    [OP_AZURE_NAME] = "/metadata/instance/compute/name?"
                      "api-version=2021-02-01&format=text",
    [OP_AZURE_EVENTS] = "/metadata/scheduledevents?" AZURE_API,
    [OP_AZURE_ACK] = "/metadata/scheduledevents?" AZURE_API,
};

enum op_state {
  OP_IDLE,
  OP_WAIT_TOKEN,
  OP_FETCHING,
  OP_BACKOFF,
  OP_DONE,
  OP_CLOSING,
  OP_STATE_LAST,
};

static const char *const state_names[OP_STATE_LAST] = {
    [OP_IDLE] = "IDLE",         [OP_WAIT_TOKEN] = "WAIT_TOKEN",
    [OP_FETCHING] = "FETCHING", [OP_BACKOFF] = "BACKOFF",
    [OP_DONE] = "DONE",         [OP_CLOSING] = "CLOSING",
};

struct op {
  struct spot_meta *m;
  struct op *next;
  enum op_kind kind;
  enum op_state state;
  CURL *easy;
  struct curl_slist *hdrs;
  struct spot_buf body;
  uv_timer_t timer;
  uint64_t next_due;   /* drift correction: the schedule, not the clock */
  uint64_t started;    /* when the request in flight began */
  unsigned failures;   /* consecutive */
  bool timed_out;      /* the deadline timer cancelled the request */
  bool retried_401;    /* AWS: one retry with a fresh token */
  bool have_value;     /* last_hash is meaningful */
  uint64_t last_hash;  /* report only on change */
  char etag[ETAG_MAX]; /* GCP: the last ETag seen */
  char new_etag[ETAG_MAX];
  bool flavor_ok; /* GCP probe: Metadata-Flavor: Google came back */
  char *post;     /* ack body */
  spot_meta_ack_cb ack_cb;
  void *ack_data;
  char url[URL_MAX];
};

struct spot_meta {
  uv_loop_t *loop;
  struct spot_http *http;
  struct spot_meta_config cfg;
  char *base_url; /* NULL: per provider default */
  char *vm_name;
  spot_meta_notice_cb cb;
  void *data;
  enum spot_provider provider;
  struct op *ops;
  unsigned probes_left;
  unsigned pending_closes;
  bool started;
  bool closing;
  spot_meta_close_cb close_cb;
  void *close_data;
  /* AWS IMDSv2 */
  char token[TOKEN_MAX];
  uint64_t token_expiry; /* monotonic ms; 0 = none */
  bool tokenless;        /* IMDSv1 fallback in effect */
  /* Azure */
  int64_t incarnation;
  bool name_known;
  struct spot_notice_dedup dedup;
  char warning[256];
  struct op *warning_op;
  uv_timer_t kick; /* only so that closing is always asynchronous */
};

static void op_start_fetch(struct op *op);
static void op_schedule(struct op *op, uint64_t delay_ms);

static int64_t
wall_now(const struct spot_meta *m)
{
  return m->cfg.wall_now != NULL ? m->cfg.wall_now() : spot_now_wall_ms();
}

static const struct spot_fsm op_fsm = {"meta", state_names, OP_STATE_LAST,
                                       NULL,   0,           SPOT_LOG_DEBUG};

#define set_state(op, s) set_state_at((op), (s), __FILE__, __LINE__)
static void
set_state_at(struct op *op, enum op_state s, const char *file, int line)
{
  if (spot_fsm_move_detail(&op_fsm, op->state, s, file, line, "%s",
                           op_names[op->kind]) > 0)
    op->state = s;
}

static void
status_changed(struct spot_meta *m)
{
  if (m->cfg.status_cb != NULL && !m->closing)
    m->cfg.status_cb(m, m->data);
}

static uint64_t
fnv1a(const char *p, size_t n, long status)
{
  uint64_t h = 1469598103934665603ull ^ (uint64_t)status;

  for (size_t i = 0; i < n; i++) {
    h ^= (unsigned char)p[i];
    h *= 1099511628211ull;
  }
  return h;
}

/* --- op lifetime ------------------------------------------------------ */

static void
op_free(struct op *op)
{
  if (op->easy != NULL)
    curl_easy_cleanup(op->easy);
  curl_slist_free_all(op->hdrs);
  spot_buf_fini(&op->body);
  free(op->post);
  free(op);
}

static void
meta_maybe_free(struct spot_meta *m)
{
  spot_meta_close_cb cb;
  void *data;

  if (!m->closing || m->pending_closes > 0)
    return;
  cb = m->close_cb;
  data = m->close_data;
  free(m->base_url);
  free(m->vm_name);
  free(m);
  if (cb != NULL)
    cb(data);
}

static void
kick_close_cb(uv_handle_t *h)
{
  struct spot_meta *m = spot_container_of(h, struct spot_meta, kick);

  m->pending_closes--;
  meta_maybe_free(m);
}

static void
op_close_cb(uv_handle_t *h)
{
  struct op *op = spot_container_of(h, struct op, timer);
  struct spot_meta *m = op->m;

  op_free(op);
  m->pending_closes--;
  meta_maybe_free(m);
}

/* Unlinks a one-shot op (probe, ack) and closes it; freed in the close
 * callback, never inside the callback that finished it. */
static void
op_retire(struct op *op)
{
  struct spot_meta *m = op->m;
  struct op **pp;

  for (pp = &m->ops; *pp != NULL; pp = &(*pp)->next) {
    if (*pp == op) {
      *pp = op->next;
      break;
    }
  }
  set_state(op, OP_CLOSING);
  uv_timer_stop(&op->timer);
  m->pending_closes++;
  uv_close((uv_handle_t *)&op->timer, op_close_cb);
}

static size_t
write_cb(char *ptr, size_t size, size_t nmemb, void *data)
{
  struct op *op = data;
  size_t n = size * nmemb;

  if (spot_buf_append(&op->body, ptr, n) < 0)
    return 0; /* over the cap: curl fails the transfer */
  return n;
}

static void
header_value(const char *line, size_t n, const char *name, char *out,
             size_t size)
{
  size_t k = strlen(name), v;

  if (n <= k || strncasecmp(line, name, k) != 0 || line[k] != ':')
    return;
  line += k + 1;
  n -= k + 1;
  while (n > 0 && (*line == ' ' || *line == '\t')) {
    line++;
    n--;
  }
  while (n > 0 &&
         (line[n - 1] == '\r' || line[n - 1] == '\n' || line[n - 1] == ' '))
    n--;
  v = n < size - 1 ? n : size - 1;
  memcpy(out, line, v);
  out[v] = '\0';
}

static size_t
header_cb(char *ptr, size_t size, size_t nmemb, void *data)
{
  struct op *op = data;
  size_t n = size * nmemb;
  char flavor[32] = "";

  header_value(ptr, n, "ETag", op->new_etag, sizeof(op->new_etag));
  header_value(ptr, n, "Metadata-Flavor", flavor, sizeof(flavor));
  if (strcmp(flavor, "Google") == 0)
    op->flavor_ok = true;
  return n;
}

static struct op *
op_new(struct spot_meta *m, enum op_kind kind)
{
  struct op *op = calloc(1, sizeof(*op));

  if (op == NULL)
    return NULL;
  op->m = m;
  op->kind = kind;
  op->state = OP_IDLE; /* initial state */
  spot_buf_init(&op->body, SPOT_META_BODY_MAX);
  op->easy = curl_easy_init();
  if (op->easy == NULL || uv_timer_init(m->loop, &op->timer) != 0) {
    op_free(op);
    return NULL;
  }
  op->next = m->ops;
  m->ops = op;
  return op;
}

/* --- requests --------------------------------------------------------- */

static const char *
base_for(const struct spot_meta *m)
{
  return m->base_url != NULL ? m->base_url : DEFAULT_BASE;
}

static bool
is_gcp(enum op_kind k)
{
  return k == OP_PROBE_GCP || k == OP_GCP_PREEMPTED || k == OP_GCP_MAINTENANCE;
}

static bool
is_azure(enum op_kind k)
{
  return k == OP_PROBE_AZURE || k == OP_AZURE_NAME || k == OP_AZURE_EVENTS ||
         k == OP_AZURE_ACK;
}

static bool
is_aws_watch(enum op_kind k)
{
  return k >= OP_AWS_SPOT && k <= OP_AWS_LIFECYCLE;
}

static bool
long_poll(const struct op *op)
{
  return is_gcp(op->kind) && op->kind != OP_PROBE_GCP && op->etag[0] != '\0';
}

static uint64_t
op_deadline_ms(const struct op *op)
{
  const struct spot_meta *m = op->m;

  if (op->kind <= OP_PROBE_AZURE)
    return m->cfg.probe_timeout_ms;
  if (long_poll(op))
    return (uint64_t)m->cfg.gcp_wait_sec * 1000 + m->cfg.http_timeout_ms;
  return m->cfg.http_timeout_ms;
}

static int
build_request(struct op *op)
{
  struct spot_meta *m = op->m;
  struct curl_slist *h = NULL, *t;
  char line[TOKEN_MAX + 64];
  int n;

  if (long_poll(op))
    n = snprintf(op->url, sizeof(op->url),
                 "%s%s?wait_for_change=true&last_etag=%s&timeout_sec=%u",
                 base_for(m), op_paths[op->kind], op->etag,
                 m->cfg.gcp_wait_sec);
  else
    n = snprintf(op->url, sizeof(op->url), "%s%s", base_for(m),
                 op_paths[op->kind]);
  if (n < 0 || (size_t)n >= sizeof(op->url))
    return -ENAMETOOLONG;

  if (op->kind == OP_AWS_TOKEN || op->kind == OP_PROBE_AWS) {
    snprintf(line, sizeof(line), "X-aws-ec2-metadata-token-ttl-seconds: %u",
             op->kind == OP_PROBE_AWS ? 60 : m->cfg.token_ttl_sec);
  } else if (is_aws_watch(op->kind) && !m->tokenless) {
    snprintf(line, sizeof(line), "X-aws-ec2-metadata-token: %s", m->token);
  } else if (is_gcp(op->kind)) {
    snprintf(line, sizeof(line), "Metadata-Flavor: Google");
  } else if (is_azure(op->kind)) {
    snprintf(line, sizeof(line), "Metadata: true");
  } else {
    line[0] = '\0';
  }
  if (line[0] != '\0') {
    t = curl_slist_append(h, line);
    if (t == NULL)
      return -ENOMEM;
    h = t;
  }
  if (op->kind == OP_AZURE_ACK) {
    t = curl_slist_append(h, "Content-Type: application/json");
    if (t == NULL) {
      curl_slist_free_all(h);
      return -ENOMEM;
    }
    h = t;
  }
  /* token bytes in `line` must not linger on the stack longer than needed */
  memset(line, 0, sizeof(line));

  curl_easy_reset(op->easy);
  curl_slist_free_all(op->hdrs);
  op->hdrs = h;
  if (curl_easy_setopt(op->easy, CURLOPT_URL, op->url) != CURLE_OK ||
      curl_easy_setopt(op->easy, CURLOPT_HTTPHEADER, h) != CURLE_OK ||
      curl_easy_setopt(op->easy, CURLOPT_WRITEFUNCTION, write_cb) != CURLE_OK ||
      curl_easy_setopt(op->easy, CURLOPT_WRITEDATA, op) != CURLE_OK ||
      curl_easy_setopt(op->easy, CURLOPT_HEADERFUNCTION, header_cb) !=
          CURLE_OK ||
      curl_easy_setopt(op->easy, CURLOPT_HEADERDATA, op) != CURLE_OK ||
      /* metadata never goes through a proxy */
      curl_easy_setopt(op->easy, CURLOPT_NOPROXY, "*") != CURLE_OK ||
      curl_easy_setopt(op->easy, CURLOPT_NOSIGNAL, 1L) != CURLE_OK ||
      curl_easy_setopt(op->easy, CURLOPT_FOLLOWLOCATION, 0L) != CURLE_OK ||
      /* the uv timer is the deadline; this is only a backstop */
      curl_easy_setopt(op->easy, CURLOPT_TIMEOUT_MS,
                       (long)(op_deadline_ms(op) * 2 + 1000)) != CURLE_OK)
    return -EINVAL;
  if (op->kind == OP_AWS_TOKEN || op->kind == OP_PROBE_AWS) {
    if (curl_easy_setopt(op->easy, CURLOPT_CUSTOMREQUEST, "PUT") != CURLE_OK)
      return -EINVAL;
  } else if (op->kind == OP_AZURE_ACK) {
    if (curl_easy_setopt(op->easy, CURLOPT_POSTFIELDS, op->post) != CURLE_OK ||
        curl_easy_setopt(op->easy, CURLOPT_POSTFIELDSIZE,
                         (long)strlen(op->post)) != CURLE_OK)
      return -EINVAL;
  }
  return 0;
}

/* --- token ------------------------------------------------------------ */

static bool
token_fresh(const struct spot_meta *m)
{
  uint64_t ttl = (uint64_t)m->cfg.token_ttl_sec * 1000;
  /* refresh at 90% of the TTL, or 60 s before expiry for long TTLs */
  uint64_t margin = ttl / 10 < 60000 ? ttl / 10 : 60000;

  return m->token[0] != '\0' && spot_now_mono_ms() + margin < m->token_expiry;
}

static struct op *
find_op(struct spot_meta *m, enum op_kind kind)
{
  for (struct op *op = m->ops; op != NULL; op = op->next)
    if (op->kind == kind)
      return op;
  return NULL;
}

static void
token_invalidate(struct spot_meta *m)
{
  memset(m->token, 0, sizeof(m->token));
  m->token_expiry = 0;
}

static void
token_request(struct spot_meta *m)
{
  struct op *t = find_op(m, OP_AWS_TOKEN);

  if (t != NULL && t->state == OP_IDLE)
    op_start_fetch(t);
  /* FETCHING: on its way; BACKOFF: its timer will retry */
}

static void
wake_token_waiters(struct spot_meta *m)
{
  for (struct op *op = m->ops; op != NULL && !m->closing; op = op->next)
    if (op->state == OP_WAIT_TOKEN)
      op_start_fetch(op);
}

/* --- warnings and notices --------------------------------------------- */

static void
op_failed(struct op *op, const char *why)
{
  struct spot_meta *m = op->m;
  uint64_t delay, cap;

  op->failures++;
  cap = 2 * (uint64_t)m->cfg.poll_interval_ms;
  if (cap < BACKOFF_MIN_CAP_MS)
    cap = BACKOFF_MIN_CAP_MS;
  delay = spot_backoff_ms(op->failures - 1, BACKOFF_BASE_MS, cap,
                          spot_random_u32());
  if (op->failures == m->cfg.warn_after) {
    log_warn("meta %s: %s (%u consecutive failures), retrying in %" PRIu64
             " ms",
             op_names[op->kind], why, op->failures, delay);
    if (m->warning_op == NULL) {
      snprintf(m->warning, sizeof(m->warning),
               "metadata %s: %u consecutive failures, last: %s",
               op_names[op->kind], op->failures, why);
      m->warning_op = op;
      status_changed(m);
    }
  } else {
    log_info("meta %s: %s (failure %u), retrying in %" PRIu64 " ms",
             op_names[op->kind], why, op->failures, delay);
    if (m->warning_op == op) /* keep the line current for spotctl status */
      snprintf(m->warning, sizeof(m->warning),
               "metadata %s: %u consecutive failures, last: %s",
               op_names[op->kind], op->failures, why);
  }
  if (m->closing)
    return;
  set_state(op, OP_BACKOFF);
  op_schedule(op, delay);
}

static void
op_succeeded(struct op *op)
{
  struct spot_meta *m = op->m;

  if (op->failures >= m->cfg.warn_after)
    log_info("meta %s: recovered after %u failures", op_names[op->kind],
             op->failures);
  op->failures = 0;
  if (m->warning_op == op) {
    m->warning_op = NULL;
    m->warning[0] = '\0';
    status_changed(m);
  }
}

static void
deliver(struct spot_meta *m, struct spot_notice *n)
{
  char when[32] = "none";
  char reason[SPOT_ESCAPE_SIZE(SPOT_NOTICE_REASON_MAX)];
  char id[SPOT_ESCAPE_SIZE(SPOT_NOTICE_ID_MAX)];

  if (spot_notice_seen(&m->dedup, n))
    return;
  spot_notice_set_mono(n, spot_now_mono_ms(), wall_now(m));
  if (n->deadline_wall_ms != 0)
    spot_rfc3339_format(n->deadline_wall_ms, when, sizeof(when));
  log_notice("meta notice provider=%s kind=%s reason=%s id=%s deadline=%s",
             spot_provider_name(n->provider), spot_notice_kind_name(n->kind),
             spot_escape(n->reason, reason, sizeof(reason)),
             spot_escape(n->id, id, sizeof(id)), when);
  m->cb(m, n, m->data);
}

/* --- scheduling ------------------------------------------------------- */

static void
timer_cb(uv_timer_t *t)
{
  struct op *op = spot_container_of(t, struct op, timer);

  switch (op->state) {
  case OP_IDLE:
  case OP_BACKOFF:
    op_start_fetch(op);
    break;
  case OP_FETCHING:
    /* the deadline: cancel; done_cb sees timed_out */
    op->timed_out = true;
    spot_http_cancel(op->m->http, op->easy);
    break;
  default:
    break;
  }
}

static void
op_schedule(struct op *op, uint64_t delay_ms)
{
  uv_timer_start(&op->timer, timer_cb, delay_ms, 0);
}

/* Next tick of a periodic op, from its schedule rather than from now, so
 * request time does not accumulate as drift; missed ticks are skipped. */
static void
op_next_tick(struct op *op)
{
  uint64_t iv = op->m->cfg.poll_interval_ms, now = spot_now_mono_ms();

  set_state(op, OP_IDLE);
  op->next_due += iv;
  if (op->next_due <= now)
    op->next_due += ((now - op->next_due) / iv + 1) * iv;
  op_schedule(op, op->next_due - now);
}

static void done_cb(CURL *easy, CURLcode rc, void *data);
static void handle_ack(struct op *op, CURLcode rc, long status);

static void
op_start_fetch(struct op *op)
{
  struct spot_meta *m = op->m;
  int r;

  if (m->closing)
    return;
  if (is_aws_watch(op->kind) && !m->tokenless && !token_fresh(m)) {
    set_state(op, OP_WAIT_TOKEN);
    uv_timer_stop(&op->timer);
    token_request(m);
    return;
  }
  spot_buf_reset(&op->body);
  op->new_etag[0] = '\0';
  op->flavor_ok = false;
  op->timed_out = false;
  r = build_request(op);
  if (r == 0)
    r = spot_http_add(m->http, op->easy, done_cb, op);
  if (r < 0) {
    log_warn_errno(r, "meta %s: cannot start request", op_names[op->kind]);
    set_state(op, OP_FETCHING); /* so op_failed's BACKOFF is a change */
    if (op->kind == OP_AZURE_ACK)
      handle_ack(op, CURLE_FAILED_INIT, 0); /* bounded retries, then cb */
    else
      op_failed(op, "cannot start request");
    return;
  }
  op->started = spot_now_mono_ms();
  set_state(op, OP_FETCHING);
  uv_timer_start(&op->timer, timer_cb, op_deadline_ms(op), 0);
}

/* --- results ---------------------------------------------------------- */

static void start_provider(struct spot_meta *m);

static void
probe_done(struct op *op, bool ok)
{
  struct spot_meta *m = op->m;
  static const enum spot_provider order[] = {
      SPOT_PROVIDER_AWS, SPOT_PROVIDER_GCP, SPOT_PROVIDER_AZURE};
  unsigned idx = (unsigned)(op->kind - OP_PROBE_AWS);

  /* AUTO sorts after the three, so the first in order wins when several
   * answer */
  if (ok && (unsigned)m->provider > (unsigned)order[idx])
    m->provider = order[idx];
  if (ok && op->kind == OP_PROBE_AZURE && m->vm_name == NULL) {
    const char *p = spot_buf_str(&op->body);
    size_t n = op->body.len;

    spot__meta_trim(&p, &n);
    if (n > 0 && n < 256 && memchr(p, '\0', n) == NULL)
      m->vm_name = strndup(p, n); /* saves the compute/name request */
  }
  log_debug("meta %s: %s", op_names[op->kind], ok ? "answered" : "no answer");
  m->probes_left--;
  op_retire(op);
  if (m->probes_left > 0)
    return;
  if (m->provider == SPOT_PROVIDER_AUTO) {
    m->provider = SPOT_PROVIDER_NONE;
    log_notice("meta: no metadata service answered; provider none "
               "(periodic checkpoints only)");
    status_changed(m);
    return;
  }
  log_notice("meta: detected provider %s", spot_provider_name(m->provider));
  status_changed(m);
  if (!m->closing)
    start_provider(m);
}

static void
handle_token(struct op *op, long status)
{
  struct spot_meta *m = op->m;
  const char *p = spot_buf_str(&op->body);
  size_t n = op->body.len;

  if (status == 200 && n > 0 && n < sizeof(m->token)) {
    memcpy(m->token, p, n);
    m->token[n] = '\0';
    m->token_expiry = op->started + (uint64_t)m->cfg.token_ttl_sec * 1000;
    m->tokenless = false;
    memset(op->body.data, 0, op->body.len); /* do not keep a copy */
    op_succeeded(op);
    set_state(op, OP_IDLE);
    uv_timer_stop(&op->timer);
    log_debug("meta: IMDSv2 token ready (ttl %u s)", m->cfg.token_ttl_sec);
    wake_token_waiters(m);
    return;
  }
  if (m->cfg.imdsv1_fallback && status != 0) {
    /* IMDS answered but would not give a token: go tokenless this time */
    if (!m->tokenless)
      log_notice("meta: no IMDSv2 token (HTTP %ld); IMDSv1 fallback", status);
    m->tokenless = true;
    op_succeeded(op);
    set_state(op, OP_IDLE);
    uv_timer_stop(&op->timer);
    wake_token_waiters(m);
    return;
  }
  if (op->body.data != NULL)
    memset(op->body.data, 0, op->body.len);
  {
    char why[64];
    snprintf(why, sizeof(why), "token PUT: HTTP %ld", status);
    op_failed(op, why);
  }
}

/* Parses a 200 body of a watch. Returns 0 or negative errno (garbage). */
static int
handle_body(struct op *op, long status)
{
  struct spot_meta *m = op->m;
  struct spot_notice n[MAX_NOTICES];
  const char *body = spot_buf_str(&op->body);
  size_t len = op->body.len, count = 1;
  int64_t now = wall_now(m), inc = 0;
  int r;

  switch (op->kind) {
  case OP_AWS_SPOT:
    r = status == 404 ? 1
                      : spot_meta_aws_parse_instance_action(body, len, now, n);
    break;
  case OP_AWS_REBALANCE:
    r = status == 404 ? 1 : spot_meta_aws_parse_rebalance(body, len, now, n);
    break;
  case OP_AWS_MAINTENANCE:
    r = status == 404 ? 1
                      : spot_meta_aws_parse_maintenance(body, len, now, n,
                                                        MAX_NOTICES, &count);
    break;
  case OP_AWS_LIFECYCLE:
    r = status == 404 ? 1 : spot_meta_aws_parse_lifecycle(body, len, now, n);
    break;
  case OP_GCP_PREEMPTED:
    r = spot_meta_gcp_parse_preempted(body, len, now, n);
    break;
  case OP_GCP_MAINTENANCE:
    r = spot_meta_gcp_parse_maintenance(body, len, now, n);
    if (r == 1)
      for (size_t i = 0; i < 2; i++) {
        static const char *const vals[] = {
            "maintenance:MIGRATE_ON_HOST_MAINTENANCE",
            "maintenance:TERMINATE_ON_HOST_MAINTENANCE"};
        spot_notice_forget(&m->dedup, SPOT_PROVIDER_GCP, vals[i]);
      }
    break;
  case OP_AZURE_EVENTS:
    r = spot_meta_azure_parse(body, len, m->name_known ? m->vm_name : NULL, now,
                              n, MAX_NOTICES, &count, &inc);
    if (r >= 0 && inc != m->incarnation) {
      log_debug("meta azure: DocumentIncarnation %" PRId64, inc);
      m->incarnation = inc;
    }
    break;
  default:
    return 0;
  }
  if (r < 0)
    return r;
  for (size_t i = 0; r == 0 && i < count && !m->closing; i++)
    deliver(m, &n[i]);
  return 0;
}

static void
handle_azure_name(struct op *op, long status)
{
  struct spot_meta *m = op->m;
  const char *p = spot_buf_str(&op->body);
  size_t n = op->body.len;
  struct op *ev;
  char name[SPOT_ESCAPE_SIZE(255)];

  spot__meta_trim(&p, &n);
  if (status != 200 || n == 0 || n > 255 || memchr(p, '\0', n) != NULL) {
    char why[64];

    snprintf(why, sizeof(why), "HTTP %ld", status);
    if (op->failures + 1 >= op->m->cfg.warn_after) {
      /* better every event than none: watch without the filter */
      log_warn("meta azure: VM name unknown; watching every event");
      op_failed(op, why);
      uv_timer_stop(&op->timer);
      set_state(op, OP_DONE);
      m->name_known = false;
    } else {
      op_failed(op, why);
      return;
    }
  } else {
    free(m->vm_name);
    m->vm_name = strndup(p, n);
    m->name_known = m->vm_name != NULL;
    log_info("meta azure: this VM is %s",
             spot_escape(m->vm_name ? m->vm_name : "?", name, sizeof(name)));
    op_succeeded(op);
    set_state(op, OP_DONE);
  }
  ev = find_op(m, OP_AZURE_EVENTS);
  if (ev != NULL && ev->state == OP_IDLE) {
    ev->next_due = spot_now_mono_ms();
    op_start_fetch(ev);
  }
}

static void
handle_ack(struct op *op, CURLcode rc, long status)
{
  spot_meta_ack_cb cb = op->ack_cb;
  void *data = op->ack_data;
  int r;

  if (rc == CURLE_OK && status >= 200 && status < 300) {
    r = 0;
  } else if (op->m->closing) {
    r = UV_ECANCELED;
  } else if (op->failures + 1 < 3 &&
             (rc != CURLE_OK || status >= 500 || status == 429)) {
    char why[64];
    snprintf(why, sizeof(why), "rc %d HTTP %ld", (int)rc, status);
    op_failed(op, why); /* retried by its timer */
    return;
  } else {
    r = -EIO;
  }
  log_info("meta azure: ack %s (HTTP %ld)", r == 0 ? "accepted" : "failed",
           status);
  op->ack_cb = NULL;
  op_retire(op);
  if (cb != NULL)
    cb(r, data);
}

static void
done_cb(CURL *easy, CURLcode rc, void *data)
{
  struct op *op = data;
  struct spot_meta *m = op->m;
  long status = 0;
  char why[128];
  int r;

  uv_timer_stop(&op->timer);
  if (rc == CURLE_OK)
    curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  if (op->kind == OP_AZURE_ACK) {
    handle_ack(op, rc, status);
    return;
  }
  if (m->closing) {
    set_state(op, OP_CLOSING);
    return;
  }
  if (op->kind <= OP_PROBE_AZURE) {
    bool ok = rc == CURLE_OK && status == 200;

    if (op->kind == OP_PROBE_GCP)
      ok = ok && op->flavor_ok;
    /* an IMDSv1-only instance refuses the token PUT but is still AWS */
    if (op->kind == OP_PROBE_AWS && m->cfg.imdsv1_fallback && rc == CURLE_OK)
      ok = ok || status == 403 || status == 405;
    probe_done(op, ok);
    return;
  }
  if (rc != CURLE_OK) {
    snprintf(why, sizeof(why), "%s",
             op->timed_out ? "timed out" : curl_easy_strerror(rc));
    op_failed(op, why);
    return;
  }
  if (op->kind == OP_AWS_TOKEN) {
    handle_token(op, status);
    return;
  }
  if (op->kind == OP_AZURE_NAME) {
    handle_azure_name(op, status);
    return;
  }
  if (is_aws_watch(op->kind) && status == 401) {
    /* expired or revoked (or IMDSv2 is required after all): one retry
     * with a fresh token, then backoff, which gets another one */
    token_invalidate(m);
    m->tokenless = false;
    if (!op->retried_401) {
      log_info("meta %s: HTTP 401, fetching a new token", op_names[op->kind]);
      op->retried_401 = true;
      op_start_fetch(op);
      return;
    }
    op->retried_401 = false;
    op_failed(op, "HTTP 401 with a fresh token");
    return;
  }
  if (status != 200 && !(is_aws_watch(op->kind) && status == 404)) {
    snprintf(why, sizeof(why), "HTTP %ld", status);
    op_failed(op, why);
    return;
  }
  op->retried_401 = false;
  if (is_gcp(op->kind) && op->new_etag[0] != '\0' && long_poll(op) &&
      strcmp(op->new_etag, op->etag) == 0) {
    /* the long poll timed out without a change */
    op_succeeded(op);
    set_state(op, OP_IDLE);
    op_schedule(op, spot_now_mono_ms() - op->started < 1000
                        ? m->cfg.poll_interval_ms
                        : 0);
    return;
  }
  {
    uint64_t h = fnv1a(spot_buf_str(&op->body), op->body.len, status);

    if (!op->have_value || h != op->last_hash) {
      r = handle_body(op, status);
      if (r < 0) {
        snprintf(why, sizeof(why), "malformed document (%s)", strerror(-r));
        op_failed(op, why);
        return;
      }
      op->have_value = true;
      op->last_hash = h;
    }
  }
  if (m->closing)
    return;
  op_succeeded(op);
  if (is_gcp(op->kind)) {
    /* valid ETags are short tokens; anything else we do not echo back */
    bool ok =
        op->new_etag[0] != '\0' &&
        strspn(op->new_etag, "0123456789abcdefABCDEF") == strlen(op->new_etag);
    if (ok) {
      spot_strlcpy(op->etag, op->new_etag, sizeof(op->etag));
      set_state(op, OP_IDLE);
      op_schedule(op, 0);
    } else {
      op->etag[0] = '\0';
      op_next_tick(op); /* no ETag: plain polling */
    }
    return;
  }
  op_next_tick(op);
}

/* --- provider start --------------------------------------------------- */

static int
add_periodic(struct spot_meta *m, enum op_kind kind)
{
  struct op *op = op_new(m, kind);

  if (op == NULL)
    return -ENOMEM;
  op->next_due = spot_now_mono_ms();
  return 0;
}

static void
start_provider(struct spot_meta *m)
{
  int r = 0;

  switch (m->provider) {
  case SPOT_PROVIDER_AWS:
    r = add_periodic(m, OP_AWS_TOKEN);
    if (r == 0)
      r = add_periodic(m, OP_AWS_SPOT);
    if (r == 0)
      r = add_periodic(m, OP_AWS_REBALANCE);
    if (r == 0)
      r = add_periodic(m, OP_AWS_MAINTENANCE);
    if (r == 0 && m->cfg.aws_lifecycle)
      r = add_periodic(m, OP_AWS_LIFECYCLE);
    break;
  case SPOT_PROVIDER_GCP:
    r = add_periodic(m, OP_GCP_PREEMPTED);
    if (r == 0)
      r = add_periodic(m, OP_GCP_MAINTENANCE);
    break;
  case SPOT_PROVIDER_AZURE:
    m->name_known = m->vm_name != NULL;
    r = add_periodic(m, OP_AZURE_EVENTS);
    if (r == 0 && !m->name_known)
      r = add_periodic(m, OP_AZURE_NAME);
    break;
  default:
    return;
  }
  if (r < 0) {
    log_err_errno(r, "meta: cannot start the %s watch",
                  spot_provider_name(m->provider));
    return;
  }
  log_info("meta: watching %s every %u ms", spot_provider_name(m->provider),
           m->cfg.poll_interval_ms);
  for (struct op *op = m->ops; op != NULL && !m->closing; op = op->next) {
    if (op->kind == OP_AWS_TOKEN)
      continue; /* started on demand by the watches */
    if (op->kind == OP_AZURE_EVENTS && !m->name_known)
      continue; /* started once the name is known */
    op_start_fetch(op);
  }
}

/* --- public API ------------------------------------------------------- */

void
spot_meta_config_init(struct spot_meta_config *cfg)
{
  memset(cfg, 0, sizeof(*cfg));
  cfg->provider = SPOT_PROVIDER_AUTO;
  cfg->poll_interval_ms = 1000;
  cfg->http_timeout_ms = 2000;
  cfg->probe_timeout_ms = 500;
  cfg->gcp_wait_sec = 60;
  cfg->warn_after = 5;
  cfg->token_ttl_sec = 21600;
}

int
spot_meta_new(uv_loop_t *loop, struct spot_http *http,
              const struct spot_meta_config *cfg, spot_meta_notice_cb cb,
              void *data, struct spot_meta **out)
{
  struct spot_meta *m;

  if (loop == NULL || http == NULL || cfg == NULL || cb == NULL ||
      (unsigned)cfg->provider >= SPOT_PROVIDER_LAST ||
      cfg->token_ttl_sec > 21600)
    return -EINVAL;
  m = calloc(1, sizeof(*m));
  if (m == NULL)
    return -ENOMEM;
  m->loop = loop;
  m->http = http;
  m->cfg = *cfg;
  if (m->cfg.poll_interval_ms == 0)
    m->cfg.poll_interval_ms = 1000;
  if (m->cfg.http_timeout_ms == 0)
    m->cfg.http_timeout_ms = 2000;
  if (m->cfg.probe_timeout_ms == 0)
    m->cfg.probe_timeout_ms = 500;
  if (m->cfg.gcp_wait_sec == 0)
    m->cfg.gcp_wait_sec = 60;
  if (m->cfg.warn_after == 0)
    m->cfg.warn_after = 5;
  if (m->cfg.token_ttl_sec == 0)
    m->cfg.token_ttl_sec = 21600;
  m->cfg.base_url = NULL;
  m->cfg.vm_name = NULL;
  if (cfg->base_url != NULL && cfg->base_url[0] != '\0') {
    size_t n = strlen(cfg->base_url);

    while (n > 0 && cfg->base_url[n - 1] == '/')
      n--;
    m->base_url = strndup(cfg->base_url, n);
    if (m->base_url == NULL || n > 512)
      goto fail;
  }
  if (cfg->vm_name != NULL && cfg->vm_name[0] != '\0') {
    m->vm_name = strdup(cfg->vm_name);
    if (m->vm_name == NULL)
      goto fail;
  }
  m->cb = cb;
  m->data = data;
  m->provider = cfg->provider;
  m->incarnation = -1;
  spot_notice_dedup_init(&m->dedup);
  if (uv_timer_init(loop, &m->kick) != 0)
    goto fail; /* nothing to close: init failing leaves no handle */
  *out = m;
  return 0;
fail:
  free(m->base_url);
  free(m->vm_name);
  free(m);
  return -ENOMEM;
}

int
spot_meta_start(struct spot_meta *m)
{
  static const enum op_kind probes[] = {OP_PROBE_AWS, OP_PROBE_GCP,
                                        OP_PROBE_AZURE};

  if (m->started || m->closing)
    return -EALREADY;
  m->started = true;
  if (m->provider == SPOT_PROVIDER_NONE) {
    log_info("meta: provider none; no interruption notices");
    return 0;
  }
  if (m->provider != SPOT_PROVIDER_AUTO) {
    start_provider(m);
    return 0;
  }
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(probes); i++) {
    struct op *op = op_new(m, probes[i]);
    if (op == NULL)
      return -ENOMEM; /* the ones already made are closed by close() */
    m->probes_left++;
  }
  for (struct op *op = m->ops; op != NULL;) {
    struct op *next = op->next; /* a failed start may retire op */
    if (op->kind <= OP_PROBE_AZURE)
      op_start_fetch(op);
    op = next;
  }
  return 0;
}

void
spot_meta_close(struct spot_meta *m, spot_meta_close_cb cb, void *data)
{
  struct op *op, *next;

  if (m == NULL)
    return;
  if (m->closing)
    return;
  m->closing = true;
  m->close_cb = cb;
  m->close_data = data;
  for (op = m->ops; op != NULL; op = op->next)
    if (op->state == OP_FETCHING)
      spot_http_cancel(m->http, op->easy); /* done_cb runs now */
  for (op = m->ops; op != NULL; op = next) {
    next = op->next;
    if (op->kind == OP_AZURE_ACK && op->ack_cb != NULL) {
      spot_meta_ack_cb acb = op->ack_cb; /* in backoff: never sent */

      op->ack_cb = NULL;
      acb(UV_ECANCELED, op->ack_data);
    }
    set_state(op, OP_CLOSING);
    uv_timer_stop(&op->timer);
    m->pending_closes++;
    uv_close((uv_handle_t *)&op->timer, op_close_cb);
  }
  m->ops = NULL;
  token_invalidate(m);
  /* the kick timer makes the close callback always asynchronous */
  m->pending_closes++;
  uv_close((uv_handle_t *)&m->kick, kick_close_cb);
}

enum spot_provider
spot_meta_provider(const struct spot_meta *m)
{
  return m->provider;
}

const char *
spot_meta_warning(const struct spot_meta *m)
{
  return m->warning[0] != '\0' ? m->warning : NULL;
}

int
spot_meta_ack(struct spot_meta *m, const char *event_id, spot_meta_ack_cb cb,
              void *data)
{
  struct op *op;
  char esc[SPOT_ESCAPE_SIZE(SPOT_NOTICE_ID_MAX)];
  int r;

  if (m->closing)
    return -ECANCELED;
  if (m->provider != SPOT_PROVIDER_AZURE)
    return -ENOTSUP;
  if (event_id == NULL || event_id[0] == '\0')
    return -EINVAL;
  op = op_new(m, OP_AZURE_ACK);
  if (op == NULL)
    return -ENOMEM;
  r = spot_meta_azure_ack_body(event_id, &op->post);
  if (r < 0) {
    op_retire(op);
    return r;
  }
  op->ack_cb = cb;
  op->ack_data = data;
  log_info("meta azure: acknowledging event %s",
           spot_escape(event_id, esc, sizeof(esc)));
  op_start_fetch(op);
  return 0;
}
