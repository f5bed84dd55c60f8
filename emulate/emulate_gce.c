/* spotd-emulate --provider gcp: the Compute Engine API next to the
 * metadata server, for rehearsing `spotctl relaunch --backend gcp` and
 * testing it. Shapes from the compute v1 reference: instances.insert
 * (POST .../zones/Z/instances?sourceInstanceTemplate=..&requestId=..)
 * answers an Operation (kind compute#operation, status PENDING, RUNNING,
 * DONE; a stockout is the DONE operation's error.errors[0].code
 * ZONE_RESOURCE_POOL_EXHAUSTED with httpErrorStatusCode 503),
 * zoneOperations.get, instances.get, instanceTemplates.get, and error
 * documents {"error": {"code", "message", "errors": [{"message",
 * "domain", "reason"}], "status"}}. Calls need "Authorization: Bearer T"
 * with a token the metadata server issued.
 *
 * One template, "spotd-template" (its metadata has a startup-script
 * item). Operations are DONE 300 ms after the insert.
 *
 * Control (POST, query parameters), GET state:
 *   /__emulate/gce/capacity?zone=Z&available=0|1
 *   /__emulate/gce/fault?throttle=N&deny=0|1
 *   /__emulate/gce/boot?instance=NAME   the metadata server answers as it
 *   GET /__emulate/gce/state   {"requests":[...],"instances":[...]}
 * Metadata: instance/service-accounts/default/token, instance/zone,
 * instance/name, instance/attributes/[KEY] of the current identity. */
#include "emulate_cloud.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <jansson.h>

#include "core/util.h"

#define INST_MAX 32
#define OPS_MAX 128
#define ZONES_MAX 32
#define TOKENS_MAX 16
#define OP_DELAY_MS 300
#define TEMPLATE "spotd-template"
#define PROJECT "spotd-emulated"
#define BASE "https://www.googleapis.com/compute/v1/"

struct ginst {
  char name[64], zone[64], status[16];
  json_t *items; /* metadata items */
  char provisioning[16];
};

struct gop {
  char name[64], zone[64], target[64], request_id[48];
  char error[64];
  uint64_t done_at;
  int64_t insert_wall;
};

struct gce {
  pthread_mutex_t mu;
  char region[32], name0[64], zone0[64];
  char full[ZONES_MAX][64];
  unsigned n_full;
  unsigned throttle;
  bool deny;
  char tokens[TOKENS_MAX][80];
  unsigned next_token;
  struct ginst inst[INST_MAX];
  unsigned n_inst;
  int ident;
  struct gop ops[OPS_MAX];
  unsigned n_ops;
  json_t *log;
};

static struct gce g;

void
emu_gce_init(const char *region, const char *vm_name)
{
  memset(&g, 0, sizeof(g));
  pthread_mutex_init(&g.mu, NULL);
  spot_strlcpy(g.region, region, sizeof(g.region));
  spot_strlcpy(g.name0, vm_name, sizeof(g.name0));
  snprintf(g.zone0, sizeof(g.zone0), "%s-a", region);
  g.ident = -1;
  g.log = json_array();
}

void
emu_gce_fini(void)
{
  for (unsigned i = 0; i < g.n_inst; i++)
    json_decref(g.inst[i].items);
  json_decref(g.log);
  pthread_mutex_destroy(&g.mu);
}

static void
rand_hex(char *out, size_t nhex)
{
  unsigned char raw[32];

  if (nhex / 2 > sizeof(raw) ||
      getrandom(raw, nhex / 2, 0) != (ssize_t)(nhex / 2))
    memset(raw, 0x3c, sizeof(raw));
  for (size_t i = 0; i < nhex / 2; i++)
    snprintf(out + 2 * i, 3, "%02x", raw[i]);
}

static enum MHD_Result
send_json(struct MHD_Connection *c, unsigned status, json_t *j)
{
  struct MHD_Response *r;
  enum MHD_Result ret;
  char *s = j != NULL ? json_dumps(j, JSON_INDENT(1)) : NULL;

  json_decref(j);
  if (s == NULL)
    return MHD_NO;
  r = MHD_create_response_from_buffer(strlen(s), s, MHD_RESPMEM_MUST_FREE);
  if (r == NULL) {
    free(s);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", "application/json; charset=UTF-8");
  ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result
send_error(struct MHD_Connection *c, unsigned code, const char *reason,
           const char *status, const char *msg)
{
  return send_json(c, code,
                   json_pack("{s:{s:i,s:s,s:[{s:s,s:s,s:s}],s:s}}", "error",
                             "code", (int)code, "message", msg, "errors",
                             "message", msg, "domain", "global", "reason",
                             reason, "status", status));
}

static bool
zone_full(const char *z)
{
  for (unsigned i = 0; i < g.n_full; i++)
    if (strcmp(g.full[i], z) == 0)
      return true;
  return false;
}

static json_t *
op_json(const struct gop *o, const char *project)
{
  bool done = spot_now_mono_ms() >= o->done_at;
  char when[32];
  json_t *j;

  spot_rfc3339_format(o->insert_wall, when, sizeof(when));
  j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:i,s:s,s:s}", "kind",
                "compute#operation", "id", "7321457385420131642", "name",
                o->name, "zone", "", "operationType", "insert", "targetLink",
                "", "status", done ? "DONE" : "RUNNING", "progress",
                done ? 100 : 0, "insertTime", when, "selfLink", "");
  if (j == NULL)
    return NULL;
  json_object_set_new(
      j, "zone", json_sprintf(BASE "projects/%s/zones/%s", project, o->zone));
  json_object_set_new(j, "targetLink",
                      json_sprintf(BASE "projects/%s/zones/%s/instances/%s",
                                   project, o->zone, o->target));
  json_object_set_new(j, "selfLink",
                      json_sprintf(BASE "projects/%s/zones/%s/operations/%s",
                                   project, o->zone, o->name));
  if (done && o->error[0] != '\0') {
    char msg[256];

    snprintf(msg, sizeof(msg),
             "The zone 'projects/%s/zones/%s' does not have enough resources "
             "available to fulfill the request.  Try a different zone, or "
             "try again later.",
             project, o->zone);
    json_object_set_new(j, "error",
                        json_pack("{s:[{s:s,s:s}]}", "errors", "code", o->error,
                                  "message", msg));
    json_object_set_new(j, "httpErrorStatusCode", json_integer(503));
    json_object_set_new(j, "httpErrorMessage",
                        json_string("SERVICE UNAVAILABLE"));
  }
  return j;
}

static struct ginst *
find_inst(const char *zone, const char *name)
{
  for (unsigned i = 0; i < g.n_inst; i++)
    if (strcmp(g.inst[i].name, name) == 0 &&
        (zone == NULL || strcmp(g.inst[i].zone, zone) == 0))
      return &g.inst[i];
  return NULL;
}

static json_t *
template_json(const char *project)
{
  json_t *t = json_pack(
      "{s:s,s:s,s:s,s:{s:s,s:{s:[{s:s,s:s}]},s:{s:s}}}", "kind",
      "compute#instanceTemplate", "name", TEMPLATE, "selfLink", "",
      "properties", "machineType", "n2-standard-4", "metadata", "items", "key",
      "startup-script", "value", "#!/bin/sh\nsystemctl start spotd\n",
      "scheduling", "provisioningModel", "STANDARD");

  if (t != NULL)
    json_object_set_new(
        t, "selfLink",
        json_sprintf(BASE "projects/%s/global/instanceTemplates/" TEMPLATE,
                     project));
  return t;
}

static enum MHD_Result
do_insert(struct MHD_Connection *c, const char *project, const char *zone,
          const char *body, size_t len, json_t *jl)
{
  const char *src = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND,
                                                "sourceInstanceTemplate");
  const char *rid =
      MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "requestId");
  json_t *b = json_loadb(body, len, 0, NULL), *sched, *items;
  const char *name = json_string_value(json_object_get(b, "name"));
  const char *pm;
  char want[256], hex[17];
  struct gop *o;
  enum MHD_Result ret;

  json_object_set_new(jl, "zone", json_string(zone));
  json_object_set_new(jl, "request_id", json_string(rid ? rid : ""));
  snprintf(want, sizeof(want), "projects/%s/global/instanceTemplates/" TEMPLATE,
           project);
  if (rid != NULL)
    for (unsigned i = 0; i < g.n_ops; i++)
      if (strcmp(g.ops[i].request_id, rid) == 0 &&
          strcmp(g.ops[i].zone, zone) == 0) {
        json_decref(b);
        json_object_set_new(jl, "result", json_string("replayed"));
        return send_json(c, 200, op_json(&g.ops[i], project));
      }
  if (src == NULL || (strcmp(src, want) != 0 && strstr(src, want) == NULL)) {
    json_decref(b);
    snprintf(want, sizeof(want),
             "Invalid value for field 'resource.sourceInstanceTemplate': "
             "'%s'. The referenced instanceTemplate resource cannot be found.",
             src ? src : "");
    json_object_set_new(jl, "result", json_string("no-template"));
    return send_error(c, 404, "notFound", "NOT_FOUND", want);
  }
  if (name == NULL || find_inst(zone, name) != NULL) {
    snprintf(want, sizeof(want),
             "The resource 'projects/%s/zones/%s/instances/%s' already "
             "exists",
             project, zone, name ? name : "");
    json_decref(b);
    json_object_set_new(jl, "result", json_string("exists"));
    return name == NULL
               ? send_error(c, 400, "required", "INVALID_ARGUMENT",
                            "Required field 'resource.name' not "
                            "specified")
               : send_error(c, 409, "alreadyExists", "ALREADY_EXISTS", want);
  }
  sched = json_object_get(b, "scheduling");
  pm = json_string_value(json_object_get(sched, "provisioningModel"));
  items = json_object_get(json_object_get(b, "metadata"), "items");
  json_object_set_new(jl, "name", json_string(name));
  json_object_set_new(jl, "provisioning", json_string(pm ? pm : ""));
  json_object_set(jl, "metadata", items != NULL ? items : json_null());
  if (g.n_ops == OPS_MAX || g.n_inst == INST_MAX) {
    json_decref(b);
    return send_error(c, 403, "quotaExceeded", "RESOURCE_EXHAUSTED",
                      "emulator full");
  }
  o = &g.ops[g.n_ops++];
  memset(o, 0, sizeof(*o));
  rand_hex(hex, 16);
  snprintf(o->name, sizeof(o->name), "operation-%" PRId64 "-%s",
           spot_now_wall_ms(), hex);
  spot_strlcpy(o->zone, zone, sizeof(o->zone));
  spot_strlcpy(o->target, name, sizeof(o->target));
  spot_strlcpy(o->request_id, rid ? rid : "", sizeof(o->request_id));
  o->done_at = spot_now_mono_ms() + OP_DELAY_MS;
  o->insert_wall = spot_now_wall_ms();
  if (zone_full(zone)) {
    spot_strlcpy(o->error, "ZONE_RESOURCE_POOL_EXHAUSTED", sizeof(o->error));
    json_object_set_new(jl, "result", json_string("no-capacity"));
  } else {
    struct ginst *in = &g.inst[g.n_inst++];

    memset(in, 0, sizeof(*in));
    spot_strlcpy(in->name, name, sizeof(in->name));
    spot_strlcpy(in->zone, zone, sizeof(in->zone));
    spot_strlcpy(in->status, "PROVISIONING", sizeof(in->status));
    spot_strlcpy(in->provisioning, pm ? pm : "STANDARD",
                 sizeof(in->provisioning));
    in->items = items != NULL ? json_deep_copy(items) : json_array();
    json_object_set_new(jl, "result", json_string("launched"));
    emu_boot_launched(in->name, true);
  }
  json_decref(b);
  ret = send_json(c, 200, op_json(o, project));
  return ret;
}

static bool
token_ok(struct MHD_Connection *c)
{
  const char *a =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");

  if (a == NULL || strncmp(a, "Bearer ", 7) != 0)
    return false;
  for (unsigned i = 0; i < TOKENS_MAX; i++)
    if (g.tokens[i][0] != '\0' && strcmp(g.tokens[i], a + 7) == 0)
      return true;
  return false;
}

static enum MHD_Result
api(struct MHD_Connection *c, const char *method, const char *url,
    const char *body, size_t len)
{
  char project[64] = "", zone[64] = "", kind[32] = "", name[128] = "";
  json_t *jl = json_pack("{s:s,s:s}", "method", method, "path", url);
  enum MHD_Result ret;
  int n;

  n = sscanf(url, "/compute/v1/projects/%63[^/]/zones/%63[^/]/%31[^/]/%127s",
             project, zone, kind, name);
  if (n < 3 &&
      sscanf(url, "/compute/v1/projects/%63[^/]/global/instanceTemplates/%127s",
             project, name) == 2)
    spot_strlcpy(kind, "instanceTemplates", sizeof(kind));
  if (!token_ok(c)) {
    json_object_set_new(jl, "result", json_string("unauthenticated"));
    ret = send_error(c, 401, "authError", "UNAUTHENTICATED",
                     "Request is missing required authentication credential. "
                     "Expected OAuth 2 access token.");
  } else if (g.throttle > 0) {
    g.throttle--;
    json_object_set_new(jl, "result", json_string("throttled"));
    ret = send_error(c, 429, "rateLimitExceeded", "RESOURCE_EXHAUSTED",
                     "Rate Limit Exceeded");
  } else if (g.deny) {
    char msg[256];

    if (strcmp(kind, "instanceTemplates") == 0)
      snprintf(msg, sizeof(msg),
               "Required 'compute.instanceTemplates.get' permission for "
               "'projects/%s/global/instanceTemplates/%s'",
               project, name);
    else
      snprintf(msg, sizeof(msg),
               "Required 'compute.instances.create' permission for "
               "'projects/%s/zones/%s/instances'",
               project, zone);
    json_object_set_new(jl, "result", json_string("denied"));
    ret = send_error(c, 403, "forbidden", "PERMISSION_DENIED", msg);
  } else if (strcmp(kind, "instanceTemplates") == 0 &&
             strcmp(method, "GET") == 0) {
    ret = strcmp(name, TEMPLATE) == 0
              ? send_json(c, 200, template_json(project))
              : send_error(c, 404, "notFound", "NOT_FOUND",
                           "The resource 'projects/.../global/"
                           "instanceTemplates/...' was not found");
  } else if (strcmp(kind, "instances") == 0 && n == 3 &&
             strcmp(method, "POST") == 0) {
    ret = do_insert(c, project, zone, body, len, jl);
  } else if (strcmp(kind, "operations") == 0 && n == 4 &&
             strcmp(method, "GET") == 0) {
    ret = MHD_NO;
    for (unsigned i = 0; i < g.n_ops; i++)
      if (strcmp(g.ops[i].name, name) == 0)
        ret = send_json(c, 200, op_json(&g.ops[i], project));
    if (ret == MHD_NO)
      ret = send_error(c, 404, "notFound", "NOT_FOUND",
                       "The resource was not found");
  } else if (strcmp(kind, "instances") == 0 && n == 4 &&
             strcmp(method, "GET") == 0) {
    struct ginst *in = find_inst(zone, name);

    ret = in == NULL
              ? send_error(c, 404, "notFound", "NOT_FOUND",
                           "The resource was not found")
              : send_json(c, 200,
                          json_pack("{s:s,s:s,s:s,s:{s:O},s:{s:s}}", "kind",
                                    "compute#instance", "name", in->name,
                                    "status", in->status, "metadata", "items",
                                    in->items, "scheduling",
                                    "provisioningModel", in->provisioning));
  } else {
    ret = send_error(c, 404, "notFound", "NOT_FOUND", "Not Found");
  }
  json_array_append_new(g.log, jl);
  return ret;
}

static enum MHD_Result
send_text(struct MHD_Connection *c, unsigned status, const char *body)
{
  struct MHD_Response *r;
  enum MHD_Result ret;

  r = MHD_create_response_from_buffer(strlen(body), (void *)body,
                                      MHD_RESPMEM_MUST_COPY);
  if (r == NULL)
    return MHD_NO;
  ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

static enum MHD_Result
state(struct MHD_Connection *c)
{
  json_t *j =
      json_pack("{s:O,s:[],s:s}", "requests", g.log, "instances", "identity",
                g.ident < 0 ? g.name0 : g.inst[g.ident].name);

  for (unsigned i = 0; j != NULL && i < g.n_inst; i++) {
    struct ginst *in = &g.inst[i];
    json_t *md = json_object();
    size_t k;
    json_t *it;

    json_array_foreach(in->items, k, it)
    {
      const char *key = json_string_value(json_object_get(it, "key"));

      if (key != NULL)
        json_object_set(md, key, json_object_get(it, "value"));
    }
    json_array_append_new(json_object_get(j, "instances"),
                          json_pack("{s:s,s:s,s:s,s:o}", "name", in->name,
                                    "zone", in->zone, "provisioning",
                                    in->provisioning, "metadata", md));
  }
  return send_json(c, 200, j);
}

static enum MHD_Result
control(struct MHD_Connection *c, const char *method, const char *url)
{
  const char *v;

  if (strcmp(url, "/__emulate/gce/state") == 0)
    return state(c);
  if (strcmp(method, "POST") != 0)
    return send_text(c, 405, "use POST\n");
  if (strcmp(url, "/__emulate/gce/capacity") == 0) {
    const char *z =
        MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "zone");
    const char *a =
        MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "available");

    if (z == NULL || a == NULL || strlen(z) >= 64)
      return send_text(c, 400, "zone and available\n");
    for (unsigned i = 0; i < g.n_full; i++)
      if (strcmp(g.full[i], z) == 0) {
        spot_strlcpy(g.full[i], g.full[--g.n_full], sizeof(g.full[i]));
        break;
      }
    if (strcmp(a, "0") == 0 && g.n_full < ZONES_MAX)
      spot_strlcpy(g.full[g.n_full++], z, sizeof(g.full[0]));
  } else if (strcmp(url, "/__emulate/gce/fault") == 0) {
    int64_t n;

    v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "throttle");
    if (v != NULL && spot_parse_int64(v, 0, 1000, &n) == 0)
      g.throttle = (unsigned)n;
    v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "deny");
    if (v != NULL)
      g.deny = strcmp(v, "1") == 0;
  } else if (strcmp(url, "/__emulate/gce/boot") == 0) {
    v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "instance");
    for (unsigned i = 0; v != NULL && i < g.n_inst; i++)
      if (strcmp(g.inst[i].name, v) == 0) {
        g.ident = (int)i;
        spot_strlcpy(g.inst[i].status, "RUNNING", sizeof(g.inst[i].status));
        return send_text(c, 200, "ok\n");
      }
    return send_text(c, 404, "no such instance\n");
  } else {
    return send_text(c, 404, "unknown control\n");
  }
  return send_text(c, 200, "ok\n");
}

int
emu_gce_boot(const char *name)
{
  int r = -ENOENT;

  pthread_mutex_lock(&g.mu);
  for (unsigned i = 0; i < g.n_inst; i++)
    if (strcmp(g.inst[i].name, name) == 0) {
      g.ident = (int)i;
      spot_strlcpy(g.inst[i].status, "RUNNING", sizeof(g.inst[i].status));
      r = 0;
    }
  pthread_mutex_unlock(&g.mu);
  return r;
}

bool
emu_gce_handle(struct MHD_Connection *c, const char *method, const char *url,
               const char *body, size_t len, enum MHD_Result *ret)
{
  if (strncmp(url, "/__emulate/gce/", 15) == 0) {
    pthread_mutex_lock(&g.mu);
    *ret = control(c, method, url);
    pthread_mutex_unlock(&g.mu);
    return true;
  }
  if (strncmp(url, "/compute/v1/", 12) == 0) {
    pthread_mutex_lock(&g.mu);
    *ret = api(c, method, url, body, len);
    pthread_mutex_unlock(&g.mu);
    return true;
  }
  return false;
}

const char *
emu_gce_meta(const char *key, char *buf, size_t size)
{
  const struct ginst *in;
  const char *v = NULL;

  pthread_mutex_lock(&g.mu);
  in = g.ident >= 0 ? &g.inst[g.ident] : NULL;
  if (strcmp(key, "instance/service-accounts/default/token") == 0) {
    char tok[80], hex[41];

    rand_hex(hex, 40);
    snprintf(tok, sizeof(tok), "ya29.emulated-%s", hex);
    spot_strlcpy(g.tokens[g.next_token], tok, sizeof(g.tokens[0]));
    g.next_token = (g.next_token + 1) % TOKENS_MAX;
    snprintf(buf, size,
             "{\"access_token\":\"%s\",\"expires_in\":3599,"
             "\"token_type\":\"Bearer\"}",
             tok);
    v = buf;
  } else if (strcmp(key, "instance/zone") == 0) {
    snprintf(buf, size, "projects/1234567890/zones/%s",
             in != NULL ? in->zone : g.zone0);
    v = buf;
  } else if (strcmp(key, "instance/name") == 0) {
    spot_strlcpy(buf, in != NULL ? in->name : g.name0, size);
    v = buf;
  } else if (strcmp(key, "project/project-id") == 0) {
    spot_strlcpy(buf, PROJECT, size);
    v = buf;
  } else if (strncmp(key, "instance/attributes/", 20) == 0 && in != NULL) {
    size_t k;
    json_t *it;

    buf[0] = '\0';
    json_array_foreach(in->items, k, it)
    {
      const char *ik = json_string_value(json_object_get(it, "key"));
      const char *iv = json_string_value(json_object_get(it, "value"));

      if (ik == NULL || iv == NULL)
        continue;
      if (key[20] == '\0')
        snprintf(buf + strlen(buf), size - strlen(buf), "%s\n", ik);
      else if (strcmp(ik, key + 20) == 0) {
        spot_strlcpy(buf, iv, size);
        v = buf;
      }
    }
    if (key[20] == '\0')
      v = buf;
  }
  pthread_mutex_unlock(&g.mu);
  return v;
}
