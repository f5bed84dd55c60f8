/* GCP metadata server values to notices. Pure: no I/O. */
#include <errno.h>
#include <string.h>

#include "core/notice.h"
#include "core/util.h"

/* A bare value: trimmed, 1..64 upper-case letters, digits or '_'. */
static int
value(const char *body, size_t len, const char **p, size_t *n)
{
  if (len > SPOT_META_BODY_MAX)
    return -E2BIG;
  if (body == NULL)
    return -EINVAL;
  *p = body;
  *n = len;
  spot__meta_trim(p, n);
  if (*n == 0 || *n > 64)
    return -EINVAL;
  for (size_t i = 0; i < *n; i++) {
    char c = (*p)[i];
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_'))
      return -EINVAL;
  }
  return 0;
}

static int
is(const char *p, size_t n, const char *lit)
{
  return strlen(lit) == n && memcmp(p, lit, n) == 0;
}

/* value(), then 1 when the value is none. */
static int
value_unless(const char *body, size_t len, const char *none, const char **p,
             size_t *vlen)
{
  int r = value(body, len, p, vlen);

  if (r < 0)
    return r;
  return is(*p, *vlen, none) ? 1 : 0;
}

static void
init_notice(struct spot_notice *n, enum spot_notice_kind kind,
            const char *reason, int64_t deadline)
{
  memset(n, 0, sizeof(*n));
  n->provider = SPOT_PROVIDER_GCP;
  n->kind = kind;
  n->deadline_wall_ms = deadline;
  spot_strlcpy(n->reason, reason, sizeof(n->reason));
}

int
spot_meta_gcp_parse_preempted(const char *body, size_t len, int64_t now_wall_ms,
                              struct spot_notice *out)
{
  struct spot_notice n;
  const char *p;
  size_t vlen;
  int r;

  r = value_unless(body, len, "FALSE", &p, &vlen);
  if (r != 0)
    return r;
  if (!is(p, vlen, "TRUE"))
    return -EINVAL;
  init_notice(&n, SPOT_NOTICE_PREEMPT, "gcp-preempted",
              now_wall_ms + SPOT_META_GCP_PREEMPT_MS);
  spot_strlcpy(n.id, "preempted", sizeof(n.id));
  spot__notice_detail(&n, p, vlen);
  *out = n;
  return 0;
}

int
spot_meta_gcp_parse_maintenance(const char *body, size_t len,
                                int64_t now_wall_ms, struct spot_notice *out)
{
  struct spot_notice n;
  const char *p;
  size_t vlen;
  int r;

  r = value_unless(body, len, "NONE", &p, &vlen);
  if (r != 0)
    return r;
  if (is(p, vlen, "TERMINATE_ON_HOST_MAINTENANCE"))
    init_notice(&n, SPOT_NOTICE_TERMINATE, "gcp-maintenance-terminate",
                now_wall_ms + SPOT_META_GCP_MAINTENANCE_MS);
  else
    init_notice(&n, SPOT_NOTICE_MAINTENANCE, "gcp-maintenance",
                now_wall_ms + SPOT_META_GCP_MAINTENANCE_MS);
  /* the id is the value: the poller forgets it when NONE comes back */
  spot__notice_detail(&n, p, vlen);
  memcpy(n.id, "maintenance:", 12);
  spot_strlcpy(n.id + 12, n.detail, sizeof(n.id) - 12);
  *out = n;
  return 0;
}
