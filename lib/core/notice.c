/* Notice names, deadlines and de-duplication. */
#include "core/notice.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "core/util.h"

static const char *const provider_names[SPOT_PROVIDER_LAST] = {
    [SPOT_PROVIDER_NONE] = "none", [SPOT_PROVIDER_AWS] = "aws",
    [SPOT_PROVIDER_GCP] = "gcp",   [SPOT_PROVIDER_AZURE] = "azure",
    [SPOT_PROVIDER_AUTO] = "auto",
};

static const char *const kind_names[SPOT_NOTICE_LAST] = {
    [SPOT_NOTICE_TERMINATE] = "terminate",
    [SPOT_NOTICE_STOP] = "stop",
    [SPOT_NOTICE_HIBERNATE] = "hibernate",
    [SPOT_NOTICE_REBALANCE] = "rebalance",
    [SPOT_NOTICE_MAINTENANCE] = "maintenance",
    [SPOT_NOTICE_PREEMPT] = "preempt",
};

const char *
spot_provider_name(enum spot_provider p)
{
  if ((unsigned)p >= SPOT_PROVIDER_LAST)
    return "invalid";
  return provider_names[p];
}

int
spot_provider_from_name(const char *s, enum spot_provider *out)
{
  for (unsigned i = 0; s != NULL && i < SPOT_PROVIDER_LAST; i++) {
    if (strcmp(s, provider_names[i]) == 0) {
      *out = (enum spot_provider)i;
      return 0;
    }
  }
  return -EINVAL;
}

const char *
spot_notice_kind_name(enum spot_notice_kind k)
{
  if ((unsigned)k >= SPOT_NOTICE_LAST)
    return "invalid";
  return kind_names[k];
}

void
spot_notice_set_mono(struct spot_notice *n, uint64_t now_mono_ms,
                     int64_t now_wall_ms)
{
  int64_t left;

  if (n->deadline_wall_ms == 0) {
    n->deadline_mono_ms = 0;
    return;
  }
  left = n->deadline_wall_ms - now_wall_ms;
  n->deadline_mono_ms = now_mono_ms + (left > 0 ? (uint64_t)left : 0);
}

void
spot_notice_dedup_init(struct spot_notice_dedup *d)
{
  memset(d, 0, sizeof(*d));
}

static void
make_key(char *key, size_t size, enum spot_provider p, const char *id)
{
  snprintf(key, size, "%s:%s", spot_provider_name(p), id);
}

int
spot_notice_seen(struct spot_notice_dedup *d, const struct spot_notice *n)
{
  char key[sizeof(d->keys[0])];

  make_key(key, sizeof(key), n->provider, n->id);
  for (unsigned i = 0; i < d->used; i++)
    if (strcmp(d->keys[i], key) == 0)
      return 1;
  spot_strlcpy(d->keys[d->next], key, sizeof(d->keys[0]));
  d->next = (d->next + 1) % SPOT_NOTICE_DEDUP_SLOTS;
  if (d->used < SPOT_NOTICE_DEDUP_SLOTS)
    d->used++;
  return 0;
}

void
spot_notice_forget(struct spot_notice_dedup *d, enum spot_provider p,
                   const char *id)
{
  char key[sizeof(d->keys[0])];

  make_key(key, sizeof(key), p, id);
  for (unsigned i = 0; i < d->used; i++)
    if (strcmp(d->keys[i], key) == 0)
      d->keys[i][0] = '\0'; /* an empty key never matches a real one */
}

int
spot__meta_json_load(const char *body, size_t len, struct json_t **out)
{
  json_error_t err;
  json_t *j;

  if (len > SPOT_META_BODY_MAX)
    return -E2BIG;
  if (body == NULL)
    return -EINVAL;
  j = json_loadb(body, len, JSON_REJECT_DUPLICATES, &err);
  if (j == NULL)
    return -EINVAL;
  *out = j;
  return 0;
}

void
spot__notice_detail(struct spot_notice *n, const char *body, size_t len)
{
  size_t c = len < sizeof(n->detail) - 1 ? len : sizeof(n->detail) - 1;

  if (body != NULL)
    memcpy(n->detail, body, c);
  else
    c = 0;
  n->detail[c] = '\0';
}

static int
by_deadline(const void *a, const void *b)
{
  const struct spot_notice *x = a, *y = b;

  return (x->deadline_wall_ms > y->deadline_wall_ms) -
         (x->deadline_wall_ms < y->deadline_wall_ms);
}

int
spot__notice_sort_out(struct spot_notice *tmp, size_t count,
                      struct spot_notice *out, size_t max, size_t *n)
{
  if (count == 0 || max == 0)
    return 1;
  qsort(tmp, count, sizeof(tmp[0]), by_deadline);
  if (count > max)
    count = max;
  memcpy(out, tmp, count * sizeof(tmp[0]));
  *n = count;
  return 0;
}

void
spot__meta_trim(const char **p, size_t *len)
{
  while (*len > 0 && strchr(" \t\r\n", (*p)[0]) != NULL && (*p)[0] != '\0') {
    (*p)++;
    (*len)--;
  }
  while (*len > 0 && strchr(" \t\r\n", (*p)[*len - 1]) != NULL &&
         (*p)[*len - 1] != '\0')
    (*len)--;
}
