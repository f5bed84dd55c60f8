/* The journal scan: a spotd killed mid-upload left a journal
 * (CKPT_DIR/.spotd-journal/JOB--NAME.json) next to the checkpoint folder.
 * The newest one whose folder is still complete is resumed by startup.c
 * (its parts already stored are not sent again); older ones are dropped
 * and their uploads aborted by the next commit's retention. */
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "journal.h"
#include "core/manifest.h"
#include "spotd.h"
#include "core/util.h"

static bool
newer(const struct timespec *a, const struct timespec *b)
{
  return a->tv_sec > b->tv_sec ||
         (a->tv_sec == b->tv_sec && a->tv_nsec > b->tv_nsec);
}

/* The checkpoint name of journal file fname, or false. */
static bool
journal_name(const char *fname, const char *prefix, char *name, size_t size)
{
  size_t n = strlen(fname), plen = strlen(prefix);

  if (strncmp(fname, prefix, plen) != 0 || n < plen + 6 ||
      strcmp(fname + n - 5, ".json") != 0 || n - plen - 5 >= size)
    return false;
  memcpy(name, fname + plen, n - plen - 5);
  name[n - plen - 5] = '\0';
  return true;
}

static void
drop(struct spotd *d, const char *prefix, const char *name)
{
  char path[4400];

  snprintf(path, sizeof(path), "%s/%s%s.json", d->journal_dir, prefix, name);
  unlink(path);
}

bool
journal_find(struct spotd *d, char *best, size_t size)
{
  DIR *dir = opendir(d->journal_dir);
  struct timespec best_mtime = {0, 0};
  struct dirent *de;
  char prefix[300];

  best[0] = '\0';
  if (dir == NULL)
    return false;
  snprintf(prefix, sizeof(prefix), "%s--", d->cfg->job);
  while ((de = readdir(dir)) != NULL) {
    char path[4400], marker[4400], name[256];
    struct stat st;

    if (!journal_name(de->d_name, prefix, name, sizeof(name)))
      continue;
    snprintf(path, sizeof(path), "%s/%s", d->journal_dir, de->d_name);
    snprintf(marker, sizeof(marker), "%s/%s/%s", d->ckpt_dir, name,
             SPOTD_COMPLETE);
    if (!spot_ckpt_name_valid(name) || stat(marker, &st) < 0 ||
        stat(path, &st) < 0) {
      unlink(path);
      continue;
    }
    if (best[0] != '\0' && !newer(&st.st_mtim, &best_mtime)) {
      unlink(path);
      continue;
    }
    if (best[0] != '\0')
      drop(d, prefix, best);
    spot_strlcpy(best, name, size);
    best_mtime = st.st_mtim;
  }
  closedir(dir);
  return best[0] != '\0';
}
