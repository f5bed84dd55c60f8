/* Internals shared by store.c, store_push.c, store_restore.c and
 * store_list.c. */
#ifndef SPOT_STORE_INTERNAL_H
#define SPOT_STORE_INTERNAL_H

#include <unistd.h>

#include "store.h"

/* A config with its strings copied and defaults filled in. */
struct spot__store_cfg {
  struct spot_store_config c;
  char *bucket, *prefix, *job, *journal_dir;
};

int spot__store_cfg_copy(struct spot__store_cfg *dst,
                         const struct spot_store_config *src);
void spot__store_cfg_fini(struct spot__store_cfg *c);
/* malloc'd key, NULL on ENOMEM. */
char *spot__store_key(const struct spot_store_config *cfg, const char *name,
                      const char *rel);
/* ".../checkpoints/NAME/" (a CommonPrefix) -> NAME, malloc'd. Returns 0,
 * -EINVAL (not of that shape) or -ENOMEM. */
int spot__store_prefix_name(const char *prefix, char **name);
/* Writes into buf only if it is still empty (the first error wins). */
void spot__store_msg(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void spot__store_s3_msg(char *buf, size_t size, const char *what,
                        const struct spot_s3_result *res);

/* LATEST and manifests are read with this cap. */
#define SPOT__STORE_LATEST_CAP 1024
#define SPOT__STORE_MANIFEST_CAP ((size_t)64 << 20)

enum spot__store_kind {
  SPOT__STORE_PUSH,
  SPOT__STORE_RESTORE,
  SPOT__STORE_LIST,
};

/* Every op starts with this header so spot_store_cancel() can dispatch. */
struct spot__store_hdr {
  enum spot__store_kind kind;
};

void spot__store_push_cancel(struct spot_store_op *op);
void spot__store_restore_cancel(struct spot_store_op *op);
void spot__store_list_cancel(struct spot_store_op *op);

#endif
