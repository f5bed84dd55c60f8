/* spotctl relaunch --backend gcp: compute instances.insert of a SPOT VM
 * from an instance template, into the first zone of the user's list that
 * is neither the zone just reclaimed (from the metadata server) nor one
 * that stocked out lately for this job (the relaunch record in the
 * store); the next zone on ZONE_RESOURCE_POOL_EXHAUSTED / stockout, be it
 * in the answer or in the zone operation's error.
 *
 * Idempotency: the requestId of each insert is a UUID derived from (job,
 * checkpoint, reason, zone), so a retried insert returns the first
 * operation; the instance name is derived from (job, checkpoint, reason),
 * so a second insert elsewhere is refused as existing in that zone; the
 * record in the store notes the relaunch once it succeeded.
 *
 * The OAuth token is the instance service account's, from the metadata
 * server; it is never printed. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/gce.h"
#include "core/util.h"
#include "io/http_once.h"
#include "relaunch_cloud.h"
#include "spotctl.h"

#define ZONES_MAX 16
#define DEFAULT_ENDPOINT "https://compute.googleapis.com"
#define DEFAULT_METADATA "http://metadata.google.internal"
#define BACKOFF_BASE_MS 300
#define BACKOFF_CAP_MS 5000
#define POLL_MIN_MS 200
#define POLL_MAX_MS 2000
#define TOKEN_MAX 2048

struct gcp_relaunch {
  struct cloud c;
  const char *template, *project_opt, *endpoint_opt;
  char *zones[ZONES_MAX];
  size_t n_zones;
  char *zone_list;
  char endpoint[512], meta[512];
  char project[128], this_zone[64], this_name[128];
  char template_path[400]; /* projects/P/global/instanceTemplates/T */
  char token[TOKEN_MAX];
  char auth[TOKEN_MAX + 32];
  char name[SPOT_GCE_NAME_MAX + 1];
  struct spot_buf tmpl; /* the template document */
};

static const char gcp_usage[] =
    "Usage: spotctl relaunch --backend gcp --instance-template T --zones LIST\n"
    "                        [OPTIONS]\n"
    "\n"
    "compute instances.insert of a SPOT VM from the instance template into\n"
    "the first zone of LIST that is not this VM's zone nor one that stocked\n"
    "out lately; the next zone on ZONE_RESOURCE_POOL_EXHAUSTED. The new VM\n"
    "carries spotd-job and spotd-store in its metadata (spotd --job-from\n"
    "gcp-metadata reads them). Reads SPOTD_JOB, SPOTD_STORE,\n"
    "SPOTD_CHECKPOINT, SPOTD_REASON, SPOTD_DEADLINE.\n"
    "\n"
    "Options:\n"
    "  --instance-template T  name (global template of the project) or\n"
    "                         projects/P/global/instanceTemplates/T "
    "(required)\n"
    "  --zones LIST           comma-separated zones, in order (required)\n"
    "  --project P            default: the metadata server's project\n"
    "  --failed-ttl SEC       skip zones that stocked out this recently "
    "(3600)\n"
    "  --compute-endpoint URL default $SPOTCTL_GCE_ENDPOINT, else\n"
    "                         " DEFAULT_ENDPOINT "\n"
    "  --metadata-url URL     default http://$GCE_METADATA_HOST, else\n"
    "                         " DEFAULT_METADATA "\n"
    "  --endpoint URL, --region R   S3 store of the record\n"
    "  --no-record            do not read or write PREFIX/JOB/relaunch.json\n"
    "  --timeout SEC          time for everything (default SPOTD_DEADLINE\n"
    "                         minus 5 s, else 60 s)\n"
    "  --dry-run              print the request, send nothing\n"
    "Exit status: 0 launched (or already), 1 failed, 2 usage.\n";

enum {
  OPT_TEMPLATE = CLOUD_OPT_LAST,
  OPT_ZONES,
  OPT_PROJECT,
  OPT_COMPUTE,
};

static bool
name_ok(const char *s, size_t max)
{
  size_t n = strlen(s);

  if (n == 0 || n > max)
    return false;
  for (const char *p = s; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' ||
          *p == '_' || *p == '.' || (*p >= 'A' && *p <= 'Z')))
      return false;
  return true;
}

static int
split_zones(struct gcp_relaunch *g, const char *arg)
{
  free(g->zone_list);
  g->zone_list = strdup(arg);
  g->n_zones = 0;
  if (g->zone_list == NULL)
    return spotctl_fail("relaunch: out of memory");
  for (char *p = g->zone_list; p != NULL && *p;) {
    char *comma = strchr(p, ',');

    if (comma != NULL)
      *comma = '\0';
    if (*p != '\0') {
      if (g->n_zones == ZONES_MAX || !name_ok(p, 63))
        return spotctl_usage("relaunch: --zones: at most %d zone names, "
                             "got '%s'",
                             ZONES_MAX, p);
      g->zones[g->n_zones++] = p;
    }
    p = comma != NULL ? comma + 1 : NULL;
  }
  return 0;
}

static int
parse_args(int argc, char **argv, struct gcp_relaunch *g)
{
  static const struct option opts[] = {
      {"instance-template", required_argument, NULL, OPT_TEMPLATE},
      {"zones", required_argument, NULL, OPT_ZONES},
      {"project", required_argument, NULL, OPT_PROJECT},
      {"compute-endpoint", required_argument, NULL, OPT_COMPUTE},
      CLOUD_LONG_OPTIONS,
  };
  int o, r = 0;

  optind = 1;
  opterr = 0;
  while (r == 0 && (o = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
    switch (o) {
    case 'h':
      fputs(gcp_usage, stdout);
      return 1;
    case OPT_TEMPLATE:
      g->template = optarg;
      break;
    case OPT_ZONES:
      r = split_zones(g, optarg);
      break;
    case OPT_PROJECT:
      if (!name_ok(optarg, 100))
        return spotctl_usage("relaunch: --project: bad project id '%s'",
                             optarg);
      g->project_opt = optarg;
      break;
    case OPT_COMPUTE:
      g->endpoint_opt = optarg;
      break;
    default:
      r = cloud_option(&g->c, o, optarg);
      if (r == 1)
        return spotctl_bad_option("relaunch", argv);
    }
  }
  if (r != 0)
    return r;
  if (optind < argc)
    return spotctl_usage("relaunch: unexpected argument '%s'", argv[optind]);
  if (g->template == NULL || g->n_zones == 0)
    return spotctl_usage("relaunch: --backend gcp needs --instance-template "
                         "and --zones");
  return 0;
}

/* ------------------------------------------------------------ HTTP */

/* One call with the bearer token (or the metadata header). 0 with the
 * reply (any status), or negative errno (transport, line in rep->error). */
static int
call(struct gcp_relaunch *g, const char *method, const char *url,
     const char *body, bool metadata, struct spot_http_reply *rep)
{
  const char *hdrs[2];
  struct spot_http_req q;
  uint64_t left = cloud_ms_left(&g->c);

  memset(&q, 0, sizeof(q));
  hdrs[0] = metadata ? "Metadata-Flavor: Google" : g->auth;
  hdrs[1] = "Content-Type: application/json";
  q.method = method;
  q.url = url;
  q.headers = hdrs;
  q.n_headers = body != NULL ? 2 : 1;
  q.body = body;
  q.body_len = body != NULL ? strlen(body) : 0;
  q.timeout_ms = (long)(left < 20000 ? left + 1 : 20000);
  q.max_reply = SPOT_GCE_REPLY_MAX;
  q.no_proxy = metadata;
  return spot_http_once(g->c.conn.http, &q, rep);
}

static int
meta_get(struct gcp_relaunch *g, const char *path, char *out, size_t size)
{
  struct spot_http_reply rep;
  char url[700];
  int r;

  snprintf(url, sizeof(url), "%s/computeMetadata/v1/%s", g->meta, path);
  r = call(g, "GET", url, NULL, true, &rep);
  if (r == 0 && rep.status != 200)
    r = -ENOENT;
  if (r == 0 && spot_strlcpy(out, spot_buf_str(&rep.body), size) >= size)
    r = -E2BIG;
  if (rep.body.data != NULL)
    explicit_bzero(rep.body.data, rep.body.len);
  spot_buf_fini(&rep.body);
  return r;
}

/* Token, project, this VM's zone. */
static int
metadata(struct gcp_relaunch *g)
{
  char doc[TOKEN_MAX + 256], zone[256];
  const char *slash;
  int r;

  r = meta_get(g, "instance/service-accounts/default/token", doc, sizeof(doc));
  if (r == 0)
    r = spot_gce_token_parse(doc, strlen(doc), g->token, sizeof(g->token));
  explicit_bzero(doc, sizeof(doc));
  if (r < 0)
    return spotctl_fail("relaunch: no OAuth token from the metadata server "
                        "%s (the VM needs a service account with the "
                        "compute scope)",
                        g->meta);
  snprintf(g->auth, sizeof(g->auth), "Authorization: Bearer %s", g->token);
  if (g->project_opt != NULL)
    spot_strlcpy(g->project, g->project_opt, sizeof(g->project));
  else if (meta_get(g, "project/project-id", g->project, sizeof(g->project)) <
               0 ||
           !name_ok(g->project, 100))
    return spotctl_fail("relaunch: no project from the metadata server: give "
                        "--project");
  if (meta_get(g, "instance/zone", zone, sizeof(zone)) == 0) {
    slash = strrchr(zone, '/');
    spot_strlcpy(g->this_zone, slash != NULL ? slash + 1 : zone,
                 sizeof(g->this_zone));
  } else {
    relaunch_say("warning: the metadata server did not give this VM's zone: "
                 "the reclaimed zone cannot be skipped");
  }
  (void)meta_get(g, "instance/name", g->this_name, sizeof(g->this_name));
  return 0;
}

/* A failed API answer, one line. Returns an exit status. */
static int
fail_op(struct gcp_relaunch *g, const struct spot_gce_op *op, long status)
{
  switch (spot_gce_classify(op)) {
  case SPOT_GCE_CLASS_AUTH:
    return spotctl_fail("relaunch: GCE refused: HTTP %ld %s: %.200s (the "
                        "service account needs compute.instances.create, "
                        "compute.instances.setMetadata, "
                        "compute.instanceTemplates.useReadOnly and "
                        "iam.serviceAccounts.actAs; scope "
                        "https://www.googleapis.com/auth/compute)",
                        status, op->code, op->message);
  case SPOT_GCE_CLASS_TEMPLATE:
    return spotctl_fail("relaunch: instance template '%s': HTTP %ld %s: "
                        "%.200s",
                        g->template, status, op->code, op->message);
  default:
    return spotctl_fail("relaunch: GCE insert failed: HTTP %ld %s: %.200s",
                        status, op->code, op->message);
  }
}

/* GET or POST with retries on 429/5xx. 0 with *op parsed and *status, or
 * an exit status after one line. */
static int
api(struct gcp_relaunch *g, const char *method, const char *url,
    const char *body, struct spot_gce_op *op, long *status, bool raw,
    struct spot_buf *keep)
{
  struct spot_http_reply rep;
  char line[300];
  int r;

  memset(op, 0, sizeof(*op));
  for (unsigned attempt = 0;; attempt++) {
    uint64_t wait;

    r = call(g, method, url, body, false, &rep);
    if (r == 0) {
      bool parsed =
          spot_gce_op_parse(spot_buf_str(&rep.body), rep.body.len, op) == 0;
      bool retry = rep.status == 429 || rep.status >= 500;

      *status = rep.status;
      if (parsed && op->is_error &&
          spot_gce_classify(op) == SPOT_GCE_CLASS_CAPACITY)
        retry = false; /* a stockout answered at once: next zone */
      if (!retry && (parsed || (raw && rep.status == 200))) {
        if (keep != NULL) {
          spot_buf_reset(keep);
          spot_buf_append(keep, rep.body.data != NULL ? rep.body.data : "",
                          rep.body.len);
        }
        spot_buf_fini(&rep.body);
        return 0;
      }
      snprintf(line, sizeof(line), "HTTP %ld %s", rep.status,
               parsed ? op->code : "(unreadable answer)");
      if (!retry) {
        spot_buf_fini(&rep.body);
        return spotctl_fail("relaunch: GCE %s: %s", method, line);
      }
    } else {
      snprintf(line, sizeof(line), "%s", rep.error);
    }
    spot_buf_fini(&rep.body);
    wait = spot_backoff_ms(attempt, BACKOFF_BASE_MS, BACKOFF_CAP_MS,
                           spot_random_u32());
    if (cloud_ms_left(&g->c) < wait + 1000)
      return spotctl_fail("relaunch: GCE did not answer in time (last: %s)",
                          line);
    relaunch_say("GCE %s: %s: retrying in %" PRIu64 " ms", method, line, wait);
    usleep((useconds_t)(wait * 1000));
  }
}

static int
load_template(struct gcp_relaunch *g)
{
  struct spot_gce_op op;
  char url[1024];
  long status = 0;
  int r;

  if (strncmp(g->template, "projects/", 9) == 0)
    spot_strlcpy(g->template_path, g->template, sizeof(g->template_path));
  else if (name_ok(g->template, 63))
    snprintf(g->template_path, sizeof(g->template_path),
             "projects/%s/global/instanceTemplates/%s", g->project,
             g->template);
  else
    return spotctl_usage("relaunch: --instance-template: a name or "
                         "projects/P/global/instanceTemplates/T");
  snprintf(url, sizeof(url), "%s/compute/v1/%s", g->endpoint, g->template_path);
  spot_buf_init(&g->tmpl, SPOT_GCE_REPLY_MAX);
  r = api(g, "GET", url, NULL, &op, &status, true, &g->tmpl);
  if (r != 0)
    return r;
  if (status != 200)
    return fail_op(g, &op, status);
  return 0;
}

/* Waits for the zone operation to be DONE. 0 with *op final, or an exit
 * status. */
static int
wait_op(struct gcp_relaunch *g, const char *zone, struct spot_gce_op *op)
{
  char url[1024];
  uint64_t delay = POLL_MIN_MS;
  long status = 0;
  int r;

  while (strcmp(op->status, "DONE") != 0) {
    if (cloud_ms_left(&g->c) < delay + 500)
      return spotctl_fail("relaunch: the insert in %s is still %s when the "
                          "time is up (operation %s): it may still start",
                          zone, op->status, op->name);
    usleep((useconds_t)(delay * 1000));
    delay = delay * 2 > POLL_MAX_MS ? POLL_MAX_MS : delay * 2;
    snprintf(url, sizeof(url),
             "%s/compute/v1/projects/%s/zones/%s/operations/%s", g->endpoint,
             g->project, zone, op->name);
    r = api(g, "GET", url, NULL, op, &status, false, NULL);
    if (r != 0)
      return r;
    if (op->is_error)
      return fail_op(g, op, status);
  }
  return 0;
}

#define ZONE_STOCKOUT (-1)

/* One zone: 0 launched (or there already), ZONE_STOCKOUT (recorded), or an
 * exit status. */
static int
insert(struct gcp_relaunch *g, const char *zone, const char *body)
{
  struct spot_gce_op op;
  char url[1200], rid[40];
  long status = 0;
  int r;

  if (spot_gce_request_id(g->c.job, g->c.ckpt, g->c.reason, zone, rid,
                          sizeof(rid)) < 0)
    return spotctl_fail("relaunch: cannot derive the requestId");
  snprintf(url, sizeof(url),
           "%s/compute/v1/projects/%s/zones/%s/instances?"
           "sourceInstanceTemplate=%s&requestId=%s",
           g->endpoint, g->project, zone, g->template_path, rid);
  if (g->c.dry_run) {
    printf("would POST %s\n%s\n", url, body);
    return 0;
  }
  relaunch_say("GCE insert %s in %s (SPOT, requestId %s)", g->name, zone, rid);
  r = api(g, "POST", url, body, &op, &status, false, NULL);
  if (r != 0)
    return r;
  if (op.is_error) {
    enum spot_gce_class k = spot_gce_classify(&op);

    if (k == SPOT_GCE_CLASS_EXISTS) {
      relaunch_say("%s exists already in %s: relaunched before", g->name, zone);
      return 0;
    }
    if (k != SPOT_GCE_CLASS_CAPACITY)
      return fail_op(g, &op, status);
  } else if ((r = wait_op(g, zone, &op)) != 0) {
    return r;
  }
  if (op.code[0] != '\0') {
    if (spot_gce_classify(&op) != SPOT_GCE_CLASS_CAPACITY)
      return fail_op(g, &op, status);
    relaunch_say("zone %s: %s (no capacity, skipped from now)", zone, op.code);
    spot_relaunch_record_fail(&g->c.rec, zone, op.code, spot_now_wall_ms());
    return ZONE_STOCKOUT;
  }
  return 0;
}

static void
set_endpoints(struct gcp_relaunch *g)
{
  const char *e = g->endpoint_opt, *h;

  if (e == NULL)
    e = getenv("SPOTCTL_GCE_ENDPOINT");
  spot_strlcpy(g->endpoint, e != NULL && e[0] ? e : DEFAULT_ENDPOINT,
               sizeof(g->endpoint));
  if (g->c.metadata_url != NULL)
    spot_strlcpy(g->meta, g->c.metadata_url, sizeof(g->meta));
  else if ((h = getenv("GCE_METADATA_HOST")) != NULL && h[0] != '\0')
    snprintf(g->meta, sizeof(g->meta), "http://%s", h);
  else
    spot_strlcpy(g->meta, DEFAULT_METADATA, sizeof(g->meta));
  for (char *u = g->endpoint; u; u = u == g->endpoint ? g->meta : NULL)
    while (u[0] && u[strlen(u) - 1] == '/')
      u[strlen(u) - 1] = '\0';
}

static int
run(struct gcp_relaunch *g)
{
  char key[SPOT_EC2_TOKEN_LEN + 1];
  const struct spot_relaunch_done *d;
  struct spot_buf body;
  int64_t since;
  size_t tried = 0;
  int r;

  set_endpoints(g);
  if ((r = metadata(g)) != 0)
    return r;
  relaunch_say("gcp backend: job %s, checkpoint %s, reason %s; this VM %s in "
               "%s; %.1f s budget",
               g->c.job, g->c.ckpt[0] ? g->c.ckpt : "(none)", g->c.reason,
               g->this_name[0] ? g->this_name : "?",
               g->this_zone[0] ? g->this_zone : "?",
               (double)cloud_ms_left(&g->c) / 1000.0);
  if (!g->c.dry_run)
    cloud_record_load(&g->c);
  if (cloud_key(&g->c, key, sizeof(key)) < 0)
    return spotctl_fail("relaunch: cannot derive the key");
  if ((d = spot_relaunch_record_find(&g->c.rec, key)) != NULL) {
    relaunch_say("nothing to do: this preemption was relaunched already as %s "
                 "in %s",
                 d->instance, d->pool);
    return 0;
  }
  if ((r = load_template(g)) != 0)
    return r;
  spot_gce_instance_name(g->c.job, key, g->name, sizeof(g->name));
  spot_buf_init(&body, SPOT_GCE_REPLY_MAX);
  if (spot_gce_insert_body(g->name, g->c.job, g->c.store, g->tmpl.data,
                           g->tmpl.len, &body) < 0) {
    spot_buf_fini(&body);
    return spotctl_fail("relaunch: instance template '%s': unreadable "
                        "document",
                        g->template);
  }
  if (g->this_zone[0] != '\0')
    spot_relaunch_record_fail(&g->c.rec, g->this_zone, "reclaimed",
                              spot_now_wall_ms());
  since = spot_now_wall_ms() - g->c.failed_ttl_s * 1000;
  r = ZONE_STOCKOUT;
  for (size_t i = 0; r == ZONE_STOCKOUT && i < g->n_zones; i++) {
    const char *z = g->zones[i];

    if (strcmp(z, g->this_zone) == 0 ||
        spot_relaunch_record_failed(&g->c.rec, z, since)) {
      relaunch_say("zone %s skipped (%s)", z,
                   strcmp(z, g->this_zone) == 0 ? "reclaimed"
                                                : "stocked out lately");
      continue;
    }
    tried++;
    r = insert(g, z, spot_buf_str(&body));
    if (r == 0 && !g->c.dry_run) {
      relaunch_say("launched %s in %s (SPOT)", g->name, z);
      spot_relaunch_record_done(&g->c.rec, key, g->name, z, spot_now_wall_ms());
      printf("%s\n", spotctl_esc(g->name));
    }
    if (g->c.dry_run)
      break;
  }
  spot_buf_fini(&body);
  if (g->c.dry_run)
    return r > 0 ? r : 0;
  cloud_record_save(&g->c);
  if (r == ZONE_STOCKOUT)
    return spotctl_fail("relaunch: no capacity in any zone (%zu tried of "
                        "%zu): nothing was launched; the job stays in the "
                        "store: relaunch it later by hand with the same "
                        "command",
                        tried, g->n_zones);
  return r;
}

int
spotctl_relaunch_gcp(int argc, char **argv)
{
  struct gcp_relaunch *g = calloc(1, sizeof(*g));
  int r;

  if (g == NULL)
    return spotctl_fail("relaunch: out of memory");
  g->c.failed_ttl_s = CLOUD_DEFAULT_FAILED_TTL_S;
  g->c.aws_optional = true;
  r = parse_args(argc, argv, g);
  if (r == 1)
    r = SPOTCTL_EXIT_OK;
  else if (r == 0 && (r = cloud_read_env(&g->c)) == 0 &&
           (r = cloud_open(&g->c, true)) == 0)
    r = run(g);
  cloud_close(&g->c);
  explicit_bzero(g->token, sizeof(g->token));
  explicit_bzero(g->auth, sizeof(g->auth));
  spot_buf_fini(&g->tmpl);
  free(g->zone_list);
  free(g);
  return r;
}
