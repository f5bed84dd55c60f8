/* watch.c: SPOTD_CKPT_DIR with inotify (uv_fs_event): complete checkpoint
 * folders. */
#ifndef SPOTD_WATCH_H
#define SPOTD_WATCH_H

#include <stdbool.h>
#include <uv.h>

struct spotd;

#define SPOTD_NAMES_MAX 64 /* checkpoint folders remembered */
#define SPOTD_WATCH_MAX 64 /* subfolders watched for SPOTD_COMPLETE */

struct watch_sub {
  uv_fs_event_t ev;
  char *name;
  bool used;
  struct spotd *d;
};

int watch_start(struct spotd *d);
void watch_scan(struct spotd *d);
void watch_close(struct spotd *d);
bool watch_is_known(struct spotd *d, const char *name);
void watch_mark_known(struct spotd *d, const char *name);

#endif
