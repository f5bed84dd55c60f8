/* AWS IMDS documents to notices. Pure: no I/O, the caller passes now. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "core/notice.h"
#include "core/util.h"

static void
init_notice(struct spot_notice *n, enum spot_notice_kind kind,
            const char *reason)
{
  memset(n, 0, sizeof(*n));
  n->provider = SPOT_PROVIDER_AWS;
  n->kind = kind;
  spot_strlcpy(n->reason, reason, sizeof(n->reason));
}

/* Loads body, a JSON object with an RFC 3339 time under key: 0 with *j (to
 * decref), *time and *t set, or -EINVAL / -E2BIG. */
static int
load_timed(const char *body, size_t len, const char *key, json_t **j,
           const char **time, int64_t *t)
{
  int r = spot__meta_json_load(body, len, j);

  if (r < 0)
    return r;
  *time = json_string_value(json_object_get(*j, key));
  if (!json_is_object(*j) || *time == NULL ||
      spot_rfc3339_parse(*time, t) < 0) {
    json_decref(*j);
    return -EINVAL;
  }
  return 0;
}

int
spot_meta_aws_parse_instance_action(const char *body, size_t len,
                                    int64_t now_wall_ms,
                                    struct spot_notice *out)
{
  static const struct {
    const char *action;
    enum spot_notice_kind kind;
    const char *reason;
  } actions[] = {
      {"terminate", SPOT_NOTICE_TERMINATE, "aws-spot-terminate"},
      {"stop", SPOT_NOTICE_STOP, "aws-spot-stop"},
      {"hibernate", SPOT_NOTICE_HIBERNATE, "aws-spot-hibernate"},
  };
  struct spot_notice n;
  const char *action, *time;
  json_t *j;
  int64_t t;
  int r;

  r = load_timed(body, len, "time", &j, &time, &t);
  if (r < 0)
    return r;
  action = json_string_value(json_object_get(j, "action"));
  r = -EINVAL;
  if (action == NULL)
    goto out;
  for (size_t i = 0; i < SPOT_ARRAY_SIZE(actions); i++) {
    if (strcmp(action, actions[i].action) != 0)
      continue;
    init_notice(&n, actions[i].kind, actions[i].reason);
    /* 0 is the "no deadline" sentinel: an epoch time means now */
    n.deadline_wall_ms = t > 0 ? t : now_wall_ms;
    snprintf(n.id, sizeof(n.id), "spot:%s@%s", action, time);
    spot__notice_detail(&n, body, len);
    *out = n;
    r = 0;
    break;
  }
out:
  json_decref(j);
  return r;
}

int
spot_meta_aws_parse_rebalance(const char *body, size_t len, int64_t now_wall_ms,
                              struct spot_notice *out)
{
  struct spot_notice n;
  const char *time;
  json_t *j;
  int64_t t;
  int r;

  r = load_timed(body, len, "noticeTime", &j, &time, &t);
  if (r < 0)
    return r;
  init_notice(&n, SPOT_NOTICE_REBALANCE, "aws-rebalance");
  snprintf(n.id, sizeof(n.id), "rebalance@%s", time);
  spot__notice_detail(&n, body, len);
  json_decref(j);
  *out = n;
  return 0;
}

static int
cancelled(const char *state, const char *desc)
{
  if (state != NULL && (strcasecmp(state, "canceled") == 0 ||
                        strcasecmp(state, "cancelled") == 0 ||
                        strcasecmp(state, "completed") == 0))
    return 1;
  if (desc != NULL && (strncmp(desc, "[Canceled]", 10) == 0 ||
                       strncmp(desc, "[Completed]", 11) == 0))
    return 1;
  return 0;
}

int
spot_meta_aws_parse_maintenance(const char *body, size_t len,
                                int64_t now_wall_ms, struct spot_notice *out,
                                size_t max, size_t *n)
{
  struct spot_notice tmp[16];
  size_t count = 0, i;
  json_t *j, *ev;
  const char *p = body;
  size_t plen = len;
  int r;

  spot__meta_trim(&p, &plen);
  if (plen == 0 && len <= SPOT_META_BODY_MAX)
    return 1; /* an empty document: no events */
  r = spot__meta_json_load(body, len, &j);
  if (r < 0)
    return r;
  if (!json_is_array(j)) {
    json_decref(j);
    return -EINVAL;
  }
  json_array_foreach(j, i, ev)
  {
    const char *code = json_string_value(json_object_get(ev, "Code"));
    const char *id = json_string_value(json_object_get(ev, "EventId"));
    const char *nb = json_string_value(json_object_get(ev, "NotBefore"));
    const char *state = json_string_value(json_object_get(ev, "State"));
    const char *desc = json_string_value(json_object_get(ev, "Description"));
    struct spot_notice *t;
    char *text;
    int64_t when;

    if (!json_is_object(ev) || id == NULL || nb == NULL ||
        spot_time_parse_aws_event(nb, &when) < 0) {
      json_decref(j);
      return -EINVAL;
    }
    if (cancelled(state, desc) || count == SPOT_ARRAY_SIZE(tmp))
      continue;
    t = &tmp[count++];
    init_notice(t, SPOT_NOTICE_MAINTENANCE, "aws-maintenance");
    if (code != NULL && (strcmp(code, "instance-stop") == 0 ||
                         strcmp(code, "instance-retirement") == 0)) {
      t->kind = code[9] == 's' ? SPOT_NOTICE_STOP : SPOT_NOTICE_TERMINATE;
      spot_strlcpy(t->reason,
                   code[9] == 's' ? "aws-instance-stop"
                                  : "aws-instance-retirement",
                   sizeof(t->reason));
    }
    t->deadline_wall_ms = when > 0 ? when : now_wall_ms;
    spot_strlcpy(t->id, id, sizeof(t->id));
    text = json_dumps(ev, JSON_COMPACT | JSON_SORT_KEYS);
    if (text != NULL) {
      spot__notice_detail(t, text, strlen(text));
      free(text);
    }
  }
  json_decref(j);
  return spot__notice_sort_out(tmp, count, out, max, n);
}

int
spot_meta_aws_parse_lifecycle(const char *body, size_t len, int64_t now_wall_ms,
                              struct spot_notice *out)
{
  struct spot_notice n;
  const char *p = body;

  if (len > SPOT_META_BODY_MAX)
    return -E2BIG;
  if (body == NULL)
    return -EINVAL;
  spot__meta_trim(&p, &len);
  if (len == 0 || len > 64)
    return -EINVAL;
  for (size_t i = 0; i < len; i++)
    if (!((p[i] >= 'A' && p[i] <= 'Z') || (p[i] >= 'a' && p[i] <= 'z') ||
          p[i] == ':'))
      return -EINVAL;
  if (len != 10 || memcmp(p, "Terminated", 10) != 0)
    return 1;
  init_notice(&n, SPOT_NOTICE_TERMINATE, "aws-asg-terminate");
  n.deadline_wall_ms = now_wall_ms; /* IMDS gives no time: act now */
  spot_strlcpy(n.id, "lifecycle:Terminated", sizeof(n.id));
  spot__notice_detail(&n, p, len);
  *out = n;
  return 0;
}
