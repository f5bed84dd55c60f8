/* fallback.c: an older committed checkpoint when the newest is damaged. */
#ifndef SPOTD_FALLBACK_H
#define SPOTD_FALLBACK_H

#include <stdbool.h>
#include <stddef.h>

#include "io/store/store.h"

struct spotd;

/* Restore fallback: checkpoints that failed verification
 * and the committed ones still to try, newest first. */
#define SPOTD_FALLBACK_MAX 16
struct fallback {
  struct spot_store_op *op; /* the listing or an older one's restore */
  bool listed;
  char bad[SPOTD_FALLBACK_MAX][256];
  size_t nbad;
  char cands[SPOTD_FALLBACK_MAX][256];
  size_t ncands, next;
};

/* The restore failed: true when an older checkpoint is being
 * tried (restore_finished() follows), false to fail. Only for damage in
 * the store (fallback_damage()). */
bool fallback_next(struct spotd *d, const struct spot_store_result *res);
/* Whether the restore failed on damage in the store itself, the only
 * failure an older checkpoint is tried for. */
bool fallback_damage(const struct spot_store_result *res);

#endif
