/* The async S3 client: one struct spot_s3_op per operation, driven by
 * curl through spot_http, SigV4 signed by curl.
 *
 * What we write ourselves, because curl 7.88 signs path and query exactly
 * as given, neither sorted nor encoded (fixed only in curl 8.3/8.5): the
 * path (keys percent-encoded, '/' kept), the query (names sorted, values
 * encoded, `uploads=` with its '='), and x-amz-content-sha256 on every
 * request, which curl does not add and without which Ceph RGW answers
 * 403.
 *
 * An op's life: INIT -> SENDING -> (BACKOFF -> SENDING)* -> DONE. Only
 * set_state() moves it. DONE runs the user callback once, then the op
 * closes its backoff timer and frees itself in the close callback.
 *
 * Lanes: with io_threads >= 2, the transfers of big bodies (parts, large
 * PUTs, GETs into a sink) run on I/O threads of their own, each with its
 * own loop and spot_http, so one loop no longer carries every byte. Such
 * an op is built and ended on the caller's loop as any other; in between
 * it belongs to its lane, which runs its attempts, retries and backoff
 * (on the lane's timer, ltimer) and hands it back through s3->back, where
 * finish() runs its callback. The caller only flags a cancel (under
 * lane_mu) and wakes the lane; the lane stops the transfer and hands the
 * op back. The credentials are copied into the op when it is submitted,
 * on the caller's loop, for the provider is not thread-safe. */
#include "io/s3.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <strings.h>

#include <openssl/evp.h>

#include "core/fsm.h"
#include "core/log.h"
#include "core/sigv4.h"
#include "core/util.h"
#include "io/s3_internal.h"
#include "spot-config.h"

#define PAYLOAD_HASH_MAX (64 * 1024)
#define KEY_MAX 1024
#define UPLOAD_ID_MAX 1024
#define URL_CAP (16 * 1024)
#define BODY_CAP (8u * 1024 * 1024)
#define MAX_PARTS 10000
#define MAX_DELETE 1000

enum op_kind {
  OP_PUT,
  OP_GET,
  OP_HEAD,
  OP_LIST,
  OP_DELETE_OBJECTS,
  OP_MPU_CREATE,
  OP_MPU_PART,
  OP_MPU_COMPLETE,
  OP_MPU_ABORT,
  OP_MPU_LIST_PARTS,
  OP_LIST_UPLOADS,
  OP_KIND_LAST,
};

static const struct {
  const char *name;
  const char *method;
  int xml; /* expected success body, or -1 */
} kinds[OP_KIND_LAST] = {
    [OP_PUT] = {"PUT", "PUT", -1},
    [OP_GET] = {"GET", "GET", -1},
    [OP_HEAD] = {"HEAD", "HEAD", -1},
    [OP_LIST] = {"LIST", "GET", SPOT__S3_XML_LIST_OBJECTS},
    [OP_DELETE_OBJECTS] = {"DELETE", "POST", SPOT__S3_XML_DELETE},
    [OP_MPU_CREATE] = {"MPU-CREATE", "POST", SPOT__S3_XML_INITIATE},
    [OP_MPU_PART] = {"MPU-PART", "PUT", -1},
    [OP_MPU_COMPLETE] = {"MPU-COMPLETE", "POST", SPOT__S3_XML_COMPLETE},
    [OP_MPU_ABORT] = {"MPU-ABORT", "DELETE", -1},
    [OP_MPU_LIST_PARTS] = {"MPU-LIST-PARTS", "GET", SPOT__S3_XML_LIST_PARTS},
    [OP_LIST_UPLOADS] = {"LIST-UPLOADS", "GET", SPOT__S3_XML_LIST_UPLOADS},
};

enum op_state {
  OP_INIT,
  OP_SENDING,
  OP_BACKOFF,
  OP_CANCELLED, /* the -ECANCELED callback is queued on op->timer */
  OP_DONE,
  OP_STATE_LAST,
};

static const char *const state_names[OP_STATE_LAST] = {
    [OP_INIT] = "init",       [OP_SENDING] = "sending",
    [OP_BACKOFF] = "backoff", [OP_CANCELLED] = "cancelled",
    [OP_DONE] = "done",
};

struct lane;

struct spot_s3 {
  struct spot_http *http;
  uv_loop_t *loop;
  char *scheme;   /* "http" or "https" */
  char *hostport; /* "127.0.0.1:7480" */
  char *region;
  char *sigv4; /* "aws:amz:REGION:s3" */
  bool path_style;
  struct spot_creds_provider *creds;
  unsigned max_retries;
  uint64_t retry_base_ms, retry_cap_ms;
  long connect_timeout_ms, low_speed_time_s, low_speed_limit;
  long request_timeout_ms;
  struct spot_s3_op *ops;
  unsigned next_id;
  bool freeing;
  bool if_match_unquoted;
  uint64_t throttled; /* spot_s3_throttled(); atomic: lanes add to it */
  spot__s3_request_hook_fn hook;
  void *hook_data;
  /* Lanes (see the top): io_threads of them once the first big transfer
   * comes, none before nor with io_threads < 2. */
  unsigned io_threads;
  struct lane *lanes;
  unsigned nlanes;
  uv_async_t *back;  /* on the caller's loop: lane ops handed back */
  unsigned lane_out; /* lane ops not yet handed back to finish() */
  uv_mutex_t lane_mu;
  uv_cond_t lane_cond;          /* an op handed back (spot_s3_free() waits) */
  bool lane_sync;               /* lane_mu and lane_cond initialised */
  struct spot_s3_op *back_list; /* under lane_mu */
  bool *back_gone;              /* back_cb() running: set when s3 is freed */
};

/* One I/O thread. inbox and stop are under s3->lane_mu; active, loop,
 * http and the ops in active are the lane thread's alone. */
struct lane {
  struct spot_s3 *s3;
  uv_thread_t thread;
  uv_loop_t loop;
  uv_async_t wake;
  struct spot_http *http;
  struct spot_s3_op *inbox, *active;
  bool stop;
  int start_err;
  uv_sem_t started;
  unsigned load; /* ops given and not handed back: caller's thread */
};

struct spot_s3_op {
  struct spot_s3 *s3; /* NULL once DONE */
  struct spot_s3_op *prev, *next;
  enum op_kind kind;
  enum op_state state;
  unsigned id;
  char *bucket;
  char *key; /* "" for bucket-level ops */
  struct spot_buf url;
  /* request body: borrowed (put, part) or owned (complete, delete) */
  const char *body;
  size_t body_len, body_off;
  char *owned_body;
  bool upload;
  char payload_hash[65];
  char content_md5[32];
  unsigned flags;
  /* GET */
  uint64_t off, len, got;
  bool sent_range;
  char if_match[160];
  char meta_hdr[320];  /* put_ex: "x-amz-meta-NAME: VALUE" or "" */
  char meta2_hdr[320]; /* put_ex: a second one, or "" */
  char resp_meta[1024];
  spot_s3_sink_cb sink;
  struct spot_buf *into;
  /* request */
  CURL *easy;
  struct curl_slist *headers;
  char errbuf[CURL_ERROR_SIZE];
  struct spot_buf resp;
  int sink_err;
  bool resp_overflow;
  bool cancelled;
  unsigned retries;
  uv_timer_t timer;
  spot_s3_cb cb;
  void *cbdata;
  /* on a lane: */
  struct lane *lane;
  struct spot_s3_op *lnext; /* in the inbox, the lane's active list or
                               s3->back_list: one at a time */
  struct spot_s3_op *lane_cancel_next; /* the lane's list of cancels */
  bool lane_cancel;                    /* under lane_mu: the caller cancelled */
  bool lane_cancel_seen;               /* lane thread */
  int lane_err;                        /* how it ended, read by the caller */
  uv_timer_t ltimer;                   /* the lane's backoff timer */
  struct spot_creds creds;             /* copied at submit */
  /* result storage, alive during the callback */
  struct spot__s3_xml_result xml;
  char etag[160];
  int64_t date_ms, sent_wall_ms, recv_wall_ms; /* see spot_s3_result */
  char code[128];
  char message[512];
  long status;
  uint64_t content_length;
};

static const struct spot_fsm op_fsm = {"s3", state_names, OP_STATE_LAST,
                                       NULL, 0,           SPOT_LOG_DEBUG};

#define set_state(op, st) set_state_at((op), (st), __FILE__, __LINE__)
static void
set_state_at(struct spot_s3_op *op, enum op_state st, const char *file,
             int line)
{
  if (spot_fsm_move_detail(&op_fsm, op->state, st, file, line,
                           "op=%u %s s3://%s/%s", op->id, kinds[op->kind].name,
                           op->bucket, op->key) > 0)
    op->state = st;
}

/* ---- pure helpers ---------------------------------------------------- */

int
spot_s3_uri_encode(const char *in, bool keep_slash, struct spot_buf *out)
{
  return spot__uri_encode_n(in, strlen(in), keep_slash, out);
}

static bool
code_is(const char *code, const char *const *set)
{
  if (code == NULL || code[0] == '\0')
    return false;
  for (; *set != NULL; set++)
    if (strcmp(code, *set) == 0)
      return true;
  return false;
}

/* The server asks us to slow down: retried, and what the store's
 * concurrency control (pace.h) backs off on. */
static const char *const throttle_codes[] = {
    "SlowDown",
    "RequestTimeout",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "TooManyRequestsException",
    NULL,
};
/* Retried too, but not throttling. */
static const char *const transient_codes[] = {
    "InternalError",
    "ServiceUnavailable",
    NULL,
};

bool
spot__s3_should_retry(CURLcode rc, long status, const char *s3_code)
{
  switch (rc) {
  case CURLE_OK:
    break;
  case CURLE_COULDNT_CONNECT:
  case CURLE_RECV_ERROR:
  case CURLE_SEND_ERROR:
  case CURLE_OPERATION_TIMEDOUT:
  case CURLE_GOT_NOTHING:
  case CURLE_PARTIAL_FILE:
    return true;
  default:
    return false;
  }
  if (status >= 500 && status <= 599)
    return true;
  if (status == 429)
    return true;
  /* RequestTimeout comes as a 400 and SlowDown as a 503; InternalError
   * can come inside a 200 (CompleteMultipartUpload). */
  return code_is(s3_code, throttle_codes) || code_is(s3_code, transient_codes);
}

/* A throttling answer (throttle_codes, 503, 429). A 500 InternalError is
 * not one. */
static bool
throttle_answer(long status, const char *s3_code)
{
  return status == 503 || status == 429 || code_is(s3_code, throttle_codes);
}

uint64_t
spot_s3_throttled(const struct spot_s3 *s3)
{
  return s3 != NULL ? __atomic_load_n(&s3->throttled, __ATOMIC_RELAXED) : 0;
}

int
spot__s3_map_error(CURLcode rc, long status, const char *s3_code)
{
  static const char *const missing[] = {"NoSuchKey", "NoSuchBucket",
                                        "NoSuchUpload", NULL};

  if (rc == CURLE_ABORTED_BY_CALLBACK)
    return -ECANCELED;
  if (rc != CURLE_OK)
    return -EIO;
  if (status >= 200 && status <= 299 && (s3_code == NULL || s3_code[0] == '\0'))
    return 0;
  if (code_is(s3_code, missing))
    return -ENOENT;
  switch (status) {
  case 400:
  case 411:
    return -EINVAL;
  case 401:
  case 403:
    return -EACCES;
  case 404:
    return -ENOENT;
  case 405:
  case 501:
    return -EOPNOTSUPP;
  case 409:
    return -EBUSY;
  case 412:
    return -EEXIST;
  case 413:
    return -EFBIG;
  case 416:
    return -ERANGE;
  case 429:
    return -EBUSY;
  default:
    return -EIO;
  }
}

bool
spot_s3_bad_credentials(const struct spot_s3_result *res)
{
  static const char *const codes[] = {
      "SignatureDoesNotMatch", "InvalidAccessKeyId",   "InvalidToken",
      "ExpiredToken",          "TokenRefreshRequired", NULL,
  };

  return res->s3_code != NULL && code_is(res->s3_code, codes);
}

const char *
spot_s3_strerror(const struct spot_s3_result *res, char *buf, size_t size)
{
  const char *code = res->s3_code != NULL ? res->s3_code : "";
  const char *msg = res->message != NULL ? res->message : "";
  char status[24] = "", tries[40] = "";
  char key[SPOT_ESCAPE_SIZE(512)];

  if (size == 0)
    return buf;
  if (res->http_status > 0)
    snprintf(status, sizeof(status), "%ld ", res->http_status);
  if (res->retries > 0)
    snprintf(tries, sizeof(tries), " (after %u retries)", res->retries);
  if (code[0] == '\0' && msg[0] == '\0')
    msg = strerror(-res->err);
  snprintf(buf, size, "%s s3://%s/%s: %s%s%s%s%s",
           res->op_name != NULL ? res->op_name : "S3",
           res->bucket != NULL ? res->bucket : "",
           spot_escape(res->key, key, sizeof(key)), status, code,
           code[0] != '\0' && msg[0] != '\0' ? ": " : "", msg, tries);
  return buf;
}

/* ---- setup ----------------------------------------------------------- */

static bool
valid_region(const char *r)
{
  size_t n = strlen(r);

  if (n == 0 || n > 32)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((r[i] >= 'a' && r[i] <= 'z') || (r[i] >= '0' && r[i] <= '9') ||
          r[i] == '-'))
      return false;
  return true;
}

static bool
valid_hostport(const char *h)
{
  if (h[0] == '\0')
    return false;
  for (; *h != '\0'; h++)
    if (*h == '@' || *h == '?' || *h == '#' || *h == '/' || *h == ' ' ||
        (unsigned char)*h < 0x21)
      return false;
  return true;
}

/* A test knob: SPOT_S3_LOW_SPEED_TIME=SEC (1..3600) shortens the stall
 * timeout so fault-injection tests need not wait 20 s per stall. */
static long
env_secs_or(const char *name, long dflt)
{
  const char *v = getenv(name);
  int64_t n;

  if (v == NULL || v[0] == '\0')
    return dflt;
  if (spot_parse_int64(v, 1, 3600, &n) < 0) {
    log_warn("s3: ignoring %s=\"%s\" (expected 1 to 3600 seconds)", name, v);
    return dflt;
  }
  return (long)n;
}

/* I/O threads: cfg's, else $SPOT_IO_THREADS (a test knob: CI's 2 cores
 * run the lanes with 3), else 1 (no lane: the caller's loop carries
 * everything) up to 4 cores and half the cores above, at most
 * SPOT_S3_IO_THREADS_MAX. Each lane copies its bodies into curl's buffer
 * and the socket (about 0.3 CPU-s per GiB in all): on 16 cores a quarter
 * (4 lanes) gave each 0.06-0.09 CPU-s per GiB of a push, half (8)
 * 0.02-0.07, under the 0.08 (12.5 GiB/s) a lane may cost
 * (bench/results/threads.md). */
static unsigned
io_threads_default(unsigned want)
{
  const char *v = getenv("SPOT_IO_THREADS");
  unsigned cores;
  int64_t n;

  if (want > 0)
    return want > SPOT_S3_IO_THREADS_MAX ? SPOT_S3_IO_THREADS_MAX : want;
  if (v != NULL && v[0] != '\0') {
    if (spot_parse_int64(v, 1, SPOT_S3_IO_THREADS_MAX, &n) == 0)
      return (unsigned)n;
    log_warn("s3: ignoring SPOT_IO_THREADS=\"%s\" (expected 1 to %d)", v,
             SPOT_S3_IO_THREADS_MAX);
  }
  cores = uv_available_parallelism();
  if (cores <= 4)
    return 1;
  return cores / 2 > SPOT_S3_IO_THREADS_MAX ? SPOT_S3_IO_THREADS_MAX
                                            : cores / 2;
}

int
spot_s3_new(struct spot_http *http, const struct spot_s3_config *cfg,
            struct spot_s3 **out)
{
  struct spot_s3 *s3;
  const char *rest;
  size_t n;
  char *sig = NULL;

  if (http == NULL || cfg == NULL || cfg->endpoint == NULL ||
      cfg->region == NULL || cfg->creds == NULL || cfg->creds->get == NULL)
    return -EINVAL;
  if (!valid_region(cfg->region)) {
    log_err("s3: invalid region \"%s\"", cfg->region);
    return -EINVAL;
  }
  s3 = calloc(1, sizeof(*s3));
  if (s3 == NULL)
    return -ENOMEM;
  if (strncmp(cfg->endpoint, "http://", 7) == 0) {
    s3->scheme = strdup("http");
    rest = cfg->endpoint + 7;
  } else if (strncmp(cfg->endpoint, "https://", 8) == 0) {
    s3->scheme = strdup("https");
    rest = cfg->endpoint + 8;
  } else {
    log_err("s3: endpoint \"%s\" is not an http:// or https:// URL",
            cfg->endpoint);
    free(s3);
    return -EINVAL;
  }
  n = strcspn(rest, "/");
  s3->hostport = strndup(rest, n);
  s3->region = strdup(cfg->region);
  if (asprintf(&sig, "aws:amz:%s:s3", cfg->region) < 0)
    sig = NULL;
  s3->sigv4 = sig;
  if (s3->scheme == NULL || s3->hostport == NULL || s3->region == NULL ||
      s3->sigv4 == NULL) {
    spot_s3_free(s3);
    return -ENOMEM;
  }
  if (!valid_hostport(s3->hostport) ||
      (rest[n] != '\0' && strcmp(rest + n, "/") != 0)) {
    log_err("s3: endpoint \"%s\" must be scheme://host[:port]", cfg->endpoint);
    spot_s3_free(s3);
    return -EINVAL;
  }
  s3->http = http;
  s3->loop = spot_http_loop(http);
  s3->path_style = cfg->path_style;
  s3->creds = cfg->creds;
  s3->max_retries = cfg->max_retries != 0 ? cfg->max_retries : 5;
  s3->retry_base_ms = cfg->retry_base_ms != 0 ? cfg->retry_base_ms : 200;
  s3->retry_cap_ms = cfg->retry_cap_ms != 0 ? cfg->retry_cap_ms : 10000;
  s3->connect_timeout_ms =
      cfg->connect_timeout_ms > 0 ? cfg->connect_timeout_ms : 5000;
  s3->low_speed_time_s = cfg->low_speed_time_s > 0
                             ? cfg->low_speed_time_s
                             : env_secs_or("SPOT_S3_LOW_SPEED_TIME", 20);
  s3->low_speed_limit = cfg->low_speed_limit > 0 ? cfg->low_speed_limit : 1024;
  s3->request_timeout_ms =
      cfg->request_timeout_ms > 0 ? cfg->request_timeout_ms : 0;
  s3->io_threads = io_threads_default(cfg->io_threads);
  if (s3->io_threads > 1) {
    if (uv_mutex_init(&s3->lane_mu) < 0) {
      s3->io_threads = 1; /* no lanes: the caller's loop carries all */
    } else if (uv_cond_init(&s3->lane_cond) < 0) {
      uv_mutex_destroy(&s3->lane_mu);
      s3->io_threads = 1;
    } else {
      s3->lane_sync = true;
    }
  }
  *out = s3;
  return 0;
}

void
spot__s3_set_request_hook(struct spot_s3 *s3, spot__s3_request_hook_fn fn,
                          void *data)
{
  s3->hook = fn;
  s3->hook_data = data;
}

/* ---- op lifetime ----------------------------------------------------- */

static void
creds_wipe(struct spot_creds *c)
{
  if (c->secret_key != NULL)
    explicit_bzero(c->secret_key, strlen(c->secret_key));
  free(c->access_key);
  free(c->secret_key);
  free(c->session_token);
  memset(c, 0, sizeof(*c));
}

static void
op_free_cb(uv_handle_t *handle)
{
  struct spot_s3_op *op =
      spot_container_of((uv_timer_t *)handle, struct spot_s3_op, timer);

  free(op);
}

/* Releases everything but the timer, then closes the timer; the memory
 * goes in op_free_cb. */
static void
op_destroy(struct spot_s3_op *op)
{
  if (op->easy != NULL)
    curl_easy_cleanup(op->easy);
  curl_slist_free_all(op->headers);
  spot__s3_xml_result_fini(&op->xml);
  spot_buf_fini(&op->url);
  spot_buf_fini(&op->resp);
  free(op->owned_body);
  free(op->bucket);
  free(op->key);
  creds_wipe(&op->creds);
  uv_close((uv_handle_t *)&op->timer, op_free_cb);
}

static void
op_unlink(struct spot_s3_op *op)
{
  struct spot_s3 *s3 = op->s3;

  if (s3 == NULL)
    return;
  if (op->prev != NULL)
    op->prev->next = op->next;
  else
    s3->ops = op->next;
  if (op->next != NULL)
    op->next->prev = op->prev;
  op->prev = op->next = NULL;
}

static void
finish(struct spot_s3_op *op, int err)
{
  struct spot_s3_result res;
  char line[1024];

  memset(&res, 0, sizeof(res));
  res.err = err;
  res.http_status = op->status;
  res.s3_code = op->code;
  res.message = op->message;
  res.retries = op->retries;
  res.op_name = kinds[op->kind].name;
  res.bucket = op->bucket;
  res.key = op->key;
  res.etag = op->etag;
  res.date_ms = op->date_ms;
  res.sent_wall_ms = op->sent_wall_ms;
  res.recv_wall_ms = op->recv_wall_ms;
  res.meta = op->resp_meta;
  if (err == 0) {
    res.content_length = op->content_length;
    res.upload_id = op->xml.upload_id;
    res.objects = op->xml.objects;
    res.n_objects = op->xml.n_objects;
    res.common_prefixes = (const char *const *)op->xml.prefixes;
    res.n_common_prefixes = op->xml.n_prefixes;
    res.next_token = op->xml.truncated ? op->xml.next_token : NULL;
    res.parts = op->xml.parts;
    res.n_parts = op->xml.n_parts;
    res.uploads = op->xml.uploads;
    res.n_uploads = op->xml.n_uploads;
    res.failed_keys = (const char *const *)op->xml.failed_keys;
    res.n_failed_keys = op->xml.n_failed_keys;
  }
  if (err < 0 && err != -ECANCELED)
    log_debug("s3: op=%u %s", op->id,
              spot_s3_strerror(&res, line, sizeof(line)));
  set_state(op, OP_DONE);
  op_unlink(op);
  op->s3 = NULL;
  op->cb(&res, op->cbdata);
  op_destroy(op);
}

/* ---- curl callbacks -------------------------------------------------- */

/* curl copies an upload's body through a buffer of this size (one
 * read_cb and one send() per fill). Its default, 64 KiB, costs a syscall
 * per 64 KiB; 256 KiB cut a push's CPU by 6 % (bench: 1 GiB to
 * bench/s3_discard.py), and 1-2 MiB cost more than the default: the
 * buffer no longer stays in the CPU's cache. Bodies up to the default
 * keep it (and its memory). */
#define UPLOAD_BUF_DEFAULT (64L << 10)
#define UPLOAD_BUF (256L << 10)
/* The same for a download into a sink (curl's default is 16 KiB): a
 * restore of 1 GiB from Ceph spent ~20 % less CPU with 256 KiB (noisy
 * figures; 512 KiB no better). */
#define DOWNLOAD_BUF (256L << 10)

static size_t
read_cb(char *buf, size_t size, size_t nitems, void *data)
{
  struct spot_s3_op *op = data;
  size_t want = size * nitems, left = op->body_len - op->body_off;

  if (want > left)
    want = left;
  if (want > 0)
    memcpy(buf, op->body + op->body_off, want);
  op->body_off += want;
  return want;
}

static int
seek_cb(void *data, curl_off_t offset, int origin)
{
  struct spot_s3_op *op = data;

  if (origin != SEEK_SET)
    return CURL_SEEKFUNC_CANTSEEK;
  if (offset < 0 || (uint64_t)offset > op->body_len)
    return CURL_SEEKFUNC_FAIL;
  op->body_off = (size_t)offset;
  return CURL_SEEKFUNC_OK;
}

static size_t
write_cb(char *p, size_t size, size_t nitems, void *data)
{
  struct spot_s3_op *op = data;
  size_t len = size * nitems;
  long status = 0;
  int r;

  curl_easy_getinfo(op->easy, CURLINFO_RESPONSE_CODE, &status);
  if (op->kind == OP_GET && status >= 200 && status <= 299) {
    if (op->sent_range && status != 206) {
      /* the server ignored Range: these are not the bytes asked for */
      op->sink_err = -EPROTO;
      return 0;
    }
    if (op->sink != NULL)
      r = op->sink(p, len, op->got, op->cbdata);
    else
      r = spot_buf_append(op->into, p, len);
    if (r < 0) {
      op->sink_err = r;
      return 0;
    }
    op->got += len;
    return len;
  }
  if (spot_buf_append(&op->resp, p, len) < 0) {
    op->resp_overflow = true;
    return 0;
  }
  return len;
}

static int
debug_cb(CURL *easy, curl_infotype type, char *data, size_t size, void *userp)
{
  struct spot_s3_op *op = userp;

  if (type == CURLINFO_HEADER_OUT && op->s3 != NULL && op->s3->hook != NULL)
    op->s3->hook(data, size, op->s3->hook_data);
  return 0;
}

/* ---- one attempt ----------------------------------------------------- */

static void done_cb(CURL *easy, CURLcode rc, void *data);

static int add_header(struct spot_s3_op *op, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static int
add_header(struct spot_s3_op *op, const char *fmt, ...)
{
  char line[1024];
  struct curl_slist *l;
  va_list ap;
  int n;

  va_start(ap, fmt);
  n = vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof(line))
    return -E2BIG;
  l = curl_slist_append(op->headers, line);
  if (l == NULL)
    return -ENOMEM;
  op->headers = l;
  return 0;
}

static int
build_headers(struct spot_s3_op *op, const struct spot_creds *creds)
{
  int r;

  curl_slist_free_all(op->headers);
  op->headers = NULL;
  op->sent_range = false;
  r = add_header(op, "x-amz-content-sha256: %s", op->payload_hash);
  if (r == 0 && creds->session_token != NULL && creds->session_token[0] != '\0')
    r = add_header(op, "x-amz-security-token: %s", creds->session_token);
  if (r == 0 && (op->flags & SPOT_S3_IF_NONE_MATCH))
    r = add_header(op, "If-None-Match: *");
  if (r == 0 && op->content_md5[0] != '\0')
    r = add_header(op, "Content-MD5: %s", op->content_md5);
  if (r == 0 && op->owned_body != NULL)
    r = add_header(op, "Content-Type: application/xml");
  if (r == 0 && op->kind == OP_GET) {
    uint64_t start = op->off + op->got;

    if (op->len > 0) {
      r = add_header(op, "Range: bytes=%llu-%llu", (unsigned long long)start,
                     (unsigned long long)(op->off + op->len - 1));
      op->sent_range = true;
    } else if (start > 0) {
      r = add_header(op, "Range: bytes=%llu-", (unsigned long long)start);
      op->sent_range = true;
    }
    /* a resumed GET must read the same object version */
    if (r == 0 && op->got > 0 && op->if_match[0] != '\0')
      r = add_header(op, "If-Match: %s", op->if_match);
  }
  if (r == 0 && op->kind == OP_PUT && op->if_match[0] != '\0')
    r = add_header(op, "If-Match: %s", op->if_match);
  if (r == 0 && op->meta_hdr[0] != '\0')
    r = add_header(op, "%s", op->meta_hdr);
  if (r == 0 && op->meta2_hdr[0] != '\0')
    r = add_header(op, "%s", op->meta2_hdr);
  return r;
}

#define SETOPT(opt, val)                                                       \
  do {                                                                         \
    CURLcode c_ = curl_easy_setopt(op->easy, opt, val);                        \
    if (c_ != CURLE_OK) {                                                      \
      log_err("s3: curl_easy_setopt(%s): %s", #opt, curl_easy_strerror(c_));   \
      return c_ == CURLE_OUT_OF_MEMORY ? -ENOMEM : -EINVAL;                    \
    }                                                                          \
  } while (0)

/* The provider's credentials now, on the caller's loop: 0, or a negative
 * errno with op->message saying why. */
static int
creds_get(struct spot_s3_op *op, const struct spot_creds **out)
{
  int r = op->s3->creds->get(op->s3->creds, out);

  if (r < 0) {
    snprintf(op->message, sizeof(op->message), "no credentials: %s",
             strerror(-r));
    return r;
  }
  if (*out == NULL || (*out)->access_key == NULL || (*out)->secret_key == NULL)
    return -ENOKEY;
  return 0;
}

static int
attempt(struct spot_s3_op *op)
{
  struct spot_s3 *s3 = op->s3;
  const struct spot_creds *creds = NULL;
  int r;

  if (op->lane != NULL) {
    creds = &op->creds; /* the provider belongs to the caller's loop */
    if (creds->access_key == NULL || creds->secret_key == NULL)
      return -ENOKEY;
  } else {
    r = creds_get(op, &creds);
    if (r < 0)
      return r;
  }
  r = build_headers(op, creds);
  if (r < 0)
    return r;
  spot_buf_reset(&op->resp);
  op->resp_overflow = false;
  op->sink_err = 0;
  op->body_off = 0;
  op->status = 0;
  op->errbuf[0] = '\0';
  op->code[0] = '\0';
  op->message[0] = '\0';
  op->resp_meta[0] = '\0';
  curl_easy_reset(op->easy);
  SETOPT(CURLOPT_URL, spot_buf_str(&op->url));
  SETOPT(CURLOPT_PROTOCOLS_STR, "http,https");
  SETOPT(CURLOPT_PATH_AS_IS, 1L);
  SETOPT(CURLOPT_NOSIGNAL, 1L);
  SETOPT(CURLOPT_ERRORBUFFER, op->errbuf);
  SETOPT(CURLOPT_USERAGENT, "spotd/" SPOT_VERSION);
  SETOPT(CURLOPT_AWS_SIGV4, s3->sigv4);
  SETOPT(CURLOPT_USERNAME, creds->access_key);
  SETOPT(CURLOPT_PASSWORD, creds->secret_key);
  SETOPT(CURLOPT_HTTPHEADER, op->headers);
  SETOPT(CURLOPT_SSL_VERIFYPEER, 1L);
  SETOPT(CURLOPT_SSL_VERIFYHOST, 2L);
  SETOPT(CURLOPT_TCP_KEEPALIVE, 1L);
  SETOPT(CURLOPT_CONNECTTIMEOUT_MS, s3->connect_timeout_ms);
  SETOPT(CURLOPT_LOW_SPEED_LIMIT, s3->low_speed_limit);
  SETOPT(CURLOPT_LOW_SPEED_TIME, s3->low_speed_time_s);
  if (s3->request_timeout_ms > 0)
    SETOPT(CURLOPT_TIMEOUT_MS, s3->request_timeout_ms);
  SETOPT(CURLOPT_WRITEFUNCTION, write_cb);
  SETOPT(CURLOPT_WRITEDATA, op);
  if (s3->hook != NULL) {
    SETOPT(CURLOPT_DEBUGFUNCTION, debug_cb);
    SETOPT(CURLOPT_DEBUGDATA, op);
    SETOPT(CURLOPT_VERBOSE, 1L);
  }
  if (op->upload) {
    /* UPLOAD sends the body from read_cb with a Content-Length (never
     * chunked: Ceph answers 411); CUSTOMREQUEST turns it into a POST
     * where needed without curl adding a form Content-Type. */
    SETOPT(CURLOPT_UPLOAD, 1L);
    SETOPT(CURLOPT_READFUNCTION, read_cb);
    SETOPT(CURLOPT_READDATA, op);
    SETOPT(CURLOPT_SEEKFUNCTION, seek_cb);
    SETOPT(CURLOPT_SEEKDATA, op);
    SETOPT(CURLOPT_INFILESIZE_LARGE, (curl_off_t)op->body_len);
    if (op->body_len > UPLOAD_BUF_DEFAULT)
      SETOPT(CURLOPT_UPLOAD_BUFFERSIZE, UPLOAD_BUF);
    /* curl 7.88 sends "Expect: 100-continue" with every PUT and waits
     * up to 1 s for the 100: a round trip per part on a real network.
     * An empty "Expect:" header would break curl 7.88's SigV4 signature
     * (it signs every custom header), so send the body at once instead; a
     * refusal still arrives as the final status. */
    SETOPT(CURLOPT_EXPECT_100_TIMEOUT_MS, 0L);
    if (strcmp(kinds[op->kind].method, "PUT") != 0)
      SETOPT(CURLOPT_CUSTOMREQUEST, kinds[op->kind].method);
  } else if (op->kind == OP_GET && op->sink != NULL) {
    /* a frame into a sink: fewer, larger recv() and sink calls */
    SETOPT(CURLOPT_BUFFERSIZE, DOWNLOAD_BUF);
  } else if (op->kind == OP_HEAD) {
    SETOPT(CURLOPT_NOBODY, 1L);
  } else if (strcmp(kinds[op->kind].method, "GET") != 0) {
    SETOPT(CURLOPT_CUSTOMREQUEST, kinds[op->kind].method);
  }
  op->sent_wall_ms = spot_now_wall_ms();
  r = spot_http_add(op->lane != NULL ? op->lane->http : s3->http, op->easy,
                    done_cb, op);
  if (r < 0)
    return r;
  set_state(op, OP_SENDING);
  return 0;
}

static void lane_end(struct spot_s3_op *op, int err);

/* How an attempt's op ends: on the caller's loop, or handed back by its
 * lane. */
static void
end(struct spot_s3_op *op, int err)
{
  if (op->lane != NULL)
    lane_end(op, err);
  else
    finish(op, err);
}

/* The retry after a backoff, on the caller's timer or the lane's
 * (ltimer): either timer's data is the op. */
static void
backoff_cb(uv_timer_t *timer)
{
  struct spot_s3_op *op = timer->data;
  int r;

  r = attempt(op);
  if (r < 0)
    end(op, r);
}

static void
copy_str(char *dst, size_t size, const char *src)
{
  spot_strlcpy(dst, src != NULL ? src : "", size);
}

static void
cancelled_cb(uv_timer_t *timer)
{
  finish(spot_container_of(timer, struct spot_s3_op, timer), -ECANCELED);
}

/* A cancelled op ends from the loop, never inside the call that cancels
 * it: its callback may start or cancel other ops of the same caller,
 * which must not find that caller halfway through its own cancel. The
 * op's timer, idle once the transfer is gone, carries the callback (a 0
 * ms timer runs on the loop's next turn). */
static void
queue_cancelled(struct spot_s3_op *op)
{
  if (op->state == OP_CANCELLED || op->state == OP_DONE)
    return;
  copy_str(op->message, sizeof(op->message), "cancelled");
  set_state(op, OP_CANCELLED);
  uv_timer_stop(&op->timer);
  uv_timer_start(&op->timer, cancelled_cb, 0, 0);
}

/* Keeps the x-amz-meta-* response headers (those that fit). */
static void
collect_meta(struct spot_s3_op *op)
{
  struct curl_header *h, *prev = NULL;
  size_t used = 0;

  op->resp_meta[0] = '\0';
  while ((h = curl_easy_nextheader(op->easy, CURLH_HEADER, -1, prev)) != NULL) {
    prev = h;
    if (strncasecmp(h->name, "x-amz-meta-", 11) == 0) {
      int n = snprintf(op->resp_meta + used, sizeof(op->resp_meta) - used,
                       "%s: %s\n", h->name, h->value);

      if (n < 0 || (size_t)n >= sizeof(op->resp_meta) - used) {
        op->resp_meta[used] = '\0';
        break;
      }
      used += (size_t)n;
    }
  }
}

/* What the server said (Code, Message) is printed: escaped on arrival. */
static void
copy_escaped(char *dst, size_t size, const char *src)
{
  spot_escape(src, dst, size);
}

/* An HTTP Date (RFC 9110 IMF-fixdate, "Sun, 06 Nov 1994 08:49:37 GMT")
 * in ms since the epoch, or 0. */
static int64_t
http_date_ms(const char *v)
{
  struct tm tm;
  const char *end;
  time_t t;

  memset(&tm, 0, sizeof(tm));
  end = strptime(v, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (end == NULL || *end != '\0')
    return 0;
  t = timegm(&tm);
  return t > 0 ? (int64_t)t * 1000 : 0;
}

int64_t
spot_s3_clock_skew_ms(const struct spot_s3_result *res)
{
  if (res == NULL || res->date_ms <= 0 || res->sent_wall_ms <= 0 ||
      res->recv_wall_ms < res->sent_wall_ms)
    return 0;
  if (res->sent_wall_ms > res->date_ms + 1000)
    return res->sent_wall_ms - (res->date_ms + 1000); /* ahead */
  if (res->recv_wall_ms < res->date_ms)
    return res->recv_wall_ms - res->date_ms; /* behind */
  return 0;
}

static void
done_cb(CURL *easy, CURLcode rc, void *data)
{
  struct spot_s3_op *op = data;
  struct curl_header *h = NULL;
  curl_off_t cl = -1;
  char key[SPOT_ESCAPE_SIZE(512)]; /* for log lines: keys may come from the
                                      store (a listing, a manifest) */
  int err;

  if (op->cancelled || rc == CURLE_ABORTED_BY_CALLBACK) {
    if (op->lane != NULL) {
      copy_str(op->message, sizeof(op->message), "cancelled");
      lane_end(op, -ECANCELED);
    } else {
      queue_cancelled(op);
    }
    return;
  }
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &op->status);
  if (rc == CURLE_OK || op->status > 0) {
    if (curl_easy_header(easy, "ETag", 0, CURLH_HEADER, -1, &h) == CURLHE_OK &&
        h != NULL)
      copy_str(op->etag, sizeof(op->etag), h->value);
    collect_meta(op);
    op->recv_wall_ms = spot_now_wall_ms();
    op->date_ms = 0;
    if (curl_easy_header(easy, "Date", 0, CURLH_HEADER, -1, &h) == CURLHE_OK &&
        h != NULL)
      op->date_ms = http_date_ms(h->value);
  }
  if (op->kind == OP_GET && op->if_match[0] == '\0' && op->etag[0] != '\0')
    copy_str(op->if_match, sizeof(op->if_match), op->etag);

  if (rc != CURLE_OK) {
    if (op->sink_err < 0) {
      end(op, op->sink_err);
      return;
    }
    if (op->resp_overflow) {
      snprintf(op->message, sizeof(op->message), "response body over %u bytes",
               SPOT__S3_XML_CAP);
      end(op, -EMSGSIZE);
      return;
    }
    copy_str(op->message, sizeof(op->message),
             op->errbuf[0] != '\0' ? op->errbuf : curl_easy_strerror(rc));
    err = spot__s3_map_error(rc, op->status, NULL);
  } else if (op->status >= 200 && op->status <= 299) {
    err = 0;
    if (kinds[op->kind].xml >= 0) {
      spot__s3_xml_result_fini(&op->xml);
      err = spot__s3_xml_parse((enum spot__s3_xml_kind)kinds[op->kind].xml,
                               spot_buf_str(&op->resp), op->resp.len, &op->xml);
      if (err < 0) {
        snprintf(op->message, sizeof(op->message),
                 "unparsable response body (%zu bytes)", op->resp.len);
        err = -EBADMSG;
      } else if (op->xml.is_error) {
        /* CompleteMultipartUpload can fail inside a 200 */
        copy_escaped(op->code, sizeof(op->code), op->xml.code);
        copy_escaped(op->message, sizeof(op->message), op->xml.message);
        err = -EIO;
      } else if (op->kind == OP_MPU_COMPLETE && op->xml.etag != NULL) {
        copy_str(op->etag, sizeof(op->etag), op->xml.etag);
      }
    }
    if (err == 0) {
      if (op->kind == OP_HEAD) {
        curl_easy_getinfo(easy, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &cl);
        op->content_length = cl >= 0 ? (uint64_t)cl : 0;
      } else if (op->kind == OP_GET) {
        op->content_length = op->got;
      }
    }
  } else {
    struct spot__s3_xml_result x;

    if (op->resp.len > 0 &&
        spot__s3_xml_parse(SPOT__S3_XML_ERROR, spot_buf_str(&op->resp),
                           op->resp.len, &x) == 0) {
      copy_escaped(op->code, sizeof(op->code), x.code);
      copy_escaped(op->message, sizeof(op->message), x.message);
      spot__s3_xml_result_fini(&x);
    } else {
      snprintf(op->message, sizeof(op->message), "HTTP %ld", op->status);
    }
    err = spot__s3_map_error(rc, op->status, op->code);
  }
  if (err == 0) {
    end(op, 0);
    return;
  }
  if (rc == CURLE_OK && throttle_answer(op->status, op->code))
    __atomic_fetch_add(&op->s3->throttled, 1, __ATOMIC_RELAXED);
  if (err != -EBADMSG && spot__s3_should_retry(rc, op->status, op->code) &&
      op->retries < op->s3->max_retries) {
    uint64_t ms = spot_backoff_ms(op->retries, op->s3->retry_base_ms,
                                  op->s3->retry_cap_ms, spot_random_u32());

    op->retries++;
    log_warn("s3: %s s3://%s/%s: %s%s%s; retry %u/%u in %llu ms",
             kinds[op->kind].name, op->bucket,
             spot_escape(op->key, key, sizeof(key)),
             rc != CURLE_OK ? "" : op->code,
             rc != CURLE_OK || op->code[0] == '\0' ? "" : ": ", op->message,
             op->retries, op->s3->max_retries, (unsigned long long)ms);
    set_state(op, OP_BACKOFF);
    if (op->lane != NULL)
      uv_timer_start(&op->ltimer, backoff_cb, ms, 0);
    else
      uv_timer_start(&op->timer, backoff_cb, ms, 0);
    return;
  }
  if (rc != CURLE_OK)
    log_warn("s3: %s s3://%s/%s: %s", kinds[op->kind].name, op->bucket,
             spot_escape(op->key, key, sizeof(key)), op->message);
  end(op, err);
}

/* ---- lanes ----------------------------------------------------------- */

/* Bodies from this size go to a lane: below it, a transfer is mostly
 * round trips, which the caller's loop carries as well. */
#define LANE_MIN_BODY ((size_t)1 << 20)

static bool
lane_wanted(const struct spot_s3_op *op)
{
  if (op->s3->io_threads < 2)
    return false;
  switch (op->kind) {
  case OP_MPU_PART:
    return op->body_len >= LANE_MIN_BODY;
  case OP_PUT: /* conditional PUTs (commit, lease, LATEST) stay */
    return op->body_len >= LANE_MIN_BODY && op->flags == 0 &&
           op->if_match[0] == '\0' && op->meta_hdr[0] == '\0';
  case OP_GET:
    return op->sink != NULL;
  default:
    return false;
  }
}

static void
lane_timer_closed(uv_handle_t *h)
{
  struct spot_s3_op *op =
      spot_container_of((uv_timer_t *)h, struct spot_s3_op, ltimer);
  struct spot_s3 *s3 = op->s3;

  /* The op is the caller's again once it is on back_list; the async is
   * sent under the lock, so spot_s3_free() (which takes it) cannot free
   * s3 between the two. */
  uv_mutex_lock(&s3->lane_mu);
  op->lnext = s3->back_list;
  s3->back_list = op;
  uv_cond_signal(&s3->lane_cond);
  uv_async_send(s3->back);
  uv_mutex_unlock(&s3->lane_mu);
}

/* On the lane: the op is over (err); off the lane's list, its timer
 * closed, then handed back. */
static void
lane_end(struct spot_s3_op *op, int err)
{
  struct lane *l = op->lane;
  struct spot_s3_op **pp = &l->active;

  while (*pp != NULL && *pp != op)
    pp = &(*pp)->lnext;
  if (*pp != NULL)
    *pp = op->lnext;
  op->lnext = NULL;
  op->lane_err = err;
  set_state(op, OP_DONE); /* finish() runs its callback on the caller's loop */
  uv_timer_stop(&op->ltimer);
  uv_close((uv_handle_t *)&op->ltimer, lane_timer_closed);
}

static void
lane_cancel_op(struct spot_s3_op *op)
{
  copy_str(op->message, sizeof(op->message), "cancelled");
  if (op->state == OP_SENDING) {
    op->cancelled = true;
    /* done_cb runs inside and ends the op */
    spot_http_cancel(op->lane->http, op->easy);
    if (op->state == OP_SENDING)
      lane_end(op, -ECANCELED); /* in case http no longer knew it */
  } else if (op->state == OP_BACKOFF) {
    lane_end(op, -ECANCELED);
  }
}

static void
lane_closed_cb(void *data)
{
  (void)data;
}

static void
lane_wake_cb(uv_async_t *a)
{
  struct lane *l = spot_container_of(a, struct lane, wake);
  struct spot_s3 *s3 = l->s3;
  struct spot_s3_op *in, *op, *next, *cancel = NULL;
  bool stop;

  uv_mutex_lock(&s3->lane_mu);
  in = l->inbox;
  l->inbox = NULL;
  stop = l->stop;
  for (op = l->active; op != NULL; op = op->lnext)
    if (op->lane_cancel && !op->lane_cancel_seen) {
      op->lane_cancel_seen = true;
      op->lane_cancel_next = cancel;
      cancel = op;
    }
  for (op = in; op != NULL; op = op->lnext)
    op->lane_cancel_seen = op->lane_cancel;
  uv_mutex_unlock(&s3->lane_mu);
  /* the inbox is pushed at its head: started in the order submitted */
  for (op = in, in = NULL; op != NULL; op = next) {
    next = op->lnext;
    op->lnext = in;
    in = op;
  }

  for (op = cancel; op != NULL; op = next) {
    next = op->lane_cancel_next;
    lane_cancel_op(op);
  }
  for (op = in; op != NULL; op = next) {
    int r;

    next = op->lnext;
    op->lnext = l->active;
    l->active = op;
    /* Cannot fail: the lane's loop is initialised. */
    (void)uv_timer_init(&l->loop, &op->ltimer);
    op->ltimer.data = op;
    if (op->lane_cancel_seen) {
      copy_str(op->message, sizeof(op->message), "cancelled");
      lane_end(op, -ECANCELED);
    } else if ((r = attempt(op)) < 0) {
      lane_end(op, r);
    }
  }
  if (stop) {
    /* spot_s3_free() took every op back first */
    spot_http_close(l->http, lane_closed_cb, NULL);
    uv_close((uv_handle_t *)&l->wake, NULL);
  }
}

static void
lane_main(void *arg)
{
  struct lane *l = arg;
  sigset_t all;
  int r;

  /* Signals are the caller's loop's (uv_signal_t). */
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, NULL);
  r = uv_loop_init(&l->loop);
  if (r == 0) {
    r = uv_async_init(&l->loop, &l->wake, lane_wake_cb);
    if (r == 0) {
      r = spot_http_new(&l->loop, &l->http);
      if (r < 0)
        uv_close((uv_handle_t *)&l->wake, NULL);
    }
    if (r < 0) {
      uv_run(&l->loop, UV_RUN_DEFAULT);
      uv_loop_close(&l->loop);
    }
  }
  l->start_err = r;
  uv_sem_post(&l->started);
  if (r < 0)
    return;
  uv_run(&l->loop, UV_RUN_DEFAULT);
  if (uv_loop_close(&l->loop) != 0)
    log_warn("s3: an I/O thread's loop closed with handles left");
}

/* One op at a time off back_list: a callback may cancel others or free
 * s3 (then spot_s3_free() ends the ops still listed, and sets *gone). */
static void
back_cb(uv_async_t *a)
{
  struct spot_s3 *s3 = a->data;
  struct spot_s3_op *op;
  bool gone = false;

  s3->back_gone = &gone;
  for (;;) {
    uv_mutex_lock(&s3->lane_mu);
    op = s3->back_list;
    if (op != NULL)
      s3->back_list = op->lnext;
    uv_mutex_unlock(&s3->lane_mu);
    if (op == NULL)
      break;
    op->lane->load--;
    if (--s3->lane_out == 0)
      uv_unref((uv_handle_t *)s3->back);
    finish(op, op->lane_err);
    if (gone)
      return;
  }
  s3->back_gone = NULL;
}

static void
back_closed_cb(uv_handle_t *h)
{
  free(h);
}

/* Starts the lanes' threads (the first big transfer). 0 or negative
 * errno: then the op stays on the caller's loop. */
static int
lanes_start(struct spot_s3 *s3)
{
  unsigned n = s3->io_threads;
  int r;

  s3->back = calloc(1, sizeof(*s3->back));
  s3->lanes = calloc(n, sizeof(*s3->lanes));
  if (s3->back == NULL || s3->lanes == NULL) {
    free(s3->back);
    free(s3->lanes);
    s3->back = NULL;
    s3->lanes = NULL;
    return -ENOMEM;
  }
  r = uv_async_init(s3->loop, s3->back, back_cb);
  if (r < 0) {
    free(s3->back);
    free(s3->lanes);
    s3->back = NULL;
    s3->lanes = NULL;
    return r;
  }
  s3->back->data = s3;
  uv_unref((uv_handle_t *)s3->back);
  for (unsigned i = 0; i < n; i++) {
    struct lane *l = &s3->lanes[i];

    l->s3 = s3;
    if (uv_sem_init(&l->started, 0) < 0)
      break;
    r = uv_thread_create(&l->thread, lane_main, l);
    if (r == 0) {
      char name[16];

      /* by role, for top -H and per-thread CPU figures */
      snprintf(name, sizeof(name), "s3-lane-%u", i % 1000);
      pthread_setname_np(l->thread, name);
      uv_sem_wait(&l->started);
    }
    uv_sem_destroy(&l->started);
    if (r < 0 || l->start_err < 0) {
      if (r == 0)
        uv_thread_join(&l->thread);
      break;
    }
    s3->nlanes++;
  }
  if (s3->nlanes < n)
    log_warn("s3: %u of %u I/O threads started", s3->nlanes, n);
  log_debug("s3: %u I/O threads", s3->nlanes);
  return 0;
}

static int
creds_copy(struct spot_creds *dst, const struct spot_creds *src)
{
  dst->access_key = strdup(src->access_key);
  dst->secret_key = strdup(src->secret_key);
  dst->session_token =
      src->session_token != NULL ? strdup(src->session_token) : NULL;
  dst->expires_ms = src->expires_ms;
  if (dst->access_key == NULL || dst->secret_key == NULL ||
      (src->session_token != NULL && dst->session_token == NULL)) {
    creds_wipe(dst);
    return -ENOMEM;
  }
  return 0;
}

/* Gives op to the least busy lane (ties: the first, so the lanes' own
 * connections are reused; spreading 4 transfers over 8 lanes measured
 * more CPU in all, bench/results/threads.md): 0, 1 (not a lane op: the
 * caller's loop runs it) or negative errno (op not started). */
static int
lane_submit(struct spot_s3_op *op)
{
  struct spot_s3 *s3 = op->s3;
  const struct spot_creds *creds = NULL;
  struct lane *l = NULL;
  unsigned n;
  int r;

  if (!lane_wanted(op))
    return 1;
  if (s3->lanes == NULL && lanes_start(s3) < 0)
    return 1;
  n = s3->nlanes;
  for (unsigned i = 0; i < n; i++)
    if (l == NULL || s3->lanes[i].load < l->load)
      l = &s3->lanes[i];
  if (l == NULL)
    return 1;
  r = creds_get(op, &creds);
  if (r < 0)
    return r;
  r = creds_copy(&op->creds, creds);
  if (r < 0)
    return r;
  op->lane = l;
  l->load++;
  if (s3->lane_out++ == 0)
    uv_ref((uv_handle_t *)s3->back);
  set_state(op, OP_SENDING);
  uv_mutex_lock(&s3->lane_mu);
  op->lnext = l->inbox;
  l->inbox = op;
  uv_async_send(&l->wake);
  uv_mutex_unlock(&s3->lane_mu);
  return 0;
}

/* ---- building operations ---------------------------------------------- */

static bool
valid_bucket(const char *b)
{
  size_t n = b != NULL ? strlen(b) : 0;

  if (n < 3 || n > 63)
    return false;
  for (size_t i = 0; i < n; i++)
    if (!((b[i] >= 'a' && b[i] <= 'z') || (b[i] >= 'A' && b[i] <= 'Z') ||
          (b[i] >= '0' && b[i] <= '9') || b[i] == '-' || b[i] == '.' ||
          b[i] == '_'))
      return false;
  return true;
}

static bool
valid_key(const char *k)
{
  size_t n = k != NULL ? strlen(k) : 0;

  return n > 0 && n <= KEY_MAX;
}

/* Builds the op and its URL (query already canonical: sorted, encoded). */
static int
op_new(struct spot_s3 *s3, enum op_kind kind, const char *bucket,
       const char *key, const char *query, spot_s3_cb cb, void *cbdata,
       struct spot_s3_op **out)
{
  struct spot_s3_op *op;
  int r;

  if (s3 == NULL || cb == NULL)
    return -EINVAL;
  if (s3->freeing)
    return -ESHUTDOWN;
  if (!valid_bucket(bucket)) {
    log_err("s3: invalid bucket name \"%s\"", bucket != NULL ? bucket : "");
    return -EINVAL;
  }
  if (key != NULL && !valid_key(key))
    return -EINVAL;
  op = calloc(1, sizeof(*op));
  if (op == NULL)
    return -ENOMEM;
  op->s3 = s3;
  op->kind = kind;
  op->state = OP_INIT; /* initial state */
  op->id = ++s3->next_id;
  op->cb = cb;
  op->cbdata = cbdata;
  memcpy(op->payload_hash, SPOT__SHA256_EMPTY, sizeof(op->payload_hash));
  spot_buf_init(&op->url, URL_CAP);
  spot_buf_init(&op->resp, SPOT__S3_XML_CAP);
  op->bucket = strdup(bucket);
  op->key = strdup(key != NULL ? key : "");
  op->easy = curl_easy_init();
  if (op->bucket == NULL || op->key == NULL || op->easy == NULL) {
    r = -ENOMEM;
    goto fail;
  }
  if (s3->path_style)
    r = spot_buf_printf(&op->url, "%s://%s/%s%s", s3->scheme, s3->hostport,
                        bucket, key != NULL ? "/" : "");
  else
    r = spot_buf_printf(&op->url, "%s://%s.%s/", s3->scheme, bucket,
                        s3->hostport);
  if (r == 0 && key != NULL)
    r = spot_s3_uri_encode(key, true, &op->url);
  if (r == 0 && query != NULL && query[0] != '\0')
    r = spot_buf_printf(&op->url, "?%s", query);
  if (r < 0)
    goto fail;
  r = uv_timer_init(s3->loop, &op->timer);
  if (r < 0)
    goto fail;
  op->timer.data = op;
  *out = op;
  return 0;
fail:
  curl_easy_cleanup(op->easy);
  spot_buf_fini(&op->url);
  spot_buf_fini(&op->resp);
  free(op->bucket);
  free(op->key);
  free(op);
  return r;
}

/* First attempt; on failure the op is destroyed and cb never runs. */
static int
op_start(struct spot_s3_op *op, struct spot_s3_op **out)
{
  struct spot_s3 *s3 = op->s3;
  int r;

  if (op->upload && op->body_len <= PAYLOAD_HASH_MAX)
    spot__sha256_hex(op->body_len > 0 ? op->body : "", op->body_len,
                     op->payload_hash);
  else if (op->upload)
    spot_strlcpy(op->payload_hash, "UNSIGNED-PAYLOAD",
                 sizeof(op->payload_hash));
  r = lane_submit(op);
  if (r == 1)
    r = attempt(op);
  if (r < 0) {
    log_debug("s3: %s s3://%s/%s: cannot start: %s", kinds[op->kind].name,
              op->bucket, op->key, strerror(-r));
    op->s3 = NULL;
    op_destroy(op);
    return r;
  }
  op->next = s3->ops;
  if (s3->ops != NULL)
    s3->ops->prev = op;
  s3->ops = op;
  if (out != NULL)
    *out = op;
  return 0;
}

/* op_new() for an operation on one object (a NULL key is the empty one). */
static int
object_op_new(struct spot_s3 *s3, enum op_kind kind, const char *bucket,
              const char *key, const char *query, spot_s3_cb cb, void *cbdata,
              struct spot_s3_op **out)
{
  return op_new(s3, kind, bucket, key != NULL ? key : "", query, cb, cbdata,
                out);
}

/* Hands the XML body built in body to o as its upload body (body is left
 * empty). On -ENOMEM o is destroyed. */
static int
own_body(struct spot_s3_op *o, struct spot_buf *body)
{
  o->upload = true;
  o->body_len = body->len;
  o->owned_body = spot_buf_steal(body);
  o->body = o->owned_body;
  spot_buf_fini(body);
  if (o->owned_body == NULL) {
    o->s3 = NULL;
    op_destroy(o);
    return -ENOMEM;
  }
  return 0;
}

static int
query_upload_id(const char *upload_id, int part, struct spot_buf *q)
{
  int r = 0;

  if (upload_id == NULL || upload_id[0] == '\0' ||
      strlen(upload_id) > UPLOAD_ID_MAX)
    return -EINVAL;
  if (part > 0)
    r = spot_buf_printf(q, "partNumber=%d&", part);
  if (r == 0)
    r = spot_buf_appends(q, "uploadId=");
  if (r == 0)
    r = spot_s3_uri_encode(upload_id, false, q);
  return r;
}

int
spot_s3_put(struct spot_s3 *s3, const char *bucket, const char *key,
            const void *data, size_t len, unsigned flags, spot_s3_cb cb,
            void *cbdata, struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  int r;

  if (data == NULL && len > 0)
    return -EINVAL;
  r = object_op_new(s3, OP_PUT, bucket, key, NULL, cb, cbdata, &o);
  if (r != 0)
    return r;
  o->upload = true;
  o->body = data;
  o->body_len = len;
  o->flags = flags;
  return op_start(o, op);
}

static bool
meta_text_ok(const char *s, size_t max)
{
  size_t n = strlen(s);

  if (n == 0 || n > max)
    return false;
  for (; *s != '\0'; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
      return false;
  return true;
}

/* Both or neither, printable, a name without ':'. */
static bool
meta_ok(const char *name, const char *value)
{
  if ((name != NULL) != (value != NULL))
    return false;
  return name == NULL || (meta_text_ok(name, 64) && strchr(name, ':') == NULL &&
                          meta_text_ok(value, 200));
}

int
spot_s3_put_ex(struct spot_s3 *s3, const char *bucket, const char *key,
               const void *data, size_t len,
               const struct spot_s3_put_opts *opts, spot_s3_cb cb, void *cbdata,
               struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  int r;

  if ((data == NULL && len > 0) || opts == NULL)
    return -EINVAL;
  if (opts->if_match != NULL && !meta_text_ok(opts->if_match, 150))
    return -EINVAL;
  if (!meta_ok(opts->meta_name, opts->meta_value) ||
      !meta_ok(opts->meta2_name, opts->meta2_value))
    return -EINVAL;
  r = object_op_new(s3, OP_PUT, bucket, key, NULL, cb, cbdata, &o);
  if (r != 0)
    return r;
  o->upload = true;
  o->body = data;
  o->body_len = len;
  o->flags = opts->flags;
  if (opts->if_match != NULL)
    copy_str(o->if_match, sizeof(o->if_match), opts->if_match);
  if (opts->meta_name != NULL)
    snprintf(o->meta_hdr, sizeof(o->meta_hdr), "x-amz-meta-%s: %s",
             opts->meta_name, opts->meta_value);
  if (opts->meta2_name != NULL)
    snprintf(o->meta2_hdr, sizeof(o->meta2_hdr), "x-amz-meta-%s: %s",
             opts->meta2_name, opts->meta2_value);
  return op_start(o, op);
}

bool
spot_s3_if_match_unquoted(const struct spot_s3 *s3)
{
  return s3 != NULL && s3->if_match_unquoted;
}

void
spot_s3_set_if_match_unquoted(struct spot_s3 *s3, bool unquoted)
{
  if (s3 != NULL)
    s3->if_match_unquoted = unquoted;
}

int
spot_s3_meta_get(const char *meta, const char *name, char *out, size_t size)
{
  size_t nl = strlen(name);

  for (const char *p = meta; p != NULL && *p != '\0';) {
    const char *eol = strchr(p, '\n');
    size_t len = eol != NULL ? (size_t)(eol - p) : strlen(p);

    if (len > 11 + nl + 2 && strncasecmp(p, "x-amz-meta-", 11) == 0 &&
        strncasecmp(p + 11, name, nl) == 0 && p[11 + nl] == ':') {
      const char *v = p + 11 + nl + 1;
      size_t vl;

      while (*v == ' ')
        v++;
      vl = len - (size_t)(v - p);
      if (vl + 1 > size)
        return -E2BIG;
      memcpy(out, v, vl);
      out[vl] = '\0';
      return 0;
    }
    p = eol != NULL ? eol + 1 : NULL;
  }
  return -ENOENT;
}

int
spot_s3_get(struct spot_s3 *s3, const char *bucket, const char *key,
            uint64_t off, uint64_t len, spot_s3_sink_cb sink,
            struct spot_buf *into, spot_s3_cb cb, void *cbdata,
            struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  int r;

  if ((sink == NULL) == (into == NULL))
    return -EINVAL;
  if (len > 0 && off + len < off)
    return -EINVAL;
  r = object_op_new(s3, OP_GET, bucket, key, NULL, cb, cbdata, &o);
  if (r != 0)
    return r;
  o->off = off;
  o->len = len;
  o->sink = sink;
  o->into = into;
  return op_start(o, op);
}

int
spot_s3_head(struct spot_s3 *s3, const char *bucket, const char *key,
             spot_s3_cb cb, void *cbdata, struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  int r;

  r = object_op_new(s3, OP_HEAD, bucket, key, NULL, cb, cbdata, &o);
  if (r != 0)
    return r;
  return op_start(o, op);
}

static int
add_param(struct spot_buf *q, const char *name, const char *value)
{
  int r = spot_buf_printf(q, "%s%s=", q->len > 0 ? "&" : "", name);

  if (r == 0 && value != NULL)
    r = spot_s3_uri_encode(value, false, q);
  return r;
}

int
spot__s3_list_query(const char *prefix, const char *delimiter,
                    const char *token, unsigned max_keys, struct spot_buf *q)
{
  char mk[16];
  int r = 0;

  /* names in sorted order: continuation-token, delimiter, list-type,
   * max-keys, prefix */
  if (token != NULL && token[0] != '\0')
    r = add_param(q, "continuation-token", token);
  if (r == 0 && delimiter != NULL && delimiter[0] != '\0')
    r = add_param(q, "delimiter", delimiter);
  if (r == 0)
    r = add_param(q, "list-type", "2");
  if (r == 0 && max_keys > 0) {
    snprintf(mk, sizeof(mk), "%u", max_keys);
    r = add_param(q, "max-keys", mk);
  }
  if (r == 0 && prefix != NULL && prefix[0] != '\0')
    r = add_param(q, "prefix", prefix);
  return r;
}

int
spot_s3_list(struct spot_s3 *s3, const char *bucket, const char *prefix,
             const char *delimiter, const char *token, unsigned max_keys,
             spot_s3_cb cb, void *cbdata, struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  struct spot_buf q;
  int r;

  spot_buf_init(&q, URL_CAP);
  r = spot__s3_list_query(prefix, delimiter, token, max_keys, &q);
  if (r == 0)
    r = op_new(s3, OP_LIST, bucket, NULL, spot_buf_str(&q), cb, cbdata, &o);
  spot_buf_fini(&q);
  if (r != 0)
    return r;
  return op_start(o, op);
}

static void
md5_base64(const void *p, size_t n, char out[32])
{
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;

  out[0] = '\0';
  if (EVP_Digest(p, n, md, &len, EVP_md5(), NULL) == 1 && len == 16)
    EVP_EncodeBlock((unsigned char *)out, md, 16); /* 24 chars + NUL */
}

int
spot_s3_delete_objects(struct spot_s3 *s3, const char *bucket,
                       const char *const *keys, size_t n, spot_s3_cb cb,
                       void *cbdata, struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  struct spot_buf body;
  int r;

  if (n == 0 || n > MAX_DELETE || keys == NULL)
    return -EINVAL;
  spot_buf_init(&body, BODY_CAP);
  r = spot_buf_appends(&body, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>"
                              "<Delete><Quiet>true</Quiet>");
  for (size_t i = 0; r == 0 && i < n; i++) {
    if (!valid_key(keys[i])) {
      r = -EINVAL;
      break;
    }
    r = spot_buf_appends(&body, "<Object><Key>");
    if (r == 0)
      r = spot__xml_escape(keys[i], &body);
    if (r == 0)
      r = spot_buf_appends(&body, "</Key></Object>");
  }
  if (r == 0)
    r = spot_buf_appends(&body, "</Delete>");
  if (r == 0)
    r = op_new(s3, OP_DELETE_OBJECTS, bucket, NULL, "delete=", cb, cbdata, &o);
  if (r != 0) {
    spot_buf_fini(&body);
    return r;
  }
  r = own_body(o, &body);
  if (r < 0)
    return r;
  md5_base64(o->body, o->body_len, o->content_md5);
  return op_start(o, op);
}

int
spot_s3_mpu_create(struct spot_s3 *s3, const char *bucket, const char *key,
                   spot_s3_cb cb, void *cbdata, struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  int r;

  r = object_op_new(s3, OP_MPU_CREATE, bucket, key, "uploads=", cb, cbdata, &o);
  if (r != 0)
    return r;
  o->upload = true; /* POST with an empty body and Content-Length: 0 */
  o->body = "";
  return op_start(o, op);
}

int
spot_s3_mpu_part(struct spot_s3 *s3, const char *bucket, const char *key,
                 const char *upload_id, int part_number, const void *data,
                 size_t len, spot_s3_cb cb, void *cbdata,
                 struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  struct spot_buf q;
  int r;

  if (part_number < 1 || part_number > MAX_PARTS || (data == NULL && len > 0))
    return -EINVAL;
  spot_buf_init(&q, URL_CAP);
  r = query_upload_id(upload_id, part_number, &q);
  if (r == 0)
    r = object_op_new(s3, OP_MPU_PART, bucket, key, spot_buf_str(&q), cb,
                      cbdata, &o);
  spot_buf_fini(&q);
  if (r != 0)
    return r;
  o->upload = true;
  o->body = data;
  o->body_len = len;
  return op_start(o, op);
}

int
spot_s3_mpu_complete(struct spot_s3 *s3, const char *bucket, const char *key,
                     const char *upload_id,
                     const struct spot_s3_part_info *parts, size_t n,
                     spot_s3_cb cb, void *cbdata, struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  struct spot_buf q, body;
  int r;

  if (parts == NULL || n == 0 || n > MAX_PARTS)
    return -EINVAL;
  spot_buf_init(&q, URL_CAP);
  spot_buf_init(&body, BODY_CAP);
  r = query_upload_id(upload_id, 0, &q);
  if (r == 0)
    r = spot_buf_appends(&body, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>"
                                "<CompleteMultipartUpload>");
  for (size_t i = 0; r == 0 && i < n; i++) {
    if (parts[i].number < 1 || parts[i].number > MAX_PARTS ||
        (i > 0 && parts[i].number <= parts[i - 1].number)) {
      r = -EINVAL; /* S3 wants them ascending */
      break;
    }
    r = spot_buf_printf(&body, "<Part><PartNumber>%d</PartNumber><ETag>",
                        parts[i].number);
    if (r == 0)
      r = spot__xml_escape(parts[i].etag, &body);
    if (r == 0)
      r = spot_buf_appends(&body, "</ETag></Part>");
  }
  if (r == 0)
    r = spot_buf_appends(&body, "</CompleteMultipartUpload>");
  if (r == 0)
    r = object_op_new(s3, OP_MPU_COMPLETE, bucket, key, spot_buf_str(&q), cb,
                      cbdata, &o);
  spot_buf_fini(&q);
  if (r != 0) {
    spot_buf_fini(&body);
    return r;
  }
  r = own_body(o, &body);
  if (r < 0)
    return r;
  return op_start(o, op);
}

static int
upload_id_op(struct spot_s3 *s3, enum op_kind kind, const char *bucket,
             const char *key, const char *upload_id, spot_s3_cb cb,
             void *cbdata, struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  struct spot_buf q;
  int r;

  spot_buf_init(&q, URL_CAP);
  r = query_upload_id(upload_id, 0, &q);
  if (r == 0)
    r = object_op_new(s3, kind, bucket, key, spot_buf_str(&q), cb, cbdata, &o);
  spot_buf_fini(&q);
  if (r != 0)
    return r;
  return op_start(o, op);
}

int
spot_s3_mpu_abort(struct spot_s3 *s3, const char *bucket, const char *key,
                  const char *upload_id, spot_s3_cb cb, void *cbdata,
                  struct spot_s3_op **op)
{
  return upload_id_op(s3, OP_MPU_ABORT, bucket, key, upload_id, cb, cbdata, op);
}

int
spot_s3_mpu_list_parts(struct spot_s3 *s3, const char *bucket, const char *key,
                       const char *upload_id, spot_s3_cb cb, void *cbdata,
                       struct spot_s3_op **op)
{
  return upload_id_op(s3, OP_MPU_LIST_PARTS, bucket, key, upload_id, cb, cbdata,
                      op);
}

int
spot_s3_list_uploads(struct spot_s3 *s3, const char *bucket, const char *prefix,
                     spot_s3_cb cb, void *cbdata, struct spot_s3_op **op)
{
  struct spot_s3_op *o;
  struct spot_buf q;
  int r = 0;

  spot_buf_init(&q, URL_CAP);
  if (prefix != NULL && prefix[0] != '\0')
    r = add_param(&q, "prefix", prefix);
  if (r == 0)
    r = add_param(&q, "uploads", "");
  if (r == 0)
    r = op_new(s3, OP_LIST_UPLOADS, bucket, NULL, spot_buf_str(&q), cb, cbdata,
               &o);
  spot_buf_fini(&q);
  if (r != 0)
    return r;
  return op_start(o, op);
}

/* ---- cancel and free ------------------------------------------------- */

void
spot_s3_cancel(struct spot_s3_op *op)
{
  if (op == NULL)
    return;
  if (op->lane != NULL) {
    /* The lane stops it and hands it back; finish() runs from the loop. */
    uv_mutex_lock(&op->s3->lane_mu);
    if (!op->lane_cancel) {
      op->lane_cancel = true;
      uv_async_send(&op->lane->wake);
    }
    uv_mutex_unlock(&op->s3->lane_mu);
    return;
  }
  switch (op->state) {
  case OP_SENDING:
    op->cancelled = true;
    /* done_cb runs inside and only queues the callback */
    spot_http_cancel(op->s3->http, op->easy);
    queue_cancelled(op); /* in case http no longer knew the transfer */
    break;
  case OP_BACKOFF:
    queue_cancelled(op);
    break;
  case OP_INIT:
  case OP_CANCELLED:
  case OP_DONE:
  case OP_STATE_LAST:
    break;
  }
}

void
spot_s3_free(struct spot_s3 *s3)
{
  struct spot_s3_op *op;

  if (s3 == NULL)
    return;
  s3->freeing = true;
  if (s3->back_gone != NULL)
    *s3->back_gone = true;
  /* Ops on lanes come back first: each lane stops its transfers, and this
   * thread waits until every one is handed back (the lanes need nothing
   * of this loop for that). */
  if (s3->lanes != NULL) {
    uv_mutex_lock(&s3->lane_mu);
    for (op = s3->ops; op != NULL; op = op->next)
      if (op->lane != NULL && !op->lane_cancel) {
        op->lane_cancel = true;
        uv_async_send(&op->lane->wake);
      }
    for (;;) {
      unsigned back = 0;

      for (struct spot_s3_op *b = s3->back_list; b != NULL; b = b->lnext)
        back++;
      if (back == s3->lane_out)
        break;
      uv_cond_wait(&s3->lane_cond, &s3->lane_mu);
    }
    for (unsigned i = 0; i < s3->nlanes; i++) {
      s3->lanes[i].stop = true;
      uv_async_send(&s3->lanes[i].wake);
    }
    s3->back_list = NULL; /* all still listed in s3->ops */
    uv_mutex_unlock(&s3->lane_mu);
    for (unsigned i = 0; i < s3->nlanes; i++)
      uv_thread_join(&s3->lanes[i].thread);
    free(s3->lanes);
    s3->lanes = NULL;
    s3->nlanes = 0;
    s3->lane_out = 0;
    uv_close((uv_handle_t *)s3->back, back_closed_cb);
    s3->back = NULL;
  }
  /* The one exception to "from the loop": the ops cannot outlive s3 and
   * the loop may not turn again, so their callbacks run here. One may
   * cancel others; those are still listed and end here too. */
  while ((op = s3->ops) != NULL) {
    if (op->lane == NULL)
      spot_s3_cancel(op);
    uv_timer_stop(&op->timer);
    finish(op, -ECANCELED);
  }
  if (s3->lane_sync) {
    uv_cond_destroy(&s3->lane_cond);
    uv_mutex_destroy(&s3->lane_mu);
  }
  free(s3->scheme);
  free(s3->hostport);
  free(s3->region);
  free(s3->sigv4);
  free(s3);
}
