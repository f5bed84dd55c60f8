/* What the cloud relaunch backends share. Client style: blocking calls
 * that run the loop until their operation ends. */
#include "relaunch_cloud.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/log.h"
#include "core/s3url.h"
#include "core/util.h"
#include "spotctl.h"

#define DEFAULT_TIMEOUT_MS 60000
#define DEADLINE_MARGIN_MS 5000
#define MIN_TIMEOUT_MS 5000
#define RECORD_NAME "relaunch.json"

void
relaunch_say(const char *fmt, ...)
{
  struct timespec ts;
  struct tm tm;
  char when[32] = "?", msg[SPOTCTL_ESC_MAX];
  va_list ap;

  clock_gettime(CLOCK_REALTIME, &ts);
  if (gmtime_r(&ts.tv_sec, &tm) != NULL) {
    size_t n = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof(when) - n, ".%03ldZ", ts.tv_nsec / 1000000);
  }
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  /* names and messages from EC2 and GCE: one escaped line (spotd copies
   * this output into its own log) */
  fprintf(stderr, "spotctl relaunch %s: %s\n", when, spotctl_esc(msg));
}

int
relaunch_read_env(const char **job, const char **store, const char **ckpt,
                  const char **reason, const char **deadline,
                  int64_t *deadline_ms)
{
  static const char *const names[] = {"SPOTD_JOB", "SPOTD_STORE",
                                      "SPOTD_CHECKPOINT", "SPOTD_REASON",
                                      "SPOTD_DEADLINE"};
  const char **vals[] = {job, store, ckpt, reason, deadline};

  for (size_t i = 0; i < SPOT_ARRAY_SIZE(names); i++) {
    const char *v = getenv(names[i]);
    bool may_be_empty = i == 2 || i == 4;

    if (v == NULL || (!may_be_empty && v[0] == '\0'))
      return spotctl_fail("relaunch: %s is %s (spotd sets SPOTD_JOB, "
                          "SPOTD_STORE, SPOTD_CHECKPOINT, SPOTD_REASON and "
                          "SPOTD_DEADLINE for its relaunch step; set them "
                          "to run it by hand)",
                          names[i], v == NULL ? "not set" : "empty");
    *vals[i] = v;
  }
  if ((*deadline)[0] != '\0' && spot_rfc3339_parse(*deadline, deadline_ms) < 0)
    return spotctl_fail("relaunch: SPOTD_DEADLINE '%s' is not an RFC 3339 "
                        "time",
                        *deadline);
  return 0;
}

int
cloud_read_env(struct cloud *c)
{
  char err[256], *job = NULL;
  size_t plen;
  int r;

  r = relaunch_read_env(&c->job, &c->store_url, &c->ckpt, &c->reason,
                        &c->deadline, &c->deadline_ms);
  if (r != 0)
    return r;
  if (spot_s3_url_parse_job(c->store_url, &c->bucket, &c->prefix, &job, err,
                            sizeof(err)) < 0)
    return spotctl_fail("relaunch: SPOTD_STORE: %s", err);
  if (strcmp(job, c->job) != 0) {
    free(job);
    return spotctl_fail("relaunch: SPOTD_STORE '%s' does not end with the "
                        "job '%s'",
                        c->store_url, c->job);
  }
  free(job);
  /* the store of the new node: the job root without "/JOB" */
  plen = strlen(c->store_url) - strlen(c->job) - 1;
  if (plen >= sizeof(c->store))
    return spotctl_fail("relaunch: SPOTD_STORE is too long");
  memcpy(c->store, c->store_url, plen);
  c->store[plen] = '\0';
  return 0;
}

uint64_t
cloud_ms_left(const struct cloud *c)
{
  uint64_t now = spot_now_mono_ms();

  return c->end_mono > now ? c->end_mono - now : 0;
}

static uint64_t
budget_ms(const struct cloud *c)
{
  int64_t left;

  if (c->timeout_s > 0)
    return (uint64_t)c->timeout_s * 1000;
  if (c->deadline_ms == 0)
    return DEFAULT_TIMEOUT_MS;
  left = c->deadline_ms - spot_now_wall_ms() - DEADLINE_MARGIN_MS;
  return left > MIN_TIMEOUT_MS ? (uint64_t)left : MIN_TIMEOUT_MS;
}

int
cloud_parse_num(const char *opt, const char *v, int64_t min, int64_t max,
                int64_t *out)
{
  if (spot_parse_int64(v, min, max, out) < 0)
    return spotctl_usage("relaunch: %s: expected %" PRId64 " to %" PRId64
                         ", got '%s'",
                         opt, min, max, v);
  return 0;
}

int
cloud_option(struct cloud *c, int opt, const char *arg)
{
  switch (opt) {
  case CLOUD_OPT_BACKEND:
    return 0;
  case CLOUD_OPT_FAILED_TTL:
    return cloud_parse_num("--failed-ttl", arg, 0, 30 * 86400,
                           &c->failed_ttl_s);
  case CLOUD_OPT_METADATA_URL:
    c->metadata_url = arg;
    return 0;
  case CLOUD_OPT_ENDPOINT:
    c->s3_endpoint = arg;
    return 0;
  case CLOUD_OPT_REGION:
    c->region = arg;
    return 0;
  case CLOUD_OPT_NO_RECORD:
    c->no_record = true;
    return 0;
  case CLOUD_OPT_TIMEOUT:
    return cloud_parse_num("--timeout", arg, 1, 86400, &c->timeout_s);
  case CLOUD_OPT_DRY_RUN:
    c->dry_run = true;
    return 0;
  default:
    return 1;
  }
}

int
cloud_open(struct cloud *c, bool with_aws)
{
  struct spotctl_s3_options so;
  char err[600];

  c->end_mono = spot_now_mono_ms() + budget_ms(c);
  if (spotctl_s3_open_loop(&c->conn, err, sizeof(err)) < 0)
    return spotctl_fail("relaunch: %s", err);
  if (!with_aws)
    return 0;
  memset(&so, 0, sizeof(so));
  so.endpoint = c->s3_endpoint;
  so.region = c->region;
  so.imds_url = c->metadata_url;
  so.max_retries = 2;
  if (spotctl_s3_open_aws(&c->conn, &so, err, sizeof(err)) == 0)
    return 0;
  if (c->conn.aws_failed && c->aws_optional) {
    relaunch_say("warning: no store credentials (%s): the relaunch record is "
                 "not used",
                 err);
    c->no_record = true;
    return 0;
  }
  return spotctl_fail("relaunch: %s", err);
}

void
cloud_close(struct cloud *c)
{
  spotctl_s3_close(&c->conn);
  free(c->bucket);
  free(c->prefix);
  c->bucket = c->prefix = NULL;
}

int
cloud_key(const struct cloud *c, char *buf, size_t size)
{
  return spot_ec2_client_token(c->job, c->ckpt, c->reason, 0, buf, size);
}

/* ---- the record ---- */

struct s3_wait {
  bool done;
  int err;
  char msg[300];
};

static void
s3_cb(const struct spot_s3_result *res, void *data)
{
  struct s3_wait *w = data;

  w->err = res->err;
  if (res->err < 0)
    spot_s3_strerror(res, w->msg, sizeof(w->msg));
  w->done = true;
}

static void
record_key(const struct cloud *c, char *buf, size_t size)
{
  snprintf(buf, size, "%s%s%s/" RECORD_NAME, c->prefix, c->prefix[0] ? "/" : "",
           c->job);
}

void
cloud_record_load(struct cloud *c)
{
  struct s3_wait w;
  struct spot_buf body;
  char key[512], err[256];
  int r;

  memset(&c->rec, 0, sizeof(c->rec));
  if (c->no_record || c->conn.s3 == NULL)
    return;
  record_key(c, key, sizeof(key));
  memset(&w, 0, sizeof(w));
  spot_buf_init(&body, SPOT_RELAUNCH_RECORD_MAX);
  r = spot_s3_get(c->conn.s3, c->bucket, key, 0, 0, NULL, &body, s3_cb, &w,
                  NULL);
  if (r == 0)
    while (!w.done && uv_run(&c->conn.loop, UV_RUN_ONCE) != 0)
      ;
  if (r < 0 || (w.err < 0 && w.err != -ENOENT)) {
    relaunch_say("warning: cannot read the relaunch record s3://%s/%s: %s",
                 c->bucket, key, r < 0 ? strerror(-r) : w.msg);
  } else if (w.err == 0 && spot_relaunch_record_parse(
                               body.data != NULL ? body.data : "", body.len,
                               &c->rec, err, sizeof(err)) < 0) {
    relaunch_say("warning: the relaunch record s3://%s/%s is not valid (%s): "
                 "starting a new one",
                 c->bucket, key, err);
  }
  c->rec_loaded = r == 0 && (w.err == 0 || w.err == -ENOENT);
  spot_buf_fini(&body);
}

void
cloud_record_save(struct cloud *c)
{
  struct s3_wait w;
  struct spot_buf body;
  char key[512];
  int r;

  if (c->no_record || c->conn.s3 == NULL)
    return;
  record_key(c, key, sizeof(key));
  memset(&w, 0, sizeof(w));
  spot_buf_init(&body, SPOT_RELAUNCH_RECORD_MAX);
  r = spot_relaunch_record_format(&c->rec, &body);
  if (r == 0)
    r = spot_s3_put(c->conn.s3, c->bucket, key, body.data, body.len, 0, s3_cb,
                    &w, NULL);
  if (r == 0)
    while (!w.done && uv_run(&c->conn.loop, UV_RUN_ONCE) != 0)
      ;
  if (r < 0 || w.err < 0)
    relaunch_say("warning: cannot write the relaunch record s3://%s/%s: %s",
                 c->bucket, key, r < 0 ? strerror(-r) : w.msg);
  spot_buf_fini(&body);
}

int
spotctl_relaunch_cloud_backend(int argc, char **argv)
{
  for (int i = 1; i < argc && argv[i] != NULL; i++) {
    const char *b = NULL;

    if (strcmp(argv[i], "--") == 0)
      break;
    if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
      b = argv[i + 1];
    else if (strncmp(argv[i], "--backend=", 10) == 0)
      b = argv[i] + 10;
    if (b != NULL && strcmp(b, "aws") == 0)
      return 1;
    if (b != NULL && strcmp(b, "gcp") == 0)
      return 2;
  }
  return 0;
}
