/* Push, unchanged bytes are not uploaded again (cfg dedup; docs/design.md
 * "Unchanged bytes"): a file is cut into frames of dedup_frame bytes
 * (within the part grid, so a frame never spans two part_size parts),
 * each an independent zstd frame with the SHA-256 of its raw bytes in the
 * manifest. Before the transfer, the push reads LATEST's manifest (the
 * base) and hashes every frame of its files on the pool; a frame whose
 * SHA-256 (and length and filter) the base records is a reference to the
 * object and range that holds it (manifest.h "References"), the others
 * are encoded and uploaded, grouped into parts of up to part_size raw
 * bytes (so S3's 5 MiB part minimum costs no padding when only scattered
 * frames changed).
 *
 *   LATEST    GET LATEST (404: no base, every frame is sent)
 *   MANIFEST  GET and parse its manifest (invalid: no base, a warning)
 *   HEAD      HEAD every object its hashed frames are in: one that is
 *             missing or not the size its manifest says is never
 *             referenced (a new checkpoint must not inherit the damage)
 *   HASH      pool: read and hash every frame, look each up in the base
 *   DONE      spot__push_advance() plans the parts and goes on
 *
 * Without a base (the job's first checkpoint) nothing is hashed ahead:
 * the encoding worker hashes each frame it reads. Workers only touch the
 * frames of their own part or unit, and the base index is read-only
 * while they run. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <openssl/sha.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/fsm.h"
#include "core/log.h"
#include "core/util.h"
#include "io/store/store_push.h"

#define fail_msg(op, ...) spot__store_fail_msg(&(op)->b, __VA_ARGS__)

/* Frames hashed per unit of pool work (a unit is one file's frames). */
#define UNIT_FRAMES 64

static const char *const dedup_state_names[] = {
    "latest", "manifest", "head", "hash", "done",
};

_Static_assert(SPOT_ARRAY_SIZE(dedup_state_names) == DEDUP_STATE_LAST,
               "dedup_state_names");
static const struct spot_fsm dedup_fsm = {
    "push dedup", dedup_state_names, DEDUP_STATE_LAST, NULL, 0, SPOT_LOG_DEBUG};

#define set_state(op, s) set_state_at((op), (s), __FILE__, __LINE__)
static void
set_state_at(struct push_op *op, enum dedup_state s, const char *file, int line)
{
  if (spot_fsm_move_detail(&dedup_fsm, op->dedup.state, s, file, line,
                           "name=%s", op->b.name) > 0)
    op->dedup.state = s;
}

uint64_t
spot__dedup_frame_size(const struct push_op *op)
{
  uint64_t fs = op->b.cfg.c.dedup_frame ? op->b.cfg.c.dedup_frame
                                        : SPOT_STORE_DEDUP_FRAME_DEFAULT;

  return fs < op->b.cfg.c.part_size ? fs : op->b.cfg.c.part_size;
}

/* Whether this push cuts files into frames: cfg dedup, one node, not
 * following, and parts of at least SPOT_STORE_DEDUP_PART_MIN (a part of
 * incompressible frames must reach S3's minimum within a slot's buffer:
 * spot_codec_bound() of a part holds a part's worth of frames only up to
 * their per-frame overhead, and padding has no room left then). */
bool
spot__dedup_on(const struct push_op *op)
{
  return op->b.cfg.c.dedup && op->b.cfg.c.nranks <= 1 && op->follow == NULL &&
         op->b.cfg.c.part_size >= SPOT_STORE_DEDUP_PART_MIN;
}

bool
spot__dedup_wanted(const struct push_op *op, const struct pfile *f)
{
  /* small files go in packs (store_pack.c), whole */
  return spot__dedup_on(op) && f->size > 0 && f->link == NULL && f->pack == 0 &&
         f->pk == NULL && !spot__pack_small(op, f);
}

/* Frame j of f: its offset and length in the file (the grid of
 * dedup_frame within each part_size part). */
static void
frame_at(const struct push_op *op, const struct pfile *f, size_t j,
         uint64_t *off, uint64_t *len)
{
  uint64_t ps = op->b.cfg.c.part_size, fs = spot__dedup_frame_size(op);
  uint64_t per = (ps + fs - 1) / fs, p = j / per, in = j % per;
  uint64_t pend = (p + 1) * ps < f->size ? (p + 1) * ps : f->size;

  *off = p * ps + in * fs;
  *len = pend - *off < fs ? pend - *off : fs;
}

static size_t
frames_of(const struct push_op *op, uint64_t size)
{
  uint64_t ps = op->b.cfg.c.part_size, fs = spot__dedup_frame_size(op);
  uint64_t per = (ps + fs - 1) / fs, rem = size % ps;

  return (size_t)(size / ps * per + (rem + fs - 1) / fs);
}

void
spot__dedup_fini(struct push_op *op)
{
  struct dedup *d = &op->dedup;

  spot_manifest_free(d->base);
  d->base = NULL;
  free(d->idx);
  d->idx = NULL;
  free(d->units);
  d->units = NULL;
  free(d->jobs);
  d->jobs = NULL;
  free(d->obj);
  d->obj = NULL;
}

void
spot__dedup_pfile_fini(struct pfile *f)
{
  free(f->df);
  free(f->own);
  free(f->part_first);
  f->df = NULL;
  f->own = NULL;
  f->part_first = NULL;
}

/* ---------------------------------------------------------- the base */

static int
cmp_ent(const void *a, const void *b)
{
  return memcmp(((const struct spot__dedup_ent *)a)->sha,
                ((const struct spot__dedup_ent *)b)->sha,
                SPOT_MANIFEST_SHA256_LEN);
}

/* The base's hashed frames, sorted by SHA-256. */
static int
build_index(struct dedup *d)
{
  const struct spot_manifest *m = d->base;
  size_t n = 0;

  for (size_t i = 0; i < m->nfiles; i++)
    for (size_t j = 0; !m->files[i].pack && j < m->files[i].nframes; j++)
      n += m->files[i].frames[j].has_sha;
  if (n == 0)
    return 0;
  d->idx = malloc(n * sizeof(*d->idx));
  if (d->idx == NULL)
    return -ENOMEM;
  for (size_t i = 0; i < m->nfiles; i++)
    for (size_t j = 0; !m->files[i].pack && j < m->files[i].nframes; j++)
      if (m->files[i].frames[j].has_sha) {
        memcpy(d->idx[d->nidx].sha, m->files[i].frames[j].sha256,
               SPOT_MANIFEST_SHA256_LEN);
        d->idx[d->nidx].file = (uint32_t)i;
        d->idx[d->nidx].frame = (uint32_t)j;
        d->nidx++;
      }
  qsort(d->idx, d->nidx, sizeof(*d->idx), cmp_ent);
  return 0;
}

/* The index of a base frame with this content, filter and length, or -1.
 * Read-only: called on the workers. */
static int32_t
lookup(const struct dedup *d, const unsigned char *sha, enum spot_filter filter,
       uint64_t raw_len)
{
  size_t lo = 0, hi = d->nidx;

  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;

    if (memcmp(d->idx[mid].sha, sha, SPOT_MANIFEST_SHA256_LEN) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (; lo < d->nidx &&
         memcmp(d->idx[lo].sha, sha, SPOT_MANIFEST_SHA256_LEN) == 0;
       lo++) {
    const struct spot_manifest_file *bf = &d->base->files[d->idx[lo].file];

    if (bf->filter == filter && bf->frames[d->idx[lo].frame].raw_len == raw_len)
      return (int32_t)lo;
  }
  return -1;
}

static void dedup_cb(const struct spot_s3_result *res, void *data);
static void start_hash(struct push_op *op);

static int
get(struct push_op *op, const char *name, const char *rel, size_t cap)
{
  return spot__store_get_into(&op->b, &op->body, name, rel, cap, dedup_cb, op,
                              &op->s3op);
}

static void
no_base(struct push_op *op, const char *why)
{
  if (why != NULL)
    log_warn("push name=%s: no earlier checkpoint to reference (%s): every "
             "frame is uploaded",
             op->b.name, why);
  spot_manifest_free(op->dedup.base);
  op->dedup.base = NULL;
  set_state(op, DEDUP_DONE);
}

static void
got_latest(struct push_op *op)
{
  char name[SPOT__STORE_LATEST_CAP + 1];
  size_t n = op->body.len < SPOT__STORE_LATEST_CAP ? op->body.len
                                                   : SPOT__STORE_LATEST_CAP;
  int r;

  memcpy(name, spot_buf_str(&op->body), n);
  name[n] = '\0';
  while (n > 0 &&
         (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' '))
    name[--n] = '\0';
  if (!spot_ckpt_name_valid(name) || strcmp(name, op->b.name) == 0) {
    no_base(op, "LATEST names no other valid checkpoint");
    return;
  }
  set_state(op, DEDUP_MANIFEST);
  r = get(op, name, SPOT_MANIFEST_NAME, SPOT__STORE_MANIFEST_CAP);
  if (r < 0)
    no_base(op, strerror(-r));
}

/* The object base frame e is in: base file e->file's own object
 * (index < nfiles), or the base's reference nfiles + ref - 1. */
static size_t
obj_of(const struct spot_manifest *m, const struct spot__dedup_ent *e)
{
  const struct spot_manifest_frame *fr = &m->files[e->file].frames[e->frame];

  return fr->ref > 0 ? m->nfiles + fr->ref - 1 : e->file;
}

/* HEAD: the next object a hashed frame is in; then HASH. */
static void
head_next(struct push_op *op)
{
  struct dedup *d = &op->dedup;
  const struct spot_manifest *m = d->base;
  size_t n = 0;

  while (d->head_idx < m->nfiles + m->nrefs && d->obj[d->head_idx] != OBJ_USED)
    d->head_idx++;
  if (d->head_idx < m->nfiles + m->nrefs) {
    size_t o = d->head_idx;
    const char *name = o < m->nfiles ? m->name : m->refs[o - m->nfiles].name;
    const char *rel =
        o < m->nfiles ? m->files[o].key : m->refs[o - m->nfiles].key;
    char *key = spot__store_key(&op->b.cfg.c, name, rel);
    int r;

    if (key == NULL) {
      fail_msg(op, -ENOMEM, "out of memory");
      return;
    }
    r = spot_s3_head(op->b.cfg.c.s3, op->b.cfg.bucket, key, dedup_cb, op,
                     &op->s3op);
    free(key);
    if (r < 0) {
      fail_msg(op, r, "reading the earlier checkpoint: %s", strerror(-r));
      return;
    }
    op->b.active_s3++;
    return;
  }
  /* drop the frames of objects that failed the check (stays sorted) */
  for (size_t i = 0; i < d->nidx; i++)
    if (d->obj[obj_of(m, &d->idx[i])] == OBJ_OK)
      d->idx[n++] = d->idx[i];
  d->nidx = n;
  start_hash(op);
}

/* HEAD's answer for object head_idx. */
static void
got_head(struct push_op *op, const struct spot_s3_result *res)
{
  struct dedup *d = &op->dedup;
  const struct spot_manifest *m = d->base;
  size_t o = d->head_idx;
  uint64_t want =
      o < m->nfiles ? m->files[o].stored : m->refs[o - m->nfiles].stored;

  if (res->err == 0 && res->content_length == want) {
    d->obj[o] = OBJ_OK;
  } else {
    char tmp[256];

    d->obj[o] = OBJ_BAD;
    log_warn("push name=%s: an object of %s cannot be referenced (%s): "
             "its frames are uploaded again",
             op->b.name, m->name,
             res->err < 0 ? spot_s3_strerror(res, tmp, sizeof(tmp))
                          : "not the size its manifest says");
  }
  d->head_idx++;
  head_next(op);
}

static void
got_manifest(struct push_op *op)
{
  char err[256];
  int r = spot_manifest_parse(spot_buf_str(&op->body), op->body.len,
                              &op->dedup.base, err, sizeof(err));

  if (r < 0) {
    op->dedup.base = NULL;
    no_base(op, err);
    return;
  }
  if (strcmp(op->dedup.base->job, op->b.cfg.job) != 0) {
    no_base(op, "LATEST's manifest is another job's");
    return;
  }
  r = build_index(&op->dedup);
  if (r < 0) {
    fail_msg(op, r, "out of memory");
    return;
  }
  if (op->dedup.nidx == 0) {
    no_base(op, NULL); /* an older manifest: no frame hashes */
    return;
  }
  op->dedup.obj = calloc(op->dedup.base->nfiles + op->dedup.base->nrefs, 1);
  if (op->dedup.obj == NULL) {
    fail_msg(op, -ENOMEM, "out of memory");
    return;
  }
  for (size_t i = 0; i < op->dedup.nidx; i++)
    op->dedup.obj[obj_of(op->dedup.base, &op->dedup.idx[i])] = OBJ_USED;
  set_state(op, DEDUP_HEAD);
  op->dedup.head_idx = 0;
  head_next(op);
}

static void
dedup_cb(const struct spot_s3_result *res, void *data)
{
  struct push_op *op = data;

  spot__store_s3_done(&op->b, &op->s3op, res);
  if (spot__store_cancelled(&op->b) || op->b.err < 0) {
    set_state(op, DEDUP_DONE);
  } else if (op->dedup.state == DEDUP_HEAD) {
    got_head(op, res);
  } else if (res->err == -ENOENT) {
    no_base(op, NULL); /* the job's first checkpoint */
  } else if (res->err < 0) {
    char tmp[256];

    no_base(op, spot_s3_strerror(res, tmp, sizeof(tmp)));
  } else if (op->dedup.state == DEDUP_LATEST) {
    got_latest(op);
  } else {
    got_manifest(op);
  }
  spot__push_advance(op);
}

/* ---------------------------------------------------------- hashing */

static void
hash_work_cb(uv_work_t *req)
{
  struct spot__dedup_job *job =
      spot_container_of(req, struct spot__dedup_job, work);
  struct push_op *op = job->op;
  struct dedup *d = &op->dedup;
  uint64_t fs = spot__dedup_frame_size(op);
  unsigned char *buf = malloc((size_t)fs);

  if (buf == NULL) {
    job->err = -ENOMEM;
    return;
  }
  for (;;) {
    size_t u = atomic_fetch_add(&d->next_unit, 1);
    const struct spot__dedup_unit *un;
    struct pfile *f;
    int fd;

    if (u >= d->nunits || job->err < 0)
      break;
    un = &d->units[u];
    f = &op->files[un->file];
    fd = open(f->abs, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
      job->err = -errno;
      job->file = un->file;
      break;
    }
    for (size_t j = un->first; j < un->end; j++) {
      struct spot__dframe *df = &f->df[j];
      uint64_t off, len;
      int r;

      frame_at(op, f, j, &off, &len);
      r = spot__push_read_full(fd, buf, (size_t)len, off);
      if (r < 0) {
        job->err = r;
        job->file = un->file;
        break;
      }
      SHA256(buf, (size_t)len, df->sha);
      df->has_sha = true;
      df->base = lookup(d, df->sha, f->filter, len);
    }
    close(fd);
  }
  free(buf);
}

static void
hash_after_cb(uv_work_t *req, int status)
{
  struct spot__dedup_job *job =
      spot_container_of(req, struct spot__dedup_job, work);
  struct push_op *op = job->op;

  op->b.active_work--;
  if (status == UV_ECANCELED && op->b.err == 0)
    spot__store_fail(&op->b, -ECANCELED);
  else if (job->err == -ESTALE)
    fail_msg(op, job->err, "%s: file changed while it was pushed",
             op->files[job->file].rel);
  else if (job->err < 0)
    fail_msg(op, job->err, "%s: %s", op->files[job->file].rel,
             strerror(-job->err));
  if (--op->dedup.jobs_left == 0)
    set_state(op, DEDUP_DONE);
  spot__push_advance(op);
}

/* Every frame of the files to push gets a slot; the units of hashing
 * work go to at most `workers` pool jobs. */
static int
alloc_frames(struct push_op *op)
{
  for (size_t i = 0; i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];

    if (!spot__dedup_wanted(op, f))
      continue;
    f->ndf = frames_of(op, f->size);
    f->df = calloc(f->ndf, sizeof(*f->df));
    if (f->df == NULL)
      return -ENOMEM;
    for (size_t j = 0; j < f->ndf; j++)
      f->df[j].base = -1;
  }
  return 0;
}

static void
start_hash(struct push_op *op)
{
  struct dedup *d = &op->dedup;
  size_t n = 0;
  unsigned njobs;
  int r;

  for (size_t i = 0; i < op->nfiles; i++)
    if (op->files[i].df != NULL)
      n += (op->files[i].ndf + UNIT_FRAMES - 1) / UNIT_FRAMES;
  if (n == 0) {
    set_state(op, DEDUP_DONE);
    return;
  }
  d->units = calloc(n, sizeof(*d->units));
  if (d->units == NULL) {
    fail_msg(op, -ENOMEM, "out of memory");
    return;
  }
  for (size_t i = 0; i < op->nfiles; i++)
    for (size_t j = 0; op->files[i].df != NULL && j < op->files[i].ndf;
         j += UNIT_FRAMES) {
      struct spot__dedup_unit *u = &d->units[d->nunits++];

      u->file = i;
      u->first = j;
      u->end = j + UNIT_FRAMES < op->files[i].ndf ? j + UNIT_FRAMES
                                                  : op->files[i].ndf;
    }
  atomic_store(&d->next_unit, 0);
  njobs = op->b.cfg.c.workers > 0 ? op->b.cfg.c.workers : 1;
  if (njobs > d->nunits)
    njobs = (unsigned)d->nunits;
  if (njobs == 0) {
    set_state(op, DEDUP_DONE);
    return;
  }
  d->jobs = calloc(njobs, sizeof(*d->jobs));
  if (d->jobs == NULL) {
    fail_msg(op, -ENOMEM, "out of memory");
    return;
  }
  set_state(op, DEDUP_HASH);
  for (unsigned k = 0; k < njobs; k++) {
    d->jobs[k].op = op;
    r = spot__store_work(&op->b, &d->jobs[k].work, hash_work_cb, hash_after_cb);
    if (r < 0) {
      fail_msg(op, r, "queueing work: %s", uv_strerror(r));
      break;
    }
    op->b.active_work++;
    d->jobs_left++;
  }
  if (d->jobs_left == 0)
    set_state(op, DEDUP_DONE);
}

void
spot__dedup_start(struct push_op *op)
{
  int r;

  spot__push_set_state(op, PUSH_DEDUP);
  set_state(op, DEDUP_LATEST);
  r = alloc_frames(op);
  if (r < 0) {
    fail_msg(op, r, "out of memory");
    set_state(op, DEDUP_DONE);
    spot__push_advance(op);
    return;
  }
  r = get(op, NULL, "LATEST", SPOT__STORE_LATEST_CAP);
  if (r < 0) {
    no_base(op, strerror(-r));
    spot__push_advance(op);
  }
}

bool
spot__dedup_done(const struct push_op *op)
{
  return op->dedup.state == DEDUP_DONE;
}

/* ---------------------------------------------------------- the plan */

/* Groups f's own frames into parts: each holds frames whose encoding
 * bounds add up to at most the slot's buffer (spot_codec_bound of a
 * part), so about part_size raw bytes. */
static int
plan_file(struct push_op *op, struct pfile *f)
{
  size_t cap = spot_codec_bound((size_t)op->b.cfg.c.part_size), acc = 0;
  size_t nparts = 0;

  f->own = malloc(f->ndf * sizeof(*f->own));
  f->part_first = malloc((f->ndf + 1) * sizeof(*f->part_first));
  if (f->own == NULL || f->part_first == NULL)
    return -ENOMEM;
  f->nown = 0;
  for (size_t j = 0; j < f->ndf; j++) {
    uint64_t off, len;
    size_t b;

    if (f->df[j].base >= 0) {
      uint64_t dummy;

      frame_at(op, f, j, &dummy, &len);
      op->dedup.ref_raw += len;
      continue;
    }
    frame_at(op, f, j, &off, &len);
    b = spot_codec_bound((size_t)len);
    if (nparts == 0 || acc + b > cap) {
      if (nparts == SPOT_MANIFEST_PARTS_MAX)
        return -E2BIG;
      f->part_first[nparts++] = f->nown;
      acc = 0;
    }
    acc += b;
    f->own[f->nown++] = j;
  }
  f->part_first[nparts] = f->nown;
  f->nparts = nparts;
  return 0;
}

int
spot__dedup_plan(struct push_op *op)
{
  uint64_t total = 0;

  for (size_t i = 0; i < op->nfiles; i++) {
    struct pfile *f = &op->files[i];
    int r;

    if (f->df == NULL)
      continue;
    total += f->size;
    r = plan_file(op, f);
    if (r < 0)
      return r;
  }
  op->b.raw_done += op->dedup.ref_raw; /* progress: referenced is done */
  if (op->dedup.base != NULL)
    log_info("push name=%s: %" PRIu64 " of %" PRIu64
             " bytes unchanged since %s, referenced, not uploaded",
             op->b.name, op->dedup.ref_raw, total, op->dedup.base->name);
  return 0;
}

uint64_t
spot__dedup_part_raw(const struct push_op *op, const struct pfile *f,
                     size_t part)
{
  uint64_t raw = 0;

  for (size_t k = f->part_first[part]; k < f->part_first[part + 1]; k++) {
    uint64_t off, len;

    frame_at(op, f, f->own[k], &off, &len);
    raw += len;
  }
  return raw;
}

/* The manifest entries of f's referenced frames. */
int
spot__dedup_add_refs(struct push_op *op, struct pfile *f)
{
  const struct dedup *d = &op->dedup;
  int r;

  for (size_t j = 0; j < f->ndf; j++) {
    const struct spot__dedup_ent *e;
    const struct spot_manifest_file *bf;
    const struct spot_manifest_frame *bfr;
    const char *name, *key;
    uint64_t stored;
    size_t ref;

    if (f->df[j].base < 0)
      continue;
    e = &d->idx[f->df[j].base];
    bf = &d->base->files[e->file];
    bfr = &bf->frames[e->frame];
    key = spot_manifest_frame_key(d->base, bf, bfr, &name);
    if (name != NULL) {
      stored = d->base->refs[bfr->ref - 1].stored;
    } else {
      name = d->base->name;
      stored = bf->stored;
    }
    r = spot_manifest_add_ref(op->manifest, name, key, stored, &ref);
    if (r == 0)
      r = spot_manifest_set_ref_frame(op->manifest, f->midx, j, ref,
                                      bfr->comp_off, bfr->raw_len,
                                      bfr->comp_len, bfr->crc32c, bfr->sha256);
    if (r < 0)
      return r;
  }
  if (f->nown == 0)
    return spot_manifest_clear_key(op->manifest, f->midx);
  return 0;
}

/* ---------------------------------------------------------- encoding */

/* Pads a part (frames k0..k1 of f's own, encoded one after another in
 * comp, len bytes) to S3's part minimum. A stored frame may end with one
 * zstd skippable frame (restore's frame_len()), but must stay within
 * spot_codec_bound() of its raw length (the restore's buffers): so the
 * padding is spread over the frames, each taking what its bound leaves,
 * and the frames move up to make room. -ENOBUFS when they cannot take
 * it all (a part of incompressible frames just under the minimum: a
 * part_size of at least 8 MiB leaves room). */
static int
pad_frames(const struct push_op *op, struct pfile *f, size_t k0, size_t k1,
           unsigned char *comp, size_t cap, size_t *len)
{
  size_t need = (size_t)SPOT_STORE_PART_MIN - *len, total = 0, pos = *len;
  size_t *pad = calloc(k1 - k0, sizeof(*pad));

  if (pad == NULL)
    return -ENOMEM;
  for (size_t k = k0; k < k1 && need > 0; k++) {
    uint64_t off, rlen;
    size_t room;

    frame_at(op, f, f->own[k], &off, &rlen);
    room = spot_codec_bound((size_t)rlen) - (size_t)f->df[f->own[k]].comp_len;
    if (room < 8)
      continue;
    pad[k - k0] = need < 8 ? 8 : need < room ? need : room;
    need -= pad[k - k0] < need ? pad[k - k0] : need;
    total += pad[k - k0];
  }
  if (need > 0 || *len + total > cap) {
    free(pad);
    return -ENOBUFS;
  }
  /* from the last frame down: move it up by the padding before it, then
   * write its own padding after it */
  for (size_t k = k1; k-- > k0;) {
    struct spot__dframe *df = &f->df[f->own[k]];
    size_t c = (size_t)df->comp_len, before = 0;
    unsigned char *p;

    for (size_t i = k0; i < k; i++)
      before += pad[i - k0];
    pos -= c;
    memmove(comp + pos + before, comp + pos, c);
    if (pad[k - k0] > 0) {
      size_t n = pad[k - k0] - 8;

      p = comp + pos + before + c;
      p[0] = 0x50;
      p[1] = 0x2A;
      p[2] = 0x4D;
      p[3] = 0x18;
      p[4] = (unsigned char)(n & 0xff);
      p[5] = (unsigned char)((n >> 8) & 0xff);
      p[6] = (unsigned char)((n >> 16) & 0xff);
      p[7] = (unsigned char)((n >> 24) & 0xff);
      memset(p + 8, 0, n);
      df->comp_len += pad[k - k0];
    }
  }
  free(pad);
  *len += total;
  return 0;
}

/* Encodes part s->part of f: its own frames one after another, each a
 * frame of its own with its CRC32C (and SHA-256 when no base hashed it),
 * padded to S3's part minimum unless it is the last part. Called on the
 * worker. */
void
spot__dedup_encode(struct push_op *op, struct spot__store_slot *s,
                   struct pfile *f)
{
  size_t len = 0, k0 = f->part_first[s->part], k1 = f->part_first[s->part + 1];
  int fd = open(f->abs, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);

  s->work_err = 0;
  if (fd < 0) {
    s->work_err = -errno;
    return;
  }
  for (size_t k = k0; s->work_err == 0 && k < k1; k++) {
    struct spot__dframe *df = &f->df[f->own[k]];
    uint64_t off, rlen;
    size_t clen = 0;

    frame_at(op, f, f->own[k], &off, &rlen);
    s->work_err = spot__push_read_full(fd, s->coder->raw, (size_t)rlen, off);
    if (s->work_err < 0)
      break;
    if (!df->has_sha) {
      SHA256(s->coder->raw, (size_t)rlen, df->sha);
      df->has_sha = true;
    }
    s->work_err = spot_codec_encode(
        s->coder->codec, f->filter, (enum spot_codec_mode)s->mode,
        s->coder->raw, (size_t)rlen, (char *)s->comp + len, s->comp_cap - len,
        &clen, &df->crc);
    df->comp_len = clen;
    len += clen;
  }
  close(fd);
  if (s->work_err == 0 && f->nparts > 1 && s->part + 1 < f->nparts &&
      len < SPOT_STORE_PART_MIN)
    s->work_err = pad_frames(op, f, k0, k1, s->comp, s->comp_cap, &len);
  s->comp_len = len;
}

/* After the worker: the part's frames into the manifest. */
int
spot__dedup_encoded(struct push_op *op, struct spot__store_slot *s)
{
  struct pfile *f = &op->files[s->file];

  for (size_t k = f->part_first[s->part]; k < f->part_first[s->part + 1]; k++) {
    size_t j = f->own[k];
    const struct spot__dframe *df = &f->df[j];
    uint64_t off, rlen;
    int r;

    frame_at(op, f, j, &off, &rlen);
    r = spot_manifest_set_frame(op->manifest, f->midx, j, rlen, df->comp_len,
                                df->crc);
    if (r == 0)
      r = spot_manifest_set_frame_sha(op->manifest, f->midx, j, df->sha);
    if (r < 0)
      return r;
  }
  return 0;
}
