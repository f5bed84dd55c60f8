/* Azure Scheduled Events documents to notices. Pure: no I/O. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/notice.h"
#include "core/util.h"

static const struct {
  const char *type;
  enum spot_notice_kind kind;
  const char *reason;
} types[] = {
    {"Preempt", SPOT_NOTICE_PREEMPT, "azure-preempt"},
    {"Terminate", SPOT_NOTICE_TERMINATE, "azure-terminate"},
    {"Reboot", SPOT_NOTICE_MAINTENANCE, "azure-reboot"},
    {"Redeploy", SPOT_NOTICE_MAINTENANCE, "azure-redeploy"},
};

static int
has_resource(json_t *resources, const char *vm_name)
{
  size_t i;
  json_t *r;

  if (vm_name == NULL || vm_name[0] == '\0')
    return 1;
  json_array_foreach(resources, i, r)
  {
    const char *s = json_string_value(r);
    if (s != NULL && strcmp(s, vm_name) == 0)
      return 1;
  }
  return 0;
}

/* One element of Events: 0 + notice, 1 ignored, -EINVAL malformed. */
static int
parse_event(json_t *ev, const char *vm_name, int64_t now_wall_ms,
            struct spot_notice *t)
{
  const char *id = json_string_value(json_object_get(ev, "EventId"));
  const char *type = json_string_value(json_object_get(ev, "EventType"));
  const char *status = json_string_value(json_object_get(ev, "EventStatus"));
  const char *nb = json_string_value(json_object_get(ev, "NotBefore"));
  json_t *res = json_object_get(ev, "Resources");
  int64_t when = now_wall_ms;
  char *text;

  if (!json_is_object(ev) || id == NULL || id[0] == '\0' || type == NULL ||
      status == NULL || !json_is_array(res))
    return -EINVAL;
  /* NotBefore is blank once the event has started: due now. */
  if (nb != NULL && nb[0] != '\0' && spot_time_parse_rfc1123(nb, &when) < 0)
    return -EINVAL;
  if (strcmp(status, "Scheduled") != 0 && strcmp(status, "Started") != 0)
    return 1;
  if (!has_resource(res, vm_name))
    return 1;
  for (size_t k = 0; k < SPOT_ARRAY_SIZE(types); k++) {
    if (strcmp(type, types[k].type) != 0)
      continue;
    memset(t, 0, sizeof(*t));
    t->provider = SPOT_PROVIDER_AZURE;
    t->kind = types[k].kind;
    spot_strlcpy(t->reason, types[k].reason, sizeof(t->reason));
    t->deadline_wall_ms = when > 0 ? when : now_wall_ms;
    if (spot_strlcpy(t->id, id, sizeof(t->id)) >= sizeof(t->id))
      return -EINVAL; /* an id we could not ack back verbatim */
    text = json_dumps(ev, JSON_COMPACT | JSON_SORT_KEYS);
    if (text != NULL) {
      spot__notice_detail(t, text, strlen(text));
      free(text);
    }
    return 0;
  }
  return 1; /* Freeze and future types: not an interruption */
}

int
spot_meta_azure_parse(const char *body, size_t len, const char *vm_name,
                      int64_t now_wall_ms, struct spot_notice *out, size_t max,
                      size_t *n, int64_t *incarnation)
{
  struct spot_notice tmp[16];
  size_t count = 0, i;
  json_t *j, *inc, *events, *ev;
  int r;

  r = spot__meta_json_load(body, len, &j);
  if (r < 0)
    return r;
  inc = json_object_get(j, "DocumentIncarnation");
  events = json_object_get(j, "Events");
  if (!json_is_object(j) || !json_is_integer(inc) || !json_is_array(events)) {
    json_decref(j);
    return -EINVAL;
  }
  json_array_foreach(events, i, ev)
  {
    if (count == SPOT_ARRAY_SIZE(tmp))
      break;
    r = parse_event(ev, vm_name, now_wall_ms, &tmp[count]);
    if (r < 0) {
      json_decref(j);
      return r;
    }
    if (r == 0)
      count++;
  }
  *incarnation = json_integer_value(inc);
  json_decref(j);
  return spot__notice_sort_out(tmp, count, out, max, n);
}

int
spot_meta_azure_ack_body(const char *event_id, char **out)
{
  json_t *j;
  char *s;

  if (event_id == NULL || event_id[0] == '\0')
    return -EINVAL;
  j = json_pack("{s:[{s:s}]}", "StartRequests", "EventId", event_id);
  if (j == NULL)
    return -ENOMEM;
  s = json_dumps(j, JSON_COMPACT);
  json_decref(j);
  if (s == NULL)
    return -ENOMEM;
  *out = s;
  return 0;
}
