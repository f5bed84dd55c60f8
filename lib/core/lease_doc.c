/* The job lease document: parse, encode, judge. See lease_doc.h. */
#include "core/lease_doc.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"

static int doc_err(char *err, size_t errlen, int r, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int
doc_err(char *err, size_t errlen, int r, const char *fmt, ...)
{
  va_list ap;

  if (err != NULL && errlen > 0) {
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
  }
  return r;
}

static bool
printable(const char *s, size_t max, bool space_ok)
{
  size_t n = 0;

  for (; *s != '\0'; s++, n++)
    if ((unsigned char)*s < 0x20 + (space_ok ? 0 : 1) ||
        (unsigned char)*s > 0x7e)
      return false;
  return n > 0 && n <= max;
}

bool
spot_lease_doc_owner_valid(const char *owner)
{
  return owner != NULL && printable(owner, SPOT_LEASE_OWNER_MAX, true);
}

/* A string member: must be present and printable within max. */
static int
get_str(json_t *root, const char *name, size_t max, bool space_ok, char *out,
        size_t size, char *err, size_t errlen)
{
  json_t *v = json_object_get(root, name);
  const char *s;

  if (!json_is_string(v))
    return doc_err(err, errlen, -EBADMSG, "%s: missing or not a string", name);
  s = json_string_value(v);
  if (strlen(s) != json_string_length(v) || !printable(s, max, space_ok) ||
      strlen(s) >= size)
    return doc_err(err, errlen, -EBADMSG,
                   "%s: empty, too long or not "
                   "printable ASCII",
                   name);
  spot_strlcpy(out, s, size);
  return 0;
}

static int
get_int(json_t *root, const char *name, int64_t min, int64_t max, int64_t *out,
        char *err, size_t errlen)
{
  json_t *v = json_object_get(root, name);
  json_int_t n;

  if (!json_is_integer(v))
    return doc_err(err, errlen, -EBADMSG, "%s: missing or not an integer",
                   name);
  n = json_integer_value(v);
  if (n < min || n > max)
    return doc_err(err, errlen, -EBADMSG, "%s: out of range", name);
  *out = (int64_t)n;
  return 0;
}

static int
parse_root(json_t *root, struct spot_lease_doc *d, char *err, size_t errlen)
{
  char fmt[32], state[16];
  int64_t version = 0, epoch = 0;
  int r;

  if (!json_is_object(root))
    return doc_err(err, errlen, -EBADMSG, "not a JSON object");
  r = get_str(root, "format", sizeof(fmt) - 1, false, fmt, sizeof(fmt), err,
              errlen);
  if (r == 0 && strcmp(fmt, SPOT_LEASE_FORMAT) != 0)
    r = doc_err(err, errlen, -EBADMSG, "format: not \"%s\"", SPOT_LEASE_FORMAT);
  if (r == 0)
    r = get_int(root, "version", 1, INT32_MAX, &version, err, errlen);
  if (r == 0 && version != SPOT_LEASE_VERSION)
    r = doc_err(err, errlen, -EPROTONOSUPPORT,
                "version %" PRId64 " (this spotd reads %d)", version,
                SPOT_LEASE_VERSION);
  if (r == 0)
    r = get_str(root, "owner", SPOT_LEASE_OWNER_MAX, true, d->owner,
                sizeof(d->owner), err, errlen);
  if (r == 0)
    r = get_int(root, "epoch", 1, (int64_t)SPOT_LEASE_EPOCH_MAX, &epoch, err,
                errlen);
  if (r == 0)
    r = get_str(root, "state", sizeof(state) - 1, false, state, sizeof(state),
                err, errlen);
  if (r == 0 && strcmp(state, "held") != 0 && strcmp(state, "released") != 0)
    r = doc_err(err, errlen, -EBADMSG, "state: not \"held\" or \"released\"");
  if (r == 0)
    r = get_int(root, "ttl_ms", 1, SPOT_LEASE_TTL_MAX_MS, &d->ttl_ms, err,
                errlen);
  if (r == 0) /* 1970 .. 9999 */
    r = get_int(root, "expires_ms", 0, INT64_C(253402300799999), &d->expires_ms,
                err, errlen);
  if (r == 0)
    r = get_str(root, "nonce", SPOT_LEASE_NONCE_MAX, false, d->nonce,
                sizeof(d->nonce), err, errlen);
  if (r < 0)
    return r;
  d->epoch = (uint64_t)epoch;
  d->released = strcmp(state, "released") == 0;
  return 0;
}

int
spot_lease_doc_parse(const char *json, size_t len, struct spot_lease_doc *out,
                     char *err, size_t errlen)
{
  struct spot_lease_doc d;
  json_error_t jerr;
  json_t *root;
  int r;

  if (json == NULL)
    return doc_err(err, errlen, -EBADMSG, "no data");
  if (len > SPOT_LEASE_JSON_MAX)
    return doc_err(err, errlen, -E2BIG, "lease object over %d bytes",
                   SPOT_LEASE_JSON_MAX);
  root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
  if (root == NULL)
    return doc_err(err, errlen, -EBADMSG, "not JSON: %s (line %d)", jerr.text,
                   jerr.line);
  memset(&d, 0, sizeof(d));
  r = parse_root(root, &d, err, errlen);
  json_decref(root);
  if (r == 0)
    *out = d;
  return r;
}

int
spot_lease_doc_encode(const struct spot_lease_doc *d, char **out)
{
  char expires[32];
  json_t *root;
  char *s;

  if (d == NULL || !spot_lease_doc_owner_valid(d->owner) || d->epoch < 1 ||
      d->epoch > SPOT_LEASE_EPOCH_MAX || d->ttl_ms < 1 ||
      d->ttl_ms > SPOT_LEASE_TTL_MAX_MS || d->expires_ms < 0 ||
      !printable(d->nonce, SPOT_LEASE_NONCE_MAX, false) ||
      spot_rfc3339_format(d->expires_ms, expires, sizeof(expires)) < 0)
    return -EINVAL;
  root = json_pack(
      "{s:s, s:i, s:s, s:I, s:s, s:I, s:I, s:s, s:s}", "format",
      SPOT_LEASE_FORMAT, "version", SPOT_LEASE_VERSION, "owner", d->owner,
      "epoch", (json_int_t)d->epoch, "state", d->released ? "released" : "held",
      "ttl_ms", (json_int_t)d->ttl_ms, "expires_ms", (json_int_t)d->expires_ms,
      "expires", expires, "nonce", d->nonce);
  if (root == NULL)
    return -ENOMEM;
  s = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
  json_decref(root);
  if (s == NULL)
    return -ENOMEM;
  *out = s;
  return 0;
}

enum spot_lease_verdict
spot_lease_doc_judge(const struct spot_lease_doc *cur, const char *owner,
                     const char *our_nonce, int64_t now_ms, int64_t grace_ms)
{
  if (cur == NULL)
    return SPOT_LEASE_ABSENT;
  if (our_nonce != NULL && our_nonce[0] != '\0' && owner != NULL &&
      strcmp(cur->owner, owner) == 0 && strcmp(cur->nonce, our_nonce) == 0)
    return SPOT_LEASE_OURS;
  if (cur->released)
    return SPOT_LEASE_RELEASED;
  if (now_ms > cur->expires_ms && now_ms - cur->expires_ms > grace_ms)
    return SPOT_LEASE_EXPIRED;
  return SPOT_LEASE_THEIRS;
}

uint64_t
spot_lease_doc_next_epoch(const struct spot_lease_doc *cur,
                          enum spot_lease_verdict v)
{
  switch (v) {
  case SPOT_LEASE_ABSENT:
    return 1;
  case SPOT_LEASE_OURS:
    return cur != NULL ? cur->epoch : 0;
  case SPOT_LEASE_RELEASED:
  case SPOT_LEASE_EXPIRED:
  case SPOT_LEASE_DEAD:
    if (cur == NULL || cur->epoch >= SPOT_LEASE_EPOCH_MAX)
      return 0;
    return cur->epoch + 1;
  case SPOT_LEASE_THEIRS:
  case SPOT_LEASE_VERDICT_LAST:
    break;
  }
  return 0;
}

const char *
spot_lease_doc_verdict_name(enum spot_lease_verdict v)
{
  static const char *const names[SPOT_LEASE_VERDICT_LAST] = {
      [SPOT_LEASE_ABSENT] = "absent",   [SPOT_LEASE_RELEASED] = "released",
      [SPOT_LEASE_EXPIRED] = "expired", [SPOT_LEASE_OURS] = "ours",
      [SPOT_LEASE_THEIRS] = "theirs",   [SPOT_LEASE_DEAD] = "dead",
  };

  return (unsigned)v < SPOT_LEASE_VERDICT_LAST ? names[v] : "?";
}

int64_t
spot_lease_doc_wait_ms(const struct spot_lease_doc *cur, int64_t now_ms,
                       int64_t grace_ms)
{
  int64_t at;

  if (cur == NULL || cur->released)
    return 0;
  at = cur->expires_ms + grace_ms;
  return now_ms > at ? 0 : at - now_ms + 1;
}

int
spot_lease_doc_etag_bare(const char *etag, char *out, size_t size)
{
  size_t n;

  if (strncmp(etag, "W/", 2) == 0)
    etag += 2;
  n = strlen(etag);
  if (n >= 2 && etag[0] == '"' && etag[n - 1] == '"') {
    etag++;
    n -= 2;
  }
  if (n + 1 > size)
    return -E2BIG;
  memcpy(out, etag, n);
  out[n] = '\0';
  return 0;
}

int
spot_lease_doc_etag_quoted(const char *etag, char *out, size_t size)
{
  char bare[256];
  int n;

  if (spot_lease_doc_etag_bare(etag, bare, sizeof(bare)) < 0)
    return -E2BIG;
  n = snprintf(out, size, "\"%s\"", bare);
  return n < 0 || (size_t)n >= size ? -E2BIG : 0;
}

bool
spot_lease_doc_etag_same(const char *a, const char *b)
{
  char x[256], y[256];

  if (a == NULL || b == NULL || spot_lease_doc_etag_bare(a, x, sizeof(x)) < 0 ||
      spot_lease_doc_etag_bare(b, y, sizeof(y)) < 0)
    return false;
  return x[0] != '\0' && strcmp(x, y) == 0;
}

static int
parse_u64(const char *s, size_t n, uint64_t *out)
{
  uint64_t v = 0;

  if (n == 0 || n > 16 || (n > 1 && s[0] == '0'))
    return -EINVAL;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -EINVAL;
    v = v * 10 + (uint64_t)(s[i] - '0');
  }
  if (v > SPOT_LEASE_EPOCH_MAX)
    return -EINVAL;
  *out = v;
  return 0;
}

int
spot_lease_doc_order_parse(const char *s, struct spot_latest_order *out)
{
  const char *dot = s != NULL ? strchr(s, '.') : NULL;
  struct spot_latest_order o;

  if (dot == NULL || parse_u64(s, (size_t)(dot - s), &o.epoch) < 0 ||
      parse_u64(dot + 1, strlen(dot + 1), &o.seq) < 0)
    return -EINVAL;
  *out = o;
  return 0;
}

void
spot_lease_doc_order_format(struct spot_latest_order o, char *buf, size_t size)
{
  snprintf(buf, size, "%" PRIu64 ".%" PRIu64, o.epoch, o.seq);
}

int
spot_lease_doc_order_cmp(struct spot_latest_order a, struct spot_latest_order b)
{
  if (a.epoch != b.epoch)
    return a.epoch < b.epoch ? -1 : 1;
  if (a.seq != b.seq)
    return a.seq < b.seq ? -1 : 1;
  return 0;
}

int
spot_lease_owner_format(const char *instance, const struct spot_lease_owner *o,
                        char *out, size_t size)
{
  int n = snprintf(out, size, "%s%s%s/pidns-%" PRIu64 "/%s:%ld",
                   instance != NULL ? instance : "",
                   instance != NULL && instance[0] != '\0' ? "/" : "",
                   o->boot[0] != '\0' ? o->boot : "no-boot-id", o->pidns,
                   o->host[0] != '\0' ? o->host : "unknown", o->pid);

  return n < 0 || (size_t)n >= size ? -E2BIG : 0;
}

/* Digits only, no sign, in [1, max]; -1 when not. */
static int64_t
owner_number(const char *s, size_t n, int64_t max)
{
  int64_t v = 0;

  if (n == 0 || n > 19 || (n > 1 && s[0] == '0'))
    return -1;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9')
      return -1;
    if (v > (max - (s[i] - '0')) / 10)
      return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v >= 1 ? v : -1;
}

int
spot_lease_owner_parse(const char *owner, struct spot_lease_owner *out)
{
  const char *colon = strrchr(owner, ':'), *host, *ns, *boot;
  struct spot_lease_owner o;
  int64_t pid, pidns;
  size_t n;

  memset(&o, 0, sizeof(o));
  if (colon == NULL)
    return -EINVAL;
  pid = owner_number(colon + 1, strlen(colon + 1), INT32_MAX);
  /* HOST: from the '/' before the colon */
  for (host = colon; host > owner && host[-1] != '/'; host--)
    ;
  if (pid < 0 || host == owner || host == colon ||
      (size_t)(colon - host) >= sizeof(o.host))
    return -EINVAL;
  memcpy(o.host, host, (size_t)(colon - host));
  /* pidns-N: the segment before HOST */
  for (ns = host - 1; ns > owner && ns[-1] != '/'; ns--)
    ;
  n = (size_t)(host - 1 - ns);
  if (ns == owner || n <= 6 || strncmp(ns, "pidns-", 6) != 0)
    return -EINVAL;
  pidns = owner_number(ns + 6, n - 6, INT64_MAX);
  /* BOOT: the segment before that (an INSTANCE/ may come first) */
  for (boot = ns - 1; boot > owner && boot[-1] != '/'; boot--)
    ;
  n = (size_t)(ns - 1 - boot);
  if (pidns < 0 || n == 0 || n >= sizeof(o.boot))
    return -EINVAL;
  memcpy(o.boot, boot, n);
  o.pidns = (uint64_t)pidns;
  o.pid = (long)pid;
  *out = o;
  return 0;
}
