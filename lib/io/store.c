/* The checkpoint store: shared pieces of push, restore and list.
 * store_push.c and store_restore.c hold the two pipelines. */
#include "store.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "manifest.h"
#include "store_internal.h"
#include "util.h"

const char *
spot_store_phase_name(enum spot_store_phase p)
{
  static const char *const names[] = {
      [SPOT_STORE_PHASE_PLAN] = "plan",
      [SPOT_STORE_PHASE_TRANSFER] = "transfer",
      [SPOT_STORE_PHASE_COMMIT] = "commit",
      [SPOT_STORE_PHASE_RETAIN] = "retain",
      [SPOT_STORE_PHASE_FINISH] = "finish",
  };

  if ((unsigned)p >= SPOT_STORE_PHASE_LAST)
    return "?";
  return names[p];
}

int
spot_store_key(const struct spot_store_config *cfg, const char *name,
               const char *rel, struct spot_buf *out)
{
  int r;

  spot_buf_reset(out);
  if (cfg->prefix != NULL && cfg->prefix[0] != '\0') {
    r = spot_buf_printf(out, "%s/", cfg->prefix);
    if (r < 0)
      return r;
  }
  r = spot_buf_printf(out, "%s/", cfg->job);
  if (r < 0)
    return r;
  if (name == NULL)
    return rel != NULL ? spot_buf_appends(out, rel) : 0;
  r = spot_buf_printf(out, "checkpoints/%s/", name);
  if (r < 0 || rel == NULL)
    return r;
  return spot_buf_appends(out, rel);
}

char *
spot__store_key(const struct spot_store_config *cfg, const char *name,
                const char *rel)
{
  struct spot_buf b;

  spot_buf_init(&b, 2048);
  if (spot_store_key(cfg, name, rel, &b) < 0) {
    spot_buf_fini(&b);
    return NULL;
  }
  return spot_buf_steal(&b);
}

int
spot__store_cfg_copy(struct spot__store_cfg *dst,
                     const struct spot_store_config *src)
{
  long cores;

  memset(dst, 0, sizeof(*dst));
  dst->c = *src;
  dst->bucket = strdup(src->bucket != NULL ? src->bucket : "");
  dst->prefix = strdup(src->prefix != NULL ? src->prefix : "");
  dst->job = strdup(src->job != NULL ? src->job : "");
  if (src->journal_dir != NULL) {
    dst->journal_dir = strdup(src->journal_dir);
    if (dst->journal_dir == NULL) {
      spot__store_cfg_fini(dst);
      return -ENOMEM;
    }
  }
  if (dst->bucket == NULL || dst->prefix == NULL || dst->job == NULL) {
    spot__store_cfg_fini(dst);
    return -ENOMEM;
  }
  dst->c.bucket = dst->bucket;
  dst->c.prefix = dst->prefix;
  dst->c.job = dst->job;
  dst->c.journal_dir = dst->journal_dir;
  if (dst->c.part_size == 0)
    dst->c.part_size = SPOT_STORE_PART_DEFAULT;
  if (dst->c.parallel == 0)
    dst->c.parallel = SPOT_STORE_PARALLEL_DEFAULT;
  if (dst->c.workers == 0) {
    cores = sysconf(_SC_NPROCESSORS_ONLN);
    dst->c.workers = cores < 1 ? 1 : cores > 8 ? 8 : (unsigned)cores;
  }
  if (dst->c.stale_upload_age_ms == 0)
    dst->c.stale_upload_age_ms = 3600 * 1000;
  if (src->s3 == NULL || dst->bucket[0] == '\0' || dst->job[0] == '\0' ||
      dst->c.part_size < SPOT_STORE_PART_MIN ||
      dst->c.part_size > SPOT_STORE_PART_MAX || dst->c.part_size % 4096 != 0 ||
      dst->c.parallel > 64 || dst->c.workers > 64) {
    spot__store_cfg_fini(dst);
    return -EINVAL;
  }
  return 0;
}

void
spot__store_cfg_fini(struct spot__store_cfg *c)
{
  free(c->bucket);
  free(c->prefix);
  free(c->job);
  free(c->journal_dir);
  c->bucket = c->prefix = c->job = c->journal_dir = NULL;
}

void
spot__store_msg(char *buf, size_t size, const char *fmt, ...)
{
  va_list ap;

  if (buf[0] != '\0')
    return; /* keep the first error: it is the cause */
  va_start(ap, fmt);
  vsnprintf(buf, size, fmt, ap);
  va_end(ap);
}

void
spot__store_s3_msg(char *buf, size_t size, const char *what,
                   const struct spot_s3_result *res)
{
  char tmp[512];

  spot__store_msg(buf, size, "%s: %s", what,
                  spot_s3_strerror(res, tmp, sizeof(tmp)));
}

int
spot__store_prefix_name(const char *p, char **name)
{
  size_t len = strlen(p);
  const char *start;

  if (len < 2 || p[len - 1] != '/')
    return -EINVAL;
  start = p + len - 2;
  while (start > p && start[-1] != '/')
    start--;
  *name = strndup(start, (size_t)(p + len - 1 - start));
  return *name != NULL ? 0 : -ENOMEM;
}
