/* spotd-emulate: a local metadata service for AWS, GCP or Azure, to
 * rehearse a preemption (like AWS's ec2-metadata-mock) and to test spotd.
 * Its own executable, so the client installed on every training node
 * carries no HTTP server and spawns no shell; `spotctl emulate` execs it.
 *
 * libmicrohttpd with one thread per connection, so a GCP long poll or a
 * stall simply blocks its own thread on the condition variable. All the
 * state is behind one mutex; events are scheduled on the monotonic clock
 * and rendered lazily, with wall-clock times fixed when scheduled (so a
 * body never changes between two polls unless the event did).
 *
 * Runtime control on the same port, under /__emulate/ (no provider path
 * starts with "__"); parameters in the query string, method POST:
 *   /__emulate/notice?after=S&deadline=S&action=A&resource=VM
 *   /__emulate/rebalance?after=S
 *   /__emulate/maintenance?after=S&deadline=S&cancel_after=S&cancelled=1
 *   /__emulate/cancel[?notice=1]     cancel the maintenance (and notice)
 *   /__emulate/fault?throttle=F&stall=S&stall_fraction=F&reset=F&
 *                    malformed=F&token_expire=S&clear=1
 *   /__emulate/lifecycle?state=Terminated
 *   GET /__emulate/state             JSON: acks, incarnation, requests,
 *                                    tokens (the IMDSv2 tokens issued) */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include <jansson.h>
#include <microhttpd.h>

#include "core/log.h"
#include "core/notice.h"
#include "core/util.h"
#include "emulate_cloud.h"
#include "spot-config.h"

#define UPLOAD_MAX (16 * 1024)
#define TOKENS_MAX 64
#define LONG_POLL_MAX_S 3600
#define ACKS_MAX 32

struct emu_token {
  char value[64];
  uint64_t issued; /* mono ms */
  unsigned ttl_s;
};

struct emu {
  enum spot_provider provider;
  pthread_mutex_t mu;
  pthread_cond_t cond;
  bool stopping;
  bool imdsv2_required;
  /* the notice: visible from notice_at (mono ms, 0 = none) */
  uint64_t notice_at;
  int64_t notice_wall;          /* when it became visible */
  int64_t notice_deadline_wall; /* the action time / NotBefore */
  unsigned notice_deadline_s;   /* default gap between notice and deadline */
  char action[16];
  char notice_resource[128];
  unsigned notice_seq;
  bool notice_started; /* Azure: acknowledged */
  /* rebalance recommendation */
  uint64_t rebalance_at;
  int64_t rebalance_wall;
  /* maintenance */
  uint64_t maint_at, maint_cancel_at;
  int64_t maint_deadline_wall;
  bool maint_started;
  unsigned maint_seq;
  char lifecycle[32];
  /* faults */
  double throttle, reset, malformed, stall_fraction;
  unsigned stall_s;
  int token_expire_s; /* < 0: off */
  unsigned rnd;
  /* AWS */
  struct emu_token tokens[TOKENS_MAX];
  unsigned next_token;
  char region[32], instance_id[32], role[64];
  char *creds;            /* JSON document, or NULL */
  const char *creds_file; /* re-read on each request (key rotation) */
  unsigned role_expire_s; /* Expiration = serve time + this; 0: 6 h */
  /* Azure */
  char vm_name[128];
  int64_t incarnation;
  char *last_events; /* the Events array last served */
  char acks[ACKS_MAX][64];
  unsigned n_acks;
  unsigned long requests;
};

struct emu_conn {
  char body[UPLOAD_MAX];
  size_t len;
  bool too_big;
};

/* --- small helpers ---------------------------------------------------- */

static uint64_t
deadline_after(uint64_t base, double secs)
{
  return base + (uint64_t)(secs * 1000.0);
}

static bool
chance(struct emu *e, double p)
{
  if (p <= 0)
    return false;
  return (double)rand_r(&e->rnd) / ((double)RAND_MAX + 1.0) < p;
}

/* Waits on the state's condition variable until mono time `until` or
 * stop. Called with the mutex held. */
static void
wait_until(struct emu *e, uint64_t until)
{
  struct timespec ts;
  uint64_t now = spot_now_mono_ms();

  if (until <= now || e->stopping)
    return;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_sec += (time_t)((until - now) / 1000);
  ts.tv_nsec += (long)((until - now) % 1000) * 1000000L;
  if (ts.tv_nsec >= 1000000000L) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000L;
  }
  pthread_cond_timedwait(&e->cond, &e->mu, &ts);
}

static int
reply(struct MHD_Connection *c, unsigned status, const char *type,
      const char *body, const char *h1, const char *v1)
{
  struct MHD_Response *r;
  int ret;

  r = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                      MHD_RESPMEM_MUST_COPY);
  if (r == NULL)
    return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  MHD_add_response_header(r, "Server", "spotd-emulate");
  if (h1 != NULL)
    MHD_add_response_header(r, h1, v1);
  ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

static const char *
hdr(struct MHD_Connection *c, const char *name)
{
  return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

static const char *
arg(struct MHD_Connection *c, const char *name)
{
  return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

static int
parse_secs(const char *s, double *out)
{
  char *end;
  double v;

  if (s == NULL || *s == '\0')
    return -EINVAL;
  errno = 0;
  v = strtod(s, &end);
  if (errno != 0 || *end != '\0' || v < 0 || v > 1e7)
    return -EINVAL;
  *out = v;
  return 0;
}

static int
parse_fraction(const char *s, double *out)
{
  double v;

  if (parse_secs(s, &v) < 0 || v > 1.0)
    return -EINVAL;
  *out = v;
  return 0;
}

static void
fmt_rfc3339(int64_t ms, char *buf, size_t size)
{
  if (spot_rfc3339_format(ms, buf, size) < 0)
    spot_strlcpy(buf, "1970-01-01T00:00:00Z", size);
}

/* --- scheduling (mutex held) ------------------------------------------ */

static void
schedule_notice(struct emu *e, double after, double deadline,
                const char *action, const char *resource)
{
  uint64_t now = spot_now_mono_ms();
  int64_t wall = spot_now_wall_ms();

  e->notice_at = deadline_after(now, after);
  if (e->notice_at == 0)
    e->notice_at = 1;
  e->notice_wall = wall + (int64_t)(after * 1000.0);
  /* whole seconds, like the real services */
  e->notice_deadline_wall =
      ((e->notice_wall + (int64_t)(deadline * 1000.0)) / 1000) * 1000;
  if (action != NULL)
    spot_strlcpy(e->action, action, sizeof(e->action));
  spot_strlcpy(e->notice_resource, resource != NULL ? resource : e->vm_name,
               sizeof(e->notice_resource));
  e->notice_seq++;
  e->notice_started = false;
  pthread_cond_broadcast(&e->cond);
}

static void
schedule_maintenance(struct emu *e, double after, double deadline,
                     double cancel_after, bool cancel)
{
  uint64_t now = spot_now_mono_ms();

  e->maint_at = deadline_after(now, after);
  if (e->maint_at == 0)
    e->maint_at = 1;
  e->maint_deadline_wall =
      ((spot_now_wall_ms() + (int64_t)((after + deadline) * 1000.0)) / 1000) *
      1000;
  e->maint_cancel_at =
      cancel ? e->maint_at
             : (cancel_after > 0 ? deadline_after(now, cancel_after) : 0);
  e->maint_seq++;
  e->maint_started = false;
  pthread_cond_broadcast(&e->cond);
}

static bool
notice_visible(const struct emu *e, uint64_t now)
{
  return e->notice_at != 0 && now >= e->notice_at;
}

static bool
rebalance_visible(const struct emu *e, uint64_t now)
{
  return e->rebalance_at != 0 && now >= e->rebalance_at;
}

static bool
maint_visible(const struct emu *e, uint64_t now)
{
  return e->maint_at != 0 && now >= e->maint_at;
}

static bool
maint_cancelled(const struct emu *e, uint64_t now)
{
  return e->maint_cancel_at != 0 && now >= e->maint_cancel_at;
}

/* The next mono time at which some rendered value changes (0 = never). */
static uint64_t
next_change(const struct emu *e, uint64_t now)
{
  uint64_t t[] = {e->notice_at, e->rebalance_at, e->maint_at,
                  e->maint_cancel_at};
  uint64_t best = 0;

  for (size_t i = 0; i < SPOT_ARRAY_SIZE(t); i++)
    if (t[i] > now && (best == 0 || t[i] < best))
      best = t[i];
  return best;
}

/* --- AWS -------------------------------------------------------------- */

static int load_creds(struct emu *e, const char *file);

static bool
token_valid(struct emu *e, const char *tok, uint64_t now)
{
  for (unsigned i = 0; i < TOKENS_MAX; i++) {
    struct emu_token *t = &e->tokens[i];
    uint64_t life;

    if (t->value[0] == '\0' || strcmp(t->value, tok) != 0)
      continue;
    life = (uint64_t)t->ttl_s * 1000;
    if (e->token_expire_s >= 0 && (uint64_t)e->token_expire_s * 1000 < life)
      life = (uint64_t)e->token_expire_s * 1000;
    return now < t->issued + life;
  }
  return false;
}

static int
aws_token(struct emu *e, struct MHD_Connection *c)
{
  const char *ttl_s = hdr(c, "X-aws-ec2-metadata-token-ttl-seconds");
  unsigned char raw[24];
  struct emu_token *t;
  int64_t ttl;
  char tok[64];

  if (hdr(c, "X-Forwarded-For") != NULL)
    return reply(c, 403, "text/plain", "Forbidden", NULL, NULL);
  if (ttl_s == NULL || spot_parse_int64(ttl_s, 1, 21600, &ttl) < 0)
    return reply(c, 400, "text/plain", "Bad Request", NULL, NULL);
  if (getrandom(raw, sizeof(raw), 0) != (ssize_t)sizeof(raw))
    return reply(c, 500, "text/plain", "Internal Server Error", NULL, NULL);
  for (size_t i = 0; i < sizeof(raw); i++)
    snprintf(tok + 2 * i, 3, "%02x", raw[i]);
  t = &e->tokens[e->next_token];
  e->next_token = (e->next_token + 1) % TOKENS_MAX;
  spot_strlcpy(t->value, tok, sizeof(t->value));
  t->issued = spot_now_mono_ms();
  t->ttl_s = (unsigned)ttl;
  return reply(c, 200, "text/plain", tok,
               "X-aws-ec2-metadata-token-ttl-seconds", ttl_s);
}

static int
aws_get(struct emu *e, struct MHD_Connection *c, const char *path,
        bool malformed)
{
  const char *tok = hdr(c, "X-aws-ec2-metadata-token");
  uint64_t now = spot_now_mono_ms();
  char body[2048], t1[32], t2[32];
  const char *md = "/latest/meta-data/";

  if (tok != NULL ? !token_valid(e, tok, now) : e->imdsv2_required)
    return reply(c, 401, "text/plain", "Unauthorized", NULL, NULL);
  if (strncmp(path, md, strlen(md)) != 0)
    return reply(c, 404, "text/plain", "Not Found", NULL, NULL);
  path += strlen(md);

  if (strcmp(path, "spot/instance-action") == 0) {
    if (!notice_visible(e, now))
      return reply(c, 404, "text/plain", "Not Found", NULL, NULL);
    fmt_rfc3339(e->notice_deadline_wall, t1, sizeof(t1));
    if (malformed)
      return reply(c, 200, "text/plain", "{\"action\": \"termin", NULL, NULL);
    snprintf(body, sizeof(body), "{\"action\": \"%s\", \"time\": \"%s\"}",
             e->action, t1);
    return reply(c, 200, "text/plain", body, NULL, NULL);
  }
  if (strcmp(path, "spot/termination-time") == 0) {
    if (!notice_visible(e, now))
      return reply(c, 404, "text/plain", "Not Found", NULL, NULL);
    fmt_rfc3339(e->notice_deadline_wall, t1, sizeof(t1));
    return reply(c, 200, "text/plain", t1, NULL, NULL);
  }
  if (strcmp(path, "events/recommendations/rebalance") == 0) {
    if (!rebalance_visible(e, now))
      return reply(c, 404, "text/plain", "Not Found", NULL, NULL);
    if (malformed)
      return reply(c, 200, "text/plain", "{\"noticeTime\": ", NULL, NULL);
    fmt_rfc3339(e->rebalance_wall, t1, sizeof(t1));
    snprintf(body, sizeof(body), "{\"noticeTime\": \"%s\"}", t1);
    return reply(c, 200, "text/plain", body, NULL, NULL);
  }
  if (strcmp(path, "events/maintenance/scheduled") == 0) {
    bool cancelled = maint_cancelled(e, now);

    if (malformed)
      return reply(c, 200, "text/plain", "[ {\n  \"NotBefore\" : ", NULL, NULL);
    if (!maint_visible(e, now))
      return reply(c, 200, "text/plain", "[]", NULL, NULL);
    spot_time_format_aws_event(e->maint_deadline_wall, t1, sizeof(t1));
    spot_time_format_aws_event(e->maint_deadline_wall + 1800000, t2,
                               sizeof(t2));
    snprintf(body, sizeof(body),
             "[ {\n  \"NotBefore\" : \"%s\",\n  \"Code\" : \"system-reboot\","
             "\n  \"Description\" : \"%sscheduled reboot\",\n"
             "  \"EventId\" : \"instance-event-%016x\",\n"
             "  \"NotAfter\" : \"%s\",\n  \"State\" : \"%s\"\n} ]",
             t1, cancelled ? "[Canceled] " : "", e->maint_seq, t2,
             cancelled ? "canceled" : "active");
    return reply(c, 200, "text/plain", body, NULL, NULL);
  }
  if (emu_ec2_imds(path, body, sizeof(body)) != NULL)
    return reply(c, 200, "text/plain", body, NULL, NULL);
  if (strcmp(path, "autoscaling/target-lifecycle-state") == 0)
    return reply(c, 200, "text/plain", e->lifecycle, NULL, NULL);
  if (strcmp(path, "instance-id") == 0)
    return reply(c, 200, "text/plain", e->instance_id, NULL, NULL);
  if (strcmp(path, "placement/region") == 0)
    return reply(c, 200, "text/plain", e->region, NULL, NULL);
  if (strcmp(path, "placement/availability-zone") == 0) {
    snprintf(body, sizeof(body), "%sa", e->region);
    return reply(c, 200, "text/plain", body, NULL, NULL);
  }
  if (strcmp(path, "iam/security-credentials/") == 0 ||
      strcmp(path, "iam/security-credentials") == 0) {
    if (e->creds == NULL)
      return reply(c, 404, "text/plain", "Not Found", NULL, NULL);
    return reply(c, 200, "text/plain", e->creds != NULL ? e->role : "", NULL,
                 NULL);
  }
  if (strncmp(path, "iam/security-credentials/", 25) == 0 &&
      strcmp(path + 25, e->role) == 0 && e->creds != NULL) {
    if (e->creds_file != NULL) /* rotated? (keeps the old on error) */
      (void)load_creds(e, e->creds_file);
    return reply(c, 200, "text/plain", e->creds, NULL, NULL);
  }
  return reply(c, 404, "text/plain", "Not Found", NULL, NULL);
}

/* --- GCP -------------------------------------------------------------- */

/* The current value of a GCP key, or NULL for 404. */
static const char *
gcp_value(struct emu *e, const char *key, uint64_t now, char *buf, size_t size)
{
  if (emu_gce_meta(key, buf, size) != NULL)
    return buf;
  if (strcmp(key, "instance/preempted") == 0)
    return notice_visible(e, now) ? "TRUE" : "FALSE";
  if (strcmp(key, "instance/maintenance-event") == 0)
    return maint_visible(e, now) && !maint_cancelled(e, now)
               ? (strcmp(e->action, "terminate") == 0
                      ? "TERMINATE_ON_HOST_MAINTENANCE"
                      : "MIGRATE_ON_HOST_MAINTENANCE")
               : "NONE";
  if (strcmp(key, "instance/id") == 0)
    return "4520031799277581759";
  if (strcmp(key, "instance/name") == 0)
    return e->vm_name;
  if (strcmp(key, "instance/zone") == 0) {
    snprintf(buf, size, "projects/1234567890/zones/%s-a", e->region);
    return buf;
  }
  if (strcmp(key, "project/project-id") == 0)
    return "spotd-emulated";
  return NULL;
}

static void
gcp_etag(const char *value, char *out, size_t size)
{
  uint64_t h = 1469598103934665603ull;

  for (const char *p = value; *p; p++) {
    h ^= (unsigned char)*p;
    h *= 1099511628211ull;
  }
  snprintf(out, size, "%016" PRIx64, h);
}

static int
gcp_get(struct emu *e, struct MHD_Connection *c, const char *path,
        bool malformed)
{
  const char *flavor = hdr(c, "Metadata-Flavor");
  const char *wait = arg(c, "wait_for_change");
  const char *last = arg(c, "last_etag");
  const char *tmo = arg(c, "timeout_sec");
  const char *prefix = "/computeMetadata/v1/";
  uint64_t now = spot_now_mono_ms(), until;
  const char *v;
  char buf[256], etag[32], value[256];
  double t = LONG_POLL_MAX_S;
  struct MHD_Response *r;
  int ret;

  if (flavor == NULL || strcmp(flavor, "Google") != 0 ||
      hdr(c, "X-Forwarded-For") != NULL)
    return reply(c, 403, "text/html",
                 "Missing required header \"Metadata-Flavor\"", NULL, NULL);
  if (strncmp(path, prefix, strlen(prefix)) != 0)
    return reply(c, 404, "text/html", "Not Found", NULL, NULL);
  path += strlen(prefix);
  if (tmo != NULL && (parse_secs(tmo, &t) < 0 || t > LONG_POLL_MAX_S))
    return reply(c, 400, "text/html", "Bad timeout_sec", NULL, NULL);
  until = deadline_after(now, t);

  for (;;) {
    now = spot_now_mono_ms();
    v = gcp_value(e, path, now, buf, sizeof(buf));
    if (v == NULL)
      return reply(c, 404, "text/html", "Not Found", NULL, NULL);
    gcp_etag(v, etag, sizeof(etag));
    if (wait == NULL || strcmp(wait, "true") != 0 || last == NULL ||
        strcmp(last, etag) != 0 || now >= until || e->stopping)
      break;
    {
      uint64_t nc = next_change(e, now);
      wait_until(e, nc != 0 && nc < until ? nc : until);
    }
  }
  spot_strlcpy(value, malformed ? "GARBAGE\x01{" : v, sizeof(value));
  gcp_etag(value, etag, sizeof(etag)); /* the ETag of what is served */
  r = MHD_create_response_from_buffer(strlen(value), value,
                                      MHD_RESPMEM_MUST_COPY);
  if (r == NULL)
    return MHD_NO;
  MHD_add_response_header(r, "Metadata-Flavor", "Google");
  MHD_add_response_header(r, "Content-Type", "application/text");
  MHD_add_response_header(r, "ETag", etag);
  ret = MHD_queue_response(c, 200, r);
  MHD_destroy_response(r);
  return ret;
}

/* --- Azure ------------------------------------------------------------ */

static char *
azure_events(struct emu *e, uint64_t now)
{
  json_t *arr = json_array(), *ev;
  char nb[40], id[64];
  char *s;

  if (arr == NULL)
    return NULL;
  if (notice_visible(e, now)) {
    const char *type = strcmp(e->action, "terminate") == 0  ? "Terminate"
                       : strcmp(e->action, "reboot") == 0   ? "Reboot"
                       : strcmp(e->action, "redeploy") == 0 ? "Redeploy"
                                                            : "Preempt";
    if (e->notice_started)
      nb[0] = '\0';
    else
      spot_time_format_rfc1123(e->notice_deadline_wall, nb, sizeof(nb));
    snprintf(id, sizeof(id), "5C1A0B3D-0000-4000-8000-%012X", e->notice_seq);
    ev = json_pack("{s:s,s:s,s:s,s:s,s:[s],s:s,s:s,s:s,s:i}", "EventId", id,
                   "EventStatus", e->notice_started ? "Started" : "Scheduled",
                   "EventType", type, "ResourceType", "VirtualMachine",
                   "Resources", e->notice_resource, "NotBefore", nb,
                   "Description", "", "EventSource", "Platform",
                   "DurationInSeconds", -1);
    json_array_append_new(arr, ev);
  }
  /* cancelled events are removed from the array, as Azure does */
  if (maint_visible(e, now) && !maint_cancelled(e, now)) {
    if (e->maint_started)
      nb[0] = '\0';
    else
      spot_time_format_rfc1123(e->maint_deadline_wall, nb, sizeof(nb));
    snprintf(id, sizeof(id), "7D2B0C4E-0000-4000-8000-%012X", e->maint_seq);
    ev = json_pack("{s:s,s:s,s:s,s:s,s:[s],s:s,s:s,s:s,s:i}", "EventId", id,
                   "EventStatus", e->maint_started ? "Started" : "Scheduled",
                   "EventType", "Reboot", "ResourceType", "VirtualMachine",
                   "Resources", e->vm_name, "NotBefore", nb, "Description",
                   "Virtual machine is going to be restarted as requested "
                   "by authorized user.",
                   "EventSource", "User", "DurationInSeconds", -1);
    json_array_append_new(arr, ev);
  }
  s = json_dumps(arr, JSON_COMPACT);
  json_decref(arr);
  return s;
}

static int
azure_ack(struct emu *e, struct MHD_Connection *c, const struct emu_conn *u)
{
  json_t *j, *reqs, *r;
  json_error_t err;
  uint64_t now = spot_now_mono_ms();
  char nid[64], mid[64];
  size_t i;
  int found = 0;

  j = json_loadb(u->body, u->len, 0, &err);
  reqs = json_object_get(j, "StartRequests");
  if (j == NULL || !json_is_array(reqs)) {
    json_decref(j);
    return reply(c, 400, "application/json",
                 "{\"error\":\"Bad request. Invalid StartRequests\"}", NULL,
                 NULL);
  }
  snprintf(nid, sizeof(nid), "5C1A0B3D-0000-4000-8000-%012X", e->notice_seq);
  snprintf(mid, sizeof(mid), "7D2B0C4E-0000-4000-8000-%012X", e->maint_seq);
  json_array_foreach(reqs, i, r)
  {
    const char *id = json_string_value(json_object_get(r, "EventId"));

    if (id == NULL)
      continue;
    if (notice_visible(e, now) && strcmp(id, nid) == 0)
      e->notice_started = true, found = 1;
    else if (maint_visible(e, now) && strcmp(id, mid) == 0)
      e->maint_started = true, found = 1;
    else
      continue;
    if (e->n_acks < ACKS_MAX)
      spot_strlcpy(e->acks[e->n_acks++], id, sizeof(e->acks[0]));
    printf("ack EventId=%s\n", id);
    fflush(stdout);
  }
  json_decref(j);
  (void)found;
  pthread_cond_broadcast(&e->cond);
  return reply(c, 200, "application/json", "", NULL, NULL);
}

static int
azure(struct emu *e, struct MHD_Connection *c, const char *method,
      const char *path, const struct emu_conn *u, bool malformed)
{
  const char *md = hdr(c, "Metadata");
  const char *ver = arg(c, "api-version");
  uint64_t now = spot_now_mono_ms();
  char *events, *doc;
  int ret;

  if (md == NULL || strcmp(md, "true") != 0 ||
      hdr(c, "X-Forwarded-For") != NULL)
    return reply(c, 400, "application/json",
                 "{\"error\":\"Bad request. Required metadata header not "
                 "specified\"}",
                 NULL, NULL);
  if (ver == NULL)
    return reply(c, 400, "application/json",
                 "{\"error\":\"Bad request. api-version was not specified "
                 "in the request\"}",
                 NULL, NULL);
  if (strcmp(path, "/metadata/instance/compute/name") == 0)
    return reply(c, 200, "text/plain", e->vm_name, NULL, NULL);
  if (strcmp(path, "/metadata/instance") == 0) {
    char body[512];
    snprintf(body, sizeof(body),
             "{\"compute\":{\"name\":\"%s\",\"location\":\"%s\","
             "\"vmId\":\"02aab8a4-74ef-476e-8182-f6d2ba4166a6\"}}",
             e->vm_name, e->region);
    return reply(c, 200, "application/json", body, NULL, NULL);
  }
  if (strcmp(path, "/metadata/scheduledevents") != 0)
    return reply(c, 404, "application/json", "{\"error\":\"Not found\"}", NULL,
                 NULL);
  if (strcmp(method, "POST") == 0)
    return azure_ack(e, c, u);
  events = azure_events(e, now);
  if (events == NULL)
    return MHD_NO;
  if (e->last_events == NULL || strcmp(events, e->last_events) != 0) {
    e->incarnation++; /* the document changed */
    free(e->last_events);
    e->last_events = events;
  } else {
    free(events);
  }
  if (malformed)
    return reply(c, 200, "application/json", "{\"DocumentIncarnation\":", NULL,
                 NULL);
  if (asprintf(&doc, "{\"DocumentIncarnation\":%" PRId64 ",\"Events\":%s}",
               e->incarnation, e->last_events) < 0)
    return MHD_NO;
  ret = reply(c, 200, "application/json", doc, NULL, NULL);
  free(doc);
  return ret;
}

/* --- control ---------------------------------------------------------- */

static int
control(struct emu *e, struct MHD_Connection *c, const char *method,
        const char *path)
{
  double after = 0, deadline = e->notice_deadline_s, cancel_after = 0, f;
  const char *v;

  if (strcmp(path, "/__emulate/state") == 0) {
    json_t *j = json_pack("{s:s,s:I,s:I,s:[]}", "provider",
                          spot_provider_name(e->provider), "incarnation",
                          (json_int_t)e->incarnation, "requests",
                          (json_int_t)e->requests, "acks");
    char *s;
    int ret;

    for (unsigned i = 0; j != NULL && i < e->n_acks; i++)
      json_array_append_new(json_object_get(j, "acks"),
                            json_string(e->acks[i]));
    /* for tests that scan output for secrets */
    if (j != NULL && json_object_set_new(j, "tokens", json_array()) == 0)
      for (unsigned i = 0; i < TOKENS_MAX; i++)
        if (e->tokens[i].value[0] != '\0')
          json_array_append_new(json_object_get(j, "tokens"),
                                json_string(e->tokens[i].value));
    s = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (s == NULL)
      return MHD_NO;
    ret = reply(c, 200, "application/json", s, NULL, NULL);
    free(s);
    return ret;
  }
  if (strcmp(method, "POST") != 0)
    return reply(c, 405, "text/plain", "use POST\n", NULL, NULL);
  if ((v = arg(c, "after")) != NULL && parse_secs(v, &after) < 0)
    return reply(c, 400, "text/plain", "bad after\n", NULL, NULL);
  if ((v = arg(c, "deadline")) != NULL && parse_secs(v, &deadline) < 0)
    return reply(c, 400, "text/plain", "bad deadline\n", NULL, NULL);
  if ((v = arg(c, "cancel_after")) != NULL && parse_secs(v, &cancel_after) < 0)
    return reply(c, 400, "text/plain", "bad cancel_after\n", NULL, NULL);

  if (strcmp(path, "/__emulate/notice") == 0) {
    const char *action = arg(c, "action");

    if (action != NULL && strlen(action) >= sizeof(e->action))
      return reply(c, 400, "text/plain", "bad action\n", NULL, NULL);
    schedule_notice(e, after, deadline, action, arg(c, "resource"));
  } else if (strcmp(path, "/__emulate/rebalance") == 0) {
    e->rebalance_at = deadline_after(spot_now_mono_ms(), after);
    e->rebalance_wall = spot_now_wall_ms() + (int64_t)(after * 1000.0);
    e->rebalance_wall = e->rebalance_wall / 1000 * 1000;
    pthread_cond_broadcast(&e->cond);
  } else if (strcmp(path, "/__emulate/maintenance") == 0) {
    v = arg(c, "cancelled");
    schedule_maintenance(e, after, deadline, cancel_after,
                         v != NULL && strcmp(v, "1") == 0);
  } else if (strcmp(path, "/__emulate/cancel") == 0) {
    if (e->maint_at != 0)
      e->maint_cancel_at = spot_now_mono_ms();
    v = arg(c, "notice");
    if (v != NULL && strcmp(v, "1") == 0)
      e->notice_at = 0;
    pthread_cond_broadcast(&e->cond);
  } else if (strcmp(path, "/__emulate/lifecycle") == 0) {
    v = arg(c, "state");
    if (v == NULL || strlen(v) >= sizeof(e->lifecycle))
      return reply(c, 400, "text/plain", "bad state\n", NULL, NULL);
    spot_strlcpy(e->lifecycle, v, sizeof(e->lifecycle));
  } else if (strcmp(path, "/__emulate/fault") == 0) {
    v = arg(c, "clear");
    if (v != NULL && strcmp(v, "1") == 0) {
      e->throttle = e->reset = e->malformed = 0;
      e->stall_s = 0;
      e->stall_fraction = 1.0;
      e->token_expire_s = -1;
    }
    if ((v = arg(c, "throttle")) != NULL) {
      if (parse_fraction(v, &f) < 0)
        return reply(c, 400, "text/plain", "bad throttle\n", NULL, NULL);
      e->throttle = f;
    }
    if ((v = arg(c, "reset")) != NULL) {
      if (parse_fraction(v, &f) < 0)
        return reply(c, 400, "text/plain", "bad reset\n", NULL, NULL);
      e->reset = f;
    }
    if ((v = arg(c, "malformed")) != NULL) {
      if (parse_fraction(v, &f) < 0)
        return reply(c, 400, "text/plain", "bad malformed\n", NULL, NULL);
      e->malformed = f;
    }
    if ((v = arg(c, "stall_fraction")) != NULL) {
      if (parse_fraction(v, &f) < 0)
        return reply(c, 400, "text/plain", "bad stall_fraction\n", NULL, NULL);
      e->stall_fraction = f;
    }
    if ((v = arg(c, "stall")) != NULL) {
      if (parse_secs(v, &f) < 0 || f > 3600)
        return reply(c, 400, "text/plain", "bad stall\n", NULL, NULL);
      e->stall_s = (unsigned)f;
    }
    if ((v = arg(c, "token_expire")) != NULL) {
      if (parse_secs(v, &f) < 0 || f > 21600)
        return reply(c, 400, "text/plain", "bad token_expire\n", NULL, NULL);
      e->token_expire_s = (int)f;
    }
  } else {
    return reply(c, 404, "text/plain", "unknown control\n", NULL, NULL);
  }
  return reply(c, 200, "text/plain", "ok\n", NULL, NULL);
}

/* --- dispatch --------------------------------------------------------- */

static enum MHD_Result
handler(void *cls, struct MHD_Connection *c, const char *url,
        const char *method, const char *version, const char *upload,
        size_t *upload_size, void **con_cls)
{
  struct emu *e = cls;
  struct emu_conn *u = *con_cls;
  bool malformed;
  int ret;

  if (u == NULL) {
    u = calloc(1, sizeof(*u));
    if (u == NULL)
      return MHD_NO;
    *con_cls = u;
    return MHD_YES;
  }
  if (*upload_size > 0) {
    if (u->len + *upload_size > sizeof(u->body) - 1)
      u->too_big = true;
    else {
      memcpy(u->body + u->len, upload, *upload_size);
      u->len += *upload_size;
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (u->too_big)
    return reply(c, 413, "text/plain", "Payload Too Large", NULL, NULL) ==
                   MHD_YES
               ? MHD_YES
               : MHD_NO;

  if (e->provider == SPOT_PROVIDER_AWS || e->provider == SPOT_PROVIDER_GCP) {
    enum MHD_Result cr;

    if (e->provider == SPOT_PROVIDER_AWS
            ? emu_ec2_handle(c, method, url, u->body, u->len, &cr)
            : emu_gce_handle(c, method, url, u->body, u->len, &cr)) {
      /* a booted instance has its own IMDS: no notice there yet */
      if (strcmp(url, "/__emulate/ec2/boot") == 0 ||
          strcmp(url, "/__emulate/gce/boot") == 0) {
        pthread_mutex_lock(&e->mu);
        e->notice_at = e->rebalance_at = 0;
        pthread_mutex_unlock(&e->mu);
      }
      return cr;
    }
  }
  pthread_mutex_lock(&e->mu);
  e->requests++;
  if (strncmp(url, "/__emulate/", 11) == 0) {
    ret = control(e, c, method, url);
    pthread_mutex_unlock(&e->mu);
    return ret == MHD_YES ? MHD_YES : MHD_NO;
  }
  /* faults, in the order a client would meet them */
  if (e->stall_s > 0 && chance(e, e->stall_fraction)) {
    uint64_t until = spot_now_mono_ms() + (uint64_t)e->stall_s * 1000;

    while (!e->stopping && spot_now_mono_ms() < until)
      wait_until(e, until);
  }
  if (chance(e, e->reset)) {
    pthread_mutex_unlock(&e->mu);
    return MHD_NO; /* MHD closes the connection without a response */
  }
  if (chance(e, e->throttle)) {
    pthread_mutex_unlock(&e->mu);
    return reply(c, 503, "text/plain", "Service Unavailable", NULL, NULL) ==
                   MHD_YES
               ? MHD_YES
               : MHD_NO;
  }
  malformed = chance(e, e->malformed);

  switch (e->provider) {
  case SPOT_PROVIDER_AWS:
    if (strcmp(url, "/latest/api/token") == 0)
      ret = strcmp(method, "PUT") == 0
                ? aws_token(e, c)
                : reply(c, 405, "text/plain", "Method Not Allowed", NULL, NULL);
    else if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
      ret = reply(c, 405, "text/plain", "Method Not Allowed", NULL, NULL);
    else
      ret = aws_get(e, c, url, malformed);
    break;
  case SPOT_PROVIDER_GCP:
    ret = gcp_get(e, c, url, malformed);
    break;
  default:
    ret = azure(e, c, method, url, u, malformed);
    break;
  }
  pthread_mutex_unlock(&e->mu);
  return ret == MHD_YES ? MHD_YES : MHD_NO;
}

/* A booted instance has its own metadata service: no notice there. */
static void
clear_notice(void *arg)
{
  struct emu *e = arg;

  pthread_mutex_lock(&e->mu);
  e->notice_at = e->rebalance_at = 0;
  pthread_cond_broadcast(&e->cond);
  pthread_mutex_unlock(&e->mu);
}

static void
completed(void *cls, struct MHD_Connection *c, void **con_cls,
          enum MHD_RequestTerminationCode toe)
{
  free(*con_cls);
  *con_cls = NULL;
}

/* --- setup ------------------------------------------------------------ */

/* Exit statuses, as spotctl's: the same command line gives the same
 * status whether it runs as `spotctl emulate` or spotd-emulate. */
enum {
  EMU_EXIT_OK = 0,
  EMU_EXIT_FAIL = 1,
  EMU_EXIT_USAGE = 2,
};

/* "spotd-emulate: MESSAGE" and the trailer on stderr, escaped (file names
 * and option values come from the command line), returns status. */
__attribute__((format(printf, 3, 0), nonnull(2, 3))) static int
emu_vfail(int status, const char *trailer, const char *fmt, va_list ap)
{
  char msg[1024], esc[SPOT_ESCAPE_SIZE(sizeof(msg))];

  vsnprintf(msg, sizeof(msg), fmt, ap);
  fputs("spotd-emulate: ", stderr);
  fputs(spot_escape(msg, esc, sizeof(esc)), stderr);
  fputs(trailer, stderr);
  return status;
}

__attribute__((format(printf, 1, 2))) static int
emu_fail(const char *fmt, ...)
{
  va_list ap;
  int r;

  va_start(ap, fmt);
  r = emu_vfail(EMU_EXIT_FAIL, "\n", fmt, ap);
  va_end(ap);
  return r;
}

__attribute__((format(printf, 1, 2))) static int
emu_usage(const char *fmt, ...)
{
  va_list ap;
  int r;

  va_start(ap, fmt);
  r = emu_vfail(EMU_EXIT_USAGE, "\nTry 'spotd-emulate --help'.\n", fmt, ap);
  va_end(ap);
  return r;
}

static void
usage(FILE *f)
{
  fprintf(
      f,
      "Usage: spotd-emulate --provider aws|gcp|azure [OPTIONS]\n"
      "       spotctl emulate --provider aws|gcp|azure [OPTIONS]\n\n"
      "Serve a cloud metadata service on loopback to rehearse a preemption:\n"
      "  spotd-emulate --provider aws --port 1338 --notice-after 60 &\n"
      "  spotd run --provider aws --metadata-url http://127.0.0.1:1338 ...\n\n"
      "Options:\n"
      "  --port P                  listen port (default 1338; 0 = any free)\n"
      "  --bind ADDR               IPv4 address (default 127.0.0.1)\n"
      "  --notice-after SEC        publish the interruption notice after SEC\n"
      "  --notice-deadline SEC     notice to action (default 120 aws, 30 "
      "gcp/azure)\n"
      "  --action A                aws: terminate|stop|hibernate; azure:\n"
      "                            preempt|terminate|reboot|redeploy; gcp\n"
      "                            maintenance: terminate|migrate\n"
      "  --rebalance-after SEC     aws rebalance recommendation after SEC\n"
      "  --maintenance-after SEC   scheduled maintenance after SEC\n"
      "  --maintenance-cancel-after SEC   and cancel it after SEC\n"
      "  --imdsv2 required|optional   aws tokens (default required)\n"
      "  --fault K=V               throttle=FRACTION (503), stall=SEC,\n"
      "                            stall_fraction=FRACTION, reset=FRACTION,\n"
      "                            malformed=FRACTION, token-expire=SEC\n"
      "  --region R, --instance-id ID, --vm-name NAME, --role NAME\n"
      "  --role-creds FILE         JSON {AccessKeyId, SecretAccessKey, Token}\n"
      "                            served as the instance role, re-read on\n"
      "                            each request (else\n"
      "                            SPOT_EMULATE_AWS_ACCESS_KEY_ID,\n"
      "                            SPOT_EMULATE_AWS_SECRET_ACCESS_KEY,\n"
      "                            SPOT_EMULATE_AWS_SESSION_TOKEN)\n"
      "  --role-expire SEC         role Expiration: SEC after each serve "
      "(6 h)\n"
      "  --boot-cmd CMD            aws/gcp: after each instance the\n"
      "                            emulated cloud launches, answer as it and\n"
      "                            run CMD (sh -c) with SPOT_EMULATE_INSTANCE\n"
      "                            and SPOT_EMULATE_URL (the new node)\n"
      "  --boot-after SEC          launch to boot (default 1)\n\n"
      "Runtime control, on the same port (POST, query parameters; times\n"
      "in seconds from now):\n"
      "  /__emulate/notice?after=S&deadline=S&action=A&resource=VM\n"
      "        post the interruption notice (aws spot, gcp preemption,\n"
      "        azure Preempt event; resource: the azure VM it names)\n"
      "  /__emulate/cancel?notice=1\n"
      "        withdraw the notice (the endpoint answers 404 again) and\n"
      "        cancel a scheduled maintenance; without notice=1 only the\n"
      "        maintenance\n"
      "  /__emulate/rebalance?after=S          aws rebalance recommendation\n"
      "  /__emulate/maintenance?after=S&deadline=S&cancel_after=S&cancelled=1\n"
      "  /__emulate/fault?K=V...&clear=1\n"
      "        faults as --fault (token_expire for token-expire); clear=1\n"
      "        clears every fault first\n"
      "  /__emulate/lifecycle?state=Terminated   aws target lifecycle\n"
      "  GET /__emulate/state    JSON: acks, incarnation, requests, tokens\n"
      "aws also serves the EC2 API (CreateFleet, DescribeInstances,\n"
      "TerminateInstances: POST /) with /__emulate/ec2/capacity, subnet,\n"
      "fault, identity, boot and GET /__emulate/ec2/state; gcp the compute\n"
      "v1 API (instances.insert, zone operations, instanceTemplates.get)\n"
      "with /__emulate/gce/capacity, fault, boot, GET /__emulate/gce/state\n"
      "(see README).\n"
      "For example:\n"
      "  curl -X POST 'http://127.0.0.1:1338/__emulate/notice?deadline=120'\n"
      "  curl -X POST 'http://127.0.0.1:1338/__emulate/cancel?notice=1'\n"
      "Prints \"listening on http://ADDR:PORT\" when ready and one line per\n"
      "Azure acknowledgement (\"ack EventId=...\"). Stops on "
      "SIGINT/SIGTERM.\n");
}

static int
apply_fault(struct emu *e, const char *kv)
{
  const char *eq = strchr(kv, '=');
  char key[32];
  double v;

  if (eq == NULL || (size_t)(eq - kv) >= sizeof(key))
    return -EINVAL;
  memcpy(key, kv, (size_t)(eq - kv));
  key[eq - kv] = '\0';
  for (char *p = key; *p; p++)
    if (*p == '-')
      *p = '_';
  if (strcmp(key, "throttle") == 0)
    return parse_fraction(eq + 1, &e->throttle);
  if (strcmp(key, "reset") == 0)
    return parse_fraction(eq + 1, &e->reset);
  if (strcmp(key, "malformed") == 0)
    return parse_fraction(eq + 1, &e->malformed);
  if (strcmp(key, "stall_fraction") == 0)
    return parse_fraction(eq + 1, &e->stall_fraction);
  if (parse_secs(eq + 1, &v) < 0 || v > 21600)
    return -EINVAL;
  if (strcmp(key, "stall") == 0)
    e->stall_s = (unsigned)v;
  else if (strcmp(key, "token_expire") == 0)
    e->token_expire_s = (int)v;
  else
    return -EINVAL;
  return 0;
}

/* Role credentials as the IMDS document. Never printed. */
static int
load_creds(struct emu *e, const char *file)
{
  const char *ak, *sk, *tok;
  json_t *src = NULL, *doc;
  json_error_t err;
  char exp[32], now[32], *fresh;

  if (file != NULL) {
    src = json_load_file(file, 0, &err);
    if (src == NULL)
      return emu_fail("%s:%d: %s", file, err.line, err.text);
    ak = json_string_value(json_object_get(src, "AccessKeyId"));
    sk = json_string_value(json_object_get(src, "SecretAccessKey"));
    tok = json_string_value(json_object_get(src, "Token"));
  } else {
    ak = getenv("SPOT_EMULATE_AWS_ACCESS_KEY_ID");
    sk = getenv("SPOT_EMULATE_AWS_SECRET_ACCESS_KEY");
    tok = getenv("SPOT_EMULATE_AWS_SESSION_TOKEN");
  }
  if (ak == NULL || sk == NULL) {
    json_decref(src);
    return file != NULL ? emu_fail("%s: AccessKeyId and SecretAccessKey "
                                   "are required",
                                   file)
                        : 0;
  }
  fmt_rfc3339(spot_now_wall_ms(), now, sizeof(now));
  fmt_rfc3339(spot_now_wall_ms() + (e->role_expire_s != 0
                                        ? (int64_t)e->role_expire_s * 1000
                                        : 6 * 3600 * 1000),
              exp, sizeof(exp));
  doc = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s}", "Code", "Success",
                  "LastUpdated", now, "Type", "AWS-HMAC", "AccessKeyId", ak,
                  "SecretAccessKey", sk, "Token", tok != NULL ? tok : "",
                  "Expiration", exp);
  json_decref(src);
  if (doc == NULL)
    return emu_fail("out of memory");
  fresh = json_dumps(doc, JSON_INDENT(2));
  json_decref(doc);
  if (fresh == NULL)
    return emu_fail("out of memory");
  if (e->creds != NULL)
    explicit_bzero(e->creds, strlen(e->creds));
  free(e->creds);
  e->creds = fresh;
  return 0;
}

int
main(int argc, char **argv)
{
  enum {
    OPT_PORT = 256,
    OPT_BIND,
    OPT_NOTICE_AFTER,
    OPT_NOTICE_DEADLINE,
    OPT_ACTION,
    OPT_REBALANCE_AFTER,
    OPT_MAINT_AFTER,
    OPT_MAINT_CANCEL,
    OPT_IMDSV2,
    OPT_FAULT,
    OPT_REGION,
    OPT_INSTANCE_ID,
    OPT_VM_NAME,
    OPT_ROLE,
    OPT_ROLE_CREDS,
    OPT_ROLE_EXPIRE,
    OPT_BOOT_CMD,
    OPT_BOOT_AFTER,
    OPT_PROVIDER,
    OPT_HELP,
    OPT_VERSION,
  };
  static const struct option opts[] = {
      {"provider", required_argument, NULL, OPT_PROVIDER},
      {"port", required_argument, NULL, OPT_PORT},
      {"bind", required_argument, NULL, OPT_BIND},
      {"notice-after", required_argument, NULL, OPT_NOTICE_AFTER},
      {"notice-deadline", required_argument, NULL, OPT_NOTICE_DEADLINE},
      {"action", required_argument, NULL, OPT_ACTION},
      {"rebalance-after", required_argument, NULL, OPT_REBALANCE_AFTER},
      {"maintenance-after", required_argument, NULL, OPT_MAINT_AFTER},
      {"maintenance-cancel-after", required_argument, NULL, OPT_MAINT_CANCEL},
      {"imdsv2", required_argument, NULL, OPT_IMDSV2},
      {"fault", required_argument, NULL, OPT_FAULT},
      {"region", required_argument, NULL, OPT_REGION},
      {"instance-id", required_argument, NULL, OPT_INSTANCE_ID},
      {"vm-name", required_argument, NULL, OPT_VM_NAME},
      {"role", required_argument, NULL, OPT_ROLE},
      {"role-creds", required_argument, NULL, OPT_ROLE_CREDS},
      {"role-expire", required_argument, NULL, OPT_ROLE_EXPIRE},
      {"boot-cmd", required_argument, NULL, OPT_BOOT_CMD},
      {"boot-after", required_argument, NULL, OPT_BOOT_AFTER},
      {"help", no_argument, NULL, OPT_HELP},
      {"version", no_argument, NULL, OPT_VERSION},
      {NULL, 0, NULL, 0},
  };
  static struct emu e; /* threads see it until MHD_stop_daemon returns */
  double notice_after = -1, notice_deadline = -1, rebalance_after = -1;
  double maint_after = -1, maint_cancel = -1;
  const char *bind_addr = "127.0.0.1", *creds_file = NULL;
  const char *provider = NULL, *boot_cmd = NULL;
  double boot_after = 1.0;
  int64_t port = 1338;
  struct sockaddr_in sa;
  struct MHD_Daemon *d;
  const union MHD_DaemonInfo *info;
  sigset_t set;
  int opt, sig, ret = EMU_EXIT_OK;
  bool action_set = false;

  spot_log_init("spotd-emulate", SPOT_LOG_WARNING);
  /* The role credentials it serves live in this process's memory: no core
   * dump, no ptrace by other processes of the same uid (the commands of
   * --boot-cmd get it back at exec). */
  (void)prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  memset(&e, 0, sizeof(e));
  e.imdsv2_required = true;
  e.stall_fraction = 1.0;
  e.token_expire_s = -1;
  spot_strlcpy(e.action, "terminate", sizeof(e.action));
  spot_strlcpy(e.lifecycle, "InService", sizeof(e.lifecycle));
  spot_strlcpy(e.region, "us-east-1", sizeof(e.region));
  spot_strlcpy(e.instance_id, "i-0123456789abcdef0", sizeof(e.instance_id));
  spot_strlcpy(e.role, "spotd-role", sizeof(e.role));
  spot_strlcpy(e.vm_name, "spotd-vm", sizeof(e.vm_name));
  e.rnd = spot_random_u32();

  optind = 1;
  while ((opt = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (opt) {
    case OPT_PROVIDER:
      provider = optarg;
      break;
    case OPT_PORT:
      if (spot_parse_int64(optarg, 0, 65535, &port) < 0)
        return emu_usage("bad --port '%s'", optarg);
      break;
    case OPT_BIND:
      bind_addr = optarg;
      break;
    case OPT_NOTICE_AFTER:
    case OPT_NOTICE_DEADLINE:
    case OPT_REBALANCE_AFTER:
    case OPT_MAINT_AFTER:
    case OPT_MAINT_CANCEL: {
      double v;
      if (parse_secs(optarg, &v) < 0)
        return emu_usage("bad number of seconds '%s'", optarg);
      *(opt == OPT_NOTICE_AFTER      ? &notice_after
        : opt == OPT_NOTICE_DEADLINE ? &notice_deadline
        : opt == OPT_REBALANCE_AFTER ? &rebalance_after
        : opt == OPT_MAINT_AFTER     ? &maint_after
                                     : &maint_cancel) = v;
      break;
    }
    case OPT_ACTION:
      action_set = true;
      if (spot_strlcpy(e.action, optarg, sizeof(e.action)) >= sizeof(e.action))
        return emu_usage("bad --action '%s'", optarg);
      break;
    case OPT_IMDSV2:
      if (strcmp(optarg, "required") != 0 && strcmp(optarg, "optional") != 0)
        return emu_usage("--imdsv2 is required or optional");
      e.imdsv2_required = strcmp(optarg, "required") == 0;
      break;
    case OPT_FAULT:
      if (apply_fault(&e, optarg) < 0)
        return emu_usage("bad --fault '%s'", optarg);
      break;
    case OPT_REGION:
    case OPT_INSTANCE_ID:
    case OPT_VM_NAME:
    case OPT_ROLE: {
      char *dst = opt == OPT_REGION        ? e.region
                  : opt == OPT_INSTANCE_ID ? e.instance_id
                  : opt == OPT_VM_NAME     ? e.vm_name
                                           : e.role;
      size_t size = opt == OPT_REGION        ? sizeof(e.region)
                    : opt == OPT_INSTANCE_ID ? sizeof(e.instance_id)
                    : opt == OPT_VM_NAME     ? sizeof(e.vm_name)
                                             : sizeof(e.role);
      if (optarg[0] == '\0' || strpbrk(optarg, "\"\\/\r\n") != NULL ||
          spot_strlcpy(dst, optarg, size) >= size)
        return emu_usage("bad value '%s'", optarg);
      break;
    }
    case OPT_ROLE_CREDS:
      creds_file = optarg;
      break;
    case OPT_BOOT_CMD:
      boot_cmd = optarg;
      break;
    case OPT_BOOT_AFTER:
      if (parse_secs(optarg, &boot_after) < 0 || boot_after > 3600)
        return emu_usage("bad --boot-after '%s'", optarg);
      break;
    case OPT_ROLE_EXPIRE: {
      int64_t v;

      if (spot_parse_int64(optarg, 1, 43200, &v) < 0)
        return emu_usage("--role-expire: expected 1 to 43200 "
                         "seconds, got '%s'",
                         optarg);
      e.role_expire_s = (unsigned)v;
      break;
    }
    case OPT_HELP:
    case 'h':
      usage(stdout);
      return EMU_EXIT_OK;
    case OPT_VERSION:
      printf("spotd-emulate %s\n", SPOT_VERSION);
      return EMU_EXIT_OK;
    default:
      return emu_usage("unknown option");
    }
  }
  if (optind < argc)
    return emu_usage("unexpected argument '%s'", argv[optind]);
  if (provider == NULL || spot_provider_from_name(provider, &e.provider) < 0 ||
      (e.provider != SPOT_PROVIDER_AWS && e.provider != SPOT_PROVIDER_GCP &&
       e.provider != SPOT_PROVIDER_AZURE))
    return emu_usage("--provider aws|gcp|azure is required");
  e.notice_deadline_s = notice_deadline >= 0 ? (unsigned)notice_deadline
                        : e.provider == SPOT_PROVIDER_AWS ? 120
                                                          : 30;
  /* each provider's usual event when --action is not given */
  if (!action_set && e.provider == SPOT_PROVIDER_AZURE)
    spot_strlcpy(e.action, "preempt", sizeof(e.action));
  if (!action_set && e.provider == SPOT_PROVIDER_GCP)
    spot_strlcpy(e.action, "migrate", sizeof(e.action));
  memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)port);
  if (inet_pton(AF_INET, bind_addr, &sa.sin_addr) != 1)
    return emu_usage("--bind needs an IPv4 address");
  if (e.provider == SPOT_PROVIDER_AWS && load_creds(&e, creds_file) != 0)
    return EMU_EXIT_FAIL;
  e.creds_file = creds_file;

  pthread_mutex_init(&e.mu, NULL);
  if (e.provider == SPOT_PROVIDER_AWS)
    emu_ec2_init(e.region, e.instance_id);
  if (e.provider == SPOT_PROVIDER_GCP)
    emu_gce_init(e.region, e.vm_name);
  {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e.cond, &ca);
    pthread_condattr_destroy(&ca);
  }
  if (notice_after >= 0)
    schedule_notice(&e, notice_after, e.notice_deadline_s, NULL, NULL);
  if (rebalance_after >= 0) {
    e.rebalance_at = deadline_after(spot_now_mono_ms(), rebalance_after);
    e.rebalance_wall =
        (spot_now_wall_ms() + (int64_t)(rebalance_after * 1000)) / 1000 * 1000;
  }
  if (maint_after >= 0)
    schedule_maintenance(&e, maint_after, e.notice_deadline_s,
                         maint_cancel >= 0 ? maint_cancel : 0, false);

  /* Threads inherit this mask; the main thread takes the signals. */
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, NULL);

  d = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION |
                           MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG,
                       0, NULL, NULL, handler, &e, MHD_OPTION_SOCK_ADDR,
                       (struct sockaddr *)&sa, MHD_OPTION_NOTIFY_COMPLETED,
                       completed, NULL, MHD_OPTION_LISTENING_ADDRESS_REUSE, 1,
                       MHD_OPTION_END);
  if (d == NULL) {
    ret = emu_fail("cannot listen on %s:%" PRId64, bind_addr, port);
    goto out;
  }
  info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  printf("listening on http://%s:%u\n", bind_addr,
         info != NULL ? (unsigned)info->port : (unsigned)port);
  if (boot_cmd != NULL) {
    char url[128];

    snprintf(url, sizeof(url), "http://%s:%u", bind_addr,
             info != NULL ? (unsigned)info->port : (unsigned)port);
    emu_boot_setup(boot_cmd, boot_after, url, clear_notice, &e);
  }
  fflush(stdout);

  while (sigwait(&set, &sig) != 0)
    ;
  pthread_mutex_lock(&e.mu);
  e.stopping = true;
  pthread_cond_broadcast(&e.cond);
  pthread_mutex_unlock(&e.mu);
  MHD_stop_daemon(d);
  emu_boot_stop();
out:
  pthread_sigmask(SIG_UNBLOCK, &set, NULL);
  pthread_cond_destroy(&e.cond);
  pthread_mutex_destroy(&e.mu);
  if (e.provider == SPOT_PROVIDER_AWS)
    emu_ec2_fini();
  if (e.provider == SPOT_PROVIDER_GCP)
    emu_gce_fini();
  free(e.last_events);
  if (e.creds != NULL)
    explicit_bzero(e.creds, strlen(e.creds));
  free(e.creds);
  return ret;
}
