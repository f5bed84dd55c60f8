/* EC2 CreateFleet request and reply, the relaunch record. Pure. */
#include "core/ec2.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <expat.h>
#include <jansson.h>
#include <openssl/evp.h>

#include "core/sigv4.h"
#include "core/util.h"

#define TEXT_CAP 4096
#define PATH_CAP 256

/* ------------------------------------------------------------ request */

static int
param(struct spot_buf *b, const char *name, const char *value)
{
  int r;

  if (b->len > 0 && (r = spot_buf_appends(b, "&")) < 0)
    return r;
  if ((r = spot_buf_appends(b, name)) < 0 || (r = spot_buf_appends(b, "=")) < 0)
    return r;
  return spot__uri_encode_n(value, strlen(value), false, b);
}

/* name built from a format, e.g. "LaunchTemplateConfigs.1.Overrides.%zu.X" */
static int paramf(struct spot_buf *b, const char *value, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int
paramf(struct spot_buf *b, const char *value, const char *fmt, ...)
{
  char name[128];
  va_list ap;
  int n;

  va_start(ap, fmt);
  n = vsnprintf(name, sizeof(name), fmt, ap);
  va_end(ap);
  if (n < 0 || (size_t)n >= sizeof(name))
    return -EINVAL;
  return param(b, name, value);
}

#define LTC "LaunchTemplateConfigs.1."

static int
form_overrides(const struct spot_ec2_fleet_req *q, struct spot_buf *b)
{
  char prio[24];
  int r = 0;

  for (size_t i = 0; i < q->n_pools && r == 0; i++) {
    const struct spot_ec2_pool *p = &q->pools[i];
    size_t n = i + 1;

    if (p->type[0] != '\0')
      r = paramf(b, p->type, LTC "Overrides.%zu.InstanceType", n);
    if (r == 0 && p->subnet[0] != '\0')
      r = paramf(b, p->subnet, LTC "Overrides.%zu.SubnetId", n);
    else if (r == 0 && p->az[0] != '\0')
      r = paramf(b, p->az, LTC "Overrides.%zu.AvailabilityZone", n);
    snprintf(prio, sizeof(prio), "%zu", n);
    if (r == 0)
      r = paramf(b, prio, LTC "Overrides.%zu.Priority", n);
  }
  return r;
}

int
spot_ec2_fleet_form(const struct spot_ec2_fleet_req *q, struct spot_buf *b)
{
  const char *kind = q->on_demand ? "on-demand" : "spot";
  int r;

  if ((q->lt_id == NULL) == (q->lt_name == NULL) ||
      q->n_pools > SPOT_EC2_POOLS_MAX || q->client_token == NULL)
    return -EINVAL;
  spot_buf_reset(b);
  r = param(b, "Action", "CreateFleet");
  if (r == 0)
    r = param(b, "Version", SPOT_EC2_VERSION);
  if (r == 0)
    r = param(b, "ClientToken", q->client_token);
  if (r == 0)
    r = param(b, "Type", "instant");
  if (r == 0)
    r = param(b, "TargetCapacitySpecification.TotalTargetCapacity", "1");
  if (r == 0)
    r = param(b, "TargetCapacitySpecification.DefaultTargetCapacityType", kind);
  if (r == 0 && q->on_demand)
    r = param(b, "OnDemandOptions.AllocationStrategy", "prioritized");
  else if (r == 0)
    r = param(b, "SpotOptions.AllocationStrategy",
              "capacity-optimized-prioritized");
  if (r == 0 && q->lt_id != NULL)
    r = param(b, LTC "LaunchTemplateSpecification.LaunchTemplateId", q->lt_id);
  else if (r == 0)
    r = param(b, LTC "LaunchTemplateSpecification.LaunchTemplateName",
              q->lt_name);
  if (r == 0)
    r = param(b, LTC "LaunchTemplateSpecification.Version",
              q->lt_version != NULL ? q->lt_version : "$Default");
  if (r == 0)
    r = form_overrides(q, b);
  if (r == 0 && q->n_tags > 0)
    r = param(b, "TagSpecification.1.ResourceType", "instance");
  for (size_t i = 0; r == 0 && i < q->n_tags; i++) {
    r = paramf(b, q->tag_keys[i], "TagSpecification.1.Tag.%zu.Key", i + 1);
    if (r == 0)
      r = paramf(b, q->tag_values[i], "TagSpecification.1.Tag.%zu.Value",
                 i + 1);
  }
  return r;
}

/* -------------------------------------------------------------- reply */

struct ctx {
  XML_Parser p;
  struct spot_ec2_reply *out;
  char path[PATH_CAP]; /* "CreateFleetResponse/errorSet/item/..." */
  size_t plen[24];
  int depth;
  struct spot_buf text;
  struct spot_ec2_item cur;
  bool in_item;
  int err;
};

/* Cut between whole characters: a code cut inside one could not be
 * written to the relaunch record. */
static void
set_field(char *dst, size_t size, const char *v)
{
  spot_strlcpy_utf8(dst, v, size);
}

static void XMLCALL
on_start(void *data, const XML_Char *name, const XML_Char **attrs)
{
  struct ctx *c = data;
  size_t len = strlen(c->path), n = strlen(name);

  (void)attrs;
  if (c->depth == 0 && strcmp(name, "CreateFleetResponse") != 0 &&
      strcmp(name, "Response") != 0) {
    c->err = -EBADMSG;
    XML_StopParser(c->p, XML_FALSE);
    return;
  }
  if (c->depth == 0)
    c->out->is_error = strcmp(name, "Response") == 0;
  if ((size_t)c->depth >= SPOT_ARRAY_SIZE(c->plen) ||
      len + n + 2 > sizeof(c->path)) {
    c->err = -EBADMSG;
    XML_StopParser(c->p, XML_FALSE);
    return;
  }
  c->plen[c->depth++] = len;
  if (len > 0)
    c->path[len++] = '/';
  memcpy(c->path + len, name, n + 1);
  spot_buf_reset(&c->text);
  if (strcmp(c->path, "CreateFleetResponse/fleetInstanceSet/item") == 0 ||
      strcmp(c->path, "CreateFleetResponse/errorSet/item") == 0) {
    memset(&c->cur, 0, sizeof(c->cur));
    c->in_item = true;
  }
}

/* Fields of an item, by their path below the item. */
static void
item_field(struct spot_ec2_item *it, const char *rel, const char *v)
{
  static const char ov[] = "launchTemplateAndOverrides/overrides/";

  if (strncmp(rel, ov, sizeof(ov) - 1) == 0) {
    rel += sizeof(ov) - 1;
    if (strcmp(rel, "instanceType") == 0)
      set_field(it->pool.type, sizeof(it->pool.type), v);
    else if (strcmp(rel, "availabilityZone") == 0)
      set_field(it->pool.az, sizeof(it->pool.az), v);
    else if (strcmp(rel, "subnetId") == 0)
      set_field(it->pool.subnet, sizeof(it->pool.subnet), v);
  } else if (strcmp(rel, "lifecycle") == 0) {
    set_field(it->lifecycle, sizeof(it->lifecycle), v);
  } else if (strcmp(rel, "errorCode") == 0) {
    set_field(it->code, sizeof(it->code), v);
  } else if (strcmp(rel, "errorMessage") == 0) {
    set_field(it->message, sizeof(it->message), v);
  } else if (strcmp(rel, "instanceIds/item") == 0 &&
             it->instance_id[0] == '\0') {
    set_field(it->instance_id, sizeof(it->instance_id), v);
  } else if (strcmp(rel, "instanceType") == 0 && it->pool.type[0] == '\0') {
    set_field(it->pool.type, sizeof(it->pool.type), v);
  }
}

static void
end_item(struct ctx *c, bool instance)
{
  struct spot_ec2_reply *o = c->out;

  c->in_item = false;
  if (instance && o->n_instances < SPOT_EC2_ITEMS_MAX &&
      c->cur.instance_id[0] != '\0')
    o->instances[o->n_instances++] = c->cur;
  else if (!instance && o->n_errors < SPOT_EC2_ITEMS_MAX)
    o->errors[o->n_errors++] = c->cur;
}

static void XMLCALL
on_end(void *data, const XML_Char *name)
{
  static const char fis[] = "CreateFleetResponse/fleetInstanceSet/item";
  static const char es[] = "CreateFleetResponse/errorSet/item";
  struct ctx *c = data;
  struct spot_ec2_reply *o = c->out;
  const char *v = spot_buf_str(&c->text), *p = c->path;

  (void)name;
  if (strcmp(p, fis) == 0 || strcmp(p, es) == 0) {
    end_item(c, strcmp(p, fis) == 0);
  } else if (c->in_item && strncmp(p, fis, sizeof(fis) - 1) == 0 &&
             p[sizeof(fis) - 1] == '/') {
    item_field(&c->cur, p + sizeof(fis), v);
  } else if (c->in_item && strncmp(p, es, sizeof(es) - 1) == 0 &&
             p[sizeof(es) - 1] == '/') {
    item_field(&c->cur, p + sizeof(es), v);
  } else if (strcmp(p, "CreateFleetResponse/fleetId") == 0) {
    set_field(o->fleet_id, sizeof(o->fleet_id), v);
  } else if (strcmp(p, "CreateFleetResponse/requestId") == 0 ||
             strcmp(p, "Response/RequestID") == 0) {
    set_field(o->request_id, sizeof(o->request_id), v);
  } else if (strcmp(p, "Response/Errors/Error/Code") == 0 &&
             o->code[0] == '\0') {
    set_field(o->code, sizeof(o->code), v);
  } else if (strcmp(p, "Response/Errors/Error/Message") == 0 &&
             o->message[0] == '\0') {
    set_field(o->message, sizeof(o->message), v);
  }
  if (c->depth > 0)
    c->path[c->plen[--c->depth]] = '\0';
  spot_buf_reset(&c->text);
}

static void XMLCALL
on_text(void *data, const XML_Char *s, int len)
{
  struct ctx *c = data;

  /* over the cap: the value is cut (fields are short anyway) */
  if (c->text.len + (size_t)len <= TEXT_CAP)
    (void)spot_buf_append(&c->text, s, (size_t)len);
}

int
spot_ec2_reply_parse(const char *xml, size_t len, struct spot_ec2_reply *out)
{
  struct ctx c;
  int ok;

  memset(out, 0, sizeof(*out));
  memset(&c, 0, sizeof(c));
  if (len > SPOT_EC2_REPLY_MAX || len > INT32_MAX)
    return -EBADMSG;
  c.p = XML_ParserCreate(NULL);
  if (c.p == NULL)
    return -ENOMEM;
  c.out = out;
  spot_buf_init(&c.text, TEXT_CAP + 1);
  XML_SetUserData(c.p, &c);
  XML_SetElementHandler(c.p, on_start, on_end);
  XML_SetCharacterDataHandler(c.p, on_text);
  ok = XML_Parse(c.p, xml, (int)len, XML_TRUE) == XML_STATUS_OK;
  XML_ParserFree(c.p);
  spot_buf_fini(&c.text);
  if (c.err == 0 && !ok)
    c.err = -EBADMSG;
  if (c.err == 0 && out->is_error && out->code[0] == '\0')
    c.err = -EBADMSG;
  if (c.err < 0)
    memset(out, 0, sizeof(*out));
  return c.err;
}

enum spot_ec2_class
spot_ec2_classify(const char *code)
{
  static const char *const capacity[] = {
      "InsufficientInstanceCapacity",
      "MaxSpotInstanceCountExceeded",
      "Unsupported",
      "InsufficientCapacity",
      "SpotMaxPriceTooLow",
      "InsufficientFreeAddressesInSubnet",
      "InsufficientHostCapacity",
      "InsufficientReservedInstanceCapacity",
      "InstanceLimitExceeded",
      "VcpuLimitExceeded",
  };
  static const char *const retry[] = {
      "RequestLimitExceeded", "Throttling",  "InternalError",
      "ServiceUnavailable",   "Unavailable", "InternalFailure",
      "RequestExpired",
  };
  static const char *const auth[] = {
      "UnauthorizedOperation",
      "AuthFailure",
      "Blocked",
      "OptInRequired",
      "SignatureDoesNotMatch",
      "InvalidClientTokenId",
      "MissingAuthenticationToken",
  };

  if (code == NULL)
    return SPOT_EC2_CLASS_OTHER;
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(capacity); i++)
    if (strcmp(code, capacity[i]) == 0)
      return SPOT_EC2_CLASS_CAPACITY;
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(retry); i++)
    if (strcmp(code, retry[i]) == 0)
      return SPOT_EC2_CLASS_RETRY;
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(auth); i++)
    if (strcmp(code, auth[i]) == 0)
      return SPOT_EC2_CLASS_AUTH;
  if (strncmp(code, "InvalidLaunchTemplate", 21) == 0 ||
      strcmp(code, "InvalidAMIID.NotFound") == 0 ||
      strcmp(code, "InvalidAMIID.Malformed") == 0 ||
      strcmp(code, "InvalidParameterCombination") == 0)
    return SPOT_EC2_CLASS_TEMPLATE;
  return SPOT_EC2_CLASS_OTHER;
}

int
spot_ec2_client_token(const char *job, const char *ckpt, const char *reason,
                      unsigned attempt, char *buf, size_t size)
{
  const char *parts[] = {job, ckpt, reason};
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  char num[16];
  EVP_MD_CTX *x;
  int ok;

  if (size < SPOT_EC2_TOKEN_LEN + 1)
    return -ENOSPC;
  x = EVP_MD_CTX_new();
  if (x == NULL)
    return -ENOMEM;
  snprintf(num, sizeof(num), "%u", attempt);
  ok = EVP_DigestInit_ex(x, EVP_sha256(), NULL);
  for (size_t i = 0; ok && i < SPOT_ARRAY_SIZE(parts); i++)
    ok = EVP_DigestUpdate(x, parts[i], strlen(parts[i]) + 1);
  ok = ok && EVP_DigestUpdate(x, num, strlen(num));
  ok = ok && EVP_DigestFinal_ex(x, md, &mdlen);
  EVP_MD_CTX_free(x);
  if (!ok || mdlen < 16)
    return -EIO;
  snprintf(buf, size, "spotd-");
  for (unsigned i = 0; i < 16; i++)
    snprintf(buf + 6 + 2 * i, 3, "%02x", md[i]);
  return 0;
}

const char *
spot_ec2_pool_name(const struct spot_ec2_pool *p, char *buf, size_t size)
{
  snprintf(buf, size, "%s/%s", p->type[0] ? p->type : "-",
           p->az[0] ? p->az : "-");
  return buf;
}

/* ------------------------------------------------------------- record */

/* A string member of entry i of the list "failed" or "done": absent or
 * not a string reads as "". One that would not come back the same from
 * spot_relaunch_record_format() (longer than its field, a NUL byte, not
 * UTF-8) refuses the whole record: cutting it could split a character or
 * merge two pools. */
static int
copy_str(json_t *o, const char *list, size_t i, const char *key, char *dst,
         size_t size, char *err, size_t errlen)
{
  json_t *v = json_object_get(o, key);
  const char *s = json_string_value(v);
  size_t n;

  dst[0] = '\0';
  if (s == NULL)
    return 0;
  n = strlen(s);
  if (n != json_string_length(v)) {
    spot_set_err(err, errlen, "%s[%zu].%s: holds a NUL byte", list, i, key);
    return -EBADMSG;
  }
  if (n >= size) {
    spot_set_err(err, errlen,
                 "%s[%zu].%s: %zu bytes, over the %zu a record "
                 "keeps",
                 list, i, key, n, size - 1);
    return -EBADMSG;
  }
  if (!spot_utf8_valid(s)) {
    spot_set_err(err, errlen, "%s[%zu].%s: not UTF-8", list, i, key);
    return -EBADMSG;
  }
  memcpy(dst, s, n + 1);
  return 0;
}

int
spot_relaunch_record_parse(const char *json, size_t len,
                           struct spot_relaunch_record *out, char *err,
                           size_t errlen)
{
  json_t *root, *a, *it;
  json_error_t jerr;
  const char *nul;
  size_t i;
  int r = 0;

  memset(out, 0, sizeof(*out));
  nul = memchr(json, '\0', len);
  if (nul != NULL) { /* jansson skips one after a number or a literal */
    spot_set_err(err, errlen, "a NUL byte at offset %zu", (size_t)(nul - json));
    return -EBADMSG;
  }
  root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL) {
    char esc[SPOT_ESCAPE_SIZE(JSON_ERROR_TEXT_LENGTH)];

    spot_set_err(err, errlen, "not JSON: %s (line %d)",
                 spot_escape(jerr.text, esc, sizeof(esc)), jerr.line);
    return -EBADMSG;
  }
  if (!json_is_object(root)) {
    json_decref(root);
    spot_set_err(err, errlen, "not a JSON object");
    return -EBADMSG;
  }
  a = json_object_get(root, "failed");
  json_array_foreach(a, i, it)
  {
    json_t *at = json_object_get(it, "at");
    struct spot_relaunch_failed f;

    if (!json_is_object(it) || !json_is_integer(at))
      continue;
    memset(&f, 0, sizeof(f));
    r = copy_str(it, "failed", i, "pool", f.pool, sizeof(f.pool), err, errlen);
    if (r == 0)
      r = copy_str(it, "failed", i, "code", f.code, sizeof(f.code), err,
                   errlen);
    if (r < 0)
      break;
    f.at_ms = (int64_t)json_integer_value(at);
    if (f.pool[0] != '\0')
      spot_relaunch_record_fail(out, f.pool, f.code, f.at_ms);
  }
  a = json_object_get(root, "done");
  json_array_foreach(a, i, it)
  {
    json_t *at = json_object_get(it, "at");
    struct spot_relaunch_done d;

    if (r < 0)
      break;
    if (!json_is_object(it) || !json_is_integer(at))
      continue;
    memset(&d, 0, sizeof(d));
    r = copy_str(it, "done", i, "key", d.key, sizeof(d.key), err, errlen);
    if (r == 0)
      r = copy_str(it, "done", i, "instance", d.instance, sizeof(d.instance),
                   err, errlen);
    if (r == 0)
      r = copy_str(it, "done", i, "pool", d.pool, sizeof(d.pool), err, errlen);
    if (r == 0 && d.key[0] != '\0')
      spot_relaunch_record_done(out, d.key, d.instance, d.pool,
                                (int64_t)json_integer_value(at));
  }
  json_decref(root);
  if (r < 0)
    memset(out, 0, sizeof(*out));
  return r;
}

/* Whether the field s (size bytes) is a string JSON can carry. */
static bool
field_ok(const char *s, size_t size)
{
  return memchr(s, '\0', size) != NULL && spot_utf8_valid(s);
}

int
spot_relaunch_record_format(const struct spot_relaunch_record *r,
                            struct spot_buf *out)
{
  json_t *root;
  char *s;
  int err = 0;

  if (r->n_failed > SPOT_RELAUNCH_FAILED_MAX ||
      r->n_done > SPOT_RELAUNCH_DONE_MAX)
    return -EINVAL;
  for (size_t i = 0; i < r->n_failed; i++)
    if (!field_ok(r->failed[i].pool, sizeof(r->failed[i].pool)) ||
        !field_ok(r->failed[i].code, sizeof(r->failed[i].code)))
      return -EINVAL;
  for (size_t i = 0; i < r->n_done; i++)
    if (!field_ok(r->done[i].key, sizeof(r->done[i].key)) ||
        !field_ok(r->done[i].instance, sizeof(r->done[i].instance)) ||
        !field_ok(r->done[i].pool, sizeof(r->done[i].pool)))
      return -EINVAL;
  root = json_pack("{s:i,s:[],s:[]}", "version", 1, "failed", "done");
  if (root == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < r->n_failed; i++)
    if (json_array_append_new(json_object_get(root, "failed"),
                              json_pack("{s:s,s:s,s:I}", "pool",
                                        r->failed[i].pool, "code",
                                        r->failed[i].code, "at",
                                        (json_int_t)r->failed[i].at_ms)) < 0)
      err = -ENOMEM;
  for (size_t i = 0; i < r->n_done; i++)
    if (json_array_append_new(
            json_object_get(root, "done"),
            json_pack("{s:s,s:s,s:s,s:I}", "key", r->done[i].key, "instance",
                      r->done[i].instance, "pool", r->done[i].pool, "at",
                      (json_int_t)r->done[i].at_ms)) < 0)
      err = -ENOMEM;
  s = err == 0 ? json_dumps(root, JSON_COMPACT) : NULL;
  json_decref(root);
  if (s == NULL)
    return -ENOMEM;
  spot_buf_reset(out);
  err = spot_buf_appends(out, s);
  free(s);
  return err;
}

void
spot_relaunch_record_fail(struct spot_relaunch_record *r, const char *pool,
                          const char *code, int64_t at_ms)
{
  struct spot_relaunch_failed *f = NULL;

  for (size_t i = 0; i < r->n_failed; i++)
    if (strcmp(r->failed[i].pool, pool) == 0) {
      memmove(&r->failed[i], &r->failed[i + 1],
              (r->n_failed - i - 1) * sizeof(r->failed[0]));
      r->n_failed--;
      break;
    }
  if (r->n_failed == SPOT_RELAUNCH_FAILED_MAX) {
    memmove(&r->failed[0], &r->failed[1],
            (r->n_failed - 1) * sizeof(r->failed[0]));
    r->n_failed--;
  }
  f = &r->failed[r->n_failed++];
  memset(f, 0, sizeof(*f));
  spot_strlcpy_utf8(f->pool, pool, sizeof(f->pool));
  spot_strlcpy_utf8(f->code, code, sizeof(f->code));
  f->at_ms = at_ms;
}

bool
spot_relaunch_record_failed(const struct spot_relaunch_record *r,
                            const char *pool, int64_t since_ms)
{
  for (size_t i = 0; i < r->n_failed; i++)
    if (strcmp(r->failed[i].pool, pool) == 0 && r->failed[i].at_ms >= since_ms)
      return true;
  return false;
}

void
spot_relaunch_record_done(struct spot_relaunch_record *r, const char *key,
                          const char *instance, const char *pool, int64_t at_ms)
{
  struct spot_relaunch_done *d;

  if (r->n_done == SPOT_RELAUNCH_DONE_MAX) {
    memmove(&r->done[0], &r->done[1], (r->n_done - 1) * sizeof(r->done[0]));
    r->n_done--;
  }
  d = &r->done[r->n_done++];
  memset(d, 0, sizeof(*d));
  spot_strlcpy_utf8(d->key, key, sizeof(d->key));
  spot_strlcpy_utf8(d->instance, instance, sizeof(d->instance));
  spot_strlcpy_utf8(d->pool, pool, sizeof(d->pool));
  d->at_ms = at_ms;
}

const struct spot_relaunch_done *
spot_relaunch_record_find(const struct spot_relaunch_record *r, const char *key)
{
  for (size_t i = 0; i < r->n_done; i++)
    if (strcmp(r->done[i].key, key) == 0)
      return &r->done[i];
  return NULL;
}
