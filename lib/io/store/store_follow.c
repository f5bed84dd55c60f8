/* Push, following a folder the trainer is still writing (cfg follow):
 * the upload overlaps the save. enum follow_state:
 *
 *   WATCH  every SPOT_STORE_FOLLOW_SCAN_MS a scan on the pool lists the
 *          folder (readdir + lstat, no reads); a file of at least
 *          SPOT_STORE_FOLLOW_MIN whose size and mtime stayed the same for
 *          SPOT_STORE_FOLLOW_SETTLE_MS looks closed: the scan tries its
 *          filters and the loop appends it to op->files and the manifest,
 *          where the transfer pipeline (store_push_xfer.c) picks it up.
 *          Smaller files wait for the marker (they are the packer's).
 *   DRAIN  the scan saw SPOT_STORE_MARKER: no new file; the pipeline
 *          finishes what it started. Meanwhile the check of the parts
 *          read before the marker runs on the pool (split over up to
 *          `workers` jobs): each is read again
 *          and its CRC32C kept (the trainer has finished writing, so what
 *          it reads now is final). Parts read after the marker was seen
 *          are final as they were read and are not read again.
 *   FINAL  nothing in flight, the check done: the files uploaded so far
 *          move aside and the push's own walk runs on the pool (every
 *          file, with its filter); every file uploaded early whose size,
 *          mtime, inode and part count are unchanged, and whose parts read
 *          before the marker have the CRC32C of their frames, is
 *          unchanged. The loop then builds a new manifest:
 *          unchanged files keep their objects and frames (they are not
 *          uploaded again), changed and new files are uploaded (same key:
 *          a changed file's object is replaced), files that are gone are
 *          not in it (their objects stay unreferenced under this attempt's
 *          folder until retention removes the checkpoint).
 *   DONE   spot__follow_hold() lets the push go on: the pipeline uploads
 *          what is left, then verify and commit as always.
 *
 * A folder never marked complete is never committed: the follow holds the
 * push until it is cancelled (or fails), and stop() in store_push.c aborts
 * its multipart uploads and deletes its completed objects.
 *
 * A file that grows (appended to, as torch.save and most writers do) is
 * taken once it holds two full parts: its full parts below the current
 * size are uploaded as it grows (growing in struct pfile), and its last
 * part once the marker is there (not when it looks closed: a trainer that
 * pauses longer than the settle time would have it closed early, then
 * uploaded again whole). Its parts of S3's minimum or more are padded to
 * it (the last one could not be told apart while it grows). A file that
 * shrinks instead completes with what was sent and the final walk uploads
 * it again. A file taken as closed that changes after all is uploaded
 * again at the marker. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/crc32c.h"
#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"
#include "io/store/store_push.h"

#define SCAN_DEPTH_MAX 64
/* Files of at least FOLLOW_MIN tracked, and op->files' room while the
 * folder is followed: reserved at once, as the workers read op->files
 * while the loop appends to it (more files wait for the marker). */
#define SCAN_SEEN_MAX 10000
#define VERIFY_CHUNK ((size_t)1 << 20)

#define fail_msg(op, ...) spot__store_fail_msg(&(op)->b, __VA_ARGS__)

enum follow_state {
  FOLLOW_WATCH,
  FOLLOW_DRAIN,
  FOLLOW_FINAL,
  FOLLOW_DONE,
  FOLLOW_STATE_LAST,
};

static const char *const follow_state_names[] = {
    "watch",
    "drain",
    "final",
    "done",
};
_Static_assert(SPOT_ARRAY_SIZE(follow_state_names) == FOLLOW_STATE_LAST,
               "follow_state_names");

/* A big file the scans have seen: what it looked like, since when. */
struct seen {
  char *rel;
  uint64_t size;
  int64_t mtime_ns;
  uint64_t since_ms;
  bool taken;   /* handed to the pipeline */
  bool growing; /* taken while growing, not closed yet */
};

/* What a scan saw of a file taken while growing. */
struct grow {
  const char *rel; /* the seen entry's */
  struct stat st;
  bool closed; /* settled, or the marker is there: its last part */
};

/* A file's parts read before the marker was seen (the first nparts):
 * read again on the pool once the marker is there. crc[p] their CRC32C,
 * bad[p] set when part p could not be read whole (the file shrank or
 * went); each part is written by one check job only. */
struct early {
  char *abs, *rel;
  uint64_t size;
  size_t nparts;
  uint32_t *crc;
  unsigned char *bad;
};

/* The check is split over up to `workers` jobs on the pool (the encoders
 * have little left to do once the marker is there): job k reads the parts
 * [from, to) of all the files' early parts, counted in file order. */
#define CHECK_JOBS_MAX 8

struct check_job {
  struct follow *fo;
  uv_work_t work;
  size_t from, to;
  uint64_t bytes;
  int status;
};

struct follow {
  struct push_op *op;
  enum follow_state state;
  uv_timer_t timer; /* the scan period */
  uv_work_t work;   /* the scan or the final check */
  bool working;
  /* the pool's, between queueing and the after callback */
  struct seen *seen;
  size_t nseen, seen_alloc;
  struct pfile *add; /* files that look closed, for the loop to take */
  size_t nadd, add_alloc;
  struct grow *grow; /* news of files taken while growing */
  size_t ngrow, grow_alloc;
  bool marker;
  int scan_err;
  char scan_msg[512];
  /* FINAL: the files uploaded before the marker and their manifest; for
   * each new file, 1 + the index of the old one it reuses, or 0 */
  struct pfile *old;
  size_t nold;
  struct spot_manifest *old_manifest;
  size_t *reuse;
  size_t nchanged, nreused;
  size_t nwalked; /* files of the final walk (pack entries come after) */
  uint64_t scans;
  /* where the time after the marker goes (the log lines say): when the
   * loop saw the marker, when the final walk began, and what the final
   * check read again (pool, read by the loop once the work is done) */
  uint64_t marker_ms, final_ms;
  uint64_t reread_bytes;
  /* DRAIN: the check of the parts read before the marker (pool) */
  struct check_job jobs[CHECK_JOBS_MAX];
  unsigned njobs, checking; /* jobs queued, jobs not back yet */
  struct early *early;      /* early[i] is op->files[i] at the marker's */
  size_t nearly;
  bool rescan;            /* a poke came while a scan ran: scan again at once */
  atomic_bool check_stop; /* cancelled: the check stops reading */
};

static void timer_cb(uv_timer_t *t);
static int check_start(struct follow *fo);

static const struct spot_fsm follow_fsm = {
    "push follow", follow_state_names, FOLLOW_STATE_LAST, NULL, 0,
    SPOT_LOG_DEBUG};

#define set_state(fo, s) set_state_at((fo), (s), __FILE__, __LINE__)
static void
set_state_at(struct follow *fo, enum follow_state s, const char *file, int line)
{
  if (spot_fsm_move_detail(&follow_fsm, fo->state, s, file, line, "name=%s",
                           fo->op->b.name) > 0)
    fo->state = s;
  fo->op->b.marker_pending = fo->state == FOLLOW_WATCH;
}

/* ----------------------------------------------------------- the scan */

static struct seen *
seen_find(struct follow *fo, const char *rel)
{
  for (size_t i = 0; i < fo->nseen; i++)
    if (strcmp(fo->seen[i].rel, rel) == 0)
      return &fo->seen[i];
  return NULL;
}

static int
seen_add(struct follow *fo, const char *rel, struct seen **out)
{
  struct seen *s;

  if (fo->nseen >= SCAN_SEEN_MAX)
    return -E2BIG;
  if (fo->nseen == fo->seen_alloc) {
    size_t n = fo->seen_alloc ? fo->seen_alloc * 2 : 16;
    struct seen *p = realloc(fo->seen, n * sizeof(*p));
    if (p == NULL)
      return -ENOMEM;
    fo->seen = p;
    fo->seen_alloc = n;
  }
  s = &fo->seen[fo->nseen];
  memset(s, 0, sizeof(*s));
  s->rel = strdup(rel);
  if (s->rel == NULL)
    return -ENOMEM;
  fo->nseen++;
  *out = s;
  return 0;
}

/* A file that looks closed: its filter from its first MiB, like the walk
 * does (pool). 0, 1 (leave it for the final walk) or negative errno. */
static int
take(struct follow *fo, struct spot_codec *codec, void *sample, const char *rel,
     const char *abs, const struct stat *st, bool growing)
{
  struct push_op *op = fo->op;
  uint64_t part = op->b.cfg.c.part_size;
  size_t n = SPOT_CODEC_SAMPLE_MAX;
  struct spot_codec_trial t;
  struct pfile *f;
  int fd, r;

  if (((uint64_t)st->st_size + part - 1) / part > SPOT_MANIFEST_PARTS_MAX ||
      !spot_manifest_path_valid(rel))
    return 1; /* the final walk says why */
  if (fo->nadd == fo->add_alloc) {
    size_t k = fo->add_alloc ? fo->add_alloc * 2 : 8;
    struct pfile *p = realloc(fo->add, k * sizeof(*p));
    if (p == NULL)
      return -ENOMEM;
    fo->add = p;
    fo->add_alloc = k;
  }
  f = &fo->add[fo->nadd];
  memset(f, 0, sizeof(*f));
  fd = open(abs, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0)
    return 1;
  if ((uint64_t)st->st_size < n)
    n = (size_t)st->st_size;
  r = spot__push_read_full(fd, sample, n, 0);
  close(fd);
  if (r < 0)
    return 1; /* shrank: not closed after all */
  if (op->b.cfg.c.compress == SPOT_STORE_COMPRESS_NEVER) {
    f->filter = SPOT_FILTER_NONE;
  } else {
    if (spot_codec_choose_filter(codec, sample, n, &t) < 0)
      return 1;
    f->filter =
        spot__push_looks_like_text(sample, n) ? SPOT_FILTER_NONE : t.filter;
    f->compress = t.compress;
    f->cmode = t.mode;
  }
  if (spot__push_pfile_init(f, rel, abs, st) < 0)
    return -ENOMEM;
  f->nparts = (size_t)((f->size + part - 1) / part);
  if (growing) { /* its full parts so far */
    f->nparts = (size_t)(f->size / part);
    f->size = (uint64_t)f->nparts * part;
    f->growing = f->open_ended = true;
  }
  fo->nadd++;
  return 0;
}

static int
grow_add(struct follow *fo, const char *rel, const struct stat *st, bool closed)
{
  if (fo->ngrow == fo->grow_alloc) {
    size_t k = fo->grow_alloc ? fo->grow_alloc * 2 : 8;
    struct grow *p = realloc(fo->grow, k * sizeof(*p));
    if (p == NULL)
      return -ENOMEM;
    fo->grow = p;
    fo->grow_alloc = k;
  }
  fo->grow[fo->ngrow].rel = rel;
  fo->grow[fo->ngrow].st = *st;
  fo->grow[fo->ngrow].closed = closed;
  fo->ngrow++;
  return 0;
}

struct scan_ctx {
  struct follow *fo;
  struct spot_codec *codec;
  void *sample;
  uint64_t now;
};

static int
scan_dir(struct scan_ctx *c, const char *abs, const char *rel, int depth)
{
  struct follow *fo = c->fo;
  DIR *d;
  struct dirent *de;
  int r = 0;

  if (depth > SCAN_DEPTH_MAX)
    return 0; /* the final walk fails it */
  d = opendir(abs);
  if (d == NULL)
    return depth == 0 ? -errno : 0; /* a subfolder may just have gone */
  while ((de = readdir(d)) != NULL) {
    char cabs[4096], crel[4096];
    struct stat st;
    struct seen *s;
    int64_t mt;

    if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
      continue;
    if (depth == 0 && strcmp(de->d_name, SPOT_STORE_MARKER) == 0) {
      fo->marker = true;
      continue;
    }
    if ((size_t)snprintf(cabs, sizeof(cabs), "%s/%s", abs, de->d_name) >=
            sizeof(cabs) ||
        (size_t)snprintf(crel, sizeof(crel), "%s%s%s", rel, rel[0] ? "/" : "",
                         de->d_name) >= sizeof(crel))
      continue;
    if (lstat(cabs, &st) < 0)
      continue;
    if (S_ISDIR(st.st_mode)) {
      r = scan_dir(c, cabs, crel, depth + 1);
      if (r < 0)
        break;
      continue;
    }
    if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size < SPOT_STORE_FOLLOW_MIN ||
        (uint64_t)st.st_size < spot__pack_threshold(fo->op))
      continue; /* links, small (packed) files: after the marker */
    mt = (int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec;
    s = seen_find(fo, crel);
    if (s == NULL) {
      r = seen_add(fo, crel, &s);
      if (r == -E2BIG) {
        r = 0;
        continue;
      }
      if (r < 0)
        break;
      s->size = (uint64_t)st.st_size;
      s->mtime_ns = mt;
      s->since_ms = c->now;
    } else if (s->size != (uint64_t)st.st_size || s->mtime_ns != mt) {
      bool grew = (uint64_t)st.st_size > s->size;

      s->size = (uint64_t)st.st_size;
      s->mtime_ns = mt;
      s->since_ms = c->now;
      if (!s->taken && grew &&
          (uint64_t)st.st_size >= 2 * fo->op->b.cfg.c.part_size) {
        r = take(fo, c->codec, c->sample, crel, cabs, &st, true);
        s->taken = s->growing = r == 0;
      } else if (s->growing) {
        r = grow_add(fo, s->rel, &st, false);
      }
      if (r < 0)
        break;
      r = 0;
    } else if (c->now >= s->since_ms + SPOT_STORE_FOLLOW_SETTLE_MS) {
      /* A file taken while growing stays open until the marker: a
       * trainer pausing longer than the settle time would otherwise have
       * it closed early, and uploaded again whole at the marker. */
      if (!s->taken) {
        r = take(fo, c->codec, c->sample, crel, cabs, &st, false);
        s->taken = r == 0;
      }
      if (r < 0)
        break;
      r = 0;
    }
  }
  closedir(d);
  return r;
}

static void
scan_work_cb(uv_work_t *req)
{
  struct follow *fo = spot_container_of(req, struct follow, work);
  struct scan_ctx c = {fo, NULL, NULL, spot_now_mono_ms()};
  int r;

  fo->scan_err = 0;
  fo->nadd = 0;
  fo->ngrow = 0;
  r = spot_codec_new(SPOT_CODEC_SAMPLE_MAX, &c.codec);
  c.sample = malloc(SPOT_CODEC_SAMPLE_MAX);
  if (r < 0 || c.sample == NULL) {
    fo->scan_err = -ENOMEM;
    snprintf(fo->scan_msg, sizeof(fo->scan_msg), "out of memory");
  } else if ((r = scan_dir(&c, fo->op->dir, "", 0)) < 0) {
    fo->scan_err = r;
    snprintf(fo->scan_msg, sizeof(fo->scan_msg), "%s: %s", fo->op->dir,
             strerror(-r));
  }
  /* The marker says every file is closed: the last parts of the files
   * still growing (one gone or unreadable keeps what it sent). */
  for (size_t i = 0; fo->marker && fo->scan_err == 0 && i < fo->nseen; i++) {
    struct seen *s = &fo->seen[i];
    char abs[8200];
    struct stat st;

    if (!s->growing)
      continue;
    snprintf(abs, sizeof(abs), "%s/%s", fo->op->dir, s->rel);
    if (lstat(abs, &st) < 0 || !S_ISREG(st.st_mode))
      memset(&st, 0, sizeof(st));
    if (grow_add(fo, s->rel, &st, true) < 0) {
      fo->scan_err = -ENOMEM;
      snprintf(fo->scan_msg, sizeof(fo->scan_msg), "out of memory");
      break;
    }
    s->growing = false;
  }
  free(c.sample);
  spot_codec_free(c.codec);
}

/* The files the scan found closed join the push. */
static int
take_added(struct follow *fo)
{
  struct push_op *op = fo->op;

  if (fo->nadd == 0)
    return 0;
  if (op->files == NULL)
    op->files = malloc(SCAN_SEEN_MAX * sizeof(*op->files));
  if (op->files == NULL || op->nfiles + fo->nadd > SCAN_SEEN_MAX)
    return -ENOMEM; /* never more than seen entries */
  for (size_t i = 0; i < fo->nadd; i++) {
    struct pfile *f = &op->files[op->nfiles];
    int r;

    *f = fo->add[i];
    op->nfiles++;
    op->b.raw_total += f->size;
    r = spot__push_add_to_manifest(op, f);
    if (r < 0) {
      for (size_t j = i + 1; j < fo->nadd; j++)
        spot__push_pfile_fini(&fo->add[j]);
      fo->nadd = 0;
      return r;
    }
    log_info("push name=%s: %s %s (%" PRIu64
             " bytes): uploading it before the marker",
             op->b.name, f->rel,
             f->growing ? "grows, its full parts so far" : "looks closed",
             f->size);
  }
  fo->nadd = 0;
  return 0;
}

/* News of the files taken while growing: more full parts, or closed
 * (their last part). A file that shrank keeps what was sent: the final
 * walk finds it changed. */
static int
grown(struct follow *fo)
{
  struct push_op *op = fo->op;
  uint64_t part = op->b.cfg.c.part_size;

  for (size_t i = 0; i < fo->ngrow; i++) {
    const struct grow *g = &fo->grow[i];
    uint64_t size = (uint64_t)g->st.st_size;
    struct spot_manifest_file *mf;
    struct pfile *f = NULL;
    size_t idx, nparts;

    for (idx = 0; idx < op->nfiles; idx++)
      if (strcmp(op->files[idx].rel, g->rel) == 0) {
        f = &op->files[idx];
        break;
      }
    if (f == NULL || !f->growing)
      continue;
    if (g->closed) {
      f->growing = false;
      if (g->st.st_ino != 0) {
        f->mtime_ns =
            (int64_t)g->st.st_mtim.tv_sec * 1000000000 + g->st.st_mtim.tv_nsec;
        f->mode = g->st.st_mode & 07777;
      }
      nparts = size >= f->size ? (size_t)((size + part - 1) / part) : f->nparts;
      if (size < f->size)
        size = f->size;
      log_info("push name=%s: %s closed at %" PRIu64 " bytes (%zu parts)",
               op->b.name, f->rel, size, nparts);
    } else {
      nparts = (size_t)(size / part);
      size = (uint64_t)nparts * part;
      if (nparts <= f->nparts)
        continue;
    }
    if (nparts > SPOT_MANIFEST_PARTS_MAX) { /* the final walk says why */
      nparts = f->nparts;
      size = f->size;
    }
    if (nparts > f->nparts) {
      struct spot_s3_part_info *e = realloc(f->etags, nparts * sizeof(*e));

      if (e == NULL)
        return -ENOMEM;
      memset(e + f->nparts, 0, (nparts - f->nparts) * sizeof(*e));
      f->etags = e;
    }
    op->b.raw_total += size - f->size;
    f->size = size;
    f->nparts = nparts;
    mf = &op->manifest->files[f->midx];
    mf->size = size;
    mf->mtime_ns = f->mtime_ns;
    mf->mode = f->mode;
    if (idx < op->next_file)
      op->next_file = idx; /* its new parts */
  }
  fo->ngrow = 0;
  return 0;
}

static void
scan_after_cb(uv_work_t *req, int status)
{
  struct follow *fo = spot_container_of(req, struct follow, work);
  struct push_op *op = fo->op;
  int r;

  op->b.active_work--;
  fo->working = false;
  fo->scans++;
  if (status < 0 || spot__store_cancelled(&op->b) || op->b.err < 0) {
    for (size_t i = 0; i < fo->nadd; i++)
      spot__push_pfile_fini(&fo->add[i]);
    fo->nadd = 0;
    fo->ngrow = 0;
    if (status < 0 && status != UV_ECANCELED)
      fail_msg(op, status, "queueing work: %s", uv_strerror(status));
  } else if (fo->scan_err < 0) {
    fail_msg(op, fo->scan_err, "following the checkpoint folder: %s",
             fo->scan_msg);
  } else if ((r = take_added(fo)) < 0 || (r = grown(fo)) < 0) {
    fail_msg(op, r, "following the checkpoint folder: %s", strerror(-r));
  } else if (fo->marker && fo->state == FOLLOW_WATCH) {
    fo->marker_ms = spot_now_mono_ms();
    log_info("push name=%s: %s is there after %" PRIu64
             " scans: final walk once the files started are stored; "
             "%" PRIu64 " of %" PRIu64 " bytes read and %" PRIu64
             " bytes stored so far",
             op->b.name, SPOT_STORE_MARKER, fo->scans, op->b.raw_done,
             op->b.raw_total, op->b.stored_done);
    uv_timer_stop(&fo->timer);
    for (size_t i = 0; i < op->nfiles; i++)
      op->files[i].growing = false; /* the scan closed them; if not, as is */
    set_state(fo, FOLLOW_DRAIN);
    if ((r = check_start(fo)) < 0)
      fail_msg(op, r, "checking the files read before the marker: %s",
               strerror(-r));
  } else if (fo->rescan && fo->state == FOLLOW_WATCH) {
    uv_timer_start(&fo->timer, timer_cb, 0, SPOT_STORE_FOLLOW_SCAN_MS);
  }
  fo->rescan = false;
  spot__push_pump(op);
}

static void
timer_cb(uv_timer_t *t)
{
  struct follow *fo = spot_container_of(t, struct follow, timer);
  struct push_op *op = fo->op;
  int r;

  if (op->b.err < 0 || op->b.life != SPOT__STORE_RUNNING) {
    /* failed or cancelled while idle: nothing else would move it on */
    uv_timer_stop(t);
    spot__push_pump(op);
    return;
  }
  if (fo->working || fo->state != FOLLOW_WATCH || op->state != PUSH_XFER)
    return;
  r = spot__store_work(&op->b, &fo->work, scan_work_cb, scan_after_cb);
  if (r < 0) {
    fail_msg(op, r, "queueing work: %s", uv_strerror(r));
    spot__push_pump(op);
    return;
  }
  fo->working = true;
  op->b.active_work++;
}

/* ---------------------------------------------------------- the final */

/* The raw length of part p of a file of size bytes. */
static uint64_t
part_len(uint64_t size, uint64_t part, size_t p)
{
  uint64_t off = (uint64_t)p * part;

  return size - off < part ? size - off : part;
}

/* Reads again its share of the parts read before the marker, keeping
 * their CRC32C (pool). The final walk compares them with the frames. */
static void
check_work_cb(uv_work_t *req)
{
  struct check_job *j = spot_container_of(req, struct check_job, work);
  struct follow *fo = j->fo;
  uint64_t part = fo->op->b.cfg.c.part_size;
  void *buf = malloc(VERIFY_CHUNK);
  size_t g = 0; /* the part's index in file order */

  j->status = buf != NULL ? 0 : -ENOMEM;
  for (size_t i = 0; buf != NULL && i < fo->nearly && g < j->to; i++) {
    struct early *e = &fo->early[i];
    int fd = -1;

    for (size_t p = 0; p < e->nparts; p++, g++) {
      uint64_t off = (uint64_t)p * part, left = part_len(e->size, part, p);
      uint32_t crc = 0;

      if (g < j->from || g >= j->to)
        continue;
      if (fd < 0)
        fd = open(e->abs, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      if (fd < 0) {
        e->bad[p] = 1;
        continue;
      }
      while (left > 0) {
        size_t n = left < VERIFY_CHUNK ? (size_t)left : VERIFY_CHUNK;

        if (atomic_load(&fo->check_stop) ||
            spot__push_read_full(fd, buf, n, off) < 0) {
          e->bad[p] = 1;
          break;
        }
        crc = spot_crc32c(crc, buf, n);
        j->bytes += n;
        off += n;
        left -= n;
      }
      e->crc[p] = crc;
    }
    if (fd >= 0)
      close(fd);
  }
  free(buf);
}

static void
check_after_cb(uv_work_t *req, int status)
{
  struct check_job *j = spot_container_of(req, struct check_job, work);
  struct follow *fo = j->fo;
  struct push_op *op = fo->op;

  op->b.active_work--;
  fo->checking--;
  fo->reread_bytes += j->bytes;
  if (status < 0 && status != UV_ECANCELED)
    fail_msg(op, status, "queueing work: %s", uv_strerror(status));
  else if (status == 0 && j->status < 0)
    fail_msg(op, j->status, "checking the files read before the marker: %s",
             strerror(-j->status));
  else if (status < 0 && op->b.err == 0)
    spot__store_fail(&op->b, -ECANCELED);
  spot__push_pump(op);
}

static void
early_free(struct follow *fo)
{
  for (size_t i = 0; i < fo->nearly; i++) {
    free(fo->early[i].abs);
    free(fo->early[i].rel);
    free(fo->early[i].crc);
    free(fo->early[i].bad);
  }
  free(fo->early);
  fo->early = NULL;
  fo->nearly = 0;
}

/* The marker is there: what each file had dispatched by now may have been
 * read before the trainer finished; read it again on the pool while the
 * pipeline stores the rest. 0 or negative errno (the jobs queued run on). */
static int
check_start(struct follow *fo)
{
  struct push_op *op = fo->op;
  size_t total = 0, njobs = op->b.cfg.c.workers;

  fo->reread_bytes = 0;
  fo->early = calloc(op->nfiles + 1, sizeof(*fo->early));
  if (fo->early == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < op->nfiles; i++) {
    const struct pfile *f = &op->files[i];
    struct early *e = &fo->early[i];

    fo->nearly = i + 1;
    e->size = f->size;
    e->nparts = f->next_part < f->nparts ? f->next_part : f->nparts;
    e->abs = strdup(f->abs);
    e->rel = strdup(f->rel);
    e->crc = calloc(e->nparts + 1, sizeof(*e->crc));
    e->bad = calloc(e->nparts + 1, 1);
    if (e->abs == NULL || e->rel == NULL || e->crc == NULL || e->bad == NULL)
      return -ENOMEM;
    total += e->nparts;
  }
  atomic_store(&fo->check_stop, false);
  if (njobs > CHECK_JOBS_MAX)
    njobs = CHECK_JOBS_MAX;
  if (njobs > total)
    njobs = total;
  for (size_t k = 0; k < njobs; k++) {
    struct check_job *j = &fo->jobs[k];
    int r;

    memset(j, 0, sizeof(*j));
    j->fo = fo;
    j->from = total * k / njobs;
    j->to = total * (k + 1) / njobs;
    r = spot__store_work(&op->b, &j->work, check_work_cb, check_after_cb);
    if (r < 0)
      return r;
    fo->njobs = (unsigned)k + 1;
    fo->checking++;
    op->b.active_work++;
  }
  return 0;
}

/* Whether the parts of old file j read before the marker read back, after
 * it, with the CRC32C of their frames (the others were read after it).
 * Pool, once the check is done. */
static bool
early_same(const struct follow *fo, size_t j,
           const struct spot_manifest_file *mf)
{
  uint64_t part = fo->op->b.cfg.c.part_size;
  const struct early *e;

  if (j >= fo->nearly)
    return false;
  e = &fo->early[j];
  if (strcmp(e->rel, fo->old[j].rel) != 0 || mf->nframes != fo->old[j].nparts ||
      e->nparts > mf->nframes)
    return false;
  for (size_t p = 0; p < mf->nframes; p++) {
    const struct spot_manifest_frame *fr = &mf->frames[p];

    if (!fr->set)
      return false;
    if (p < e->nparts &&
        (e->bad[p] || fr->raw_len != part_len(e->size, part, p) ||
         fr->crc32c != e->crc[p]))
      return false;
  }
  return true;
}

static void
final_work_cb(uv_work_t *req)
{
  struct follow *fo = spot_container_of(req, struct follow, work);
  struct push_op *op = fo->op;

  spot__push_walk(op);
  if (op->b.err < 0)
    return;
  fo->reuse = calloc(op->nfiles + 1, sizeof(*fo->reuse));
  if (fo->reuse == NULL) {
    fail_msg(op, -ENOMEM, "out of memory");
    return;
  }
  for (size_t i = 0; i < op->nfiles; i++) {
    const struct pfile *f = &op->files[i];

    for (size_t j = 0; j < fo->nold; j++) {
      const struct pfile *o = &fo->old[j];

      if (o->state != FILE_DONE || o->key == NULL ||
          strcmp(o->rel, f->rel) != 0)
        continue;
      if (f->link == NULL && o->size == f->size && o->mtime_ns == f->mtime_ns &&
          o->ino == f->ino && o->dev == f->dev && o->nparts == f->nparts &&
          early_same(fo, j, &fo->old_manifest->files[o->midx])) {
        fo->reuse[i] = j + 1;
        fo->nreused++;
      } else {
        fo->nchanged++;
      }
      break;
    }
  }
}

/* The new manifest: files reused keep their frames. */
static int
rebuild(struct follow *fo)
{
  struct push_op *op = fo->op;
  size_t n;
  int r;

  if (spot__push_walked(op) < 0)
    return op->b.err;
  /* the files walked: fo->reuse covers them; the manifest build appends
   * the pack entries after them */
  n = fo->nwalked = op->nfiles;
  for (size_t i = 0; i < n; i++)
    if (fo->reuse[i] != 0)
      op->files[i].filter = fo->old[fo->reuse[i] - 1].filter;
  r = spot__push_manifest_build(op);
  if (r < 0)
    return r;
  op->b.raw_done = 0;
  for (size_t i = 0; i < n; i++) {
    struct pfile *f = &op->files[i];
    const struct spot_manifest_file *mf;

    if (fo->reuse[i] == 0)
      continue;
    mf = &fo->old_manifest->files[fo->old[fo->reuse[i] - 1].midx];
    for (size_t p = 0; p < mf->nframes; p++) {
      r = spot_manifest_set_frame(op->manifest, f->midx, p,
                                  mf->frames[p].raw_len, mf->frames[p].comp_len,
                                  mf->frames[p].crc32c);
      if (r < 0)
        return r;
    }
    f->next_part = f->parts_done = f->nparts;
    op->b.raw_done += f->size;
    spot__push_file_set_state(op, f, FILE_DONE);
  }
  return 0;
}

static void
old_free(struct follow *fo)
{
  for (size_t i = 0; i < fo->nold; i++)
    spot__push_pfile_fini(&fo->old[i]);
  free(fo->old);
  fo->old = NULL;
  fo->nold = 0;
  spot_manifest_free(fo->old_manifest);
  fo->old_manifest = NULL;
  free(fo->reuse);
  fo->reuse = NULL;
  early_free(fo);
}

static void
final_after_cb(uv_work_t *req, int status)
{
  struct follow *fo = spot_container_of(req, struct follow, work);
  struct push_op *op = fo->op;
  int r = 0;

  op->b.active_work--;
  fo->working = false;
  if (status < 0 && status != UV_ECANCELED)
    fail_msg(op, status, "queueing work: %s", uv_strerror(status));
  else if (status == 0 && op->b.err == 0 && (r = rebuild(fo)) < 0)
    fail_msg(op, r, "the final walk: %s", strerror(-r));
  if (op->b.err < 0 || status < 0) {
    /* Failed or cancelled: the files uploaded so far come back, for
     * stop() to delete their objects. */
    for (size_t i = 0; i < op->nfiles; i++)
      spot__push_pfile_fini(&op->files[i]);
    free(op->files);
    spot_manifest_free(op->manifest);
    op->files = fo->old;
    op->nfiles = fo->nold;
    op->manifest = fo->old_manifest;
    fo->old = NULL;
    fo->nold = 0;
    fo->old_manifest = NULL;
    if (op->b.err == 0)
      spot__store_fail(&op->b, -ECANCELED);
  } else {
    uint64_t now = spot_now_mono_ms();

    log_info("push name=%s: final walk: %zu files, %zu uploaded before the "
             "marker and unchanged, %zu changed since (uploaded again); "
             "%" PRIu64 " bytes read before the marker read again",
             op->b.name, fo->nwalked, fo->nreused, fo->nchanged,
             fo->reread_bytes);
    log_debug("push name=%s: after the marker, %" PRIu64
              " ms to store the files started, %" PRIu64
              " ms for the final walk",
              op->b.name, fo->final_ms - fo->marker_ms, now - fo->final_ms);
    set_state(fo, FOLLOW_DONE);
  }
  old_free(fo);
  op->next_file = 0;
  spot__push_pump(op);
}

bool
spot__follow_hold(struct push_op *op)
{
  struct follow *fo = op->follow;
  int r;

  switch (fo->state) {
  case FOLLOW_WATCH:
    if (!uv_is_active((uv_handle_t *)&fo->timer))
      uv_timer_start(&fo->timer, timer_cb, 0, SPOT_STORE_FOLLOW_SCAN_MS);
    return true;
  case FOLLOW_DRAIN:
    if (fo->checking > 0)
      return true; /* the last one's end moves the push on */
    /* Everything started is stored; the walk fills op->files anew. */
    fo->old = op->files;
    fo->nold = op->nfiles;
    fo->old_manifest = op->manifest;
    op->files = NULL;
    op->nfiles = 0;
    op->manifest = NULL;
    fo->nreused = fo->nchanged = 0;
    fo->final_ms = spot_now_mono_ms();
    set_state(fo, FOLLOW_FINAL);
    r = spot__store_work(&op->b, &fo->work, final_work_cb, final_after_cb);
    if (r < 0) {
      final_after_cb(&fo->work, r);
      return true;
    }
    fo->working = true;
    op->b.active_work++;
    return true;
  case FOLLOW_FINAL:
    return true;
  default:
    return false;
  }
}

/* ---------------------------------------------------------- lifecycle */

int
spot__follow_init(struct push_op *op)
{
  struct follow *fo = calloc(1, sizeof(*fo));

  if (fo == NULL)
    return -ENOMEM;
  fo->op = op;
  op->b.marker_pending = true; /* FOLLOW_WATCH */
  /* Cannot fail once a timer of the same loop initialised. */
  (void)uv_timer_init(op->b.loop, &fo->timer);
  op->b.handles++;
  op->follow = fo;
  return 0;
}

void
spot__follow_cancel(struct push_op *op)
{
  struct follow *fo = op->follow;

  if (fo == NULL)
    return;
  /* The push may be idle, waiting for the next scan: the timer moves it
   * on (to stop() and its aborts) from the loop, never from here. */
  uv_timer_start(&fo->timer, timer_cb, 0, 0);
  if (fo->working)
    (void)spot__store_work_cancel(&op->b, &fo->work);
  if (fo->checking > 0) {
    atomic_store(&fo->check_stop, true); /* they stop at their next MiB */
    for (unsigned k = 0; k < fo->njobs; k++)
      (void)spot__store_work_cancel(&op->b, &fo->jobs[k].work);
  }
}

bool
spot__follow_walking(const struct push_op *op)
{
  const struct follow *fo = op->follow;

  return fo != NULL && fo->state == FOLLOW_FINAL && fo->working;
}

void
spot__follow_poke(struct push_op *op)
{
  struct follow *fo = op->follow;

  if (fo == NULL || fo->state != FOLLOW_WATCH ||
      op->b.life != SPOT__STORE_RUNNING)
    return;
  if (fo->working)
    fo->rescan = true; /* the scan running may have missed it */
  else
    uv_timer_start(&fo->timer, timer_cb, 0, SPOT_STORE_FOLLOW_SCAN_MS);
}

static void
timer_close_cb(uv_handle_t *h)
{
  struct follow *fo = spot_container_of(h, struct follow, timer);

  spot__store_handle_closed(&fo->op->b);
}

void
spot__follow_close(struct push_op *op)
{
  struct follow *fo = op->follow;

  if (fo == NULL)
    return;
  uv_timer_stop(&fo->timer);
  uv_close((uv_handle_t *)&fo->timer, timer_close_cb);
}

void
spot__follow_fini(struct push_op *op)
{
  struct follow *fo = op->follow;

  if (fo == NULL)
    return;
  old_free(fo);
  for (size_t i = 0; i < fo->nseen; i++)
    free(fo->seen[i].rel);
  free(fo->seen);
  for (size_t i = 0; i < fo->nadd; i++)
    spot__push_pfile_fini(&fo->add[i]);
  free(fo->add);
  free(fo->grow);
  free(fo);
  op->follow = NULL;
}
