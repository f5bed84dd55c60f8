/* spotctl relaunch --backend aws: one EC2 CreateFleet of type instant per
 * attempt, launch template + overrides (instance types x subnets/zones),
 * spot with capacity-optimized-prioritized, never in the pool just
 * reclaimed (this instance's type and zone, from IMDS) nor in pools that
 * failed lately for this job (the relaunch record in the store).
 *
 * Idempotency: attempt N of a preemption carries the ClientToken
 * spotd-HEX(job, checkpoint, reason, N), so EC2 answers a repeated request
 * with the same fleet instead of a new one; the record in the store
 * (PREFIX/JOB/relaunch.json) notes the relaunch once it succeeded, and a
 * second call for the same preemption finds it and does nothing.
 *
 * Errors: per-override capacity errors (InsufficientInstanceCapacity,
 * MaxSpotInstanceCountExceeded, Unsupported, ...) mark that pool failed
 * and the next attempt goes to the others; throttling and 5xx are retried
 * with backoff inside the time budget; UnauthorizedOperation and a bad
 * launch template end it with one line. */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/util.h"
#include "io/http_once.h"
#include "relaunch_cloud.h"
#include "spotctl.h"

#define LIST_MAX 16
#define DEFAULT_ATTEMPTS 3
#define BACKOFF_BASE_MS 300
#define BACKOFF_CAP_MS 5000
#define CALL_TIMEOUT_MS 20000
#define OD_ATTEMPT 1000 /* token index of the on-demand attempt */

struct aws_relaunch {
  struct cloud c;
  const char *lt, *lt_version, *ec2_endpoint;
  char *types[LIST_MAX], *subnets[LIST_MAX], *zones[LIST_MAX];
  size_t n_types, n_subnets, n_zones;
  char *lists[3]; /* strdup'ed option values */
  int64_t attempts, od_after;
  char endpoint[SPOT_AWS_ENDPOINT_MAX + 1];
  char sigv4[64];
  /* this instance, from IMDS */
  char instance_id[32];
  struct spot_ec2_pool reclaimed;
  /* every pool, priority order */
  struct spot_ec2_pool pools[SPOT_EC2_POOLS_MAX];
  size_t n_pools;
  unsigned spot_failures;
};

static const char aws_usage[] =
    "Usage: spotctl relaunch --backend aws --launch-template NAME|lt-ID\n"
    "                        [OPTIONS]\n"
    "\n"
    "One EC2 CreateFleet (instant, capacity-optimized-prioritized spot) from\n"
    "the launch template, over the instance types and subnets/zones given,\n"
    "never in the pool just reclaimed nor in pools that failed lately. The\n"
    "new instance is tagged spotd-job=JOB and spotd-store=STORE (spotd\n"
    "--job-from aws-tag reads them). Reads SPOTD_JOB, SPOTD_STORE,\n"
    "SPOTD_CHECKPOINT, SPOTD_REASON, SPOTD_DEADLINE.\n"
    "\n"
    "Options:\n"
    "  --launch-template T    name, or id (lt-...) (required)\n"
    "  --template-version V   default $Default\n"
    "  --instance-types LIST  comma-separated, in priority order (default:\n"
    "                         the template's)\n"
    "  --subnets LIST         SUBNET@ZONE,... (the zone lets the reclaimed\n"
    "                         pool be skipped)\n"
    "  --zones LIST           zones, when the template has no subnet\n"
    "  --attempts N           spot requests at most (default 3)\n"
    "  --on-demand-after N    then on-demand after N failed spot attempts\n"
    "                         (default 0 = never)\n"
    "  --failed-ttl SEC       skip pools that failed this recently (3600)\n"
    "  --ec2-endpoint URL     default $AWS_ENDPOINT_URL_EC2, else\n"
    "                         https://ec2.REGION.amazonaws.com\n"
    "  --metadata-url URL     IMDS (default\n"
    "                         $AWS_EC2_METADATA_SERVICE_ENDPOINT, else\n"
    "                         http://169.254.169.254)\n"
    "  --endpoint URL         S3 endpoint of the store (the record)\n"
    "  --region R             region (default: $AWS_REGION, profile, IMDS)\n"
    "  --no-record            do not read or write PREFIX/JOB/relaunch.json\n"
    "  --timeout SEC          time for everything (default SPOTD_DEADLINE\n"
    "                         minus 5 s, else 60 s)\n"
    "  --dry-run              print the request, send nothing\n"
    "Exit status: 0 launched (or already), 1 failed, 2 usage.\n";

enum {
  OPT_LT = CLOUD_OPT_LAST,
  OPT_LT_VERSION,
  OPT_TYPES,
  OPT_SUBNETS,
  OPT_ZONES,
  OPT_ATTEMPTS,
  OPT_OD_AFTER,
  OPT_EC2_ENDPOINT,
};

/* Splits a comma list in place into out (at most LIST_MAX). */
static int
split(char *s, char **out, size_t *n, const char *opt)
{
  *n = 0;
  for (char *p = s; p != NULL && *p != '\0';) {
    char *comma = strchr(p, ',');

    if (comma != NULL)
      *comma = '\0';
    if (*p != '\0') {
      if (*n == LIST_MAX || strlen(p) >= 32 || strpbrk(p, " &=\"'<>") != NULL)
        return spotctl_usage("relaunch: %s: at most %d names of up to 31 "
                             "characters, got '%s'",
                             opt, LIST_MAX, p);
      out[(*n)++] = p;
    }
    p = comma != NULL ? comma + 1 : NULL;
  }
  return 0;
}

static int
parse_args(int argc, char **argv, struct aws_relaunch *a)
{
  static const struct option opts[] = {
      {"launch-template", required_argument, NULL, OPT_LT},
      {"template-version", required_argument, NULL, OPT_LT_VERSION},
      {"instance-types", required_argument, NULL, OPT_TYPES},
      {"subnets", required_argument, NULL, OPT_SUBNETS},
      {"zones", required_argument, NULL, OPT_ZONES},
      {"attempts", required_argument, NULL, OPT_ATTEMPTS},
      {"on-demand-after", required_argument, NULL, OPT_OD_AFTER},
      {"ec2-endpoint", required_argument, NULL, OPT_EC2_ENDPOINT},
      CLOUD_LONG_OPTIONS,
  };
  int o, r = 0;

  optind = 1;
  opterr = 0;
  while (r == 0 && (o = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
    switch (o) {
    case 'h':
      fputs(aws_usage, stdout);
      return 1;
    case OPT_LT:
      if (optarg[0] == '\0' || strlen(optarg) > 128)
        return spotctl_usage("relaunch: --launch-template: 1 to 128 "
                             "characters");
      a->lt = optarg;
      break;
    case OPT_LT_VERSION:
      a->lt_version = optarg;
      break;
    case OPT_TYPES:
    case OPT_SUBNETS:
    case OPT_ZONES: {
      size_t k = (size_t)(o - OPT_TYPES);
      char **dst = k == 0 ? a->types : k == 1 ? a->subnets : a->zones;
      size_t *n = k == 0 ? &a->n_types : k == 1 ? &a->n_subnets : &a->n_zones;

      free(a->lists[k]);
      a->lists[k] = strdup(optarg);
      if (a->lists[k] == NULL)
        return spotctl_fail("relaunch: out of memory");
      r = split(a->lists[k], dst, n, argv[optind - 1]);
      break;
    }
    case OPT_ATTEMPTS:
      r = cloud_parse_num("--attempts", optarg, 1, 20, &a->attempts);
      break;
    case OPT_OD_AFTER:
      r = cloud_parse_num("--on-demand-after", optarg, 0, 20, &a->od_after);
      break;
    case OPT_EC2_ENDPOINT:
      a->ec2_endpoint = optarg;
      break;
    default:
      r = cloud_option(&a->c, o, optarg);
      if (r == 1)
        return spotctl_bad_option("relaunch", argv);
    }
  }
  if (r != 0)
    return r;
  if (optind < argc)
    return spotctl_usage("relaunch: unexpected argument '%s'", argv[optind]);
  if (a->lt == NULL)
    return spotctl_usage("relaunch: --backend aws needs --launch-template "
                         "NAME|lt-ID");
  if (a->n_subnets > 0 && a->n_zones > 0)
    return spotctl_usage("relaunch: --subnets and --zones exclude each other");
  return 0;
}

/* ---------------------------------------------------------------- IMDS */

static int
imds_get(struct aws_relaunch *a, const char *base, const char *token,
         const char *path, char *out, size_t size)
{
  char url[600], hdr[200];
  const char *hdrs[] = {hdr};
  struct spot_http_req q;
  struct spot_http_reply rep;
  int r;

  snprintf(url, sizeof(url), "%s/latest/meta-data/%s", base, path);
  snprintf(hdr, sizeof(hdr), "X-aws-ec2-metadata-token: %s", token);
  memset(&q, 0, sizeof(q));
  q.method = "GET";
  q.url = url;
  q.headers = hdrs;
  q.n_headers = 1;
  q.timeout_ms = 2000;
  q.max_reply = 256;
  q.no_proxy = true;
  r = spot_http_once(a->c.conn.http, &q, &rep);
  explicit_bzero(hdr, sizeof(hdr));
  if (r == 0 && rep.status != 200)
    r = -ENOENT;
  if (r == 0) {
    spot_strlcpy(out, spot_buf_str(&rep.body), size);
    out[strcspn(out, "\r\n ")] = '\0';
  }
  spot_buf_fini(&rep.body);
  return r;
}

/* This instance's pool: instance-type and placement/availability-zone. */
static void
read_this_pool(struct aws_relaunch *a)
{
  const char *base = a->c.metadata_url;
  const char *hdrs[] = {"X-aws-ec2-metadata-token-ttl-seconds: 60"};
  struct spot_http_req q;
  struct spot_http_reply rep;
  char url[600], token[128] = "";
  int r;

  if (base == NULL)
    base = getenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
  if (base == NULL || base[0] == '\0')
    base = SPOT_AWS_IMDS_URL;
  snprintf(url, sizeof(url), "%s/latest/api/token", base);
  memset(&q, 0, sizeof(q));
  q.method = "PUT";
  q.url = url;
  q.headers = hdrs;
  q.n_headers = 1;
  q.timeout_ms = 2000;
  q.max_reply = sizeof(token) - 1;
  q.no_proxy = true;
  r = spot_http_once(a->c.conn.http, &q, &rep);
  if (r == 0 && rep.status == 200)
    spot_strlcpy(token, spot_buf_str(&rep.body), sizeof(token));
  if (rep.body.data != NULL)
    explicit_bzero(rep.body.data, rep.body.len);
  spot_buf_fini(&rep.body);
  if (token[0] == '\0' ||
      imds_get(a, base, token, "instance-type", a->reclaimed.type,
               sizeof(a->reclaimed.type)) < 0 ||
      imds_get(a, base, token, "placement/availability-zone", a->reclaimed.az,
               sizeof(a->reclaimed.az)) < 0) {
    memset(&a->reclaimed, 0, sizeof(a->reclaimed));
    relaunch_say("warning: instance metadata (%s) did not give this instance's "
                 "type and zone: the reclaimed pool cannot be skipped",
                 base);
  } else {
    (void)imds_get(a, base, token, "instance-id", a->instance_id,
                   sizeof(a->instance_id));
  }
  explicit_bzero(token, sizeof(token));
}

/* --------------------------------------------------------------- pools */

/* A pool's name for the record: the template's type is taken to be this
 * instance's (the usual case: one template per job). EC2 echoes an
 * override that named a subnet without its zone: the zone is the one
 * --subnets gave that subnet, so a failed pool is recorded (and skipped)
 * under the name it was asked by. */
static const char *
pool_key(const struct aws_relaunch *a, const struct spot_ec2_pool *p, char *buf,
         size_t size)
{
  struct spot_ec2_pool q = *p;

  if (q.type[0] == '\0')
    spot_strlcpy(q.type, a->reclaimed.type, sizeof(q.type));
  for (size_t i = 0; q.az[0] == '\0' && q.subnet[0] != '\0' && i < a->n_pools;
       i++)
    if (strcmp(a->pools[i].subnet, q.subnet) == 0)
      spot_strlcpy(q.az, a->pools[i].az, sizeof(q.az));
  return spot_ec2_pool_name(&q, buf, size);
}

static void
build_pools(struct aws_relaunch *a)
{
  size_t nt = a->n_types > 0 ? a->n_types : 1;
  size_t nz = a->n_subnets > 0 ? a->n_subnets : a->n_zones > 0 ? a->n_zones : 1;

  if (a->n_types == 0 && a->n_subnets == 0 && a->n_zones == 0) {
    relaunch_say("warning: no --instance-types, --subnets or --zones: the "
                 "launch template alone, which may land in the pool just "
                 "reclaimed");
    return; /* no override at all */
  }
  /* types first: the user's order of types is the priority order, each
   * across every zone */
  for (size_t t = 0; t < nt; t++)
    for (size_t z = 0; z < nz && a->n_pools < SPOT_EC2_POOLS_MAX; z++) {
      struct spot_ec2_pool *p = &a->pools[a->n_pools++];

      memset(p, 0, sizeof(*p));
      if (a->n_types > 0)
        spot_strlcpy(p->type, a->types[t], sizeof(p->type));
      if (a->n_subnets > 0) {
        char *at = strchr(a->subnets[z], '@');
        size_t sl =
            at != NULL ? (size_t)(at - a->subnets[z]) : strlen(a->subnets[z]);

        snprintf(p->subnet, sizeof(p->subnet), "%.*s", (int)sl, a->subnets[z]);
        if (at != NULL)
          spot_strlcpy(p->az, at + 1, sizeof(p->az));
      } else if (a->n_zones > 0) {
        spot_strlcpy(p->az, a->zones[z], sizeof(p->az));
      }
    }
}

/* The pools worth asking now: not reclaimed, not failed lately. */
static size_t
usable_pools(struct aws_relaunch *a, bool on_demand, struct spot_ec2_pool *out)
{
  int64_t since = spot_now_wall_ms() - a->c.failed_ttl_s * 1000;
  char name[80], rec[80];
  size_t n = 0;

  spot_ec2_pool_name(&a->reclaimed, rec, sizeof(rec));
  for (size_t i = 0; i < a->n_pools; i++) {
    pool_key(a, &a->pools[i], name, sizeof(name));
    if (a->reclaimed.type[0] != '\0' && strcmp(name, rec) == 0)
      continue;
    /* on-demand: spot capacity failures say nothing about it */
    if (!on_demand && spot_relaunch_record_failed(&a->c.rec, name, since))
      continue;
    out[n++] = a->pools[i];
  }
  return n;
}

/* ------------------------------------------------------------ request */

static const char *
first_line(const char *s, char *buf, size_t size)
{
  size_t n = strcspn(s, "\r\n");

  if (n >= size)
    n = size - 1;
  memcpy(buf, s, n);
  buf[n] = '\0';
  return buf;
}

/* One CreateFleet, retried while throttled or failing inside AWS.
 * 0 with *rep filled (a fleet answer or an error document), or an exit
 * status after one line. */
static int
create_fleet(struct aws_relaunch *a, const char *form,
             struct spot_ec2_reply *rep)
{
  const char *hdrs[] = {
      "Content-Type: application/x-www-form-urlencoded; charset=utf-8"};
  const struct spot_creds *cr = NULL;
  struct spot_creds_provider *prov = spot_aws_creds_provider(a->c.conn.aws);
  struct spot_http_req q;
  struct spot_http_reply hr;
  char line[300], snip[128], tokhdr[4200];
  const char *hdrs2[2] = {hdrs[0], tokhdr};
  int r;

  for (unsigned attempt = 0;; attempt++) {
    uint64_t wait;

    if (prov->get(prov, &cr) < 0)
      return spotctl_fail("relaunch: no AWS credentials for EC2");
    memset(&q, 0, sizeof(q));
    q.method = "POST";
    q.url = a->endpoint;
    q.headers = hdrs;
    q.n_headers = 1;
    q.body = form;
    q.body_len = strlen(form);
    q.sigv4 = a->sigv4;
    q.user = cr->access_key;
    q.password = cr->secret_key;
    q.max_reply = SPOT_EC2_REPLY_MAX;
    q.timeout_ms =
        (long)(cloud_ms_left(&a->c) < CALL_TIMEOUT_MS ? cloud_ms_left(&a->c) + 1
                                                      : CALL_TIMEOUT_MS);
    /* session tokens ride in their own header (signed by curl) */
    if (cr->session_token != NULL && cr->session_token[0] != '\0') {
      snprintf(tokhdr, sizeof(tokhdr), "X-Amz-Security-Token: %s",
               cr->session_token);
      q.headers = hdrs2;
      q.n_headers = 2;
    }
    r = spot_http_once(a->c.conn.http, &q, &hr);
    explicit_bzero(tokhdr, sizeof(tokhdr));
    if (r == 0 &&
        spot_ec2_reply_parse(spot_buf_str(&hr.body), hr.body.len, rep) == 0) {
      bool retry = hr.status >= 500 ||
                   (rep->is_error &&
                    spot_ec2_classify(rep->code) == SPOT_EC2_CLASS_RETRY);

      if (!retry) {
        spot_buf_fini(&hr.body);
        return 0;
      }
      snprintf(line, sizeof(line), "HTTP %ld %s", hr.status, rep->code);
    } else if (r == 0) {
      snprintf(line, sizeof(line), "HTTP %ld, unreadable answer: %s", hr.status,
               first_line(spot_buf_str(&hr.body), snip, sizeof(snip)));
      if (hr.status < 500 && hr.status != 429) {
        spot_buf_fini(&hr.body);
        return spotctl_fail("relaunch: EC2 %s: %s", a->endpoint, line);
      }
    } else {
      snprintf(line, sizeof(line), "%s", hr.error);
    }
    spot_buf_fini(&hr.body);
    wait = spot_backoff_ms(attempt, BACKOFF_BASE_MS, BACKOFF_CAP_MS,
                           spot_random_u32());
    if (cloud_ms_left(&a->c) < wait + 1000)
      return spotctl_fail("relaunch: EC2 CreateFleet did not get through "
                          "in time (last: %s)",
                          line);
    relaunch_say("EC2 CreateFleet: %s: retrying in %" PRIu64 " ms", line, wait);
    usleep((useconds_t)(wait * 1000));
  }
}

/* A reply's failure, one line. Returns an exit status. */
static int
fail_reply(struct aws_relaunch *a, const char *code, const char *msg)
{
  char m[220];

  first_line(msg, m, sizeof(m));
  switch (spot_ec2_classify(code)) {
  case SPOT_EC2_CLASS_AUTH:
    return spotctl_fail("relaunch: EC2 refused CreateFleet: %s: %s (the "
                        "instance role needs ec2:CreateFleet, "
                        "ec2:RunInstances, ec2:CreateTags and iam:PassRole; "
                        "see README, Relaunch on AWS / GCP)",
                        code, m);
  case SPOT_EC2_CLASS_TEMPLATE:
    return spotctl_fail("relaunch: launch template '%s': %s: %s", a->lt, code,
                        m);
  default:
    return spotctl_fail("relaunch: EC2 CreateFleet failed: %s: %s", code, m);
  }
}

/* What attempt() returns besides 0 (launched) and exit statuses (> 0,
 * after their one line). */
enum {
  ATT_NO_CAPACITY = -1, /* no pool had room (recorded) */
  ATT_NO_POOLS = -2,    /* every pool is excluded */
};

/* One attempt: 0 launched, ATT_*, or an exit status. */
static int
attempt(struct aws_relaunch *a, unsigned n, bool on_demand)
{
  static const char *const keys[] = {"spotd-job", "spotd-store"};
  const char *vals[] = {a->c.job, a->c.store};
  struct spot_ec2_pool use[SPOT_EC2_POOLS_MAX];
  struct spot_ec2_fleet_req q;
  struct spot_ec2_reply *rep;
  struct spot_buf form;
  char token[SPOT_EC2_TOKEN_LEN + 1], name[80], key[SPOT_EC2_TOKEN_LEN + 1];
  size_t nu = usable_pools(a, on_demand, use);
  uint64_t t0 = spot_now_mono_ms();
  int r;

  if (a->n_pools > 0 && nu == 0)
    return ATT_NO_POOLS;
  memset(&q, 0, sizeof(q));
  if (spot_ec2_client_token(a->c.job, a->c.ckpt, a->c.reason, n, token,
                            sizeof(token)) < 0)
    return spotctl_fail("relaunch: cannot derive the ClientToken");
  q.client_token = token;
  if (strncmp(a->lt, "lt-", 3) == 0)
    q.lt_id = a->lt;
  else
    q.lt_name = a->lt;
  q.lt_version = a->lt_version;
  q.pools = use;
  q.n_pools = a->n_pools > 0 ? nu : 0;
  q.on_demand = on_demand;
  q.tag_keys = keys;
  q.tag_values = vals;
  q.n_tags = 2;
  spot_buf_init(&form, 64 * 1024);
  if (spot_ec2_fleet_form(&q, &form) < 0) {
    spot_buf_fini(&form);
    return spotctl_fail("relaunch: cannot build the CreateFleet request");
  }
  if (a->c.dry_run) {
    printf("would POST to %s (SigV4 %s):\n%s\n", a->endpoint, a->sigv4,
           spot_buf_str(&form));
    spot_buf_fini(&form);
    return 0;
  }
  rep = calloc(1, sizeof(*rep));
  if (rep == NULL) {
    spot_buf_fini(&form);
    return spotctl_fail("relaunch: out of memory");
  }
  relaunch_say("EC2 CreateFleet (%s, %zu pools, ClientToken %s)",
               on_demand ? "on-demand" : "spot", q.n_pools, token);
  r = create_fleet(a, spot_buf_str(&form), rep);
  spot_buf_fini(&form);
  if (r != 0)
    goto out;
  if (rep->is_error) {
    r = fail_reply(a, rep->code, rep->message);
    goto out;
  }
  for (size_t i = 0; i < rep->n_errors; i++) {
    struct spot_ec2_item *e = &rep->errors[i];
    enum spot_ec2_class k = spot_ec2_classify(e->code);

    pool_key(a, &e->pool, name, sizeof(name));
    if (k == SPOT_EC2_CLASS_AUTH || k == SPOT_EC2_CLASS_TEMPLATE) {
      r = fail_reply(a, e->code, e->message);
      goto out;
    }
    relaunch_say("pool %s: %s (%s)", name, e->code,
                 k == SPOT_EC2_CLASS_CAPACITY ? "no capacity, skipped from now"
                                              : "failed, skipped from now");
    if (!on_demand)
      spot_relaunch_record_fail(&a->c.rec, name, e->code, spot_now_wall_ms());
  }
  if (rep->n_instances > 0) {
    struct spot_ec2_item *it = &rep->instances[0];

    pool_key(a, &it->pool, name, sizeof(name));
    relaunch_say("launched %s in pool %s (%s) by fleet %s in %.1f s",
                 it->instance_id, name, it->lifecycle[0] ? it->lifecycle : "?",
                 rep->fleet_id, (double)(spot_now_mono_ms() - t0) / 1000.0);
    if (cloud_key(&a->c, key, sizeof(key)) == 0)
      spot_relaunch_record_done(&a->c.rec, key, it->instance_id, name,
                                spot_now_wall_ms());
    printf("%s\n", spotctl_esc(it->instance_id));
    r = 0;
  } else {
    r = ATT_NO_CAPACITY;
  }
out:
  free(rep);
  return r;
}

static int
setup_endpoint(struct aws_relaunch *a)
{
  const char *ep = a->ec2_endpoint, *region = spot_aws_region(a->c.conn.aws);
  char err[256];

  if (ep == NULL)
    ep = getenv("AWS_ENDPOINT_URL_EC2");
  if (ep != NULL && ep[0] != '\0') {
    if (spot_aws_endpoint_check(ep, a->endpoint, sizeof(a->endpoint), err,
                                sizeof(err)) < 0)
      return spotctl_fail("relaunch: EC2 endpoint: %s", err);
    /* the Query API is POST / */
    spot_strlcpy(a->endpoint + strlen(a->endpoint), "/",
                 sizeof(a->endpoint) - strlen(a->endpoint));
  } else {
    snprintf(a->endpoint, sizeof(a->endpoint), "https://ec2.%s.amazonaws.com/",
             region);
  }
  snprintf(a->sigv4, sizeof(a->sigv4), "aws:amz:%s:ec2", region);
  return 0;
}

static int
run(struct aws_relaunch *a)
{
  char key[SPOT_EC2_TOKEN_LEN + 1], rec[80];
  const struct spot_relaunch_done *d;
  int r = 1;
  unsigned n;

  if ((r = setup_endpoint(a)) != 0)
    return r;
  read_this_pool(a);
  relaunch_say("aws backend: job %s, checkpoint %s, reason %s; this instance "
               "%s in pool %s; %.1f s budget",
               a->c.job, a->c.ckpt[0] ? a->c.ckpt : "(none)", a->c.reason,
               a->instance_id[0] ? a->instance_id : "?",
               spot_ec2_pool_name(&a->reclaimed, rec, sizeof(rec)),
               (double)cloud_ms_left(&a->c) / 1000.0);
  if (!a->c.dry_run)
    cloud_record_load(&a->c);
  if (cloud_key(&a->c, key, sizeof(key)) == 0 &&
      (d = spot_relaunch_record_find(&a->c.rec, key)) != NULL) {
    relaunch_say("nothing to do: this preemption was relaunched already as %s "
                 "in pool %s",
                 d->instance, d->pool);
    return 0;
  }
  if (a->reclaimed.type[0] != '\0')
    spot_relaunch_record_fail(&a->c.rec, rec, "reclaimed", spot_now_wall_ms());
  build_pools(a);
  r = ATT_NO_CAPACITY;
  for (n = 0; r == ATT_NO_CAPACITY && n < (unsigned)a->attempts; n++) {
    if (a->od_after > 0 && a->spot_failures >= (unsigned)a->od_after)
      break;
    r = attempt(a, n, false);
    if (r == ATT_NO_CAPACITY)
      a->spot_failures++;
    if (a->c.dry_run)
      return r < 0 ? 0 : r;
  }
  if (r < 0 && a->od_after > 0) {
    relaunch_say("no spot capacity after %u attempts: trying on-demand",
                 a->spot_failures);
    r = attempt(a, OD_ATTEMPT, true);
  }
  cloud_record_save(&a->c);
  if (r < 0)
    return spotctl_fail("relaunch: no capacity in any pool (%zu pools, "
                        "%u spot attempts): nothing was launched; the job "
                        "stays in the store: relaunch it later by hand "
                        "with the same command",
                        a->n_pools, a->spot_failures);
  return r;
}

int
spotctl_relaunch_aws(int argc, char **argv)
{
  struct aws_relaunch *a = calloc(1, sizeof(*a));
  int r;

  if (a == NULL)
    return spotctl_fail("relaunch: out of memory");
  a->attempts = DEFAULT_ATTEMPTS;
  a->c.failed_ttl_s = CLOUD_DEFAULT_FAILED_TTL_S;
  r = parse_args(argc, argv, a);
  if (r == 1)
    r = SPOTCTL_EXIT_OK;
  else if (r == 0 && (r = cloud_read_env(&a->c)) == 0 &&
           (r = cloud_open(&a->c, true)) == 0)
    r = run(a);
  cloud_close(&a->c);
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(a->lists); i++)
    free(a->lists[i]);
  free(a);
  return r;
}
