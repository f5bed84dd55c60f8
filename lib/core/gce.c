/* GCE insert request and replies. Pure. */
#include "core/gce.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "core/util.h"

static void
copy(json_t *o, const char *key, char *dst, size_t size)
{
  const char *v = json_string_value(json_object_get(o, key));

  if (v != NULL)
    spot_strlcpy_utf8(dst, v, size);
}

int
spot_gce_op_parse(const char *json, size_t len, struct spot_gce_op *out)
{
  json_t *root, *err, *first;
  json_error_t jerr;

  memset(out, 0, sizeof(*out));
  if (len > SPOT_GCE_REPLY_MAX)
    return -EBADMSG;
  root = json_loadb(json, len, 0, &jerr);
  if (root == NULL || !json_is_object(root)) {
    json_decref(root);
    return -EBADMSG;
  }
  err = json_object_get(root, "error");
  if (json_is_object(err) && json_object_get(root, "status") == NULL) {
    /* an error document */
    json_t *code = json_object_get(err, "code");

    out->is_error = true;
    out->http_code = json_is_integer(code) ? (int)json_integer_value(code) : 0;
    copy(err, "message", out->message, sizeof(out->message));
    copy(err, "status", out->api_status, sizeof(out->api_status));
    first = json_array_get(json_object_get(err, "errors"), 0);
    copy(first, "reason", out->code, sizeof(out->code));
    if (out->message[0] == '\0')
      copy(first, "message", out->message, sizeof(out->message));
    if (out->code[0] == '\0')
      spot_strlcpy_utf8(out->code, out->api_status, sizeof(out->code));
    json_decref(root);
    return out->code[0] != '\0' || out->http_code != 0 ? 0 : -EBADMSG;
  }
  copy(root, "name", out->name, sizeof(out->name));
  copy(root, "status", out->status, sizeof(out->status));
  copy(root, "targetLink", out->target, sizeof(out->target));
  first = json_array_get(json_object_get(err, "errors"), 0);
  copy(first, "code", out->code, sizeof(out->code));
  copy(first, "message", out->message, sizeof(out->message));
  json_decref(root);
  if (out->name[0] == '\0' || out->status[0] == '\0')
    return -EBADMSG;
  return 0;
}

enum spot_gce_class
spot_gce_classify(const struct spot_gce_op *op)
{
  const char *c = op->code;

  if (strncmp(c, "ZONE_RESOURCE_POOL_EXHAUSTED", 28) == 0 ||
      strstr(c, "STOCKOUT") != NULL || strstr(op->message, "stockout") ||
      strcmp(c, "QUOTA_EXCEEDED") == 0 ||
      strcmp(c, "UNSUPPORTED_OPERATION") == 0)
    return SPOT_GCE_CLASS_CAPACITY;
  if (op->is_error && (op->http_code == 429 || op->http_code >= 500 ||
                       strcmp(c, "rateLimitExceeded") == 0 ||
                       strcmp(c, "userRateLimitExceeded") == 0 ||
                       strcmp(c, "backendError") == 0))
    return SPOT_GCE_CLASS_RETRY;
  if (op->is_error && (op->http_code == 401 || op->http_code == 403))
    return SPOT_GCE_CLASS_AUTH;
  if (op->is_error && op->http_code == 409)
    return SPOT_GCE_CLASS_EXISTS;
  if (op->is_error && (op->http_code == 404 || op->http_code == 400) &&
      strstr(op->message, "nstanceTemplate") != NULL)
    return SPOT_GCE_CLASS_TEMPLATE;
  if (op->is_error && op->http_code == 404)
    return SPOT_GCE_CLASS_TEMPLATE;
  return SPOT_GCE_CLASS_OTHER;
}

int
spot_gce_token_parse(const char *json, size_t len, char *tok, size_t size)
{
  json_t *root = json_loadb(json, len, 0, NULL);
  const char *t = json_string_value(json_object_get(root, "access_token"));
  int r = -EBADMSG;

  if (t != NULL && t[0] != '\0' && strlen(t) < size &&
      strpbrk(t, "\r\n ") == NULL) {
    spot_strlcpy(tok, t, size);
    r = 0;
  }
  json_decref(root);
  return r;
}

int
spot_gce_request_id(const char *job, const char *ckpt, const char *reason,
                    const char *zone, char *buf, size_t size)
{
  const char *parts[] = {job, ckpt, reason, zone};
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int mdlen = 0;
  EVP_MD_CTX *x;
  char h[33];
  int ok;

  if (size < 37)
    return -ENOSPC;
  x = EVP_MD_CTX_new();
  if (x == NULL)
    return -ENOMEM;
  ok = EVP_DigestInit_ex(x, EVP_sha256(), NULL);
  for (size_t i = 0; ok && i < SPOT_ARRAY_SIZE(parts); i++)
    ok = EVP_DigestUpdate(x, parts[i], strlen(parts[i]) + 1);
  ok = ok && EVP_DigestFinal_ex(x, md, &mdlen);
  EVP_MD_CTX_free(x);
  if (!ok || mdlen < 16)
    return -EIO;
  md[6] = (unsigned char)((md[6] & 0x0f) | 0x40); /* version 4 layout */
  md[8] = (unsigned char)((md[8] & 0x3f) | 0x80); /* RFC 4122 variant */
  for (unsigned i = 0; i < 16; i++)
    snprintf(h + 2 * i, 3, "%02x", md[i]);
  snprintf(buf, size, "%.8s-%.4s-%.4s-%.4s-%.12s", h, h + 8, h + 12, h + 16,
           h + 20);
  return 0;
}

int
spot_gce_instance_name(const char *job, const char *key, char *buf, size_t size)
{
  size_t o = 0, klen = strlen(key);

  if (size < SPOT_GCE_NAME_MAX + 1 || klen < 8)
    return -EINVAL;
  o = (size_t)snprintf(buf, size, "spotd-");
  for (const char *p = job; *p && o < SPOT_GCE_NAME_MAX - 9; p++) {
    char ch = (char)tolower((unsigned char)*p);

    buf[o++] = (isalnum((unsigned char)ch) ? ch : '-');
  }
  snprintf(buf + o, size - o, "-%.8s", key + klen - 8);
  return 0;
}

/* Sets key to value in the items array (replacing an item of that key). */
static int
set_item(json_t *items, const char *key, const char *value)
{
  size_t i;
  json_t *it;

  json_array_foreach(items, i, it)
  {
    const char *k = json_string_value(json_object_get(it, "key"));

    if (k != NULL && strcmp(k, key) == 0)
      return json_object_set_new(it, "value", json_string(value));
  }
  return json_array_append_new(
      items, json_pack("{s:s,s:s}", "key", key, "value", value));
}

int
spot_gce_insert_body(const char *name, const char *job, const char *store,
                     const char *template_json, size_t template_len,
                     struct spot_buf *out)
{
  json_t *items = NULL, *body;
  char *s;
  int r = 0;

  if (template_json != NULL) {
    json_t *t = json_loadb(template_json, template_len, 0, NULL);
    json_t *ti = json_object_get(
        json_object_get(json_object_get(t, "properties"), "metadata"), "items");

    if (t == NULL || !json_is_object(t)) {
      json_decref(t);
      return -EBADMSG;
    }
    if (json_is_array(ti))
      items = json_deep_copy(ti);
    json_decref(t);
  }
  if (items == NULL)
    items = json_array();
  if (items == NULL || set_item(items, "spotd-job", job) < 0 ||
      (store != NULL && set_item(items, "spotd-store", store) < 0)) {
    json_decref(items);
    return -ENOMEM;
  }
  body = json_pack("{s:s,s:{s:o},s:{s:s,s:s}}", "name", name, "metadata",
                   "items", items, "scheduling", "provisioningModel", "SPOT",
                   "instanceTerminationAction", "DELETE");
  if (body == NULL)
    return -ENOMEM;
  s = json_dumps(body, JSON_COMPACT);
  json_decref(body);
  if (s == NULL)
    return -ENOMEM;
  spot_buf_reset(out);
  r = spot_buf_appends(out, s);
  free(s);
  return r;
}
