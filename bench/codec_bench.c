/* Codec throughput and ratio on checkpoint-like data, one core.
 *
 *   BUILD_DIR/bench/codec_bench [MIB_PER_DATASET [PART_MIB]]
 *
 * Datasets: fp32 weights + Adam state (three Gaussian tensors: weights
 * N(0, 0.02), exp_avg N(0, 1e-3), exp_avg_sq = N(0, 1e-3)^2), bf16 weights
 * (the top half of N(0, 0.02) fp32), random bytes, text (log-like lines),
 * zeros. For each: the filter spot_codec_choose_filter() picks, encode and
 * decode MB/s per core (raw bytes / CPU time, best of 3) and the ratio; the
 * same in raw mode; and the building blocks (byte grouping, CRC32C, memcpy)
 * plus the alternatives measured before choosing the defaults. */
#define ZSTD_STATIC_LINKING_ONLY
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#include "core/codec.h"
#include "core/crc32c.h"
#include "core/util.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t
next_u64(void)
{
  /* xorshift64* */
  rng ^= rng >> 12;
  rng ^= rng << 25;
  rng ^= rng >> 27;
  return rng * 0x2545F4914F6CDD1Dull;
}

static double
uniform(void)
{
  return ((double)(next_u64() >> 11) + 0.5) / 9007199254740992.0;
}

/* Box-Muller: two N(0, 1) values per call */
static void
gauss2(double *a, double *b)
{
  double r = sqrt(-2.0 * log(uniform())), t = 2.0 * M_PI * uniform();

  *a = r * cos(t);
  *b = r * sin(t);
}

/* n floats at p (byte pointer: no aliasing games) */
static void
fill_gauss_f32(unsigned char *p, size_t n, double sigma, int square)
{
  for (size_t i = 0; i < n; i += 2) {
    double a, b;
    float fa, fb;

    gauss2(&a, &b);
    a *= sigma;
    b *= sigma;
    if (square) {
      a *= a;
      b *= b;
    }
    fa = (float)a;
    fb = (float)b;
    memcpy(p + 4 * i, &fa, 4);
    if (i + 1 < n)
      memcpy(p + 4 * (i + 1), &fb, 4);
  }
}

static void
fill_bf16(unsigned char *p, size_t n)
{
  for (size_t i = 0; i < n; i += 2) {
    double a, b;
    float fa, fb;
    uint32_t ua, ub;

    gauss2(&a, &b);
    fa = (float)(a * 0.02);
    fb = (float)(b * 0.02);
    memcpy(&ua, &fa, 4);
    memcpy(&ub, &fb, 4);
    ua >>= 16;
    ub >>= 16;
    /* little-endian bf16, as torch writes it on x86 */
    p[2 * i] = (unsigned char)ua;
    p[2 * i + 1] = (unsigned char)(ua >> 8);
    if (i + 1 < n) {
      p[2 * i + 2] = (unsigned char)ub;
      p[2 * i + 3] = (unsigned char)(ub >> 8);
    }
  }
}

static void
fill_text(char *p, size_t n)
{
  static const char *const words[] = {
      "step",   "loss",       "lr",         "epoch",     "grad_norm",
      "tokens", "throughput", "checkpoint", "saved",     "warmup",
      "batch",  "eval",       "accuracy",   "the",       "model",
      "layer",  "attention",  "weights",    "optimizer", "scheduler"};
  size_t i = 0;
  unsigned long line = 0;

  while (i < n) {
    char l[160];
    int len =
        snprintf(l, sizeof(l), "%lu %s=%.4f %s %s=%lu %s\n", line++,
                 words[next_u64() % 20], uniform() * 4, words[next_u64() % 20],
                 words[next_u64() % 20], (unsigned long)(next_u64() % 100000),
                 words[next_u64() % 20]);
    size_t c = (size_t)len < n - i ? (size_t)len : n - i;

    memcpy(p + i, l, c);
    i += c;
  }
}

static double
cpu_now(void)
{
  struct timespec ts;

  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct dataset {
  const char *name;
  unsigned char *data;
  size_t len;
};

static size_t part_size;

/* Encodes the whole dataset part by part; returns best-of-3 CPU seconds,
 * stored bytes in *stored. Decodes it back and checks it. */
static int
run(struct spot_codec *c, const struct dataset *d, enum spot_filter f,
    enum spot_codec_mode mode, double *enc_s, double *dec_s, size_t *stored)
{
  size_t nparts = (d->len + part_size - 1) / part_size;
  size_t bound = spot_codec_bound(part_size);
  unsigned char *out = malloc(nparts * bound);
  unsigned char *back = malloc(part_size);
  size_t *clen = calloc(nparts, sizeof(*clen));
  uint32_t *crc = calloc(nparts, sizeof(*crc));
  int r = 0;

  if (!out || !back || !clen || !crc) {
    r = -ENOMEM;
    goto out;
  }
  *enc_s = *dec_s = 1e9;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = cpu_now(), t1;

    *stored = 0;
    for (size_t i = 0; i < nparts; i++) {
      size_t n = d->len - i * part_size < part_size ? d->len - i * part_size
                                                    : part_size;

      r = spot_codec_encode(c, f, mode, d->data + i * part_size, n,
                            out + i * bound, bound, &clen[i], &crc[i]);
      if (r < 0)
        goto out;
      *stored += clen[i];
    }
    t1 = cpu_now();
    if (t1 - t0 < *enc_s)
      *enc_s = t1 - t0;
    t0 = cpu_now();
    for (size_t i = 0; i < nparts; i++) {
      size_t n = d->len - i * part_size < part_size ? d->len - i * part_size
                                                    : part_size;

      r = spot_codec_decode(c, f, out + i * bound, clen[i], back, n, crc[i]);
      if (r < 0)
        goto out;
    }
    t1 = cpu_now();
    if (t1 - t0 < *dec_s)
      *dec_s = t1 - t0;
    /* spot check the last part byte for byte */
    if (memcmp(back, d->data + (nparts - 1) * part_size,
               d->len - (nparts - 1) * part_size) != 0) {
      r = -EILSEQ;
      goto out;
    }
  }
out:
  free(out);
  free(back);
  free(clen);
  free(crc);
  return r;
}

/* Plain zstd on grouped (or not) data with explicit parameters: the
 * alternatives considered for the defaults. */
static void
alt(const struct dataset *d, unsigned k, int level, int lit, const char *what)
{
  ZSTD_CCtx *z = ZSTD_createCCtx();
  size_t bound = ZSTD_compressBound(part_size);
  unsigned char *g = malloc(part_size), *o = malloc(bound);
  double best = 1e9;
  size_t stored = 0;

  if (!z || !g || !o)
    goto out;
  ZSTD_CCtx_setParameter(z, ZSTD_c_compressionLevel, level);
  ZSTD_CCtx_setParameter(z, ZSTD_c_literalCompressionMode, lit);
  for (int rep = 0; rep < 3; rep++) {
    double t0 = cpu_now(), t;

    stored = 0;
    for (size_t off = 0; off < d->len; off += part_size) {
      size_t n = d->len - off < part_size ? d->len - off : part_size;
      size_t r;

      if (k > 1)
        spot_codec_group(g, d->data + off, n, k);
      else
        memcpy(g, d->data + off, n);
      r = ZSTD_compress2(z, o, bound, g, n);
      if (ZSTD_isError(r))
        goto out;
      stored += r;
    }
    t = cpu_now() - t0;
    if (t < best)
      best = t;
  }
  printf("| %s | %s | %.3f | %.0f |\n", d->name, what,
         (double)d->len / (double)stored, (double)d->len / best / 1e6);
out:
  ZSTD_freeCCtx(z);
  free(g);
  free(o);
}

static double
time_op(const struct dataset *d, int op)
{
  unsigned char *tmp = malloc(d->len);
  double best = 1e9;
  volatile uint32_t sink = 0;

  if (!tmp)
    return 0;
  for (int rep = 0; rep < 3; rep++) {
    double t0 = cpu_now(), t;

    if (op == 0)
      spot_codec_group(tmp, d->data, d->len, 4);
    else if (op == 1)
      spot_codec_ungroup(tmp, d->data, d->len, 4);
    else if (op == 2)
      sink ^= spot_crc32c(0, d->data, d->len);
    else if (op == 3)
      sink ^= spot_crc32c_sw(0, d->data, d->len);
    else
      memcpy(tmp, d->data, d->len);
    t = cpu_now() - t0;
    if (t < best)
      best = t;
  }
  (void)sink;
  free(tmp);
  return (double)d->len / best / 1e6;
}

int
main(int argc, char **argv)
{
  uint64_t mib = 64, pmib = 8;
  struct dataset ds[5] = {0};
  struct spot_codec *c = NULL;
  size_t nf;
  int r, rc = 1;

  if ((argc > 1 && spot_parse_size(argv[1], &mib) < 0) ||
      (argc > 2 && spot_parse_size(argv[2], &pmib) < 0) || mib == 0 ||
      pmib == 0 || pmib > 128) {
    fprintf(stderr, "usage: codec_bench [MIB_PER_DATASET [PART_MIB]]\n");
    return 2;
  }
  part_size = (size_t)pmib << 20;
  for (int i = 0; i < 5; i++) {
    ds[i].len = (size_t)mib << 20;
    ds[i].data = malloc(ds[i].len);
    if (!ds[i].data)
      goto out;
  }
  ds[0].name = "fp32+Adam";
  /* weights, Adam's first and second moments: a third of the floats each,
   * 4-byte aligned and covering every byte */
  nf = ds[0].len / 4;
  fill_gauss_f32(ds[0].data, nf / 3, 0.02, 0);
  fill_gauss_f32(ds[0].data + 4 * (nf / 3), nf / 3, 1e-3, 0);
  fill_gauss_f32(ds[0].data + 8 * (nf / 3), nf - 2 * (nf / 3), 1e-3, 1);
  ds[1].name = "bf16";
  fill_bf16(ds[1].data, ds[1].len / 2);
  ds[2].name = "random";
  for (size_t i = 0; i + 8 <= ds[2].len; i += 8) {
    uint64_t v = next_u64();

    memcpy(ds[2].data + i, &v, 8);
  }
  ds[3].name = "text";
  fill_text((char *)ds[3].data, ds[3].len);
  ds[4].name = "zeros";
  memset(ds[4].data, 0, ds[4].len);

  r = spot_codec_new(part_size, &c);
  if (r < 0)
    goto out;
  printf("codec_bench: %llu MiB per dataset, %llu MiB parts, level %d, "
         "crc32c %s; MB/s = raw MB per CPU second (one core), best of 3\n\n",
         (unsigned long long)mib, (unsigned long long)pmib, SPOT_CODEC_LEVEL,
         spot_crc32c_hw_available() ? "sse4.2" : "table");
  printf("| data | chosen filter | chosen mode | ratio | encode MB/s | "
         "decode MB/s | raw-mode encode MB/s | raw-mode decode MB/s |\n");
  printf("|---|---|---|---|---|---|---|---|\n");
  for (int i = 0; i < 5; i++) {
    struct spot_codec_trial t;
    double es, dsec, res, rds;
    size_t stored, rstored;

    if (spot_codec_choose_filter(c, ds[i].data, ds[i].len, &t) < 0 ||
        run(c, &ds[i], t.filter, t.mode, &es, &dsec, &stored) < 0 ||
        run(c, &ds[i], t.filter, SPOT_CODEC_RAW, &res, &rds, &rstored) < 0) {
      fprintf(stderr, "codec_bench: %s: round trip failed\n", ds[i].name);
      goto out;
    }
    printf("| %s | %s | %s | %.3f | %.0f | %.0f | %.0f | %.0f |\n", ds[i].name,
           spot_filter_name(t.filter),
           t.mode == SPOT_CODEC_RAW     ? "raw"
           : t.mode == SPOT_CODEC_DENSE ? "dense"
                                        : "zstd",
           (double)ds[i].len / (double)stored, (double)ds[i].len / es / 1e6,
           (double)ds[i].len / dsec / 1e6, (double)ds[i].len / res / 1e6,
           (double)ds[i].len / rds / 1e6);
  }

  printf("\nBuilding blocks on %llu MiB: group4 %.0f MB/s, ungroup4 %.0f "
         "MB/s, crc32c %.0f MB/s (table %.0f MB/s), memcpy %.0f MB/s\n",
         (unsigned long long)mib, time_op(&ds[0], 0), time_op(&ds[0], 1),
         time_op(&ds[0], 2), time_op(&ds[0], 3), time_op(&ds[0], 4));

  printf("\nAlternatives (plain ZSTD_compress2 per part, grouping included, "
         "no CRC):\n\n| data | setting | ratio | MB/s |\n|---|---|---|---|\n");
  alt(&ds[0], 1, 1, ZSTD_ps_auto, "no filter, level 1");
  alt(&ds[0], 1, -1000, ZSTD_ps_enable, "no filter, -1000 + literals");
  alt(&ds[0], 4, 1, ZSTD_ps_auto, "bytegroup4, level 1");
  alt(&ds[0], 4, -1000, ZSTD_ps_enable, "bytegroup4, -1000 + literals");
  alt(&ds[0], 4, ZSTD_minCLevel(), ZSTD_ps_enable,
      "bytegroup4, min level + literals");
  alt(&ds[1], 1, 1, ZSTD_ps_auto, "no filter, level 1");
  alt(&ds[1], 2, -1000, ZSTD_ps_enable, "bytegroup2, -1000 + literals");
  alt(&ds[2], 1, -1000, ZSTD_ps_disable, "raw candidate: -1000, no literals");
  alt(&ds[2], 1, ZSTD_minCLevel(), ZSTD_ps_disable,
      "raw candidate: min level, no literals");
  alt(&ds[3], 1, -1000, ZSTD_ps_enable, "no filter, -1000 + literals");
  alt(&ds[3], 1, 1, ZSTD_ps_auto, "no filter, level 1");

  rc = 0;
out:
  spot_codec_free(c);
  for (int i = 0; i < 5; i++)
    free(ds[i].data);
  return rc;
}
