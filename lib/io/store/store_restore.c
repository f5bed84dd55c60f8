/* Restore: one committed checkpoint into a folder, all or nothing.
 *
 *   LATEST    GET ROOT/LATEST (when no name is given)
 *   MANIFEST  GET and validate the manifest; nothing else is trusted
 *   PREPARE   (thread pool) make a temporary folder next to the target,
 *             create every folder and file in it
 *   XFER      ranged GETs of the frames (at most the controller's limit,
 *             pace.h, within the memory budget), decode and
 *             check each frame's CRC32C on the pool (at most `workers`),
 *             pwrite at its offset (cfg direct_io: with O_DIRECT)
 *   FINISH    (thread pool) fsync, set modes and times, rename the
 *             temporary folder into place, fsync the parent
 *   CLEANUP   (thread pool, after an error) remove the temporary folder
 *
 * The target is therefore either the whole verified checkpoint or left as
 * it was.
 *
 * A fault in transit is not damage in the store: a frame (or run of
 * packed files) that fails its check (checksum, undecodable, short), and
 * LATEST or the manifest when it is invalid or its MD5 differs from the
 * ETag the server gave, is fetched again, at most REFETCH_MAX times more,
 * before the restore fails with damage (which spotd answers by falling
 * back to an older checkpoint). Each fetch again is logged. PREPARE first
 * checks that the checkpoint fits in the free space of the target's file
 * system. A failure of the local file system (no space, read-only, no
 * permission, an I/O error) is told apart from one of the store (res->local): a
 * caller that falls back to an older checkpoint over damage in the store must
 * not do so for a full disk. */
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
#include <openssl/evp.h>
#include <zstd.h>

#include "core/codec.h"
#include "core/fsm.h"
#include "core/log.h"
#include "core/manifest.h"
#include "core/util.h"
#include "io/store/store_internal.h"

enum restore_state {
  R_LATEST,
  R_MANIFEST,
  R_RANKS,
  R_PREPARE,
  R_XFER,
  R_FINISH,
  R_CLEANUP,
  R_DONE,
};

/* Fetches of one frame, run of packed files, LATEST or manifest after the
 * first that failed verification: a byte flipped on the way (plain http,
 * a bad NIC or proxy) passes the second time; damage in the store fails
 * every time. */
#define REFETCH_MAX 2

static const char *const restore_state_names[] = {
    "latest",   "manifest", "ranks",   "prepare",
    "transfer", "finish",   "cleanup", "done",
};

/* A slot (store_internal.h) holds one frame: s->part is its index in
 * the file, s->comp_len the bytes fetched so far. */
enum rslot_state {
  RS_FREE = 0,
  RS_FETCHING,
  RS_FETCHED,
  RS_DECODING,
  RS_STATE_LAST,
};

/* Fetched (the transfer's end frees it: fetched, or refetched, or
 * failed), then decoded and written on the pool (the pool's job frees
 * it). */
static const char *const rslot_state_names[] = {
    "free",
    "fetching",
    "fetched",
    "decoding",
};
_Static_assert(SPOT_ARRAY_SIZE(rslot_state_names) == RS_STATE_LAST,
               "rslot_state_names");

static const uint32_t rslot_legal[RS_STATE_LAST] = {
    [RS_FREE] = SPOT_FSM_BIT(RS_FETCHING) | SPOT_FSM_BIT(RS_FETCHED),
    [RS_FETCHING] = SPOT_FSM_BIT(RS_FREE),
    [RS_FETCHED] = SPOT_FSM_BIT(RS_DECODING),
    [RS_DECODING] = SPOT_FSM_BIT(RS_FREE),
};

static const struct spot_fsm rslot_fsm = {
    "restore slot", rslot_state_names, RS_STATE_LAST, rslot_legal, 0,
    SPOT_LOG_DEBUG};

struct restore_op {
  struct spot__store_op b; /* first: the op handle is its address */
  enum restore_state state;
  char *dir;
  char *parent;   /* the folder dir is in: where the bytes go */
  char *tmp;      /* the temporary folder, once made */
  char *replace;  /* cfg replace_parent, or NULL */
  uint32_t umask; /* the process umask when the restore started */

  struct spot_buf body;
  unsigned obj_refetches; /* of LATEST or the manifest (the state's) */
  char obj_md5[33];       /* the MD5 of its last body ("" none yet) */
  unsigned refetched;     /* every fetch again of this restore */
  struct spot_manifest *m;
  struct spot__store_pipe pipe;
  size_t next_file, next_frame;
  unsigned active_fetch;
  struct spot_s3_op *s3op;

  /* multi-node (cfg nranks > 0: spotd): the committing job's rank count,
   * from the markers ranks/rank-K.json; the files of other ranks are
   * moved past m->nfiles (nfiles_all counts them all). */
  unsigned ckpt_nranks;
  char *token;
  size_t nfiles_all;
  uint64_t ckpt_raw, ckpt_stored;

  /* the local file system (see res->local) */
  bool local, precheck, removed_copy;
  uint64_t need, avail;
};

static void advance(struct restore_op *op);
static void pump(struct restore_op *op);

static const struct spot_fsm restore_fsm = {
    "restore", restore_state_names, SPOT_ARRAY_SIZE(restore_state_names), NULL,
    0,         SPOT_LOG_DEBUG};

#define set_state(op, s) set_state_at((op), (s), __FILE__, __LINE__)
static void
set_state_at(struct restore_op *op, enum restore_state s, const char *file,
             int line)
{
  if (spot_fsm_move_detail(&restore_fsm, op->state, s, file, line, "name=%s",
                           op->b.name != NULL ? op->b.name : "?") > 0)
    op->state = s;
}

#define fail_msg(op, ...) spot__store_fail_msg(&(op)->b, __VA_ARGS__)

static void
tick(struct spot__store_op *b)
{
  struct restore_op *op = (struct restore_op *)(void *)b;

  if (op->state == R_XFER)
    spot__store_progress(b, SPOT_STORE_PHASE_TRANSFER);
}

static void
op_free(struct spot__store_op *b)
{
  struct restore_op *op = (struct restore_op *)(void *)b;

  spot__store_pipe_fini(&op->pipe);
  if (op->m != NULL && op->nfiles_all > op->m->nfiles)
    op->m->nfiles = op->nfiles_all;
  spot_manifest_free(op->m);
  free(op->token);
  spot_buf_fini(&op->body);
  free(op->dir);
  free(op->parent);
  free(op->tmp);
  free(op->replace);
}

/* The disk the checkpoint's files take with blocks of `block` bytes,
 * and a block for each folder (about: a folder is counted again when
 * files of another folder come between). */
static uint64_t
need_bytes(const struct restore_op *op, uint64_t block)
{
  uint64_t need = block;

  for (size_t i = 0; i < op->m->nfiles; i++) {
    const struct spot_manifest_file *f = &op->m->files[i];
    const char *slash = strrchr(f->path, '/');
    size_t plen = slash != NULL ? (size_t)(slash - f->path) : 0;

    if (f->link == NULL)
      need += (f->size + block - 1) / block * block;
    /* a folder per change of folder, in path order */
    if (plen > 0 &&
        (i == 0 || strncmp(op->m->files[i - 1].path, f->path, plen + 1) != 0))
      need += block;
  }
  return need;
}

/* A local failure's line ends with the folder, the bytes needed and the
 * bytes free now (the temporary folder is gone by then). */
static void
local_figures(struct restore_op *op)
{
  uint64_t avail, block;
  size_t n = strlen(op->b.msg);

  /* a target in the way is no matter of space */
  if (op->precheck || op->m == NULL || op->b.err == -EEXIST ||
      spot_fs_avail(op->parent, &avail, &block) < 0)
    return;
  op->avail = avail;
  if (op->need == 0)
    op->need = need_bytes(op, block);
  snprintf(
      op->b.msg + n, sizeof(op->b.msg) - n,
      "; checkpoint %s needs %" PRIu64 " bytes in %s, %" PRIu64 " are free",
      op->b.name != NULL ? op->b.name : "?", op->need, op->parent, op->avail);
}

static void
finish(struct restore_op *op)
{
  struct spot_store_result res;

  set_state(op, R_DONE);
  memset(&res, 0, sizeof(res));
  if (op->b.err < 0 && op->b.err != -ECANCELED && op->local) {
    local_figures(op);
    res.local = true;
    res.need_bytes = op->need;
    res.free_bytes = op->avail;
  }
  res.files = op->m != NULL ? op->m->nfiles : 0;
  res.raw_bytes = op->m != NULL ? op->m->total_raw : 0;
  res.stored_bytes = op->m != NULL ? op->m->total_stored : 0;
  res.ckpt_raw_bytes = op->m != NULL ? op->ckpt_raw : 0;
  res.ckpt_stored_bytes = op->m != NULL ? op->ckpt_stored : 0;
  res.ckpt_nranks = op->ckpt_nranks;
  res.created_ms = op->m != NULL ? op->m->created_ms : 0;
  res.step = op->m == NULL      ? -1
             : op->m->step >= 0 ? op->m->step
                                : spot_ckpt_name_step(op->m->name);
  spot__store_finish(&op->b, &res);
}

/* ------------------------------------------------------ file system */

/* A failure of the local file system, not of the store (res->local).
 * The first error wins, as for the message. */
static void __attribute__((format(printf, 3, 4)))
disk_fail(struct restore_op *op, int err, const char *fmt, ...)
{
  char line[sizeof(op->b.msg)];
  va_list ap;

  if (op->b.err == 0 && err != -ENOMEM)
    op->local = true;
  va_start(ap, fmt);
  vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  fail_msg(op, err, "%s", line);
}

/* Whether a failure to make an entry can come from the manifest's paths
 * (a file where a folder is to be, a name twice, a path too long): those
 * are the store's, the others the disk's. */
static bool
from_paths(int err)
{
  return err == -EEXIST || err == -ENOTDIR || err == -ELOOP ||
         err == -ENAMETOOLONG || err == -EISDIR;
}

#define entry_fail(op, err, ...)                                               \
  do {                                                                         \
    if (from_paths(err))                                                       \
      fail_msg(op, err, __VA_ARGS__);                                          \
    else                                                                       \
      disk_fail(op, err, __VA_ARGS__);                                         \
  } while (0)

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

/* The target must not exist, or be an empty folder (rename(2) replaces
 * an empty folder atomically). */
static int
check_target(struct restore_op *op)
{
  struct stat st;
  int n = 0;

  if (lstat(op->dir, &st) < 0) {
    if (errno == ENOENT)
      return 0;
    disk_fail(op, -errno, "%s: %s", op->dir, strerror(errno));
    return -1;
  }
  if (S_ISDIR(st.st_mode)) {
    int fd = open(op->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    struct dirent *de;

    if (d == NULL) {
      if (fd >= 0)
        close(fd);
      disk_fail(op, -errno, "%s: %s", op->dir, strerror(errno));
      return -1;
    }
    while ((de = readdir(d)) != NULL)
      if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
        n++;
    closedir(d);
  }
  if (!S_ISDIR(st.st_mode) || n > 0) {
    disk_fail(op, -EEXIST,
              "%s already exists and is not an empty folder; restore into "
              "a new folder",
              op->dir);
    return -1;
  }
  return 0;
}

/* The folder path is in ("." for a bare name), malloc'd. */
static char *
parent_of(const char *path)
{
  const char *slash = strrchr(path, '/');

  if (slash == NULL)
    return strdup(".");
  if (slash == path)
    return strdup("/");
  return strndup(path, (size_t)(slash - path));
}

/* mkdtemp "PARENT/.BASE.spotd-restore-XXXXXX" into op->tmp. */
static int
make_tmp(struct restore_op *op)
{
  char *dup, *slash, tmpl[4200];
  const char *parent, *base;

  dup = strdup(op->dir);
  if (dup == NULL) {
    fail_msg(op, -ENOMEM, "out of memory");
    return -1;
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
    disk_fail(op, -errno, "making a temporary folder next to %s: %s", op->dir,
              strerror(errno));
    return -1;
  }
  op->tmp = strdup(tmpl);
  if (op->tmp == NULL) {
    rmdir(tmpl);
    fail_msg(op, -ENOMEM, "out of memory");
    return -1;
  }
  return 0;
}

/* Whether the checkpoint fits in the free space next to dir, before
 * anything is fetched. The old local copy it will replace (cfg
 * replace_parent) counts as free on the same file system, and is removed
 * when the checkpoint fits only without it: otherwise the disk must hold
 * both at once. Unknown free space (statvfs tells nothing) passes: the
 * writes will tell. */
static int
check_space(struct restore_op *op)
{
  char copy[4400];
  struct stat pst, cst;
  uint64_t avail, block, used, dev;

  if (spot_fs_avail(op->parent, &avail, &block) < 0)
    return 0;
  op->need = need_bytes(op, block);
  op->avail = avail;
  if (avail >= op->need)
    return 0;
  if (op->replace != NULL &&
      (size_t)snprintf(copy, sizeof(copy), "%s/%s", op->replace, op->b.name) <
          sizeof(copy) &&
      lstat(copy, &cst) == 0 && S_ISDIR(cst.st_mode) &&
      stat(op->parent, &pst) == 0 && cst.st_dev == pst.st_dev &&
      spot_tree_usage(copy, &used, &dev) == 0 && avail + used >= op->need) {
    spot_rm_tree(copy);
    op->removed_copy = true;
    if (spot_fs_avail(op->parent, &avail, &block) == 0)
      op->avail = avail;
    if (op->avail >= op->need)
      return 0;
  }
  op->precheck = true;
  disk_fail(op, -ENOSPC,
            "checkpoint %s does not fit in %s (%s): it needs %" PRIu64
            " bytes, %" PRIu64 " are free; nothing was fetched",
            op->b.name, op->parent, strerror(ENOSPC), op->need, op->avail);
  return -1;
}

static void
prepare_work_cb(uv_work_t *req)
{
  struct restore_op *op = spot_container_of(req, struct restore_op, b.work);
  int dfd;

  if (check_target(op) < 0 || check_space(op) < 0)
    return;
  /* a test fills the disk here, to fail the writes that follow */
  spot_fault_point("restore-space-checked");
  if (make_tmp(op) < 0)
    return;
  dfd = open(op->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) {
    disk_fail(op, -errno, "%s: %s", op->tmp, strerror(errno));
    return;
  }
  for (size_t i = 0, prev = SIZE_MAX; i < op->m->nfiles; i++) {
    const struct spot_manifest_file *f = &op->m->files[i];
    const char *slash = strrchr(f->path, '/');
    size_t plen = slash != NULL ? (size_t)(slash - f->path) : 0;
    int r = 0, fd;

    if (f->link != NULL)
      continue; /* made last, once every file is written */
    /* the previous file's folders are made (and checked) already */
    if (prev == SIZE_MAX || plen == 0 ||
        strncmp(op->m->files[prev].path, f->path, plen + 1) != 0)
      r = make_parents(dfd, f->path);
    prev = i;
    if (r < 0) {
      entry_fail(op, r, "creating the folders of %s: %s", f->path,
                 strerror(-r));
      break;
    }
    fd = openat(dfd, f->path,
                O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      r = -errno;
      entry_fail(op, r, "creating %s: %s", f->path, strerror(-r));
      break;
    }
    close(fd);
  }
  close(dfd);
}

static void
cleanup_work_cb(uv_work_t *req)
{
  struct restore_op *op = spot_container_of(req, struct restore_op, b.work);

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

/* Floor division: tv_nsec stays in [0, 1e9) before 1970 too. */
static void
mtime_of(const struct spot_manifest_file *f, struct timespec ts[2])
{
  ts[0].tv_sec = ts[1].tv_sec =
      (time_t)(f->mtime_ns / 1000000000 - (f->mtime_ns % 1000000000 < 0));
  ts[0].tv_nsec = ts[1].tv_nsec =
      (long)((f->mtime_ns % 1000000000 + 1000000000) % 1000000000);
}

/* Beyond this many files one syncfs(2) of the temporary folder's file
 * system replaces an fsync per file: each costs a journal commit (5000
 * small files, packed: 14 of the restore's 18 s here). */
#define RESTORE_SYNCFS_FILES 64

/* Mode and times of a file; fsync when it has data (unless syncfs). An
 * empty file has nothing to sync: the folders' fsync makes its entry
 * durable, and it costs no open (a checkpoint may hold 300,000 empty
 * files: README "What the store refuses or never does"). */
static int
file_attrs(const struct restore_op *op, int dfd,
           const struct spot_manifest_file *f, const struct timespec ts[2],
           bool syncfs_later)
{
  mode_t mode = (mode_t)spot_store_restore_mode(f->mode, op->umask);
  int fd, r = 0;

  if (f->size == 0 || syncfs_later)
    return fchmodat(dfd, f->path, mode, 0) < 0 ||
                   utimensat(dfd, f->path, ts, AT_SYMLINK_NOFOLLOW) < 0
               ? -errno
               : 0;
  fd = openat(dfd, f->path, O_WRONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return -errno;
  if (fsync(fd) < 0 || fchmod(fd, mode) < 0 || futimens(fd, ts) < 0)
    r = -errno;
  if (close(fd) < 0 && r == 0)
    r = -errno;
  return r;
}

/* A symlink. Their targets were checked by the manifest parser
 * (spot_manifest_link_valid()): relative, inside the checkpoint. */
static int
make_link(int dfd, const struct spot_manifest_file *f,
          const struct timespec ts[2])
{
  int r = make_parents(dfd, f->path);

  if (r == 0 && (symlinkat(f->link, dfd, f->path) < 0 ||
                 utimensat(dfd, f->path, ts, AT_SYMLINK_NOFOLLOW) < 0))
    r = -errno;
  return r;
}

/* Every file's attributes, then the symlinks: until every file is done
 * no link exists in the temporary folder. */
static int
finish_entries(struct restore_op *op)
{
  int dfd = open(op->tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  bool many = op->m->nfiles > RESTORE_SYNCFS_FILES;
  int r = 0;

  if (dfd < 0) {
    disk_fail(op, -errno, "%s: %s", op->tmp, strerror(errno));
    return -1;
  }
  for (int links = 0; links < 2; links++)
    for (size_t i = 0; r == 0 && i < op->m->nfiles; i++) {
      const struct spot_manifest_file *f = &op->m->files[i];
      struct timespec ts[2];

      if ((f->link != NULL) != (links == 1))
        continue;
      mtime_of(f, ts);
      r = links ? make_link(dfd, f, ts) : file_attrs(op, dfd, f, ts, many);
      if (r < 0)
        entry_fail(op, r, "%s: %s%s", f->path,
                   links ? "making the symlink: " : "", strerror(-r));
    }
  if (r == 0 && many && syncfs(dfd) < 0) {
    r = -errno;
    disk_fail(op, r, "syncing %s: %s", op->tmp, strerror(-r));
  }
  close(dfd);
  return r;
}

static void
finish_work_cb(uv_work_t *req)
{
  struct restore_op *op = spot_container_of(req, struct restore_op, b.work);
  char *parent;
  char *slash;

  if (finish_entries(op) < 0)
    return;
  /* mkdtemp made it 0700; a checkpoint folder is an ordinary one. */
  chmod(op->tmp, 0755);
  if (nftw(op->tmp, fsync_dirs_cb, 16, FTW_DEPTH | FTW_PHYS) != 0) {
    disk_fail(op, -EIO, "syncing the folders of %s failed", op->tmp);
    return;
  }
  if (rename(op->tmp, op->dir) < 0) {
    disk_fail(op, -errno, "moving the restored checkpoint to %s: %s", op->dir,
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
  struct spot__store_slot *s = data;

  /* The server must not send more than the frame asked for (a 206 with
   * extra bytes): its own length, not the buffer's, is the limit. */
  /* Runs on an I/O thread when the client has them (s3.h): it touches
   * only this transfer's buffer, and the error reaches fetch_cb as
   * res->err, never through the slot's fields the loop also writes. */
  if (offset > s->want || n > s->want - offset || s->want > s->comp_cap)
    return -EMSGSIZE;
  memcpy((char *)s->comp + offset, p, n);
  if (offset + n > s->comp_len)
    s->comp_len = (size_t)(offset + n);
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

/* Direct I/O goes in blocks of this size, at offsets that are its
 * multiples: the logical block size of the disks met (512 or 4096). A
 * device that asks for more refuses with EINVAL, and the frame goes
 * through the page cache. */
#define DIRECT_BLOCK 4096

/* pwrite of all n bytes; *done counts what was written. 0 or -errno. */
static int
pwrite_all(int fd, const char *buf, size_t n, uint64_t off, size_t *done)
{
  while (*done < n) {
    ssize_t w = pwrite(fd, buf + *done, n - *done, (off_t)(off + *done));

    if (w < 0 && errno == EINTR)
      continue;
    if (w < 0)
      return -errno;
    if (w == 0)
      return -EIO;
    *done += (size_t)w;
  }
  return 0;
}

/* Writes a decoded frame (n bytes of buf, page-aligned) at off into rel.
 * With cfg direct_io its whole blocks go with O_DIRECT: they reach the
 * disk from buf, with no copy into the page cache and no page cache to
 * allocate (on a VM that returns freed memory to its host, the first
 * touch of each new page-cache page cost more than all the rest of a
 * restore: bench/results/restore_profile.md). A file's last partial
 * block, and every frame on a file system or device that refuses
 * O_DIRECT (EINVAL), go through the page cache, whose write-back starts
 * at once so the fsync before the rename finds little left. 0 or the
 * disk's -errno. */
static int
write_frame(const struct restore_op *op, const char *rel, const char *buf,
            size_t n, uint64_t off)
{
  size_t done = 0;
  int fd, r;

  if (op->b.cfg.c.direct_io && off % DIRECT_BLOCK == 0 && n >= DIRECT_BLOCK &&
      (uintptr_t)buf % DIRECT_BLOCK == 0) {
    fd = open_in_tmp(op, rel, O_WRONLY | O_DIRECT);
    if (fd < 0 && fd != -EINVAL)
      return fd;
    if (fd >= 0) {
      r = pwrite_all(fd, buf, n / DIRECT_BLOCK * DIRECT_BLOCK, off, &done);
      close(fd);
      if (r < 0 && r != -EINVAL)
        return r;
      /* a short or refused direct write: the rest through the cache */
      done = done / DIRECT_BLOCK * DIRECT_BLOCK;
    }
  }
  if (done == n)
    return 0;
  fd = open_in_tmp(op, rel, O_WRONLY);
  if (fd < 0)
    return fd;
  buf += done;
  off += done;
  n -= done;
  done = 0;
  r = pwrite_all(fd, buf, n, off, &done);
  if (r == 0)
    sync_file_range(fd, (off_t)off, (off_t)n, SYNC_FILE_RANGE_WRITE);
  close(fd);
  return r;
}

static void fetch_cb(const struct spot_s3_result *res, void *data);
static void pack_fetch_cb(const struct spot_s3_result *res, void *data);

/* Starts the ranged GET of what s holds: frame s->part of file s->file,
 * or (s->nfiles > 0) the run of packed files [file, file + nfiles) whose
 * bytes s->want counts. 0, or negative errno (the op failed with a
 * message). */
static int
issue_get(struct restore_op *op, struct spot__store_slot *s)
{
  const struct spot_manifest_file *f = &op->m->files[s->file];
  uint64_t off;
  char *key;
  int r;

  if (s->nfiles > 0) {
    key = spot__store_key(&op->b.cfg.c, op->b.name,
                          spot_manifest_object_key(op->m, f));
    off = f->pack_off;
  } else {
    /* a reference (manifest.h "References"): a range of an object of
     * the earlier checkpoint that stored it */
    const struct spot_manifest_frame *fr = &f->frames[s->part];
    const char *ref_name,
        *rel = spot_manifest_frame_key(op->m, f, fr, &ref_name);

    key = spot__store_key(&op->b.cfg.c, ref_name ? ref_name : op->b.name, rel);
    off = fr->comp_off;
  }
  if (key == NULL) {
    fail_msg(op, -ENOMEM, "out of memory");
    return -ENOMEM;
  }
  s->comp_len = 0;
  s->work_err = 0;
  s->seq = op->pipe.seq++;
  r = spot_s3_get(op->b.cfg.c.s3, op->b.cfg.bucket, key, off, s->want,
                  fetch_sink, NULL, s->nfiles > 0 ? pack_fetch_cb : fetch_cb, s,
                  &s->s3op);
  free(key);
  if (r < 0) {
    fail_msg(op, r, "reading %s: %s", f->path, strerror(-r));
    return r;
  }
  spot__store_slot_sent(s, s->want);
  spot__store_slot_set_state(s, RS_FETCHING);
  op->b.active_s3++;
  op->active_fetch++;
  return 0;
}

/* What s held failed verification (why): fetches it again into the same
 * slot, unless it was fetched REFETCH_MAX times more already or the
 * restore has failed. True when it did (or failed trying: the op then
 * has its error). */
static bool
refetch(struct restore_op *op, struct spot__store_slot *s, const char *what,
        const char *why)
{
  if (op->b.err != 0 || s->refetches >= REFETCH_MAX)
    return false;
  s->refetches++;
  op->refetched++;
  log_notice("restore: %s of checkpoint %s failed verification (%s); "
             "fetching it again (%u of %u): a fault in transit is not damage "
             "in the store",
             what, op->b.name, why, s->refetches, REFETCH_MAX);
  (void)issue_get(op, s);
  return true;
}

/* The words a failure adds after fetches again: " (the same on all 3
 * fetches)". */
static const char *
fetches_note(const struct spot__store_slot *s, char *buf, size_t n)
{
  if (s->refetches == 0)
    return "";
  snprintf(buf, n, " (the same on all %u fetches)", s->refetches + 1);
  return buf;
}

static void
decode_work_cb(uv_work_t *req)
{
  struct spot__store_slot *s =
      spot_container_of(req, struct spot__store_slot, work);
  struct restore_op *op = (struct restore_op *)(void *)s->op;
  const struct spot_manifest_file *f = &op->m->files[s->file];
  const struct spot_manifest_frame *fr = &f->frames[s->part];

  s->work_local = false;
  s->work_err = spot_codec_decode(
      s->coder->codec, f->filter, s->comp, frame_len(s->comp, s->comp_len),
      s->coder->raw, (size_t)fr->raw_len, fr->crc32c);
  if (s->work_err < 0)
    return;
  s->work_local = true; /* from here on, failures are the disk's */
  s->work_err =
      write_frame(op, f->path, s->coder->raw, (size_t)fr->raw_len, fr->raw_off);
}

static const char *frame_obj(const struct restore_op *op,
                             const struct spot_manifest_file *f, size_t part);

static void
decode_after_cb(uv_work_t *req, int status)
{
  struct spot__store_slot *s =
      spot_container_of(req, struct spot__store_slot, work);
  struct restore_op *op = (struct restore_op *)(void *)s->op;
  const struct spot_manifest_file *f = &op->m->files[s->file];
  bool local = s->work_local;
  int r = spot__store_pipe_worked(s, status);
  char what[600], note[64];

  s->work_local = false;
  snprintf(what, sizeof(what), "%s part %zu", f->path, s->part + 1);
  if (local && r < 0 && r != -ECANCELED)
    disk_fail(op, r, "writing %s: %s", f->path, strerror(-r));
  else if ((r == -EILSEQ || r == -EBADMSG) &&
           refetch(op, s, what,
                   r == -EILSEQ ? "checksum mismatch" : "undecodable frame"))
    ;
  else if (r == -EILSEQ || r == -EBADMSG)
    fail_msg(op, r,
             "%s: %s%s: the stored object %s is corrupt; restore "
             "stopped, nothing was written to %s",
             what, r == -EILSEQ ? "checksum mismatch" : "undecodable frame",
             fetches_note(s, note, sizeof(note)), frame_obj(op, f, s->part),
             op->dir);
  else if (r < 0)
    fail_msg(op, r, "writing %s: %s", f->path, strerror(-r));
  else
    op->b.raw_done += f->frames[s->part].raw_len;
  pump(op);
}

/* For messages: the object frame part of f is in, "<key>" of this
 * checkpoint or "<name>/<key>" of the earlier one a reference names.
 * Loop thread only (one static buffer). */
static const char *
frame_obj(const struct restore_op *op, const struct spot_manifest_file *f,
          size_t part)
{
  static char buf[2 * SPOT_MANIFEST_PATH_MAX];
  const char *name,
      *key = spot_manifest_frame_key(op->m, f, &f->frames[part], &name);

  if (name == NULL)
    return key != NULL ? key : "";
  snprintf(buf, sizeof(buf), "%s/%s", name, key);
  return buf;
}

static void
fetch_cb(const struct spot_s3_result *res, void *data)
{
  struct spot__store_slot *s = data;
  struct restore_op *op = (struct restore_op *)(void *)s->op;
  const struct spot_manifest_file *f = &op->m->files[s->file];
  const struct spot_manifest_frame *fr = &f->frames[s->part];

  spot__store_s3_done(&op->b, &s->s3op, res);
  op->active_fetch--;
  spot__store_slot_set_state(s, RS_FREE);
  if (res->err == -EMSGSIZE && res->http_status / 100 == 2) {
    fail_msg(op, -EBADMSG,
             "%s part %zu: the server sent more than the frame's %" PRIu64
             " bytes of %s (a ranged read with extra bytes)",
             f->path, s->part + 1, fr->comp_len, frame_obj(op, f, s->part));
  } else if (res->err < 0) {
    char what[600];
    snprintf(what, sizeof(what), "reading %s part %zu", f->path, s->part + 1);
    if (!spot__store_slot_too_slow(s, what))
      spot__store_fail_s3(&op->b, what, res);
  } else if (s->comp_len != fr->comp_len) {
    char what[600], note[64];

    snprintf(what, sizeof(what), "%s part %zu", f->path, s->part + 1);
    if (!refetch(op, s, what, "shorter than the manifest says"))
      fail_msg(op, -EBADMSG,
               "%s: the stored object %s is shorter than the manifest "
               "says%s",
               what, frame_obj(op, f, s->part),
               fetches_note(s, note, sizeof(note)));
  } else {
    spot__store_slot_finished(s, s->comp_len);
    op->b.stored_done += s->comp_len;
    spot__store_slot_set_state(s, RS_FETCHED);
  }
  pump(op);
}

/* ------------------------------------------------------ packed files
 *
 * Small files live in pack objects (manifest.h "Packs"): a run of them
 * that follow each other in the manifest and in one pack, with no gap,
 * is fetched with one ranged GET of at most the part size (or of one
 * file, whatever its size), then each file's frames are decoded and
 * checked on the pool. */

static const char *
pack_key(const struct restore_op *op, const struct spot__store_slot *s)
{
  return spot_manifest_object_key(op->m, &op->m->files[s->file]);
}

static void
pack_decode_work_cb(uv_work_t *req)
{
  struct spot__store_slot *s =
      spot_container_of(req, struct spot__store_slot, work);
  struct restore_op *op = (struct restore_op *)(void *)s->op;
  uint64_t start = op->m->files[s->file].pack_off;

  s->work_err = 0;
  s->work_local = false;
  for (size_t k = 0; k < s->nfiles; k++) {
    const struct spot_manifest_file *f = &op->m->files[s->file + k];
    int fd = -1;

    s->part = k; /* the file a failure names */
    for (size_t j = 0; s->work_err == 0 && j < f->nframes; j++) {
      const struct spot_manifest_frame *fr = &f->frames[j];
      size_t done = 0;

      s->work_err = spot_codec_decode(
          s->coder->codec, f->filter, (char *)s->comp + (fr->comp_off - start),
          (size_t)fr->comp_len, s->coder->raw, (size_t)fr->raw_len, fr->crc32c);
      if (s->work_err == 0 && fd < 0 &&
          (fd = open_in_tmp(op, f->path, O_WRONLY)) < 0) {
        s->work_err = fd;
        s->work_local = true;
      }
      while (s->work_err == 0 && done < fr->raw_len) {
        ssize_t w =
            pwrite(fd, (char *)s->coder->raw + done, (size_t)fr->raw_len - done,
                   (off_t)(fr->raw_off + done));
        if (w < 0 && errno != EINTR) {
          s->work_err = -errno;
          s->work_local = true;
        } else if (w > 0) {
          done += (size_t)w;
        }
      }
    }
    if (fd >= 0)
      close(fd);
    if (s->work_err < 0)
      return;
  }
}

static void
pack_decode_after_cb(uv_work_t *req, int status)
{
  struct spot__store_slot *s =
      spot_container_of(req, struct spot__store_slot, work);
  struct restore_op *op = (struct restore_op *)(void *)s->op;
  size_t file = s->file, n = s->nfiles, bad = s->part;
  bool local = s->work_local;
  int r = spot__store_pipe_worked(s, status);
  char what[600], note[64];

  s->work_local = false;
  snprintf(what, sizeof(what), "%s (pack %s)", op->m->files[file + bad].path,
           spot_manifest_object_key(op->m, &op->m->files[file]));
  if (local && r < 0 && r != -ECANCELED) {
    disk_fail(op, r, "writing %s: %s", op->m->files[file + bad].path,
              strerror(-r));
  } else if (r == -EILSEQ || r == -EBADMSG) {
    s->part = 0;
    if (refetch(op, s, what,
                r == -EILSEQ ? "checksum mismatch" : "undecodable frame"))
      goto out;
    fail_msg(op, r,
             "%s: %s%s: the stored pack is corrupt; restore stopped, "
             "nothing was written to %s",
             what, r == -EILSEQ ? "checksum mismatch" : "undecodable frame",
             fetches_note(s, note, sizeof(note)), op->dir);
  } else if (r < 0) {
    fail_msg(op, r, "writing %s: %s", op->m->files[file + bad].path,
             strerror(-r));
  } else {
    for (size_t k = 0; k < n; k++)
      op->b.raw_done += op->m->files[file + k].size;
  }
  s->nfiles = 0;
out:
  pump(op);
}

static void
pack_fetch_cb(const struct spot_s3_result *res, void *data)
{
  struct spot__store_slot *s = data;
  struct restore_op *op = (struct restore_op *)(void *)s->op;
  const char *first = op->m->files[s->file].path;

  spot__store_s3_done(&op->b, &s->s3op, res);
  op->active_fetch--;
  spot__store_slot_set_state(s, RS_FREE);
  if (res->err == -EMSGSIZE && res->http_status / 100 == 2) {
    fail_msg(op, -EBADMSG,
             "%s: the server sent more than the %" PRIu64
             " bytes asked of pack %s (a ranged read with extra bytes)",
             first, s->want, pack_key(op, s));
  } else if (res->err == 0 && s->comp_len != s->want &&
             refetch(op, s, first, "pack shorter than the manifest says")) {
    pump(op); /* s holds the run again */
    return;
  } else if (res->err < 0 ? res->http_status == 416 /* starts past its end */
                          : s->comp_len != s->want) {
    fail_msg(op, -EBADMSG,
             "%s: the stored pack %s is shorter than the manifest says; "
             "restore stopped, nothing was written to %s",
             first, pack_key(op, s), op->dir);
  } else if (res->err < 0) {
    char what[600];
    snprintf(what, sizeof(what), "reading %s (pack %s)", first,
             pack_key(op, s));
    if (!spot__store_slot_too_slow(s, what))
      spot__store_fail_s3(&op->b, what, res);
  } else {
    op->b.stored_done += s->comp_len;
    spot__store_slot_set_state(s, RS_FETCHED);
  }
  if (s->state == RS_FREE)
    s->nfiles = 0;
  pump(op);
}

/* The fetch of the run of packed files starting at op->next_file. */
static int
start_pack_fetch(struct restore_op *op, struct spot__store_slot *s)
{
  const struct spot_manifest *m = op->m;
  const struct spot_manifest_file *f = &m->files[op->next_file];
  uint64_t start = f->pack_off, end = f->pack_off + f->stored;
  uint64_t limit = op->b.cfg.c.part_size;
  size_t n = 1;
  int r;

  if (limit > s->comp_cap)
    limit = s->comp_cap;
  while (op->next_file + n < m->nfiles) {
    const struct spot_manifest_file *g = &m->files[op->next_file + n];

    if (g->pack != f->pack || g->pack_off != end ||
        end - start + g->stored > limit)
      break;
    end += g->stored;
    n++;
  }
  if (end - start > s->comp_cap) { /* prepare() sized the buffers */
    fail_msg(op, -EFBIG, "%s: too large to read from its pack", f->path);
    return -EFBIG;
  }
  s->file = op->next_file;
  s->nfiles = n;
  s->part = 0;
  s->want = end - start;
  s->refetches = 0;
  r = issue_get(op, s);
  if (r < 0) {
    s->nfiles = 0;
    return r;
  }
  op->next_file += n;
  op->next_frame = 0;
  return 0;
}

/* Decodes fetched frames, oldest first, while a decoder is free. */
static void
start_decodes(struct restore_op *op)
{
  struct spot__store_slot *s;

  while ((s = spot__store_pipe_find(&op->pipe, RS_FETCHED, NULL)) != NULL &&
         spot__store_pipe_work(
             &op->pipe, s, s->nfiles ? pack_decode_work_cb : decode_work_cb,
             s->nfiles ? pack_decode_after_cb : decode_after_cb,
             RS_DECODING) == 0)
    ;
}

/* Starts ranged GETs of the next frames while a slot is free. */
static void
start_fetches(struct restore_op *op)
{
  while (op->b.err == 0 && op->active_fetch < spot_pace_limit(&op->b.pace) &&
         op->next_file < op->m->nfiles) {
    const struct spot_manifest_file *f = &op->m->files[op->next_file];
    const struct spot_manifest_frame *fr;
    struct spot__store_slot *s;
    int r;

    if (op->next_frame >= f->nframes) {
      op->next_file++;
      op->next_frame = 0;
      continue;
    }
    if ((r = spot__store_pipe_take(&op->pipe, &s)) != 0) {
      if (r < 0)
        fail_msg(op, r, "out of memory");
      break;
    }
    if (f->pack != 0) {
      if (start_pack_fetch(op, s) < 0)
        break;
      continue;
    }
    fr = &f->frames[op->next_frame];
    s->file = op->next_file;
    s->part = op->next_frame;
    s->nfiles = 0;
    s->want = fr->comp_len;
    s->refetches = 0;
    if (issue_get(op, s) < 0)
      break;
    op->next_frame++;
  }
}

static void
pump(struct restore_op *op)
{
  if (op->b.err == 0 && op->state == R_XFER) {
    start_decodes(op);
    start_fetches(op);
    if (spot__store_pace(&op->b, op->active_fetch))
      start_fetches(op);
  }
  if (!spot__store_busy(&op->b))
    advance(op);
}

/* ---------------------------------------------------------- states */

static int get_object(struct restore_op *op, const char *name, const char *rel,
                      size_t cap);

/* The lowercase hex MD5 of b's bytes into out[33]; false when libcrypto
 * fails. */
static bool
md5_hex(const struct spot_buf *b, char out[33])
{
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;

  if (EVP_Digest(b->len > 0 ? b->data : "", b->len, md, &len, EVP_md5(),
                 NULL) != 1 ||
      len != 16)
    return false;
  for (unsigned i = 0; i < 16; i++)
    snprintf(out + 2 * i, 3, "%02x", md[i]);
  return true;
}

/* Whether an ETag is a plain MD5 (32 hex digits, quoted or not): what S3
 * and its clones give a single PUT without SSE-KMS or SSE-C. Then
 * md5_into holds it, lowercase. */
static bool
etag_md5(const char *etag, char md5_into[33])
{
  size_t n;

  if (etag == NULL)
    return false;
  if (etag[0] == '"')
    etag++;
  n = strspn(etag, "0123456789abcdefABCDEF");
  if (n != 32 || (etag[n] != '\0' && strcmp(etag + n, "\"") != 0))
    return false;
  for (size_t i = 0; i < 32; i++)
    md5_into[i] =
        (char)(etag[i] >= 'A' && etag[i] <= 'F' ? etag[i] + 32 : etag[i]);
  md5_into[32] = '\0';
  return true;
}

/* The body of LATEST or the manifest (the state's) failed verification
 * (why): fetches it again, unless it was fetched REFETCH_MAX times more
 * already, or these bytes are the same as the last fetch's (the same
 * bytes twice are what the store holds: no fetch changes them). True
 * when it did (or failed trying: the op then has its error). */
static bool
refetch_object(struct restore_op *op, const char *why)
{
  const char *what = op->state == R_LATEST ? "LATEST" : "the manifest";
  char md5[33];
  int r;

  if (op->b.err != 0 || op->obj_refetches >= REFETCH_MAX ||
      !md5_hex(&op->body, md5) ||
      (op->obj_md5[0] != '\0' && strcmp(md5, op->obj_md5) == 0))
    return false;
  memcpy(op->obj_md5, md5, sizeof(md5));
  op->obj_refetches++;
  op->refetched++;
  log_notice("restore: %s%s%s failed verification (%s); fetching it again "
             "(%u of %u): a fault in transit is not damage in the store",
             what, op->b.name != NULL ? " of checkpoint " : "",
             op->b.name != NULL ? op->b.name : "", why, op->obj_refetches,
             REFETCH_MAX);
  if (op->state == R_LATEST)
    r = get_object(op, NULL, "LATEST", SPOT__STORE_LATEST_CAP);
  else
    r = get_object(op, op->b.name, SPOT_MANIFEST_NAME,
                   SPOT__STORE_MANIFEST_CAP);
  if (r < 0)
    fail_msg(op, r, "reading %s: %s", what, strerror(-r));
  return true;
}

/* A body whose MD5 is not the ETag's: changed on the way, unless the same
 * bytes came twice (an ETag that is no MD5 after all). True when it is
 * fetched again; after REFETCH_MAX fetches again the op fails (-EIO: the
 * network, not damage). */
static bool
body_differs_from_etag(struct restore_op *op, const struct spot_s3_result *res)
{
  char want[33], got[33];

  if (!etag_md5(res->etag, want) || !md5_hex(&op->body, got) ||
      strcmp(want, got) == 0)
    return false;
  if (refetch_object(op, "its MD5 is not the ETag's"))
    return true;
  if (strcmp(got, op->obj_md5) == 0)
    return false; /* the same bytes again: the ETag is no MD5 */
  fail_msg(op, -EIO,
           "reading %s: its MD5 differed from the ETag on all %u fetches (a "
           "fault in transit, not damage in the store)",
           op->state == R_LATEST ? "LATEST" : "the manifest",
           op->obj_refetches + 1);
  return false;
}

static void
get_cb(const struct spot_s3_result *res, void *data)
{
  struct restore_op *op = data;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (res->err == 0 && (op->state == R_LATEST || op->state == R_MANIFEST) &&
      body_differs_from_etag(op, res))
    return; /* fetched again */
  if (res->err == -ENOENT && op->state == R_LATEST)
    fail_msg(op, -ENOENT,
             "no committed checkpoint for job %s (no LATEST in the store)",
             op->b.cfg.job);
  else if (res->err == -E2BIG && op->state == R_MANIFEST)
    fail_msg(op, -EFBIG,
             "the manifest of checkpoint %s is larger than %zu MiB, the limit "
             "of a checkpoint's manifest; nothing was fetched",
             op->b.name, SPOT_MANIFEST_JSON_MAX >> 20);
  else if (res->err == -ENOENT)
    fail_msg(op, -ENOENT,
             "checkpoint %s of job %s does not exist (no "
             "committed manifest)",
             op->b.name, op->b.cfg.job);
  else if (res->err < 0)
    spot__store_fail_s3(
        &op->b,
        op->state == R_LATEST ? "reading LATEST" : "reading the manifest", res);
  advance(op);
}

static int
get_object(struct restore_op *op, const char *name, const char *rel, size_t cap)
{
  return spot__store_get_into(&op->b, &op->body, name, rel, cap, get_cb, op,
                              &op->s3op);
}

/* LATEST read: its name is the checkpoint; read its manifest. */
static void
got_latest(struct restore_op *op)
{
  char name[SPOT__STORE_LATEST_CAP + 1];
  size_t n = op->body.len;
  int r;

  memcpy(name, spot_buf_str(&op->body), n);
  name[n] = '\0';
  while (n > 0 &&
         (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' '))
    name[--n] = '\0';
  if (!spot_ckpt_name_valid(name)) {
    if (!refetch_object(op, "no valid checkpoint name"))
      fail_msg(op, -EBADMSG, "LATEST of job %s holds no valid checkpoint name",
               op->b.cfg.job);
    return;
  }
  op->b.name = strdup(name);
  if (op->b.name == NULL) {
    fail_msg(op, -ENOMEM, "out of memory");
    return;
  }
  set_state(op, R_MANIFEST);
  op->obj_refetches = 0;
  op->obj_md5[0] = '\0';
  r = get_object(op, op->b.name, SPOT_MANIFEST_NAME, SPOT__STORE_MANIFEST_CAP);
  if (r < 0)
    fail_msg(op, r, "reading the manifest: %s", strerror(-r));
}

/* ------------------------------------------------------------ ranks */

static void list_ranks(struct restore_op *op);

static void
ranks_cb(const struct spot_s3_result *res, void *data)
{
  struct restore_op *op = data;

  spot__store_s3_done(&op->b, &op->s3op, res);
  free(op->token);
  op->token = NULL;
  if (res->err < 0) {
    spot__store_fail_s3(&op->b, "listing the rank markers", res);
    advance(op);
    return;
  }
  for (size_t i = 0; i < res->n_objects; i++) {
    const char *b = strrchr(res->objects[i].key, '/');
    unsigned k;
    char tail;

    if (b != NULL && sscanf(b, "/rank-%u.jso%c", &k, &tail) == 2 &&
        tail == 'n' && k < 1024 && k + 1 > op->ckpt_nranks)
      op->ckpt_nranks = k + 1;
  }
  if (res->next_token != NULL) {
    op->token = strdup(res->next_token);
    if (op->token == NULL)
      fail_msg(op, -ENOMEM, "out of memory");
    else
      list_ranks(op);
  }
  advance(op);
}

static void
list_ranks(struct restore_op *op)
{
  char *key = spot__store_key(&op->b.cfg.c, op->b.name, "ranks/");
  int r = -ENOMEM;

  if (key != NULL)
    r = spot_s3_list(op->b.cfg.c.s3, op->b.cfg.bucket, key, NULL, op->token, 0,
                     ranks_cb, op, &op->s3op);
  free(key);
  if (r < 0)
    fail_msg(op, r, "listing the rank markers: %s", strerror(-r));
  else
    op->b.active_s3++;
}

/* Whether path is "rank-K/..." of a rank other than mine. */
static bool
other_rank(const char *path, unsigned mine)
{
  unsigned k;
  int n = 0;

  if (strncmp(path, "rank-", 5) != 0 || path[5] < '0' || path[5] > '9')
    return false;
  if (sscanf(path, "rank-%u/%n", &k, &n) != 1 || n == 0)
    return false;
  return k != mine;
}

/* The markers are listed: refuse another rank count (unless resharding),
 * else keep this rank's files and the shared ones. */
static void
got_ranks(struct restore_op *op)
{
  const struct spot_store_config *c = &op->b.cfg.c;
  struct spot_manifest *m = op->m;
  struct spot_manifest_file tmp;
  size_t kept = 0;

  if (op->ckpt_nranks == 0)
    op->ckpt_nranks = 1; /* a single-node commit */
  if (op->ckpt_nranks != c->nranks && !c->reshard) {
    fail_msg(op, -EXDEV,
             "checkpoint %s was committed by %u ranks and this job runs %u "
             "(--nranks): not restoring it; start the job on %u nodes, or "
             "give --reshard to restore every rank's files on each node",
             op->b.name, op->ckpt_nranks, c->nranks, op->ckpt_nranks);
    return;
  }
  if (op->ckpt_nranks != c->nranks)
    log_warn("checkpoint %s was committed by %u ranks, this job runs %u: "
             "--reshard restores every rank's files on this node",
             op->b.name, op->ckpt_nranks, c->nranks);
  if (c->nranks <= 1 || op->ckpt_nranks != c->nranks)
    return;
  /* Stable partition: this rank's and shared files first. */
  op->nfiles_all = m->nfiles;
  for (size_t i = 0; i < m->nfiles; i++) {
    if (other_rank(m->files[i].path, c->rank))
      continue;
    tmp = m->files[i];
    memmove(&m->files[kept + 1], &m->files[kept],
            (i - kept) * sizeof(m->files[0]));
    m->files[kept++] = tmp;
  }
  m->nfiles = kept;
  m->total_raw = m->total_stored = 0;
  m->total_frames = 0;
  for (size_t i = 0; i < kept; i++) {
    m->total_raw += m->files[i].size;
    m->total_stored += m->files[i].stored;
    m->total_frames += m->files[i].nframes;
  }
}

/* Manifest read and validated: make the files on the pool. */
static void
prepare(struct restore_op *op)
{
  uint64_t part_max;
  int r;

  op->b.raw_total = op->m->total_raw;
  part_max = spot_manifest_max_frame_raw(op->m);
  /* packed files: one read of up to part_size, or of one whole file */
  for (size_t i = 0; i < op->m->nfiles; i++) {
    uint64_t need = op->m->files[i].stored; /* <= SPOT_CODEC_PART_MAX */

    if (op->m->files[i].pack == 0)
      continue;
    if (need < op->b.cfg.c.part_size)
      need = op->b.cfg.c.part_size;
    if (part_max < need)
      part_max = need;
  }
  r = spot__store_pipe_init(&op->pipe, &op->b,
                            part_max > 0 ? (size_t)part_max : 1, &rslot_fsm);
  if (r < 0) {
    fail_msg(op, r, "%s", strerror(-r));
    return;
  }
  set_state(op, R_PREPARE);
  if ((r = spot__store_queue(&op->b, prepare_work_cb)) < 0)
    fail_msg(op, r, "queueing work: %s", uv_strerror(r));
}

/* Manifest read: validate it; multi-node, list the rank markers. */
static void
got_manifest(struct restore_op *op)
{
  char err[256];
  int r;

  r = spot_manifest_parse(spot_buf_str(&op->body), op->body.len, &op->m, err,
                          sizeof(err));
  if (r < 0) {
    if (!refetch_object(op, err))
      fail_msg(op, r, "the manifest of checkpoint %s is invalid: %s%s",
               op->b.name, err,
               op->obj_refetches > 0 ? " (the same on two fetches)" : "");
    return;
  }
  if (strcmp(op->m->name, op->b.name) != 0) {
    if (!refetch_object(op, "it names another checkpoint"))
      fail_msg(op, -EBADMSG, "the manifest of checkpoint %s names %s",
               op->b.name, op->m->name);
    spot_manifest_free(op->m);
    op->m = NULL;
    return;
  }
  spot_buf_fini(&op->body);
  op->ckpt_raw = op->m->total_raw;
  op->ckpt_stored = op->m->total_stored;
  if (op->b.cfg.c.nranks == 0) {
    prepare(op);
    return;
  }
  set_state(op, R_RANKS);
  list_ranks(op);
}

static void
xfer_done(struct restore_op *op)
{
  int r;

  if (op->next_file < op->m->nfiles)
    return;
  for (size_t i = 0; i < op->pipe.nslots; i++)
    if (op->pipe.slots[i].state != RS_FREE)
      return;
  set_state(op, R_FINISH);
  spot__store_progress(&op->b, SPOT_STORE_PHASE_COMMIT);
  if ((r = spot__store_queue(&op->b, finish_work_cb)) < 0)
    fail_msg(op, r, "queueing work: %s", uv_strerror(r));
}

static void
advance(struct restore_op *op)
{
  if (spot__store_busy(&op->b) || op->state == R_DONE)
    return;
  if (op->b.err == 0) {
    switch (op->state) {
    case R_LATEST:
      got_latest(op);
      break;
    case R_MANIFEST:
      got_manifest(op);
      break;
    case R_RANKS:
      if (op->token != NULL)
        return; /* the next page is being listed */
      got_ranks(op);
      if (op->b.err == 0)
        prepare(op);
      break;
    case R_PREPARE:
      if (op->removed_copy)
        log_notice("restore: removed the old local copy %s/%s first: "
                   "checkpoint %s fits in %s only without it (%" PRIu64
                   " bytes needed, %" PRIu64 " free now)",
                   op->replace, op->b.name, op->b.name, op->parent, op->need,
                   op->avail);
      set_state(op, R_XFER);
      spot__store_progress(&op->b, SPOT_STORE_PHASE_TRANSFER);
      pump(op);
      return;
    case R_XFER:
      xfer_done(op);
      break;
    case R_FINISH:
      finish(op);
      return;
    default:
      return;
    }
    if (op->b.err == 0 || spot__store_busy(&op->b))
      return;
  }
  /* Failed or cancelled: remove the temporary folder, then report. */
  if (op->tmp != NULL && op->state != R_CLEANUP) {
    set_state(op, R_CLEANUP);
    if (spot__store_queue(&op->b, cleanup_work_cb) == 0)
      return;
  }
  finish(op);
}

static void
advance_cb(struct spot__store_op *b)
{
  advance((struct restore_op *)(void *)b);
}

static void
cancel(struct spot__store_op *b)
{
  struct restore_op *op = (struct restore_op *)(void *)b;

  spot__store_pipe_cancel(&op->pipe, RS_DECODING, RS_FETCHING);
  if (op->s3op != NULL)
    spot_s3_cancel(op->s3op);
}

static const struct spot__store_kind restore_kind = {
    .name = "restore",
    .advance = advance_cb,
    .cancel = cancel,
    .free = op_free,
    .tick = tick,
};

int
spot_store_restore(uv_loop_t *loop, const struct spot_store_config *cfg,
                   const char *name, const char *dir,
                   spot_store_progress_cb progress, spot_store_cb cb,
                   void *data, struct spot_store_op **out)
{
  struct spot__store_op *b;
  struct restore_op *op;
  size_t n;
  int r;

  if (loop == NULL || cfg == NULL || dir == NULL || dir[0] == '\0' ||
      cb == NULL || (name != NULL && !spot_ckpt_name_valid(name)))
    return -EINVAL;
  r = spot__store_op_new(sizeof(*op), &restore_kind, loop, cfg, progress, cb,
                         data, &b);
  if (r < 0)
    return r;
  op = (struct restore_op *)(void *)b;
  op->b.pipe = &op->pipe;
  spot__store_deadline(&op->b, op->b.cfg.c.restore_timeout_ms,
                       "--restore-timeout");
  spot_buf_init(&op->body, SPOT__STORE_LATEST_CAP);
  op->dir = strdup(dir);
  if (op->dir == NULL ||
      (name != NULL && (op->b.name = strdup(name)) == NULL)) {
    spot__store_close(&op->b);
    return -ENOMEM;
  }
  op->umask = spot_store_umask();
  n = strlen(op->dir);
  while (n > 1 && op->dir[n - 1] == '/')
    op->dir[--n] = '\0';
  op->parent = parent_of(op->dir);
  if (cfg->replace_parent != NULL)
    op->replace = strdup(cfg->replace_parent);
  /* the op's copy of cfg must not point at the caller's string */
  op->b.cfg.c.replace_parent = op->replace;
  if (op->parent == NULL ||
      (cfg->replace_parent != NULL && op->replace == NULL)) {
    spot__store_close(&op->b);
    return -ENOMEM;
  }
  if (name != NULL) {
    op->state = R_MANIFEST; /* initial state */
    r = get_object(op, name, SPOT_MANIFEST_NAME, SPOT__STORE_MANIFEST_CAP);
  } else {
    op->state = R_LATEST; /* initial state */
    r = get_object(op, NULL, "LATEST", SPOT__STORE_LATEST_CAP);
  }
  if (r < 0) {
    spot__store_close(&op->b);
    return r;
  }
  spot__store_progress_start(&op->b);
  if (out != NULL)
    *out = (struct spot_store_op *)(void *)op;
  return 0;
}
