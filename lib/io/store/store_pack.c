/* Push, small files packed: a checkpoint of thousands of
 * small files costs a request per file, which over a real network is a
 * round trip each (5000 x 4 KiB: 11-24 s against 0.34 s as one object).
 * Files below the threshold are uploaded together in pack objects:
 *
 *   - the members of a pack are consecutive small files in path order;
 *   - a pack is a pseudo file at the end of op->files (f->pk): its parts
 *     are runs of whole members whose encoded bounds fit one part buffer,
 *     at most SPOT_STORE_PACK_PARTS parts, uploaded by the same pipeline
 *     as any file (one PUT, or a multipart upload whose parts but the
 *     last are padded to S3's minimum with a skippable frame);
 *   - each member is one zstd frame (no filter trial: small files do not
 *     pay for it; SPOT_CODEC_ZSTD, whose blocks fall back to raw ones
 *     when they do not compress, or raw with compress=never), so restore
 *     reads any run of members with one ranged GET and checks each CRC;
 *   - the manifest (manifest.h "Packs") lists the packs with their sizes
 *     and gives each member its pack and offset, known once every part
 *     of the pack is encoded (spot__pack_finish()).
 *
 * Pack keys end in ".pack", file keys in ".zst": never the same object.
 * A resumed push (store_resume.c) does not journal packs: they are
 * uploaded again from the start (their open uploads are aborted as
 * orphans of the attempt). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/util.h"
#include "io/store/store_push.h"

struct spot__pack {
  size_t *members; /* indices in op->files */
  size_t nmembers;
  size_t *part_first; /* nparts + 1: part p holds members [p], [p+1]) */
  uint64_t *part_len; /* stored bytes of each part (with padding) */
  /* per member: offset in its part, frame length, CRC32C */
  uint64_t *moff, *mlen;
  uint32_t *mcrc;
  size_t midx; /* the pack's index in the manifest */
};

static uint64_t
threshold(const struct push_op *op)
{
  uint64_t t = op->b.cfg.c.pack_threshold;

  if (t == 0)
    t = SPOT_STORE_PACK_THRESHOLD_DEFAULT;
  if (t > op->b.cfg.c.part_size)
    t = op->b.cfg.c.part_size; /* a packed file is one frame */
  return t;
}

uint64_t
spot__pack_threshold(const struct push_op *op)
{
  return op->b.cfg.c.pack_threshold == SPOT_STORE_PACK_OFF ? 0 : threshold(op);
}

bool
spot__pack_small(const struct push_op *op, const struct pfile *f)
{
  return op->b.cfg.c.pack_threshold != SPOT_STORE_PACK_OFF && f->link == NULL &&
         f->pk == NULL && f->size > 0 && f->size < threshold(op);
}

void
spot__pack_free(struct pfile *f)
{
  struct spot__pack *pk = f->pk;

  if (pk == NULL)
    return;
  free(pk->members);
  free(pk->part_first);
  free(pk->part_len);
  free(pk->moff);
  free(pk->mlen);
  free(pk->mcrc);
  free(pk);
  f->pk = NULL;
}

uint64_t
spot__pack_part_raw(const struct push_op *op, const struct pfile *f,
                    size_t part)
{
  const struct spot__pack *pk = f->pk;
  uint64_t raw = 0;

  for (size_t k = pk->part_first[part]; k < pk->part_first[part + 1]; k++)
    raw += op->files[pk->members[k]].size;
  return raw;
}

/* "[rank-K/][ATTEMPT/]packs/pack-NNNNNN.pack" */
static void
pack_key_rel(const struct push_op *op, size_t n, char *out, size_t size)
{
  char rank[32] = "";

  if (op->b.cfg.c.nranks > 1)
    snprintf(rank, sizeof(rank), "rank-%u/", op->b.cfg.c.rank);
  snprintf(out, size, "%s%s%spacks/pack-%06zu.pack", rank, op->attempt,
           op->attempt[0] != '\0' ? "/" : "", n);
}

/* The pack entry of members [first, last) of small (indices in files),
 * split into parts; appended to op->files (which may move). */
static int
new_pack(struct push_op *op, const size_t *small, size_t first, size_t last,
         const size_t *part_first, size_t nparts)
{
  struct pfile *pf, *files;
  struct spot__pack *pk;
  char rel[200];
  uint64_t raw = 0;
  size_t n = last - first;
  int r;

  files = realloc(op->files, (op->nfiles + 1) * sizeof(*files));
  if (files == NULL)
    return -ENOMEM;
  op->files = files;
  pf = &op->files[op->nfiles];
  memset(pf, 0, sizeof(*pf));
  pk = calloc(1, sizeof(*pk));
  if (pk == NULL)
    return -ENOMEM;
  pf->pk = pk;
  pk->members = malloc(n * sizeof(*pk->members));
  pk->part_first = malloc((nparts + 1) * sizeof(*pk->part_first));
  pk->part_len = calloc(nparts, sizeof(*pk->part_len));
  pk->moff = calloc(n, sizeof(*pk->moff));
  pk->mlen = calloc(n, sizeof(*pk->mlen));
  pk->mcrc = calloc(n, sizeof(*pk->mcrc));
  pack_key_rel(op, op->npacks + 1, rel, sizeof(rel));
  pf->rel = strdup(rel);
  pf->key = spot__store_key(&op->b.cfg.c, op->b.name, rel);
  if (pk->members == NULL || pk->part_first == NULL || pk->part_len == NULL ||
      pk->moff == NULL || pk->mlen == NULL || pk->mcrc == NULL ||
      pf->rel == NULL || pf->key == NULL) {
    spot__pack_free(pf);
    free(pf->rel);
    free(pf->key);
    return -ENOMEM;
  }
  pk->nmembers = n;
  for (size_t k = 0; k < n; k++) {
    struct pfile *f = &op->files[small[first + k]];

    pk->members[k] = small[first + k];
    raw += f->size;
    f->pack = op->nfiles + 1;
    f->nparts = 0; /* nothing of its own to upload */
  }
  for (size_t p = 0; p <= nparts; p++)
    pk->part_first[p] = part_first[p] - first;
  pf->size = raw;
  pf->mode = 0600;
  pf->filter = SPOT_FILTER_NONE;
  pf->compress = op->b.cfg.c.compress != SPOT_STORE_COMPRESS_NEVER;
  pf->cmode = pf->compress ? SPOT_CODEC_ZSTD : SPOT_CODEC_RAW;
  pf->nparts = nparts;
  if (nparts > 1) {
    pf->etags = calloc(nparts, sizeof(*pf->etags));
    if (pf->etags == NULL) {
      spot__pack_free(pf);
      free(pf->rel);
      free(pf->key);
      return -ENOMEM;
    }
  }
  r = spot_manifest_add_pack(op->manifest, rel, 0, &pk->midx);
  if (r < 0) {
    free(pf->etags);
    spot__pack_free(pf);
    free(pf->rel);
    free(pf->key);
    return r;
  }
  op->nfiles++;
  op->npacks++;
  log_debug("push name=%s %s: %zu files, %" PRIu64 " bytes, %zu parts",
            op->b.name, rel, n, raw, nparts);
  return 0;
}

int
spot__pack_plan(struct push_op *op)
{
  size_t cap = spot_codec_bound((size_t)op->b.cfg.c.part_size);
  size_t *small, nsmall = 0, *part_first, nparts = 0, first = 0;
  size_t used = 0, nfiles = op->nfiles;
  int r = 0;

  small = malloc((nfiles + 1) * sizeof(*small));
  part_first = malloc((SPOT_STORE_PACK_PARTS + 1) * sizeof(*part_first));
  if (small == NULL || part_first == NULL) {
    free(small);
    free(part_first);
    return -ENOMEM;
  }
  for (size_t i = 0; i < nfiles; i++)
    if (spot__pack_small(op, &op->files[i]))
      small[nsmall++] = i;
  if (nsmall == 0)
    goto out;
  part_first[0] = 0;
  for (size_t k = 0; r == 0 && k <= nsmall; k++) {
    size_t need =
        k < nsmall ? spot_codec_bound((size_t)op->files[small[k]].size) : 0;

    if (k < nsmall && used + need <= cap) {
      used += need; /* fits the current part */
      continue;
    }
    /* part [part_first[nparts], k) is full (or the last) */
    part_first[++nparts] = k;
    used = need;
    if (k == nsmall || nparts == SPOT_STORE_PACK_PARTS) {
      r = new_pack(op, small, first, k, part_first, nparts);
      first = k;
      nparts = 0;
      part_first[0] = k;
    }
  }
out:
  free(small);
  free(part_first);
  return r;
}

int
spot__pack_add_member(struct push_op *op, struct pfile *f)
{
  const struct pfile *pf = &op->files[f->pack - 1];
  char path[4200];
  int r;

  if (op->b.cfg.c.nranks > 1)
    snprintf(path, sizeof(path), "rank-%u/%s", op->b.cfg.c.rank, f->rel);
  else
    snprintf(path, sizeof(path), "%s", f->rel);
  r = spot_manifest_add_packed(op->manifest, path, pf->pk->midx, 0, f->size,
                               f->mode, f->mtime_ns, SPOT_FILTER_NONE,
                               &f->midx);
  if (r < 0)
    return r;
  spot__push_file_set_state(op, f, FILE_DONE); /* its pack carries it */
  return 0;
}

void
spot__pack_encode(struct push_op *op, struct spot__store_slot *s)
{
  struct pfile *pf = &op->files[s->file];
  struct spot__pack *pk = pf->pk;
  uint64_t t0 = spot_now_mono_ms();
  size_t off = 0;

  s->work_err = 0;
  for (size_t k = pk->part_first[s->part];
       s->work_err == 0 && k < pk->part_first[s->part + 1]; k++) {
    const struct pfile *f = &op->files[pk->members[k]];
    int fd = open(f->abs, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    size_t len = 0;
    uint32_t crc = 0;

    if (fd < 0) {
      s->work_err = -errno;
      break;
    }
    s->work_err = spot__push_read_full(fd, s->coder->raw, (size_t)f->size, 0);
    close(fd);
    if (s->work_err == 0)
      s->work_err = spot_codec_encode(
          s->coder->codec, SPOT_FILTER_NONE, (enum spot_codec_mode)s->mode,
          s->coder->raw, (size_t)f->size, (char *)s->comp + off,
          s->comp_cap - off, &len, &crc);
    pk->moff[k] = off;
    pk->mlen[k] = len;
    pk->mcrc[k] = crc;
    off += len;
  }
  s->comp_len = off;
  if (s->work_err == 0 && s->part + 1 < pf->nparts)
    s->work_err = spot__push_pad(s->comp, s->comp_cap, &s->comp_len);
  s->work_ns = (spot_now_mono_ms() - t0) * 1000000u + 1;
}

int
spot__pack_encoded(struct push_op *op, struct spot__store_slot *s)
{
  struct pfile *pf = &op->files[s->file];
  struct spot__pack *pk = pf->pk;
  int r = 0;

  for (size_t k = pk->part_first[s->part];
       r == 0 && k < pk->part_first[s->part + 1]; k++) {
    const struct pfile *f = &op->files[pk->members[k]];

    r = spot_manifest_set_frame(op->manifest, f->midx, 0, f->size, pk->mlen[k],
                                pk->mcrc[k]);
  }
  pk->part_len[s->part] = s->comp_len;
  return r;
}

int
spot__pack_finish(struct push_op *op)
{
  for (size_t i = op->nfiles - op->npacks; i < op->nfiles; i++) {
    const struct pfile *pf = &op->files[i];
    const struct spot__pack *pk = pf->pk;
    uint64_t base = 0;
    int r;

    for (size_t p = 0; p < pf->nparts; p++) {
      for (size_t k = pk->part_first[p]; k < pk->part_first[p + 1]; k++) {
        r = spot_manifest_set_pack_off(
            op->manifest, op->files[pk->members[k]].midx, base + pk->moff[k]);
        if (r < 0)
          return r;
      }
      base += pk->part_len[p];
    }
    r = spot_manifest_set_pack_stored(op->manifest, pk->midx, base);
    if (r < 0)
      return r;
  }
  return 0;
}
