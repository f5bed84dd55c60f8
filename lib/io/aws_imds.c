/* The async side of the AWS chain: IMDSv2 instance-role credentials (and
 * placement region) fetched through lib/http.h, refreshed ahead of expiry
 * by a timer, and the spot_creds_provider handed to the S3 client.
 *
 * One fetch cycle is TOKEN -> [ROLE -> CREDS] -> [REGION] -> IDLE; the
 * first cycle decides the ready callback, later ones only refresh the
 * credentials and never block a request: the provider keeps returning the
 * last good credentials until a new set arrives. The IMDS token and the
 * secrets are never logged. */
#include "io/aws.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"

#define IMDS_BODY_MAX (64 * 1024)
#define IMDS_TOKEN_MAX 4096
#define IMDS_TOKEN_TTL_S 21600
#define IMDS_DEFAULT_TIMEOUT_MS 2000
#define REFRESH_RETRY_BASE_MS 1000
#define REFRESH_RETRY_CAP_MS 30000
#define ROLE_MAX 128
/* A busy IMDS (HTTP 429/5xx) gets this many tries per request; an absent
 * one (connect error, timeout) only one, so a machine off EC2 learns it has
 * no credentials within one timeout. */
#define IMDS_TRIES 3
#define IMDS_RETRY_BASE_MS 100
#define IMDS_RETRY_CAP_MS 1000

enum imds_state {
  IMDS_IDLE,
  IMDS_TOKEN,
  IMDS_ROLE,
  IMDS_CREDS,
  IMDS_REGION,
  IMDS_CLOSING,
  IMDS_STATE_LAST,
};

static const char *const imds_state_names[IMDS_STATE_LAST] = {
    "idle", "token", "role", "creds", "region", "closing",
};

struct spot_aws {
  uv_loop_t *loop;
  struct spot_http *http;
  uv_timer_t timer; /* deferred ready callback, then refresh */
  CURL *easy;
  struct curl_slist *hdrs;
  struct spot_buf body;
  char curl_err[CURL_ERROR_SIZE];
  bool in_flight;
  enum imds_state state;

  /* options, copied */
  char *opt_endpoint;
  char *opt_region;
  char *opt_profile;
  char imds_url[SPOT_AWS_ENDPOINT_MAX + 1];
  bool imds_disabled;
  long timeout_ms;

  /* the cycle in progress */
  bool need_creds;
  bool need_region;
  unsigned tries; /* of the current request */
  char *token;
  char role[ROLE_MAX + 1];
  struct spot_creds fetched;

  bool started;
  bool ready_done;
  bool notify_pending; /* the timer is carrying the ready callback */
  bool closing;
  int ready_err;
  char msg[768];
  spot_aws_ready_cb ready_cb;
  void *ready_data;
  spot_aws_close_cb close_cb;
  void *close_data;

  /* results */
  enum spot_aws_source source;
  struct spot_creds cur;  /* handed out by the provider */
  struct spot_creds next; /* refreshed, handed out on the next get() */
  bool have_cur;
  bool have_next;
  int64_t latest_expires_ms;
  bool warned_stale;
  unsigned refreshes;
  unsigned failures;
  char region[SPOT_AWS_REGION_MAX + 1];
  char endpoint[SPOT_AWS_ENDPOINT_MAX + 1];
  bool path_style;
  struct spot_creds_provider provider;
};

static void imds_advance(struct spot_aws *aws);

static const struct spot_fsm imds_fsm = {
    "aws imds:", imds_state_names, IMDS_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

#define set_state(aws, s) set_state_at((aws), (s), __FILE__, __LINE__)
static void
set_state_at(struct spot_aws *aws, enum imds_state s, const char *file,
             int line)
{
  if (spot_fsm_move(&imds_fsm, aws->state, s, file, line) > 0)
    aws->state = s;
}

static void set_msg(struct spot_aws *aws, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
set_msg(struct spot_aws *aws, const char *fmt, ...)
{
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(aws->msg, sizeof(aws->msg), fmt, ap);
  va_end(ap);
}

static void
token_clear(struct spot_aws *aws)
{
  if (aws->token != NULL) {
    explicit_bzero(aws->token, strlen(aws->token));
    free(aws->token);
    aws->token = NULL;
  }
}

static int
provider_get(struct spot_creds_provider *p, const struct spot_creds **out)
{
  struct spot_aws *aws = p->data;

  /* What the previous call returned stays valid until now: swap in a
   * refreshed set only here. */
  if (aws->have_next) {
    spot_aws_creds_clear(&aws->cur);
    aws->cur = aws->next;
    memset(&aws->next, 0, sizeof(aws->next));
    aws->have_next = false;
    aws->have_cur = true;
  }
  if (!aws->have_cur)
    return -ENOKEY;
  if (aws->cur.expires_ms != 0 && spot_now_wall_ms() >= aws->cur.expires_ms &&
      !aws->warned_stale) {
    char when[32];
    spot_rfc3339_format(aws->cur.expires_ms, when, sizeof(when));
    log_warn("AWS credentials from %s expired at %s; using them until a "
             "refresh succeeds",
             spot_aws_source_name(aws->source), when);
    aws->warned_stale = true;
  }
  *out = &aws->cur;
  return 0;
}

static char *
dup_opt(const char *s, bool *fail)
{
  char *d;

  if (s == NULL)
    return NULL;
  d = strdup(s);
  if (d == NULL)
    *fail = true;
  return d;
}

int
spot_aws_new(uv_loop_t *loop, struct spot_http *http,
             const struct spot_aws_options *opts, struct spot_aws **out)
{
  static const struct spot_aws_options none = {0};
  struct spot_aws *aws;
  const char *url;
  char err[256];
  bool fail = false;
  int r;

  if (loop == NULL || out == NULL)
    return -EINVAL;
  if (opts == NULL)
    opts = &none;
  aws = calloc(1, sizeof(*aws));
  if (aws == NULL)
    return -ENOMEM;
  aws->loop = loop;
  aws->http = http;
  aws->opt_endpoint = dup_opt(opts->endpoint, &fail);
  aws->opt_region = dup_opt(opts->region, &fail);
  aws->opt_profile = dup_opt(opts->profile, &fail);
  aws->imds_disabled =
      opts->imds_disabled || http == NULL || spot_aws_imds_disabled_by_env();
  aws->timeout_ms = opts->imds_timeout_ms > 0 ? opts->imds_timeout_ms
                                              : IMDS_DEFAULT_TIMEOUT_MS;
  spot_buf_init(&aws->body, IMDS_BODY_MAX);
  aws->provider.get = provider_get;
  aws->provider.data = aws;
  r = fail ? -ENOMEM : 0;
  url = opts->imds_url;
  if (url == NULL)
    url = getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (url == NULL || url[0] == '\0')
    url = SPOT_AWS_IMDS_URL;
  if (r == 0) {
    r = spot_aws_endpoint_check(url, aws->imds_url, sizeof(aws->imds_url), err,
                                sizeof(err));
    if (r < 0)
      log_err("instance metadata URL: %s", err);
  }
  if (r == 0 && http != NULL) {
    aws->easy = curl_easy_init();
    if (aws->easy == NULL)
      r = -ENOMEM;
  }
  if (r == 0)
    r = uv_timer_init(loop, &aws->timer);
  if (r < 0) {
    if (aws->easy != NULL)
      curl_easy_cleanup(aws->easy);
    free(aws->opt_endpoint);
    free(aws->opt_region);
    free(aws->opt_profile);
    free(aws);
    return r;
  }
  *out = aws;
  return 0;
}

static void
notify(struct spot_aws *aws, int err)
{
  if (aws->ready_done)
    return;
  aws->ready_done = true;
  aws->notify_pending = false;
  /* from now on the timer only carries background refreshes */
  uv_unref((uv_handle_t *)&aws->timer);
  if (err == 0)
    aws->msg[0] = '\0';
  if (aws->ready_cb != NULL)
    aws->ready_cb(err, aws->msg, aws->ready_data);
}

static void timer_cb(uv_timer_t *t);

static void
timer_arm(struct spot_aws *aws, uint64_t delay_ms)
{
  if (aws->closing)
    return;
  uv_timer_start(&aws->timer, timer_cb, delay_ms, 0);
  /* The first cycle (its retries, the ready callback) keeps the loop
   * alive; a background refresh does not (else a daemon whose other
   * handles are closed never leaves uv_run while it holds instance-role
   * credentials). */
  if (!aws->ready_done || aws->notify_pending)
    uv_ref((uv_handle_t *)&aws->timer);
  else
    uv_unref((uv_handle_t *)&aws->timer);
}

/* Reports the first cycle's outcome from the loop, never from inside
 * spot_aws_start(). */
static void
notify_later(struct spot_aws *aws, int err)
{
  aws->ready_err = err;
  aws->notify_pending = true;
  timer_arm(aws, 0);
}

static void
schedule_refresh(struct spot_aws *aws)
{
  int64_t d;

  if (aws->source != SPOT_AWS_SOURCE_IMDS)
    return;
  d = spot_aws_refresh_delay_ms(spot_now_wall_ms(), aws->latest_expires_ms);
  if (d < 0)
    return;
  log_debug("aws: credentials refresh in %" PRId64 " ms", d);
  timer_arm(aws, (uint64_t)d);
}

static int
resolve_endpoint(struct spot_aws *aws)
{
  char err[512];
  bool custom;
  int r;

  r = spot_aws_endpoint_resolve(aws->opt_endpoint, aws->region, aws->endpoint,
                                sizeof(aws->endpoint), &aws->path_style,
                                &custom, err, sizeof(err));
  if (r < 0)
    set_msg(aws, "%s", err);
  return r;
}

static void
ready_ok(struct spot_aws *aws)
{
  log_info("AWS credentials from %s, region %s, endpoint %s (%s)",
           spot_aws_source_name(aws->source), aws->region, aws->endpoint,
           aws->path_style ? "path-style" : "virtual-host");
}

static size_t
body_write_cb(char *p, size_t size, size_t n, void *data)
{
  struct spot_aws *aws = data;

  if (spot_buf_append(&aws->body, p, size * n) < 0)
    return 0; /* CURLE_WRITE_ERROR */
  return size * n;
}

static size_t
read_none_cb(char *p, size_t size, size_t n, void *data)
{
  return 0;
}

#define SETOPT(easy, opt, val)                                                 \
  do {                                                                         \
    if (curl_easy_setopt((easy), (opt), (val)) != CURLE_OK)                    \
      return -EINVAL;                                                          \
  } while (0)

static int
imds_setup(struct spot_aws *aws, bool put, const char *path)
{
  char url[SPOT_AWS_ENDPOINT_MAX + ROLE_MAX + 64];
  char hdr[IMDS_TOKEN_MAX + 64];
  CURL *e = aws->easy;
  struct curl_slist *l;
  int n;

  n = snprintf(url, sizeof(url), "%s%s", aws->imds_url, path);
  if (n < 0 || (size_t)n >= sizeof(url))
    return -ENAMETOOLONG;
  if (put)
    n = snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token-ttl-seconds: %d",
                 IMDS_TOKEN_TTL_S);
  else
    n = snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s",
                 aws->token != NULL ? aws->token : "");
  if (n < 0 || (size_t)n >= sizeof(hdr))
    return -ENAMETOOLONG;
  l = curl_slist_append(NULL, hdr);
  explicit_bzero(hdr, sizeof(hdr));
  if (l == NULL)
    return -ENOMEM;
  aws->hdrs = l;
  curl_easy_reset(e);
  spot_buf_reset(&aws->body);
  aws->curl_err[0] = '\0';
  SETOPT(e, CURLOPT_URL, url);
  SETOPT(e, CURLOPT_HTTPHEADER, aws->hdrs);
  SETOPT(e, CURLOPT_NOSIGNAL, 1L);
  SETOPT(e, CURLOPT_PROTOCOLS_STR, "http,https");
  SETOPT(e, CURLOPT_FOLLOWLOCATION, 0L);
  SETOPT(e, CURLOPT_NOPROXY, "*");
  SETOPT(e, CURLOPT_TIMEOUT_MS, aws->timeout_ms);
  SETOPT(e, CURLOPT_CONNECTTIMEOUT_MS, aws->timeout_ms);
  SETOPT(e, CURLOPT_ERRORBUFFER, aws->curl_err);
  SETOPT(e, CURLOPT_WRITEFUNCTION, body_write_cb);
  SETOPT(e, CURLOPT_WRITEDATA, aws);
  if (put) {
    SETOPT(e, CURLOPT_UPLOAD, 1L);
    SETOPT(e, CURLOPT_INFILESIZE_LARGE, (curl_off_t)0);
    SETOPT(e, CURLOPT_READFUNCTION, read_none_cb);
  }
  return 0;
}

static void imds_done_cb(CURL *easy, CURLcode rc, void *data);

static int
imds_request(struct spot_aws *aws, bool put, const char *path)
{
  int r = imds_setup(aws, put, path);

  if (r == 0)
    r = spot_http_add(aws->http, aws->easy, imds_done_cb, aws);
  if (r < 0) {
    curl_slist_free_all(aws->hdrs);
    aws->hdrs = NULL;
    set_msg(aws, "instance metadata at %s: cannot start a request: %s",
            aws->imds_url, strerror(-r));
    return r;
  }
  aws->in_flight = true;
  return 0;
}

/* The cycle failed with aws->msg set. */
static void
cycle_fail(struct spot_aws *aws, int err)
{
  char detail[sizeof(aws->msg)];

  token_clear(aws);
  spot_aws_creds_clear(&aws->fetched);
  set_state(aws, IMDS_IDLE);
  if (!aws->ready_done) {
    spot_strlcpy(detail, aws->msg, sizeof(detail));
    if (aws->need_creds) {
      set_msg(aws, "%s (%s)", SPOT_AWS_NO_CREDS_MSG, detail);
      err = -ENOKEY;
    } else {
      set_msg(aws,
              "no AWS region: set --region, AWS_REGION or the profile's "
              "region (%s)",
              detail);
      err = -EINVAL;
    }
    notify(aws, err);
    return;
  }
  aws->failures++;
  {
    uint64_t d = spot_backoff_ms(aws->failures - 1, REFRESH_RETRY_BASE_MS,
                                 REFRESH_RETRY_CAP_MS, spot_random_u32());
    char when[32];

    spot_rfc3339_format(aws->latest_expires_ms, when, sizeof(when));
    spot_log(aws->failures == 1 ? SPOT_LOG_WARNING : SPOT_LOG_DEBUG,
             "AWS credentials refresh failed: %s; keeping the current ones "
             "(expire at %s), retry in %" PRIu64 " ms",
             aws->msg, when, d);
    timer_arm(aws, d);
  }
}

static void
cycle_done(struct spot_aws *aws)
{
  token_clear(aws);
  set_state(aws, IMDS_IDLE);
  if (aws->need_creds) {
    aws->latest_expires_ms = aws->fetched.expires_ms;
    if (!aws->have_cur) {
      aws->cur = aws->fetched;
      aws->have_cur = true;
    } else {
      spot_aws_creds_clear(&aws->next);
      aws->next = aws->fetched;
      aws->have_next = true;
      aws->refreshes++;
      aws->warned_stale = false;
      log_debug("aws: credentials refreshed from instance metadata "
                "key_id=%s",
                aws->fetched.access_key);
    }
    memset(&aws->fetched, 0, sizeof(aws->fetched));
    aws->source = SPOT_AWS_SOURCE_IMDS;
  }
  aws->failures = 0;
  if (!aws->ready_done) {
    if (resolve_endpoint(aws) < 0) {
      notify(aws, -EINVAL);
      return;
    }
    schedule_refresh(aws);
    ready_ok(aws);
    notify(aws, 0);
    return;
  }
  schedule_refresh(aws);
}

/* Trims trailing blanks and newlines in place. */
static void
rtrim(struct spot_buf *b)
{
  while (b->len > 0 &&
         (b->data[b->len - 1] == '\n' || b->data[b->len - 1] == '\r' ||
          b->data[b->len - 1] == ' '))
    b->data[--b->len] = '\0';
}

static bool
role_ok(const char *s)
{
  size_t n;

  for (n = 0; s[n] != '\0'; n++)
    if (n >= ROLE_MAX ||
        !((s[n] >= 'a' && s[n] <= 'z') || (s[n] >= 'A' && s[n] <= 'Z') ||
          (s[n] >= '0' && s[n] <= '9') || strchr("+=,.@_-", s[n]) != NULL))
      return false;
  return n > 0;
}

static bool
token_ok(const char *s, size_t n)
{
  if (n == 0 || n > IMDS_TOKEN_MAX)
    return false;
  for (size_t i = 0; i < n; i++)
    if (s[i] <= 0x20 || s[i] >= 0x7f)
      return false;
  return true;
}

/* Handles one answer; the next request or the end of the cycle. */
static void
imds_answer(struct spot_aws *aws, long status)
{
  char err[256];
  const char *what = imds_state_names[aws->state];

  if ((status == 429 || status >= 500) && aws->tries < IMDS_TRIES) {
    uint64_t d = spot_backoff_ms(aws->tries, IMDS_RETRY_BASE_MS,
                                 IMDS_RETRY_CAP_MS, spot_random_u32());
    log_debug("aws imds: %s answered HTTP %ld, retry in %" PRIu64 " ms", what,
              status, d);
    timer_arm(aws, d);
    return;
  }
  aws->tries = 0;
  if (status != 200) {
    if (aws->state == IMDS_ROLE && status == 404)
      set_msg(aws,
              "instance metadata at %s: no IAM role attached to this "
              "instance",
              aws->imds_url);
    else
      set_msg(aws, "instance metadata at %s: %s request answered HTTP %ld",
              aws->imds_url, what, status);
    cycle_fail(aws, -EIO);
    return;
  }
  switch (aws->state) {
  case IMDS_TOKEN:
    rtrim(&aws->body);
    if (!token_ok(spot_buf_str(&aws->body), aws->body.len)) {
      set_msg(aws, "instance metadata at %s: malformed token", aws->imds_url);
      break;
    }
    token_clear(aws);
    aws->token = spot_buf_steal(&aws->body);
    set_state(aws, aws->need_creds ? IMDS_ROLE : IMDS_REGION);
    imds_advance(aws);
    return;
  case IMDS_ROLE: {
    /* One role per instance profile: the first line. */
    char *nl = memchr(spot_buf_str(&aws->body), '\n', aws->body.len);
    if (nl != NULL)
      *nl = '\0';
    if (!role_ok(spot_buf_str(&aws->body))) {
      set_msg(aws, "instance metadata at %s: malformed role name",
              aws->imds_url);
      break;
    }
    spot_strlcpy(aws->role, spot_buf_str(&aws->body), sizeof(aws->role));
    set_state(aws, IMDS_CREDS);
    imds_advance(aws);
    return;
  }
  case IMDS_CREDS: {
    int r;

    spot_aws_creds_clear(&aws->fetched);
    r = spot_aws_imds_creds_parse(spot_buf_str(&aws->body), aws->body.len,
                                  &aws->fetched, err, sizeof(err));
    /* The body held the secret, whether it parsed or not. */
    if (aws->body.data != NULL)
      explicit_bzero(aws->body.data, aws->body.len);
    spot_buf_reset(&aws->body);
    if (r < 0) {
      set_msg(aws, "instance metadata at %s: role %s: %s", aws->imds_url,
              aws->role, err);
      break;
    }
    if (aws->need_region) {
      set_state(aws, IMDS_REGION);
      imds_advance(aws);
    } else {
      cycle_done(aws);
    }
    return;
  }
  case IMDS_REGION:
    rtrim(&aws->body);
    if (!spot_aws_region_valid(spot_buf_str(&aws->body))) {
      set_msg(aws, "instance metadata at %s: malformed placement region",
              aws->imds_url);
      break;
    }
    spot_strlcpy(aws->region, spot_buf_str(&aws->body), sizeof(aws->region));
    cycle_done(aws);
    return;
  default:
    return;
  }
  cycle_fail(aws, -EIO);
}

static void
imds_done_cb(CURL *easy, CURLcode rc, void *data)
{
  struct spot_aws *aws = data;
  long status = 0;

  aws->in_flight = false;
  curl_slist_free_all(aws->hdrs);
  aws->hdrs = NULL;
  if (aws->closing || rc == CURLE_ABORTED_BY_CALLBACK)
    return;
  if (rc != CURLE_OK) {
    set_msg(aws, "instance metadata at %s: %s", aws->imds_url,
            aws->curl_err[0] != '\0' ? aws->curl_err : curl_easy_strerror(rc));
    cycle_fail(aws, rc == CURLE_OPERATION_TIMEDOUT ? -ETIMEDOUT : -EIO);
    return;
  }
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  imds_answer(aws, status);
}

/* Sends the request of the current state. */
static void
imds_advance(struct spot_aws *aws)
{
  char path[ROLE_MAX + 64];

  aws->tries++;
  switch (aws->state) {
  case IMDS_TOKEN:
    if (imds_request(aws, true, "/latest/api/token") < 0)
      cycle_fail(aws, -EIO);
    return;
  case IMDS_ROLE:
    if (imds_request(aws, false,
                     "/latest/meta-data/iam/security-credentials/") < 0)
      cycle_fail(aws, -EIO);
    return;
  case IMDS_CREDS:
    snprintf(path, sizeof(path),
             "/latest/meta-data/iam/security-credentials/%s", aws->role);
    if (imds_request(aws, false, path) < 0)
      cycle_fail(aws, -EIO);
    return;
  case IMDS_REGION:
    if (imds_request(aws, false, "/latest/meta-data/placement/region") < 0)
      cycle_fail(aws, -EIO);
    return;
  default:
    return;
  }
}

static void
cycle_start(struct spot_aws *aws, bool need_creds, bool need_region)
{
  aws->need_creds = need_creds;
  aws->need_region = need_region;
  aws->tries = 0;
  set_state(aws, IMDS_TOKEN);
  imds_advance(aws);
}

static void
timer_cb(uv_timer_t *t)
{
  struct spot_aws *aws = spot_container_of(t, struct spot_aws, timer);

  if (aws->closing)
    return;
  if (aws->notify_pending) {
    notify(aws, aws->ready_err);
    return;
  }
  if (aws->state == IMDS_IDLE && aws->source == SPOT_AWS_SOURCE_IMDS)
    cycle_start(aws, true, false);
  else if (aws->state != IMDS_IDLE && !aws->in_flight)
    imds_advance(aws); /* a retry of the current request */
}

int
spot_aws_start(struct spot_aws *aws, spot_aws_ready_cb cb, void *data)
{
  char err[512];
  enum spot_aws_source src = SPOT_AWS_SOURCE_NONE;
  bool custom, need_creds, need_region;
  int r;

  if (aws->started || aws->closing)
    return -EALREADY;
  aws->started = true;
  aws->ready_cb = cb;
  aws->ready_data = data;

  /* Bad input first, before any network. */
  custom = spot_aws_endpoint_is_custom(aws->opt_endpoint);
  if (custom && resolve_endpoint(aws) < 0) {
    notify_later(aws, -EINVAL);
    return 0;
  }
  r = spot_aws_region_resolve_sync(aws->opt_region, aws->opt_profile,
                                   aws->region, sizeof(aws->region), err,
                                   sizeof(err));
  if (r < 0) {
    set_msg(aws, "%s", err);
    notify_later(aws, r);
    return 0;
  }
  need_region = r == 1 && !custom;
  if (r == 1 && custom)
    spot_strlcpy(aws->region, SPOT_AWS_DEFAULT_CUSTOM_REGION,
                 sizeof(aws->region));
  r = spot_aws_creds_resolve_sync(aws->opt_profile, &aws->cur, &src, err,
                                  sizeof(err));
  if (r < 0) {
    set_msg(aws, "%s", err);
    notify_later(aws, r);
    return 0;
  }
  need_creds = r == 1;
  if (r == 0) {
    aws->have_cur = true;
    aws->source = src;
  }
  if (!need_creds && !need_region) {
    if (resolve_endpoint(aws) < 0) {
      notify_later(aws, -EINVAL);
      return 0;
    }
    ready_ok(aws);
    notify_later(aws, 0);
    return 0;
  }
  if (aws->imds_disabled) {
    if (need_creds)
      set_msg(aws, "%s (instance metadata is disabled)", SPOT_AWS_NO_CREDS_MSG);
    else
      set_msg(aws, "no AWS region: set --region, AWS_REGION or the profile's "
                   "region (instance metadata is disabled)");
    notify_later(aws, need_creds ? -ENOKEY : -EINVAL);
    return 0;
  }
  log_debug("aws: asking instance metadata at %s for%s%s", aws->imds_url,
            need_creds ? " credentials" : "", need_region ? " region" : "");
  cycle_start(aws, need_creds, need_region);
  return 0;
}

struct spot_creds_provider *
spot_aws_creds_provider(struct spot_aws *aws)
{
  return &aws->provider;
}

const char *
spot_aws_region(const struct spot_aws *aws)
{
  return aws->region;
}

const char *
spot_aws_endpoint(const struct spot_aws *aws)
{
  return aws->endpoint;
}

bool
spot_aws_path_style(const struct spot_aws *aws)
{
  return aws->path_style;
}

enum spot_aws_source
spot_aws_source(const struct spot_aws *aws)
{
  return aws->source;
}

unsigned
spot_aws_refresh_count(const struct spot_aws *aws)
{
  return aws->refreshes;
}

void
spot_aws_s3_config(struct spot_aws *aws, struct spot_s3_config *cfg)
{
  cfg->endpoint = aws->endpoint;
  cfg->region = aws->region;
  cfg->path_style = aws->path_style;
  cfg->creds = &aws->provider;
}

static void
aws_closed_cb(uv_handle_t *h)
{
  struct spot_aws *aws = spot_container_of(h, struct spot_aws, timer);
  spot_aws_close_cb cb = aws->close_cb;
  void *data = aws->close_data;

  token_clear(aws);
  spot_aws_creds_clear(&aws->fetched);
  spot_aws_creds_clear(&aws->cur);
  spot_aws_creds_clear(&aws->next);
  if (aws->body.data != NULL)
    explicit_bzero(aws->body.data, aws->body.len);
  spot_buf_fini(&aws->body);
  curl_slist_free_all(aws->hdrs);
  if (aws->easy != NULL)
    curl_easy_cleanup(aws->easy);
  free(aws->opt_endpoint);
  free(aws->opt_region);
  free(aws->opt_profile);
  free(aws);
  if (cb != NULL)
    cb(data);
}

void
spot_aws_close(struct spot_aws *aws, spot_aws_close_cb cb, void *data)
{
  if (aws == NULL || aws->closing)
    return;
  aws->closing = true;
  aws->close_cb = cb;
  aws->close_data = data;
  set_state(aws, IMDS_CLOSING);
  if (aws->in_flight)
    spot_http_cancel(aws->http, aws->easy);
  aws->in_flight = false;
  uv_timer_stop(&aws->timer);
  if (aws->started && !aws->ready_done) {
    set_msg(aws, "cancelled");
    notify(aws, -ECANCELED);
  }
  uv_close((uv_handle_t *)&aws->timer, aws_closed_cb);
}
