/* spotd-emulate --provider aws: the EC2 Query API next to IMDS, for
 * rehearsing `spotctl relaunch --backend aws` and testing it. Shapes from
 * the EC2 API reference (2016-11-15): CreateFleet (type instant),
 * DescribeInstances, TerminateInstances, and the error document
 * <Response><Errors><Error><Code/><Message/></Error></Errors>
 * <RequestID/></Response>. Requests are POST / with a form body, signed
 * with SigV4 (service ec2): the signature is checked when the emulator
 * knows the secret (SPOT_EMULATE_AWS_ACCESS_KEY_ID/_SECRET_ACCESS_KEY).
 *
 * Capacity: every pool (TYPE/ZONE) has room unless switched off. One
 * launch template, "spotd-template" (lt-0123456789abcdef0, m5.large).
 * Subnets are known by a control call (id -> zone).
 *
 * Control (POST, query parameters), GET state:
 *   /__emulate/ec2/capacity?pool=TYPE/ZONE&available=0|1[&lifecycle=L]
 *   /__emulate/ec2/subnet?id=subnet-...&zone=Z
 *   /__emulate/ec2/fault?throttle=N&deny=0|1   N next calls throttled
 *   /__emulate/ec2/identity?type=T&zone=Z      this instance (IMDS)
 *   /__emulate/ec2/boot?instance=ID            IMDS answers as ID now
 *   GET /__emulate/ec2/state   {"requests":[...],"instances":[...]}
 * IMDS: instance-type, placement/availability-zone, instance-id and
 * tags/instance[/KEY] of the current identity. */
#include "emulate_cloud.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <jansson.h>

#include "core/buf.h"
#include "core/sigv4.h"
#include "core/util.h"

#define INST_MAX 64
#define POOLS_MAX 64
#define SUBNETS_MAX 32
#define TOKENS_MAX 64
#define TAGS_MAX 8
#define PARAMS_MAX 512
#define NS "http://ec2.amazonaws.com/doc/2016-11-15/"
#define LT_NAME "spotd-template"
#define LT_ID "lt-0123456789abcdef0"
#define LT_TYPE "m5.large"

struct inst {
  char id[24], type[32], az[32], subnet[32], lifecycle[16], state[16];
  char tag_k[TAGS_MAX][128], tag_v[TAGS_MAX][640];
  unsigned n_tags;
  int64_t launched_ms;
};

struct tok {
  char token[72];
  char *params; /* the request's form, for IdempotentParameterMismatch */
  char *reply;
};

struct ec2 {
  pthread_mutex_t mu;
  char region[32];
  char ak[128], sk[256], token[2048];
  struct {
    char pool[80], lifecycle[16];
  } full[POOLS_MAX];
  unsigned n_full;
  struct {
    char id[32], az[32];
  } subnets[SUBNETS_MAX];
  unsigned n_subnets;
  unsigned throttle;
  bool deny;
  struct inst inst[INST_MAX];
  unsigned n_inst;
  int ident; /* -1: the first instance (identity below) */
  char id0[32], type0[32], az0[32];
  struct tok tokens[TOKENS_MAX];
  unsigned n_tokens;
  json_t *log;
};

static struct ec2 g;

struct kv {
  char *k[PARAMS_MAX], *v[PARAMS_MAX];
  size_t n;
  char *mem;
};

void
emu_ec2_init(const char *region, const char *instance_id)
{
  const char *ak = getenv("SPOT_EMULATE_AWS_ACCESS_KEY_ID");
  const char *sk = getenv("SPOT_EMULATE_AWS_SECRET_ACCESS_KEY");

  memset(&g, 0, sizeof(g));
  pthread_mutex_init(&g.mu, NULL);
  spot_strlcpy(g.region, region, sizeof(g.region));
  spot_strlcpy(g.id0, instance_id, sizeof(g.id0));
  spot_strlcpy(g.type0, LT_TYPE, sizeof(g.type0));
  snprintf(g.az0, sizeof(g.az0), "%sa", region);
  g.ident = -1;
  if (ak != NULL && sk != NULL) {
    const char *tok = getenv("SPOT_EMULATE_AWS_SESSION_TOKEN");

    spot_strlcpy(g.ak, ak, sizeof(g.ak));
    spot_strlcpy(g.sk, sk, sizeof(g.sk));
    if (tok != NULL)
      spot_strlcpy(g.token, tok, sizeof(g.token));
  }
  g.log = json_array();
}

static void
rand_hex(char *out, size_t nhex)
{
  unsigned char raw[32];

  if (nhex / 2 > sizeof(raw) ||
      getrandom(raw, nhex / 2, 0) != (ssize_t)(nhex / 2))
    memset(raw, 0x5a, sizeof(raw));
  for (size_t i = 0; i < nhex / 2; i++)
    snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

static void
request_id(char *out)
{
  char h[33];

  rand_hex(h, 32);
  snprintf(out, 40, "%.8s-%.4s-%.4s-%.4s-%.12s", h, h + 8, h + 12, h + 16,
           h + 20);
}

static void
xml_esc(struct spot_buf *b, const char *s)
{
  for (; *s; s++) {
    switch (*s) {
    case '<':
      spot_buf_appends(b, "&lt;");
      break;
    case '>':
      spot_buf_appends(b, "&gt;");
      break;
    case '&':
      spot_buf_appends(b, "&amp;");
      break;
    case '"':
      spot_buf_appends(b, "&quot;");
      break;
    default:
      spot_buf_append(b, s, 1);
    }
  }
}

static enum MHD_Result
send_xml(struct MHD_Connection *c, unsigned status, const char *body)
{
  struct MHD_Response *r;
  enum MHD_Result ret;

  r = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                      MHD_RESPMEM_MUST_COPY);
  if (r == NULL)
    return MHD_NO;
  MHD_add_response_header(r, "Content-Type", "text/xml;charset=UTF-8");
  MHD_add_response_header(r, "Server", "AmazonEC2");
  ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result
send_error(struct MHD_Connection *c, unsigned status, const char *code,
           const char *msg)
{
  struct spot_buf b;
  char rid[40];
  enum MHD_Result ret;

  request_id(rid);
  spot_buf_init(&b, 1 << 16);
  spot_buf_appends(&b, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                       "<Response><Errors><Error><Code>");
  xml_esc(&b, code);
  spot_buf_appends(&b, "</Code><Message>");
  xml_esc(&b, msg);
  spot_buf_printf(&b,
                  "</Message></Error></Errors><RequestID>%s</RequestID>"
                  "</Response>",
                  rid);
  ret = send_xml(c, status, spot_buf_str(&b));
  spot_buf_fini(&b);
  return ret;
}

static void
log_request(const char *action, json_t *extra)
{
  json_t *o = extra != NULL ? extra : json_object();

  json_object_set_new(o, "action", json_string(action));
  json_object_set_new(o, "at", json_integer(spot_now_wall_ms()));
  json_array_append_new(g.log, o);
}

/* ---- the form ---- */

static int
form_parse(const char *body, size_t len, struct kv *f)
{
  struct spot_buf d;
  char *p;

  memset(f, 0, sizeof(*f));
  f->mem = malloc(len + 1);
  if (f->mem == NULL)
    return -1;
  memcpy(f->mem, body, len);
  f->mem[len] = '\0';
  spot_buf_init(&d, len + 1);
  for (p = f->mem; p != NULL && *p != '\0' && f->n < PARAMS_MAX;) {
    char *amp = strchr(p, '&'), *eq;

    if (amp != NULL)
      *amp = '\0';
    eq = strchr(p, '=');
    if (eq != NULL) {
      *eq = '\0';
      /* decode the value in place (never longer) */
      spot_buf_reset(&d);
      if (spot__uri_decode_n(eq + 1, strlen(eq + 1), &d) == 0) {
        memcpy(eq + 1, spot_buf_str(&d), d.len + 1);
        f->k[f->n] = p;
        f->v[f->n++] = eq + 1;
      }
    }
    p = amp != NULL ? amp + 1 : NULL;
  }
  spot_buf_fini(&d);
  return 0;
}

static const char *fget(const struct kv *f, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static const char *
fget(const struct kv *f, const char *fmt, ...)
{
  char name[160];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(name, sizeof(name), fmt, ap);
  va_end(ap);
  for (size_t i = 0; i < f->n; i++)
    if (strcmp(f->k[i], name) == 0)
      return f->v[i];
  return NULL;
}

/* ---- SigV4 ---- */

/* "ok", or why not. */
static const char *
check_sig(struct MHD_Connection *c, const char *body, size_t len)
{
  const char *auth =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  const char *date =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Amz-Date");
  char ak[128], day[16], region[32], service[32], signed_h[512];
  struct spot__sigv4_header hs[16];
  struct spot__sigv4_request rq;
  struct spot_buf want;
  char hash[65];
  const char *sig, *p;
  size_t nh = 0;
  bool ok;

  if (auth == NULL || date == NULL)
    return "missing";
  if (sscanf(auth,
             "AWS4-HMAC-SHA256 Credential=%127[^/]/%15[^/]/%31[^/]/%31[^/]/"
             "aws4_request, SignedHeaders=%511[^,]",
             ak, day, region, service, signed_h) != 5)
    return "malformed";
  if (strcmp(service, "ec2") != 0 || strcmp(region, g.region) != 0)
    return "wrong scope";
  if (g.sk[0] == '\0')
    return "ok"; /* no secret to check against */
  if (strcmp(ak, g.ak) != 0)
    return "unknown key";
  /* temporary credentials: the token must be the role's, and signed */
  p = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Amz-Security-Token");
  if (p != NULL && (strcmp(p, g.token) != 0 ||
                    strstr(signed_h, "x-amz-security-token") == NULL))
    return "bad token";
  sig = strstr(auth, "Signature=");
  if (sig == NULL)
    return "malformed";
  sig += 10;
  for (p = signed_h; *p != '\0' && nh < SPOT_ARRAY_SIZE(hs);) {
    static char names[16][64];
    size_t n = strcspn(p, ";");

    snprintf(names[nh], sizeof(names[nh]), "%.*s", (int)n, p);
    hs[nh].name = names[nh];
    hs[nh].value = MHD_lookup_connection_value(c, MHD_HEADER_KIND, names[nh]);
    if (hs[nh].value == NULL)
      return "signed header missing";
    nh++;
    p += n;
    if (*p == ';')
      p++;
  }
  spot__sha256_hex(body, len, hash);
  memset(&rq, 0, sizeof(rq));
  rq.method = "POST";
  rq.path = "/";
  rq.headers = hs;
  rq.n_headers = nh;
  rq.payload_hash = hash;
  spot_buf_init(&want, 4096);
  ok = spot__sigv4_authorization(ak, g.sk, date, region, service, &rq, &want) ==
           0 &&
       (p = strstr(spot_buf_str(&want), "Signature=")) != NULL &&
       strcmp(p + 10, sig) == 0;
  spot_buf_fini(&want);
  return ok ? "ok" : "mismatch";
}

/* ---- CreateFleet ---- */

struct ovr {
  char type[32], az[32], subnet[32];
  bool az_given; /* the request named the zone (not only a subnet) */
  double prio;
  int order;
};

static bool
pool_full(const char *type, const char *az, const char *lifecycle)
{
  char pool[80];

  snprintf(pool, sizeof(pool), "%s/%s", type, az);
  for (unsigned i = 0; i < g.n_full; i++)
    if (strcmp(g.full[i].pool, pool) == 0 &&
        strcmp(g.full[i].lifecycle, lifecycle) == 0)
      return true;
  return false;
}

static const char *
subnet_az(const char *id)
{
  for (unsigned i = 0; i < g.n_subnets; i++)
    if (strcmp(g.subnets[i].id, id) == 0)
      return g.subnets[i].az;
  return NULL;
}

static void
lt_and_overrides(struct spot_buf *b, const struct ovr *o)
{
  spot_buf_appends(b,
                   "<launchTemplateAndOverrides><launchTemplateSpecification>"
                   "<launchTemplateId>" LT_ID "</launchTemplateId>"
                   "<version>1</version></launchTemplateSpecification>"
                   "<overrides>");
  /* EC2 echoes the override as requested: an override that named a
   * subnet comes back with its subnetId and no availabilityZone. */
  spot_buf_printf(b, "<instanceType>%s</instanceType>", o->type);
  if (o->subnet[0] != '\0')
    spot_buf_printf(b, "<subnetId>%s</subnetId>", o->subnet);
  if (o->az_given)
    spot_buf_printf(b, "<availabilityZone>%s</availabilityZone>", o->az);
  if (o->prio > 0)
    spot_buf_printf(b, "<priority>%.1f</priority>", o->prio);
  spot_buf_appends(b, "</overrides></launchTemplateAndOverrides>");
}

static int
ovr_cmp(const void *a, const void *b)
{
  const struct ovr *x = a, *y = b;

  if (x->prio != y->prio)
    return x->prio < y->prio ? -1 : 1;
  return x->order - y->order;
}

static struct tok *
find_token(const char *t)
{
  for (unsigned i = 0; i < g.n_tokens; i++)
    if (strcmp(g.tokens[i].token, t) == 0)
      return &g.tokens[i];
  return NULL;
}

static size_t
read_overrides(const struct kv *f, struct ovr *ov, json_t *jl)
{
  size_t n = 0;

  for (int i = 1; i <= POOLS_MAX; i++) {
    const char *t =
        fget(f, "LaunchTemplateConfigs.1.Overrides.%d.InstanceType", i);
    const char *s = fget(f, "LaunchTemplateConfigs.1.Overrides.%d.SubnetId", i);
    const char *z =
        fget(f, "LaunchTemplateConfigs.1.Overrides.%d.AvailabilityZone", i);
    const char *p = fget(f, "LaunchTemplateConfigs.1.Overrides.%d.Priority", i);
    struct ovr *o = &ov[n];

    if (t == NULL && s == NULL && z == NULL && p == NULL)
      break;
    memset(o, 0, sizeof(*o));
    spot_strlcpy(o->type, t != NULL ? t : LT_TYPE, sizeof(o->type));
    if (s != NULL) {
      spot_strlcpy(o->subnet, s, sizeof(o->subnet));
      spot_strlcpy(o->az, subnet_az(s) ? subnet_az(s) : "", sizeof(o->az));
    } else {
      snprintf(o->az, sizeof(o->az), "%s", z != NULL ? z : g.az0);
      o->az_given = z != NULL;
    }
    o->prio = p != NULL ? strtod(p, NULL) : 0;
    o->order = i;
    json_array_append_new(jl, json_pack("{s:s,s:s,s:s}", "type", o->type,
                                        "zone", o->az, "subnet", o->subnet));
    n++;
  }
  if (n == 0) { /* the template alone */
    memset(&ov[0], 0, sizeof(ov[0]));
    spot_strlcpy(ov[0].type, LT_TYPE, sizeof(ov[0].type));
    spot_strlcpy(ov[0].az, g.az0, sizeof(ov[0].az));
    n = 1;
  }
  qsort(ov, n, sizeof(ov[0]), ovr_cmp);
  return n;
}

static void
launch(const struct kv *f, const struct ovr *o, const char *lifecycle,
       struct spot_buf *ok)
{
  struct inst *in = &g.inst[g.n_inst++];
  char hex[18];

  memset(in, 0, sizeof(*in));
  rand_hex(hex, 16);
  snprintf(in->id, sizeof(in->id), "i-0%.16s", hex);
  spot_strlcpy(in->type, o->type, sizeof(in->type));
  spot_strlcpy(in->az, o->az, sizeof(in->az));
  spot_strlcpy(in->subnet, o->subnet, sizeof(in->subnet));
  spot_strlcpy(in->lifecycle, lifecycle, sizeof(in->lifecycle));
  spot_strlcpy(in->state, "running", sizeof(in->state));
  in->launched_ms = spot_now_wall_ms();
  for (int t = 1; t <= 4; t++) {
    const char *rt = fget(f, "TagSpecification.%d.ResourceType", t);

    if (rt == NULL)
      break;
    if (strcmp(rt, "instance") != 0)
      continue;
    for (int k = 1; k <= TAGS_MAX && in->n_tags < TAGS_MAX; k++) {
      const char *key = fget(f, "TagSpecification.%d.Tag.%d.Key", t, k);
      const char *val = fget(f, "TagSpecification.%d.Tag.%d.Value", t, k);

      if (key == NULL)
        break;
      spot_strlcpy(in->tag_k[in->n_tags], key, sizeof(in->tag_k[0]));
      spot_strlcpy(in->tag_v[in->n_tags++], val != NULL ? val : "",
                   sizeof(in->tag_v[0]));
    }
  }
  spot_buf_appends(ok, "<fleetInstanceSet><item>");
  lt_and_overrides(ok, o);
  spot_buf_printf(ok,
                  "<lifecycle>%s</lifecycle><instanceIds><item>%s</item>"
                  "</instanceIds><instanceType>%s</instanceType></item>"
                  "</fleetInstanceSet>",
                  lifecycle, in->id, in->type);
}

static enum MHD_Result
create_fleet(struct MHD_Connection *c, const struct kv *f, const char *body,
             json_t *jl)
{
  const char *tok = fget(f, "ClientToken"), *type = fget(f, "Type");
  const char *name = fget(f, "LaunchTemplateConfigs.1."
                             "LaunchTemplateSpecification.LaunchTemplateName");
  const char *id = fget(f, "LaunchTemplateConfigs.1."
                           "LaunchTemplateSpecification.LaunchTemplateId");
  const char *kind = fget(f, "TargetCapacitySpecification."
                             "DefaultTargetCapacityType");
  const char *total =
      fget(f, "TargetCapacitySpecification.TotalTargetCapacity");
  const char *lifecycle =
      kind != NULL && strcmp(kind, "on-demand") == 0 ? "on-demand" : "spot";
  struct ovr ov[POOLS_MAX];
  struct spot_buf b, errs, ok;
  char rid[40], fleet[48], hex[33], msg[300];
  struct tok *t;
  size_t n;
  enum MHD_Result ret;

  json_object_set_new(jl, "client_token", json_string(tok ? tok : ""));
  json_object_set_new(jl, "lifecycle", json_string(lifecycle));
  json_object_set_new(jl, "overrides", json_array());
  if (tok != NULL && (t = find_token(tok)) != NULL) {
    if (strcmp(t->params, body) != 0) {
      json_object_set_new(jl, "result", json_string("mismatch"));
      return send_error(c, 400, "IdempotentParameterMismatch",
                        "The client token you have provided is associated "
                        "with a request that has different parameters.");
    }
    json_object_set_new(jl, "result", json_string("replayed"));
    return send_xml(c, 200, t->reply);
  }
  if (type == NULL || strcmp(type, "instant") != 0 || total == NULL ||
      strcmp(total, "1") != 0) {
    json_object_set_new(jl, "result", json_string("invalid"));
    return send_error(c, 400, "InvalidParameterValue",
                      "The emulator supports Type=instant with "
                      "TotalTargetCapacity=1.");
  }
  if ((name == NULL || strcmp(name, LT_NAME) != 0) &&
      (id == NULL || strcmp(id, LT_ID) != 0)) {
    json_object_set_new(jl, "result", json_string("no-template"));
    if (id != NULL) {
      snprintf(msg, sizeof(msg),
               "The specified launch template, with template ID %s, does "
               "not exist.",
               id);
      return send_error(c, 400, "InvalidLaunchTemplateId.NotFound", msg);
    }
    snprintf(msg, sizeof(msg),
             "The specified launch template, with template name %s, does "
             "not exist.",
             name != NULL ? name : "");
    return send_error(c, 400, "InvalidLaunchTemplateName.NotFoundException",
                      msg);
  }
  n = read_overrides(f, ov, json_object_get(jl, "overrides"));
  spot_buf_init(&errs, 1 << 20);
  spot_buf_init(&ok, 1 << 16);
  for (size_t i = 0; i < n && ok.len == 0; i++) {
    const char *code = NULL;

    if (ov[i].az[0] == '\0') {
      code = "InvalidSubnetID.NotFound";
      snprintf(msg, sizeof(msg), "The subnet ID '%s' does not exist",
               ov[i].subnet);
    } else if (pool_full(ov[i].type, ov[i].az, lifecycle) ||
               g.n_inst >= INST_MAX) {
      code = "InsufficientInstanceCapacity";
      snprintf(msg, sizeof(msg),
               "We currently do not have sufficient %s capacity in the "
               "Availability Zone you requested (%s). Our system will be "
               "working on provisioning additional capacity.",
               ov[i].type, ov[i].az);
    }
    if (code != NULL) {
      spot_buf_appends(&errs, "<item>");
      lt_and_overrides(&errs, &ov[i]);
      spot_buf_printf(&errs,
                      "<lifecycle>%s</lifecycle><errorCode>%s"
                      "</errorCode><errorMessage>",
                      lifecycle, code);
      xml_esc(&errs, msg);
      spot_buf_appends(&errs, "</errorMessage></item>");
      continue;
    }
    launch(f, &ov[i], lifecycle, &ok);
    emu_boot_launched(g.inst[g.n_inst - 1].id, false);
    json_object_set_new(jl, "instance", json_string(g.inst[g.n_inst - 1].id));
  }
  request_id(rid);
  rand_hex(hex, 32);
  snprintf(fleet, sizeof(fleet), "fleet-%.8s-%.4s-%.4s-%.4s-%.12s", hex,
           hex + 8, hex + 12, hex + 16, hex + 20);
  spot_buf_init(&b, 1 << 20);
  spot_buf_printf(&b,
                  "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                  "<CreateFleetResponse xmlns=\"" NS "\">\n"
                  "    <requestId>%s</requestId>\n"
                  "    <fleetId>%s</fleetId>\n",
                  rid, fleet);
  if (errs.len > 0)
    spot_buf_printf(&b, "    <errorSet>%s</errorSet>\n", spot_buf_str(&errs));
  else
    spot_buf_appends(&b, "    <errorSet/>\n");
  spot_buf_printf(&b, "    %s\n</CreateFleetResponse>\n",
                  ok.len > 0 ? spot_buf_str(&ok) : "<fleetInstanceSet/>");
  json_object_set_new(jl, "result",
                      json_string(ok.len > 0 ? "launched" : "no-capacity"));
  if (tok != NULL && g.n_tokens < TOKENS_MAX) {
    t = &g.tokens[g.n_tokens++];
    spot_strlcpy(t->token, tok, sizeof(t->token));
    t->params = strdup(body);
    t->reply = strdup(spot_buf_str(&b));
  }
  ret = send_xml(c, 200, spot_buf_str(&b));
  spot_buf_fini(&b);
  spot_buf_fini(&errs);
  spot_buf_fini(&ok);
  return ret;
}

/* ---- DescribeInstances, TerminateInstances ---- */

static bool
wanted(const struct kv *f, const struct inst *in)
{
  bool any_id = false;

  for (int i = 1; i <= 100; i++) {
    const char *id = fget(f, "InstanceId.%d", i);

    if (id == NULL)
      break;
    any_id = true;
    if (strcmp(id, in->id) == 0)
      return true;
  }
  if (any_id)
    return false;
  for (int i = 1; i <= 10; i++) {
    const char *name = fget(f, "Filter.%d.Name", i);
    const char *val = fget(f, "Filter.%d.Value.1", i);
    bool match = false;

    if (name == NULL)
      break;
    if (strncmp(name, "tag:", 4) == 0 && val != NULL) {
      for (unsigned k = 0; k < in->n_tags; k++)
        if (strcmp(in->tag_k[k], name + 4) == 0 &&
            strcmp(in->tag_v[k], val) == 0)
          match = true;
    } else if (strcmp(name, "instance-state-name") == 0 && val != NULL) {
      match = strcmp(in->state, val) == 0;
    }
    if (!match)
      return false;
  }
  return true;
}

static int
state_code(const char *s)
{
  return strcmp(s, "running") == 0         ? 16
         : strcmp(s, "shutting-down") == 0 ? 32
         : strcmp(s, "terminated") == 0    ? 48
                                           : 0;
}

static enum MHD_Result
describe(struct MHD_Connection *c, const struct kv *f)
{
  struct spot_buf b;
  char rid[40], when[32];
  enum MHD_Result ret;

  request_id(rid);
  spot_buf_init(&b, 1 << 20);
  spot_buf_printf(&b,
                  "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                  "<DescribeInstancesResponse xmlns=\"" NS "\">\n"
                  "<requestId>%s</requestId><reservationSet>",
                  rid);
  for (unsigned i = 0; i < g.n_inst; i++) {
    struct inst *in = &g.inst[i];

    if (!wanted(f, in))
      continue;
    spot_rfc3339_format(in->launched_ms, when, sizeof(when));
    spot_buf_printf(
        &b,
        "<item><reservationId>r-0%.16s</reservationId>"
        "<ownerId>123456789012</ownerId><groupSet/><instancesSet><item>"
        "<instanceId>%s</instanceId><imageId>ami-0abcdef1234567890</imageId>"
        "<instanceState><code>%d</code><name>%s</name></instanceState>"
        "<instanceType>%s</instanceType><launchTime>%s</launchTime>"
        "<placement><availabilityZone>%s</availabilityZone><tenancy>default"
        "</tenancy></placement>",
        in->id + 3, in->id, state_code(in->state), in->state, in->type, when,
        in->az);
    if (in->subnet[0] != '\0')
      spot_buf_printf(&b, "<subnetId>%s</subnetId>", in->subnet);
    if (strcmp(in->lifecycle, "spot") == 0)
      spot_buf_appends(&b, "<instanceLifecycle>spot</instanceLifecycle>");
    spot_buf_appends(&b, "<tagSet>");
    for (unsigned k = 0; k < in->n_tags; k++) {
      spot_buf_appends(&b, "<item><key>");
      xml_esc(&b, in->tag_k[k]);
      spot_buf_appends(&b, "</key><value>");
      xml_esc(&b, in->tag_v[k]);
      spot_buf_appends(&b, "</value></item>");
    }
    spot_buf_appends(&b, "</tagSet></item></instancesSet></item>");
  }
  spot_buf_appends(&b, "</reservationSet></DescribeInstancesResponse>\n");
  ret = send_xml(c, 200, spot_buf_str(&b));
  spot_buf_fini(&b);
  return ret;
}

static enum MHD_Result
terminate(struct MHD_Connection *c, const struct kv *f)
{
  struct spot_buf b;
  char rid[40];
  enum MHD_Result ret;

  request_id(rid);
  spot_buf_init(&b, 1 << 20);
  spot_buf_printf(&b,
                  "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                  "<TerminateInstancesResponse xmlns=\"" NS "\">\n"
                  "<requestId>%s</requestId><instancesSet>",
                  rid);
  for (int i = 1; i <= 100; i++) {
    const char *id = fget(f, "InstanceId.%d", i);
    struct inst *in = NULL;

    if (id == NULL)
      break;
    for (unsigned k = 0; k < g.n_inst; k++)
      if (strcmp(g.inst[k].id, id) == 0)
        in = &g.inst[k];
    if (in == NULL) {
      char msg[128];

      spot_buf_fini(&b);
      snprintf(msg, sizeof(msg), "The instance ID '%s' does not exist", id);
      return send_error(c, 400, "InvalidInstanceID.NotFound", msg);
    }
    spot_buf_printf(&b,
                    "<item><instanceId>%s</instanceId><currentState><code>32"
                    "</code><name>shutting-down</name></currentState>"
                    "<previousState><code>%d</code><name>%s</name>"
                    "</previousState></item>",
                    id, state_code(in->state), in->state);
    spot_strlcpy(in->state, "shutting-down", sizeof(in->state));
  }
  spot_buf_appends(&b, "</instancesSet></TerminateInstancesResponse>\n");
  ret = send_xml(c, 200, spot_buf_str(&b));
  spot_buf_fini(&b);
  return ret;
}

static enum MHD_Result
api(struct MHD_Connection *c, const char *body, size_t len)
{
  struct kv f;
  const char *action, *sig;
  json_t *jl;
  enum MHD_Result ret;

  if (form_parse(body, len, &f) < 0)
    return MHD_NO;
  action = fget(&f, "Action");
  jl = json_object();
  sig = check_sig(c, body, len);
  json_object_set_new(jl, "signature", json_string(sig));
  json_object_set_new(
      jl, "session_token",
      json_boolean(MHD_lookup_connection_value(
                       c, MHD_HEADER_KIND, "X-Amz-Security-Token") != NULL));
  if (action == NULL) {
    ret = send_error(c, 400, "MissingAction",
                     "The request must contain the "
                     "parameter Action");
  } else if (strcmp(sig, "ok") != 0) {
    ret = strcmp(sig, "missing") == 0 || strcmp(sig, "bad token") == 0
              ? send_error(c, 401, "AuthFailure",
                           "AWS was not able to validate the provided "
                           "access credentials")
              : send_error(c, 403, "SignatureDoesNotMatch",
                           "The request signature we calculated does not "
                           "match the signature you provided.");
  } else if (fget(&f, "Version") == NULL ||
             strcmp(fget(&f, "Version"), "2016-11-15") != 0) {
    ret = send_error(c, 400, "InvalidParameterValue", "Bad Version");
  } else if (g.throttle > 0) {
    g.throttle--;
    json_object_set_new(jl, "result", json_string("throttled"));
    ret = send_error(c, 503, "RequestLimitExceeded", "Request limit exceeded.");
  } else if (g.deny) {
    json_object_set_new(jl, "result", json_string("denied"));
    ret = send_error(c, 403, "UnauthorizedOperation",
                     "You are not authorized to perform this operation. "
                     "Encoded authorization failure message: "
                     "emulated-denial");
  } else if (strcmp(action, "CreateFleet") == 0) {
    ret = create_fleet(c, &f, f.n > 0 ? body : "", jl);
  } else if (strcmp(action, "DescribeInstances") == 0) {
    ret = describe(c, &f);
  } else if (strcmp(action, "TerminateInstances") == 0) {
    ret = terminate(c, &f);
  } else {
    ret = send_error(c, 400, "InvalidAction",
                     "The action is not valid for this web service.");
  }
  log_request(action != NULL ? action : "", jl);
  free(f.mem);
  return ret;
}

/* ---- control ---- */

static const char *
qarg(struct MHD_Connection *c, const char *name)
{
  return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

static enum MHD_Result
send_text(struct MHD_Connection *c, unsigned status, const char *type,
          const char *body)
{
  struct MHD_Response *r;
  enum MHD_Result ret;

  r = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                      MHD_RESPMEM_MUST_COPY);
  if (r == NULL)
    return MHD_NO;
  MHD_add_response_header(r, "Content-Type", type);
  ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result
state(struct MHD_Connection *c)
{
  json_t *j = json_pack("{s:O,s:[],s:s}", "requests", g.log, "instances",
                        "identity", g.ident < 0 ? g.id0 : g.inst[g.ident].id);
  enum MHD_Result ret;
  char *s;

  for (unsigned i = 0; j != NULL && i < g.n_inst; i++) {
    struct inst *in = &g.inst[i];
    json_t *tags = json_object();

    for (unsigned k = 0; k < in->n_tags; k++)
      json_object_set_new(tags, in->tag_k[k], json_string(in->tag_v[k]));
    json_array_append_new(
        json_object_get(j, "instances"),
        json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:o}", "id", in->id, "type",
                  in->type, "zone", in->az, "subnet", in->subnet, "lifecycle",
                  in->lifecycle, "state", in->state, "tags", tags));
  }
  s = j != NULL ? json_dumps(j, JSON_COMPACT) : NULL;
  json_decref(j);
  if (s == NULL)
    return MHD_NO;
  ret = send_text(c, 200, "application/json", s);
  free(s);
  return ret;
}

static enum MHD_Result
control(struct MHD_Connection *c, const char *method, const char *url)
{
  const char *v;

  if (strcmp(url, "/__emulate/ec2/state") == 0)
    return state(c);
  if (strcmp(method, "POST") != 0)
    return send_text(c, 405, "text/plain", "use POST\n");
  if (strcmp(url, "/__emulate/ec2/capacity") == 0) {
    const char *pool = qarg(c, "pool"), *avail = qarg(c, "available");
    const char *lc = qarg(c, "lifecycle");

    if (pool == NULL || avail == NULL || strlen(pool) >= 80)
      return send_text(c, 400, "text/plain", "pool and available\n");
    if (lc == NULL)
      lc = "spot";
    for (unsigned i = 0; i < g.n_full; i++)
      if (strcmp(g.full[i].pool, pool) == 0 &&
          strcmp(g.full[i].lifecycle, lc) == 0) {
        g.full[i] = g.full[--g.n_full];
        break;
      }
    if (strcmp(avail, "0") == 0 && g.n_full < POOLS_MAX) {
      spot_strlcpy(g.full[g.n_full].pool, pool, sizeof(g.full[0].pool));
      spot_strlcpy(g.full[g.n_full++].lifecycle, lc,
                   sizeof(g.full[0].lifecycle));
    }
  } else if (strcmp(url, "/__emulate/ec2/subnet") == 0) {
    const char *id = qarg(c, "id"), *z = qarg(c, "zone");

    if (id == NULL || z == NULL || g.n_subnets == SUBNETS_MAX)
      return send_text(c, 400, "text/plain", "id and zone\n");
    spot_strlcpy(g.subnets[g.n_subnets].id, id, sizeof(g.subnets[0].id));
    spot_strlcpy(g.subnets[g.n_subnets++].az, z, sizeof(g.subnets[0].az));
  } else if (strcmp(url, "/__emulate/ec2/fault") == 0) {
    int64_t n;

    if ((v = qarg(c, "throttle")) != NULL &&
        spot_parse_int64(v, 0, 1000, &n) == 0)
      g.throttle = (unsigned)n;
    if ((v = qarg(c, "deny")) != NULL)
      g.deny = strcmp(v, "1") == 0;
  } else if (strcmp(url, "/__emulate/ec2/identity") == 0) {
    if ((v = qarg(c, "type")) != NULL)
      spot_strlcpy(g.type0, v, sizeof(g.type0));
    if ((v = qarg(c, "zone")) != NULL)
      spot_strlcpy(g.az0, v, sizeof(g.az0));
  } else if (strcmp(url, "/__emulate/ec2/boot") == 0) {
    v = qarg(c, "instance");
    for (unsigned i = 0; v != NULL && i < g.n_inst; i++)
      if (strcmp(g.inst[i].id, v) == 0) {
        g.ident = (int)i;
        return send_text(c, 200, "text/plain", "ok\n");
      }
    return send_text(c, 404, "text/plain", "no such instance\n");
  } else {
    return send_text(c, 404, "text/plain", "unknown control\n");
  }
  return send_text(c, 200, "text/plain", "ok\n");
}

int
emu_ec2_boot(const char *id)
{
  int r = -ENOENT;

  pthread_mutex_lock(&g.mu);
  for (unsigned i = 0; i < g.n_inst; i++)
    if (strcmp(g.inst[i].id, id) == 0) {
      g.ident = (int)i;
      r = 0;
    }
  pthread_mutex_unlock(&g.mu);
  return r;
}

bool
emu_ec2_handle(struct MHD_Connection *c, const char *method, const char *url,
               const char *body, size_t len, enum MHD_Result *ret)
{
  if (strncmp(url, "/__emulate/ec2/", 15) == 0) {
    pthread_mutex_lock(&g.mu);
    *ret = control(c, method, url);
    pthread_mutex_unlock(&g.mu);
    return true;
  }
  if (strcmp(url, "/") == 0 && strcmp(method, "POST") == 0) {
    pthread_mutex_lock(&g.mu);
    *ret = api(c, body, len);
    pthread_mutex_unlock(&g.mu);
    return true;
  }
  return false;
}

const char *
emu_ec2_imds(const char *path, char *buf, size_t size)
{
  const struct inst *in;
  const char *v = NULL;

  pthread_mutex_lock(&g.mu);
  in = g.ident >= 0 ? &g.inst[g.ident] : NULL;
  if (strcmp(path, "instance-type") == 0)
    v = in != NULL ? in->type : g.type0;
  else if (strcmp(path, "placement/availability-zone") == 0)
    v = in != NULL ? in->az : g.az0;
  else if (strcmp(path, "instance-id") == 0 && in != NULL)
    v = in->id;
  else if (strcmp(path, "tags/instance") == 0 ||
           strcmp(path, "tags/instance/") == 0) {
    buf[0] = '\0';
    for (unsigned k = 0; in != NULL && k < in->n_tags; k++)
      snprintf(buf + strlen(buf), size - strlen(buf), "%s%s", k ? "\n" : "",
               in->tag_k[k]);
    v = in != NULL ? buf : NULL;
    pthread_mutex_unlock(&g.mu);
    return v;
  } else if (strncmp(path, "tags/instance/", 14) == 0 && in != NULL) {
    for (unsigned k = 0; k < in->n_tags; k++)
      if (strcmp(in->tag_k[k], path + 14) == 0)
        v = in->tag_v[k];
  }
  if (v != NULL) {
    spot_strlcpy(buf, v, size);
    v = buf;
  }
  pthread_mutex_unlock(&g.mu);
  return v;
}

void
emu_ec2_fini(void)
{
  for (unsigned i = 0; i < g.n_tokens; i++) {
    free(g.tokens[i].params);
    free(g.tokens[i].reply);
  }
  json_decref(g.log);
  explicit_bzero(g.sk, sizeof(g.sk));
  explicit_bzero(g.token, sizeof(g.token));
  pthread_mutex_destroy(&g.mu);
}
