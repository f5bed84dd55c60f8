/* SPOTD_CKPT_DIR, watched with inotify through uv_fs_event (never by
 * polling). inotify is not recursive, so the folder itself is watched for
 * new checkpoint folders and each incomplete checkpoint folder is watched
 * for its SPOTD_COMPLETE marker. Any event triggers a rescan, which is
 * cheap (one readdir, one stat per folder) and makes missed or coalesced
 * events harmless. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/log.h"
#include "spotd.h"
#include "upload.h"
#include "core/util.h"
#include "watch.h"

bool
watch_is_known(struct spotd *d, const char *name)
{
  for (size_t i = 0; i < d->nknown; i++)
    if (strcmp(d->known[i], name) == 0)
      return true;
  return false;
}

void
watch_mark_known(struct spotd *d, const char *name)
{
  char *dup;

  if (watch_is_known(d, name))
    return;
  dup = strdup(name);
  if (dup == NULL)
    return;
  if (d->nknown == SPOTD_NAMES_MAX) {
    /* forget the oldest: it was handled long ago */
    free(d->known[0]);
    memmove(d->known, d->known + 1, (SPOTD_NAMES_MAX - 1) * sizeof(char *));
    d->nknown--;
  }
  d->known[d->nknown++] = dup;
}

static void
sub_close_cb(uv_handle_t *h)
{
  struct watch_sub *s = spot_container_of(h, struct watch_sub, ev);

  free(s->name);
  s->name = NULL;
  s->used = false;
}

static void
sub_drop(struct spotd *d, struct watch_sub *s)
{
  if (!s->used || uv_is_closing((uv_handle_t *)&s->ev))
    return;
  uv_fs_event_stop(&s->ev);
  uv_close((uv_handle_t *)&s->ev, sub_close_cb);
}

static void
event_cb(uv_fs_event_t *h, const char *filename, int events, int status)
{
  struct spotd *d = h->data;

  if (status < 0)
    log_debug("watch: %s", uv_strerror(status));
  (void)filename;
  (void)events;
  if (!d->closing)
    watch_scan(d);
}

static struct watch_sub *
sub_find(struct spotd *d, const char *name)
{
  for (size_t i = 0; i < SPOTD_WATCH_MAX; i++)
    if (d->subs[i].used && d->subs[i].name != NULL &&
        !uv_is_closing((uv_handle_t *)&d->subs[i].ev) &&
        strcmp(d->subs[i].name, name) == 0)
      return &d->subs[i];
  return NULL;
}

static void
sub_add(struct spotd *d, const char *name, const char *path)
{
  struct watch_sub *s = NULL;
  int r;

  if (sub_find(d, name) != NULL)
    return;
  for (size_t i = 0; i < SPOTD_WATCH_MAX; i++)
    if (!d->subs[i].used) {
      s = &d->subs[i];
      break;
    }
  if (s == NULL) {
    log_warn("watch: more than %d incomplete checkpoint folders; %s is "
             "only seen on the next change",
             SPOTD_WATCH_MAX, name);
    return;
  }
  r = uv_fs_event_init(d->loop, &s->ev);
  if (r < 0)
    return;
  s->used = true;
  s->d = d;
  s->ev.data = d;
  s->name = strdup(name);
  r = uv_fs_event_start(&s->ev, event_cb, path, 0);
  if (r < 0 || s->name == NULL) {
    log_debug("watch %s: %s", path, uv_strerror(r));
    sub_drop(d, s);
  }
}

static bool
is_file(const char *path)
{
  struct stat st;

  return lstat(path, &st) == 0 && S_ISREG(st.st_mode);
}

void
watch_scan(struct spotd *d)
{
  DIR *dir;
  struct dirent *de;

  dir = opendir(d->ckpt_dir);
  if (dir == NULL)
    return;
  while ((de = readdir(dir)) != NULL) {
    char path[4200], marker[4300];
    struct stat st;
    struct watch_sub *s;

    if (de->d_name[0] == '.')
      continue; /* ".", "..", and our own temporary folders */
    if (watch_is_known(d, de->d_name)) {
      if ((s = sub_find(d, de->d_name)) != NULL)
        sub_drop(d, s);
      continue;
    }
    snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, de->d_name);
    if (lstat(path, &st) < 0 || !S_ISDIR(st.st_mode))
      continue;
    snprintf(marker, sizeof(marker), "%s/%s", path, SPOTD_COMPLETE);
    if (!is_file(marker)) {
      sub_add(d, de->d_name, path);
      /* a marker made between the check and the watch sends no event */
      if (!is_file(marker)) {
        upload_follow_maybe(d, de->d_name);
        continue;
      }
    }
    if ((s = sub_find(d, de->d_name)) != NULL)
      sub_drop(d, s);
    spotd_checkpoint_complete(d, de->d_name);
  }
  closedir(dir);
  /* folders that vanished */
  for (size_t i = 0; i < SPOTD_WATCH_MAX; i++) {
    struct watch_sub *s = &d->subs[i];
    char path[4200];
    struct stat st;

    if (!s->used || s->name == NULL || uv_is_closing((uv_handle_t *)&s->ev))
      continue;
    snprintf(path, sizeof(path), "%s/%s", d->ckpt_dir, s->name);
    if (lstat(path, &st) < 0)
      sub_drop(d, s);
  }
}

int
watch_start(struct spotd *d)
{
  int r = uv_fs_event_init(d->loop, &d->dir_ev);

  if (r < 0)
    return r;
  d->dir_ev_active = true;
  d->dir_ev.data = d;
  r = uv_fs_event_start(&d->dir_ev, event_cb, d->ckpt_dir, 0);
  if (r < 0) {
    log_err("cannot watch %s: %s", d->ckpt_dir, uv_strerror(r));
    return r;
  }
  watch_scan(d);
  return 0;
}

void
watch_close(struct spotd *d)
{
  for (size_t i = 0; i < SPOTD_WATCH_MAX; i++)
    sub_drop(d, &d->subs[i]);
  if (d->dir_ev_active && !uv_is_closing((uv_handle_t *)&d->dir_ev)) {
    uv_fs_event_stop(&d->dir_ev);
    uv_close((uv_handle_t *)&d->dir_ev, NULL);
  }
  for (size_t i = 0; i < d->nknown; i++)
    free(d->known[i]);
  d->nknown = 0;
}
