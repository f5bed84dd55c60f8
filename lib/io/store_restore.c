/* Restore: one committed checkpoint into a folder, all or nothing.
 *
 *   LATEST    GET ROOT/LATEST (when no name is given)
 *   MANIFEST  GET and validate the manifest; nothing else is trusted
 *   PREPARE   (thread pool) make a temporary folder next to the target,
 *             create every folder and file in it
 *   XFER      ranged GETs of the frames (at most `parallel`), decode and
 *             check each frame's CRC32C on the pool (at most `workers`),
 *             pwrite at its offset
 *   FINISH    (thread pool) fsync, set modes and times, rename the
 *             temporary folder into place, fsync the parent
 *   CLEANUP   (thread pool, after an error) remove the temporary folder
 *
 * The target is therefore either the whole verified checkpoint or left as
 * it was. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zstd.h>

#include "codec.h"
#include "log.h"
#include "manifest.h"
#include "store_internal.h"
#include "util.h"

enum restore_state {
  R_LATEST,
  R_MANIFEST,
  R_PREPARE,
  R_XFER,
  R_FINISH,
  R_CLEANUP,
  R_DONE,
};

static const char *const restore_state_names[] = {
    "latest", "manifest", "prepare", "transfer", "finish", "cleanup", "done",
};

struct decoder {
  struct spot_codec *codec;
  void *raw;
  bool busy;
};

enum rslot_state {
  RS_FREE,
  RS_FETCHING,
  RS_FETCHED,
  RS_DECODING,
};

struct rslot {
  struct restore_op *op;
  enum rslot_state state;
  size_t file, frame;
  void *comp;
  size_t comp_cap, got;
  struct decoder *dec;
  uv_work_t work;
  int work_err;
  struct spot_s3_op *s3op;
  uint64_t seq;
};

struct restore_op {
  struct spot__store_hdr hdr;
  uv_loop_t *loop;
  struct spot__store_cfg cfg;
  enum restore_state state;
  char *name;
  char *dir;
  char *tmp; /* the temporary folder, once made */
  spot_store_progress_cb progress;
  spot_store_cb cb;
  void *data;
  int err;
  char msg[768];
  bool cancelled;

  struct spot_buf body;
  struct spot_manifest *m;
  struct decoder *decs;
  struct rslot *slots;
  size_t nslots;
  size_t next_file, next_frame;
  uint64_t seq;
  unsigned active_work, active_s3, active_fetch;
  struct spot_s3_op *s3op;
  uv_work_t work;

  uint64_t raw_done, stored_done;
  unsigned retries;
  uint64_t start_ms;
  uv_timer_t progress_timer;
};

static void advance(struct restore_op *op);
static void pump(struct restore_op *op);

static void
set_state(struct restore_op *op, enum restore_state s)
{
  log_debug("restore name=%s state %s -> %s", op->name ? op->name : "?",
            restore_state_names[op->state], restore_state_names[s]);
  op->state = s;
}

static void fail_msg(struct restore_op *op, int err, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
fail_msg(struct restore_op *op, int err, const char *fmt, ...)
{
  va_list ap;
  char raw[sizeof(op->msg)];

  if (op->msg[0] == '\0') {
    va_start(ap, fmt);
    vsnprintf(raw, sizeof(raw), fmt, ap);
    va_end(ap);
    /* Paths and names come from the store's manifest: never raw. */
    spot_escape(raw, op->msg, sizeof(op->msg));
  }
  if (op->err == 0)
    op->err = err < 0 ? err : -EIO;
}

static bool
busy(const struct restore_op *op)
{
  return op->active_work > 0 || op->active_s3 > 0;
}

static void
report_progress(struct restore_op *op, enum spot_store_phase phase)
{
  struct spot_store_progress p;

  if (op->progress == NULL)
    return;
  p.phase = phase;
  p.name = op->name != NULL ? op->name : "";
  p.raw_done = op->raw_done;
  p.raw_total = op->m != NULL ? op->m->total_raw : 0;
  p.stored_done = op->stored_done;
  p.elapsed_ms = spot_now_mono_ms() - op->start_ms;
  p.retries = op->retries;
  op->progress(&p, op->data);
}

static void
progress_timer_cb(uv_timer_t *t)
{
  struct restore_op *op =
      spot_container_of(t, struct restore_op, progress_timer);

  if (op->state == R_XFER)
    report_progress(op, SPOT_STORE_PHASE_TRANSFER);
}

static void
op_free(struct restore_op *op)
{
  for (size_t i = 0; op->decs != NULL && i < op->cfg.c.workers; i++) {
    spot_codec_free(op->decs[i].codec);
    free(op->decs[i].raw);
  }
  free(op->decs);
  for (size_t i = 0; i < op->nslots; i++)
    free(op->slots[i].comp);
  free(op->slots);
  spot_manifest_free(op->m);
  spot_buf_fini(&op->body);
  spot__store_cfg_fini(&op->cfg);
  free(op->name);
  free(op->dir);
  free(op->tmp);
  free(op);
}

static void
timer_close_cb(uv_handle_t *h)
{
  op_free(spot_container_of(h, struct restore_op, progress_timer));
}

static void
finish(struct restore_op *op)
{
  struct spot_store_result res;

  set_state(op, R_DONE);
  memset(&res, 0, sizeof(res));
  res.err = op->err;
  if (op->err < 0 && op->msg[0] == '\0')
    snprintf(op->msg, sizeof(op->msg), "%s", strerror(-op->err));
  res.message = op->err < 0 ? op->msg : "";
  res.name = op->name != NULL ? op->name : "";
  res.files = op->m != NULL ? op->m->nfiles : 0;
  res.raw_bytes = op->m != NULL ? op->m->total_raw : 0;
  res.stored_bytes = op->m != NULL ? op->m->total_stored : 0;
  res.retries = op->retries;
  res.elapsed_ms = spot_now_mono_ms() - op->start_ms;
  res.warning = "";
  if (op->err == 0)
    report_progress(op, SPOT_STORE_PHASE_FINISH);
  op->cb(&res, op->data);
  uv_timer_stop(&op->progress_timer);
  uv_close((uv_handle_t *)&op->progress_timer, timer_close_cb);
}

/* ------------------------------------------------------ file system */

/* Creates the parent folders of rel under dirfd. rel is validated by the
 * manifest parser: relative, no "." or ".." or empty component. */
static int
make_parents(int dirfd, const char *rel)
{
  char path[SPOT_MANIFEST_PATH_MAX + 1];
  char *p;

  if (spot_strlcpy(path, rel, sizeof(path)) >= sizeof(path))
    return -ENAMETOOLONG;
  for (p = strchr(path, '/'); p != NULL; p = strchr(p + 1, '/')) {
    struct stat st;

    *p = '\0';
    if (mkdirat(dirfd, path, 0755) < 0 && errno != EEXIST)
      return -errno;
    /* Never follow anything but a folder we made. */
    if (fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) < 0)
      return -errno;
    if (!S_ISDIR(st.st_mode))
      return -ENOTDIR;
    *p = '/';
  }
  return 0;
}

static int
open_in_tmp(const struct restore_op *op, const char *rel, int flags)
{
  int dfd = open(op->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int fd, saved;

  if (dfd < 0)
    return -errno;
  fd = openat(dfd, rel, flags | O_CLOEXEC | O_NOFOLLOW, 0600);
  saved = errno;
  close(dfd);
  return fd < 0 ? -saved : fd;
}

static void
prepare_work_cb(uv_work_t *req)
{
  struct restore_op *op = spot_container_of(req, struct restore_op, work);
  char *dup, *slash, tmpl[4200];
  const char *parent, *base;
  struct stat st;
  int dfd;

  /* The target must not exist, or be an empty folder (rename(2) replaces
   * an empty folder atomically). */
  if (lstat(op->dir, &st) == 0) {
    int n = 0;
    if (S_ISDIR(st.st_mode)) {
      int fd = open(op->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
      struct dirent *de;
      if (d == NULL) {
        if (fd >= 0)
          close(fd);
        fail_msg(op, -errno, "%s: %s", op->dir, strerror(errno));
        return;
      }
      while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
          n++;
      closedir(d);
    }
    if (!S_ISDIR(st.st_mode) || n > 0) {
      fail_msg(op, -EEXIST,
               "%s already exists and is not an empty folder; restore into "
               "a new folder",
               op->dir);
      return;
    }
  } else if (errno != ENOENT) {
    fail_msg(op, -errno, "%s: %s", op->dir, strerror(errno));
    return;
  }

  dup = strdup(op->dir);
  if (dup == NULL) {
    fail_msg(op, -ENOMEM, "out of memory");
    return;
  }
  slash = strrchr(dup, '/');
  if (slash == NULL) {
    parent = ".";
    base = dup;
  } else if (slash == dup) {
    parent = "/";
    base = slash + 1;
  } else {
    *slash = '\0';
    parent = dup;
    base = slash + 1;
  }
  snprintf(tmpl, sizeof(tmpl), "%s/.%s.spotd-restore-%s", parent, base,
           SPOT_MKTEMP_SUFFIX);
  free(dup);
  if (mkdtemp(tmpl) == NULL) {
    fail_msg(op, -errno, "making a temporary folder next to %s: %s", op->dir,
             strerror(errno));
    return;
  }
  op->tmp = strdup(tmpl);
  if (op->tmp == NULL) {
    rmdir(tmpl);
    fail_msg(op, -ENOMEM, "out of memory");
    return;
  }
  dfd = open(op->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    fail_msg(op, -errno, "%s: %s", op->tmp, strerror(errno));
    return;
  }
  for (size_t i = 0; i < op->m->nfiles; i++) {
    const struct spot_manifest_file *f = &op->m->files[i];
    int r = make_parents(dfd, f->path);
    int fd;

    if (r < 0) {
      fail_msg(op, r, "creating the folders of %s: %s", f->path, strerror(-r));
      break;
    }
    fd = openat(dfd, f->path,
                O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      fail_msg(op, -errno, "creating %s: %s", f->path, strerror(errno));
      break;
    }
    close(fd);
  }
  close(dfd);
}

static void
cleanup_work_cb(uv_work_t *req)
{
  struct restore_op *op = spot_container_of(req, struct restore_op, work);

  if (op->tmp != NULL)
    spot_rm_tree(op->tmp);
}

static int
fsync_path(const char *path, int flags)
{
  int fd = open(path, flags | O_CLOEXEC);
  int r = 0;

  if (fd < 0)
    return -errno;
  if (fsync(fd) < 0)
    r = -errno;
  close(fd);
  return r;
}

static int
fsync_dirs_cb(const char *path, const struct stat *st, int flag,
              struct FTW *ftw)
{
  (void)st;
  (void)ftw;
  if (flag == FTW_DP && fsync_path(path, O_RDONLY | O_DIRECTORY) < 0)
    return 1;
  return 0;
}

static void
finish_work_cb(uv_work_t *req)
{
  struct restore_op *op = spot_container_of(req, struct restore_op, work);
  char *parent;
  char *slash;

  for (size_t i = 0; i < op->m->nfiles; i++) {
    const struct spot_manifest_file *f = &op->m->files[i];
    struct timespec ts[2];
    int fd = open_in_tmp(op, f->path, O_WRONLY);

    if (fd < 0) {
      fail_msg(op, fd, "%s: %s", f->path, strerror(-fd));
      return;
    }
    ts[0].tv_sec = ts[1].tv_sec = (time_t)(f->mtime_ns / 1000000000);
    ts[0].tv_nsec = ts[1].tv_nsec = (long)(f->mtime_ns % 1000000000);
    if (fsync(fd) < 0 || fchmod(fd, (mode_t)f->mode) < 0 ||
        futimens(fd, ts) < 0) {
      fail_msg(op, -errno, "%s: %s", f->path, strerror(errno));
      close(fd);
      return;
    }
    if (close(fd) < 0) {
      fail_msg(op, -errno, "%s: %s", f->path, strerror(errno));
      return;
    }
  }
  /* mkdtemp made it 0700; a checkpoint folder is an ordinary one. */
  chmod(op->tmp, 0755);
  if (nftw(op->tmp, fsync_dirs_cb, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    fail_msg(op, -EIO, "syncing the folders of %s failed", op->tmp);
    return;
  }
  if (rename(op->tmp, op->dir) < 0) {
    fail_msg(op, -errno, "moving the restored checkpoint to %s: %s", op->dir,
             strerror(errno));
    return;
  }
  free(op->tmp);
  op->tmp = NULL; /* nothing to clean up any more */
  parent = strdup(op->dir);
  if (parent != NULL) {
    slash = strrchr(parent, '/');
    if (slash == parent)
      slash[1] = '\0';
    else if (slash != NULL)
      *slash = '\0';
    fsync_path(slash != NULL ? parent : ".", O_RDONLY | O_DIRECTORY);
    free(parent);
  }
}

/* ------------------------------------------------------------ xfer */

static int
fetch_sink(const void *p, size_t n, uint64_t offset, void *data)
{
  struct rslot *s = data;

  /* The server must not send more than the frame. */
  if (offset > s->comp_cap || n > s->comp_cap - offset)
    return -EBADMSG;
  memcpy((char *)s->comp + offset, p, n);
  if (offset + n > s->got)
    s->got = (size_t)(offset + n);
  return 0;
}

/* The length of the zstd frame at the start of a stored frame: all of it,
 * or less when push padded it with one skippable frame to S3's part
 * minimum (store_push.c pad_part()). Anything else after the frame is
 * left in, and the codec rejects it as corrupt. */
static size_t
frame_len(const unsigned char *p, size_t n)
{
  size_t z = ZSTD_findFrameCompressedSize(p, n);
  const unsigned char *t;
  size_t rest;

  if (ZSTD_isError(z) || z >= n || n - z < 8)
    return n;
  t = p + z;
  rest = n - z - 8;
  if ((t[0] & 0xf0) != 0x50 || t[1] != 0x2A || t[2] != 0x4D || t[3] != 0x18 ||
      ((size_t)t[4] | (size_t)t[5] << 8 | (size_t)t[6] << 16 |
       (size_t)t[7] << 24) != rest)
    return n;
  return z;
}

static void
decode_work_cb(uv_work_t *req)
{
  struct rslot *s = spot_container_of(req, struct rslot, work);
  struct restore_op *op = s->op;
  const struct spot_manifest_file *f = &op->m->files[s->file];
  const struct spot_manifest_frame *fr = &f->frames[s->frame];
  size_t done = 0;
  int fd;

  s->work_err = spot_codec_decode(s->dec->codec, f->filter, s->comp,
                                  frame_len(s->comp, s->got), s->dec->raw,
                                  (size_t)fr->raw_len, fr->crc32c);
  if (s->work_err < 0)
    return;
  fd = open_in_tmp(op, f->path, O_WRONLY);
  if (fd < 0) {
    s->work_err = fd;
    return;
  }
  while (done < fr->raw_len) {
    ssize_t w = pwrite(fd, (char *)s->dec->raw + done,
                       (size_t)fr->raw_len - done, (off_t)(fr->raw_off + done));
    if (w < 0) {
      if (errno == EINTR)
        continue;
      s->work_err = -errno;
      break;
    }
    done += (size_t)w;
  }
  /* Start writing the frame back now, so the fsync before the rename
   * finds little left to do (it still waits for all of it). */
  if (s->work_err == 0)
    sync_file_range(fd, (off_t)fr->raw_off, (off_t)fr->raw_len,
                    SYNC_FILE_RANGE_WRITE);
  close(fd);
}

static void
decode_after_cb(uv_work_t *req, int status)
{
  struct rslot *s = spot_container_of(req, struct rslot, work);
  struct restore_op *op = s->op;
  const struct spot_manifest_file *f = &op->m->files[s->file];
  int r = status < 0 ? status : s->work_err;

  op->active_work--;
  s->dec->busy = false;
  s->dec = NULL;
  s->state = RS_FREE;
  if (r == -EILSEQ || r == -EBADMSG)
    fail_msg(op, r,
             "%s part %zu: %s: the stored object %s is corrupt; restore "
             "stopped, nothing was written to %s",
             f->path, s->frame + 1,
             r == -EILSEQ ? "checksum mismatch" : "undecodable frame", f->key,
             op->dir);
  else if (r < 0)
    fail_msg(op, r, "writing %s: %s", f->path, strerror(-r));
  else
    op->raw_done += f->frames[s->frame].raw_len;
  pump(op);
}

static void
fetch_cb(const struct spot_s3_result *res, void *data)
{
  struct rslot *s = data;
  struct restore_op *op = s->op;
  const struct spot_manifest_file *f = &op->m->files[s->file];
  const struct spot_manifest_frame *fr = &f->frames[s->frame];

  op->active_s3--;
  op->active_fetch--;
  s->s3op = NULL;
  op->retries += res->retries;
  if (res->err < 0) {
    char what[600];
    snprintf(what, sizeof(what), "reading %s part %zu", f->path, s->frame + 1);
    spot__store_s3_msg(op->msg, sizeof(op->msg), what, res);
    if (op->err == 0)
      op->err = res->err;
    s->state = RS_FREE;
  } else if (s->got != fr->comp_len) {
    fail_msg(op, -EBADMSG,
             "%s part %zu: the stored object %s is shorter than the manifest "
             "says",
             f->path, s->frame + 1, f->key);
    s->state = RS_FREE;
  } else {
    op->stored_done += s->got;
    s->state = RS_FETCHED;
  }
  pump(op);
}

static void
pump(struct restore_op *op)
{
  int r;

  if (op->err < 0 || op->cancelled || op->state != R_XFER) {
    if (!busy(op))
      advance(op);
    return;
  }
  /* decode fetched frames, oldest first */
  for (;;) {
    struct rslot *s = NULL;
    struct decoder *d = NULL;

    for (size_t i = 0; i < op->cfg.c.workers; i++)
      if (!op->decs[i].busy) {
        d = &op->decs[i];
        break;
      }
    for (size_t i = 0; d != NULL && i < op->nslots; i++)
      if (op->slots[i].state == RS_FETCHED &&
          (s == NULL || op->slots[i].seq < s->seq))
        s = &op->slots[i];
    if (s == NULL)
      break;
    s->dec = d;
    d->busy = true;
    r = uv_queue_work(op->loop, &s->work, decode_work_cb, decode_after_cb);
    if (r < 0) {
      d->busy = false;
      s->dec = NULL;
      fail_msg(op, r, "queueing work: %s", uv_strerror(r));
      break;
    }
    s->state = RS_DECODING;
    op->active_work++;
  }
  /* fetch more frames */
  while (op->err == 0 && op->active_fetch < op->cfg.c.parallel &&
         op->next_file < op->m->nfiles) {
    const struct spot_manifest_file *f = &op->m->files[op->next_file];
    const struct spot_manifest_frame *fr;
    struct rslot *s = NULL;
    char *key;

    if (op->next_frame >= f->nframes) {
      op->next_file++;
      op->next_frame = 0;
      continue;
    }
    for (size_t i = 0; i < op->nslots; i++)
      if (op->slots[i].state == RS_FREE) {
        s = &op->slots[i];
        break;
      }
    if (s == NULL)
      break;
    fr = &f->frames[op->next_frame];
    key = spot__store_key(&op->cfg.c, op->name, f->key);
    if (key == NULL) {
      fail_msg(op, -ENOMEM, "out of memory");
      break;
    }
    s->file = op->next_file;
    s->frame = op->next_frame;
    s->got = 0;
    s->seq = op->seq++;
    r = spot_s3_get(op->cfg.c.s3, op->cfg.bucket, key, fr->comp_off,
                    fr->comp_len, fetch_sink, NULL, fetch_cb, s, &s->s3op);
    free(key);
    if (r < 0) {
      fail_msg(op, r, "reading %s: %s", f->path, strerror(-r));
      break;
    }
    op->next_frame++;
    s->state = RS_FETCHING;
    op->active_s3++;
    op->active_fetch++;
  }
  if (!busy(op))
    advance(op);
}

/* ---------------------------------------------------------- states */

static void
work_after_cb(uv_work_t *req, int status)
{
  struct restore_op *op = spot_container_of(req, struct restore_op, work);

  op->active_work--;
  if (status < 0)
    fail_msg(op, status, "%s", uv_strerror(status));
  advance(op);
}

static int
queue(struct restore_op *op, uv_work_cb fn)
{
  int r = uv_queue_work(op->loop, &op->work, fn, work_after_cb);

  if (r == 0)
    op->active_work++;
  return r;
}

static void
get_cb(const struct spot_s3_result *res, void *data)
{
  struct restore_op *op = data;

  op->active_s3--;
  op->s3op = NULL;
  op->retries += res->retries;
  if (res->err == -ENOENT && op->state == R_LATEST)
    fail_msg(op, -ENOENT,
             "no committed checkpoint for job %s (no LATEST in the store)",
             op->cfg.job);
  else if (res->err == -ENOENT)
    fail_msg(op, -ENOENT,
             "checkpoint %s of job %s does not exist (no "
             "committed manifest)",
             op->name, op->cfg.job);
  else if (res->err < 0)
    spot__store_s3_msg(
        op->msg, sizeof(op->msg),
        op->state == R_LATEST ? "reading LATEST" : "reading the manifest", res);
  if (res->err < 0 && op->err == 0)
    op->err = res->err;
  advance(op);
}

static int
get_object(struct restore_op *op, const char *name, const char *rel, size_t cap)
{
  char *key = spot__store_key(&op->cfg.c, name, rel);
  int r;

  if (key == NULL)
    return -ENOMEM;
  spot_buf_fini(&op->body);
  spot_buf_init(&op->body, cap);
  r = spot_s3_get(op->cfg.c.s3, op->cfg.bucket, key, 0, 0, NULL, &op->body,
                  get_cb, op, &op->s3op);
  free(key);
  if (r == 0)
    op->active_s3++;
  return r;
}

static int
setup_pipeline(struct restore_op *op)
{
  uint64_t part_max = spot_manifest_max_frame_raw(op->m);
  size_t bound;
  int r;

  if (part_max == 0)
    part_max = 1;
  bound = spot_codec_bound((size_t)part_max);
  op->decs = calloc(op->cfg.c.workers, sizeof(*op->decs));
  op->nslots = op->cfg.c.workers + op->cfg.c.parallel;
  op->slots = calloc(op->nslots, sizeof(*op->slots));
  if (op->decs == NULL || op->slots == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < op->cfg.c.workers; i++) {
    r = spot_codec_new((size_t)part_max, &op->decs[i].codec);
    if (r < 0)
      return r;
    op->decs[i].raw = malloc((size_t)part_max);
    if (op->decs[i].raw == NULL)
      return -ENOMEM;
  }
  for (size_t i = 0; i < op->nslots; i++) {
    op->slots[i].op = op;
    op->slots[i].comp_cap = bound;
    op->slots[i].comp = malloc(bound);
    if (op->slots[i].comp == NULL)
      return -ENOMEM;
  }
  return 0;
}

static void
advance(struct restore_op *op)
{
  int r;

  if (busy(op))
    return;
  if (op->err < 0 || op->cancelled) {
    if (op->err == 0)
      op->err = -ECANCELED;
    if (op->state == R_DONE)
      return;
    if (op->tmp != NULL && op->state != R_CLEANUP) {
      set_state(op, R_CLEANUP);
      if (queue(op, cleanup_work_cb) == 0)
        return;
    }
    finish(op);
    return;
  }
  switch (op->state) {
  case R_LATEST: {
    char name[SPOT__STORE_LATEST_CAP + 1];
    size_t n = op->body.len;

    memcpy(name, spot_buf_str(&op->body), n);
    name[n] = '\0';
    while (n > 0 &&
           (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' '))
      name[--n] = '\0';
    if (!spot_ckpt_name_valid(name)) {
      fail_msg(op, -EBADMSG, "LATEST of job %s holds no valid checkpoint name",
               op->cfg.job);
      advance(op);
      return;
    }
    op->name = strdup(name);
    if (op->name == NULL) {
      fail_msg(op, -ENOMEM, "out of memory");
      advance(op);
      return;
    }
    set_state(op, R_MANIFEST);
    r = get_object(op, op->name, SPOT_MANIFEST_NAME, SPOT__STORE_MANIFEST_CAP);
    if (r < 0) {
      fail_msg(op, r, "reading the manifest: %s", strerror(-r));
      advance(op);
    }
    return;
  }
  case R_MANIFEST: {
    char err[256];

    r = spot_manifest_parse(spot_buf_str(&op->body), op->body.len, &op->m, err,
                            sizeof(err));
    if (r < 0) {
      fail_msg(op, r, "the manifest of checkpoint %s is invalid: %s", op->name,
               err);
      advance(op);
      return;
    }
    if (strcmp(op->m->name, op->name) != 0) {
      fail_msg(op, -EBADMSG, "the manifest of checkpoint %s names %s", op->name,
               op->m->name);
      advance(op);
      return;
    }
    spot_buf_fini(&op->body);
    r = setup_pipeline(op);
    if (r < 0) {
      fail_msg(op, r, "%s", strerror(-r));
      advance(op);
      return;
    }
    set_state(op, R_PREPARE);
    if ((r = queue(op, prepare_work_cb)) < 0) {
      fail_msg(op, r, "queueing work: %s", uv_strerror(r));
      advance(op);
    }
    return;
  }
  case R_PREPARE:
    set_state(op, R_XFER);
    report_progress(op, SPOT_STORE_PHASE_TRANSFER);
    pump(op);
    return;
  case R_XFER:
    if (op->next_file < op->m->nfiles)
      return;
    for (size_t i = 0; i < op->nslots; i++)
      if (op->slots[i].state != RS_FREE)
        return;
    set_state(op, R_FINISH);
    report_progress(op, SPOT_STORE_PHASE_COMMIT);
    if ((r = queue(op, finish_work_cb)) < 0) {
      fail_msg(op, r, "queueing work: %s", uv_strerror(r));
      advance(op);
    }
    return;
  case R_FINISH:
    finish(op);
    return;
  default:
    return;
  }
}

void
spot__store_restore_cancel(struct spot_store_op *sop)
{
  struct restore_op *op = (struct restore_op *)(void *)sop;

  if (op->state == R_DONE || op->cancelled)
    return;
  op->cancelled = true;
  if (op->err == 0)
    op->err = -ECANCELED;
  spot__store_msg(op->msg, sizeof(op->msg), "cancelled");
  for (size_t i = 0; i < op->nslots; i++)
    if (op->slots[i].state == RS_FETCHING && op->slots[i].s3op != NULL)
      spot_s3_cancel(op->slots[i].s3op);
  if (op->s3op != NULL)
    spot_s3_cancel(op->s3op);
}

int
spot_store_restore(uv_loop_t *loop, const struct spot_store_config *cfg,
                   const char *name, const char *dir,
                   spot_store_progress_cb progress, spot_store_cb cb,
                   void *data, struct spot_store_op **out)
{
  struct restore_op *op;
  size_t n;
  int r;

  if (loop == NULL || cfg == NULL || dir == NULL || dir[0] == '\0' ||
      cb == NULL || (name != NULL && !spot_ckpt_name_valid(name)))
    return -EINVAL;
  op = calloc(1, sizeof(*op));
  if (op == NULL)
    return -ENOMEM;
  op->hdr.kind = SPOT__STORE_RESTORE;
  op->loop = loop;
  r = spot__store_cfg_copy(&op->cfg, cfg);
  if (r < 0) {
    free(op);
    return r;
  }
  spot_buf_init(&op->body, SPOT__STORE_LATEST_CAP);
  op->dir = strdup(dir);
  if (op->dir == NULL || (name != NULL && (op->name = strdup(name)) == NULL)) {
    op_free(op);
    return -ENOMEM;
  }
  n = strlen(op->dir);
  while (n > 1 && op->dir[n - 1] == '/')
    op->dir[--n] = '\0';
  op->progress = progress;
  op->cb = cb;
  op->data = data;
  op->start_ms = spot_now_mono_ms();
  r = uv_timer_init(loop, &op->progress_timer);
  if (r < 0) {
    op_free(op);
    return r;
  }
  if (name != NULL) {
    op->state = R_MANIFEST;
    r = get_object(op, name, SPOT_MANIFEST_NAME, SPOT__STORE_MANIFEST_CAP);
  } else {
    op->state = R_LATEST;
    r = get_object(op, NULL, "LATEST", SPOT__STORE_LATEST_CAP);
  }
  if (r < 0) {
    uv_close((uv_handle_t *)&op->progress_timer, timer_close_cb);
    return r;
  }
  if (progress != NULL) {
    uv_timer_start(&op->progress_timer, progress_timer_cb, 250, 250);
    uv_unref((uv_handle_t *)&op->progress_timer);
  }
  if (out != NULL)
    *out = (struct spot_store_op *)(void *)op;
  return 0;
}
