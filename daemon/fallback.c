/* Restore fallback: when the newest commit fails
 * verification at restore (a checksum mismatch, a missing or undecodable
 * object, an unreadable manifest), spotd says so loudly, lists the job's
 * committed checkpoints and restores the newest one that verifies. The
 * status shows a warning naming the bad checkpoint and "restored" names
 * the one restored. Runs inside the startup's RESTORING state
 * (startup.c), with an operation slot of its own, d->fb.op (one writer:
 * this file), which closing cancels. Nothing else falls back: not the local
 * disk (startup.c exits 74), not the network or the server, not a rank count
 * (65): an older checkpoint there would silently roll the training back. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "fallback.h"
#include "core/log.h"
#include "startup.h"
#include "spotd.h"
#include "core/util.h"

static void try_next(struct spotd *d);

bool
fallback_damage(const struct spot_store_result *res)
{
  if (res->local)
    return false;
  switch (-res->err) {
  case EILSEQ:       /* a checksum mismatch */
  case EBADMSG:      /* undecodable, shorter than the manifest, bad LATEST */
  case ENOENT:       /* an object or the manifest missing */
  case EINVAL:       /* an invalid manifest */
  case E2BIG:        /* a frame larger than a part may be */
  case EFBIG:        /* a manifest over its limit */
  case EMSGSIZE:     /* an object longer than the manifest says */
  case ERANGE:       /* a ranged read past the object's end */
  case EEXIST:       /* the manifest's paths collide */
  case ENOTDIR:      /* (ditto) */
  case ELOOP:        /* (ditto) */
  case ENAMETOOLONG: /* (ditto) */
  case EISDIR:       /* (ditto) */
    return true;
  default: /* the network, the server, permissions, a timeout, memory */
    return false;
  }
}

static bool
is_bad(const struct spotd *d, const char *name)
{
  for (size_t i = 0; i < d->fb.nbad; i++)
    if (strcmp(d->fb.bad[i], name) == 0)
      return true;
  return false;
}

static void
mark_bad(struct spotd *d, const char *name)
{
  if (name != NULL && name[0] != '\0' && !is_bad(d, name) &&
      d->fb.nbad < SPOTD_FALLBACK_MAX)
    spot_strlcpy(d->fb.bad[d->fb.nbad++], name, sizeof(d->fb.bad[0]));
}

static void
fallback_done_cb(const struct spot_store_result *res, void *data)
{
  struct spotd *d = data;

  d->fb.op = NULL;
  if (d->closing)
    return;
  restore_finished(d, res);
}

static void
try_next(struct spotd *d)
{
  struct spot_store_config sc;
  char tmp[4300];
  int r;

  while (d->fb.next < d->fb.ncands) {
    const char *name = d->fb.cands[d->fb.next++];

    if (is_bad(d, name))
      continue;
    log_notice("restore: trying the older checkpoint %s", name);
    snprintf(tmp, sizeof(tmp), "%s/.spotd-resume", d->ckpt_dir);
    if (access(tmp, F_OK) == 0)
      spot_rm_tree(tmp);
    restore_store_config(d, &sc);
    r = spot_store_restore(d->loop, &sc, name, tmp, NULL, fallback_done_cb, d,
                           &d->fb.op);
    if (r == 0)
      return;
    d->fb.op = NULL;
    /* not a verdict on the checkpoint (memory): stop here */
    log_err("restore: starting the restore of %s: %s", name, strerror(-r));
    restore_failed(d, SPOTD_EXIT_ERROR);
    return;
  }
  /* Reached only through fallback_next(), for damage in the store: every
   * checkpoint tried failed verification. */
  log_err("restore: no committed checkpoint of job %s verifies; not "
          "starting from scratch over a damaged store (fix or delete the "
          "damaged checkpoints)",
          d->cfg->job);
  restore_failed(d, SPOTD_EXIT_DATAERR);
}

static void
list_cb(const struct spot_store_list_result *res, void *data)
{
  struct spotd *d = data;

  d->fb.op = NULL;
  if (d->closing)
    return;
  if (res->err < 0) {
    log_err("restore: listing the job's checkpoints: %s", res->message);
    restore_failed(d, SPOTD_EXIT_UNAVAILABLE);
    return;
  }
  d->fb.ncands = 0;
  for (size_t i = 0; i < res->n && d->fb.ncands < SPOTD_FALLBACK_MAX; i++)
    if (res->entries[i].committed && res->entries[i].problem == NULL)
      spot_strlcpy(d->fb.cands[d->fb.ncands++], res->entries[i].name,
                   sizeof(d->fb.cands[0]));
  d->fb.next = 0;
  try_next(d);
}

bool
fallback_next(struct spotd *d, const struct spot_store_result *res)
{
  const char *name = res->name != NULL && res->name[0] ? res->name : "LATEST";
  int r;

  if (res->err == -ECANCELED || d->closing)
    return false;
  mark_bad(d, name);
  log_err("restore: checkpoint %s fails verification: %s", name, res->message);
  spotd_warn(d,
             "checkpoint %s fails verification (%s): restoring an older "
             "one",
             name, res->message);
  if (d->fb.listed) {
    try_next(d);
    return true;
  }
  d->fb.listed = true;
  r = spot_store_list(d->loop, &d->store, list_cb, d, &d->fb.op);
  if (r < 0) {
    d->fb.op = NULL;
    return false;
  }
  return true;
}
